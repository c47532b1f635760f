//! `critio bench kv-background`: the same redis-benchmark load against
//! critio-kv while checkpoints and snapshots run, with `--scheme none` and
//! `--scheme rcp` side by side.
//!
//! ```text
//!  per scheme: open the stack (simulated SSD by default) ─> FLUSHALL ─> preload
//!              KEYSPACE keys of SIZE bytes (the store several times the cache)
//!              ─> serve it on 127.0.0.1:0
//!              ─> redis-benchmark -t set,get,incr,mset -n N -c 50 -r KEYSPACE -d SIZE
//!                 while: checkpoints every CKPT ms, and a BGSAVE restarted as soon
//!                 as the last one ends
//!  parse:      per test "throughput summary", "latency summary" (p50, p99, max),
//!              and p99.9 from "Latency by percentile distribution" (the first
//!              listed percentile at or above 99.9%, an upper reading)
//! ```
//!
//! Targets: rcp's p99.9 over none's (geometric mean over the four tests) at
//! most 1, and background progress under rcp (checkpoints per second of the
//! run) at least 80% of none's. The redis-benchmark binary comes with
//! Debian's `redis-tools`.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use critio::context::Class;
use critio::device::DeviceSpec;
use critio_kv::engine::{BackgroundStats, Engine, EngineConfig};
use critio_kv::server::{Backend, Server, ServerConfig};
use critio_kv::stack::default_critio_config;
use critio_kv::{Scheme, Stack, StackConfig};
use serde_json::json;

use super::report::{Goal, Report, Table, Target};
use super::BenchArgs;

const SCHEMES: [Scheme; 2] = [Scheme::None, Scheme::Rcp];
const TESTS: &str = "set,get,incr,mset";
const CLIENTS: u32 = 50;
/// How often the BGSAVE driver looks whether the last snapshot ended.
const BGSAVE_POLL: Duration = Duration::from_millis(50);

/// The run's size.
#[derive(Clone, Copy, Debug)]
struct Params {
    keyspace: u64,
    value_bytes: usize,
    requests: u64,
    cache_bytes: u64,
    capacity: u64,
    checkpoint_interval_ms: u64,
}

impl Params {
    fn new(quick: bool) -> Params {
        if quick {
            Params {
                keyspace: 20_000,
                value_bytes: 1024,
                requests: 3_000,
                cache_bytes: 8 << 20,
                capacity: 2 << 30,
                checkpoint_interval_ms: 300,
            }
        } else {
            Params {
                keyspace: 150_000,
                value_bytes: 1024,
                requests: 50_000,
                cache_bytes: 32 << 20,
                capacity: 4 << 30,
                checkpoint_interval_ms: 500,
            }
        }
    }
}

/// One redis-benchmark test's figures.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TestResult {
    /// `SET`, `GET`, `INCR`, `MSET (10 keys)`.
    pub name: String,
    /// Requests per second.
    pub rps: f64,
    /// Median, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// 99.9th percentile (upper reading), ms.
    pub p999_ms: f64,
    /// Maximum, ms.
    pub max_ms: f64,
}

/// One scheme's run.
struct SchemeResult {
    scheme: Scheme,
    tests: Vec<TestResult>,
    seconds: f64,
    background: BackgroundStats,
    waits: Vec<(String, u64, f64, f64)>,
    /// Error replies the server sent during the load.
    errors: u64,
}

pub(super) fn require_redis_benchmark() -> Result<(), String> {
    match Command::new("redis-benchmark").arg("--version").output() {
        Ok(o) if o.status.success() => Ok(()),
        _ => Err(
            "kv-background drives the server with redis-benchmark, which is not installed: \
                  apt-get install redis-tools"
                .into(),
        ),
    }
}

fn device_spec(args: &BenchArgs) -> Result<DeviceSpec, String> {
    args.device.as_deref().unwrap_or("sim").parse()
}

fn open(scheme: Scheme, p: Params, device: &DeviceSpec) -> Result<(Stack, StackConfig), String> {
    let mut critio = default_critio_config();
    critio.cache.capacity_bytes = p.cache_bytes;
    let cfg = StackConfig {
        device: device.clone(),
        capacity: p.capacity,
        seed: 1,
        scheme,
        critio,
        engine: EngineConfig {
            checkpoint_interval_ms: p.checkpoint_interval_ms,
            ..EngineConfig::default()
        },
        ..StackConfig::default()
    };
    let stack = Stack::open(&cfg).map_err(|e| format!("{scheme}: cannot open {device}: {e}"))?;
    Ok((stack, cfg))
}

