//! Opening the file or block device under a real backend (`uring`, and
//! `pool`, which shares this), with probes that turn the kernel's terse
//! errno into a typed [`DeviceOpenError`] with a cause and a remedy.
//!
//! | what goes wrong                     | error           | what it says                                 |
//! |-------------------------------------|-----------------|----------------------------------------------|
//! | file missing, no size given         | `NotFound`      | no such file PATH; create it or pass a size  |
//! | its directory missing               | `NotFound`      | create the directory first                   |
//! | `create_size` not a block multiple  | `InvalidOption` | `create_size` and the block size             |
//! | O_DIRECT refused (EINVAL) at open   | `Unsupported`   | the filesystem does not support O_DIRECT     |
//! | ... or at the first aligned read    | `Unsupported`   | the same                                     |
//! | neither a file nor a block device   | `Unsupported`   | the same, with the path                      |
//! | permission denied, read-only, ...   | `Io`            | who cannot open what read-write              |
//!
//! Block size: 4096 with O_DIRECT, which every common filesystem and disk
//! accepts (the logical block size is 512 or 4096; a block device reporting
//! more via `BLKSSZGET` gets its own). 512 without O_DIRECT, where the page
//! cache takes any alignment and 512 is the smallest block anyone uses.
//! Capacity: the file's length (a block device's size, by seeking to its
//! end), rounded down to the block size.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;

use crate::device::{AlignedBuf, DeviceOpenError};

/// Block size with O_DIRECT (see the module docs).
pub const DIRECT_BLOCK_SIZE: u32 = 4096;
/// Block size through the page cache.
pub const BUFFERED_BLOCK_SIZE: u32 = 512;

const _: () = assert!(DIRECT_BLOCK_SIZE as usize <= crate::device::BUF_ALIGN);
const _: () = assert!(DIRECT_BLOCK_SIZE % BUFFERED_BLOCK_SIZE == 0);

/// How to open a backend's file.
pub(crate) struct FileSpec<'a> {
    /// The file or block device.
    pub path: &'a Path,
    /// The device's name, for errors.
    pub device: &'a str,
    /// Open with O_DIRECT.
    pub direct: bool,
    /// Create the file with this many bytes if it does not exist.
    pub create_size: Option<u64>,
    /// What to suggest when O_DIRECT is refused ("the pool backend").
    pub no_direct_hint: &'a str,
}

/// An open, probed file.
#[derive(Debug)]
pub(crate) struct OpenFile {
    pub file: File,
    pub capacity: u64,
    pub block_size: u32,
    /// A regular file (not a block device): its blocks may be allocated
    /// on their first write.
    pub regular_file: bool,
}

impl FileSpec<'_> {
    /// A [`DeviceOpenError::Io`] on this file: `what` says what failed on
    /// which path, and what to do.
    fn io_error(&self, what: String, source: io::Error) -> DeviceOpenError {
        DeviceOpenError::Io {
            device: self.device.to_owned(),
            path: self.path.to_owned(),
            what,
            source,
        }
    }

    fn not_found(&self, remedy: &'static str, source: io::Error) -> DeviceOpenError {
        DeviceOpenError::NotFound {
            device: self.device.to_owned(),
            path: self.path.to_owned(),
            remedy,
            source,
        }
    }

    /// The error for a filesystem that refuses O_DIRECT.
    pub(crate) fn no_direct(&self, source: io::Error) -> DeviceOpenError {
        let fs = filesystem_name(self.path).map_or("tmpfs?".to_owned(), |n| n.to_owned());
        DeviceOpenError::Unsupported {
            device: self.device.to_owned(),
            what: format!(
                "the filesystem at {} ({fs}) does not support O_DIRECT; use a file on a \
                 disk-backed filesystem, or {}",
                self.path.display(),
                self.no_direct_hint
            ),
            source: Some(source),
        }
    }

    fn base_block_size(&self) -> u32 {
        if self.direct {
            DIRECT_BLOCK_SIZE
        } else {
            BUFFERED_BLOCK_SIZE
        }
    }

    fn options(&self) -> OpenOptions {
        let mut o = OpenOptions::new();
        o.read(true).write(true);
        if self.direct {
            o.custom_flags(libc::O_DIRECT);
        }
        o
    }

    /// Opens (or creates) and probes the file.
    pub(crate) fn open(&self) -> Result<OpenFile, DeviceOpenError> {
        let file = match self.options().open(self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => self.create(e)?,
            Err(e) => return Err(self.open_error(e)),
        };
        let (capacity, block_size) = self.measure(&file)?;
        if self.direct {
            self.probe_direct(&file, capacity)?;
        }
        let regular_file = file.metadata().is_ok_and(|m| m.is_file());
        Ok(OpenFile {
            file,
            capacity,
            block_size,
            regular_file,
        })
    }

    /// Creates the file, which `open` found missing (`missing`).
    fn create(&self, missing: io::Error) -> Result<File, DeviceOpenError> {
        let path = self.path.display();
        let Some(size) = self.create_size else {
            return Err(self.not_found(
                "create it or pass a size (create_size) to create it",
                missing,
            ));
        };
        let block = u64::from(self.base_block_size());
        if size == 0 || size % block != 0 {
            return Err(DeviceOpenError::InvalidOption {
                device: self.device.to_owned(),
                field: "create_size",
                why: format!("{size} must be a positive multiple of the block size {block}"),
            });
        }
        let file = self
            .options()
            .create_new(true)
            .open(self.path)
            .map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => self.not_found(
                    "cannot create it: its directory does not exist; create the directory first",
                    e,
                ),
                _ => self.open_error(e),
            })?;
        file.set_len(size).map_err(|e| {
            self.io_error(
                format!("cannot size {path} to {size} bytes: {e}; check free space"),
                e,
            )
        })?;
        Ok(file)
    }

    fn open_error(&self, e: io::Error) -> DeviceOpenError {
        let path = self.path.display();
        let what = match e.raw_os_error() {
            Some(libc::EINVAL) if self.direct => return self.no_direct(e),
            Some(libc::EACCES) | Some(libc::EPERM) => format!(
                "permission denied opening {path} for reading and writing; \
                 fix its permissions or run as a user who may write it"
            ),
            Some(libc::EISDIR) => format!("{path} is a directory; give a file or a block device"),
            Some(libc::EROFS) => {
                format!("{path} is on a read-only filesystem; critio needs to write it")
            }
            _ => format!("opening {path} failed: {e}"),
        };
        self.io_error(what, e)
    }

    /// Capacity and block size.
    fn measure(&self, file: &File) -> Result<(u64, u32), DeviceOpenError> {
        let path = self.path.display();
        let meta = file
            .metadata()
            .map_err(|e| self.io_error(format!("cannot stat {path}: {e}"), e))?;
        let mut block = self.base_block_size();
        let len = if meta.file_type().is_block_device() {
            if let Ok(logical) = rustix::fs::ioctl_blksszget(file) {
                block = block.max(logical);
            }
            (&*file)
                .seek(SeekFrom::End(0))
                .map_err(|e| self.io_error(format!("cannot find the size of {path}: {e}"), e))?
        } else if meta.is_file() {
            meta.len()
        } else {
            return Err(DeviceOpenError::Unsupported {
                device: self.device.to_owned(),
                what: format!("{path} is neither a regular file nor a block device"),
                source: None,
            });
        };
        Ok((len - len % u64::from(block), block))
    }

    /// One aligned read: some filesystems accept O_DIRECT at open and refuse
    /// it at the first I/O.
    fn probe_direct(&self, file: &File, capacity: u64) -> Result<(), DeviceOpenError> {
        if capacity == 0 {
            return Ok(());
        }
        let mut buf = AlignedBuf::zeroed(DIRECT_BLOCK_SIZE as usize);
        match file.read_at(buf.as_mut_slice(), 0) {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Err(self.no_direct(e)),
            Err(e) => Err(self.io_error(
                format!(
                    "the first read of {} failed: {e}; check the device",
                    self.path.display()
                ),
                e,
            )),
        }
    }
}

