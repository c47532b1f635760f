//! A probe of the machine itself while a load runs: a thread at a
//! real-time priority sleeps 1 ms at a time and records how late it wakes.
//!
//! ```text
//!  loop: t = now; sleep(1 ms); late = now - t - 1 ms  ─> wake-ups, late > 3 ms, longest
//! ```
//!
//! A real-time thread preempts every normal one, so on a healthy machine
//! it wakes within tens of microseconds whatever the load. It runs one
//! level above critio's lock ceiling ([`critio::sys::CEILING_RT_PRIORITY`]),
//! so a critio-kv thread in a ceiling section does not hold it off either
//! (at the same level, first in first out, one could: such a section would
//! count as a stall of the machine). When it is
//! milliseconds late, something above every normal thread held its CPU:
//! on a virtual machine, most often the host (the virtual CPUs were not
//! running: the host ran something else, or throttled the guest), or
//! else the kernel's own interrupt work. A request's thread waits through
//! such a stall like any other, whatever its priority, so a table of
//! tails prints them beside it.
//! Without the right to run real-time (not root) the probe runs at normal
//! priority and says so: its lateness then includes CPU queueing.
//!
//! Beside the stalls, the probe reads the kernel's CPU accounting
//! (`/proc/stat`) before and after the load: how many of the guest's CPUs
//! were busy on average, and the share of CPU time the host took
//! (`steal`: a virtual CPU ready to run, not run). On this project's
//! virtual machine the two explain each other: with the disk busy and
//! the guest's CPUs mostly busy too, the host stops the whole guest for
//! tens of milliseconds, which shows as steal and as stalls. So it also
//! reads what the guest's disks read and wrote meanwhile
//! (`/sys/block/*/stat`, whole disks, not loop or RAM devices, whose I/O
//! lands on a disk counted already): on such a machine the rate at which
//! a server moves bytes (its background's writes, its misses' reads) is
//! what the host makes every thread pay for, and a frontier measured at
//! the same rates tells what any server could keep.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use critio::sys::{set_thread_fifo, CEILING_RT_PRIORITY};
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
    /// The guest's CPUs busy on average during the load (of
    /// [`Stalls::cpus`]); `None` where `/proc/stat` cannot be read.
    pub busy_cpus: Option<f64>,
    /// The share of the CPUs' time the host took (`steal`), in percent.
    pub steal_pct: Option<f64>,
    /// The CPUs the kernel accounts for.
    pub cpus: u32,
    /// What the guest's disks wrote per second during the load, in MB/s;
    /// `None` where `/sys/block` cannot be read.
    pub disk_write_mb_s: Option<f64>,
    /// What they read per second, in MB/s (the same).
    pub disk_read_mb_s: Option<f64>,
}

/// Bytes (read, written) so far by the whole disks in `/sys/block`
/// (`stat`'s third and seventh fields count 512-byte sectors), leaving
/// out loop, RAM and device-mapper devices: what they move lands on a
/// disk counted here.
fn disk_bytes() -> Option<(u64, u64)> {
    let (mut read, mut written) = (0u64, 0u64);
    for entry in std::fs::read_dir("/sys/block").ok()?.flatten() {
        let name = entry.file_name();
        if !counts_as_disk(&name.to_string_lossy()) {
            continue;
        }
        let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
        let (r, w) = sectors_moved(&stat)?;
        read += r * 512;
        written += w * 512;
    }
    Some((read, written))
}

/// Whether a `/sys/block` entry is a disk of its own.
fn counts_as_disk(name: &str) -> bool {
    !["loop", "ram", "zram", "dm-", "md", "sr", "nbd"]
        .iter()
        .any(|p| name.starts_with(p))
}

/// The sectors (read, written), from a block device's `stat` line.
fn sectors_moved(stat: &str) -> Option<(u64, u64)> {
    let field = |n| stat.split_whitespace().nth(n)?.parse().ok();
    Some((field(2)?, field(6)?))
}

/// CPU time from `/proc/stat`'s first line, in the kernel's ticks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct CpuTimes {
    /// user, nice, system, irq, softirq.
    busy: u64,
    /// idle and iowait.
    idle: u64,
    steal: u64,
}

