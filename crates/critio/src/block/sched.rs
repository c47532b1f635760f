//! The block scheduler core: a sans-I/O state machine of admission, two
//! queues and dispatch limits (paper 000, Section 4.3; paper 004).
//!
//! Lifecycle of a request (STYLE.md rule 6):
//!
//! ```text
//!  submit ──slot free──> Queued ──dispatch──> AtDevice ──complete──> gone
//!     │                    ^                      │
//!     └─no slot─> AwaitingAdmission ─slot freed───┘ (admitted in FIFO order)
//!
//!  promote(id): AwaitingAdmission -> waits in the critical pool (admitted now if a slot is free)
//!               Queued            -> moves to the critical queue
//!               AtDevice          -> counted (the write cache may reissue it)
//! ```
//!
//! What each class gets:
//! - **Admission**: separate slot pools (default 128 + 128), so a burst of
//!   background I/O cannot take the slots a critical request needs.
//! - **Dispatch**: critical requests first, FIFO within a class, up to the
//!   device's queue depth. Non-critical requests go only when no critical one
//!   is queued, while fewer than the cap are at the device, and, with
//!   anticipation on, neither while critical requests are at the device nor
//!   for the window after the last critical completion; but at least one per
//!   starvation period goes ahead of critical ones, so background work is
//!   never starved.
//! - With classes off (`classes: false`) everything shares one pool and one
//!   FIFO: the `none` scheme.
//!
//! The core takes `now` as an argument and performs no I/O; the driver in
//! `layer.rs` runs it on threads against a device, and the experiments run it
//! in virtual time.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use serde::Serialize;

use super::cap::{CapState, NoncriticalCap};
use super::ncio::NcioIndex;
use super::ReqId;
use crate::class::Class;
use crate::device::Op;
use crate::time::Nanos;

/// Where an outstanding request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Location {
    /// Waiting for an admission slot.
    AwaitingAdmission,
    /// Admitted, waiting in a dispatch queue.
    Queued,
    /// Dispatched to the device.
    AtDevice,
}

/// What a promotion did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Promotion {
    /// The scheme has no I/O inheritance: nothing was done.
    Disabled,
    /// No such outstanding request.
    NotFound,
    /// It was critical already.
    AlreadyCritical,
    /// It was waiting for a slot and was admitted into the critical pool.
    Admitted,
    /// It was waiting for a slot and now waits for a critical one.
    WaitsInCriticalPool,
    /// It was queued and moved to the critical queue.
    Requeued,
    /// It was at the device; nothing more can be done here (counted).
    AtDevice,
}

/// The core's configuration (see `BlockConfig` for the documented defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SchedConfig {
    /// Two classes (false: one pool, one FIFO, no cap: the `none` scheme).
    pub classes: bool,
    /// Admission slots for critical requests.
    pub critical_slots: u32,
    /// Admission slots for non-critical requests.
    pub noncritical_slots: u32,
    /// At least one non-critical dispatch per this period.
    pub starvation_period: Nanos,
    /// Non-critical requests allowed at the device.
    pub noncritical_cap: NoncriticalCap,
    /// After a critical completion, hold non-critical dispatch this long
    /// unless a critical request arrives (0: off).
    pub anticipation: Nanos,
    /// Most requests at the device at once (its queue depth).
    pub device_depth: u32,
}

/// One request as the core sees it.
#[derive(Clone, Copy, Debug)]
pub struct ReqInfo {
    /// Its class at submission.
    pub class: Class,
    /// Read, write or flush.
    pub op: Op,
    /// Byte offset.
    pub offset: u64,
    /// Byte length.
    pub len: u64,
}

/// The bytes of a non-critical request that pacing counts: its writes.
/// Pacing exists because a device's write cache makes a flush wait for the
/// background data written before it (see `cap.rs`); a read leaves nothing
/// behind, and the cap on requests at the device already bounds what it
/// costs while it runs.
fn paced_bytes(info: &ReqInfo) -> u64 {
    if info.op == Op::Write {
        info.len
    } else {
        0
    }
}

/// Request ids are sequential integers: hash them with one multiply.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type IdMap<V> = HashMap<ReqId, V, BuildHasherDefault<IdHasher>>;

#[derive(Clone, Debug)]
struct Entry<P> {
    payload: P,
    info: ReqInfo,
    class: Class,
    /// The pool whose slot it holds (it keeps it when promoted).
    slot: usize,
    loc: Location,
    submitted: Nanos,
    queued: Nanos,
    dispatched: Nanos,
    nc_at_dispatch: u32,
}

