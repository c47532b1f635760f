//! Opening a log: read the header (or format a blank region), recover,
//! decide about a corrupt tail, start the next incarnation, start the
//! writer.
//!
//! ```text
//!  read block 0 ── blank ──> format: header seq 1, epoch 1 (write + flush)
//!      │ valid (newest slot)
//!      v
//!  scan the ring (recovery.rs) ── Corrupt and not allowed ──> Err(Corrupt), nothing written
//!      │
//!      v
//!  header: epoch + 1, resume_lsn = next LSN (head moved to the resume point
//!  if nothing is live) ── write + flush ──> spawn the writer, register it as helper
//! ```
//!
//! Nothing is written before the decision, so a refused open leaves the
//! device exactly as it found it. All reads and writes are in the caller's
//! class.

use std::sync::Arc;

use super::header::{Found, Header, SLOTS, SLOT_BYTES};
use super::recovery::{scan, Recovery, Scan, Tail};
use super::ring::{Geometry, Ring};
use super::state::{HeaderState, Limits, Shared, State};
use super::{
    writer, Log, LogConfig, LogError, LogStats, Lsn, COMMIT_POINT, HEADER_POINT, LOG_BLOCK_MIN,
    SPACE_POINT, STATE_POINT, WRITER_IDLE_POINT, WRITER_THREAD_NAME,
};
use crate::block::{BlockError, BlockLayer};
use crate::context;
use crate::device::AlignedBuf;
use crate::error::ConfigError;
use crate::sync::SyncConfig;
use crate::sync::{Condvar, Mutex};

/// What is on the device, read without changing anything.
struct Loaded {
    geo: Geometry,
    image: Vec<u8>,
    /// `None`: a blank region.
    found: Option<(Header, Scan)>,
}

impl Log {
    /// Opens the log in `cfg`'s region of `block`'s device: formats a blank
    /// region, or recovers the log there, and starts the writer. Returns the
    /// log and what recovery found. Replay `records`, then checkpoint and
    /// [`Log::truncate`] them: the recovered ring may be full, and appends
    /// wait for space until something truncates.
    ///
    /// A torn tail is recovered silently (it was never acknowledged). A
    /// corrupt one (a bad record followed by valid ones, see [`Tail`]) is
    /// refused with [`LogError::Corrupt`] and nothing on the device changes,
    /// unless `cfg.allow_corrupt_truncate` is set: then the records after
    /// the bad one are dropped and the returned tail says how many. Either
    /// way the caller should report it loudly.
    pub fn open(
        block: Arc<BlockLayer>,
        cfg: &LogConfig,
        sync: &SyncConfig,
    ) -> Result<(Log, Recovery), LogError> {
        let loaded = load(&block, cfg)?;
        let geo = loaded.geo;
        let (hdr, image, recovery, ring) = match loaded.found {
            None => format(&block, geo, cfg)?,
            Some((hdr, scan)) => {
                refuse_corrupt(&scan, cfg)?;
                reopen(&block, geo, hdr, loaded.image, scan)?
            }
        };
        let limits = Limits {
            record_max: cfg.record_bytes_max,
            batch_max: cfg.batch_bytes_max,
            pending_max: cfg.pending_bytes_max,
            committer_writes: cfg.committer_writes,
        };
        let state = State {
            next_lsn: recovery.next_lsn,
            durable_lsn: recovery.next_lsn - 1,
            pending: Default::default(),
            pending_bytes: 0,
            inflight: None,
            batches_taken: 0,
            ring,
            poison: None,
            closing: false,
            refused: None,
            writer_done: false,
            writer_idle: false,
            writer_needed: false,
            critical_lsn: 0,
            stats: LogStats::default(),
        };
        state.check_invariants();
        let metrics = block.metrics().clone();
        let shared = Arc::new(Shared {
            block,
            geo,
            limits,
            log_id: hdr.log_id,
            epoch: hdr.epoch,
            state: Mutex::with_options(state, sync.options_in(STATE_POINT, &metrics)),
            commit_cv: [0, 1]
                .map(|_| Condvar::with_options(sync.options_in(COMMIT_POINT, &metrics))),
            space_cv: Condvar::with_options(sync.options_in(SPACE_POINT, &metrics)),
            work_cv: Condvar::with_options(
                sync.options_in(WRITER_IDLE_POINT, &metrics)
                    .inherit(false)
                    .idle(),
            ),
            header: Mutex::with_options(
                HeaderState { header: hdr, image },
                sync.options_in(HEADER_POINT, &metrics),
            ),
        });
        let log = start_writer(shared)?;
        Ok((log, recovery))
    }

