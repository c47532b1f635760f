//! The metadata log's writer: records appended by any thread are written in
//! batches (group commit), one batch in flight at a time, each to fresh
//! sectors of the current epoch's half; compaction when the half is full.
//!
//! ```text
//!  md_append(records, done) ──> pending ──(no batch in flight)──> batch: pending records up to
//!        ^                                                         64 KiB, at sector `next` of the half
//!        │                                                              │ cache device write
//!        └── batch completes: `done` of each entry; next batch <───────┘
//!
//!  the batch would pass the end of the half ──> compaction (no batch in flight; records wait):
//!     snapshot (map record per writing/mapped slot, except those being freed: their free
//!     records may be in the half being dropped) -> other half, epoch + 1; flush;
//!     header(epoch + 1) -> header slot (epoch + 1) % 2; flush; next = snapshot's sectors
//! ```
//!
//! Every step is a completion callback; nothing here blocks a thread. A
//! failed batch write or compaction poisons the write cache: the waiting
//! records fail, and so does every later write.

use std::collections::VecDeque;
use std::sync::mpsc;
use std::sync::Arc;

use super::config::BATCH_BYTES_MAX;
use super::error::{dup, NvwcError};
use super::record::{encode_records, Header, Record, RECORD_BYTES};
use super::stats::add;
use super::Shared;
use crate::class::Class;
use crate::device::{Command, DeviceError, Op};

/// Called when an entry's records are written (or not).
pub(super) type MdDone = Box<dyn FnOnce(Result<(), DeviceError>) + Send>;

/// The most records one batch write carries.
const BATCH_RECORDS_MAX: usize = BATCH_BYTES_MAX as usize / RECORD_BYTES;

struct MdEntry {
    records: Vec<Record>,
    class: Class,
    done: MdDone,
}

/// The writer's state (its own lock; never held while taking another).
pub(super) struct MdState {
    /// The live epoch: records go to half `epoch % 2`.
    epoch: u64,
    /// The next unwritten sector of the live half.
    next: u64,
    pending: VecDeque<MdEntry>,
    writing: bool,
    compacting: bool,
}

impl MdState {
    /// The state after opening: `epoch` live, its half written up to `next`.
    pub(super) fn new(epoch: u64, next: u64) -> MdState {
        MdState {
            epoch,
            next,
            pending: VecDeque::new(),
            writing: false,
            compacting: false,
        }
    }
}

/// What to do after the state changed.
enum Next {
    Idle,
    Write {
        offset: u64,
        epoch: u64,
        entries: Vec<MdEntry>,
    },
    Compact,
    Fail(Vec<MdEntry>),
}

impl Shared {
    /// Appends `records` (of one command) to the log; `done` runs when the
    /// batch holding them is written.
    pub(super) fn md_append(self: &Arc<Self>, records: Vec<Record>, class: Class, done: MdDone) {
        assert!(!records.is_empty(), "an empty metadata entry");
        assert!(
            records.len() <= BATCH_RECORDS_MAX,
            "an entry larger than a batch"
        );
        let next = {
            let mut md = self.md.lock();
            md.pending.push_back(MdEntry {
                records,
                class,
                done,
            });
            self.md_next(&mut md)
        };
        self.md_act(next);
    }

    /// [`Shared::md_append`], waiting for it (writeback thread only).
    pub(super) fn md_append_wait(
        self: &Arc<Self>,
        records: Vec<Record>,
        class: Class,
    ) -> Result<(), DeviceError> {
        let (tx, rx) = mpsc::sync_channel(1);
        let done = move |r| {
            let _ = tx.send(r);
        };
        self.md_append(records, class, Box::new(done));
        rx.recv().expect("a metadata completion is never dropped")
    }

    fn md_next(&self, md: &mut MdState) -> Next {
        if md.writing || md.compacting || md.pending.is_empty() {
            return Next::Idle;
        }
        if self.is_poisoned() {
            return Next::Fail(md.pending.drain(..).collect());
        }
        let (mut records, mut take) = (0, 0);
        for e in &md.pending {
            if take > 0 && records + e.records.len() > BATCH_RECORDS_MAX {
                break;
            }
            records += e.records.len();
            take += 1;
        }
        let sectors = self.layout.sectors_for(records);
        if md.next + sectors > self.layout.half_sectors() {
            md.compacting = true;
            return Next::Compact;
        }
        let offset = self.layout.half_offset(md.epoch) + md.next * self.layout.sector as u64;
        md.next += sectors;
        md.writing = true;
        Next::Write {
            offset,
            epoch: md.epoch,
            entries: md.pending.drain(..take).collect(),
        }
    }

