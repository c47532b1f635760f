//! `critio bench kv-cache-jobs`: critio-kv's page cache while BGSAVE and
//! BGREWRITEAOF run, on data that does not compress and fits the cache,
//! beside stock Redis under the same load.
//!
//! ```text
//!  for redis-server (appendonly yes, appendfsync always) and critio-kv rcp:
//!    start it on the file system under test ─> preload KEYS keys of 1 KiB random bytes
//!    alone:      redis-benchmark -t get  (-c 20 -r KEYS)
//!    background: the same, while BGSAVE and BGREWRITEAOF run back to back
//!    critio-kv: its page cache's misses in each phase (INFO)
//! ```
//!
//! Each BGREWRITEAOF writes a copy of every live record through critio's
//! page cache, and each BGSAVE writes a dump as large as the data (random
//! bytes do not compress): if the pages they leave behind, or the dump's,
//! took frames from the data, a store that fits the cache would miss and
//! read from the device while the jobs run. `kv-vs-redis` does not show
//! it: redis-benchmark's values are one repeated letter, so its dumps are
//! tiny. Targets, from this one run (a miss prints MISS): under the
//! loop, at most one cache miss per 1000 GETs, and GET throughput at least
//! Redis's (the bar `kv-vs-redis` sets for data that fits).

use std::path::Path;
use std::time::Instant;

use critio_kv::Scheme;
use serde_json::json;

use super::host;
use super::kv_background::TestResult;
use super::peers::{
    benchmark, info_u64, progress_bar, redis_server_version, BackgroundLoop, Kind, Peer, Rounds,
};
use super::report::{Goal, Report, Table, Target};
use super::BenchArgs;

const CLIENTS: u32 = 20;
const VALUE_BYTES: usize = 1024;

/// The data set and the load.
#[derive(Clone, Copy, Debug)]
struct Size {
    keys: u64,
    /// critio-kv's image file, reserved in full when the server starts.
    image_bytes: u64,
    cache_bytes: u64,
    gets: u64,
}

fn size(quick: bool) -> Size {
    if quick {
        Size {
            keys: 30_000,
            image_bytes: 1 << 30,
            cache_bytes: 64 << 20,
            gets: 60_000,
        }
    } else {
        // About 600 MiB of values in a 1 GiB cache: the data fits, a dump
        // beside it does not.
        Size {
            keys: 600_000,
            image_bytes: 8 << 30,
            cache_bytes: 1 << 30,
            gets: 600_000,
        }
    }
}

/// One server's GET load in one phase.
#[derive(Clone, Debug)]
struct Run {
    kind: Kind,
    background: bool,
    get: TestResult,
    seconds: f64,
    rounds: Rounds,
    /// critio-kv's page cache misses during the load.
    misses: Option<u64>,
}

fn cache_misses(peer: &Peer) -> Result<Option<u64>, String> {
    Ok(match peer.kind {
        Kind::Redis => None,
        Kind::Critio(_) => Some(
            info_u64(&peer.info()?, "cache_misses")
                .ok_or("critio-kv's INFO has no cache_misses")?,
        ),
    })
}

/// Both phases of one server.
fn run_peer(kind: Kind, size: Size, dir: &Path, args: &BenchArgs) -> Result<Vec<Run>, String> {
    let pb = progress_bar(&kind.label());
    let peer = Peer::start(
        kind,
        dir,
        size.image_bytes,
        size.cache_bytes,
        &args.placement,
    )?;
    pb.set_message("preload (random values)");
    peer.preload_values(size.keys, VALUE_BYTES, true, &pb)?;
    let mut runs = Vec::new();
    for background in [false, true] {
        pb.set_message(if background {
            "GET with background work"
        } else {
            "GET alone"
        });
        let before = cache_misses(&peer)?;
        let bg = background
            .then(|| BackgroundLoop::start(&peer))
            .transpose()?;
        let started = Instant::now();
        let get = benchmark(&peer, "get", size.gets, CLIENTS, size.keys, VALUE_BYTES);
        let seconds = started.elapsed().as_secs_f64();
        // Read as the load ends: stopping the loop waits for its job.
        let misses = match (cache_misses(&peer)?, before) {
            (Some(after), Some(before)) => Some(after - before),
            _ => None,
        };
        let rounds = match bg {
            Some(bg) => bg.stop()?,
            None => Rounds::default(),
        };
        runs.push(Run {
            kind,
            background,
            get: get?,
            seconds,
            rounds,
            misses,
        });
    }
    pb.finish_and_clear();
    peer.stop()?;
    Ok(runs)
}

