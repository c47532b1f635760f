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

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use critio::sync::{Mutex, MutexGuard, SyncOptions};
use foldhash::fast::RandomState;
use hashbrown::hash_table::{Entry, HashTable};

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

/// Key bytes a [`Key`] holds in itself.
const INLINE: usize = 22;

/// A key as the index holds it: up to [`INLINE`] bytes in its slot of the
/// table (no allocation of its own, and a lookup compares it without
/// following a pointer to another cache line), a longer one on the heap.
#[derive(Clone, Debug)]
enum Key {
    Inline(u8, [u8; INLINE]),
    Heap(Box<[u8]>),
}

impl Key {
    fn new(key: &[u8]) -> Key {
        if key.len() <= INLINE {
            let mut bytes = [0; INLINE];
            bytes[..key.len()].copy_from_slice(key);
            Key::Inline(key.len() as u8, bytes)
        } else {
            Key::Heap(key.into())
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Key::Inline(len, bytes) => &bytes[..usize::from(*len)],
            Key::Heap(bytes) => bytes,
        }
    }
}

impl AsRef<[u8]> for Key {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

impl From<&[u8]> for Key {
    fn from(key: &[u8]) -> Key {
        Key::new(key)
    }
}

/// A key and where its latest record is: one slot of a stripe's table.
struct Slot {
    key: Key,
    loc: Loc,
}

/// One stripe of the index: open-addressing tables (hashbrown's
/// `HashTable`) of slots that hold short keys in place, hashed with
/// foldhash under a seed of the stripe's own, drawn at random (a client
/// cannot choose keys that collide without knowing it). Against the
/// `HashMap<Box<[u8]>, Loc>` with SipHash it replaced, on this project's
/// 2-vCPU test machine: the scale test's 10 million keys of 16 bytes took
/// 96 bytes of memory per key instead of 109 and reopened (the index
/// rebuilt) in 14.6 s instead of 20.0; a BGSAVE of 300k keys, whose
/// every record is an index lookup, 365 ms of CPU instead of 485 (medians
/// of 12), and a BGREWRITEAOF 550 instead of 630.
#[derive(Default)]
pub(crate) struct Stripe {
    hasher: RandomState,
    map: HashTable<Slot>,
    /// While a snapshot runs: what each key changed since it started
    /// pointed at then (None: it was absent).
    pre: HashTable<(Key, Option<Loc>)>,
}

/// Saves where `key` (hashed to `h`) pointed when the running snapshot
/// started, unless an earlier change since then already did: the first
/// change's previous location is the one the snapshot reads.
fn keep_first<K: AsRef<[u8]> + Into<Key>>(
    pre: &mut HashTable<(Key, Option<Loc>)>,
    hasher: &RandomState,
    h: u64,
    key: K,
    then: Option<Loc>,
) {
    let rehash = |(k, _): &(Key, Option<Loc>)| hasher.hash_one(k.bytes());
    if let Entry::Vacant(v) = pre.entry(h, |(k, _)| k.bytes() == key.as_ref(), rehash) {
        v.insert((key.into(), then));
    }
}

impl Stripe {
    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The key's location, if it has one.
    pub(crate) fn get(&self, key: &[u8]) -> Option<Loc> {
        if self.map.is_empty() {
            return None;
        }
        let h = self.hash(key);
        self.map.find(h, |s| s.key.bytes() == key).map(|s| s.loc)
    }

    /// Points `key` at `loc` (None: removes it); returns what it pointed
    /// at. `snapshot`: a snapshot that started before this change is
    /// running, so the previous location is saved for it.
    pub(crate) fn set(&mut self, key: &[u8], loc: Option<Loc>, snapshot: bool) -> Option<Loc> {
        let h = self.hash(key);
        let Stripe { hasher, map, pre } = self;
        let rehash = |s: &Slot| hasher.hash_one(s.key.bytes());
        let old = match loc {
            Some(l) => match map.entry(h, |s| s.key.bytes() == key, rehash) {
                Entry::Occupied(mut o) => Some(std::mem::replace(&mut o.get_mut().loc, l)),
                Entry::Vacant(v) => {
                    v.insert(Slot {
                        key: Key::new(key),
                        loc: l,
                    });
                    None
                }
            },
            None => match map.find_entry(h, |s| s.key.bytes() == key) {
                Ok(o) => Some(o.remove().0.loc),
                Err(_) => None,
            },
        };
        if snapshot && old != loc {
            keep_first(pre, hasher, h, key, old);
        }
        old
    }

