//! `critio bench kv-schedulers`: kv-vs-redis's "fits" load under the
//! BGSAVE/BGREWRITEAOF loop on each of the kernel's I/O schedulers for the
//! disk under DIR, with the settings a user would pick instead of critio
//! side by side on each: stock Redis (`appendfsync always`), critio-kv
//! `none` (no priorities), `kernel-idle` (`ionice -c3` on the background
//! threads: the kernel's own priorities) and `rcp`.
//!
//! ```text
//!  for each scheduler the disk offers (none, mq-deadline, kyber, bfq),
//!  and bfq again with slice_idle 0:
//!    echo SCHED > /sys/block/DISK/queue/scheduler
//!    for redis-server, critio-kv none, kernel-idle, rcp:
//!      start it in DIR ─> preload KEYS keys of 1 KiB ─> BGSAVE and
//!      BGREWRITEAOF back to back, each waited for (critio-kv also
//!      checkpoints every second) ─> redis-benchmark -t set, then -t get
//!      (-c 20 -r KEYS -d 1024) ─> stop the loop, stop the server
//!  the scheduler the disk had is put back with its tunables, whatever
//!  happened
//! ```
//!
//! Why: how much of the kernel's help a server gets depends on the
//! scheduler. mq-deadline serves I/O priority classes in order; bfq
//! serves the idle class only once no other class has I/O for a while
//! and weighs the best-effort levels; kyber and `none` ignore priorities
//! altogether. Distributions pick different ones (`none` for NVMe and
//! often virtio, mq-deadline or bfq for SATA disks), and a user can pick
//! bfq with `ionice` to get the kernel's strongest isolation. critio's
//! classes are made in its own layers before the kernel sees a request,
//! so its advantage should not depend on which one runs below it; this
//! experiment checks that on the real device.
//!
//! Each scheduler runs with its defaults, except the one in place, which
//! keeps its tunables as they were. bfq runs once more with its idling
//! off (`slice_idle` 0).
//! bfq idles after a queue's request for its next one before it serves
//! another queue, and takes a request's priority from its thread, not
//! from the request; `critio serve` notes it when its disk has bfq with
//! idling on.
//!
//! Targets, per scheduler, are the floor a priority scheme worth its
//! place has to clear against the best the kernel gives on that
//! scheduler: rcp's SET and GET p99.9 under the loop no higher than the
//! lower of `none`'s and `kernel-idle`'s (at least 1.0x), and its
//! background keeping at least 80% of `none`'s jobs a second (the
//! rounds goal of kv-vs-redis). Switching schedulers needs root (writing
//! `/sys/block/DISK/queue/scheduler`); without it, or with `--quick` (a
//! smoke run beside other tests, which must not change the disk under
//! them), the experiment runs on the scheduler in place and says so.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use critio_kv::Scheme;
use serde_json::json;

use super::host;
use super::kv_background::TestResult;
use super::peers::{benchmark, progress_bar, redis_server_version, BackgroundLoop, Kind, Peer};
use super::report::{ratio, Goal, Report, Table, Target};
use super::BenchArgs;

const CLIENTS: u32 = 20;
const VALUE_BYTES: usize = 1024;
const SCHEMES: [Scheme; 3] = [Scheme::None, Scheme::KernelIdle, Scheme::Rcp];

/// The load: kv-vs-redis's "fits" size (or a small one for `--quick`).
#[derive(Clone, Copy, Debug)]
struct Load {
    keys: u64,
    /// critio-kv's image file, reserved in full (and written with zeros)
    /// when the server starts: a short run asks for little.
    image_bytes: u64,
    cache_bytes: u64,
    set_requests: u64,
    get_requests: u64,
}

fn load(quick: bool) -> Load {
    if quick {
        Load {
            keys: 20_000,
            image_bytes: 1 << 30,
            cache_bytes: 64 << 20,
            set_requests: 3_000,
            get_requests: 6_000,
        }
    } else {
        Load {
            keys: 300_000,
            image_bytes: 8 << 30,
            cache_bytes: 1 << 30,
            set_requests: 200_000,
            get_requests: 600_000,
        }
    }
}

/// One server's load under the loop on one scheduler.
#[derive(Clone, Debug)]
struct Run {
    scheduler: String,
    kind: Kind,
    set: TestResult,
    get: TestResult,
    /// Background jobs completed during the load (the one in progress by
    /// its share), per second of load.
    jobs_per_s: f64,
}

