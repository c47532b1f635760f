//! The cache's core: frames, the page map, second-chance (CLOCK)
//! replacement and dirty accounting per class. Sans-I/O: it decides, the
//! driver (`mod.rs`) does the I/O and holds the lock around every call.
//! Every operation is O(1) (or O(log n) in the unflushed index) in the
//! number of frames: each state has its own list (`list.rs`).
//!
//! ```text
//!   page state     how it got there                 who may take its frame
//!   Loading(p)     a read miss is in flight          nobody (waiters wait on p)
//!   Clean          loaded, or written back           eviction, when unreferenced
//!   Dirty          written                           nobody: write it back first
//!   Writeback(p)   its copy is being written          nobody: wait on p
//! ```
//!
//! Dirty accounting: a page counts against its writer's class from the
//! moment it is dirtied until the write that covers it completes (pages
//! under writeback still count, as the kernel counts `NR_WRITEBACK`). A page
//! dirtied by a critical writer is critical even if background writers
//! touched it too.

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::list::{ListId, Lists};
use super::pending::PendingIo;
use super::FileId;
use crate::class::Class;
use crate::time::Nanos;

/// A page of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct PageKey {
    pub(crate) file: FileId,
    pub(crate) page: u64,
}

/// A multiplicative hasher for page keys (FxHash's step): two integers do
/// not need SipHash's resistance to chosen keys, and the map is on every
/// access's path.
#[derive(Default)]
pub(crate) struct PageHasher(u64);

impl Hasher for PageHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.add(u64::from(b));
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

impl PageHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// How many referenced clean pages one allocation may give a second
/// chance to before it evicts the next one regardless ([`Frames::alloc`]).
pub(crate) const CLOCK_PASSES_MAX: usize = 32;

type PageMap = HashMap<PageKey, u32, BuildHasherDefault<PageHasher>>;

pub(crate) enum State {
    Free,
    Loading(Arc<PendingIo>),
    Clean,
    Dirty,
    /// A copy is being written: the page's writes up to `seq`;
    /// `dirty_again` if written to since the copy.
    Writeback {
        io: Arc<PendingIo>,
        seq: u64,
        dirty_again: bool,
    },
}

impl State {
    /// The list a frame in this state is on.
    fn list(&self) -> ListId {
        match self {
            State::Free => ListId::Free,
            State::Loading(_) => ListId::Loading,
            State::Clean => ListId::Clean,
            State::Dirty => ListId::Dirty,
            State::Writeback { .. } => ListId::Writeback,
        }
    }

    #[cfg(any(test, debug_assertions))]
    fn unflushed(&self) -> bool {
        matches!(self, State::Dirty | State::Writeback { .. })
    }
}

/// One frame's bookkeeping (its bytes are in the arena).
pub(crate) struct Frame {
    pub(crate) key: Option<PageKey>,
    pub(crate) state: State,
    referenced: bool,
    /// The class the page counts against while dirty or under writeback.
    pub(crate) class: Class,
    dirtied_at: Nanos,
    /// Bumped by every write; a writeback records the value it copied.
    pub(crate) write_seq: u64,
    pub(crate) written_seq: u64,
}

/// What a caller must do to get a frame for a new page.
pub(crate) enum Alloc {
    /// This frame is free now (its key is set, state `Free`, on no list):
    /// the caller starts loading it, writes it whole, or releases it before
    /// it lets go of the cache lock.
    Frame(usize),
    /// Every frame is busy; wait for this page load, then retry.
    Wait(Arc<PendingIo>),
    /// Every frame is busy; wait for the writeback of this frame (the
    /// first in line), end it if its writer has not yet, then retry.
    WaitWriteback(usize, Arc<PendingIo>),
    /// Only dirty pages are left: write this one back, then retry.
    Reclaim(usize),
}

