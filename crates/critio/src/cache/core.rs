//! The cache's core: frames, the page map, CLOCK replacement and dirty
//! accounting per class. Sans-I/O: it decides, the driver (`mod.rs`) does
//! the I/O and holds the lock around every call.
//!
//! ```text
//!   page state     how it got there                 who may take its frame
//!   Loading(p)     a read miss is in flight          nobody (waiters wait on p)
//!   Clean          loaded, or written back           CLOCK, when unreferenced
//!   Dirty          written                           nobody: write it back first
//!   Writeback(p)   its copy is being written          nobody: wait on p
//! ```
//!
//! Dirty accounting: a page counts against its writer's class from the
//! moment it is dirtied until the write that covers it completes (pages
//! under writeback still count, as the kernel counts `NR_WRITEBACK`). A page
//! dirtied by a critical writer is critical even if background writers
//! touched it too.

use std::collections::HashMap;
use std::sync::Arc;

use super::pending::PendingIo;
use super::FileId;
use crate::context::Class;
use crate::time::Nanos;

/// A page of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct PageKey {
    pub(crate) file: FileId,
    pub(crate) page: u64,
}

pub(crate) enum State {
    Free,
    Loading(Arc<PendingIo>),
    Clean,
    Dirty,
    /// A copy is being written; `dirty_again` if written to since the copy.
    Writeback {
        io: Arc<PendingIo>,
        dirty_again: bool,
    },
}

pub(crate) struct Frame {
    pub(crate) key: Option<PageKey>,
    pub(crate) data: Box<[u8]>,
    pub(crate) state: State,
    referenced: bool,
    /// The class the page counts against while dirty or under writeback.
    class: Class,
    dirtied_at: Nanos,
    /// Bumped by every write; a writeback records the value it copied.
    pub(crate) write_seq: u64,
    pub(crate) written_seq: u64,
}

/// What a caller must do to get a frame for a new page.
pub(crate) enum Alloc {
    /// This frame is free now (its key is set, state `Free`).
    Frame(usize),
    /// Every frame is busy; wait for this I/O, then retry.
    Wait(Arc<PendingIo>),
    /// Only dirty pages are left: write this one back, then retry.
    Reclaim(usize),
}

/// Frames, map, CLOCK hand and dirty counts.
pub(crate) struct Frames {
    frames: Vec<Frame>,
    map: HashMap<PageKey, usize>,
    hand: usize,
    dirty: [usize; 2],
}

impl Frames {
    pub(crate) fn new(count: usize, page_bytes: usize) -> Self {
        assert!(count >= 1);
        let frames = (0..count)
            .map(|_| Frame {
                key: None,
                data: vec![0; page_bytes].into_boxed_slice(),
                state: State::Free,
                referenced: false,
                class: Class::NonCritical,
                dirtied_at: 0,
                write_seq: 0,
                written_seq: 0,
            })
            .collect();
        Self {
            frames,
            map: HashMap::new(),
            hand: 0,
            dirty: [0; 2],
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.frames.len()
    }

    pub(crate) fn lookup(&self, key: PageKey) -> Option<usize> {
        self.map.get(&key).copied()
    }

    pub(crate) fn frame(&self, i: usize) -> &Frame {
        &self.frames[i]
    }

    pub(crate) fn frame_mut(&mut self, i: usize) -> &mut Frame {
        &mut self.frames[i]
    }

    /// Marks a frame recently used.
    pub(crate) fn touch(&mut self, i: usize) {
        self.frames[i].referenced = true;
    }

    /// Dirty pages (dirty or under writeback) per class.
    pub(crate) fn dirty(&self, class: Class) -> usize {
        self.dirty[class.index()]
    }

    /// Dirty pages of both classes.
    pub(crate) fn dirty_total(&self) -> usize {
        self.dirty[0] + self.dirty[1]
    }

    /// Finds a frame for `key` (not yet in the map) with CLOCK: the first
    /// clean, unreferenced frame, clearing reference bits on the way (two
    /// sweeps at most).
    pub(crate) fn alloc(&mut self, key: PageKey) -> Alloc {
        assert!(
            !self.map.contains_key(&key),
            "allocating a page already cached"
        );
        let n = self.frames.len();
        for _ in 0..2 * n {
            let i = self.hand;
            self.hand = (self.hand + 1) % n;
            let f = &mut self.frames[i];
            match f.state {
                State::Free => return self.claim(i, key),
                State::Clean if f.referenced => f.referenced = false,
                State::Clean => {
                    let old = f.key.take().expect("a clean frame has a page");
                    self.map.remove(&old);
                    f.state = State::Free;
                    return self.claim(i, key);
                }
                _ => {}
            }
        }
        // Nothing clean: wait for the oldest writeback, else reclaim the
        // oldest dirty page, else wait for a load.
        let oldest = |want: fn(&State) -> bool| {
            self.frames
                .iter()
                .enumerate()
                .filter(|(_, f)| want(&f.state))
                .min_by_key(|(_, f)| f.dirtied_at)
                .map(|(i, _)| i)
        };
        if let Some(i) = oldest(|s| matches!(s, State::Writeback { .. })) {
            if let State::Writeback { io, .. } = &self.frames[i].state {
                return Alloc::Wait(io.clone());
            }
        }
        if let Some(i) = oldest(|s| matches!(s, State::Dirty)) {
            return Alloc::Reclaim(i);
        }
        match self.frames.iter().find_map(|f| match &f.state {
            State::Loading(p) => Some(p.clone()),
            _ => None,
        }) {
            Some(p) => Alloc::Wait(p),
            None => unreachable!("no frame is free, clean, dirty, loading or under writeback"),
        }
    }

    fn claim(&mut self, i: usize, key: PageKey) -> Alloc {
        let f = &mut self.frames[i];
        f.key = Some(key);
        f.referenced = true;
        f.write_seq = 0;
        f.written_seq = 0;
        self.map.insert(key, i);
        Alloc::Frame(i)
    }

    /// Forgets a page whose load failed.
    pub(crate) fn release(&mut self, i: usize) {
        let f = &mut self.frames[i];
        assert!(matches!(f.state, State::Free | State::Loading(_)));
        if let Some(key) = f.key.take() {
            self.map.remove(&key);
        }
        f.state = State::Free;
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
            self.dirty[class.index()] += 1;
        } else if class == Class::Critical && f.class == Class::NonCritical {
            f.class = Class::Critical;
            self.dirty[0] += 1;
            self.dirty[1] -= 1;
        }
        newly
    }

