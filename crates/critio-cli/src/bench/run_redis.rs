//! `critio bench run-redis`: real, unmodified Redis (Debian's
//! `redis-server`, `appendonly yes`, `appendfsync always`) four ways, side
//! by side in one run, on the same file system:
//!
//! ```text
//!  alone        stock redis-server, no background work
//!  stock        stock redis-server, BGSAVE and BGREWRITEAOF back to back (each waited for)
//!  ionice -c3   the same, its fork children put in the kernel's idle I/O class and at
//!               CPU nice 10 as they appear (what a user scripts with `ionice -c3 -p CHILD`
//!               and `renice`; critio run nices background threads to 10 too)
//!  critio run   the same, under `critio run --preset redis`
//!  critio run, background_idle
//!               the same with `background_idle = true`: the children also run
//!               SCHED_IDLE (CPU only when no other thread wants it), an opt-in trade
//!  no I/O       stock with the loop, its data in memory (tmpfs, /dev/shm): what the
//!               loop costs Redis with no disk at all (fork, copy-on-write, CPU), a
//!               floor no I/O policy can go below
//!  no I/O alone the same data in memory with no loop: the loop's cost without a disk
//!               is the ratio of these two rows. Redis serves GETs from memory either
//!               way, so where that ratio misses a GET target, no I/O policy can meet
//!               it on this machine (SETs on the disk wait for fsync instead of the CPU)
//!
//!  each: fresh data directory -> preload KEYS keys of 1 KiB -> redis-benchmark -t set,
//!        then -t get (-c 20 -r KEYS -d 1024), the background loop running throughout
//! ```
//!
//! Targets (issue 14), from this one run: under `critio run`, p99.9 within
//! 1.5x of alone and throughput at least 0.9x alone, for SET and for GET,
//! and at least 80% as many background jobs per second as stock (the job
//! in progress when the load ends counted by the share of it done).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use critio::sys::{set_thread_ioprio, IoPriority};
use serde_json::json;

use super::host;
use super::kv_background::TestResult;
use super::peers::{benchmark, redis_server_version, BackgroundLoop, Peer, Rounds};
use super::placement::Placement;
use super::report::{ratio, Goal, Report, Table, Target};
use super::stalls::{self, probed, Stalls};
use super::BenchArgs;

const CLIENTS: u32 = 20;
/// Where the no-I/O run keeps its data (skipped where it is not a tmpfs).
const TMPFS: &str = "/dev/shm";
const VALUE_BYTES: usize = 1024;

/// How the server runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setup {
    Alone,
    Stock,
    IoniceChildren,
    CritioRun,
    CritioRunIdle,
    NoIo,
    NoIoAlone,
}

const SETUPS: [Setup; 7] = [
    Setup::Alone,
    Setup::Stock,
    Setup::IoniceChildren,
    Setup::CritioRun,
    Setup::CritioRunIdle,
    Setup::NoIo,
    Setup::NoIoAlone,
];

impl Setup {
    fn name(self) -> &'static str {
        match self {
            Setup::Alone => "alone",
            Setup::Stock => "stock",
            Setup::IoniceChildren => "ionice -c3 + nice children",
            Setup::CritioRun => "critio run",
            Setup::CritioRunIdle => "critio run, background_idle",
            Setup::NoIo => "no I/O (tmpfs)",
            Setup::NoIoAlone => "no I/O (tmpfs), alone",
        }
    }

    fn background(self) -> bool {
        !matches!(self, Setup::Alone | Setup::NoIoAlone)
    }

    fn in_memory(self) -> bool {
        matches!(self, Setup::NoIo | Setup::NoIoAlone)
    }
}

struct Size {
    keys: u64,
    set_requests: u64,
    get_requests: u64,
}

fn size(quick: bool) -> Size {
    if quick {
        Size {
            keys: 20_000,
            set_requests: 5_000,
            get_requests: 10_000,
        }
    } else {
        Size {
            keys: 1_000_000,
            set_requests: 300_000,
            get_requests: 1_000_000,
        }
    }
}

