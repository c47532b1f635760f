//! The write cache (`critio::nvwc`): the device conformance suite for every
//! policy, what each policy admits, stalls, recovery, the reissue path
//! under the block layer, and power cuts of both devices at seeded random
//! points.
//!
//! "Acknowledged" here is the device contract: a write is acknowledged
//! once its completion returned `Ok` *and* a flush submitted after that
//! completion returned `Ok` (the write cache, like a drive with a volatile
//! cache, makes completed writes durable at the next flush; bypassed writes
//! happen to be durable at completion already, which the checks do not rely
//! on). After a cut and recovery every block must hold a version at least
//! as new as its newest acknowledged one, and whatever it holds must be
//! versions actually written to that block (sector by sector: a write in
//! flight at the cut may be torn at the backing device, as on any drive;
//! a block with no write in flight must hold one whole version).
//!
//! Seeded tests run `NVWC_SEEDS` seeds (defaults below), or just `SEED=n`;
//! `NVWC_DEBUG=1` prints each power-cut run's stats and cut reports.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use common::conformance::run_suite;
use common::gate::GateDevice;
use common::{seed_or, wait_until};
use critio::block::{BlockConfig, BlockLayer};
use critio::context::{self, Class};
use critio::device::faulty::{FaultConfig, FaultyDevice};
use critio::device::mem::MemDevice;
use critio::device::sim::{SimConfig, SimDevice};
use critio::device::{submit_and_wait, AlignedBuf, Command, Completion, Device, IoHint, Op};
use critio::nvwc::{
    FullPolicy, NvwcConfig, Policy, Reissue, WriteCache, HEADER_BYTES, STALL_POINT,
};
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const BS: usize = 4096;
const SECTOR: usize = 512;

fn cfg(policy: Policy, slots: u64) -> NvwcConfig {
    NvwcConfig {
        policy,
        cache_bytes: slots * BS as u64,
        ..NvwcConfig::default()
    }
}

fn mem_pair(cfg: &NvwcConfig, backing_bytes: u64) -> (Arc<MemDevice>, Arc<MemDevice>) {
    (
        Arc::new(MemDevice::new(cfg.cache_device_bytes())),
        Arc::new(MemDevice::new(backing_bytes)),
    )
}

fn manual(cache: Arc<dyn Device>, backing: Arc<dyn Device>, cfg: NvwcConfig) -> WriteCache {
    WriteCache::without_writeback_thread(cache, backing, cfg).unwrap()
}

/// A write of `buf` at `offset` with the hints a block layer would give.
fn write_cmd(
    offset: u64,
    buf: AlignedBuf,
    class: Class,
    sync: bool,
    fg: bool,
    tag: u64,
) -> Command {
    let mut cmd = Command::write(offset, buf, class);
    cmd.hint = IoHint {
        sync,
        foreground: fg,
        tag,
    };
    cmd
}

fn page(byte: u8) -> AlignedBuf {
    AlignedBuf::from_slice(&[byte; BS])
}

fn read(dev: &dyn Device, offset: u64, len: usize) -> Vec<u8> {
    let c = submit_and_wait(dev, Command::read(offset, len, Class::Critical));
    c.result.unwrap_or_else(|e| panic!("read at {offset}: {e}"));
    c.buf.as_slice().to_vec()
}

/// The byte every byte at `offset..offset + len` equals, if they all do
/// (keeps failure messages short).
fn fill_of(dev: &dyn Device, offset: u64, len: usize) -> Option<u8> {
    let data = read(dev, offset, len);
    data.iter().all(|&b| b == data[0]).then_some(data[0])
}

fn ok(dev: &dyn Device, cmd: Command) {
    let what = format!("{:?} at {}", cmd.op, cmd.offset);
    submit_and_wait(dev, cmd)
        .result
        .unwrap_or_else(|e| panic!("{what}: {e}"));
}

/// Submits `cmd`; returns how many times its completer ran and its result.
type Outcome = Arc<Mutex<Vec<Result<(), String>>>>;

fn submit_tracked(dev: &dyn Device, cmd: Command) -> Outcome {
    let out: Outcome = Arc::default();
    let o = out.clone();
    dev.submit(
        cmd,
        Box::new(move |c: Completion| o.lock().push(c.result.map_err(|e| e.to_string()))),
    );
    out
}

// ---------------------------------------------------------------- conformance

#[test]
fn conformance_for_every_policy_over_memory() {
    for policy in Policy::ALL {
        for full in [FullPolicy::Stall, FullPolicy::Bypass] {
            // 64 slots: the suite's concurrent writes overflow it, so writes
            // stall (or bypass) and the writeback thread frees slots.
            let cfg = NvwcConfig {
                full,
                ..cfg(policy, 64)
            };
            let (cache, backing) = mem_pair(&cfg, 2 << 20);
            let wc = Arc::new(WriteCache::new(cache, backing, cfg).unwrap());
            run_suite(wc.clone());
            let s = wc.stats();
            assert!(s.writes > 0 && s.reads > 0, "{policy} {full:?}: {s:?}");
            if policy == Policy::All {
                assert_eq!(s.bypassed_writes, s.full_bypasses, "{full:?}: {s:?}");
            }
        }
    }
}

// ---------------------------------------------------------------- policies

