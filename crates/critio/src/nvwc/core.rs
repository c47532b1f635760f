//! The mapping core, sans-I/O: which slot holds which version of which
//! backing block, and when a slot may be reused. The driver holds one lock
//! around it and does every I/O outside.
//!
//! ```text
//!            alloc                write_done(ok)            overwrite completes / writeback freed
//!   Free ─────────> Writing ───────────────────> Mapped ──────────────────────────────────> Stale
//!    ^                 │ write_done(failed)        (map[block] = slot, in `dirty` by seq)     │ flush_begin
//!    │                 v                                                                      v
//!    │               Dead ──(next compaction drops its record)──> Free                    Releasing
//!    │                                                                                        │ flush_end(ok)
//!    └──────────── pins == 0 ─────────── Released (readers still pinned) <──── pins > 0 ──────┤
//!    └────────────────────────────────────────────────────────────────── pins == 0 ──────────┘
//! ```
//!
//! Why a slot waits for a flush before reuse: until what made it stale (the
//! newer version's map record, or the free record after writeback) is
//! durable, recovery may still pick the slot's own old map record, so its
//! data must stay. A flush submitted after that record completed makes it
//! durable; [`Core::flush_begin`] takes exactly the slots whose releasing
//! record has completed by then (a slot turns `Stale` only after it has).
//!
//! Reads and writeback pin the slots they read, so a slot is never reused
//! under a read in flight.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::record::Record;

/// A block placed in a slot, with the version's sequence number and data
/// checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placed {
    pub(crate) slot: u32,
    pub(crate) block: u64,
    pub(crate) seq: u64,
    pub(crate) crc: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Free,
    Writing { block: u64, seq: u64, crc: u32 },
    Mapped { block: u64, seq: u64, crc: u32 },
    Stale,
    Releasing,
    Released,
    Dead,
}

/// Where a piece of a read comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// Consecutive slots from this one (pinned).
    Cache(u32),
    /// The backing device.
    Backing,
}

/// A run of blocks read from one place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) first: u64,
    pub(crate) n: u64,
    pub(crate) source: Source,
}

/// The mapping state of one write cache.
pub(crate) struct Core {
    slots: Vec<Slot>,
    pins: Vec<u32>,
    free: BTreeSet<u32>,
    /// Backing block -> the slot of its newest completed version.
    map: HashMap<u64, u32>,
    /// Mapped slots by sequence number: the writeback order.
    dirty: BTreeMap<u64, u32>,
    /// Backing block -> writes to it in flight at the backing device.
    backing: HashMap<u64, u32>,
    /// The stale slots (what the next flush releases).
    stale: Vec<u32>,
    /// Mapped slots written back whose free records are being logged: a
    /// compaction leaves them out (it would drop the free record and keep
    /// the map record).
    freeing: HashSet<u32>,
    next_seq: u64,
}

impl Core {
    /// `slots` slots, with the recovered blocks mapped; sequence numbers
    /// continue after `next_seq - 1`.
    pub(crate) fn new(slots: u32, recovered: &[Placed], next_seq: u64) -> Core {
        let mut core = Core {
            slots: vec![Slot::Free; slots as usize],
            pins: vec![0; slots as usize],
            free: (0..slots).collect(),
            map: HashMap::new(),
            dirty: BTreeMap::new(),
            backing: HashMap::new(),
            stale: Vec::new(),
            freeing: HashSet::new(),
            next_seq,
        };
        for p in recovered {
            assert!(p.seq < next_seq, "a recovered version from the future");
            assert!(core.free.remove(&p.slot), "slot {} recovered twice", p.slot);
            assert!(
                core.map.insert(p.block, p.slot).is_none(),
                "block recovered twice"
            );
            core.slots[p.slot as usize] = Slot::Mapped {
                block: p.block,
                seq: p.seq,
                crc: p.crc,
            };
            core.dirty.insert(p.seq, p.slot);
        }
        core
    }

    /// All slots.
    pub(crate) fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// Slots that can be allocated now.
    pub(crate) fn free_count(&self) -> usize {
        self.free.len()
    }