    /// The keys that have not expired at `now_ms`, with their locations.
    pub(crate) fn live(&self, now_ms: u64) -> impl Iterator<Item = (&[u8], &Loc)> {
        self.map
            .iter()
            .filter(move |s| !s.loc.expired(now_ms))
            .map(|s| (s.key.bytes(), &s.loc))
    }

    /// The key's location when the running snapshot started.
    pub(crate) fn as_of_snapshot(&self, key: &[u8]) -> Option<Loc> {
        if self.pre.is_empty() {
            return self.get(key);
        }
        let h = self.hash(key);
        match self.pre.find(h, |(k, _)| k.bytes() == key) {
            Some((_, then)) => *then,
            None => self.map.find(h, |s| s.key.bytes() == key).map(|s| s.loc),
        }
    }

    /// Removes every key (FLUSHALL), saving their locations for a running
    /// snapshot; returns the sizes of the records they pointed at.
    pub(crate) fn clear(&mut self, snapshot: bool) -> (u64, u64) {
        let Stripe { hasher, map, pre } = self;
        let keys = map.len() as u64;
        let bytes = map.iter().map(|s| u64::from(s.loc.size)).sum();
        for Slot { key, loc } in map.drain() {
            if snapshot {
                let h = hasher.hash_one(key.bytes());
                keep_first(pre, hasher, h, key, Some(loc));
            }
        }
        map.shrink_to_fit(|s| hasher.hash_one(s.key.bytes()));
        (keys, bytes)
    }

    /// The snapshot ended: forget what it needed.
    pub(crate) fn end_snapshot(&mut self) {
        self.pre = HashTable::new();
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

    #[test]
    fn a_key_is_held_in_its_slot_up_to_22_bytes_and_any_key_is_found() {
        assert_eq!(std::mem::size_of::<Key>(), 24, "a slot's key is 24 bytes");
        assert!(matches!(Key::new(&[7; INLINE]), Key::Inline(22, _)));
        assert!(matches!(Key::new(&[7; INLINE + 1]), Key::Heap(_)));
        let mut s = Stripe::default();
        // Empty, at the inline limit and past it, and keys that are
        // prefixes of each other (the inline padding is zeros).
        let keys: Vec<Vec<u8>> = vec![
            vec![],
            vec![0],
            vec![0, 0],
            vec![b'k'; INLINE],
            vec![b'k'; INLINE + 1],
            vec![b'k'; 1000],
        ];
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(s.set(k, loc(i as u64), false), None);
        }
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(s.get(k), loc(i as u64), "key of {} bytes", k.len());
        }
        assert_eq!(s.live(0).count(), keys.len());
        assert_eq!(s.set(&keys[1], None, false), loc(1));
        assert_eq!(s.get(&keys[1]), None);
        assert_eq!(s.get(&keys[2]), loc(2), "its neighbour stays");
        assert_eq!(s.set(&keys[4], None, false), loc(4));
        assert_eq!(s.get(&keys[3]), loc(3));
        assert_eq!(s.get(&keys[5]), loc(5));
    }

    #[test]
    fn a_stripe_grows_and_shrinks_with_its_keys() {
        let mut s = Stripe::default();
        let key = |i: u64| format!("key:{i:012}").into_bytes();
        for i in 0..10_000 {
            s.set(&key(i), loc(i), false);
        }
        for i in (0..10_000).step_by(2) {
            assert_eq!(s.set(&key(i), None, false), loc(i));
        }
        for i in 0..10_000 {
            let want = if i % 2 == 0 { None } else { loc(i) };
            assert_eq!(s.get(&key(i)), want, "key {i}");
        }
        assert_eq!(s.clear(false), (5_000, 5_000 * 64));
        assert_eq!(s.live(0).count(), 0);
    }
}