impl CpuTimes {
    /// Parses the `cpu` line of `/proc/stat` (`cpu user nice system idle
    /// iowait irq softirq steal guest guest_nice`; guest time is counted
    /// in user already) and the number of `cpuN` lines.
    fn parse(stat: &str) -> Option<(Self, u32)> {
        let mut lines = stat.lines();
        let total = lines.next()?.strip_prefix("cpu ")?;
        let f: Vec<u64> = total
            .split_whitespace()
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        if f.len() < 8 {
            return None;
        }
        let cpus = lines
            .take_while(|l| l.starts_with("cpu"))
            .count()
            .try_into()
            .ok()?;
        let times = Self {
            busy: f[0] + f[1] + f[2] + f[5] + f[6],
            idle: f[3] + f[4],
            steal: f[7],
        };
        Some((times, cpus))
    }

    fn now() -> Option<(Self, u32)> {
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// Busy CPUs and steal in percent between `self` and `later`, on `cpus`
    /// CPUs; `None` if no time passed.
    fn between(self, later: Self, cpus: u32) -> Option<(f64, f64)> {
        let busy = later.busy.checked_sub(self.busy)?;
        let idle = later.idle.checked_sub(self.idle)?;
        let steal = later.steal.checked_sub(self.steal)?;
        let all = busy + idle + steal;
        (all > 0).then(|| {
            let all = all as f64;
            (
                busy as f64 / all * f64::from(cpus),
                steal as f64 / all * 100.0,
            )
        })
    }
}

/// A running probe; [`StallProbe::stop`] ends it.
pub struct StallProbe {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Stalls>,
    cpu: Option<(CpuTimes, u32)>,
    moved: Option<((u64, u64), Instant)>,
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
        Ok(Self {
            stop,
            thread,
            cpu: CpuTimes::now(),
            moved: disk_bytes().map(|b| (b, Instant::now())),
        })
    }