/// (class, sync, foreground) of the writes each policy is shown.
const KINDS: [(Class, bool, bool); 4] = [
    (Class::Critical, true, true),      // a foreground task's sync write
    (Class::Critical, true, false),     // a task inheriting criticality
    (Class::NonCritical, true, false),  // a background task's sync write
    (Class::NonCritical, false, false), // writeback
];

#[test]
fn each_policy_admits_what_it_should_and_the_rest_goes_to_the_backing_device() {
    let want: [(Policy, [bool; 4]); 5] = [
        (Policy::All, [true, true, true, true]),
        (Policy::Sync, [true, true, true, false]),
        (Policy::Cp, [true, false, false, false]),
        (Policy::CpPi, [true, true, false, false]),
        (Policy::CpPiIoi, [true, true, false, false]),
    ];
    for (policy, admitted) in want {
        let cfg = cfg(policy, 16);
        let (cache, backing) = mem_pair(&cfg, 1 << 20);
        let wc = manual(cache, backing.clone(), cfg);
        for (i, &(class, sync, fg)) in KINDS.iter().enumerate() {
            let offset = (i * BS) as u64;
            ok(
                &wc,
                write_cmd(offset, page(i as u8 + 1), class, sync, fg, 0),
            );
            let on_backing = fill_of(&*backing, offset, BS) == Some(i as u8 + 1);
            assert_eq!(on_backing, !admitted[i], "{policy}: kind {i}");
            assert_eq!(fill_of(&wc, offset, BS), Some(i as u8 + 1), "{policy}");
        }
        let s = wc.stats();
        let n = admitted.iter().filter(|&&a| a).count() as u64;
        assert_eq!(
            (s.cached_writes, s.bypassed_writes),
            (n, 4 - n),
            "{policy}: {s:?}"
        );
        assert_eq!(s.dirty_blocks, n);
        wc.writeback_all().unwrap();
        for i in 0..4 {
            assert_eq!(fill_of(&*backing, (i * BS) as u64, BS), Some(i as u8 + 1));
        }
        assert_eq!((wc.stats().used_slots, wc.stats().writeback_blocks), (0, n));
    }
}

#[test]
fn a_write_to_a_cached_block_goes_to_the_cache_whatever_the_policy() {
    let cfg = cfg(Policy::Cp, 16);
    let (cache, backing) = mem_pair(&cfg, 1 << 20);
    let wc = manual(cache, backing.clone(), cfg);
    // Blocks 1 and 2 cached by a foreground write; then a background write
    // covers blocks 0..4: 1 and 2 go to the cache, 0 and 3 to the backing.
    let two = AlignedBuf::from_slice(&[1; 2 * BS]);
    ok(
        &wc,
        write_cmd(BS as u64, two, Class::Critical, true, true, 0),
    );
    let four = AlignedBuf::from_slice(&[2; 4 * BS]);
    ok(&wc, write_cmd(0, four, Class::NonCritical, false, false, 0));
    assert_eq!(fill_of(&wc, 0, 4 * BS), Some(2), "read piecewise");
    assert_eq!(fill_of(&*backing, 0, BS), Some(2));
    assert_eq!(
        fill_of(&*backing, BS as u64, 2 * BS),
        Some(0),
        "not behind the cache"
    );
    let s = wc.stats();
    assert_eq!(
        (s.cached_writes, s.hit_writes, s.bypassed_blocks),
        (1, 1, 2)
    );
    assert_eq!((s.read_hit_blocks, s.read_miss_blocks), (2, 2));
}

// ---------------------------------------------------------------- full cache

#[test]
fn a_full_cache_stalls_until_writeback_frees_a_slot() {
    let before = critio::metrics::global()
        .wait_histogram(STALL_POINT, Class::Critical)
        .summary()
        .count;
    let cfg = cfg(Policy::All, 16);
    let (cache, backing) = mem_pair(&cfg, 1 << 20);
    let wc = manual(cache, backing, cfg);
    for i in 0..16u64 {
        ok(
            &wc,
            write_cmd(i * BS as u64, page(i as u8), Class::Critical, true, true, 0),
        );
    }
    let late = submit_tracked(
        &wc,
        write_cmd(16 * BS as u64, page(99), Class::Critical, true, true, 0),
    );
    assert!(late.lock().is_empty(), "stalled: no free slot");
    assert_eq!(wc.stalled(), 1);
    let cp = NvwcConfig::default();
    assert_eq!(
        cp.full,
        FullPolicy::Stall,
        "the default stalls, as paper 002's cache does"
    );
    assert_eq!(wc.writeback_now(4).unwrap(), 4);
    assert_eq!(*late.lock(), vec![Ok(())], "admitted once slots were freed");
    assert_eq!(fill_of(&wc, 16 * BS as u64, BS), Some(99));
    let s = wc.stats();
    assert_eq!(s.stalls, 1);
    assert!(s.stall_ns > 0);
    let after = critio::metrics::global()
        .wait_histogram(STALL_POINT, Class::Critical)
        .summary()
        .count;
    assert!(
        after > before,
        "the stall is a wait point in critio's metrics"
    );
}

