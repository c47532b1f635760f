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
//!      critio-kv: CONFIG RESETSTAT before each load, INFO after it: where its
//!                  rounds' time went, its critical device time, its longest wait
//!      stop it, remove DIR
//!  the machine's frontier (each size): a stock redis-server with no I/O
//!      of its own, the same SET and GET loads alone and beside fio held
//!      to what each server's disks moved in that load under the loop (a
//!      writer at its write rate; a reader of random pages at its read
//!      rate, where it read: critio-kv's misses at 4x, the snapshots'
//!      scans; the readers' file is written once, before the preload)
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
//! from 16 threads.) The ceiling table sets each ratio against that: the
//! other server's p99.9 under the loop over what a server with no I/O of
//! its own had beside fio at rcp's rates in the same load. For a SET that
//! is a bound no durable server reaches (the frontier commits nothing,
//! where the others wait for a flush); for a GET whose misses read the
//! device (at 4x), it is no lower than the p99.9 of the reader's own
//! reads, one of which each miss waits for. The floor ceiling sets it
//! against the frontier alone, with no fio at all: a goal above that asks
//! rcp's tail under the loop to be shorter than the same load's served
//! from memory on an idle disk, whatever the background moved.

use std::path::Path;
use std::time::Instant;

use critio_kv::Scheme;
use serde_json::json;

use super::fio::{self, Antagonist};
use super::host;
use super::kv_background::TestResult;
use super::peers::{
    benchmark, info_u64, info_value, progress_bar, redis_server_version, BackgroundLoop, Kind,
    Peer, Rounds,
};
use super::placement::Placement;
use super::report::{ratio, Goal, Report, Table, Target};
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
    /// critio-kv's own account of each test (SET, GET); None for Redis.
    inside: [Option<Inside>; 2],
    /// The server's event loops' run-queue wait during the SET and the
    /// GET load, in ms per s ([`super::runq`]).
    runq: [Option<f64>; 2],
}

impl Run {
    fn jobs_per_s(&self) -> f64 {
        self.rounds.jobs() / self.seconds.max(1e-9)
    }
}

/// What critio-kv's INFO says of one load, read after it with the
/// figures reset before it (CONFIG RESETSTAT): where its worker rounds
/// spent their time (a reply waits for all of its round: running the
/// requests, the one log commit, sending the replies), what its critical
/// I/O took at the device, and the longest critical wait. Set beside the
/// client's tail, they say whether that tail is the device's, the log's,
/// a wait on background work, or none of them (the machine's).
#[derive(Clone, Debug, Default, PartialEq)]
struct Inside {
    /// Worker rounds.
    rounds: u64,
    /// p99.9 of the rounds' run, commit and send parts, in ms.
    run_p999_ms: f64,
    commit_p999_ms: f64,
    send_p999_ms: f64,
    /// Critical requests the block layer timed at the device.
    critical_ios: u64,
    /// Their device time: p50, p99.9 and max, in ms.
    device_p50_ms: f64,
    device_p999_ms: f64,
    device_max_ms: f64,
    /// The critical wait point with the longest single wait (other than
    /// the block queue, whose device time is above), and that wait in ms.
    longest_wait: Option<(String, f64)>,
}

impl Inside {
    fn from_info(info: &str) -> Inside {
        let hist = |key: &str| Histogram::parse(info, key).unwrap_or_default();
        let (run, commit, send) = (hist("round_run"), hist("round_commit"), hist("round_send"));
        let device = hist("block_critical_device_time");
        let longest_wait = info
            .lines()
            .filter_map(|l| {
                let (point, fields) = l.strip_prefix("critical_wait_")?.split_once(':')?;
                let max = field(fields, "max_ms")?;
                let waits = field(fields, "waits")?;
                (point != "block_queue" && waits > 0.0).then(|| (point.to_owned(), max))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1));
        Inside {
            rounds: run.count,
            run_p999_ms: run.p999_us / 1e3,
            commit_p999_ms: commit.p999_us / 1e3,
            send_p999_ms: send.p999_us / 1e3,
            critical_ios: device.count,
            device_p50_ms: device.p50_us / 1e3,
            device_p999_ms: device.p999_us / 1e3,
            device_max_ms: device.max_us / 1e3,
            longest_wait,
        }
    }
}

/// One of critio-kv's INFO histograms
/// (`key:count=N,mean_us=..,p50_us=..,p99_us=..,p999_us=..,max_us=..`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Histogram {
    count: u64,
    p50_us: f64,
    p999_us: f64,
    max_us: f64,
}

