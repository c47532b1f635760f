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
//! | new file larger than the free space | `Io`            | bytes needed and free; a smaller size        |
//! | another open holds the image        | `Io`            | in use; close the other one first            |
//!
//! Space: a regular file's blocks are reserved when it is opened
//! ([`reserve`]): a new (or empty) file's in full, refused up front, and
//! not left behind, if its file system has less free space; an existing
//! one's holes best effort (if that fails it works as before, its blocks
//! allocated as they are first written). Without `fallocate` (some file
//! systems) a new file is sparse, and its size is not checked against the
//! free space.
//!
//! Exclusive: a regular file is locked ([`lock_image`]) from its creation
//! or opening until its last descriptor closes; a block device is opened
//! with O_EXCL. A second open of either is refused as in use.
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

    /// The error for an image another open holds ([`in_use`]).
    fn in_use(&self, source: io::Error) -> DeviceOpenError {
        self.io_error(in_use(self.path), source)
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

    /// Read-write, O_DIRECT if asked; a block device also O_EXCL, the
    /// kernel's own claim (refused while it is mounted or claimed), in
    /// place of [`lock_image`]: udev takes a shared `flock` on a whole
    /// disk for a moment after a writer closes it, which would refuse a
    /// quick reopen.
    fn options(&self, block_device: bool) -> OpenOptions {
        let mut o = OpenOptions::new();
        o.read(true).write(true);
        let mut flags = 0;
        if self.direct {
            flags |= libc::O_DIRECT;
        }
        if block_device {
            flags |= libc::O_EXCL;
        }
        o.custom_flags(flags);
        o
    }

    /// Opens (or creates) and probes the file.
    pub(crate) fn open(&self) -> Result<OpenFile, DeviceOpenError> {
        let block_device =
            std::fs::metadata(self.path).is_ok_and(|m| m.file_type().is_block_device());
        let (file, created) = match self.options(block_device).open(self.path) {
            Ok(f) => (f, false),
            Err(e) if e.kind() == io::ErrorKind::NotFound => match self.create(e)? {
                Some(f) => (f, true),
                // Another opener created it meanwhile: open theirs (and
                // meet its lock).
                None => (
                    self.options(false)
                        .open(self.path)
                        .map_err(|e| self.open_error(e))?,
                    false,
                ),
            },
            Err(e) if block_device && e.raw_os_error() == Some(libc::EBUSY) => {
                return Err(self.in_use(e))
            }
            Err(e) => return Err(self.open_error(e)),
        };
        if !created && !block_device {
            lock_image(&file).map_err(|e| self.in_use(e))?;
        }
        let len = file
            .metadata()
            .ok()
            .filter(|m| m.is_file())
            .map(|m| m.len());
        let regular_file = len.is_some();
        if !created {
            match (len, self.create_size) {
                // Empty: a creation that stopped before sizing it (or an
                // empty file given): sized as a new one.
                (Some(0), Some(size)) => {
                    self.check_create_size(size)?;
                    self.size_new(&file, size)?;
                }
                // Best effort: an existing file keeps working as it did
                // if its holes cannot be reserved (no space, no fallocate).
                (Some(len), _) if len > 0 => {
                    let _ = reserve(&file, len);
                }
                _ => {}
            }
        }
        let (capacity, block_size) = self.measure(&file)?;
        if self.direct {
            self.probe_direct(&file, capacity)?;
        }
        Ok(OpenFile {
            file,
            capacity,
            block_size,
            regular_file,
        })
    }

    fn check_create_size(&self, size: u64) -> Result<(), DeviceOpenError> {
        let block = u64::from(self.base_block_size());
        if size == 0 || size % block != 0 {
            return Err(DeviceOpenError::InvalidOption {
                device: self.device.to_owned(),
                field: "create_size",
                why: format!("{size} must be a positive multiple of the block size {block}"),
            });
        }
        Ok(())
    }

    /// Creates the file, which `open` found missing (`missing`), locked
    /// and sized; `None` if another opener created it first.
    fn create(&self, missing: io::Error) -> Result<Option<File>, DeviceOpenError> {
        let Some(size) = self.create_size else {
            return Err(self.not_found(
                "create it or pass a size (create_size) to create it",
                missing,
            ));
        };
        self.check_create_size(size)?;
        let file =
            match self.options(false).create_new(true).open(self.path) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(self.not_found(
                    "cannot create it: its directory does not exist; create the directory first",
                    e,
                )),
                Err(e) => return Err(self.open_error(e)),
            };
        // Locked before anything else: another opener from now on meets
        // the lock, and the file is removed below only while this call
        // holds it.
        lock_image(&file).map_err(|e| self.in_use(e))?;
        if let Err(e) = self.size_new(&file, size) {
            let _ = std::fs::remove_file(self.path);
            return Err(e);
        }
        Ok(Some(file))
    }

    /// Sizes a new, empty file to `size` bytes: reserved in full, and
    /// refused up front if its file system has less free space; sparse
    /// where the file system has no `fallocate` (the free space is not
    /// checked then: a sparse file takes it as it is written).
    fn size_new(&self, file: &File, size: u64) -> Result<(), DeviceOpenError> {
        let path = self.path.display();
        let block = u64::from(self.base_block_size());
        match reserve(file, block) {
            Err(e) if fallocate_unsupported(&e) => {
                return file.set_len(size).map_err(|e| {
                    self.io_error(
                        format!("cannot size {path} to {size} bytes: {e}; check free space"),
                        e,
                    )
                })
            }
            // The probe's block is the file's own now.
            _ => {}
        }
        if let Some(free) = self.free_bytes().map(|f| f + block).filter(|&f| f < size) {
            return Err(self.io_error(
                format!(
                    "not enough free space for {path}: it needs {size} bytes and its file \
                     system has {free} free; free some space or give a smaller size"
                ),
                io::Error::from_raw_os_error(libc::ENOSPC),
            ));
        }
        reserve(file, size).map_err(|e| {
            self.io_error(
                format!(
                    "cannot reserve {size} bytes for {path}: {e}; free some space or give a \
                     smaller size"
                ),
                e,
            )
        })
    }

    /// Bytes free to an unprivileged user on the file system that will
    /// hold the file; `None` when unknown.
    fn free_bytes(&self) -> Option<u64> {
        let st = rustix::fs::statvfs(self.path).ok()?;
        Some(st.f_bavail.saturating_mul(st.f_frsize))
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

/// Takes an exclusive advisory lock (`flock`) on an image for as long as
/// `file`, or a duplicate of it, stays open: a second device opened on
/// the same image (a second server started on the same data directory)
/// is refused instead of writing over the first one's store. `Err`
/// (`WouldBlock`) only when another open file holds the lock; a file
/// system without locks refuses nothing.
pub(crate) fn lock_image(file: &File) -> io::Result<()> {
    use rustix::fs::{flock, FlockOperation};
    match flock(file, FlockOperation::NonBlockingLockExclusive) {
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => Err(e.into()),
        _ => Ok(()),
    }
}

/// What [`lock_image`]'s refusal means, and what to do.
pub(crate) fn in_use(path: &Path) -> String {
    format!(
        "{} is in use: another open of it holds its lock, in this process or another (another \
         critio serve on the same data directory?); close that one first",
        path.display()
    )
}

/// Reserves the blocks of a regular file's first `len` bytes
/// (`fallocate`, mode 0): its holes become allocated extents, which the
/// file system marks unwritten, so reads of them still return zeros;
/// data already written is untouched. A write into a hole allocates
/// blocks, and on ext4 an O_DIRECT write that allocates takes the file's
/// lock exclusively: every other read and write of the file, a request's
/// included, waits for it (on this project's machine, a GET's worst case
/// in the hundreds of milliseconds while the value log's first lap was
/// written back). Into a reserved block the write takes the lock shared.
fn reserve(file: &File, len: u64) -> io::Result<()> {
    rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, len).map_err(Into::into)
}