struct Run {
    setup: Setup,
    set: TestResult,
    get: TestResult,
    seconds: f64,
    rounds: Rounds,
    /// What `critio run --stats` printed (critio run only).
    stats: Vec<String>,
    /// The machine's stalls during the SET and the GET load.
    stalls: [Stalls; 2],
}

impl Run {
    fn jobs_per_s(&self) -> f64 {
        self.rounds.jobs() / self.seconds.max(1e-9)
    }
}

/// Puts every child process of `pid` in the idle I/O class, at CPU nice
/// 10, as it appears, until stopped.
struct IoniceChildren {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<u64>,
}

impl IoniceChildren {
    fn start(pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut done = std::collections::HashSet::new();
                while !stop.load(Ordering::Relaxed) {
                    for child in children(pid) {
                        if !done.insert(child) {
                            continue;
                        }
                        if set_thread_ioprio(child, IoPriority::Idle).is_err() {
                            done.remove(&child); // gone already, or not yet visible
                        } else {
                            // SAFETY: setpriority takes integers; the child
                            // is the server's.
                            unsafe {
                                libc::setpriority(libc::PRIO_PROCESS, child as libc::id_t, 10)
                            };
                        }
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                done.len() as u64
            })
        };
        Self { stop, handle }
    }

    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or(0)
    }
}

/// The child processes of `pid` (`/proc/PID/task/PID/children`).
fn children(pid: u32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect()
}

fn run_setup(setup: Setup, size: &Size, dir: &Path, placement: &Placement) -> Result<Run, String> {
    let base = if setup.in_memory() {
        PathBuf::from(TMPFS)
    } else {
        dir.to_path_buf()
    };
    let data = base.join(format!("critio-run-redis-{}", std::process::id()));
    let stats_path = dir.join("critio-run.stats");
    let config = dir.join("critio-run-idle.toml");
    let wrapper: Vec<OsString> = if matches!(setup, Setup::CritioRun | Setup::CritioRunIdle) {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find critio: {e}"))?;
        let mut w: Vec<OsString> = vec![
            exe.into(),
            "run".into(),
            "--preset".into(),
            "redis".into(),
            "--stats".into(),
        ];
        if setup == Setup::CritioRunIdle {
            std::fs::write(&config, "background_idle = true\n")
                .map_err(|e| format!("{}: {e}", config.display()))?;
            w.extend(["--config".into(), config.clone().into()]);
        }
        w.push("--".into());
        w
    } else {
        Vec::new()
    };
    let peer = Peer::redis_under(&data, &wrapper, Some(&stats_path), placement)?;
    eprintln!("run-redis: {}: preloading {} keys", setup.name(), size.keys);
    let pb = indicatif::ProgressBar::hidden();
    peer.preload(size.keys, VALUE_BYTES, &pb)?;
    eprintln!("run-redis: {}: redis-benchmark SET and GET", setup.name());
    let bg = if setup.background() {
        Some(BackgroundLoop::start(&peer)?)
    } else {
        None
    };
    let ionice = (setup == Setup::IoniceChildren).then(|| IoniceChildren::start(peer.pid()));
    let started = Instant::now();
    let bench = |test, n| probed(|| benchmark(&peer, test, n, CLIENTS, size.keys, VALUE_BYTES));
    let set = bench("set", size.set_requests);
    let get = bench("get", size.get_requests);
    let seconds = started.elapsed().as_secs_f64();
    let rounds = match bg {
        Some(bg) => bg.stop()?,
        None => Rounds::default(),
    };
    if let Some(w) = ionice {
        eprintln!(
            "run-redis: ionice -c3: {} children put in the idle class at nice 10",
            w.stop()
        );
    }
    peer.stop()?;
    let stats = std::fs::read_to_string(&stats_path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("critio run") || l.starts_with("  "))
        .map(str::to_owned)
        .collect();
    let _ = std::fs::remove_file(&stats_path);
    let _ = std::fs::remove_file(&config);
    let ((set, set_stalls), (get, get_stalls)) = (set?, get?);
    Ok(Run {
        setup,
        set,
        get,
        seconds,
        rounds,
        stats,
        stalls: [set_stalls, get_stalls],
    })
}

