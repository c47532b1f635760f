//! Opening a write cache: find the live epoch, replay its records, check
//! each candidate's data, and start the next epoch from what survived.
//!
//! ```text
//!  header slots 0 and 1 ──> newest valid epoch e (both blank: format, e = 0)
//!  half e % 2 ──> every record valid in epoch e (holes and old epochs' leftovers are skipped)
//!  kill[block] = max seq of its free records
//!  map records, newest first: skip if seq <= kill[block], block resolved, or slot taken;
//!                             take if the slot's data matches the record's crc
//!  write epoch e + 1: the taken map records -> half (e + 1) % 2; flush; header; flush
//! ```
//!
//! Why the newest matching record is right: a slot is reused only after
//! what superseded its version (a newer version's record, or the free
//! record after writeback) is durable, and records are never dropped
//! before that either (compaction keeps every writing or mapped slot, and
//! drops a free record only with the map records it kills). So
//! a map record older than a block's newest durable one is either dead
//! (killed) or shadowed by it, and a newer one whose write did not reach
//! the media fails its data checksum and is skipped.

use std::collections::{BTreeSet, HashMap};

use serde::Serialize;

use super::core::Placed;
use super::error::NvwcError;
use super::io::submit_all;
use super::layout::Layout;
use super::record::{data_crc, decode_records, encode_records, Header, Record};
use crate::class::Class;
use crate::device::{submit_and_wait, AlignedBuf, Command, Device};

/// What opening found on the cache device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RecoveryReport {
    /// The header area was blank: the cache device was formatted.
    pub formatted: bool,
    /// The epoch the metadata log runs in now.
    pub epoch: u64,
    /// Valid records replayed.
    pub records: u64,
    /// Cached blocks recovered (written back later).
    pub blocks: u64,
    /// Map records skipped because the slot's data did not match (a write
    /// that did not reach the media before the crash).
    pub unverified: u64,
}

/// What [`open`] hands the driver.
pub(super) struct Opened {
    pub(super) epoch: u64,
    pub(super) next_sector: u64,
    pub(super) placed: Vec<Placed>,
    pub(super) next_seq: u64,
    pub(super) report: RecoveryReport,
}

fn read(cache: &dyn Device, offset: u64, len: usize, what: &str) -> Result<AlignedBuf, NvwcError> {
    let c = submit_and_wait(cache, Command::read(offset, len, Class::Critical));
    c.result.map_err(|source| NvwcError::Open {
        what: what.to_owned(),
        source,
    })?;
    Ok(c.buf)
}

fn run(cache: &dyn Device, cmd: Command, what: &str) -> Result<(), NvwcError> {
    submit_and_wait(cache, cmd)
        .result
        .map_err(|source| NvwcError::Open {
            what: what.to_owned(),
            source,
        })
}

/// Recovers the cache device's mapping and starts a new epoch.
pub(super) fn open(cache: &dyn Device, layout: &Layout) -> Result<Opened, NvwcError> {
    let header = read_header(cache, layout)?;
    let (old, records) = match header {
        None => (0, Vec::new()),
        Some(h) => (h.epoch, scan(cache, layout, h.epoch)?),
    };
    let crcs = slot_crcs(cache, layout, &candidate_slots(&records, layout))?;
    let (placed, unverified) = resolve(&records, &crcs, layout);
    let next_seq = records.iter().map(Record::seq).max().unwrap_or(0) + 1;
    let epoch = old + 1;
    let snapshot: Vec<Record> = placed.iter().map(super::write::map_record).collect();
    if !snapshot.is_empty() {
        let buf = encode_records(&snapshot, epoch, layout.sector);
        let cmd = Command::write(layout.half_offset(epoch), buf, Class::Critical);
        run(cache, cmd, "writing the recovered mapping")?;
    }
    run(
        cache,
        Command::flush(Class::Critical),
        "flushing the recovered mapping",
    )?;
    let buf = Header {
        epoch,
        geometry: layout.geometry(),
    }
    .encode(layout.sector);
    let cmd = Command::write(layout.header_offset(epoch), buf, Class::Critical);
    run(cache, cmd, "writing the header")?;
    run(
        cache,
        Command::flush(Class::Critical),
        "flushing the header",
    )?;
    let report = RecoveryReport {
        formatted: header.is_none(),
        epoch,
        records: records.len() as u64,
        blocks: placed.len() as u64,
        unverified,
    };
    Ok(Opened {
        epoch,
        next_sector: layout.sectors_for(snapshot.len()),
        placed,
        next_seq,
        report,
    })
}

