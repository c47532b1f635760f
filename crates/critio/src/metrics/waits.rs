//! The wait-point histograms, sharded so that recording a wait takes no
//! process-wide lock.
//!
//! Every blocking wait ends with one record, so one shared table would be a
//! lock every waiting thread takes. Instead a [`WaitTables`] owns a few
//! shards, each its own small lock and table; a thread records into the
//! shard its thread-local index picks (threads are spread round-robin, so
//! two threads share a shard only when there are more threads than shards).
//! Reading merges the shards:
//!
//! ```text
//!  thread 0 ─record─> shard 0 ─┐
//!  thread 1 ─record─> shard 1 ─┼─ snapshot / histogram: lock each in turn, merge by (point, class)
//!  thread k ─record─> shard k%n┘   reset: lock each in turn, clear
//! ```
//!
//! Exact: a record is complete under its shard's lock, so every wait
//! recorded before a read starts is in it, and a reset clears every shard.
//! Within a shard a wait point is found by the address of its name (wait
//! points are `&'static str`), so the hot path hashes two words and
//! compares no strings; reads merge entries by the names' contents, so one
//! name spelled twice in the binary is still one row.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use super::LatencyHistogram;
use crate::class::Class;

/// Fewest and most shards a table set has.
const SHARDS_MIN: usize = 4;
const SHARDS_MAX: usize = 64;
/// Shards per CPU: threads are spread round-robin, most of them asleep.
const SHARDS_PER_CPU: usize = 4;

const _: () = assert!(SHARDS_MIN.is_power_of_two() && SHARDS_MAX.is_power_of_two());
const _: () = assert!(SHARDS_MIN <= SHARDS_MAX);

/// The next thread's shard index (threads take them in turn).
static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

std::thread_local! {
    /// This thread's shard index (reduced modulo each table set's size);
    /// `usize::MAX` until first use.
    static THREAD_INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn thread_index() -> usize {
    THREAD_INDEX.with(|i| {
        if i.get() == usize::MAX {
            i.set(NEXT_THREAD.fetch_add(1, Ordering::Relaxed) & (SHARDS_MAX - 1));
        }
        i.get()
    })
}

/// A wait point by the address and length of its name, and a class.
type Key = (usize, usize, Class);

/// Hashes a [`Key`]'s words with one multiply each (they are addresses and
/// small integers, not attacker-chosen).
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

type Table = HashMap<Key, (&'static str, LatencyHistogram), BuildHasherDefault<KeyHasher>>;

/// One shard, on its own cache lines so neighbours' locks do not share one.
#[repr(align(128))]
#[derive(Default)]
struct Shard(Mutex<Table>);

/// Histograms of waits by wait point and class, in shards.
pub(crate) struct WaitTables {
    shards: Box<[Shard]>,
}

impl Default for WaitTables {
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        let n = (cpus * SHARDS_PER_CPU)
            .next_power_of_two()
            .clamp(SHARDS_MIN, SHARDS_MAX);
        Self {
            shards: (0..n).map(|_| Shard::default()).collect(),
        }
    }
}

impl WaitTables {
    fn shard(&self) -> &Mutex<Table> {
        debug_assert!(self.shards.len().is_power_of_two());
        &self.shards[thread_index() & (self.shards.len() - 1)].0
    }

    /// Records one wait into the current thread's shard.
    pub(crate) fn record(&self, point: &'static str, class: Class, waited: Duration) {
        self.record_n(point, class, waited, 1);
    }

    /// Records `n` waits of one length into the current thread's shard.
    pub(crate) fn record_n(&self, point: &'static str, class: Class, waited: Duration, n: u64) {
        let key = (point.as_ptr() as usize, point.len(), class);
        let nanos = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.shard()
            .lock()
            .entry(key)
            .or_insert_with(|| (point, LatencyHistogram::new()))
            .1
            .record_nanos_n(nanos, n);
    }

    /// Every shard's histograms merged by wait point name and class.
    pub(crate) fn merged(&self) -> BTreeMap<(&'static str, Class), LatencyHistogram> {
        let mut out: BTreeMap<(&'static str, Class), LatencyHistogram> = BTreeMap::new();
        for shard in self.shards.iter() {
            for (&(_, _, class), (point, h)) in shard.0.lock().iter() {
                out.entry((point, class)).or_default().merge(h);
            }
        }
        out
    }

    /// One wait point's histogram of one class, merged over the shards
    /// (empty if never recorded).
    pub(crate) fn histogram(&self, point: &str, class: Class) -> LatencyHistogram {
        let mut out = LatencyHistogram::new();
        for shard in self.shards.iter() {
            for (&(_, _, c), (p, h)) in shard.0.lock().iter() {
                if c == class && *p == point {
                    out.merge(h);
                }
            }
        }
        out
    }

    /// Forgets every recorded wait, in every shard.
    pub(crate) fn clear(&self) {
        for shard in self.shards.iter() {
            shard.0.lock().clear();
        }
    }

    #[cfg(test)]
    fn shard_count(&self) -> usize {
        self.shards.len()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn waits_from_many_threads_are_all_in_the_merged_view() {
        let tables = std::sync::Arc::new(WaitTables::default());
        assert!(tables.shard_count() >= SHARDS_MIN);
        let threads: Vec<_> = (0..2 * SHARDS_MAX)
            .map(|i| {
                let tables = tables.clone();
                std::thread::spawn(move || {
                    let class = if i % 2 == 0 {
                        Class::Critical
                    } else {
                        Class::NonCritical
                    };
                    for _ in 0..10 {
                        tables.record("t: sharded", class, Duration::from_micros(i as u64 + 1));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let merged = tables.merged();
        assert_eq!(merged.len(), 2);
        assert_eq!(
            merged[&("t: sharded", Class::Critical)].count(),
            10 * SHARDS_MAX as u64
        );
        let h = tables.histogram("t: sharded", Class::NonCritical);
        assert_eq!(h.count(), 10 * SHARDS_MAX as u64);
        let max_us = h.max().as_secs_f64() * 1e6;
        let expected_us = (2 * SHARDS_MAX) as f64;
        assert!(
            (max_us - expected_us).abs() / expected_us < 0.002,
            "max {max_us} µs"
        );
        tables.clear();
        assert!(tables.merged().is_empty());
        assert_eq!(tables.histogram("t: sharded", Class::Critical).count(), 0);
    }

    #[test]
    fn one_name_at_two_addresses_is_one_wait_point() {
        let tables = WaitTables::default();
        let a: &'static str = "t: twice";
        let b: &'static str = Box::leak(String::from("t: twice").into_boxed_str());
        assert_ne!(a.as_ptr(), b.as_ptr());
        tables.record(a, Class::Critical, Duration::from_micros(1));
        tables.record(b, Class::Critical, Duration::from_micros(3));
        let merged = tables.merged();
        assert_eq!(merged.len(), 1);
        assert_eq!(merged[&("t: twice", Class::Critical)].count(), 2);
        assert_eq!(tables.histogram("t: twice", Class::Critical).count(), 2);
    }
}
