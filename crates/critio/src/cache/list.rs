//! Intrusive doubly-linked lists of frame indices: the cache keeps every
//! frame on exactly one list per state (free, loading, clean, dirty, under
//! writeback), so finding a victim, the oldest dirty page or the oldest
//! writeback is O(1), and moving a frame between states is O(1), whatever
//! the number of frames (STYLE.md 18: nothing proportional on the hot path).
//!
//! ```text
//!   head ─> [i] <─> [j] <─> [k] <─ tail        links live in `Links`, one
//!                                               per frame, indexed by frame
//! ```

/// The "no frame" index.
pub(crate) const NIL: u32 = u32::MAX;

/// The links of one frame.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Links {
    prev: u32,
    next: u32,
    /// The list the frame is on, if any.
    on: Option<ListId>,
}

impl Default for Links {
    fn default() -> Self {
        Self {
            prev: NIL,
            next: NIL,
            on: None,
        }
    }
}

/// Which list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ListId {
    Free = 0,
    Loading = 1,
    Clean = 2,
    Dirty = 3,
    Writeback = 4,
}

const LISTS: usize = 5;

#[derive(Clone, Copy, Debug)]
struct Ends {
    head: u32,
    tail: u32,
    len: usize,
}

/// Every list over one set of frames.
pub(crate) struct Lists {
    links: Vec<Links>,
    ends: [Ends; LISTS],
}

impl Lists {
    /// `count` frames, on no list.
    pub(crate) fn new(count: usize) -> Self {
        assert!(count < NIL as usize, "too many frames for u32 links");
        Self {
            links: vec![Links::default(); count],
            ends: [Ends {
                head: NIL,
                tail: NIL,
                len: 0,
            }; LISTS],
        }
    }

    /// The list frame `i` is on.
    #[cfg(any(test, debug_assertions))]
    pub(crate) fn on(&self, i: usize) -> Option<ListId> {
        self.links[i].on
    }

    /// Frames on `list`.
    pub(crate) fn len(&self, list: ListId) -> usize {
        self.ends[list as usize].len
    }

    /// The first frame of `list`.
    pub(crate) fn front(&self, list: ListId) -> Option<usize> {
        let h = self.ends[list as usize].head;
        (h != NIL).then_some(h as usize)
    }

    /// The frame after `i` on its list.
    pub(crate) fn next(&self, i: usize) -> Option<usize> {
        let n = self.links[i].next;
        (n != NIL).then_some(n as usize)
    }

    /// Appends frame `i` (on no list) to the back of `list`.
    pub(crate) fn push_back(&mut self, list: ListId, i: usize) {
        assert!(self.links[i].on.is_none(), "frame {i} is already listed");
        let e = &mut self.ends[list as usize];
        let old_tail = e.tail;
        self.links[i] = Links {
            prev: old_tail,
            next: NIL,
            on: Some(list),
        };
        if old_tail == NIL {
            e.head = i as u32;
        } else {
            self.links[old_tail as usize].next = i as u32;
        }
        e.tail = i as u32;
        e.len += 1;
    }

    /// Takes frame `i` off whatever list it is on (none: nothing to do).
    pub(crate) fn unlink(&mut self, i: usize) {
        let Links { prev, next, on } = self.links[i];
        let Some(list) = on else { return };
        let e = &mut self.ends[list as usize];
        if prev == NIL {
            e.head = next;
        } else {
            self.links[prev as usize].next = next;
        }
        if next == NIL {
            e.tail = prev;
        } else {
            self.links[next as usize].prev = prev;
        }
        e.len -= 1;
        self.links[i] = Links::default();
    }

    /// Moves frame `i` to the back of `list`.
    pub(crate) fn move_back(&mut self, list: ListId, i: usize) {
        self.unlink(i);
        self.push_back(list, i);
    }

    /// Takes the first frame off `list`.
    pub(crate) fn pop_front(&mut self, list: ListId) -> Option<usize> {
        let i = self.front(list)?;
        self.unlink(i);
        Some(i)
    }

    /// Checks every list's links and lengths (costly).
    #[cfg(any(test, debug_assertions))]
    pub(crate) fn check_invariants(&self) {
        let mut listed = 0;
        for (l, e) in self.ends.iter().enumerate() {
            let mut n = 0;
            let mut prev = NIL;
            let mut at = e.head;
            while at != NIL {
                let links = &self.links[at as usize];
                assert_eq!(
                    links.on.map(|x| x as usize),
                    Some(l),
                    "frame on a wrong list"
                );
                assert_eq!(links.prev, prev, "broken back link");
                prev = at;
                at = links.next;
                n += 1;
                assert!(n <= self.links.len(), "list loops");
            }
            assert_eq!(e.tail, prev, "tail out of step");
            assert_eq!(e.len, n, "length out of step");
            listed += n;
        }
        let on_some = self.links.iter().filter(|l| l.on.is_some()).count();
        assert_eq!(listed, on_some, "a frame marked listed is on no list");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(l: &Lists, list: ListId) -> Vec<usize> {
        let mut v = Vec::new();
        let mut at = l.front(list);
        while let Some(i) = at {
            v.push(i);
            at = l.next(i);
        }
        v
    }

    #[test]
    fn frames_move_between_lists_in_order() {
        let mut l = Lists::new(6);
        for i in 0..6 {
            l.push_back(ListId::Free, i);
        }
        assert_eq!(l.pop_front(ListId::Free), Some(0));
        l.push_back(ListId::Dirty, 0);
        l.move_back(ListId::Dirty, 3);
        l.move_back(ListId::Dirty, 1);
        assert_eq!(items(&l, ListId::Dirty), vec![0, 3, 1]);
        assert_eq!(items(&l, ListId::Free), vec![2, 4, 5]);
        l.unlink(3);
        assert_eq!(l.on(3), None);
        l.push_back(ListId::Dirty, 3);
        assert_eq!(items(&l, ListId::Dirty), vec![0, 1, 3]);
        l.unlink(1);
        l.unlink(1); // not listed: nothing happens
        assert_eq!(items(&l, ListId::Dirty), vec![0, 3]);
        assert_eq!(l.len(ListId::Dirty), 2);
        l.check_invariants();
    }
}
