//! Naming a device on a command line or in a config file, and opening it.
//!
//! | spec            | device                                                  |
//! |-----------------|---------------------------------------------------------|
//! | `mem`           | memory, completes inline                                |
//! | `sim`, `sim:ssd`| simulated SSD (8 channels), in memory                   |
//! | `sim:hdd`       | simulated 7200 rpm HDD, in memory                       |
//! | `sim:ssd:PATH`, `sim:hdd:PATH` | the same simulation over a file (data outlives the process) |
//! | `file:PATH`     | io_uring with O_DIRECT on a real file, per-request ioprio |
//! | `pool:PATH`     | pread/pwrite worker threads with per-class `ioprio_set` |

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use super::mem::MemDevice;
use super::pool::{PoolDevice, PoolOptions};
use super::sim::{Profile, SimConfig, SimDevice};
use super::uring::{UringDevice, UringOptions};
use super::{Device, DeviceOpenError};
use crate::sys::ClassPriorities;

/// A device, by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    /// `mem`.
    Mem,
    /// `sim[:ssd|:hdd][:PATH]`.
    Sim {
        /// The drive profile.
        profile: Profile,
        /// A file to keep the data in, else memory.
        file: Option<PathBuf>,
    },
    /// `file:PATH`: io_uring with O_DIRECT.
    Uring(PathBuf),
    /// `pool:PATH`: pread/pwrite workers.
    Pool(PathBuf),
}

/// How to open a device.
#[derive(Clone, Copy, Debug)]
pub struct OpenOptions {
    /// Size of a memory or simulated device, and of a file created because
    /// it did not exist.
    pub capacity: u64,
    /// Seed of a simulated device.
    pub seed: u64,
    /// Kernel priorities of each class for `file:` and `pool:` devices
    /// (`None`: no per-request priority).
    pub priorities: Option<ClassPriorities>,
    /// A simulated drive's firmware serves critical commands first.
    pub drive_priority: bool,
    /// Commands in flight at a `file:` device: a power of two, or 0 for
    /// the kernel's queue depth of the file's disk
    /// ([`super::uring::kernel_queue_depth`]).
    pub queue_depth: u32,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            capacity: 1 << 30,
            seed: 0,
            priorities: Some(ClassPriorities::LEVELS),
            drive_priority: true,
            queue_depth: super::uring::ENTRIES_DEFAULT,
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let path = |p: &str| {
            if p.is_empty() {
                Err(format!("`{s}`: give a path after the colon"))
            } else {
                Ok(PathBuf::from(p))
            }
        };
        let sim = |profile, rest: Option<&str>| {
            Ok(DeviceSpec::Sim {
                profile,
                file: rest.map(path).transpose()?,
            })
        };
        match s.split_once(':') {
            None if s == "mem" => Ok(DeviceSpec::Mem),
            None if s == "sim" => sim(Profile::Ssd, None),
            Some(("file", p)) => Ok(DeviceSpec::Uring(path(p)?)),
            Some(("pool", p)) => Ok(DeviceSpec::Pool(path(p)?)),
            Some(("sim", rest)) => {
                let (profile, file) = rest
                    .split_once(':')
                    .map_or((rest, None), |(a, b)| (a, Some(b)));
                match profile {
                    "ssd" => sim(Profile::Ssd, file),
                    "hdd" => sim(Profile::Hdd, file),
                    _ => Err(format!("`{s}`: the simulated profile is `ssd` or `hdd`")),
                }
            }
            _ => Err(format!(
                "`{s}` is not a device: use mem, sim, sim:ssd, sim:hdd, sim:ssd:PATH, \
                 sim:hdd:PATH, file:PATH (io_uring) or pool:PATH"
            )),
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Mem => f.write_str("mem"),
            DeviceSpec::Sim { profile, file } => {
                let p = match profile {
                    Profile::Ssd => "ssd",
                    Profile::Hdd => "hdd",
                };
                match file {
                    Some(path) => write!(f, "sim:{p}:{}", path.display()),
                    None => write!(f, "sim:{p}"),
                }
            }
            DeviceSpec::Uring(p) => write!(f, "file:{}", p.display()),
            DeviceSpec::Pool(p) => write!(f, "pool:{}", p.display()),
        }
    }
}

