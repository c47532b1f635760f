//! Scenario tests of the write-ahead log: round trips, truncation and
//! wrap-around over many laps, torn and corrupt tails, poisoning, power cuts
//! on the simulated SSD and on the fault injector (many seeds, `SEED=n`
//! reproduces one), and the RCP scenario: a foreground commit makes the busy
//! log writer critical.

mod common;

use std::collections::BTreeMap;
use std::error::Error as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use common::gate::GateDevice;
use common::{wait_blocked, wait_until};
use critio::block::{BlockConfig, BlockLayer};
use critio::config::SyncConfig;
use critio::context::{self, BlockingStatus, Class};
use critio::device::faulty::{FaultConfig, FaultyDevice};
use critio::device::mem::MemDevice;
use critio::device::sim::{SimConfig, SimDevice};
use critio::device::{
    submit_and_wait, AlignedBuf, Command, Completer, Completion, Device, DeviceError, DeviceInfo,
    Op,
};
use critio::log::{
    Log, LogConfig, LogError, Lsn, Recovery, Tail, COMMIT_POINT, SPACE_POINT, WRITER_IDLE_POINT,
};
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const KIB: u64 = 1 << 10;
const BLOCK: u64 = 4096;

/// A 256 KiB log at 64 KiB: 63 ring blocks.
fn small_cfg() -> LogConfig {
    LogConfig {
        region_offset_bytes: 64 * KIB,
        region_bytes: 256 * KIB,
        batch_bytes_max: 64 * KIB,
        record_bytes_max: 16 * KIB,
        pending_bytes_max: 128 * KIB,
        allow_corrupt_truncate: false,
        ..LogConfig::default()
    }
}

/// The smallest log: 15 ring blocks.
fn tiny_cfg() -> LogConfig {
    LogConfig {
        region_offset_bytes: 0,
        region_bytes: 64 * KIB,
        batch_bytes_max: 28 * KIB,
        record_bytes_max: 6000,
        pending_bytes_max: 28 * KIB,
        allow_corrupt_truncate: false,
        ..LogConfig::default()
    }
}

fn layer(dev: &Arc<dyn Device>) -> Arc<BlockLayer> {
    Arc::new(BlockLayer::new(dev.clone(), BlockConfig::default()).unwrap())
}

fn try_open(dev: &Arc<dyn Device>, cfg: &LogConfig) -> Result<(Log, Recovery), LogError> {
    Log::open(layer(dev), cfg, &SyncConfig::default())
}

fn open(dev: &Arc<dyn Device>, cfg: &LogConfig) -> (Log, Recovery) {
    try_open(dev, cfg).unwrap_or_else(|e| panic!("open failed: {e}"))
}

fn mem(capacity: u64) -> Arc<dyn Device> {
    Arc::new(MemDevice::new(capacity))
}

/// Payload `lsn` of length `len`: recognizable bytes.
fn body(lsn: Lsn, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (lsn as usize * 31 + i * 7) as u8)
        .collect()
}

/// The device offset of ring byte `at` of a log configured by `cfg`.
fn ring_offset(cfg: &LogConfig, at: u64) -> u64 {
    cfg.region_offset_bytes + BLOCK + at
}

/// Changes one device byte directly (not through the log).
fn poke(dev: &dyn Device, offset: u64, f: impl FnOnce(&mut u8)) {
    let block = offset / 512 * 512;
    let mut c = submit_and_wait(dev, Command::read(block, 512, Class::Critical));
    c.result.unwrap();
    f(&mut c.buf.as_mut_slice()[(offset - block) as usize]);
    let w = submit_and_wait(dev, Command::write(block, c.buf, Class::Critical));
    w.result.unwrap();
}

#[test]
fn reopen_recovers_every_committed_record_in_order() {
    let dev = mem(4 << 20);
    let cfg = LogConfig {
        region_bytes: 2 << 20,
        ..small_cfg()
    };
    let (log, rec) = open(&dev, &cfg);
    assert!(rec.formatted && rec.records.is_empty() && rec.tail == Tail::Clean);
    let mut expect = Vec::new();
    for lsn in 1..=300u64 {
        let p = body(lsn, (lsn as usize * 37) % 3000);
        // Every third commit covers three records appended together.
        assert_eq!(log.append(&p).unwrap(), lsn);
        if lsn % 3 == 0 {
            log.commit(lsn).unwrap();
        }
        expect.push((lsn, p));
    }
    // Records 1..=30 are obsolete; the rest must come back.
    log.truncate(30).unwrap();
    assert_eq!(log.durable_lsn(), 300);
    log.close().unwrap();
    for _ in 0..2 {
        let (log, rec) = open(&dev, &cfg);
        assert!(!rec.formatted);
        assert_eq!(rec.tail, Tail::Clean);
        assert_eq!((rec.head_lsn, rec.next_lsn), (31, 301));
        assert_eq!(rec.records, expect[30..].to_vec());
        assert_eq!(log.next_lsn(), 301);
        drop(log);
    }
    let (log, _) = open(&dev, &cfg);
    assert_eq!(log.append_commit(b"after").unwrap(), 301, "LSNs continue");
}

#[test]
fn close_writes_the_pending_records_first() {
    let dev = mem(1 << 20);
    let (log, _) = open(&dev, &small_cfg());
    for lsn in 1..=50 {
        log.append(&body(lsn, 100)).unwrap();
    }
    log.close().unwrap();
    let (_log, rec) = open(&dev, &small_cfg());
    assert_eq!(
        rec.records.len(),
        50,
        "appended, never committed, still written"
    );
}

#[test]
fn truncation_and_wrap_around_over_many_laps_recover_exactly_the_live_records() {
    let dev = mem(1 << 20);
    let cfg = tiny_cfg();
    let mut rng = SmallRng::seed_from_u64(7);
    let mut all: Vec<Vec<u8>> = vec![Vec::new()]; // index = LSN
    let mut head = 1;
    let (mut log, _) = open(&dev, &cfg);
    let mut written = 0;
    // At most 4 one-block records per round and 2 kept: the ring (15
    // blocks) never fills, since this thread is also the truncator.
    for round in 0..200 {
        let mut last = 0;
        for _ in 0..rng.gen_range(1..=4) {
            let lsn = all.len() as Lsn;
            let p = body(lsn, rng.gen_range(0..=3000));
            last = log.append(&p).unwrap();
            assert_eq!(last, lsn);
            all.push(p);
        }
        log.commit(last).unwrap();
        // Keep a few records live (sometimes none).
        let keep = rng.gen_range(0..=2).min(last);
        head = head.max(last - keep + 1);
        log.truncate(head - 1).unwrap();
        if round % 5 == 0 {
            written += log.stats().bytes_written;
            drop(log);
            let (l, rec) = open(&dev, &cfg);
            assert_eq!(rec.tail, Tail::Clean, "round {round}");
            assert_eq!(rec.head_lsn, head, "round {round}");
            assert_eq!(rec.next_lsn, last + 1);
            let want: Vec<(Lsn, Vec<u8>)> = (head..=last)
                .map(|l| (l, all[l as usize].clone()))
                .collect();
            assert_eq!(rec.records, want, "round {round}");
            log = l;
        }
    }
    written += log.stats().bytes_written;
    let laps = written / (cfg.region_bytes - BLOCK);
    assert!(laps >= 5, "only {laps} laps of the ring");
}