/// Frames, their bytes, the page map, the state lists and dirty counts.
///
/// ```text
///   list        frames in state      order              used for
///   Free        Free, no page        any                allocation first
///   Clean       Clean                second chance      eviction (CLOCK as a list)
///   Dirty       Dirty                dirtying order     writeback: oldest first, expiry
///   Writeback   Writeback            writeback start    waiting when nothing is clean
///   Loading     Loading              load start         waiting when nothing else is left
/// ```
///
/// A frame handed out by [`Frames::alloc`] is on no list until its load
/// starts, its first write lands, or it is released, all under the same
/// lock hold. `unflushed` indexes the pages that are dirty or under
/// writeback, by file and page, for flushes.
pub(crate) struct Frames {
    frames: Vec<Frame>,
    arena: Box<[u8]>,
    page: usize,
    lists: Lists,
    map: PageMap,
    unflushed: BTreeSet<PageKey>,
    dirty: [usize; 2],
    /// Dirty counts per class summed over every part of the cache (each
    /// part's `Frames` adds its changes), read without any part's lock.
    shared_dirty: Arc<[AtomicUsize; 2]>,
    /// Most pages that are not dirty (clean or loading) this part keeps
    /// before it evicts a clean page rather than take a free frame; the
    /// frames beyond hold only dirty pages (`cache.clean_bytes_max`).
    clean_max: usize,
}

impl Drop for Frames {
    /// The frames' memory goes back to the allocator without the huge
    /// pages the prefault thread asked for (`prefault::advise`).
    fn drop(&mut self) {
        super::prefault::advise(self.arena_span(), false);
    }
}

impl Frames {
    /// `count` free frames of `page_bytes`. The bytes are one zeroed
    /// allocation, so a large cache costs no time to create and no memory
    /// until its pages are used (or `prefault.rs` populates them). The page
    /// map is sized for every frame at once: grown as the cache fills, each
    /// doubling would rehash every entry under the part's lock, in
    /// whichever thread brought the page in (a request's, often).
    #[cfg(test)]
    pub(crate) fn new(count: usize, page_bytes: usize) -> Self {
        Self::with_shared(count, page_bytes, Arc::default())
    }

    /// `count` free frames whose dirty counts are also added to
    /// `shared_dirty` (shared by the parts of one cache).
    pub(crate) fn with_shared(
        count: usize,
        page_bytes: usize,
        shared_dirty: Arc<[AtomicUsize; 2]>,
    ) -> Self {
        assert!(count >= 1);
        assert!(page_bytes >= 1);
        let frames = (0..count)
            .map(|_| Frame {
                key: None,
                state: State::Free,
                referenced: false,
                class: Class::NonCritical,
                dirtied_at: 0,
                write_seq: 0,
                written_seq: 0,
            })
            .collect();
        let mut lists = Lists::new(count);
        for i in 0..count {
            lists.push_back(ListId::Free, i);
        }
        let bytes = count.checked_mul(page_bytes).expect("cache size overflows");
        Self {
            frames,
            arena: vec![0u8; bytes].into_boxed_slice(),
            page: page_bytes,
            lists,
            map: PageMap::with_capacity_and_hasher(count, Default::default()),
            unflushed: BTreeSet::new(),
            dirty: [0; 2],
            shared_dirty,
            clean_max: usize::MAX,
        }
    }

    /// Keeps at most `max` pages that are not dirty: past it a new page
    /// takes a clean page's frame, not a free one.
    pub(crate) fn set_clean_max(&mut self, max: usize) {
        self.clean_max = max.max(1);
    }

