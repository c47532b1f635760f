//! The whole I/O stack of one store, assembled from a scheme and a config:
//! device, block layer, page cache, log and engine.
//!
//! Schemes (DESIGN.md section 7) are named configurations of the same stack,
//! so experiments compare them in one run:
//!
//! On a simulated or memory device:
//!
//! | scheme        | block layer              | cache dirty limits | inheritance (locks, condvars, I/O) | drive firmware priority |
//! |---------------|--------------------------|--------------------|------------------------------------|-------------------------|
//! | `none`        | one FIFO                 | one shared limit   | off                                | off                     |
//! | `kernel-idle` | two queues, idle class emulated (background only when no request I/O waits), no cap | one shared limit | off | off |
//! | `static`      | classes by task, cap     | per class          | off                                | on                      |
//! | `sync-first`  | classes by sync/async    | one shared limit   | off                                | on                      |
//! | `rcp`         | classes by task, cap, promotion | per class   | on                                 | on                      |
//!
//! On a real device (`file:`, `pool:`) the two baselines are what Linux
//! itself does, not emulations: critio's block layer is a plain FIFO
//! pass-through as deep as the kernel's queue (the disk's `nr_requests`),
//! and the kernel's I/O scheduler decides.
//!
//! | scheme        | critio's block layer     | kernel I/O priority                                        |
//! |---------------|--------------------------|------------------------------------------------------------|
//! | `none`        | pass-through             | none set: every request the kernel's default               |
//! | `kernel-idle` | pass-through             | `ionice -c3` on background threads (`ioprio_set`, the kernel mirror), their I/O in the idle class, request I/O best-effort 4 |
//! | `static`, `sync-first`, `rcp` | as above | per-request levels: critical BE 0, non-critical BE 7 |
//!
//! `kernel-idle` is the best a user can do today with `ionice -c3` on the
//! background threads, and nothing else in the stack knows about it.
//!
//! The layers come from [`critio::Stack`]: a [`StackConfig`] becomes one
//! critio [`Config`] (the scheme's switches, `[device]`, `[nvwc]`), and
//! the engine lays its regions out on that stack, each checked against the
//! others. With a [`WriteCacheSpec`], the device is a write cache (critio's
//! `nvwc`) of a fast cache device in front of the configured one, whose
//! reissue hook the stack wires into the block layer, so that promotion of
//! a write already at the backing device reissues it to the cache (paper
//! 002):
//!
//! ```text
//!  engine ─> page cache / log ─> block layer ─> WriteCache ─┬─> cache device (admitted writes)
//!                                      └── at-device hook ──┘─> backing device (the rest)
//! ```

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use critio::block::{BlockScheme, NoncriticalCap};
use critio::config::Config;
use critio::device::uring::ENTRIES_DEFAULT;
use critio::device::{DeviceConfig, DeviceSpec, PriorityMode};
use critio::nvwc::{NvwcConfig, WriteCacheConfig};
use critio::sys::ClassPriorities;
use serde::{Deserialize, Serialize};

use crate::engine::{Engine, EngineConfig, EngineError};

/// A named configuration of the stack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scheme {
    /// No classes anywhere (Linux's default behaviour).
    None,
    /// Background threads in the kernel's idle class; priority only at the
    /// I/O scheduler.
    KernelIdle,
    /// Foreground first in every layer, no inheritance.
    Static,
    /// Synchronous I/O first.
    SyncFirst,
    /// Request-centric prioritization: everything on.
    #[default]
    Rcp,
}

impl Scheme {
    /// Every scheme, in table order.
    pub const ALL: [Scheme; 5] = [
        Scheme::None,
        Scheme::KernelIdle,
        Scheme::Static,
        Scheme::SyncFirst,
        Scheme::Rcp,
    ];

