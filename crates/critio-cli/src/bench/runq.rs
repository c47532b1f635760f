//! How long a server's threads (its event loops) waited for a CPU during
//! a load.
//!
//! The kernel keeps, for each thread, the time it ran and the time it
//! waited on a run queue, runnable but not running
//! (`/proc/PID/task/TID/schedstat`, the same as `/proc/TID/schedstat`, which
//! `critio::sys::thread_cpu_times` reads: `run_ns wait_ns slices`). Summed over
//! the threads named (`kv-vs-redis` names the event loops: Redis's main
//! thread, critio-kv's workers) and divided by the load's length, it
//! tells how much of the requests' time went to waiting for a CPU rather
//! than to anything the server did:
//!
//! ```text
//!   before the load: wait_ns of each thread named ─┐
//!   after the load:  wait_ns of each thread named ─┴─> Σ (after - before) / load seconds = ms/s
//! ```
//!
//! On two CPUs shared by the load generator, the server and a background
//! job, this is where much of a tail under the loop goes; 250 ms/s for
//! one event loop means it was runnable but not running a quarter of the
//! time, and every client it serves waited through that.

use std::collections::HashMap;
use std::time::Instant;

/// Run-queue waits of some threads of one process at one moment.
#[derive(Clone, Debug)]
pub struct RunQueue {
    /// Nanoseconds waited so far, by thread id.
    waits: HashMap<i32, u64>,
    at: Instant,
}

impl RunQueue {
    /// The threads of process `pid` whose names start with one of
    /// `names`, now. None if the process's threads cannot be read (it
    /// ended, or this kernel has no schedstat).
    pub fn sample(pid: u32, names: &[&str]) -> Option<Self> {
        let at = Instant::now();
        let mut waits = HashMap::new();
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
            let path = task.ok()?.path();
            let Some(tid) = path.file_name().and_then(|n| n.to_str()?.parse().ok()) else {
                continue;
            };
            // A thread may end between the listing and the reads.
            let Ok(comm) = std::fs::read_to_string(path.join("comm")) else {
                continue;
            };
            if !names.iter().any(|n| comm.trim_end().starts_with(n)) {
                continue;
            }
            if let Ok(t) = critio::sys::thread_cpu_times(tid) {
                waits.insert(tid, t.wait_ns);
            }
        }
        Some(Self { waits, at })
    }

    /// Milliseconds the threads in both samples waited on a run queue
    /// between `self` and `later`, per second between them. None if no
    /// thread is in both.
    pub fn ms_per_s(&self, later: &Self) -> Option<f64> {
        let secs = later.at.duration_since(self.at).as_secs_f64();
        let mut any = false;
        let mut waited = 0u64;
        for (tid, &after) in &later.waits {
            if let Some(&before) = self.waits.get(tid) {
                any = true;
                waited += after.saturating_sub(before);
            }
        }
        (any && secs > 0.0).then(|| waited as f64 / 1e6 / secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_of_threads_in_both_samples_are_summed_per_second() {
        let t0 = Instant::now();
        let before = RunQueue {
            waits: HashMap::from([(1, 1_000_000), (2, 0), (3, 7)]),
            at: t0,
        };
        let after = RunQueue {
            // Thread 3 ended, thread 4 started: neither counts.
            waits: HashMap::from([(1, 201_000_000), (2, 100_000_000), (4, 9_000_000)]),
            at: t0 + std::time::Duration::from_secs(2),
        };
        assert_eq!(before.ms_per_s(&after), Some(150.0));
        let none = RunQueue {
            waits: HashMap::new(),
            at: t0 + std::time::Duration::from_secs(2),
        };
        assert_eq!(before.ms_per_s(&none), None);
    }

    #[test]
    fn this_process_threads_are_found_by_name() {
        if std::fs::metadata("/proc/self/schedstat").is_err() {
            return; // a kernel without scheduler statistics: nothing to read
        }
        let name = "runq-probe";
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (up_tx, up_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                // Named by now: std names the thread as it starts.
                up_tx.send(()).unwrap();
                rx.recv()
            })
            .unwrap();
        up_rx.recv().unwrap();
        let pid = std::process::id();
        let s = RunQueue::sample(pid, &[name]).expect("/proc is readable");
        assert_eq!(s.waits.len(), 1, "{:?}", s.waits);
        assert!(RunQueue::sample(pid, &["no-such-thread"])
            .unwrap()
            .waits
            .is_empty());
        tx.send(()).unwrap();
        t.join().unwrap().unwrap();
    }
}