/// `key:000000000042`, redis-benchmark's `-r` key names.
fn key(i: u64) -> Vec<u8> {
    format!("key:{i:012}").into_bytes()
}

/// Writes the keyspace with MSETs from a few threads, then checkpoints.
fn preload(engine: &Arc<Engine>, p: Params) -> Result<(), String> {
    const THREADS: u64 = 8;
    const BATCH: u64 = 64;
    engine.flushall().map_err(|e| e.to_string())?;
    let value: Vec<u8> = (0..p.value_bytes).map(|i| b'a' + (i % 26) as u8).collect();
    let workers: Vec<JoinHandle<Result<(), String>>> = (0..THREADS)
        .map(|t| {
            let (engine, value) = (engine.clone(), value.clone());
            std::thread::spawn(move || {
                let mut start = t * BATCH;
                while start < p.keyspace {
                    let keys: Vec<Vec<u8>> =
                        (start..(start + BATCH).min(p.keyspace)).map(key).collect();
                    let pairs: Vec<(&[u8], &[u8])> = keys
                        .iter()
                        .map(|k| (k.as_slice(), value.as_slice()))
                        .collect();
                    engine.mset(&pairs).map_err(|e| format!("preload: {e}"))?;
                    start += THREADS * BATCH;
                }
                Ok(())
            })
        })
        .collect();
    for w in workers {
        w.join()
            .map_err(|_| "a preload thread panicked".to_owned())??;
    }
    engine
        .save()
        .map_err(|e| format!("preload checkpoint: {e}"))?;
    Ok(())
}

/// Keeps a BGSAVE running until stopped.
fn bgsave_driver(engine: Arc<Engine>, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            if !engine.background_running().0 {
                let _ = engine.bgsave(); // errors are counted in the stats
            }
            std::thread::sleep(BGSAVE_POLL);
        }
    })
}

