//! [`NvwcConfig`]: the write cache's configuration, every default written
//! and explained, validated with an error that names the field.
//!
//! ```toml
//! [nvwc]
//! policy = "cp-pi-ioi"         # all | sync | cp | cp+pi | cp+pi+ioi (or cp-pi, cp-pi-ioi)
//! cache_bytes = 67108864       # 64 MiB of cached data
//! block_bytes = 4096           # the mapping granularity (and the device's block size)
//! metadata_bytes = 0           # 0: auto (see NvwcConfig::metadata_bytes_effective)
//! full = "stall"               # stall | bypass: what an admitted write does when no slot is free
//! writeback_start_pct = 50.0   # writeback starts when this much of the cache is in use
//! writeback_stop_pct = 25.0    # ... and stops below this
//! writeback_batch_blocks = 64  # blocks per writeback round (one backing flush each)
//! writeback_inflight_max = 4   # backing writes in flight per round
//! ```

use serde::{Deserialize, Serialize};

use super::policy::Policy;
use super::record::RECORD_BYTES;
use crate::device::IO_LEN_MAX;
use crate::error::ConfigError;

/// What an admitted write does when the cache has no free slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FullPolicy {
    /// Wait (without blocking a thread) until writeback frees slots, first
    /// come first served; counted and timed at the wait point
    /// [`STALL_POINT`](super::STALL_POINT). The default: it is what paper
    /// 002's cache (FlashCache) does, and what makes admission matter: a
    /// cache that admits everything stalls critical writes behind
    /// background ones (paper 002, Section 2.2, Figure 1a).
    #[default]
    Stall,
    /// Send the write to the backing device instead (write-through when
    /// full). Blocks already in the cache are still overwritten in the
    /// cache (a newer copy must never go behind an older cached one), so a
    /// write that overwrites cached blocks may still wait.
    Bypass,
}

/// The largest cache device sector (block size) the metadata log supports.
pub const SECTOR_BYTES_MAX: u32 = 4096;
/// The metadata region starts with two header slots of this many bytes.
pub const HEADER_BYTES: u64 = 2 * SECTOR_BYTES_MAX as u64;
/// The most record bytes one metadata write carries.
pub const BATCH_BYTES_MAX: u64 = 64 << 10;
/// The largest command the write cache accepts (the block layer's limit).
pub const COMMAND_BYTES_MAX: u64 = IO_LEN_MAX;
/// The smallest and largest `block_bytes`.
pub const BLOCK_BYTES_RANGE: std::ops::RangeInclusive<u32> = 4096..=65536;
/// The most cache slots (`cache_bytes / block_bytes`).
pub const SLOTS_MAX: u64 = 1 << 24;
/// The most blocks one writeback round writes back (its free records are
/// one metadata write).
pub const ROUND_BLOCKS_MAX: u32 = 2048;

// One command's records fit in one metadata write.
const _: () = assert!(COMMAND_BYTES_MAX / 4096 * RECORD_BYTES as u64 <= BATCH_BYTES_MAX);
const _: () = assert!(SECTOR_BYTES_MAX as usize % RECORD_BYTES == 0);
const _: () = assert!(ROUND_BLOCKS_MAX as u64 * RECORD_BYTES as u64 <= BATCH_BYTES_MAX);
const _: () = assert!(BATCH_BYTES_MAX % SECTOR_BYTES_MAX as u64 == 0);

