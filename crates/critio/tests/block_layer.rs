//! Scenario tests of the block layer driver: admission, dispatch order and
//! I/O inheritance, on a device that holds commands until released.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::channel;
use std::sync::Arc;

use common::gate::GateDevice;
use common::{wait_blocked, wait_until};
use critio::block::{
    AutoCapConfig, BlockConfig, BlockError, BlockLayer, BlockScheme, NoncriticalCap, Promotion,
    IO_LEN_MAX,
};
use critio::context::{self, BlockingStatus, Class, InheritKind};
use critio::device::mem::MemDevice;
use critio::device::{AlignedBuf, Device, Op};
use critio::sync::Mutex;

fn layer(dev: Arc<GateDevice>, cfg: BlockConfig) -> Arc<BlockLayer> {
    Arc::new(BlockLayer::new(dev, cfg).unwrap())
}

fn page(n: u8) -> AlignedBuf {
    AlignedBuf::from_slice(&[n; 4096])
}

#[test]
fn reads_writes_and_flushes_round_trip_through_the_layer() {
    let l = BlockLayer::new(Arc::new(MemDevice::new(1 << 20)), BlockConfig::default()).unwrap();
    l.write(8192, page(7)).unwrap();
    l.flush().unwrap();
    assert_eq!(l.read(8192, 4096).unwrap().as_slice(), &[7; 4096]);
    let h = l.write_async(0, page(1)).unwrap();
    h.wait().unwrap();
    assert_eq!(l.read(0, 4096).unwrap().as_slice(), &[1; 4096]);
    let e = l.read(100, 4096).unwrap_err().to_string();
    assert!(e.contains("not a multiple of the block size"), "{e}");
    let s = l.stats();
    // write, flush, read, async write, read: all non-critical (a background
    // thread); the flush moves no bytes.
    assert_eq!(
        s.class(Class::NonCritical).completions,
        5,
        "this thread is background"
    );
    assert_eq!(s.class(Class::NonCritical).bytes, 4 * 4096);
    assert_eq!(s.class(Class::Critical).completions, 0);
}

#[test]
fn a_foreground_thread_submits_critical_requests_and_writeback_is_not() {
    let dev = GateDevice::new(32);
    let l = layer(dev.clone(), BlockConfig::default());
    let fg = {
        let l = l.clone();
        std::thread::spawn(move || {
            context::set_foreground();
            l.write(0, page(1)).unwrap();
            l.write_async(4096, page(2)).unwrap()
        })
    };
    dev.wait_arrivals(1);
    dev.release_all();
    let h = fg.join().unwrap();
    dev.wait_arrivals(2);
    dev.release_all();
    h.wait().unwrap();
    assert_eq!(
        dev.arrivals(),
        vec![(0, Class::Critical), (4096, Class::NonCritical)]
    );
}

#[test]
fn a_foreground_wait_promotes_a_queued_writeback_past_the_cap() {
    let dev = GateDevice::new(32);
    let l = layer(dev.clone(), BlockConfig::default()); // rcp, cap 1
    let handles: Vec<_> = (0..3)
        .map(|i| l.write_async(i * 4096, page(i as u8)).unwrap())
        .collect();
    dev.wait_arrivals(1); // the cap lets one through
    assert_eq!(dev.arrivals(), vec![(0, Class::NonCritical)]);
    let third = handles[2].clone();
    let waiter = std::thread::spawn(move || {
        context::set_foreground();
        third.wait().unwrap();
    });
    dev.wait_arrivals(2);
    assert_eq!(
        dev.arrivals()[1],
        (8192, Class::Critical),
        "promoted and dispatched"
    );
    dev.release(8192);
    waiter.join().unwrap();
    dev.release(0); // frees the cap: the second goes
    dev.wait_arrivals(3);
    assert_eq!(dev.arrivals()[2], (4096, Class::NonCritical));
    dev.release_all();
    for h in &handles {
        h.wait().unwrap();
    }
    assert_eq!(l.stats().counters.promoted_queued, 1);
}

