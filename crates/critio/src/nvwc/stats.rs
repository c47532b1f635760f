//! What the write cache did: counters kept with relaxed atomics, read as
//! one [`NvwcStats`] snapshot (the numbers paper 002's figures plot).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use super::policy::Policy;

/// A snapshot of the write cache's counters and gauges.
///
/// A *write* is one command; a *block* is `block_bytes` of it. A write can
/// count in more than one of `cached_writes`, `hit_writes` and
/// `bypassed_writes` when its blocks went to different places.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NvwcStats {
    /// The admission policy.
    pub policy: Policy,
    /// Write commands received.
    pub writes: u64,
    /// Writes the policy admitted, written (at least partly) to the cache:
    /// paper 002's "cached writes".
    pub cached_writes: u64,
    /// Blocks written to the cache for any reason (admission, overwrite of
    /// a cached block, reissue).
    pub cached_blocks: u64,
    /// Writes the policy did not admit that overwrote cached blocks, so
    /// those blocks went to the cache (a newer copy never goes behind an
    /// older cached one).
    pub hit_writes: u64,
    /// Writes sent (at least partly) to the backing device.
    pub bypassed_writes: u64,
    /// Blocks sent to the backing device by writes.
    pub bypassed_blocks: u64,
    /// Admitted writes sent to the backing device instead: the cache was
    /// full (`full = "bypass"`) or the write is larger than the cache.
    pub full_bypasses: u64,
    /// In-flight writes reissued to the cache because a critical task
    /// waited for them (CP+PI+IOI).
    pub reissues: u64,
    /// Blocks reissued.
    pub reissued_blocks: u64,
    /// Reissue requests that found nothing to reissue (not a bypassed write
    /// in flight, already done) or no free slot.
    pub reissue_misses: u64,
    /// Second completions of a reissued write (the original at the backing
    /// device, or the reissue if the original won) that were discarded.
    pub duplicates_suppressed: u64,
    /// Writes that waited for a free slot.
    pub stalls: u64,
    /// Total time writes waited for a free slot, in ns.
    pub stall_ns: u64,
    /// Blocks written back to the backing device.
    pub writeback_blocks: u64,
    /// Writeback rounds that wrote something.
    pub writeback_rounds: u64,
    /// Writeback rounds that failed (retried later).
    pub writeback_errors: u64,
    /// Read commands.
    pub reads: u64,
    /// Blocks read from the cache.
    pub read_hit_blocks: u64,
    /// Blocks read from the backing device.
    pub read_miss_blocks: u64,
    /// Flush commands.
    pub flushes: u64,
    /// Metadata log writes (batches of records).
    pub metadata_writes: u64,
    /// Metadata log compactions.
    pub compactions: u64,
    /// Cache slots.
    pub slots: u64,
    /// Slots in use now (written, being written, or waiting for a flush
    /// before reuse).
    pub used_slots: u64,
    /// Blocks waiting for writeback now.
    pub dirty_blocks: u64,
}

impl NvwcStats {
    /// Mean stall, in ms (0 without stalls).
    pub fn stall_mean_ms(&self) -> f64 {
        match self.stalls {
            0 => 0.0,
            n => self.stall_ns as f64 / n as f64 / 1e6,
        }
    }
}

macro_rules! counters {
    ($($name:ident),* $(,)?) => {
        /// The live counters.
        #[derive(Default, Debug)]
        pub(crate) struct Counters {
            $(pub(crate) $name: AtomicU64,)*
        }

        impl Counters {
            /// Copies every counter into `s`.
            fn fill(&self, s: &mut NvwcStats) {
                $(s.$name = self.$name.load(Ordering::Relaxed);)*
            }
        }
    };
}

counters!(
    writes,
    cached_writes,
    cached_blocks,
    hit_writes,
    bypassed_writes,
    bypassed_blocks,
    full_bypasses,
    reissues,
    reissued_blocks,
    reissue_misses,
    duplicates_suppressed,
    stalls,
    stall_ns,
    writeback_blocks,
    writeback_rounds,
    writeback_errors,
    reads,
    read_hit_blocks,
    read_miss_blocks,
    flushes,
    metadata_writes,
    compactions,
);

/// Adds `n` to a counter.
pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    /// A snapshot with the gauges given.
    pub(crate) fn snapshot(&self, policy: Policy, slots: u64, used: u64, dirty: u64) -> NvwcStats {
        let mut s = NvwcStats {
            policy,
            slots,
            used_slots: used,
            dirty_blocks: dirty,
            ..NvwcStats::default()
        };
        self.fill(&mut s);
        s
    }
}