/// The schedulers a `queue/scheduler` file lists (`none [mq-deadline]
/// kyber bfq`), in its order, and the active one.
fn schedulers(text: &str) -> (Vec<String>, Option<String>) {
    let all = text
        .split_whitespace()
        .map(|s| s.trim_matches(|c| c == '[' || c == ']').to_owned())
        .collect();
    (all, critio::sys::active_scheduler(text))
}

/// The settings to run: each scheduler, and bfq once more
/// with its idling off (`slice_idle` 0), the setting `critio serve`'s
/// note on bfq recommends.
fn settings(schedulers: &[String]) -> Vec<String> {
    let mut all = schedulers.to_vec();
    if schedulers.iter().any(|s| s == "bfq") {
        all.push(BFQ_NO_IDLING.to_owned());
    }
    all
}

/// bfq with `slice_idle` 0.
const BFQ_NO_IDLING: &str = "bfq slice_idle=0";

/// A disk's I/O scheduler, switched for the experiment and put back as it
/// was, with its tunables, when dropped, or when the process gets SIGINT,
/// SIGTERM or SIGHUP meanwhile (a run stopped with Ctrl-C does not leave
/// the disk on another scheduler).
struct Switch {
    /// What to put back; `None` once put back. Shared with the signal
    /// watcher, and held while a setting is written, so a signal cannot
    /// restore between the two writes of one.
    saved: Arc<Mutex<Option<Saved>>>,
}

/// The disk's scheduler before the experiment.
struct Saved {
    /// The disk's `queue` directory in sysfs.
    queue: PathBuf,
    original: String,
    /// The original scheduler's tunables (`queue/iosched/*`), each as read.
    tunables: Vec<(PathBuf, String)>,
}

/// The queue directory of the disk under `dir`, its schedulers and the
/// active one; Err says why there is none to switch.
fn disk_queue(dir: &Path) -> Result<(PathBuf, Vec<String>, String), String> {
    let disk = critio::sys::disk_of(dir)
        .ok_or_else(|| format!("{} is on no block device", dir.display()))?;
    let queue = PathBuf::from(format!("/sys/block/{}/queue", disk.name));
    let file = queue.join("scheduler");
    let text = std::fs::read_to_string(&file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let (all, active) = schedulers(&text);
    let active = active.ok_or_else(|| format!("{} names no scheduler", file.display()))?;
    Ok((queue, all, active))
}

impl Switch {
    /// Takes over the disk's scheduler: checks that `active` can be
    /// written (root), saves it and its tunables, and starts the signal
    /// watcher. Err: nothing was changed, and nothing will be.
    fn take(queue: PathBuf, active: String) -> Result<Switch, String> {
        // Writing the active scheduler again changes nothing.
        write_scheduler(&queue.join("scheduler"), &active)?;
        let tunables = std::fs::read_dir(queue.join("iosched"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let value = std::fs::read_to_string(e.path()).ok()?;
                Some((e.path(), value.trim().to_owned()))
            })
            .collect();
        let saved = Arc::new(Mutex::new(Some(Saved {
            queue,
            original: active,
            tunables,
        })));
        watch_signals(saved.clone())?;
        Ok(Switch { saved })
    }

    /// Makes `setting` (a scheduler, or [`BFQ_NO_IDLING`]) the active one.
    fn set(&self, setting: &str) -> Result<(), String> {
        let guard = self.saved.lock().unwrap_or_else(|e| e.into_inner());
        let saved = guard.as_ref().ok_or("the scheduler was put back")?;
        let file = saved.queue.join("scheduler");
        if setting == BFQ_NO_IDLING {
            write_scheduler(&file, "bfq")?;
            let idle = saved.queue.join("iosched/slice_idle");
            std::fs::write(&idle, "0")
                .map_err(|e| format!("cannot write 0 to {}: {e}", idle.display()))
        } else {
            write_scheduler(&file, setting)
        }
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        restore(&self.saved);
    }
}

/// Puts the original scheduler back, then its tunables (a scheduler
/// starts with its defaults), once.
fn restore(saved: &Mutex<Option<Saved>>) {
    let mut guard = saved.lock().unwrap_or_else(|e| e.into_inner());
    let Some(s) = guard.take() else {
        return;
    };
    if let Err(why) = write_scheduler(&s.queue.join("scheduler"), &s.original) {
        eprintln!("kv-schedulers: could not put the scheduler back: {why}");
        return;
    }
    for (file, value) in &s.tunables {
        let now = std::fs::read_to_string(file).unwrap_or_default();
        if now.trim() != value && std::fs::write(file, value).is_err() {
            eprintln!(
                "kv-schedulers: could not put {} back to {value}",
                file.display()
            );
        }
    }
}

/// On SIGINT, SIGTERM or SIGHUP: puts the scheduler back if it is not
/// yet, then exits as the signal would have (status 128 + its number).
/// The watcher stays for the process's life (`bench all` runs other
/// experiments after this one): signal-hook does not give a signal its
/// default action back once watched, so the watcher keeps ending the
/// process on one, which after the switch dropped restores nothing.
fn watch_signals(saved: Arc<Mutex<Option<Saved>>>) -> Result<(), String> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .map_err(|e| format!("cannot watch for signals: {e}"))?;
    std::thread::Builder::new()
        .name("kv-schedulers-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                if saved.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
                    eprintln!("kv-schedulers: signal {sig}: putting the disk's scheduler back");
                }
                restore(&saved);
                std::process::exit(128 + sig);
            }
        })
        .map(drop)
        .map_err(|e| format!("cannot start the signal watcher: {e}"))
}