#[test]
fn a_full_cache_can_bypass_instead_but_never_for_a_cached_block() {
    let cfg = NvwcConfig {
        full: FullPolicy::Bypass,
        ..cfg(Policy::All, 16)
    };
    let (cache, backing) = mem_pair(&cfg, 1 << 20);
    let wc = manual(cache, backing.clone(), cfg);
    for i in 0..16u64 {
        ok(
            &wc,
            write_cmd(i * BS as u64, page(1), Class::Critical, true, true, 0),
        );
    }
    ok(
        &wc,
        write_cmd(16 * BS as u64, page(2), Class::Critical, true, true, 0),
    );
    assert_eq!(fill_of(&*backing, 16 * BS as u64, BS), Some(2), "bypassed");
    assert_eq!(wc.stats().full_bypasses, 1);
    // Overwriting a cached block needs a slot even so: it waits.
    let hit = submit_tracked(&wc, write_cmd(0, page(3), Class::Critical, true, true, 0));
    assert!(hit.lock().is_empty());
    wc.writeback_now(1).unwrap();
    assert_eq!(*hit.lock(), vec![Ok(())]);
    assert_eq!(fill_of(&wc, 0, BS), Some(3));
}

// ---------------------------------------------------------------- recovery

#[test]
fn reopening_recovers_the_cached_blocks_and_compacts_the_metadata_log() {
    let slots = 32;
    let cfg = NvwcConfig {
        // The smallest log: it fills after a few hundred batches.
        metadata_bytes: HEADER_BYTES + 2 * NvwcConfig::half_bytes_min(slots),
        ..cfg(Policy::All, slots)
    };
    let (cache, backing) = mem_pair(&cfg, 1 << 20);
    let wc = manual(cache.clone(), backing.clone(), cfg);
    assert!(wc.recovery().formatted);
    let mut latest = HashMap::new();
    for i in 0..3000u64 {
        let block = i % 24;
        let byte = (i % 251) as u8;
        ok(
            &wc,
            write_cmd(
                block * BS as u64,
                page(byte),
                Class::Critical,
                true,
                true,
                0,
            ),
        );
        latest.insert(block, byte);
        // A flush per write keeps the overwritten slots from piling up
        // (no writeback thread here to free them).
        ok(&wc, Command::flush(Class::Critical));
        if i % 500 == 499 {
            wc.writeback_now(8).unwrap();
        }
    }
    ok(&wc, Command::flush(Class::Critical));
    let s = wc.stats();
    assert!(s.compactions > 0, "{s:?}");
    let dirty = s.dirty_blocks;
    drop(wc);
    let wc = manual(cache, backing, cfg);
    let r = *wc.recovery();
    assert!(!r.formatted);
    assert_eq!(r.blocks, dirty, "{r:?}");
    for (&block, &byte) in &latest {
        assert_eq!(
            fill_of(&wc, block * BS as u64, BS),
            Some(byte),
            "block {block}"
        );
    }
}

#[test]
fn a_compaction_keeps_the_records_of_writes_still_in_flight() {
    let slots = 16;
    let cfg = NvwcConfig {
        metadata_bytes: HEADER_BYTES + 2 * NvwcConfig::half_bytes_min(slots),
        ..cfg(Policy::All, slots)
    };
    // The cache device holds the first data write to slot 0.
    let slot0 = cfg.data_offset();
    let armed = AtomicBool::new(true);
    let cache = GateDevice::with(
        32,
        cfg.cache_device_bytes(),
        Box::new(move |op, offset| {
            op == Op::Write && offset == slot0 && armed.swap(false, Ordering::SeqCst)
        }),
    );
    let backing = Arc::new(MemDevice::new(1 << 20));
    let wc = manual(cache.clone(), backing.clone(), cfg);
    let held = submit_tracked(&wc, write_cmd(0, page(7), Class::Critical, true, true, 0));
    cache.wait_arrivals(1);
    // Its map record is written; enough other writes follow to compact the
    // log while its data is still in flight.
    let mut i = 0u64;
    while wc.stats().compactions == 0 {
        ok(
            &wc,
            write_cmd(
                BS as u64 * (1 + i % 4),
                page(i as u8),
                Class::Critical,
                true,
                true,
                0,
            ),
        );
        ok(&wc, Command::flush(Class::Critical));
        i += 1;
        assert!(i < 10_000, "no compaction");
    }
    cache.release(slot0);
    assert_eq!(*held.lock(), vec![Ok(())]);
    ok(&wc, Command::flush(Class::Critical));
    drop(wc);
    let wc = manual(cache, backing, cfg);
    assert_eq!(
        fill_of(&wc, 0, BS),
        Some(7),
        "recovered from the compacted log"
    );
}

#[test]
fn a_mismatched_config_or_a_foreign_device_is_refused_with_a_clear_error() {
    let cfg16 = cfg(Policy::All, 16);
    let cache = Arc::new(MemDevice::new(cfg16.cache_device_bytes() + 16 * BS as u64));
    let backing = Arc::new(MemDevice::new(1 << 20));
    drop(manual(cache.clone(), backing.clone(), cfg16));
    let cfg17 = NvwcConfig {
        cache_bytes: 17 * BS as u64,
        metadata_bytes: cfg16.metadata_bytes_effective(),
        ..cfg16
    };
    let e = WriteCache::without_writeback_thread(cache, backing.clone(), cfg17)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("config") && e.contains("zero"), "{e}");
    let foreign = Arc::new(MemDevice::new(cfg16.cache_device_bytes()));
    ok(&*foreign, Command::write(0, page(7), Class::Critical));
    let e = WriteCache::without_writeback_thread(foreign, backing.clone(), cfg16)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("not a write-cache header"), "{e}");
    let small = Arc::new(MemDevice::new(64 * BS as u64));
    let e = WriteCache::without_writeback_thread(small, backing, cfg16)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("larger cache device"), "{e}");
}