/// The newest valid header; `None` if both slots are blank.
fn read_header(cache: &dyn Device, layout: &Layout) -> Result<Option<Header>, NvwcError> {
    let area = read(cache, 0, super::HEADER_BYTES as usize, "reading the header")?;
    let mut best: Option<Header> = None;
    let mut bad = None;
    for slot in 0..2u64 {
        let at = layout.header_offset(slot) as usize;
        match Header::decode(&area.as_slice()[at..at + layout.sector]) {
            Ok(Some(h)) if best.is_none_or(|b| h.epoch > b.epoch) => best = Some(h),
            Ok(_) => {}
            Err(reason) => bad = Some((at as u64, reason)),
        }
    }
    match (best, bad) {
        (None, Some((offset, reason))) => Err(NvwcError::NotACache {
            device: cache.info().name.clone(),
            offset,
            reason,
        }),
        (Some(h), _) if h.geometry != layout.geometry() => Err(NvwcError::Geometry {
            what: format!(
                "cache device {} holds a write cache of {:?}, not of {:?}",
                cache.info().name,
                h.geometry,
                layout.geometry()
            ),
            fix: "open it with the config (and backing device) it was created with, so its \
                  cached blocks are not lost, or zero its first 8 KiB to start empty"
                .into(),
        }),
        (best, _) => Ok(best),
    }
}

/// Every valid record of `epoch` in its half.
fn scan(cache: &dyn Device, layout: &Layout, epoch: u64) -> Result<Vec<Record>, NvwcError> {
    const CHUNK: u64 = 1 << 20;
    let mut records = Vec::new();
    let (start, end) = (
        layout.half_offset(epoch),
        layout.half_offset(epoch) + layout.half_bytes,
    );
    let mut at = start;
    while at < end {
        let len = CHUNK.min(end - at) as usize;
        let buf = read(cache, at, len, "scanning the metadata log")?;
        records.extend(decode_records(buf.as_slice(), epoch));
        at += len as u64;
    }
    Ok(records)
}

/// The slots some live-looking map record points to.
fn candidate_slots(records: &[Record], layout: &Layout) -> BTreeSet<u32> {
    let kill = kills(records);
    records
        .iter()
        .filter_map(|r| match *r {
            Record::Map {
                slot, block, seq, ..
            } if in_range(slot, block, layout) && kill.get(&block).is_none_or(|&k| seq > k) => {
                Some(slot)
            }
            _ => None,
        })
        .collect()
}

fn in_range(slot: u32, block: u64, layout: &Layout) -> bool {
    slot < layout.slots && block < layout.backing_blocks
}

fn kills(records: &[Record]) -> HashMap<u64, u64> {
    let mut kill: HashMap<u64, u64> = HashMap::new();
    for r in records {
        if let Record::Free { block, seq, .. } = *r {
            let k = kill.entry(block).or_insert(0);
            *k = (*k).max(seq);
        }
    }
    kill
}

/// The data checksum of each slot in `slots`, read in runs of up to 1 MiB.
fn slot_crcs(
    cache: &dyn Device,
    layout: &Layout,
    slots: &BTreeSet<u32>,
) -> Result<HashMap<u32, u32>, NvwcError> {
    let run_max = ((1u64 << 20) / layout.block_bytes).max(1) as u32;
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for &s in slots {
        match runs.last_mut() {
            Some((first, n)) if *first + *n == s && *n < run_max => *n += 1,
            _ => runs.push((s, 1)),
        }
    }
    let bb = layout.block_bytes as usize;
    let cmds = runs
        .iter()
        .map(|&(first, n)| {
            Command::read(layout.slot_offset(first), n as usize * bb, Class::Critical)
        })
        .collect();
    let bufs = submit_all(cache, cmds, 16).map_err(|source| NvwcError::Open {
        what: "reading cached blocks to check them".into(),
        source,
    })?;
    let mut crcs = HashMap::new();
    for (&(first, _), buf) in runs.iter().zip(&bufs) {
        for (k, data) in buf.as_slice().chunks_exact(bb).enumerate() {
            crcs.insert(first + k as u32, data_crc(data));
        }
    }
    Ok(crcs)
}

/// The recovered mapping: per block, the newest map record that is not
/// killed and whose slot holds matching data. Also counts the records
/// skipped for mismatching data.
pub(super) fn resolve(
    records: &[Record],
    crcs: &HashMap<u32, u32>,
    layout: &Layout,
) -> (Vec<Placed>, u64) {
    let kill = kills(records);
    let mut maps: Vec<Placed> = records
        .iter()
        .filter_map(|r| match *r {
            Record::Map {
                slot,
                block,
                seq,
                crc,
            } if in_range(slot, block, layout) => Some(Placed {
                slot,
                block,
                seq,
                crc,
            }),
            _ => None,
        })
        .filter(|p| kill.get(&p.block).is_none_or(|&k| p.seq > k))
        .collect();
    maps.sort_by(|a, b| b.seq.cmp(&a.seq).then(a.slot.cmp(&b.slot)));
    maps.dedup();
    let mut blocks = BTreeSet::new();
    let mut slots = BTreeSet::new();
    let mut placed = Vec::new();
    let mut unverified = 0;
    for p in maps {
        if blocks.contains(&p.block) || slots.contains(&p.slot) {
            continue;
        }
        if crcs.get(&p.slot) != Some(&p.crc) {
            unverified += 1;
            continue;
        }
        blocks.insert(p.block);
        slots.insert(p.slot);
        placed.push(p);
    }
    (placed, unverified)
}