#[test]
fn records_appended_while_a_batch_is_in_flight_form_the_next_batch() {
    let (gate, cfg, log) = gated_log();
    let n0 = gate.arrivals().len();
    let first = {
        let log = log.clone();
        std::thread::spawn(move || log.append_commit(b"first").unwrap())
    };
    gate.wait_arrivals(n0 + 1); // its write is held
    let rest: Vec<_> = (0..5)
        .map(|i| {
            let log = log.clone();
            std::thread::spawn(move || log.append_commit(&body(i, 200)).unwrap())
        })
        .collect();
    wait_until("five more records are appended", || log.next_lsn() == 7);
    release_until(&gate, || {
        first.is_finished() && rest.iter().all(|t| t.is_finished())
    });
    assert_eq!(first.join().unwrap(), 1);
    for t in rest {
        t.join().unwrap();
    }
    let stats = log.stats();
    assert_eq!((stats.batches, stats.records), (2, 6), "{stats:?}");
    let ops: Vec<u64> = gate.arrivals()[n0..].iter().map(|a| a.0).collect();
    let data = ring_offset(&cfg, 0);
    assert_eq!(
        ops,
        vec![data, 0, data + BLOCK, 0],
        "write, flush, write, flush"
    );
}

#[test]
fn a_full_ring_blocks_appends_on_the_space_wait_and_its_helper_inherits() {
    let dev = mem(1 << 20);
    let cfg = tiny_cfg();
    let (log, _) = open(&dev, &cfg);
    let log = Arc::new(log);
    // This thread is the checkpointer.
    log.register_space_helper(context::current());
    for lsn in 1..=15 {
        log.append_commit(&body(lsn, 4000)).unwrap(); // one block each
    }
    assert_eq!(log.stats().used_bytes, log.stats().capacity_bytes);
    let (tx, rx) = mpsc::channel();
    let appender = {
        let log = log.clone();
        std::thread::spawn(move || {
            context::set_foreground();
            tx.send(context::current()).unwrap();
            log.append_commit(&body(16, 4000))
        })
    };
    let task = rx.recv().unwrap();
    wait_blocked(&task, BlockingStatus::Condvar { name: SPACE_POINT });
    wait_until("the checkpointer inherits", || {
        context::current_class() == Class::Critical
    });
    log.truncate(10).unwrap();
    assert_eq!(appender.join().unwrap().unwrap(), 16);
    assert_eq!(context::current_class(), Class::NonCritical);
    assert_eq!(log.head_lsn(), 11);
}

/// A thread waiting in `wait_for_space(len)` on the full `log` (returned
/// once it waits there).
fn space_waiter(log: &Arc<Log>, len: usize) -> std::thread::JoinHandle<Result<(), LogError>> {
    let (tx, rx) = mpsc::channel();
    let waiter = {
        let log = log.clone();
        std::thread::spawn(move || {
            tx.send(context::current()).unwrap();
            log.wait_for_space(len)
        })
    };
    wait_blocked(
        &rx.recv().unwrap(),
        BlockingStatus::Condvar { name: SPACE_POINT },
    );
    waiter
}

/// The retry pattern for appending under a lock the checkpointer needs.
#[test]
fn try_append_never_waits_and_wait_for_space_returns_after_truncation() {
    let dev = mem(1 << 20);
    let (log, _) = open(&dev, &tiny_cfg());
    let log = Arc::new(log);
    for lsn in 1..=15 {
        log.append_commit(&body(lsn, 4000)).unwrap();
    }
    assert_eq!(log.used_pct(), 100.0);
    assert_eq!(log.try_append(&body(16, 4000)).unwrap(), None, "full");
    let waiter = space_waiter(&log, 4000);
    log.truncate(15).unwrap();
    waiter.join().unwrap().unwrap();
    assert_eq!(log.try_append(&body(16, 4000)).unwrap(), Some(16));
    // Truncating past records not yet durable waits for them first.
    let lsn = log.append(b"not committed yet").unwrap();
    log.truncate(lsn).unwrap();
    assert_eq!((log.durable_lsn(), log.head_lsn()), (lsn, lsn + 1));
    assert_eq!(log.used_pct(), 0.0);
    let e = log.wait_for_space(7000).unwrap_err();
    assert!(matches!(e, LogError::RecordTooLarge { .. }), "{e}");
}

/// An owner that can no longer make room refuses appends: a task waiting
/// for space gets the reason instead of waiting forever, new appends fail,
/// and what was appended before still becomes durable and recoverable.
#[test]
fn refused_appends_fail_waiters_for_space_and_keep_what_was_appended() {
    let dev = mem(1 << 20);
    let (log, _) = open(&dev, &tiny_cfg());
    let log = Arc::new(log);
    for lsn in 1..=14 {
        log.append_commit(&body(lsn, 4000)).unwrap();
    }
    let last = log.append(&body(15, 4000)).unwrap(); // not waited for yet
    assert_eq!(log.try_append(&body(16, 4000)).unwrap(), None, "full");
    let waiter = space_waiter(&log, 4000);
    log.refuse_appends("the checkpointer stopped");
    log.refuse_appends("a second reason is not kept");
    let e = waiter.join().unwrap().unwrap_err();
    assert!(
        matches!(&e, LogError::Refused { why } if why == "the checkpointer stopped"),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "log: appends refused: the checkpointer stopped"
    );
    assert!(matches!(log.append(b"x"), Err(LogError::Refused { .. })));
    assert!(matches!(
        log.try_append(b"x"),
        Err(LogError::Refused { .. })
    ));
    log.commit(last).unwrap();
    log.truncate(10).unwrap();
    assert!(matches!(
        log.wait_for_space(10),
        Err(LogError::Refused { .. })
    ));
    Arc::into_inner(log).unwrap().close().unwrap();
    let (_, rec) = open(&dev, &tiny_cfg());
    let lsns: Vec<Lsn> = rec.records.iter().map(|(lsn, _)| *lsn).collect();
    assert_eq!(lsns, (11..=15).collect::<Vec<_>>());
    assert_eq!(rec.records[4].1, body(15, 4000));
}

#[test]
fn oversized_records_and_bad_configs_are_clear_errors() {
    let dev = mem(1 << 20);
    let (log, _) = open(&dev, &small_cfg());
    let e = log.append(&vec![0; 16 * 1024 + 1]).unwrap_err();
    assert!(matches!(e, LogError::RecordTooLarge { .. }), "{e}");
    assert!(e.to_string().contains("log.record_bytes_max"), "{e}");
    drop(log);
    let too_big = LogConfig {
        region_offset_bytes: 1 << 20,
        ..small_cfg()
    };
    let e = try_open(&dev, &too_big).unwrap_err().to_string();
    assert!(
        e.contains("log.region_bytes") && e.contains("must fit"),
        "{e}"
    );
    let other_size = LogConfig {
        region_bytes: 512 * KIB,
        ..small_cfg()
    };
    let e = try_open(&dev, &other_size).unwrap_err().to_string();
    assert!(
        e.contains("formatted with log.region_bytes = 262144"),
        "{e}"
    );
    // A region holding something else is not formatted over.
    poke(&*dev, 64 * KIB, |b| *b ^= 0xff);
    poke(&*dev, 64 * KIB + 512, |b| *b ^= 0xff);
    let e = try_open(&dev, &small_cfg()).unwrap_err();
    assert!(matches!(e, LogError::BadHeader { .. }), "{e}");
}

