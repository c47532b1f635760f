//! What the kernel says about the disk a path lives on: its name, its I/O
//! scheduler and its queue depth, read from `/sys/dev/block/MAJ:MIN`.
//!
//! A `file:` device asks for the queue depth when told to be as deep as the
//! kernel's queue (`device.queue_depth = 0`, the pass-through baselines),
//! and the experiments print the disk and scheduler under every real-device
//! table. A path on a file system with no block device behind it (tmpfs,
//! overlay) has no disk: every function says `None`.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The block device (the whole disk) holding a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disk {
    /// The disk's name (`vda`).
    pub name: String,
    /// The active kernel I/O scheduler (`mq-deadline`, `none`, ...).
    pub scheduler: Option<String>,
    /// The scheduler's queue depth (`queue/nr_requests`).
    pub nr_requests: Option<u32>,
    /// How long the scheduler idles for a queue that just emptied, waiting
    /// for its next request before serving another (`queue/iosched/
    /// slice_idle_us`; bfq has it, mq-deadline, kyber and `none` do not).
    pub slice_idle_us: Option<u64>,
}

/// The active entry of a `queue/scheduler` file: `none [mq-deadline] bfq`.
pub fn active_scheduler(text: &str) -> Option<String> {
    let start = text.find('[')?;
    let end = text[start..].find(']')? + start;
    Some(text[start + 1..end].to_owned())
}

/// The disk holding `path` (the whole disk, for a partition; the device
/// itself, for a block device node). For a path that does not exist yet,
/// the disk of its directory.
pub fn disk_of(path: &Path) -> Option<Disk> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(_) => {
            let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
            std::fs::metadata(dir.unwrap_or(Path::new("."))).ok()?
        }
    };
    let dev = if meta.file_type().is_block_device() {
        meta.rdev()
    } else {
        meta.dev()
    };
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let sys = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    // A partition's queue is its disk's, one directory up.
    let queue = |p: &PathBuf| p.join("queue");
    let disk = if queue(&sys).exists() {
        sys
    } else {
        sys.parent()?.to_path_buf()
    };
    let read = |f: &str| std::fs::read_to_string(queue(&disk).join(f)).ok();
    Some(Disk {
        name: disk.file_name()?.to_string_lossy().into_owned(),
        scheduler: read("scheduler").and_then(|t| active_scheduler(&t)),
        nr_requests: read("nr_requests").and_then(|t| t.trim().parse().ok()),
        slice_idle_us: read("iosched/slice_idle_us").and_then(|t| t.trim().parse().ok()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bracketed_scheduler_is_the_active_one() {
        assert_eq!(
            active_scheduler("none [mq-deadline] kyber bfq\n").as_deref(),
            Some("mq-deadline")
        );
        assert_eq!(active_scheduler("[none] bfq").as_deref(), Some("none"));
        assert_eq!(active_scheduler("none"), None);
    }

    #[test]
    fn a_missing_file_is_looked_up_by_its_directory() {
        // Not every sandbox exposes /sys; where it does, both agree.
        let dir = std::env::temp_dir();
        assert_eq!(disk_of(&dir.join("no-such-file-critio")), disk_of(&dir));
        if let Some(d) = disk_of(&dir) {
            assert!(!d.name.is_empty());
        }
    }
}
