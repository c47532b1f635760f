//! The front door: one [`Stack`] opened from one [`Config`] assembles every
//! layer (device, optional write cache, block layer, page cache) and lays
//! out what lives on the device (the log, the files, raw regions), each
//! region checked against the device's end and every other region.
//!
//! ```text
//!  Config ── [device] ──> DeviceSpec::open ─┐
//!         ── [nvwc]   ──> WriteCache (cache device in front of it; its reissue hook wired to the block layer)
//!         ── [block]  ──> BlockLayer ───────┤
//!         ── [cache], [sync] ──> PageCache  │   reserve / add_file / open_log:
//!         ── [context] ──> kernel mirror,   │   regions on the device, overlap-checked
//!                          background nice  │
//!         ── [log]    ──> Log (open_log) ───┘
//! ```
//!
//! The stack applies every switch of the config itself: the kernel mirror
//! and the background threads' nice value are process-wide (they follow
//! threads, not stacks), so the last stack opened sets them; what could not
//! be applied (no permission to renice) is kept in [`Stack::notes`] and the
//! stack works without it.
//!
//! A region's placement is the caller's: an engine gives fixed offsets
//! ([`Stack::reserve`], [`Stack::add_file_at`], [`Stack::open_log_with`]),
//! or lets the stack place a file after everything reserved so far
//! ([`Stack::add_file`]: the same calls in the same order find the same
//! place on every open).
//!
//! ```
//! use critio::{Config, Stack, StackError};
//!
//! let mut config = Config::default();
//! config.device.capacity_bytes = 32 << 20;
//! config.log.region_offset_bytes = 0;
//! config.log.region_bytes = 4 << 20;
//! let stack = Stack::open(&config).unwrap();
//! let (_log, _) = stack.open_log().unwrap();
//! stack.add_file("data", 8 << 20).unwrap(); // placed after the log
//! let err = stack.add_file_at("dump", 1 << 20, 1 << 20).unwrap_err();
//! assert!(matches!(err, StackError::Layout { .. }));
//! assert!(err.to_string().contains("overlaps `log` [0, 4194304)"), "{err}");
//! let names: Vec<_> = stack.regions().into_iter().map(|r| r.name).collect();
//! assert_eq!(names, ["log", "data"]);
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::block::BlockLayer;
use crate::cache::{CacheError, FileId, PageCache};
use crate::config::Config;
use crate::device::{Device, DeviceOpenError, OpenOptions};
use crate::error::ConfigError;
use crate::log::{Log, LogConfig, LogError, Recovery};
use crate::metrics::{Metrics, MetricsHandle};
use crate::nvwc::WriteCache;
use crate::sync::SyncOptions;

/// A named region of the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    /// What lives there (`"log"`, a file's name, ...).
    pub name: String,
    /// The first byte.
    pub offset: u64,
    /// Its length in bytes.
    pub len: u64,
    /// What kind of region it is.
    pub kind: RegionKind,
}