// ---------------------------------------------------------------- reissue

const HELD: u64 = 8 * BS as u64;

/// A gate over 1 MiB that holds only the first write at `HELD`.
fn gate_first_write() -> Arc<GateDevice> {
    let armed = AtomicBool::new(true);
    GateDevice::with(
        32,
        1 << 20,
        Box::new(move |op, offset| {
            op == Op::Write && offset == HELD && armed.swap(false, Ordering::SeqCst)
        }),
    )
}

#[test]
fn a_reissued_write_completes_once_and_its_late_original_clobbers_nothing() {
    let gate = gate_first_write();
    let cfg = cfg(Policy::CpPiIoi, 16);
    let cache = Arc::new(MemDevice::new(cfg.cache_device_bytes()));
    let wc = manual(cache, gate.clone(), cfg);
    // A background write reaches the backing device and is held there.
    let v1 = submit_tracked(
        &wc,
        write_cmd(HELD, page(1), Class::NonCritical, false, false, 42),
    );
    gate.wait_arrivals(1);
    assert_eq!(wc.reissue(7), Reissue::NotFound);
    assert_eq!(wc.reissue(42), Reissue::Reissued { blocks: 1 });
    assert_eq!(*v1.lock(), vec![Ok(())], "completed from the cache copy");
    assert!(gate.holds(HELD), "while the original is still in flight");
    assert_eq!(
        wc.reissue(42),
        Reissue::NotFound,
        "done: no longer findable"
    );
    // A newer version through the cache; writeback must not pass the held
    // original (it would land after it and be overwritten).
    ok(
        &wc,
        write_cmd(HELD, page(2), Class::Critical, true, true, 0),
    );
    assert_eq!(
        wc.writeback_now(16).unwrap(),
        0,
        "the block waits for its backing write"
    );
    assert_eq!(gate.arrivals().len(), 1);
    gate.release(HELD);
    assert_eq!(
        v1.lock().len(),
        1,
        "the original's completion was discarded"
    );
    let s = wc.stats();
    assert_eq!(
        (s.reissues, s.duplicates_suppressed, s.reissue_misses),
        (1, 1, 2)
    );
    assert_eq!(fill_of(&wc, HELD, BS), Some(2));
    wc.writeback_all().unwrap();
    assert_eq!(fill_of(&*gate, HELD, BS), Some(2), "written back after it");
}

#[test]
fn reissue_is_only_done_by_cp_pi_ioi() {
    for policy in [Policy::All, Policy::Sync, Policy::Cp, Policy::CpPi] {
        let gate = gate_first_write();
        let cfg = cfg(policy, 16);
        let cache = Arc::new(MemDevice::new(cfg.cache_device_bytes()));
        let wc = manual(cache, gate.clone(), cfg);
        assert_eq!(wc.reissue(1), Reissue::Disabled, "{policy}");
    }
}

struct Stack {
    cache: Arc<FaultyDevice>,
    gate: Arc<GateDevice>,
    wc: Arc<WriteCache>,
    layer: Arc<BlockLayer>,
}

fn stack(policy: Policy) -> Stack {
    let gate = gate_first_write();
    let cfg = cfg(policy, 16);
    let mem = Arc::new(MemDevice::new(cfg.cache_device_bytes()));
    let cache = Arc::new(FaultyDevice::new(mem, FaultConfig::default()).unwrap());
    let wc = Arc::new(WriteCache::new(cache.clone(), gate.clone(), cfg).unwrap());
    let layer = Arc::new(BlockLayer::new(wc.clone(), BlockConfig::default()).unwrap());
    layer.set_at_device_hook(wc.reissue_hook());
    Stack {
        cache,
        gate,
        wc,
        layer,
    }
}

/// A foreground thread that waits for `h`; the flag says it returned.
fn foreground_waiter(h: critio::block::IoHandle) -> (Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let t = std::thread::spawn(move || {
        context::set_foreground();
        h.wait().unwrap();
        d.store(true, Ordering::SeqCst);
    });
    (done, t)
}

