//! Tick-harness tests of the scheduler core: explicit time, explicit
//! completions, and checks of what each class received.

use super::cap::NoncriticalCap;
use super::sched::{
    Direct, FastRoom, LaneTokens, Location, Promotion, ReqInfo, SchedConfig, Scheduler, LANES,
};
use super::ReqId;
use crate::class::Class::{self, Critical as C, NonCritical as N};
use crate::device::Op;
use crate::time::{Nanos, MS, US};

struct Harness {
    s: Scheduler<Class>,
    now: Nanos,
    next: ReqId,
    at_device: Vec<ReqId>,
    dispatched: Vec<(ReqId, Class)>,
}

fn cfg() -> SchedConfig {
    SchedConfig {
        classes: true,
        critical_slots: 4,
        noncritical_slots: 4,
        starvation_period: 10 * MS,
        noncritical_cap: NoncriticalCap::Fixed(1),
        anticipation: 0,
        think_time: true,
        tokens: LaneTokens::default(),
        device_depth: 8,
    }
}

impl Harness {
    fn new(cfg: SchedConfig) -> Self {
        Self {
            s: Scheduler::new(cfg),
            now: 0,
            next: 1,
            at_device: Vec::new(),
            dispatched: Vec::new(),
        }
    }

    /// Submits a 4 KiB read; returns (id, admitted).
    fn submit(&mut self, class: Class) -> (ReqId, bool) {
        self.submit_op(class, Op::Read, 4096)
    }

    /// Submits a request; returns (id, admitted).
    fn submit_op(&mut self, class: Class, op: Op, len: u64) -> (ReqId, bool) {
        self.submit_at_level(class, 0, op, len)
    }

    /// Submits a 4 KiB non-critical read at a background level.
    fn submit_bg(&mut self, level: u8) -> ReqId {
        self.submit_at_level(N, level, Op::Read, 4096).0
    }

    fn submit_at_level(&mut self, class: Class, level: u8, op: Op, len: u64) -> (ReqId, bool) {
        let id = self.next;
        self.next += 1;
        let info = ReqInfo {
            class,
            level,
            op,
            offset: id * len,
            len,
        };
        let admitted = self.s.submit(id, info, class, self.now);
        self.s.check_invariants();
        (id, admitted)
    }

    /// Sends a 4 KiB read of `class` straight to the device if the core
    /// allows it ([`Scheduler::submit_direct`]).
    fn direct(&mut self, class: Class) -> Option<Direct> {
        let info = ReqInfo {
            class,
            level: 0,
            op: Op::Read,
            offset: 0,
            len: 4096,
        };
        let d = self.s.submit_direct(&info, self.now);
        self.s.check_invariants();
        d
    }

    fn complete_direct(&mut self, d: Direct) -> Vec<ReqId> {
        let done = self.s.complete_direct(d, C, self.now);
        self.s.check_invariants();
        assert_eq!((done.admission_wait, done.queue_wait), (0, 0));
        done.admitted
    }

    /// Dispatches everything allowed now; returns the classes, in order.
    fn dispatch(&mut self) -> Vec<Class> {
        let mut got = Vec::new();
        while let Some(id) = self.s.dispatch(self.now) {
            let class = self.s.class_of(id).unwrap();
            self.at_device.push(id);
            self.dispatched.push((id, class));
            got.push(class);
        }
        self.s.check_invariants();
        got
    }

    fn complete(&mut self, id: ReqId) -> Vec<ReqId> {
        self.at_device.retain(|&r| r != id);
        let done = self.s.complete(id, self.now);
        self.s.check_invariants();
        done.admitted
    }

    fn complete_oldest(&mut self) -> ReqId {
        let id = self.at_device[0];
        self.complete(id);
        id
    }

    /// How many requests went to the device in `class`.
    fn dispatched_in(&self, class: Class) -> usize {
        self.dispatched.iter().filter(|(_, c)| *c == class).count()
    }

    fn advance(&mut self, by: Nanos) {
        self.now += by;
    }
}

#[test]
fn critical_requests_always_go_first() {
    let mut h = Harness::new(cfg());
    h.advance(100 * MS); // long after start: no request counts as starving
    let n1 = h.submit(N).0;
    let c1 = h.submit(C).0;
    let c2 = h.submit(C).0;
    h.dispatch();
    let order: Vec<ReqId> = h.dispatched.iter().map(|d| d.0).collect();
    assert_eq!(
        order,
        vec![c1, c2, n1],
        "critical first, then non-critical within the cap"
    );
}

#[test]
fn fifo_within_a_class() {
    let mut h = Harness::new(cfg());
    h.advance(MS);
    let ids: Vec<ReqId> = (0..4).map(|_| h.submit(C).0).collect();
    h.dispatch();
    let order: Vec<ReqId> = h.dispatched.iter().map(|d| d.0).collect();
    assert_eq!(order, ids);
}

#[test]
fn noncritical_is_dispatched_within_one_period_under_a_critical_flood() {
    let mut h = Harness::new(SchedConfig {
        critical_slots: 64,
        device_depth: 2,
        ..cfg()
    });
    h.advance(MS);
    let n = h.submit(N).0;
    // A flood: the device is always full of critical requests and more wait.
    for _ in 0..40 {
        h.submit(C);
    }
    h.dispatch();
    let mut served_at = None;
    for step in 0..200 {
        h.advance(100 * US);
        h.complete_oldest();
        h.submit(C);
        h.dispatch();
        if h.dispatched.iter().any(|&(id, _)| id == n) {
            served_at = Some(step);
            break;
        }
    }
    let served_at = served_at.expect("non-critical request starved");
    // Queued at 1 ms, 100 µs per step: served within one period of queueing.
    let waited = h.now - MS;
    assert!(
        waited >= 10 * MS,
        "it waited its turn behind critical work ({waited} ns)"
    );
    assert!(
        waited <= 10 * MS + 100 * US,
        "served after {waited} ns (step {served_at})"
    );
    assert!(h.s.counters().starvation_dispatches >= 1);
}

