//! The on-demand background jobs: BGSAVE writes every key as of its start
//! to the dump file; BGREWRITEAOF rewrites the value log (the cleaner, over
//! every record written before it started).
//!
//! BGSAVE reads the value log in order, past the cache, between the clean
//! tail and the head at its start (the records stay in place until it
//! ends), and writes a record if it was its key's latest when BGSAVE
//! started (the index's snapshot view). Writers are never stopped: their
//! first change of a key after the start saves the key's old location.
//!
//! Both run on their own thread, never foreground, with critio's locks: a
//! request that needs a stripe they hold makes them critical for that
//! moment.
//!
//! The dump is compressed, as Redis compresses its RDB file
//! (`rdbcompression`, on by default): entries are gathered into frames of
//! about [`FRAME_RAW`] and each frame is stored LZ4-compressed (the
//! `lz4_flex` crate's block format), so a snapshot of compressible values
//! writes a fraction of their bytes. Version 1 dumps (uncompressed) still
//! load.
//!
//! ```text
//!  dump file: | header page: "CKVD" | version u32 | keys u64 | body bytes u64 | crc32c(body) u32 |
//!             | body (v2): (raw len u32 | stored len u32 | LZ4 block of entries)* |
//!             | body (v1): entries                                               |
//!  entry:     klen u32 | key | kind u8 | expire_ms u64 | vlen u32 | value
//! ```

use std::collections::VecDeque;
use std::time::Instant;

use critio::cache::WriteAround;

use super::entry::{Entry, Reader, Value};
use super::index::{Index, STRIPES};
use super::vlog::Flow;
use super::{Engine, EngineError, Inner};

const DUMP_MAGIC: &[u8; 4] = b"CKVD";
/// Version 2: the body is LZ4-compressed frames. Version 1 (raw entries)
/// still loads.
const DUMP_VERSION: u32 = 2;
/// Stored bytes buffered before a dump write.
const DUMP_CHUNK: usize = 1 << 20;
/// Entry bytes gathered into one compressed frame: LZ4 finds matches
/// within 64 KiB, so a larger frame compresses no better, and each frame's
/// compression is a stretch of CPU a background thread runs without a
/// [`critio::context::yield_point`].
const FRAME_RAW: usize = 128 << 10;
/// A frame's header: raw length u32, stored length u32.
const FRAME_HEADER: usize = 8;

/// Stored bytes of the dump a BGSAVE keeps in flight to the device.
const DUMP_INFLIGHT: u64 = 4 * DUMP_CHUNK as u64;

/// Streams entries into the dump file: compressed a frame at a time,
/// written whole pages at a time around the page cache
/// ([`critio::cache::PageCache::start_write_around`]: the dump is not read
/// back by the server, and through the cache it would push out pages of
/// the data), a few writes in flight.
struct DumpWriter<'a> {
    inner: &'a Inner,
    offset: u64,
    /// The writes in flight, oldest first, with their bytes. A dump that
    /// fails waits for them as it drops them ([`WriteAround`]'s drop), so
    /// none lands over the next dump.
    inflight: VecDeque<(u64, WriteAround)>,
    inflight_bytes: u64,
    /// Entries not yet compressed.
    raw: Vec<u8>,
    /// Stored (compressed) bytes not yet written.
    buf: Vec<u8>,
    crc: u32,
    /// What is written so far.
    size: DumpSize,
}

/// What a dump holds.
#[derive(Default)]
struct DumpSize {
    keys: u64,
    /// The body's bytes as stored (compressed).
    stored: u64,
    /// The entries' bytes before compression.
    raw: u64,
}