#[test]
fn a_foreground_wait_reissues_a_held_writeback_through_the_block_layer() {
    let s = stack(Policy::CpPiIoi);
    let h = s.layer.write_async(HELD, page(1)).unwrap();
    s.gate.wait_arrivals(1);
    let (done, waiter) = foreground_waiter(h.clone());
    wait_until("the waiter is woken by the cache copy", || {
        done.load(Ordering::SeqCst)
    });
    assert!(s.gate.holds(HELD), "the original write is still held");
    waiter.join().unwrap();
    assert_eq!(s.wc.stats().reissues, 1);
    assert_eq!(s.layer.stats().counters.promoted_at_device, 1);
    // A newer version, then the original lands late.
    let fg = {
        let layer = s.layer.clone();
        std::thread::spawn(move || {
            context::set_foreground();
            layer.write(HELD, page(2)).unwrap();
            layer.flush().unwrap();
        })
    };
    fg.join().unwrap();
    s.gate.release(HELD);
    wait_until("the late completion is discarded", || {
        s.wc.stats().duplicates_suppressed == 1
    });
    assert!(h.is_done());
    let got = s.layer.read(HELD, BS).unwrap();
    assert!(
        got.as_slice() == page(2).as_slice(),
        "the newer version wins"
    );
    assert_eq!(
        fill_of(&*s.gate, HELD, BS),
        Some(1),
        "the late original landed"
    );
    // Power cut of the cache device, recovery: the cache copy still wins.
    let Stack {
        cache,
        gate,
        wc,
        layer,
    } = s;
    cache.power_cut().unwrap();
    drop(layer);
    drop(wc);
    cache.restart();
    let wc = WriteCache::new(cache, gate.clone(), cfg(Policy::CpPiIoi, 16)).unwrap();
    assert_eq!(wc.recovery().blocks, 1);
    assert_eq!(fill_of(&wc, HELD, BS), Some(2));
    wc.writeback_all().unwrap();
    assert_eq!(fill_of(&*gate, HELD, BS), Some(2));
}

#[test]
fn without_ioi_the_foreground_waiter_waits_for_the_backing_device() {
    let s = stack(Policy::CpPi);
    let h = s.layer.write_async(HELD, page(1)).unwrap();
    s.gate.wait_arrivals(1);
    let (done, waiter) = foreground_waiter(h);
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !done.load(Ordering::SeqCst),
        "nothing to do at the device without IOI"
    );
    s.gate.release(HELD);
    waiter.join().unwrap();
    let st = s.wc.stats();
    assert_eq!((st.reissues, st.reissue_misses), (0, 0));
    assert_eq!(s.layer.stats().counters.promoted_at_device, 1);
}

/// Background writes through the block layer to simulated drives while a
/// foreground thread waits on random ones (promoting them in the queue or
/// reissuing them at the device): every write completes exactly once (the
/// block layer panics on a second completion), each reissue's second
/// completion is discarded, and the newest version of every block wins, in
/// the cache and after writeback.
#[test]
fn reissues_race_with_backing_completions_on_simulated_drives() {
    for_seeds("the reissue race test", seeds(4), reissue_race_run);
}

/// A block layer over a write cache (CP+PI+IOI) of a simulated SSD in
/// front of a simulated HDD, with no cap on non-critical I/O at the device
/// (so background writes are at the device when waited for).
fn sim_stack(seed: u64) -> (Arc<WriteCache>, Arc<BlockLayer>, Arc<SimDevice>) {
    let cfg = cfg(Policy::CpPiIoi, 64);
    let ssd = SimConfig {
        speedup: 10.0,
        ..SimConfig::ssd(cfg.cache_device_bytes(), seed)
    };
    let hdd = SimConfig {
        speedup: 50.0,
        ..SimConfig::hdd(1 << 20, seed)
    };
    let cache = Arc::new(SimDevice::new(ssd).unwrap());
    let backing = Arc::new(SimDevice::new(hdd).unwrap());
    let wc = Arc::new(WriteCache::new(cache, backing.clone(), cfg).unwrap());
    let block_cfg = BlockConfig {
        noncritical_cap: critio::block::NoncriticalCap::Fixed(0),
        ..BlockConfig::default()
    };
    let layer = Arc::new(BlockLayer::new(wc.clone(), block_cfg).unwrap());
    layer.set_at_device_hook(wc.reissue_hook());
    (wc, layer, backing)
}

/// A foreground thread that waits on random handles until `stop`.
fn random_waiter(
    handles: Arc<Mutex<Vec<critio::block::IoHandle>>>,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        context::set_foreground();
        let mut rng = SmallRng::seed_from_u64(seed);
        while !stop.load(Ordering::SeqCst) {
            let h = {
                let hs = handles.lock();
                (!hs.is_empty()).then(|| hs[rng.gen_range(0..hs.len())].clone())
            };
            match h {
                Some(h) => h.wait().unwrap(),
                None => std::thread::yield_now(),
            }
        }
    })
}

