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
//!  dump file: | header page: "CKVD" | version u32 | keys u64 | body bytes u64 | crc32c(body) u32 | start u64 (v3) |
//!             | body area: the body from `start`, a ring (v1, v2: from 0)                        |
//!  body (v2, v3): (raw len u32 | stored len u32 | LZ4 block of entries)*
//!  body (v1):     entries
//!  entry:         klen u32 | key | kind u8 | expire_ms u64 | vlen u32 | value
//! ```
//!
//! The last dump survives the BGSAVE after it until that one is complete,
//! as Redis keeps `dump.rdb` until the new file is renamed over it: a new
//! body starts in the body area where the last one ends and wraps around
//! its end, and the header page, rewritten once the new body is durable,
//! is the switch from one to the other. A BGSAVE that fails or is cut
//! short (a crash, an I/O error) before then leaves the last dump
//! readable. Only a dump that outgrows the room beside the last one
//! reaches the last one's body: the header is erased first (durably), so
//! that from there a failure (the crash, or the dump file found too small
//! for it) leaves no dump rather than a header over a damaged body.
//!
//! ```text
//!  body area: | .. last dump .. | new dump ->  ...  | (wraps) -> .. | last dump ..
//!             the header names the last dump until the new body is durable
//! ```

use std::collections::VecDeque;
use std::time::Instant;

use critio::cache::WriteAround;

use super::entry::{Entry, Reader, Value};
use super::index::{Index, STRIPES};
use super::vlog::Flow;
use super::{Engine, EngineError, Inner};