/// What a completion reports.
#[derive(Clone, Debug)]
pub struct Completed<P = ()> {
    /// The payload given at submission.
    pub payload: P,
    /// The request's class when it was dispatched.
    pub class: Class,
    /// Submission to admission.
    pub admission_wait: Nanos,
    /// Admission to dispatch.
    pub queue_wait: Nanos,
    /// Dispatch to completion.
    pub device_time: Nanos,
    /// Requests admitted because this one freed its slot.
    pub admitted: Vec<ReqId>,
}

/// Counters the core keeps.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct SchedCounters {
    /// Promotions that found the request waiting for admission.
    pub promoted_awaiting_admission: u64,
    /// Promotions that moved a queued request.
    pub promoted_queued: u64,
    /// Promotions that found the request already at the device.
    pub promoted_at_device: u64,
    /// Non-critical dispatches forced by the starvation timer.
    pub starvation_dispatches: u64,
    /// Dispatch decisions that held non-critical work for anticipation.
    pub anticipation_holds: u64,
}

/// The scheduler core. `P` is a payload the driver keeps per request (the
/// device command, the waiter's handle); the core never looks at it.
pub struct Scheduler<P = ()> {
    cfg: SchedConfig,
    reqs: IdMap<Entry<P>>,
    admission: [VecDeque<ReqId>; 2],
    /// Admitted requests per lane, with the time each was queued (so the
    /// starvation check reads the front's time without a map lookup).
    queues: [VecDeque<(ReqId, Nanos)>; 2],
    slots_used: [u32; 2],
    inflight: [u32; 2],
    ncio: NcioIndex,
    last_nc_dispatch: Nanos,
    anticipate_until: Option<Nanos>,
    cap: CapState,
    counters: SchedCounters,
}

const CRIT: usize = 0;
const NONCRIT: usize = 1;

impl<P> Scheduler<P> {
    /// A scheduler with nothing outstanding.
    pub fn new(cfg: SchedConfig) -> Self {
        assert!(cfg.critical_slots >= 1 && cfg.noncritical_slots >= 1);
        assert!(cfg.device_depth >= 1);
        assert!(cfg.starvation_period > 0);
        Self {
            cfg,
            reqs: IdMap::default(),
            admission: Default::default(),
            queues: Default::default(),
            slots_used: [0; 2],
            inflight: [0; 2],
            ncio: NcioIndex::default(),
            last_nc_dispatch: 0,
            anticipate_until: None,
            cap: CapState::new(cfg.noncritical_cap),
            counters: SchedCounters::default(),
        }
    }

    /// The class a request is scheduled in (everything is one class when
    /// classes are off).
    fn lane(&self, class: Class) -> usize {
        if self.cfg.classes {
            class.index()
        } else {
            CRIT
        }
    }

    fn pool_size(&self, lane: usize) -> u32 {
        match (self.cfg.classes, lane) {
            (false, _) => self.cfg.critical_slots + self.cfg.noncritical_slots,
            (true, CRIT) => self.cfg.critical_slots,
            (true, _) => self.cfg.noncritical_slots,
        }
    }

