//! `critio bench kv-vs-redis`: critio-kv against the server its users would
//! pick instead, stock Redis with the same durability, on the same file
//! system, under the same redis-benchmark load, side by side in one run.
//!
//! ```text
//!  for each size (the data fits critio's cache; the data is 4x the cache):
//!    for redis-server (appendonly yes, appendfsync always), critio-kv none, critio-kv rcp:
//!      start it in DIR on the file system under test ─> preload KEYS keys of 1 KiB
//!      alone:      redis-benchmark -t set, then -t get   (-c 20 -r KEYS -d 1024)
//!      background: the same, while BGSAVE and BGREWRITEAOF run back to back
//!                  (each waited for); critio-kv also checkpoints every second, always
//!      stop it, remove DIR
//!  the machine's frontier for a GET (each size): a stock redis-server
//!      with no I/O of its own, the same GET load alone and beside fio
//!      held to what each server's disks moved in its GET load under the
//!      loop (a writer at its write rate; a reader of random pages at its
//!      read rate, where it read: critio-kv's misses at 4x; the readers'
//!      file is written once, before the preload)
//!  then fio on the same file system: a log commit's O_DSYNC write alone,
//!  next to a writer held to a static rate and to an unpaced one, and
//!  random reads from one thread with 16 in flight and from 16 threads
//! ```
//!
//! Targets are ratios from this one run; a miss prints MISS. Redis comes
//! from Debian's `redis-server` (skipped with a printed reason where it is
//! missing); redis-benchmark from `redis-tools`. The critio-kv servers are
//! `critio serve --device file` processes (io_uring, O_DIRECT), as a user
//! runs them. Background progress is compared as jobs (BGSAVE or
//! BGREWRITEAOF) completed per second of load, since a faster server
//! spends fewer seconds on the same requests; the job in progress when
//! the load ends counts by the share of it done (INFO's
//! `current_fork_perc`, which both servers report).
//!
//! Why a frontier: on a virtual machine whose disk the host caches, what
//! the guest reads and writes costs the host CPU that the guest's own
//! CPUs then miss (steal, stalls of the whole guest), so a request that
//! does no I/O at all still pays for the background's writes, and every
//! GET pays for the other GETs' misses. How much, at a given rate, is the
//! machine's; no scheduler inside the guest changes it, short of moving
//! less. (By hand, stock Redis with no persistence serving the 4x GET
//! load from memory had a p99.9 of 1.4-1.8 ms alone and 13.0-15.3 ms
//! beside fio reading random 4 KiB pages at 12k a second, critio-kv's
//! miss rate at that size, whether from one thread with 16 in flight or
//! from 16 threads.) The GET rows of the ceiling table set each ratio
//! against that: the other server's p99.9 under the loop over what a
//! server with no I/O of its own had beside fio at rcp's rates.

use std::path::Path;
use std::time::Instant;

use critio_kv::Scheme;
use serde_json::json;

use super::fio::{self, Antagonist};
use super::host;
use super::kv_background::TestResult;
use super::peers::{
    benchmark, info_u64, progress_bar, redis_server_version, BackgroundLoop, Kind, Peer, Rounds,
};
use super::placement::Placement;
use super::report::{Goal, Report, Table, Target};
use super::runq::RunQueue;
use super::stalls::{self, probed, Stalls};
use super::BenchArgs;

const CLIENTS: u32 = 20;
const VALUE_BYTES: usize = 1024;
const PEERS: [Kind; 3] = [
    Kind::Redis,
    Kind::Critio(Scheme::None),
    Kind::Critio(Scheme::Rcp),
];

/// One data-set size.
#[derive(Clone, Copy, Debug)]
struct Size {
    name: &'static str,
    about: &'static str,
    keys: u64,
    /// critio-kv's image file, reserved in full when the server starts.
    image_bytes: u64,
    cache_bytes: u64,
    set_requests: u64,
    get_requests: u64,
}

