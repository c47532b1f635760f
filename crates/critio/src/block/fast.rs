//! The block layer's fast path: critical requests sent while the core has
//! nothing queued, with no call into the core and no lock.
//!
//! A critical request that its submitter does in its own thread, on a
//! layer with nothing queued, is one the core would send at once
//! ([`Scheduler::submit_direct`](super::sched::Scheduler::submit_direct)):
//! all it asks of the core is a slot and room at the device, and all it
//! gives back is accounting. Taking the core lock twice for that (to
//! submit, to complete) was most of what the layer cost such a request,
//! and a foreground request that finds the lock held by a background
//! dispatcher waits for it. So the core hands out that room in advance:
//!
//! ```text
//!  gate (one atomic word): open | epoch | non-critical at the device | limit | count
//!
//!  request:  enter  (CAS count+1 while open and count < limit) ── else: the locked path
//!            device (in the caller's thread)
//!            leave  (CAS count-1 while open in the same epoch)
//!               ├─ left: push a record of it to the ring (what the core never saw),
//!               │        or, untimed and no write, add it to the untimed tally
//!               └─ the epoch ended: the core adopted it; complete it through the core
//!  core lock (every holder, first thing): close the gate (epoch + 1, count 0),
//!            adopt the count still at the device, fold in the ring's records
//!            and the untimed tally;
//!            on unlock by a critical thread: reopen with the room the core
//!            has left, if nothing is queued
//! ```
//!
//! While the gate is open the core does not change (every change is made
//! under its lock, which closes the gate first), so what the room was
//! computed from stays true until the epoch ends: the slots and device
//! room the open epoch's requests take are exactly the limit's, and the
//! non-critical requests beside each are the epoch's. The ring's records
//! and the untimed tally are folded in before any decision the core makes:
//! the adaptive cap sees every critical sample before it next decides, the
//! stats before they are read.
//!
//! Timing: a request's device time needs two clock reads (about 20 ns on
//! this project's virtual machine). On a device that answers within
//! [`FAST_UNTIMED_BELOW`] on average (memory) that is a tenth of the
//! request, so there one fast-path request in [`FAST_TIME_EVERY`] is timed
//! and the others are only counted; on any slower device every one is.
//! An untimed read or flush leaves nothing the core needs one by one (a
//! count and its bytes; the adaptive cap only learns that critical traffic
//! is there), so it is added to one atomic tally instead of taking a place
//! in the ring: one atomic add in place of a push and a pop.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crossbeam_queue::ArrayQueue;

use super::sched::{FastRoom, FAST_TIME_EVERY, FAST_UNTIMED_BELOW};
use crate::device::Op;
use crate::time::Nanos;

// The gate's word: open (1 bit) | epoch (39) | non-critical at the device
// (4, saturating: the cap asks only whether any was) | limit (10) |
// count (10). An epoch ends at each close of an open gate; 39 bits do not
// wrap while a request is at the device (a million reopenings a second
// would take six days).
const OPEN: u64 = 1 << 63;
const EPOCH_SHIFT: u32 = 24;
const EPOCH_MASK: u64 = (1 << 39) - 1;
const NC_SHIFT: u32 = 20;
const NC_MAX: u32 = 0xF;
const LIMIT_SHIFT: u32 = 10;
/// The most fast-path requests at the device at once (the gate's count
/// field); beyond it requests take the locked path.
pub(super) const LIMIT_MAX: u32 = 0x3FF;
const COUNT_MASK: u64 = 0x3FF;

/// Records of fast-path requests the core has not folded in yet. A lock
/// holder folds them all (a few microseconds at most, with the gate
/// closed); a request that finds the ring full takes the lock to do it.
const RING: usize = 128;

// The untimed tally's word: bytes (high 44 bits) | requests (low 20). A
// request that brings it to UNTIMED_FOLD takes the core lock to fold it
// in, as does every one after it until that is done, so the count passes
// the fold mark by at most the threads adding at once, far below 2^20,
// and the bytes by that many times IO_LEN_MAX (2^23), far below 2^44.
const UNTIMED_COUNT_BITS: u32 = 20;
const UNTIMED_COUNT_MASK: u64 = (1 << UNTIMED_COUNT_BITS) - 1;
const UNTIMED_FOLD: u64 = 1024;

fn epoch(w: u64) -> u64 {
    (w >> EPOCH_SHIFT) & EPOCH_MASK
}

fn count(w: u64) -> u32 {
    (w & COUNT_MASK) as u32
}

fn limit(w: u64) -> u32 {
    ((w >> LIMIT_SHIFT) & COUNT_MASK) as u32
}

/// A fast-path request's pass through the gate.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ticket {
    epoch: u64,
    /// The room it went through: what its completion needs if the core
    /// adopts it.
    pub(super) room: FastRoom,
}

