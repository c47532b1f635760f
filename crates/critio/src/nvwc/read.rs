//! The read path: each block from its newest copy, the cache slot if the
//! block is cached, else the backing device; a read spanning both is served
//! piecewise and assembled into the caller's buffer.
//!
//! ```text
//!  read(blocks 0..4)   block:  0      1      2      3
//!                      copy:   slot 7 slot 8 back.  back.
//!                      runs:   cache[7..9)   backing[2..4)   -> two device reads, one completion
//! ```
//!
//! The slots read are pinned until their read completes, so a slot is
//! never reused under a read in flight.

use std::sync::Arc;

use super::core::{Piece, Source};
use super::joint::{Attempt, Joint, Outcome};
use super::stats::add;
use super::Shared;
use crate::device::{AlignedBuf, Command, Completer, Completion, Device, Op};

struct ReadPayload {
    buf: AlignedBuf,
    done: Completer,
}

impl Shared {
    /// A read command (validated).
    pub(super) fn read(self: &Arc<Self>, cmd: Command, done: Completer) {
        let (first, n) = self.layout.blocks(cmd.offset, cmd.len());
        let pieces = self.state.lock().core.read_pieces(first, n);
        let hits: u64 = pieces
            .iter()
            .filter(|p| p.source != Source::Backing)
            .map(|p| p.n)
            .sum();
        add(&self.counters.reads, 1);
        add(&self.counters.read_hit_blocks, hits);
        add(&self.counters.read_miss_blocks, n - hits);
        if let [p] = pieces[..] {
            let (dev, offset) = self.piece_at(&p);
            let mut cmd = cmd;
            cmd.offset = offset;
            let me = self.clone();
            return dev.submit(
                cmd,
                Box::new(move |c| {
                    me.unpin_piece(&p);
                    done(c)
                }),
            );
        }
        let bb = self.layout.block_bytes;
        let joint = Arc::new(Joint::new(pieces.len(), ReadPayload { buf: cmd.buf, done }));
        for (i, p) in pieces.into_iter().enumerate() {
            let (dev, offset) = self.piece_at(&p);
            let sub = Command {
                op: Op::Read,
                offset,
                buf: AlignedBuf::zeroed((p.n * bb) as usize),
                class: cmd.class,
                hint: cmd.hint,
            };
            let at = ((p.first - first) * bb) as usize;
            let me = self.clone();
            let joint = joint.clone();
            dev.submit(
                sub,
                Box::new(move |c| {
                    me.unpin_piece(&p);
                    if c.result.is_ok() {
                        let data = c.buf.as_slice();
                        joint.with_payload(|r| {
                            r.buf.as_mut_slice()[at..at + data.len()].copy_from_slice(data)
                        });
                    }
                    if let (Outcome::Finished(result, r), _) =
                        joint.done(i, Attempt::Original, c.result)
                    {
                        (r.done)(Completion { result, buf: r.buf });
                    }
                }),
            );
        }
    }

    /// The device and offset a piece is read from.
    fn piece_at(&self, p: &Piece) -> (&Arc<dyn Device>, u64) {
        match p.source {
            Source::Cache(slot) => (&self.cache, self.layout.slot_offset(slot)),
            Source::Backing => (&self.backing, p.first * self.layout.block_bytes),
        }
    }

    fn unpin_piece(self: &Arc<Self>, p: &Piece) {
        let Source::Cache(slot) = p.source else {
            return;
        };
        let freed = {
            let mut st = self.state.lock();
            (0..p.n as u32).fold(false, |f, k| st.core.unpin(slot + k) | f)
        };
        if freed {
            self.admit_stalled();
        }
    }
}
