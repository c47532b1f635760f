//! The write path: where each block of a write goes, the device commands
//! that carry it, and its one completion.
//!
//! ```text
//!  write(cmd) ──lock──> plan: per block cached? admitted? free slots? ──no──> stalled (FIFO)
//!        │                 allocate slots (copy-on-write), count backing writes per block
//!        v
//!  start: runs of blocks ──cache runs──> cache device          ┐
//!                         ──map records──> metadata log         ├─ Joint: the command completes once,
//!                         ──backing runs──> backing device      │  when every part has
//!                                             └─> grouped backing flush
//!  finish: map the new slots (older copies turn stale), forget the kept data, complete
//! ```
//!
//! A bypassed write under `cp+pi+ioi` keeps its buffer (a copy goes to the
//! backing device) and is findable by its tag until it completes, so
//! `reissue` can write the same data to the cache.

use std::sync::Arc;
use std::time::Duration;

use super::config::{FullPolicy, NvwcConfig};
use super::core::{Core, Placed};
use super::joint::{Attempt, Joint, Outcome};
use super::layout::Layout;
use super::record::{data_crc, Record};
use super::stats::add;
use super::{Shared, Stalled, STALL_POINT};
use crate::class::Class;
use crate::device::{AlignedBuf, Command, Completer, Completion, DeviceError};
use crate::metrics;

/// Where a run of blocks goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dest {
    /// Consecutive slots from this one.
    Cache(u32),
    Backing,
}

/// A run of consecutive blocks with one destination.
#[derive(Clone, Copy, Debug)]
pub(super) struct Seg {
    pub(super) first: u64,
    pub(super) n: u64,
    dest: Dest,
}

/// Where a write's blocks go, with its slots allocated.
pub(super) struct Plan {
    segs: Vec<Seg>,
    placed: Vec<Placed>,
    /// The policy admitted it and its blocks go to the cache.
    admitted: bool,
    /// Blocks that were cached already.
    hits: usize,
    /// Admitted, but sent to the backing device (full or too large).
    demoted: bool,
}

/// A write in flight.
pub(super) struct WriteOp {
    pub(super) tag: u64,
    pub(super) joint: Joint<WritePayload>,
    /// The parts that go to the backing device: (part, first block, blocks).
    pub(super) backing_parts: Vec<(usize, u64, u64)>,
    /// First block of the command.
    pub(super) first: u64,
    /// Registered for reissue.
    kept: bool,
}

/// What a write hands back when it finishes.
pub(super) struct WritePayload {
    /// The command's buffer (`None` while it is the one device command's).
    pub(super) buf: Option<AlignedBuf>,
    done: Completer,
    placed: Vec<Placed>,
}

/// Decides where `cmd`'s blocks go and allocates their slots; `None`: it
/// must wait for free slots. `queue_ahead`: writes are stalled already
/// (this one queues behind them if it needs a slot).
fn plan(
    cfg: &NvwcConfig,
    layout: &Layout,
    core: &mut Core,
    cmd: &Command,
    queue_ahead: bool,
) -> Option<Plan> {
    let (first, n) = layout.blocks(cmd.offset, cmd.len());
    let admits = cfg.policy.admits(cmd);
    let hit: Vec<bool> = (first..first + n)
        .map(|b| core.cached(b).is_some())
        .collect();
    let hits = hit.iter().filter(|&&h| h).count();
    let mut need = if admits { n as usize } else { hits };
    let mut demoted = false;
    if need > hits && need > core.slot_count() {
        (need, demoted) = (hits, true); // larger than the whole cache
    }
    let blocked = |need: usize, core: &Core| need > 0 && (queue_ahead || need > core.free_count());
    if blocked(need, core) && cfg.full == FullPolicy::Bypass && need > hits {
        (need, demoted) = (hits, true);
    }
    if blocked(need, core) {
        return None;
    }
    let all = need > hits;
    let bb = layout.block_bytes as usize;
    let data = cmd.buf.as_slice();
    let mut segs: Vec<Seg> = Vec::new();
    let mut placed = Vec::with_capacity(need);
    for (i, &h) in hit.iter().enumerate() {
        let block = first + i as u64;
        let dest = if h || all {
            let p = core.alloc(block, data_crc(&data[i * bb..(i + 1) * bb]));
            placed.push(p);
            Dest::Cache(p.slot)
        } else {
            Dest::Backing
        };
        match segs.last_mut() {
            Some(last) if extends(last, dest) => last.n += 1,
            _ => segs.push(Seg {
                first: block,
                n: 1,
                dest,
            }),
        }
    }
    for s in segs.iter().filter(|s| s.dest == Dest::Backing) {
        core.backing_begin(s.first, s.n);
    }
    assert_eq!(placed.len(), need);
    Some(Plan {
        segs,
        placed,
        admitted: admits && all,
        hits,
        demoted,
    })
}