/// A fast-path request completed in its epoch: what the core folds in.
#[derive(Clone, Copy, Debug)]
pub(super) struct Record {
    pub(super) op: Op,
    pub(super) len: u64,
    /// Dispatched and completed, if it was timed.
    pub(super) times: Option<(Nanos, Nanos)>,
    pub(super) nc_inflight: u32,
}

/// The gate, the ring and the timing policy.
pub(super) struct FastPath {
    gate: AtomicU64,
    /// The open epoch's count of non-critical requests sent so far (used
    /// only by a request the core adopts), written before the gate opens.
    nc_seq: AtomicU64,
    ring: ArrayQueue<Record>,
    /// Untimed reads and flushes completed in an epoch, not yet folded in:
    /// bytes | count (see [`UNTIMED_FOLD`]).
    untimed: AtomicU64,
    /// One fast-path request in `time_mask + 1` is timed: 0 (every one)
    /// or [`FAST_TIME_EVERY`] - 1 (a power of two less one, so a mask).
    time_mask: AtomicU32,
    /// Mean device time of timed fast-path requests, as f64 bits
    /// ([`NO_MEAN`] before the first); written under the core lock.
    mean: AtomicU64,
}

const NO_MEAN: u64 = u64::MAX;

std::thread_local! {
    /// Fast-path requests this thread sent: which to time.
    static TICK: Cell<u32> = const { Cell::new(0) };
}

impl FastPath {
    /// A closed gate (the first lock holder opens it).
    pub(super) fn new() -> Self {
        Self {
            gate: AtomicU64::new(0),
            nc_seq: AtomicU64::new(0),
            ring: ArrayQueue::new(RING),
            untimed: AtomicU64::new(0),
            time_mask: AtomicU32::new(0),
            mean: AtomicU64::new(NO_MEAN),
        }
    }

    /// Takes a place at the device, if the gate is open and has room.
    pub(super) fn enter(&self) -> Option<Ticket> {
        let mut w = self.gate.load(Ordering::Acquire);
        loop {
            if w & OPEN == 0 || count(w) >= limit(w) {
                return None;
            }
            // Read before the place is taken: once it is, the core may
            // close the epoch (adopting this request) and open the next
            // with a later count, which would hide the background sent in
            // between from its sample. `w`'s epoch wrote it before opening
            // (Release), and a later epoch's value (Acquire) would mean
            // the gate changed since `w`, failing the swap.
            let nc_seq = self.nc_seq.load(Ordering::Acquire);
            match self
                .gate
                .compare_exchange_weak(w, w + 1, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => {
                    #[cfg(test)]
                    tests::after_enter();
                    return Some(Ticket {
                        epoch: epoch(w),
                        room: FastRoom {
                            limit: limit(w),
                            nc_inflight: ((w >> NC_SHIFT) & u64::from(NC_MAX)) as u32,
                            nc_seq,
                        },
                    });
                }
                Err(now) => w = now,
            }
        }
    }

    /// Gives the place back. False if the epoch it entered in has ended:
    /// the core adopted the request, which must then complete through it.
    pub(super) fn leave(&self, t: &Ticket) -> bool {
        let mut w = self.gate.load(Ordering::Acquire);
        loop {
            if w & OPEN == 0 || epoch(w) != t.epoch {
                return false;
            }
            debug_assert!(count(w) > 0);
            match self
                .gate
                .compare_exchange_weak(w, w - 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => w = now,
            }
        }
    }

    /// Under the core lock: ends the epoch. Returns how many of its
    /// requests are still at the device (the core adopts them).
    pub(super) fn close(&self) -> u32 {
        // Only lock holders change the epoch or open the gate, so both are
        // stable here; the count may still move (enter and leave), which
        // the swap takes as it is. A closed gate's count is 0, and it
        // stays closed: nothing to do (no atomic write on a busy core).
        let w = self.gate.load(Ordering::Acquire);
        if w & OPEN == 0 {
            return 0;
        }
        let next = ((epoch(w) + 1) & EPOCH_MASK) << EPOCH_SHIFT;
        let was = self.gate.swap(next, Ordering::AcqRel);
        if was & OPEN == 0 {
            0
        } else {
            count(was)
        }
    }

    /// Under the core lock, the gate closed: opens a new epoch with the
    /// room the core has left.
    pub(super) fn open(&self, room: &FastRoom) {
        let w = self.gate.load(Ordering::Relaxed);
        debug_assert!(w & OPEN == 0 && count(w) == 0, "opened twice");
        self.nc_seq.store(room.nc_seq, Ordering::Release);
        let word = OPEN
            | (w & (EPOCH_MASK << EPOCH_SHIFT))
            | u64::from(room.nc_inflight.min(NC_MAX)) << NC_SHIFT
            | u64::from(room.limit.min(LIMIT_MAX)) << LIMIT_SHIFT;
        self.gate.store(word, Ordering::Release);
    }