    /// The name used on command lines and in tables.
    pub fn name(self) -> &'static str {
        match self {
            Scheme::None => "none",
            Scheme::KernelIdle => "kernel-idle",
            Scheme::Static => "static",
            Scheme::SyncFirst => "sync-first",
            Scheme::Rcp => "rcp",
        }
    }

    /// `base` with this scheme's switches applied, for the device in its
    /// `[device]` section (the baselines differ between real and simulated
    /// devices: see the module docs).
    pub fn apply(self, base: &Config) -> Config {
        let mut c = base.clone();
        let real = is_real(&c.device.spec);
        let passthrough = real && self.is_baseline();
        let (block, dirty_limits, inheritance) = match self {
            Scheme::None => (BlockScheme::None, false, false),
            Scheme::KernelIdle if passthrough => (BlockScheme::None, false, false),
            Scheme::KernelIdle => (BlockScheme::Static, false, false),
            Scheme::Static => (BlockScheme::Static, true, false),
            Scheme::SyncFirst => (BlockScheme::SyncFirst, false, false),
            Scheme::Rcp => (BlockScheme::Rcp, true, true),
        };
        c.block.scheme = block;
        c.cache.dirty_limits = dirty_limits;
        c.sync.inheritance = inheritance;
        // Background threads yield the CPU only where a scheme classifies
        // by task (static: without inheritance, a background lock holder
        // a request waits for stays slow; rcp: it runs at full speed).
        if !matches!(self, Scheme::Static | Scheme::Rcp) {
            c.context.background_nice = 0;
        }
        if self == Scheme::KernelIdle && !passthrough {
            // The emulated idle class: no cap on background at the device.
            c.block.noncritical_cap = NoncriticalCap::Fixed(0);
        }
        c.device.priorities = self.priority_mode();
        if passthrough {
            // As deep as the kernel's queue, so the kernel's scheduler sees
            // everything a plain program would give it.
            // (One FIFO admits critical_slots + noncritical_slots, 256 by
            // default, as many as mq-deadline's nr_requests.)
            c.device.queue_depth = 0;
        }
        if real && self == Scheme::KernelIdle {
            // ionice -c3 on the background threads themselves.
            c.context.kernel_mirror = true;
        }
        c
    }

    /// `none` and `kernel-idle`: the settings a user has without critio.
    pub fn is_baseline(self) -> bool {
        matches!(self, Scheme::None | Scheme::KernelIdle)
    }

    /// The kernel priorities a file device gets under this scheme: none
    /// for `none`, `ionice -c3` for `kernel-idle` (idle class for
    /// background I/O, the kernel's default for the rest), levels for the
    /// schemes that classify (and a simulated drive's priority firmware
    /// with them).
    pub fn priority_mode(self) -> PriorityMode {
        match self {
            Scheme::None => PriorityMode::Off,
            Scheme::KernelIdle => PriorityMode::Idle,
            _ => PriorityMode::Levels,
        }
    }

    /// The kernel priorities a file device gets under this scheme.
    pub fn device_priorities(self) -> Option<ClassPriorities> {
        self.priority_mode().priorities()
    }

    /// One line on how this scheme is made on `device`, for the output of
    /// every experiment (a baseline on a simulated device is an emulation,
    /// and says so).
    pub fn describe(self, device: &DeviceSpec) -> String {
        let real = is_real(device);
        let depth = match device {
            DeviceSpec::Uring(p) => critio::device::uring::kernel_queue_depth(p).map_or_else(
                || format!("{ENTRIES_DEFAULT} deep"),
                |d| format!("{d} deep, the kernel's nr_requests"),
            ),
            _ => "as deep as its workers".to_owned(),
        };
        match (self, real) {
            (Scheme::None, true) => format!(
                "none: critio's block layer a FIFO pass-through ({depth}), no I/O priority set, no classes: the kernel's I/O scheduler decides"
            ),
            (Scheme::KernelIdle, true) => format!(
                "kernel-idle: ionice -c3 on background threads (ioprio_set) and their I/O in the idle class, request I/O best-effort 4; critio's block layer a FIFO pass-through ({depth}): the kernel's I/O scheduler decides"
            ),
            (Scheme::None, false) => "none: one FIFO, no classes, drive firmware throughput-first".to_owned(),
            (Scheme::KernelIdle, false) => "kernel-idle (emulated: no kernel under a simulated drive): critio's two queues, background dispatched only when no request I/O waits, no cap; drive firmware throughput-first".to_owned(),
            (s, true) => format!("{s}: critio's classes, requests at ioprio BE 0 and background at BE 7"),
            (s, false) => format!("{s}: critio's classes, drive firmware serves critical commands first"),
        }
    }
}

/// Whether `device` is a real one (a file through io_uring or the pool).
fn is_real(device: &DeviceSpec) -> bool {
    matches!(device, DeviceSpec::Uring(_) | DeviceSpec::Pool(_))
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Scheme {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Scheme::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| {
                format!("`{s}` is not a scheme: use none, kernel-idle, static, sync-first or rcp")
            })
    }
}

