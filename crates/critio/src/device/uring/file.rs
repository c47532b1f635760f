//! Opening the file or block device under a real backend (`uring`, and
//! `pool`, which shares this), with probes that turn the kernel's terse
//! errno into a cause and a remedy.
//!
//! | what goes wrong                     | what the error says                          |
//! |-------------------------------------|----------------------------------------------|
//! | file missing, no size given         | no such file PATH; create it or pass a size  |
//! | O_DIRECT refused (EINVAL) at open   | the filesystem does not support O_DIRECT     |
//! | ... or at the first aligned read    | the same                                     |
//! | permission denied                   | who cannot open what read-write              |
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

use crate::device::{AlignedBuf, DeviceError};

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
    fn error(&self, cause: String) -> DeviceError {
        DeviceError::Open {
            device: self.device.to_owned(),
            cause,
        }
    }

    /// The error for a filesystem that refuses O_DIRECT.
    pub(crate) fn no_direct(&self) -> DeviceError {
        let fs = filesystem_name(self.path).map_or("tmpfs?".to_owned(), |n| n.to_owned());
        self.error(format!(
            "the filesystem at {} ({fs}) does not support O_DIRECT; use a file on a \
             disk-backed filesystem, or {}",
            self.path.display(),
            self.no_direct_hint
        ))
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
    pub(crate) fn open(&self) -> Result<OpenFile, DeviceError> {
        let file = match self.options().open(self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => self.create()?,
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

    fn create(&self) -> Result<File, DeviceError> {
        let path = self.path.display();
        let Some(size) = self.create_size else {
            return Err(self.error(format!(
                "no such file {path}; create it or pass a size (create_size) to create it"
            )));
        };
        let block = u64::from(self.base_block_size());
        if size == 0 || size % block != 0 {
            return Err(self.error(format!(
                "create_size {size} must be a positive multiple of the block size {block}"
            )));
        }
        let file = self
            .options()
            .create_new(true)
            .open(self.path)
            .map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => self.error(format!(
                    "cannot create {path}: its directory does not exist; create the directory first"
                )),
                _ => self.open_error(e),
            })?;
        file.set_len(size).map_err(|e| {
            self.error(format!(
                "cannot size {path} to {size} bytes: {e}; check free space"
            ))
        })?;
        Ok(file)
    }

    fn open_error(&self, e: io::Error) -> DeviceError {
        let path = self.path.display();
        match e.raw_os_error() {
            Some(libc::EINVAL) if self.direct => self.no_direct(),
            Some(libc::EACCES) | Some(libc::EPERM) => self.error(format!(
                "permission denied opening {path} for reading and writing; \
                 fix its permissions or run as a user who may write it"
            )),
            Some(libc::EISDIR) => self.error(format!(
                "{path} is a directory; give a file or a block device"
            )),
            Some(libc::EROFS) => self.error(format!(
                "{path} is on a read-only filesystem; critio needs to write it"
            )),
            _ => self.error(format!("opening {path} failed: {e}")),
        }
    }

    /// Capacity and block size.
    fn measure(&self, file: &File) -> Result<(u64, u32), DeviceError> {
        let path = self.path.display();
        let meta = file
            .metadata()
            .map_err(|e| self.error(format!("cannot stat {path}: {e}")))?;
        let mut block = self.base_block_size();
        let len = if meta.file_type().is_block_device() {
            if let Ok(logical) = rustix::fs::ioctl_blksszget(file) {
                block = block.max(logical);
            }
            (&*file)
                .seek(SeekFrom::End(0))
                .map_err(|e| self.error(format!("cannot find the size of {path}: {e}")))?
        } else if meta.is_file() {
            meta.len()
        } else {
            return Err(self.error(format!(
                "{path} is neither a regular file nor a block device"
            )));
        };
        Ok((len - len % u64::from(block), block))
    }

    /// One aligned read: some filesystems accept O_DIRECT at open and refuse
    /// it at the first I/O.
    fn probe_direct(&self, file: &File, capacity: u64) -> Result<(), DeviceError> {
        if capacity == 0 {
            return Ok(());
        }
        let mut buf = AlignedBuf::zeroed(DIRECT_BLOCK_SIZE as usize);
        match file.read_at(buf.as_mut_slice(), 0) {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Err(self.no_direct()),
            Err(e) => Err(self.error(format!(
                "the first read of {} failed: {e}; check the device",
                self.path.display()
            ))),
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
        let e = spec(&path).open().unwrap_err().to_string();
        assert!(e.contains("no such file"), "{e}");
        assert!(e.contains("pass a size"), "{e}");
        let mut s = spec(&path);
        s.create_size = Some(1 << 20);
        let e = s.open().unwrap_err().to_string();
        assert!(e.contains("directory does not exist"), "{e}");
        s.create_size = Some(1000);
        let e = s.open().unwrap_err().to_string();
        assert!(e.contains("multiple of the block size 4096"), "{e}");
    }
}