impl DeviceSpec {
    /// Opens the device. The error says why it cannot be opened and what
    /// to do, and its variant what kind of failure it is (see
    /// [`DeviceOpenError`]).
    pub fn open(&self, opts: OpenOptions) -> Result<Arc<dyn Device>, DeviceOpenError> {
        Ok(match self {
            DeviceSpec::Mem => Arc::new(MemDevice::new(opts.capacity)),
            DeviceSpec::Sim { profile, file } => {
                let base = match profile {
                    Profile::Ssd => SimConfig::ssd(opts.capacity, opts.seed),
                    Profile::Hdd => SimConfig::hdd(opts.capacity, opts.seed),
                };
                let mut cfg = match file {
                    Some(p) => base.with_file(p),
                    None => base,
                };
                cfg.priority_aware = opts.drive_priority;
                Arc::new(SimDevice::new(cfg)?)
            }
            DeviceSpec::Uring(p) => Arc::new(UringDevice::open(
                p,
                UringOptions {
                    create_size: Some(opts.capacity),
                    entries: match opts.queue_depth {
                        0 => super::uring::kernel_queue_depth(p)
                            .unwrap_or(super::uring::ENTRIES_DEFAULT),
                        n => n,
                    },
                    per_request_ioprio: opts.priorities.is_some(),
                    priorities: opts.priorities.unwrap_or_default(),
                },
            )?),
            DeviceSpec::Pool(p) => Arc::new(PoolDevice::open(
                p,
                PoolOptions {
                    create_size: Some(opts.capacity),
                    set_worker_ioprio: opts.priorities.is_some(),
                    priorities: opts.priorities.unwrap_or_default(),
                    ..PoolOptions::default()
                },
            )?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_print_back() {
        for s in [
            "mem",
            "sim:ssd",
            "sim:hdd",
            "sim:hdd:/tmp/x.img",
            "file:/d/f",
            "pool:/d/f",
        ] {
            let spec: DeviceSpec = s.parse().unwrap();
            assert_eq!(spec.to_string(), s);
        }
        assert_eq!("sim".parse::<DeviceSpec>().unwrap().to_string(), "sim:ssd");
        let e = "disk".parse::<DeviceSpec>().unwrap_err();
        assert!(e.contains("file:PATH"), "{e}");
        assert!("file:".parse::<DeviceSpec>().unwrap_err().contains("path"));
        assert!("sim:tape"
            .parse::<DeviceSpec>()
            .unwrap_err()
            .contains("ssd"));
    }

    #[test]
    fn mem_and_sim_open() {
        let opts = OpenOptions {
            capacity: 1 << 20,
            ..OpenOptions::default()
        };
        assert_eq!(DeviceSpec::Mem.open(opts).unwrap().info().capacity, 1 << 20);
        let sim: DeviceSpec = "sim".parse().unwrap();
        assert_eq!(sim.open(opts).unwrap().info().capacity, 1 << 20);
        let missing = DeviceSpec::Uring("/nonexistent-dir/x".into()).open(opts);
        let e = missing
            .err()
            .expect("cannot open under a missing directory")
            .to_string();
        assert!(e.contains("/nonexistent-dir"), "{e}");
    }

    #[test]
    fn a_file_device_is_as_deep_as_the_kernels_queue_when_asked() {
        let dir = std::env::temp_dir().join(format!("critio-depth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("dev.img");
        let spec = DeviceSpec::Uring(path.clone());
        for (asked, want) in [
            (64, Some(64)),
            (0, super::super::uring::kernel_queue_depth(&dir)),
        ] {
            let opts = OpenOptions {
                capacity: 1 << 20,
                queue_depth: asked,
                ..OpenOptions::default()
            };
            match spec.open(opts) {
                Ok(dev) => assert_eq!(
                    dev.info().queue_depth,
                    want.unwrap_or(super::super::uring::ENTRIES_DEFAULT),
                    "queue_depth {asked} on {}",
                    dir.display()
                ),
                // No io_uring or O_DIRECT here: nothing to check.
                Err(DeviceOpenError::Unsupported { .. }) => {}
                Err(e) => panic!("{e}"),
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn open_errors_are_typed_and_name_the_path_or_the_field() {
        let opts = OpenOptions {
            capacity: 1 << 20,
            ..OpenOptions::default()
        };
        let path = PathBuf::from("/nonexistent-dir/critio/x.img");
        let file = DeviceSpec::Uring(path.clone());
        let pool = DeviceSpec::Pool(path.clone());
        for spec in [&file, &pool] {
            let e = spec.open(opts).err().expect("no directory to create it in");
            assert!(
                matches!(&e, DeviceOpenError::NotFound { path: p, .. } if *p == path),
                "{spec}: {e:?}"
            );
            assert_eq!(e.path(), Some(path.as_path()));
            let text = e.to_string();
            assert!(
                text.contains("no such file /nonexistent-dir/critio/x.img"),
                "{text}"
            );
            assert!(text.contains("create the directory first"), "{text}");
        }
        let bad = OpenOptions {
            capacity: 1000,
            ..opts
        };
        for (spec, field) in [
            (&file, "create_size"),
            (&pool, "create_size"),
            (
                &DeviceSpec::Sim {
                    profile: Profile::Ssd,
                    file: None,
                },
                "capacity",
            ),
        ] {
            let e = spec
                .open(bad)
                .err()
                .expect("1000 bytes is not a block multiple");
            assert!(
                matches!(&e, DeviceOpenError::InvalidOption { field: f, .. } if *f == field),
                "{spec}: {e:?}"
            );
            let text = e.to_string();
            assert!(text.contains(&format!("invalid {field}: 1000")), "{text}");
        }
    }
}