fn redis_benchmark(port: u16, p: Params) -> Result<String, String> {
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-t", TESTS])
        .args(["-n", &p.requests.to_string(), "-c", &CLIENTS.to_string()])
        .args([
            "-r",
            &p.keyspace.to_string(),
            "-d",
            &p.value_bytes.to_string(),
        ])
        .output()
        .map_err(|e| format!("cannot run redis-benchmark: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "\n");
    if !out.status.success() {
        return Err(format!(
            "redis-benchmark failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(text)
}

/// The figures of every test in redis-benchmark's (non-quiet) output.
pub fn parse(output: &str) -> Vec<TestResult> {
    let mut tests = Vec::new();
    for section in output.split("====== ").skip(1) {
        let Some((name, body)) = section.split_once(" ======") else {
            continue;
        };
        let mut r = TestResult {
            name: name.trim().to_owned(),
            ..TestResult::default()
        };
        let mut lines = body.lines().map(str::trim);
        while let Some(line) = lines.next() {
            if let Some(rest) = line.strip_prefix("throughput summary:") {
                r.rps = first_number(rest).unwrap_or(0.0);
            } else if line.starts_with("avg") && line.contains("p50") {
                let heads: Vec<&str> = line.split_whitespace().collect();
                let values: Vec<f64> = lines
                    .next()
                    .unwrap_or("")
                    .split_whitespace()
                    .filter_map(|v| v.parse().ok())
                    .collect();
                let at = |h: &str| {
                    heads
                        .iter()
                        .position(|x| *x == h)
                        .and_then(|i| values.get(i))
                };
                r.p50_ms = at("p50").copied().unwrap_or(0.0);
                r.p99_ms = at("p99").copied().unwrap_or(0.0);
                r.max_ms = at("max").copied().unwrap_or(0.0);
            } else if r.p999_ms == 0.0 {
                if let Some((pct, ms)) = percentile_line(line) {
                    if pct >= 99.9 {
                        r.p999_ms = ms;
                    }
                }
            }
        }
        if r.p999_ms == 0.0 {
            r.p999_ms = r.max_ms; // no distribution printed: the max bounds it
        }
        tests.push(r);
    }
    tests
}

fn first_number(text: &str) -> Option<f64> {
    text.split_whitespace().find_map(|w| w.parse().ok())
}

/// `99.902% <= 44.607 milliseconds (cumulative count 1999)`.
fn percentile_line(line: &str) -> Option<(f64, f64)> {
    let (pct, rest) = line.split_once("% <= ")?;
    let ms = rest.strip_suffix(')')?.split_once(" milliseconds")?.0;
    Some((pct.parse().ok()?, ms.parse().ok()?))
}

fn critical_waits(stack: &Stack) -> Vec<(String, u64, f64, f64)> {
    let m = stack.io.metrics().snapshot();
    let mut w: Vec<_> = m
        .wait_points
        .iter()
        .filter(|w| w.class == Class::Critical)
        .map(|w| {
            let l = &w.latency;
            (w.point.clone(), l.count, l.mean_us / 1e3, l.max_us / 1e3)
        })
        .collect();
    w.sort_by(|a, b| (b.2 * b.1 as f64).total_cmp(&(a.2 * a.1 as f64)));
    w.truncate(6);
    w
}

fn run_scheme(scheme: Scheme, p: Params, device: &DeviceSpec) -> Result<SchemeResult, String> {
    let (stack, cfg) = open(scheme, p, device)?;
    eprintln!("kv-background: {scheme}: preloading {} keys", p.keyspace);
    preload(&stack.engine, p)?;
    eprintln!(
        "kv-background: {scheme}: redis-benchmark -t {TESTS} -n {}",
        p.requests
    );
    let server_cfg = ServerConfig {
        bind: "127.0.0.1:0".into(),
        ..ServerConfig::default()
    };
    let server = Server::start(server_cfg, Backend::of(&stack, &cfg)).map_err(|e| e.to_string())?;
    let before = stack.engine.background_stats();
    stack.io.metrics().reset();
    let stop = Arc::new(AtomicBool::new(false));
    let driver = bgsave_driver(stack.engine.clone(), stop.clone());
    let started = Instant::now();
    let output = redis_benchmark(server.local_addr().port(), p);
    let seconds = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let _ = driver.join();
    let waits = critical_waits(&stack);
    let after = stack.engine.background_stats();
    let errors = info_field(&server.info(&["stats"]), "total_error_replies");
    server.shutdown();
    stack
        .engine
        .close()
        .map_err(|e| format!("{scheme}: close: {e}"))?;
    let tests = parse(&output?);
    if tests.len() != 4 {
        return Err(format!(
            "{scheme}: redis-benchmark printed {} tests, not 4",
            tests.len()
        ));
    }
    Ok(SchemeResult {
        scheme,
        tests,
        seconds,
        background: delta(&before, &after),
        waits,
        errors,
    })
}

/// A numeric `key:value` field of INFO text (0 if absent).
fn info_field(info: &str, key: &str) -> u64 {
    super::peers::info_u64(info, key).unwrap_or(0)
}

/// The background work done between two readings.
fn delta(before: &BackgroundStats, after: &BackgroundStats) -> BackgroundStats {
    BackgroundStats {
        checkpoints: after.checkpoints - before.checkpoints,
        checkpoint_ms_total: after.checkpoint_ms_total - before.checkpoint_ms_total,
        checkpoint_errors: after.checkpoint_errors - before.checkpoint_errors,
        snapshots: after.snapshots - before.snapshots,
        ..after.clone()
    }
}

fn latency_table(results: &[SchemeResult], p: Params) -> Table {
    let mut t = Table::new(
        &format!(
            "redis-benchmark -t {TESTS} -n {} -c {CLIENTS} -r {} -d {}, during checkpoints and BGSAVE",
            p.requests, p.keyspace, p.value_bytes
        ),
        &["scheme", "test", "req/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms"],
    );
    for r in results {
        for x in &r.tests {
            t.row(vec![
                json!(r.scheme.name()),
                json!(x.name),
                json!(x.rps),
                json!(x.p50_ms),
                json!(x.p99_ms),
                json!(x.p999_ms),
                json!(x.max_ms),
            ]);
        }
    }
    t
}

fn background_table(results: &[SchemeResult]) -> Table {
    let mut t = Table::new(
        "background progress during the load",
        &[
            "scheme",
            "seconds",
            "checkpoints",
            "ckpt/s",
            "ckpt mean ms",
            "snapshots",
            "snap/s",
            "error replies",
        ],
    );
    for r in results {
        let b = &r.background;
        let mean = b.checkpoint_ms_total / (b.checkpoints.max(1)) as f64;
        t.row(vec![
            json!(r.scheme.name()),
            json!(r.seconds),
            json!(b.checkpoints),
            json!(b.checkpoints as f64 / r.seconds),
            json!(mean),
            json!(b.snapshots),
            json!(b.snapshots as f64 / r.seconds),
            json!(r.errors),
        ]);
    }
    t
}

fn waits_table(results: &[SchemeResult]) -> Table {
    let mut t = Table::new(
        "where critical requests waited most (paper 000 Tables 2-3)",
        &["scheme", "wait point", "waits", "mean ms", "max ms"],
    );
    for r in results {
        for (point, n, mean, max) in &r.waits {
            t.row(vec![
                json!(r.scheme.name()),
                json!(point),
                json!(n),
                json!(mean),
                json!(max),
            ]);
        }
    }
    t
}

fn targets(none: &SchemeResult, rcp: &SchemeResult) -> Vec<Target> {
    let ratios: Vec<f64> = none
        .tests
        .iter()
        .zip(&rcp.tests)
        .map(|(n, r)| r.p999_ms / n.p999_ms.max(1e-3))
        .collect();
    let geo = (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64).exp();
    let rate = |r: &SchemeResult| r.background.checkpoints as f64 / r.seconds;
    let progress = 100.0 * rate(rcp) / rate(none).max(1e-9);
    vec![
        Target::new("rcp-vs-none-p99.9", geo, Goal::AtMost(1.0), "x"),
        Target::new(
            "rcp-checkpoint-progress-vs-none",
            progress,
            Goal::AtLeast(80.0),
            "%",
        ),
    ]
}

/// Runs the experiment.
pub fn run(args: &BenchArgs) -> Result<Report, String> {
    require_redis_benchmark()?;
    let p = Params::new(args.quick);
    let device = device_spec(args)?;
    let mut results = Vec::new();
    for scheme in SCHEMES {
        results.push(run_scheme(scheme, p, &device)?);
    }
    let targets = targets(&results[0], &results[1]);
    Ok(Report {
        experiment: "kv-background".into(),
        description: format!(
            "critio-kv on {device}, {} keys of {} B (cache {} MiB), checkpoint every {} ms and \
             BGSAVE back to back; the same redis-benchmark load under none and rcp. \
             p99.9 is redis-benchmark's first listed percentile at or above 99.9%.",
            p.keyspace,
            p.value_bytes,
            p.cache_bytes >> 20,
            p.checkpoint_interval_ms
        ),
        tables: vec![
            latency_table(&results, p),
            background_table(&results),
            waits_table(&results),
        ],
        targets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
====== SET ======
  2000 requests completed in 0.60 seconds
Latency by percentile distribution:
0.000% <= 1.279 milliseconds (cumulative count 1)
99.805% <= 41.951 milliseconds (cumulative count 1997)
99.902% <= 44.607 milliseconds (cumulative count 1999)
100.000% <= 49.599 milliseconds (cumulative count 2000)

Cumulative distribution of latencies:
99.900% <= 43.103 milliseconds (cumulative count 1998)

Summary:
  throughput summary: 3327.79 requests per second
  latency summary (msec):
          avg       min       p50       p95       p99       max
       14.647     1.272    14.807    24.927    33.663    49.599
====== MSET (10 keys) ======
Summary:
  throughput summary: 100.5 requests per second
  latency summary (msec):
          avg       min       p50       p95       p99       max
       1.0     0.5    0.9    2.0    3.0    4.0
";

    #[test]
    fn redis_benchmark_output_parses() {
        let t = parse(SAMPLE);
        assert_eq!(t.len(), 2);
        assert_eq!(
            t[0],
            TestResult {
                name: "SET".into(),
                rps: 3327.79,
                p50_ms: 14.807,
                p99_ms: 33.663,
                p999_ms: 44.607,
                max_ms: 49.599,
            }
        );
        assert_eq!(t[1].name, "MSET (10 keys)");
        assert_eq!((t[1].rps, t[1].p99_ms, t[1].p999_ms), (100.5, 3.0, 4.0));
    }
}
