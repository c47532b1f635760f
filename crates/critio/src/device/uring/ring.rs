//! Setting up the ring, with probes that say why io_uring cannot be used
//! here and what to do about it. Every failure is a
//! [`DeviceOpenError::Unsupported`]: the pool backend works without io_uring,
//! and each message says so.
//!
//! | probe                         | failure                 | the error says                      |
//! |-------------------------------|-------------------------|-------------------------------------|
//! | `io_uring_setup`              | ENOSYS                  | kernel without io_uring             |
//! |                               | EPERM                   | `kernel.io_uring_disabled` = N, or a |
//! |                               |                         | seccomp filter; how to enable it    |
//! |                               | ENOMEM                  | locked-memory limit (`ulimit -l`)    |
//! | `IORING_REGISTER_PROBE`       | READ/WRITE/FSYNC absent | kernel older than 5.6               |
//! | `IORING_REGISTER_EVENTFD`     | any                     | the errno                           |

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use io_uring::{opcode, IoUring, Probe};

use crate::device::DeviceOpenError;

/// Where the kernel says whether io_uring may be used (Linux 6.6+).
pub(super) const IO_URING_DISABLED: &str = "/proc/sys/kernel/io_uring_disabled";

/// What every error suggests instead.
const INSTEAD: &str = "or use the pool backend";

/// A ring of `entries` SQEs (and twice as many CQEs) that signals
/// `eventfd` on every completion, for the device named `device`.
pub(super) fn build(
    device: &str,
    entries: u32,
    eventfd: &OwnedFd,
) -> Result<IoUring, DeviceOpenError> {
    let unsupported = |what: String, source: Option<io::Error>| DeviceOpenError::Unsupported {
        device: device.to_owned(),
        what,
        source,
    };
    let ring = IoUring::new(entries).map_err(|e| unsupported(setup_error(&e, entries), Some(e)))?;
    check_opcodes(&ring).map_err(|(what, e)| unsupported(what, e))?;
    ring.submitter()
        .register_eventfd(eventfd.as_raw_fd())
        .map_err(|e| {
            unsupported(
                format!("cannot register an eventfd with the io_uring: {e}; {INSTEAD}"),
                Some(e),
            )
        })?;
    Ok(ring)
}

/// Whether the ring supports every operation critio issues; `Err` is the
/// cause in plain words and the system's error, if any.
fn check_opcodes(ring: &IoUring) -> Result<(), (String, Option<io::Error>)> {
    let old = "this kernel's io_uring lacks";
    let remedy = format!("critio needs Linux 5.6 or later; {INSTEAD}");
    let mut probe = Probe::new();
    ring.submitter().register_probe(&mut probe).map_err(|e| {
        (
            format!("{old} IORING_REGISTER_PROBE ({e}); {remedy}"),
            Some(e),
        )
    })?;
    for (name, code) in [
        ("READ", opcode::Read::CODE),
        ("WRITE", opcode::Write::CODE),
        ("FSYNC", opcode::Fsync::CODE),
    ] {
        if !probe.is_supported(code) {
            return Err((format!("{old} the {name} operation; {remedy}"), None));
        }
    }
    Ok(())
}

/// Why `io_uring_setup` failed.
fn setup_error(e: &io::Error, entries: u32) -> String {
    match e.raw_os_error() {
        Some(libc::ENOSYS) => format!(
            "io_uring is not available: this kernel has no io_uring (io_uring_setup: ENOSYS); \
             critio needs Linux 5.6 or later built with CONFIG_IO_URING, {INSTEAD}"
        ),
        Some(libc::EPERM) => {
            disabled_cause(std::fs::read_to_string(IO_URING_DISABLED).ok().as_deref())
        }
        Some(libc::ENOMEM) => format!(
            "io_uring_setup ran out of memory for {entries} entries (ENOMEM): on kernels \
             before 5.12 rings count against the locked-memory limit; raise `ulimit -l`, \
             use fewer entries, {INSTEAD}"
        ),
        _ => format!("io_uring_setup with {entries} entries failed: {e}; {INSTEAD}"),
    }
}

/// Why `io_uring_setup` said EPERM, given the contents of
/// [`IO_URING_DISABLED`] (`None`: the file is absent, before Linux 6.6).
pub(super) fn disabled_cause(io_uring_disabled: Option<&str>) -> String {
    let enable = format!("set it to 0 (`sysctl kernel.io_uring_disabled=0`), {INSTEAD}");
    match io_uring_disabled.map(str::trim) {
        Some("2") => format!(
            "io_uring is disabled: {IO_URING_DISABLED} is 2 (nobody may use io_uring); {enable}"
        ),
        Some("1") => format!(
            "io_uring is disabled for this user: {IO_URING_DISABLED} is 1 (only root and \
             members of kernel.io_uring_group may use io_uring); add the user to that group, \
             {enable}"
        ),
        Some(v) => format!(
            "io_uring_setup was refused (EPERM) although {IO_URING_DISABLED} is {v}: a \
             seccomp filter (a container runtime's default profile) probably blocks it; allow \
             io_uring_setup, io_uring_enter and io_uring_register, {INSTEAD}"
        ),
        None => format!(
            "io_uring_setup was refused (EPERM) and {IO_URING_DISABLED} does not exist: a \
             seccomp filter (a container runtime's default profile) probably blocks it; allow \
             io_uring_setup, io_uring_enter and io_uring_register, {INSTEAD}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eperm_names_the_sysctl_and_its_value() {
        let c = disabled_cause(Some("2\n"));
        assert!(c.contains("/proc/sys/kernel/io_uring_disabled is 2"), "{c}");
        assert!(c.contains("sysctl kernel.io_uring_disabled=0"), "{c}");
        let c = disabled_cause(Some("1"));
        assert!(c.contains("is 1") && c.contains("io_uring_group"), "{c}");
        let c = disabled_cause(Some("0"));
        assert!(c.contains("seccomp"), "{c}");
        assert!(disabled_cause(None).contains("does not exist"));
    }

    #[test]
    fn enosys_says_the_kernel_lacks_io_uring() {
        let c = setup_error(&io::Error::from_raw_os_error(libc::ENOSYS), 128);
        assert!(c.contains("this kernel has no io_uring"), "{c}");
        assert!(c.contains("pool backend"), "{c}");
    }
}