impl DumpWriter<'_> {
    fn entry(
        &mut self,
        key: &[u8],
        kind: u8,
        expire: u64,
        value: &[u8],
    ) -> Result<(), EngineError> {
        let e = &mut self.raw;
        e.extend_from_slice(&(key.len() as u32).to_le_bytes());
        e.extend_from_slice(key);
        e.push(kind);
        e.extend_from_slice(&expire.to_le_bytes());
        e.extend_from_slice(&(value.len() as u32).to_le_bytes());
        e.extend_from_slice(value);
        self.size.keys += 1;
        if self.raw.len() >= FRAME_RAW {
            self.frame();
            critio::context::yield_point();
            if self.buf.len() >= DUMP_CHUNK {
                self.write(false)?;
            }
        }
        Ok(())
    }

    /// Compresses the gathered entries into one frame of the body.
    fn frame(&mut self) {
        if self.raw.is_empty() {
            return;
        }
        let start = self.buf.len();
        self.buf
            .extend_from_slice(&(self.raw.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(&[0; 4]);
        let bound = lz4_flex::block::get_maximum_output_size(self.raw.len());
        self.buf.resize(start + FRAME_HEADER + bound, 0);
        let stored =
            lz4_flex::block::compress_into(&self.raw, &mut self.buf[start + FRAME_HEADER..])
                .expect("the output holds the compression bound");
        self.buf.truncate(start + FRAME_HEADER + stored);
        self.buf[start + 4..start + FRAME_HEADER].copy_from_slice(&(stored as u32).to_le_bytes());
        self.crc = crc32c::crc32c_append(self.crc, &self.buf[start..]);
        self.size.stored += (FRAME_HEADER + stored) as u64;
        self.size.raw += self.raw.len() as u64;
        self.raw.clear();
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
        let cache = &self.inner.cache;
        let write = cache.start_write_around(self.inner.dump, self.offset, &chunk)?;
        self.inflight.push_back((n as u64, write));
        self.inflight_bytes += n as u64;
        while self.inflight_bytes > DUMP_INFLIGHT {
            self.wait_oldest()?;
        }
        self.offset += n as u64;
        Ok(())
    }

    /// Waits for the oldest write in flight.
    fn wait_oldest(&mut self) -> Result<(), EngineError> {
        if let Some((n, write)) = self.inflight.pop_front() {
            self.inflight_bytes -= n;
            write.finish()?;
        }
        Ok(())
    }

    /// Writes the rest, then the header once the body is durable (so a
    /// header never describes a body not yet on the device), then makes
    /// that durable.
    fn finish(mut self) -> Result<DumpSize, EngineError> {
        self.frame();
        self.write(true)?;
        while !self.inflight.is_empty() {
            self.wait_oldest()?;
        }
        self.inner.cache.block().flush()?;
        let mut head = Vec::with_capacity(self.inner.layout.page as usize);
        head.extend_from_slice(DUMP_MAGIC);
        head.extend_from_slice(&DUMP_VERSION.to_le_bytes());
        head.extend_from_slice(&self.size.keys.to_le_bytes());
        head.extend_from_slice(&self.size.stored.to_le_bytes());
        head.extend_from_slice(&self.crc.to_le_bytes());
        head.resize(self.inner.layout.page as usize, 0);
        self.inner.write_dump_header(&head)?;
        Ok(self.size)
    }
}

impl Inner {
    /// BGSAVE: a consistent copy of every key as of its start, when the
    /// value log's `range` was taken ([`super::vlog::Vlog::begin_snapshot`])
    /// and the clock read `now` (ms): the keys expired then are left out.
    pub(crate) fn snapshot(&self, range: (u64, u64), now: u64) -> Result<(), EngineError> {
        let started = Instant::now();
        let result = self.write_dump(range, now);
        self.vlog.end_snapshot();
        for s in 0..STRIPES {
            self.index.lock(s).end_snapshot();
        }
        let size = result?;
        let mut bg = self.bg.lock();
        bg.stats.snapshots += 1;
        bg.stats.last_snapshot_ms = started.elapsed().as_secs_f64() * 1e3;
        bg.stats.last_snapshot_keys = size.keys;
        bg.stats.last_snapshot_bytes = size.stored;
        bg.stats.last_snapshot_raw_bytes = size.raw;
        Ok(())
    }

    /// Writes the dump's header page (or zeroes over it) around the cache,
    /// durably.
    fn write_dump_header(&self, page: &[u8]) -> Result<(), EngineError> {
        (self.cache)
            .start_write_around(self.dump, 0, page)?
            .finish()?;
        self.cache.block().flush()?;
        Ok(())
    }

    fn write_dump(&self, (from, to): (u64, u64), now: u64) -> Result<DumpSize, EngineError> {
        // The last dump's header goes first (durably): its body is about
        // to be overwritten, and a dump that then fails or is cut short
        // leaves no dump rather than a header over a damaged body.
        self.write_dump_header(&vec![0u8; self.layout.page as usize])?;
        let mut w = DumpWriter {
            inner: self,
            offset: self.layout.page,
            inflight: VecDeque::new(),
            inflight_bytes: 0,
            raw: Vec::with_capacity(DUMP_CHUNK + (64 << 10)),
            buf: Vec::with_capacity(2 * DUMP_CHUNK),
            crc: 0,
            size: DumpSize::default(),
        };
        let progress = &self.progress[0]; // its totals set as it began
        self.vlog.scan(from, to, |addr, r, stored| {
            if r.is_value() {
                let then = self
                    .index
                    .lock(Index::stripe_of(r.key))
                    .as_of_snapshot(r.key);
                if then.is_some_and(|l| l.addr == addr && !l.expired(now)) {
                    w.entry(r.key, r.kind, r.expire_at_ms, r.value)?;
                }
            }
            progress.advance(addr + stored.len() as u64 - from, w.size.keys);
            Ok(Flow::Continue)
        })?;
        w.finish()
    }

    /// BGREWRITEAOF: every record written before it started is gone
    /// through; live ones are copied to the head, expired keys dropped.
    pub(crate) fn rewrite(&self) -> Result<(), EngineError> {
        let head = self.vlog.head();
        let done = self.clean(head, Some(&self.progress[1]))?;
        self.checkpoint()?;
        let mut bg = self.bg.lock();
        bg.stats.rewrites += 1;
        bg.stats.last_rewrite_records = done.copied;
        Ok(())
    }
}

impl Engine {
    /// The entries of the last complete dump (BGSAVE), checked against its
    /// checksum; an empty list if there is none (none yet, or the last
    /// BGSAVE failed or was cut short: each starts by erasing the header of
    /// the dump it overwrites).
    pub fn read_dump(&self) -> Result<Vec<Entry>, EngineError> {
        let inner = &self.inner;
        let page = inner.layout.page as usize;
        let mut head = vec![0u8; page];
        inner.cache.read_through(inner.dump, 0, &mut head)?;
        let mut r = Reader(&head);
        if r.take(4) != Some(&DUMP_MAGIC[..]) {
            return Ok(Vec::new());
        }
        let bad = |why: &str| EngineError::Corrupt(format!("dump file: {why}"));
        let version = r.u32();
        if !matches!(version, Some(1 | DUMP_VERSION)) {
            return Err(bad("unknown version"));
        }
        let (keys, body, crc) = match (r.u64(), r.u64(), r.u32()) {
            (Some(k), Some(b), Some(c)) => (k, b, c),
            _ => return Err(bad("short header")),
        };
        if body > inner.layout.dump.1 - page as u64 {
            return Err(bad("body larger than the file"));
        }
        // Straight into the returned buffer: read_through would copy the
        // whole body once more.
        let bytes = inner
            .cache
            .start_read_through(inner.dump, page as u64, body as usize)?
            .finish()?;
        if crc32c::crc32c(&bytes) != crc {
            return Err(bad("checksum"));
        }
        dump_entries(version.unwrap_or(0), keys, bytes)
    }
}

/// The `keys` entries of a dump body of `version` (checksum checked).
fn dump_entries(version: u32, keys: u64, body: Vec<u8>) -> Result<Vec<Entry>, EngineError> {
    let bad = |why: &str| EngineError::Corrupt(format!("dump file: {why}"));
    let bytes = match version {
        1 => body,
        _ => {
            let raw = decompress_frames(&body);
            drop(body); // not kept while the entries are parsed
            raw.ok_or_else(|| bad("compressed frame"))?
        }
    };
    let mut r = Reader(&bytes);
    let mut out = Vec::with_capacity(keys.min(1 << 20) as usize);
    for _ in 0..keys {
        let entry = (|| {
            let key = r.bytes()?.to_vec();
            let kind = r.u8()?;
            let expire_at_ms = r.u64()?;
            let value = Value::decode(kind, r.bytes()?)?;
            Some(Entry {
                key,
                expire_at_ms,
                value,
            })
        })();
        out.push(entry.ok_or_else(|| bad("entry layout"))?);
    }
    Ok(out)
}

/// LZ4's block format cannot expand a byte more than about 255 times: a
/// frame claiming more is damaged (checked before anything is allocated
/// for it).
const LZ4_RATIO_MAX: usize = 255;

/// The entries of a version 2 body: every frame decompressed, in order
/// (None: a frame is cut short, claims more than its stored bytes can
/// hold, or does not decompress to its length).
fn decompress_frames(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    while !body.is_empty() {
        let mut r = Reader(body);
        let (raw, stored) = (r.u32()? as usize, r.u32()? as usize);
        let end = FRAME_HEADER.checked_add(stored)?;
        let frame = body.get(FRAME_HEADER..end)?;
        if raw > stored.saturating_mul(LZ4_RATIO_MAX).saturating_add(16) {
            return None;
        }
        let start = out.len();
        out.try_reserve(raw).ok()?;
        out.resize(start + raw, 0);
        let n = lz4_flex::block::decompress_into(frame, &mut out[start..]).ok()?;
        if n != raw {
            return None;
        }
        body = &body[end..];
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(raw: &[u8]) -> Vec<u8> {
        let stored = lz4_flex::block::compress(raw);
        let mut f = (raw.len() as u32).to_le_bytes().to_vec();
        f.extend_from_slice(&(stored.len() as u32).to_le_bytes());
        f.extend_from_slice(&stored);
        f
    }

    #[test]
    fn frames_decompress_in_order_and_damage_is_refused() {
        let (a, b) = (vec![7u8; 5000], b"entries of the second frame".to_vec());
        let mut body = frame(&a);
        body.extend_from_slice(&frame(&b));
        assert!(body.len() < 200, "equal bytes compress: {}", body.len());
        let mut want = a.clone();
        want.extend_from_slice(&b);
        assert_eq!(decompress_frames(&body), Some(want));
        assert_eq!(decompress_frames(&[]), Some(vec![]));
        // Cut short, or a raw length the frame does not decompress to.
        assert_eq!(decompress_frames(&body[..body.len() - 1]), None);
        let mut lying = frame(&a);
        lying[..4].copy_from_slice(&4000u32.to_le_bytes());
        assert_eq!(decompress_frames(&lying), None);
        // A header claiming 4 GiB from nothing is refused before anything
        // is allocated for it.
        let mut huge = u32::MAX.to_le_bytes().to_vec();
        huge.extend_from_slice(&0u32.to_le_bytes());
        assert_eq!(decompress_frames(&huge), None);
    }

    fn entry_bytes(key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut e = (key.len() as u32).to_le_bytes().to_vec();
        e.extend_from_slice(key);
        e.push(crate::engine::entry::KIND_STR);
        e.extend_from_slice(&0u64.to_le_bytes());
        e.extend_from_slice(&(value.len() as u32).to_le_bytes());
        e.extend_from_slice(value);
        e
    }

    #[test]
    fn both_dump_versions_load_and_a_short_body_is_refused() {
        let mut raw = entry_bytes(b"a", b"1");
        raw.extend_from_slice(&entry_bytes(b"b", &[2; 3000]));
        let v1 = dump_entries(1, 2, raw.clone()).unwrap();
        let v2 = dump_entries(2, 2, frame(&raw)).unwrap();
        assert_eq!(v1, v2);
        assert_eq!(v1[1].key, b"b");
        assert_eq!(v1[1].value, Value::Str(vec![2; 3000]));
        assert!(
            dump_entries(1, 3, raw.clone()).is_err(),
            "a third entry is missing"
        );
        assert!(dump_entries(2, 2, frame(&raw[..raw.len() - 1])).is_err());
    }
}
