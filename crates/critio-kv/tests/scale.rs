//! Real scale: a 4 GiB page cache and 10 million keys on a real file
//! (io_uring, O_DIRECT). It takes minutes and gigabytes, so it is ignored
//! by `cargo test`; run it with
//!
//! ```text
//! cargo test --release -p critio-kv --test scale -- --ignored --nocapture
//! ```
//!
//! `CRITIO_SCALE_KEYS` (default 10000000) and `CRITIO_SCALE_DIR` (default
//! the temporary directory) change its size and place. It prints how long
//! each step took, the read rate with few keys and with all of them
//! (nothing on a request's path may grow with the key count), and the
//! memory the process grew by per key once the cache's memory was backed
//! (the index, mostly; with `cache.prefault` unable to back it, the
//! cache's pages count too), and checks that every key is there, before
//! and after reopening.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use critio::device::DeviceSpec;
use critio_kv::engine::{EngineConfig, SetOptions};
use critio_kv::stack::default_critio_config;
use critio_kv::{Scheme, Stack, StackConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const VALUE_BYTES: usize = 100;
const MSET_KEYS: u64 = 1000;
const THREADS: u64 = 4;

fn key(i: u64) -> Vec<u8> {
    format!("key:{i:012}").into_bytes()
}

fn value(i: u64) -> Vec<u8> {
    let mut v = format!("{i:020}").into_bytes();
    v.resize(VALUE_BYTES, b'v');
    v
}

fn open(path: &std::path::Path, capacity: u64) -> Stack {
    let mut critio = default_critio_config();
    critio.cache.capacity_bytes = 4 << 30;
    let cfg = StackConfig {
        device: DeviceSpec::Uring(path.to_path_buf()),
        capacity,
        scheme: Scheme::Rcp,
        critio,
        engine: EngineConfig {
            checkpoint_interval_ms: 1000,
            log_bytes: 256 << 20,
            ..EngineConfig::default()
        },
        ..StackConfig::default()
    };
    Stack::open(&cfg).expect("open the store")
}

/// Loads keys `range` with MSETs from several threads.
fn load(stack: &Stack, range: std::ops::Range<u64>) {
    let next = Arc::new(AtomicU64::new(range.start));
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            let next = next.clone();
            let engine = stack.engine.clone();
            let end = range.end;
            s.spawn(move || {
                critio::context::set_foreground();
                loop {
                    let first = next.fetch_add(MSET_KEYS, Ordering::Relaxed);
                    if first >= end {
                        return;
                    }
                    let ids: Vec<u64> = (first..(first + MSET_KEYS).min(end)).collect();
                    let kv: Vec<(Vec<u8>, Vec<u8>)> =
                        ids.iter().map(|&i| (key(i), value(i))).collect();
                    let pairs: Vec<(&[u8], &[u8])> =
                        kv.iter().map(|(k, v)| (&k[..], &v[..])).collect();
                    engine.mset(&pairs).expect("mset");
                }
            });
        }
    });
}

/// Random GETs (and one SET in ten) over keys `0..keys` from several
/// foreground threads for `secs`: operations per second.
fn serve_rate(stack: &Stack, keys: u64, secs: f64) -> f64 {
    let done = AtomicU64::new(0);
    let until = Instant::now() + Duration::from_secs_f64(secs);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (engine, done) = (stack.engine.clone(), &done);
            s.spawn(move || {
                critio::context::set_foreground();
                let mut rng = SmallRng::seed_from_u64(t);
                let mut n = 0;
                while Instant::now() < until {
                    let i = rng.gen_range(0..keys);
                    if n % 10 == 9 {
                        engine
                            .set(&key(i), &value(i), SetOptions::default())
                            .expect("set");
                    } else {
                        assert_eq!(engine.get(&key(i)).expect("get"), Some(value(i)));
                    }
                    n += 1;
                }
                done.fetch_add(n, Ordering::Relaxed);
            });
        }
    });
    done.load(Ordering::Relaxed) as f64 / secs
}