fn find(runs: &[Run], kind: Kind, background: bool) -> Option<&Run> {
    runs.iter()
        .find(|r| r.kind == kind && r.background == background)
}

fn per_1000(misses: u64, gets: u64) -> f64 {
    misses as f64 * 1000.0 / gets.max(1) as f64
}

fn table(runs: &[Run], size: Size) -> Table {
    let mut t = Table::new(
        &format!(
            "{} keys x {VALUE_BYTES} B of random bytes, critio image {} GiB, cache {} MiB; redis-benchmark -t get -n {} -c {CLIENTS} -r {}; \
             cache misses: critio-kv's page cache during the load (INFO cache_misses)",
            size.keys,
            size.image_bytes >> 30,
            size.cache_bytes >> 20,
            size.gets,
            size.keys
        ),
        &[
            "server",
            "phase",
            "req/s",
            "p50 ms",
            "p99 ms",
            "p99.9 ms",
            "max ms",
            "cache misses",
            "per 1000 GETs",
            "BGSAVE done",
            "BGREWRITEAOF done",
            "jobs/s",
        ],
    );
    for r in runs {
        t.row(vec![
            json!(r.kind.label()),
            json!(if r.background { "background" } else { "alone" }),
            json!(r.get.rps),
            json!(r.get.p50_ms),
            json!(r.get.p99_ms),
            json!(r.get.p999_ms),
            json!(r.get.max_ms),
            r.misses.map_or(json!("-"), |m| json!(m)),
            r.misses
                .map_or(json!("-"), |m| json!(per_1000(m, size.gets))),
            json!(r.rounds.bgsaves),
            json!(r.rounds.rewrites),
            json!(r.rounds.jobs() / r.seconds.max(1e-9)),
        ]);
    }
    t
}

fn targets(runs: &[Run], size: Size) -> Vec<Target> {
    let rcp = Kind::Critio(Scheme::Rcp);
    let mut t = Vec::new();
    let Some(bg) = find(runs, rcp, true) else {
        return t;
    };
    t.push(Target::new(
        "background-get-cache-misses-per-1000-gets-rcp",
        per_1000(bg.misses.unwrap_or(0), size.gets),
        Goal::AtMost(1.0),
        "",
    ));
    if let Some(redis) = find(runs, Kind::Redis, true) {
        t.push(Target::new(
            "background-get-throughput-rcp-vs-redis",
            bg.get.rps / redis.get.rps.max(1e-9),
            Goal::AtLeast(1.0),
            "x",
        ));
    }
    t
}

/// Runs the experiment.
pub fn run(args: &BenchArgs) -> Result<Report, String> {
    super::kv_background::require_redis_benchmark()?;
    let redis = redis_server_version();
    let mut peers = vec![Kind::Critio(Scheme::Rcp)];
    match &redis {
        Ok(_) => peers.insert(0, Kind::Redis),
        Err(why) => eprintln!("kv-cache-jobs: skipping the Redis run and target: {why}"),
    }
    let dir = args.file_system_dir("kv-cache-jobs")?;
    let machine = host::describe(&dir);
    let version = redis.as_deref().unwrap_or("(not installed)").to_owned();
    eprintln!(
        "kv-cache-jobs: Redis {version} and critio-kv on {} ({machine})",
        dir.display()
    );
    let size = size(args.quick);
    let mut runs = Vec::new();
    for &kind in &peers {
        runs.extend(run_peer(kind, size, &dir, args)?);
    }
    Ok(Report {
        experiment: "kv-cache-jobs".into(),
        description: format!(
            "critio-kv rcp (critio serve --device file: io_uring, O_DIRECT) and Redis {version} \
             (appendonly yes, appendfsync always) on {} on {machine}: GETs of a store of random \
             (incompressible) values that fits critio's cache, alone and while each runs BGSAVE \
             and BGREWRITEAOF back to back; critio-kv checkpoints every second. p99.9 is \
             redis-benchmark's first listed percentile at or above 99.9%.",
            dir.display()
        ),
        tables: vec![table(&runs, size)],
        targets: targets(&runs, size),
    })
}
