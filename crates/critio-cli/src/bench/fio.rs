//! The raw device's own figures, from fio on the same file system: the
//! floor under what a server on it can show, and what the machine itself
//! does to a pattern of I/O, measured in the same run as the servers.
//!
//! ```text
//!  probe = one measured fio job (4 KiB, O_DIRECT), optionally next to a
//!          background job in its own reporting group (sequential writes of
//!          128 KiB at QD 4, unpaced or at a static rate, or unpaced
//!          sequential reads of one request size at QD 1),
//!          and optionally with every CPU kept busy by `SCHED_IDLE`
//!          spinners (they take only CPU time nothing else wants)
//!  fio --output-format=json ... ─> the measured job's completion latency
//!          percentiles (p50/p99/p99.9/max) and rate, and the background
//!          job's rate
//! ```
//!
//! fio comes from Debian's `fio`; where it is missing, [`version`] says
//! so and the caller prints the reason instead of the table.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};

use super::placement::spawn_on;
use super::report::Table;

/// A sequential background job next to the measured one.
#[derive(Clone, Copy, Debug)]
pub struct Background {
    /// Reads (`true`) or writes.
    pub read: bool,
    /// The size of each request, in KiB.
    pub bs_kib: u32,
    /// Requests in flight.
    pub iodepth: u32,
    /// Its rate limit in MiB/s (0: unpaced).
    pub rate_mib_s: u32,
}

/// One measured fio job, optionally next to a background one.
#[derive(Clone, Debug)]
pub struct Probe {
    /// The row's name.
    pub label: &'static str,
    /// Reads (`true`) or writes.
    pub read: bool,
    /// fio options of the measured job (besides its file, size and time).
    pub job: &'static [&'static str],
    /// A background job next to it.
    pub background: Option<Background>,
    /// Keep every CPU busy meanwhile with a `SCHED_IDLE` spinner each: on
    /// a virtual machine, whether the guest's CPUs are busy can decide the
    /// device's tail (the host's I/O work competes with busy vCPUs), and
    /// a server's background work keeps them busy.
    pub busy_cpus: bool,
}

