//! The drive-model interface: what the threaded driver and the virtual-time
//! experiments (E2, E3) call. A model is a pure function of the submissions
//! and the times they are made at; it never reads a clock or sleeps.
//!
//! ```text
//!   loop {
//!       t = min(model.next_event(), next arrival)      // virtual or real time
//!       model.pop_completed(t, &mut done)              // completions at <= t
//!       model.submit(request, t)                       // new work at t
//!   }
//! ```
//!
//! Times passed in must never decrease. Completions carry their exact time
//! (`at <= now`), so a caller that looks late still measures exact latency.

use serde::{Deserialize, Serialize};

use crate::device::Op;
use crate::time::{Nanos, MS};

/// One command handed to a drive model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// The caller's id, returned in the [`Completed`]; unique among the
    /// model's outstanding commands.
    pub id: u64,
    /// Read, write or flush.
    pub op: Op,
    /// Byte offset (0 for flushes).
    pub offset: u64,
    /// Bytes transferred (0 for flushes, else positive).
    pub len: u64,
    /// Served first by priority-aware firmware; ignored otherwise.
    pub high_priority: bool,
}

impl Request {
    /// A low-priority read.
    pub fn read(id: u64, offset: u64, len: u64) -> Self {
        Self {
            id,
            op: Op::Read,
            offset,
            len,
            high_priority: false,
        }
    }

    /// A low-priority write.
    pub fn write(id: u64, offset: u64, len: u64) -> Self {
        Self {
            op: Op::Write,
            ..Self::read(id, offset, len)
        }
    }

    /// A flush: completes once every write submitted before it completed.
    pub fn flush(id: u64) -> Self {
        Self {
            op: Op::Flush,
            ..Self::read(id, 0, 0)
        }
    }

    /// The same request with its priority set.
    pub fn with_priority(self, high_priority: bool) -> Self {
        Self {
            high_priority,
            ..self
        }
    }
}

/// A command the model has finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Completed {
    /// The request's id.
    pub id: u64,
    /// When it completed (virtual nanoseconds, `<=` the `now` it was popped
    /// at).
    pub at: Nanos,
}

/// A drive's timing model: a state machine over submissions and times.
pub trait DriveModel: Send {
    /// Hands `req` to the drive at `now`. Commands beyond the drive's queue
    /// depth wait in a host-side FIFO and enter as slots free.
    fn submit(&mut self, req: Request, now: Nanos);

    /// The time of the next completion or internal event, if any work is
    /// outstanding. May be `<= now` when completions wait to be popped.
    fn next_event(&self) -> Option<Nanos>;

    /// Appends to `out`, in completion order, every command completed by
    /// `now`.
    fn pop_completed(&mut self, now: Nanos, out: &mut Vec<Completed>);

    /// Commands submitted and not yet popped.
    fn outstanding(&self) -> usize;

    /// How many commands the drive holds at once (its internal queue).
    fn queue_depth(&self) -> u32;
}

/// The firmware's choice among queued commands, shared by both profiles.
///
/// | firmware             | order                                                          | starvation bound |
/// |----------------------|----------------------------------------------------------------|------------------|
/// | default (throughput) | HDD: shortest positioning time first; SSD: FIFO per channel     | a command queued `max_age_ns` goes first |
/// | `priority_aware`, strict | high priority first (in the same order among themselves), low priority when no high is queued | a low-priority command queued `aging_ns` goes first |
/// | `priority_aware` with `high_deadline_ns` | the throughput order over every command, but a high-priority command queued `high_deadline_ns` goes first | `max_age_ns` for low priority |
///
/// Strict precedence gives the shortest high-priority latency but costs
/// throughput when high-priority work is always queued: every one of them is
/// a full random seek. The deadline form keeps the drive's reordering and
/// only bounds the wait of high-priority commands, which is how paper 001's
/// drive cut the tail ~10x while losing little throughput
/// (`critio bench e2-device-priority` shows both).
///
/// Among several overdue commands the most overdue goes first. Ages count
/// from when a command entered the drive, not from its submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Firmware {
    /// High-priority commands are favoured (paper 001). Default: false.
    pub priority_aware: bool,
    /// With `priority_aware`: `None` serves high-priority commands strictly
    /// first; `Some(d)` keeps the throughput order and serves a
    /// high-priority command first once it has been queued `d`. Default:
    /// `None`.
    pub high_deadline_ns: Option<Nanos>,
    /// With `priority_aware`: a low-priority command queued in the drive
    /// this long is served before any other (anti-starvation aging).
    /// Default: 500 ms.
    pub aging_ns: Nanos,
    /// Any command queued in the drive this long is served first: a weak
    /// limit on throughput-first reordering, like real firmware's. Default:
    /// 2 s.
    pub max_age_ns: Nanos,
}

impl Default for Firmware {
    fn default() -> Self {
        Self {
            priority_aware: false,
            high_deadline_ns: None,
            aging_ns: 500 * MS,
            max_age_ns: 2000 * MS,
        }
    }
}

impl Firmware {
    /// Priority-aware firmware with the default aging.
    pub fn priority_aware() -> Self {
        Self {
            priority_aware: true,
            ..Self::default()
        }
    }

    /// Priority-aware firmware that keeps its throughput order but serves a
    /// high-priority command first once it has been queued `deadline`.
    pub fn priority_deadline(deadline: Nanos) -> Self {
        Self {
            priority_aware: true,
            high_deadline_ns: Some(deadline),
            ..Self::default()
        }
    }

    /// The time after which a command entered at `entered` goes first.
    pub(crate) fn deadline(&self, entered: Nanos, high_priority: bool) -> Nanos {
        let limit = match (self.priority_aware, high_priority, self.high_deadline_ns) {
            (true, true, Some(d)) => d.min(self.max_age_ns),
            (true, false, None) => self.aging_ns.min(self.max_age_ns),
            _ => self.max_age_ns,
        };
        entered.saturating_add(limit)
    }

    /// Whether only high-priority commands are candidates, given whether
    /// any is queued.
    pub(crate) fn high_only(&self, any_high: bool) -> bool {
        self.priority_aware && self.high_deadline_ns.is_none() && any_high
    }

    /// Checks the fields; the error names the bad one.
    pub fn validate(&self) -> Result<(), String> {
        if self.aging_ns == 0 {
            return Err("firmware aging_ns must be positive".into());
        }
        if self.max_age_ns == 0 {
            return Err("firmware max_age_ns must be positive".into());
        }
        if self.high_deadline_ns == Some(0) {
            return Err("firmware high_deadline_ns must be positive".into());
        }
        Ok(())
    }
}