    /// Starts writing a copy of dirty page `i` with `io`; returns the copy
    /// and the write sequence it covers.
    pub(crate) fn begin_writeback(&mut self, i: usize, io: Arc<PendingIo>) -> u64 {
        let f = &mut self.frames[i];
        assert!(
            matches!(f.state, State::Dirty),
            "writing back a page that is not dirty"
        );
        f.state = State::Writeback {
            io,
            dirty_again: false,
        };
        f.write_seq
    }

    /// Ends the writeback of page `i` that copied `seq`: clean, or dirty
    /// again if written meanwhile; a failed write leaves it dirty.
    pub(crate) fn end_writeback(&mut self, i: usize, seq: u64, ok: bool) {
        let f = &mut self.frames[i];
        let State::Writeback { dirty_again, .. } = f.state else {
            panic!("ending a writeback that did not start");
        };
        if ok {
            f.written_seq = f.written_seq.max(seq);
        }
        if dirty_again || !ok {
            f.state = State::Dirty;
        } else {
            f.state = State::Clean;
            self.dirty[f.class.index()] -= 1;
            f.class = Class::NonCritical;
        }
    }

    /// Up to `max` dirty pages (not under writeback), oldest first.
    pub(crate) fn oldest_dirty(&self, max: usize) -> Vec<usize> {
        let mut v: Vec<(Nanos, PageKey, usize)> = self
            .frames
            .iter()
            .enumerate()
            .filter(|(_, f)| matches!(f.state, State::Dirty))
            .map(|(i, f)| (f.dirtied_at, f.key.expect("dirty frame has a page"), i))
            .collect();
        v.sort_unstable();
        v.truncate(max);
        v.into_iter().map(|(_, _, i)| i).collect()
    }

    /// When the oldest dirty page was dirtied.
    pub(crate) fn oldest_dirty_at(&self) -> Option<Nanos> {
        self.frames
            .iter()
            .filter(|f| matches!(f.state, State::Dirty | State::Writeback { .. }))
            .map(|f| f.dirtied_at)
            .min()
    }

    /// The pages of `file` that hold writes not yet durable, with the write
    /// sequence each must reach.
    pub(crate) fn unflushed_of(&self, file: FileId) -> Vec<(PageKey, u64)> {
        self.frames
            .iter()
            .filter(|f| matches!(f.state, State::Dirty | State::Writeback { .. }))
            .filter_map(|f| f.key.filter(|k| k.file == file).map(|k| (k, f.write_seq)))
            .collect()
    }

    /// Every file with unflushed pages.
    pub(crate) fn files_with_unflushed(&self) -> Vec<FileId> {
        let mut v: Vec<FileId> = self
            .frames
            .iter()
            .filter(|f| matches!(f.state, State::Dirty | State::Writeback { .. }))
            .filter_map(|f| f.key.map(|k| k.file))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Drops every clean page (tests; a cold cache).
    pub(crate) fn drop_clean(&mut self) -> usize {
        let mut n = 0;
        for f in &mut self.frames {
            if matches!(f.state, State::Clean) {
                self.map
                    .remove(&f.key.take().expect("a clean frame has a page"));
                f.state = State::Free;
                n += 1;
            }
        }
        n
    }

    /// Checks the accounting (costly).
    #[cfg(any(test, debug_assertions))]
    pub(crate) fn check_invariants(&self) {
        let mut dirty = [0usize; 2];
        for (i, f) in self.frames.iter().enumerate() {
            match (&f.state, f.key) {
                (State::Free, k) => assert!(k.is_none() || self.map.get(&k.unwrap()) == Some(&i)),
                (_, Some(k)) => assert_eq!(self.map.get(&k), Some(&i), "map out of step"),
                (_, None) => panic!("a used frame without a page"),
            }
            if matches!(f.state, State::Dirty | State::Writeback { .. }) {
                dirty[f.class.index()] += 1;
            }
        }
        assert_eq!(dirty, self.dirty, "dirty counts drifted");
        assert!(self.map.len() <= self.frames.len());
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
                Alloc::Frame(i) => frames.frame_mut(i).state = State::Clean,
                _ => panic!("no free frame for page {p}"),
            }
        }
    }

    fn pending() -> Arc<PendingIo> {
        PendingIo::new("test", context::current(), &SyncOptions::default())
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
        let seq = f.begin_writeback(a, pending());
        f.mark_written(a, Class::NonCritical, 4); // written during writeback
        f.end_writeback(a, seq, true);
        assert!(matches!(f.frame(a).state, State::Dirty), "dirty again");
        let seq = f.begin_writeback(a, pending());
        f.end_writeback(a, seq, true);
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
            matches!(f.alloc(key(5)), Alloc::Wait(_)),
            "wait for the writeback"
        );
        let seq = f.begin_writeback(a, pending());
        f.end_writeback(a, seq, false);
        assert!(
            matches!(f.frame(a).state, State::Dirty),
            "a failed write stays dirty"
        );
    }
}
