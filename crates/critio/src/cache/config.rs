//! The `cache` section of the config; defaults are paper 000's.

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// The page cache's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheConfig {
    /// Memory for cached pages, in bytes. Default 64 MiB. At least 16 pages.
    pub capacity_bytes: u64,
    /// Page size in bytes: a power of two, 4096..=65536. Default 4096.
    pub page_bytes: u32,
    /// Separate dirty limits per class (paper 000, Section 4.3). Off: both
    /// classes share one limit (`shared_dirty_pct`), as Linux does. Default:
    /// on.
    pub dirty_limits: bool,
    /// Dirty pages of critical writers, in percent of the cache. Default 20.
    pub critical_dirty_pct: f64,
    /// Dirty pages of non-critical writers, in percent of the cache.
    /// Default 1.
    pub noncritical_dirty_pct: f64,
    /// The one limit of both classes when `dirty_limits` is off, in percent.
    /// Default 20.
    pub shared_dirty_pct: f64,
    /// Writeback starts when a class's dirty pages reach this percentage of
    /// its limit. Default 50.
    pub background_pct: f64,
    /// Pages dirty this long are written back even below the thresholds,
    /// in ms. Default 1000.
    pub dirty_expire_ms: u64,
    /// Most pages in one writeback write (contiguous pages of one file).
    /// Default 32 (128 KiB with 4 KiB pages).
    pub writeback_batch_pages: u32,
    /// Most writeback writes in flight at once. Default 16.
    pub writeback_inflight: u32,
    /// Most bytes of pages that are not dirty (clean, or being loaded); the
    /// rest of the cache holds only dirty pages, a write buffer that reads
    /// cannot use. 0 (the default): no limit. The experiments' isolation
    /// runs use it to give the dirty pages of a run without checkpoints
    /// room of their own while reads see the cache every other run has.
    pub clean_bytes_max: u64,
    /// Independent parts of the cache, each with its own lock, frames and
    /// replacement; a page's part is chosen by a hash of its file and its
    /// stripe of `writeback_batch_pages` pages (so a writeback run stays in
    /// one part). More parts: a request's page lookup rarely meets a
    /// background scan's lock hold. 0 (the default): one per 1024 frames,
    /// a power of two from 1 to 64. At most 1024, and each part holds at
    /// least 16 frames.
    pub shards: u32,
    /// Back the frames with memory ahead of their first use, in a
    /// background thread started with the cache (`prefault.rs`): a first
    /// write to a frame otherwise faults in and zeroes its memory (a 2 MiB
    /// huge page at once) in whichever thread brought a page in, a
    /// request's as often as not. The process then holds the cache's whole
    /// memory soon after start. Default: on.
    pub prefault: bool,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            capacity_bytes: 64 << 20,
            page_bytes: 4096,
            dirty_limits: true,
            critical_dirty_pct: 20.0,
            noncritical_dirty_pct: 1.0,
            shared_dirty_pct: 20.0,
            background_pct: 50.0,
            dirty_expire_ms: 1000,
            writeback_batch_pages: 32,
            writeback_inflight: 16,
            clean_bytes_max: 0,
            shards: 0,
            prefault: true,
        }
    }
}

fn invalid(field: &'static str, value: impl ToString, allowed: &str) -> ConfigError {
    ConfigError::Invalid {
        field,
        value: value.to_string(),
        allowed: allowed.to_owned(),
    }
}

impl CacheConfig {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let p = self.page_bytes;
        if !p.is_power_of_two() || !(4096..=65536).contains(&p) {
            return Err(invalid(
                "cache.page_bytes",
                p,
                "must be a power of two in 4096..=65536",
            ));
        }
        if self.capacity_bytes < 16 * u64::from(p) {
            return Err(invalid(
                "cache.capacity_bytes",
                self.capacity_bytes,
                "must hold at least 16 pages",
            ));
        }
        for (field, v) in [
            ("cache.critical_dirty_pct", self.critical_dirty_pct),
            ("cache.noncritical_dirty_pct", self.noncritical_dirty_pct),
            ("cache.shared_dirty_pct", self.shared_dirty_pct),
            ("cache.background_pct", self.background_pct),
        ] {
            if !(v > 0.0 && v <= 100.0) {
                return Err(invalid(field, v, "must be a percentage in (0, 100]"));
            }
        }
        if self.critical_dirty_pct + self.noncritical_dirty_pct > 100.0 {
            return Err(invalid(
                "cache.critical_dirty_pct",
                self.critical_dirty_pct,
                "plus noncritical_dirty_pct must not exceed 100",
            ));
        }
        if self.writeback_batch_pages == 0 || self.writeback_inflight == 0 {
            return Err(invalid(
                "cache.writeback_batch_pages",
                format!("{}/{}", self.writeback_batch_pages, self.writeback_inflight),
                "batch pages and writeback_inflight must be at least 1",
            ));
        }
        if self.shards > 1024 || self.frames() < 16 * self.shards as usize {
            return Err(invalid(
                "cache.shards",
                self.shards,
                "must be at most 1024, with at least 16 frames each (0: automatic)",
            ));
        }
        Ok(())
    }

    /// How many frames the cache has.
    pub fn frames(&self) -> usize {
        (self.capacity_bytes / u64::from(self.page_bytes)) as usize
    }

    /// How many parts (shards) the cache has: `shards`, or for 0 one per
    /// 1024 frames, a power of two from 1 to 64.
    pub fn shard_count(&self) -> usize {
        match self.shards {
            0 => {
                let per = (self.frames() / 1024).clamp(1, 64);
                1 << per.ilog2()
            }
            n => n as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_fields_are_named() {
        CacheConfig::default().validate().unwrap();
        let e = CacheConfig {
            page_bytes: 1000,
            ..CacheConfig::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("cache.page_bytes"), "{e}");
        let e = CacheConfig {
            noncritical_dirty_pct: 0.0,
            ..CacheConfig::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("noncritical_dirty_pct"), "{e}");
        assert_eq!(CacheConfig::default().frames(), 16384);
    }

    #[test]
    fn parts_grow_with_the_cache_up_to_64_and_too_many_is_an_error() {
        let of = |mib: u64| {
            CacheConfig {
                capacity_bytes: mib << 20,
                ..CacheConfig::default()
            }
            .shard_count()
        };
        assert_eq!(of(1), 1); // 256 frames
        assert_eq!(of(8), 2); // 2048 frames
        assert_eq!(of(64), 16);
        assert_eq!(of(1024), 64);
        assert_eq!(of(4096), 64);
        let e = CacheConfig {
            capacity_bytes: 1 << 20,
            shards: 32,
            ..CacheConfig::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("cache.shards"), "{e}");
    }
}
