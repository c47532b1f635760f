//! Where a simulated device keeps its data: sparse memory, or a file so the
//! data outlives the process.
//!
//! | store    | capacity             | after the process exits            |
//! |----------|----------------------|------------------------------------|
//! | memory   | any: chunks of 64 KiB allocated on first write, zeros elsewhere | gone |
//! | file     | the file is extended (sparse) to the capacity | kept: a new device on the path sees it |
//!
//! The store holds the *media*: what a read returns. Whether a write is
//! durable against a simulated power cut is the driver's business
//! (`device::crash`); a flush also syncs the file to the host's disk. A
//! killed process is not a power cut: the file keeps every completed write.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::device::DeviceOpenError;

/// Where a simulated device keeps its data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum StoreKind {
    /// Sparse memory, lost with the device. The default.
    #[default]
    Memory,
    /// A file, created if missing and extended to the capacity; a device
    /// opened again on the same path sees the data.
    File(PathBuf),
}

const CHUNK: usize = 64 * 1024;

/// The media of a simulated device.
#[derive(Debug)]
pub(crate) enum Store {
    Memory(HashMap<u64, Box<[u8]>>),
    File(File),
}

impl Store {
    /// Opens the store for a device of `capacity` bytes, named `device` in
    /// errors.
    pub fn open(kind: &StoreKind, capacity: u64, device: &str) -> Result<Store, DeviceOpenError> {
        match kind {
            StoreKind::Memory => Ok(Store::Memory(HashMap::new())),
            StoreKind::File(path) => open_file(path, capacity)
                .map(Store::File)
                .map_err(|source| match source.kind() {
                    io::ErrorKind::WouldBlock => DeviceOpenError::Io {
                        device: device.to_owned(),
                        path: path.clone(),
                        what: crate::device::uring::file::in_use(path),
                        source,
                    },
                    io::ErrorKind::NotFound => DeviceOpenError::NotFound {
                        device: device.to_owned(),
                        path: path.clone(),
                        remedy: "cannot create the backing file: its directory does not exist; \
                                 create the directory first",
                        source,
                    },
                    _ => DeviceOpenError::Io {
                        device: device.to_owned(),
                        path: path.clone(),
                        what: format!(
                            "cannot open the backing file {}: {source}; check the path and \
                             permissions",
                            path.display()
                        ),
                        source,
                    },
                }),
        }
    }

    /// Fills `buf` from `offset`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        match self {
            Store::Memory(chunks) => {
                for_chunks(offset, buf.len(), |key, within, at, len| {
                    let dst = &mut buf[at..at + len];
                    match chunks.get(&key) {
                        Some(c) => dst.copy_from_slice(&c[within..within + len]),
                        None => dst.fill(0),
                    }
                });
                Ok(())
            }
            Store::File(f) => f.read_exact_at(buf, offset),
        }
    }

    /// Writes `data` at `offset`.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        match self {
            Store::Memory(chunks) => {
                for_chunks(offset, data.len(), |key, within, at, len| {
                    let c = chunks
                        .entry(key)
                        .or_insert_with(|| vec![0u8; CHUNK].into_boxed_slice());
                    c[within..within + len].copy_from_slice(&data[at..at + len]);
                });
                Ok(())
            }
            Store::File(f) => f.write_all_at(data, offset),
        }
    }

    /// Makes the store's contents survive a host crash (files only).
    pub fn sync(&self) -> io::Result<()> {
        match self {
            Store::Memory(_) => Ok(()),
            Store::File(f) => f.sync_data(),
        }
    }
}

/// Calls `f(chunk key, offset within chunk, offset within the buffer, len)`
/// for each chunk that `offset..offset + len` touches.
fn for_chunks(offset: u64, len: usize, mut f: impl FnMut(u64, usize, usize, usize)) {
    let mut at = 0;
    while at < len {
        let pos = offset + at as u64;
        let within = (pos % CHUNK as u64) as usize;
        let n = (CHUNK - within).min(len - at);
        f(pos / CHUNK as u64, within, at, n);
        at += n;
    }
}

fn open_file(path: &Path, capacity: u64) -> io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    crate::device::uring::file::lock_image(&f)?;
    if f.metadata()?.len() < capacity {
        f.set_len(capacity)?;
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backing_file_in_use_is_refused() {
        let path = std::env::temp_dir().join(format!("critio-sim-lock-{}", std::process::id()));
        let kind = StoreKind::File(path.clone());
        let first = Store::open(&kind, 1 << 20, "sim").unwrap();
        let e = Store::open(&kind, 1 << 20, "sim")
            .map(drop)
            .expect_err("refused");
        assert!(e.to_string().contains("in use"), "{e}");
        drop(first);
        Store::open(&kind, 1 << 20, "sim").expect("free once closed");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn memory_is_sparse_and_spans_chunks() {
        let mut s = Store::open(&StoreKind::Memory, 1 << 40, "test").unwrap();
        let data: Vec<u8> = (0..3 * CHUNK as u32).map(|i| i as u8).collect();
        let at = (1 << 39) + CHUNK as u64 - 512;
        s.write(at, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        s.read(at, &mut back).unwrap();
        assert_eq!(back, data);
        let mut zeros = vec![1u8; 4096];
        s.read(4096, &mut zeros).unwrap();
        assert!(zeros.iter().all(|&b| b == 0));
    }
}
