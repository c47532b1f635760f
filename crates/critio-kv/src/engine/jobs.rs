//! The on-demand background jobs: BGSAVE writes every key to the dump file
//! from a frozen copy of the index; BGREWRITEAOF rewrites the index,
//! dropping expired entries and repacking chains.
//!
//! Both run on their own thread, never foreground, with critio's locks: a
//! request that needs a bucket the rewrite holds makes the rewrite critical
//! for that moment.
//!
//! ```text
//!  dump file: | header page: "CKVD" | version u32 | keys u64 | body bytes u64 | crc32c(body) u32 |
//!             | body: (klen u32 | key | kind u8 | expire_ms u64 | vlen u32 | value)* |
//! ```

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::store::now_ms;
use super::{EngineError, Inner};

const DUMP_MAGIC: &[u8; 4] = b"CKVD";
const DUMP_VERSION: u32 = 1;
/// Bytes buffered before a dump write.
const DUMP_CHUNK: usize = 1 << 20;

/// Streams entries into the dump file, whole pages at a time.
struct DumpWriter<'a> {
    inner: &'a Inner,
    offset: u64,
    buf: Vec<u8>,
    crc: u32,
    body: u64,
    keys: u64,
}

impl DumpWriter<'_> {
    fn entry(
        &mut self,
        key: &[u8],
        kind: u8,
        expire: u64,
        value: &[u8],
    ) -> Result<(), EngineError> {
        let mut e = Vec::with_capacity(17 + key.len() + value.len());
        e.extend_from_slice(&(key.len() as u32).to_le_bytes());
        e.extend_from_slice(key);
        e.push(kind);
        e.extend_from_slice(&expire.to_le_bytes());
        e.extend_from_slice(&(value.len() as u32).to_le_bytes());
        e.extend_from_slice(value);
        self.crc = crc32c::crc32c_append(self.crc, &e);
        self.body += e.len() as u64;
        self.keys += 1;
        self.buf.extend_from_slice(&e);
        if self.buf.len() >= DUMP_CHUNK {
            self.write(false)?;
        }
        Ok(())
    }

    /// Writes the whole pages buffered (all of it, padded, if `last`).
    fn write(&mut self, last: bool) -> Result<(), EngineError> {
        let page = self.inner.layout.page as usize;
        let n = if last {
            self.buf.len().div_ceil(page) * page
        } else {
            self.buf.len() / page * page
        };
        if n == 0 {
            return Ok(());
        }
        if self.offset + n as u64 > self.inner.layout.dump.1 {
            return Err(EngineError::Config(format!(
                "the dump file ({} bytes) is too small for this snapshot; raise engine.dump_pct",
                self.inner.layout.dump.1
            )));
        }
        let mut chunk: Vec<u8> = self.buf.drain(..n.min(self.buf.len())).collect();
        chunk.resize(n, 0);
        self.inner
            .cache
            .write(self.inner.dump, self.offset, &chunk)?;
        self.offset += n as u64;
        Ok(())
    }

    fn finish(mut self) -> Result<u64, EngineError> {
        self.write(true)?;
        let mut head = Vec::with_capacity(self.inner.layout.page as usize);
        head.extend_from_slice(DUMP_MAGIC);
        head.extend_from_slice(&DUMP_VERSION.to_le_bytes());
        head.extend_from_slice(&self.keys.to_le_bytes());
        head.extend_from_slice(&self.body.to_le_bytes());
        head.extend_from_slice(&self.crc.to_le_bytes());
        head.resize(self.inner.layout.page as usize, 0);
        self.inner.cache.write(self.inner.dump, 0, &head)?;
        self.inner.cache.flush_file(self.inner.dump)?;
        Ok(self.keys)
    }
}

impl Inner {
    /// BGSAVE: a consistent copy of every key as of its start.
    pub(crate) fn snapshot(&self) -> Result<(), EngineError> {
        let started = Instant::now();
        let dir: Vec<u64> = {
            let _epoch = self.epoch.write();
            let mut a = self.alloc.lock();
            let from = a.advance();
            a.pin(from); // the frozen tree's pages stay until the snapshot ends
            self.directory
                .iter()
                .map(|d| d.load(Ordering::Acquire))
                .collect()
        };
        let result = self.write_dump(&dir);
        self.alloc.lock().unpin();
        let keys = result?;
        let mut bg = self.bg.lock();
        bg.stats.snapshots += 1;
        bg.stats.last_snapshot_ms = started.elapsed().as_secs_f64() * 1e3;
        bg.stats.last_snapshot_keys = keys;
        Ok(())
    }

    fn write_dump(&self, dir: &[u64]) -> Result<u64, EngineError> {
        let now = now_ms();
        let mut w = DumpWriter {
            inner: self,
            offset: self.layout.page,
            buf: Vec::with_capacity(2 * DUMP_CHUNK),
            crc: 0,
            body: 0,
            keys: 0,
        };
        for &head in dir.iter().filter(|&&h| h != 0) {
            let (_, slots) = self.read_chain(head)?;
            for s in slots
                .iter()
                .filter(|s| s.expire_at_ms == 0 || s.expire_at_ms > now)
            {
                let value = self.value_bytes(s)?;
                w.entry(&s.key, s.kind, s.expire_at_ms, &value)?;
            }
        }
        w.finish()
    }

    /// BGREWRITEAOF: drops expired entries and repacks chains, bucket by
    /// bucket (a physical change: nothing to log).
    pub(crate) fn rewrite(&self) -> Result<(), EngineError> {
        let mut repacked = 0;
        for b in 0..self.directory.len() {
            if self.closing.load(Ordering::SeqCst) {
                break;
            }
            let _stripe = self.stripes[Self::stripe_of(b)].lock();
            let mut bucket = self.load_bucket(b)?;
            if self.repack(&mut bucket, now_ms()).is_some() {
                let _epoch = self.epoch.read();
                self.store_bucket(bucket)?;
                repacked += 1;
            }
        }
        let mut bg = self.bg.lock();
        bg.stats.rewrites += 1;
        bg.stats.last_rewrite_buckets = repacked;
        Ok(())
    }
}