#[test]
fn the_noncritical_cap_holds() {
    let mut h = Harness::new(SchedConfig {
        noncritical_cap: NoncriticalCap::Fixed(2),
        ..cfg()
    });
    h.advance(MS);
    for _ in 0..4 {
        h.submit(N);
    }
    assert_eq!(h.dispatch(), vec![N, N], "two at most");
    assert_eq!(h.s.inflight(), [0, 2]);
    h.advance(20 * MS); // even the starvation timer respects a filled cap
    assert!(h.dispatch().is_empty());
    h.complete_oldest();
    assert_eq!(h.dispatch(), vec![N]);
}

#[test]
fn zero_cap_means_unlimited_up_to_the_device_depth() {
    let mut h = Harness::new(SchedConfig {
        noncritical_cap: NoncriticalCap::Fixed(0),
        noncritical_slots: 16,
        ..cfg()
    });
    h.advance(MS);
    for _ in 0..12 {
        h.submit(N);
    }
    assert_eq!(h.dispatch().len(), 8, "device depth bounds it");
}

#[test]
fn separate_pools_keep_critical_slots_free_of_a_background_burst() {
    let mut h = Harness::new(cfg());
    let admitted: Vec<bool> = (0..6).map(|_| h.submit(N).1).collect();
    assert_eq!(admitted, vec![true, true, true, true, false, false]);
    assert!(h.submit(C).1, "a critical request still gets a slot");
    assert_eq!(h.s.awaiting_admission(), [0, 2]);
}

#[test]
fn a_completion_admits_the_oldest_waiter_of_its_pool() {
    let mut h = Harness::new(cfg());
    h.advance(20 * MS);
    let first: Vec<ReqId> = (0..4).map(|_| h.submit(N).0).collect();
    let (w1, ok1) = h.submit(N);
    let (_w2, ok2) = h.submit(N);
    assert!(!ok1 && !ok2);
    h.dispatch();
    assert_eq!(h.complete(first[0]), vec![w1]);
    assert_eq!(h.s.location(w1), Some(Location::Queued));
}

#[test]
fn promotion_while_awaiting_admission_grants_a_critical_slot() {
    let mut h = Harness::new(cfg());
    for _ in 0..4 {
        h.submit(N);
    }
    let (w, admitted) = h.submit(N);
    assert!(!admitted);
    assert_eq!(h.s.promote(w, h.now), Promotion::Admitted);
    assert_eq!(h.s.location(w), Some(Location::Queued));
    assert_eq!(h.s.class_of(w), Some(C));
    h.s.check_invariants();
    assert_eq!(h.s.counters().promoted_awaiting_admission, 1);
    assert_eq!(h.s.promote(w, h.now), Promotion::AlreadyCritical);
}

#[test]
fn promotion_waits_in_the_critical_pool_when_it_is_full() {
    let mut h = Harness::new(cfg());
    for _ in 0..4 {
        h.submit(C);
        h.submit(N);
    }
    let (w, _) = h.submit(N);
    assert_eq!(h.s.promote(w, h.now), Promotion::WaitsInCriticalPool);
    h.advance(MS);
    h.dispatch();
    let crit = h.dispatched.iter().find(|d| d.1 == C).unwrap().0;
    assert_eq!(
        h.complete(crit),
        vec![w],
        "admitted by the next critical completion"
    );
}

#[test]
fn promotion_of_a_queued_request_moves_it_to_the_critical_queue() {
    let mut h = Harness::new(cfg());
    h.advance(MS);
    let n1 = h.submit(N).0;
    let n2 = h.submit(N).0;
    assert_eq!(h.dispatch(), vec![N]); // n1 fills the cap; n2 stays queued
    assert_eq!(h.s.location(n2), Some(Location::Queued));
    assert_eq!(h.s.promote(n2, h.now), Promotion::Requeued);
    assert_eq!(h.dispatch(), vec![C], "n2 is now dispatched past the cap");
    assert_eq!(h.dispatched.last().unwrap().0, n2);
    assert_eq!(h.s.promote(n1, h.now), Promotion::AtDevice);
    assert_eq!(h.s.counters().promoted_queued, 1);
    assert_eq!(h.s.counters().promoted_at_device, 1);
}

#[test]
fn noncritical_requests_are_findable_by_range_until_they_complete() {
    let mut h = Harness::new(cfg());
    h.advance(MS);
    let n = h.submit(N).0;
    let offset = n * 4096;
    assert_eq!(h.s.noncritical_overlapping(offset + 100, 1), vec![n]);
    h.dispatch();
    assert_eq!(h.s.location(n), Some(Location::AtDevice));
    assert_eq!(
        h.s.noncritical_overlapping(offset, 4096),
        vec![n],
        "at the device"
    );
    h.complete(n);
    assert!(h.s.noncritical_overlapping(offset, 4096).is_empty());
    assert_eq!(h.s.promote(n, h.now), Promotion::NotFound);
}