/// The write cache's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NvwcConfig {
    /// Which writes the cache admits. Default `cp-pi-ioi` (critio's point:
    /// critical writes, and in-flight ones a critical task waits for).
    pub policy: Policy,
    /// Cached data, in bytes (a multiple of `block_bytes`, 16 blocks to
    /// 2^24 blocks). Default 64 MiB. The cache device must also hold the
    /// metadata: see [`NvwcConfig::cache_device_bytes`].
    pub cache_bytes: u64,
    /// The mapping granularity, a power of two in 4096..=65536 and a
    /// multiple of both devices' block sizes. It is also the write cache's
    /// own block size: commands must be aligned to it. Default 4096.
    pub block_bytes: u32,
    /// The metadata region at the start of the cache device, in bytes: two
    /// header slots and two halves of the metadata log. 0: auto, each half
    /// `max(1 MiB, 4 x cache_bytes / block_bytes x 32 B)` rounded up to
    /// 64 KiB. Default 0. An explicit size must give each half room for
    /// twice the largest compaction plus one batch (the error says how
    /// much).
    pub metadata_bytes: u64,
    /// What an admitted write does when no slot is free. Default `stall`.
    pub full: FullPolicy,
    /// Writeback starts when this percentage of the slots is in use.
    /// Default 50: room is left for bursts, and blocks overwritten soon
    /// (log blocks, hot pages) are written back once, not per write.
    pub writeback_start_pct: f64,
    /// Writeback stops when usage falls to this percentage (0 empties the
    /// cache). Default 25. At most `writeback_start_pct`.
    pub writeback_stop_pct: f64,
    /// Blocks written back per round; a round ends with one backing flush
    /// and one metadata write. Range 1..=2048. Default 64.
    pub writeback_batch_blocks: u32,
    /// Backing writes in flight at once during a round (contiguous blocks
    /// are merged into one write). Writeback is non-critical I/O below the
    /// block layer, so this bounds how much it competes with the requests
    /// that bypass the cache. Range 1..=64. Default 4.
    pub writeback_inflight_max: u32,
}

impl Default for NvwcConfig {
    fn default() -> Self {
        Self {
            policy: Policy::CpPiIoi,
            cache_bytes: 64 << 20,
            block_bytes: 4096,
            metadata_bytes: 0,
            full: FullPolicy::Stall,
            writeback_start_pct: 50.0,
            writeback_stop_pct: 25.0,
            writeback_batch_blocks: 64,
            writeback_inflight_max: 4,
        }
    }
}

fn invalid(field: &'static str, value: impl ToString, allowed: String) -> ConfigError {
    ConfigError::Invalid {
        field,
        value: value.to_string(),
        allowed,
    }
}

fn round_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to) * to
}

impl NvwcConfig {
    /// Cache slots: `cache_bytes / block_bytes`.
    pub fn slots(&self) -> u64 {
        self.cache_bytes / u64::from(self.block_bytes)
    }

    /// The smallest metadata log half for `slots` slots: twice the largest
    /// compaction (one record per slot, plus a partial sector) and one
    /// batch, so a compaction always leaves room for new records.
    pub fn half_bytes_min(slots: u64) -> u64 {
        let snapshot = slots * RECORD_BYTES as u64 + u64::from(SECTOR_BYTES_MAX);
        round_up(2 * snapshot + BATCH_BYTES_MAX, u64::from(SECTOR_BYTES_MAX))
    }

    /// The metadata region's size: `metadata_bytes`, or the auto size.
    pub fn metadata_bytes_effective(&self) -> u64 {
        if self.metadata_bytes != 0 {
            return self.metadata_bytes;
        }
        let half = (4 * self.slots() * RECORD_BYTES as u64).max(1 << 20);
        HEADER_BYTES + 2 * round_up(half, 64 << 10)
    }

    /// Where the data slots start on the cache device.
    pub fn data_offset(&self) -> u64 {
        round_up(self.metadata_bytes_effective(), u64::from(self.block_bytes))
    }

    /// How large the cache device must be: metadata, then the slots.
    pub fn cache_device_bytes(&self) -> u64 {
        self.data_offset() + self.cache_bytes
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let b = self.block_bytes;
        if !b.is_power_of_two() || !BLOCK_BYTES_RANGE.contains(&b) {
            let allowed = "must be a power of two in 4096..=65536".to_owned();
            return Err(invalid("nvwc.block_bytes", b, allowed));
        }
        let slots = self.slots();
        if self.cache_bytes % u64::from(b) != 0 || !(16..=SLOTS_MAX).contains(&slots) {
            let allowed = format!(
                "must be a multiple of nvwc.block_bytes ({b}) holding 16..={SLOTS_MAX} blocks"
            );
            return Err(invalid("nvwc.cache_bytes", self.cache_bytes, allowed));
        }
        self.validate_metadata()?;
        self.validate_writeback()
    }