fn sizes(quick: bool) -> [Size; 2] {
    if quick {
        [
            Size {
                name: "fits",
                about: "the data fits critio's cache",
                keys: 20_000,
                image_bytes: 1 << 30,
                cache_bytes: 64 << 20,
                set_requests: 3_000,
                get_requests: 6_000,
            },
            Size {
                name: "4x",
                about: "the data is 4x critio's cache",
                keys: 40_000,
                image_bytes: 1 << 30,
                cache_bytes: 10 << 20,
                set_requests: 3_000,
                get_requests: 6_000,
            },
        ]
    } else {
        [
            Size {
                name: "fits",
                about: "the data fits critio's cache",
                keys: 300_000,
                image_bytes: 8 << 30,
                cache_bytes: 1 << 30,
                set_requests: 200_000,
                get_requests: 600_000,
            },
            Size {
                name: "4x",
                about: "the data is 4x critio's cache",
                keys: 1_000_000,
                image_bytes: 8 << 30,
                cache_bytes: 256 << 20,
                set_requests: 200_000,
                get_requests: 600_000,
            },
        ]
    }
}

/// One server's load in one phase.
#[derive(Clone, Debug)]
struct Run {
    kind: Kind,
    size: &'static str,
    background: bool,
    set: TestResult,
    get: TestResult,
    seconds: f64,
    rounds: Rounds,
    checkpoints: u64,
    /// The machine's stalls during the SET and the GET load.
    stalls: [Stalls; 2],
    /// The server's event loops' run-queue wait during the SET and the
    /// GET load, in ms per s ([`super::runq`]).
    runq: [Option<f64>; 2],
}

impl Run {
    fn jobs_per_s(&self) -> f64 {
        self.rounds.jobs() / self.seconds.max(1e-9)
    }
}

fn checkpoints(peer: &Peer) -> u64 {
    peer.info()
        .ok()
        .and_then(|i| info_u64(&i, "checkpoints"))
        .unwrap_or(0)
}

/// One GET load at the machine's frontier: a server that does no I/O,
/// alone or beside fio moving what a server's disks moved.
#[derive(Clone, Debug)]
struct FrontierRow {
    /// Whose rates fio was held to (None: no fio).
    rate_of: Option<Kind>,
    /// The reader's rate asked of fio, in MB/s (None: no reader).
    read_mb_s: Option<f64>,
    /// The writer's rate asked of fio, in MB/s (None: no writer).
    write_mb_s: Option<f64>,
    get: TestResult,
    stalls: Stalls,
}

/// Below this, a server's disk reads during a load get no fio reader at
/// the frontier (what a server that reads its data from memory still
/// reads: its own files, metadata).
const READER_MIN_MB_S: f64 = 1.0;

/// The size of a server's miss, for a reader's rate in reads a second: a
/// page.
const READ_BYTES: f64 = 4096.0;

/// The GET loads at the frontier of `size`: stock Redis with no
/// persistence (so no I/O of its own), preloaded as the servers were,
/// alone and then beside fio held to what each server's disks moved
/// during its GET load under the loop: a writer at its write rate, and a
/// reader at its read rate where it read at least [`READER_MIN_MB_S`]
/// (at 4x, critio-kv's misses).
fn frontier(
    size: &Size,
    dir: &Path,
    runs: &[Run],
    placement: &Placement,
) -> Result<Vec<FrontierRow>, String> {
    let pb = progress_bar(&format!("{} frontier", size.name));
    let rates: Vec<_> = PEERS
        .iter()
        .filter_map(|&kind| {
            let run = runs
                .iter()
                .find(|r| r.kind == kind && r.size == size.name && r.background)?;
            let moved = &run.stalls[1];
            let read = moved.disk_read_mb_s.filter(|&r| r >= READER_MIN_MB_S);
            Some((Some(kind), read, Some(moved.disk_write_mb_s?)))
        })
        .collect();
    // The readers' file first, once: every row then follows the preload,
    // none the writing of the file.
    let reader_file = if rates.iter().any(|r| r.1.is_some()) {
        pb.set_message("the readers' file");
        Some(fio::ReaderFile::lay_out(dir)?)
    } else {
        None
    };
    let peer = Peer::redis_in_memory(&dir.join("frontier"), placement)?;
    pb.set_message("preload");
    peer.preload(size.keys, VALUE_BYTES, &pb)?;
    let cpus = placement.server.as_deref();
    let mut rows = Vec::new();
    for (rate_of, read_mb_s, write_mb_s) in std::iter::once((None, None, None)).chain(rates) {
        pb.set_message(match (read_mb_s, write_mb_s) {
            (None, None) => "GET alone".to_owned(),
            (Some(r), Some(w)) => format!("GET beside fio reading {r:.0} MB/s, writing {w:.0}"),
            (_, w) => format!("GET beside fio writing {:.0} MB/s", w.unwrap_or(0.0)),
        });
        let reader = match (read_mb_s, &reader_file) {
            (Some(r), Some(file)) => Some(Antagonist::reader(
                file,
                (r * 1e6 / READ_BYTES) as u64,
                cpus,
            )?),
            _ => None,
        };
        let writer = match write_mb_s {
            Some(w) => Some(Antagonist::writer(dir, (w * 1e6) as u64, cpus)?),
            None => None,
        };
        let (get, stalls) = probed(|| {
            benchmark(
                &peer,
                "get",
                size.get_requests,
                CLIENTS,
                size.keys,
                VALUE_BYTES,
            )
        })?;
        drop((reader, writer));
        rows.push(FrontierRow {
            rate_of,
            read_mb_s,
            write_mb_s,
            get,
            stalls,
        });
    }
    pb.finish_and_clear();
    peer.stop()?;
    Ok(rows)
}

