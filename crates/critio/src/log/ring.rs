//! The ring's geometry and space accounting (sans-I/O).
//!
//! Positions are *virtual*: byte offsets into the data area that keep
//! growing across laps, so "used" is a subtraction and the lap a position
//! is in is `v / data_len`. The device offset is
//! `region_offset + block + v % data_len`.
//!
//! ```text
//!  virtual:  0 ........ data_len ........ 2*data_len ......
//!            | lap 0     | lap 1            | lap 2
//!                 ^head_v        ^write_v          used = write_v - block_of(head_v)
//!  a batch that would cross a lap end starts at the next lap instead
//! ```
//!
//! Space is freed at block granularity: the block holding the head record
//! stays in use until the head leaves it. `marks` remembers where records
//! start (the first record of every batch, and the head) so that
//! [`Ring::head_for`] can move the head to the first record after a
//! truncation point without reading the device.

use std::collections::VecDeque;

use super::record::align_up;
use super::Lsn;

/// Where the log is and how big its blocks are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// Device offset of the header block.
    pub(crate) region_offset: u64,
    /// Log block size (a power of two, at least 4096).
    pub(crate) block: u64,
    /// Bytes of the ring (the region minus the header block).
    pub(crate) data_len: u64,
}

impl Geometry {
    pub(crate) fn new(region_offset: u64, region_bytes: u64, block: u64) -> Geometry {
        assert!(block.is_power_of_two());
        assert_eq!(region_offset % block, 0);
        assert_eq!(region_bytes % block, 0);
        assert!(region_bytes >= 3 * block);
        Geometry {
            region_offset,
            block,
            data_len: region_bytes - block,
        }
    }

    /// The position of `v` within the ring.
    pub(crate) fn phys(&self, v: u64) -> u64 {
        v % self.data_len
    }

    /// The device offset of virtual position `v`.
    pub(crate) fn device_offset(&self, v: u64) -> u64 {
        self.region_offset + self.block + self.phys(v)
    }

    /// Where the lap containing `v` ends (the next lap's start).
    pub(crate) fn lap_end(&self, v: u64) -> u64 {
        (v / self.data_len + 1) * self.data_len
    }

    pub(crate) fn align_down(&self, v: u64) -> u64 {
        v - v % self.block
    }

    pub(crate) fn align_up(&self, v: u64) -> u64 {
        align_up(v, self.block)
    }
}

/// The live part of the ring: from the head record to the write position.
#[derive(Debug)]
pub(crate) struct Ring {
    geo: Geometry,
    /// Virtual position of the record the head is at.
    head_v: u64,
    /// The first live LSN (at or after the record at `head_v`).
    head_lsn: Lsn,
    /// Where the next batch goes (block-aligned).
    write_v: u64,
    /// `(first LSN, virtual start)` of known record starts from the head on,
    /// ascending; the front is the head record.
    marks: VecDeque<(Lsn, u64)>,
}

impl Ring {
    /// A ring whose head record (`head_pos_lsn`) is at `head_v`, whose first
    /// live LSN is `head_lsn`, and which appends at `write_v`. `marks` are
    /// record starts found by recovery (ascending, from `head_v` on).
    pub(crate) fn new(
        geo: Geometry,
        head: (Lsn, u64),
        head_lsn: Lsn,
        write_v: u64,
        marks: &[(Lsn, u64)],
    ) -> Ring {
        let (head_pos_lsn, head_v) = head;
        assert!(head_pos_lsn <= head_lsn);
        let mut ring = Ring {
            geo,
            head_v,
            head_lsn,
            write_v,
            marks: VecDeque::from([head]),
        };
        for &m in marks.iter().filter(|m| m.1 > head_v) {
            ring.push_mark(m);
        }
        ring.check_invariants();
        ring
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.geo.data_len
    }

    /// Bytes in use: from the head's block to the write position.
    pub(crate) fn used(&self) -> u64 {
        self.write_v - self.geo.align_down(self.head_v)
    }

    pub(crate) fn head_lsn(&self) -> Lsn {
        self.head_lsn
    }

    /// The header's view of the head: (position in the ring, its LSN).
    pub(crate) fn head_pos(&self) -> (u64, Lsn) {
        let (lsn, v) = *self.marks.front().expect("the head is always marked");
        (self.geo.phys(v), lsn)
    }

    /// Where a batch of `len` bytes (whole blocks) would start, or `None`
    /// while the ring has no room for it.
    pub(crate) fn place(&self, len: u64) -> Option<u64> {
        assert!(len > 0 && len % self.geo.block == 0);
        assert!(
            len <= self.geo.data_len / 2,
            "batches are at most half the ring"
        );
        let mut start = self.write_v;
        if start + len > self.geo.lap_end(start) {
            start = self.geo.lap_end(start);
        }
        let end_max = self.geo.align_down(self.head_v) + self.geo.data_len;
        (start + len <= end_max).then_some(start)
    }

    /// Records a batch of `len` bytes whose first record is `first_lsn`, at
    /// the start [`Ring::place`] returned.
    pub(crate) fn push(&mut self, first_lsn: Lsn, start: u64, len: u64) {
        assert_eq!(
            self.place(len),
            Some(start),
            "a batch goes where place() says"
        );
        self.push_mark((first_lsn, start));
        self.write_v = start + len;
        self.check_invariants();
    }

    fn push_mark(&mut self, mark: (Lsn, u64)) {
        let &(last_lsn, last_v) = self.marks.back().expect("the head is always marked");
        assert!(mark.0 >= last_lsn && mark.1 >= last_v, "marks ascend");
        if mark.1 > last_v {
            self.marks.push_back(mark);
        }
    }