#[test]
fn anticipation_holds_noncritical_after_a_critical_completion_until_broken() {
    let mut h = Harness::new(SchedConfig {
        anticipation: 2 * MS,
        ..cfg()
    });
    h.advance(MS);
    let c = h.submit(C).0;
    h.submit(N);
    assert_eq!(
        h.dispatch(),
        vec![C],
        "held while the critical request is at the device"
    );
    h.advance(100 * US);
    h.complete(c);
    assert!(h.dispatch().is_empty(), "window open: non-critical held");
    assert_eq!(h.s.next_timer(h.now), Some(h.now + 2 * MS));
    h.advance(500 * US);
    assert!(h.dispatch().is_empty());
    let c2 = h.submit(C).0; // a critical arrival ends the window...
    assert_eq!(h.dispatch(), vec![C]);
    h.complete(c2); // ...and its completion opens the next one
    assert!(h.dispatch().is_empty());
    assert!(h.s.counters().anticipation_holds >= 3);

    // A window that expires lets the held request go.
    h.advance(2 * MS);
    assert_eq!(h.dispatch(), vec![N]);
}

#[test]
fn anticipation_never_starves_background_past_the_period() {
    let mut h = Harness::new(SchedConfig {
        anticipation: 2 * MS,
        ..cfg()
    });
    h.advance(MS);
    let n = h.submit(N).0;
    for _ in 0..200 {
        let c = h.submit(C).0;
        h.dispatch();
        h.advance(200 * US);
        h.complete(c);
        if h.dispatched.iter().any(|&(id, _)| id == n) {
            break;
        }
    }
    assert!(h.dispatched.iter().any(|&(id, _)| id == n), "starved");
    assert!(
        h.now <= MS + 10 * MS + 400 * US,
        "within one period: {}",
        h.now
    );
}

#[test]
fn without_classes_everything_shares_one_fifo_and_pool() {
    let mut h = Harness::new(SchedConfig {
        classes: false,
        noncritical_cap: NoncriticalCap::Fixed(0),
        ..cfg()
    });
    let ids: Vec<ReqId> = [N, C, N, C].into_iter().map(|c| h.submit(c).0).collect();
    h.dispatch();
    let order: Vec<ReqId> = h.dispatched.iter().map(|d| d.0).collect();
    assert_eq!(order, ids, "one FIFO");
    let admitted = (0..8).filter(|_| h.submit(N).1).count();
    assert_eq!(admitted, 4, "one pool of 4 + 4 slots, 4 already used");
    assert_eq!(h.s.promote(ids[0], h.now), Promotion::AlreadyCritical);
}

/// A harness under the adaptive cap with `min_share` and
/// `starvation_period`, after five clean 1 ms critical requests (its
/// baseline).
fn baselined_auto(min_share: f64, starvation_period: Nanos) -> Harness {
    use super::cap::AutoCapConfig;
    let mut h = Harness::new(SchedConfig {
        noncritical_cap: NoncriticalCap::Auto(AutoCapConfig {
            min_share,
            ..AutoCapConfig::default()
        }),
        starvation_period,
        ..cfg()
    });
    for _ in 0..5 {
        h.submit(C);
        h.dispatch();
        h.advance(MS);
        h.complete_oldest();
    }
    h
}

/// Under the adaptive cap, critical latency kept 3x above its clean
/// baseline by background writes paces them down to the floor; a background
/// read is not held by pacing (it leaves nothing in the device's write
/// cache), a background write is.
#[test]
fn pacing_holds_background_writes_not_reads() {
    // The configured floor alone (the share of background's own
    // throughput: see the next test).
    let mut h = baselined_auto(0.0, cfg().starvation_period);
    let mut submitted = 0;
    for _ in 0..12 * 16 {
        // A new background write once the last one went (no backlog).
        if h.dispatched_in(N) == submitted {
            h.submit_op(N, Op::Write, 400 << 10);
            submitted += 1;
        }
        h.submit(C);
        h.dispatch();
        h.advance(3 * MS);
        while !h.at_device.is_empty() {
            h.complete_oldest();
        }
    }
    let rate = h.s.pacing_rate().expect("paced") / f64::from(1 << 20);
    assert!(rate <= 16.0, "paced near the floor: {rate} MiB/s");
    // One more write goes when the bucket (or the starvation timer) lets
    // it, and leaves the bucket empty.
    if h.dispatched_in(N) == submitted {
        h.submit_op(N, Op::Write, 1 << 20);
    }
    for _ in 0..50 {
        if !h.dispatch().is_empty() {
            break;
        }
        h.advance(MS);
    }
    assert_eq!(h.at_device.len(), 1, "the write went");
    h.complete_oldest();
    h.submit_op(N, Op::Read, 1 << 20);
    assert_eq!(h.dispatch(), vec![N], "a read is not paced");
    h.complete_oldest();
    h.submit_op(N, Op::Write, 1 << 20);
    assert!(h.dispatch().is_empty(), "a write waits for its tokens");
}

/// Background MiB/s written in the last 1.5 s of 3 s in which a critical
/// request is sent each step and a background write of 400 KiB is always
/// queued, one at a time at the device, as on a device with a write cache:
/// a step takes 3 ms (the critical request 3x its clean 1 ms) while a
/// background write is at the device or completed in the last 20 ms, 1 ms
/// otherwise; 130 MiB/s unpaced. The starvation period is long, so
/// pacing alone decides.
fn backlogged_background_rate(min_share: f64) -> f64 {
    let mut h = baselined_auto(min_share, 1000 * MS);
    let start = h.now;
    let mut submitted = 0;
    let mut late = 0;
    let mut last_write: Option<Nanos> = None;
    while h.now < start + 3000 * MS {
        // Always one write queued behind the one at the device.
        while submitted < h.dispatched_in(N) + 1 {
            h.submit_op(N, Op::Write, 400 << 10);
            submitted += 1;
        }
        h.submit(C);
        let wrote = h.dispatch().contains(&N);
        if wrote && h.now >= start + 1500 * MS {
            late += 1;
        }
        let dirty = wrote || last_write.is_some_and(|t| h.now - t < 20 * MS);
        h.advance(if dirty { 3 * MS } else { MS });
        if wrote {
            last_write = Some(h.now);
        }
        while !h.at_device.is_empty() {
            h.complete_oldest();
        }
    }
    f64::from(late) * 400.0 / 1024.0 / 1.5
}