impl Histogram {
    fn parse(info: &str, key: &str) -> Option<Histogram> {
        let fields: String = info_value(info, key)?;
        Some(Histogram {
            count: field(&fields, "count")? as u64,
            p50_us: field(&fields, "p50_us")?,
            p999_us: field(&fields, "p999_us")?,
            max_us: field(&fields, "max_us")?,
        })
    }
}

/// The value of `name=value` in a comma-separated INFO field list.
fn field(fields: &str, name: &str) -> Option<f64> {
    fields
        .trim()
        .split(',')
        .find_map(|f| f.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
}

fn checkpoints(peer: &Peer) -> u64 {
    peer.info()
        .ok()
        .and_then(|i| info_u64(&i, "checkpoints"))
        .unwrap_or(0)
}

/// One load at the machine's frontier: a server that does no I/O, alone
/// or beside fio moving what a server's disks moved in the same load.
#[derive(Clone, Debug)]
struct FrontierRow {
    /// The load: "SET" or "GET".
    test: &'static str,
    /// Whose rates fio was held to (None: no fio).
    rate_of: Option<Kind>,
    /// The reader's rate asked of fio, in MB/s (None: no reader).
    read_mb_s: Option<f64>,
    /// The writer's rate asked of fio, in MB/s (None: no writer).
    write_mb_s: Option<f64>,
    /// The reader's own reads' p99.9 in ms, as fio measured them (None:
    /// no reader, or fio said nothing).
    fio_read_p999_ms: Option<f64>,
    result: TestResult,
    stalls: Stalls,
}

/// Below this, a server's disk reads during a load get no fio reader at
/// the frontier (what a server that reads its data from memory still
/// reads: its own files, metadata).
const READER_MIN_MB_S: f64 = 1.0;

/// The size of a server's miss, for a reader's rate in reads a second: a
/// page.
const READ_BYTES: f64 = 4096.0;

/// The loads at the frontier of `size`: stock Redis with no persistence
/// (so no I/O of its own), preloaded as the servers were, running the
/// SET load and then the GET load, each alone and then beside fio held
/// to what each server's disks moved during that load under the loop: a
/// writer at its write rate, and a reader at its read rate where it read
/// at least [`READER_MIN_MB_S`] (at 4x, critio-kv's misses; under the
/// loop, the snapshots' and rewrites' scans).
fn frontier(
    size: &Size,
    dir: &Path,
    runs: &[Run],
    placement: &Placement,
) -> Result<Vec<FrontierRow>, String> {
    let pb = progress_bar(&format!("{} frontier", size.name));
    // (the load, whose rates, read MB/s, write MB/s), each load alone
    // first; a load is (its test, redis-benchmark's, requests, its index
    // in a run's stalls).
    let loads = [
        ("SET", "set", size.set_requests, 0),
        ("GET", "get", size.get_requests, 1),
    ];
    let mut rows_to_run = Vec::new();
    for load in loads {
        rows_to_run.push((load, None, None, None));
        for &kind in &PEERS {
            let Some(run) = runs
                .iter()
                .find(|r| r.kind == kind && r.size == size.name && r.background)
            else {
                continue;
            };
            let moved = &run.stalls[load.3];
            let Some(write) = moved.disk_write_mb_s else {
                continue;
            };
            let read = moved.disk_read_mb_s.filter(|&r| r >= READER_MIN_MB_S);
            rows_to_run.push((load, Some(kind), read, Some(write)));
        }
    }
    // The readers' file first, once: every row then follows the preload,
    // none the writing of the file.
    let reader_file = if rows_to_run.iter().any(|r| r.2.is_some()) {
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
    for ((test, command, requests, _), rate_of, read_mb_s, write_mb_s) in rows_to_run {
        pb.set_message(match (read_mb_s, write_mb_s) {
            (None, None) => format!("{test} alone"),
            (Some(r), Some(w)) => format!("{test} beside fio reading {r:.0} MB/s, writing {w:.0}"),
            (_, w) => format!("{test} beside fio writing {:.0} MB/s", w.unwrap_or(0.0)),
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
        let (result, stalls) =
            probed(|| benchmark(&peer, command, requests, CLIENTS, size.keys, VALUE_BYTES))?;
        drop(writer);
        let fio_read_p999_ms = match reader.map(Antagonist::finish) {
            Some(Ok(read)) => read.map(|m| m.p999_ms),
            Some(Err(why)) => {
                pb.suspend(|| {
                    eprintln!(
                        "kv-vs-redis: {} frontier: no latency from fio's reader: {why}",
                        size.name
                    )
                });
                None
            }
            None => None,
        };
        rows.push(FrontierRow {
            test,
            rate_of,
            read_mb_s,
            write_mb_s,
            fio_read_p999_ms,
            result,
            stalls,
        });
    }
    pb.finish_and_clear();
    peer.stop()?;
    Ok(rows)
}

/// The frontier's p99.9 in `test` beside fio at `kind`'s rates; for a
/// load whose requests read the device themselves (`reads`: GETs that
/// miss), no less than fio's reader's own p99.9 there, since such a
/// request waits for one of those reads.
fn frontier_p999(rows: &[FrontierRow], kind: Kind, test: &str, reads: bool) -> Option<f64> {
    let row = rows
        .iter()
        .find(|r| r.rate_of == Some(kind) && r.test == test)?;
    let read = row.fio_read_p999_ms.filter(|_| reads).unwrap_or(0.0);
    Some(row.result.p999_ms.max(read))
}

/// The frontier's p99.9 in `test` with no fio beside it: the same load
/// served from memory with no disk traffic at all, this machine's floor
/// whatever a server's background moves. None for a load whose requests
/// read the device (`reads`), which no server serves from memory.
fn floor_p999(rows: &[FrontierRow], test: &str, reads: bool) -> Option<f64> {
    if reads {
        return None;
    }
    rows.iter()
        .find(|r| r.rate_of.is_none() && r.test == test)
        .map(|r| r.result.p999_ms)
}

fn frontier_table(rows: &[FrontierRow], size: &Size) -> Table {
    let mut t = Table::new(
        &format!(
            "the machine's frontier ({}): stock Redis with no persistence (no I/O of its own: a SET commits nothing), preloaded the same, the same SET (-n {}) and GET (-n {}) loads alone and beside fio moving what each server's disks moved in that load under the loop: a writer (O_DIRECT, 128 KiB, 4 in flight) at its write rate and, where it read {READER_MIN_MB_S} MB/s or more, a reader (O_DIRECT, random 4 KiB, 16 in flight) at its read rate, whose reads' own p99.9 fio reports",
            size.name, size.set_requests, size.get_requests
        ),
        &["test", "fio", "fio read MB/s", "fio write MB/s", "fio read p99.9 ms", "req/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms"]
            .into_iter()
            .chain(stalls::COLUMNS)
            .collect::<Vec<_>>(),
    );
    for r in rows {
        let mut row = vec![
            json!(r.test),
            json!(r
                .rate_of
                .map_or("none".to_owned(), |k| format!("at {}'s rates", k.label()))),
            r.read_mb_s.map_or(json!("-"), |x| json!(x)),
            r.write_mb_s.map_or(json!("-"), |x| json!(x)),
            r.fio_read_p999_ms.map_or(json!("-"), |x| json!(x)),
            json!(r.result.rps),
            json!(r.result.p50_ms),
            json!(r.result.p99_ms),
            json!(r.result.p999_ms),
            json!(r.result.max_ms),
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
            // critio-kv's figures start afresh for each load, so they say
            // what this load alone met.
            if matches!(kind, Kind::Critio(_)) {
                peer.reset_stats()?;
            }
            let before = RunQueue::sample(peer.pid(), loops);
            let out = probed(|| benchmark(&peer, test, n, CLIENTS, size.keys, VALUE_BYTES));
            let after = RunQueue::sample(peer.pid(), loops);
            let runq = before.zip(after).and_then(|(b, a)| b.ms_per_s(&a));
            let inside = match kind {
                Kind::Critio(_) => Some(Inside::from_info(&peer.info()?)),
                Kind::Redis => None,
            };
            out.map(|(result, stalls)| (result, stalls, runq, inside))
        };
        let set = bench("set", size.set_requests);
        let get = bench("get", size.get_requests);
        let seconds = started.elapsed().as_secs_f64();
        let rounds = match bg {
            Some(bg) => bg.stop()?,
            None => Rounds::default(),
        };
        let ((set, set_stalls, set_runq, set_inside), (get, get_stalls, get_runq, get_inside)) =
            (set?, get?);
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
            inside: [set_inside, get_inside],
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

fn inside_table(runs: &[Run]) -> Table {
    let mut t = Table::new(
        "inside critio-kv, per load (INFO after it, its figures reset before it): p99.9 of the worker \
         rounds' parts (a reply waits for its whole round: running the requests, the one log commit, \
         sending the replies); the critical I/O the block layer timed at the device; the critical \
         wait point with the longest single wait (the block queue's aside)",
        &[
            "size",
            "server",
            "phase",
            "test",
            "rounds",
            "run p99.9 ms",
            "commit p99.9 ms",
            "send p99.9 ms",
            "critical I/Os",
            "device p50 ms",
            "device p99.9 ms",
            "device max ms",
            "longest wait",
            "its max ms",
        ],
    );
    for r in runs {
        for (test, inside) in ["SET", "GET"].into_iter().zip(&r.inside) {
            let Some(i) = inside else { continue };
            let (point, max) = match &i.longest_wait {
                Some((p, m)) => (json!(p), json!(m)),
                None => (json!("-"), json!("-")),
            };
            t.row(vec![
                json!(r.size),
                json!(r.kind.label()),
                json!(if r.background { "background" } else { "alone" }),
                json!(test),
                json!(i.rounds),
                json!(i.run_p999_ms),
                json!(i.commit_p999_ms),
                json!(i.send_p999_ms),
                json!(i.critical_ios),
                json!(i.device_p50_ms),
                json!(i.device_p999_ms),
                json!(i.device_max_ms),
                point,
                max,
            ]);
        }
    }
    t
}

fn background_table(runs: &[Run]) -> Table {
    let mut t = Table::new(
        "background work during the load (phase 'background'; critio-kv checkpoints every second in both phases); \
         mean s: a completed job's time, from its command to INFO saying it no longer runs; \
         last job: the share of the job in progress when the load ended that was done (INFO current_fork_perc), counted in jobs/s",
        &[
            "size",
            "server",
            "phase",
            "seconds",
            "BGSAVE done",
            "BGREWRITEAOF done",
            "BGSAVE mean s",
            "BGREWRITEAOF mean s",
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
            r.rounds.bgsave_mean_secs().map_or(json!("-"), |s| json!(s)),
            r.rounds
                .rewrite_mean_secs()
                .map_or(json!("-"), |s| json!(s)),
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
/// this machine in this run. The frontier gives a second one: the other
/// server's tail over that of a server with no I/O of its own in the same
/// load beside fio at rcp's disk rates in it (`-` where it was not
/// measured). For a GET of the data that fits, which does no I/O of its
/// own, that is the machine's bound; for a SET, a bound below it (the
/// frontier commits nothing); for a GET whose misses read the device (rcp
/// read it in its GET load alone: the data four times the cache), the
/// frontier ran beside a reader at rcp's read rate, and each miss waits
/// for one such read, so the bound is no lower than that reader's own
/// p99.9. The floor gives a third, independent of what rcp moved: the
/// other server's tail over the frontier's alone, with no disk traffic at
/// all (`-` for a GET that reads the device).
fn ceiling_table(runs: &[Run], with_redis: bool, frontiers: &[(&Size, Vec<FrontierRow>)]) -> Table {
    let (redis, none, rcp) = (
        Kind::Redis,
        Kind::Critio(Scheme::None),
        Kind::Critio(Scheme::Rcp),
    );
    let mut t = Table::new(
        "p99.9 ratios under the loop and their ceiling in this run (the other server's p99.9 under the loop over rcp's alone, which the loop only adds to; frontier ceiling: over the frontier's p99.9 in the same load beside fio at rcp's disk rates in it under the loop, or over fio's reader's own p99.9 there where rcp's GETs read the device, if higher; floor ceiling: over the frontier's p99.9 alone, the same load from memory with no disk traffic at all, whatever rcp's background moved)",
        &["size", "test", "over rcp's", "measured", "ceiling", "frontier ceiling", "floor ceiling", "goal"],
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
                // Its requests read the device: its GETs read alone.
                let reads = test == "GET"
                    && alone.stalls[1]
                        .disk_read_mb_s
                        .is_some_and(|r| r >= READER_MIN_MB_S);
                let rows = frontiers.iter().find(|(s, _)| s.name == size);
                let edge = rows.and_then(|(_, rows)| frontier_p999(rows, rcp, test, reads));
                let floor = rows.and_then(|(_, rows)| floor_p999(rows, test, reads));
                t.row(vec![
                    json!(size),
                    json!(test),
                    json!(other.label()),
                    json!(ratio(b.p999_ms, u.p999_ms)),
                    json!(ratio(b.p999_ms, a.p999_ms)),
                    edge.map_or(json!("-"), |f| json!(ratio(b.p999_ms, f))),
                    floor.map_or(json!("-"), |f| json!(ratio(b.p999_ms, f))),
                    json!(goal),
                ]);
            }
        }
    }
    t
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
    tables.push(inside_table(&runs));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_load_is_read_from_critio_kv_info() {
        let info = "# Stats\r\n\
            round_run:count=22396,mean_us=310.7,p50_us=89.4,p99_us=5025.8,p999_us=18759.7,max_us=61734.9\r\n\
            round_commit:count=22396,mean_us=486.1,p50_us=291.1,p99_us=3854.3,p999_us=10903.6,max_us=30326.8\r\n\
            round_send:count=22396,mean_us=133.9,p50_us=83.7,p99_us=1494.0,p999_us=4632.6,max_us=11911.2\r\n\
            block_critical_queue_wait:count=43481,mean_us=0.3,p50_us=0.0,p99_us=0.0,p999_us=0.0,max_us=7200.8\r\n\
            block_critical_device_time:count=43481,mean_us=232.0,p50_us=127.8,p99_us=2037.8,p999_us=5886.0,max_us=29769.7\r\n\
            critical_wait_block_queue:waits=43481,mean_ms=0.000,max_ms=7.201\r\n\
            critical_wait_cache_part_lock:waits=395,mean_ms=0.069,max_ms=2.603\r\n\
            critical_wait_log_space_wait:waits=11,mean_ms=20.993,max_ms=60.228\r\n\
            critical_wait_kv_epoch:waits=0,mean_ms=0.000,max_ms=0.000\r\n";
        let i = Inside::from_info(info);
        assert_eq!(i.rounds, 22396);
        let near = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(near(i.commit_p999_ms, 10.9036), "{i:?}");
        assert_eq!(i.critical_ios, 43481);
        assert!(
            near(i.device_p50_ms, 0.1278) && near(i.device_max_ms, 29.7697),
            "{i:?}"
        );
        assert_eq!(
            i.longest_wait,
            Some(("log_space_wait".to_owned(), 60.228)),
            "the longest wait wins, the block queue's aside"
        );
        // A server that says none of it (or an older one): zeros, no wait.
        assert_eq!(Inside::from_info("# Stats\r\n"), Inside::default());
    }

    #[test]
    fn a_ratio_is_set_against_the_frontier_of_its_own_load() {
        let (none, rcp) = (Kind::Critio(Scheme::None), Kind::Critio(Scheme::Rcp));
        let row = |test, rate_of, p999_ms| FrontierRow {
            test,
            rate_of,
            read_mb_s: rate_of.map(|_| 150.0),
            write_mb_s: rate_of.map(|_| 100.0),
            fio_read_p999_ms: rate_of.map(|_| 2.0),
            result: TestResult {
                name: test.to_owned(),
                rps: 50_000.0,
                p50_ms: 0.2,
                p99_ms: 0.5,
                p999_ms,
                max_ms: 2.0,
            },
            stalls: Stalls::default(),
        };
        let rows = [
            row("SET", None, 0.6),
            row("SET", Some(none), 1.4),
            row("SET", Some(rcp), 2.8),
            row("GET", None, 1.1),
            row("GET", Some(none), 0.9),
            row("GET", Some(rcp), 1.3),
        ];
        assert_eq!(frontier_p999(&rows, rcp, "SET", false), Some(2.8));
        assert_eq!(frontier_p999(&rows, rcp, "GET", false), Some(1.3));
        assert_eq!(frontier_p999(&rows, none, "GET", false), Some(0.9));
        assert_eq!(
            frontier_p999(&rows, Kind::Redis, "SET", false),
            None,
            "not measured"
        );
        // GETs that read the device wait for the reader's reads too...
        assert_eq!(frontier_p999(&rows, rcp, "GET", true), Some(2.0));
        // ...unless the server-less load's own tail was longer.
        assert_eq!(frontier_p999(&rows, rcp, "SET", true), Some(2.8));
        // The floor is the load alone, whoever's rates; none where the
        // requests read the device.
        assert_eq!(floor_p999(&rows, "SET", false), Some(0.6));
        assert_eq!(floor_p999(&rows, "GET", false), Some(1.1));
        assert_eq!(floor_p999(&rows, "GET", true), None);
        assert_eq!(floor_p999(&rows[1..3], "SET", false), None, "not measured");
    }
}