#[test]
fn a_torn_last_batch_is_a_torn_tail_and_appending_resumes_over_it() {
    let dev = mem(1 << 20);
    let cfg = small_cfg();
    let (log, _) = open(&dev, &cfg);
    for lsn in 1..=5 {
        log.append_commit(&body(lsn, 1000)).unwrap(); // data blocks 0..=4
    }
    log.append_commit(&body(6, 10_000)).unwrap(); // data blocks 5..=7
    drop(log);
    // Only the first of record 6's blocks reached the media.
    let zeros = AlignedBuf::zeroed(2 * BLOCK as usize);
    let w = Command::write(ring_offset(&cfg, 6 * BLOCK), zeros, Class::Critical);
    submit_and_wait(&*dev, w).result.unwrap();
    let (log, rec) = open(&dev, &cfg);
    assert_eq!(
        rec.tail,
        Tail::Torn {
            offset: ring_offset(&cfg, 5 * BLOCK),
            lsn: 6
        }
    );
    assert_eq!(rec.records.len(), 5);
    assert_eq!(log.append_commit(b"six").unwrap(), 6);
    drop(log);
    let (_log, rec) = open(&dev, &cfg);
    assert_eq!(rec.tail, Tail::Clean);
    assert_eq!(rec.records.last().unwrap(), &(6, b"six".to_vec()));
}

