//! I/O criticality inheritance at the device (paper 002, Section 4.2.2):
//! immediate reissuing and completion discarding.
//!
//! ```text
//!  reissue(tag) ──lock──> the bypassed write `tag` in flight? its backing parts not done?
//!        │                enough free slots? ──no──> counted miss (it completes at the backing device)
//!        v
//!  its kept data -> new slots ┐ data runs + map records, then a cache flush: durable
//!                             ┘   └─> each backing part resolved by this attempt ──> the write
//!                                     completes once (Joint); the backing write's later
//!                                     completion is a duplicate: discarded, counted
//! ```
//!
//! The late backing write cannot clobber newer data: the map points to the
//! cache copy (and to any newer overwrite), and writeback of those blocks
//! waits until no backing write to them is in flight.

use std::sync::Arc;

use super::core::Placed;
use super::joint::{Attempt, Joint, Outcome};
use super::record::{data_crc, Record};
use super::stats::add;
use super::write::{map_record, WriteOp, WritePayload};
use super::Shared;
use crate::class::Class;
use crate::device::{AlignedBuf, Command, DeviceError};

/// What [`WriteCache::reissue`](super::WriteCache::reissue) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reissue {
    /// The write's bypassed blocks are being written to the cache; it
    /// completes when they are durable there (or at the backing device, if
    /// that is first).
    Reissued {
        /// Blocks reissued.
        blocks: u64,
    },
    /// No bypassed write with that tag is in flight (a read, a flush, a
    /// write admitted to the cache or waiting for a slot, or done).
    NotFound,
    /// Its bypassed parts are done or were reissued already.
    AlreadyDone,
    /// Too few free slots now; it completes at the backing device.
    NoSpace,
    /// The policy is not `cp+pi+ioi`.
    Disabled,
    /// The cache is poisoned or closing.
    Refused,
}

/// A reissue in flight.
struct ReissuePayload {
    op: Arc<WriteOp>,
    /// The original write's parts this resolves.
    parts: Vec<usize>,
    placed: Vec<Placed>,
}

impl Shared {
    pub(super) fn reissue(self: &Arc<Self>, tag: u64) -> Reissue {
        if !self.cfg.policy.reissues() {
            return Reissue::Disabled;
        }
        let r = self.try_reissue(tag);
        match r {
            Reissue::Reissued { blocks } => {
                add(&self.counters.reissues, 1);
                add(&self.counters.reissued_blocks, blocks);
            }
            _ => add(&self.counters.reissue_misses, 1),
        }
        r
    }

    fn try_reissue(self: &Arc<Self>, tag: u64) -> Reissue {
        if self.is_poisoned() {
            return Reissue::Refused;
        }
        let bb = self.layout.block_bytes as usize;
        let (op, parts, blocks, placed) = {
            let mut st = self.state.lock();
            if st.shutdown {
                return Reissue::Refused;
            }
            let Some(op) = st.inflight.get(&tag).cloned() else {
                return Reissue::NotFound;
            };
            let upper: u64 = op.backing_parts.iter().map(|p| p.2).sum();
            if upper > st.core.free_count() as u64 {
                return Reissue::NoSpace;
            }
            let all: Vec<usize> = op.backing_parts.iter().map(|p| p.0).collect();
            // (block, its data) for every block of the parts reissued.
            let copy = |chosen: &[usize], p: &mut WritePayload| {
                let data = p.buf.as_ref().expect("a kept write keeps its buffer");
                (op.backing_parts.iter())
                    .filter(|part| chosen.contains(&part.0))
                    .flat_map(|&(_, first, n)| first..first + n)
                    .map(|b| {
                        let at = (b - op.first) as usize * bb;
                        (b, AlignedBuf::from_slice(&data.as_slice()[at..at + bb]))
                    })
                    .collect::<Vec<_>>()
            };
            let Some((parts, blocks)) = op.joint.add_attempts(&all, copy) else {
                return Reissue::AlreadyDone;
            };
            let placed: Vec<Placed> = (blocks.iter())
                .map(|(b, data)| st.core.alloc(*b, data_crc(data.as_slice())))
                .collect();
            (op, parts, blocks, placed)
        };
        let blocks_n = placed.len() as u64;
        let bufs = blocks.into_iter().map(|(_, data)| data).collect();
        self.start_reissue(op, parts, bufs, placed);
        Reissue::Reissued { blocks: blocks_n }
    }

    /// Writes the reissued data: a cache write per block and the map
    /// records; then a flush.
    fn start_reissue(
        self: &Arc<Self>,
        op: Arc<WriteOp>,
        parts: Vec<usize>,
        bufs: Vec<AlignedBuf>,
        placed: Vec<Placed>,
    ) {
        assert_eq!(bufs.len(), placed.len());
        let records: Vec<Record> = placed.iter().map(map_record).collect();
        let slots: Vec<u32> = placed.iter().map(|p| p.slot).collect();
        add(&self.counters.cached_blocks, placed.len() as u64);
        let n = bufs.len();
        let joint = Arc::new(Joint::new(n + 1, ReissuePayload { op, parts, placed }));
        for (i, (buf, slot)) in bufs.into_iter().zip(slots).enumerate() {
            let cmd = Command::write(self.layout.slot_offset(slot), buf, Class::Critical);
            let (me, joint) = (self.clone(), joint.clone());
            let done = move |c: crate::device::Completion| me.reissue_part(&joint, i, c.result);
            self.cache.submit(cmd, Box::new(done));
        }
        let me = self.clone();
        let done = move |r| me.reissue_part(&joint, n, r);
        self.md_append(records, Class::Critical, Box::new(done));
    }

    fn reissue_part(
        self: &Arc<Self>,
        joint: &Joint<ReissuePayload>,
        i: usize,
        r: Result<(), DeviceError>,
    ) {
        let (Outcome::Finished(result, p), _) = joint.done(i, Attempt::Original, r) else {
            return;
        };
        if result.is_err() {
            self.poison("a reissue to the cache device");
            return self.reissue_durable(result, p);
        }
        let me = self.clone();
        self.flush_cache(Class::Critical, Box::new(move |r| me.reissue_durable(r, p)));
    }

    /// The reissued copy is durable (or failed): map it first, then let it
    /// decide the original write's parts (which may complete the write, so
    /// a write after it finds the copy).
    fn reissue_durable(self: &Arc<Self>, r: Result<(), DeviceError>, p: ReissuePayload) {
        {
            let mut st = self.state.lock();
            for placed in &p.placed {
                st.core.write_done(placed, r.is_ok());
            }
        }
        for &i in &p.parts {
            let r = r.as_ref().map(|_| ()).map_err(super::error::dup);
            self.attempt_result(&p.op, i, Attempt::Reissue, r);
        }
    }
}
