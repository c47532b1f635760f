//! The CPU floor: background threads keep a share of the CPU they want.
//!
//! A background thread runs the background nice below its own (10 levels
//! by default), or in
//! `SCHED_IDLE`, while no request waits for it: on a CPU that request
//! threads keep busy it then gets a tenth of it, or almost nothing, and a
//! checkpoint or snapshot that needs the CPU crawls. The I/O side has a
//! floor (pacing keeps `min_share` of the background's own throughput);
//! this is the CPU's.
//!
//! Every [`WINDOW`], a floor thread reads each background thread's
//! scheduler times ([`crate::sys::thread_cpu_times`]): how long it ran and
//! how long it waited on a run queue. Of the time it wanted a CPU (both),
//! it should have run at least `min_share`:
//!
//! ```text
//!   wanted = run + run-queue wait over the window
//!   wanted < WINDOW / 10 (it mostly slept or did I/O) ─> relief - 1
//!   run / wanted < min_share                          ─> relief + 1 (at most the background nice)
//!   run / wanted >= min(1.5 min_share, (1 + min_share) / 2) ─> relief - 1
//!   nice while non-critical = own + background nice - relief (SCHED_IDLE only at relief 0)
//! ```
//!
//! One nice level is about a 1.25x weight to the kernel, so a starved
//! thread reaches its own nice in ten windows and settles where its share is
//! between the floor and 1.5 times it; a request thread still gets the CPU
//! first whenever the background has its share. The floor works per thread and never touches
//! a critical one (inheritance has it at its own nice already).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Once;
use std::time::Duration;

use super::mirror::{background_nice, mirror_cpu};
use crate::sys::{thread_cpu_times, CpuTimes};

/// How often the floor looks at the background threads.
pub const WINDOW: Duration = Duration::from_millis(50);

/// `min_share` in millionths (0: the floor is off).
static MIN_SHARE: AtomicU32 = AtomicU32::new(0);
/// Windows in which the floor relieved a thread by one more level.
static RAISES: AtomicU64 = AtomicU64::new(0);
/// Background threads relieved at the last window.
static RELIEVED: AtomicU32 = AtomicU32::new(0);
static STARTED: Once = Once::new();

/// What the CPU floor has done, for INFO and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuFloorStats {
    /// Times a background thread was relieved by one more nice level (it
    /// got less than its share of the CPU it wanted over a window).
    pub raises: u64,
    /// Background threads running below the background nice now.
    pub relieved: u32,
}

/// What the CPU floor has done since the process started.
pub fn cpu_floor_stats() -> CpuFloorStats {
    CpuFloorStats {
        raises: RAISES.load(Ordering::Relaxed),
        relieved: RELIEVED.load(Ordering::Relaxed),
    }
}

/// Sets the CPU floor (`min_share` of the CPU a background thread wants,
/// within 0..=1; 0 turns it off), after checking that this kernel reports
/// threads' scheduler times. The floor thread starts with the first
/// floor above 0 and stays; turning the floor off gives every background
/// thread its full background nice back.
pub fn set_background_cpu_min_share(min_share: f64) -> Result<(), String> {
    assert!(
        (0.0..=1.0).contains(&min_share),
        "min_share {min_share} outside 0..=1"
    );
    if min_share > 0.0 {
        let me = rustix::thread::gettid().as_raw_nonzero().get();
        if let Err(e) = thread_cpu_times(me) {
            MIN_SHARE.store(0, Ordering::SeqCst);
            return Err(format!(
                "cannot read a thread's scheduler times ({e}); the CPU floor stays off"
            ));
        }
    }
    let millionths = (min_share * 1e6).round() as u32;
    MIN_SHARE.store(millionths, Ordering::SeqCst);
    if millionths == 0 {
        for task in super::registry::all() {
            if task.relief().swap(0, Ordering::Relaxed) != 0 {
                mirror_cpu(&task);
            }
        }
        return Ok(());
    }
    STARTED.call_once(|| {
        std::thread::Builder::new()
            .name("critio-cpu-floor".into())
            .spawn(run)
            .expect("cannot spawn the CPU floor's thread");
    });
    Ok(())
}