impl Region {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// What a [`Region`] holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionKind {
    /// Raw blocks the caller reads and writes through the block layer
    /// (superblocks, headers).
    Raw,
    /// A write-ahead log.
    Log,
    /// A page-cache file.
    File,
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` [{}, {})",
            self.name,
            self.offset,
            self.offset + self.len
        )
    }
}

/// Why a stack could not be opened or a region not laid out.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StackError {
    /// A config field is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The device (or the write cache's device) cannot be opened.
    #[error("{what}: {source}")]
    Device {
        /// Which device (`device` or `nvwc.device`).
        what: &'static str,
        /// Why.
        #[source]
        source: DeviceOpenError,
    },
    /// The write cache cannot be opened over the devices.
    #[error("nvwc: {0}")]
    WriteCache(String),
    /// A region does not fit the device or overlaps another.
    #[error("layout: {what}; {fix}")]
    Layout {
        /// What does not fit.
        what: String,
        /// What to do.
        fix: String,
    },
    /// The page cache refused a file.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// The log cannot be opened or recovered.
    #[error(transparent)]
    Log(#[from] LogError),
}

/// An open stack: the device and every layer above it, and the layout of
/// the device. Share it with `Arc`; the layers are `Arc`s of their own, so
/// a handle taken from it outlives it.
pub struct Stack {
    config: Config,
    device: Arc<dyn Device>,
    write_cache: Option<Arc<WriteCache>>,
    block: Arc<BlockLayer>,
    cache: Arc<PageCache>,
    regions: Mutex<Vec<Region>>,
    notes: Vec<String>,
}

impl Drop for Stack {
    /// The kernel mirror is process-wide: a stack that turned it on
    /// (`context.kernel_mirror`) turns it off as it closes, so the next
    /// stack of the process starts from the kernel's defaults.
    fn drop(&mut self) {
        if self.config.context.kernel_mirror {
            crate::context::set_kernel_mirror(None);
        }
    }
}

impl fmt::Debug for Stack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stack")
            .field("device", &self.device.info().name)
            .field("write_cache", &self.write_cache.is_some())
            .field("regions", &*self.regions.lock())
            .finish_non_exhaustive()
    }
}

impl Stack {
    /// Opens `config.device` (and the write cache of `config.nvwc` in front
    /// of it) and every layer above, with every switch of `config` applied.
    pub fn open(config: &Config) -> Result<Stack, StackError> {
        config.validate()?;
        let device = config
            .device
            .spec
            .open(config.device.open_options())
            .map_err(|source| StackError::Device {
                what: "device",
                source,
            })?;
        Self::assemble(device, config)
    }

    /// Like [`Stack::open`] over a device the caller opened (a wrapper of
    /// its own, a fault injector); `config.device` is not used.
    pub fn over(device: Arc<dyn Device>, config: &Config) -> Result<Stack, StackError> {
        config.validate()?;
        Self::assemble(device, config)
    }

    /// Everything above the device, from a validated `config`.
    fn assemble(device: Arc<dyn Device>, config: &Config) -> Result<Stack, StackError> {
        let metrics = MetricsHandle::new_registry();
        let mut device = device;
        let write_cache = match &config.nvwc {
            None => None,
            Some(wc) => {
                let opts = OpenOptions {
                    capacity: wc.cache.cache_device_bytes(),
                    seed: config.device.seed.wrapping_add(1),
                    ..config.device.open_options()
                };
                let cache_dev = wc.device.open(opts).map_err(|source| StackError::Device {
                    what: "nvwc.device",
                    source,
                })?;
                let wc = Arc::new(
                    WriteCache::new(cache_dev, device, wc.cache)
                        .map_err(|e| StackError::WriteCache(e.to_string()))?,
                );
                wc.record_waits_in(metrics.clone());
                device = wc.clone();
                Some(wc)
            }
        };
        let mut notes = Vec::new();
        if config.context.kernel_mirror {
            let priorities = config.device.priorities.priorities();
            crate::context::set_kernel_mirror(Some(
                priorities.unwrap_or(crate::sys::ClassPriorities::LEVELS),
            ));
        }
        if let Err(why) = crate::context::set_background_nice(config.context.background_nice) {
            notes.push(format!("context.background_nice: {why}"));
        }
        if config.context.background_nice > 0 {
            let share = config.context.background_cpu_min_share;
            if let Err(why) = crate::context::set_background_cpu_min_share(share) {
                notes.push(format!("context.background_cpu_min_share: {why}"));
            }
        }
        crate::context::set_background_yield(Duration::from_micros(
            config.context.background_yield_us.into(),
        ));
        if config.context.background_idle && config.context.background_nice > 0 {
            if let Err(why) = crate::context::set_background_idle(true) {
                notes.push(format!("context.background_idle: {why}"));
            }
        }
        if let Err(why) = crate::context::set_lock_ceiling(config.context.lock_ceiling) {
            notes.push(format!("context.lock_ceiling: {why}"));
        }
        let block = Arc::new(BlockLayer::with_metrics(
            device.clone(),
            config.block,
            metrics.clone(),
        )?);
        if let Some(wc) = &write_cache {
            block.set_at_device_hook(wc.reissue_hook());
        }
        let cache = Arc::new(PageCache::new(block.clone(), config.cache, &config.sync)?);
        Ok(Stack {
            config: config.clone(),
            device,
            write_cache,
            block,
            cache,
            regions: Mutex::new(Vec::new()),
            notes,
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The device under the block layer (the write cache, if there is one).
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// The device's size in bytes.
    pub fn capacity(&self) -> u64 {
        self.device.info().capacity
    }

    /// This stack's wait-point registry: every wait on its block layer,
    /// page cache, log and write cache, and on the locks made with
    /// [`Stack::sync_options`]. (Inheritance counters are per process:
    /// a task's inheritance is not one stack's.)
    pub fn metrics(&self) -> &Metrics {
        self.block.metrics().get()
    }

    /// The handle of [`Stack::metrics`], to record other waits there.
    pub fn metrics_handle(&self) -> &MetricsHandle {
        self.block.metrics()
    }

    /// Options for a lock or condition variable of the application built
    /// on this stack: the config's `[sync]` switches, its waits recorded
    /// in [`Stack::metrics`] under wait point `name`.
    pub fn sync_options(&self, name: &'static str) -> SyncOptions {
        self.config.sync.options_in(name, self.block.metrics())
    }

    /// The write cache, if the config has one.
    pub fn write_cache(&self) -> Option<&Arc<WriteCache>> {
        self.write_cache.as_ref()
    }

    /// The block layer.
    pub fn block(&self) -> &Arc<BlockLayer> {
        &self.block
    }

    /// The page cache.
    pub fn cache(&self) -> &Arc<PageCache> {
        &self.cache
    }

    /// What could not be set up as configured, and what was done instead
    /// (for the operator; the stack works either way).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Every region laid out so far, in device order.
    pub fn regions(&self) -> Vec<Region> {
        let mut r = self.regions.lock().clone();
        r.sort_by_key(|r| r.offset);
        r
    }

    /// Reserves `[offset, offset + len)` for raw blocks named `name`
    /// (aligned to the device's block size, inside the device, overlapping
    /// no other region).
    pub fn reserve(&self, name: &str, offset: u64, len: u64) -> Result<Region, StackError> {
        self.place(name, offset, len, RegionKind::Raw)
    }

    /// Places a page-cache file of `len` bytes at `offset`.
    pub fn add_file_at(&self, name: &str, offset: u64, len: u64) -> Result<FileId, StackError> {
        let page = u64::from(self.config.cache.page_bytes);
        self.check_multiple(name, offset, len, page, "the page size")?;
        let region = self.place(name, offset, len, RegionKind::File)?;
        self.cache.add_file(name, offset, len).map_err(|e| {
            self.regions.lock().retain(|r| r != &region);
            StackError::Cache(e)
        })
    }

    /// Places a page-cache file of `len` bytes after every region laid out
    /// so far, at the next page boundary.
    pub fn add_file(&self, name: &str, len: u64) -> Result<FileId, StackError> {
        let page = u64::from(self.config.cache.page_bytes);
        let end = self.regions.lock().iter().map(Region::end).max();
        let offset = end.unwrap_or(0).div_ceil(page) * page;
        self.add_file_at(name, offset, len)
    }

    /// Opens (recovering, or formatting a blank region) the write-ahead log
    /// the config's `[log]` section places.
    pub fn open_log(&self) -> Result<(Log, Recovery), StackError> {
        self.open_log_with(&self.config.log)
    }

    /// Opens a write-ahead log with `cfg` (its region and limits) instead
    /// of the config's `[log]` section.
    pub fn open_log_with(&self, cfg: &LogConfig) -> Result<(Log, Recovery), StackError> {
        cfg.validate()?;
        let region = self.place(
            "log",
            cfg.region_offset_bytes,
            cfg.region_bytes,
            RegionKind::Log,
        )?;
        Log::open(self.block.clone(), cfg, &self.config.sync).map_err(|e| {
            self.regions.lock().retain(|r| r != &region);
            StackError::Log(e)
        })
    }

    fn check_multiple(
        &self,
        name: &str,
        offset: u64,
        len: u64,
        unit: u64,
        what: &str,
    ) -> Result<(), StackError> {
        if len == 0 || offset % unit != 0 || len % unit != 0 {
            return Err(StackError::Layout {
                what: format!("`{name}` at {offset}, {len} bytes, is not aligned to {what}"),
                fix: format!("give an offset and a positive length that are multiples of {unit}"),
            });
        }
        Ok(())
    }

    fn place(
        &self,
        name: &str,
        offset: u64,
        len: u64,
        kind: RegionKind,
    ) -> Result<Region, StackError> {
        let info = self.device.info();
        let block = u64::from(info.block_size);
        self.check_multiple(name, offset, len, block, "the device's block size")?;
        let region = Region {
            name: name.to_owned(),
            offset,
            len,
            kind,
        };
        if offset
            .checked_add(len)
            .is_none_or(|end| end > info.capacity)
        {
            return Err(StackError::Layout {
                what: format!(
                    "{region} ends past the end of {} ({} bytes)",
                    info.name, info.capacity
                ),
                fix: "use a larger device, or a smaller region".into(),
            });
        }
        let mut regions = self.regions.lock();
        if let Some(other) = regions.iter().find(|r| r.name == name && r.kind == kind) {
            return Err(StackError::Layout {
                what: format!("{region}: a region named `{name}` is already at {other}"),
                fix: "give each region its own name".into(),
            });
        }
        if let Some(other) = regions
            .iter()
            .find(|r| offset < r.end() && r.offset < region.end())
        {
            return Err(StackError::Layout {
                what: format!("{region} overlaps {other}"),
                fix: "move one of them (see Stack::regions for what is where)".into(),
            });
        }
        regions.push(region.clone());
        Ok(region)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::device::{DeviceConfig, DeviceSpec};
    use crate::nvwc::{NvwcConfig, Policy, WriteCacheConfig};

    fn small() -> Config {
        let mut c = Config {
            device: DeviceConfig {
                spec: DeviceSpec::Mem,
                capacity_bytes: 32 << 20,
                ..DeviceConfig::default()
            },
            ..Config::default()
        };
        c.cache.capacity_bytes = 1 << 20;
        c.log.region_offset_bytes = 4096;
        c.log.region_bytes = 4 << 20;
        c
    }

    #[test]
    fn regions_are_checked_against_the_device_and_each_other() {
        let stack = Stack::open(&small()).unwrap();
        assert_eq!(stack.capacity(), 32 << 20);
        stack.reserve("super", 0, 4096).unwrap();
        let (log, _) = stack.open_log().unwrap();
        drop(log);
        let data = stack.add_file("data", 8 << 20).unwrap();
        assert_eq!(stack.cache().file_len(data), 8 << 20);
        let regions = stack.regions();
        let names: Vec<_> = regions.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["super", "log", "data"]);
        assert_eq!(regions[2].offset, 4096 + (4 << 20), "placed after the log");

        let err = stack.add_file_at("dump", 1 << 20, 1 << 20).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("overlaps `log`") && text.contains("`dump`"),
            "{text}"
        );
        let err = stack.add_file("huge", 64 << 20).unwrap_err().to_string();
        assert!(err.contains("past the end"), "{err}");
        let err = stack.reserve("odd", 100, 4096).unwrap_err().to_string();
        assert!(err.contains("not aligned"), "{err}");
        let err = stack
            .reserve("super", 20 << 20, 4096)
            .unwrap_err()
            .to_string();
        assert!(err.contains("already"), "{err}");
        // A refused region takes no room: the next file goes where it would have.
        let dump = stack.add_file("dump", 1 << 20).unwrap();
        assert_ne!(dump, data);
        assert_eq!(stack.regions().last().unwrap().offset, 4096 + (12 << 20));
    }

    #[test]
    fn a_log_over_a_file_is_refused_with_both_named() {
        let stack = Stack::open(&small()).unwrap();
        stack.add_file_at("data", 0, 8 << 20).unwrap();
        let err = stack.open_log().unwrap_err().to_string();
        assert!(err.contains("`log`") && err.contains("`data`"), "{err}");
    }

    #[test]
    fn a_missing_device_and_a_bad_config_are_clear_errors() {
        let mut c = small();
        c.device.spec = DeviceSpec::Uring("/nonexistent-dir/critio.img".into());
        let err = Stack::open(&c).unwrap_err();
        assert!(
            matches!(err, StackError::Device { what: "device", .. }),
            "{err}"
        );
        let mut c = small();
        c.device.capacity_bytes = 1000;
        let err = Stack::open(&c).unwrap_err().to_string();
        assert!(err.contains("device.capacity_bytes"), "{err}");
    }

    #[test]
    fn a_write_cache_sits_under_the_block_layer() {
        let mut c = small();
        c.nvwc = Some(WriteCacheConfig {
            device: DeviceSpec::Mem,
            cache: NvwcConfig {
                policy: Policy::All,
                cache_bytes: 1 << 20,
                ..NvwcConfig::default()
            },
        });
        let stack = Stack::open(&c).unwrap();
        let wc = stack.write_cache().expect("a write cache").clone();
        assert!(Arc::ptr_eq(
            stack.device(),
            &(wc.clone() as Arc<dyn Device>)
        ));
        let (log, _) = stack.open_log().unwrap();
        let before = wc.stats().cached_writes;
        log.append_commit(b"through the write cache").unwrap();
        assert!(wc.stats().cached_writes > before);
    }

    #[test]
    fn each_stack_records_its_own_waits() {
        // A simulated SSD takes real time for every write, so the
        // foreground commit, which writes its batch itself, waits for its
        // write ("block: io") in its own thread. (A memory device would
        // complete it inline, with no wait.)
        let mut sim = small();
        sim.device.spec = DeviceSpec::Sim {
            profile: crate::device::sim::Profile::Ssd,
            file: None,
        };
        let (a, b) = (Stack::open(&sim).unwrap(), Stack::open(&small()).unwrap());
        assert_ne!(a.metrics_handle(), b.metrics_handle());
        let count = |m: &Metrics, point| m.wait_histogram(point, crate::Class::Critical).count();
        let (log, _) = a.open_log().unwrap();
        let lock = a.sync_options("t: stack lock");
        let lock = Arc::new(crate::sync::Mutex::with_options(0u32, lock));
        std::thread::scope(|s| {
            let held = lock.lock();
            let (committed, told) = std::sync::mpsc::channel();
            let (log, lock) = (&log, &lock);
            let waiter = s.spawn(move || {
                let _fg = crate::context::foreground();
                log.append_commit(b"a critical commit").unwrap();
                committed.send(()).unwrap();
                *lock.lock() += 1;
            });
            // The lock is held until well after the waiter came to it.
            told.recv().unwrap();
            std::thread::sleep(std::time::Duration::from_millis(50));
            drop(held);
            waiter.join().unwrap();
        });
        let io = "block: io";
        assert!(count(a.metrics(), io) >= 1);
        assert_eq!(count(a.metrics(), "t: stack lock"), 1);
        assert_eq!(count(b.metrics(), io), 0);
        // (Other tests may commit on logs without a stack, into the global
        // registry; the lock's name is this test's alone.)
        for other in [b.metrics(), crate::metrics::global()] {
            assert_eq!(count(other, "t: stack lock"), 0);
        }
    }
}