/// Pacing keeps `min_share` (half, by default) of what a background that
/// always has work writes when pacing does not hold it, however far above
/// target critical latency stays; with the share off, it falls to the
/// configured floor.
#[test]
fn pacing_keeps_half_of_the_backgrounds_own_throughput() {
    let own = 400.0 / 1024.0 / 0.003; // 130 MiB/s
    let kept = backlogged_background_rate(0.5);
    assert!(
        (0.4 * own..=0.75 * own).contains(&kept),
        "half of {own:.0} MiB/s kept: {kept:.1}"
    );
    let floor = backlogged_background_rate(0.0);
    assert!(floor < 0.2 * own, "share off: {floor:.1} MiB/s");
}

/// A critical request with background sent to the device after it, in
/// the same dispatch turn, shared the device as much as one sent behind
/// background: its device time is not a clean sample for the adaptive
/// cap's baseline (it was, and a device's first busy moment after a quiet
/// spell set the baseline that every later window was judged against).
#[test]
fn background_sent_after_a_critical_request_makes_its_sample_mixed() {
    use super::cap::AutoCapConfig;
    let mut h = Harness::new(SchedConfig {
        noncritical_cap: NoncriticalCap::Auto(AutoCapConfig::default()),
        ..cfg()
    });
    h.submit(C);
    h.submit_op(N, Op::Write, 64 << 10);
    assert_eq!(h.dispatch(), vec![C, N], "the critical one goes first");
    h.advance(5 * MS);
    h.complete_oldest();
    h.complete_oldest();
    assert_eq!(h.s.cap_view().0, None, "no clean sample yet");
    // Alone, after the device settled, a critical request is clean.
    h.advance(100 * MS);
    h.submit(C);
    h.dispatch();
    h.advance(MS);
    h.complete_oldest();
    assert_eq!(h.s.cap_view().0, Some(MS as f64));
}

/// A probe of the adaptive cap holds background work until the device has
/// settled and clean critical samples arrive, then lets it go: with
/// background always queued and a critical request every millisecond, the
/// longest pause in background dispatch is the probe's (settle_ms, 20 ms,
/// plus a few samples), not the starvation period and not probe_max_ms.
#[test]
fn a_probe_pauses_background_briefly_and_ends_on_clean_samples() {
    use super::cap::AutoCapConfig;
    let mut h = Harness::new(SchedConfig {
        noncritical_cap: NoncriticalCap::Auto(AutoCapConfig::default()),
        ..cfg()
    });
    let mut submitted = 0;
    let mut nc_times = Vec::new();
    for _ in 0..2500 {
        if h.dispatched_in(N) == submitted {
            h.submit_op(N, Op::Write, 64 << 10);
            submitted += 1;
        }
        h.submit(C);
        for class in h.dispatch() {
            if class == N {
                nc_times.push(h.now);
            }
        }
        h.advance(MS);
        while !h.at_device.is_empty() {
            h.complete_oldest();
        }
    }
    let longest = nc_times.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    assert!(
        (15 * MS..40 * MS).contains(&longest),
        "longest background pause {} ms",
        longest / MS
    );
}

/// Which lane each dispatched request came from, in order.
fn lanes_of(h: &Harness, levels: &std::collections::HashMap<ReqId, usize>) -> Vec<usize> {
    h.dispatched.iter().map(|(id, _)| levels[id]).collect()
}

#[test]
fn background_levels_are_served_in_order_and_a_level_past_the_last_is_clamped() {
    let mut h = Harness::new(SchedConfig {
        noncritical_cap: NoncriticalCap::Fixed(0),
        noncritical_slots: 8,
        ..cfg()
    });
    let mut lane = std::collections::HashMap::new();
    for level in [2u8, 0, 200, 1] {
        lane.insert(h.submit_bg(level), 1 + usize::from(level.min(7)));
    }
    let c = h.submit(C).0;
    lane.insert(c, 0);
    h.dispatch();
    assert_eq!(lanes_of(&h, &lane), vec![0, 1, 2, 3, 8]);
    assert_eq!(h.s.counters().lane_dispatches[8], 1, "level 200 is level 7");
}

#[test]
fn a_lane_that_used_its_tokens_yields_until_the_others_had_theirs() {
    // One request at the device at a time, so every dispatch is a decision.
    let mut h = Harness::new(SchedConfig {
        noncritical_cap: NoncriticalCap::Fixed(0),
        critical_slots: 16,
        noncritical_slots: 16,
        device_depth: 1,
        tokens: LaneTokens::from_slice(&[3, 2, 1]).unwrap(),
        ..cfg()
    });
    let mut lane = std::collections::HashMap::new();
    for _ in 0..8 {
        lane.insert(h.submit(C).0, 0);
        lane.insert(h.submit_bg(0), 1);
        lane.insert(h.submit_bg(1), 2);
    }
    for _ in 0..12 {
        h.dispatch();
        h.complete_oldest();
    }
    assert_eq!(
        lanes_of(&h, &lane),
        vec![0, 0, 0, 1, 1, 2, 0, 0, 0, 1, 1, 2],
        "each lane its budget per round, highest first"
    );
    assert_eq!(h.s.counters().token_rounds, 1);

    // With the other lanes empty, a lane past its budget is not held back.
    let mut h = Harness::new(SchedConfig {
        device_depth: 1,
        tokens: LaneTokens::from_slice(&[1, 1]).unwrap(),
        ..cfg()
    });
    for _ in 0..3 {
        h.submit(C);
    }
    for _ in 0..3 {
        assert_eq!(h.dispatch(), vec![C]);
        h.complete_oldest();
    }
}