fn reissue_race_run(seed: u64) {
    let (wc, layer, backing) = sim_stack(seed);
    let handles: Arc<Mutex<Vec<critio::block::IoHandle>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let fg = random_waiter(handles.clone(), stop.clone(), !seed);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut last: HashMap<u64, (u64, critio::block::IoHandle)> = HashMap::new();
    let mut written: HashMap<u64, Vec<u64>> = HashMap::new();
    for v in 1..=400u64 {
        let b = rng.gen_range(0..48u64);
        if let Some((_, h)) = last.get(&b) {
            h.wait().unwrap(); // one write per block in flight
        }
        written.entry(b).or_default().push(v);
        let h = layer.write_async(b * BS as u64, content(b, v, 1)).unwrap();
        handles.lock().push(h.clone());
        last.insert(b, (v, h));
        if v % 50 == 0 {
            handles.lock().retain(|h| !h.is_done());
        }
    }
    for (_, h) in last.values() {
        h.wait().unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    fg.join().unwrap();
    let s = wc.stats();
    if std::env::var("NVWC_DEBUG").is_ok() {
        eprintln!("{s:?}\n{:?}", layer.stats().counters);
    }
    assert!(s.reissues > 0, "no reissue happened: {s:?}");
    wait_until("every reissue's second completion arrives", || {
        let s = wc.stats();
        s.duplicates_suppressed == s.reissues
    });
    layer.flush().unwrap();
    let model = Model {
        written,
        acked: last.iter().map(|(&b, (v, _))| (b, *v)).collect(),
        ..Model::default()
    };
    for (&b, (v, _)) in &last {
        let got = layer.read(b * BS as u64, BS).unwrap();
        assert_eq!(model.check(b, got.as_slice(), true, seed), *v, "block {b}");
    }
    wc.writeback_all().unwrap();
    for (&b, (v, _)) in &last {
        let got = read(&*backing, b * BS as u64, BS);
        assert_eq!(
            model.check(b, &got, true, seed),
            *v,
            "block {b} on the backing device"
        );
    }
}

// ---------------------------------------------------------------- power cuts

/// Block `b`'s content at `version`: every 512-byte sector starts with
/// (block, version, sector), then a pattern of those.
fn content(block: u64, version: u64, blocks: usize) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(blocks * BS);
    for (k, chunk) in buf.as_mut_slice().chunks_exact_mut(BS).enumerate() {
        let b = block + k as u64;
        for (s, sector) in chunk.chunks_exact_mut(SECTOR).enumerate() {
            sector[..8].copy_from_slice(&b.to_le_bytes());
            sector[8..16].copy_from_slice(&version.to_le_bytes());
            sector[16..24].copy_from_slice(&(s as u64).to_le_bytes());
            let mut x = (b * 1_000_003) ^ (version << 20) ^ s as u64 | 1;
            for w in sector[24..].chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                w.copy_from_slice(&x.to_le_bytes()[..w.len()]);
            }
        }
    }
    buf
}

/// What the test knows about each block.
#[derive(Default)]
struct Model {
    /// Versions ever submitted, per block.
    written: HashMap<u64, Vec<u64>>,
    /// Newest completed version (what a read returns now).
    done: HashMap<u64, u64>,
    /// Newest acknowledged version (completed, then a flush completed).
    acked: HashMap<u64, u64>,
    /// Completed writes no flush has been submitted after yet.
    unflushed: Vec<(u64, u64)>,
}

impl Model {
    fn completed(&mut self, first: u64, n: u64, version: u64) {
        for b in first..first + n {
            self.done.insert(b, version);
            self.unflushed.push((b, version));
        }
    }

    fn acknowledge(&mut self, covered: &[(u64, u64)]) {
        for &(b, v) in covered {
            let a = self.acked.entry(b).or_insert(0);
            *a = (*a).max(v);
        }
    }

    /// Checks block `b` as read back after a cut (`whole`: no write to it
    /// was in flight); returns the version it holds.
    fn check(&self, b: u64, data: &[u8], whole: bool, seed: u64) -> u64 {
        let acked = self.acked.get(&b).copied().unwrap_or(0);
        let mut seen = Vec::new();
        for (s, sector) in data.chunks_exact(SECTOR).enumerate() {
            if sector.iter().all(|&x| x == 0) {
                seen.push(0);
                continue;
            }
            let v = u64::from_le_bytes(sector[8..16].try_into().unwrap());
            let want = content(b, v, 1);
            assert!(
                sector == &want.as_slice()[s * SECTOR..(s + 1) * SECTOR],
                "block {b} sector {s}: not a version written there; reproduce with SEED={seed}"
            );
            assert!(
                self.written.get(&b).is_some_and(|w| w.contains(&v)),
                "block {b}: version {v} was never written; reproduce with SEED={seed}"
            );
            seen.push(v);
        }
        for &v in &seen {
            assert!(
                v >= acked,
                "block {b}: holds version {v}, older than acknowledged {acked} (stale copy won); \
                 reproduce with SEED={seed}"
            );
        }
        if whole {
            assert!(
                seen.iter().all(|&v| v == seen[0]),
                "block {b}: torn ({seen:?}) with no write in flight; reproduce with SEED={seed}"
            );
        }
        seen[0]
    }
}

type Events = Arc<Mutex<Vec<(u64, u64, u64, bool)>>>;