    /// Stops it and returns what it saw.
    pub fn stop(self) -> Stalls {
        let cpu = self
            .cpu
            .zip(CpuTimes::now())
            .and_then(|((before, cpus), (after, _))| {
                before.between(after, cpus).map(|x| (x, cpus))
            });
        let moved = self.moved.zip(disk_bytes()).and_then(|((b, t), a)| {
            let secs = t.elapsed().as_secs_f64();
            let rate = |after: u64, before: u64| after.saturating_sub(before) as f64 / secs / 1e6;
            (secs > 0.0).then(|| (rate(a.0, b.0), rate(a.1, b.1)))
        });
        self.stop.store(true, Ordering::Relaxed);
        let mut s = self.thread.join().unwrap_or_default();
        s.disk_read_mb_s = moved.map(|m| m.0);
        s.disk_write_mb_s = moved.map(|m| m.1);
        if let Some(((busy, steal), cpus)) = cpu {
            s.busy_cpus = Some(busy);
            s.steal_pct = Some(steal);
            s.cpus = cpus;
        }
        s
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
    let columns: Vec<String> = std::iter::once("setup".to_owned())
        .chain(
            ["SET", "GET"]
                .iter()
                .flat_map(|test| COLUMNS.map(|c| format!("{test} {c}"))),
        )
        .collect();
    let columns: Vec<&str> = columns.iter().map(String::as_str).collect();
    let mut t = Table::new(title, &columns);
    for (label, [set, get]) in rows {
        let mut row = vec![json!(label)];
        row.extend(set.cells());
        row.extend(get.cells());
        t.row(row);
    }
    t
}

/// The column names of [`Stalls::cells`].
pub const COLUMNS: [&str; 6] = [
    "stalls",
    "stall max ms",
    "CPUs busy",
    "steal %",
    "disk MB/s read",
    "disk MB/s written",
];

impl Stalls {
    /// Its cells under [`COLUMNS`]; `-` for what was not measured.
    pub fn cells(&self) -> [serde_json::Value; 6] {
        [
            json!(self.stalls),
            json!(self.longest_ms),
            json!(self.busy_cpus),
            json!(self.steal_pct),
            json!(self.disk_read_mb_s),
            json!(self.disk_write_mb_s),
        ]
    }
}

/// Says what the probe is, for an experiment's description: whether it
/// ran real-time in every load of `seen`.
pub fn describe<'a>(seen: impl IntoIterator<Item = &'a Stalls>) -> String {
    let seen: Vec<&Stalls> = seen.into_iter().collect();
    let realtime = seen.iter().all(|s| s.realtime);
    let cpus = seen.iter().map(|s| s.cpus).max().unwrap_or(0);
    format!(
        "stalls: how often a {} thread sleeping 1 ms at a time woke more than {} ms late \
         during that load ({}), and its latest wake-up; CPUs busy: the guest's CPUs busy \
         on average (of {cpus}); steal %: the share of their time the host took \
         (/proc/stat); disk MB/s read and written: what the guest's disks read and wrote \
         per second meanwhile, foreground and background (/sys/block/*/stat)",
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
        // One level above critio's lock ceiling: a server's ceiling
        // section (its cleaner holding key stripes, real-time at the
        // ceiling) would otherwise keep the probe off its CPU like the
        // host does, and count as the machine's stall.
        realtime: set_thread_fifo(0, CEILING_RT_PRIORITY + 1).is_ok(),
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
        if std::path::Path::new("/proc/stat").exists() {
            assert!(s.cpus >= 1, "{s:?}");
            let busy = s.busy_cpus.expect("/proc/stat is readable");
            assert!((0.0..=f64::from(s.cpus)).contains(&busy), "{s:?}");
            assert!(s.steal_pct.is_some_and(|x| (0.0..=100.0).contains(&x)));
        }
    }

    #[test]
    fn a_block_devices_stat_gives_its_sectors_read_and_written_and_only_disks_count() {
        // reads, merged, sectors, ms, writes, merged, sectors, ms, ...
        let stat =
            "   1200      3   96000    500     4000     10  2048000   9000    0  1000  9500\n";
        assert_eq!(sectors_moved(stat), Some((96_000, 2_048_000)));
        assert_eq!(sectors_moved("1 2 3"), None);
        assert!(counts_as_disk("vda") && counts_as_disk("nvme0n1") && counts_as_disk("sdb"));
        assert!(!counts_as_disk("loop3") && !counts_as_disk("dm-0") && !counts_as_disk("zram0"));
        if disk_bytes().is_some() {
            let p = StallProbe::start().unwrap();
            std::thread::sleep(Duration::from_millis(20));
            let s = p.stop();
            assert!(s.disk_write_mb_s.is_some_and(|x| x >= 0.0), "{s:?}");
            assert!(s.disk_read_mb_s.is_some_and(|x| x >= 0.0), "{s:?}");
        }
    }

    const STAT: &str = "cpu  100 10 50 800 20 5 5 10 0 0\n\
                        cpu0 50 5 25 400 10 2 3 5 0 0\n\
                        cpu1 50 5 25 400 10 3 2 5 0 0\n\
                        intr 12345\n";

    #[test]
    fn proc_stat_gives_busy_idle_and_steal_and_the_cpu_count() {
        let (t, cpus) = CpuTimes::parse(STAT).unwrap();
        assert_eq!(cpus, 2);
        assert_eq!(
            t,
            CpuTimes {
                busy: 100 + 10 + 50 + 5 + 5,
                idle: 800 + 20,
                steal: 10
            }
        );
        assert_eq!(CpuTimes::parse("intr 1\n"), None);
        assert_eq!(CpuTimes::parse("cpu  1 2 x 4 5 6 7 8\n"), None);
        assert_eq!(CpuTimes::parse("cpu  1 2 3\n"), None);
    }

    #[test]
    fn busy_cpus_and_steal_are_shares_of_the_time_between_two_readings() {
        let before = CpuTimes {
            busy: 100,
            idle: 100,
            steal: 0,
        };
        // 200 ticks passed on 2 CPUs: 150 busy, 30 idle, 20 stolen.
        let after = CpuTimes {
            busy: 250,
            idle: 130,
            steal: 20,
        };
        let (busy, steal) = before.between(after, 2).unwrap();
        assert!((busy - 1.5).abs() < 1e-9, "{busy}");
        assert!((steal - 10.0).abs() < 1e-9, "{steal}");
        assert_eq!(before.between(before, 2), None, "no time passed");
        assert_eq!(after.between(before, 2), None, "counters went back");
    }
}