/// The frontier's p99.9 beside fio at `kind`'s rates.
fn frontier_p999(rows: &[FrontierRow], kind: Kind) -> Option<f64> {
    rows.iter()
        .find(|r| r.rate_of == Some(kind))
        .map(|r| r.get.p999_ms)
}

fn frontier_table(rows: &[FrontierRow], size: &Size) -> Table {
    let mut t = Table::new(
        &format!(
            "the machine's frontier for a GET ({}): stock Redis with no persistence (no I/O of its own), preloaded the same, the same GET load (-n {}) alone and beside fio moving what each server's disks moved in its GET load under the loop: a writer (O_DIRECT, 128 KiB, 4 in flight) at its write rate and, where it read {READER_MIN_MB_S} MB/s or more, a reader (O_DIRECT, random 4 KiB, 16 in flight) at its read rate",
            size.name, size.get_requests
        ),
        &["fio", "fio read MB/s", "fio write MB/s", "req/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms"]
            .into_iter()
            .chain(stalls::COLUMNS)
            .collect::<Vec<_>>(),
    );
    for r in rows {
        let mut row = vec![
            json!(r
                .rate_of
                .map_or("none".to_owned(), |k| format!("at {}'s rates", k.label()))),
            r.read_mb_s.map_or(json!("-"), |x| json!(x)),
            r.write_mb_s.map_or(json!("-"), |x| json!(x)),
            json!(r.get.rps),
            json!(r.get.p50_ms),
            json!(r.get.p99_ms),
            json!(r.get.p999_ms),
            json!(r.get.max_ms),
        ];
        row.extend(r.stalls.cells());
        t.row(row);
    }
    t
}

/// Both phases of one server at one size.
fn run_peer(
    kind: Kind,
    size: &Size,
    dir: &Path,
    placement: &Placement,
) -> Result<Vec<Run>, String> {
    let label = format!("{} {}", size.name, kind.label());
    let pb = progress_bar(&label);
    let peer = Peer::start(kind, dir, size.image_bytes, size.cache_bytes, placement)?;
    for line in &peer.banner {
        pb.suspend(|| eprintln!("kv-vs-redis: {label}: {line}"));
    }
    pb.set_message("preload");
    peer.preload(size.keys, VALUE_BYTES, &pb)?;
    let mut runs = Vec::new();
    for background in [false, true] {
        pb.set_message(if background {
            "with background work"
        } else {
            "alone"
        });
        let bg = if background {
            Some(BackgroundLoop::start(&peer)?)
        } else {
            None
        };
        let ckpt = checkpoints(&peer);
        let started = Instant::now();
        let loops = event_loops(kind);
        let bench = |test, n| {
            let before = RunQueue::sample(peer.pid(), loops);
            let out = probed(|| benchmark(&peer, test, n, CLIENTS, size.keys, VALUE_BYTES));
            let after = RunQueue::sample(peer.pid(), loops);
            let runq = before.zip(after).and_then(|(b, a)| b.ms_per_s(&a));
            out.map(|(result, stalls)| (result, stalls, runq))
        };
        let set = bench("set", size.set_requests);
        let get = bench("get", size.get_requests);
        let seconds = started.elapsed().as_secs_f64();
        let rounds = match bg {
            Some(bg) => bg.stop()?,
            None => Rounds::default(),
        };
        let ((set, set_stalls, set_runq), (get, get_stalls, get_runq)) = (set?, get?);
        runs.push(Run {
            kind,
            size: size.name,
            background,
            set,
            get,
            seconds,
            rounds,
            checkpoints: checkpoints(&peer).saturating_sub(ckpt),
            stalls: [set_stalls, get_stalls],
            runq: [set_runq, get_runq],
        });
    }
    pb.finish_and_clear();
    peer.stop()?;
    Ok(runs)
}

