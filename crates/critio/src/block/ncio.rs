//! The outstanding non-critical I/O index (paper 000, Section 4.2.2, `ncio`).
//!
//! Every non-critical request is findable by its byte range while it is
//! outstanding, so a critical task that must wait for "whatever I/O covers
//! this range" (a page under writeback, a file being flushed) can find and
//! promote it without knowing its id. The index is bounded by the
//! non-critical slots plus the requests waiting for one.
//!
//! ```text
//!  insert ─> recent (unsorted, at most RECENT_MAX) ─full─> by_offset (B-tree by start)
//!  overlapping(range) = scan of recent + tree range [start - IO_LEN_MAX, end)
//! ```

use std::collections::BTreeMap;

use super::ReqId;

pub use crate::device::IO_LEN_MAX;

/// Requests kept unsorted before they spill into the tree. Most requests
/// complete while only a few others are outstanding, so they never reach
/// the tree: an insert and a remove are then a short scan, not two B-tree
/// updates. Every operation stays O(RECENT_MAX + log n).
const RECENT_MAX: usize = 8;

const _: () = assert!(RECENT_MAX >= 1 && RECENT_MAX <= 64);

/// Non-critical requests by byte range: the most recent few in a small
/// unsorted list, the rest in a tree by start offset (then id).
#[derive(Debug)]
pub(crate) struct NcioIndex {
    recent: Vec<Span>,
    by_offset: BTreeMap<(u64, ReqId), u64>,
}

#[derive(Clone, Copy, Debug)]
struct Span {
    id: ReqId,
    offset: u64,
    len: u64,
}

impl Default for NcioIndex {
    fn default() -> Self {
        Self {
            recent: Vec::with_capacity(RECENT_MAX),
            by_offset: BTreeMap::new(),
        }
    }
}

impl NcioIndex {
    pub(crate) fn insert(&mut self, id: ReqId, offset: u64, len: u64) {
        assert!(
            len <= IO_LEN_MAX,
            "request of {len} bytes exceeds IO_LEN_MAX"
        );
        debug_assert!(
            !self.recent.iter().any(|s| s.id == id),
            "ncio entry {id} inserted twice"
        );
        if self.recent.len() < RECENT_MAX {
            self.recent.push(Span { id, offset, len });
            return;
        }
        let prev = self.by_offset.insert((offset, id), len);
        assert!(prev.is_none(), "ncio entry {id} inserted twice");
    }

    pub(crate) fn remove(&mut self, id: ReqId, offset: u64) {
        if let Some(at) = self.recent.iter().position(|s| s.id == id) {
            debug_assert_eq!(
                self.recent[at].offset, offset,
                "ncio entry not at its offset"
            );
            self.recent.swap_remove(at);
            return;
        }
        self.by_offset
            .remove(&(offset, id))
            .expect("ncio entry not at its offset (or removed twice)");
    }

    /// Every request overlapping `[offset, offset + len)`, by start offset
    /// (then id).
    pub(crate) fn overlapping(&self, offset: u64, len: u64) -> Vec<ReqId> {
        let end = offset.saturating_add(len);
        let from = offset.saturating_sub(IO_LEN_MAX - 1);
        let mut found: Vec<(u64, ReqId)> = self
            .by_offset
            .range((from, 0)..(end, 0))
            .filter(|(&(start, _), &l)| start + l > offset)
            .map(|(&key, _)| key)
            .collect();
        found.extend(
            self.recent
                .iter()
                .filter(|s| s.offset < end && s.offset + s.len > offset)
                .map(|s| (s.offset, s.id)),
        );
        found.sort_unstable();
        found.into_iter().map(|(_, id)| id).collect()
    }

    #[cfg(any(test, debug_assertions))]
    pub(crate) fn len(&self) -> usize {
        self.recent.len() + self.by_offset.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_exactly_the_overlapping_requests() {
        let mut ix = NcioIndex::default();
        ix.insert(1, 0, 4096);
        ix.insert(2, 4096, 8192);
        ix.insert(3, 65536, 4096);
        assert_eq!(ix.overlapping(4095, 2), vec![1, 2]);
        assert_eq!(ix.overlapping(12288, 4096), Vec::<ReqId>::new());
        assert_eq!(ix.overlapping(8192, 1), vec![2]);
        ix.remove(2, 4096);
        assert_eq!(ix.overlapping(0, 1 << 20), vec![1, 3]);
        assert_eq!(ix.len(), 2);
    }

    #[test]
    fn requests_past_the_recent_list_are_found_and_removed_too() {
        let mut ix = NcioIndex::default();
        let n = 3 * RECENT_MAX as u64;
        for id in 1..=n {
            ix.insert(id, (n - id) * 4096, 4096); // descending offsets
        }
        assert_eq!(ix.len(), n as usize);
        let all = ix.overlapping(0, n * 4096);
        let expected: Vec<ReqId> = (1..=n).rev().collect();
        assert_eq!(all, expected, "sorted by offset");
        assert_eq!(ix.overlapping(4096, 1), vec![n - 1]);
        for id in (1..=n).step_by(2) {
            ix.remove(id, (n - id) * 4096);
        }
        assert_eq!(ix.len(), (n / 2) as usize);
        let left = ix.overlapping(0, n * 4096);
        assert!(left.iter().all(|id| id % 2 == 0));
        assert_eq!(left.len(), (n / 2) as usize);
        ix.insert(n + 1, 0, IO_LEN_MAX);
        assert!(ix.overlapping(IO_LEN_MAX - 1, 1).contains(&(n + 1)));
        assert!(!ix.overlapping(IO_LEN_MAX, 1).contains(&(n + 1)));
    }
}