#[test]
fn anticipation_opens_only_for_a_lane_whose_think_time_fits_the_window() {
    let mut h = Harness::new(SchedConfig {
        anticipation: 2 * MS,
        ..cfg()
    });
    h.advance(MS);
    // A critical stream that thinks 5 ms between requests, longer than the
    // window: after its first think time is measured, no window opens.
    let mut held_after = Vec::new();
    for _ in 0..4 {
        let c = h.submit(C).0;
        h.dispatch();
        h.advance(100 * US);
        h.complete(c);
        let n = h.submit(N).0;
        held_after.push(h.dispatch().is_empty());
        if held_after.last() == Some(&true) {
            h.advance(2 * MS);
            assert_eq!(h.dispatch(), vec![N], "the window ends");
        }
        h.complete(n);
        h.advance(5 * MS);
    }
    assert_eq!(
        held_after,
        vec![true, false, false, false],
        "no history: anticipate; then the measured 5 ms think time rules it out"
    );
    // Three for the critical lane, three for the background one (it too
    // thinks 5 ms).
    assert_eq!(h.s.counters().anticipation_skipped, 6);

    // A stream that comes back within the window is anticipated again.
    for _ in 0..20 {
        let c = h.submit(C).0;
        h.dispatch();
        h.advance(100 * US);
        h.complete(c);
        h.advance(500 * US);
    }
    let c = h.submit(C).0;
    h.dispatch();
    h.complete(c);
    h.submit(N);
    assert!(h.dispatch().is_empty(), "mean think time now fits: held");

    // With the heuristic off, a slow stream gets a window every time.
    let mut h = Harness::new(SchedConfig {
        anticipation: 2 * MS,
        think_time: false,
        ..cfg()
    });
    for _ in 0..4 {
        h.advance(5 * MS);
        let c = h.submit(C).0;
        h.dispatch();
        h.complete(c);
        let n = h.submit(N).0;
        assert!(h.dispatch().is_empty(), "held");
        h.advance(2 * MS);
        h.dispatch();
        h.complete(n);
    }
    assert_eq!(h.s.counters().anticipation_skipped, 0);
}

#[test]
fn a_background_level_anticipates_for_itself_not_over_higher_lanes() {
    let mut h = Harness::new(SchedConfig {
        anticipation: 2 * MS,
        noncritical_cap: NoncriticalCap::Fixed(0),
        ..cfg()
    });
    h.advance(MS);
    let hi = h.submit_bg(0);
    h.submit_bg(3);
    assert_eq!(
        h.dispatch().len(),
        1,
        "level 3 waits while level 0 is at the device"
    );
    h.complete(hi);
    assert!(h.dispatch().is_empty(), "and for level 0's window");
    h.submit(C);
    assert_eq!(
        h.dispatch(),
        vec![C],
        "a higher lane is never held by a lower one's window"
    );
    h.complete_oldest();
    h.advance(2 * MS + 1);
    assert_eq!(h.dispatch(), vec![N], "both windows over");
}

#[test]
fn a_lane_past_its_token_budget_holds_no_window() {
    let mut h = Harness::new(SchedConfig {
        anticipation: 2 * MS,
        tokens: LaneTokens::from_slice(&[2, 1]).unwrap(),
        ..cfg()
    });
    h.advance(MS);
    h.submit(N);
    let c = h.submit(C).0;
    assert_eq!(
        h.dispatch(),
        vec![C],
        "held while the critical lane has budget"
    );
    h.advance(100 * US);
    h.complete(c);
    assert!(h.dispatch().is_empty(), "and for its window");
    h.advance(100 * US);
    h.submit(C);
    assert_eq!(
        h.dispatch(),
        vec![C, N],
        "the critical lane used its budget: it no longer holds background"
    );
}

#[test]
fn the_starvation_timer_serves_the_level_that_waited_longest() {
    let mut h = Harness::new(SchedConfig {
        anticipation: 2 * MS,
        device_depth: 1,
        ..cfg()
    });
    h.advance(MS);
    let low = h.submit_bg(6);
    h.advance(MS);
    h.submit_bg(0);
    let mut got_low = None;
    for _ in 0..100 {
        h.submit(C);
        h.dispatch();
        h.advance(500 * US);
        h.complete_oldest();
        if got_low.is_none() && h.dispatched.iter().any(|&(id, _)| id == low) {
            got_low = Some(h.now);
        }
    }
    let at = got_low.expect("the lowest level is served");
    assert!(
        at <= 12 * MS + 500 * US,
        "within a period of its arrival: {at}"
    );
}

#[test]
fn lane_tokens_parse_from_a_list_and_refuse_too_many() {
    #[derive(serde::Deserialize)]
    struct T {
        tokens: LaneTokens,
    }
    let t: T = toml::from_str("tokens = [16, 4, 2]").unwrap();
    assert_eq!(&t.tokens.0[..4], &[16, 4, 2, 0]);
    assert!(t.tokens.enabled());
    let e = toml::from_str::<T>(&format!("tokens = {:?}", vec![1; LANES + 1]))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("lanes"), "{e}");
    assert!(!LaneTokens::default().enabled());
}