const DUMP_MAGIC: &[u8; 4] = b"CKVD";
/// Version 3: the body is LZ4-compressed frames from `start` in the body
/// area. Version 2 (the same body from the area's start) and version 1
/// (raw entries) still load.
const DUMP_VERSION: u32 = 3;
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
    /// The body area's bytes (the dump file less its header page).
    area: u64,
    /// Where in the body area this body starts: where the last dump's
    /// ends.
    start: u64,
    /// Body bytes written (whole pages).
    written: u64,
    /// Body bytes this one may write before it reaches the last dump's
    /// body (the whole area if there is none).
    room: u64,
    /// The last dump's header is still in place (the last dump is kept).
    kept: bool,
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
        if self.written + n as u64 > self.area {
            return Err(EngineError::Config(format!(
                "the dump file ({} bytes) is too small for this snapshot; raise engine.dump_pct",
                self.inner.layout.dump.1
            )));
        }
        if self.kept && self.written + n as u64 > self.room {
            // The last dump's body is next: its header goes first, so that
            // a failure from here leaves no dump rather than that header
            // over a damaged body.
            self.inner
                .write_dump_header(&vec![0u8; self.inner.layout.page as usize])?;
            self.kept = false;
        }
        let mut chunk: Vec<u8> = self.buf.drain(..n.min(self.buf.len())).collect();
        chunk.resize(n, 0);
        // Up to the area's end, and the rest from its start.
        let at = (self.start + self.written) % self.area;
        let first = (self.area - at).min(n as u64) as usize;
        let page = self.inner.layout.page;
        let cache = &self.inner.cache;
        for (at, piece) in [(at, &chunk[..first]), (0, &chunk[first..])] {
            if piece.is_empty() {
                continue;
            }
            let write = cache.start_write_around(self.inner.dump, page + at, piece)?;
            self.inflight.push_back((piece.len() as u64, write));
        }
        self.inflight_bytes += n as u64;
        while self.inflight_bytes > DUMP_INFLIGHT {
            self.wait_oldest()?;
        }
        self.written += n as u64;
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
        head.extend_from_slice(&self.start.to_le_bytes());
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

    /// The last complete dump's header, if the header page holds one.
    fn dump_header(&self) -> Result<Option<DumpHeader>, EngineError> {
        let mut head = vec![0u8; self.layout.page as usize];
        self.cache.read_through(self.dump, 0, &mut head)?;
        parse_dump_header(&head, self.layout.dump_area(), self.layout.page)
    }

    fn write_dump(&self, (from, to): (u64, u64), now: u64) -> Result<DumpSize, EngineError> {
        let (area, page) = (self.layout.dump_area(), self.layout.page);
        // The new body goes where the last one ends. A header that does
        // not read (damaged, or a read error that may pass) keeps nothing,
        // and it is erased first, as one about to be overwritten is: a
        // valid header must never be left over a body written across.
        let last = match self.dump_header() {
            Ok(last) => last,
            Err(_) => {
                self.write_dump_header(&vec![0u8; page as usize])?;
                None
            }
        };
        let (start, room) = match &last {
            Some(h) => {
                let len = h.body.div_ceil(page) * page;
                ((h.start + len).checked_rem(area).unwrap_or(0), area - len)
            }
            None => (0, area),
        };
        let mut w = DumpWriter {
            inner: self,
            area,
            start,
            written: 0,
            room,
            kept: last.is_some(),
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

/// The dump header in `head` (a dump file's first page) of a dump file
/// whose body area is `area` bytes, in pages of `page`: None if it holds
/// none.
fn parse_dump_header(head: &[u8], area: u64, page: u64) -> Result<Option<DumpHeader>, EngineError> {
    let mut r = Reader(head);
    if r.take(4) != Some(&DUMP_MAGIC[..]) {
        return Ok(None);
    }
    let bad = |why: &str| EngineError::Corrupt(format!("dump file: {why}"));
    let version = match r.u32() {
        Some(v @ 1..=DUMP_VERSION) => v,
        _ => return Err(bad("unknown version")),
    };
    let (keys, body, crc) = match (r.u64(), r.u64(), r.u32()) {
        (Some(k), Some(b), Some(c)) => (k, b, c),
        _ => return Err(bad("short header")),
    };
    let start = match version {
        3.. => r.u64().ok_or_else(|| bad("short header"))?,
        _ => 0,
    };
    if body > area {
        return Err(bad("body larger than the file"));
    }
    // (A file of one page has an empty area, where only 0 is a start.)
    if start % page != 0 || start >= area.max(page) {
        return Err(bad("body start outside the file"));
    }
    Ok(Some(DumpHeader {
        version,
        keys,
        body,
        crc,
        start,
    }))
}

/// A dump file's header page.
struct DumpHeader {
    version: u32,
    keys: u64,
    /// The body's stored bytes.
    body: u64,
    crc: u32,
    /// Where in the body area the body starts.
    start: u64,
}

impl Engine {
    /// The entries of the last complete dump (BGSAVE), checked against its
    /// checksum; an empty list if there is none (none yet, or the one
    /// BGSAVE after another outgrew the room beside it and then failed or
    /// was cut short). All of them in memory: see [`Engine::dump_entries`]
    /// for a dump of any size.
    pub fn read_dump(&self) -> Result<Vec<Entry>, EngineError> {
        self.dump_entries()?.collect()
    }

    /// The entries of the last complete dump (BGSAVE), read from the device
    /// a chunk at a time (`critio dump` exports them): besides one chunk
    /// (1 MiB), it holds one compressed frame and its entries, and the
    /// entry it yields, whatever the dump's size. No entries if there is
    /// no dump ([`DumpEntries::exists`] tells an empty one apart).
    ///
    /// The checksum covers the whole body, so it is checked when the last
    /// chunk has been read: a damaged dump yields entries and then an
    /// error, as its last item. A caller that must not act on a damaged
    /// dump checks it first ([`Engine::check_dump`]) or keeps what it does
    /// provisional until the iterator has ended without one.
    ///
    /// Refused while a BGSAVE runs: it may erase the header or switch it
    /// to the new dump under the reader.
    pub fn dump_entries(&self) -> Result<DumpEntries<'_>, EngineError> {
        if self.background_running().0 {
            return Err(EngineError::Busy(
                "a BGSAVE is writing the dump: read it once it has ended",
            ));
        }
        let inner = &*self.inner;
        let header = inner.dump_header()?;
        Ok(DumpEntries::new(
            Source::Store(inner),
            inner.layout.dump_area(),
            inner.layout.page,
            header,
        ))
    }

    /// Reads the last dump's body for its checksum alone, a chunk at a
    /// time: Ok if it is whole (or there is none), the error
    /// [`Engine::dump_entries`] would end in otherwise. What to run before
    /// acting on entries that cannot be taken back (`critio dump` to
    /// standard output).
    pub fn check_dump(&self) -> Result<(), EngineError> {
        self.dump_entries()?.check()
    }
}

/// The last dump of the store whose image is `image` (`critio.img`), read
/// from the file on its own, past any server: what `critio dump` reads
/// while the store's server runs (its lock keeps [`Engine::open`] out).
/// `cfg` is the config the store runs with, whose layout places the dump
/// file; a layout another than the store's (its superblock's value log
/// size) is refused. Reads are `O_DIRECT`, so they see what the server
/// wrote, which writes the same way.
///
/// The dump is the one whose header the first read found: after each
/// chunk, and at the body's end, the header is read again, and the
/// entries end in an error (`Busy`) once it has changed (a BGSAVE that
/// ended meanwhile replaced it, or one that outgrew the room beside it
/// erased it before writing over its body). So every entry yielded comes
/// from bytes of that one dump, but a read may end early: a caller that
/// keeps what it wrote only once the entries end without an error never
/// keeps a part of a dump.
pub fn image_dump(
    image: &std::path::Path,
    cfg: &super::EngineConfig,
) -> Result<DumpEntries<'static>, EngineError> {
    use super::layout::{Layout, SUPERBLOCK_BYTES};
    let file = open_image(image)
        .map_err(|e| EngineError::Io(format!("cannot open {}: {e}", image.display())))?;
    let capacity = file
        .metadata()
        .map_err(|e| EngineError::Io(format!("{}: {e}", image.display())))?
        .len();
    let layout = Layout::new(capacity, cfg.log_bytes, cfg.dump_pct, 4096)?;
    let sb = super::checkpoint::current_superblock(|at| {
        read_direct(&file, at, SUPERBLOCK_BYTES as usize)
    })?;
    match sb.map(|sb| sb.vlog_bytes) {
        None => {
            return Err(EngineError::Corrupt(format!(
                "{} holds no checkpointed store",
                image.display()
            )))
        }
        Some(vlog) if vlog != layout.data.1 * layout.page => {
            return Err(EngineError::Config(format!(
                "the config's layout is not this store's (a value log of {} bytes, the store's {vlog}): \
                 pass the config its server runs with",
                layout.data.1 * layout.page
            )))
        }
        Some(_) => {}
    }
    let (area, page) = (layout.dump_area(), layout.page);
    let head = read_direct(&file, layout.dump.0, page as usize)?;
    let header = parse_dump_header(&head, area, page)?;
    let source = Source::Image {
        file,
        dump: layout.dump,
        head,
    };
    Ok(DumpEntries::new(source, area, page, header))
}