/// A `SCHED_IDLE` spinner per CPU until dropped.
struct Spinners {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Spinners {
    fn start() -> Spinners {
        let stop = Arc::new(AtomicBool::new(false));
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let tid = rustix::thread::gettid().as_raw_nonzero().get();
                    // Best effort: where SCHED_IDLE is refused, the spinner
                    // runs at the normal policy and still keeps the CPU busy.
                    let _ = critio::sys::set_thread_policy(tid, critio::sys::SchedPolicy::Idle);
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        Spinners { stop, threads }
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// What one probe measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    /// The measured job's operations per second.
    pub ops_per_s: f64,
    /// Its completion latency percentiles and maximum, in ms.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Maximum.
    pub max_ms: f64,
    /// The background job's throughput, in MB/s, if there was one.
    pub background_mb_s: Option<f64>,
}

/// The fio job name of the measured job and of the background one.
const MEASURED: &str = "measured";
const BACKGROUND: &str = "background";

/// fio's version, or why it cannot be used.
pub fn version() -> Result<String, String> {
    match Command::new("fio").arg("--version").output() {
        Ok(out) if out.status.success() => {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        }
        Ok(out) => Err(format!(
            "fio --version failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!(
            "fio is not installed (Debian: apt-get install fio): {e}"
        )),
    }
}

/// Runs `probe` for `seconds` in `dir` (its files are removed after), on
/// `cpus` if given.
pub fn measure(
    dir: &Path,
    probe: &Probe,
    seconds: u32,
    cpus: Option<&[usize]>,
) -> Result<Measured, String> {
    let data = dir.join("fio-measured.dat");
    let bg = dir.join("fio-background.dat");
    let mut args: Vec<String> = vec![
        "--output-format=json".into(),
        "--direct=1".into(),
        format!("--runtime={seconds}"),
        "--time_based".into(),
        format!("--name={MEASURED}"),
        format!("--filename={}", data.display()),
        // Reads need data there: fio lays the file out first.
        format!("--size={}", if probe.read { "1g" } else { "64m" }),
        "--bs=4k".into(),
        "--group_reporting".into(),
    ];
    args.extend(probe.job.iter().map(|s| (*s).to_owned()));
    if let Some(b) = probe.background {
        args.extend([
            format!("--name={BACKGROUND}"),
            "--new_group".into(),
            format!("--filename={}", bg.display()),
            "--size=1g".into(),
            format!("--rw={}", if b.read { "read" } else { "write" }),
            format!("--bs={}k", b.bs_kib),
            "--ioengine=libaio".into(),
            format!("--iodepth={}", b.iodepth),
            "--numjobs=1".into(),
        ]);
        if b.rate_mib_s > 0 {
            args.push(format!("--rate={}m", b.rate_mib_s));
        }
    }
    let spinners = probe.busy_cpus.then(Spinners::start);
    let out = spawn_on(cpus, || {
        Command::new("fio")
            .args(&args)
            .output()
            .map_err(|e| format!("cannot run fio: {e}"))
    });
    drop(spinners);
    let _ = std::fs::remove_file(&data);
    let _ = std::fs::remove_file(&bg);
    let out = out?;
    if !out.status.success() {
        return Err(format!(
            "fio {}: {}",
            probe.label,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    parse(
        &String::from_utf8_lossy(&out.stdout),
        probe.read,
        probe.background,
    )
    .map_err(|e| format!("fio {}: {e}", probe.label))
}

/// The measured job's figures from fio's JSON output (anything fio
/// printed before the JSON is skipped).
fn parse(out: &str, read: bool, background: Option<Background>) -> Result<Measured, String> {
    parse_job(out, MEASURED, read, background)
}

/// Job `name`'s figures (its reads' if `read`, else its writes') from
/// fio's JSON output, with `background`'s throughput.
fn parse_job(
    out: &str,
    name: &str,
    read: bool,
    background: Option<Background>,
) -> Result<Measured, String> {
    let start = out.find('{').ok_or("no JSON in fio's output")?;
    let v: Value = serde_json::from_str(&out[start..]).map_err(|e| format!("fio's JSON: {e}"))?;
    let jobs = v["jobs"].as_array().ok_or("no jobs in fio's JSON")?;
    let job = |name: &str| {
        jobs.iter()
            .find(|j| j["jobname"] == name)
            .ok_or_else(|| format!("no job {name} in fio's JSON"))
    };
    let m = &job(name)?[if read { "read" } else { "write" }];
    let clat = &m["clat_ns"];
    let max_ms = clat["max"].as_f64().ok_or("no max")? / 1e6;
    // fio reports a percentile as the upper bound of its histogram bucket
    // (up to 1/64 above the true value), which may exceed the exact max
    // it also reports: a percentile is never above the max.
    let pct = |p: &str| -> Result<f64, String> {
        clat["percentile"][p]
            .as_f64()
            .map(|ns| (ns / 1e6).min(max_ms))
            .ok_or_else(|| format!("no {p} percentile"))
    };
    let background_mb_s = match background {
        Some(b) => {
            let dir = if b.read { "read" } else { "write" };
            let bytes = job(BACKGROUND)?[dir]["bw_bytes"].as_f64();
            Some(bytes.ok_or_else(|| format!("no {dir} bw_bytes of the background job"))? / 1e6)
        }
        None => None,
    };
    Ok(Measured {
        ops_per_s: m["iops"].as_f64().ok_or("no iops")?,
        p50_ms: pct("50.000000")?,
        p99_ms: pct("99.000000")?,
        p999_ms: pct("99.900000")?,
        max_ms,
        background_mb_s,
    })
}

/// A log commit: a 4 KiB `O_DIRECT|O_DSYNC` write, QD 1.
const COMMIT: &[&str] = &["--rw=write", "--ioengine=psync", "--sync=dsync"];

/// The probes of a key-value server's device: a log commit (a 4 KiB
/// `O_DIRECT|O_DSYNC` write, QD 1) alone, with every CPU busy, next to a
/// writer held to a static rate (32 MiB/s, and 160 MiB/s with and without
/// the CPUs busy), next to an unpaced one, and next to an unpaced reader
/// of one request at a time of 1 MiB and of 128 KiB (a snapshot scan's
/// request size before `critio serve` cut it, and after; not the server's
/// own load: the two readers read at their own rates, and the server has
/// several such requests in flight); and 4 KiB random reads from one
/// thread with 16 in flight (io_uring) against 16 threads with one each
/// (as a server's blocking readers do it).
pub const KV_PROBES: [Probe; 10] = [
    commit("commit (4 KiB O_DSYNC write, QD 1), alone", None, false),
    commit("commit, CPUs busy (SCHED_IDLE spinners)", None, true),
    commit("commit, writer at 32 MiB/s", writer(32), false),
    commit("commit, writer at 160 MiB/s", writer(160), false),
    commit("commit, writer at 160 MiB/s, CPUs busy", writer(160), true),
    commit("commit, unpaced writer", writer(0), false),
    commit("commit, reader of 1 MiB at QD 1", reader_of(1024), false),
    commit("commit, reader of 128 KiB at QD 1", reader_of(128), false),
    Probe {
        label: "4 KiB random reads, 1 thread, QD 16",
        read: true,
        job: &["--rw=randread", "--ioengine=io_uring", "--iodepth=16"],
        background: None,
        busy_cpus: false,
    },
    Probe {
        label: "4 KiB random reads, 16 threads, QD 1 each",
        read: true,
        job: &["--rw=randread", "--ioengine=psync", "--numjobs=16"],
        background: None,
        busy_cpus: false,
    },
];

const fn commit(label: &'static str, background: Option<Background>, busy_cpus: bool) -> Probe {
    Probe {
        label,
        read: false,
        job: COMMIT,
        background,
        busy_cpus,
    }
}

/// A writer of 128 KiB requests, 4 in flight, at `rate_mib_s` (0: unpaced).
const fn writer(rate_mib_s: u32) -> Option<Background> {
    Some(Background {
        read: false,
        bs_kib: 128,
        iodepth: 4,
        rate_mib_s,
    })
}

/// An unpaced reader of `bs_kib` requests, one at a time.
const fn reader_of(bs_kib: u32) -> Option<Background> {
    Some(Background {
        read: true,
        bs_kib,
        iodepth: 1,
        rate_mib_s: 0,
    })
}

/// A background fio job held to a static rate that runs until dropped,
/// for a load measured beside it: a writer ([`Antagonist::writer`]) or a
/// reader ([`Antagonist::reader`]).
pub struct Antagonist {
    child: std::process::Child,
    /// The file it removes when dropped (its own), if any.
    file: Option<PathBuf>,
    /// Where fio writes its report when stopped by [`Antagonist::finish`]
    /// (a reader's), if anywhere.
    report: Option<PathBuf>,
}

/// The file readers read ([`Antagonist::reader`]), of [`READER_FILE_BYTES`],
/// laid out once for all of them (writing it just before each reader
/// would put half a gigabyte of writes, and the host's flush of them,
/// right before every load beside one); removed when dropped.
pub struct ReaderFile {
    path: PathBuf,
}

impl ReaderFile {
    /// Writes the file in `dir` (so every read of it goes to the device:
    /// a hole reads as zeros without one).
    pub fn lay_out(dir: &Path) -> Result<Self, String> {
        let path = dir.join("fio-reader.dat");
        let layout = Command::new("fio")
            .args(layout_args(&path))
            .stdout(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("cannot run fio: {e}"))?;
        let file = ReaderFile { path };
        if !layout.status.success() {
            return Err(format!(
                "fio could not write the reader's file ({}): {}",
                layout.status,
                String::from_utf8_lossy(&layout.stderr).trim()
            ));
        }
        Ok(file)
    }
}

impl Drop for ReaderFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// How long an [`Antagonist`] waits after it starts before the load beside
/// it begins (fio opens its file and starts its job meanwhile).
const ANTAGONIST_START: std::time::Duration = std::time::Duration::from_secs(1);

/// How long [`Antagonist::finish`] waits for fio to stop and report.
const REPORT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The job name of [`Antagonist::reader`].
const READER: &str = "reader";

/// The file a reader reads: laid out before it starts, so every read
/// goes to the device (a hole reads as zeros without it).
const READER_FILE_BYTES: u64 = 512 << 20;

impl Antagonist {
    /// Sequential `O_DIRECT` writes of 128 KiB, 4 in flight (the
    /// background job of the probes), at `bytes_per_s`, in `dir`, on
    /// `cpus` if given; returns once it is writing (or has failed: fio's
    /// own words).
    pub fn writer(dir: &Path, bytes_per_s: u64, cpus: Option<&[usize]>) -> Result<Self, String> {
        let file = dir.join("fio-writer.dat");
        Self::spawn(writer_args(&file, bytes_per_s), Some(file), None, cpus)
    }

    /// Random `O_DIRECT` reads of 4 KiB, 16 in flight (a server's misses:
    /// one page each, many clients), at `reads_per_s`, of `file`; on
    /// `cpus` if given. [`Antagonist::finish`] says what its reads took.
    pub fn reader(
        file: &ReaderFile,
        reads_per_s: u64,
        cpus: Option<&[usize]>,
    ) -> Result<Self, String> {
        let report = file.path.with_file_name("fio-reader-report.json");
        // One left by a run that was killed is not this reader's.
        let _ = std::fs::remove_file(&report);
        let mut args = reader_args(&file.path, reads_per_s);
        args.extend([
            "--output-format=json".into(),
            format!("--output={}", report.display()),
        ]);
        Self::spawn(args, None, Some(report), cpus)
    }

    /// Stops the job and returns what its own requests took since it
    /// started (fio reports on SIGTERM): a reader's reads; `None` for a
    /// writer, which keeps no report.
    pub fn finish(mut self) -> Result<Option<Measured>, String> {
        let Some(report) = self.report.take() else {
            return Ok(None); // dropped: stopped outright
        };
        // fio stops its jobs on SIGTERM, then writes its report.
        super::peers::terminate(&self.child);
        let stopped = super::peers::wait_or_kill(&mut self.child, REPORT_WAIT);
        let text = std::fs::read_to_string(&report);
        let _ = std::fs::remove_file(&report);
        if !stopped {
            return Err(format!("fio did not stop within {REPORT_WAIT:?}; killed"));
        }
        let text = text.map_err(|e| format!("fio's report {}: {e}", report.display()))?;
        parse_job(&text, READER, true, None).map(Some)
    }

    fn spawn(
        args: Vec<String>,
        file: Option<PathBuf>,
        report: Option<PathBuf>,
        cpus: Option<&[usize]>,
    ) -> Result<Self, String> {
        let mut cmd = Command::new("fio");
        cmd.args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        let child = match spawn_on(cpus, || {
            cmd.spawn().map_err(|e| format!("cannot run fio: {e}"))
        }) {
            Ok(child) => child,
            Err(why) => {
                if let Some(file) = &file {
                    let _ = std::fs::remove_file(file);
                }
                return Err(why);
            }
        };
        // Dropped on an early end: its file goes too.
        let mut a = Antagonist {
            child,
            file,
            report,
        };
        std::thread::sleep(ANTAGONIST_START);
        if let Ok(Some(status)) = a.child.try_wait() {
            let mut why = String::new();
            if let Some(mut err) = a.child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut err, &mut why);
            }
            return Err(format!("fio ended at once ({status}): {}", why.trim()));
        }
        Ok(a)
    }
}

/// fio's arguments for [`Antagonist::writer`] of `file` (a day at most:
/// it is stopped when dropped).
fn writer_args(file: &Path, bytes_per_s: u64) -> Vec<String> {
    vec![
        "--name=writer".into(),
        format!("--filename={}", file.display()),
        "--size=1g".into(),
        "--direct=1".into(),
        "--rw=write".into(),
        "--bs=128k".into(),
        "--ioengine=libaio".into(),
        "--iodepth=4".into(),
        format!("--rate={}", bytes_per_s.max(1)),
        "--time_based".into(),
        "--runtime=86400".into(),
    ]
}

/// fio's arguments that write the file of [`Antagonist::reader`].
fn layout_args(file: &Path) -> Vec<String> {
    vec![
        "--name=layout".into(),
        format!("--filename={}", file.display()),
        format!("--size={READER_FILE_BYTES}"),
        "--direct=1".into(),
        "--rw=write".into(),
        "--bs=1m".into(),
        "--ioengine=libaio".into(),
        "--iodepth=4".into(),
    ]
}

/// fio's arguments for [`Antagonist::reader`] of `file`.
fn reader_args(file: &Path, reads_per_s: u64) -> Vec<String> {
    vec![
        format!("--name={READER}"),
        format!("--filename={}", file.display()),
        format!("--size={READER_FILE_BYTES}"),
        "--direct=1".into(),
        "--rw=randread".into(),
        "--bs=4k".into(),
        "--ioengine=libaio".into(),
        "--iodepth=16".into(),
        format!("--rate_iops={}", reads_per_s.max(1)),
        "--time_based".into(),
        "--runtime=86400".into(),
    ]
}

impl Drop for Antagonist {
    fn drop(&mut self) {
        // Not once it has ended and been waited for: its pid may be reused.
        if matches!(self.child.try_wait(), Ok(None)) {
            super::peers::kill_tree(self.child.id());
            let _ = self.child.wait();
        }
        for path in self.file.iter().chain(&self.report) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Runs `probes` in `dir`, `seconds` each, one after another, into a
/// table; on `cpus` if given.
pub fn table(
    dir: &Path,
    probes: &[Probe],
    seconds: u32,
    cpus: Option<&[usize]>,
) -> Result<Table, String> {
    let version = version()?;
    let on = cpus.map_or_else(String::new, |c| {
        format!(", on CPU {}", super::placement::format_cpu_list(c))
    });
    let mut t = Table::new(
        &format!("the device alone: {version} on the same file system, O_DIRECT, {seconds} s per row{on} (latencies in ms)"),
        &["fio job", "ops/s", "p50", "p99", "p99.9", "max", "background MB/s"],
    );
    for p in probes {
        let m = measure(dir, p, seconds, cpus)?;
        t.row(vec![
            json!(p.label),
            json!(m.ops_per_s.round()),
            json!(m.p50_ms),
            json!(m.p99_ms),
            json!(m.p999_ms),
            json!(m.max_ms),
            m.background_mb_s.map_or(json!("-"), |w| json!(w)),
        ]);
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Trimmed from fio 3.33's JSON (a measured job and a background
    /// writer).
    const OUT: &str = r#"note: a line fio printed first
{
  "fio version" : "fio-3.33",
  "jobs" : [
    {
      "jobname" : "measured",
      "read" : { "iops" : 0.0, "clat_ns" : { "max" : 0, "percentile" : { "50.000000" : 0 } } },
      "write" : {
        "iops" : 7324.5,
        "clat_ns" : {
          "max" : 1580000,
          "percentile" : { "50.000000" : 130000, "99.000000" : 232000, "99.900000" : 528000 }
        }
      }
    },
    {
      "jobname" : "background",
      "read" : { "bw_bytes" : 0, "iops" : 0.0 },
      "write" : { "bw_bytes" : 33554432, "iops" : 256.0 }
    }
  ]
}"#;

    #[test]
    fn the_measured_job_and_the_background_one_are_read_from_fios_json() {
        let m = parse(OUT, false, writer(32)).unwrap();
        assert_eq!(m.ops_per_s, 7324.5);
        assert_eq!((m.p50_ms, m.p99_ms, m.p999_ms), (0.13, 0.232, 0.528));
        assert_eq!(m.max_ms, 1.58);
        assert_eq!(m.background_mb_s, Some(33.554432));
        // A background reader's bytes are its reads.
        let reader = OUT.replace(
            r#""read" : { "bw_bytes" : 0, "iops" : 0.0 },
      "write" : { "bw_bytes" : 33554432"#,
            r#""read" : { "bw_bytes" : 880000000, "iops" : 6714.0 },
      "write" : { "bw_bytes" : 0"#,
        );
        let m = parse(&reader, false, reader_of(128)).unwrap();
        assert_eq!(m.background_mb_s, Some(880.0));
        // Bytes missing are an error, not a zero; no background job, none.
        let no_bytes = OUT.replace(r#""bw_bytes" : 33554432, "#, "");
        let e = parse(&no_bytes, false, writer(32)).unwrap_err();
        assert!(e.contains("no write bw_bytes of the background job"), "{e}");
        assert_eq!(parse(OUT, false, None).unwrap().background_mb_s, None);
        // The read side has no 99th percentile: an error, not a zero.
        assert!(parse(OUT, true, None).unwrap_err().contains("99.000000"));
        assert!(parse("fio: no output", false, None).is_err());
    }

    #[test]
    fn a_percentile_bucket_above_the_max_is_read_as_the_max() {
        // A max of 0.5 ms, inside the 99.9th percentile's bucket (0.528).
        let out = OUT.replace("\"max\" : 1580000", "\"max\" : 500000");
        let m = parse(&out, false, None).unwrap();
        assert_eq!((m.p99_ms, m.p999_ms, m.max_ms), (0.232, 0.5, 0.5));
    }

    #[test]
    fn antagonists_are_held_to_their_rate_and_stop_when_dropped_or_finished() {
        let args = writer_args(Path::new("/d/w.dat"), 150_000_000);
        assert!(args.contains(&"--rate=150000000".to_owned()), "{args:?}");
        assert!(args.contains(&"--filename=/d/w.dat".to_owned()));
        assert!(args.contains(&"--direct=1".to_owned()));
        // A rate of zero would be no limit to fio: at least a byte, a read.
        assert!(writer_args(Path::new("w"), 0).contains(&"--rate=1".to_owned()));
        let args = reader_args(Path::new("/d/r.dat"), 12_000);
        for a in [
            "--rate_iops=12000",
            "--rw=randread",
            "--bs=4k",
            "--direct=1",
        ] {
            assert!(args.contains(&a.to_owned()), "{a} not in {args:?}");
        }
        assert!(reader_args(Path::new("r"), 0).contains(&"--rate_iops=1".to_owned()));
        if version().is_err() {
            return eprintln!("skipped: no fio");
        }
        let dir = std::env::temp_dir().join(format!("critio-fio-w-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Each runs, and stops when dropped; the writer's file goes with it.
        // A file system without O_DIRECT (tmpfs) is not a device: skipped.
        let check = |a: Result<Antagonist, String>, name: &str| match a {
            Ok(mut a) => {
                assert!(
                    a.child.try_wait().unwrap().is_none(),
                    "{name}: still running"
                );
                drop(a);
            }
            Err(e) => eprintln!("skipped: {e}"),
        };
        check(Antagonist::writer(&dir, 8 << 20, None), "writer");
        assert!(
            !dir.join("fio-writer.dat").exists(),
            "the writer's file goes"
        );
        let reader_file = dir.join("fio-reader.dat");
        match ReaderFile::lay_out(&dir) {
            Ok(f) => {
                // Two readers of one file, one after the other: the file
                // outlives them, and goes with the ReaderFile.
                check(Antagonist::reader(&f, 500, None), "reader");
                assert!(reader_file.exists(), "a reader leaves the file");
                check(Antagonist::reader(&f, 500, None), "second reader");
                // Stopped by finish, a reader says what its reads took,
                // and its report goes; a writer keeps none.
                let report = dir.join("fio-reader-report.json");
                if let Ok(r) = Antagonist::reader(&f, 500, None) {
                    std::thread::sleep(std::time::Duration::from_millis(500));
                    let pid = r.child.id();
                    let m = r.finish().unwrap().expect("a reader reports");
                    assert!(m.ops_per_s > 0.0 && m.p999_ms > 0.0, "{m:?}");
                    assert!(m.p50_ms <= m.p999_ms && m.p999_ms <= m.max_ms, "{m:?}");
                    assert!(!report.exists(), "the report goes");
                    let alive = std::path::PathBuf::from(format!("/proc/{pid}/stat"));
                    let stat = std::fs::read_to_string(alive).unwrap_or_default();
                    assert!(!stat.contains("(fio)"), "fio ended: {stat}");
                }
                if let Ok(w) = Antagonist::writer(&dir, 8 << 20, None) {
                    assert_eq!(w.finish().unwrap(), None);
                }
                drop(f);
            }
            Err(e) => eprintln!("skipped: {e}"),
        }
        assert!(!reader_file.exists(), "the reader's file goes");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_probe_runs_where_fio_is_installed() {
        if let Err(why) = version() {
            eprintln!("skipped: {why}");
            return;
        }
        let dir = std::env::temp_dir().join(format!("critio-fio-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // With the spinners too: they must stop when fio ends.
        let probe = Probe {
            background: writer(8),
            busy_cpus: true,
            ..KV_PROBES[0].clone()
        };
        let m = measure(&dir, &probe, 1, None);
        let _ = std::fs::remove_dir_all(&dir);
        let m = match m {
            // A file system without O_DIRECT (tmpfs) is not a device.
            Err(e) if e.contains("direct=1") => return eprintln!("skipped: {e}"),
            m => m.unwrap(),
        };
        assert!(m.ops_per_s > 0.0, "{m:?}");
        assert!(m.p50_ms > 0.0 && m.p50_ms <= m.p99_ms && m.p99_ms <= m.p999_ms);
        assert!(m.p999_ms <= m.max_ms + 1e-9, "{m:?}");
        assert!(m.background_mb_s.is_some_and(|w| w > 0.0), "{m:?}");
    }
}