/// The prefixes of the names of the server's event loops, the threads a
/// wait of which every client they serve waits through: Redis's main
/// thread, critio-kv's workers. critio-kv's miss readers are left out:
/// each waits for one request, and summed over 16 of them their waits say
/// more about how many there are than about any request's.
fn event_loops(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Redis => &["redis-server"],
        Kind::Critio(_) => &["kv-worker"],
    }
}

fn find<'a>(runs: &'a [Run], kind: Kind, size: &str, background: bool) -> &'a Run {
    runs.iter()
        .find(|r| r.kind == kind && r.size == size && r.background == background)
        .expect("every server ran every phase")
}

fn latency_table(runs: &[Run], size: &Size) -> Table {
    let mut t = Table::new(
        &format!(
            "{} ({}): {} keys x {VALUE_BYTES} B, critio image {} GiB, cache {} MiB; redis-benchmark -c {CLIENTS} -r {} -d {VALUE_BYTES}, SET -n {}, GET -n {}",
            size.name,
            size.about,
            size.keys,
            size.image_bytes >> 30,
            size.cache_bytes >> 20,
            size.keys,
            size.set_requests,
            size.get_requests
        ),
        &[
            "server", "phase", "test", "req/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms",
        ]
        .into_iter()
        .chain(stalls::COLUMNS)
        .chain(["loop runq ms/s"])
        .collect::<Vec<_>>(),
    );
    for r in runs.iter().filter(|r| r.size == size.name) {
        for ((x, st), runq) in [&r.set, &r.get].into_iter().zip(&r.stalls).zip(r.runq) {
            let mut row = vec![
                json!(r.kind.label()),
                json!(if r.background { "background" } else { "alone" }),
                json!(x.name),
                json!(x.rps),
                json!(x.p50_ms),
                json!(x.p99_ms),
                json!(x.p999_ms),
                json!(x.max_ms),
            ];
            row.extend(st.cells());
            row.push(json!(runq));
            t.row(row);
        }
    }
    t
}

fn background_table(runs: &[Run]) -> Table {
    let mut t = Table::new(
        "background work during the load (phase 'background'; critio-kv checkpoints every second in both phases); \
         last job: the share of the job in progress when the load ended that was done (INFO current_fork_perc), counted in jobs/s",
        &[
            "size",
            "server",
            "phase",
            "seconds",
            "BGSAVE done",
            "BGREWRITEAOF done",
            "last job",
            "jobs/s",
            "checkpoints",
        ],
    );
    for r in runs {
        t.row(vec![
            json!(r.size),
            json!(r.kind.label()),
            json!(if r.background { "background" } else { "alone" }),
            json!(r.seconds),
            json!(r.rounds.bgsaves),
            json!(r.rounds.rewrites),
            json!(r.rounds.partial),
            json!(r.jobs_per_s()),
            json!(r.checkpoints),
        ]);
    }
    t
}

