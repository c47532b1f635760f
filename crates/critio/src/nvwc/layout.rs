//! Where everything lives on the cache device, and how backing offsets map
//! to blocks.
//!
//! ```text
//!  cache device
//!  0        4096      8192                 8192+half           8192+2*half   data_offset
//!  +--------+---------+--------------------+--------------------+------------+------------------------+
//!  | header | header  | metadata log       | metadata log       | (padding)  | slot 0 | slot 1 | ...   |
//!  | even   | odd     | half 0 (even epoch)| half 1 (odd epoch) |            | block_bytes each       |
//!  +--------+---------+--------------------+--------------------+------------+------------------------+
//!  \________________________ metadata_bytes ___________________/
//! ```
//!
//! A header slot is one sector (the cache device's block size, at most
//! 4096). The log of epoch `e` lives in half `e % 2` and its header in slot
//! `e % 2`, so a compaction (epoch `e + 1`) never overwrites the live half
//! or the live header.

use super::config::{NvwcConfig, HEADER_BYTES, SECTOR_BYTES_MAX};
use super::error::NvwcError;
use super::record::{Geometry, RECORD_BYTES};
use crate::device::DeviceInfo;

/// The geometry of one open write cache.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    /// Bytes per cache block (the mapping granularity).
    pub(crate) block_bytes: u64,
    /// Cache slots.
    pub(crate) slots: u32,
    /// The cache device's sector: the unit of metadata writes.
    pub(crate) sector: usize,
    /// Bytes per metadata log half (a multiple of the sector).
    pub(crate) half_bytes: u64,
    /// Where slot 0 starts.
    pub(crate) data_offset: u64,
    /// The metadata region's size.
    pub(crate) metadata_bytes: u64,
    /// Blocks of the backing device (the write cache's capacity).
    pub(crate) backing_blocks: u64,
}

fn geometry_error(what: String, fix: &str) -> NvwcError {
    NvwcError::Geometry {
        what,
        fix: fix.to_owned(),
    }
}

impl Layout {
    /// The layout of `cfg` (validated) over these devices.
    pub(crate) fn new(
        cfg: &NvwcConfig,
        cache: &DeviceInfo,
        backing: &DeviceInfo,
    ) -> Result<Layout, NvwcError> {
        cfg.validate()?;
        let block_bytes = u64::from(cfg.block_bytes);
        let sector = cache.block_size;
        if !sector.is_power_of_two() || sector > SECTOR_BYTES_MAX {
            return Err(geometry_error(
                format!("cache device {} has {sector}-byte blocks", cache.name),
                "use a cache device with blocks of at most 4096 bytes",
            ));
        }
        for dev in [cache, backing] {
            if cfg.block_bytes % dev.block_size != 0 {
                return Err(geometry_error(
                    format!(
                        "nvwc.block_bytes = {} is not a multiple of device {}'s block size {}",
                        cfg.block_bytes, dev.name, dev.block_size
                    ),
                    "raise nvwc.block_bytes",
                ));
            }
        }
        let need = cfg.cache_device_bytes();
        if cache.capacity < need {
            return Err(geometry_error(
                format!(
                    "cache device {} holds {} bytes, but {need} are needed ({} of metadata and \
                     nvwc.cache_bytes = {})",
                    cache.name,
                    cache.capacity,
                    cfg.data_offset(),
                    cfg.cache_bytes
                ),
                "use a larger cache device or lower nvwc.cache_bytes",
            ));
        }
        let backing_blocks = backing.capacity / block_bytes;
        if backing_blocks == 0 {
            return Err(geometry_error(
                format!("backing device {} is smaller than one block", backing.name),
                "use a larger backing device",
            ));
        }
        let metadata_bytes = cfg.metadata_bytes_effective();
        let half_bytes = (metadata_bytes - HEADER_BYTES) / 2 / u64::from(SECTOR_BYTES_MAX)
            * u64::from(SECTOR_BYTES_MAX);
        assert!(half_bytes >= NvwcConfig::half_bytes_min(cfg.slots()));
        Ok(Layout {
            block_bytes,
            slots: u32::try_from(cfg.slots()).expect("validated: at most 2^24 slots"),
            sector: sector as usize,
            half_bytes,
            data_offset: cfg.data_offset(),
            metadata_bytes,
            backing_blocks,
        })
    }

    /// What the header records, checked when reopening.
    pub(crate) fn geometry(&self) -> Geometry {
        Geometry {
            block_bytes: self.block_bytes as u32,
            slots: self.slots,
            metadata_bytes: self.metadata_bytes,
            backing_blocks: self.backing_blocks,
        }
    }

    /// The write cache's capacity in bytes.
    pub(crate) fn capacity(&self) -> u64 {
        self.backing_blocks * self.block_bytes
    }

    /// The byte offset of header slot `epoch % 2`.
    pub(crate) fn header_offset(&self, epoch: u64) -> u64 {
        (epoch % 2) * u64::from(SECTOR_BYTES_MAX)
    }

    /// The byte offset of the log half of `epoch`.
    pub(crate) fn half_offset(&self, epoch: u64) -> u64 {
        HEADER_BYTES + (epoch % 2) * self.half_bytes
    }

    /// Sectors per log half.
    pub(crate) fn half_sectors(&self) -> u64 {
        self.half_bytes / self.sector as u64
    }

    /// Sectors that `records` records take.
    pub(crate) fn sectors_for(&self, records: usize) -> u64 {
        (records * RECORD_BYTES).div_ceil(self.sector) as u64
    }

    /// The byte offset of a slot's data.
    pub(crate) fn slot_offset(&self, slot: u32) -> u64 {
        assert!(slot < self.slots, "slot {slot} of {}", self.slots);
        self.data_offset + u64::from(slot) * self.block_bytes
    }

    /// The blocks `[first, first + n)` a command at `offset` of `len`
    /// bytes covers (validated: aligned and in range).
    pub(crate) fn blocks(&self, offset: u64, len: usize) -> (u64, u64) {
        debug_assert_eq!(offset % self.block_bytes, 0);
        debug_assert_eq!(len as u64 % self.block_bytes, 0);
        (offset / self.block_bytes, len as u64 / self.block_bytes)
    }
}