/// Everything needed to open a store.
#[derive(Clone, Debug)]
pub struct StackConfig {
    /// The device.
    pub device: DeviceSpec,
    /// Size of a simulated or memory device, or of a file created for it.
    pub capacity: u64,
    /// Seed of a simulated device.
    pub seed: u64,
    /// The scheme.
    pub scheme: Scheme,
    /// critio's layers (the scheme's switches are applied on top).
    pub critio: Config,
    /// The engine.
    pub engine: EngineConfig,
    /// A change applied after the scheme's switches (the ablation runs of
    /// the experiments switch one component off this way).
    pub tweak: Option<fn(&mut Config)>,
    /// A non-volatile write cache in front of `device` (None: none).
    pub write_cache: Option<WriteCacheSpec>,
}

/// A write cache in front of the store's device.
#[derive(Clone, Debug)]
pub struct WriteCacheSpec {
    /// The cache device (a simulated SSD, or a file on fast storage). A
    /// simulated or memory device is sized by
    /// [`NvwcConfig::cache_device_bytes`]; a file must be at least that.
    pub device: DeviceSpec,
    /// The write cache: policy, size, writeback.
    pub config: NvwcConfig,
}

/// critio's defaults with a log sized for key-value writes (a record holds
/// the largest value; a batch, several).
pub fn default_critio_config() -> Config {
    let mut c = Config::default();
    c.log.record_bytes_max = 4 << 20;
    c.log.batch_bytes_max = 8 << 20;
    c.log.pending_bytes_max = 16 << 20;
    c
}

impl Default for StackConfig {
    fn default() -> Self {
        Self {
            device: DeviceSpec::Sim {
                profile: critio::device::sim::Profile::Ssd,
                file: None,
            },
            capacity: 1 << 30,
            seed: 1,
            scheme: Scheme::Rcp,
            critio: default_critio_config(),
            engine: EngineConfig::default(),
            tweak: None,
            write_cache: None,
        }
    }
}

/// An open store and the layers under it.
pub struct Stack {
    /// critio's stack: the device (the write cache, if there is one), the
    /// block layer, the page cache, the layout of the device, and the
    /// configuration in force (with the scheme applied).
    pub io: critio::Stack,
    /// The engine.
    pub engine: Arc<Engine>,
}

impl Stack {
    /// Opens the device and everything above it through
    /// [`critio::Stack`], recovering the store.
    pub fn open(cfg: &StackConfig) -> Result<Stack, EngineError> {
        let io = critio::Stack::open(&cfg.critio_config())?;
        let engine = Arc::new(Engine::open(&io, cfg.engine)?);
        Ok(Stack { io, engine })
    }
}

impl StackConfig {
    /// The critio config this store opens its stack with: the scheme's
    /// switches and the tweak applied, and the device and write cache in
    /// its `[device]` and `[nvwc]` sections.
    pub fn critio_config(&self) -> Config {
        let mut base = self.critio.clone();
        base.device = DeviceConfig {
            spec: self.device.clone(),
            capacity_bytes: self.capacity,
            seed: self.seed,
            ..self.critio.device.clone()
        };
        let mut config = self.scheme.apply(&base);
        if let Some(tweak) = self.tweak {
            tweak(&mut config);
        }
        config.nvwc = self.write_cache.as_ref().map(|wc| WriteCacheConfig {
            device: wc.device.clone(),
            cache: wc.config,
        });
        config
    }
}

#[cfg(test)]
mod tests {
    use critio::nvwc::Policy;

    use super::*;
    use crate::engine::SetOptions;

    fn behind_a_write_cache(policy: Policy) -> StackConfig {
        StackConfig {
            device: DeviceSpec::Mem,
            capacity: 64 << 20,
            engine: EngineConfig {
                log_bytes: 32 << 20,
                checkpoint_interval_ms: 0,
                ..EngineConfig::default()
            },
            write_cache: Some(WriteCacheSpec {
                device: DeviceSpec::Mem,
                config: NvwcConfig {
                    policy,
                    cache_bytes: 4 << 20,
                    ..NvwcConfig::default()
                },
            }),
            ..StackConfig::default()
        }
    }