/// For each p99.9 target, what this run allows it: the loop only adds
/// work, so rcp under it is not expected below its own tail alone, and a
/// ratio's ceiling is the other server's tail under the loop over rcp's
/// alone. A goal above its ceiling is out of reach of any scheduling on
/// this machine in this run. For a GET of the data that fits (no I/O of
/// its own) the frontier gives a second, lower one: the other server's
/// tail over that of a server with no I/O of its own beside fio at rcp's
/// disk rates (`-` where it was not measured). So does it for a GET of
/// the data four times the cache, whose misses read the device: beside
/// a reader at rcp's read rate too.
fn ceiling_table(runs: &[Run], with_redis: bool, frontiers: &[(&Size, Vec<FrontierRow>)]) -> Table {
    let (redis, none, rcp) = (
        Kind::Redis,
        Kind::Critio(Scheme::None),
        Kind::Critio(Scheme::Rcp),
    );
    let mut t = Table::new(
        "p99.9 ratios under the loop and their ceiling in this run (the other server's p99.9 under the loop over rcp's alone, which the loop only adds to; frontier ceiling: over the frontier's GET beside fio at rcp's disk rates under the loop)",
        &["size", "test", "over rcp's", "measured", "ceiling", "frontier ceiling", "goal"],
    );
    let mut others = vec![(none, 3.0)];
    if with_redis {
        others.insert(0, (redis, 5.0));
    }
    for size in ["fits", "4x"] {
        let (alone, under) = (find(runs, rcp, size, false), find(runs, rcp, size, true));
        for (other, goal) in &others {
            let o = find(runs, *other, size, true);
            for (test, a, u, b) in [
                ("SET", &alone.set, &under.set, &o.set),
                ("GET", &alone.get, &under.get, &o.get),
            ] {
                if size == "4x" && test == "GET" && *other == redis {
                    continue; // not a target: Redis serves it from memory
                }
                let edge = frontiers
                    .iter()
                    .find(|(s, _)| s.name == size && test == "GET")
                    .and_then(|(_, rows)| frontier_p999(rows, rcp));
                t.row(vec![
                    json!(size),
                    json!(test),
                    json!(other.label()),
                    json!(ratio(b.p999_ms, u.p999_ms)),
                    json!(ratio(b.p999_ms, a.p999_ms)),
                    edge.map_or(json!("-"), |f| json!(ratio(b.p999_ms, f))),
                    json!(goal),
                ]);
            }
        }
    }
    t
}

fn ratio(a: f64, b: f64) -> f64 {
    a / b.max(1e-9)
}

fn targets(runs: &[Run], with_redis: bool) -> Vec<Target> {
    let mut t = Vec::new();
    if with_redis {
        t.extend(redis_targets(runs));
    }
    t.extend(scheme_targets(runs));
    t
}

fn redis_targets(runs: &[Run]) -> Vec<Target> {
    let (redis, rcp) = (Kind::Redis, Kind::Critio(Scheme::Rcp));
    let mut t = Vec::new();
    let alone = (
        find(runs, rcp, "fits", false),
        find(runs, redis, "fits", false),
    );
    t.push(Target::new(
        "fits-alone-set-throughput-rcp-vs-redis",
        ratio(alone.0.set.rps, alone.1.set.rps),
        Goal::AtLeast(1.0),
        "x",
    ));
    t.push(Target::new(
        "fits-alone-get-throughput-rcp-vs-redis",
        ratio(alone.0.get.rps, alone.1.get.rps),
        Goal::AtLeast(0.8),
        "x",
    ));
    for (test, a, b) in [
        ("set", &alone.0.set, &alone.1.set),
        ("get", &alone.0.get, &alone.1.get),
    ] {
        t.push(Target::new(
            &format!("fits-alone-{test}-p99-rcp-vs-redis"),
            ratio(a.p99_ms, b.p99_ms),
            Goal::AtMost(2.0),
            "x",
        ));
    }
    let bg = (
        find(runs, rcp, "fits", true),
        find(runs, redis, "fits", true),
    );
    for (test, a, b) in [("set", &bg.0.set, &bg.1.set), ("get", &bg.0.get, &bg.1.get)] {
        t.push(Target::new(
            &format!("fits-background-{test}-p99.9-redis-over-rcp"),
            ratio(b.p999_ms, a.p999_ms),
            Goal::AtLeast(5.0),
            "x",
        ));
        t.push(Target::new(
            &format!("fits-background-{test}-throughput-rcp-vs-redis"),
            ratio(a.rps, b.rps),
            Goal::AtLeast(1.0),
            "x",
        ));
    }
    let big = (find(runs, rcp, "4x", true), find(runs, redis, "4x", true));
    t.push(Target::new(
        "4x-background-set-p99.9-redis-over-rcp",
        ratio(big.1.set.p999_ms, big.0.set.p999_ms),
        Goal::AtLeast(5.0),
        "x",
    ));
    t
}

