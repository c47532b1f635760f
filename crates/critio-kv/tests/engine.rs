//! The storage engine on its own: every operation, reopening, data several
//! times the cache, large values, background jobs, and crash consistency
//! under simulated power cuts (seeded, many seeds).

use std::collections::HashMap;
use std::sync::Arc;

use critio::config::Config;
use critio::device::faulty::{FaultConfig, FaultyDevice};
use critio::device::mem::MemDevice;
use critio::device::Device;
use critio::log::LogConfig;
use critio_kv::engine::{Engine, EngineConfig, EngineError, SetOptions, Value};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const MIB: u64 = 1 << 20;

fn small_config() -> EngineConfig {
    EngineConfig {
        log_bytes: 4 * MIB,
        checkpoint_interval_ms: 0,
        value_bytes_max: 256 << 10,
        ..EngineConfig::default()
    }
}

fn log_config() -> LogConfig {
    LogConfig {
        record_bytes_max: 512 << 10,
        batch_bytes_max: MIB,
        pending_bytes_max: 2 * MIB,
        ..LogConfig::default()
    }
}

/// critio's stack over `dev` with a cache of `cache_bytes` and `log`.
fn stack_on(dev: Arc<dyn Device>, cache_bytes: u64, log: LogConfig) -> critio::Stack {
    let mut config = Config::default();
    config.cache.capacity_bytes = cache_bytes;
    config.log = log;
    config.context.background_nice = 0;
    critio::Stack::over(dev, &config).unwrap()
}

fn open_on(dev: Arc<dyn Device>, cache_bytes: u64) -> Result<Engine, EngineError> {
    Engine::open(&stack_on(dev, cache_bytes, log_config()), small_config())
}

fn set(e: &Engine, k: &str, v: &[u8]) {
    assert!(e.set(k.as_bytes(), v, SetOptions::default()).unwrap());
}

/// BGSAVE, waited for (a minute at most); the background figures after.
fn bgsave_done(e: &Engine) -> critio_kv::engine::BackgroundStats {
    e.bgsave().unwrap();
    let start = std::time::Instant::now();
    while e.background_running() != (false, false) {
        assert!(start.elapsed().as_secs() < 60, "the BGSAVE never ended");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    e.background_stats()
}

/// Sets `k{i}` for each i of `keys` to 2000 random bytes (a dump of them
/// is as large as they are); the keys and values set.
fn fill_random(
    e: &Engine,
    rng: &mut SmallRng,
    keys: std::ops::Range<usize>,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    keys.map(|i| {
        let v: Vec<u8> = (0..2000).map(|_| rng.gen()).collect();
        set(e, &format!("k{i}"), &v);
        (format!("k{i}").into_bytes(), v)
    })
    .collect()
}

/// `len` bytes at `at` in the dump file of a store of `cfg` on `mem`, read
/// from the device.
fn dump_file_bytes(mem: &MemDevice, cfg: &EngineConfig, at: u64, len: usize) -> Vec<u8> {
    use critio::device::{submit_and_wait, Command};
    let layout =
        critio_kv::engine::Layout::new(mem.info().capacity, cfg.log_bytes, cfg.dump_pct, 4096)
            .unwrap();
    let r = submit_and_wait(
        mem,
        Command::read(layout.dump.0 + at, len, critio::context::Class::NonCritical),
    );
    r.result.unwrap();
    r.buf.as_slice().to_vec()
}

/// Writes `page` over the dump file's header page on `mem`.
fn write_dump_header_page(mem: &MemDevice, cfg: &EngineConfig, page: &[u8]) {
    use critio::device::{submit_and_wait, AlignedBuf, Command};
    let layout =
        critio_kv::engine::Layout::new(mem.info().capacity, cfg.log_bytes, cfg.dump_pct, 4096)
            .unwrap();
    let w = submit_and_wait(
        mem,
        Command::write(
            layout.dump.0,
            AlignedBuf::from_slice(page),
            critio::context::Class::NonCritical,
        ),
    );
    w.result.unwrap();
}

#[test]
fn every_operation_behaves_like_redis() {
    let e = open_on(Arc::new(MemDevice::new(32 * MIB)), MIB).unwrap();
    set(&e, "a", b"1");
    assert_eq!(e.get(b"a").unwrap(), Some(b"1".to_vec()));
    assert!(!e
        .set(
            b"a",
            b"2",
            SetOptions {
                nx: true,
                ..SetOptions::default()
            }
        )
        .unwrap());
    assert!(!e
        .set(
            b"b",
            b"2",
            SetOptions {
                xx: true,
                ..SetOptions::default()
            }
        )
        .unwrap());
    assert_eq!(e.incr_by(b"a", 41).unwrap(), 42);
    assert_eq!(e.incr_by(b"n", -3).unwrap(), -3);
    set(&e, "s", b"x");
    assert!(matches!(e.incr_by(b"s", 1), Err(EngineError::NotInteger)));
    assert_eq!(e.hset(b"h", &[(b"f1", b"v1"), (b"f2", b"v2")]).unwrap(), 2);
    assert_eq!(e.hset(b"h", &[(b"f1", b"v3")]).unwrap(), 0);
    assert_eq!(e.hget(b"h", b"f1").unwrap(), Some(b"v3".to_vec()));
    assert!(matches!(e.get(b"h"), Err(EngineError::WrongType)));
    assert!(matches!(
        e.hset(b"a", &[(b"f", b"v")]),
        Err(EngineError::WrongType)
    ));
    assert_eq!(e.hgetall(b"h").unwrap().len(), 2);
    assert_eq!(e.hdel(b"h", &[b"f1", b"zz"]).unwrap(), 1);
    assert_eq!(e.hdel(b"h", &[b"f2"]).unwrap(), 1);
    assert_eq!(e.exists(&[b"h"]).unwrap(), 0, "an emptied hash is gone");
    e.mset(&[(b"m1", b"x"), (b"m2", b"y")]).unwrap();
    assert_eq!(
        e.mget(&[b"m1", b"nope", b"m2"]).unwrap(),
        vec![Some(b"x".to_vec()), None, Some(b"y".to_vec())]
    );
    assert_eq!(e.exists(&[b"m1", b"m1", b"nope"]).unwrap(), 2);
    assert_eq!(e.del(&[b"m1", b"m1", b"nope"]).unwrap(), 1);
    assert_eq!(e.dbsize(), 4, "a, n, s, m2: m1 deleted, the hash emptied");
    let past = SetOptions {
        expire_at_ms: Some(1),
        ..SetOptions::default()
    };
    e.set(b"old", b"v", past).unwrap();
    assert_eq!(e.get(b"old").unwrap(), None, "expired");
    e.flushall().unwrap();
    assert_eq!(e.dbsize(), 0);
    assert_eq!(e.get(b"a").unwrap(), None);
    let long = vec![b'k'; 2000];
    assert!(matches!(
        e.set(&long, b"v", SetOptions::default()),
        Err(EngineError::KeyTooLarge { .. })
    ));
    // It cannot be there: reading, counting or deleting it finds nothing.
    e.set(b"m2", b"y", SetOptions::default()).unwrap();
    assert_eq!(e.get(&long).unwrap(), None);
    assert_eq!(e.exists(&[&long[..], b"m2"]).unwrap(), 1);
    assert_eq!(
        e.mget(&[&long[..], b"m2"]).unwrap(),
        vec![None, Some(b"y".to_vec())]
    );
    assert_eq!(e.del(&[&long[..]]).unwrap(), 0);
    let huge = vec![0u8; 300 << 10];
    assert!(matches!(
        e.set(b"big", &huge, SetOptions::default()),
        Err(EngineError::ValueTooLarge { .. })
    ));
    e.close().unwrap();
}

#[test]
fn data_several_times_the_cache_with_large_values_survives_reopening() {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(64 * MIB));
    let mut rng = SmallRng::seed_from_u64(5);
    let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    {
        let e = open_on(dev.clone(), MIB).unwrap();
        for i in 0..3000 {
            let key = format!("key{}", rng.gen_range(0..2000)).into_bytes();
            let len = if i % 50 == 0 {
                rng.gen_range(3000..100_000)
            } else {
                rng.gen_range(0..1500)
            };
            let value: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            e.set(&key, &value, SetOptions::default()).unwrap();
            model.insert(key, value);
            if i % 700 == 0 {
                e.save().unwrap();
            }
        }
        assert_eq!(e.dbsize(), model.len() as u64);
        for (k, v) in model.iter().take(200) {
            assert_eq!(e.get(k).unwrap().as_ref(), Some(v));
        }
        e.close().unwrap();
    }
    let e = open_on(dev, MIB).unwrap();
    assert_eq!(e.dbsize(), model.len() as u64);
    for (k, v) in &model {
        assert_eq!(
            e.get(k).unwrap().as_ref(),
            Some(v),
            "key {:?}",
            String::from_utf8_lossy(k)
        );
    }
    e.close().unwrap();
}

#[test]
fn log_records_after_the_last_checkpoint_are_replayed_on_reopen() {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(32 * MIB));
    {
        let e = open_on(dev.clone(), MIB).unwrap();
        set(&e, "before", b"1");
        e.save().unwrap();
        set(&e, "after", b"2");
        e.incr_by(b"count", 5).unwrap();
        e.hset(b"h", &[(b"f", b"v")]).unwrap();
        // No close: the engine is dropped without a final checkpoint.
    }
    let e = open_on(dev, MIB).unwrap();
    assert_eq!(e.get(b"before").unwrap(), Some(b"1".to_vec()));
    assert_eq!(e.get(b"after").unwrap(), Some(b"2".to_vec()));
    assert_eq!(e.get(b"count").unwrap(), Some(b"5".to_vec()));
    assert_eq!(e.hget(b"h", b"f").unwrap(), Some(b"v".to_vec()));
    assert_eq!(e.dbsize(), 4);
    e.close().unwrap();
}

#[test]
fn background_jobs_complete_while_writes_go_on() {
    let e = Arc::new(open_on(Arc::new(MemDevice::new(32 * MIB)), MIB).unwrap());
    for i in 0..500 {
        set(&e, &format!("k{i}"), &[7; 900]);
    }
    let past = SetOptions {
        expire_at_ms: Some(1),
        ..SetOptions::default()
    };
    for i in 0..50 {
        e.set(format!("gone{i}").as_bytes(), b"x", past).unwrap();
    }
    e.bgsave().unwrap();
    assert!(matches!(e.bgsave(), Err(EngineError::Busy(_))) || !e.background_running().0);
    for i in 0..200 {
        set(&e, &format!("k{i}"), &[8; 900]);
    }
    while e.background_running().0 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    e.bgrewrite().unwrap();
    while e.background_running().1 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let s = e.background_stats();
    assert_eq!(s.snapshots, 1, "{s:?}");
    assert!(s.last_snapshot_keys >= 500, "{s:?}");
    // 900 equal bytes per value: the dump is compressed, as Redis's RDB.
    assert!(s.last_snapshot_raw_bytes >= 500 * 900, "{s:?}");
    assert!(
        s.last_snapshot_bytes * 10 < s.last_snapshot_raw_bytes,
        "{s:?}"
    );
    assert_eq!(s.rewrites, 1);
    assert!(s.last_error.is_none(), "{s:?}");
    assert_eq!(e.dbsize(), 500, "the rewrite dropped the expired keys");
    assert_eq!(e.get(b"k3").unwrap(), Some(vec![8; 900]));
    e.close().unwrap();
}

/// A store of `keys` keys of 2000 random bytes (incompressible: a dump
/// is as large as the data) on a cache of `frames` pages: the stack, the
/// engine and what each key holds.
fn random_store(
    frames: u64,
    keys: usize,
    seed: u64,
) -> (critio::Stack, Engine, HashMap<String, Vec<u8>>) {
    let stack = stack_on(
        Arc::new(MemDevice::new(64 * MIB)),
        frames * 4096,
        log_config(),
    );
    let e = Engine::open(&stack, small_config()).unwrap();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut model = HashMap::new();
    for i in 0..keys {
        let v: Vec<u8> = (0..2000).map(|_| rng.gen()).collect();
        set(&e, &format!("k{i}"), &v);
        model.insert(format!("k{i}"), v);
    }
    (stack, e, model)
}