fn write_scheduler(file: &Path, scheduler: &str) -> Result<(), String> {
    std::fs::write(file, scheduler)
        .map_err(|e| format!("cannot write {scheduler} to {}: {e}", file.display()))?;
    let now = std::fs::read_to_string(file).map_err(|e| e.to_string())?;
    match critio::sys::active_scheduler(&now) {
        Some(s) if s == scheduler => Ok(()),
        other => Err(format!(
            "{} says {other:?} after {scheduler} was written",
            file.display()
        )),
    }
}

fn run_peer(
    kind: Kind,
    scheduler: &str,
    dir: &Path,
    load: &Load,
    args: &BenchArgs,
) -> Result<Run, String> {
    let label = format!("{scheduler} {}", kind.label());
    let pb = progress_bar(&label);
    let peer = Peer::start(
        kind,
        dir,
        load.image_bytes,
        load.cache_bytes,
        &args.placement,
    )?;
    for line in &peer.banner {
        pb.suspend(|| eprintln!("kv-schedulers: {label}: {line}"));
    }
    pb.set_message("preload");
    peer.preload(load.keys, VALUE_BYTES, &pb)?;
    pb.set_message("with background work");
    let bg = BackgroundLoop::start(&peer)?;
    let started = Instant::now();
    let bench = |test, n| benchmark(&peer, test, n, CLIENTS, load.keys, VALUE_BYTES);
    let set = bench("set", load.set_requests);
    let get = bench("get", load.get_requests);
    let seconds = started.elapsed().as_secs_f64();
    let rounds = bg.stop()?;
    pb.finish_and_clear();
    peer.stop()?;
    Ok(Run {
        scheduler: scheduler.to_owned(),
        kind,
        set: set?,
        get: get?,
        jobs_per_s: rounds.jobs() / seconds.max(1e-9),
    })
}

fn latency_table(runs: &[Run], load: &Load) -> Table {
    let mut t = Table::new(
        &format!(
            "under the BGSAVE/BGREWRITEAOF loop, by the disk's I/O scheduler: {} keys x {VALUE_BYTES} B, critio cache {} MiB; \
             redis-benchmark -c {CLIENTS} -r {} -d {VALUE_BYTES}, SET -n {}, GET -n {}",
            load.keys,
            load.cache_bytes >> 20,
            load.keys,
            load.set_requests,
            load.get_requests
        ),
        &[
            "scheduler",
            "server",
            "SET req/s",
            "SET p99 ms",
            "SET p99.9 ms",
            "SET max ms",
            "GET req/s",
            "GET p99 ms",
            "GET p99.9 ms",
            "GET max ms",
            "jobs/s",
        ],
    );
    for r in runs {
        t.row(vec![
            json!(r.scheduler),
            json!(r.kind.label()),
            json!(r.set.rps),
            json!(r.set.p99_ms),
            json!(r.set.p999_ms),
            json!(r.set.max_ms),
            json!(r.get.rps),
            json!(r.get.p99_ms),
            json!(r.get.p999_ms),
            json!(r.get.max_ms),
            json!(r.jobs_per_s),
        ]);
    }
    t
}