    fn md_act(self: &Arc<Self>, next: Next) {
        match next {
            Next::Idle => {}
            Next::Write {
                offset,
                epoch,
                entries,
            } => self.md_write(offset, epoch, entries),
            Next::Compact => self.compact(),
            Next::Fail(entries) => {
                let what = self.poison.lock().clone().unwrap_or_default();
                for e in entries {
                    let err = NvwcError::Poisoned { what: what.clone() };
                    (e.done)(Err(err.into_device(&self.info.name, Op::Write, 0)));
                }
            }
        }
    }

    fn md_write(self: &Arc<Self>, offset: u64, epoch: u64, entries: Vec<MdEntry>) {
        let records: Vec<Record> = entries
            .iter()
            .flat_map(|e| e.records.iter().copied())
            .collect();
        let class = entries
            .iter()
            .map(|e| e.class)
            .min()
            .expect("a batch has entries");
        let buf = encode_records(&records, epoch, self.layout.sector);
        add(&self.counters.metadata_writes, 1);
        let me = self.clone();
        let done = move |c: crate::device::Completion| me.md_written(entries, c.result);
        self.cache
            .submit(Command::write(offset, buf, class), Box::new(done));
    }

    fn md_written(self: &Arc<Self>, entries: Vec<MdEntry>, result: Result<(), DeviceError>) {
        if result.is_err() {
            self.poison("a metadata log write");
        }
        let next = {
            let mut md = self.md.lock();
            md.writing = false;
            self.md_next(&mut md)
        };
        for e in entries {
            (e.done)(result.as_ref().map(|_| ()).map_err(dup));
        }
        self.md_act(next);
    }

    /// Rewrites the live mapping as the next epoch's log (see the module
    /// docs); records wait until it is done.
    fn compact(self: &Arc<Self>) {
        let (records, dead) = self.state.lock().core.snapshot();
        let epoch = self.md.lock().epoch + 1;
        let l = &self.layout;
        let sectors = l.sectors_for(records.len());
        assert!(
            sectors + l.sectors_for(BATCH_RECORDS_MAX) <= l.half_sectors(),
            "a compaction leaves room for a batch (validated)"
        );
        let mut steps = VecDeque::new();
        if !records.is_empty() {
            let buf = encode_records(&records, epoch, l.sector);
            steps.push_back(Command::write(l.half_offset(epoch), buf, Class::Critical));
        }
        steps.push_back(Command::flush(Class::Critical));
        let header = Header {
            epoch,
            geometry: l.geometry(),
        };
        let buf = header.encode(l.sector);
        steps.push_back(Command::write(l.header_offset(epoch), buf, Class::Critical));
        steps.push_back(Command::flush(Class::Critical));
        let me = self.clone();
        self.run_steps(
            steps,
            Box::new(move |r| me.compacted(epoch, sectors, &dead, r)),
        );
    }

    fn compacted(
        self: &Arc<Self>,
        epoch: u64,
        sectors: u64,
        dead: &[u32],
        r: Result<(), DeviceError>,
    ) {
        add(&self.counters.compactions, 1);
        match &r {
            Ok(()) => self.state.lock().core.compacted(dead),
            Err(_) => self.poison("a metadata log compaction"),
        }
        let next = {
            let mut md = self.md.lock();
            md.compacting = false;
            if r.is_ok() {
                md.epoch = epoch;
                md.next = sectors;
            }
            self.md_next(&mut md)
        };
        self.md_act(next);
        if r.is_ok() && !dead.is_empty() {
            self.admit_stalled();
        }
    }

    /// Runs cache device commands one after another; `then` gets the first
    /// error or `Ok` after the last.
    fn run_steps(self: &Arc<Self>, mut steps: VecDeque<Command>, then: MdDone) {
        let Some(cmd) = steps.pop_front() else {
            return then(Ok(()));
        };
        let me = self.clone();
        let done = move |c: crate::device::Completion| match c.result {
            Ok(()) => me.run_steps(steps, then),
            Err(e) => then(Err(e)),
        };
        self.cache.submit(cmd, Box::new(done));
    }
}