/// BGREWRITEAOF writes a copy of every live record through the cache: the
/// pages it leaves dead (the cleaned log behind the copies) leave the cache
/// at once, and BGSAVE writes its dump around the cache, so a store that
/// fits keeps every key cached, with the rest of the cache free, however
/// many rounds run.
#[test]
fn background_rounds_leave_a_store_that_fits_cached_with_frames_to_spare() {
    const FRAMES: u64 = 1024;
    const KEYS: usize = 400;
    let (stack, e, model) = random_store(FRAMES, KEYS, 3);
    let live_pages = (KEYS as u64 * 2048).div_ceil(4096);
    let wait = |e: &Engine| {
        while e.background_running() != (false, false) {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    };
    // Each round writes about twice the data through the cache: 8 rounds,
    // about 3x the cache.
    for _ in 0..8 {
        e.bgsave().unwrap();
        wait(&e);
        e.bgrewrite().unwrap();
        wait(&e);
    }
    let s = e.background_stats();
    assert_eq!((s.snapshots, s.rewrites), (8, 8), "{s:?}");
    assert!(s.last_error.is_none(), "{s:?}");
    let c = stack.cache().stats();
    // Each rewrite's cleaned pages dropped, each dump written around.
    assert!(c.discarded >= 8 * live_pages * 9 / 10, "{c:?}");
    assert!(c.written_around_pages >= 8 * live_pages * 9 / 10, "{c:?}");
    assert!(
        c.free_frames as u64 >= FRAMES - 3 * live_pages,
        "the dead pages filled the cache: {c:?}"
    );
    let misses = c.misses;
    for (k, v) in &model {
        assert_eq!(e.get(k.as_bytes()).unwrap().as_ref(), Some(v), "{k}");
    }
    assert_eq!(stack.cache().stats().misses, misses, "every key was cached");
    // The dump goes around the cache: a BGSAVE takes no frame.
    let before = stack.cache().stats();
    e.bgsave().unwrap();
    wait(&e);
    let after = stack.cache().stats();
    assert_eq!(after.free_frames, before.free_frames, "{after:?}");
    assert!(
        after.written_around_pages - before.written_around_pages >= live_pages * 9 / 10,
        "{after:?}"
    );
    let dump = e.read_dump().unwrap();
    assert_eq!(dump.len(), KEYS);
    for x in dump {
        let k = String::from_utf8(x.key).unwrap();
        assert_eq!(Some(x.value), model.get(&k).cloned().map(Value::Str), "{k}");
    }
    e.close().unwrap();
}

/// A dump larger than the cache's free frames, of a store that fits: it
/// goes around the cache, so it never pushes a page of the data out (when
/// it went through the cache, dropped only once done: 198 misses).
#[test]
fn a_bgsave_larger_than_the_free_frames_leaves_a_store_that_fits_cached() {
    const FRAMES: u64 = 4096;
    const KEYS: usize = 4400;
    // The data fills a little more than half the cache.
    let (stack, e, model) = random_store(FRAMES, KEYS, 4);
    let free = stack.cache().stats().free_frames as u64;
    let live_pages = (KEYS as u64 * 2048).div_ceil(4096);
    assert!(free < live_pages && free > FRAMES / 3, "free {free}");
    e.bgsave().unwrap();
    while e.background_running() != (false, false) {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let s = e.background_stats();
    assert!(s.last_error.is_none() && s.snapshots == 1, "{s:?}");
    let misses = stack.cache().stats().misses;
    for (k, v) in &model {
        assert_eq!(e.get(k.as_bytes()).unwrap().as_ref(), Some(v), "{k}");
    }
    let c = stack.cache().stats();
    assert_eq!(
        c.misses - misses,
        0,
        "the dump pushed live pages out: {c:?}"
    );
    e.close().unwrap();
}

/// A dump is read back a chunk at a time (`Engine::dump_entries`, what
/// `critio dump` exports), every entry as BGSAVE wrote it, strings and
/// hashes with their expiry; one byte damaged in its body, the entries end
/// in an error (the checksum, known once the last chunk is read).
#[test]
fn a_dump_reads_back_in_chunks_and_a_damaged_one_ends_in_an_error() {
    use critio::context::Class;
    use critio::device::{submit_and_wait, Command};
    let dev = Arc::new(MemDevice::new(64 * MIB));
    let mut rng = SmallRng::seed_from_u64(9);
    let mut model: HashMap<Vec<u8>, (Value, u64)> = HashMap::new();
    let (layout, body) = {
        let stack = stack_on(dev.clone(), 16 * MIB, log_config());
        let e = Engine::open(&stack, small_config()).unwrap();
        // About 3 MiB of random bytes: a body of several 1 MiB reads.
        for i in 0..3000 {
            let v: Vec<u8> = (0..1024).map(|_| rng.gen()).collect();
            let key = format!("k{i}").into_bytes();
            let at = if i % 7 == 0 { 4_000_000_000_000 + i } else { 0 };
            let opts = SetOptions {
                expire_at_ms: (at != 0).then_some(at),
                ..SetOptions::default()
            };
            e.set(&key, &v, opts).unwrap();
            model.insert(key, (Value::Str(v), at));
        }
        let fields: Vec<(Vec<u8>, Vec<u8>)> = (0..300)
            .map(|i| (format!("f{i}").into_bytes(), vec![i as u8; 10]))
            .collect();
        let pairs: Vec<(&[u8], &[u8])> = fields.iter().map(|(f, v)| (&f[..], &v[..])).collect();
        e.hset(b"h", &pairs).unwrap();
        model.insert(
            b"h".to_vec(),
            (Value::Hash(fields.into_iter().collect()), 0),
        );
        e.bgsave().unwrap();
        while e.background_running() != (false, false) {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert!(e.background_stats().last_error.is_none());
        e.check_dump().unwrap();
        let entries = e.dump_entries().unwrap();
        assert!(entries.exists());
        assert_eq!(entries.keys(), 3001);
        let (body, read) = entries.bytes();
        assert!(body > 2 * MIB && read == 0, "{body} {read}");
        let mut seen = 0;
        for x in entries {
            let x = x.unwrap();
            let (value, at) = &model[&x.key];
            assert_eq!((&x.value, x.expire_at_ms), (value, *at));
            seen += 1;
        }
        assert_eq!(seen, model.len());
        let layout = e.layout();
        e.close().unwrap();
        (layout, body)
    };
    // One byte in the middle of the body.
    let at = (layout.dump.0 + layout.page + body / 2) / 4096 * 4096;
    let dev_ref: &dyn Device = &*dev;
    let c = submit_and_wait(dev_ref, Command::read(at, 4096, Class::Critical));
    c.result.unwrap();
    let mut page = c.buf.as_slice().to_vec();
    page[100] ^= 0x5a;
    let w = Command::write(
        at,
        critio::device::AlignedBuf::from_slice(&page),
        Class::Critical,
    );
    submit_and_wait(dev_ref, w).result.unwrap();
    let stack = stack_on(dev.clone(), 16 * MIB, log_config());
    let e = Engine::open(&stack, small_config()).unwrap();
    let checked = e.check_dump().unwrap_err().to_string();
    assert!(checked.contains("checksum"), "{checked}");
    let items: Vec<Result<_, _>> = e.dump_entries().unwrap().collect();
    let (last, before) = items.split_last().unwrap();
    assert!(
        before.iter().all(|x| x.is_ok()) && before.len() > 1000,
        "{}",
        before.len()
    );
    let err = last.as_ref().unwrap_err().to_string();
    assert!(err.contains("dump file"), "{err}");
    assert!(e.read_dump().is_err());
    e.close().unwrap();
}

/// A BGSAVE that outgrows the room beside the last dump overwrites the
/// last dump's body: if it then fails it leaves no dump (an empty list)
/// rather than the old header over a damaged body (a checksum error,
/// before a dump erased the header first).
#[test]
fn a_failed_bgsave_leaves_no_dump_rather_than_a_damaged_one() {
    let stack = stack_on(Arc::new(MemDevice::new(64 * MIB)), 16 * MIB, log_config());
    // A dump file of 6 MiB.
    let cfg = EngineConfig {
        dump_pct: 10,
        ..small_config()
    };
    let e = Engine::open(&stack, cfg).unwrap();
    let mut rng = SmallRng::seed_from_u64(6);
    fill_random(&e, &mut rng, 0..1000);
    assert!(bgsave_done(&e).last_error.is_none());
    assert_eq!(e.read_dump().unwrap().len(), 1000);
    // About 7 MiB of random bytes: the next dump does not fit.
    fill_random(&e, &mut rng, 1000..3500);
    let s = bgsave_done(&e);
    assert!(
        s.last_error
            .as_deref()
            .is_some_and(|m| m.contains("too small")),
        "{s:?}"
    );
    assert_eq!(e.read_dump().unwrap().len(), 0, "no dump");
    assert!(!e.dump_entries().unwrap().exists());
    e.close().unwrap();
}

/// Writes acknowledged keys, cuts the power at a seeded moment, restarts,
/// and checks every acknowledged write.
fn power_cut_round(seed: u64, device_bytes: u64, writes: std::ops::Range<usize>) {
    let faults = FaultConfig {
        seed,
        torn_writes: seed % 2 == 0,
        ..FaultConfig::default()
    };
    let dev = Arc::new(FaultyDevice::new(Arc::new(MemDevice::new(device_bytes)), faults).unwrap());
    let mut rng = SmallRng::seed_from_u64(seed);
    // Every acknowledged value of each key, in order (the last must win).
    let mut acked: HashMap<Vec<u8>, Vec<Vec<u8>>> = HashMap::new();
    let check = |round: usize, acked: &HashMap<Vec<u8>, Vec<Vec<u8>>>| {
        let e = match open_on(dev.clone(), MIB) {
            Ok(e) => e,
            Err(err) => panic!("reopen failed in round {round}: {err}; reproduce with SEED={seed}"),
        };
        for (k, versions) in acked {
            let got = e.get(k).unwrap();
            let last = versions.last().expect("at least one version");
            if got.as_ref() != Some(last) {
                let which = got
                    .as_ref()
                    .and_then(|g| versions.iter().position(|v| v == g));
                panic!(
                    "key {:?} in round {round}: expected version {} of {}, got {}; reproduce with SEED={seed}",
                    String::from_utf8_lossy(k),
                    versions.len() - 1,
                    versions.len(),
                    match (got, which) {
                        (None, _) => "nothing".to_owned(),
                        (Some(_), Some(i)) => format!("the older version {i}"),
                        (Some(g), None) => format!("an unknown value of {} bytes", g.len()),
                    }
                );
            }
        }
        e
    };
    for round in 0..3 {
        let e = check(round, &acked);
        let writes = rng.gen_range(writes.clone());
        let cut_at = rng.gen_range(0..writes);
        let save_at = rng.gen_range(0..writes);
        let e = Arc::new(e);
        let (mut ok_before, mut failed_after) = (0, 0);
        let mut saver = None;
        for i in 0..writes {
            if i == save_at {
                let e2 = e.clone();
                saver = Some(std::thread::spawn(move || {
                    let _ = e2.save();
                }));
            }
            if i == cut_at {
                dev.power_cut().unwrap();
            }
            let key = format!("k{}", rng.gen_range(0..300)).into_bytes();
            let len = if rng.gen_ratio(1, 20) {
                rng.gen_range(3000..20_000)
            } else {
                rng.gen_range(1..600)
            };
            let value: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            match e.set(&key, &value, SetOptions::default()) {
                Ok(_) => {
                    acked.entry(key).or_default().push(value);
                    ok_before += usize::from(i < cut_at);
                }
                Err(_) => failed_after += usize::from(i >= cut_at),
            }
        }
        assert!(
            ok_before == cut_at,
            "writes before the cut failed; reproduce with SEED={seed}"
        );
        assert!(
            failed_after > 0 || writes - cut_at <= 1,
            "writes after the cut were acknowledged; SEED={seed}"
        );
        if cut_at >= writes {
            dev.power_cut().unwrap();
        }
        // A power cut ends the process: every thread of the old engine must
        // be gone before the device comes back, or its writeback and
        // checkpoints would write state a real crash never could.
        if let Some(t) = saver {
            t.join().unwrap();
        }
        assert_eq!(Arc::strong_count(&e), 1, "the old engine is still shared");
        drop(e);
        dev.restart();
    }
    check(3, &acked).close().unwrap();
}

#[test]
fn every_acknowledged_write_survives_power_cuts() {
    let seeds: Vec<u64> = match std::env::var("SEED") {
        Ok(s) => vec![s.parse().expect("SEED is a number")],
        Err(_) => (1..=12).collect(),
    };
    for seed in seeds {
        power_cut_round(seed, 48 * MIB, 50..400);
    }
}

/// The same on a device whose value log (about 5 MiB) wraps about three
/// times over the rounds (half a round's writes, on average, come before
/// its cut), so cuts land while the cleaner copies records and space is
/// reused.
#[test]
fn every_acknowledged_write_survives_power_cuts_while_the_log_wraps() {
    let seeds: Vec<u64> = match std::env::var("SEED") {
        Ok(s) => vec![s.parse().expect("SEED is a number")],
        Err(_) => (100..=105).collect(),
    };
    for seed in seeds {
        power_cut_round(seed, 12 * MIB, 8000..12000);
    }
}

#[test]
fn the_value_log_wraps_and_cleans_without_losing_a_key() {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(16 * MIB));
    let mut rng = SmallRng::seed_from_u64(9);
    let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    let e = open_on(dev.clone(), MIB).unwrap();
    let (_, _, region) = e.space();
    let mut written = 0u64;
    while written < 4 * region {
        let key = format!("key{}", rng.gen_range(0..2500)).into_bytes();
        if rng.gen_ratio(1, 10) {
            e.del(&[&key]).unwrap();
            model.remove(&key);
            continue;
        }
        let value: Vec<u8> = (0..rng.gen_range(100..2000)).map(|_| rng.gen()).collect();
        written += value.len() as u64 + 40;
        e.set(&key, &value, SetOptions::default()).unwrap();
        model.insert(key, value);
    }
    let s = e.background_stats();
    assert!(s.cleaned_records > 0 && s.cleaned_bytes > region, "{s:?}");
    assert!(s.last_error.is_none(), "{s:?}");
    let (live, span, _) = e.space();
    assert!(
        live <= span && span <= region,
        "live {live}, span {span}, region {region}"
    );
    let check = |e: &Engine| {
        assert_eq!(e.dbsize(), model.len() as u64);
        for (k, v) in &model {
            assert_eq!(
                e.get(k).unwrap().as_ref(),
                Some(v),
                "key {:?}",
                String::from_utf8_lossy(k)
            );
        }
    };
    check(&e);
    e.close().unwrap();
    drop(e);
    let e = open_on(dev, MIB).unwrap();
    check(&e);
    e.close().unwrap();
}

/// A header that does not read (here, a version this build does not
/// know) keeps nothing: the next BGSAVE erases it before it writes, so
/// that when that BGSAVE fails the store has no dump, not that header
/// over a body written across.
#[test]
fn an_unreadable_dump_header_is_erased_before_the_next_dump_writes() {
    let mem = Arc::new(MemDevice::new(64 * MIB));
    // A dump file of 6 MiB.
    let cfg = EngineConfig {
        dump_pct: 10,
        ..small_config()
    };
    let e = Engine::open(&stack_on(mem.clone(), 16 * MIB, log_config()), cfg).unwrap();
    let mut rng = SmallRng::seed_from_u64(9);
    fill_random(&e, &mut rng, 0..1000);
    assert!(bgsave_done(&e).last_error.is_none());
    let mut page = dump_file_bytes(&mem, &cfg, 0, 4096);
    page[4..8].copy_from_slice(&9u32.to_le_bytes());
    write_dump_header_page(&mem, &cfg, &page);
    assert!(
        matches!(e.read_dump(), Err(EngineError::Corrupt(ref m)) if m.contains("version")),
        "the header does not read"
    );
    // About 7 MiB of random bytes: the next dump does not fit.
    fill_random(&e, &mut rng, 1000..3500);
    let s = bgsave_done(&e);
    assert!(
        s.last_error
            .as_deref()
            .is_some_and(|m| m.contains("too small")),
        "{s:?}"
    );
    assert!(!e.dump_entries().unwrap().exists(), "no dump");
    e.close().unwrap();
}

/// A device that holds back every write of more than a page while `hold`
/// is set, until [`HeldWrites::release`]: writes in flight when the power
/// goes. (A dump's header, one page, goes through.)
struct HeldWrites {
    inner: Arc<FaultyDevice>,
    hold: std::sync::atomic::AtomicBool,
    held: std::sync::Mutex<Vec<(critio::device::Command, critio::device::Completer)>>,
}

impl HeldWrites {
    fn release(&self) {
        self.hold.store(false, std::sync::atomic::Ordering::SeqCst);
        for (cmd, done) in self.held.lock().unwrap().drain(..) {
            self.inner.submit(cmd, done);
        }
    }
}

impl Device for HeldWrites {
    fn info(&self) -> &critio::device::DeviceInfo {
        self.inner.info()
    }

    fn submit(&self, cmd: critio::device::Command, done: critio::device::Completer) {
        let mut held = self.held.lock().unwrap();
        if self.hold.load(std::sync::atomic::Ordering::SeqCst)
            && cmd.op == critio::device::Op::Write
            && cmd.buf.len() > 4096
        {
            held.push((cmd, done));
        } else {
            drop(held);
            self.inner.submit(cmd, done);
        }
    }
}

/// A BGSAVE cut short by a power cut leaves the last dump whole, as Redis
/// keeps `dump.rdb` until a new one is renamed over it: a new body goes
/// where the last one ends, around the dump file's end, and the header is
/// rewritten only once it is durable.
#[test]
fn a_bgsave_cut_short_leaves_the_last_dump_and_the_next_wraps_around_the_file() {
    use std::sync::atomic::Ordering::SeqCst;
    let mem = Arc::new(MemDevice::new(64 * MIB));
    let faulty = Arc::new(FaultyDevice::new(mem.clone(), FaultConfig::default()).unwrap());
    let dev = Arc::new(HeldWrites {
        inner: faulty.clone(),
        hold: false.into(),
        held: Default::default(),
    });
    // A dump file of 6 MiB.
    let cfg = EngineConfig {
        dump_pct: 10,
        ..small_config()
    };
    let e = Engine::open(&stack_on(dev.clone(), 16 * MIB, log_config()), cfg).unwrap();
    let mut rng = SmallRng::seed_from_u64(8);
    let mut now: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    let dump = |e: &Engine| -> HashMap<Vec<u8>, Vec<u8>> {
        let entries = e.read_dump().unwrap();
        let n = entries.len();
        let map: HashMap<_, _> = entries
            .into_iter()
            .map(|x| match x.value {
                Value::Str(v) => (x.key, v),
                other => panic!("a string was dumped as {other:?}"),
            })
            .collect();
        assert_eq!(map.len(), n, "a key dumped twice");
        map
    };

    // The first dump, about 2 MiB.
    now.extend(fill_random(&e, &mut rng, 0..1000));
    assert!(bgsave_done(&e).last_error.is_none());
    let first = now.clone();
    assert!(dump(&e) == first);

    // The second, about 3.5 MiB (it fits beside the first), cut short by
    // the power while its first write is in flight.
    now.extend(fill_random(&e, &mut rng, 200..1800));
    dev.hold.store(true, SeqCst);
    e.bgsave().unwrap();
    let start = std::time::Instant::now();
    // (Its first body write: the block layer lets one of a background's
    // writes to the device at a time here.)
    while dev.held.lock().unwrap().is_empty() {
        assert!(start.elapsed().as_secs() < 60, "the BGSAVE wrote nothing");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(e.background_running().0, "cut while it runs");
    faulty.power_cut().unwrap();
    dev.release();
    let cut = std::time::Instant::now();
    while e.background_running() != (false, false) {
        assert!(cut.elapsed().as_secs() < 60, "the cut BGSAVE never ended");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let s = e.background_stats();
    assert!(s.last_error.is_some() && s.snapshots == 1, "{s:?}");
    drop(e);

    let (mem, faulty) = mixed_ops::restarted(&mem, &FaultConfig::default());
    let e = Engine::open(&stack_on(faulty, 16 * MIB, log_config()), cfg).unwrap();
    assert!(dump(&e) == first, "the last dump, whole");
    // Every acknowledged write is there all the same.
    for (k, v) in &now {
        assert_eq!(e.get(k).unwrap().as_ref(), Some(v));
    }

    // The second again, whole this time, beside the first.
    assert!(bgsave_done(&e).last_error.is_none());
    assert!(dump(&e) == now);
    // A third, of about 1.2 MiB: it starts near the file's end, where the
    // second ends, and wraps around to its start.
    for i in 0..1200 {
        assert_eq!(e.del(&[format!("k{i}").as_bytes()]).unwrap(), 1);
        now.remove(format!("k{i}").as_bytes());
    }
    assert!(bgsave_done(&e).last_error.is_none());
    assert!(dump(&e) == now);
    e.check_dump().unwrap();
    // It did wrap: its header (version 3) puts its start within the
    // body area and its end past the area's end. (The dump's writes go
    // around the cache and are flushed: the device has them.)
    let layout = critio_kv::engine::Layout::new(64 * MIB, cfg.log_bytes, 10, 4096).unwrap();
    let area = layout.dump.1 - 4096;
    let header = || {
        let head = dump_file_bytes(&mem, &cfg, 0, 4096);
        assert_eq!(&head[..8], b"CKVD\x03\0\0\0");
        let word = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().unwrap());
        (word(16), word(28)) // body bytes, start
    };
    let (body, start) = header();
    assert!(
        start < area && start + body > area,
        "{start} + {body} against {area}"
    );
    // A fourth, of about 5.2 MiB: more than the room beside the third,
    // so it erases the third's header and writes over part of its body,
    // and is whole all the same.
    now.extend(fill_random(&e, &mut rng, 2000..4100));
    assert!(bgsave_done(&e).last_error.is_none());
    assert!(dump(&e) == now);
    let (body4, start4) = header();
    let len = body.div_ceil(4096) * 4096;
    assert_eq!(start4, (start + len) % area);
    assert!(
        body4 > area - len && body4 <= area,
        "{body4} against {body}"
    );
    e.close().unwrap();
}

/// A dump written before dumps could start anywhere (version 2, its body
/// at the dump file's start) still reads, and the next BGSAVE goes beside
/// it.
#[test]
fn a_version_2_dump_still_reads_and_is_kept_by_the_next_bgsave() {
    let mem = Arc::new(MemDevice::new(64 * MIB));
    let cfg = EngineConfig {
        dump_pct: 10,
        ..small_config()
    };
    let head = |mem: &MemDevice| dump_file_bytes(mem, &cfg, 0, 4096);
    let wait = |e: &Engine| assert!(bgsave_done(e).last_error.is_none());
    let e = Engine::open(&stack_on(mem.clone(), 16 * MIB, log_config()), cfg).unwrap();
    for i in 0..300 {
        set(&e, &format!("k{i}"), format!("one {i}").as_bytes());
    }
    wait(&e);
    e.close().unwrap();
    // The first dump starts at the body area's start: as version 2 it is
    // the same dump with a shorter header.
    let mut page = head(&mem);
    assert_eq!(&page[4..8], &3u32.to_le_bytes());
    assert_eq!(&page[28..36], &0u64.to_le_bytes());
    page[4..8].copy_from_slice(&2u32.to_le_bytes());
    page[28..36].fill(0xee); // not read in version 2
    write_dump_header_page(&mem, &cfg, &page);

    let body_of = |page: &[u8]| u64::from_le_bytes(page[16..24].try_into().unwrap());
    let v2_body = |mem: &MemDevice| {
        let len = body_of(&head(mem)).div_ceil(4096) as usize * 4096;
        dump_file_bytes(mem, &cfg, 4096, len)
    };
    let before = v2_body(&mem);

    let e = Engine::open(&stack_on(mem.clone(), 16 * MIB, log_config()), cfg).unwrap();
    let d = e.read_dump().unwrap();
    assert_eq!(d.len(), 300);
    let value = |x: &critio_kv::engine::Entry| match &x.value {
        Value::Str(v) => v.clone(),
        other => panic!("{other:?}"),
    };
    for x in &d {
        let i = std::str::from_utf8(&x.key[1..]).unwrap();
        assert_eq!(value(x), format!("one {i}").into_bytes());
    }
    for i in 0..300 {
        set(&e, &format!("k{i}"), format!("two {i}").as_bytes());
    }
    wait(&e);
    let d = e.read_dump().unwrap();
    assert_eq!(d.len(), 300);
    assert!(d.iter().all(|x| value(x).starts_with(b"two ")));
    e.close().unwrap();
    // Version 3, beside the version 2 body, which is as it was.
    let page = head(&mem);
    let start = u64::from_le_bytes(page[28..36].try_into().unwrap());
    assert_eq!(&page[4..8], &3u32.to_le_bytes());
    assert_eq!(start, before.len() as u64);
    assert!(body_of(&page) > 0);
    assert!(
        dump_file_bytes(&mem, &cfg, 4096, before.len()) == before,
        "the version 2 body kept"
    );
}

#[test]
fn a_snapshot_holds_every_key_as_it_was_when_bgsave_was_called() {
    let e = Arc::new(open_on(Arc::new(MemDevice::new(32 * MIB)), MIB).unwrap());
    for i in 0..600 {
        set(&e, &format!("k{i}"), format!("old{i}").as_bytes());
    }
    e.hset(b"h", &[(b"f", b"v")]).unwrap();
    e.bgsave().unwrap();
    // Everything from here on is after the snapshot's moment.
    for i in 0..600 {
        match i % 3 {
            0 => set(&e, &format!("k{i}"), b"new"),
            1 => assert_eq!(e.del(&[format!("k{i}").as_bytes()]).unwrap(), 1),
            _ => {}
        }
    }
    set(&e, "born-later", b"x");
    e.bgrewrite().unwrap(); // moves the old records while the snapshot reads them
    while e.background_running() != (false, false) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let s = e.background_stats();
    assert!(s.last_error.is_none(), "{s:?}");
    let dump = e.read_dump().unwrap();
    assert_eq!(dump.len(), 601, "every key of the moment, nothing later");
    let by_key: HashMap<Vec<u8>, critio_kv::engine::Value> =
        dump.into_iter().map(|x| (x.key, x.value)).collect();
    for i in 0..600 {
        let want = critio_kv::engine::Value::Str(format!("old{i}").into_bytes());
        assert_eq!(by_key.get(format!("k{i}").as_bytes()), Some(&want), "k{i}");
    }
    assert!(matches!(
        by_key.get(&b"h"[..]),
        Some(critio_kv::engine::Value::Hash(_))
    ));
    e.close().unwrap();
}

/// Scans (BGSAVE, BGREWRITEAOF, the index rebuilt on open) read the value
/// log in 1 MiB chunks, several ahead: values larger than a chunk, and
/// records that straddle chunk boundaries, come back whole.
#[test]
fn values_larger_than_a_scan_chunk_survive_snapshot_rewrite_and_reopen() {
    let open = |dev: Arc<dyn Device>| {
        let cfg = EngineConfig {
            log_bytes: 16 * MIB,
            checkpoint_interval_ms: 0,
            value_bytes_max: 3 * MIB as usize,
            ..EngineConfig::default()
        };
        let log = LogConfig {
            record_bytes_max: 7 * MIB / 2,
            batch_bytes_max: 4 * MIB,
            pending_bytes_max: 8 * MIB,
            ..LogConfig::default()
        };
        Engine::open(&stack_on(dev, 2 * MIB, log), cfg).unwrap()
    };
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(128 * MIB));
    let mut rng = SmallRng::seed_from_u64(11);
    let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    {
        let e = open(dev.clone());
        for i in 0..30 {
            let key = format!("big{}", i % 20).into_bytes();
            let len = match i % 3 {
                0 => rng.gen_range(MIB as usize..3 * MIB as usize),
                1 => rng.gen_range(100_000..700_000),
                _ => rng.gen_range(1..5000),
            };
            let mut value = vec![0u8; len];
            rng.fill(&mut value[..]);
            e.set(&key, &value, SetOptions::default()).unwrap();
            model.insert(key, value);
        }
        e.bgsave().unwrap();
        while e.background_running() != (false, false) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        e.bgrewrite().unwrap();
        while e.background_running() != (false, false) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let s = e.background_stats();
        assert!(s.last_error.is_none(), "{s:?}");
        let dump = e.read_dump().unwrap();
        assert_eq!(dump.len(), model.len());
        for x in dump {
            let want = critio_kv::engine::Value::Str(model[&x.key].clone());
            assert_eq!(x.value, want, "{:?}", String::from_utf8_lossy(&x.key));
        }
        e.close().unwrap();
    }
    let e = open(dev);
    assert_eq!(e.dbsize(), model.len() as u64);
    for (k, v) in &model {
        assert_eq!(e.get(k).unwrap().as_ref(), Some(v));
    }
    e.close().unwrap();
}

#[test]
fn a_round_of_deferred_commits_is_durable_when_commit_returns() {
    let e = open_on(Arc::new(MemDevice::new(32 * MIB)), MIB).unwrap();
    let round = e.defer_commits();
    assert_eq!(round.lsn(), 0, "nothing logged yet");
    round.commit().unwrap(); // nothing to wait for
    set(&e, "a", b"1");
    set(&e, "b", b"2");
    let lsn = round.lsn();
    assert!(lsn > 0, "the round's writes were logged");
    assert_eq!(e.get(b"a").unwrap(), Some(b"1".to_vec()), "and applied");
    round.commit().unwrap();
    assert!(e.log().durable_lsn() >= lsn, "durable once commit returns");
    assert_eq!(round.lsn(), 0, "the round starts over");
    // Another thread's writes are not part of this thread's round.
    std::thread::scope(|s| {
        s.spawn(|| {
            set(&e, "c", b"3");
            assert!(e.log().durable_lsn() >= e.log().next_lsn() - 1);
        });
    });
    assert_eq!(round.lsn(), 0);
    set(&e, "d", b"4");
    let last = round.lsn();
    drop(round); // a round dropped with writes waits for them
    assert!(e.log().durable_lsn() >= last);
    set(&e, "e", b"5"); // no round: commits on its own
    assert_eq!(e.log().durable_lsn(), e.log().next_lsn() - 1);
    e.close().unwrap();
}

/// Writes in rounds of deferred commits, a power cut somewhere: every write
/// of a round whose commit returned Ok survives, in order.
#[test]
fn deferred_rounds_survive_power_cuts() {
    for seed in 0..6u64 {
        let faults = FaultConfig {
            seed,
            torn_writes: seed % 2 == 0,
            ..FaultConfig::default()
        };
        let dev = Arc::new(FaultyDevice::new(Arc::new(MemDevice::new(32 * MIB)), faults).unwrap());
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut acked: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let e = open_on(dev.clone(), MIB).unwrap();
        let rounds = 40;
        let cut_at = rng.gen_range(0..rounds);
        let mut failed_after = 0;
        for r in 0..rounds {
            if r == cut_at {
                dev.power_cut().unwrap();
            }
            let round = e.defer_commits();
            let mut written = Vec::new();
            let mut refused = false;
            for _ in 0..rng.gen_range(1..12) {
                let key = format!("k{}", rng.gen_range(0..50)).into_bytes();
                let value: Vec<u8> = (0..rng.gen_range(1..900)).map(|_| rng.gen()).collect();
                match e.set(&key, &value, SetOptions::default()) {
                    Ok(_) => written.push((key, value)),
                    Err(_) => refused = true,
                }
            }
            // After the cut a write may fail at once (its writer throttled
            // on writeback that fails), or be logged and fail at commit.
            if refused {
                assert!(r >= cut_at, "a write before the cut failed; SEED={seed}");
                failed_after += 1;
            }
            match round.commit() {
                Ok(()) if written.is_empty() => {} // nothing logged
                Ok(()) => {
                    assert!(
                        r < cut_at,
                        "a round after the cut was acknowledged; SEED={seed}"
                    );
                    acked.extend(written);
                }
                Err(_) => {
                    assert!(r >= cut_at, "a round before the cut failed; SEED={seed}");
                    failed_after += 1;
                }
            }
        }
        // The cut took effect: some write or commit after it failed.
        assert!(failed_after > 0 || cut_at + 1 >= rounds, "SEED={seed}");
        drop(e);
        dev.restart();
        let e = open_on(dev.clone(), MIB).unwrap();
        for (k, v) in &acked {
            assert_eq!(
                e.get(k).unwrap().as_ref(),
                Some(v),
                "key {k:?}; SEED={seed}"
            );
        }
        e.close().unwrap();
    }
}

#[test]
fn a_transaction_applies_every_write_or_none_and_keeps_expiry_across_reopen() {
    use critio_kv::engine::{ExpireIf, Value};
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(32 * MIB));
    let far = 4_000_000_000_000; // ms since the epoch, in 2096
    {
        let e = open_on(dev.clone(), MIB).unwrap();
        set(&e, "s", b"10");
        e.hset(b"h", &[(b"f", b"1")]).unwrap();
        let keys: [&[u8]; 4] = [b"s", b"h", b"new", b"gone"];
        set(&e, "gone", b"x");
        let replies = e
            .transact(&keys, |t| {
                let a = t.incr_by(b"s", 5);
                // Fails (a hash is not a string) and writes nothing ...
                let b = t.incr_by(b"h", 1);
                // ... while the rest of the transaction goes on.
                let c = t.hincr_by(b"h", b"f", 2);
                t.put(b"new", Value::Str(b"n".to_vec()), 0);
                let d = t.expire_at(b"new", far, ExpireIf::Nx);
                let gone = t.remove(b"gone");
                // Reads see the transaction's own writes.
                let seen = t.get(b"s").unwrap();
                (a.unwrap(), b.is_err(), c.unwrap(), d.unwrap(), gone, seen)
            })
            .unwrap();
        assert_eq!(replies, (15, true, 3, true, true, Some(b"15".to_vec())));
        // A transaction that writes nothing logs nothing and sees the store.
        let n = e.transact(&[b"s"], |t| t.pttl(b"s")).unwrap();
        assert_eq!(n, -1);
        assert_eq!(e.versions(&[b"nothing"]).unwrap(), vec![None]);
        // No close: the reopen replays the log record.
    }
    let e = open_on(dev, MIB).unwrap();
    assert_eq!(e.get(b"s").unwrap(), Some(b"15".to_vec()));
    assert_eq!(e.hget(b"h", b"f").unwrap(), Some(b"3".to_vec()));
    assert_eq!(e.get(b"gone").unwrap(), None);
    let ttl = e.transact(&[b"new"], |t| t.pttl(b"new")).unwrap();
    assert!(
        ttl > 1_000_000_000,
        "the expiry survived the restart: {ttl}"
    );
    assert_eq!(e.dbsize(), 3);
    // WRONGTYPE and friends leave the key as it was.
    assert!(matches!(
        e.transact(&[b"s"], |t| t.hset(b"s", &[(b"f", b"v")]))
            .unwrap(),
        Err(EngineError::WrongType)
    ));
    assert!(matches!(
        e.transact(&[b"h"], |t| t.incr_by_float(b"h", 1.0)).unwrap(),
        Err(EngineError::WrongType)
    ));
    e.close().unwrap();
}

/// Transactions of three keys each, with power cuts: after every restart
/// each transaction's keys are all there with its value or all absent, and
/// every acknowledged one is there.
#[test]
fn transactions_are_atomic_across_power_cuts() {
    let seeds: Vec<u64> = match std::env::var("SEED") {
        Ok(s) => vec![s.parse().expect("SEED is a number")],
        Err(_) => (1..=6).collect(),
    };
    for seed in seeds {
        let faults = FaultConfig {
            seed,
            torn_writes: seed % 2 == 0,
            ..FaultConfig::default()
        };
        let dev = Arc::new(FaultyDevice::new(Arc::new(MemDevice::new(48 * MIB)), faults).unwrap());
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut acked: HashMap<usize, Vec<u8>> = HashMap::new();
        for round in 0..3 {
            let e = open_on(dev.clone(), MIB).unwrap();
            for group in 0..50 {
                let keys: Vec<Vec<u8>> = ["a", "b", "c"]
                    .iter()
                    .map(|p| format!("{p}{group}").into_bytes())
                    .collect();
                let got: Vec<_> = keys.iter().map(|k| e.get(k).unwrap()).collect();
                assert!(
                    got.iter().all(|g| g == &got[0]),
                    "transaction {group} half applied after round {round}: SEED={seed}"
                );
                if let Some(v) = acked.get(&group) {
                    assert_eq!(got[0].as_ref(), Some(v), "acknowledged, lost: SEED={seed}");
                }
            }
            let writes = rng.gen_range(50..300);
            let cut_at = rng.gen_range(0..writes);
            for i in 0..writes {
                if i == cut_at {
                    dev.power_cut().unwrap();
                }
                let group = rng.gen_range(0..50);
                let keys: Vec<Vec<u8>> = ["a", "b", "c"]
                    .iter()
                    .map(|p| format!("{p}{group}").into_bytes())
                    .collect();
                let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
                let len = rng.gen_range(1..3000);
                let value: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                let done = e.transact(&refs, |t| {
                    for k in &refs {
                        t.set(k, &value, SetOptions::default()).unwrap();
                    }
                });
                if done.is_ok() {
                    assert!(i < cut_at, "acknowledged after the cut: SEED={seed}");
                    acked.insert(group, value);
                }
            }
            drop(e);
            dev.restart();
        }
    }
}

/// `busy` and `try_get` name a stripe a background thread holds (so a
/// server parks the request rather than its worker), and not one a
/// foreground thread (another request) holds: that one is waited for.
#[test]
fn a_stripe_held_by_background_work_is_named_and_one_held_by_a_request_is_not() {
    let e = Arc::new(open_on(Arc::new(MemDevice::new(32 * MIB)), MIB).unwrap());
    set(&e, "k", b"v");
    for foreground in [false, true] {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let e2 = e.clone();
        let holder = std::thread::spawn(move || {
            if foreground {
                critio::context::set_foreground();
            }
            let mut first = true;
            e2.transact(&[b"k"], |_| {
                if std::mem::take(&mut first) {
                    ready_tx.send(()).unwrap();
                    let _ = go_rx.recv();
                }
            })
            .unwrap();
        });
        ready_rx.recv().unwrap();
        let keys: [&[u8]; 1] = [b"k"];
        if foreground {
            assert_eq!(e.busy(&keys), None, "a request's stripe is waited for");
            // try_get waits for it: let the holder go once it is waiting.
            let release = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                go_tx.send(()).unwrap();
            });
            assert_eq!(e.try_get(b"k").unwrap(), Ok(Some(b"v".to_vec())));
            release.join().unwrap();
        } else {
            let busy = e.busy(&keys).expect("a background job's stripe is named");
            assert!(busy.waits_for_lock());
            assert_eq!(e.try_get(b"k").unwrap(), Err(busy));
            go_tx.send(()).unwrap();
            e.prefetch(&busy).unwrap(); // returns once the stripe is free
        }
        holder.join().unwrap();
        assert_eq!(e.busy(&keys), None);
    }
    Arc::into_inner(e).unwrap().close().unwrap();
}