    fn validate_metadata(&self) -> Result<(), ConfigError> {
        if self.metadata_bytes == 0 {
            return Ok(());
        }
        let half_min = Self::half_bytes_min(self.slots());
        let min = HEADER_BYTES + 2 * half_min;
        if self.metadata_bytes < min || self.metadata_bytes % u64::from(SECTOR_BYTES_MAX) != 0 {
            let allowed = format!(
                "must be 0 (auto) or a multiple of 4096 of at least {min} bytes for {} slots \
                 (two 4 KiB header slots and two log halves of {half_min} bytes)",
                self.slots()
            );
            return Err(invalid("nvwc.metadata_bytes", self.metadata_bytes, allowed));
        }
        Ok(())
    }

    fn validate_writeback(&self) -> Result<(), ConfigError> {
        let pct = |v: f64| (0.0..=100.0).contains(&v);
        if !pct(self.writeback_start_pct) || self.writeback_start_pct == 0.0 {
            let allowed = "must be a percentage in (0, 100]".to_owned();
            return Err(invalid(
                "nvwc.writeback_start_pct",
                self.writeback_start_pct,
                allowed,
            ));
        }
        if !pct(self.writeback_stop_pct) || self.writeback_stop_pct > self.writeback_start_pct {
            let allowed = format!(
                "must be a percentage in [0, nvwc.writeback_start_pct = {}]",
                self.writeback_start_pct
            );
            return Err(invalid(
                "nvwc.writeback_stop_pct",
                self.writeback_stop_pct,
                allowed,
            ));
        }
        if !(1..=ROUND_BLOCKS_MAX).contains(&self.writeback_batch_blocks) {
            let allowed = format!("must be within 1..={ROUND_BLOCKS_MAX}");
            return Err(invalid(
                "nvwc.writeback_batch_blocks",
                self.writeback_batch_blocks,
                allowed,
            ));
        }
        if !(1..=64).contains(&self.writeback_inflight_max) {
            let allowed = "must be within 1..=64".to_owned();
            return Err(invalid(
                "nvwc.writeback_inflight_max",
                self.writeback_inflight_max,
                allowed,
            ));
        }
        Ok(())
    }
}

/// The `[nvwc]` section of a stack's config: a write cache on `device` in
/// front of the stack's device, configured by `cache`. In the file the
/// device sits among the cache's own fields:
///
/// ```toml
/// [nvwc]
/// device = "file:/fast/critio-nvwc.img"   # any device spec; mem and sim are sized to fit
/// policy = "cp-pi-ioi"
/// cache_bytes = 67108864
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "toml::Table", into = "toml::Table")]
pub struct WriteCacheConfig {
    /// The cache device. A memory or simulated device is created with
    /// [`NvwcConfig::cache_device_bytes`]; a file must be at least that.
    pub device: crate::device::DeviceSpec,
    /// The write cache itself.
    pub cache: NvwcConfig,
}

impl Default for WriteCacheConfig {
    fn default() -> Self {
        Self {
            device: crate::device::DeviceSpec::Mem,
            cache: NvwcConfig::default(),
        }
    }
}

impl TryFrom<toml::Table> for WriteCacheConfig {
    type Error = String;

    fn try_from(mut table: toml::Table) -> Result<Self, String> {
        let device = match table.remove("device") {
            None => crate::device::DeviceSpec::Mem,
            Some(toml::Value::String(s)) => s.parse()?,
            Some(other) => return Err(format!("nvwc.device must be a string, not {other}")),
        };
        let cache =
            NvwcConfig::deserialize(toml::Value::Table(table)).map_err(|e| format!("nvwc: {e}"))?;
        Ok(Self { device, cache })
    }
}

