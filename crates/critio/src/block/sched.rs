//! The block scheduler core: a sans-I/O state machine of admission, priority
//! lanes and dispatch limits (paper 000, Section 4.3; paper 004).
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
//!
//!  submit_direct: nothing queued, slot and device room free -> AtDevice
//!                 at once, with no table entry (critical lane only)
//! ```
//!
//! What each class gets:
//! - **Admission**: separate slot pools (default 128 + 128), so a burst of
//!   background I/O cannot take the slots a critical request needs.
//! - **Lanes** (paper 004's priority levels): lane 0 holds critical
//!   requests, lanes 1..=8 non-critical ones by their background level
//!   (`ReqInfo::level`, 0 highest, like `ionice -c2 -n0..7`). FIFO within
//!   a lane; a promoted request moves to lane 0.
//! - **Dispatch**: the highest lane with work first, up to the device's
//!   queue depth. Non-critical lanes go only while fewer than the cap are at
//!   the device, and at least one non-critical request per starvation
//!   period goes ahead of everything (from the lane that waited longest;
//!   a lane that waited 9 periods goes too), so no background level is
//!   ever starved.
//! - **Anticipation** (paper 004, on when `anticipation > 0`): while a
//!   lane's requests are at the device, and for the window after one
//!   completes, lower lanes wait: the lane's next request, a think time
//!   away, then finds the device free. The window opens only if the lane's
//!   mean think time (completion to next arrival, measured) fits in it, and
//!   an arrival in that lane or a higher one ends it at once.
//! - **Tokens** (paper 004's batches, on when any lane has a budget): each
//!   lane may dispatch its budget of requests per round; a lane that has
//!   used its budget yields (it neither dispatches nor anticipates) until
//!   every other lane with work has had its turn, then all budgets refill.
//!   A budget of 0 is unlimited.
//! - With classes off (`classes: false`) everything shares one pool and one
//!   FIFO: the `none` scheme.
//!
//! The core takes `now` as an argument and performs no I/O; the driver in
//! `layer.rs` runs it on threads against a device, and the experiments run it
//! in virtual time.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use serde::{Deserialize, Serialize};

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

/// Background priority levels (lanes 1..=8 below the critical lane 0).
pub const BACKGROUND_LEVELS: u8 = 8;

/// Lanes: the critical lane and one per background level.
pub const LANES: usize = 1 + BACKGROUND_LEVELS as usize;

/// Per-lane batch budgets (paper 004's tokens): entry 0 is the critical
/// lane, entry `1 + n` background level `n`; 0 means unlimited. All zero
/// (the default) turns tokens off: strict priority between lanes.
///
/// In a config file: `tokens = [16, 4, 2]` (missing entries are 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaneTokens(pub [u32; LANES]);

impl LaneTokens {
    /// Budgets from a list (lane 0 first); at most [`LANES`] entries.
    pub fn from_slice(budgets: &[u32]) -> Result<Self, String> {
        if budgets.len() > LANES {
            return Err(format!(
                "{} token budgets given; there are {LANES} lanes (critical, then background levels 0..{})",
                budgets.len(),
                BACKGROUND_LEVELS - 1
            ));
        }
        let mut t = [0; LANES];
        t[..budgets.len()].copy_from_slice(budgets);
        Ok(Self(t))
    }

    /// Whether any lane has a budget.
    pub fn enabled(&self) -> bool {
        self.0.iter().any(|&t| t > 0)
    }
}

impl Serialize for LaneTokens {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let used = self.0.iter().rposition(|&t| t > 0).map_or(0, |i| i + 1);
        self.0[..used].serialize(s)
    }
}

impl<'de> Deserialize<'de> for LaneTokens {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Vec::<u32>::deserialize(d)?;
        Self::from_slice(&v).map_err(serde::de::Error::custom)
    }
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
    /// After a completion in a lane, hold lower lanes this long unless a
    /// request arrives in that lane or a higher one (0: off).
    pub anticipation: Nanos,
    /// Open a window only for a lane whose mean think time fits in it
    /// (false: after every lane's last completion).
    pub think_time: bool,
    /// Per-lane batch budgets (all zero: off).
    pub tokens: LaneTokens,
    /// Most requests at the device at once (its queue depth).
    pub device_depth: u32,
}