    /// Counts one more (or one fewer) dirty page of `class`.
    fn count_dirty(&mut self, class: Class, more: bool) {
        let (local, shared) = (
            &mut self.dirty[class.index()],
            &self.shared_dirty[class.index()],
        );
        if more {
            *local += 1;
            shared.fetch_add(1, Ordering::Relaxed);
        } else {
            *local -= 1;
            shared.fetch_sub(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn lookup(&self, key: PageKey) -> Option<usize> {
        self.map.get(&key).map(|&i| i as usize)
    }

    pub(crate) fn frame(&self, i: usize) -> &Frame {
        &self.frames[i]
    }

    /// Where the frames' bytes are, as an address and a length, for
    /// populating them ahead of use (`prefault.rs`). The allocation never
    /// moves: it is a boxed slice the frames own until they are dropped.
    pub(crate) fn arena_span(&self) -> (usize, usize) {
        (self.arena.as_ptr() as usize, self.arena.len())
    }

    /// The bytes of frame `i`.
    pub(crate) fn data(&self, i: usize) -> &[u8] {
        &self.arena[i * self.page..(i + 1) * self.page]
    }

    /// The bytes of frame `i`, to fill or change.
    pub(crate) fn data_mut(&mut self, i: usize) -> &mut [u8] {
        &mut self.arena[i * self.page..(i + 1) * self.page]
    }

    /// Marks a frame recently used.
    pub(crate) fn touch(&mut self, i: usize) {
        self.frames[i].referenced = true;
    }

    /// Dirty pages (dirty or under writeback) of this part, per class.
    #[cfg(test)]
    pub(crate) fn dirty(&self, class: Class) -> usize {
        self.dirty[class.index()]
    }

    /// Moves frame `i` to the list of its (new) state.
    fn relist(&mut self, i: usize) {
        let list = self.frames[i].state.list();
        self.lists.move_back(list, i);
    }

    /// Finds a frame for `key` (not yet in the map): a free frame (unless
    /// the clean pages are at their limit), else the
    /// first clean frame not referenced since it last came round (second
    /// chance: a referenced one loses its bit and goes to the back), else
    /// the oldest writeback to wait for, else the oldest dirty page to
    /// reclaim, else a load to wait for. O(1): one allocation passes over
    /// at most [`CLOCK_PASSES_MAX`] referenced pages, then takes the next
    /// clean page whatever its bit (without the bound, a part whose clean
    /// pages were all used since the hand last came round would be walked
    /// whole, under its lock, by the one miss that found them so).
    pub(crate) fn alloc(&mut self, key: PageKey) -> Alloc {
        assert!(
            !self.map.contains_key(&key),
            "allocating a page already cached"
        );
        let not_dirty = self.lists.len(ListId::Clean) + self.lists.len(ListId::Loading);
        if not_dirty < self.clean_max || self.lists.len(ListId::Clean) == 0 {
            if let Some(i) = self.lists.pop_front(ListId::Free) {
                return self.claim(i, key);
            }
        }
        let mut passed = 0;
        while let Some(i) = self.lists.pop_front(ListId::Clean) {
            let f = &mut self.frames[i];
            if f.referenced && passed < CLOCK_PASSES_MAX {
                passed += 1;
                f.referenced = false;
                self.lists.push_back(ListId::Clean, i);
                continue;
            }
            let old = f.key.take().expect("a clean frame has a page");
            f.state = State::Free;
            self.map.remove(&old);
            return self.claim(i, key);
        }
        if let Some(i) = self.lists.front(ListId::Writeback) {
            if let State::Writeback { io, .. } = &self.frames[i].state {
                return Alloc::WaitWriteback(i, io.clone());
            }
        }
        if let Some(i) = self.lists.front(ListId::Dirty) {
            return Alloc::Reclaim(i);
        }
        match self
            .lists
            .front(ListId::Loading)
            .map(|i| &self.frames[i].state)
        {
            Some(State::Loading(p)) => Alloc::Wait(p.clone()),
            _ => unreachable!("every frame is handed out: none is free, clean, dirty or busy"),
        }
    }

    /// Hands out frame `i` (free, on no list) for `key`.
    fn claim(&mut self, i: usize, key: PageKey) -> Alloc {
        let f = &mut self.frames[i];
        debug_assert!(matches!(f.state, State::Free) && f.key.is_none());
        f.key = Some(key);
        f.referenced = true;
        f.write_seq = 0;
        f.written_seq = 0;
        self.map.insert(key, i as u32);
        Alloc::Frame(i)
    }

    /// Starts loading frame `i` (just allocated) with `p`.
    pub(crate) fn begin_load(&mut self, i: usize, p: Arc<PendingIo>) {
        let f = &mut self.frames[i];
        assert!(matches!(f.state, State::Free) && f.key.is_some());
        f.state = State::Loading(p);
        self.relist(i);
    }

    /// Frame `i`'s load completed: its bytes are the page's.
    pub(crate) fn end_load(&mut self, i: usize) {
        let f = &mut self.frames[i];
        assert!(
            matches!(f.state, State::Loading(_)),
            "ending a load that did not start"
        );
        f.state = State::Clean;
        self.relist(i);
    }

    /// Forgets a page whose load failed (or a frame handed out and unused).
    pub(crate) fn release(&mut self, i: usize) {
        let f = &mut self.frames[i];
        assert!(matches!(f.state, State::Free | State::Loading(_)));
        if let Some(key) = f.key.take() {
            self.map.remove(&key);
        }
        f.state = State::Free;
        self.relist(i);
    }

    /// Records a write by `class` to a page that is loaded (or fully
    /// overwritten). Returns true if the page became dirty now.
    pub(crate) fn mark_written(&mut self, i: usize, class: Class, now: Nanos) -> bool {
        let f = &mut self.frames[i];
        f.write_seq += 1;
        f.referenced = true;
        let newly = match &mut f.state {
            State::Clean | State::Free => {
                f.state = State::Dirty;
                f.dirtied_at = now;
                true
            }
            State::Writeback { dirty_again, .. } => {
                if !*dirty_again {
                    f.dirtied_at = now;
                }
                *dirty_again = true;
                false
            }
            State::Dirty => false,
            State::Loading(_) => unreachable!("written before loaded"),
        };
        if newly {
            f.class = class;
            let key = f.key.expect("a written frame has a page");
            self.count_dirty(class, true);
            self.unflushed.insert(key);
            self.relist(i);
        } else if class == Class::Critical && f.class == Class::NonCritical {
            f.class = Class::Critical;
            self.count_dirty(Class::Critical, true);
            self.count_dirty(Class::NonCritical, false);
        }
        newly
    }

    /// Starts writing a copy of dirty page `i` (its writes so far) with
    /// `io`.
    pub(crate) fn begin_writeback(&mut self, i: usize, io: Arc<PendingIo>) {
        let f = &mut self.frames[i];
        assert!(
            matches!(f.state, State::Dirty),
            "writing back a page that is not dirty"
        );
        let seq = f.write_seq;
        f.state = State::Writeback {
            io,
            seq,
            dirty_again: false,
        };
        self.relist(i);
    }

    /// Ends the writeback of page `i` by `io` if it is still under it:
    /// clean, or dirty again if written meanwhile; a failed write leaves it
    /// dirty, last in line as if dirtied `now` (first in line, pages whose
    /// writes keep failing would be all that each round of writeback and
    /// each direct reclaim takes, and the part's other dirty pages would
    /// never be written; a flush of its file still writes it at once).
    /// Whoever sees `io` complete first ends it (the run's submitter, or a
    /// task waiting for the page):
    /// a submitter waits for its runs one at a time, and a page whose write
    /// completed must not wait for other runs' I/O. Returns whether it
    /// ended it (false: someone did, and the frame may hold another page).
    pub(crate) fn end_writeback(
        &mut self,
        i: usize,
        io: &Arc<PendingIo>,
        ok: bool,
        now: Nanos,
    ) -> bool {
        let f = &mut self.frames[i];
        let State::Writeback {
            io: ref by,
            seq,
            dirty_again,
        } = f.state
        else {
            return false;
        };
        if !Arc::ptr_eq(by, io) {
            return false;
        }
        if ok {
            f.written_seq = f.written_seq.max(seq);
        }
        if !ok {
            f.state = State::Dirty;
            f.dirtied_at = now;
            self.relist(i);
            return true;
        }
        if dirty_again {
            f.state = State::Dirty;
        } else {
            f.state = State::Clean;
            let (class, key) = (f.class, f.key.expect("a written frame has a page"));
            f.class = Class::NonCritical;
            self.count_dirty(class, false);
            self.unflushed.remove(&key);
        }
        self.relist(i);
        true
    }

    /// Up to `max` dirty pages (not under writeback), oldest first.
    pub(crate) fn oldest_dirty(&self, max: usize) -> Vec<usize> {
        let mut v = Vec::with_capacity(max.min(self.lists.len(ListId::Dirty)));
        let mut at = self.lists.front(ListId::Dirty);
        while let Some(i) = at {
            if v.len() == max {
                break;
            }
            v.push(i);
            at = self.lists.next(i);
        }
        v
    }

    /// When the page first in line for writeback was dirtied (about the
    /// oldest: a page dirtied again during its writeback rejoins the line
    /// at the back when that writeback ends, and one whose write failed
    /// rejoins it as if dirtied then).
    pub(crate) fn oldest_dirty_at(&self) -> Option<Nanos> {
        self.lists
            .front(ListId::Dirty)
            .map(|i| self.frames[i].dirtied_at)
    }

    /// Up to `max` pages of `file` in `pages` that hold writes not yet
    /// durable, in page order, with the write sequence each must reach.
    pub(crate) fn unflushed_of(
        &self,
        file: FileId,
        pages: std::ops::RangeInclusive<u64>,
        max: usize,
    ) -> Vec<(PageKey, u64)> {
        let from = PageKey {
            file,
            page: *pages.start(),
        };
        let to = PageKey {
            file,
            page: *pages.end(),
        };
        self.unflushed
            .range(from..=to)
            .take(max)
            .map(|&k| {
                let i = self.lookup(k).expect("an unflushed page is cached");
                (k, self.frames[i].write_seq)
            })
            .collect()
    }

    /// The last page of `file` holding writes not yet durable.
    pub(crate) fn last_unflushed(&self, file: FileId) -> Option<u64> {
        let range = PageKey { file, page: 0 }..=PageKey {
            file,
            page: u64::MAX,
        };
        self.unflushed.range(range).next_back().map(|k| k.page)
    }

    /// Every file with unflushed pages.
    pub(crate) fn files_with_unflushed(&self) -> Vec<FileId> {
        let mut v = Vec::new();
        let mut from = PageKey { file: 0, page: 0 };
        while let Some(k) = self.unflushed.range(from..).next() {
            v.push(k.file);
            match k.file.checked_add(1) {
                Some(next) => {
                    from = PageKey {
                        file: next,
                        page: 0,
                    }
                }
                None => break,
            }
        }
        v
    }

    /// Frames that hold no page.
    pub(crate) fn free_frames(&self) -> usize {
        self.lists.len(ListId::Free)
    }

    /// Drops `key`'s page if it is cached and clean: its frame goes to
    /// the free list. A page that is dirty, under writeback or loading
    /// stays. None if the page is not cached, else whether it was dropped.
    pub(crate) fn discard(&mut self, key: PageKey) -> Option<bool> {
        let i = self.lookup(key)?;
        let f = &mut self.frames[i];
        if !matches!(f.state, State::Clean) {
            return Some(false);
        }
        f.key = None;
        f.state = State::Free;
        f.referenced = false;
        self.map.remove(&key);
        self.lists.move_back(ListId::Free, i);
        Some(true)
    }

    /// Drops every clean page (tests; a cold cache).
    pub(crate) fn drop_clean(&mut self) -> usize {
        let mut n = 0;
        while let Some(i) = self.lists.pop_front(ListId::Clean) {
            let f = &mut self.frames[i];
            self.map
                .remove(&f.key.take().expect("a clean frame has a page"));
            f.state = State::Free;
            self.lists.push_back(ListId::Free, i);
            n += 1;
        }
        n
    }

    /// Checks the accounting, the map and the lists (costly: every frame).
    #[cfg(any(test, debug_assertions))]
    pub(crate) fn check_invariants(&self) {
        let mut dirty = [0usize; 2];
        let mut unflushed = 0;
        for (i, f) in self.frames.iter().enumerate() {
            match (&f.state, f.key) {
                (State::Free, None) => {}
                (_, Some(k)) => assert_eq!(self.lookup(k), Some(i), "map out of step"),
                (_, None) => panic!("a used frame without a page"),
            }
            let listed = self.lists.on(i);
            if !(matches!(f.state, State::Free) && f.key.is_some()) {
                assert_eq!(listed, Some(f.state.list()), "frame {i} on the wrong list");
            }
            if f.state.unflushed() {
                dirty[f.class.index()] += 1;
                unflushed += 1;
                assert!(self.unflushed.contains(&f.key.expect("keyed")));
            }
        }
        assert_eq!(dirty, self.dirty, "dirty counts drifted");
        assert_eq!(unflushed, self.unflushed.len(), "unflushed index drifted");
        assert!(self.map.len() <= self.frames.len());
        self.lists.check_invariants();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context;
    use crate::sync::SyncOptions;

    fn key(page: u64) -> PageKey {
        PageKey { file: 0, page }
    }

    fn fill(frames: &mut Frames, pages: std::ops::Range<u64>) {
        for p in pages {
            match frames.alloc(key(p)) {
                Alloc::Frame(i) => {
                    frames.begin_load(i, pending());
                    frames.end_load(i);
                }
                _ => panic!("no free frame for page {p}"),
            }
        }
    }

    fn pending() -> Arc<PendingIo> {
        PendingIo::new("test", context::current(), &SyncOptions::default())
    }

    #[test]
    fn past_the_clean_limit_a_new_page_takes_a_clean_frame_and_free_ones_wait_for_dirty_pages() {
        let mut f = Frames::new(8, 16);
        f.set_clean_max(2);
        fill(&mut f, 0..2);
        // Page 0 turns dirty: one clean page left, so a free frame is taken.
        let dirty = f.lookup(key(0)).unwrap();
        f.mark_written(dirty, Class::Critical, 1);
        fill(&mut f, 2..3);
        assert_eq!(f.lists.len(ListId::Free), 5);
        // Two clean pages now: a third replaces one of them.
        fill(&mut f, 3..4);
        assert_eq!(f.lists.len(ListId::Clean), 2);
        assert_eq!(
            f.lists.len(ListId::Free),
            5,
            "the free frames wait for dirty pages"
        );
        assert_eq!(f.lookup(key(0)), Some(dirty));
        assert!(f.lookup(key(3)).is_some());
        f.check_invariants();
    }

    #[test]
    fn clock_evicts_an_unreferenced_clean_page_and_spares_dirty_ones() {
        let mut f = Frames::new(4, 16);
        fill(&mut f, 0..4);
        let dirty = f.lookup(key(0)).unwrap();
        f.mark_written(dirty, Class::NonCritical, 1);
        let Alloc::Frame(i) = f.alloc(key(9)) else {
            panic!("expected a frame")
        };
        assert_ne!(i, dirty, "a dirty page is never evicted");
        assert!(f.lookup(key(9)).is_some());
        assert_eq!(f.lookup(key(0)), Some(dirty));
        f.check_invariants();
    }

    #[test]
    fn a_discarded_clean_page_frees_its_frame_and_other_states_stay() {
        let mut f = Frames::new(4, 16);
        fill(&mut f, 0..3);
        let dirty = f.lookup(key(1)).unwrap();
        f.mark_written(dirty, Class::NonCritical, 1);
        let loading = match f.alloc(key(9)) {
            Alloc::Frame(i) => i,
            _ => panic!("a free frame is left"),
        };
        f.begin_load(loading, pending());
        assert_eq!(f.free_frames(), 0);
        assert_eq!(f.discard(key(0)), Some(true), "a clean page is dropped");
        assert_eq!(f.discard(key(1)), Some(false), "a dirty page stays");
        assert_eq!(f.discard(key(9)), Some(false), "a loading page stays");
        assert_eq!(f.discard(key(5)), None, "nothing to drop");
        assert_eq!(f.lookup(key(0)), None);
        assert_eq!(f.free_frames(), 1);
        // The next page takes the freed frame, not another clean page.
        let Alloc::Frame(i) = f.alloc(key(8)) else {
            panic!("expected a frame")
        };
        assert!(f.lookup(key(2)).is_some(), "no clean page was evicted");
        assert_eq!(f.free_frames(), 0);
        f.begin_load(i, pending());
        f.end_load(i);
        f.end_load(loading);
        f.check_invariants();
    }

    #[test]
    fn one_allocation_passes_over_a_bounded_number_of_referenced_pages() {
        const N: u64 = 1000;
        let mut f = Frames::new(N as usize, 16);
        fill(&mut f, 0..N);
        for p in 0..N {
            let i = f.lookup(key(p)).unwrap();
            f.touch(i);
        }
        let Alloc::Frame(_) = f.alloc(key(N)) else {
            panic!("expected a frame")
        };
        let cleared = (0..N)
            .filter_map(|p| f.lookup(key(p)))
            .filter(|&i| !f.frames[i].referenced)
            .count();
        assert_eq!(
            cleared, CLOCK_PASSES_MAX,
            "one miss gives a bounded number of second chances, not a walk of the part"
        );
        assert_eq!(
            f.lookup(key(CLOCK_PASSES_MAX as u64)),
            None,
            "the page after them is evicted"
        );
        // Each allocation is bounded alike; the pages passed over went to
        // the back, so they outlive the next ones.
        let Alloc::Frame(_) = f.alloc(key(N + 1)) else {
            panic!("expected a frame")
        };
        assert_eq!(f.lookup(key(2 * CLOCK_PASSES_MAX as u64 + 1)), None);
        assert!(f.lookup(key(0)).is_some());
        f.check_invariants();
    }

    #[test]
    fn dirty_pages_count_against_their_writer_class_until_written_back() {
        let mut f = Frames::new(4, 16);
        fill(&mut f, 0..2);
        let (a, b) = (f.lookup(key(0)).unwrap(), f.lookup(key(1)).unwrap());
        assert!(f.mark_written(a, Class::NonCritical, 1));
        assert!(f.mark_written(b, Class::Critical, 2));
        assert!(!f.mark_written(a, Class::Critical, 3), "already dirty");
        assert_eq!(
            (f.dirty(Class::Critical), f.dirty(Class::NonCritical)),
            (2, 0),
            "upgraded"
        );
        let p = pending();
        f.begin_writeback(a, p.clone());
        f.mark_written(a, Class::NonCritical, 4); // written during writeback
        assert!(f.end_writeback(a, &p, true, 5));
        assert!(!f.end_writeback(a, &p, true, 5), "ended once");
        assert!(matches!(f.frame(a).state, State::Dirty), "dirty again");
        let p = pending();
        f.begin_writeback(a, p.clone());
        assert!(f.end_writeback(a, &p, true, 5));
        assert!(matches!(f.frame(a).state, State::Clean));
        assert_eq!(f.dirty(Class::Critical), 1);
        assert_eq!(f.oldest_dirty(10), vec![b]);
        f.check_invariants();
    }

    #[test]
    fn with_nothing_clean_alloc_waits_for_writeback_else_reclaims_dirty() {
        let mut f = Frames::new(2, 16);
        fill(&mut f, 0..2);
        let (a, b) = (f.lookup(key(0)).unwrap(), f.lookup(key(1)).unwrap());
        f.mark_written(a, Class::NonCritical, 1);
        f.mark_written(b, Class::NonCritical, 2);
        assert!(
            matches!(f.alloc(key(5)), Alloc::Reclaim(i) if i == a),
            "oldest dirty"
        );
        f.begin_writeback(b, pending());
        assert!(
            matches!(f.alloc(key(5)), Alloc::WaitWriteback(i, _) if i == b),
            "wait for the writeback"
        );
        let p = pending();
        f.begin_writeback(a, p.clone());
        assert!(
            !f.end_writeback(a, &pending(), true, 5),
            "another run's I/O"
        );
        assert!(f.end_writeback(a, &p, false, 5));
        assert!(
            matches!(f.frame(a).state, State::Dirty),
            "a failed write stays dirty"
        );
    }

    #[test]
    fn a_page_whose_write_failed_rejoins_the_dirty_line_at_the_back() {
        let mut f = Frames::new(3, 16);
        fill(&mut f, 0..3);
        let [a, b, c] = [0, 1, 2].map(|p| f.lookup(key(p)).unwrap());
        for (t, i) in [a, b, c].into_iter().enumerate() {
            f.mark_written(i, Class::NonCritical, t as Nanos + 1);
        }
        let p = pending();
        f.begin_writeback(a, p.clone());
        assert!(f.end_writeback(a, &p, false, 10));
        assert_eq!(f.oldest_dirty(3), vec![b, c, a], "behind the others");
        assert_eq!(f.oldest_dirty_at(), Some(2));
        assert!(
            matches!(f.alloc(key(9)), Alloc::Reclaim(i) if i == b),
            "reclaim takes a page that did not fail"
        );
        f.check_invariants();
    }
}