fn scheme_targets(runs: &[Run]) -> Vec<Target> {
    let (none, rcp) = (Kind::Critio(Scheme::None), Kind::Critio(Scheme::Rcp));
    let mut t = Vec::new();
    for size in ["fits", "4x"] {
        let (r, n) = (find(runs, rcp, size, true), find(runs, none, size, true));
        for (test, a, b) in [("set", &r.set, &n.set), ("get", &r.get, &n.get)] {
            t.push(Target::new(
                &format!("{size}-background-{test}-p99.9-none-over-rcp"),
                ratio(b.p999_ms, a.p999_ms),
                Goal::AtLeast(3.0),
                "x",
            ));
            t.push(Target::new(
                &format!("{size}-background-{test}-throughput-rcp-vs-none"),
                ratio(a.rps, b.rps),
                Goal::AtLeast(1.0),
                "x",
            ));
        }
        t.push(Target::new(
            &format!("{size}-background-jobs-per-s-rcp-vs-none"),
            ratio(r.jobs_per_s(), n.jobs_per_s()),
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
    let peers: Vec<Kind> = match &redis {
        Ok(_) => PEERS.to_vec(),
        Err(why) => {
            eprintln!("kv-vs-redis: skipping the Redis runs and targets: {why}");
            PEERS.into_iter().filter(|k| *k != Kind::Redis).collect()
        }
    };
    let version = redis.as_deref().unwrap_or("(not installed)").to_owned();
    let dir = args.file_system_dir("kv-vs-redis")?;
    let machine = host::describe(&dir);
    eprintln!(
        "kv-vs-redis: Redis {version} and critio-kv on {} ({machine})",
        dir.display()
    );
    let sizes = sizes(args.quick);
    let mut runs = Vec::new();
    for size in &sizes {
        for &kind in &peers {
            runs.extend(run_peer(kind, size, &dir, &args.placement)?);
        }
    }
    // Needs a stock redis-server; its rates come from the servers' runs.
    let mut frontiers = Vec::new();
    match &redis {
        Ok(_) => {
            for size in &sizes {
                match frontier(size, &dir, &runs, &args.placement) {
                    Ok(rows) => frontiers.push((size, rows)),
                    Err(why) => eprintln!("kv-vs-redis: no {} frontier: {why}", size.name),
                }
            }
        }
        Err(why) => eprintln!("kv-vs-redis: no frontier (it runs a stock redis-server): {why}"),
    }
    let mut tables: Vec<Table> = sizes.iter().map(|s| latency_table(&runs, s)).collect();
    tables.push(background_table(&runs));
    for (size, rows) in &frontiers {
        tables.push(frontier_table(rows, size));
    }
    tables.push(ceiling_table(&runs, redis.is_ok(), &frontiers));
    // The device's own floor, measured after the servers on the same file
    // system: what its log commits and reads cost with no server at all.
    let seconds = if args.quick { 1 } else { 5 };
    match fio::table(
        &dir,
        &fio::KV_PROBES,
        seconds,
        args.placement.server.as_deref(),
    ) {
        Ok(t) => tables.push(t),
        Err(why) => eprintln!("kv-vs-redis: no fio table: {why}"),
    }
    Ok(Report {
        experiment: "kv-vs-redis".into(),
        description: format!(
            "critio-kv (critio serve --device file: io_uring, O_DIRECT) against Redis {version} \
             (appendonly yes, appendfsync always) on the same file system, {} on {machine}; \
             the same redis-benchmark load, alone and while each runs BGSAVE and BGREWRITEAOF \
             back to back. p99.9 is redis-benchmark's first listed percentile at or above 99.9%. \
             Placement: {}. {}.",
            dir.display(),
            args.placement.describe(),
            stalls::describe(runs.iter().flat_map(|r| &r.stalls)),
        )
            + " loop runq ms/s: how long the server's event loops (Redis's main thread, \
             critio-kv's workers) waited on a run queue, runnable but not running, per second \
             of the load, summed over them (/proc/PID/task/TID/schedstat).",
        tables,
        targets: targets(&runs, redis.is_ok()),
    })
}
