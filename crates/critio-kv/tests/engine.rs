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
use critio_kv::engine::{Engine, EngineConfig, EngineError, SetOptions};
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
            for _ in 0..rng.gen_range(1..12) {
                let key = format!("k{}", rng.gen_range(0..50)).into_bytes();
                let value: Vec<u8> = (0..rng.gen_range(1..900)).map(|_| rng.gen()).collect();
                if e.set(&key, &value, SetOptions::default()).is_ok() {
                    written.push((key, value));
                }
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