#[test]
fn a_flipped_byte_in_a_middle_record_is_corruption_and_open_refuses_it() {
    let dev = mem(1 << 20);
    let cfg = small_cfg();
    let (log, _) = open(&dev, &cfg);
    for lsn in 1..=10 {
        log.append_commit(&body(lsn, 500)).unwrap(); // one batch, one block each
    }
    drop(log);
    poke(&*dev, ring_offset(&cfg, 3 * BLOCK) + 100, |b| *b ^= 0x10); // record 4
    let e = try_open(&dev, &cfg).unwrap_err();
    assert!(
        matches!(
            e,
            LogError::Corrupt {
                lsn: 4,
                later_records: 6,
                recovered: 3,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("allow_corrupt_truncate"), "{e}");
    // Refusing changed nothing: the same report again, also from inspect.
    let rec = Log::inspect(&layer(&dev), &cfg).unwrap();
    let corrupt = Tail::Corrupt {
        offset: ring_offset(&cfg, 3 * BLOCK),
        lsn: 4,
        later_records: 6,
    };
    assert_eq!(rec.tail, corrupt);
    // The caller decides to truncate there.
    let allow = LogConfig {
        allow_corrupt_truncate: true,
        ..cfg
    };
    let (log, rec) = open(&dev, &allow);
    assert_eq!(rec.tail, corrupt);
    let lsns: Vec<Lsn> = rec.records.iter().map(|r| r.0).collect();
    assert_eq!(lsns, vec![1, 2, 3]);
    assert_eq!(rec.records[2].1, body(3, 500));
    assert_eq!(log.append_commit(b"new four").unwrap(), 4);
    drop(log);
    // The dropped records 5..=10 (an older incarnation) never come back.
    let (_log, rec) = open(&dev, &cfg);
    assert_eq!(rec.tail, Tail::Clean);
    assert_eq!(rec.records.len(), 4);
    assert_eq!(rec.records[3], (4, b"new four".to_vec()));
}

/// A memory device whose writes or flushes fail while a switch is on.
struct Switch {
    mem: MemDevice,
    fail: AtomicBool,
    op: Op,
}

impl Device for Switch {
    fn info(&self) -> &DeviceInfo {
        self.mem.info()
    }

    fn submit(&self, cmd: Command, done: Completer) {
        if cmd.op == self.op && self.fail.load(Ordering::SeqCst) {
            let result = Err(DeviceError::Injected {
                device: "switch".into(),
                op: cmd.op,
                offset: cmd.offset,
            });
            return done(Completion {
                result,
                buf: cmd.buf,
            });
        }
        self.mem.submit(cmd, done);
    }
}

#[test]
fn a_failed_flush_poisons_the_log_and_says_so() {
    let sw = Arc::new(Switch {
        mem: MemDevice::new(1 << 20),
        fail: AtomicBool::new(false),
        op: Op::Flush,
    });
    let dev: Arc<dyn Device> = sw.clone();
    let (log, _) = open(&dev, &small_cfg());
    log.append_commit(b"one").unwrap();
    sw.fail.store(true, Ordering::SeqCst);
    let e = log.append_commit(b"two").unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            LogError::Poisoned {
                first_unacked: 2,
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains("flush") && msg.contains("restart and recover"),
        "{msg}"
    );
    assert!(
        e.source().unwrap().to_string().contains("injected"),
        "{e:?}"
    );
    sw.fail.store(false, Ordering::SeqCst);
    let e = log.append(b"three").unwrap_err();
    assert!(matches!(e, LogError::Poisoned { .. }), "{e}");
    assert!(e.to_string().contains("flush"), "{e}");
    assert!(log.is_poisoned());
    assert_eq!(
        log.durable_lsn(),
        1,
        "the failed batch is never acknowledged"
    );
    assert!(matches!(log.truncate(1), Err(LogError::Poisoned { .. })));
    assert!(matches!(log.close(), Err(LogError::Poisoned { .. })));
    // Restart and recover: record 1 for sure; record 2 may have reached the
    // media (its write completed), but it was never acknowledged.
    let (log, rec) = open(&dev, &small_cfg());
    assert_eq!(rec.records[0], (1, b"one".to_vec()));
    assert!(rec.records.len() <= 2);
    log.append_commit(b"works again").unwrap();
}

#[test]
fn a_failed_write_poisons_the_log_and_commits_waiting_on_it_fail() {
    // Open writes one header block; then three batches fit.
    let faults = FaultConfig {
        no_space_after_bytes: Some(4 * BLOCK),
        ..FaultConfig::default()
    };
    let inner = mem(1 << 20);
    let dev: Arc<dyn Device> = Arc::new(FaultyDevice::new(inner.clone(), faults).unwrap());
    let (log, _) = open(&dev, &small_cfg());
    for lsn in 1..=3 {
        log.append_commit(&body(lsn, 10)).unwrap();
    }
    let e = log.append_commit(b"four").unwrap_err();
    assert!(e.to_string().contains("write of records 4..=4"), "{e}");
    assert!(
        e.source().unwrap().to_string().contains("no space"),
        "{e:?}"
    );
    assert!(matches!(
        log.append(b"five"),
        Err(LogError::Poisoned { .. })
    ));
    drop(log);
    let (_log, rec) = open(&inner, &small_cfg());
    assert_eq!(rec.records.len(), 3);
}

/// A memory device whose next write, once armed, waits until the test
/// lets it go and then panics, in the thread that submitted it: a bug in a
/// device or below, hit by a committer writing its own batch.
struct PanicOnce {
    mem: MemDevice,
    armed: AtomicBool,
    entered: Mutex<Option<mpsc::Sender<()>>>,
    go: Mutex<Option<mpsc::Receiver<()>>>,
}

impl PanicOnce {
    /// Arms the device. Returns where the write reports its arrival, and
    /// where the test lets it go on (and panic).
    fn arm(&self) -> (mpsc::Receiver<()>, mpsc::Sender<()>) {
        let (entered_tx, entered_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel();
        *self.entered.lock() = Some(entered_tx);
        *self.go.lock() = Some(go_rx);
        self.armed.store(true, Ordering::SeqCst);
        (entered_rx, go_tx)
    }

    fn maybe_panic(&self, op: Op) {
        if op != Op::Write || !self.armed.swap(false, Ordering::SeqCst) {
            return;
        }
        let _ = self.entered.lock().take().unwrap().send(());
        let go = self.go.lock().take().unwrap();
        let _ = go.recv_timeout(common::PATIENCE);
        panic!("PanicOnce: a device write panics (injected by the test)");
    }
}

impl Device for PanicOnce {
    fn info(&self) -> &DeviceInfo {
        self.mem.info()
    }

    fn submit(&self, cmd: Command, done: Completer) {
        self.maybe_panic(cmd.op);
        self.mem.submit(cmd, done);
    }

    fn flushes_here(&self) -> bool {
        self.mem.flushes_here()
    }

    fn flush_here(&self) -> Option<Result<(), DeviceError>> {
        self.mem.flush_here()
    }

    fn submits_here(&self) -> bool {
        self.mem.submits_here()
    }

    fn submit_here(&self, cmd: Command) -> Result<Completion, Command> {
        self.maybe_panic(cmd.op);
        self.mem.submit_here(cmd)
    }
}

/// A foreground committer that panics while it writes its own batch (the
/// device's write panics) poisons the log, as a failed write does: the
/// committer waiting for that batch and every later append fail at once,
/// instead of waiting forever for a batch left in flight, and the panic
/// goes on in the committer's thread.
#[test]
fn a_committer_that_panics_in_its_batch_write_poisons_the_log() {
    let panicky = Arc::new(PanicOnce {
        mem: MemDevice::new(1 << 20),
        armed: AtomicBool::new(false),
        entered: Mutex::new(None),
        go: Mutex::new(None),
    });
    let dev: Arc<dyn Device> = panicky.clone();
    let log = Arc::new(open(&dev, &small_cfg()).0);
    log.append_commit(b"one").unwrap();
    let (entered, go) = panicky.arm();
    let committer = {
        let log = log.clone();
        std::thread::spawn(move || {
            context::set_foreground();
            let lsn = log.append(b"two").unwrap();
            log.commit(lsn)
        })
    };
    entered
        .recv_timeout(common::PATIENCE)
        .expect("the committer writes its batch");
    // A second committer waits for the batch in flight.
    let (tx, rx) = mpsc::channel();
    let (task_tx, task_rx) = mpsc::channel();
    std::thread::spawn({
        let log = log.clone();
        move || {
            context::set_foreground();
            task_tx.send(context::current()).unwrap();
            let lsn = log.append(b"three").unwrap();
            let _ = tx.send(log.commit(lsn));
        }
    });
    let waiter = task_rx.recv().unwrap();
    wait_blocked(&waiter, BlockingStatus::Condvar { name: COMMIT_POINT });
    go.send(()).unwrap();
    wait_until("the panicking committer's thread ends", || {
        committer.is_finished()
    });
    assert!(committer.join().is_err(), "the panic goes on in its thread");
    let e = rx
        .recv_timeout(common::PATIENCE)
        .expect("the commit waiting for the batch whose committer panicked returns")
        .unwrap_err();
    assert!(
        matches!(
            e,
            LogError::Poisoned {
                first_unacked: 2,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("panicked"), "{e}");
    assert!(matches!(
        log.append(b"four"),
        Err(LogError::Poisoned { .. })
    ));
    assert_eq!(log.durable_lsn(), 1);
    drop(log);
    let (log, rec) = open(&dev, &small_cfg());
    assert_eq!(rec.records, [(1, b"one".to_vec())]);
    log.append_commit(b"works again").unwrap();
}

#[test]
fn a_device_whose_flushes_fail_cannot_open_a_log() {
    let faults = FaultConfig {
        flush_error_rate: 1.0,
        ..FaultConfig::default()
    };
    let dev: Arc<dyn Device> = Arc::new(FaultyDevice::new(mem(1 << 20), faults).unwrap());
    let e = try_open(&dev, &small_cfg()).unwrap_err();
    assert!(matches!(e, LogError::Io { .. }), "{e}");
    assert!(e.to_string().contains("formatting the log"), "{e}");
    assert!(
        e.source().unwrap().to_string().contains("injected"),
        "{e:?}"
    );
}

/// Holds each flush for a seeded random time before passing it on, like a
/// drive whose cache flush takes a while. This widens the window in which
/// a batch is written but not yet durable, where a power cut drops or tears
/// it (without it, the window is a few microseconds and no cut lands there).
struct SlowFlush {
    inner: Arc<dyn Device>,
    rng: Mutex<SmallRng>,
    /// Flushes being held now.
    held: Arc<AtomicU64>,
}

/// The longest a [`SlowFlush`] holds a flush.
const FLUSH_DELAY_MAX_US: u64 = 300;

impl SlowFlush {
    fn new(inner: Arc<dyn Device>, seed: u64) -> Arc<SlowFlush> {
        let rng = Mutex::new(SmallRng::seed_from_u64(seed));
        let held = Arc::new(AtomicU64::new(0));
        Arc::new(SlowFlush { inner, rng, held })
    }
}

impl Device for SlowFlush {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }

    fn submit(&self, cmd: Command, done: Completer) {
        if cmd.op != Op::Flush {
            return self.inner.submit(cmd, done);
        }
        let delay = Duration::from_micros(self.rng.lock().gen_range(0..=FLUSH_DELAY_MAX_US));
        let (inner, held) = (self.inner.clone(), self.held.clone());
        held.fetch_add(1, Ordering::SeqCst);
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            held.fetch_sub(1, Ordering::SeqCst);
            inner.submit(cmd, done);
        });
    }
}

/// A device the crash scenario can cut and restart.
trait Cuttable: Send + Sync {
    /// The device the log runs on: the cuttable one behind a [`SlowFlush`].
    fn slow(&self) -> &Arc<SlowFlush>;
    fn cut(&self);
    fn restart(&self);

    fn device(&self) -> Arc<dyn Device> {
        self.slow().clone()
    }
}

struct Sim(Arc<SimDevice>, Arc<SlowFlush>);

impl Cuttable for Sim {
    fn slow(&self) -> &Arc<SlowFlush> {
        &self.1
    }
    fn cut(&self) {
        self.0.power_cut().unwrap();
    }
    fn restart(&self) {
        self.0.restart();
    }
}

struct Faulty(Arc<FaultyDevice>, Arc<SlowFlush>);

impl Cuttable for Faulty {
    fn slow(&self) -> &Arc<SlowFlush> {
        &self.1
    }
    fn cut(&self) {
        self.0.power_cut().unwrap();
    }
    fn restart(&self) {
        self.0.restart();
    }
}

/// What the workload did before the cut.
#[derive(Default)]
struct History {
    appended: BTreeMap<Lsn, Vec<u8>>,
    /// Every record up to this one was acknowledged (`commit(last)` is Ok
    /// only once everything up to `last` is durable).
    acked_upto: Lsn,
}

/// Two appenders commit seeded records (1-3 per commit) and a checkpointer
/// truncates behind them, until the power is cut after a seeded time of up
/// to `cut_max_us`, for three seeds in four at a moment a batch is written
/// but its flush is not done (the window a cut drops or tears it in).
/// Returns the history and the highest truncation point started / done.
fn crash_workload(
    log: Arc<Log>,
    dev: &dyn Cuttable,
    seed: u64,
    cut_max_us: u64,
) -> (History, Lsn, Lsn) {
    let history = Arc::new(Mutex::new(History::default()));
    let (started, done) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let stop = Arc::new(AtomicBool::new(false));
    let appenders: Vec<_> = (0..2u64)
        .map(|t| {
            let (log, history) = (log.clone(), history.clone());
            std::thread::spawn(move || {
                // One foreground appender, whose commits write their own
                // batches (`committer_writes`), one background, whose
                // records the log writer writes: batches of both, and
                // mixed ones, are cut.
                if t == 0 {
                    context::set_foreground();
                }
                let mut rng = SmallRng::seed_from_u64(seed ^ ((t + 1) * 0x9E37));
                'run: loop {
                    let mut last = 0;
                    for _ in 0..rng.gen_range(1..=3) {
                        // Mostly a few sectors (a tear cuts through one),
                        // sometimes several blocks.
                        let len = match rng.gen_ratio(1, 8) {
                            true => rng.gen_range(4000..=12_000),
                            false => rng.gen_range(0..=3000),
                        };
                        let p: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                        let Ok(lsn) = log.append(&p) else { break 'run };
                        history.lock().appended.insert(lsn, p);
                        last = lsn;
                    }
                    if log.commit(last).is_err() {
                        break;
                    }
                    let mut h = history.lock();
                    h.acked_upto = h.acked_upto.max(last);
                }
            })
        })
        .collect();
    let checkpointer = {
        let (log, started, done, stop) = (log.clone(), started.clone(), done.clone(), stop.clone());
        std::thread::spawn(move || {
            log.register_space_helper(context::current());
            while !stop.load(Ordering::SeqCst) {
                // Keeps the last ones live (a cut must not lose them) while
                // the ring is at most half full, else drops everything
                // durable. That cannot stall: the writer waits only when
                // used > ring - 2 * batch_bytes_max (a batch and its wrap
                // waste), an appender only when used > ring - pending max -
                // a record, and with crash_cfg both are above half the ring.
                let stats = log.stats();
                let keep = match stats.used_bytes * 2 > stats.capacity_bytes {
                    true => 0,
                    false => CHECKPOINT_KEEP,
                };
                let upto = log.durable_lsn().saturating_sub(keep);
                started.fetch_max(upto, Ordering::SeqCst);
                if log.truncate(upto).is_err() {
                    break;
                }
                done.fetch_max(upto, Ordering::SeqCst);
                std::thread::sleep(Duration::from_micros(300));
            }
        })
    };
    let mut rng = SmallRng::seed_from_u64(seed);
    std::thread::sleep(Duration::from_micros(rng.gen_range(0..cut_max_us)));
    if rng.gen_ratio(3, 4) {
        let held = &dev.slow().held;
        wait_until("a flush is held", || held.load(Ordering::SeqCst) > 0);
    }
    dev.cut();
    for a in appenders {
        a.join().unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    checkpointer.join().unwrap();
    let h = std::mem::take(&mut *history.lock());
    (
        h,
        started.load(Ordering::SeqCst),
        done.load(Ordering::SeqCst),
    )
}

/// Every acknowledged record after the last truncation started is
/// recovered, byte for byte; what is recovered is a run of consecutive
/// appended records (nothing after a lost or torn one).
fn check_recovery(h: &History, rec: &Recovery, started: Lsn, done: Lsn) -> Result<(), String> {
    if let Tail::Corrupt { .. } = rec.tail {
        return Err(format!("a power cut is never corruption: {:?}", rec.tail));
    }
    let head_max = started + 1;
    if rec.head_lsn <= done || (rec.head_lsn > head_max && !rec.records.is_empty()) {
        return Err(format!(
            "head {} outside the truncations (done {done}, started {started})",
            rec.head_lsn
        ));
    }
    for (i, (lsn, bytes)) in rec.records.iter().enumerate() {
        if *lsn != rec.head_lsn + i as u64 {
            return Err(format!("LSN {lsn} at position {i}: not consecutive"));
        }
        match h.appended.get(lsn) {
            Some(p) if p == bytes => {}
            Some(_) => return Err(format!("record {lsn} recovered with other bytes")),
            None => return Err(format!("record {lsn} recovered but never appended")),
        }
    }
    let end = rec.head_lsn + rec.records.len() as u64;
    if rec.next_lsn != end {
        return Err(format!(
            "next LSN {} after records ending at {end}",
            rec.next_lsn
        ));
    }
    // The acknowledged records after `started` must all be recovered.
    let must = started + 1..=h.acked_upto;
    let recovered = rec.head_lsn..end;
    match must.is_empty() || (recovered.contains(must.start()) && recovered.contains(must.end())) {
        true => Ok(()),
        false => Err(format!(
            "acknowledged records {must:?} not all recovered (recovered {recovered:?}, {:?})",
            rec.tail
        )),
    }
}

/// Records the crash workload's checkpointer keeps behind the durable LSN.
const CHECKPOINT_KEEP: u64 = 20;

/// Seeds per device kind.
const CRASH_SEEDS: u64 = 40;

/// Whether all seeds run (then the torn-tail count is checked: about 10
/// of the 120 cuts tear the last batch through a record).
fn all_seeds() -> bool {
    std::env::var("SEED").is_err()
}

fn crash_cfg() -> LogConfig {
    // See the checkpointer in `crash_workload` for how these relate.
    LogConfig {
        region_offset_bytes: 16 * KIB,
        region_bytes: 256 * KIB,
        batch_bytes_max: 32 * KIB,
        record_bytes_max: 12 * KIB,
        pending_bytes_max: 64 * KIB,
        allow_corrupt_truncate: false,
        ..LogConfig::default()
    }
}

/// Aborts the process (a hang cannot fail a test otherwise) unless
/// dropped within [`common::PATIENCE`].
struct Watchdog(Option<mpsc::Sender<()>>);

impl Watchdog {
    fn arm(what: String) -> Watchdog {
        let (tx, rx) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(common::PATIENCE) {
                eprintln!("{what}");
                std::process::abort();
            }
        });
        Watchdog(Some(tx))
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Disconnecting the channel disarms it.
        self.0.take();
    }
}

/// Cuts per seed: each round runs the workload on the log the previous
/// round recovered, on the same media (stale laps, torn bytes and records
/// of earlier incarnations included).
const CRASH_ROUNDS: u64 = 3;

/// Runs the crash workload over the seeds (`SEED=n`: that one only);
/// returns how many cuts left a torn tail.
fn crash_scenario(what: &str, cut_max_us: u64, make: impl Fn(u64) -> Box<dyn Cuttable>) -> u32 {
    let seeds: Vec<u64> = match std::env::var("SEED").ok().and_then(|s| s.parse().ok()) {
        Some(seed) => vec![seed],
        None => (1..=CRASH_SEEDS).collect(),
    };
    let cfg = crash_cfg();
    let (mut acked, mut torn, mut laps) = (0, 0, 0);
    for seed in seeds {
        let _watchdog = Watchdog::arm(format!("{what}: hung; reproduce with SEED={seed}"));
        let dev = make(seed);
        let (mut log, _) = open(&dev.device(), &cfg);
        // Records up to here were replayed and checkpointed.
        let mut floor = 0;
        for round in 0..CRASH_ROUNDS {
            let fail = |e: String| -> ! {
                panic!("{what}: round {round}: {e}; reproduce with SEED={seed}")
            };
            let shared = Arc::new(log);
            let (h, started, done) =
                crash_workload(shared.clone(), &*dev, seed * 16 + round, cut_max_us);
            laps += shared.stats().bytes_written / (cfg.region_bytes - BLOCK);
            drop(Arc::into_inner(shared).expect("the workload's threads are done"));
            dev.restart();
            let (l, rec) = try_open(&dev.device(), &cfg)
                .unwrap_or_else(|e| fail(format!("reopen failed: {e}")));
            if let Err(e) = check_recovery(&h, &rec, started.max(floor), done.max(floor)) {
                fail(e);
            }
            acked += h.acked_upto.saturating_sub(started.max(floor));
            torn += u32::from(matches!(rec.tail, Tail::Torn { .. }));
            // As an engine does: replay, checkpoint (the ring may be full).
            floor = rec.next_lsn - 1;
            l.truncate(floor)
                .unwrap_or_else(|e| fail(format!("checkpoint failed: {e}")));
            log = l;
        }
        let next = log.append_commit(b"after the cuts");
        assert_eq!(
            next.ok(),
            Some(floor + 1),
            "{what}: reproduce with SEED={seed}"
        );
    }
    eprintln!("{what}: {acked} acknowledged records checked, {torn} torn tails, {laps} ring laps");
    assert!(
        acked > 0,
        "{what}: no record was acknowledged before the cuts"
    );
    torn
}

#[test]
fn sim_ssd_power_cuts_lose_no_acknowledged_record() {
    let torn = crash_scenario("sim-ssd", 60_000, |seed| {
        let config = SimConfig {
            speedup: 10.0,
            torn_writes: seed % 4 != 0,
            ..SimConfig::ssd(1 << 20, seed)
        };
        let sim = Arc::new(SimDevice::new(config).unwrap());
        let dev = SlowFlush::new(sim.clone(), seed);
        Box::new(Sim(sim, dev))
    });
    assert!(
        !all_seeds() || torn >= 3,
        "too few torn tails ({torn}) to test them"
    );
}

#[test]
fn faulty_power_cuts_lose_no_acknowledged_record() {
    let torn = crash_scenario("faulty(mem)", 30_000, |seed| {
        let faults = FaultConfig {
            seed,
            torn_writes: seed % 4 != 0,
            ..FaultConfig::default()
        };
        let faulty = Arc::new(FaultyDevice::new(mem(1 << 20), faults).unwrap());
        let dev = SlowFlush::new(faulty.clone(), seed);
        Box::new(Faulty(faulty, dev))
    });
    assert!(
        !all_seeds() || torn >= 3,
        "too few torn tails ({torn}) to test them"
    );
}

/// Releases every command that reaches the gate until `done`.
fn release_until(gate: &GateDevice, done: impl Fn() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "still not done after releasing the gate for 60 s"
        );
        gate.release_all();
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A log of `small_cfg()` on a gated device, opened with the gate
/// released.
fn gated_log() -> (Arc<GateDevice>, LogConfig, Arc<Log>) {
    gated_log_with(small_cfg())
}

fn gated_log_with(cfg: LogConfig) -> (Arc<GateDevice>, LogConfig, Arc<Log>) {
    let gate = GateDevice::new(32);
    let dev: Arc<dyn Device> = gate.clone();
    let log = Arc::new(pumped(&gate, || open(&dev, &cfg).0));
    (gate, cfg, log)
}

/// Runs `f` on a thread while releasing every command that reaches the
/// gate.
fn pumped<T: Send>(gate: &GateDevice, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        let h = s.spawn(f);
        release_until(gate, || h.is_finished());
        h.join().unwrap()
    })
}