/// Body bytes [`DumpEntries`] reads from the device at a time.
const READ_CHUNK: usize = if cfg!(test) { 16 << 10 } else { 1 << 20 };

/// Which dump a [`DumpEntries`] reads ([`DumpEntries::id`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DumpId {
    keys: u64,
    body: u64,
    crc: u32,
    start: u64,
}

/// Where [`DumpEntries`] reads a dump file from.
enum Source<'a> {
    /// An open store, past its page cache.
    Store(&'a Inner),
    /// A store's image file, on its own ([`image_dump`]): the dump file at
    /// `dump` (offset, bytes) in it, and its header page as first read.
    Image {
        file: std::fs::File,
        dump: (u64, u64),
        head: Vec<u8>,
    },
}

impl Source<'_> {
    /// `n` bytes of the dump file from `at` (a page boundary).
    fn read(&self, at: u64, n: usize) -> Result<Vec<u8>, EngineError> {
        match self {
            Source::Store(inner) => Ok(inner
                .cache
                .start_read_through(inner.dump, at, n)?
                .finish()?),
            Source::Image { file, dump, .. } => read_direct(file, dump.0 + at, n),
        }
    }
}

/// `image` for reading with `O_DIRECT`, or without where its file system
/// refuses it (tmpfs: there the server's writes go through the same page
/// cache).
fn open_image(image: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let direct = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(image);
    let refused = |e: &std::io::Error| e.raw_os_error() == Some(libc::EINVAL);
    match direct {
        // Some file systems take the flag at open and refuse the first read.
        Ok(f) => {
            let mut probe = critio::device::AlignedBuf::zeroed(4096);
            match f.read_at(probe.as_mut_slice(), 0) {
                Err(e) if refused(&e) => std::fs::File::open(image),
                _ => Ok(f),
            }
        }
        Err(e) if refused(&e) => std::fs::File::open(image),
        Err(e) => Err(e),
    }
}

