//! The index: where each key's latest record is in the value log, kept in
//! memory (like Bitcask's keydir) in stripes, each behind a critio mutex.
//!
//! ```text
//!  key ──crc32c──> stripe (one of STRIPES) ── map: key -> Loc { addr, size, kind, expire }
//!                                          └─ pre: while a snapshot runs, the Loc each
//!                                             key changed since it started had then
//! ```
//!
//! A stripe's lock is held by a request for the whole of a read (lookup and
//! the value's read from the cache) and of a write (lookup, logging,
//! append, index update), so a record cannot be relocated or its space
//! reused while someone reads it, and each key's log order is its apply
//! order. Every operation is O(1) in the number of keys: a stripe's map
//! holds about keys / STRIPES entries.
//!
//! Snapshots (BGSAVE) read the log as of their start without stopping
//! writers: the first change of a key after the start saves the key's
//! previous location in `pre`, and the snapshot reads a key's location
//! "as of the start" from `pre` first, then from `map`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use critio::sync::{Mutex, MutexGuard, SyncOptions};

/// Stripes of the index (a power of two).
pub(crate) const STRIPES: usize = 4096;
const _: () = assert!(STRIPES.is_power_of_two());

/// Where a key's latest record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Loc {
    /// The record's address in the value log (logical: it only grows).
    pub(crate) addr: u64,
    /// The record's size, padding included.
    pub(crate) size: u32,
    /// The value's kind (string or hash).
    pub(crate) kind: u8,
    /// Expiry in ms since the Unix epoch; 0 = never.
    pub(crate) expire_at_ms: u64,
}

impl Loc {
    /// Whether the key has expired at `now_ms`.
    pub(crate) fn expired(&self, now_ms: u64) -> bool {
        self.expire_at_ms != 0 && self.expire_at_ms <= now_ms
    }
}

/// One stripe of the index.
#[derive(Default)]
pub(crate) struct Stripe {
    map: HashMap<Box<[u8]>, Loc>,
    pre: HashMap<Box<[u8]>, Option<Loc>>,
}

impl Stripe {
    /// The key's location, if it has one.
    pub(crate) fn get(&self, key: &[u8]) -> Option<Loc> {
        self.map.get(key).copied()
    }

    /// Points `key` at `loc` (None: removes it); returns what it pointed
    /// at. `snapshot`: a snapshot that started before this change is
    /// running, so the previous location is saved for it.
    pub(crate) fn set(&mut self, key: &[u8], loc: Option<Loc>, snapshot: bool) -> Option<Loc> {
        let old = match loc {
            Some(l) => match self.map.get_mut(key) {
                Some(slot) => Some(std::mem::replace(slot, l)),
                None => self.map.insert(key.into(), l),
            },
            None => self.map.remove(key),
        };
        if snapshot && old != loc && !self.pre.contains_key(key) {
            self.pre.insert(key.into(), old);
        }
        old
    }

    /// The keys that have not expired at `now_ms`, with their locations.
    pub(crate) fn live(&self, now_ms: u64) -> impl Iterator<Item = (&[u8], &Loc)> {
        self.map
            .iter()
            .filter(move |(_, l)| !l.expired(now_ms))
            .map(|(k, l)| (&**k, l))
    }

    /// The key's location when the running snapshot started.
    pub(crate) fn as_of_snapshot(&self, key: &[u8]) -> Option<Loc> {
        match self.pre.get(key) {
            Some(then) => *then,
            None => self.get(key),
        }
    }

    /// Removes every key (FLUSHALL), saving their locations for a running
    /// snapshot; returns the sizes of the records they pointed at.
    pub(crate) fn clear(&mut self, snapshot: bool) -> (u64, u64) {
        let keys = self.map.len() as u64;
        let bytes = self.map.values().map(|l| u64::from(l.size)).sum();
        for (key, loc) in self.map.drain() {
            if snapshot {
                self.pre.entry(key).or_insert(Some(loc));
            }
        }
        self.map.shrink_to_fit();
        (keys, bytes)
    }

    /// The snapshot ended: forget what it needed.
    pub(crate) fn end_snapshot(&mut self) {
        self.pre = HashMap::new();
    }
}

/// The whole index.
pub(crate) struct Index {
    stripes: Box<[Mutex<Stripe>]>,
    keys: AtomicU64,
}

impl Index {
    /// An empty index whose stripe locks are accounted to `opts`.
    pub(crate) fn new(opts: SyncOptions) -> Self {
        Self {
            stripes: (0..STRIPES)
                .map(|_| Mutex::with_options(Stripe::default(), opts.clone()))
                .collect(),
            keys: AtomicU64::new(0),
        }
    }

    /// The stripe of `key`.
    pub(crate) fn stripe_of(key: &[u8]) -> usize {
        crc32c::crc32c(key) as usize & (STRIPES - 1)
    }

    /// Locks stripe `s`.
    pub(crate) fn lock(&self, s: usize) -> MutexGuard<'_, Stripe> {
        self.stripes[s].lock()
    }

    /// Locks stripe `s` unless a background thread holds it past `spin`
    /// ([`critio::sync::Mutex::lock_unless_background`]).
    pub(crate) fn lock_unless_background(
        &self,
        s: usize,
        spin: std::time::Duration,
    ) -> Option<MutexGuard<'_, Stripe>> {
        self.stripes[s].lock_unless_background(spin)
    }

    /// Whether stripe `s` is held by a thread that is not foreground (a
    /// background job's, boosted or not): worth a request's parking rather
    /// than its worker's wait. False if it is free by now.
    pub(crate) fn held_by_background(&self, s: usize) -> bool {
        self.stripes[s].held_by_background()
    }

    /// Keys in the index (expired ones not yet dropped included).
    pub(crate) fn keys(&self) -> u64 {
        self.keys.load(Ordering::Relaxed)
    }

    /// Counts a key added (`+1`) or removed (`-1`).
    pub(crate) fn count(&self, delta: i64) {
        if delta >= 0 {
            self.keys.fetch_add(delta as u64, Ordering::Relaxed);
        } else {
            self.keys.fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
        }
    }

    /// Recounts the keys (recovery, FLUSHALL).
    pub(crate) fn set_count(&self, keys: u64) {
        self.keys.store(keys, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(addr: u64) -> Option<Loc> {
        Some(Loc {
            addr,
            size: 64,
            kind: 0,
            expire_at_ms: 0,
        })
    }

    #[test]
    fn a_snapshot_sees_each_key_as_it_was_when_it_started() {
        let mut s = Stripe::default();
        s.set(b"a", loc(8), false);
        s.set(b"b", loc(16), false);
        // A snapshot starts; then a changes twice, b goes, c comes.
        s.set(b"a", loc(100), true);
        s.set(b"a", loc(200), true);
        s.set(b"b", None, true);
        s.set(b"c", loc(300), true);
        assert_eq!(s.as_of_snapshot(b"a"), loc(8), "the first pre-image stays");
        assert_eq!(s.as_of_snapshot(b"b"), loc(16));
        assert_eq!(s.as_of_snapshot(b"c"), None, "absent when it started");
        assert_eq!(s.get(b"a"), loc(200));
        s.end_snapshot();
        assert_eq!(s.as_of_snapshot(b"b"), None);
        assert_eq!(s.clear(true), (2, 128));
        assert_eq!(s.as_of_snapshot(b"a"), loc(200), "FLUSHALL saved it");
        assert_eq!(s.get(b"a"), None);
    }
}
