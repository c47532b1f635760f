//! The page allocator of the data region, and when a freed page may be
//! reused.
//!
//! ```text
//!  epoch e ──boundary (checkpoint or snapshot starts)──> epoch e+1 ...
//!
//!  a page freed in the epoch it was allocated in:  reusable at once
//!     (no checkpoint or snapshot can reference it)
//!  a page freed in epoch f, allocated before:      pending until a checkpoint
//!     whose boundary is after f is durable (the durable tree may still
//!     point to it), and while a snapshot started at or before f runs
//! ```
//!
//! Page 0 is reserved (the null page number).

/// Pages freed but not yet reusable: (epoch freed in, first page, count).
type Pending = (u32, u64, u32);

/// The allocator.
pub(crate) struct Allocator {
    used: Vec<u64>,
    epoch_of: Vec<u32>,
    pages: u64,
    epoch: u32,
    pending: Vec<Pending>,
    pinned_from: Option<u32>,
    cursor: u64,
    in_use: u64,
}

impl Allocator {
    /// An allocator of `pages` pages, all free but page 0, in epoch 1.
    pub(crate) fn new(pages: u64) -> Self {
        assert!(pages >= 2, "a data region needs at least two pages");
        let words = pages.div_ceil(64) as usize;
        let mut a = Self {
            used: vec![0; words],
            epoch_of: vec![0; pages as usize],
            pages,
            epoch: 1,
            pending: Vec::new(),
            pinned_from: None,
            cursor: 1,
            in_use: 0,
        };
        a.set(0, true);
        a
    }

    /// An allocator whose in-use pages are `live` (a checkpoint's bitmap).
    pub(crate) fn restore(pages: u64, live: &[u64]) -> Self {
        let mut a = Self::new(pages);
        assert_eq!(
            live.len(),
            a.used.len(),
            "bitmap size does not match the region"
        );
        a.used.copy_from_slice(live);
        a.set(0, true);
        a.in_use = a
            .used
            .iter()
            .map(|w| u64::from(w.count_ones()))
            .sum::<u64>()
            - 1;
        a
    }

    fn is_used(&self, p: u64) -> bool {
        self.used[(p / 64) as usize] & (1 << (p % 64)) != 0
    }

    fn set(&mut self, p: u64, on: bool) {
        let (w, b) = ((p / 64) as usize, p % 64);
        if on {
            self.used[w] |= 1 << b;
        } else {
            self.used[w] &= !(1 << b);
        }
    }

    /// `n` contiguous free pages, first fit from a rotating cursor.
    pub(crate) fn alloc(&mut self, n: u32) -> Option<u64> {
        assert!(n >= 1);
        let n = u64::from(n);
        let mut start = self.cursor;
        let mut run = 0;
        for _ in 0..self.pages + n {
            if start + run >= self.pages {
                start = 1;
                run = 0;
                continue;
            }
            if self.is_used(start + run) {
                start = start + run + 1;
                run = 0;
                continue;
            }
            run += 1;
            if run == n {
                for p in start..start + n {
                    self.set(p, true);
                    self.epoch_of[p as usize] = self.epoch;
                }
                self.cursor = start + n;
                self.in_use += n;
                return Some(start);
            }
        }
        None
    }

    /// Frees `n` pages from `page`: at once if allocated in this epoch,
    /// else pending (see the module docs).
    pub(crate) fn free(&mut self, page: u64, n: u32) {
        assert!(
            page >= 1 && page + u64::from(n) <= self.pages,
            "freeing outside the region"
        );
        let young = (page..page + u64::from(n)).all(|p| self.epoch_of[p as usize] == self.epoch);
        if young {
            self.release(page, n);
        } else {
            self.pending.push((self.epoch, page, n));
        }
    }

    fn release(&mut self, page: u64, n: u32) {
        for p in page..page + u64::from(n) {
            assert!(self.is_used(p), "double free of page {p}");
            self.set(p, false);
        }
        self.in_use -= u64::from(n);
    }

    /// Starts a new epoch (a checkpoint or snapshot boundary); returns it.
    pub(crate) fn advance(&mut self) -> u32 {
        self.epoch += 1;
        self.epoch
    }

