//! The part of a drive model that both profiles share: the host-side FIFO,
//! the drive's command slots (NCQ), flush barriers and the completions
//! waiting to be popped. The profile-specific [`Mechanism`] (heads and
//! platters, or flash channels) only sees commands that hold a slot.
//!
//! ```text
//!  submit ──> host FIFO ──(slot free)──> Mechanism queue ──> service ──> ready ──> pop_completed
//!  (flush) ──> barrier: completes when every earlier-submitted write has
//! ```
//!
//! Lifecycle of a read or write: `submit` (host FIFO) -> `enter` (takes one
//! of `depth` slots, the firmware may now pick it) -> `dispatch` (being
//! served) -> `step` finishes it (slot freed, completion ready) -> popped.
//! Flushes take no slot. How they order with writes is the interface's:
//!
//! | flush          | completes                                  | like                       |
//! |----------------|--------------------------------------------|----------------------------|
//! | `Barrier`      | when every earlier-submitted write finished | SATA FLUSH CACHE (non-queued: the queue drains first) |
//! | `Drain`        | when the mechanism has made durable every write completed before it (its volatile buffer drained that far) | NVMe Flush on a drive with a volatile DRAM write buffer and no power-loss protection |

use std::collections::{BTreeSet, VecDeque};

use super::model::{Completed, Request};
use crate::device::Op;
use crate::time::Nanos;

/// The most commands a model holds in its host FIFO: far above any caller's
/// queue depth, so reaching it is a caller bug.
pub const HOST_QUEUE_MAX: usize = 1 << 20;

/// A command inside a model.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cmd {
    pub req: Request,
    /// Submission order, unique; breaks ties deterministically.
    pub ticket: u64,
    /// When it entered the drive (took a slot).
    pub entered: Nanos,
}

/// The profile-specific inside of a drive.
pub(crate) trait Mechanism {
    /// `cmd` takes a slot and joins the firmware's queue (not yet served).
    fn enter(&mut self, cmd: Cmd);
    /// Starts serving queued commands on idle resources at `now`.
    fn dispatch(&mut self, now: Nanos);
    /// The time of the next internal event, if any.
    fn next_event(&self) -> Option<Nanos>;
    /// Processes the event at `next_event()`; pushes the commands it
    /// finished onto `finished`. Does not start new work.
    fn step(&mut self, finished: &mut Vec<Cmd>);
    /// A `Drain` flush is submitted: returns the durability position it
    /// waits for (covering every write finished so far). `high` is the
    /// flush's priority. Only called with [`FlushKind::Drain`].
    fn flush_begin(&mut self, _high: bool, _now: Nanos) -> u64 {
        0
    }
    /// How far writes are durable: a `Drain` flush whose position is at
    /// most this completes.
    fn durable(&self) -> u64 {
        u64::MAX
    }
}

/// How a flush orders with the writes in the drive (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FlushKind {
    Barrier,
    Drain,
}

/// Host FIFO, slots, flush barriers, completions.
#[derive(Debug)]
pub(crate) struct Frontend {
    depth: usize,
    flush: FlushKind,
    now: Nanos,
    next_ticket: u64,
    host: VecDeque<Cmd>,
    inside: usize,
    /// Tickets of writes submitted and not finished.
    writes: BTreeSet<u64>,
    /// Flushes waiting: (id, ticket) for `Barrier` (tickets increasing),
    /// (id, durability position) for `Drain` (positions non-decreasing).
    flushes: VecDeque<(u64, u64)>,
    ready: VecDeque<Completed>,
    scratch: Vec<Cmd>,
}

impl Frontend {
    pub fn new(depth: u32, flush: FlushKind) -> Self {
        assert!(depth > 0, "a drive needs at least one slot");
        Self {
            depth: depth as usize,
            flush,
            now: 0,
            next_ticket: 0,
            host: VecDeque::new(),
            inside: 0,
            writes: BTreeSet::new(),
            flushes: VecDeque::new(),
            ready: VecDeque::new(),
            scratch: Vec::new(),
        }
    }

