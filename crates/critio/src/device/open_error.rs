//! [`DeviceOpenError`]: why a device could not be opened, as a type a
//! caller can match on, with a message that says what to do.
//!
//! Opening a device (by [`DeviceSpec`](super::DeviceSpec), or a backend's
//! own `open`/`new`) fails for a few kinds of reasons that call for
//! different reactions: the backend cannot work here at all (fall back to
//! another one), the file is not there (create it, or give a size), an
//! option is wrong (fix the configuration), or the operating system
//! refused something else. Each is one variant; every message starts with
//! `cannot open device NAME:` and names the path or the option at fault,
//! so printing it (`to_string`) is enough for a person.
//!
//! | variant         | e.g.                                                      |
//! |-----------------|-----------------------------------------------------------|
//! | `Unsupported`   | no io_uring, io_uring disabled, no O_DIRECT on the filesystem, a priority the kernel refuses, a path that is neither a file nor a block device |
//! | `NotFound`      | no such file and no size to create it; its directory is missing |
//! | `InvalidOption` | `entries` not a power of two, `create_size` not a multiple of the block size, a bad simulator field |
//! | `Io`            | permission denied, a read-only filesystem, the first read failed |
//! | `Resource`      | no thread or eventfd to be had                            |
//!
//! Errors of a device already open (a failed read, a write past the end)
//! are [`DeviceError`](super::DeviceError)s.

use std::io;
use std::path::{Path, PathBuf};

/// Why a device could not be opened. Every message names the device and the
/// path or option at fault, and says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceOpenError {
    /// The backend cannot work here: the kernel lacks io_uring or refuses
    /// it, the filesystem refuses O_DIRECT, the kernel refuses an I/O
    /// priority, or the path is neither a regular file nor a block device.
    /// Another backend may work (the message says which).
    #[error("cannot open device {device}: {what}")]
    Unsupported {
        /// The device, as named in errors (`uring:/path`, `pool:/path`).
        device: String,
        /// What is missing or refused, why, and what to do instead.
        what: String,
        /// The system's error, when there is one.
        #[source]
        source: Option<io::Error>,
    },
    /// The file (or block device) does not exist and was not created:
    /// no size was given to create it with, or its directory is missing.
    #[error("cannot open device {device}: no such file {}; {remedy}", path.display())]
    NotFound {
        /// The device, as named in errors.
        device: String,
        /// The path that was opened.
        path: PathBuf,
        /// What to do: give a size, or create the directory first.
        remedy: &'static str,
        /// The system's error.
        #[source]
        source: io::Error,
    },
    /// An option is out of range or inconsistent.
    #[error("cannot open device {device}: invalid {field}: {why}")]
    InvalidOption {
        /// The device, as named in errors.
        device: String,
        /// The option's name, as in the options struct or the config file
        /// (`entries`, `create_size`, `non_critical_workers`, `capacity`).
        field: &'static str,
        /// What is wrong with its value and what is allowed.
        why: String,
    },
    /// Opening, measuring, creating or first reading the file failed for
    /// another reason: permissions, a read-only filesystem, a directory
    /// given for a file, no space to create it.
    #[error("cannot open device {device}: {what}")]
    Io {
        /// The device, as named in errors.
        device: String,
        /// The file or block device.
        path: PathBuf,
        /// What failed on which path, and what to do.
        what: String,
        /// The system's error.
        #[source]
        source: io::Error,
    },
    /// The system refused a resource the device needs: a thread, an
    /// eventfd.
    #[error("cannot open device {device}: {what}: {source}")]
    Resource {
        /// The device, as named in errors.
        device: String,
        /// What could not be had (`cannot start the reaper thread`).
        what: &'static str,
        /// The system's error.
        #[source]
        source: io::Error,
    },
}

impl DeviceOpenError {
    /// The device that could not be opened, as named in errors.
    pub fn device(&self) -> &str {
        match self {
            DeviceOpenError::Unsupported { device, .. }
            | DeviceOpenError::NotFound { device, .. }
            | DeviceOpenError::InvalidOption { device, .. }
            | DeviceOpenError::Io { device, .. }
            | DeviceOpenError::Resource { device, .. } => device,
        }
    }

    /// The file or block device at fault, where the error is about one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            DeviceOpenError::NotFound { path, .. } | DeviceOpenError::Io { path, .. } => Some(path),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_device_and_the_path_or_field() {
        let e = DeviceOpenError::NotFound {
            device: "pool:/d/f".into(),
            path: "/d/f".into(),
            remedy: "create it",
            source: io::Error::from(io::ErrorKind::NotFound),
        };
        assert_eq!(
            e.to_string(),
            "cannot open device pool:/d/f: no such file /d/f; create it"
        );
        assert_eq!(e.device(), "pool:/d/f");
        assert_eq!(e.path(), Some(Path::new("/d/f")));
        let e = DeviceOpenError::InvalidOption {
            device: "uring:/d/f".into(),
            field: "entries",
            why: "100 must be a power of two".into(),
        };
        assert_eq!(
            e.to_string(),
            "cannot open device uring:/d/f: invalid entries: 100 must be a power of two"
        );
        assert_eq!(e.path(), None);
    }
}