    /// Slots not free.
    pub(crate) fn used(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Blocks waiting for writeback.
    pub(crate) fn dirty_count(&self) -> usize {
        self.dirty.len()
    }

    /// Whether some slot is stale (a flush would release it).
    pub(crate) fn has_stale(&self) -> bool {
        !self.stale.is_empty()
    }

    fn make_stale(&mut self, slot: u32) {
        self.slots[slot as usize] = Slot::Stale;
        self.stale.push(slot);
    }

    /// The slot holding `block`'s newest completed version.
    pub(crate) fn cached(&self, block: u64) -> Option<u32> {
        self.map.get(&block).copied()
    }

    /// Places a new version of `block` (data checksum `crc`) in a free slot.
    pub(crate) fn alloc(&mut self, block: u64, crc: u32) -> Placed {
        let slot = self.free.pop_first().expect("alloc with no free slot");
        assert_eq!(self.slots[slot as usize], Slot::Free);
        assert_eq!(self.pins[slot as usize], 0, "a free slot is pinned");
        let seq = self.next_seq;
        self.next_seq += 1;
        self.slots[slot as usize] = Slot::Writing { block, seq, crc };
        Placed {
            slot,
            block,
            seq,
            crc,
        }
    }

    /// The write of `p` (data and map record) completed, or failed.
    pub(crate) fn write_done(&mut self, p: &Placed, ok: bool) {
        let s = p.slot as usize;
        assert_eq!(
            self.slots[s],
            Slot::Writing {
                block: p.block,
                seq: p.seq,
                crc: p.crc
            }
        );
        if !ok {
            self.slots[s] = Slot::Dead;
            return;
        }
        if let Some(&old) = self.map.get(&p.block) {
            let Slot::Mapped { seq: old_seq, .. } = self.slots[old as usize] else {
                panic!(
                    "map points to slot {old} which is {:?}",
                    self.slots[old as usize]
                );
            };
            if old_seq > p.seq {
                // An overlapping newer write completed first: it wins.
                self.make_stale(p.slot);
                return;
            }
            self.dirty.remove(&old_seq);
            self.make_stale(old);
        }
        self.map.insert(p.block, p.slot);
        self.dirty.insert(p.seq, p.slot);
        self.slots[s] = Slot::Mapped {
            block: p.block,
            seq: p.seq,
            crc: p.crc,
        };
    }

    /// Where each block of `[first, first + n)` is read from, in runs; the
    /// cache slots are pinned until [`Core::unpin`].
    pub(crate) fn read_pieces(&mut self, first: u64, n: u64) -> Vec<Piece> {
        let mut pieces: Vec<Piece> = Vec::new();
        for block in first..first + n {
            let source = match self.map.get(&block) {
                Some(&slot) => {
                    self.pins[slot as usize] += 1;
                    Source::Cache(slot)
                }
                None => Source::Backing,
            };
            if let Some(last) = pieces.last_mut() {
                let extends = match (last.source, source) {
                    (Source::Backing, Source::Backing) => true,
                    (Source::Cache(a), Source::Cache(b)) => u64::from(a) + last.n == u64::from(b),
                    _ => false,
                };
                if extends {
                    last.n += 1;
                    continue;
                }
            }
            pieces.push(Piece {
                first: block,
                n: 1,
                source,
            });
        }
        pieces
    }

    /// Releases a read's pin on `slot`; true if that freed it.
    pub(crate) fn unpin(&mut self, slot: u32) -> bool {
        let s = slot as usize;
        assert!(self.pins[s] > 0, "unpin of unpinned slot {slot}");
        self.pins[s] -= 1;
        if self.pins[s] == 0 && self.slots[s] == Slot::Released {
            self.slots[s] = Slot::Free;
            self.free.insert(slot);
            return true;
        }
        false
    }

    /// A write to blocks `[first, first + n)` starts at the backing device.
    pub(crate) fn backing_begin(&mut self, first: u64, n: u64) {
        for b in first..first + n {
            *self.backing.entry(b).or_insert(0) += 1;
        }
    }

    /// A write to blocks `[first, first + n)` ended at the backing device.
    pub(crate) fn backing_end(&mut self, first: u64, n: u64) {
        for b in first..first + n {
            let c = self.backing.get_mut(&b).expect("a backing write in flight");
            *c -= 1;
            if *c == 0 {
                self.backing.remove(&b);
            }
        }
    }

    /// Up to `max` of the oldest cached versions whose blocks have no write
    /// in flight at the backing device (writes to one block stay in order
    /// there); pins them and counts their writeback as backing writes.
    pub(crate) fn pick_writeback(&mut self, max: usize) -> Vec<Placed> {
        let mut picks = Vec::new();
        for (&seq, &slot) in &self.dirty {
            if picks.len() == max {
                break;
            }
            let Slot::Mapped { block, crc, .. } = self.slots[slot as usize] else {
                panic!("a dirty slot that is not mapped");
            };
            if !self.backing.contains_key(&block) {
                picks.push(Placed {
                    slot,
                    block,
                    seq,
                    crc,
                });
            }
        }
        for p in &picks {
            self.pins[p.slot as usize] += 1;
            self.backing_begin(p.block, 1);
        }
        picks
    }

    /// The picks are durable on the backing device and their free records
    /// are about to be logged.
    pub(crate) fn mark_freeing(&mut self, picks: &[Placed]) {
        for p in picks {
            assert!(self.pins[p.slot as usize] > 0, "a pick is pinned");
            self.freeing.insert(p.slot);
        }
    }

    /// A writeback round ended; `freed`: the picks are durable on the
    /// backing device and their free records completed, so the versions
    /// that are still the newest leave the cache.
    pub(crate) fn writeback_end(&mut self, picks: &[Placed], freed: bool) {
        for p in picks {
            self.freeing.remove(&p.slot);
            self.backing_end(p.block, 1);
            let current = self.map.get(&p.block) == Some(&p.slot);
            if freed && current {
                assert!(
                    matches!(self.slots[p.slot as usize], Slot::Mapped { seq, .. } if seq == p.seq)
                );
                self.map.remove(&p.block);
                self.dirty.remove(&p.seq);
                self.make_stale(p.slot);
            }
            self.unpin(p.slot);
        }
    }

    /// A cache flush is submitted: it will release the stale slots.
    pub(crate) fn flush_begin(&mut self) -> Vec<u32> {
        let taken = std::mem::take(&mut self.stale);
        for &slot in &taken {
            assert_eq!(self.slots[slot as usize], Slot::Stale);
            self.slots[slot as usize] = Slot::Releasing;
        }
        taken
    }

    /// The flush that took `taken` completed (`ok`) or failed.
    pub(crate) fn flush_end(&mut self, taken: &[u32], ok: bool) {
        for &slot in taken {
            let s = slot as usize;
            assert_eq!(self.slots[s], Slot::Releasing);
            self.slots[s] = match (ok, self.pins[s]) {
                (false, _) => {
                    self.stale.push(slot);
                    Slot::Stale
                }
                (true, 0) => {
                    self.free.insert(slot);
                    Slot::Free
                }
                (true, _) => Slot::Released,
            };
        }
    }

    /// What a compaction writes (a map record per slot being written or
    /// mapped), and the dead slots it will make reusable.
    pub(crate) fn snapshot(&self) -> (Vec<Record>, Vec<u32>) {
        let mut records = Vec::new();
        let mut dead = Vec::new();
        for (i, s) in self.slots.iter().enumerate() {
            let slot = i as u32;
            match *s {
                Slot::Mapped { .. } if self.freeing.contains(&slot) => {}
                Slot::Writing { block, seq, crc } | Slot::Mapped { block, seq, crc } => records
                    .push(Record::Map {
                        slot,
                        block,
                        seq,
                        crc,
                    }),
                Slot::Dead => dead.push(slot),
                _ => {}
            }
        }
        (records, dead)
    }

    /// A compaction that snapshot `dead` is durable: their records are gone.
    pub(crate) fn compacted(&mut self, dead: &[u32]) {
        for &slot in dead {
            if self.slots[slot as usize] == Slot::Dead {
                assert_eq!(self.pins[slot as usize], 0);
                self.slots[slot as usize] = Slot::Free;
                self.free.insert(slot);
            }
        }
    }

    /// Checks every structural invariant (costly: debug builds and tests).
    #[cfg(any(test, debug_assertions))]
    pub(crate) fn check_invariants(&self) {
        for (i, s) in self.slots.iter().enumerate() {
            let slot = i as u32;
            assert_eq!(
                *s == Slot::Free,
                self.free.contains(&slot),
                "slot {slot}: {s:?}"
            );
            match *s {
                Slot::Free => assert_eq!(self.pins[i], 0, "slot {slot} free but pinned"),
                Slot::Released => assert!(self.pins[i] > 0, "slot {slot} released, unpinned"),
                Slot::Mapped { block, seq, .. } => {
                    assert_eq!(self.map.get(&block), Some(&slot), "slot {slot}");
                    assert_eq!(self.dirty.get(&seq), Some(&slot), "slot {slot}");
                    assert!(seq < self.next_seq);
                }
                _ => {}
            }
        }
        assert_eq!(self.map.len(), self.dirty.len());
        let stale = self.slots.iter().filter(|s| **s == Slot::Stale).count();
        assert_eq!(stale, self.stale.len(), "the stale list");
        assert!(self
            .stale
            .iter()
            .all(|&s| self.slots[s as usize] == Slot::Stale));
        for (&block, &slot) in &self.map {
            assert!(
                matches!(self.slots[slot as usize], Slot::Mapped { block: b, .. } if b == block)
            );
        }
        assert!(self.backing.values().all(|&c| c > 0));
    }
}