/// The name of the filesystem holding `path` (or its directory), for
/// errors; `None` when unknown.
fn filesystem_name(path: &Path) -> Option<&'static str> {
    let st = rustix::fs::statfs(path)
        .ok()
        .or_else(|| rustix::fs::statfs(path.parent()?).ok())?;
    // Magic numbers from <linux/magic.h>.
    let names: [(u64, &str); 8] = [
        (0x0102_1994, "tmpfs"),
        (0xef53, "ext4"),
        (0x5846_5342, "xfs"),
        (0x9123_683e, "btrfs"),
        (0x794c_7630, "overlayfs"),
        (0x6573_5546, "fuse"),
        (0x6969, "nfs"),
        (0x8584_58f6, "ramfs"),
    ];
    let ty = st.f_type as u64;
    names.iter().find(|(m, _)| *m == ty).map(|(_, n)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(path: &Path) -> FileSpec<'_> {
        FileSpec {
            path,
            device: "test",
            direct: true,
            create_size: None,
            no_direct_hint: "the pool backend",
        }
    }

    #[test]
    fn einval_at_open_reads_as_no_direct() {
        let path = Path::new("/dev/shm/critio-no-such-file");
        let e = spec(path).open_error(io::Error::from_raw_os_error(libc::EINVAL));
        assert!(
            matches!(
                e,
                DeviceOpenError::Unsupported {
                    source: Some(_),
                    ..
                }
            ),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(text.contains("does not support O_DIRECT"), "{text}");
        assert!(text.contains("/dev/shm/critio-no-such-file"), "{text}");
        assert!(text.contains("the pool backend"), "{text}");
        if Path::new("/dev/shm").exists() {
            assert!(text.contains("tmpfs"), "{text}");
        }
    }

    #[test]
    fn a_missing_file_says_what_to_do() {
        let path = std::env::temp_dir().join("critio-surely-missing/x");
        let e = spec(&path).open().unwrap_err();
        assert!(matches!(&e, DeviceOpenError::NotFound { path: p, .. } if *p == path));
        let e = e.to_string();
        assert!(e.contains("no such file"), "{e}");
        assert!(e.contains("pass a size"), "{e}");
        let mut s = spec(&path);
        s.create_size = Some(1 << 20);
        let e = s.open().unwrap_err();
        assert!(matches!(&e, DeviceOpenError::NotFound { path: p, .. } if *p == path));
        let e = e.to_string();
        assert!(e.contains("directory does not exist"), "{e}");
        s.create_size = Some(1000);
        let e = s.open().unwrap_err();
        assert!(matches!(
            e,
            DeviceOpenError::InvalidOption {
                field: "create_size",
                ..
            }
        ));
        let e = e.to_string();
        assert!(e.contains("multiple of the block size 4096"), "{e}");
    }
}
