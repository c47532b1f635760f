//! The chain walk: after a task's class flips, follow its blocking status to
//! whatever it waits on, let that object resolve the dependency, and repeat
//! from every task whose class flipped in turn (paper 000, Section 4.4).
//!
//! ```text
//!  foreground F --lock--> B1 --condvar--> helper B2 --lock--> B3 --admission--> wake as critical
//!      flips       B1 inherits     B2 inherits        B3 inherits     stage hook resolves
//! ```
//!
//! The walk is the same for inheritance and for revocation: objects compare
//! the waiter's current class with what they accounted for it, so a flip down
//! undoes exactly what the flip up did. Depth is bounded by
//! [`CHAIN_DEPTH_MAX`] and a task is visited at most once per walk, so a
//! dependency cycle (which is a deadlock, or a stale inferred condvar helper
//! that the helper window removes) cannot make the walk loop.

use serde::Serialize;

use super::task::{TaskId, TaskRef};
use crate::metrics;

/// The longest dependency chain the walk follows from one flip. Paper 000
/// saw chains of four steps.
pub const CHAIN_DEPTH_MAX: usize = 16;

/// The most tasks one walk visits.
const WALK_VISITS_MAX: usize = 256;

const _: () = assert!(CHAIN_DEPTH_MAX >= 4);
const _: () = assert!(WALK_VISITS_MAX >= CHAIN_DEPTH_MAX);

/// What a task inherited criticality through, for the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum InheritKind {
    /// The owner of a mutex a critical task waits for.
    Lock,
    /// A reader or writer holding an rwlock a critical task waits for.
    RwLock,
    /// A helper of a condition variable a critical task waits on.
    Condvar,
    /// A helper (setter) of an event a critical task waits on.
    Event,
    /// A task blocked in an admission stage, woken to retry as critical.
    Admission,
    /// An outstanding I/O promoted because a critical task waits for it.
    Io,
}

impl InheritKind {
    /// Every kind, in table order.
    pub const ALL: [InheritKind; 6] = [
        InheritKind::Lock,
        InheritKind::RwLock,
        InheritKind::Condvar,
        InheritKind::Event,
        InheritKind::Admission,
        InheritKind::Io,
    ];

    /// A short stable name, used in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            InheritKind::Lock => "lock",
            InheritKind::RwLock => "rwlock",
            InheritKind::Condvar => "condvar",
            InheritKind::Event => "event",
            InheritKind::Admission => "admission",
            InheritKind::Io => "io",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Continues the chain walk from every task in `flipped` (tasks whose class
/// may just have changed). Call it with no critio lock held.
pub(crate) fn propagate(flipped: Vec<TaskRef>) {
    if flipped.is_empty() {
        return;
    }
    let mut work: Vec<(TaskRef, usize)> = flipped.into_iter().map(|t| (t, 0)).collect();
    let mut visited: Vec<TaskId> = Vec::new();
    let mut out = Vec::new();
    while let Some((task, depth)) = work.pop() {
        #[cfg(not(loom))]
        super::mirror::mirror(&task);
        if visited.contains(&task.id()) {
            metrics::global().count_chain_cycle();
            continue;
        }
        if depth >= CHAIN_DEPTH_MAX || visited.len() >= WALK_VISITS_MAX {
            metrics::global().count_chain_truncated();
            continue;
        }
        visited.push(task.id());
        let Some(blocking) = task.blocker() else {
            continue; // runnable: the chain ends here
        };
        if depth > 0 {
            metrics::global().count_chain_step();
        }
        blocking.on.resolve(&task, &mut out);
        work.extend(out.drain(..).map(|t| (t, depth + 1)));
    }
}