    #[test]
    fn a_store_behind_a_write_cache_caches_what_requests_wait_for() {
        let stack = Stack::open(&behind_a_write_cache(Policy::CpPi)).unwrap();
        let wc = stack.io.write_cache().cloned().expect("a write cache");
        assert!(Arc::ptr_eq(
            stack.io.device(),
            &(wc.clone() as Arc<dyn critio::device::Device>)
        ));
        let start = wc.stats();
        std::thread::scope(|s| {
            s.spawn(|| {
                critio::context::set_foreground();
                for i in 0..20 {
                    let key = format!("k{i}");
                    stack
                        .engine
                        .set(key.as_bytes(), b"v", SetOptions::default())
                        .unwrap();
                }
            });
        });
        let served = wc.stats();
        assert!(
            served.cached_writes > start.cached_writes,
            "the log writer inherits from the committing requests: {served:?}"
        );
        // This thread is background: its checkpoint bypasses the cache.
        stack.engine.save().unwrap();
        let saved = wc.stats();
        assert!(
            saved.bypassed_writes > served.bypassed_writes,
            "a background checkpoint goes to the backing device: {saved:?}"
        );
        assert_eq!(stack.engine.get(b"k7").unwrap().as_deref(), Some(&b"v"[..]));
    }

    #[test]
    fn a_bad_write_cache_config_is_a_clear_error() {
        let mut cfg = behind_a_write_cache(Policy::All);
        if let Some(wc) = &mut cfg.write_cache {
            wc.config.cache_bytes = 0;
        }
        let err = Stack::open(&cfg).err().expect("refused").to_string();
        assert!(err.contains("nvwc"), "{err}");
    }

    fn config_on(device: &str, scheme: Scheme) -> Config {
        StackConfig {
            device: device.parse().unwrap(),
            scheme,
            ..StackConfig::default()
        }
        .critio_config()
    }

    #[test]
    fn on_a_real_file_the_baselines_are_the_kernels_own() {
        let none = config_on("file:/d/x.img", Scheme::None);
        assert_eq!(none.block.scheme, BlockScheme::None);
        assert_eq!(none.device.priorities, PriorityMode::Off);
        assert_eq!(none.device.queue_depth, 0, "as deep as the kernel's queue");
        assert!(!none.context.kernel_mirror);

        let idle = config_on("file:/d/x.img", Scheme::KernelIdle);
        assert_eq!(
            idle.block.scheme,
            BlockScheme::None,
            "critio passes through"
        );
        assert!(!idle.sync.inheritance && !idle.cache.dirty_limits);
        assert_eq!(idle.device.priorities, PriorityMode::Idle);
        assert!(
            idle.context.kernel_mirror,
            "ionice -c3 on background threads"
        );
        assert_eq!(idle.device.queue_depth, 0);
        let pool = config_on("pool:/d/x.img", Scheme::KernelIdle);
        assert_eq!(pool.block.scheme, BlockScheme::None);

        let rcp = config_on("file:/d/x.img", Scheme::Rcp);
        assert_eq!(rcp.block.scheme, BlockScheme::Rcp);
        assert_eq!(rcp.device.priorities, PriorityMode::Levels);
        assert_ne!(rcp.device.queue_depth, 0);
        assert!(!rcp.context.kernel_mirror);
        assert!(Scheme::KernelIdle
            .describe(&"file:/d/x.img".parse().unwrap())
            .contains("ionice -c3"));
    }

    #[test]
    fn on_a_simulated_drive_the_baselines_are_emulated_and_say_so() {
        let idle = config_on("sim:ssd", Scheme::KernelIdle);
        assert_eq!(idle.block.scheme, BlockScheme::Static);
        assert_eq!(idle.block.noncritical_cap, NoncriticalCap::Fixed(0));
        assert!(!idle.context.kernel_mirror);
        assert!(!idle.device.open_options().drive_priority);
        let sim = "sim:ssd".parse().unwrap();
        assert!(Scheme::KernelIdle.describe(&sim).contains("emulated"));
        for scheme in [Scheme::Static, Scheme::SyncFirst, Scheme::Rcp] {
            let c = config_on("sim:ssd", scheme);
            assert!(
                c.device.open_options().drive_priority,
                "{scheme}: the simulated drive's firmware knows the classes"
            );
        }
        assert!(
            !config_on("sim:ssd", Scheme::None)
                .device
                .open_options()
                .drive_priority
        );
    }
}