/// The model-based power-cut test: writer threads (one to three, each on
/// keys of its own) run a seeded mix of every operation that changes data
/// (SET with its options and expiries, DEL, MSET, APPEND, INCRBY, HSET,
/// HDEL, HINCRBY, EXPIRE with its conditions, PERSIST, GETDEL, multi-key
/// transactions, rounds of deferred commits, FLUSHALL between phases)
/// while a background thread runs SAVE, BGSAVE and BGREWRITEAOF, the
/// checkpointer runs every few ms and the value log wraps (so the cleaner
/// copies records); one writer cuts the power at a seeded point.
///
/// Each writer keeps a model of its keys: the state every acknowledged
/// operation left, checked against the engine's reply as it goes, and the
/// operations after it whose outcome is unknown (in flight at the cut,
/// refused, or in a round whose commit failed). After each restart its
/// keys must be exactly the model's state after some prefix of those
/// unknown operations (each transaction whole): nothing acknowledged is
/// lost, no deleted or expired key comes back, no value is torn, no
/// expiry is lost or made up. Writes issued after the cut must be refused.
mod mixed_ops {
    use std::collections::BTreeMap;
    use std::fmt::Debug;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use critio::device::faulty::{FaultConfig, FaultyDevice};
    use critio::device::mem::MemDevice;
    use critio::device::{submit_and_wait, Command, Device};
    use critio::log::LogConfig;
    use critio::Class;
    use critio_kv::engine::{
        Engine, EngineConfig, EngineError, ExpireIf, SetOptions, SetOutcome, Txn, Value,
    };
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    use super::{stack_on, MIB};