/// This process's resident memory, in MiB (`VmRSS` of `/proc/self/status`),
/// if the kernel reports it.
fn rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Waits (at most a minute) until no thread of this process is named
/// `critio-prefault`: the cache's frames are all backed.
fn wait_for_prefault() {
    let prefaulting = || {
        std::fs::read_dir("/proc/self/task").is_ok_and(|tasks| {
            tasks.flatten().any(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.trim() == "critio-prefault")
            })
        })
    };
    let until = Instant::now() + Duration::from_secs(60);
    while prefaulting() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Prints the resident memory now, and per key over `base` (MiB) if both
/// are known.
fn print_rss(when: &str, base: Option<f64>, keys: u64) {
    match (rss_mib(), base) {
        (Some(now), Some(base)) => println!(
            "memory {when}: {now:.0} MiB resident, {:.0} B per key over the {base:.0} MiB before the keys",
            (now - base) * 1048576.0 / keys as f64
        ),
        (Some(now), None) => println!("memory {when}: {now:.0} MiB resident"),
        _ => {}
    }
}

fn check_sample(stack: &Stack, keys: u64) {
    let mut rng = SmallRng::seed_from_u64(99);
    for _ in 0..100_000 {
        let i = rng.gen_range(0..keys);
        assert_eq!(
            stack.engine.get(&key(i)).unwrap(),
            Some(value(i)),
            "key {i}"
        );
    }
}

#[test]
#[ignore = "minutes and gigabytes: run with --release -- --ignored"]
fn a_4_gib_cache_and_10_million_keys_open_load_and_serve() {
    let keys: u64 = std::env::var("CRITIO_SCALE_KEYS")
        .map(|s| s.parse().expect("CRITIO_SCALE_KEYS is a number"))
        .unwrap_or(10_000_000);
    let dir = std::env::var("CRITIO_SCALE_DIR").map_or_else(|_| std::env::temp_dir(), Into::into);
    let path = dir.join(format!("critio-scale-{}.img", std::process::id()));
    // Records of about 140 bytes: the value log holds twice the live data,
    // the dump as much again.
    let capacity = (keys * 150 * 4).max(2 << 30) / 4096 * 4096;
    let t = Instant::now();
    let stack = open(&path, capacity);
    println!(
        "open: 4 GiB cache, {} GiB file: {:.2} s",
        capacity >> 30,
        t.elapsed().as_secs_f64()
    );
    // The cache's memory is backed at open by a thread that then exits:
    // once it is gone, what grows is the index (and the allocator's
    // slack), not the cache.
    wait_for_prefault();
    let base = rss_mib();
    print_rss("after open", None, keys);
    let few = keys.min(100_000);
    load(&stack, 0..few);
    let rate_few = serve_rate(&stack, few, 5.0);
    let t = Instant::now();
    load(&stack, few..keys);
    let secs = t.elapsed().as_secs_f64();
    println!(
        "load: {} keys of {VALUE_BYTES} B in {secs:.1} s ({:.0} keys/s)",
        keys - few,
        (keys - few) as f64 / secs
    );
    assert_eq!(stack.engine.dbsize(), keys);
    print_rss("after the load", base, keys);
    let rate_all = serve_rate(&stack, keys, 5.0);
    println!(
        "serve (90% GET, 10% SET, {THREADS} threads): {rate_few:.0} ops/s over {few} keys, \
         {rate_all:.0} ops/s over {keys} keys ({:.2}x)",
        rate_all / rate_few
    );
    check_sample(&stack, keys);
    let t = Instant::now();
    stack.engine.close().unwrap();
    println!(
        "close (a final checkpoint): {:.2} s",
        t.elapsed().as_secs_f64()
    );
    drop(stack);
    let t = Instant::now();
    let stack = open(&path, capacity);
    println!(
        "reopen (the index rebuilt from the value log): {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(stack.engine.dbsize(), keys);
    wait_for_prefault();
    print_rss("after the reopen", base, keys);
    check_sample(&stack, keys);
    stack.engine.close().unwrap();
    drop(stack);
    std::fs::remove_file(&path).unwrap();
}