/// Whether `fallocate` failed because the file system has none (a
/// sparse file still works there).
fn fallocate_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)
    )
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

    /// A path in the temp directory, removed on drop; the buffered spec
    /// for it (tmpfs takes no O_DIRECT, and space is what is tested).
    struct Temp(std::path::PathBuf);

    impl Temp {
        fn new(name: &str) -> Self {
            let p = std::env::temp_dir().join(format!("critio-file-{name}-{}", std::process::id()));
            let _ = std::fs::remove_file(&p);
            Temp(p)
        }

        fn spec(&self, create_size: Option<u64>) -> FileSpec<'_> {
            FileSpec {
                direct: false,
                create_size,
                ..spec(&self.0)
            }
        }

        fn allocated(&self) -> u64 {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(&self.0).unwrap().blocks() * 512
        }
    }

    impl Drop for Temp {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// Whether the temp directory's file system has `fallocate`.
    fn can_reserve() -> bool {
        let t = Temp::new("probe");
        let f = File::create(&t.0).unwrap();
        match reserve(&f, 4096) {
            Ok(()) => true,
            Err(e) if fallocate_unsupported(&e) => {
                eprintln!(
                    "skipped: no fallocate in {}",
                    std::env::temp_dir().display()
                );
                false
            }
            Err(e) => panic!("fallocate: {e}"),
        }
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_new_file_has_all_its_blocks_reserved() {
        if !can_reserve() {
            return;
        }
        let t = Temp::new("new");
        let f = t.spec(Some(4 * MIB)).open().unwrap();
        assert_eq!(f.capacity, 4 * MIB);
        assert!(f.regular_file);
        assert!(
            t.allocated() >= 4 * MIB,
            "{} bytes allocated",
            t.allocated()
        );
        let mut buf = vec![1u8; 4096];
        f.file.read_exact_at(&mut buf, 2 * MIB).unwrap();
        assert!(
            buf.iter().all(|&b| b == 0),
            "a reserved block reads as zeros"
        );
    }

    #[test]
    fn an_existing_sparse_file_has_its_holes_reserved_and_keeps_its_data() {
        if !can_reserve() {
            return;
        }
        let t = Temp::new("sparse");
        {
            let f = File::create(&t.0).unwrap();
            f.set_len(4 * MIB).unwrap();
            f.write_all_at(b"kept", 3 * MIB).unwrap();
            f.sync_all().unwrap();
        }
        assert!(t.allocated() < 4 * MIB, "sparse to start with");
        let f = t.spec(None).open().unwrap();
        assert_eq!(f.capacity, 4 * MIB);
        assert!(
            t.allocated() >= 4 * MIB,
            "{} bytes allocated",
            t.allocated()
        );
        let mut buf = [0u8; 4];
        f.file.read_exact_at(&mut buf, 3 * MIB).unwrap();
        assert_eq!(&buf, b"kept");
        assert_eq!(std::fs::metadata(&t.0).unwrap().len(), 4 * MIB, "size kept");
    }

    #[test]
    fn a_new_file_larger_than_the_free_space_is_refused_and_not_left_behind() {
        let t = Temp::new("huge");
        let dir = std::env::temp_dir();
        let st = rustix::fs::statvfs(&dir).unwrap();
        let free = st.f_bavail.saturating_mul(st.f_frsize);
        let size = (free + 64 * 1024 * MIB).next_multiple_of(4096);
        let e = t.spec(Some(size)).open().unwrap_err();
        assert!(matches!(&e, DeviceOpenError::Io { .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.contains("not enough free space"), "{text}");
        assert!(text.contains(&size.to_string()), "{text}");
        assert!(text.contains("smaller size"), "{text}");
        assert!(!t.0.exists(), "the half-made file is removed");
    }

    #[test]
    fn a_second_open_of_the_same_image_is_refused_until_the_first_closes() {
        let t = Temp::new("locked");
        let first = t.spec(Some(MIB)).open().unwrap();
        let e = t.spec(None).open().unwrap_err();
        assert!(matches!(&e, DeviceOpenError::Io { .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.contains("in use"), "{text}");
        assert!(text.contains(&t.0.display().to_string()), "{text}");
        // A duplicate of the first's descriptor (the caller-thread file)
        // shares its lock and keeps it.
        let dup = first.file.try_clone().unwrap();
        drop(first);
        assert!(t.spec(None).open().is_err(), "the duplicate still holds it");
        drop(dup);
        t.spec(None)
            .open()
            .expect("free once every descriptor is closed");
    }

    #[test]
    fn an_empty_file_is_sized_as_a_new_one() {
        if !can_reserve() {
            return;
        }
        let t = Temp::new("empty");
        File::create(&t.0).unwrap();
        let f = t.spec(Some(2 * MIB)).open().unwrap();
        assert_eq!(f.capacity, 2 * MIB);
        assert!(
            t.allocated() >= 2 * MIB,
            "{} bytes allocated",
            t.allocated()
        );
    }

    /// A block device is claimed with O_EXCL, so a second open is refused
    /// as in use. Needs a block device that may be written:
    /// `CRITIO_TEST_BLOCK_DEVICE=/dev/loopN` (`losetup -f --show FILE`).
    #[test]
    fn a_block_device_in_use_is_refused() {
        let Some(dev) = std::env::var_os("CRITIO_TEST_BLOCK_DEVICE") else {
            eprintln!("skipped: set CRITIO_TEST_BLOCK_DEVICE to a block device to test");
            return;
        };
        let path = std::path::PathBuf::from(dev);
        let s = FileSpec {
            direct: false,
            ..spec(&path)
        };
        let first = s.open().unwrap();
        assert!(!first.regular_file);
        let e = s.open().unwrap_err();
        assert!(e.to_string().contains("in use"), "{e}");
        drop(first);
        s.open().expect("free once closed");
    }
}