    /// Expiries that are deterministic: long past, and far ahead (2096,
    /// 2099). Keys of the second kind (`x` in their names) also get
    /// expiries a few ms to a second ahead, and only blind writes.
    const PAST: u64 = 1_000;
    const FAR: u64 = 4_000_000_000_000;
    const FARTHER: u64 = 4_100_000_000_000;
    /// Normal keys and short-lived keys per writer.
    const KEYS: usize = 40;
    const XKEYS: usize = 8;
    const FIELDS: [&[u8]; 6] = [b"f0", b"f1", b"f2", b"f3", b"f4", b"f5"];

    fn now_ms() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    }

    /// Each key's value and expiry (0: none).
    type State = BTreeMap<Vec<u8>, (Value, u64)>;

    /// One key's operation (alone, or inside a transaction).
    #[derive(Clone, Debug)]
    enum KeyOp {
        Set(Vec<u8>, SetOptions),
        Remove,
        Append(Vec<u8>),
        IncrBy(i64),
        HSet(Vec<(Vec<u8>, Vec<u8>)>),
        HDel(Vec<Vec<u8>>),
        HIncrBy(Vec<u8>, i64),
        ExpireAt(u64, ExpireIf),
        Persist,
        GetDel,
        Get,
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// Through the engine's own method if it has one, else as a
        /// transaction of one key.
        One(Vec<u8>, KeyOp),
        Del(Vec<Vec<u8>>),
        MSet(Vec<(Vec<u8>, Vec<u8>)>),
        /// A transaction over the keys: (position in them, operation)*.
        Txn(Vec<Vec<u8>>, Vec<(usize, KeyOp)>),
        FlushAll,
    }

    fn short(b: &[u8]) -> String {
        if b.len() <= 12 {
            format!("{:?}", String::from_utf8_lossy(b))
        } else {
            format!("<{} bytes {:02x?}..>", b.len(), &b[..4])
        }
    }

    fn describe_key_op(op: &KeyOp) -> String {
        match op {
            KeyOp::Set(v, o) => format!(
                "SET {}{}{}{}{}{}",
                short(v),
                if o.nx { " NX" } else { "" },
                if o.xx { " XX" } else { "" },
                if o.keep_ttl { " KEEPTTL" } else { "" },
                if o.get { " GET" } else { "" },
                o.expire_at_ms
                    .map_or(String::new(), |at| format!(" PXAT {at}"))
            ),
            KeyOp::Append(t) => format!("APPEND {}", short(t)),
            KeyOp::HSet(f) => format!("HSET {} fields", f.len()),
            KeyOp::HDel(f) => format!("HDEL {} fields", f.len()),
            other => format!("{other:?}"),
        }
    }

    fn describe(op: &Op) -> String {
        let k = |k: &[u8]| String::from_utf8_lossy(k).into_owned();
        match op {
            Op::One(key, op) => format!("{} {}", k(key), describe_key_op(op)),
            Op::Del(keys) => format!("DEL {:?}", keys.iter().map(|x| k(x)).collect::<Vec<_>>()),
            Op::MSet(pairs) => format!(
                "MSET {:?}",
                pairs
                    .iter()
                    .map(|(key, v)| format!("{} {}", k(key), short(v)))
                    .collect::<Vec<_>>()
            ),
            Op::Txn(keys, ops) => format!(
                "TXN [{}]",
                ops.iter()
                    .map(|(i, op)| format!("{} {}", k(&keys[*i]), describe_key_op(op)))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            Op::FlushAll => "FLUSHALL".into(),
        }
    }

    /// The keys an operation writes (None: every key).
    fn keys_of(op: &Op) -> Option<Vec<Vec<u8>>> {
        match op {
            Op::One(k, _) => Some(vec![k.clone()]),
            Op::Del(keys) | Op::Txn(keys, _) => Some(keys.clone()),
            Op::MSet(pairs) => Some(pairs.iter().map(|(k, _)| k.clone()).collect()),
            Op::FlushAll => None,
        }
    }

    fn is_x(key: &[u8]) -> bool {
        key.contains(&b'x')
    }

    fn fmt<T: Debug>(r: Result<T, EngineError>) -> String {
        match r {
            Ok(v) => format!("{v:?}"),
            Err(e) => format!("E:{e}"),
        }
    }

    /// Errors that are the operation's reply (it wrote nothing).
    fn logical(e: &EngineError) -> bool {
        matches!(
            e,
            EngineError::WrongType
                | EngineError::NotInteger
                | EngineError::NotFloat
                | EngineError::HashNotInteger
                | EngineError::HashNotFloat
                | EngineError::NanOrInfinity
                | EngineError::Overflow
        )
    }

    /// Errors of a store that lost its device (the power cut).
    fn io(e: &EngineError) -> bool {
        matches!(
            e,
            EngineError::Failed(_)
                | EngineError::Log(_)
                | EngineError::Cache(_)
                | EngineError::Block(_)
        )
    }

    /// Redis's integer parsing, as the engine's.
    fn parse_int(s: &[u8]) -> Option<i64> {
        let t = std::str::from_utf8(s).ok()?;
        if t.starts_with('+') || (t.len() > 1 && t.starts_with('0')) || t.starts_with("-0") {
            return None;
        }
        t.parse().ok()
    }

    fn live<'a>(s: &'a State, key: &[u8], now: u64) -> Option<&'a (Value, u64)> {
        s.get(key).filter(|(_, exp)| *exp == 0 || *exp > now)
    }

    /// The model of one key's operation: the reply, None if it depends
    /// on a short-lived key's expiry.
    fn apply_key(s: &mut State, key: &[u8], op: &KeyOp, now: u64) -> Option<String> {
        type Fields = BTreeMap<Vec<u8>, Vec<u8>>;
        let cur = live(s, key, now).cloned();
        let string = || match &cur {
            None => Ok(None),
            Some((Value::Str(v), exp)) => Ok(Some((v.clone(), *exp))),
            Some(_) => Err(EngineError::WrongType),
        };
        let hash = || -> Result<(Fields, u64), EngineError> {
            match &cur {
                None => Ok((Fields::new(), 0)),
                Some((Value::Hash(h), exp)) => Ok((h.clone(), *exp)),
                Some(_) => Err(EngineError::WrongType),
            }
        };
        let k = key.to_vec();
        Some(match op {
            KeyOp::Set(v, o) => fmt((|| {
                let old = if o.get { string()?.map(|x| x.0) } else { None };
                let exists = cur.is_some();
                if (o.nx && exists) || (o.xx && !exists) {
                    return Ok(SetOutcome { set: false, old });
                }
                let exp = match o.expire_at_ms {
                    Some(at) => at,
                    None if o.keep_ttl => cur.as_ref().map_or(0, |c| c.1),
                    None => 0,
                };
                s.insert(k, (Value::Str(v.clone()), exp));
                Ok(SetOutcome { set: true, old })
            })()),
            KeyOp::Remove => {
                s.remove(key);
                if is_x(key) {
                    return None;
                }
                fmt::<bool>(Ok(cur.is_some()))
            }
            KeyOp::Append(tail) => fmt((|| {
                let (mut v, exp) = string()?.unwrap_or_default();
                v.extend_from_slice(tail);
                let len = v.len() as u64;
                s.insert(k, (Value::Str(v), exp));
                Ok(len)
            })()),
            KeyOp::IncrBy(d) => fmt((|| {
                let (n, exp) = match string()? {
                    None => (0, 0),
                    Some((v, exp)) => (parse_int(&v).ok_or(EngineError::NotInteger)?, exp),
                };
                let next = n.checked_add(*d).ok_or(EngineError::Overflow)?;
                s.insert(k, (Value::Str(next.to_string().into_bytes()), exp));
                Ok(next)
            })()),
            KeyOp::HSet(fields) => fmt((|| {
                let (mut h, exp) = hash()?;
                let mut added = 0u64;
                for (f, v) in fields {
                    added += u64::from(h.insert(f.clone(), v.clone()).is_none());
                }
                s.insert(k, (Value::Hash(h), exp));
                Ok(added)
            })()),
            KeyOp::HDel(fields) => fmt((|| {
                let (mut h, exp) = hash()?;
                let removed = fields.iter().filter(|f| h.remove(*f).is_some()).count() as u64;
                if removed > 0 {
                    if h.is_empty() {
                        s.remove(key);
                    } else {
                        s.insert(k, (Value::Hash(h), exp));
                    }
                }
                Ok(removed)
            })()),
            KeyOp::HIncrBy(f, d) => fmt((|| {
                let (mut h, exp) = hash()?;
                let n = match h.get(f) {
                    None => 0,
                    Some(v) => parse_int(v).ok_or(EngineError::HashNotInteger)?,
                };
                let next = n.checked_add(*d).ok_or(EngineError::Overflow)?;
                h.insert(f.clone(), next.to_string().into_bytes());
                s.insert(k, (Value::Hash(h), exp));
                Ok(next)
            })()),
            KeyOp::ExpireAt(at, cond) => fmt::<bool>((|| {
                let Some((v, old)) = cur.clone() else {
                    return Ok(false);
                };
                let ok = match cond {
                    ExpireIf::Always => true,
                    ExpireIf::Nx => old == 0,
                    ExpireIf::Xx => old != 0,
                    ExpireIf::Gt => old != 0 && *at > old,
                    ExpireIf::Lt => old == 0 || *at < old,
                };
                if ok {
                    if *at <= now {
                        s.remove(key);
                    } else {
                        s.insert(k, (v, *at));
                    }
                }
                Ok(ok)
            })()),
            KeyOp::Persist => fmt::<bool>(match cur.clone() {
                Some((v, exp)) if exp != 0 => {
                    s.insert(k, (v, 0));
                    Ok(true)
                }
                _ => Ok(false),
            }),
            KeyOp::GetDel => fmt((|| {
                let old = string()?.map(|x| x.0);
                if old.is_some() {
                    s.remove(key);
                }
                Ok(old)
            })()),
            KeyOp::Get => fmt(string().map(|x| x.map(|x| x.0))),
        })
    }

    /// The model of an operation: its replies (None where unknown).
    fn apply(s: &mut State, op: &Op, now: u64) -> Vec<Option<String>> {
        match op {
            Op::One(k, op) => vec![apply_key(s, k, op, now)],
            Op::Del(keys) => {
                let n = keys.iter().filter(|k| live(s, k, now).is_some()).count() as u64;
                for k in keys {
                    s.remove(k);
                }
                let known = !keys.iter().any(|k| is_x(k));
                vec![known.then(|| format!("{n:?}"))]
            }
            Op::MSet(pairs) => {
                for (k, v) in pairs {
                    s.insert(k.clone(), (Value::Str(v.clone()), 0));
                }
                vec![Some("()".into())]
            }
            Op::Txn(keys, ops) => ops
                .iter()
                .map(|(i, op)| apply_key(s, &keys[*i], op, now))
                .collect(),
            Op::FlushAll => {
                s.clear();
                vec![Some("()".into())]
            }
        }
    }

    fn run_in_txn(t: &mut Txn<'_>, k: &[u8], op: &KeyOp) -> String {
        match op {
            KeyOp::Set(v, o) => fmt(t.set(k, v, *o)),
            KeyOp::Remove => fmt::<bool>(Ok(t.remove(k))),
            KeyOp::Append(tail) => fmt(t.append(k, tail)),
            KeyOp::IncrBy(d) => fmt(t.incr_by(k, *d)),
            KeyOp::HSet(f) => {
                let f: Vec<(&[u8], &[u8])> = f.iter().map(|(a, b)| (&a[..], &b[..])).collect();
                fmt(t.hset(k, &f))
            }
            KeyOp::HDel(f) => {
                let f: Vec<&[u8]> = f.iter().map(|x| &x[..]).collect();
                fmt(t.hdel(k, &f))
            }
            KeyOp::HIncrBy(f, d) => fmt(t.hincr_by(k, f, *d)),
            KeyOp::ExpireAt(at, cond) => fmt(t.expire_at(k, *at, *cond)),
            KeyOp::Persist => fmt(t.persist(k)),
            KeyOp::GetDel => fmt(t.get_del(k)),
            KeyOp::Get => fmt(t.get(k)),
        }
    }

    /// An operation's replies, or the store's error.
    type Replies = Result<Vec<String>, EngineError>;

    /// An operation's replies from a method that replies with an error
    /// when it fails (the reply) or when the store does (Err).
    fn one<T: Debug>(r: Result<T, EngineError>) -> Replies {
        match r {
            Err(e) if !logical(&e) => Err(e),
            r => Ok(vec![fmt(r)]),
        }
    }

    /// Runs `op` on the engine: its replies, or the store's error.
    fn exec(e: &Engine, op: &Op) -> Replies {
        match op {
            Op::One(k, op) => match op {
                KeyOp::Set(v, o) if !o.get => {
                    one(e.set(k, v, *o).map(|set| SetOutcome { set, old: None }))
                }
                KeyOp::Remove => one(e.del(&[k]).map(|n| n == 1)),
                KeyOp::IncrBy(d) => one(e.incr_by(k, *d)),
                KeyOp::HSet(f) => {
                    let f: Vec<(&[u8], &[u8])> = f.iter().map(|(a, b)| (&a[..], &b[..])).collect();
                    one(e.hset(k, &f))
                }
                KeyOp::HDel(f) => {
                    let f: Vec<&[u8]> = f.iter().map(|x| &x[..]).collect();
                    one(e.hdel(k, &f))
                }
                KeyOp::Get => one(e.get(k)),
                op => e.transact(&[k], |t| vec![run_in_txn(t, k, op)]),
            },
            Op::Del(keys) => {
                let keys: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
                one(e.del(&keys))
            }
            Op::MSet(pairs) => {
                let pairs: Vec<(&[u8], &[u8])> =
                    pairs.iter().map(|(k, v)| (&k[..], &v[..])).collect();
                one(e.mset(&pairs))
            }
            Op::Txn(keys, ops) => {
                let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
                e.transact(&refs, |t| {
                    ops.iter()
                        .map(|(i, op)| run_in_txn(t, &keys[*i], op))
                        .collect()
                })
            }
            Op::FlushAll => one(e.flushall()),
        }
    }

    fn value(rng: &mut SmallRng) -> Vec<u8> {
        if rng.gen_ratio(1, 6) {
            let n: i64 = match rng.gen_range(0..20) {
                0 => i64::MAX - rng.gen_range(0..50),
                1 => i64::MIN + rng.gen_range(0..50),
                _ => rng.gen_range(-1000..1000),
            };
            return n.to_string().into_bytes();
        }
        let len = match rng.gen_range(0..100) {
            0..=11 => rng.gen_range(8_000..40_000),
            12..=21 => rng.gen_range(1_000..4_000),
            _ => rng.gen_range(0..300),
        };
        let mut v = vec![0u8; len];
        rng.fill(&mut v[..]);
        v
    }

    fn small_value(rng: &mut SmallRng) -> Vec<u8> {
        if rng.gen_ratio(1, 3) {
            return rng.gen_range(-50i64..50).to_string().into_bytes();
        }
        let mut v = vec![0u8; rng.gen_range(0..40)];
        rng.fill(&mut v[..]);
        v
    }

    fn expiry(rng: &mut SmallRng) -> Option<u64> {
        match rng.gen_range(0..20) {
            0..=2 => Some(FAR),
            3 => Some(FARTHER),
            4..=5 => Some(PAST),
            _ => None,
        }
    }

    fn expire_if(rng: &mut SmallRng) -> ExpireIf {
        [
            ExpireIf::Always,
            ExpireIf::Nx,
            ExpireIf::Xx,
            ExpireIf::Gt,
            ExpireIf::Lt,
        ][rng.gen_range(0..5)]
    }

    /// What one writer knows of its keys.
    struct Writer {
        id: usize,
        keys: Vec<Vec<u8>>,
        xkeys: Vec<Vec<u8>>,
        /// The state every acknowledged operation left.
        acked: State,
        /// Operations after those whose outcome is unknown, in order.
        pending: Vec<Op>,
        /// The operations under way (unlocked), in order.
        in_flight: Vec<Op>,
        /// This round's operations (the keys they write) and how they
        /// ended, for a failure's report.
        history: Vec<(Option<Vec<Vec<u8>>>, String)>,
        stats: Stats,
    }

    #[derive(Clone, Copy, Debug, Default)]
    struct Stats {
        acked: u64,
        refused_after_cut: u64,
        no_space: u64,
        pending: u64,
    }

    impl Writer {
        fn new(id: usize) -> Writer {
            Writer {
                id,
                keys: (0..KEYS)
                    .map(|i| format!("w{id}k{i}").into_bytes())
                    .collect(),
                xkeys: (0..XKEYS)
                    .map(|i| format!("w{id}x{i}").into_bytes())
                    .collect(),
                acked: State::new(),
                pending: Vec::new(),
                in_flight: Vec::new(),
                history: Vec::new(),
                stats: Stats::default(),
            }
        }

        fn key(&self, rng: &mut SmallRng) -> Vec<u8> {
            self.keys[rng.gen_range(0..KEYS)].clone()
        }

        fn xkey(&self, rng: &mut SmallRng) -> Vec<u8> {
            self.xkeys[rng.gen_range(0..XKEYS)].clone()
        }

        /// A few distinct keys, some of them short-lived.
        fn some_keys(&self, rng: &mut SmallRng, n: std::ops::Range<usize>) -> Vec<Vec<u8>> {
            let n = rng.gen_range(n);
            let mut out: Vec<Vec<u8>> = Vec::new();
            while out.len() < n {
                let k = if rng.gen_ratio(1, 5) {
                    self.xkey(rng)
                } else {
                    self.key(rng)
                };
                if !out.contains(&k) {
                    out.push(k);
                }
            }
            out
        }

        /// A blind write of a short-lived key (its outcome does not depend
        /// on whether it has expired).
        fn x_op(&self, rng: &mut SmallRng) -> KeyOp {
            if rng.gen_ratio(1, 4) {
                return KeyOp::Remove;
            }
            let at = match rng.gen_range(0..10) {
                0..=4 => Some(now_ms() + rng.gen_range(5..1500)),
                5 => Some(PAST),
                6 => Some(FAR),
                _ => None,
            };
            KeyOp::Set(
                value(rng),
                SetOptions {
                    expire_at_ms: at,
                    ..SetOptions::default()
                },
            )
        }

        fn key_op(&self, rng: &mut SmallRng, key: &[u8], in_txn: bool) -> KeyOp {
            if is_x(key) {
                return self.x_op(rng);
            }
            let len = match self.acked.get(key) {
                Some((Value::Str(s), _)) => s.len(),
                _ => 0,
            };
            match rng.gen_range(0..100) {
                0..=24 => {
                    let get = in_txn && rng.gen_ratio(1, 8);
                    let (nx, xx) = match rng.gen_range(0..10) {
                        0 => (true, false),
                        1 => (false, true),
                        _ => (false, false),
                    };
                    KeyOp::Set(
                        if in_txn { small_value(rng) } else { value(rng) },
                        SetOptions {
                            nx,
                            xx,
                            expire_at_ms: expiry(rng),
                            keep_ttl: rng.gen_ratio(1, 6),
                            get,
                        },
                    )
                }
                25..=33 => KeyOp::Remove,
                34..=47 if len > 48_000 => KeyOp::Set(small_value(rng), SetOptions::default()),
                34..=47 => {
                    let n = if !in_txn && len < 16_000 && rng.gen_ratio(1, 5) {
                        rng.gen_range(2_000..8_000)
                    } else {
                        rng.gen_range(1..200)
                    };
                    let mut tail = vec![0u8; n];
                    rng.fill(&mut tail[..]);
                    KeyOp::Append(tail)
                }
                48..=56 => KeyOp::IncrBy(if rng.gen_ratio(1, 30) {
                    i64::MAX / 2
                } else {
                    rng.gen_range(-100..100)
                }),
                57..=65 => KeyOp::HSet(
                    (0..rng.gen_range(1..4))
                        .map(|_| (FIELDS[rng.gen_range(0..6)].to_vec(), small_value(rng)))
                        .collect(),
                ),
                66..=70 => KeyOp::HDel(
                    (0..rng.gen_range(1..3))
                        .map(|_| FIELDS[rng.gen_range(0..6)].to_vec())
                        .collect(),
                ),
                71..=75 => {
                    KeyOp::HIncrBy(FIELDS[rng.gen_range(0..6)].to_vec(), rng.gen_range(-9..9))
                }
                76..=85 => KeyOp::ExpireAt(
                    [FAR, FARTHER, PAST, FAR][rng.gen_range(0..4)],
                    expire_if(rng),
                ),
                86..=91 => KeyOp::Persist,
                92..=95 => KeyOp::GetDel,
                _ => KeyOp::Get,
            }
        }

        fn gen(&self, rng: &mut SmallRng) -> Op {
            match rng.gen_range(0..100) {
                0..=4 => Op::Del(self.some_keys(rng, 1..4)),
                5..=9 => {
                    let keys = self.some_keys(rng, 1..4);
                    Op::MSet(keys.into_iter().map(|k| (k, value(rng))).collect())
                }
                // Many small records in one append (they often straddle
                // the end of the value log's lap).
                10..=13 => {
                    let keys = self.some_keys(rng, 4..17);
                    Op::MSet(keys.into_iter().map(|k| (k, small_value(rng))).collect())
                }
                14..=21 => {
                    let keys = self.some_keys(rng, 2..5);
                    let ops = (0..rng.gen_range(1..7))
                        .map(|_| {
                            let i = rng.gen_range(0..keys.len());
                            (i, self.key_op(rng, &keys[i], true))
                        })
                        .collect();
                    Op::Txn(keys, ops)
                }
                22..=33 => {
                    let k = self.xkey(rng);
                    let op = self.x_op(rng);
                    Op::One(k, op)
                }
                _ => {
                    let k = self.key(rng);
                    let op = self.key_op(rng, &k, false);
                    Op::One(k, op)
                }
            }
        }

        /// Records how `op` ended; `cut`: the power cut had begun when it
        /// returned. Panics on a reply the model does not give, or a
        /// failure before the cut.
        fn record(&mut self, op: Op, got: Replies, cut: bool, ctx: &str) {
            let how = match &got {
                Ok(r) => format!("{r:?}"),
                Err(e) => format!("error: {e}"),
            };
            let line = format!(
                "{}{} -> {}",
                if cut { "(cut) " } else { "" },
                describe(&op),
                how.chars().take(200).collect::<String>()
            );
            self.history.push((keys_of(&op), line));
            match got {
                Err(EngineError::NoSpace) => self.stats.no_space += 1, // nothing logged
                Err(e) if io(&e) => {
                    assert!(cut, "{ctx}: an operation before the power cut failed: {e}");
                    self.pending.push(op);
                    self.stats.pending += 1;
                }
                Err(e) => panic!("{ctx}: unexpected error {e} from {}", describe(&op)),
                Ok(_) if !self.pending.is_empty() => {
                    self.pending.push(op);
                    self.stats.pending += 1;
                }
                Ok(replies) => {
                    // Once the cut began, a reply the model does not give
                    // (a read that failed inside a transaction) leaves the
                    // outcome unknown: the model's state is kept to go on.
                    let mut next = if cut { Some(self.acked.clone()) } else { None };
                    let want = apply(next.as_mut().unwrap_or(&mut self.acked), &op, now_ms());
                    let same = want.len() == replies.len()
                        && want
                            .iter()
                            .zip(&replies)
                            .all(|(w, r)| w.as_ref().is_none_or(|w| w == r));
                    if !same && !cut {
                        panic!(
                            "{ctx}: {} replied {replies:?}, the model says {want:?}",
                            describe(&op)
                        );
                    }
                    match next {
                        Some(_) if !same => {
                            self.pending.push(op);
                            self.stats.pending += 1;
                        }
                        Some(next) => {
                            self.acked = next;
                            self.stats.acked += 1;
                        }
                        None => self.stats.acked += 1,
                    }
                }
            }
        }

        /// After a restart: the keys must be the model's state after some
        /// prefix of the operations of unknown outcome; that state becomes
        /// the acknowledged one.
        fn check(&mut self, e: &Engine, ctx: &str) -> u64 {
            let mut got = Vec::new();
            for k in self.keys.iter().chain(&self.xkeys) {
                let t0 = now_ms();
                let v = e
                    .transact(&[k], |t| t.entry(k).map(|o| o.cloned()))
                    .and_then(|r| r)
                    .unwrap_or_else(|err| panic!("{ctx}: reading {k:?}: {err}"));
                got.push((k.clone(), v, t0, now_ms()));
            }
            let matches =
                |s: &State, k: &[u8], v: &Option<(Value, u64)>, t0: u64, t1: u64| match s.get(k) {
                    None => v.is_none(),
                    Some((_, exp)) if *exp != 0 && *exp <= t0 => v.is_none(),
                    Some(want) if want.1 == 0 || want.1 > t1 => v.as_ref() == Some(want),
                    Some(want) => v.is_none() || v.as_ref() == Some(want),
                };
            let all = |s: &State| got.iter().all(|(k, v, t0, t1)| matches(s, k, v, *t0, *t1));
            let mut cand = self.acked.clone();
            let mut applied = 0;
            let mut ok = all(&cand);
            while !ok && applied < self.pending.len() {
                apply(&mut cand, &self.pending[applied], now_ms());
                applied += 1;
                ok = all(&cand);
            }
            if !ok {
                let mut report = String::new();
                let show = |v: Option<&(Value, u64)>| match v {
                    None => "absent".to_owned(),
                    Some((Value::Str(s), exp)) => format!("string {} expiry {exp}", short(s)),
                    Some((Value::Hash(h), exp)) => {
                        format!("hash of {} fields expiry {exp}", h.len())
                    }
                };
                for (k, v, t0, t1) in &got {
                    if matches(&self.acked, k, v, *t0, *t1) {
                        continue;
                    }
                    report += &format!(
                        "\n  key {}: got {}, acknowledged {}, after every unknown op {}",
                        String::from_utf8_lossy(k),
                        show(v.as_ref()),
                        show(self.acked.get(k)),
                        show(cand.get(k))
                    );
                    report += "\n    ops of the round on it:";
                    let touched = self
                        .history
                        .iter()
                        .filter(|(keys, _)| keys.as_ref().is_none_or(|ks| ks.contains(k)));
                    for (_, line) in touched {
                        report += &format!("\n      {line}");
                    }
                }
                panic!(
                    "{ctx}: writer {}: the store after the restart is no prefix of the unknown \
                     operations ({} of them, {} ops acknowledged this round):{report}",
                    self.id,
                    self.pending.len(),
                    self.stats.acked
                );
            }
            self.acked = got
                .into_iter()
                .filter_map(|(k, v, _, _)| v.map(|v| (k, v)))
                .collect();
            self.pending.clear();
            self.history.clear();
            self.stats = Stats::default();
            applied as u64
        }
    }

    /// A barrier that a writer's panic breaks, so the others stop rather
    /// than wait for it for good.
    struct Gate {
        /// Writers waiting, the generation, broken.
        state: Mutex<(usize, u64, bool)>,
        cv: Condvar,
        n: usize,
    }

    impl Gate {
        fn new(n: usize) -> Gate {
            Gate {
                state: Mutex::new((0, 0, false)),
                cv: Condvar::new(),
                n,
            }
        }

        /// Waits for every writer; false if one panicked.
        fn wait(&self) -> bool {
            let mut st = self.state.lock().unwrap();
            let generation = st.1;
            st.0 += 1;
            if st.0 == self.n {
                st.0 = 0;
                st.1 += 1;
                self.cv.notify_all();
            }
            while st.1 == generation && !st.2 {
                st = self.cv.wait(st).unwrap();
            }
            !st.2
        }

        fn break_(&self) {
            self.state.lock().unwrap().2 = true;
            self.cv.notify_all();
        }
    }

    /// Breaks the gate if its writer panics.
    struct BreakOnPanic<'a>(&'a Gate);

    impl Drop for BreakOnPanic<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                self.0.break_();
            }
        }
    }

    /// What the threads of one round share.
    struct Shared {
        dev: Arc<FaultyDevice>,
        ops: AtomicUsize,
        cut_at: usize,
        cut_started: AtomicBool,
        cut_done: AtomicBool,
        gate: Gate,
        /// FLUSHALL's result (writer 0 runs it between phases), and
        /// whether it was issued after the cut.
        flushed: Mutex<Option<(bool, Replies)>>,
        /// Writer 0 runs a FLUSHALL issued before the cut.
        flush_in_flight: AtomicBool,
    }

    impl Shared {
        fn cut(&self) {
            self.cut_started.store(true, SeqCst);
            self.dev.power_cut().unwrap();
            self.cut_done.store(true, SeqCst);
        }
    }

    /// One writer's part of a round: `phases` of (operations, FLUSHALL
    /// after them). The model is locked only between operations, so the
    /// round's end can take it from a writer stuck in one.
    fn write(
        e: &Engine,
        w: &Mutex<Writer>,
        sh: &Shared,
        phases: &[(usize, bool)],
        rng: &mut SmallRng,
        ctx: &str,
    ) {
        let _gate = BreakOnPanic(&sh.gate);
        let id = w.lock().unwrap().id;
        for &(n, flush) in phases {
            for _ in 0..n {
                if sh.ops.fetch_add(1, SeqCst) == sh.cut_at {
                    sh.cut();
                }
                if sh.cut_done.load(SeqCst) {
                    let (k, v) = {
                        let w = w.lock().unwrap();
                        if w.stats.refused_after_cut >= 3 {
                            continue;
                        }
                        (w.key(rng), small_value(rng))
                    };
                    // A write issued after the cut is never acknowledged.
                    let r = e.set(&k, &v, SetOptions::default());
                    assert!(
                        r.is_err(),
                        "{ctx}: a SET issued after the power cut was acknowledged"
                    );
                    w.lock().unwrap().stats.refused_after_cut += 1;
                    continue;
                }
                // Generated, then marked in flight, then run unlocked.
                let next = |rng: &mut SmallRng| {
                    let mut w = w.lock().unwrap();
                    let op = w.gen(rng);
                    w.in_flight.push(op.clone());
                    op
                };
                if rng.gen_ratio(1, 12) {
                    // A round of deferred commits: acknowledged when its
                    // commit returns.
                    let round = e.defer_commits();
                    let ops: Vec<(Op, _)> = (0..rng.gen_range(2..6))
                        .map(|_| {
                            let op = next(rng);
                            let r = exec(e, &op);
                            (op, r)
                        })
                        .collect();
                    let committed = round.commit();
                    drop(round);
                    let cut = sh.cut_started.load(SeqCst);
                    let mut w = w.lock().unwrap();
                    w.in_flight.clear();
                    match committed {
                        Ok(()) => {
                            for (op, r) in ops {
                                w.record(op, r, cut, ctx);
                            }
                        }
                        Err(err) => {
                            assert!(cut, "{ctx}: a round's commit before the cut failed: {err}");
                            for (op, r) in ops {
                                let how = match &r {
                                    Ok(r) => format!("{r:?}"),
                                    Err(e) => format!("error: {e}"),
                                };
                                let line = format!(
                                    "(cut, round not committed) {} -> {how}",
                                    describe(&op)
                                );
                                w.history.push((keys_of(&op), line));
                                if !matches!(r, Err(EngineError::NoSpace)) {
                                    w.pending.push(op);
                                    w.stats.pending += 1;
                                }
                            }
                        }
                    }
                } else {
                    let op = next(rng);
                    let r = exec(e, &op);
                    let cut = sh.cut_started.load(SeqCst);
                    let mut w = w.lock().unwrap();
                    w.in_flight.clear();
                    w.record(op, r, cut, ctx);
                }
            }
            if !sh.gate.wait() {
                return;
            }
            if flush && id == 0 {
                let after = sh.cut_done.load(SeqCst);
                sh.flush_in_flight.store(!after, SeqCst);
                let r = one(e.flushall());
                assert!(
                    !(after && r.is_ok()),
                    "{ctx}: a FLUSHALL issued after the power cut was acknowledged"
                );
                *sh.flushed.lock().unwrap() = Some((after, r));
                sh.flush_in_flight.store(false, SeqCst);
            }
            if !sh.gate.wait() {
                return;
            }
            if flush {
                let (after, r) = match sh.flushed.lock().unwrap().as_ref() {
                    Some((after, Ok(r))) => (*after, Ok(r.clone())),
                    Some((after, Err(e))) => (*after, Err(EngineError::Failed(e.to_string()))),
                    None => unreachable!("writer 0 ran FLUSHALL"),
                };
                if !after {
                    let cut = sh.cut_started.load(SeqCst);
                    w.lock().unwrap().record(Op::FlushAll, r, cut, ctx);
                }
            }
        }
    }

    /// What a seed's rounds did, summed.
    #[derive(Debug, Default)]
    pub(super) struct Totals {
        acked: u64,
        unknown: u64,
        unknown_applied: u64,
        refused_after_cut: u64,
        stuck_after_cut: u64,
        recovery_cuts: u64,
        cleaned_records: u64,
        checkpoints: u64,
        snapshots: u64,
        rewrites: u64,
    }

    impl Totals {
        pub(super) fn add(&mut self, o: &Totals) {
            self.acked += o.acked;
            self.unknown += o.unknown;
            self.unknown_applied += o.unknown_applied;
            self.refused_after_cut += o.refused_after_cut;
            self.recovery_cuts += o.recovery_cuts;
            self.stuck_after_cut += o.stuck_after_cut;
            self.cleaned_records += o.cleaned_records;
            self.checkpoints += o.checkpoints;
            self.snapshots += o.snapshots;
            self.rewrites += o.rewrites;
        }
    }

    /// The device after a power cut: a new one holding what `mem` held when
    /// the power went. The old one stays off, so no thread of the old
    /// engine (one left waiting for good, see below) can write to it.
    pub(super) fn restarted(
        mem: &MemDevice,
        faults: &FaultConfig,
    ) -> (Arc<MemDevice>, Arc<FaultyDevice>) {
        let size = mem.info().capacity;
        let image = submit_and_wait(mem, Command::read(0, size as usize, Class::NonCritical));
        image.result.unwrap();
        let next = Arc::new(MemDevice::new(size));
        let done = submit_and_wait(&*next, Command::write(0, image.buf, Class::NonCritical));
        done.result.unwrap();
        let dev = Arc::new(FaultyDevice::new(next.clone(), faults.clone()).unwrap());
        (next, dev)
    }

    /// One seed: `rounds` rounds of writes, each ended by a power cut.
    pub(super) fn power_cuts(seed: u64, rounds: usize) -> Totals {
        let ctx = format!("reproduce with SEED={seed}");
        let mut faults = FaultConfig {
            seed,
            torn_writes: seed % 2 == 0,
            ..FaultConfig::default()
        };
        let mut mem = Arc::new(MemDevice::new(4 * MIB));
        let mut dev = Arc::new(FaultyDevice::new(mem.clone(), faults.clone()).unwrap());
        let cfg = EngineConfig {
            log_bytes: MIB,
            dump_pct: 25,
            checkpoint_interval_ms: [5, 20, 0][(seed / 3 % 3) as usize],
            clean_free_pct: [6, 25, 60][(seed / 9 % 3) as usize],
            value_bytes_max: 128 << 10,
            ..EngineConfig::default()
        };
        let log = LogConfig {
            record_bytes_max: 256 << 10,
            batch_bytes_max: 384 << 10,
            pending_bytes_max: 512 << 10,
            ..LogConfig::default()
        };
        let open = |dev: &Arc<FaultyDevice>| Engine::open(&stack_on(dev.clone(), MIB, log), cfg);
        let mut rng = SmallRng::seed_from_u64(seed);
        let threads = 1 + (seed % 3) as usize;
        let mut writers: Vec<Writer> = (0..threads).map(Writer::new).collect();
        let mut totals = Totals::default();
        // A hang (a deadlock) fails the test rather than stall it.
        let (alive, watched) = std::sync::mpsc::channel::<()>();
        let watchdog = {
            let ctx = ctx.clone();
            std::thread::spawn(move || loop {
                match watched.recv_timeout(Duration::from_secs(60)) {
                    Ok(()) => {}
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                        eprintln!("a round has run for a minute: a hang; {ctx}");
                        std::process::abort();
                    }
                }
            })
        };
        for round in 0..=rounds {
            alive.send(()).unwrap();
            let ctx = format!("round {round}: {ctx}");
            if round > 0 && rng.gen_ratio(1, 3) {
                // The power goes again while the store recovers (or soon
                // after): what it recovered must still be there after the
                // next restart, none of it lost or made up.
                let delay = Duration::from_micros(rng.gen_range(0..20_000));
                let cutter = {
                    let dev = dev.clone();
                    std::thread::spawn(move || {
                        std::thread::sleep(delay);
                        dev.power_cut().unwrap();
                    })
                };
                drop(open(&dev));
                cutter.join().unwrap();
                faults.seed = rng.gen();
                (mem, dev) = restarted(&mem, &faults);
                totals.recovery_cuts += 1;
            }
            let e = open(&dev).unwrap_or_else(|err| panic!("{ctx}: reopening failed: {err}"));
            for w in &mut writers {
                totals.unknown_applied += w.check(&e, &ctx);
            }
            let late = format!("after-cut-{}", round.saturating_sub(1));
            assert_eq!(e.get(late.as_bytes()).unwrap(), None, "{ctx}: {late}");
            if round == rounds {
                e.close().unwrap();
                break;
            }
            let e = Arc::new(e);
            let phases: Vec<(usize, bool)> = (0..rng.gen_range(1..5))
                .map(|_| (rng.gen_range(300..1500) / threads, rng.gen_ratio(1, 8)))
                .collect();
            let total: usize = threads * phases.iter().map(|p| p.0).sum::<usize>();
            let sh = Arc::new(Shared {
                dev: dev.clone(),
                ops: AtomicUsize::new(0),
                // Some rounds are cut after the writes, background work going on.
                cut_at: rng.gen_range(0..total + total / 5 + 1),
                cut_started: AtomicBool::new(false),
                cut_done: AtomicBool::new(false),
                gate: Gate::new(threads),
                flushed: Mutex::new(None),
                flush_in_flight: AtomicBool::new(false),
            });
            let stop = Arc::new(AtomicBool::new(false));
            // Background jobs every few ms, or rarely (then the writers
            // run the value log full and wait for the cleaner).
            let gap = [0..6, 20..150][rng.gen_range(0..2)].clone();
            let chaos = {
                let (e, stop) = (e.clone(), stop.clone());
                let mut rng = SmallRng::seed_from_u64(rng.gen());
                std::thread::spawn(move || {
                    while !stop.load(SeqCst) {
                        std::thread::sleep(Duration::from_millis(rng.gen_range(gap.clone())));
                        match rng.gen_range(0..10) {
                            0..=3 => drop(e.save()),
                            4..=6 => drop(e.bgsave()),
                            _ => drop(e.bgrewrite()),
                        }
                    }
                })
            };
            let models: Vec<Arc<Mutex<Writer>>> =
                writers.drain(..).map(|w| Arc::new(Mutex::new(w))).collect();
            let (tasks_tx, tasks) = std::sync::mpsc::channel();
            let handles: Vec<_> = models
                .iter()
                .map(|w| {
                    let (e, sh, phases, ctx) = (e.clone(), sh.clone(), phases.clone(), ctx.clone());
                    let (w, tasks_tx) = (w.clone(), tasks_tx.clone());
                    let mut rng = SmallRng::seed_from_u64(rng.gen());
                    std::thread::spawn(move || {
                        // As a server's request workers.
                        critio::context::set_foreground();
                        tasks_tx.send(critio::context::current()).unwrap();
                        write(&e, &w, &sh, &phases, &mut rng, &ctx);
                    })
                })
                .collect();
            let tasks: Vec<_> = (0..threads).map(|_| tasks.recv().unwrap()).collect();
            // Writers the cut left waiting for good: a writer waiting for
            // room in the WAL or the value log when the power went waits
            // for a checkpoint, and none succeeds on a device without
            // power. (A real power cut ends the process.)
            let unfinished = |handles: &[std::thread::JoinHandle<()>]| {
                handles.iter().filter(|h| !h.is_finished()).count()
            };
            let start = std::time::Instant::now();
            while unfinished(&handles) > 0
                && (!sh.cut_done.load(SeqCst) || start.elapsed() < Duration::from_secs(3))
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            let mut stuck = unfinished(&handles) > 0;
            if stuck {
                // The others are released (they wait at the gate).
                sh.gate.break_();
                std::thread::sleep(Duration::from_millis(200));
                let waiting: Vec<_> = tasks.iter().filter_map(|t| t.blocking_status()).collect();
                assert!(
                    waiting.len() == unfinished(&handles)
                        && waiting.iter().all(|w| matches!(w,
                            critio::context::BlockingStatus::Condvar { name }
                                if [critio::log::SPACE_POINT, "kv: space"].contains(name))),
                    "{ctx}: writers still at work 3 s after the cut: {waiting:?}"
                );
            }
            let mut panicked = None;
            for h in handles {
                if h.is_finished() {
                    if let Err(panic) = h.join() {
                        panicked = panicked.or(Some(panic));
                    }
                }
            }
            if let Some(panic) = panicked {
                stop.store(true, SeqCst);
                std::panic::resume_unwind(panic)
            }
            for w in &models {
                let mut w = w.lock().unwrap();
                // Operations left waiting may yet have been logged: their
                // outcome is unknown (a FLUSHALL's for every writer).
                let in_flight = std::mem::take(&mut w.in_flight);
                w.stats.pending += in_flight.len() as u64;
                w.pending.extend(in_flight);
                if sh.flush_in_flight.load(SeqCst) {
                    w.pending.push(Op::FlushAll);
                }
                let id = w.id;
                writers.push(std::mem::replace(&mut *w, Writer::new(id)));
            }
            if !sh.cut_done.load(SeqCst) {
                std::thread::sleep(Duration::from_millis(rng.gen_range(0..20)));
                sh.cut();
            }
            if !stuck {
                // A SET after the cut is refused, or waits for room that no
                // checkpoint makes (see above) until a checkpoint fails the
                // engine, which these rounds may not take within the wait.
                let (done_tx, done) = std::sync::mpsc::channel();
                let (task_tx, task) = std::sync::mpsc::channel();
                let setter = {
                    let e = e.clone();
                    let late = format!("after-cut-{round}");
                    std::thread::spawn(move || {
                        task_tx.send(critio::context::current()).unwrap();
                        let r = e.set(late.as_bytes(), b"x", SetOptions::default());
                        let _ = done_tx.send(r.is_err());
                    })
                };
                let task = task.recv().unwrap();
                match done.recv_timeout(Duration::from_secs(3)) {
                    Ok(refused) => {
                        assert!(refused, "{ctx}: a SET after the power cut was acknowledged");
                        setter.join().unwrap();
                    }
                    Err(_) => {
                        let status = task.blocking_status();
                        assert!(
                            matches!(&status, Some(critio::context::BlockingStatus::Condvar { name })
                                if [critio::log::SPACE_POINT, "kv: space"].contains(name)),
                            "{ctx}: a SET after the cut neither refused nor waiting for room: {status:?}"
                        );
                        stuck = true;
                    }
                }
            }
            stop.store(true, SeqCst);
            chaos.join().unwrap();
            let s = e.background_stats();
            totals.cleaned_records += s.cleaned_records;
            totals.checkpoints += s.checkpoints;
            totals.snapshots += s.snapshots;
            totals.rewrites += s.rewrites;
            totals.stuck_after_cut += u64::from(stuck);
            for w in &writers {
                totals.acked += w.stats.acked;
                totals.unknown += w.stats.pending;
                totals.refused_after_cut += w.stats.refused_after_cut;
            }
            if std::env::var_os("VERBOSE").is_some() {
                let st: Vec<Stats> = writers.iter().map(|w| w.stats).collect();
                eprintln!(
                    "seed {seed} round {round}: {total} ops, cut at {}{}; {st:?}; cleaned {} \
                     checkpoints {} snapshots {} rewrites {} space {:?}",
                    sh.cut_at,
                    if stuck { " (writers left waiting)" } else { "" },
                    s.cleaned_records,
                    s.checkpoints,
                    s.snapshots,
                    s.rewrites,
                    e.space()
                );
            }
            if !stuck {
                // Waits for the BGSAVE and BGREWRITEAOF threads.
                let _ = e.close();
                drop(sh);
                let e = Arc::into_inner(e).expect("the old engine is still shared");
                drop(e);
            }
            faults.seed = rng.gen();
            (mem, dev) = restarted(&mem, &faults);
        }
        drop(alive);
        watchdog.join().unwrap();
        totals
    }
}