fn extends(last: &Seg, dest: Dest) -> bool {
    match (last.dest, dest) {
        (Dest::Backing, Dest::Backing) => true,
        (Dest::Cache(a), Dest::Cache(b)) => u64::from(a) + last.n == u64::from(b),
        _ => false,
    }
}

impl Shared {
    /// A write command (validated).
    pub(super) fn write(self: &Arc<Self>, cmd: Command, done: Completer) {
        add(&self.counters.writes, 1);
        let plan = {
            let mut st = self.state.lock();
            let st = &mut *st;
            let queue_ahead = !st.stalled.is_empty();
            match plan(&self.cfg, &self.layout, &mut st.core, &cmd, queue_ahead) {
                Some(plan) => plan,
                None => {
                    let since = self.clock.now();
                    st.stalled.push_back(Stalled { cmd, done, since });
                    add(&self.counters.stalls, 1);
                    self.wake.notify_all();
                    return;
                }
            }
        };
        self.start(cmd, done, plan);
    }

    /// Starts the stalled writes that fit now, first come first served.
    pub(super) fn admit_stalled(self: &Arc<Self>) {
        loop {
            let (s, plan) = {
                let mut st = self.state.lock();
                let st = &mut *st;
                let Some(head) = st.stalled.front() else {
                    return;
                };
                let Some(plan) = plan(&self.cfg, &self.layout, &mut st.core, &head.cmd, false)
                else {
                    return;
                };
                (st.stalled.pop_front().expect("the head"), plan)
            };
            let waited = self.clock.now().saturating_sub(s.since);
            add(&self.counters.stall_ns, waited);
            let registry = self.metrics.get().map_or(metrics::global(), |m| m.get());
            registry.record_wait(STALL_POINT, s.cmd.class, Duration::from_nanos(waited));
            self.start(s.cmd, s.done, plan);
        }
    }

    fn count_plan(&self, plan: &Plan) {
        let c = &self.counters;
        let bypassed: u64 = plan
            .segs
            .iter()
            .filter(|s| s.dest == Dest::Backing)
            .map(|s| s.n)
            .sum();
        add(&c.cached_writes, u64::from(plan.admitted));
        add(&c.hit_writes, u64::from(!plan.admitted && plan.hits > 0));
        add(&c.full_bypasses, u64::from(plan.demoted));
        add(&c.cached_blocks, plan.placed.len() as u64);
        add(&c.bypassed_writes, u64::from(bypassed > 0));
        add(&c.bypassed_blocks, bypassed);
    }

    /// Issues a planned write's parts.
    fn start(self: &Arc<Self>, cmd: Command, done: Completer, plan: Plan) {
        self.count_plan(&plan);
        let Command {
            offset,
            buf,
            class,
            hint,
            ..
        } = cmd;
        let first = offset / self.layout.block_bytes;
        let has_backing = plan.segs.iter().any(|s| s.dest == Dest::Backing);
        let kept = self.cfg.policy.reissues() && hint.tag != 0 && has_backing;
        let through = plan.segs.len() == 1 && !kept;
        let (kept_buf, bufs) = self.split(buf, first, &plan.segs, through);
        let records: Vec<Record> = plan.placed.iter().map(map_record).collect();
        let parts = plan.segs.len() + usize::from(!records.is_empty());
        let backing_parts = (plan.segs.iter().enumerate())
            .filter(|(_, s)| s.dest == Dest::Backing)
            .map(|(i, s)| (i, s.first, s.n))
            .collect();
        let payload = WritePayload {
            buf: kept_buf,
            done,
            placed: plan.placed,
        };
        let op = Arc::new(WriteOp {
            tag: hint.tag,
            joint: Joint::new(parts, payload),
            backing_parts,
            first,
            kept,
        });
        if kept {
            self.state.lock().inflight.insert(hint.tag, op.clone());
        }
        for (i, (seg, buf)) in plan.segs.iter().zip(bufs).enumerate() {
            let mut cmd = Command::write(0, buf, class);
            cmd.hint = hint;
            self.submit_seg(&op, i, *seg, cmd, through);
        }
        if !records.is_empty() {
            let me = self.clone();
            let done = move |r| me.part_result(&op, parts - 1, r);
            self.md_append(records, class, Box::new(done));
        }
    }

    /// The buffers of the runs: the command's own if it is one run that
    /// need not be kept (`through`), else copies (and the command's buffer
    /// is kept to hand back).
    fn split(
        &self,
        buf: AlignedBuf,
        first: u64,
        segs: &[Seg],
        through: bool,
    ) -> (Option<AlignedBuf>, Vec<AlignedBuf>) {
        if through {
            return (None, vec![buf]);
        }
        let bb = self.layout.block_bytes;
        let runs = (segs.iter())
            .map(|s| {
                let at = ((s.first - first) * bb) as usize;
                AlignedBuf::from_slice(&buf.as_slice()[at..at + (s.n * bb) as usize])
            })
            .collect();
        (Some(buf), runs)
    }