/// `n` bytes of `file` from `at` (a page boundary), read with `O_DIRECT`
/// (whole pages, into an aligned buffer) so that they are the device's,
/// whatever the kernel's page cache holds of the file.
fn read_direct(file: &std::fs::File, at: u64, n: usize) -> Result<Vec<u8>, EngineError> {
    use std::os::unix::fs::FileExt;
    const BLOCK: usize = 4096;
    let mut buf = critio::device::AlignedBuf::zeroed(n.div_ceil(BLOCK).max(1) * BLOCK);
    file.read_exact_at(buf.as_mut_slice(), at)
        .map_err(|e| EngineError::Io(format!("cannot read the image at {at}: {e}")))?;
    Ok(buf.as_slice()[..n].to_vec())
}

/// The entries of a dump, read a chunk at a time ([`Engine::dump_entries`],
/// [`image_dump`]).
pub struct DumpEntries<'a> {
    source: Source<'a>,
    /// The dump file's body area and page, in bytes.
    area: u64,
    page: u64,
    /// A dump's header was found.
    exists: bool,
    /// Entries, as the header says.
    keys: u64,
    /// Entries yielded.
    seen: u64,
    /// Where in the body area the body starts.
    start: u64,
    /// The body's stored bytes, and how many are read.
    body: u64,
    read: u64,
    crc_want: u32,
    /// Of the bytes read so far.
    crc: u32,
    decoder: BodyDecoder,
    /// Ended, at the body's end or at an error.
    over: bool,
}

impl<'a> DumpEntries<'a> {
    /// The dump `header` describes (None: no dump) in a dump file of a
    /// body `area` in pages of `page`, read from `source`.
    fn new(source: Source<'a>, area: u64, page: u64, header: Option<DumpHeader>) -> Self {
        let h = header.as_ref();
        DumpEntries {
            source,
            area,
            page,
            exists: header.is_some(),
            keys: h.map_or(0, |h| h.keys),
            seen: 0,
            start: h.map_or(0, |h| h.start),
            body: h.map_or(0, |h| h.body),
            read: 0,
            crc_want: h.map_or(0, |h| h.crc),
            crc: 0,
            decoder: BodyDecoder::new(
                h.map_or(DUMP_VERSION, |h| h.version),
                h.map_or(0, |h| h.body),
            ),
            over: false,
        }
    }

    /// Whether there is a dump (a BGSAVE of an empty store has one, with
    /// no entries).
    pub fn exists(&self) -> bool {
        self.exists
    }

    /// How many entries the dump holds, as its header says (0: none).
    pub fn keys(&self) -> u64 {
        self.keys
    }

    /// The body's stored (compressed) bytes, and how many are read so far.
    pub fn bytes(&self) -> (u64, u64) {
        (self.body, self.read)
    }

    /// Which dump this is, as its header says: two reads of the same dump
    /// file have the same one unless a BGSAVE ended between them.
    pub fn id(&self) -> DumpId {
        DumpId {
            keys: self.keys,
            body: self.body,
            crc: self.crc_want,
            start: self.start,
        }
    }

    /// Reads the next chunk of the body into the decoder.
    fn fill(&mut self) -> Result<(), EngineError> {
        let chunk = self.fill_raw()?;
        self.decoder.push(&chunk);
        Ok(())
    }

