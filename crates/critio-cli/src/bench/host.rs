//! What the machine under a result is: the block device a path lives on,
//! its kernel I/O scheduler, and the kernel, so every real-device table
//! can say where it ran.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The block device holding `path` and its scheduler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disk {
    /// The device's name (`vda`), or what `path` is if not a block device.
    pub name: String,
    /// The active kernel I/O scheduler (`mq-deadline`, `none`, ...).
    pub scheduler: Option<String>,
}

/// The active entry of a `queue/scheduler` file: `none [mq-deadline] bfq`.
pub fn active_scheduler(text: &str) -> Option<String> {
    let start = text.find('[')?;
    let end = text[start..].find(']')? + start;
    Some(text[start + 1..end].to_owned())
}

/// The block device `path` lives on (the whole disk, for a partition).
pub fn disk_of(path: &Path) -> Option<Disk> {
    let dev = std::fs::metadata(path).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let sys = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    // A partition's queue is its disk's, one directory up.
    let queue = |p: &PathBuf| p.join("queue/scheduler");
    let disk = if queue(&sys).exists() {
        sys
    } else {
        sys.parent()?.to_path_buf()
    };
    let scheduler = std::fs::read_to_string(queue(&disk))
        .ok()
        .and_then(|t| active_scheduler(&t));
    Some(Disk {
        name: disk.file_name()?.to_string_lossy().into_owned(),
        scheduler,
    })
}

/// The running kernel's release.
pub fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "unknown".to_owned(), |s| s.trim().to_owned())
}

/// One line: `vda (scheduler mq-deadline), Linux 6.18.0`.
pub fn describe(path: &Path) -> String {
    let disk = disk_of(path).map_or_else(
        || "an unknown device".to_owned(),
        |d| {
            format!(
                "{} (scheduler {})",
                d.name,
                d.scheduler.as_deref().unwrap_or("unknown")
            )
        },
    );
    format!("{disk}, Linux {}", kernel())
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
    fn the_current_directory_is_on_some_device() {
        // Not every sandbox exposes /sys; when it does, the name is set.
        if let Some(d) = disk_of(Path::new(".")) {
            assert!(!d.name.is_empty());
        }
        assert!(describe(Path::new(".")).contains("Linux"));
    }
}