/// A request goes straight to the device only when the core would have
/// dispatched it at once: critical, nothing queued, nobody waiting for a
/// critical slot, a slot free and room at the device. It holds its slot
/// and its place at the device like any other until it completes.
#[test]
fn a_request_goes_direct_only_when_the_core_would_send_it_at_once() {
    let mut h = Harness::new(SchedConfig {
        critical_slots: 2,
        device_depth: 3,
        ..cfg()
    });
    h.advance(MS);
    assert!(h.direct(N).is_none(), "non-critical requests are queued");
    let a = h.direct(C).expect("an idle core sends it");
    assert_eq!(h.s.inflight(), [1, 0]);
    assert_eq!(h.s.outstanding(), 1);
    assert_eq!(h.s.counters().lane_dispatches[0], 1);
    let b = h.direct(C).expect("a second critical slot");
    assert!(h.direct(C).is_none(), "the critical slots are taken");
    let (waiter, admitted) = h.submit(C);
    assert!(!admitted);
    assert_eq!(
        h.complete_direct(a),
        vec![waiter],
        "its slot goes to the waiter"
    );
    assert!(h.direct(C).is_none(), "the waiter is queued ahead of it");
    assert_eq!(h.dispatch(), vec![C]);
    h.complete(waiter);
    // Background queued (the cap lets one go at a time) comes first.
    let (n1, _) = h.submit(N);
    h.dispatch();
    let (_n2, _) = h.submit(N);
    assert!(h.direct(C).is_none(), "a background request is queued");
    h.complete(n1);
    h.dispatch();
    assert_eq!(h.s.inflight(), [1, 1]);
    h.complete_direct(b);
    assert_eq!(h.s.inflight(), [0, 1]);
    // A full device takes nothing more, whatever slots are free.
    let mut h = Harness::new(SchedConfig {
        device_depth: 2,
        ..cfg()
    });
    let c = h.direct(C).unwrap();
    let d = h.direct(C).unwrap();
    assert!(h.direct(C).is_none(), "the device's depth is reached");
    h.complete_direct(c);
    h.complete_direct(d);
    assert_eq!(h.s.outstanding(), 0);
}

/// With classes off (the none scheme) every request is in the one lane,
/// so a background one goes direct too.
#[test]
fn without_classes_any_request_may_go_direct() {
    let mut h = Harness::new(SchedConfig {
        classes: false,
        ..cfg()
    });
    let d = h.direct(N).expect("one lane, idle");
    h.complete_direct(d);
    assert_eq!(h.s.outstanding(), 0);
}

/// A request sent directly is a clean sample for the adaptive cap, as a
/// queued one is, and background dispatched while it is at the device
/// makes it a mixed one.
#[test]
fn a_direct_request_feeds_the_adaptive_cap() {
    use super::cap::AutoCapConfig;
    let mut h = Harness::new(SchedConfig {
        noncritical_cap: NoncriticalCap::Auto(AutoCapConfig::default()),
        ..cfg()
    });
    let d = h.direct(C).unwrap();
    h.submit_op(N, Op::Write, 64 << 10);
    assert_eq!(h.dispatch(), vec![N]);
    h.advance(5 * MS);
    h.complete_direct(d);
    h.complete_oldest();
    assert_eq!(h.s.cap_view().0, None, "background shared the device");
    h.advance(100 * MS);
    let d = h.direct(C).unwrap();
    h.advance(MS);
    h.complete_direct(d);
    assert_eq!(h.s.cap_view().0, Some(MS as f64), "alone: clean");
}