    /// Whether the calling thread times its next fast-path request.
    pub(super) fn timed(&self) -> bool {
        let mask = self.time_mask.load(Ordering::Relaxed);
        mask == 0
            || TICK.with(|t| {
                let n = t.get().wrapping_add(1);
                t.set(n);
                n & mask == 0
            })
    }

    /// Adds an untimed read or flush of `len` bytes, left in its epoch, to
    /// the tally. True if the caller must now take the core lock, which
    /// folds it in.
    pub(super) fn add_untimed(&self, len: u64) -> bool {
        let before = self
            .untimed
            .fetch_add((len << UNTIMED_COUNT_BITS) | 1, Ordering::Relaxed);
        (before & UNTIMED_COUNT_MASK) + 1 >= UNTIMED_FOLD
    }

    /// Under the core lock: takes the untimed tally, (requests, bytes).
    pub(super) fn take_untimed(&self) -> (u64, u64) {
        // Nothing to take, no atomic write.
        if self.untimed.load(Ordering::Relaxed) == 0 {
            return (0, 0);
        }
        let w = self.untimed.swap(0, Ordering::Relaxed);
        (w & UNTIMED_COUNT_MASK, w >> UNTIMED_COUNT_BITS)
    }

    /// Queues a completed request's record for the core; hands it back if
    /// the ring is full.
    pub(super) fn push(&self, r: Record) -> Result<(), Record> {
        self.ring.push(r)
    }

    /// Under the core lock: the next record to fold in.
    pub(super) fn pop(&self) -> Option<Record> {
        self.ring.pop()
    }