/// One request as the core sees it.
#[derive(Clone, Copy, Debug)]
pub struct ReqInfo {
    /// Its class at submission.
    pub class: Class,
    /// Its background level (0 highest, clamped to [`BACKGROUND_LEVELS`]
    /// - 1); a critical request ignores it.
    pub level: u8,
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
fn paced_bytes(op: Op, len: u64) -> u64 {
    if op == Op::Write {
        len
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
    /// The lane it is queued in or was dispatched from.
    lane: usize,
    loc: Location,
    submitted: Nanos,
    queued: Nanos,
    dispatched: Nanos,
    nc_at_dispatch: u32,
    /// `nc_dispatched()` when it was dispatched: a critical request's
    /// device time is mixed if background went to the device after it,
    /// while it was there, as much as if background was there before.
    nc_seq: u64,
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
    /// Dispatch to completion (0 if it was not timed).
    pub device_time: Nanos,
    /// Whether its device time was measured: every request's is, but the
    /// layer's fast path's on a device that answers within
    /// 2 µs (see [`Scheduler::complete_fast`]).
    pub timed: bool,
    /// Requests admitted because this one freed its slot.
    pub admitted: Vec<ReqId>,
}

/// A critical request sent to the device at its submission without a
/// place in the core's table ([`Scheduler::submit_direct`]): what its
/// completion ([`Scheduler::complete_direct`]) needs. Nothing can promote
/// or look up such a request (it is critical, and no one waits for it but
/// its submitter), so it costs no table entry.
#[derive(Clone, Copy, Debug)]
pub struct Direct {
    op: Op,
    len: u64,
    dispatched: Nanos,
    /// Whether `dispatched` was read (a fast-path request may go untimed).
    timed: bool,
    nc_at_dispatch: u32,
    nc_seq: u64,
}

impl Direct {
    /// A request the layer's fast path sent and the core then adopted
    /// ([`Scheduler::adopt_fast`]): `dispatched` is None if it went
    /// untimed; `room` is what the core allowed the fast path when it sent
    /// it.
    pub fn adopted(op: Op, len: u64, dispatched: Option<Nanos>, room: &FastRoom) -> Self {
        Self {
            op,
            len,
            dispatched: dispatched.unwrap_or(0),
            timed: dispatched.is_some(),
            nc_at_dispatch: room.nc_inflight,
            nc_seq: room.nc_seq,
        }
    }
}

/// A fast-path request's device times are measured one in this many when
/// the device answers within [`FAST_UNTIMED_BELOW`] on average (the two
/// clock reads would be a tenth of such a request).
/// A power of two.
pub const FAST_TIME_EVERY: u32 = 16;
const _: () = assert!(FAST_TIME_EVERY.is_power_of_two());
/// See [`FAST_TIME_EVERY`]: 2 µs, where two clock reads (about 20 ns on
/// this project's virtual machine) are 1% of a request.
pub const FAST_UNTIMED_BELOW: Nanos = 2_000;

/// What the core lets the block layer's fast path send with no call into
/// it ([`Scheduler::fast_room`]): while nothing is queued and no
/// critical request waits for a slot, critical requests up to `limit` at
/// once may go to the device at once, as [`Scheduler::submit_direct`]
/// would send them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FastRoom {
    /// How many may be at the device at once (critical slots and device
    /// room left).
    pub limit: u32,
    /// Non-critical requests at the device meanwhile (they share it with
    /// every one sent).
    pub nc_inflight: u32,
    /// Non-critical requests sent so far (none is sent while the room is
    /// open: a dispatch goes through the core, which closes it first).
    pub nc_seq: u64,
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
    /// Completions after which no window opened: the lane's mean think
    /// time was longer than the window.
    pub anticipation_skipped: u64,
    /// Token rounds completed (every lane with work used its budget).
    pub token_rounds: u64,
    /// Dispatches per lane (critical, then background levels).
    pub lane_dispatches: [u64; LANES],
    /// Critical requests the block layer's fast path sent past the core
    /// (in `lane_dispatches` too).
    pub fast_sent: u64,
    /// Of those, how many were still at the device when the core next
    /// changed, and completed through it.
    pub fast_adopted: u64,
    /// Stalls the adaptive cap saw: a single critical request far slower
    /// than its baseline, with background about (each cut the cap to one
    /// and halved the pacing rate; see `block/cap.rs`).
    pub cap_stalls: u64,
}

/// A lane's think time: how long after its last request completed (with
/// nothing more of it queued or at the device) its next one arrives, as an
/// exponentially weighted mean (weight 1/8 per sample, as the anticipatory
/// scheduler keeps it).
#[derive(Clone, Copy, Debug, Default)]
struct ThinkTime {
    idle_since: Option<Nanos>,
    mean: f64,
    samples: u32,
}

impl ThinkTime {
    fn sample(&mut self, at: Nanos, cap: Nanos) {
        if let Some(since) = self.idle_since.take() {
            let t = at.saturating_sub(since).min(cap) as f64;
            self.mean = if self.samples == 0 {
                t
            } else {
                self.mean + (t - self.mean) / 8.0
            };
            self.samples = self.samples.saturating_add(1);
        }
    }