    /// Reads the next chunk of the body, adding it to the checksum.
    fn fill_raw(&mut self) -> Result<Vec<u8>, EngineError> {
        let area = self.area;
        // Up to the area's end at most: a body wraps around it.
        let at = (self.start + self.read) % area;
        let n = (self.body - self.read)
            .min(READ_CHUNK as u64)
            .min(area - at) as usize;
        let chunk = self.source.read(self.page + at, n)?;
        // From an image on its own, the header still the one read first
        // after the chunk: a BGSAVE erases it (durably) before it writes
        // over a body, so the chunk was read whole, and no entry is ever
        // decoded from bytes of two dumps.
        self.unchanged()?;
        self.crc = crc32c::crc32c_append(self.crc, &chunk);
        self.read += n as u64;
        Ok(chunk)
    }

    /// Reads the rest of the body for its checksum alone: Ok if the dump
    /// is whole (or there is none), the error the entries would end in
    /// otherwise ([`Engine::check_dump`]).
    pub fn check(mut self) -> Result<(), EngineError> {
        while self.read < self.body {
            self.fill_raw()?;
        }
        if self.crc != self.crc_want {
            return Err(EngineError::Corrupt("dump file: checksum".into()));
        }
        self.unchanged()
    }

    /// Read from an image on its own: whether the dump file's header is
    /// still the one read first (checked after each chunk and at the end).
    /// A BGSAVE that ended meanwhile switched it to its own dump, or one
    /// that outgrew the room beside this one erased it before it wrote
    /// over this body.
    fn unchanged(&self) -> Result<(), EngineError> {
        if let Source::Image { head, .. } = &self.source {
            if self.source.read(0, head.len())? != *head {
                return Err(EngineError::Busy(
                    "a BGSAVE replaced the dump while it was read: run again",
                ));
            }
        }
        Ok(())
    }

    /// The checks once the whole body is read: nothing left undecoded,
    /// the checksum, the count, and (from an image on its own) the header
    /// unchanged.
    fn end(&self) -> Result<(), EngineError> {
        let bad = |why: String| EngineError::Corrupt(format!("dump file: {why}"));
        if !self.decoder.is_drained() {
            return Err(bad("the body ends inside an entry".into()));
        }
        if self.crc != self.crc_want {
            return Err(bad("checksum".into()));
        }
        self.unchanged()?;
        if self.seen != self.keys {
            return Err(bad(format!(
                "{} entries where its header says {}",
                self.seen, self.keys
            )));
        }
        Ok(())
    }
}

impl Iterator for DumpEntries<'_> {
    type Item = Result<Entry, EngineError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.over {
            return None;
        }
        let result = loop {
            match self.decoder.next() {
                Err(why) => break Err(EngineError::Corrupt(format!("dump file: {why}"))),
                Ok(Some(entry)) => {
                    self.seen += 1;
                    return Some(Ok(entry));
                }
                Ok(None) if self.read < self.body => {
                    if let Err(e) = self.fill() {
                        break Err(e);
                    }
                }
                Ok(None) => match self.end() {
                    Ok(()) => {
                        self.over = true;
                        return None;
                    }
                    Err(e) => break Err(e),
                },
            }
        };
        self.over = true;
        Some(result)
    }
}

/// Decodes a dump body of either version from pieces of any size, so that
/// it is never whole in memory: at most one compressed frame and its
/// entries (version 2), or one entry (version 1), beyond the piece. A
/// frame or entry that claims more bytes than the body has left is
/// refused at once, not read to the body's end.
struct BodyDecoder {
    version: u32,
    /// Body bytes not yet pushed.
    unpushed: u64,
    /// Body bytes pushed and not yet decoded, from `pending_at`.
    pending: Vec<u8>,
    pending_at: usize,
    /// Version 2: the current frame's entries, decoded up to `raw_at`.
    raw: Vec<u8>,
    raw_at: usize,
}

impl BodyDecoder {
    /// A decoder of a body of `version` and `len` bytes.
    fn new(version: u32, len: u64) -> Self {
        Self {
            version,
            unpushed: len,
            pending: Vec::new(),
            pending_at: 0,
            raw: Vec::new(),
            raw_at: 0,
        }
    }

    /// The next piece of the body.
    fn push(&mut self, bytes: &[u8]) {
        self.unpushed = self.unpushed.saturating_sub(bytes.len() as u64);
        self.pending.drain(..self.pending_at);
        self.pending_at = 0;
        self.pending.extend_from_slice(bytes);
    }

