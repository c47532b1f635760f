//! The in-flight table: every command the kernel may be working on, keyed by
//! the `user_data` its SQE carries and its CQE returns.
//!
//! A slot owns the command's buffer from the moment its SQE is pushed until
//! its last CQE is reaped. The SQE points at the buffer's heap data, which
//! neither moving the [`AlignedBuf`] struct nor moving the slot moves; the
//! table never drops, shrinks or hands out a buffer of an occupied slot
//! except through [`Table::remove`], which the reaper calls only after the
//! final CQE. A table dropped with slots still occupied (only after a panic)
//! leaks their buffers rather than free memory the kernel may still write.
//!
//! ```text
//!   free list ──insert──> slot{op, offset, buf, done, transferred, ioprio}
//!                            │  SQE(user_data = slot id) ... CQE(user_data)
//!                            │  short transfer / EPERM fallback: resubmit,
//!                            │  same slot, same buffer
//!   free list <──remove──────┘  final CQE: buffer + completer handed back
//! ```

use crate::class::Class;
use crate::device::{AlignedBuf, Completer, Op};

/// One command the kernel may be working on.
pub(super) struct Slot {
    /// Read, write or flush.
    pub op: Op,
    /// The command's offset.
    pub offset: u64,
    /// The command's buffer; the SQE points into its heap data.
    pub buf: AlignedBuf,
    /// The request's class.
    pub class: Class,
    /// Called once, with the buffer, when the command is done.
    pub done: Completer,
    /// Bytes done so far (short transfers are resubmitted for the rest).
    pub transferred: usize,
    /// The `ioprio` the next SQE for this slot carries.
    pub ioprio: u16,
    /// SQEs issued for this command so far.
    pub attempts: u32,
}

/// A fixed-capacity slab of [`Slot`]s.
pub(super) struct Table {
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
}

impl Table {
    /// A table of `capacity` slots, allocated once.
    pub fn new(capacity: u32) -> Self {
        assert!(capacity > 0);
        Self {
            slots: (0..capacity).map(|_| None).collect(),
            free: (0..capacity).rev().collect(),
        }
    }

    /// Slots in use.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Whether no command is in flight.
    pub fn is_empty(&self) -> bool {
        self.free.len() == self.slots.len()
    }

    /// Whether every slot is in use.
    pub fn is_full(&self) -> bool {
        self.free.is_empty()
    }

    /// Takes a free slot for `slot`; returns its id.
    ///
    /// # Panics
    ///
    /// If the table is full (callers check [`Table::is_full`]).
    pub fn insert(&mut self, slot: Slot) -> u32 {
        let id = self.free.pop().expect("in-flight table is full");
        let entry = &mut self.slots[id as usize];
        assert!(entry.is_none(), "free slot {id} is occupied");
        *entry = Some(slot);
        id
    }

    /// The slot `id`, which must be in use.
    pub fn get(&self, id: u32) -> &Slot {
        self.slots[id as usize]
            .as_ref()
            .unwrap_or_else(|| panic!("no command in flight in slot {id}"))
    }

    /// The slot `id`, mutably; it must be in use.
    pub fn get_mut(&mut self, id: u32) -> &mut Slot {
        self.slots[id as usize]
            .as_mut()
            .unwrap_or_else(|| panic!("no command in flight in slot {id}"))
    }

    /// Frees slot `id` and returns what it held. Only after its final CQE.
    pub fn remove(&mut self, id: u32) -> Slot {
        let slot = self.slots[id as usize]
            .take()
            .unwrap_or_else(|| panic!("no command in flight in slot {id}"));
        self.free.push(id);
        debug_assert!(self.free.len() <= self.slots.len());
        slot
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        // Only reached with slots in use after a panic: the kernel may still
        // write into these buffers, so they must never return to the heap.
        for slot in self.slots.iter_mut().filter_map(Option::take) {
            std::mem::forget(slot.buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot() -> Slot {
        Slot {
            op: Op::Read,
            offset: 0,
            buf: AlignedBuf::zeroed(4096),
            class: Class::Critical,
            done: Box::new(|_| {}),
            transferred: 0,
            ioprio: 0,
            attempts: 0,
        }
    }

    #[test]
    fn slots_are_reused_and_bounded() {
        let mut t = Table::new(2);
        assert!(t.is_empty());
        let a = t.insert(slot());
        let b = t.insert(slot());
        assert_ne!(a, b);
        assert!(t.is_full());
        assert_eq!(t.len(), 2);
        t.get_mut(a).transferred = 7;
        assert_eq!(t.remove(a).transferred, 7);
        assert_eq!(t.insert(slot()), a);
    }

    #[test]
    #[should_panic(expected = "no command in flight in slot 1")]
    fn a_cqe_for_a_free_slot_panics() {
        let mut t = Table::new(2);
        t.insert(slot());
        t.remove(1);
    }
}