    /// Sends run `i` of `op` (`cmd`, offset still to place) to its device.
    fn submit_seg(
        self: &Arc<Self>,
        op: &Arc<WriteOp>,
        i: usize,
        seg: Seg,
        mut cmd: Command,
        through: bool,
    ) {
        let (me, op) = (self.clone(), op.clone());
        match seg.dest {
            Dest::Cache(slot) => {
                cmd.offset = self.layout.slot_offset(slot);
                let done = move |c| me.cache_part_done(&op, i, c, through);
                self.cache.submit(cmd, Box::new(done));
            }
            Dest::Backing => {
                cmd.offset = seg.first * self.layout.block_bytes;
                let class = cmd.class;
                let done = move |c| me.backing_part_done(&op, i, seg, c, through, class);
                self.backing.submit(cmd, Box::new(done));
            }
        }
    }

    fn cache_part_done(
        self: &Arc<Self>,
        op: &Arc<WriteOp>,
        i: usize,
        c: Completion,
        through: bool,
    ) {
        if c.result.is_err() {
            // Whether the data landed is unknown, and its map record may
            // be durable: it could later shadow a newer bypassed write.
            self.poison("a data write to the cache device");
        }
        if through {
            op.joint.with_payload(|p| p.buf = Some(c.buf));
        }
        self.part_result(op, i, c.result);
    }

    /// The backing write of part `i` ended: later writes to its blocks may
    /// go to the backing device now; once flushed it counts as done.
    fn backing_part_done(
        self: &Arc<Self>,
        op: &Arc<WriteOp>,
        i: usize,
        seg: Seg,
        c: Completion,
        through: bool,
        class: Class,
    ) {
        self.state.lock().core.backing_end(seg.first, seg.n);
        if through {
            op.joint.with_payload(|p| p.buf = Some(c.buf));
        }
        if c.result.is_err() || op.joint.is_resolved(i) {
            // Failed, or reissued and done already: no flush needed.
            return self.part_result(op, i, c.result);
        }
        let me = self.clone();
        let op = op.clone();
        self.after_backing_write(class, Box::new(move |r| me.part_result(&op, i, r)));
    }

    /// The original attempt at part `i` of `op` completed.
    pub(super) fn part_result(
        self: &Arc<Self>,
        op: &Arc<WriteOp>,
        i: usize,
        r: Result<(), DeviceError>,
    ) {
        self.attempt_result(op, i, Attempt::Original, r);
    }

    /// An attempt at part `i` of `op` completed.
    pub(super) fn attempt_result(
        self: &Arc<Self>,
        op: &Arc<WriteOp>,
        i: usize,
        attempt: Attempt,
        r: Result<(), DeviceError>,
    ) {
        let (outcome, suppressed) = op.joint.done(i, attempt, r);
        add(&self.counters.duplicates_suppressed, u64::from(suppressed));
        if let Outcome::Finished(result, payload) = outcome {
            self.finish_write(op, result, payload);
        }
    }

    fn finish_write(&self, op: &Arc<WriteOp>, result: Result<(), DeviceError>, p: WritePayload) {
        // A failed cache write poisons the cache; so if it is not poisoned,
        // a failure was at the backing device and the cached blocks are
        // written and recorded: they are mapped (recovery would find them
        // anyway, and a later write must not go behind them).
        let cached = result.is_ok() || !self.is_poisoned();
        {
            let mut st = self.state.lock();
            for placed in &p.placed {
                st.core.write_done(placed, cached);
            }
            if op.kept && st.inflight.get(&op.tag).is_some_and(|o| Arc::ptr_eq(o, op)) {
                st.inflight.remove(&op.tag);
            }
            self.maybe_wake(&st);
            #[cfg(debug_assertions)]
            if st.core.slot_count() <= 4096 {
                st.core.check_invariants();
            }
        }
        let buf = p.buf.expect("the buffer is back when every part is done");
        (p.done)(Completion { result, buf });
    }

    /// Wakes the writeback thread if it has work.
    pub(super) fn maybe_wake(&self, st: &super::State) {
        let start = self.cfg.writeback_start_pct / 100.0 * st.core.slot_count() as f64;
        if !st.stalled.is_empty() || st.core.used() as f64 >= start {
            self.wake.notify_one();
        }
    }
}

/// The map record of a placed block.
pub(super) fn map_record(p: &Placed) -> Record {
    Record::Map {
        slot: p.slot,
        block: p.block,
        seq: p.seq,
        crc: p.crc,
    }
}