/// A differential test: scheduler A sends every request it can with
/// `submit_direct` (as the layer does for a request done in its
/// submitter's thread), B sends everything through submit, dispatch and
/// complete. Both get the same generated script of submissions (reads,
/// writes and flushes of both classes at several levels), promotions,
/// completions and clock steps, under five settings (the default,
/// anticipation with tokens, no classes, the adaptive cap, tokens without
/// think time). After every step every observable of the two cores is
/// equal (in flight, queued, waiting for admission, counters, the cap and
/// its view, pacing, the next timer, each completion and who it admits),
/// and a request A sent directly is exactly what B dispatches at once.
#[test]
fn direct_sends_account_exactly_as_queued_ones_under_generated_scripts() {
    use super::cap::AutoCapConfig;
    use std::collections::HashMap;
    enum Sent {
        Id(ReqId),
        Direct(Direct),
    }
    let configs = [
        cfg(),
        SchedConfig {
            anticipation: 2 * MS,
            tokens: LaneTokens::from_slice(&[3, 2, 1]).unwrap(),
            ..cfg()
        },
        SchedConfig {
            classes: false,
            critical_slots: 2,
            noncritical_slots: 2,
            ..cfg()
        },
        SchedConfig {
            noncritical_cap: NoncriticalCap::Auto(AutoCapConfig::default()),
            anticipation: MS,
            critical_slots: 2,
            device_depth: 3,
            ..cfg()
        },
        SchedConfig {
            noncritical_cap: NoncriticalCap::Auto(AutoCapConfig::default()),
            tokens: LaneTokens::from_slice(&[1, 1]).unwrap(),
            anticipation: 3 * MS,
            think_time: false,
            ..cfg()
        },
    ];
    let mut directs = 0;
    for (ci, c) in configs.iter().enumerate() {
        for seed in 1..150u64 {
            let mut a: Scheduler<u64> = Scheduler::new(*c);
            let mut b: Scheduler<u64> = Scheduler::new(*c);
            let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut next = || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let mut now: Nanos = 0;
            let mut n = 0u64; // logical request number
            let mut a_sent: HashMap<u64, Sent> = HashMap::new();
            let mut b_id: HashMap<u64, ReqId> = HashMap::new();
            let mut a_dev: Vec<u64> = Vec::new();
            let mut b_dev: Vec<u64> = Vec::new();
            let mut noncrit: Vec<u64> = Vec::new();
            let drain = |s: &mut Scheduler<u64>, now: Nanos, dev: &mut Vec<u64>| {
                let mut got = Vec::new();
                while let Some((_, _, p)) = s.dispatch_payload(now) {
                    got.push(*p);
                    dev.push(*p);
                }
                s.check_invariants();
                got
            };
            for step in 0..400 {
                let ctx = format!("config {ci} seed {seed} step {step}");
                let r = next();
                match r % 12 {
                    0..=4 => {
                        n += 1;
                        let class = if r % 12 <= 2 { C } else { N };
                        let op = [Op::Read, Op::Write, Op::Flush][(r >> 8) as usize % 3];
                        let len = if op == Op::Flush {
                            0
                        } else {
                            4096 << ((r >> 12) % 5)
                        };
                        let info = ReqInfo {
                            class,
                            level: ((r >> 20) % 4) as u8,
                            op,
                            offset: n * (1 << 20),
                            len,
                        };
                        let (ida, idb) = (n * 2, n * 2 + 1);
                        if let Some(d) = a.submit_direct(&info, now) {
                            directs += 1;
                            a.check_invariants();
                            a_sent.insert(n, Sent::Direct(d));
                            a_dev.push(n);
                            b.submit(idb, info, n, now);
                            b_id.insert(n, idb);
                            let got = drain(&mut b, now, &mut b_dev);
                            assert_eq!(
                                got,
                                vec![n],
                                "{ctx}: B would not send the direct one at once"
                            );
                        } else {
                            a.submit(ida, info, n, now);
                            a_sent.insert(n, Sent::Id(ida));
                            b.submit(idb, info, n, now);
                            b_id.insert(n, idb);
                            let ga = drain(&mut a, now, &mut a_dev);
                            let gb = drain(&mut b, now, &mut b_dev);
                            assert_eq!(ga, gb, "{ctx}: dispatches differ");
                        }
                        if class == N {
                            noncrit.push(n);
                        }
                    }
                    5 if !noncrit.is_empty() => {
                        let m = noncrit[(r >> 8) as usize % noncrit.len()];
                        let Sent::Id(ida) = a_sent[&m] else {
                            assert!(!c.classes, "{ctx}: noncritical sent direct");
                            continue;
                        };
                        let pa = a.promote(ida, now);
                        let pb = b.promote(b_id[&m], now);
                        assert_eq!(pa, pb, "{ctx}: promotion");
                        let ga = drain(&mut a, now, &mut a_dev);
                        let gb = drain(&mut b, now, &mut b_dev);
                        assert_eq!(ga, gb, "{ctx}: dispatches after promotion differ");
                    }
                    6..=9 if !a_dev.is_empty() => {
                        let m = a_dev[(r >> 8) as usize % a_dev.len()];
                        a_dev.retain(|&x| x != m);
                        assert!(b_dev.contains(&m), "{ctx}: {m} not at B's device");
                        b_dev.retain(|&x| x != m);
                        noncrit.retain(|&x| x != m);
                        let da = match a_sent.remove(&m).unwrap() {
                            Sent::Id(id) => a.complete(id, now),
                            Sent::Direct(d) => a.complete_direct(d, m, now),
                        };
                        let db = b.complete(b_id.remove(&m).unwrap(), now);
                        a.check_invariants();
                        b.check_invariants();
                        assert_eq!(
                            (
                                da.payload,
                                da.class,
                                da.admission_wait,
                                da.queue_wait,
                                da.device_time
                            ),
                            (
                                db.payload,
                                db.class,
                                db.admission_wait,
                                db.queue_wait,
                                db.device_time
                            ),
                            "{ctx}: completion"
                        );
                        let adm_a: Vec<u64> = da
                            .admitted
                            .iter()
                            .map(|id| *a.payload_mut(*id).unwrap())
                            .collect();
                        let adm_b: Vec<u64> = db
                            .admitted
                            .iter()
                            .map(|id| *b.payload_mut(*id).unwrap())
                            .collect();
                        assert_eq!(adm_a, adm_b, "{ctx}: admitted");
                        let ga = drain(&mut a, now, &mut a_dev);
                        let gb = drain(&mut b, now, &mut b_dev);
                        assert_eq!(ga, gb, "{ctx}: dispatches after completion differ");
                    }
                    _ => {
                        now += (r >> 8) % (4 * MS);
                        // the timer thread's kick
                        let ga = drain(&mut a, now, &mut a_dev);
                        let gb = drain(&mut b, now, &mut b_dev);
                        assert_eq!(ga, gb, "{ctx}: dispatches after time differ");
                    }
                }
                assert_eq!(a.inflight(), b.inflight(), "{ctx}: inflight");
                assert_eq!(a.queued_per_lane(), b.queued_per_lane(), "{ctx}: queued");
                assert_eq!(
                    a.awaiting_admission(),
                    b.awaiting_admission(),
                    "{ctx}: awaiting"
                );
                assert_eq!(a.outstanding(), b.outstanding(), "{ctx}: outstanding");
                assert_eq!(
                    format!("{:?}", a.counters()),
                    format!("{:?}", b.counters()),
                    "{ctx}: counters"
                );
                assert_eq!(a.noncritical_cap(), b.noncritical_cap(), "{ctx}: cap");
                assert_eq!(
                    format!("{:?}", a.cap_view()),
                    format!("{:?}", b.cap_view()),
                    "{ctx}: cap view"
                );
                assert_eq!(
                    format!("{:?}", a.pacing_rate()),
                    format!("{:?}", b.pacing_rate()),
                    "{ctx}: pacing"
                );
                assert_eq!(
                    format!("{:?}", a.background_own_rate()),
                    format!("{:?}", b.background_own_rate()),
                    "{ctx}: own rate"
                );
                assert_eq!(a.next_timer(now), b.next_timer(now), "{ctx}: timer");
            }
        }
    }
    assert!(directs > 1000, "only {directs} direct sends exercised");
}