    /// Reads what [`Log::open`] would recover, without writing anything (no
    /// format, no new incarnation, no writer): for tools, and for a caller
    /// that wants to see a corrupt tail before deciding. A blank region is
    /// an empty, clean log with `formatted: false`.
    pub fn inspect(block: &BlockLayer, cfg: &LogConfig) -> Result<Recovery, LogError> {
        let loaded = load(block, cfg)?;
        Ok(match loaded.found {
            None => empty_recovery(false),
            Some((hdr, mut scan)) => recovery_of(&hdr, &mut scan).0,
        })
    }
}

/// The log's geometry on this device, or a config error naming the field.
fn geometry(block: &BlockLayer, cfg: &LogConfig) -> Result<Geometry, LogError> {
    let info = block.device().info();
    let device_block = u64::from(info.block_size);
    let log_block = device_block.max(LOG_BLOCK_MIN);
    if !log_block.is_power_of_two() {
        return Err(ConfigError::Invalid {
            field: "log.region_offset_bytes",
            value: cfg.region_offset_bytes.to_string(),
            allowed: format!(
                "{}: a block size of {device_block} bytes is not a power of two; \
                 the log needs one",
                info.name
            ),
        }
        .into());
    }
    cfg.validate_for_block(log_block)?;
    let end = cfg.region_offset_bytes.checked_add(cfg.region_bytes);
    if end.is_none_or(|end| end > info.capacity) {
        return Err(ConfigError::Invalid {
            field: "log.region_bytes",
            value: cfg.region_bytes.to_string(),
            allowed: format!(
                "the region from log.region_offset_bytes = {} must fit {} ({} bytes)",
                cfg.region_offset_bytes, info.name, info.capacity
            ),
        }
        .into());
    }
    Ok(Geometry::new(
        cfg.region_offset_bytes,
        cfg.region_bytes,
        log_block,
    ))
}

/// Reads the header and scans the ring; writes nothing.
fn load(block: &BlockLayer, cfg: &LogConfig) -> Result<Loaded, LogError> {
    let geo = geometry(block, cfg)?;
    let offset = geo.region_offset;
    let image = block
        .read(offset, geo.block as usize)
        .map_err(|source| io_error(format!("reading the header at offset {offset}"), source))?
        .as_slice()
        .to_vec();
    let hdr = match Header::read(&image) {
        Found::Blank => {
            return Ok(Loaded {
                geo,
                image,
                found: None,
            })
        }
        Found::Valid(h) => h,
        Found::Invalid(reason) => return Err(LogError::BadHeader { offset, reason }),
    };
    check_header(&hdr, geo, cfg)?;
    let base = geo.region_offset + geo.block;
    let mut read = |at: u64, len: usize| -> Result<Vec<u8>, BlockError> {
        Ok(block.read(base + at, len)?.as_slice().to_vec())
    };
    let scan = scan(geo, &hdr, &mut read)
        .map_err(|source| io_error("reading the log to recover it".into(), source))?;
    Ok(Loaded {
        geo,
        image,
        found: Some((hdr, scan)),
    })
}

/// The header must describe this region and be internally consistent
/// (the scan relies on it).
fn check_header(h: &Header, geo: Geometry, cfg: &LogConfig) -> Result<(), LogError> {
    let offset = geo.region_offset;
    let mismatch = |what, on_disk, configured| LogError::Mismatch {
        offset,
        what,
        on_disk,
        configured,
    };
    if u64::from(h.block_bytes) != geo.block {
        return Err(mismatch(
            "the log block size",
            h.block_bytes.into(),
            geo.block,
        ));
    }
    if h.region_bytes != cfg.region_bytes {
        return Err(mismatch(
            "log.region_bytes",
            h.region_bytes,
            cfg.region_bytes,
        ));
    }
    let consistent = h.head_pos < geo.data_len
        && h.head_pos % super::RECORD_ALIGN == 0
        && h.head_pos_lsn >= 1
        && h.head_pos_lsn <= h.head_lsn
        && h.epoch >= 1
        && h.resume_lsn >= 1;
    match consistent {
        true => Ok(()),
        false => Err(LogError::BadHeader {
            offset,
            reason: format!("inconsistent fields: {h:?}"),
        }),
    }
}

fn io_error(what: String, source: BlockError) -> LogError {
    LogError::Io { what, source }
}

fn refuse_corrupt(scan: &Scan, cfg: &LogConfig) -> Result<(), LogError> {
    match scan.tail {
        Tail::Corrupt {
            offset,
            lsn,
            later_records,
        } if !cfg.allow_corrupt_truncate => Err(LogError::Corrupt {
            offset,
            lsn,
            later_records,
            recovered: scan.records.len() as u64,
        }),
        _ => Ok(()),
    }
}

fn empty_recovery(formatted: bool) -> Recovery {
    Recovery {
        records: Vec::new(),
        tail: Tail::Clean,
        head_lsn: 1,
        next_lsn: 1,
        formatted,
    }
}