    /// Under the core lock: a timed request's device time, for the timing
    /// policy.
    pub(super) fn note_device_time(&self, t: Nanos) {
        let mean = match self.mean.load(Ordering::Relaxed) {
            NO_MEAN => t as f64,
            bits => {
                let m = f64::from_bits(bits);
                m + (t as f64 - m) / 16.0
            }
        };
        self.mean.store(mean.to_bits(), Ordering::Relaxed);
        let mask = if mean < FAST_UNTIMED_BELOW as f64 {
            FAST_TIME_EVERY - 1
        } else {
            0
        };
        self.time_mask.store(mask, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Mutex};

    use super::*;

    type Hook = Box<dyn FnOnce()>;

    std::thread_local! {
        /// Run once in this thread just after a request takes its place.
        static AFTER_ENTER: RefCell<Option<Hook>> = const { RefCell::new(None) };
    }

    pub(super) fn after_enter() {
        if let Some(hook) = AFTER_ENTER.with(|h| h.borrow_mut().take()) {
            hook();
        }
    }

    fn room(limit: u32) -> FastRoom {
        FastRoom {
            limit,
            nc_inflight: 3,
            nc_seq: 42,
        }
    }

    #[test]
    fn a_closed_gate_lets_nothing_through_and_an_open_one_up_to_its_limit() {
        let f = FastPath::new();
        assert!(f.enter().is_none(), "closed at first");
        assert_eq!(f.close(), 0);
        f.open(&room(2));
        let a = f.enter().expect("room for two");
        let b = f.enter().expect("room for two");
        assert!(f.enter().is_none(), "the limit is two");
        assert_eq!((a.room.nc_inflight, a.room.nc_seq), (3, 42));
        assert!(f.leave(&a));
        let c = f.enter().expect("a place came free");
        assert!(f.leave(&b) && f.leave(&c));
        assert_eq!(f.close(), 0, "nothing left at the device");
        // Fields saturate: a larger room lets LIMIT_MAX through, and many
        // non-critical requests still read as some.
        f.open(&FastRoom {
            limit: 5000,
            nc_inflight: 300,
            nc_seq: 7,
        });
        let t = f.enter().unwrap();
        assert_eq!((t.room.limit, t.room.nc_inflight), (LIMIT_MAX, NC_MAX));
        assert!(f.leave(&t));
    }

    #[test]
    fn requests_at_the_device_when_the_gate_closes_are_adopted_once() {
        let f = FastPath::new();
        f.close();
        f.open(&room(4));
        let a = f.enter().unwrap();
        let b = f.enter().unwrap();
        assert!(f.leave(&a));
        assert_eq!(f.close(), 1, "b is still at the device");
        assert!(!f.leave(&b), "b's epoch ended: the core completes it");
        f.open(&room(4));
        assert!(!f.leave(&b), "nor in a later epoch");
        let c = f.enter().unwrap();
        assert_eq!(f.close(), 1);
        assert_eq!(f.close(), 0, "a closed gate adopts nothing twice");
        assert!(!f.leave(&c));
    }

    /// A request that takes its place just before the core closes the
    /// epoch and opens the next (after sending background work) carries
    /// its own epoch's room: the non-critical requests sent before it, so
    /// that, adopted, it counts the background sent since as alongside.
    #[test]
    fn a_ticket_carries_the_room_of_the_epoch_it_entered_in() {
        let f = Arc::new(FastPath::new());
        f.close();
        f.open(&room(4));
        let core = f.clone();
        AFTER_ENTER.with(|h| {
            *h.borrow_mut() = Some(Box::new(move || {
                assert_eq!(core.close(), 1, "adopted");
                core.open(&FastRoom {
                    limit: 3,
                    nc_inflight: 4,
                    nc_seq: 43,
                });
            }))
        });
        let t = f.enter().expect("open");
        assert_eq!(
            (t.room.limit, t.room.nc_inflight, t.room.nc_seq),
            (4, 3, 42),
            "the epoch it entered in"
        );
        assert!(!f.leave(&t), "adopted: the core completes it");
    }

    #[test]
    fn a_slow_device_is_timed_every_request_and_memory_one_in_sixteen() {
        let f = FastPath::new();
        assert!((0..10).all(|_| f.timed()), "every one until measured");
        f.note_device_time(80_000);
        assert!((0..10).all(|_| f.timed()));
        for _ in 0..200 {
            f.note_device_time(200);
        }
        let timed = (0..160).filter(|_| f.timed()).count();
        assert_eq!(timed, 10);
        for _ in 0..200 {
            f.note_device_time(80_000);
        }
        assert!((0..10).all(|_| f.timed()), "slow again: every one");
    }

    #[test]
    fn the_untimed_tally_counts_requests_and_bytes_and_asks_for_a_fold_when_due() {
        let f = FastPath::new();
        assert_eq!(f.take_untimed(), (0, 0), "nothing yet");
        for i in 1..UNTIMED_FOLD {
            assert!(!f.add_untimed(4096), "not due at {i}");
        }
        assert!(f.add_untimed(0), "due at the fold mark (a flush: no bytes)");
        assert!(f.add_untimed(8 << 20), "and after it, until folded");
        assert_eq!(
            f.take_untimed(),
            (UNTIMED_FOLD + 1, (UNTIMED_FOLD - 1) * 4096 + (8 << 20))
        );
        assert_eq!(f.take_untimed(), (0, 0), "taken once");
        assert!(!f.add_untimed(512));
        assert_eq!(f.take_untimed(), (1, 512));
    }

    /// Threads enter and leave while a "core" closes and reopens the gate
    /// under a lock, adopting what it finds: the requests at the device
    /// never exceed the limit, and every request is accounted once, either
    /// as left in its epoch or as adopted.
    #[test]
    fn racing_requests_and_epochs_never_overfill_or_lose_a_request() {
        const LIMIT: u32 = 3;
        let f = Arc::new(FastPath::new());
        // The core's count of adopted requests still at the device.
        let core = Arc::new(Mutex::new(0u32));
        let at_device = Arc::new(AtomicU64::new(0));
        let (left, adopted) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let stop = Arc::new(AtomicBool::new(false));
        f.close();
        f.open(&room(LIMIT));
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let (f, core, at_device) = (f.clone(), core.clone(), at_device.clone());
                let (left, adopted, stop) = (left.clone(), adopted.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let Some(t) = f.enter() else {
                            std::hint::spin_loop();
                            continue;
                        };
                        let n = at_device.fetch_add(1, Ordering::SeqCst) + 1;
                        assert!(n <= u64::from(LIMIT), "{n} at the device");
                        for _ in 0..50 {
                            std::hint::spin_loop(); // the device's time
                        }
                        at_device.fetch_sub(1, Ordering::SeqCst);
                        if f.leave(&t) {
                            left.fetch_add(1, Ordering::Relaxed);
                        } else {
                            *core.lock().unwrap() -= 1;
                            adopted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        let mut core_adopted = 0u64;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while (left.load(Ordering::Relaxed) < 100 || adopted.load(Ordering::Relaxed) < 100)
            && std::time::Instant::now() < deadline
        {
            let mut c = core.lock().unwrap();
            let n = f.close();
            *c += n;
            core_adopted += u64::from(n);
            // The core's own requests take room from the next epoch.
            if *c < LIMIT {
                f.open(&room(LIMIT - *c));
            }
            drop(c);
            std::thread::yield_now();
        }
        stop.store(true, Ordering::SeqCst);
        for w in workers {
            w.join().unwrap();
        }
        let (left, adopted) = (left.load(Ordering::SeqCst), adopted.load(Ordering::SeqCst));
        assert!(
            left >= 100 && adopted >= 100,
            "both ways exercised: {left} {adopted}"
        );
        assert_eq!(adopted, core_adopted, "each adopted request completes once");
        assert_eq!(*core.lock().unwrap(), 0);
    }
}