fn find<'a>(runs: &'a [Run], scheduler: &str, kind: Kind) -> Option<&'a Run> {
    runs.iter()
        .find(|r| r.scheduler == scheduler && r.kind == kind)
}

/// Each other server's p99.9 over rcp's, per scheduler and test.
fn ratio_table(runs: &[Run], scheds: &[String]) -> Table {
    let mut t = Table::new(
        "p99.9 under the loop: the other server's over rcp's, on the same scheduler (above 1: rcp's is lower); jobs/s: rcp's over the other's",
        &["scheduler", "over rcp's", "SET", "GET", "jobs/s"],
    );
    for s in scheds {
        let Some(rcp) = find(runs, s, Kind::Critio(Scheme::Rcp)) else {
            continue;
        };
        for o in runs
            .iter()
            .filter(|r| &r.scheduler == s && r.kind != rcp.kind)
        {
            t.row(vec![
                json!(s),
                json!(o.kind.label()),
                json!(ratio(o.set.p999_ms, rcp.set.p999_ms)),
                json!(ratio(o.get.p999_ms, rcp.get.p999_ms)),
                json!(ratio(rcp.jobs_per_s, o.jobs_per_s)),
            ]);
        }
    }
    t
}

fn targets(runs: &[Run], scheds: &[String]) -> Vec<Target> {
    let mut t = Vec::new();
    for s in scheds {
        let get = |scheme| find(runs, s, Kind::Critio(scheme));
        let (Some(rcp), Some(none), Some(idle)) =
            (get(Scheme::Rcp), get(Scheme::None), get(Scheme::KernelIdle))
        else {
            continue;
        };
        // `bfq slice_idle=0` names its targets `bfq-slice_idle-0-...`.
        let s = s.replace([' ', '='], "-");
        for (test, of) in [
            ("set", (|r: &Run| r.set.p999_ms) as fn(&Run) -> f64),
            ("get", |r: &Run| r.get.p999_ms),
        ] {
            t.push(Target::new(
                &format!("{s}-{test}-p99.9-best-kernel-over-rcp"),
                ratio(of(none).min(of(idle)), of(rcp)),
                Goal::AtLeast(1.0),
                "x",
            ));
        }
        t.push(Target::new(
            &format!("{s}-jobs-per-s-rcp-vs-none"),
            ratio(rcp.jobs_per_s, none.jobs_per_s),
            Goal::AtLeast(0.8),
            "x",
        ));
    }
    t
}