/// Paper 000's journaling case: a background commit keeps the log writer
/// busy at the device; a foreground commit arrives; the writer inherits
/// (it is the commit condvar's helper), so its next I/O is critical.
#[test]
fn a_foreground_commit_makes_the_busy_log_writer_critical() {
    let (gate, cfg, log) = gated_log();
    let writer = log.writer_task().clone();
    let critical_waits = || {
        critio::metrics::global()
            .wait_histogram(COMMIT_POINT, Class::Critical)
            .count()
    };
    let waits_before = critical_waits();
    let n0 = gate.arrivals().len();
    let data = ring_offset(&cfg, 0);

    let background = {
        let log = log.clone();
        std::thread::spawn(move || log.append_commit(b"background").unwrap())
    };
    gate.wait_arrivals(n0 + 1);
    assert_eq!(gate.arrivals()[n0], (data, Class::NonCritical));
    assert!(!writer.is_critical(), "a background commit does not boost");

    let (tx, rx) = mpsc::channel();
    let foreground = {
        let log = log.clone();
        std::thread::spawn(move || {
            context::set_foreground();
            tx.send(context::current()).unwrap();
            log.append_commit(b"foreground").unwrap()
        })
    };
    let fg = rx.recv().unwrap();
    wait_blocked(&fg, BlockingStatus::Condvar { name: COMMIT_POINT });
    wait_until("the log writer inherits", || writer.is_critical());
    // The batch reached the gate when it was submitted; the writer says it
    // waits for it a moment later, when it calls `wait` (a loaded machine
    // can preempt it in between).
    wait_until("the writer is blocked on its batch write", || {
        matches!(writer.blocking_status(), Some(BlockingStatus::Io { .. }))
    });
    assert!(!writer.is_foreground());

    // Release the background batch: its flush is issued by the critical
    // writer; then the foreground batch's write and flush, by the
    // foreground committer itself (`committer_writes`).
    release_until(&gate, || {
        foreground.is_finished() && background.is_finished()
    });
    assert_eq!(background.join().unwrap(), 1);
    assert_eq!(foreground.join().unwrap(), 2);
    assert_eq!(
        gate.arrivals()[n0 + 1..],
        [
            (0, Class::Critical),
            (data + BLOCK, Class::Critical),
            (0, Class::Critical)
        ],
        "the flush, write and flush of a critical writer"
    );
    assert_eq!(log.stats().committer_batches, 1, "{:?}", log.stats());
    wait_until("the writer is non-critical again", || !writer.is_critical());
    assert!(
        critical_waits() > waits_before,
        "a critical commit wait was recorded"
    );
}

