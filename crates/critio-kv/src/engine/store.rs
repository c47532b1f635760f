//! Buckets as the engine changes them: load a chain through the cache,
//! change its entries in memory, store it to fresh pages (copy-on-write).
//!
//! A write loads its buckets *before* logging (the only reads), so applying
//! after the log record is written only writes to the cache and cannot fail
//! on I/O: the logged change and the applied change never diverge.

use std::sync::atomic::Ordering;

use super::bucket::{self, Data, Slot, INLINE_MAX};
use super::entry::{Entry, Value};
use super::wal::Op;
use super::{EngineError, Inner};

/// Pages kept free for applying already-logged writes.
const SPARE_PAGES: u64 = 64;

/// One bucket, loaded.
pub(crate) struct Bucket {
    pub(crate) index: usize,
    pages: Vec<u64>,
    pub(crate) slots: Vec<Slot>,
    changed: bool,
    freed: Vec<(u64, u32)>,
}

impl Bucket {
    fn find(&self, key: &[u8]) -> Option<usize> {
        self.slots.iter().position(|s| s.key == key)
    }
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Inner {
    pub(crate) fn bucket_of(&self, key: &[u8]) -> usize {
        (u64::from(crc32c::crc32c(key)) % u64::from(self.cfg.buckets)) as usize
    }

    pub(crate) fn stripe_of(bucket: usize) -> usize {
        bucket % super::STRIPES
    }

    fn page_bytes(&self) -> usize {
        self.layout.page as usize
    }

    fn blob_pages(&self, len: usize) -> u32 {
        len.div_ceil(self.page_bytes()).max(1) as u32
    }

    /// Reads a bucket's chain (the caller holds its stripe lock).
    pub(crate) fn load_bucket(&self, index: usize) -> Result<Bucket, EngineError> {
        let head = self.directory[index].load(Ordering::Acquire);
        let (pages, slots) = self.read_chain(head)?;
        Ok(Bucket {
            index,
            pages,
            slots,
            changed: false,
            freed: Vec::new(),
        })
    }

    /// Reads the chain starting at page `head`: (its pages, its entries).
    pub(crate) fn read_chain(&self, head: u64) -> Result<(Vec<u64>, Vec<Slot>), EngineError> {
        let (mut pages, mut slots) = (Vec::new(), Vec::new());
        let mut next = head;
        let mut buf = vec![0u8; self.page_bytes()];
        while next != 0 {
            assert!(pages.len() < 1 << 16, "bucket chain loops");
            self.cache
                .read(self.data, next * self.layout.page, &mut buf)?;
            let (n, s) = bucket::decode_page(&buf)
                .map_err(|e| EngineError::Corrupt(format!("page {next}: {}", e.0)))?;
            pages.push(next);
            slots.extend(s);
            next = n;
        }
        Ok((pages, slots))
    }

    /// The stored bytes of a slot's value (reading its blob if it has one).
    pub(crate) fn value_bytes(&self, s: &Slot) -> Result<Vec<u8>, EngineError> {
        Ok(match &s.data {
            Data::Inline(v) => v.clone(),
            Data::Blob { page, len, crc } => {
                let mut v = vec![0u8; *len as usize];
                self.cache
                    .read(self.data, page * self.layout.page, &mut v)?;
                if crc32c::crc32c(&v) != *crc {
                    return Err(EngineError::Corrupt(format!("blob at page {page}")));
                }
                v
            }
        })
    }

    /// Drops expired entries from a loaded bucket and repacks it if that or
    /// a half-empty chain saves pages. Returns how many entries expired, or
    /// None if the bucket is fine as it is.
    pub(crate) fn repack(&self, b: &mut Bucket, now: u64) -> Option<usize> {
        let (gone, keep): (Vec<Slot>, Vec<Slot>) = b
            .slots
            .drain(..)
            .partition(|s| s.expire_at_ms != 0 && s.expire_at_ms <= now);
        b.slots = keep;
        let fewer_pages = bucket::pack(&b.slots, self.page_bytes()).len() < b.pages.len();
        if gone.is_empty() && !fewer_pages {
            return None;
        }
        for old in &gone {
            self.drop_value(b, old);
        }
        self.keys.fetch_sub(gone.len() as u64, Ordering::Relaxed);
        b.changed = true;
        Some(gone.len())
    }

    /// The entry for `key` in a loaded bucket, if present and not expired.
    pub(crate) fn entry_in(
        &self,
        b: &Bucket,
        key: &[u8],
        now: u64,
    ) -> Result<Option<Entry>, EngineError> {
        let Some(i) = b.find(key) else {
            return Ok(None);
        };
        let s = &b.slots[i];
        if s.expire_at_ms != 0 && s.expire_at_ms <= now {
            return Ok(None);
        }
        let bytes = self.value_bytes(s)?;
        let value = Value::decode(s.kind, &bytes)
            .ok_or_else(|| EngineError::Corrupt(format!("value of key {key:?} does not decode")))?;
        Ok(Some(Entry {
            key: key.to_vec(),
            expire_at_ms: s.expire_at_ms,
            value,
        }))
    }

    /// Whether the data region has room for `ops` (checked before they are
    /// logged, so applying them cannot run out of pages).
    pub(crate) fn check_space(&self, ops: &[Op]) -> Result<(), EngineError> {
        let need: u64 = ops
            .iter()
            .map(|op| match op {
                Op::Put(e) if e.value.stored_len() > INLINE_MAX => {
                    u64::from(self.blob_pages(e.value.stored_len())) + 2
                }
                _ => 2,
            })
            .sum();
        let a = self.alloc.lock();
        if a.in_use() + need + SPARE_PAGES >= a.pages() {
            return Err(EngineError::NoSpace);
        }
        Ok(())
    }

    /// Applies a logged operation to its loaded bucket (in memory, plus blob
    /// pages to the cache). `Op::FlushAll` is the caller's.
    pub(crate) fn apply(&self, b: &mut Bucket, op: &Op) -> Result<(), EngineError> {
        match op {
            Op::Put(e) => {
                let slot = self.store_value(e)?;
                match b.find(&e.key) {
                    Some(i) => {
                        let old = std::mem::replace(&mut b.slots[i], slot);
                        self.drop_value(b, &old);
                    }
                    None => {
                        b.slots.push(slot);
                        self.keys.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Op::Del(key) => {
                if let Some(i) = b.find(key) {
                    let old = b.slots.remove(i);
                    self.drop_value(b, &old);
                    self.keys.fetch_sub(1, Ordering::Relaxed);
                }
            }
            Op::FlushAll => unreachable!("FLUSHALL is applied to the whole store"),
        }
        b.changed = true;
        Ok(())
    }

    fn drop_value(&self, b: &mut Bucket, old: &Slot) {
        if let Data::Blob { page, len, .. } = old.data {
            b.freed.push((page, self.blob_pages(len as usize)));
        }
    }

    /// A slot for `e`: inline, or its value written to a fresh blob.
    fn store_value(&self, e: &Entry) -> Result<Slot, EngineError> {
        let bytes = e.value.encode();
        let data = if bytes.len() <= INLINE_MAX {
            Data::Inline(bytes)
        } else {
            let pages = self.blob_pages(bytes.len());
            let page = self.alloc.lock().alloc(pages).ok_or(EngineError::NoSpace)?;
            let mut padded = bytes.clone();
            padded.resize(pages as usize * self.page_bytes(), 0); // whole pages: no loads
            self.cache
                .write(self.data, page * self.layout.page, &padded)?;
            Data::Blob {
                page,
                len: bytes.len() as u32,
                crc: crc32c::crc32c(&bytes),
            }
        };
        Ok(Slot {
            key: e.key.clone(),
            kind: e.value.kind(),
            expire_at_ms: e.expire_at_ms,
            data,
        })
    }

    /// Writes a changed bucket to fresh pages, points the directory at
    /// them, and frees its old pages and replaced blobs.
    pub(crate) fn store_bucket(&self, mut b: Bucket) -> Result<(), EngineError> {
        if !b.changed {
            return Ok(());
        }
        let page = self.page_bytes();
        let packed = bucket::pack(&b.slots, page);
        let mut fresh = Vec::with_capacity(packed.len());
        {
            let mut a = self.alloc.lock();
            for _ in 0..packed.len() {
                fresh.push(a.alloc(1).ok_or(EngineError::NoSpace)?);
            }
        }
        for (i, slots) in packed.iter().enumerate() {
            let next = fresh.get(i + 1).copied().unwrap_or(0);
            let buf = bucket::encode_page(slots, next, page);
            self.cache
                .write(self.data, fresh[i] * self.layout.page, &buf)?;
        }
        self.directory[b.index].store(fresh.first().copied().unwrap_or(0), Ordering::Release);
        let mut a = self.alloc.lock();
        for p in b.pages.drain(..) {
            a.free(p, 1);
        }
        for (p, n) in b.freed.drain(..) {
            a.free(p, n);
        }
        Ok(())
    }
}