#[test]
fn without_inheritance_a_foreground_wait_does_not_promote() {
    let dev = GateDevice::new(32);
    let cfg = BlockConfig {
        scheme: BlockScheme::Static,
        ..BlockConfig::default()
    };
    let l = layer(dev.clone(), cfg);
    let first = l.write_async(0, page(0)).unwrap();
    let second = l.write_async(4096, page(1)).unwrap();
    dev.wait_arrivals(1);
    let waiter = {
        let second = second.clone();
        std::thread::spawn(move || {
            context::set_foreground();
            second.wait().unwrap();
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(30));
    assert_eq!(dev.arrivals().len(), 1, "still behind the cap");
    assert_eq!(l.promote(second.id()), Promotion::Disabled);
    dev.release(0);
    dev.wait_arrivals(2);
    assert_eq!(dev.arrivals()[1], (4096, Class::NonCritical));
    dev.release_all();
    waiter.join().unwrap();
    first.wait().unwrap();
}

/// Paper 000's chain end: a background task holding a lock is blocked in
/// block admission; a foreground task needs the lock; the background task
/// inherits and retries in the critical pool.
#[test]
fn a_lock_holder_blocked_in_admission_retries_as_critical_when_a_foreground_task_needs_the_lock() {
    let dev = GateDevice::new(32);
    let cfg = BlockConfig {
        noncritical_slots: 1,
        ..BlockConfig::default()
    };
    let l = layer(dev.clone(), cfg);
    let first = l.write_async(0, page(0)).unwrap(); // takes the only slot
    dev.wait_arrivals(1);
    let inode = Arc::new(Mutex::named("block test: inode", ()));
    let (tx, rx) = channel();
    let bg = {
        let (l, inode) = (l.clone(), inode.clone());
        std::thread::spawn(move || {
            let _g = inode.lock();
            tx.send(context::current()).unwrap();
            l.write_async(4096, page(1)).unwrap().wait().unwrap();
        })
    };
    let bg_task = rx.recv().unwrap();
    wait_blocked(
        &bg_task,
        BlockingStatus::Admission {
            stage: "block: admission",
        },
    );
    let before = critio::metrics::global().snapshot();
    let fg = {
        let inode = inode.clone();
        std::thread::spawn(move || {
            context::set_foreground();
            drop(inode.lock());
        })
    };
    dev.wait_arrivals(2);
    assert_eq!(
        dev.arrivals()[1],
        (4096, Class::Critical),
        "admitted into the critical pool"
    );
    assert!(
        bg_task.is_critical(),
        "the holder inherits while the foreground task waits"
    );
    let after = critio::metrics::global().snapshot();
    let res = |s: &critio::metrics::MetricsSnapshot| {
        s.inheritance
            .iter()
            .find(|c| c.kind == InheritKind::Admission)
            .unwrap()
            .resolutions
    };
    assert!(res(&after) > res(&before), "admission resolution counted");
    dev.release(4096);
    bg.join().unwrap();
    fg.join().unwrap();
    dev.release(0);
    first.wait().unwrap();
    assert_eq!(bg_task.inherited_count(), 0);
    assert_eq!(l.stats().counters.promoted_awaiting_admission, 1);
}

#[test]
fn promotion_at_the_device_is_counted_and_reported_to_the_hook() {
    let dev = GateDevice::new(32);
    let l = layer(dev.clone(), BlockConfig::default());
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    {
        let seen = seen.clone();
        l.set_at_device_hook(Arc::new(move |id| seen.lock().push(id)));
    }
    let h = l.write_async(0, page(0)).unwrap();
    dev.wait_arrivals(1);
    assert_eq!(l.promote(h.id()), Promotion::AtDevice);
    assert_eq!(*seen.lock(), vec![h.id()]);
    assert_eq!(
        l.promote_range(0, 4096),
        1,
        "findable by range while at the device"
    );
    dev.release_all();
    h.wait().unwrap();
    assert_eq!(l.promote(h.id()), Promotion::NotFound);
    assert_eq!(l.stats().counters.promoted_at_device, 2);
}

#[test]
fn a_waiter_records_its_blocking_status_as_the_io() {
    let dev = GateDevice::new(32);
    let l = layer(dev.clone(), BlockConfig::default());
    let h = l
        .submit(Op::Write, 0, page(0), false, "test: writeback wait")
        .unwrap();
    let (tx, rx) = channel();
    let w = {
        let h = h.clone();
        std::thread::spawn(move || {
            tx.send(context::current()).unwrap();
            h.wait().unwrap();
        })
    };
    let waiter = rx.recv().unwrap();
    let status = BlockingStatus::Io {
        id: h.id(),
        point: "test: writeback wait",
    };
    wait_blocked(&waiter, status);
    dev.wait_arrivals(1);
    dev.release_all();
    w.join().unwrap();
    wait_until("status cleared", || waiter.blocking_status().is_none());
}

#[test]
fn no_classes_scheme_dispatches_in_arrival_order_without_a_cap() {
    let dev = GateDevice::new(32);
    let cfg = BlockConfig {
        scheme: BlockScheme::None,
        noncritical_cap: NoncriticalCap::Fixed(1),
        ..BlockConfig::default()
    };
    let l = layer(dev.clone(), cfg);
    let hs: Vec<_> = (0..4)
        .map(|i| l.write_async(i * 4096, page(1)).unwrap())
        .collect();
    dev.wait_arrivals(4);
    dev.release_all();
    for h in hs {
        h.wait().unwrap();
    }
    let offsets: Vec<u64> = dev.arrivals().iter().map(|a| a.0).collect();
    assert_eq!(offsets, vec![0, 4096, 8192, 12288]);
}

#[test]
fn a_thread_background_level_orders_its_writeback_below_higher_levels() {
    let dev = GateDevice::new(32);
    // rcp, cap 1, and a starvation period longer than the test: with the
    // default 10 ms, a loaded machine that takes that long to start the
    // three submitting threads has the timer send the longest-waiting
    // request (the lowest level's) first, as it should.
    let cfg = BlockConfig {
        starvation_period_ms: 10_000,
        ..BlockConfig::default()
    };
    let l = layer(dev.clone(), cfg);
    let blocker = l.write_async(0, page(0)).unwrap(); // fills the cap
    dev.wait_arrivals(1);
    let submit_at = |level: u8, offset: u64| {
        let l = l.clone();
        std::thread::spawn(move || {
            context::set_background_level(level);
            l.write_async(offset, page(1)).unwrap()
        })
        .join()
        .unwrap()
    };
    // Submitted lowest level first: dispatched highest level first.
    let low = submit_at(5, 3 * 4096);
    let mid = submit_at(1, 2 * 4096);
    let high = submit_at(0, 4096);
    for (n, offset) in [(2, 4096), (3, 2 * 4096), (4, 3 * 4096)] {
        dev.release_all();
        dev.wait_arrivals(n);
        assert_eq!(dev.arrivals()[n - 1], (offset, Class::NonCritical));
    }
    dev.release_all();
    for h in [blocker, low, mid, high] {
        h.wait().unwrap();
    }
    let lanes = l.stats().counters.lane_dispatches;
    assert_eq!(&lanes[..7], &[0, 2, 1, 0, 0, 0, 1]);
}

/// A memory device that does flushes in their caller's thread
/// ([`Device::flush_here`]): records which thread flushed and how, and can
/// hold a flush done here until the test lets it end.
struct FlushHere {
    mem: MemDevice,
    log: parking_lot::Mutex<Vec<(std::thread::ThreadId, &'static str)>>,
    hold: parking_lot::Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl FlushHere {
    fn new(hold: Option<std::sync::mpsc::Receiver<()>>) -> Arc<Self> {
        Arc::new(Self {
            mem: MemDevice::new(1 << 20),
            log: parking_lot::Mutex::new(Vec::new()),
            hold: parking_lot::Mutex::new(hold),
        })
    }
}

impl Device for FlushHere {
    fn info(&self) -> &critio::device::DeviceInfo {
        self.mem.info()
    }

    fn submit(&self, cmd: critio::device::Command, done: critio::device::Completer) {
        if cmd.op == Op::Flush {
            self.log
                .lock()
                .push((std::thread::current().id(), "submit"));
        }
        self.mem.submit(cmd, done)
    }

    fn flushes_here(&self) -> bool {
        true
    }

    fn flush_here(&self) -> Option<Result<(), critio::device::DeviceError>> {
        self.log.lock().push((std::thread::current().id(), "here"));
        if let Some(rx) = self.hold.lock().take() {
            rx.recv().unwrap();
        }
        Some(Ok(()))
    }
}

#[test]
fn a_flush_its_caller_waits_for_is_done_in_the_callers_thread() {
    let dev = FlushHere::new(None);
    let l = BlockLayer::new(dev.clone(), BlockConfig::default()).unwrap();
    context::set_foreground();
    l.write(0, page(3)).unwrap();
    l.flush().unwrap();
    let me = std::thread::current().id();
    assert_eq!(*dev.log.lock(), vec![(me, "here")]);
    // A flush nobody waits for yet goes through submit as before.
    l.submit(Op::Flush, 0, AlignedBuf::empty(), false, "t: flush")
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(dev.log.lock().last(), Some(&(me, "submit")));
    let s = l.stats();
    assert_eq!(s.class(Class::Critical).completions, 2, "write, flush");
    assert_eq!(
        s.class(Class::NonCritical).completions,
        1,
        "the async flush"
    );
}

#[test]
fn a_flush_done_in_its_callers_thread_holds_back_no_other_request() {
    let (release, hold) = channel();
    let dev = FlushHere::new(Some(hold));
    let l = Arc::new(BlockLayer::new(dev.clone(), BlockConfig::default()).unwrap());
    let flusher = {
        let l = l.clone();
        std::thread::spawn(move || {
            context::set_foreground();
            l.flush().unwrap();
        })
    };
    wait_until("the flusher is in flush_here", || {
        !dev.log.lock().is_empty()
    });
    // The flusher is no longer the dispatcher: another critical request
    // reaches the device and completes while the flush is still going on
    // (were the flusher still dispatching, it would wait behind the flush).
    let (tx, rx) = channel();
    {
        let l = l.clone();
        std::thread::spawn(move || {
            context::set_foreground();
            l.write(4096, page(5)).unwrap();
            tx.send(l.read(4096, 4096).unwrap()).unwrap();
        });
    }
    let read = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("a request waited behind a flush done in its caller's thread");
    assert_eq!(read.as_slice(), &[5; 4096]);
    assert!(!flusher.is_finished());
    release.send(()).unwrap();
    flusher.join().unwrap();
    assert_eq!(l.stats().class(Class::Critical).completions, 3);
}

/// A mem device that can also do reads and writes in its caller's thread
/// (or, with `refuse`, hands every one back), logs which way each command
/// went, and the most commands it had at once.
struct SubmitHere {
    mem: MemDevice,
    info: critio::device::DeviceInfo,
    refuse: bool,
    log: parking_lot::Mutex<Vec<(std::thread::ThreadId, Op, &'static str)>>,
    busy: Arc<AtomicU32>,
    most: Arc<AtomicU32>,
    /// While armed, the next command done here waits for a message.
    hold: parking_lot::Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl SubmitHere {
    fn new(refuse: bool) -> Arc<Self> {
        Self::with_depth(refuse, 128)
    }

    /// One that takes at most `depth` commands at a time (the block layer
    /// queues the rest).
    fn with_depth(refuse: bool, depth: u32) -> Arc<Self> {
        let mem = MemDevice::new(1 << 20);
        let info = critio::device::DeviceInfo {
            queue_depth: depth,
            ..mem.info().clone()
        };
        Arc::new(Self {
            mem,
            info,
            refuse,
            log: parking_lot::Mutex::new(Vec::new()),
            busy: Arc::default(),
            most: Arc::default(),
            hold: parking_lot::Mutex::new(None),
        })
    }

    /// A command arrives (it leaves when its completion is handed back).
    fn arrive(&self) {
        let n = self.busy.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
        // Give another thread a chance to send one alongside.
        std::thread::yield_now();
    }

    /// The most commands it had at once.
    fn most(&self) -> u32 {
        self.most.load(Ordering::SeqCst)
    }

    fn took(&self) -> Vec<(Op, &'static str)> {
        self.log
            .lock()
            .iter()
            .map(|&(_, op, how)| (op, how))
            .collect()
    }
}

impl Device for SubmitHere {
    fn info(&self) -> &critio::device::DeviceInfo {
        &self.info
    }

    fn submit(&self, cmd: critio::device::Command, done: critio::device::Completer) {
        let me = std::thread::current().id();
        self.log.lock().push((me, cmd.op, "submit"));
        self.arrive();
        let busy = self.busy.clone();
        self.mem.submit(
            cmd,
            Box::new(move |c| {
                busy.fetch_sub(1, Ordering::SeqCst);
                done(c)
            }),
        )
    }

    fn submits_here(&self) -> bool {
        true
    }

    fn submit_here(
        &self,
        cmd: critio::device::Command,
    ) -> Result<critio::device::Completion, critio::device::Command> {
        if self.refuse {
            return Err(cmd);
        }
        let me = std::thread::current().id();
        self.log.lock().push((me, cmd.op, "here"));
        self.arrive();
        let hold = self.hold.lock().take();
        if let Some(hold) = hold {
            hold.recv().unwrap();
        }
        let c = critio::device::submit_and_wait(&self.mem, cmd);
        self.busy.fetch_sub(1, Ordering::SeqCst);
        Ok(c)
    }
}

/// Under rcp a critical thread's reads and writes are done in its own
/// thread; a non-critical thread's sync read stays promotable, so it goes
/// through submit, and so does an async write; under none (no
/// inheritance) the non-critical thread's read is done in its thread too.
#[test]
fn a_read_or_write_its_caller_waits_for_is_done_in_its_thread_once_nobody_can_promote_it() {
    let dev = SubmitHere::new(false);
    let l = BlockLayer::new(dev.clone(), BlockConfig::default()).unwrap();
    let me = std::thread::current().id();
    context::set_foreground();
    l.write(0, page(7)).unwrap();
    assert_eq!(l.read(0, 4096).unwrap().as_slice(), &[7; 4096]);
    assert_eq!(
        *dev.log.lock(),
        vec![(me, Op::Write, "here"), (me, Op::Read, "here")]
    );
    l.write_async(4096, page(8)).unwrap().wait().unwrap();
    assert_eq!(dev.took().last(), Some(&(Op::Write, "submit")), "async");
    let background_read = |l: Arc<BlockLayer>| {
        std::thread::spawn(move || {
            context::set_background();
            assert_eq!(l.read(4096, 4096).unwrap().as_slice(), &[8; 4096]);
        })
        .join()
        .unwrap()
    };
    let l = Arc::new(l);
    background_read(l.clone());
    assert_eq!(dev.took().last(), Some(&(Op::Read, "submit")), "rcp");
    let none = Arc::new(
        BlockLayer::new(
            dev.clone(),
            BlockConfig {
                scheme: BlockScheme::None,
                ..BlockConfig::default()
            },
        )
        .unwrap(),
    );
    background_read(none);
    assert_eq!(dev.took().last(), Some(&(Op::Read, "here")), "none");
    let s = l.stats();
    assert_eq!(s.class(Class::Critical).completions, 2);
    assert_eq!(s.class(Class::NonCritical).completions, 2);
}

/// A device that cannot do a command in its caller's thread now hands it
/// back, and the block layer submits it as usual.
#[test]
fn a_request_the_device_hands_back_goes_through_submit() {
    let dev = SubmitHere::new(true);
    let l = BlockLayer::new(dev.clone(), BlockConfig::default()).unwrap();
    context::set_foreground();
    l.write(0, page(9)).unwrap();
    assert_eq!(l.read(0, 4096).unwrap().as_slice(), &[9; 4096]);
    assert_eq!(
        dev.took(),
        vec![(Op::Write, "submit"), (Op::Read, "submit")]
    );
    assert_eq!(l.stats().class(Class::Critical).completions, 2);
}

/// Four foreground threads, each writing its own page `rounds` times and
/// reading each write back (then flushing, with `flush`).
fn foreground_writers(
    l: &Arc<BlockLayer>,
    rounds: u32,
    flush: bool,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..4u8)
        .map(|t| {
            let l = l.clone();
            std::thread::spawn(move || {
                context::set_foreground();
                let at = u64::from(t) * 4096;
                for i in 0..rounds {
                    let v = t.wrapping_mul(31).wrapping_add(i as u8);
                    l.write(at, page(v)).unwrap();
                    assert_eq!(l.read(at, 4096).unwrap().as_slice(), &[v; 4096]);
                }
                if flush {
                    l.flush().unwrap();
                }
            })
        })
        .collect()
}

/// With one command at a time at the device, foreground requests queue
/// behind each other: one its submitter finds queued is sent by whoever
/// dispatches next, and its submitter waits for it like any other. Every
/// request completes, with the data written, whichever way it went.
#[test]
fn foreground_requests_queued_behind_others_complete_whoever_sends_them() {
    let dev = SubmitHere::with_depth(false, 1);
    let l = Arc::new(BlockLayer::new(dev.clone(), BlockConfig::default()).unwrap());
    let threads = foreground_writers(&l, 300, true);
    let writeback = {
        let l = l.clone();
        std::thread::spawn(move || {
            context::set_background();
            for i in 0..300u32 {
                l.write_async(65536, page(i as u8)).unwrap().wait().unwrap();
            }
        })
    };
    for t in threads {
        t.join().unwrap();
    }
    writeback.join().unwrap();
    let s = l.stats();
    assert_eq!(s.class(Class::Critical).completions, 4 * 601);
    assert_eq!(s.class(Class::NonCritical).completions, 300);
    let took = dev.took();
    let count = |op| took.iter().filter(|&&(o, _)| o == op).count();
    assert_eq!(
        count(Op::Read) + count(Op::Write),
        4 * 600 + 300,
        "once each"
    );
    assert_eq!(count(Op::Flush), 4);
    assert_eq!(dev.most(), 1, "one command at a time at the device");
}

/// Foreground requests that go straight to the device when nothing is
/// queued (no table entry, no dispatcher's turn) and requests queued behind
/// others mix under every scheduler setting: with anticipation and tokens
/// (a request at the device from the critical lane holds the background
/// lanes), and with classes off. Every request completes once, with its
/// data, the background is not starved, and every dispatch is counted
/// once. (Debug builds check the core's invariants at every dispatch
/// decision, the direct requests' slots and device counts included.)
#[test]
fn direct_and_queued_requests_mix_under_every_scheduler_setting() {
    use critio::block::LaneTokens;
    let settings = [
        BlockConfig::default(),
        BlockConfig {
            anticipation_us: 2_000,
            tokens: LaneTokens::from_slice(&[4, 2]).unwrap(),
            ..BlockConfig::default()
        },
        BlockConfig {
            scheme: BlockScheme::None,
            ..BlockConfig::default()
        },
    ];
    for cfg in settings {
        let dev = SubmitHere::with_depth(false, 4);
        let l = Arc::new(BlockLayer::new(dev.clone(), cfg).unwrap());
        let foreground = foreground_writers(&l, 200, false);
        let background = {
            let l = l.clone();
            std::thread::spawn(move || {
                context::set_background();
                for i in 0..100u32 {
                    l.write_async(65536, page(i as u8)).unwrap().wait().unwrap();
                    assert_eq!(l.read(65536, 4096).unwrap().as_slice(), &[i as u8; 4096]);
                }
            })
        };
        for t in foreground {
            t.join().unwrap();
        }
        background.join().unwrap();
        let s = l.stats();
        let done = s.class(Class::Critical).completions + s.class(Class::NonCritical).completions;
        assert_eq!(done, 4 * 400 + 200, "{cfg:?}");
        let dispatched: u64 = s.counters.lane_dispatches.iter().sum();
        assert_eq!(dispatched, done, "each request dispatched once: {cfg:?}");
        let took = dev.took();
        assert_eq!(took.len() as u64, done, "{cfg:?}");
        assert!(
            took.iter().any(|&(_, how)| how == "here"),
            "some went straight to the device: {cfg:?}"
        );
        assert!(dev.most() <= 4, "{} at the device: {cfg:?}", dev.most());
    }
}

/// A critical read on an idle layer goes past the core (the fast path);
/// one still at the device when background work arrives is adopted by the
/// core: it holds its place at the device (here the only one), so the
/// background write waits for it, and it completes through the core.
/// Every request is counted once.
#[test]
fn a_fast_request_at_the_device_when_background_arrives_is_adopted_and_keeps_its_place() {
    let dev = SubmitHere::with_depth(false, 1);
    let l = Arc::new(BlockLayer::new(dev.clone(), BlockConfig::default()).unwrap());
    context::set_foreground();
    l.write(0, page(3)).unwrap(); // the first request opens the gate
    l.read(0, 4096).unwrap();
    assert_eq!(
        l.stats().counters.fast_sent,
        1,
        "the read went past the core"
    );
    let (release, hold) = channel();
    *dev.hold.lock() = Some(hold);
    let reader = {
        let l = l.clone();
        std::thread::spawn(move || {
            context::set_foreground();
            assert_eq!(l.read(0, 4096).unwrap().as_slice(), &[3; 4096]);
        })
    };
    wait_until("the read is at the device", || dev.hold.lock().is_none());
    let (queued, write_id) = channel();
    let writeback = {
        let l = l.clone();
        std::thread::spawn(move || {
            context::set_background();
            let h = l.write_async(8192, page(4)).unwrap();
            queued.send(h.id()).unwrap();
            h.wait().unwrap();
        })
    };
    let write_id = write_id.recv().unwrap();
    assert_eq!(
        l.stats().counters.fast_adopted,
        1,
        "the core adopted the read"
    );
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(
        l.location(write_id),
        Some(critio::block::Location::Queued),
        "the write waits for the adopted read's place"
    );
    assert!(!dev.took().contains(&(Op::Write, "submit")));
    release.send(()).unwrap();
    reader.join().unwrap();
    writeback.join().unwrap();
    assert_eq!(dev.most(), 1);
    let s = l.stats();
    assert_eq!(s.class(Class::Critical).completions, 3);
    assert_eq!(s.class(Class::NonCritical).completions, 1);
    assert_eq!(s.counters.lane_dispatches.iter().sum::<u64>(), 4);
    assert_eq!((s.counters.fast_sent, s.counters.fast_adopted), (2, 1));
    assert_eq!(s.class(Class::Critical).queue_wait.count, 3);
}

/// Fast-path requests are counted exactly (more than the records the
/// layer keeps between two lock holders, from two threads): completions,
/// bytes, zero waits in the stats and the wait-point table; their device
/// times are all measured or, on a device as fast as memory, a sample.
#[test]
fn fast_path_requests_are_all_counted() {
    let metrics = critio::metrics::MetricsHandle::new_registry();
    let dev = SubmitHere::new(false);
    let l = Arc::new(
        BlockLayer::with_metrics(dev.clone(), BlockConfig::default(), metrics.clone()).unwrap(),
    );
    // A foreground thread reading 1500 pages.
    let reader = || {
        let l = l.clone();
        std::thread::spawn(move || {
            context::set_foreground();
            for i in 0..1500u64 {
                l.read(i % 64 * 4096, 4096).unwrap();
            }
        })
    };
    let readers: Vec<_> = (0..2).map(|_| reader()).collect();
    for r in readers {
        r.join().unwrap();
    }
    let s = l.stats();
    let c = s.class(Class::Critical);
    assert_eq!(c.completions, 3000);
    assert_eq!(c.bytes, 3000 * 4096);
    assert_eq!(c.admission_wait.count, 3000);
    assert_eq!(c.queue_wait.count, 3000);
    // How many went past the core depends on how the two threads met
    // (one finding the gate closed by the other's lock takes the locked
    // path); every one is counted either way.
    assert!(s.counters.fast_sent > 0, "{:?}", s.counters);
    assert_eq!(s.counters.lane_dispatches[0], 3000);
    let timed = c.device_time.count;
    assert!(
        (3000 / 16..=3000).contains(&timed),
        "every device time or a sample: {timed}"
    );
    let waits = metrics
        .get()
        .wait_histogram("block: queue", Class::Critical);
    assert_eq!(waits.count(), 3000);
    // Alone, a reader's requests all go past the core but the first (the
    // test thread's `stats`, not critical, left the gate closed; the first
    // read reopens it), folds included: a critical lock holder reopens it.
    reader().join().unwrap();
    let after = l.stats().counters;
    assert_eq!(after.fast_sent - s.counters.fast_sent, 1499, "{after:?}");
    assert_eq!(after.lane_dispatches[0], 4500);
}

/// A request longer than the layer's limit is refused with a clear error,
/// and a read that long is refused before its buffer is allocated (a
/// terabyte here: allocating it would fail or take the machine's memory).
#[test]
fn an_oversized_request_is_refused_before_anything_is_allocated() {
    let l = BlockLayer::new(Arc::new(MemDevice::new(1 << 20)), BlockConfig::default()).unwrap();
    context::set_foreground();
    let e = l.read(0, 1 << 40).unwrap_err();
    assert!(
        matches!(e, BlockError::TooLarge { len, max } if len == 1 << 40 && max == IO_LEN_MAX),
        "{e}"
    );
    assert!(e.to_string().contains("split it"), "{e}");
    let big = AlignedBuf::zeroed(IO_LEN_MAX as usize + 4096);
    let e = l.write(0, big).unwrap_err();
    assert!(matches!(e, BlockError::TooLarge { .. }), "{e}");
    assert_eq!(l.stats().class(Class::Critical).completions, 0);
    // The largest allowed is only checked against the device.
    assert!(matches!(
        l.read(0, IO_LEN_MAX as usize).unwrap_err(),
        BlockError::Device(_)
    ));
}

/// On a device as fast as memory most fast-path reads and flushes go
/// untimed, into one tally the core folds in rather than a record each:
/// every one is still counted exactly, with its bytes and its zero waits,
/// across several folds and two threads; writes keep their records.
#[test]
fn untimed_fast_path_requests_are_all_counted() {
    let metrics = critio::metrics::MetricsHandle::new_registry();
    let l = Arc::new(
        BlockLayer::with_metrics(
            Arc::new(MemDevice::new(1 << 20)),
            BlockConfig::default(),
            metrics.clone(),
        )
        .unwrap(),
    );
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let l = l.clone();
            std::thread::spawn(move || {
                context::set_foreground();
                for i in 0..2500u64 {
                    match i % 50 {
                        0 => l.flush().unwrap(),
                        1 => l.write(t * 4096, page(7)).unwrap(),
                        _ => drop(l.read(i % 64 * 512, 512).unwrap()),
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = l.stats();
    let c = s.class(Class::Critical);
    assert_eq!(c.completions, 5000);
    // 2 x 2400 reads of 512 bytes, 2 x 50 writes of a page, 100 flushes.
    assert_eq!(c.bytes, 4800 * 512 + 100 * 4096);
    assert_eq!(c.admission_wait.count, 5000);
    assert_eq!(c.queue_wait.count, 5000);
    assert_eq!(s.counters.lane_dispatches[0], 5000);
    assert!(
        c.device_time.count < 1000,
        "memory: most went untimed ({} timed)",
        c.device_time.count
    );
    let waits = metrics
        .get()
        .wait_histogram("block: queue", Class::Critical);
    assert_eq!(waits.count(), 5000);
}

/// The adaptive cap learns of every critical completion, timed or not: on
/// a device as fast as memory the fast path times one request in 16, and a
/// foreground thread reading every 10 ms is critical traffic all along,
/// not idle (100 ms of grace) between its timed requests, so background
/// completions meanwhile do not grow the cap as if nobody needed
/// protecting.
#[test]
fn untimed_fast_path_requests_keep_critical_traffic_from_looking_idle() {
    let cap = AutoCapConfig {
        max: 8,
        window: 1_000_000,       // no decisions: only idleness moves the cap
        probe_every_ms: 1 << 30, // one probe, at the start
        ..AutoCapConfig::default()
    };
    let cfg = BlockConfig {
        noncritical_cap: NoncriticalCap::Auto(cap),
        ..BlockConfig::default()
    };
    let l = BlockLayer::new(Arc::new(MemDevice::new(1 << 20)), cfg).unwrap();
    context::set_foreground();
    for i in 0..2000u64 {
        l.read(i % 64 * 512, 512).unwrap();
    }
    let s = l.stats();
    let c = s.class(Class::Critical);
    assert!(
        c.device_time.count < c.completions / 2,
        "memory: only a sample is timed ({} of {})",
        c.device_time.count,
        c.completions
    );
    assert_eq!(s.noncritical_cap, 1);
    let mut most = 0;
    for _ in 0..48 {
        l.read(0, 512).unwrap();
        context::set_background();
        l.write_async(8192, page(1)).unwrap().wait().unwrap();
        context::set_foreground();
        most = most.max(l.stats().noncritical_cap);
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(most, 1, "the cap grew while a reader was active");
}

/// A memory device whose `submit` of a non-critical command does not
/// return until the test lets it: the dispatcher that sends it is stuck in
/// its turn, as a background thread preempted there is.
struct StallInSubmit {
    mem: MemDevice,
    entered: parking_lot::Mutex<Option<std::sync::mpsc::Sender<()>>>,
    go: parking_lot::Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl Device for StallInSubmit {
    fn info(&self) -> &critio::device::DeviceInfo {
        self.mem.info()
    }

    fn submit(&self, cmd: critio::device::Command, done: critio::device::Completer) {
        if cmd.class == Class::NonCritical {
            if let Some(entered) = self.entered.lock().take() {
                entered.send(()).unwrap();
                let go = self.go.lock().take().expect("stalls once");
                go.recv().unwrap();
            }
        }
        self.mem.submit(cmd, done)
    }
}

/// A foreground request does not wait for a background dispatcher that is
/// stuck handing its batch to the device: it takes a turn of its own.
#[test]
fn a_foreground_request_does_not_wait_behind_a_background_dispatchers_turn() {
    let (entered_tx, entered_rx) = channel();
    let (go_tx, go_rx) = channel();
    let dev = Arc::new(StallInSubmit {
        mem: MemDevice::new(1 << 20),
        entered: parking_lot::Mutex::new(Some(entered_tx)),
        go: parking_lot::Mutex::new(Some(go_rx)),
    });
    let layer = Arc::new(BlockLayer::new(dev, BlockConfig::default()).unwrap());
    let background = std::thread::spawn({
        let layer = layer.clone();
        move || layer.write(0, page(1))
    });
    entered_rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the background write reaches the device");
    let (tx, rx) = channel();
    let foreground = std::thread::spawn({
        let layer = layer.clone();
        move || {
            let _fg = context::foreground();
            tx.send(layer.write(8192, page(2)).map_err(|e| e.to_string()))
                .unwrap();
        }
    });
    let got = rx.recv_timeout(std::time::Duration::from_secs(10));
    go_tx.send(()).unwrap();
    background.join().unwrap().unwrap();
    foreground.join().unwrap();
    assert!(
        matches!(got, Ok(Ok(()))),
        "the foreground write waited for the stuck background dispatcher: {got:?}"
    );
    assert_eq!(layer.stats().shared_dispatch_turns, 1);
    assert_eq!(layer.read(8192, 4096).unwrap().as_slice(), &[2u8; 4096][..]);
}