/// Appends `payload` from a foreground thread that does not commit it.
/// Appends `body(lsn, len)` for each of `lsns` from a foreground task that
/// leaves them to a commit (its appends do not call the writer); returns
/// the last LSN.
fn append_bodies_in_foreground(
    log: &Arc<Log>,
    lsns: std::ops::RangeInclusive<Lsn>,
    len: usize,
) -> Lsn {
    let log = log.clone();
    std::thread::spawn(move || {
        context::set_foreground();
        lsns.fold(0, |_, lsn| log.append(&body(lsn, len)).unwrap())
    })
    .join()
    .unwrap()
}

fn append_in_foreground(log: &Arc<Log>, payload: &'static [u8]) -> Lsn {
    let log = log.clone();
    std::thread::spawn(move || {
        context::set_foreground();
        log.append(payload).unwrap()
    })
    .join()
    .unwrap()
}

/// `committer_writes` (the default): a foreground task's records wait for
/// its commit, which writes them, and every record before them, as one
/// batch in its own thread: critical, with no hand-off to the log writer
/// (which stays idle throughout).
#[test]
fn a_foreground_commit_writes_its_batch_in_its_own_thread() {
    let (gate, cfg, log) = gated_log();
    let writer = log.writer_task().clone();
    let data = ring_offset(&cfg, 0);
    let n0 = gate.arrivals().len();
    let (tx, rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let foreground = {
        let log = log.clone();
        std::thread::spawn(move || {
            context::set_foreground();
            let lsns: Vec<Lsn> = (0..3).map(|i| log.append(&body(i, 100)).unwrap()).collect();
            tx.send(context::current()).unwrap();
            go_rx.recv().unwrap();
            log.commit(lsns[2]).unwrap();
            lsns
        })
    };
    let fg = rx.recv().unwrap();
    assert_eq!(log.next_lsn(), 4);
    // (It may still be on its way to sleep after the open.)
    wait_blocked(
        &writer,
        BlockingStatus::Condvar {
            name: WRITER_IDLE_POINT,
        },
    );
    assert_eq!(
        gate.arrivals().len(),
        n0,
        "nothing written before the commit"
    );
    go_tx.send(()).unwrap();
    wait_until("the committer blocks in its own batch write", || {
        matches!(fg.blocking_status(), Some(BlockingStatus::Io { .. }))
    });
    assert_eq!(gate.arrivals()[n0], (data, Class::Critical));
    assert_eq!(
        writer.blocking_status(),
        Some(BlockingStatus::Condvar {
            name: WRITER_IDLE_POINT
        }),
        "the writer is not involved"
    );
    release_until(&gate, || foreground.is_finished());
    assert_eq!(foreground.join().unwrap(), vec![1, 2, 3]);
    assert_eq!(
        gate.arrivals()[n0 + 1..],
        [(0, Class::Critical)],
        "its flush"
    );
    let stats = log.stats();
    assert_eq!(
        (stats.batches, stats.committer_batches, stats.records),
        (1, 1, 3),
        "{stats:?}"
    );
    assert_eq!(log.durable_lsn(), 3);
}

/// A record a foreground task appended, committed by someone else (a
/// background task: a checkpointer truncating past it, say), is written
/// by the log writer, which that commit wakes; and with
/// `committer_writes` off, the writer writes every batch.
#[test]
fn a_foreground_record_another_task_commits_is_written_by_the_writer() {
    for committer_writes in [true, false] {
        let dev = mem(1 << 20);
        let cfg = LogConfig {
            committer_writes,
            ..small_cfg()
        };
        let log = Arc::new(open(&dev, &cfg).0);
        let lsn = append_in_foreground(&log, b"foreground, not committed");
        let (tx, rx) = mpsc::channel();
        {
            let log = log.clone();
            std::thread::spawn(move || tx.send(log.commit(lsn)).unwrap());
        }
        let committed = rx.recv_timeout(Duration::from_secs(30));
        assert!(
            matches!(committed, Ok(Ok(()))),
            "committer_writes {committer_writes}: the background commit returned {committed:?}"
        );
        let stats = log.stats();
        assert_eq!(
            (stats.batches, stats.committer_batches),
            (1, 0),
            "committer_writes {committer_writes}: {stats:?}"
        );
        // A foreground commit with the option off waits for the writer.
        let fg = {
            let log = log.clone();
            std::thread::spawn(move || {
                context::set_foreground();
                log.append_commit(b"foreground, committed").unwrap()
            })
        };
        assert_eq!(fg.join().unwrap(), lsn + 1);
        let want = u64::from(committer_writes);
        assert_eq!(log.stats().committer_batches, want, "{:?}", log.stats());
    }
}

/// The same while a batch is in flight: the background commit of a
/// foreground record waits for the next batch, and the writer, told it is
/// needed, takes it once the batch in flight is done.
#[test]
fn a_background_commit_of_a_foreground_record_behind_a_batch_in_flight_completes() {
    let (gate, _cfg, log) = gated_log();
    let n0 = gate.arrivals().len();
    let first = {
        let log = log.clone();
        std::thread::spawn(move || log.append_commit(b"background").unwrap())
    };
    gate.wait_arrivals(n0 + 1); // its write is held
    let lsn = append_in_foreground(&log, b"foreground, not committed");
    let (tx, rx) = mpsc::channel();
    let committer = {
        let log = log.clone();
        std::thread::spawn(move || {
            tx.send(context::current()).unwrap();
            log.commit(lsn).unwrap()
        })
    };
    let task = rx.recv().unwrap();
    wait_blocked(&task, BlockingStatus::Condvar { name: COMMIT_POINT });
    release_until(&gate, || first.is_finished() && committer.is_finished());
    assert_eq!(first.join().unwrap(), 1);
    committer.join().unwrap();
    let stats = log.stats();
    assert_eq!(
        (stats.batches, stats.committer_batches),
        (2, 0),
        "{stats:?}"
    );
}

/// Records admitted to a nearly full ring (by their unpadded size) may not
/// fit once batched (each batch padded to whole blocks): then the writer
/// waits for space that only a truncation frees, and a truncation past
/// them first drops the records already durable instead of waiting for
/// them forever.
#[test]
fn a_truncation_past_records_the_full_ring_cannot_place_drops_the_durable_ones_first() {
    let dev = mem(1 << 20);
    let cfg = LogConfig {
        region_offset_bytes: 0,
        region_bytes: 64 * KIB, // 15 ring blocks
        batch_bytes_max: 8 * KIB,
        record_bytes_max: 4000,
        pending_bytes_max: 28 * KIB,
        ..LogConfig::default()
    };
    let log = Arc::new(open(&dev, &cfg).0);
    for lsn in 1..=11 {
        log.append_commit(&body(lsn, 3000)).unwrap(); // a block each
    }
    assert_eq!(log.stats().used_bytes, 11 * BLOCK);
    // Seven records of 2104 encoded bytes, 14728 of the 16384 bytes free,
    // appended by a foreground task that leaves them to its commit. As
    // batches of three (two blocks), three (two) and one (one), they need
    // five blocks of the four.
    let last = append_bodies_in_foreground(&log, 12..=18, 2080);
    assert_eq!(last, 18);
    let (tx, rx) = mpsc::channel();
    {
        let log = log.clone();
        std::thread::spawn(move || tx.send(log.commit(last)).unwrap());
    }
    wait_blocked(
        log.writer_task(),
        BlockingStatus::Condvar { name: SPACE_POINT },
    );
    assert_eq!(log.stats().used_bytes, 15 * BLOCK, "two batches placed");
    assert_eq!(log.durable_lsn(), 17);
    // The checkpointer's truncation past the last record.
    let (ttx, trx) = mpsc::channel();
    {
        let log = log.clone();
        std::thread::spawn(move || ttx.send(log.truncate(last)).unwrap());
    }
    let truncated = trx.recv_timeout(Duration::from_secs(30));
    assert!(matches!(truncated, Ok(Ok(()))), "{truncated:?}");
    let committed = rx.recv_timeout(Duration::from_secs(30));
    assert!(matches!(committed, Ok(Ok(()))), "{committed:?}");
    assert_eq!((log.durable_lsn(), log.head_lsn()), (18, 19));
    assert_eq!(
        log.stats().truncations,
        2,
        "the durable part, then the rest"
    );
}

/// Records let in by their size that need more than the whole ring once
/// batched (each alone in a batch, padded to a block): a truncation past
/// them all does not wait for them with the durable ones still in the
/// ring, where the writer waits for the space only it could free; it
/// drops what is durable each time a batch becomes durable.
#[test]
fn a_truncation_past_more_records_than_the_ring_holds_once_batched_completes() {
    let dev = mem(1 << 20);
    let cfg = LogConfig {
        region_offset_bytes: 0,
        region_bytes: 64 * KIB, // 15 ring blocks, 61440 bytes
        batch_bytes_max: 4 * KIB,
        record_bytes_max: 2100,
        pending_bytes_max: 60 * KIB,
        ..LogConfig::default()
    };
    let log = Arc::new(open(&dev, &cfg).0);
    // 29 records of 2104 encoded bytes (61016 of 61440): all let in, and
    // one per 4 KiB batch they need 29 ring blocks of the 15. Appended by
    // a foreground task that leaves them to a commit (the writer is not
    // called).
    let last = append_bodies_in_foreground(&log, 1..=29, 2080);
    assert_eq!(last, 29);
    let (tx, rx) = mpsc::channel();
    {
        let log = log.clone();
        std::thread::spawn(move || tx.send(log.truncate(last)).unwrap());
    }
    let truncated = rx.recv_timeout(Duration::from_secs(30));
    assert!(
        matches!(truncated, Ok(Ok(()))),
        "{truncated:?}: durable {}, head {}, writer {:?}",
        log.durable_lsn(),
        log.head_lsn(),
        log.writer_task().blocking_status()
    );
    assert_eq!((log.durable_lsn(), log.head_lsn()), (29, 30));
    drop(log);
    let (log, rec) = open(&dev, &cfg);
    assert_eq!(rec.records.len(), 0, "every record was truncated");
    assert_eq!(log.append_commit(b"after").unwrap(), 30);
}

/// A background task that leads a commit while it inherits criticality
/// (through an event a foreground task waits on) writes the batch of a
/// foreground record critical, and keeps it critical to the end of the
/// flush after its inheritance ends: a foreground commit waiting for that
/// batch boosts the log writer, not the task writing it.
#[test]
fn a_batch_led_by_an_inheriting_task_stays_critical_when_its_inheritance_ends() {
    let (gate, cfg, log) = gated_log();
    let data = ring_offset(&cfg, 0);
    let lsn = append_in_foreground(&log, b"foreground");
    let ev = Arc::new(critio::sync::Event::named("test: helped"));
    let (task_tx, task_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let background = {
        let log = log.clone();
        std::thread::spawn(move || {
            task_tx.send(context::current()).unwrap();
            go_rx.recv().unwrap();
            log.commit(lsn).unwrap()
        })
    };
    let task = task_rx.recv().unwrap();
    ev.register_helper(task.clone());
    let helped = {
        let ev = ev.clone();
        std::thread::spawn(move || {
            context::set_foreground();
            ev.wait_timeout(Duration::from_secs(60));
        })
    };
    wait_until("the background task inherits", || task.is_critical());
    let n0 = gate.arrivals().len();
    go_tx.send(()).unwrap();
    gate.wait_arrivals(n0 + 1);
    let written = gate.arrivals()[n0];
    // Its inheritance ends while its write is at the device (the waiter
    // it helped has left its wait when it returns).
    ev.set();
    helped.join().unwrap();
    let (fg_tx, fg_rx) = mpsc::channel();
    let foreground = {
        let log = log.clone();
        std::thread::spawn(move || {
            context::set_foreground();
            fg_tx.send(context::current()).unwrap();
            log.commit(lsn).unwrap()
        })
    };
    let waiter = fg_rx.recv().unwrap();
    wait_blocked(&waiter, BlockingStatus::Condvar { name: COMMIT_POINT });
    release_until(&gate, || {
        background.is_finished() && foreground.is_finished()
    });
    background.join().unwrap();
    foreground.join().unwrap();
    assert_eq!(written, (data, Class::Critical), "the write, led critical");
    assert_eq!(
        gate.arrivals()[n0 + 1..],
        [(0, Class::Critical)],
        "the flush a foreground commit waits for"
    );
}

/// A batch holding a record a critical task appended is written critical
/// from the start, before that task reaches its commit wait (without
/// `committer_writes` the writer usually takes the batch first); a batch of
/// background records is not.
#[test]
fn a_batch_a_critical_task_appended_to_is_written_critical_before_anyone_waits() {
    let (gate, cfg, log) = gated_log_with(LogConfig {
        committer_writes: false,
        ..small_cfg()
    });
    let data = ring_offset(&cfg, 0);
    let n0 = gate.arrivals().len();

    let lsn = {
        let log = log.clone();
        std::thread::spawn(move || {
            context::set_foreground();
            log.append(b"foreground").unwrap() // no commit: nobody waits
        })
        .join()
        .unwrap()
    };
    gate.wait_arrivals(n0 + 1);
    let written = gate.arrivals()[n0];
    // Released before asserting, so a failure does not leave the writer
    // stuck at the gate.
    pumped(&gate, || log.commit(lsn).unwrap());
    assert_eq!(
        written,
        (data, Class::Critical),
        "the write of a critical task's record, with nobody waiting for it"
    );
    assert_eq!(gate.arrivals()[n0 + 1], (0, Class::Critical), "its flush");

    let n1 = gate.arrivals().len();
    let background = {
        let log = log.clone();
        std::thread::spawn(move || log.append_commit(b"background").unwrap())
    };
    gate.wait_arrivals(n1 + 1);
    let written = gate.arrivals()[n1];
    release_until(&gate, || background.is_finished());
    assert_eq!(
        written,
        (data + BLOCK, Class::NonCritical),
        "a batch of background records stays background"
    );
    assert_eq!(background.join().unwrap(), lsn + 1);
}