/// Runs the experiment.
pub fn run(args: &BenchArgs) -> Result<Report, String> {
    super::kv_background::require_redis_benchmark()?;
    let version = redis_server_version()?;
    let dir = args.file_system_dir("run-redis")?;
    let machine = host::describe(&dir);
    let size = size(args.quick);
    eprintln!(
        "run-redis: Redis {version} on {} ({machine}), {} keys",
        dir.display(),
        size.keys
    );
    let mut runs = Vec::new();
    for setup in SETUPS {
        if setup.in_memory() && !Path::new(TMPFS).is_dir() {
            eprintln!(
                "run-redis: skipping the {} run: {TMPFS} is not there",
                setup.name()
            );
            continue;
        }
        runs.push(run_setup(setup, &size, &dir, &args.placement)?);
    }
    for r in &runs {
        for line in &r.stats {
            eprintln!("run-redis: {}: {line}", r.setup.name());
        }
    }
    // Each server removed its own data directory when it stopped; `dir`
    // itself may be the user's (`--device file:DIR`) and stays.
    Ok(Report {
        experiment: "run-redis".into(),
        description: format!(
            "unmodified Redis {version} (appendonly yes, appendfsync always) on {} ({machine}): \
             alone, and while BGSAVE and BGREWRITEAOF run back to back: stock, its children in \
             ionice's idle class and at nice 10, under critio run --preset redis (and with \
             background_idle = true: its background threads SCHED_IDLE too), and stock with its data on \
             tmpfs (no disk I/O: what fork, copy-on-write and the CPU cost alone), with the loop and alone. \
             {} keys x {VALUE_BYTES} B; \
             redis-benchmark -c {CLIENTS} -r {} -d {VALUE_BYTES}, SET -n {}, GET -n {}. p99.9 is \
             redis-benchmark's first listed percentile at or above 99.9%. Placement: {}. {}.",
            dir.display(),
            size.keys,
            size.keys,
            size.set_requests,
            size.get_requests,
            args.placement.describe(),
            stalls::describe(runs.iter().flat_map(|r| &r.stalls)),
        ),
        tables: vec![
            table(&runs),
            stalls::table(
                "the machine during each setup's loads",
                runs.iter().map(|r| (r.setup.name(), r.stalls)),
            ),
        ],
        targets: targets(&runs),
    })
}

fn table(runs: &[Run]) -> Table {
    let mut t = Table::new(
        "Redis alone and under a BGSAVE/BGREWRITEAOF loop, on the disk and in memory (latencies in ms); \
         last job: the share of the job in progress when the load ended that was done (INFO current_fork_perc), counted in jobs/min",
        &[
            "setup",
            "SET rps",
            "SET p50",
            "SET p99",
            "SET p99.9",
            "SET max",
            "GET rps",
            "GET p50",
            "GET p99",
            "GET p99.9",
            "GET max",
            "BGSAVEs",
            "rewrites",
            "last job",
            "jobs/min",
        ],
    );
    for r in runs {
        t.row(vec![
            json!(r.setup.name()),
            json!(r.set.rps),
            json!(r.set.p50_ms),
            json!(r.set.p99_ms),
            json!(r.set.p999_ms),
            json!(r.set.max_ms),
            json!(r.get.rps),
            json!(r.get.p50_ms),
            json!(r.get.p99_ms),
            json!(r.get.p999_ms),
            json!(r.get.max_ms),
            json!(r.rounds.bgsaves),
            json!(r.rounds.rewrites),
            json!(r.rounds.partial),
            json!(r.jobs_per_s() * 60.0),
        ]);
    }
    t
}

