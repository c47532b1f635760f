//! A probe of the machine itself while a load runs: a thread at a
//! real-time priority sleeps 1 ms at a time and records how late it wakes.
//!
//! ```text
//!  loop: t = now; sleep(1 ms); late = now - t - 1 ms  ─> wake-ups, late > 3 ms, longest
//! ```
//!
//! A real-time thread preempts every normal one, so on a healthy machine
//! it wakes within tens of microseconds whatever the load. When it is
//! milliseconds late, something above every normal thread held its CPU:
//! on a virtual machine, most often the host (the virtual CPUs were not
//! running: the host ran something else, or throttled the guest), or
//! else the kernel's own interrupt work. A request's thread waits through
//! such a stall like any other, whatever its priority, so a table of
//! tails prints them beside it.
//! Without the right to run real-time (not root) the probe runs at normal
//! priority and says so: its lateness then includes CPU queueing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use critio::sys::{set_thread_policy, SchedPolicy};
use serde_json::json;

use super::report::Table;

/// How long the probe sleeps each time.
const PERIOD: Duration = Duration::from_millis(1);
/// A wake-up this late counts as a stall.
const STALL: Duration = Duration::from_millis(3);

/// What one probe saw.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stalls {
    /// Whether it ran at a real-time priority.
    pub realtime: bool,
    /// Its wake-ups.
    pub wakeups: u64,
    /// Those late by more than [`STALL`].
    pub stalls: u64,
    /// The latest, in ms.
    pub longest_ms: f64,
}

/// A running probe; [`StallProbe::stop`] ends it.
pub struct StallProbe {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Stalls>,
}

impl StallProbe {
    /// Starts the probe thread.
    pub fn start() -> Result<Self, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("critio-stall-probe".into())
            .spawn(move || probe(&flag))
            .map_err(|e| format!("cannot start the stall probe: {e}"))?;
        Ok(Self { stop, thread })
    }

    /// Stops it and returns what it saw.
    pub fn stop(self) -> Stalls {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// Runs `load` with a probe beside it: its outcome and the stalls seen.
pub fn probed<T>(load: impl FnOnce() -> Result<T, String>) -> Result<(T, Stalls), String> {
    let probe = StallProbe::start()?;
    let out = load();
    let stalls = probe.stop();
    Ok((out?, stalls))
}

/// The table of what the probes saw, one row per `(label, SET, GET)`.
pub fn table<'a>(title: &str, rows: impl IntoIterator<Item = (&'a str, [Stalls; 2])>) -> Table {
    let mut t = Table::new(
        title,
        &[
            "setup",
            "SET stalls",
            "SET stall max ms",
            "GET stalls",
            "GET stall max ms",
        ],
    );
    for (label, [set, get]) in rows {
        t.row(vec![
            json!(label),
            json!(set.stalls),
            json!(set.longest_ms),
            json!(get.stalls),
            json!(get.longest_ms),
        ]);
    }
    t
}

/// Says what the probe is, for an experiment's description: whether it
/// ran real-time in every load of `seen`.
pub fn describe<'a>(seen: impl IntoIterator<Item = &'a Stalls>) -> String {
    let realtime = seen.into_iter().all(|s| s.realtime);
    format!(
        "stalls: how often a {} thread sleeping 1 ms at a time woke more than {} ms late \
         during that load ({}), and its latest wake-up",
        if realtime {
            "real-time"
        } else {
            "normal-priority (no right to run real-time)"
        },
        STALL.as_millis(),
        if realtime {
            "the machine itself: while it is late, no normal thread runs on its CPU"
        } else {
            "the machine and its CPU queues"
        },
    )
}

fn probe(stop: &AtomicBool) -> Stalls {
    // 0: the calling thread.
    let mut s = Stalls {
        realtime: set_thread_policy(0, SchedPolicy::Realtime).is_ok(),
        ..Stalls::default()
    };
    let mut longest = Duration::ZERO;
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        std::thread::sleep(PERIOD);
        let late = t.elapsed().saturating_sub(PERIOD);
        s.wakeups += 1;
        if late > STALL {
            s.stalls += 1;
        }
        longest = longest.max(late);
    }
    s.longest_ms = longest.as_secs_f64() * 1e3;
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_counts_its_wakeups_and_keeps_the_latest() {
        let p = StallProbe::start().unwrap();
        std::thread::sleep(Duration::from_millis(60));
        let s = p.stop();
        // Each wake-up takes at least the period: at most ~60 of them.
        assert!(s.wakeups >= 1 && s.wakeups <= 61, "{s:?}");
        assert!(s.stalls <= s.wakeups, "{s:?}");
        assert!(s.longest_ms >= 0.0, "{s:?}");
    }
}