/// The CPU floor in force (0: off).
pub fn background_cpu_min_share() -> f64 {
    f64::from(MIN_SHARE.load(Ordering::SeqCst)) / 1e6
}

/// The relief for a `window` in which a thread ran `d.run_ns` of the
/// `d.run_ns + d.wait_ns` it wanted, given its relief so far and `max`
/// (the background nice). `critio run` applies the same rule to the
/// background threads of the program it runs.
pub fn next_relief(relief: i32, d: CpuTimes, min_share: f64, max: i32, window: Duration) -> i32 {
    let wanted = d.run_ns + d.wait_ns;
    let quiet = (wanted as u128) < window.as_nanos() / 10;
    let share = d.run_ns as f64 / wanted.max(1) as f64;
    let ample = share >= (1.5 * min_share).min((1.0 + min_share) / 2.0);
    let next = if quiet || ample {
        relief - 1
    } else if share < min_share {
        relief + 1
    } else {
        relief
    };
    next.clamp(0, max.max(0))
}

/// The floor thread: one pass over the background threads per window.
fn run() {
    let mut last: HashMap<i32, CpuTimes> = HashMap::new();
    loop {
        std::thread::sleep(WINDOW);
        let min_share = background_cpu_min_share();
        let max = background_nice();
        if min_share == 0.0 || max == 0 {
            last.clear();
            RELIEVED.store(0, Ordering::Relaxed);
            continue;
        }
        let mut seen = HashMap::with_capacity(last.len());
        let mut relieved = 0;
        for task in super::registry::all() {
            if task.nice().lock().is_none() {
                continue; // not marked background
            }
            let tid = task.os_tid();
            let Ok(now) = thread_cpu_times(tid) else {
                continue; // exited
            };
            seen.insert(tid, now);
            let Some(before) = last.get(&tid) else {
                continue; // its first window
            };
            let relief = task.relief().load(Ordering::Relaxed);
            let next = next_relief(relief, now.since(*before), min_share, max, WINDOW);
            if next != relief {
                task.relief().store(next, Ordering::Relaxed);
                mirror_cpu(&task);
            }
            if next > relief {
                RAISES.fetch_add(1, Ordering::Relaxed);
            }
            relieved += u32::from(next > 0);
        }
        RELIEVED.store(relieved, Ordering::Relaxed);
        last = seen;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(run_ms: u64, wait_ms: u64) -> CpuTimes {
        CpuTimes {
            run_ns: run_ms * 1_000_000,
            wait_ns: wait_ms * 1_000_000,
        }
    }

    #[test]
    fn relief_rises_below_the_floor_falls_well_above_it_and_when_quiet() {
        // A thread that ran 5 of the 50 ms it wanted: below a 0.5 floor.
        assert_eq!(next_relief(0, window(5, 45), 0.5, 10, WINDOW), 1);
        assert_eq!(
            next_relief(10, window(5, 45), 0.5, 10, WINDOW),
            10,
            "at most max"
        );
        // Between the floor and 1.5x it: held.
        assert_eq!(next_relief(4, window(30, 20), 0.5, 10, WINDOW), 4);
        // Well above it (0.75 for a 0.5 floor): given back a level.
        assert_eq!(next_relief(4, window(40, 10), 0.5, 10, WINDOW), 3);
        assert_eq!(
            next_relief(0, window(50, 0), 0.5, 10, WINDOW),
            0,
            "at least 0"
        );
        // A thread that barely wanted the CPU (asleep, in I/O): relaxed.
        assert_eq!(next_relief(4, window(1, 2), 0.5, 10, WINDOW), 3);
        // A high floor's band tops out halfway to 1.
        assert_eq!(next_relief(4, window(43, 7), 0.8, 10, WINDOW), 4);
        assert_eq!(next_relief(4, window(46, 4), 0.8, 10, WINDOW), 3);
    }
}