    /// Whether everything pushed is decoded (at the body's end: it did not
    /// stop inside a frame or an entry).
    fn is_drained(&self) -> bool {
        self.pending_at == self.pending.len() && self.raw_at == self.raw.len()
    }

    /// The next entry; None until more of the body is pushed; an error
    /// for a damaged body.
    fn next(&mut self) -> Result<Option<Entry>, &'static str> {
        if self.version == 1 {
            let rest = &self.pending[self.pending_at..];
            let Some((entry, n)) = parse_entry(rest)? else {
                if entry_len(rest).is_some_and(|n| n > rest.len() as u64 + self.unpushed) {
                    return Err("entry layout");
                }
                return Ok(None);
            };
            self.pending_at += n;
            return Ok(Some(entry));
        }
        loop {
            if self.raw_at < self.raw.len() {
                // A frame holds whole entries.
                let (entry, n) = parse_entry(&self.raw[self.raw_at..])?.ok_or("entry layout")?;
                self.raw_at += n;
                return Ok(Some(entry));
            }
            let rest = &self.pending[self.pending_at..];
            let mut r = Reader(rest);
            let (Some(raw), Some(stored)) = (r.u32(), r.u32()) else {
                return Ok(None);
            };
            let (raw, stored) = (raw as usize, stored as usize);
            if raw > stored.saturating_mul(LZ4_RATIO_MAX).saturating_add(16)
                || (FRAME_HEADER + stored) as u64 > rest.len() as u64 + self.unpushed
            {
                return Err("compressed frame");
            }
            let Some(frame) = rest.get(FRAME_HEADER..FRAME_HEADER + stored) else {
                return Ok(None);
            };
            self.raw.clear();
            self.raw_at = 0;
            self.raw.try_reserve(raw).map_err(|_| "compressed frame")?;
            self.raw.resize(raw, 0);
            match lz4_flex::block::decompress_into(frame, &mut self.raw) {
                Ok(n) if n == raw => {}
                _ => {
                    self.raw.clear();
                    return Err("compressed frame");
                }
            }
            self.pending_at += FRAME_HEADER + stored;
        }
    }
}

/// The length an entry at the start of `bytes` claims, once its header
/// fields are there (None before).
fn entry_len(bytes: &[u8]) -> Option<u64> {
    let mut r = Reader(bytes);
    let klen = u64::from(r.u32()?);
    r.take(klen as usize)?;
    let (_kind, _expire) = (r.u8()?, r.u64()?);
    let vlen = u64::from(r.u32()?);
    Some(4 + klen + 1 + 8 + 4 + vlen)
}

/// The entry at the start of `bytes` and its length; None if `bytes` ends
/// inside it; an error if it is whole but its value does not decode.
fn parse_entry(bytes: &[u8]) -> Result<Option<(Entry, usize)>, &'static str> {
    let mut r = Reader(bytes);
    let fields = (|| {
        let key = r.bytes()?;
        let kind = r.u8()?;
        let expire_at_ms = r.u64()?;
        let value = r.bytes()?;
        Some((key, kind, expire_at_ms, value))
    })();
    let Some((key, kind, expire_at_ms, value)) = fields else {
        return Ok(None);
    };
    let value = Value::decode(kind, value).ok_or("entry layout")?;
    let entry = Entry {
        key: key.to_vec(),
        expire_at_ms,
        value,
    };
    Ok(Some((entry, bytes.len() - r.0.len())))
}

