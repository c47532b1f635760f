//! Scenario tests of the page cache: dirty limits per class, promotion of
//! writeback a foreground task needs, flushes that do not entangle files,
//! and a property test against a model.

mod common;

use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::Duration;

use common::gate::GateDevice;
use common::{wait_blocked, wait_until};
use critio::block::{BlockConfig, BlockLayer, BlockScheme};
use critio::cache::{CacheConfig, CachedRead, PageCache};
use critio::config::SyncConfig;
use critio::context::{self, BlockingStatus, Class};
use critio::device::mem::MemDevice;
use critio::device::{Device, Op};
use proptest::prelude::*;

const PAGE: usize = 4096;
const MIB: u64 = 1 << 20;

fn cache_over(dev: Arc<dyn Device>, cfg: CacheConfig) -> Arc<PageCache> {
    let block = Arc::new(BlockLayer::new(dev, BlockConfig::default()).unwrap());
    Arc::new(PageCache::new(block, cfg, &SyncConfig::default()).unwrap())
}

fn page(n: u8) -> Vec<u8> {
    vec![n; PAGE]
}

/// Drops the (last handle of the) cache while releasing every write the
/// gate holds, so its writeback thread can finish and exit.
fn drop_releasing(cache: Arc<PageCache>, dev: &Arc<GateDevice>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    assert_eq!(Arc::strong_count(&cache), 1, "other handles still alive");
    let stop = Arc::new(AtomicBool::new(false));
    let releaser = std::thread::spawn({
        let (dev, stop) = (dev.clone(), stop.clone());
        move || {
            while !stop.load(Ordering::Relaxed) {
                dev.release_all();
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    drop(cache);
    stop.store(true, Ordering::Relaxed);
    releaser.join().unwrap();
}

/// A background task dirties pages as fast as it can while writeback
/// cannot make progress (the device holds every write); then a foreground
/// task writes a few pages. Returns whether the foreground writes finished
/// while the background task was throttled.
fn foreground_write_under_background_burst(dirty_limits: bool) -> bool {
    let dev = GateDevice::with(32, 8 * MIB, Box::new(|op, _| op == Op::Write));
    let cfg = CacheConfig {
        capacity_bytes: MIB, // 256 pages: 2 non-critical, 51 critical, 51 shared
        dirty_limits,
        ..CacheConfig::default()
    };
    let cache = cache_over(dev.clone(), cfg);
    let bg_file = cache.add_file("background", 0, 4 * MIB).unwrap();
    let fg_file = cache.add_file("foreground", 4 * MIB, MIB).unwrap();
    let (tx, rx) = channel();
    let bg = {
        let cache = cache.clone();
        std::thread::spawn(move || {
            tx.send(context::current()).unwrap();
            for p in 0..200u64 {
                cache.write(bg_file, p * PAGE as u64, &page(1)).unwrap();
            }
        })
    };
    let bg_task = rx.recv().unwrap();
    wait_blocked(
        &bg_task,
        BlockingStatus::Admission {
            stage: "cache: dirty throttle",
        },
    );
    let (tx, rx) = channel();
    let (task_tx, task_rx) = channel();
    let fg = {
        let cache = cache.clone();
        std::thread::spawn(move || {
            context::set_foreground();
            task_tx.send(context::current()).unwrap();
            for p in 0..8u64 {
                cache.write(fg_file, p * PAGE as u64, &page(2)).unwrap();
            }
            tx.send(()).unwrap();
        })
    };
    let fg_task = task_rx.recv().unwrap();
    let finished = rx.recv_timeout(Duration::from_millis(500)).is_ok();
    if !finished {
        assert_eq!(
            fg_task.blocking_status(),
            Some(BlockingStatus::Admission {
                stage: "cache: dirty throttle"
            }),
            "the foreground writer waits in dirty throttling"
        );
    }
    // Let writeback run, so everyone finishes.
    let releaser = std::thread::spawn({
        let dev = dev.clone();
        move || {
            while !(bg.is_finished() && fg.is_finished()) {
                dev.release_all();
                std::thread::sleep(Duration::from_millis(1));
            }
            bg.join().unwrap();
            fg.join().unwrap();
        }
    });
    releaser.join().unwrap();
    drop_releasing(cache, &dev);
    finished
}

#[test]
fn a_background_burst_does_not_block_a_foreground_writer_with_dirty_limits_per_class() {
    assert!(
        foreground_write_under_background_burst(true),
        "foreground writer was throttled"
    );
}

#[test]
fn with_one_shared_dirty_limit_the_background_burst_blocks_the_foreground_writer() {
    assert!(
        !foreground_write_under_background_burst(false),
        "expected the foreground writer to wait"
    );
}

#[test]
fn a_throttled_background_writer_that_inherits_criticality_retries_with_the_critical_limit() {
    let dev = GateDevice::with(32, 8 * MIB, Box::new(|op, _| op == Op::Write));
    let cache = cache_over(
        dev.clone(),
        CacheConfig {
            capacity_bytes: MIB,
            ..CacheConfig::default()
        },
    );
    let file = cache.add_file("f", 0, 4 * MIB).unwrap();
    let lock = Arc::new(critio::sync::Mutex::named("cache test: lock", ()));
    let (tx, rx) = channel();
    let bg = {
        let (cache, lock) = (cache.clone(), lock.clone());
        std::thread::spawn(move || {
            let _g = lock.lock();
            tx.send(context::current()).unwrap();
            for p in 0..10u64 {
                cache.write(file, p * PAGE as u64, &page(1)).unwrap();
            }
        })
    };
    let bg_task = rx.recv().unwrap();
    wait_blocked(
        &bg_task,
        BlockingStatus::Admission {
            stage: "cache: dirty throttle",
        },
    );
    let fg = {
        let lock = lock.clone();
        std::thread::spawn(move || {
            context::set_foreground();
            drop(lock.lock());
        })
    };
    // The writer inherits, is woken, and finishes under the critical limit
    // while every write is still held at the device.
    bg.join().unwrap();
    fg.join().unwrap();
    assert!(
        cache.stats().dirty_critical >= 1,
        "its later pages count as critical"
    );
    assert_eq!(bg_task.inherited_count(), 0);
    drop_releasing(cache, &dev);
}

/// A log's append lock is held across `prepare_appending`, and requests
/// wait for it: the preparation must not wait in dirty throttling, even
/// with the writer's class over its limit and writeback stuck; the writer
/// throttles before taking its lock instead (`balance_dirty`).
#[test]
fn a_log_preparation_under_its_lock_never_throttles_but_the_next_balance_does() {
    let dev = GateDevice::with(32, 8 * MIB, Box::new(|op, _| op == Op::Write));
    let cache = cache_over(
        dev.clone(),
        CacheConfig {
            capacity_bytes: MIB, // 256 pages, 2 of them background-dirty at most
            ..CacheConfig::default()
        },
    );
    let file = cache.add_file("log", 0, 4 * MIB).unwrap();
    let pages = 10u64;
    let (tx, rx) = channel();
    let bg = {
        let cache = cache.clone();
        std::thread::spawn(move || {
            // A background appender (the default class), every write held at
            // the device: the first pages already fill its dirty limit.
            cache
                .prepare_appending(file, 0, pages * PAGE as u64)
                .unwrap();
            tx.send((context::current(), cache.stats().dirty_noncritical))
                .unwrap();
            cache.balance_dirty().unwrap();
        })
    };
    let (task, dirty) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the preparation waited (dirty throttling under the log's lock)");
    assert_eq!(
        dirty, pages as usize,
        "every prepared page is dirty, past the limit"
    );
    // Outside its lock the appender is held to its limit again.
    wait_blocked(
        &task,
        BlockingStatus::Admission {
            stage: "cache: dirty throttle",
        },
    );
    assert!(!bg.is_finished());
    while !bg.is_finished() {
        dev.release_all(); // writeback cleans, and the appender goes on
        std::thread::sleep(Duration::from_millis(1));
    }
    bg.join().unwrap();
    drop_releasing(cache, &dev);
}

#[test]
fn a_foreground_read_that_needs_a_frame_under_writeback_promotes_that_writeback() {
    let n = 16u64; // the smallest cache: every frame will be under writeback
    let dev = GateDevice::with(32, 8 * MIB, Box::new(|op, _| op == Op::Write));
    let cfg = CacheConfig {
        capacity_bytes: n * PAGE as u64,
        dirty_limits: false,
        shared_dirty_pct: 100.0,
        writeback_batch_pages: 1,
        ..CacheConfig::default()
    };
    let cache = cache_over(dev.clone(), cfg);
    let file = cache.add_file("f", 0, 4 * MIB).unwrap();
    // Dirty every frame, newest first in page order, so the oldest dirty
    // page is the last page: its writeback is queued behind the cap.
    for p in (0..n).rev() {
        cache.write(file, p * PAGE as u64, &page(p as u8)).unwrap();
    }
    dev.wait_arrivals(1); // writeback started; one write at the device
    wait_until("every page under writeback", || {
        cache.stats().dirty_noncritical == n as usize
    });
    let oldest = (n - 1) * PAGE as u64;
    assert!(
        !dev.holds(oldest),
        "the oldest page's write is still queued"
    );
    let reader = {
        let cache = cache.clone();
        std::thread::spawn(move || {
            context::set_foreground();
            let mut out = vec![0u8; PAGE];
            cache.read(file, 100 * PAGE as u64, &mut out).unwrap();
            out
        })
    };
    wait_until("the awaited writeback is promoted to the device", || {
        dev.holds(oldest)
    });
    let arrival = dev.arrivals().into_iter().find(|a| a.0 == oldest).unwrap();
    assert_eq!(
        arrival.1,
        Class::Critical,
        "promoted past the non-critical cap"
    );
    assert!(cache.block().stats().counters.promoted_queued >= 1);
    let releaser = std::thread::spawn({
        let dev = dev.clone();
        move || {
            while !reader.is_finished() {
                dev.release_all();
                std::thread::sleep(Duration::from_millis(1));
            }
            reader.join().unwrap()
        }
    });
    assert_eq!(releaser.join().unwrap(), vec![0u8; PAGE]);
    drop_releasing(cache, &dev);
}

#[test]
fn flushing_one_file_does_not_wait_for_another_files_dirty_pages() {
    let b_base = 4 * MIB;
    let dev = GateDevice::with(
        32,
        8 * MIB,
        Box::new(move |op, offset| op == Op::Write && offset >= b_base),
    );
    let cache = cache_over(
        dev.clone(),
        CacheConfig {
            capacity_bytes: 4 * MIB,
            ..CacheConfig::default()
        },
    );
    let a = cache.add_file("a", 0, MIB).unwrap();
    let b = cache.add_file("b", b_base, MIB).unwrap();
    // Fewer than the non-critical limit (1% of 1024 pages), so this
    // background writer is not throttled while b's writeback is stuck.
    for p in 0..8u64 {
        cache.write(b, p * PAGE as u64, &page(9)).unwrap();
    }
    dev.wait_arrivals(1); // b's writeback is stuck at the device
    cache.write(a, 0, &page(1)).unwrap();
    let (tx, rx) = channel();
    let a_flusher = std::thread::spawn({
        let cache = cache.clone();
        move || {
            context::set_foreground();
            tx.send(cache.flush_file(a).map_err(|e| e.to_string()))
                .unwrap();
        }
    });
    let flushed = rx.recv_timeout(Duration::from_secs(10));
    assert!(
        matches!(flushed, Ok(Ok(()))),
        "flush of a waited for b: {flushed:?}"
    );
    // (joined, so its handle on the cache is gone before the last drop)
    a_flusher.join().unwrap();
    assert!(cache.stats().dirty_noncritical > 0, "b is still dirty");
    let flusher = std::thread::spawn({
        let cache = cache.clone();
        move || cache.flush_file(b).map_err(|e| e.to_string())
    });
    while !flusher.is_finished() {
        dev.release_all();
        std::thread::sleep(Duration::from_millis(1));
    }
    flusher.join().unwrap().unwrap();
    drop_releasing(cache, &dev);
}

/// The writeback thread waits for a round's runs one at a time; a
/// critical flush of file b whose page's write was promoted and completed
/// returns then, and does not wait (spinning on a completed write) for the
/// thread to wait out file a's earlier background runs, which no one
/// promotes: whoever sees a run complete ends its pages' writeback.
#[test]
fn a_flush_whose_page_was_written_does_not_wait_for_other_files_earlier_runs() {
    let b_base = 4 * MIB;
    let dev = GateDevice::with(32, 8 * MIB, Box::new(|op, _| op == Op::Write));
    let cache = cache_over(
        dev.clone(),
        CacheConfig {
            capacity_bytes: 4 * MIB,
            dirty_expire_ms: 50,
            ..CacheConfig::default()
        },
    );
    let a = cache.add_file("a", 0, MIB).unwrap();
    let b = cache.add_file("b", b_base, MIB).unwrap();
    // Background writes, dirtied together so one writeback round takes
    // them: runs a0, a2, b0 (by file and page).
    cache.write(a, 0, &page(1)).unwrap();
    cache.write(a, 2 * PAGE as u64, &page(2)).unwrap();
    cache.write(b, 0, &page(3)).unwrap();
    dev.wait_arrivals(1);
    assert!(dev.holds(0), "a0's writeback is at the device");
    assert!(!dev.holds(b_base), "b0's is queued behind the cap");
    let (tx, rx) = channel();
    let flusher = std::thread::spawn({
        let cache = cache.clone();
        move || {
            context::set_foreground();
            tx.send(cache.flush_file(b).map_err(|e| e.to_string()))
                .unwrap();
        }
    });
    wait_until("b0's write is promoted to the device", || dev.holds(b_base));
    dev.release(b_base);
    let flushed = rx.recv_timeout(Duration::from_secs(10));
    let a_held = dev.holds(0);
    while !flusher.is_finished() {
        dev.release_all(); // the flush still waits: let it end, to fail below
        std::thread::sleep(Duration::from_millis(1));
    }
    flusher.join().unwrap();
    drop_releasing(cache, &dev);
    assert!(
        matches!(flushed, Ok(Ok(()))),
        "{flushed:?}: the flush of b still waited with a's writes held"
    );
    assert!(a_held, "a's writes were still held when b's flush returned");
}

/// A device that fails every write below `bad_end` and does the rest on
/// memory.
struct FailLow {
    mem: MemDevice,
    info: critio::device::DeviceInfo,
    bad_end: u64,
}

impl FailLow {
    /// An 8 MiB device whose writes below `bad_end` fail.
    fn below(bad_end: u64) -> Arc<dyn Device> {
        let mem = MemDevice::new(8 * MIB);
        let info = mem.info().clone();
        Arc::new(FailLow { mem, info, bad_end })
    }
}

impl Device for FailLow {
    fn info(&self) -> &critio::device::DeviceInfo {
        &self.info
    }

    fn submit(&self, cmd: critio::device::Command, done: critio::device::Completer) {
        if cmd.op == Op::Write && cmd.offset < self.bad_end {
            let offset = cmd.offset;
            return done(critio::device::Completion {
                result: Err(critio::device::DeviceError::Io {
                    device: "faillow".into(),
                    op: Op::Write,
                    offset,
                    source: std::io::Error::other("bad sector"),
                }),
                buf: cmd.buf,
            });
        }
        self.mem.submit(cmd, done)
    }
}

/// A background writer throttled on its class's dirty pages, whose
/// writeback keeps failing, gets the device's error even while a
/// foreground writer's pages of another file write back fine (failures
/// are kept per class, as dirty limits are).
#[test]
fn a_writer_throttled_on_failing_writeback_gets_the_error_while_other_writeback_succeeds() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dev = FailLow::below(MIB);
    let cache = cache_over(
        dev,
        CacheConfig {
            capacity_bytes: 4 * MIB, // 1024 pages: a background limit of 10
            dirty_expire_ms: 5,
            ..CacheConfig::default()
        },
    );
    let bad = cache.add_file("bad", 0, MIB).unwrap();
    let good = cache.add_file("good", 4 * MIB, MIB).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let foreground = std::thread::spawn({
        let (cache, stop) = (cache.clone(), stop.clone());
        move || {
            context::set_foreground();
            let mut p = 0u64;
            while !stop.load(Ordering::Relaxed) {
                cache
                    .write(good, (p % 200) * PAGE as u64, &page(7))
                    .unwrap();
                p += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    std::thread::sleep(Duration::from_millis(100));
    let (tx, rx) = channel();
    let background = std::thread::spawn({
        let cache = cache.clone();
        move || {
            let r = (0..11u64).try_for_each(|p| cache.write(bad, p * PAGE as u64, &page(1)));
            tx.send(r.map_err(|e| e.to_string())).unwrap();
        }
    });
    let got = rx.recv_timeout(Duration::from_secs(10));
    stop.store(true, Ordering::Relaxed);
    foreground.join().unwrap();
    let late = got
        .is_err()
        .then(|| rx.recv_timeout(Duration::from_secs(30)));
    background.join().unwrap();
    match got {
        Ok(Err(e)) => assert!(e.contains("bad sector"), "{e}"),
        Ok(Ok(())) => panic!("the bad file's writes did not fail"),
        Err(_) => panic!(
            "still throttled 10 s into the other file's good writeback; once it stopped: {late:?}"
        ),
    }
}

/// Pages whose writeback keeps failing do not keep the other dirty pages
/// of their part from being written back: a round of writeback takes 8
/// pages, the 8 oldest keep failing, and the 16 dirtied after them still
/// reach the device (a failed page rejoins the line behind them).
#[test]
fn pages_whose_writeback_keeps_failing_do_not_starve_the_rest_of_their_part() {
    let dev = FailLow::below(MIB);
    let cache = cache_over(
        dev,
        CacheConfig {
            capacity_bytes: 4 * MIB,
            shards: 1,
            // Rounds of 8 pages, started by expiry alone: 24 dirty pages
            // are far below either class's background threshold.
            writeback_batch_pages: 4,
            writeback_inflight: 2,
            dirty_expire_ms: 1,
            noncritical_dirty_pct: 20.0,
            ..CacheConfig::default()
        },
    );
    let bad = cache.add_file("bad", 0, MIB).unwrap();
    let good = cache.add_file("good", 4 * MIB, MIB).unwrap();
    for p in 0..8u64 {
        cache.write(bad, p * PAGE as u64, &page(1)).unwrap();
    }
    for p in 0..16u64 {
        cache.write(good, p * PAGE as u64, &page(7)).unwrap();
    }
    let want = vec![7u8; 16 * PAGE];
    wait_until("the good file's pages are written back", || {
        cache.block().read(4 * MIB, 16 * PAGE).unwrap().as_slice() == want
    });
    wait_until("only the bad file's pages are dirty", || {
        cache.stats().dirty_noncritical == 8
    });
    assert!(cache.stats().writeback_errors > 0);
    let e = cache.flush_file(bad).unwrap_err().to_string();
    assert!(e.contains("bad sector"), "{e}");
    cache.flush_file(good).unwrap();
}

#[test]
fn a_flushed_file_survives_a_new_cache_and_bad_ranges_are_errors() {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(8 * MIB));
    let block = Arc::new(BlockLayer::new(dev, BlockConfig::default()).unwrap());
    let cfg = CacheConfig {
        capacity_bytes: 16 * PAGE as u64,
        ..CacheConfig::default()
    };
    {
        let cache = PageCache::new(block.clone(), cfg, &SyncConfig::default()).unwrap();
        let f = cache.add_file("f", 0, MIB).unwrap();
        cache
            .write(f, 100, b"hello across a page boundary")
            .unwrap();
        cache.write(f, PAGE as u64 - 3, b"xyz!!!").unwrap();
        cache.flush_file(f).unwrap();
        let e = cache.write(f, MIB - 2, b"abc").unwrap_err().to_string();
        assert!(e.contains("outside file"), "{e}");
        let e = cache.add_file("g", 4096, 8192).unwrap_err().to_string();
        assert!(e.contains("overlaps"), "{e}");
    }
    let cache = PageCache::new(block, cfg, &SyncConfig::default()).unwrap();
    let f = cache.add_file("f", 0, MIB).unwrap();
    let mut out = vec![0u8; 28];
    cache.read(f, 100, &mut out).unwrap();
    assert_eq!(&out, b"hello across a page boundary");
    let mut out = vec![0u8; 6];
    cache.read(f, PAGE as u64 - 3, &mut out).unwrap();
    assert_eq!(&out, b"xyz!!!");
}

#[test]
fn discard_drops_the_clean_pages_wholly_in_its_range_and_keeps_the_rest() {
    let cache = cache_over(
        Arc::new(MemDevice::new(8 * MIB)),
        CacheConfig {
            capacity_bytes: 16 * PAGE as u64,
            ..CacheConfig::default()
        },
    );
    let f = cache.add_file("f", 0, MIB).unwrap();
    for p in 0..8u8 {
        cache
            .write(f, u64::from(p) * PAGE as u64, &page(p + 1))
            .unwrap();
    }
    cache.flush_file(f).unwrap();
    cache.write(f, 4 * PAGE as u64, &page(50)).unwrap(); // page 4 dirty again
    assert_eq!(cache.stats().free_frames, 8);
    // Pages 1 to 5 lie wholly in the range; 0 and 6 only partly.
    let dropped = cache
        .discard(f, PAGE as u64 - 1, 5 * PAGE as u64 + 2)
        .unwrap();
    assert_eq!(dropped, 4, "pages 1, 2, 3 and 5: page 4 is dirty");
    let s = cache.stats();
    assert_eq!((s.discarded, s.free_frames), (4, 12));
    // The data is all still there: dropped pages are read from the device,
    // the dirty one from the cache.
    let misses = s.misses;
    let mut out = vec![0u8; 8 * PAGE];
    cache.read(f, 0, &mut out).unwrap();
    for p in 0..8 {
        let want = if p == 4 { 50 } else { p as u8 + 1 };
        assert!(
            out[p * PAGE..(p + 1) * PAGE].iter().all(|&b| b == want),
            "page {p}"
        );
    }
    assert_eq!(
        cache.stats().misses - misses,
        4,
        "only the dropped pages missed"
    );
    let e = cache
        .discard(f, MIB - PAGE as u64, 2 * PAGE as u64)
        .unwrap_err();
    assert!(e.to_string().contains("outside file"), "{e}");
}

#[test]
fn a_write_around_the_cache_reaches_the_device_and_leaves_no_older_page_cached() {
    let cache = cache_over(
        Arc::new(MemDevice::new(8 * MIB)),
        CacheConfig {
            capacity_bytes: 16 * PAGE as u64,
            ..CacheConfig::default()
        },
    );
    let f = cache.add_file("f", 4 * MIB, MIB).unwrap();
    cache.write(f, 0, &page(1)).unwrap();
    cache.flush_file(f).unwrap(); // page 0 clean
    cache.write(f, PAGE as u64, &page(2)).unwrap(); // page 1 dirty
    let free = cache.stats().free_frames;
    let mut data = page(7);
    data.extend(page(8));
    data.extend(page(9));
    cache
        .start_write_around(f, 0, &data)
        .unwrap()
        .finish()
        .unwrap();
    let s = cache.stats();
    assert_eq!(s.written_around_pages, 3);
    assert_eq!(
        s.free_frames,
        free + 2,
        "neither old page is cached any more"
    );
    assert_eq!(s.dirty_critical + s.dirty_noncritical, 0);
    // What the device holds now is the new data (page 1's older dirty
    // bytes were written back before, never after).
    let mut out = vec![0u8; 3 * PAGE];
    cache.read_through(f, 0, &mut out).unwrap();
    assert!(out == data);
    cache.read(f, 0, &mut out).unwrap();
    assert!(out == data);
    let e = cache.start_write_around(f, 100, &page(1)).err().unwrap();
    assert!(e.to_string().contains("not whole pages"), "{e}");
    let e = cache.start_write_around(f, MIB, &page(1)).err().unwrap();
    assert!(e.to_string().contains("outside file"), "{e}");
}

/// A memory device that records each read's and write's length and class.
struct Sizes {
    mem: MemDevice,
    seen: parking_lot::Mutex<Vec<(Op, usize, Class)>>,
}

impl Device for Sizes {
    fn info(&self) -> &critio::device::DeviceInfo {
        self.mem.info()
    }
    fn submit(&self, cmd: critio::device::Command, done: critio::device::Completer) {
        if cmd.op != Op::Flush {
            self.seen.lock().push((cmd.op, cmd.buf.len(), cmd.class));
        }
        self.mem.submit(cmd, done);
    }
}

#[test]
fn a_background_bulk_transfer_goes_to_the_device_in_short_requests_and_a_critical_one_does_not() {
    const CUT: usize = 16 << 10;
    for scheme in [BlockScheme::Rcp, BlockScheme::None] {
        let dev = Arc::new(Sizes {
            mem: MemDevice::new(8 * MIB),
            seen: Default::default(),
        });
        let cfg = BlockConfig {
            scheme,
            noncritical_request_max_bytes: CUT as u64,
            ..BlockConfig::default()
        };
        let block = Arc::new(BlockLayer::new(dev.clone(), cfg).unwrap());
        let cache = PageCache::new(block, CacheConfig::default(), &SyncConfig::default()).unwrap();
        let f = cache.add_file("f", 0, MIB).unwrap();
        let data: Vec<u8> = (0..64 << 10).map(|i| (i / PAGE) as u8).collect();
        // This thread is a background one: a snapshot's dump, then its scan.
        cache
            .start_write_around(f, 0, &data)
            .unwrap()
            .finish()
            .unwrap();
        let mut out = vec![0u8; data.len()];
        cache.read_through(f, 0, &mut out).unwrap();
        assert!(out == data, "{scheme:?}: the pieces make up the whole");
        let background = std::mem::take(&mut *dev.seen.lock());
        // A request thread's read of the same range.
        out.fill(0);
        {
            let _fg = context::foreground();
            cache.read_through(f, 0, &mut out).unwrap();
        }
        assert!(out == data);
        let critical = std::mem::take(&mut *dev.seen.lock());
        let lens = |op| {
            background
                .iter()
                .filter(|s| s.0 == op)
                .map(|s| s.1)
                .collect::<Vec<_>>()
        };
        if scheme == BlockScheme::Rcp {
            assert_eq!(lens(Op::Write), [CUT; 4], "the dump's writes, cut");
            assert_eq!(lens(Op::Read), [CUT; 4], "the scan's reads, cut");
        } else {
            assert_eq!(lens(Op::Write), [data.len()], "none: not cut");
            assert_eq!(lens(Op::Read), [data.len()], "none: not cut");
        }
        assert!(
            background.iter().all(|s| s.2 == Class::NonCritical),
            "{background:?}"
        );
        assert_eq!(
            critical,
            [(Op::Read, data.len(), Class::Critical)],
            "{scheme:?}: a request's read is one request"
        );
    }
}

#[test]
fn a_critical_wait_for_a_cut_transfer_promotes_all_its_pieces_at_once() {
    const CUT: u64 = 16 << 10;
    const LEN: usize = 64 << 10;
    let dev = GateDevice::with(32, 8 * MIB, Box::new(|_, _| true));
    let cfg = BlockConfig {
        noncritical_request_max_bytes: CUT,
        ..BlockConfig::default() // rcp, one background request at the device
    };
    let block = Arc::new(BlockLayer::new(dev.clone(), cfg).unwrap());
    let cache = PageCache::new(block, CacheConfig::default(), &SyncConfig::default()).unwrap();
    let f = cache.add_file("f", 0, MIB).unwrap();
    // A background scan (this thread), then a dump, each waited for by a
    // request thread: the first piece is at the device (held), the other
    // three wait behind it for the cap, until the critical wait promotes
    // them all, not only the one it waits for first.
    let read = cache.start_read_through(f, 0, LEN).unwrap();
    dev.wait_arrivals(1);
    let reader = std::thread::spawn(move || {
        let _fg = context::foreground();
        read.finish().unwrap()
    });
    dev.wait_arrivals(4);
    let classes =
        |from: usize| -> Vec<Class> { dev.arrivals()[from..].iter().map(|a| a.1).collect() };
    use Class::{Critical, NonCritical};
    assert_eq!(classes(0), [NonCritical, Critical, Critical, Critical]);
    dev.release_all();
    assert_eq!(reader.join().unwrap().len(), LEN);
    let write = cache.start_write_around(f, 0, &vec![3; LEN]).unwrap();
    dev.wait_arrivals(5);
    let writer = std::thread::spawn(move || {
        let _fg = context::foreground();
        write.finish().unwrap()
    });
    dev.wait_arrivals(8);
    assert_eq!(classes(4), [NonCritical, Critical, Critical, Critical]);
    dev.release_all();
    writer.join().unwrap();
}

#[derive(Clone, Debug)]
enum CacheOp {
    Write {
        file: usize,
        offset: u64,
        len: usize,
        byte: u8,
    },
    Read {
        file: usize,
        offset: u64,
        len: usize,
    },
    /// `read_through` of the whole file (cached pages scattered through it).
    ReadThrough {
        file: usize,
    },
    /// `read_cached`: the data if every page is cached.
    ReadCached {
        file: usize,
        offset: u64,
        len: usize,
    },
    Flush {
        file: usize,
    },
    FlushAll,
    DropClean,
    /// `start_write_around` of whole pages, waited for.
    WriteAround {
        file: usize,
        page: u64,
        pages: usize,
        byte: u8,
    },
    /// `discard` of a range: drops its clean pages only, so nothing read
    /// changes.
    Discard {
        file: usize,
        offset: u64,
        len: usize,
    },
}

const FILE_LEN: u64 = 48 * PAGE as u64;

fn cache_op() -> impl Strategy<Value = CacheOp> {
    let range = (0..2usize, 0..FILE_LEN - 1).prop_flat_map(|(f, off)| {
        let max = ((FILE_LEN - off) as usize).min(3 * PAGE);
        (Just(f), Just(off), 1..=max)
    });
    prop_oneof![
        4 => (range.clone(), any::<u8>()).prop_map(|((file, offset, len), byte)| CacheOp::Write { file, offset, len, byte }),
        3 => range.clone().prop_map(|(file, offset, len)| CacheOp::Read { file, offset, len }),
        1 => range.clone().prop_map(|(file, offset, len)| CacheOp::ReadCached { file, offset, len }),
        1 => (0..2usize).prop_map(|file| CacheOp::ReadThrough { file }),
        1 => (0..2usize).prop_map(|file| CacheOp::Flush { file }),
        1 => Just(CacheOp::FlushAll),
        1 => Just(CacheOp::DropClean),
        2 => range.prop_map(|(file, offset, len)| CacheOp::Discard { file, offset, len }),
        2 => (0..2usize, 0..FILE_LEN / PAGE as u64 - 3, 1..=3usize, any::<u8>())
            .prop_map(|(file, page, pages, byte)| CacheOp::WriteAround { file, page, pages, byte }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Whatever sequence of reads, writes (also around the cache),
    /// flushes, evictions and discards, the cache
    /// reads back what was last written, and after a final flush so does a
    /// new cache over the same device.
    #[test]
    fn the_cache_reads_back_what_was_last_written(
        ops in proptest::collection::vec(cache_op(), 1..60),
        sharded in any::<bool>(),
    ) {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(4 * MIB));
        let block = Arc::new(BlockLayer::new(dev, BlockConfig::default()).unwrap());
        // One part of 16 frames, or four of 16 with stripes of two pages
        // (so a file's pages spread over the parts).
        let (shards, batch) = if sharded { (4, 2) } else { (1, 32) };
        let cfg = CacheConfig {
            capacity_bytes: 16 * shards as u64 * PAGE as u64,
            dirty_expire_ms: 5,
            shards,
            writeback_batch_pages: batch,
            ..CacheConfig::default()
        };
        let cache = PageCache::new(block.clone(), cfg, &SyncConfig::default()).unwrap();
        let files = [cache.add_file("a", 0, FILE_LEN).unwrap(), cache.add_file("b", MIB, FILE_LEN).unwrap()];
        let mut model = vec![vec![0u8; FILE_LEN as usize]; 2];
        for op in &ops {
            match *op {
                CacheOp::Write { file, offset, len, byte } => {
                    let data = vec![byte; len];
                    cache.write(files[file], offset, &data).unwrap();
                    model[file][offset as usize..offset as usize + len].copy_from_slice(&data);
                }
                CacheOp::Read { file, offset, len } => {
                    let mut out = vec![0u8; len];
                    cache.read(files[file], offset, &mut out).unwrap();
                    prop_assert_eq!(&out[..], &model[file][offset as usize..offset as usize + len]);
                }
                CacheOp::ReadThrough { file } => {
                    let mut out = vec![0u8; FILE_LEN as usize];
                    cache.read_through(files[file], 0, &mut out).unwrap();
                    prop_assert!(out == model[file], "read_through of file {} differs", file);
                }
                CacheOp::ReadCached { file, offset, len } => {
                    let mut out = vec![0u8; len];
                    if cache.read_cached(files[file], offset, &mut out).unwrap() == CachedRead::Hit {
                        prop_assert_eq!(&out[..], &model[file][offset as usize..offset as usize + len]);
                    }
                }
                CacheOp::Flush { file } => cache.flush_file(files[file]).unwrap(),
                CacheOp::FlushAll => cache.flush_all().unwrap(),
                CacheOp::DropClean => { cache.drop_clean(); }
                CacheOp::Discard { file, offset, len } => {
                    cache.discard(files[file], offset, len as u64).unwrap();
                }
                CacheOp::WriteAround { file, page, pages, byte } => {
                    let (at, data) = (page * PAGE as u64, vec![byte; pages * PAGE]);
                    cache.start_write_around(files[file], at, &data).unwrap().finish().unwrap();
                    model[file][at as usize..at as usize + data.len()].copy_from_slice(&data);
                }
            }
        }
        cache.flush_all().unwrap();
        drop(cache);
        let cache = PageCache::new(block, cfg, &SyncConfig::default()).unwrap();
        let files = [cache.add_file("a", 0, FILE_LEN).unwrap(), cache.add_file("b", MIB, FILE_LEN).unwrap()];
        for f in 0..2 {
            let mut out = vec![0u8; FILE_LEN as usize];
            cache.read(files[f], 0, &mut out).unwrap();
            prop_assert!(out == model[f], "file {} differs after reopening", f);
        }
    }
}