/// The fast path's room is what `submit_direct` would give each of its
/// requests: open only while nothing is queued and no critical request
/// waits for a slot, as many as the critical slots and the device's room
/// allow, and never with anticipation or critical tokens.
#[test]
fn the_fast_room_opens_only_when_the_core_would_send_critical_requests_at_once() {
    let mut h = Harness::new(SchedConfig {
        critical_slots: 3,
        device_depth: 4,
        ..cfg()
    });
    h.advance(100 * MS);
    let room = |limit, nc_inflight, nc_seq| FastRoom {
        limit,
        nc_inflight,
        nc_seq,
    };
    assert_eq!(h.s.fast_room(), Some(room(3, 0, 0)), "the critical slots");
    let d = h.direct(C).unwrap();
    assert_eq!(h.s.fast_room(), Some(room(2, 0, 0)));
    let (n, _) = h.submit(N);
    assert_eq!(h.s.fast_room(), None, "a request is queued");
    h.dispatch();
    assert_eq!(h.s.fast_room(), Some(room(2, 1, 1)), "one beside it");
    h.complete_direct(d);
    h.complete(n);
    // The device's room, once slots are not what limits.
    let mut h = Harness::new(SchedConfig {
        device_depth: 2,
        ..cfg()
    });
    let d = h.direct(C).unwrap();
    assert_eq!(h.s.fast_room().map(|r| r.limit), Some(1));
    let e = h.direct(C).unwrap();
    assert_eq!(h.s.fast_room(), None, "the device is full");
    h.complete_direct(d);
    h.complete_direct(e);
    // A critical request waiting for a slot goes first.
    let mut h = Harness::new(SchedConfig {
        critical_slots: 1,
        ..cfg()
    });
    let d = h.direct(C).unwrap();
    let (w, admitted) = h.submit(C);
    assert!(!admitted);
    assert_eq!(h.s.fast_room(), None);
    h.complete_direct(d);
    h.dispatch();
    h.complete(w);
    assert!(h.s.fast_room().is_some());
    for cfg in [
        SchedConfig {
            anticipation: MS,
            ..cfg()
        },
        SchedConfig {
            tokens: LaneTokens::from_slice(&[4, 2]).unwrap(),
            ..cfg()
        },
    ] {
        assert_eq!(Harness::new(cfg).s.fast_room(), None, "{cfg:?}");
    }
}

/// Requests the fast path still has at the device when the core closes its
/// room become the core's: they hold their slots and device room until
/// each completes through the core, and a slot one frees goes to a waiter.
/// Those it completed in its room are counted as dispatched and feed the
/// adaptive cap, timed or not.
#[test]
fn adopted_fast_requests_hold_their_places_and_completed_ones_are_counted() {
    use super::cap::AutoCapConfig;
    let mut h = Harness::new(SchedConfig {
        critical_slots: 2,
        noncritical_cap: NoncriticalCap::Auto(AutoCapConfig::default()),
        ..cfg()
    });
    h.advance(100 * MS);
    let room = h.s.fast_room().unwrap();
    assert_eq!(room.limit, 2);
    h.s.adopt_fast(2);
    h.s.check_invariants();
    assert_eq!(h.s.inflight(), [2, 0]);
    assert_eq!(h.s.outstanding(), 2);
    let (w, admitted) = h.submit(C);
    assert!(!admitted, "the adopted requests hold both critical slots");
    h.advance(MS);
    let adopted = Direct::adopted(Op::Read, 4096, Some(h.now - MS), &room);
    assert_eq!(h.complete_direct(adopted), vec![w]);
    let untimed = Direct::adopted(Op::Read, 4096, None, &room);
    let done = h.s.complete_direct(untimed, C, h.now);
    assert!(!done.timed && done.device_time == 0);
    assert_eq!(h.s.cap_view().0, Some(MS as f64), "only the timed one");
    h.dispatch();
    h.complete(w);
    assert_eq!(h.s.outstanding(), 0);
    // Completed in the room: no slot or device place to give back.
    let before = h.s.counters();
    assert_eq!(h.s.complete_fast(Op::Write, 4096, None, 0, h.now), None);
    let t = h.now;
    assert_eq!(
        h.s.complete_fast(Op::Read, 4096, Some((t, t + 3 * MS)), 0, t + 3 * MS),
        Some(3 * MS)
    );
    h.s.check_invariants();
    let after = h.s.counters();
    assert_eq!(after.lane_dispatches[0], before.lane_dispatches[0] + 2);
    assert_eq!(
        (after.fast_sent, after.fast_adopted),
        (before.fast_sent + 2, 2)
    );
    assert!(h.s.cap_view().0.unwrap() > MS as f64, "the timed sample");
}