    pub fn submit(&mut self, mech: &mut impl Mechanism, req: Request, now: Nanos) {
        self.advance(mech, now);
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        if req.op == Op::Flush {
            assert_eq!(req.len, 0, "a flush transfers no data");
            match self.flush {
                FlushKind::Barrier => {
                    self.flushes.push_back((req.id, ticket));
                    self.release_flushes(mech, now);
                }
                FlushKind::Drain => {
                    let target = mech.flush_begin(req.high_priority, now);
                    debug_assert!(
                        self.flushes.back().is_none_or(|&(_, t)| t <= target),
                        "durability positions went backwards"
                    );
                    self.flushes.push_back((req.id, target));
                    self.release_flushes(mech, now);
                    mech.dispatch(now);
                }
            }
            return;
        }
        assert!(req.len > 0, "a {} of zero bytes", req.op);
        if req.op == Op::Write {
            self.writes.insert(ticket);
        }
        self.host.push_back(Cmd {
            req,
            ticket,
            entered: now,
        });
        assert!(
            self.host.len() <= HOST_QUEUE_MAX,
            "more than {HOST_QUEUE_MAX} commands queued on a drive model"
        );
        self.admit(mech, now);
        mech.dispatch(now);
    }

    pub fn next_event(&self, mech: &impl Mechanism) -> Option<Nanos> {
        match self.ready.front() {
            Some(c) => Some(c.at),
            None => mech.next_event(),
        }
    }

    pub fn pop_completed(
        &mut self,
        mech: &mut impl Mechanism,
        now: Nanos,
        out: &mut Vec<Completed>,
    ) {
        self.advance(mech, now);
        out.extend(self.ready.drain(..));
    }

    pub fn outstanding(&self) -> usize {
        self.host.len() + self.inside + self.flushes.len() + self.ready.len()
    }

    pub fn depth(&self) -> u32 {
        self.depth as u32
    }

    /// Runs the mechanism's events up to and including `now`.
    fn advance(&mut self, mech: &mut impl Mechanism, now: Nanos) {
        assert!(
            now >= self.now,
            "drive model time went backwards: {now} < {}",
            self.now
        );
        let mut finished = std::mem::take(&mut self.scratch);
        while let Some(t) = mech.next_event() {
            if t > now {
                break;
            }
            debug_assert!(t >= self.now, "an event in the past");
            self.now = t;
            mech.step(&mut finished);
            for cmd in finished.drain(..) {
                self.finish(cmd, t);
            }
            self.release_flushes(mech, t);
            self.admit(mech, t);
            mech.dispatch(t);
        }
        self.scratch = finished;
        self.now = now;
        #[cfg(debug_assertions)]
        self.check_invariants();
    }

    fn finish(&mut self, cmd: Cmd, at: Nanos) {
        assert!(self.inside > 0, "a command finished that never entered");
        self.inside -= 1;
        if cmd.req.op == Op::Write {
            let removed = self.writes.remove(&cmd.ticket);
            assert!(removed, "a write finished twice");
        }
        self.ready.push_back(Completed { id: cmd.req.id, at });
    }

    /// Completes the flushes whose earlier writes have all finished
    /// (`Barrier`) or are durable (`Drain`).
    fn release_flushes(&mut self, mech: &impl Mechanism, now: Nanos) {
        while let Some(&(id, key)) = self.flushes.front() {
            let waits = match self.flush {
                FlushKind::Barrier => self.writes.first().is_some_and(|&w| w < key),
                FlushKind::Drain => mech.durable() < key,
            };
            if waits {
                break;
            }
            self.flushes.pop_front();
            self.ready.push_back(Completed { id, at: now });
        }
    }

    /// Moves commands from the host FIFO into free slots.
    fn admit(&mut self, mech: &mut impl Mechanism, now: Nanos) {
        while self.inside < self.depth {
            let Some(mut cmd) = self.host.pop_front() else {
                break;
            };
            cmd.entered = now;
            self.inside += 1;
            mech.enter(cmd);
        }
    }

    #[cfg(debug_assertions)]
    fn check_invariants(&self) {
        assert!(self.inside <= self.depth, "more commands than slots");
        assert!(
            self.host.is_empty() || self.inside == self.depth,
            "commands wait on the host while a slot is free"
        );
        assert!(
            self.ready.iter().all(|c| c.at <= self.now),
            "a completion in the future"
        );
    }
}
