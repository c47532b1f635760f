//! What the machine under a result is: the block device a path lives on,
//! its kernel I/O scheduler, and the kernel, so every real-device table
//! can say where it ran (the disk itself is read by `critio::sys::disk_of`).

use std::path::Path;

pub use critio::sys::disk_of;

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
            // bfq's idling decides how long a request can wait behind
            // another queue (see `critio serve`'s note on it).
            let idle = d
                .slice_idle_us
                .map_or_else(String::new, |us| format!(", slice_idle {us} us"));
            format!(
                "{} (scheduler {}{idle})",
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
    fn the_current_directory_is_on_some_device() {
        // Not every sandbox exposes /sys; when it does, the name is set.
        if let Some(d) = disk_of(Path::new(".")) {
            assert!(!d.name.is_empty());
        }
        assert!(describe(Path::new(".")).contains("Linux"));
    }
}