/// See [`mixed_ops`]. `SEED=n` runs one seed, `SEEDS=a..b` a range.
#[test]
fn every_operation_survives_power_cuts_racing_background_work() {
    let seeds: Vec<u64> = match (std::env::var("SEED"), std::env::var("SEEDS")) {
        (Ok(s), _) => vec![s.parse().expect("SEED is a number")],
        (_, Ok(r)) => {
            let (a, b) = r.split_once("..").expect("SEEDS is a..b");
            (a.parse().unwrap()..b.parse().unwrap()).collect()
        }
        _ => (1..=20).collect(),
    };
    let mut totals = mixed_ops::Totals::default();
    for seed in seeds {
        totals.add(&mixed_ops::power_cuts(seed, 4));
    }
    eprintln!("{totals:?}");
}

/// A device whose writes land (and complete) late while `slow` is set, the
/// n-th such write `n * delay` late, each on a thread of its own: a device
/// may take any time over a write, and overlapping writes in flight at
/// once have no defined order.
struct LateWrites {
    inner: Arc<MemDevice>,
    slow: std::sync::atomic::AtomicBool,
    late: std::sync::atomic::AtomicU32,
    delay: std::time::Duration,
}

impl Device for LateWrites {
    fn info(&self) -> &critio::device::DeviceInfo {
        self.inner.info()
    }

