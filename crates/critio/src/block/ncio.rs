//! The outstanding non-critical I/O index (paper 000, Section 4.2.2, `ncio`).
//!
//! Every non-critical request is findable by its byte range while it is
//! outstanding, so a critical task that must wait for "whatever I/O covers
//! this range" (a page under writeback, a file being flushed) can find and
//! promote it without knowing its id. The index is bounded by the
//! non-critical slots plus the requests waiting for one.

use std::collections::BTreeMap;

use super::ReqId;

/// The largest request the block layer accepts, which bounds how far back a
/// range lookup must scan.
pub const IO_LEN_MAX: u64 = 8 << 20;

/// Non-critical requests by start offset.
#[derive(Default, Debug)]
pub(crate) struct NcioIndex {
    by_offset: BTreeMap<u64, Vec<(ReqId, u64)>>,
    len: usize,
}

impl NcioIndex {
    pub(crate) fn insert(&mut self, id: ReqId, offset: u64, len: u64) {
        assert!(
            len <= IO_LEN_MAX,
            "request of {len} bytes exceeds IO_LEN_MAX"
        );
        self.by_offset.entry(offset).or_default().push((id, len));
        self.len += 1;
    }

    pub(crate) fn remove(&mut self, id: ReqId, offset: u64) {
        let bucket = self
            .by_offset
            .get_mut(&offset)
            .expect("ncio entry removed twice");
        let at = bucket
            .iter()
            .position(|&(r, _)| r == id)
            .expect("ncio entry not at its offset");
        bucket.swap_remove(at);
        if bucket.is_empty() {
            self.by_offset.remove(&offset);
        }
        self.len -= 1;
    }

    /// Every request overlapping `[offset, offset + len)`.
    pub(crate) fn overlapping(&self, offset: u64, len: u64) -> Vec<ReqId> {
        let end = offset.saturating_add(len);
        let from = offset.saturating_sub(IO_LEN_MAX - 1);
        self.by_offset
            .range(from..end)
            .flat_map(|(&start, reqs)| reqs.iter().map(move |&(id, l)| (start, id, l)))
            .filter(|&(start, _, l)| start + l > offset)
            .map(|(_, id, _)| id)
            .collect()
    }

    #[cfg(any(test, debug_assertions))]
    pub(crate) fn len(&self) -> usize {
        self.len
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
}
