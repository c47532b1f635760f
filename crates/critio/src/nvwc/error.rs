//! [`NvwcError`]: why the write cache refused or failed, and what to do.
//!
//! The write cache is a [`Device`](crate::device::Device), so its commands
//! fail with [`DeviceError`]: errors of its own travel as
//! `DeviceError::Io` whose source is an [`NvwcError`] (find it with
//! [`NvwcError::find`]), and opening fails with `DeviceError::Open` whose
//! cause is the message of one.

use std::io;

use crate::device::{DeviceError, Op};
use crate::error::ConfigError;

/// Why the write cache refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NvwcError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The devices do not fit the configuration.
    #[error("nvwc: {what}; {fix}")]
    Geometry {
        /// What does not fit.
        what: String,
        /// What to do.
        fix: String,
    },
    /// The cache device's header is neither blank nor a write-cache header.
    #[error(
        "nvwc: the header slot at offset {offset} of cache device {device} is not a write-cache \
         header ({reason}); check that this is the cache device, or zero its first 8 KiB to \
         format it"
    )]
    NotACache {
        /// The cache device.
        device: String,
        /// The header slot's offset.
        offset: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// Reading or writing the cache device failed while opening.
    #[error("nvwc: {what} failed while opening the write cache; check the device and open again")]
    Open {
        /// What was being done.
        what: String,
        /// The device's error.
        #[source]
        source: DeviceError,
    },
    /// A metadata write or a cache flush failed earlier: which completed
    /// writes are durable is unknown, so the cache accepts no more writes.
    #[error(
        "nvwc: poisoned: {what} failed, so the cache's durable state is unknown and writes and \
         flushes are refused; drop the write cache and open it again to recover"
    )]
    Poisoned {
        /// What failed.
        what: String,
    },
    /// A cache slot does not hold the data its map record describes.
    #[error(
        "nvwc: cache slot {slot} (backing block {block}) does not hold the data its record \
         describes; the cache device lost or corrupted it, so it was not written back"
    )]
    Corrupt {
        /// The slot.
        slot: u32,
        /// The backing block it should hold.
        block: u64,
    },
    /// The write cache was dropped while the write waited for a slot.
    #[error("nvwc: closed while the write waited for a free cache slot; nothing was written")]
    Closed,
    /// A command larger than the write cache takes.
    #[error("nvwc: a {len}-byte command exceeds the {max}-byte limit; split it")]
    TooLarge {
        /// The command's length.
        len: u64,
        /// The limit.
        max: u64,
    },
}

impl NvwcError {
    /// As the error of a command `op` at `offset` on device `device`.
    pub(crate) fn into_device(self, device: &str, op: Op, offset: u64) -> DeviceError {
        DeviceError::Io {
            device: device.to_owned(),
            op,
            offset,
            source: io::Error::other(self),
        }
    }

    /// As the error of opening the write cache `device`.
    pub(crate) fn into_open(self, device: &str) -> DeviceError {
        DeviceError::Open {
            device: device.to_owned(),
            cause: self.to_string(),
        }
    }

    /// The write cache's own error inside a command's error, if it is one.
    pub fn find(e: &DeviceError) -> Option<&NvwcError> {
        match e {
            DeviceError::Io { source, .. } => source.get_ref()?.downcast_ref::<NvwcError>(),
            _ => None,
        }
    }
}

/// A copy of `e` for a second waiter (device errors are not `Clone`: an OS
/// error keeps its kind and message).
pub(crate) fn dup(e: &DeviceError) -> DeviceError {
    match e {
        DeviceError::Unaligned {
            device,
            what,
            value,
            block_size,
        } => DeviceError::Unaligned {
            device: device.clone(),
            what,
            value: *value,
            block_size: *block_size,
        },
        DeviceError::PoweredOff { device } => DeviceError::PoweredOff {
            device: device.clone(),
        },
        DeviceError::Injected { device, op, offset } => DeviceError::Injected {
            device: device.clone(),
            op: *op,
            offset: *offset,
        },
        DeviceError::Io {
            device,
            op,
            offset,
            source,
        } => DeviceError::Io {
            device: device.clone(),
            op: *op,
            offset: *offset,
            source: io::Error::new(source.kind(), source.to_string()),
        },
        other => DeviceError::Open {
            device: String::new(),
            cause: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_errors_are_found_inside_device_errors() {
        let e = NvwcError::Poisoned {
            what: "a metadata write".into(),
        }
        .into_device("nvwc", Op::Write, 4096);
        assert!(matches!(
            NvwcError::find(&e),
            Some(NvwcError::Poisoned { .. })
        ));
        assert!(e.to_string().contains("poisoned"), "{e}");
        let d = dup(&e);
        assert!(d.to_string().contains("open it again"), "{d}");
        let p = dup(&DeviceError::PoweredOff { device: "x".into() });
        assert!(matches!(p, DeviceError::PoweredOff { .. }));
    }
}