fn find(runs: &[Run], setup: Setup) -> &Run {
    runs.iter()
        .find(|r| r.setup == setup)
        .expect("every setup ran")
}

/// Issue 14's goals for one operation of `name`'s run against a run
/// alone (`alone_name`): p99.9 within 1.5x, throughput at least 0.9x.
fn against_alone(
    t: &mut Vec<Target>,
    (name, alone_name): (&str, &str),
    op: &str,
    under: &TestResult,
    alone: &TestResult,
) {
    t.push(Target::new(
        &format!("{name}-{op}-p99.9-vs-{alone_name}"),
        ratio(under.p999_ms, alone.p999_ms),
        Goal::AtMost(1.5),
        "x",
    ));
    t.push(Target::new(
        &format!("{name}-{op}-throughput-vs-{alone_name}"),
        ratio(under.rps, alone.rps),
        Goal::AtLeast(0.9),
        "x",
    ));
}

/// Issue 14's goal for the background: at least 80% of stock's rounds.
fn jobs_against_stock(t: &mut Vec<Target>, name: &str, run: &Run, stock: &Run) {
    t.push(Target::new(
        &format!("{name}-background-jobs-per-s-vs-stock"),
        ratio(run.jobs_per_s(), stock.jobs_per_s()),
        Goal::AtLeast(0.8),
        "x",
    ));
}

fn targets(runs: &[Run]) -> Vec<Target> {
    let (alone, stock, ionice, critio) = (
        find(runs, Setup::Alone),
        find(runs, Setup::Stock),
        find(runs, Setup::IoniceChildren),
        find(runs, Setup::CritioRun),
    );
    let mut t = Vec::new();
    let names = ("critio-run", "alone");
    against_alone(&mut t, names, "SET", &critio.set, &alone.set);
    against_alone(&mut t, names, "GET", &critio.get, &alone.get);
    jobs_against_stock(&mut t, "critio-run", critio, stock);
    // The opt-in trade, against the same goals: what SCHED_IDLE children
    // give GETs, and what they cost the jobs.
    let idle = find(runs, Setup::CritioRunIdle);
    let names = ("critio-run-background_idle", "alone");
    against_alone(&mut t, names, "GET", &idle.get, &alone.get);
    jobs_against_stock(&mut t, "critio-run-background_idle", idle, stock);
    // Against what a user would do instead (informational goals: better
    // than each).
    let in_memory = |setup| runs.iter().find(|r| r.setup == setup);
    if let Some(floor) = in_memory(Setup::NoIo) {
        // How much of stock's SET tail the disk is responsible for: what
        // an I/O policy could remove at most.
        t.push(Target::new(
            "no-I/O-SET-p99.9-vs-alone (the loop's cost without a disk)",
            ratio(floor.set.p999_ms, alone.set.p999_ms),
            Goal::AtMost(1.5),
            "x",
        ));
    }
    if let (Some(l), Some(a)) = (in_memory(Setup::NoIo), in_memory(Setup::NoIoAlone)) {
        // The same goals for the loop with no disk at all: a miss here is
        // the CPU's (fork, copy-on-write, the children's own work on this
        // machine's cores). Redis serves GETs from memory on the disk too,
        // so for GET it is a floor no I/O policy can go below; SETs on the
        // disk wait for fsync, which leaves more CPU to share.
        let names = ("no-I/O-loop", "no-I/O-alone");
        against_alone(&mut t, names, "SET", &l.set, &a.set);
        against_alone(&mut t, names, "GET", &l.get, &a.get);
    }
    for (name, other) in [("stock", stock), ("ionice", ionice)] {
        t.push(Target::new(
            &format!("{name}-SET-p99.9-vs-critio-run (critio run lower)"),
            ratio(other.set.p999_ms, critio.set.p999_ms),
            Goal::AtLeast(1.0),
            "x",
        ));
    }
    t
}