impl From<WriteCacheConfig> for toml::Table {
    fn from(c: WriteCacheConfig) -> toml::Table {
        let mut table = match toml::Value::try_from(c.cache) {
            Ok(toml::Value::Table(t)) => t,
            _ => unreachable!("NvwcConfig serializes to a table"),
        };
        table.insert("device".into(), toml::Value::String(c.device.to_string()));
        table
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_are_documented() {
        let c = NvwcConfig::default();
        c.validate().unwrap();
        assert_eq!(c.slots(), 16384);
        assert_eq!(c.policy, Policy::CpPiIoi);
        assert_eq!(c.full, FullPolicy::Stall);
        // Auto: each half 4 x 16384 x 32 B = 2 MiB.
        assert_eq!(c.metadata_bytes_effective(), HEADER_BYTES + 4 * (1 << 20));
        assert!(
            c.metadata_bytes_effective() >= HEADER_BYTES + 2 * NvwcConfig::half_bytes_min(16384)
        );
        assert_eq!(c.cache_device_bytes(), c.data_offset() + (64 << 20));
        assert_eq!(c.data_offset() % 4096, 0);
    }

    #[test]
    fn auto_metadata_is_always_large_enough() {
        for slots in [16u64, 100, 1000, 1152, 5000, 1 << 20] {
            let c = NvwcConfig {
                cache_bytes: slots * 4096,
                ..NvwcConfig::default()
            };
            c.validate().unwrap();
            let half = (c.metadata_bytes_effective() - HEADER_BYTES) / 2;
            assert!(half >= NvwcConfig::half_bytes_min(slots), "{slots} slots");
        }
    }

    #[test]
    fn errors_name_the_field() {
        let cases: [(NvwcConfig, &str); 7] = [
            (
                NvwcConfig {
                    block_bytes: 1000,
                    ..Default::default()
                },
                "nvwc.block_bytes",
            ),
            (
                NvwcConfig {
                    cache_bytes: 4096 * 15,
                    ..Default::default()
                },
                "nvwc.cache_bytes",
            ),
            (
                NvwcConfig {
                    cache_bytes: 4096 * 16 + 1,
                    ..Default::default()
                },
                "nvwc.cache_bytes",
            ),
            (
                NvwcConfig {
                    metadata_bytes: 8192,
                    ..Default::default()
                },
                "nvwc.metadata_bytes",
            ),
            (
                NvwcConfig {
                    writeback_stop_pct: 60.0,
                    ..Default::default()
                },
                "nvwc.writeback_stop_pct",
            ),
            (
                NvwcConfig {
                    writeback_batch_blocks: 0,
                    ..Default::default()
                },
                "nvwc.writeback_batch_blocks",
            ),
            (
                NvwcConfig {
                    writeback_inflight_max: 65,
                    ..Default::default()
                },
                "nvwc.writeback_inflight_max",
            ),
        ];
        for (c, field) in cases {
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
        let e = NvwcConfig {
            metadata_bytes: 8192,
            ..Default::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("at least"), "{e}");
    }

    #[test]
    fn toml_round_trips_and_rejects_unknown_keys() {
        let c: NvwcConfig = toml::from_str("policy = \"cp+pi\"\nfull = \"bypass\"").unwrap();
        assert_eq!((c.policy, c.full), (Policy::CpPi, FullPolicy::Bypass));
        assert_eq!(c.cache_bytes, NvwcConfig::default().cache_bytes);
        let text = toml::to_string(&c).unwrap();
        assert_eq!(toml::from_str::<NvwcConfig>(&text).unwrap(), c);
        assert!(toml::from_str::<NvwcConfig>("cache_byte = 1").is_err());
    }

    #[test]
    fn the_nvwc_section_takes_a_device_among_the_cache_fields() {
        let text = "device = \"sim:ssd\"\ncache_bytes = 1048576\npolicy = \"all\"\n";
        let c: WriteCacheConfig = toml::from_str(text).unwrap();
        assert_eq!(c.device.to_string(), "sim:ssd");
        assert_eq!(c.cache.cache_bytes, 1 << 20);
        assert_eq!(c.cache.policy, Policy::All);
        let back: WriteCacheConfig = toml::from_str(&toml::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        let err = toml::from_str::<WriteCacheConfig>("cache_byte = 1").unwrap_err();
        assert!(err.to_string().contains("cache_byte"), "{err}");
        let err = toml::from_str::<WriteCacheConfig>("device = \"nope\"").unwrap_err();
        assert!(err.to_string().contains("not a device"), "{err}");
    }
}
