//! What the kernel's scheduler says of a thread's CPU time
//! (`/proc/TID/schedstat`): how long it ran, and how long it
//! waited on a run queue, runnable but not running. The CPU floor
//! (`context`) reads it to see whether a background thread gets the CPU it
//! wants.

use std::io;

/// A thread's scheduler times since it started, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// Time on a CPU.
    pub run_ns: u64,
    /// Time runnable on a run queue, waiting for a CPU.
    pub wait_ns: u64,
}

impl CpuTimes {
    /// Parses a `schedstat` line: `run_ns wait_ns timeslices`.
    pub fn parse(line: &str) -> Option<CpuTimes> {
        let mut fields = line.split_ascii_whitespace().map(str::parse::<u64>);
        let run_ns = fields.next()?.ok()?;
        let wait_ns = fields.next()?.ok()?;
        fields.next()?.ok()?;
        Some(CpuTimes { run_ns, wait_ns })
    }

    /// What happened between `earlier` and these times (0 where a counter
    /// went back: another thread with a reused id).
    pub fn since(self, earlier: CpuTimes) -> CpuTimes {
        CpuTimes {
            run_ns: self.run_ns.saturating_sub(earlier.run_ns),
            wait_ns: self.wait_ns.saturating_sub(earlier.wait_ns),
        }
    }
}

/// The scheduler times of thread `tid` (of any process).
pub fn thread_cpu_times(tid: i32) -> io::Result<CpuTimes> {
    let path = format!("/proc/{tid}/schedstat");
    let line = std::fs::read_to_string(&path)?;
    CpuTimes::parse(&line).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{path}: `{}` is not `run wait slices`", line.trim()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_lines_parse_and_subtract() {
        let a = CpuTimes::parse("371637671 402534 24\n").unwrap();
        assert_eq!(
            a,
            CpuTimes {
                run_ns: 371637671,
                wait_ns: 402534
            }
        );
        assert_eq!(CpuTimes::parse("1 2"), None);
        assert_eq!(CpuTimes::parse("1 x 3"), None);
        let b = CpuTimes {
            run_ns: 371637671 + 10,
            wait_ns: 402534 + 5,
        };
        assert_eq!(
            b.since(a),
            CpuTimes {
                run_ns: 10,
                wait_ns: 5
            }
        );
        assert_eq!(a.since(b), CpuTimes::default());
    }

    #[test]
    fn a_busy_thread_has_run_time() {
        let tid = rustix::thread::gettid().as_raw_nonzero().get();
        let before = thread_cpu_times(tid).unwrap();
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(20) {
            std::hint::black_box(0);
        }
        let d = thread_cpu_times(tid).unwrap().since(before);
        assert!(d.run_ns >= 5_000_000, "{d:?}");
    }
}