/// The recovery report of a scan (its records moved out), and where the
/// head is once the log resumes: `(v, its LSN)`. The head moves to the
/// resume point when nothing is live.
fn recovery_of(hdr: &Header, scan: &mut Scan) -> (Recovery, (u64, Lsn)) {
    let records = std::mem::take(&mut scan.records);
    let (head, head_lsn) = match records.is_empty() {
        false => ((scan.head_v, hdr.head_pos_lsn), hdr.head_lsn),
        true => ((scan.resume_v, scan.next_lsn), scan.next_lsn),
    };
    let recovery = Recovery {
        records,
        tail: scan.tail,
        head_lsn,
        next_lsn: scan.next_lsn,
        formatted: false,
    };
    (recovery, head)
}

type Opened = (Header, Vec<u8>, Recovery, Ring);

/// Formats a blank region: a new log id, header seq 1, epoch 1. On a
/// device whose blocks are allocated on their first write (a file), the
/// ring is written with zeros first: otherwise every commit of the first
/// lap would wait for the file system to allocate its block and commit
/// its journal (on this project's test machine, ext4 on a virtio disk:
/// about 700 commits a second instead of 6,500).
fn format(block: &BlockLayer, geo: Geometry, cfg: &LogConfig) -> Result<Opened, LogError> {
    if block.device().info().allocates_on_first_write {
        preallocate(block, geo)?;
    }
    let hdr = Header::fresh(rand::random(), geo.block as u32, cfg.region_bytes);
    let mut image = vec![0u8; geo.block as usize];
    hdr.write_into(&mut image);
    write_durably(block, geo, &image, "formatting the log")?;
    let ring = Ring::new(geo, (1, 0), 1, 0, &[]);
    Ok((hdr, image, empty_recovery(true), ring))
}

/// Starts the next incarnation after a scan: epoch + 1, resuming after the
/// last valid record.
fn reopen(
    block: &BlockLayer,
    geo: Geometry,
    hdr: Header,
    mut image: Vec<u8>,
    mut scan: Scan,
) -> Result<Opened, LogError> {
    let (recovery, (head_v, head_pos_lsn)) = recovery_of(&hdr, &mut scan);
    let next = Header {
        seq: hdr.seq + 1,
        epoch: hdr.epoch + 1,
        resume_lsn: recovery.next_lsn,
        head_pos: geo.phys(head_v),
        head_pos_lsn,
        head_lsn: recovery.head_lsn,
        ..hdr
    };
    // Header slots are rewritten whole; the rest of the block stays.
    debug_assert!(image.len() >= SLOT_BYTES * SLOTS);
    next.write_into(&mut image);
    write_durably(
        block,
        geo,
        &image,
        "writing the header of the new incarnation",
    )?;
    let ring = Ring::new(
        geo,
        (head_pos_lsn, head_v),
        recovery.head_lsn,
        scan.resume_v,
        &scan.marks,
    );
    Ok((next, image, recovery, ring))
}

/// Writes zeros over the ring, in large writes, and flushes.
fn preallocate(block: &BlockLayer, geo: Geometry) -> Result<(), LogError> {
    let start = geo.region_offset + geo.block;
    block.write_zeros(start, geo.data_len).map_err(|source| {
        io_error(
            format!(
                "preallocating the log's ring ({} bytes from offset {start})",
                geo.data_len
            ),
            source,
        )
    })?;
    block
        .flush()
        .map_err(|source| io_error("flushing the preallocated log".into(), source))
}

fn write_durably(
    block: &BlockLayer,
    geo: Geometry,
    image: &[u8],
    what: &str,
) -> Result<(), LogError> {
    let offset = geo.region_offset;
    block
        .write(offset, AlignedBuf::from_slice(image))
        .and_then(|()| block.flush())
        .map_err(|source| io_error(format!("{what} (offset {offset})"), source))
}

/// Spawns the writer and registers it as the helper of the commit and
/// space condvars.
fn start_writer(shared: Arc<Shared>) -> Result<Log, LogError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let runner = shared.clone();
    let writer = std::thread::Builder::new()
        .name(WRITER_THREAD_NAME.into())
        .spawn(move || {
            // The receiver waits for this; it only goes away on a panic.
            let _ = tx.send(context::current());
            writer::run(runner);
        })
        .map_err(|source| LogError::Spawn { source })?;
    let writer_task = rx.recv().expect("the log writer reports its task");
    for cv in &shared.commit_cv {
        cv.register_helper(writer_task.clone());
    }
    shared.space_cv.register_helper(writer_task.clone());
    Ok(Log {
        shared,
        writer: Some(writer),
        writer_task,
    })
}