    fn submit(&self, cmd: critio::device::Command, done: critio::device::Completer) {
        let slow = self.slow.load(std::sync::atomic::Ordering::SeqCst);
        if !(slow && cmd.op == critio::device::Op::Write) {
            return self.inner.submit(cmd, done);
        }
        let n = 1 + self.late.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let (delay, inner) = (self.delay * n, self.inner.clone());
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            inner.submit(cmd, done);
        });
    }
}

/// A BGSAVE that fails (its dump does not fit the dump file) leaves none
/// of its dump writes in flight: a later BGSAVE writes the same places,
/// and a write of the failed dump landing after it would corrupt it.
#[test]
fn a_failed_bgsave_leaves_no_write_in_flight_to_overwrite_the_next_dump() {
    use std::sync::atomic::Ordering::SeqCst;
    let dev = Arc::new(LateWrites {
        inner: Arc::new(MemDevice::new(64 * MIB)),
        slow: false.into(),
        late: 0.into(),
        delay: std::time::Duration::from_millis(700),
    });
    // Non-critical requests at the device uncapped (the `none` and
    // kernel-idle schemes; `critio serve` on a file lets the adaptive cap
    // go past one): several of a dump's writes are there at once.
    let mut config = Config::default();
    config.cache.capacity_bytes = 16 * MIB;
    config.log = log_config();
    config.context.background_nice = 0;
    config.block.noncritical_cap = critio::block::NoncriticalCap::Fixed(0);
    let stack = critio::Stack::over(dev.clone(), &config).unwrap();
    // A dump file of 6 MiB.
    let cfg = EngineConfig {
        dump_pct: 10,
        ..small_config()
    };
    let e = Engine::open(&stack, cfg).unwrap();
    let mut rng = SmallRng::seed_from_u64(5);
    let keys = 3500;
    for i in 0..keys {
        let v: Vec<u8> = (0..2000).map(|_| rng.gen()).collect();
        set(&e, &format!("k{i}"), &v);
    }
    let wait = |e: &Engine| {
        while e.background_running() != (false, false) {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    };
    e.save().unwrap();
    // About 7 MiB of random bytes: the dump does not fit.
    dev.slow.store(true, SeqCst);
    e.bgsave().unwrap();
    wait(&e);
    dev.slow.store(false, SeqCst);
    let s = e.background_stats();
    assert!(
        s.snapshots == 0
            && s.last_error
                .as_deref()
                .is_some_and(|m| m.contains("too small")),
        "{s:?}"
    );
    // About 3 MiB: it fits, over the places the failed dump wrote last.
    for i in 1500..keys {
        assert_eq!(e.del(&[format!("k{i}").as_bytes()]).unwrap(), 1);
    }
    e.bgsave().unwrap();
    wait(&e);
    let s = e.background_stats();
    assert_eq!(s.snapshots, 1, "{s:?}");
    // Long enough for any write of the failed dump to land.
    std::thread::sleep(dev.delay * 6);
    let dump = e.read_dump().unwrap();
    assert_eq!(dump.len(), 1500);
    e.close().unwrap();
}