/// LZ4's block format cannot expand a byte more than about 255 times: a
/// frame claiming more is damaged (checked before anything is allocated
/// for it).
const LZ4_RATIO_MAX: usize = 255;

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

    fn entry_bytes(key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut e = (key.len() as u32).to_le_bytes().to_vec();
        e.extend_from_slice(key);
        e.push(crate::engine::entry::KIND_STR);
        e.extend_from_slice(&0u64.to_le_bytes());
        e.extend_from_slice(&(value.len() as u32).to_le_bytes());
        e.extend_from_slice(value);
        e
    }

    /// Decodes `body` of `version` pushed in pieces of `piece` bytes: the
    /// entries, or the first error (a body that ends inside a frame or an
    /// entry is one).
    fn decode(version: u32, body: &[u8], piece: usize) -> Result<Vec<Entry>, &'static str> {
        let mut d = BodyDecoder::new(version, body.len() as u64);
        let mut out = Vec::new();
        for part in body.chunks(piece.max(1)) {
            d.push(part);
            while let Some(e) = d.next()? {
                out.push(e);
            }
        }
        if !d.is_drained() {
            return Err("cut short");
        }
        Ok(out)
    }

    #[test]
    fn both_dump_versions_decode_in_pieces_of_any_size() {
        let mut raw = entry_bytes(b"a", b"1");
        raw.extend_from_slice(&entry_bytes(b"b", &[2; 3000]));
        let mut raw2 = entry_bytes(b"c", b"entries of the second frame");
        raw2.extend_from_slice(&entry_bytes(b"", b""));
        let mut v1 = raw.clone();
        v1.extend_from_slice(&raw2);
        let mut v2 = frame(&raw);
        v2.extend_from_slice(&frame(&raw2));
        assert!(v2.len() < 300, "equal bytes compress: {}", v2.len());
        let want = decode(1, &v1, v1.len()).unwrap();
        assert_eq!(want.len(), 4);
        assert_eq!(want[1].key, b"b");
        assert_eq!(want[1].value, Value::Str(vec![2; 3000]));
        for piece in [1, 3, 7, 8, 9, 64, 1000, 4096, 1 << 20] {
            assert_eq!(
                decode(1, &v1, piece).unwrap(),
                want,
                "v1 in pieces of {piece}"
            );
            assert_eq!(
                decode(2, &v2, piece).unwrap(),
                want,
                "v2 in pieces of {piece}"
            );
        }
        assert_eq!(decode(2, &[], 1).unwrap(), vec![]);
    }

    #[test]
    fn a_damaged_body_is_refused() {
        let mut raw = entry_bytes(b"a", b"1");
        raw.extend_from_slice(&entry_bytes(b"b", &[2; 3000]));
        // Cut short: inside an entry (v1) or a frame (v2).
        assert!(decode(1, &raw[..raw.len() - 1], 100).is_err());
        let f = frame(&raw);
        assert!(decode(2, &f[..f.len() - 1], 100).is_err());
        // A raw length the frame does not decompress to.
        let mut lying = f.clone();
        lying[..4].copy_from_slice(&4000u32.to_le_bytes());
        assert_eq!(decode(2, &lying, 100), Err("compressed frame"));
        // A header claiming 4 GiB from nothing is refused before anything
        // is allocated for it.
        let mut huge = u32::MAX.to_le_bytes().to_vec();
        huge.extend_from_slice(&0u32.to_le_bytes());
        assert_eq!(decode(2, &huge, 100), Err("compressed frame"));
        // A frame whose entries do not fill it whole.
        assert_eq!(
            decode(2, &frame(&raw[..raw.len() - 1]), 100),
            Err("entry layout")
        );
        // A frame or an entry claiming more than the body has left is
        // refused at once, before the rest is read.
        let mut d = BodyDecoder::new(2, 1 << 30);
        let mut big = (1u32 << 20).to_le_bytes().to_vec();
        big.extend_from_slice(&(1u32 << 20).to_le_bytes());
        d.push(&big);
        assert_eq!(d.next().err(), None, "the body may still hold it");
        let mut d = BodyDecoder::new(2, 100);
        d.push(&big);
        assert_eq!(d.next().err(), Some("compressed frame"));
        let mut d = BodyDecoder::new(1, 10);
        d.push(&entry_bytes(b"k", &[1; 64])[..20]);
        assert_eq!(d.next().err(), Some("entry layout"));
        // A hash that does not decode.
        let mut e = entry_bytes(b"h", &[9; 3]);
        e[4 + 1] = crate::engine::entry::KIND_HASH;
        assert_eq!(decode(1, &e, 100), Err("entry layout"));
    }
}