    /// Where the head goes when every record before `target` is obsolete:
    /// the last known record start at or before `target`, or the write
    /// position when `target` is the first LSN not yet placed
    /// (`placed_next`). Returns (virtual position, LSN of the record there).
    pub(crate) fn head_for(&self, target: Lsn, placed_next: Lsn) -> (u64, Lsn) {
        assert!(target > self.head_lsn, "the head only moves forward");
        assert!(target <= placed_next, "truncation past the placed records");
        if target == placed_next {
            return (self.write_v, target);
        }
        let &(lsn, v) = self
            .marks
            .iter()
            .rev()
            .find(|m| m.0 <= target)
            .expect("the head mark is at or before any target");
        (v, lsn)
    }

    /// Moves the head to the record `pos_lsn` at `v`, with `head_lsn` the
    /// first live LSN (from [`Ring::head_for`], once the header says so).
    pub(crate) fn set_head(&mut self, v: u64, pos_lsn: Lsn, head_lsn: Lsn) {
        assert!(v >= self.head_v && head_lsn > self.head_lsn);
        assert!(
            v <= self.write_v,
            "the head is never past the write position"
        );
        while self.marks.front().is_some_and(|m| m.1 < v) {
            self.marks.pop_front();
        }
        if self.marks.front() != Some(&(pos_lsn, v)) {
            self.marks.push_front((pos_lsn, v));
        }
        self.head_v = v;
        self.head_lsn = head_lsn;
        self.check_invariants();
    }

    /// Every mark ascends, the head is marked, the used bytes fit the ring,
    /// the marks are bounded by the blocks in it.
    fn check_invariants(&self) {
        let front = self.marks.front().expect("the head is always marked");
        assert_eq!(front.1, self.head_v);
        assert!(front.0 <= self.head_lsn);
        assert_eq!(self.write_v % self.geo.block, 0);
        assert!(self.write_v >= self.geo.align_down(self.head_v));
        assert!(self.used() <= self.geo.data_len, "the ring overflowed");
        assert!(self.marks.len() as u64 <= self.geo.data_len / self.geo.block + 2);
        #[cfg(debug_assertions)]
        for w in self.marks.iter().collect::<Vec<_>>().windows(2) {
            assert!(w[0].0 <= w[1].0 && w[0].1 < w[1].1, "marks ascend: {w:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: u64 = 4096;

    fn ring() -> Ring {
        // 8 ring blocks.
        let geo = Geometry::new(B, 9 * B, B);
        Ring::new(geo, (1, 0), 1, 0, &[])
    }

    #[test]
    fn geometry_maps_virtual_positions_to_the_device() {
        let geo = Geometry::new(1 << 20, 9 * B, B);
        assert_eq!(geo.data_len, 8 * B);
        assert_eq!(geo.device_offset(0), (1 << 20) + B);
        assert_eq!(geo.device_offset(8 * B + 100), (1 << 20) + B + 100);
        assert_eq!(geo.lap_end(8 * B), 16 * B);
        assert_eq!((geo.align_down(B + 1), geo.align_up(B + 1)), (B, 2 * B));
    }

    #[test]
    fn batches_fill_the_ring_then_wait_for_truncation() {
        let mut r = ring();
        for i in 0..4 {
            let at = r.place(2 * B).unwrap();
            assert_eq!(at, 2 * B * i);
            r.push(1 + 10 * i, at, 2 * B);
        }
        assert_eq!(r.used(), 8 * B);
        assert_eq!(r.place(B), None, "full");
        // Records 1..=10 obsolete: the head moves to the second batch.
        let (v, lsn) = r.head_for(11, 41);
        assert_eq!((v, lsn), (2 * B, 11));
        r.set_head(v, lsn, 11);
        assert_eq!(r.used(), 6 * B);
        assert_eq!(r.head_pos(), (2 * B, 11));
        // The next batch wraps to the start of lap 1.
        assert_eq!(r.place(2 * B), Some(8 * B));
        r.push(41, 8 * B, 2 * B);
        assert_eq!(r.place(B), None);
    }

    #[test]
    fn a_batch_never_straddles_the_end_of_the_ring() {
        let mut r = ring();
        r.push(1, 0, 3 * B);
        r.push(5, 3 * B, 3 * B);
        let (v, lsn) = r.head_for(5, 9);
        r.set_head(v, lsn, 5);
        // 2 blocks left before the end, a 3-block batch starts at lap 1.
        assert_eq!(r.place(3 * B), Some(8 * B));
        r.push(9, 8 * B, 3 * B);
        assert_eq!(r.used(), 8 * B);
        assert_eq!(r.place(B), None, "the waste at the end counts as used");
    }

    #[test]
    fn the_head_moves_mid_batch_and_to_the_write_position() {
        let mut r = ring();
        r.push(1, 0, 2 * B); // records 1..=5
        r.push(6, 2 * B, B); // records 6..=7
        let (v, lsn) = r.head_for(4, 8);
        assert_eq!((v, lsn), (0, 1), "record 4 is inside the first batch");
        r.set_head(v, lsn, 4);
        assert_eq!(r.head_lsn(), 4);
        assert_eq!(r.used(), 3 * B, "the first batch still holds live records");
        let (v, lsn) = r.head_for(8, 8);
        assert_eq!((v, lsn), (3 * B, 8), "everything placed is obsolete");
        r.set_head(v, lsn, 8);
        assert_eq!(r.used(), 0);
        assert_eq!(r.place(4 * B), Some(3 * B));
    }

    #[test]
    #[should_panic(expected = "only moves forward")]
    fn the_head_never_moves_back() {
        let mut r = ring();
        r.push(1, 0, B);
        let (v, lsn) = r.head_for(2, 2);
        r.set_head(v, lsn, 2);
        let _ = r.head_for(2, 2);
    }
}
