//! Where things live on the device.
//!
//! ```text
//!  0        8 KiB           64 KiB                 64 KiB + log        ...              end
//!  | super A | super B | ... | log region (ring)     | dump file (BGSAVE) | data pages          |
//! ```
//!
//! The data region holds bucket pages, blobs and checkpoint metadata, as
//! pages numbered from 0 (page 0 is never used: it is the null page).

use crate::engine::EngineError;

/// The first superblock slot; the second follows it.
pub(crate) const SUPERBLOCK_OFFSET: u64 = 0;
/// Bytes of one superblock slot.
pub(crate) const SUPERBLOCK_BYTES: u64 = 4096;
/// Where the log region starts.
pub(crate) const LOG_OFFSET: u64 = 64 << 10;

/// The regions of one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The log ring.
    pub log: (u64, u64),
    /// The dump (snapshot) file.
    pub dump: (u64, u64),
    /// The data pages: (offset, number of pages).
    pub data: (u64, u64),
    /// Page size.
    pub page: u64,
}

impl Layout {
    /// The dump file's body area, in bytes: the file less its header page.
    pub(crate) fn dump_area(&self) -> u64 {
        self.dump.1 - self.page
    }

    /// Lays out a device of `capacity` bytes with a log of `log_bytes` and a
    /// dump file of `dump_pct` percent of what remains.
    pub fn new(
        capacity: u64,
        log_bytes: u64,
        dump_pct: u64,
        page: u64,
    ) -> Result<Layout, EngineError> {
        let round = |x: u64| x / page * page;
        let log = (LOG_OFFSET, round(log_bytes));
        let after_log = log.0 + log.1;
        let rest = round(capacity.saturating_sub(after_log));
        let dump = (after_log, round(rest * dump_pct / 100));
        let data_off = dump.0 + dump.1;
        let pages = capacity.saturating_sub(data_off) / page;
        if pages < 64 || dump.1 < page {
            return Err(EngineError::Config(format!(
                "a {capacity}-byte device is too small for a {log_bytes}-byte log, a dump file \
                 and at least 64 data pages; use a larger device or a smaller log"
            )));
        }
        Ok(Layout {
            log,
            dump,
            data: (data_off, pages),
            page,
        })
    }
}