    /// Whether waiting `window` for this lane's next request is worth it:
    /// with no history yet, or a mean think time that fits the window.
    fn worth_waiting(&self, window: Nanos) -> bool {
        self.samples == 0 || self.mean <= window as f64
    }
}

/// The scheduler core. `P` is a payload the driver keeps per request (the
/// device command, the waiter's handle); the core never looks at it.
pub struct Scheduler<P = ()> {
    cfg: SchedConfig,
    reqs: IdMap<Entry<P>>,
    /// Requests at the device that have no entry in `reqs`
    /// ([`Scheduler::submit_direct`]); all critical, each holding a
    /// critical slot.
    direct: u32,
    /// Requests waiting for a slot, per pool (critical, non-critical).
    admission: [VecDeque<ReqId>; 2],
    /// Admitted requests per lane, with the time each was queued (so the
    /// starvation check reads the front's time without a map lookup).
    queues: [VecDeque<(ReqId, Nanos)>; LANES],
    slots_used: [u32; 2],
    /// Requests at the device per class (critical, non-critical).
    inflight: [u32; 2],
    /// Requests at the device per lane.
    lane_inflight: [u32; LANES],
    ncio: NcioIndex,
    /// The last dispatch from each lane, and from any non-critical one
    /// (for the starvation check).
    last_dispatch: [Nanos; LANES],
    last_nc_dispatch: Nanos,
    /// The open anticipation window: the lane it serves and its end.
    antic: Option<(usize, Nanos)>,
    think: [ThinkTime; LANES],
    tokens_left: [u32; LANES],
    cap: CapState,
    counters: SchedCounters,
}

/// The critical pool and lane.
const CRIT: usize = 0;
/// The non-critical pool.
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
            direct: 0,
            admission: Default::default(),
            queues: Default::default(),
            slots_used: [0; 2],
            inflight: [0; 2],
            lane_inflight: [0; LANES],
            ncio: NcioIndex::default(),
            last_dispatch: [0; LANES],
            last_nc_dispatch: 0,
            antic: None,
            think: [ThinkTime::default(); LANES],
            tokens_left: cfg.tokens.0,
            cap: CapState::new(cfg.noncritical_cap),
            counters: SchedCounters::default(),
        }
    }

    /// The pool a class takes its slot from (everything is one pool when
    /// classes are off).
    fn pool(&self, class: Class) -> usize {
        if self.cfg.classes {
            class.index()
        } else {
            CRIT
        }
    }

    /// The lane a request of `class` at background `level` is queued in.
    fn lane_of(&self, class: Class, level: u8) -> usize {
        if !self.cfg.classes || class == Class::Critical {
            CRIT
        } else {
            1 + usize::from(level.min(BACKGROUND_LEVELS - 1))
        }
    }

    fn pool_size(&self, pool: usize) -> u32 {
        match (self.cfg.classes, pool) {
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
        let pool = self.pool(class);
        let lane = self.lane_of(class, info.level);
        // FIFO admission: never overtake a request already waiting.
        let admitted =
            self.admission[pool].is_empty() && self.slots_used[pool] < self.pool_size(pool);
        let entry = Entry {
            payload,
            info,
            class,
            slot: if admitted { pool } else { CRIT },
            lane,
            loc: if admitted {
                Location::Queued
            } else {
                Location::AwaitingAdmission
            },
            submitted: now,
            queued: now,
            dispatched: now,
            nc_at_dispatch: 0,
            nc_seq: 0,
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
            self.enqueue_admitted(id, pool, lane, now, now);
        } else {
            self.admission[pool].push_back(id);
        }
        admitted
    }

    fn admit(&mut self, id: ReqId, now: Nanos) {
        let e = self.reqs.get(&id).expect("admitting a known request");
        debug_assert_eq!(e.loc, Location::AwaitingAdmission);
        let (pool, lane) = (self.pool(e.class), self.lane_of(e.class, e.info.level));
        let e = self.reqs.get_mut(&id).expect("checked above");
        e.loc = Location::Queued;
        e.queued = now;
        e.slot = pool;
        e.lane = lane;
        let arrived = e.submitted;
        self.enqueue_admitted(id, pool, lane, arrived, now);
    }

    /// Takes a slot of `pool` for an admitted request and queues it in
    /// `lane`: an arrival, which feeds the lane's think time and ends an
    /// anticipation window held for this lane or a lower one.
    /// `arrived`: when it was submitted.
    fn enqueue_admitted(
        &mut self,
        id: ReqId,
        pool: usize,
        lane: usize,
        arrived: Nanos,
        now: Nanos,
    ) {
        self.queues[lane].push_back((id, now));
        self.arrive(pool, lane, arrived);
    }

    /// A request of `lane`, submitted at `arrived`, takes a slot of `pool`.
    fn arrive(&mut self, pool: usize, lane: usize, arrived: Nanos) {
        self.slots_used[pool] += 1;
        if self.cfg.classes {
            // Think time ends when the request arrived, not when it got a
            // slot (a wait for admission is not the submitter's thinking).
            self.think[lane].sample(arrived, 2 * self.cfg.anticipation.max(1));
            if self.antic.is_some_and(|(served, _)| lane <= served) {
                self.antic = None;
            }
        }
    }

    /// Sends a request straight to the device if the core would dispatch
    /// it at once anyway: it goes to the critical lane (it is critical, or
    /// classes are off), nothing is queued in any lane or waits for a slot
    /// of its pool, a slot is free, the device has room, and the lane has
    /// a token left. It then gets the slot, arrival and dispatch accounting
    /// of [`Scheduler::submit`] and [`Scheduler::dispatch`], but no table
    /// entry, so it cannot be promoted, located or given a payload: meant
    /// for a request its submitter does in its own thread and waits for.
    /// Returns None, having done nothing, otherwise.
    pub fn submit_direct(&mut self, info: &ReqInfo, now: Nanos) -> Option<Direct> {
        let class = if self.cfg.classes {
            info.class
        } else {
            Class::Critical
        };
        if self.lane_of(class, info.level) != CRIT
            || !self.admission[CRIT].is_empty()
            || self.slots_used[CRIT] >= self.pool_size(CRIT)
            || self.dispatchable()
            || self.inflight[CRIT] + self.inflight[NONCRIT] >= self.cfg.device_depth
            || !self.has_tokens(CRIT)
        {
            return None;
        }
        self.arrive(CRIT, CRIT, now);
        let (nc_at_dispatch, nc_seq) = self.send_from(CRIT, now);
        self.direct += 1;
        Some(Direct {
            op: info.op,
            len: info.len,
            dispatched: now,
            timed: true,
            nc_at_dispatch,
            nc_seq,
        })
    }

    /// Whether critical requests may go to the device with no call into
    /// the core, and how many at once: when [`Scheduler::submit_direct`]
    /// would send each (nothing queued in any lane, no critical request
    /// waiting for a slot) and the critical lane neither anticipates nor
    /// counts tokens (anticipation's think times and the tokens' rounds
    /// follow every arrival). None otherwise. While it is open, the
    /// driver must not change the core without closing it first: adopting
    /// what the fast path has at the device ([`Scheduler::adopt_fast`])
    /// and folding in what it completed ([`Scheduler::complete_fast`]).
    pub fn fast_room(&self) -> Option<FastRoom> {
        if self.cfg.anticipation > 0
            || self.cfg.tokens.0[CRIT] != 0
            || !self.admission[CRIT].is_empty()
            || self.dispatchable()
        {
            return None;
        }
        let slots = self.pool_size(CRIT).saturating_sub(self.slots_used[CRIT]);
        let room = self
            .cfg
            .device_depth
            .saturating_sub(self.inflight[CRIT] + self.inflight[NONCRIT]);
        let limit = slots.min(room);
        (limit > 0).then(|| FastRoom {
            limit,
            nc_inflight: self.inflight[NONCRIT],
            nc_seq: self.nc_dispatched(),
        })
    }

    /// `n` critical requests the fast path sent are still at the device
    /// as the core closes its room: they become the core's, with a slot,
    /// device room and dispatch counted as [`Scheduler::submit_direct`]
    /// counts them, and each completes through
    /// [`Scheduler::complete_direct`] (with `Direct::adopted`).
    pub fn adopt_fast(&mut self, n: u32) {
        if n == 0 {
            return;
        }
        self.slots_used[CRIT] += n;
        self.inflight[CRIT] += n;
        self.lane_inflight[CRIT] += n;
        self.direct += n;
        self.counters.lane_dispatches[CRIT] += u64::from(n);
        self.counters.fast_sent += u64::from(n);
        self.counters.fast_adopted += u64::from(n);
    }

    /// Folds in a critical request the fast path sent and completed while
    /// the room it went through was open (the core never counted it):
    /// its dispatch, and for the adaptive cap its written bytes and, if it
    /// was timed (`times`: dispatched and completed), its device time
    /// beside the `nc_inflight` non-critical requests its room had at the
    /// device; if it was not, that critical traffic was there until `now`
    /// (when the core learns of it, no earlier than it completed).
    /// Returns its device time if timed.
    pub fn complete_fast(
        &mut self,
        op: Op,
        len: u64,
        times: Option<(Nanos, Nanos)>,
        nc_inflight: u32,
        now: Nanos,
    ) -> Option<Nanos> {
        self.counters.lane_dispatches[CRIT] += 1;
        self.counters.fast_sent += 1;
        if self.cfg.classes && op == Op::Write {
            self.cap.on_critical_written(len);
        }
        let Some((dispatched, done)) = times else {
            if self.cfg.classes {
                self.cap.on_critical_untimed(now);
            }
            return None;
        };
        let device_time = done.saturating_sub(dispatched);
        if self.cfg.classes {
            let stall = self
                .cap
                .on_critical_complete(device_time, nc_inflight, dispatched, done);
            self.counters.cap_stalls += u64::from(stall);
            self.lane_completed(CRIT, done);
        }
        Some(device_time)
    }

    /// [`Scheduler::complete_fast`] for `n` critical reads and flushes
    /// the fast path completed untimed, in one: counted, and the adaptive
    /// cap told that critical traffic was there until `now`.
    pub fn complete_fast_untimed(&mut self, n: u64, now: Nanos) {
        self.counters.lane_dispatches[CRIT] += n;
        self.counters.fast_sent += n;
        if self.cfg.classes && n > 0 {
            self.cap.on_critical_untimed(now);
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

    /// Which lane the next dispatch takes from, if the limits allow one.
    fn pick(&mut self, now: Nanos) -> Option<usize> {
        if !self.dispatchable() {
            // Nothing queued, so nothing paced either (the common case
            // after each dispatch and completion: a short way out).
            self.cap.note_pace_hold(false, now);
            return None;
        }
        let at_device = self.inflight[CRIT] + self.inflight[NONCRIT];
        if at_device >= self.cfg.device_depth {
            return None;
        }
        let nc_room = self
            .cap
            .limit(now)
            .is_none_or(|limit| self.inflight[NONCRIT] < limit);
        // The starvation timer overrides neither a cap probe (a bounded
        // pause, `probe_max_ms` once per `probe_every_ms`, that measures the
        // clean baseline: a background write sent during it would make
        // every sample unclean until the probe times out) nor a cap that a
        // non-critical request at the device already fills: that one is the
        // background's progress.
        if !self.cap.probing(now) && (nc_room || self.inflight[NONCRIT] == 0) {
            if let Some(lane) = self.starving_lane(now) {
                if !self.queues[CRIT].is_empty() || self.held(lane, now) {
                    self.counters.starvation_dispatches += 1;
                }
                return Some(lane);
            }
        }
        let tokens = self.cfg.tokens.enabled();
        let mut first_ready = None;
        let mut held = false;
        let mut paced = false;
        for lane in 0..LANES {
            let Some(&(id, _)) = self.queues[lane].front() else {
                continue;
            };
            if lane != CRIT {
                let bytes = self
                    .reqs
                    .get(&id)
                    .map_or(0, |e| paced_bytes(e.info.op, e.info.len));
                if !nc_room {
                    continue;
                }
                if !self.cap.paced_ok(bytes, now) {
                    paced = true;
                    continue;
                }
                if self.held(lane, now) {
                    held = true;
                    continue;
                }
            }
            if !tokens || self.has_tokens(lane) {
                return Some(lane);
            }
            first_ready.get_or_insert(lane);
        }
        // Every lane was looked at: whether pacing is what holds the
        // background from here on (its own throughput leaves that time out).
        self.cap.note_pace_hold(paced, now);
        if let Some(lane) = first_ready {
            // Every lane that could go has used its budget: a new round.
            self.tokens_left = self.cfg.tokens.0;
            self.counters.token_rounds += 1;
            return Some(lane);
        }
        if held {
            self.counters.anticipation_holds += 1;
        }
        None
    }

    /// Whether `lane` may still dispatch in this token round.
    fn has_tokens(&self, lane: usize) -> bool {
        self.cfg.tokens.0[lane] == 0 || self.tokens_left[lane] > 0
    }

    /// The non-critical lane to serve ahead of everything, if background
    /// work is starving: when no non-critical request has been dispatched
    /// for a starvation period while one waited (the class's guarantee,
    /// paper 000), or when one lane has waited [`LANES`] periods (a lower
    /// level's guarantee under a flood from a higher one). The lane whose
    /// front has waited longest goes.
    fn starving_lane(&self, now: Nanos) -> Option<usize> {
        let mut worst: Option<(Nanos, usize)> = None;
        let mut oldest = Nanos::MAX;
        for lane in 1..LANES {
            let Some(&(_, queued)) = self.queues[lane].front() else {
                continue;
            };
            oldest = oldest.min(queued);
            let waited = now.saturating_sub(queued.max(self.last_dispatch[lane]));
            if worst.is_none_or(|w| waited > w.0) {
                worst = Some((waited, lane));
            }
        }
        let (waited, lane) = worst?;
        let class_waited = now.saturating_sub(oldest.max(self.last_nc_dispatch));
        let period = self.cfg.starvation_period;
        (class_waited >= period || waited >= period * LANES as Nanos).then_some(lane)
    }

    /// With anticipation on (paper 004's non-work-conserving dispatch),
    /// `lane` waits while a higher lane has requests at the device or an
    /// open window, unless that lane has used its token budget (it yields).
    fn held(&self, lane: usize, now: Nanos) -> bool {
        if self.cfg.anticipation == 0 || !self.cfg.classes {
            return false;
        }
        let yields = |l: usize| self.cfg.tokens.enabled() && !self.has_tokens(l);
        if (0..lane).any(|l| self.lane_inflight[l] > 0 && !yields(l)) {
            return true;
        }
        self.antic
            .is_some_and(|(served, until)| served < lane && now < until && !yields(served))
    }

    /// The highest queued non-critical request's bytes as pacing charges
    /// them (None: none queued).
    fn noncritical_head_bytes(&self) -> Option<u64> {
        let &(id, _) = self.queues[1..].iter().find_map(|q| q.front())?;
        Some(
            self.reqs
                .get(&id)
                .map_or(0, |e| paced_bytes(e.info.op, e.info.len)),
        )
    }

    /// Non-critical requests sent to the device so far.
    fn nc_dispatched(&self) -> u64 {
        self.counters.lane_dispatches[CRIT + 1..].iter().sum()
    }

    /// Moves the head of `lane` to the device.
    fn take(&mut self, lane: usize, now: Nanos) -> (ReqId, &mut Entry<P>) {
        let (id, _) = self.queues[lane]
            .pop_front()
            .expect("queue checked non-empty");
        let (nc_inflight, nc_seq) = self.send_from(lane, now);
        let e = self.reqs.get_mut(&id).expect("queued request is known");
        if lane != CRIT {
            self.last_nc_dispatch = now;
            self.cap
                .on_noncritical_dispatch(paced_bytes(e.info.op, e.info.len), now);
        }
        debug_assert_eq!(e.loc, Location::Queued);
        debug_assert_eq!(e.lane, lane);
        e.loc = Location::AtDevice;
        e.dispatched = now;
        e.nc_at_dispatch = nc_inflight;
        e.nc_seq = nc_seq;
        (id, e)
    }

    /// Counts a dispatch from `lane`. Returns the non-critical requests at
    /// the device before it, and how many had been sent so far (what its
    /// completion needs to tell whether background shared the device with
    /// it).
    fn send_from(&mut self, lane: usize, now: Nanos) -> (u32, u64) {
        let before = (self.inflight[NONCRIT], self.nc_dispatched());
        let pool = if lane == CRIT { CRIT } else { NONCRIT };
        self.inflight[pool] += 1;
        self.lane_inflight[lane] += 1;
        self.last_dispatch[lane] = now;
        self.tokens_left[lane] = self.tokens_left[lane].saturating_sub(1);
        self.counters.lane_dispatches[lane] += 1;
        before
    }

    /// Records that a request sent by [`Scheduler::submit_direct`]
    /// completed; `payload` is what [`Completed`] carries back.
    pub fn complete_direct(&mut self, d: Direct, payload: P, now: Nanos) -> Completed<P> {
        self.direct -= 1;
        let timed = d.timed;
        let (device_time, admitted) = self.retire(CRIT, CRIT, d, now);
        Completed {
            payload,
            class: Class::Critical,
            admission_wait: 0,
            queue_wait: 0,
            device_time,
            timed,
            admitted,
        }
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
        if e.class == Class::NonCritical && self.cfg.classes {
            self.ncio.remove(id, e.info.offset);
        }
        let sent = Direct {
            op: e.info.op,
            len: e.info.len,
            dispatched: e.dispatched,
            timed: true,
            nc_at_dispatch: e.nc_at_dispatch,
            nc_seq: e.nc_seq,
        };
        let (device_time, admitted) = self.retire(e.lane, e.slot, sent, now);
        Completed {
            payload: e.payload,
            class: e.class,
            admission_wait: e.queued.saturating_sub(e.submitted),
            queue_wait: e.dispatched.saturating_sub(e.queued),
            device_time,
            timed: true,
            admitted,
        }
    }

    /// A request sent from `lane`, holding a slot of pool `slot`, left the
    /// device: frees both, feeds the cap and the lane's think time, and
    /// admits the next request waiting for that pool. Returns its device
    /// time and the request admitted, if any.
    fn retire(
        &mut self,
        lane: usize,
        slot: usize,
        sent: Direct,
        now: Nanos,
    ) -> (Nanos, Vec<ReqId>) {
        let pool = if lane == CRIT { CRIT } else { NONCRIT };
        self.inflight[pool] -= 1;
        self.lane_inflight[lane] -= 1;
        self.slots_used[slot] -= 1;
        let device_time = if sent.timed {
            now.saturating_sub(sent.dispatched)
        } else {
            0
        };
        if lane != CRIT {
            self.cap
                .on_noncritical_complete(paced_bytes(sent.op, sent.len), now);
        } else if self.cfg.classes {
            if sent.op == Op::Write {
                self.cap.on_critical_written(sent.len);
            }
            // Background sent after it (in the same dispatch turn, say)
            // shared the device with it too.
            let nc_alongside = sent.nc_at_dispatch + u32::from(self.nc_dispatched() > sent.nc_seq);
            if sent.timed {
                let stall =
                    self.cap
                        .on_critical_complete(device_time, nc_alongside, sent.dispatched, now);
                self.counters.cap_stalls += u64::from(stall);
            } else {
                self.cap.on_critical_untimed(now);
            }
        }
        if self.cfg.classes {
            self.lane_completed(lane, now);
        }
        let mut admitted = Vec::new();
        if let Some(next) = self.admission[slot].pop_front() {
            self.admit(next, now);
            admitted.push(next);
        }
        (device_time, admitted)
    }

    /// A request of `lane` completed: if the lane has nothing more queued
    /// or at the device, its think time starts, and with anticipation on a
    /// window opens for it when its mean think time fits the window.
    fn lane_completed(&mut self, lane: usize, now: Nanos) {
        if !self.queues[lane].is_empty() || self.lane_inflight[lane] > 0 {
            return;
        }
        self.think[lane].idle_since = Some(now);
        let window = self.cfg.anticipation;
        if window == 0 || lane == LANES - 1 {
            return;
        }
        if self
            .antic
            .is_some_and(|(served, until)| served < lane && now < until)
        {
            return; // a higher lane's window stays
        }
        if !self.cfg.think_time || self.think[lane].worth_waiting(window) {
            self.antic = Some((lane, now + window));
        } else {
            self.counters.anticipation_skipped += 1;
            if self.antic.is_some_and(|(served, _)| served == lane) {
                self.antic = None;
            }
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
        let (loc, offset, lane) = (e.loc, e.info.offset, e.lane);
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
                let at = position(&self.queues[lane], |&(r, _)| r == id);
                let queued = self.queues[lane].remove(at).expect("in range");
                // It keeps its non-critical slot; it now competes as critical.
                self.reqs.get_mut(&id).expect("checked above").lane = CRIT;
                self.queues[CRIT].push_back(queued);
                self.antic = None;
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
        let window = self.antic.map(|(_, until)| until);
        [window, self.cap.probe_deadline(), paced]
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
        self.queues.iter().any(|q| !q.is_empty())
    }

    /// How many requests are outstanding (anywhere).
    pub fn outstanding(&self) -> usize {
        self.reqs.len() + self.direct as usize
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
        let nc = self.queues[1..].iter().map(VecDeque::len).sum();
        [self.queues[CRIT].len(), nc]
    }

    /// Requests queued per lane (critical, then background levels).
    pub fn queued_per_lane(&self) -> [usize; LANES] {
        std::array::from_fn(|lane| self.queues[lane].len())
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

    /// The background's own write throughput as the adaptive cap last
    /// estimated it, in bytes/s (None: no estimate, or a fixed cap).
    pub fn background_own_rate(&self) -> Option<f64> {
        self.cap.own_rate()
    }

    /// The core's counters.
    pub fn counters(&self) -> SchedCounters {
        self.counters
    }

    /// Checks every structural invariant (costly: tests and debug builds).
    #[cfg(any(test, debug_assertions))]
    pub fn check_invariants(&self) {
        let mut waiting = [0usize; 2];
        let mut queued = [0usize; LANES];
        let mut at_device = [0u32; LANES];
        let mut slots = [0u32; 2];
        at_device[CRIT] = self.direct;
        slots[CRIT] = self.direct;
        for e in self.reqs.values() {
            match e.loc {
                Location::AwaitingAdmission => waiting[self.pool(e.class)] += 1,
                Location::Queued => {
                    assert_eq!(
                        e.lane,
                        self.lane_of(e.class, e.info.level),
                        "lane of a queued request"
                    );
                    queued[e.lane] += 1;
                }
                Location::AtDevice => at_device[e.lane] += 1,
            }
            if e.loc != Location::AwaitingAdmission {
                slots[e.slot] += 1;
            }
        }
        for pool in [CRIT, NONCRIT] {
            assert_eq!(
                waiting[pool],
                self.admission[pool].len(),
                "admission pool {pool}"
            );
            assert_eq!(slots[pool], self.slots_used[pool], "slots pool {pool}");
            assert!(self.slots_used[pool] <= self.pool_size(pool));
        }
        for lane in 0..LANES {
            assert_eq!(queued[lane], self.queues[lane].len(), "queue lane {lane}");
            assert_eq!(
                at_device[lane], self.lane_inflight[lane],
                "inflight lane {lane}"
            );
        }
        assert_eq!(at_device[CRIT], self.inflight[CRIT]);
        assert_eq!(at_device[1..].iter().sum::<u32>(), self.inflight[NONCRIT]);
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