/// Runs the experiment.
pub fn run(args: &BenchArgs) -> Result<Report, String> {
    super::kv_background::require_redis_benchmark()?;
    let redis = redis_server_version();
    let mut peers: Vec<Kind> = SCHEMES.iter().map(|&s| Kind::Critio(s)).collect();
    match &redis {
        Ok(_) => peers.insert(0, Kind::Redis),
        Err(why) => eprintln!("kv-schedulers: skipping the Redis runs: {why}"),
    }
    let dir = args.file_system_dir("kv-schedulers")?;
    let machine = host::describe(&dir);
    let load = load(args.quick);
    // The schedulers to run, and the switch that puts the disk's back.
    let (scheds, switch, how) = match disk_queue(&dir) {
        Err(why) => (
            vec!["in-place".to_owned()],
            None,
            format!("on the scheduler in place ({why})"),
        ),
        Ok((_, _, active)) if args.quick => (
            vec![active],
            None,
            "on the scheduler in place (--quick never switches it)".to_owned(),
        ),
        Ok((queue, all, active)) => match Switch::take(queue, active.clone()) {
            Ok(switch) => (
                settings(&all),
                Some(switch),
                format!("on each scheduler in turn, the one in place ({active}) with its tunables as they were, the others with their defaults"),
            ),
            Err(why) => (
                vec![active],
                None,
                format!("on the scheduler in place (cannot switch: {why})"),
            ),
        },
    };
    eprintln!(
        "kv-schedulers: {} ({machine}), {how}: {}",
        dir.display(),
        scheds.join(", ")
    );
    let mut runs = Vec::new();
    for s in &scheds {
        if let Some(sw) = &switch {
            sw.set(s)?;
        }
        for &kind in &peers {
            runs.push(run_peer(kind, s, &dir, &load, args)?);
        }
    }
    drop(switch);
    Ok(Report {
        experiment: "kv-schedulers".into(),
        description: format!(
            "Redis {} (appendonly yes, appendfsync always) and critio-kv none, kernel-idle \
             (ionice -c3 on its background threads) and rcp (critio serve --device file: \
             io_uring, O_DIRECT) on the same file system, {} on {machine}, {how}; each under \
             BGSAVE and BGREWRITEAOF back to back. p99.9 is redis-benchmark's first listed \
             percentile at or above 99.9%.",
            redis.as_deref().unwrap_or("(not installed)"),
            dir.display(),
        ),
        tables: vec![latency_table(&runs, &load), ratio_table(&runs, &scheds)],
        targets: targets(&runs, &scheds),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scheduler_file_lists_its_schedulers_and_the_active_one() {
        let (all, active) = schedulers("none [mq-deadline] kyber bfq\n");
        assert_eq!(all, ["none", "mq-deadline", "kyber", "bfq"]);
        assert_eq!(active.as_deref(), Some("mq-deadline"));
        let (all, active) = schedulers("[none] \n");
        assert_eq!(all, ["none"]);
        assert_eq!(active.as_deref(), Some("none"));
    }

    #[test]
    fn bfq_runs_again_with_its_idling_off() {
        let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            settings(&s(&["none", "mq-deadline", "bfq"])),
            s(&["none", "mq-deadline", "bfq", BFQ_NO_IDLING])
        );
        assert_eq!(settings(&s(&["none", "kyber"])), s(&["none", "kyber"]));
    }

    fn run(scheduler: &str, kind: Kind, set_p999: f64, get_p999: f64, jobs: f64) -> Run {
        let r = |name: &str, p999_ms| TestResult {
            name: name.to_owned(),
            rps: 30_000.0,
            p50_ms: 0.5,
            p99_ms: 1.0,
            p999_ms,
            max_ms: 9.0,
        };
        Run {
            scheduler: scheduler.to_owned(),
            kind,
            set: r("SET", set_p999),
            get: r("GET", get_p999),
            jobs_per_s: jobs,
        }
    }

    #[test]
    fn rcp_is_set_against_the_better_of_the_kernel_settings_on_each_scheduler() {
        let (none, idle, rcp) = (
            Kind::Critio(Scheme::None),
            Kind::Critio(Scheme::KernelIdle),
            Kind::Critio(Scheme::Rcp),
        );
        let runs = [
            run("bfq", Kind::Redis, 28.0, 4.0, 0.5),
            run("bfq", none, 21.0, 2.4, 1.8),
            run("bfq", idle, 20.0, 3.0, 1.9),
            run("bfq", rcp, 5.0, 1.0, 1.2),
            run("none", none, 4.0, 1.6, 2.0),
            run("none", idle, 4.5, 1.2, 2.0),
            run("none", rcp, 5.0, 0.9, 1.9),
        ];
        let scheds = ["bfq".to_owned(), "none".to_owned()];
        let t = targets(&runs, &scheds);
        let line = |name: &str| t.iter().find(|t| t.name == name).unwrap();
        // bfq: kernel-idle's SET tail is the better kernel one.
        assert!((line("bfq-set-p99.9-best-kernel-over-rcp").measured - 4.0).abs() < 1e-9);
        assert!(line("bfq-set-p99.9-best-kernel-over-rcp").pass);
        assert!((line("bfq-jobs-per-s-rcp-vs-none").measured - 1.2 / 1.8).abs() < 1e-9);
        assert!(!line("bfq-jobs-per-s-rcp-vs-none").pass);
        // none: rcp's SET tail above none's is a miss, its GET a pass.
        assert!(!line("none-set-p99.9-best-kernel-over-rcp").pass);
        assert!(line("none-get-p99.9-best-kernel-over-rcp").pass);
        assert_eq!(t.len(), 6);
        // Every other server's row beside rcp's, Redis's too.
        let r = ratio_table(&runs, &scheds);
        assert_eq!(r.rows.len(), 5);
        assert_eq!(r.rows[0][1], json!("redis"));
    }
}