    /// A checkpoint whose boundary started epoch `boundary` is durable:
    /// pages freed before it are reusable (unless a snapshot holds them).
    pub(crate) fn checkpoint_durable(&mut self, boundary: u32) {
        let pin = self.pinned_from;
        let (ready, keep): (Vec<Pending>, Vec<Pending>) = self
            .pending
            .drain(..)
            .partition(|&(f, _, _)| f < boundary && pin.is_none_or(|p| f < p));
        self.pending = keep;
        for (_, page, n) in ready {
            self.release(page, n);
        }
    }

    /// A snapshot starting at epoch `from` reads the tree as of then: keep
    /// pages freed from that epoch on until [`Allocator::unpin`].
    pub(crate) fn pin(&mut self, from: u32) {
        self.pinned_from = Some(from);
    }

    /// The snapshot ended.
    pub(crate) fn unpin(&mut self) {
        self.pinned_from = None;
    }

    /// The pages in the live tree (in use and not pending), as a bitmap.
    pub(crate) fn live_bitmap(&self) -> Vec<u64> {
        let mut live = self.used.clone();
        for &(_, page, n) in &self.pending {
            for p in page..page + u64::from(n) {
                live[(p / 64) as usize] &= !(1 << (p % 64));
            }
        }
        live
    }

    /// Frees every page of the live tree except the runs in `keep`
    /// (FLUSHALL; `keep` is the durable checkpoint's metadata).
    pub(crate) fn free_all_live(&mut self, keep: &[(u64, u32)]) {
        let live = self.live_bitmap();
        let kept = |p: u64| keep.iter().any(|&(k, n)| p >= k && p < k + u64::from(n));
        for p in 1..self.pages {
            if live[(p / 64) as usize] & (1 << (p % 64)) != 0 && !kept(p) {
                self.free(p, 1);
            }
        }
    }

    /// Pages in use (live or pending), excluding page 0.
    pub(crate) fn in_use(&self) -> u64 {
        self.in_use
    }

    /// Pages of the region.
    pub(crate) fn pages(&self) -> u64 {
        self.pages
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn young_pages_are_reused_at_once_old_ones_after_a_checkpoint() {
        let mut a = Allocator::new(16);
        let p = a.alloc(2).unwrap();
        a.free(p, 2);
        assert_eq!(a.in_use(), 0, "freed in the epoch it was allocated in");
        let q = a.alloc(3).unwrap();
        let boundary = a.advance();
        a.free(q, 3);
        assert_eq!(a.in_use(), 3, "pending: the durable tree may point to it");
        assert!(a.live_bitmap().iter().all(|w| *w == 1), "only page 0 live");
        a.checkpoint_durable(boundary);
        assert_eq!(a.in_use(), 3, "freed in the boundary's epoch: not yet");
        let next = a.advance();
        a.checkpoint_durable(next);
        assert_eq!(a.in_use(), 0);
    }

    #[test]
    fn a_snapshot_pins_pages_freed_after_it_started() {
        let mut a = Allocator::new(16);
        let p = a.alloc(1).unwrap();
        let snap = a.advance();
        a.pin(snap);
        a.free(p, 1);
        let b = a.advance();
        a.checkpoint_durable(b);
        assert_eq!(a.in_use(), 1, "the snapshot may still read it");
        a.unpin();
        a.checkpoint_durable(b);
        assert_eq!(a.in_use(), 0);
    }

    #[test]
    fn contiguous_runs_wrap_and_exhaustion_is_none() {
        let mut a = Allocator::new(8);
        let runs: Vec<u64> = (0..3).map(|_| a.alloc(2).unwrap()).collect();
        assert_eq!(runs, vec![1, 3, 5]);
        assert_eq!(a.alloc(2), None, "only page 7 is left");
        a.free(3, 2);
        assert_eq!(a.alloc(2), Some(3), "wraps to the freed run");
        let restored = Allocator::restore(8, &a.live_bitmap());
        assert_eq!(restored.in_use(), 6);
    }
}