/// The seeds of a seeded test: `SEED=n` alone, else `NVWC_SEEDS` (default
/// `n`) seeds from 0.
fn seeds(n: u64) -> Vec<u64> {
    if std::env::var("SEED").is_ok() {
        return vec![seed_or(0)];
    }
    let n = std::env::var("NVWC_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(n);
    (0..n).collect()
}

/// Runs `run` for each seed, saying how to reproduce a failure.
fn for_seeds(what: &str, seeds: Vec<u64>, run: impl Fn(u64) + std::panic::RefUnwindSafe) {
    for seed in seeds {
        if let Err(e) = std::panic::catch_unwind(|| run(seed)) {
            eprintln!("{what} failed: reproduce with SEED={seed}");
            std::panic::resume_unwind(e);
        }
    }
}

/// One seeded run of the deterministic crash test: faulty memory devices
/// (every command completes inline), no writeback thread, so everything
/// follows from the seed.
fn crash_run(seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let policy = Policy::ALL[(seed % 5) as usize];
    let slots = rng.gen_range(16..=40u64);
    let cfg = NvwcConfig {
        full: if seed % 2 == 0 {
            FullPolicy::Stall
        } else {
            FullPolicy::Bypass
        },
        metadata_bytes: HEADER_BYTES + 2 * NvwcConfig::half_bytes_min(slots),
        writeback_batch_blocks: rng.gen_range(1..=8),
        ..cfg(policy, slots)
    };
    let blocks = 48u64;
    let faulty = |capacity, torn, s| {
        let mem = Arc::new(MemDevice::new(capacity));
        let fc = FaultConfig {
            seed: s,
            torn_writes: torn,
            ..FaultConfig::default()
        };
        Arc::new(FaultyDevice::new(mem, fc).unwrap())
    };
    let cache = faulty(cfg.cache_device_bytes(), true, seed);
    let backing = faulty(blocks * BS as u64, seed % 3 == 0, !seed);
    let mut model = Model::default();
    let mut version = 0u64;
    for cycle in 0..3 {
        let wc = manual(cache.clone(), backing.clone(), cfg);
        for b in 0..blocks {
            let data = read(&wc, b * BS as u64, BS);
            let v = model.check(b, &data, true, seed);
            // Whatever recovery found is durable now.
            model.done.insert(b, v);
            model.acked.insert(b, v);
        }
        model.unflushed.clear();
        let ops = rng.gen_range(50..600);
        crash_ops(&wc, &mut model, &mut rng, &mut version, ops, seed);
        let st = wc.stats();
        let (c, b) = if rng.gen_bool(0.5) {
            let c = cache.power_cut().unwrap();
            (c, backing.power_cut().unwrap())
        } else {
            let b = backing.power_cut().unwrap();
            (cache.power_cut().unwrap(), b)
        };
        if std::env::var("NVWC_DEBUG").is_ok() {
            eprintln!("seed {seed} cycle {cycle} {policy}: rec {:?}\n  stats {st:?}\n  cut cache {c:?}\n  cut backing {b:?}", wc.recovery());
        }
        drop(wc);
        cache.restart();
        backing.restart();
    }
    let wc = manual(cache, backing, cfg);
    for b in 0..blocks {
        model.check(b, &read(&wc, b * BS as u64, BS), true, seed);
    }
}

/// `ops` random writes, reads, flushes and writeback rounds.
fn crash_ops(
    wc: &WriteCache,
    m: &mut Model,
    rng: &mut SmallRng,
    version: &mut u64,
    ops: usize,
    seed: u64,
) {
    let events: Events = Arc::default();
    let mut pending: Vec<(u64, u64)> = Vec::new(); // stalled writes: (first, n)
    let blocks = 48u64;
    for _ in 0..ops {
        let roll = rng.gen_range(0..100);
        let first = rng.gen_range(0..blocks);
        let n = rng.gen_range(1..=4u64).min(blocks - first);
        let free = !pending.iter().any(|&(f, k)| f < first + n && first < f + k);
        if roll < 60 && free {
            *version += 1;
            let v = *version;
            for b in first..first + n {
                m.written.entry(b).or_default().push(v);
            }
            let class = if rng.gen_bool(0.5) {
                Class::Critical
            } else {
                Class::NonCritical
            };
            let cmd = write_cmd(
                first * BS as u64,
                content(first, v, n as usize),
                class,
                rng.gen(),
                rng.gen(),
                v,
            );
            let ev = events.clone();
            pending.push((first, n));
            wc.submit(
                cmd,
                Box::new(move |c| ev.lock().push((first, n, v, c.result.is_ok()))),
            );
        } else if roll < 75 && free {
            let data = read(wc, first * BS as u64, n as usize * BS);
            for (k, block) in data.chunks_exact(BS).enumerate() {
                let b = first + k as u64;
                let want = m.done.get(&b).copied().unwrap_or(0);
                let got = m.check(b, block, true, seed);
                assert_eq!(
                    got, want,
                    "block {b}: a read returned an old version; reproduce with SEED={seed}"
                );
            }
        } else if roll < 88 {
            drain(&events, &mut pending, m);
            let covered = std::mem::take(&mut m.unflushed);
            let out = submit_tracked(wc, Command::flush(Class::Critical));
            assert_eq!(out.lock().len(), 1, "memory devices complete inline");
            if out.lock()[0].is_ok() {
                m.acknowledge(&covered);
            }
        } else {
            wc.writeback_now(rng.gen_range(1..=8)).unwrap();
        }
        drain(&events, &mut pending, m);
        if !pending.is_empty() && rng.gen_bool(0.3) {
            wc.writeback_now(8).unwrap();
            drain(&events, &mut pending, m);
        }
    }
}

fn drain(events: &Events, pending: &mut Vec<(u64, u64)>, m: &mut Model) {
    for (first, n, v, ok) in events.lock().drain(..) {
        pending.retain(|&p| p != (first, n));
        assert!(ok, "a write failed before the cut");
        m.completed(first, n, v);
    }
}

#[test]
fn power_cuts_of_both_devices_lose_no_acknowledged_write() {
    for_seeds("the power-cut test", seeds(40), crash_run);
}

/// The same invariant on simulated drives (an SSD cache in front of an HDD)
/// with the writeback thread and concurrent writers, cut at a seeded
/// random moment (timing makes these runs vary; the seed fixes the rest).
fn sim_crash_run(seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let policy = Policy::ALL[(seed % 5) as usize];
    let slots = 48;
    let cfg = NvwcConfig {
        writeback_start_pct: 30.0,
        writeback_stop_pct: 10.0,
        writeback_batch_blocks: 8,
        metadata_bytes: HEADER_BYTES + 2 * NvwcConfig::half_bytes_min(slots),
        ..cfg(policy, slots)
    };
    let per_thread = 16u64;
    let threads = 3u64;
    let ssd = SimConfig {
        torn_writes: true,
        speedup: 20.0,
        ..SimConfig::ssd(cfg.cache_device_bytes(), seed)
    };
    let hdd = SimConfig {
        torn_writes: seed % 2 == 0,
        speedup: 200.0,
        ..SimConfig::hdd(1 << 20, !seed)
    };
    let cache = Arc::new(SimDevice::new(ssd).unwrap());
    let backing = Arc::new(SimDevice::new(hdd).unwrap());
    let wc = Arc::new(WriteCache::new(cache.clone(), backing.clone(), cfg).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (wc, stop) = (wc.clone(), stop.clone());
            let s = seed.wrapping_mul(31).wrapping_add(t);
            std::thread::spawn(move || sim_writer(&wc, &stop, t * per_thread, per_thread, s))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(rng.gen_range(20..100)));
    let st = wc.stats();
    let (c, b) = if rng.gen_bool(0.5) {
        let c = cache.power_cut().unwrap();
        (c, backing.power_cut().unwrap())
    } else {
        let b = backing.power_cut().unwrap();
        (cache.power_cut().unwrap(), b)
    };
    if std::env::var("NVWC_DEBUG").is_ok() {
        eprintln!("sim seed {seed} {policy}: {st:?}\n  cut cache {c:?}\n  cut backing {b:?}");
    }
    stop.store(true, Ordering::SeqCst);
    let models: Vec<(Model, Option<(u64, u64)>)> =
        workers.into_iter().map(|w| w.join().unwrap()).collect();
    drop(wc);
    cache.restart();
    backing.restart();
    let wc = WriteCache::new(cache, backing, cfg).unwrap();
    for (t, (model, in_flight)) in models.iter().enumerate() {
        for b in t as u64 * per_thread..(t as u64 + 1) * per_thread {
            let whole = in_flight.is_none_or(|(f, n)| b < f || b >= f + n);
            model.check(b, &read(&wc, b * BS as u64, BS), whole, seed);
        }
    }
}

/// Writes and flushes over its own blocks until `stop`; returns its model
/// and the write in flight when it stopped.
fn sim_writer(
    wc: &WriteCache,
    stop: &AtomicBool,
    base: u64,
    blocks: u64,
    seed: u64,
) -> (Model, Option<(u64, u64)>) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut m = Model::default();
    let mut version = seed << 32;
    while !stop.load(Ordering::SeqCst) {
        let flush = rng.gen_bool(0.2);
        let first = base + rng.gen_range(0..blocks);
        let n = rng.gen_range(1..=2u64).min(base + blocks - first);
        let cmd = if flush {
            Command::flush(Class::Critical)
        } else {
            version += 1;
            for b in first..first + n {
                m.written.entry(b).or_default().push(version);
            }
            let class = if rng.gen_bool(0.5) {
                Class::Critical
            } else {
                Class::NonCritical
            };
            write_cmd(
                first * BS as u64,
                content(first, version, n as usize),
                class,
                rng.gen(),
                rng.gen(),
                0,
            )
        };
        let covered = if flush {
            std::mem::take(&mut m.unflushed)
        } else {
            Vec::new()
        };
        let (tx, rx) = mpsc::channel();
        wc.submit(
            cmd,
            Box::new(move |c| {
                let _ = tx.send(c.result.is_ok());
            }),
        );
        let ok = loop {
            match rx.recv_timeout(Duration::from_millis(20)) {
                Ok(ok) => break Some(ok),
                Err(_) if stop.load(Ordering::SeqCst) => break None,
                Err(_) => {}
            }
        };
        match (ok, flush) {
            (Some(true), true) => m.acknowledge(&covered),
            (Some(true), false) => m.completed(first, n, version),
            (None, false) | (Some(false), false) => return (m, Some((first, n))),
            _ => return (m, None),
        }
    }
    (m, None)
}

#[test]
fn power_cuts_of_simulated_drives_lose_no_acknowledged_write() {
    for_seeds("the simulated power-cut test", seeds(16), sim_crash_run);
}

#[test]
fn counting_is_per_command() {
    let cfg = cfg(Policy::CpPi, 16);
    let (cache, backing) = mem_pair(&cfg, 1 << 20);
    let wc = manual(cache, backing, cfg);
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    wc.submit(
        write_cmd(0, page(1), Class::Critical, true, false, 0),
        Box::new(move |r| {
            r.result.unwrap();
            c.fetch_add(1, Ordering::SeqCst);
        }),
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let e = submit_and_wait(&wc, Command::read(100, BS, Class::Critical))
        .result
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("not a multiple of the block size 4096"),
        "{e}"
    );
}