    /// Registers a request. Returns true if it was admitted (it is now
    /// queued), false if it waits for a slot.
    pub fn submit(&mut self, id: ReqId, info: ReqInfo, payload: P, now: Nanos) -> bool {
        let class = if self.cfg.classes {
            info.class
        } else {
            Class::Critical
        };
        let lane = self.lane(class);
        // FIFO admission: never overtake a request already waiting.
        let admitted =
            self.admission[lane].is_empty() && self.slots_used[lane] < self.pool_size(lane);
        let entry = Entry {
            payload,
            info,
            class,
            slot: if admitted { lane } else { CRIT },
            loc: if admitted {
                Location::Queued
            } else {
                Location::AwaitingAdmission
            },
            submitted: now,
            queued: now,
            dispatched: now,
            nc_at_dispatch: 0,
        };
        match self.reqs.entry(id) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(entry);
            }
            std::collections::hash_map::Entry::Occupied(_) => {
                panic!("request {id} submitted twice")
            }
        }
        if class == Class::NonCritical {
            self.ncio.insert(id, info.offset, info.len);
        }
        if admitted {
            self.enqueue_admitted(id, lane, now);
        } else {
            self.admission[lane].push_back(id);
        }
        admitted
    }

    fn admit(&mut self, id: ReqId, now: Nanos) {
        let classes = self.cfg.classes;
        let e = self.reqs.get_mut(&id).expect("admitting a known request");
        debug_assert_eq!(e.loc, Location::AwaitingAdmission);
        let lane = if classes { e.class.index() } else { CRIT };
        e.loc = Location::Queued;
        e.queued = now;
        e.slot = lane;
        self.enqueue_admitted(id, lane, now);
    }

    /// Takes a slot of `lane` for an admitted request and queues it.
    fn enqueue_admitted(&mut self, id: ReqId, lane: usize, now: Nanos) {
        self.slots_used[lane] += 1;
        self.queues[lane].push_back((id, now));
        if lane == CRIT && self.cfg.classes {
            self.anticipate_until = None; // a critical arrival breaks anticipation
        }
    }

    /// Picks the next request to send to the device, if the limits allow one.
    pub fn dispatch(&mut self, now: Nanos) -> Option<ReqId> {
        let lane = self.pick(now)?;
        Some(self.take(lane, now).0)
    }

    /// [`Scheduler::dispatch`], also returning the request's class now and
    /// its payload (one map lookup for the driver).
    pub fn dispatch_payload(&mut self, now: Nanos) -> Option<(ReqId, Class, &mut P)> {
        let lane = self.pick(now)?;
        let (id, e) = self.take(lane, now);
        Some((id, e.class, &mut e.payload))
    }

    /// Which queue the next dispatch takes from, if the limits allow one.
    fn pick(&mut self, now: Nanos) -> Option<usize> {
        let at_device = self.inflight[CRIT] + self.inflight[NONCRIT];
        if at_device >= self.cfg.device_depth {
            return None;
        }
        let nc_room = self
            .cap
            .limit(now)
            .is_none_or(|limit| self.inflight[NONCRIT] < limit);
        let nc_head = self.noncritical_head_bytes();
        let nc_ready = nc_head.is_some_and(|bytes| nc_room && self.cap.paced_ok(bytes, now));
        // The starvation timer overrides neither a cap probe (a bounded
        // pause, `probe_max_ms` once per `probe_every_ms`, that measures the
        // clean baseline: a background write sent during it would make
        // every sample unclean until the probe times out) nor a cap that a
        // non-critical request at the device already fills: that one is the
        // background's progress.
        let nc_starving = !self.cap.probing(now)
            && (nc_room || self.inflight[NONCRIT] == 0)
            && self.noncritical_waited(now) >= self.cfg.starvation_period;
        if nc_starving {
            if !self.queues[CRIT].is_empty() || self.anticipating(now) {
                self.counters.starvation_dispatches += 1;
            }
            return Some(NONCRIT);
        }
        if !self.queues[CRIT].is_empty() {
            return Some(CRIT);
        }
        if nc_ready {
            if self.anticipating(now) {
                self.counters.anticipation_holds += 1;
                return None;
            }
            return Some(NONCRIT);
        }
        None
    }

    /// The bytes pacing charges for the first queued non-critical request
    /// (None: none queued).
    fn noncritical_head_bytes(&self) -> Option<u64> {
        let &(id, _) = self.queues[NONCRIT].front()?;
        Some(self.reqs.get(&id).map_or(0, |e| paced_bytes(&e.info)))
    }

    /// How long non-critical work has gone without a dispatch: since the
    /// last non-critical dispatch or since the oldest queued one was queued,
    /// whichever is later (0 with none queued).
    fn noncritical_waited(&self, now: Nanos) -> Nanos {
        let Some(&(_, queued)) = self.queues[NONCRIT].front() else {
            return 0;
        };
        let since = queued.max(self.last_nc_dispatch);
        now.saturating_sub(since)
    }

    /// With anticipation on (paper 004's non-work-conserving dispatch),
    /// non-critical requests wait while critical ones are at the device and
    /// for the window after the last critical completion; a critical arrival
    /// ends the window (it is dispatched at once).
    fn anticipating(&self, now: Nanos) -> bool {
        if self.cfg.anticipation == 0 || !self.cfg.classes {
            return false;
        }
        self.inflight[CRIT] > 0 || self.anticipate_until.is_some_and(|until| now < until)
    }

    /// Moves the head of `lane` to the device.
    fn take(&mut self, lane: usize, now: Nanos) -> (ReqId, &mut Entry<P>) {
        let (id, _) = self.queues[lane]
            .pop_front()
            .expect("queue checked non-empty");
        let nc_inflight = self.inflight[NONCRIT];
        self.inflight[lane] += 1;
        let e = self.reqs.get_mut(&id).expect("queued request is known");
        if lane == NONCRIT {
            self.last_nc_dispatch = now;
            self.cap.on_noncritical_dispatch(paced_bytes(&e.info), now);
        }
        debug_assert_eq!(e.loc, Location::Queued);
        e.loc = Location::AtDevice;
        e.dispatched = now;
        e.nc_at_dispatch = nc_inflight;
        (id, e)
    }

    /// Records that a request completed at the device.
    pub fn complete(&mut self, id: ReqId, now: Nanos) -> Completed<P> {
        let e = self
            .reqs
            .remove(&id)
            .expect("completing an unknown request");
        assert_eq!(
            e.loc,
            Location::AtDevice,
            "request {id} completed before dispatch"
        );
        let lane = self.lane(e.class);
        self.inflight[lane] -= 1;
        self.slots_used[e.slot] -= 1;
        if e.class == Class::NonCritical && self.cfg.classes {
            self.ncio.remove(id, e.info.offset);
        }
        let device_time = now.saturating_sub(e.dispatched);
        if lane == NONCRIT {
            self.cap.on_noncritical_complete(paced_bytes(&e.info), now);
        } else if self.cfg.classes {
            if e.info.op == Op::Write {
                self.cap.on_critical_written(e.info.len);
            }
            self.cap
                .on_critical_complete(device_time, e.nc_at_dispatch, e.dispatched, now);
            if self.cfg.anticipation > 0 {
                self.anticipate_until = Some(now + self.cfg.anticipation);
            }
        }
        let mut admitted = Vec::new();
        if let Some(next) = self.admission[e.slot].pop_front() {
            self.admit(next, now);
            admitted.push(next);
        }
        Completed {
            payload: e.payload,
            class: e.class,
            admission_wait: e.queued.saturating_sub(e.submitted),
            queue_wait: e.dispatched.saturating_sub(e.queued),
            device_time,
            admitted,
        }
    }

    /// Makes an outstanding request critical wherever it is. Returns what
    /// was done; `Admitted` means the request just got a slot (wake its
    /// submitter).
    pub fn promote(&mut self, id: ReqId, now: Nanos) -> Promotion {
        let Some(e) = self.reqs.get(&id) else {
            return Promotion::NotFound;
        };
        if e.class == Class::Critical || !self.cfg.classes {
            return Promotion::AlreadyCritical;
        }
        let (loc, offset) = (e.loc, e.info.offset);
        if loc == Location::AtDevice {
            // It stays non-critical (and in the index) until it completes.
            self.counters.promoted_at_device += 1;
            return Promotion::AtDevice;
        }
        self.ncio.remove(id, offset);
        self.reqs.get_mut(&id).expect("checked above").class = Class::Critical;
        match loc {
            Location::AwaitingAdmission => {
                self.counters.promoted_awaiting_admission += 1;
                let at = position(&self.admission[NONCRIT], |&r| r == id);
                self.admission[NONCRIT].remove(at);
                if self.admission[CRIT].is_empty()
                    && self.slots_used[CRIT] < self.cfg.critical_slots
                {
                    self.admit(id, now);
                    Promotion::Admitted
                } else {
                    self.admission[CRIT].push_back(id);
                    Promotion::WaitsInCriticalPool
                }
            }
            Location::Queued => {
                self.counters.promoted_queued += 1;
                let at = position(&self.queues[NONCRIT], |&(r, _)| r == id);
                let queued = self.queues[NONCRIT].remove(at).expect("in range");
                // It keeps its non-critical slot; it now competes as critical.
                self.queues[CRIT].push_back(queued);
                self.anticipate_until = None;
                Promotion::Requeued
            }
            Location::AtDevice => unreachable!("handled above"),
        }
    }

    /// When the core next wants to be asked to dispatch although nothing
    /// else happens (an anticipation window or a cap probe ending, or
    /// pacing letting the next background request go).
    pub fn next_timer(&self, now: Nanos) -> Option<Nanos> {
        let bytes = self.noncritical_head_bytes()?;
        let paced = self.cap.pace_deadline(bytes, now);
        [self.anticipate_until, self.cap.probe_deadline(), paced]
            .into_iter()
            .flatten()
            .filter(|&t| t > now)
            .min()
    }

    /// Where a request is, if outstanding.
    pub fn location(&self, id: ReqId) -> Option<Location> {
        self.reqs.get(&id).map(|e| e.loc)
    }

    /// A request's current class, if outstanding.
    pub fn class_of(&self, id: ReqId) -> Option<Class> {
        self.reqs.get(&id).map(|e| e.class)
    }

    /// The payload of an outstanding request.
    pub fn payload_mut(&mut self, id: ReqId) -> Option<&mut P> {
        self.reqs.get_mut(&id).map(|e| &mut e.payload)
    }

    /// Whether any request is queued (so a dispatch decision needs the
    /// time); false lets a driver skip reading its clock.
    pub fn dispatchable(&self) -> bool {
        !self.queues[CRIT].is_empty() || !self.queues[NONCRIT].is_empty()
    }

    /// How many requests are outstanding (anywhere).
    pub fn outstanding(&self) -> usize {
        self.reqs.len()
    }

    /// Outstanding non-critical requests overlapping a byte range.
    pub fn noncritical_overlapping(&self, offset: u64, len: u64) -> Vec<ReqId> {
        self.ncio.overlapping(offset, len)
    }

    /// Requests at the device, per class (critical, non-critical).
    pub fn inflight(&self) -> [u32; 2] {
        self.inflight
    }

    /// Requests queued (admitted, not dispatched), per class.
    pub fn queued(&self) -> [usize; 2] {
        [self.queues[CRIT].len(), self.queues[NONCRIT].len()]
    }

    /// Requests waiting for a slot, per class.
    pub fn awaiting_admission(&self) -> [usize; 2] {
        [self.admission[CRIT].len(), self.admission[NONCRIT].len()]
    }

    /// The adaptive cap's clean baseline and last windowed mean of critical
    /// device latency with background at the device, in ns (None for a
    /// fixed cap or before the first measurement).
    pub fn cap_view(&self) -> (Option<f64>, Option<f64>) {
        self.cap.view()
    }

    /// The current non-critical cap (u32::MAX when unlimited).
    pub fn noncritical_cap(&self) -> u32 {
        self.cap.current()
    }

    /// The background rate the adaptive cap's pacing allows, in bytes/s
    /// (None: unpaced).
    pub fn pacing_rate(&self) -> Option<f64> {
        self.cap.rate()
    }

    /// The core's counters.
    pub fn counters(&self) -> SchedCounters {
        self.counters
    }

    /// Checks every structural invariant (costly: tests and debug builds).
    #[cfg(any(test, debug_assertions))]
    pub fn check_invariants(&self) {
        let mut at = [[0u32; 2]; 3];
        let mut slots = [0u32; 2];
        for e in self.reqs.values() {
            let loc = match e.loc {
                Location::AwaitingAdmission => 0,
                Location::Queued => 1,
                Location::AtDevice => 2,
            };
            at[loc][self.lane(e.class)] += 1;
            if e.loc != Location::AwaitingAdmission {
                slots[e.slot] += 1;
            }
        }
        for lane in [CRIT, NONCRIT] {
            assert_eq!(
                at[0][lane] as usize,
                self.admission[lane].len(),
                "admission lane {lane}"
            );
            assert_eq!(
                at[1][lane] as usize,
                self.queues[lane].len(),
                "queue lane {lane}"
            );
            assert_eq!(at[2][lane], self.inflight[lane], "inflight lane {lane}");
            assert_eq!(slots[lane], self.slots_used[lane], "slots lane {lane}");
            assert!(self.slots_used[lane] <= self.pool_size(lane));
        }
        for &(id, queued) in self.queues.iter().flatten() {
            let e = &self.reqs[&id];
            assert_eq!(e.loc, Location::Queued, "request {id} queued twice");
            assert_eq!(e.queued, queued, "queue time of {id} out of step");
        }
        assert!(self.inflight[CRIT] + self.inflight[NONCRIT] <= self.cfg.device_depth);
        let nc_outstanding = self
            .reqs
            .values()
            .filter(|e| e.class == Class::NonCritical && self.cfg.classes)
            .count();
        assert_eq!(nc_outstanding, self.ncio.len(), "ncio index out of step");
    }
}

fn position<T>(q: &VecDeque<T>, is_it: impl FnMut(&T) -> bool) -> usize {
    q.iter().position(is_it).expect("request in its queue")
}
