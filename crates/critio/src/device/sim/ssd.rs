//! The SSD model: a DRAM write buffer in front of flash dies on parallel
//! channels, with program, read and erase times from a real NAND datasheet
//! and garbage collection derived from them.
//!
//! ```text
//!  write ──(room in the buffer? else wait)──> host link ──> ack (in DRAM, volatile)
//!                                                            │ appended to the drain stream
//!                                                            v
//!            stream: [programmed ... | units queued on dies | partial unit ]
//!                     durable         unit k -> die k % dies   padded by a flush
//!  read  ──all its pages in the buffer?──> served from DRAM over the link
//!        └─else split by page──> die (page % dies) queue ──tR per page──>
//!  die:  one operation at a time: read tR | program tPROG (one multi-plane page)
//!        after every `pages_per_block` programs: GC stall
//!          = valid x (tR + tPROG) + tBERS,   valid ~ uniform 0..=gc_valid_max_pct of a block
//!  flush ──> completes when every write acknowledged before it is programmed
//! ```
//!
//! The flash is Micron's MT29F16G08MAAWP family (MT29F16G08MAAWP,
//! MT29F32G08QAAWP, MT29F64G08TAAWP; 34 nm-class MLC, ONFI 1.0), from its
//! data sheet's feature list: page 4,096 + 218 bytes, 128 pages per block,
//! 2,048 blocks per plane, two-plane commands, random READ (tR) 50 µs,
//! PROGRAM PAGE (tPROG) 900 µs typical, BLOCK ERASE (tBERS) 3.5 ms typical.
//! Eight channels of four dies, each programming both planes at once (8 KiB
//! per tPROG), sustain `32 x 8 KiB / 900 µs` = 291 MB/s of writes before
//! garbage collection, a consumer drive of that flash's generation.
//!
//! What a request gets:
//!
//! | request | completes                                                         |
//! |---------|-------------------------------------------------------------------|
//! | write   | once its data crossed the host link into the buffer (2 µs for 4 KiB); if the buffer is full it first waits for room, which drains at flash speed |
//! | read    | from the buffer (link time) if every page it touches is buffered; else when its pages were read on their dies, behind what each die is doing |
//! | flush   | once every write acknowledged before it is programmed (the buffer is volatile: no power-loss protection); the last partial page is padded and programmed |
//!
//! The drain stream is log-structured: acknowledged data is programmed in
//! acknowledgement order, in units of one multi-plane page, striped over the
//! dies, whatever the addresses (a page-mapped FTL). A write is durable once
//! every unit up to its end is programmed.
//!
//! Each die serves its queue one operation at a time. Reads go before queued
//! program units (the writes are already acknowledged), unless writes wait
//! for room in the buffer: then the die serves reads and programs in the
//! order they were queued, so a read waits behind the drain queued before
//! it. A die never suspends a
//! program, an erase or a collection for a read. With priority-aware
//! firmware, high-priority reads and the program units that a high-priority
//! flush waits for go before everything else, and a high-priority write
//! waiting for room gets it before low-priority ones (and promotes the
//! drain it waits for, like a flush). Either way any
//! operation queued past its age limit goes first (see [`Firmware`]).
//!
//! Garbage collection: after every block's worth of programs on a die
//! (`pages_per_block` multi-plane pages), the die copies the valid pages of
//! a victim block (a seeded draw) and erases it, as one stall. The copies do
//! not use up the next block; the drive is assumed to keep enough free
//! blocks. Not modelled: the channel bus (ONFI transfer of a page), the
//! controller's per-command overhead, SLC caching, read disturb.

use std::collections::{BTreeMap, HashMap, VecDeque};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::front::{Cmd, FlushKind, Frontend, Mechanism};
use super::model::{Completed, DriveModel, Firmware, Request};
use crate::device::Op;
use crate::time::{Nanos, US};

/// The timings and geometry of a simulated SSD. The flash figures default
/// to Micron's MT29F16G08MAAWP MLC NAND data sheet (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SsdParams {
    /// Independent flash channels. Default: 8.
    pub channels: u32,
    /// Dies on each channel, each working independently. Default: 4 (the
    /// quad-die MT29F64G08TAAWP package).
    pub dies_per_channel: u32,
    /// Planes a die programs at once (two-plane commands). Default: 2.
    pub planes_per_die: u32,
    /// Flash page data size; reads are split into pages. Default: 4096
    /// (data sheet: 4,096 + 218 spare bytes).
    pub page_bytes: u64,
    /// Pages per erase block. Default: 128 (data sheet).
    pub pages_per_block: u32,
    /// Time to read one page, tR. Default: 50 µs (data sheet).
    pub read_ns: Nanos,
    /// Time to program one (multi-plane) page, tPROG. Default: 900 µs
    /// (data sheet, typical).
    pub program_ns: Nanos,
    /// Time to erase one block, tBERS. Default: 3.5 ms (data sheet,
    /// typical).
    pub erase_ns: Nanos,
    /// Garbage collection after each block's worth of programs on a die.
    /// Default: true.
    pub gc: bool,
    /// The valid pages a collected block still holds are drawn uniformly
    /// from 0 to this percentage of the block (mean half of it: a write
    /// amplification of about 1.33 at the default, a drive with free space
    /// and TRIM). Not a data-sheet figure. Default: 50.
    pub gc_valid_max_pct: u32,
    /// The DRAM write buffer. Default: 8 MiB.
    pub buffer_bytes: u64,
    /// Host link rate, for data into and out of the buffer. Default:
    /// 2 GB/s (PCIe 3.0 x2).
    pub host_bytes_per_sec: u64,
    /// Commands the drive holds at once. Default: 64.
    pub queue_depth: u32,
}

impl Default for SsdParams {
    fn default() -> Self {
        Self {
            channels: 8,
            dies_per_channel: 4,
            planes_per_die: 2,
            page_bytes: 4096,
            pages_per_block: 128,
            read_ns: 50 * US,
            program_ns: 900 * US,
            erase_ns: 3500 * US,
            gc: true,
            gc_valid_max_pct: 50,
            buffer_bytes: 8 << 20,
            host_bytes_per_sec: 2_000_000_000,
            queue_depth: 64,
        }
    }
}

impl SsdParams {
    /// Checks the fields; the error names the bad one and what is allowed.
    pub fn validate(&self) -> Result<(), String> {
        let ranges = [
            ("channels", self.channels, 1..=64),
            ("dies_per_channel", self.dies_per_channel, 1..=16),
            ("planes_per_die", self.planes_per_die, 1..=4),
            ("pages_per_block", self.pages_per_block, 1..=4096),
            ("gc_valid_max_pct", self.gc_valid_max_pct, 0..=90),
            ("queue_depth", self.queue_depth, 1..=1024),
        ];
        for (field, v, range) in ranges {
            if !range.contains(&v) {
                return Err(format!(
                    "ssd.{field} = {v} must be within {}..={}",
                    range.start(),
                    range.end()
                ));
            }
        }
        if self.page_bytes < 512 || !self.page_bytes.is_power_of_two() {
            return Err(format!(
                "ssd.page_bytes = {} must be a power of two >= 512",
                self.page_bytes
            ));
        }
        if self.read_ns == 0 || self.program_ns == 0 || self.erase_ns == 0 {
            return Err("ssd.read_ns, program_ns and erase_ns must be positive".into());
        }
        let unit = self.unit_bytes();
        if self.buffer_bytes < 2 * unit || self.buffer_bytes > 1 << 30 {
            return Err(format!(
                "ssd.buffer_bytes = {} must be within {}..=1 GiB (two multi-plane pages)",
                self.buffer_bytes,
                2 * unit
            ));
        }
        if self.host_bytes_per_sec < 1_000_000 {
            return Err(format!(
                "ssd.host_bytes_per_sec = {} must be at least 1000000",
                self.host_bytes_per_sec
            ));
        }
        Ok(())
    }

    /// Bytes one program operation writes: a page on every plane.
    pub fn unit_bytes(&self) -> u64 {
        self.page_bytes * u64::from(self.planes_per_die)
    }

    /// All dies of the drive.
    pub fn dies(&self) -> u32 {
        self.channels * self.dies_per_channel
    }

    /// How long a die stalls to collect a block holding `valid` valid
    /// (multi-plane) pages: copy each (read, program), then erase.
    pub fn gc_stall_ns(&self, valid: u32) -> Nanos {
        u64::from(valid) * (self.read_ns + self.program_ns) + self.erase_ns
    }

    /// Time to move `len` bytes over the host link (at least 1 ns).
    fn link_ns(&self, len: u64) -> Nanos {
        let ns = u128::from(len) * 1_000_000_000 / u128::from(self.host_bytes_per_sec);
        (ns as Nanos).max(1)
    }
}

/// What a die does for one queued operation.
#[derive(Clone, Copy, Debug)]
enum Work {
    /// `pages` pages of the read in `slot`.
    Read { slot: usize, pages: u64 },
    /// Program unit `unit` of the drain stream.
    Program { unit: u64 },
}

#[derive(Clone, Copy, Debug)]
struct DieOp {
    work: Work,
    /// A high-priority read (programs are promoted by flushes instead).
    high: bool,
    entered: Nanos,
    seq: u64,
}

#[derive(Clone, Copy, Debug)]
enum State {
    Idle,
    Busy { op: DieOp, until: Nanos },
    Collecting { until: Nanos },
}

#[derive(Debug)]
struct Die {
    queue: Vec<DieOp>,
    state: State,
    /// Units programmed on this die (a collection after every block).
    programs: u64,
}

impl Die {
    fn event(&self) -> Option<Nanos> {
        match self.state {
            State::Idle => None,
            State::Busy { until, .. } | State::Collecting { until } => Some(until),
        }
    }
}

/// A buffered write: where it is and where it ends in the drain stream.
#[derive(Clone, Copy, Debug)]
struct Buffered {
    offset: u64,
    len: u64,
    end: u64,
}

/// The DRAM write buffer and its drain stream (positions in bytes).
#[derive(Debug, Default)]
struct Buffer {
    /// Bytes held: on the link or acknowledged, not yet programmed.
    used: u64,
    /// When the host link is next free for a write's data.
    link_free: Nanos,
    /// Writes crossing the link: (ack time, command), times increasing.
    transfers: VecDeque<(Nanos, Cmd)>,
    /// Writes waiting for room, in arrival order.
    waiting: Vec<Cmd>,
    /// The stream position after the last acknowledged byte (and padding).
    acked: u64,
    /// Units are formed up to here (a multiple of the unit size).
    formed: u64,
    /// Formed units not yet programmed: unit -> data bytes in it.
    units: BTreeMap<u64, u64>,
    /// Acknowledged writes not yet durable, in acknowledgement order.
    writes: VecDeque<Buffered>,
    /// Host pages wholly written by a buffered write: how many such writes.
    pages: HashMap<u64, u32>,
    /// Units before this position serve a high-priority flush or a
    /// high-priority write waiting for room.
    high_flush: u64,
}

/// The dies, the buffer and the commands in flight.
#[derive(Debug)]
struct Flash {
    p: SsdParams,
    fw: Firmware,
    rng: SmallRng,
    dies: Vec<Die>,
    buf: Buffer,
    /// Reads in the drive and how many die parts each has left.
    slots: Vec<Option<(Cmd, u64)>>,
    free: Vec<usize>,
    /// Reads served from the buffer: (done at, seq) -> command.
    hits: BTreeMap<(Nanos, u64), Cmd>,
    next_seq: u64,
    stats: SsdStats,
}

/// What an [`SsdModel`] did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SsdStats {
    /// Garbage-collection stalls.
    pub gc_stalls: u64,
    /// Valid pages they copied.
    pub gc_valid_pages: u64,
    /// Their total length.
    pub gc_ns: Nanos,
    /// Program operations (multi-plane pages of host data or padding).
    pub programs: u64,
    /// Reads served from the write buffer.
    pub buffer_hits: u64,
    /// Writes that waited for room in the buffer.
    pub buffer_full_waits: u64,
}

impl Flash {
    fn seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    fn unit_bytes(&self) -> u64 {
        self.p.unit_bytes()
    }

    /// Everything before this stream position is on the flash.
    fn durable_pos(&self) -> u64 {
        let unit = self.unit_bytes();
        self.buf
            .units
            .first_key_value()
            .map_or(self.buf.formed, |(&k, _)| k * unit)
    }

    fn is_high(&self, op: &DieOp) -> bool {
        match op.work {
            Work::Read { .. } => op.high,
            Work::Program { unit } => unit * self.unit_bytes() < self.buf.high_flush,
        }
    }

    /// The die queue's choice: the most overdue operation, else (high
    /// only, with strict priority-aware firmware and one queued) reads
    /// before programs, or oldest first when writes wait for room.
    fn pick(&self, queue: &[DieOp], now: Nanos) -> usize {
        let any_high = queue.iter().any(|o| self.is_high(o));
        let high_only = self.fw.high_only(any_high);
        let drain_first = !self.buf.waiting.is_empty();
        let mut overdue: Option<(Nanos, u64, usize)> = None;
        let mut best: Option<((bool, u64), usize)> = None;
        for (i, op) in queue.iter().enumerate() {
            let high = self.is_high(op);
            let deadline = self.fw.deadline(op.entered, high);
            if deadline <= now && overdue.is_none_or(|o| (deadline, op.seq) < (o.0, o.1)) {
                overdue = Some((deadline, op.seq, i));
            }
            if overdue.is_some() || (high_only && !high) {
                continue;
            }
            let program = matches!(op.work, Work::Program { .. });
            let key = (program && !drain_first, op.seq);
            if best.is_none_or(|b| key < b.0) {
                best = Some((key, i));
            }
        }
        overdue
            .map(|o| o.2)
            .or(best.map(|b| b.1))
            .expect("pick from an empty queue")
    }

    /// The waiting write that gets room next: the most overdue, else the
    /// first high-priority one (priority-aware firmware), else the oldest.
    fn next_waiting(&self, now: Nanos) -> usize {
        let w = &self.buf.waiting;
        let overdue = w
            .iter()
            .enumerate()
            .filter(|(_, c)| self.fw.deadline(c.entered, c.req.high_priority) <= now)
            .min_by_key(|(_, c)| (self.fw.deadline(c.entered, c.req.high_priority), c.ticket));
        if let Some((i, _)) = overdue {
            return i;
        }
        match w.iter().position(|c| c.req.high_priority) {
            Some(i) if self.fw.high_only(true) => i,
            _ => 0,
        }
    }

    /// Gives waiting writes room and starts their transfer over the link.
    fn admit_writes(&mut self, now: Nanos) {
        while !self.buf.waiting.is_empty() {
            let i = self.next_waiting(now);
            let len = self.buf.waiting[i].req.len;
            let fits = self.buf.used + len <= self.p.buffer_bytes || self.buf.used == 0;
            if !fits {
                // A high-priority write waits for room: the drain that makes
                // it goes first, as for a high-priority flush.
                if self.buf.waiting[i].req.high_priority {
                    self.buf.high_flush = self.buf.high_flush.max(self.buf.formed);
                }
                break;
            }
            let cmd = self.buf.waiting.remove(i);
            if now > cmd.entered {
                self.stats.buffer_full_waits += 1;
            }
            self.buf.used += len;
            let start = self.buf.link_free.max(now);
            let done = start + self.p.link_ns(len);
            self.buf.link_free = done;
            self.buf.transfers.push_back((done, cmd));
        }
    }

    /// Queues unit number `unit` (holding `data` bytes) on its die.
    fn form_unit(&mut self, data: u64, now: Nanos) {
        let unit = self.unit_bytes();
        debug_assert_eq!(self.buf.formed % unit, 0, "units are aligned");
        let k = self.buf.formed / unit;
        self.buf.formed += unit;
        self.buf.units.insert(k, data);
        let seq = self.seq();
        let die = (k % u64::from(self.p.dies())) as usize;
        self.dies[die].queue.push(DieOp {
            work: Work::Program { unit: k },
            high: false,
            entered: now,
            seq,
        });
    }

    /// Forms the partial unit at the end of the stream, padding it.
    fn pad(&mut self, now: Nanos) {
        if self.buf.acked > self.buf.formed {
            let data = self.buf.acked - self.buf.formed;
            self.form_unit(data, now);
            self.buf.acked = self.buf.formed;
        }
    }

    /// A write's data is in the buffer: it joins the drain stream.
    fn acknowledge(&mut self, cmd: &Cmd, now: Nanos) {
        let (offset, len) = (cmd.req.offset, cmd.req.len);
        self.buf.acked += len;
        self.buf.writes.push_back(Buffered {
            offset,
            len,
            end: self.buf.acked,
        });
        for page in whole_pages(offset, len, self.p.page_bytes) {
            *self.buf.pages.entry(page).or_insert(0) += 1;
        }
        let unit = self.unit_bytes();
        while self.buf.acked - self.buf.formed >= unit {
            self.form_unit(unit, now);
        }
    }

    /// Unit `k` is on the flash: free its room, retire durable writes.
    fn programmed(&mut self, k: u64) {
        let data = self.buf.units.remove(&k).expect("a formed unit");
        self.buf.used -= data;
        self.stats.programs += 1;
        let durable = self.durable_pos();
        while let Some(w) = self.buf.writes.front().copied() {
            if w.end > durable {
                break;
            }
            self.buf.writes.pop_front();
            for page in whole_pages(w.offset, w.len, self.p.page_bytes) {
                let n = self.buf.pages.get_mut(&page).expect("a buffered page");
                *n -= 1;
                if *n == 0 {
                    self.buf.pages.remove(&page);
                }
            }
        }
    }

    /// Whether every page `offset..offset + len` touches is buffered.
    fn buffered(&self, offset: u64, len: u64) -> bool {
        let page = self.p.page_bytes;
        (offset / page..=(offset + len - 1) / page).all(|p| self.buf.pages.contains_key(&p))
    }

    /// The stall after a die's program, if it completed a block.
    fn gc_after(&mut self, die: usize) -> Option<Nanos> {
        let d = &mut self.dies[die];
        d.programs += 1;
        if !self.p.gc || d.programs % u64::from(self.p.pages_per_block) != 0 {
            return None;
        }
        let max = self.p.pages_per_block * self.p.gc_valid_max_pct / 100;
        let valid = self.rng.gen_range(0..=max);
        let ns = self.p.gc_stall_ns(valid);
        self.stats.gc_stalls += 1;
        self.stats.gc_valid_pages += u64::from(valid);
        self.stats.gc_ns += ns;
        Some(ns)
    }

    /// One read part finished: the command completes with its last part.
    fn finish_part(&mut self, slot: usize, finished: &mut Vec<Cmd>) {
        let entry = self.slots[slot].as_mut().expect("a part of a live read");
        assert!(entry.1 > 0, "a read with no parts left");
        entry.1 -= 1;
        if entry.1 == 0 {
            let (cmd, _) = self.slots[slot].take().expect("checked above");
            self.free.push(slot);
            finished.push(cmd);
        }
    }

    /// Splits a read over the dies its pages are on.
    fn enter_read(&mut self, cmd: Cmd) {
        let page = self.p.page_bytes;
        let first = cmd.req.offset / page;
        let n = (cmd.req.offset + cmd.req.len - 1) / page - first + 1;
        let dies = u64::from(self.p.dies());
        let parts = n.min(dies);
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        self.slots[slot] = Some((cmd, parts));
        for c in 0..parts {
            let seq = self.seq();
            let op = DieOp {
                work: Work::Read {
                    slot,
                    pages: (n - c).div_ceil(dies),
                },
                high: cmd.req.high_priority,
                entered: cmd.entered,
                seq,
            };
            self.dies[((first + c) % dies) as usize].queue.push(op);
        }
    }

    /// The earliest event: (time, source), sources in a fixed order for
    /// ties: 0 = link, 1 = buffer hit, 2 + d = die d.
    fn earliest(&self) -> Option<(Nanos, usize)> {
        let link = self.buf.transfers.front().map(|&(t, _)| (t, 0));
        let hit = self.hits.first_key_value().map(|(&(t, _), _)| (t, 1));
        let dies = self
            .dies
            .iter()
            .enumerate()
            .filter_map(|(d, die)| die.event().map(|t| (t, 2 + d)));
        link.into_iter().chain(hit).chain(dies).min()
    }

    #[cfg(debug_assertions)]
    fn check_invariants(&self) {
        let b = &self.buf;
        assert!(b.formed <= b.acked, "units past the acknowledged data");
        assert!(
            b.acked - b.formed < self.unit_bytes(),
            "a full unit unformed"
        );
        let queued: u64 = b.units.values().sum();
        let on_link: u64 = b.transfers.iter().map(|(_, c)| c.req.len).sum();
        let partial = b.acked - b.formed;
        assert_eq!(b.used, queued + on_link + partial, "buffer bytes leak");
    }
}

/// The host pages (of `page` bytes) that `offset..offset + len` covers
/// wholly.
fn whole_pages(offset: u64, len: u64, page: u64) -> std::ops::Range<u64> {
    offset.div_ceil(page)..(offset + len) / page
}

impl Mechanism for Flash {
    fn enter(&mut self, cmd: Cmd) {
        match cmd.req.op {
            Op::Write => self.buf.waiting.push(cmd),
            Op::Read if self.buffered(cmd.req.offset, cmd.req.len) => {
                self.stats.buffer_hits += 1;
                let seq = self.seq();
                let at = cmd.entered + self.p.link_ns(cmd.req.len);
                self.hits.insert((at, seq), cmd);
            }
            Op::Read => self.enter_read(cmd),
            Op::Flush => unreachable!("flushes take no slot"),
        }
    }

    fn dispatch(&mut self, now: Nanos) {
        self.admit_writes(now);
        // Writes wait for room that only the partial unit holds: pad it.
        let stuck = !self.buf.waiting.is_empty()
            && self.buf.units.is_empty()
            && self.buf.transfers.is_empty();
        if stuck {
            self.pad(now);
        }
        for d in 0..self.dies.len() {
            let die = &self.dies[d];
            if !matches!(die.state, State::Idle) || die.queue.is_empty() {
                continue;
            }
            let i = self.pick(&die.queue, now);
            let op = self.dies[d].queue.swap_remove(i);
            let ns = match op.work {
                Work::Read { pages, .. } => self.p.read_ns * pages,
                Work::Program { .. } => self.p.program_ns,
            };
            self.dies[d].state = State::Busy {
                op,
                until: now + ns,
            };
        }
        #[cfg(debug_assertions)]
        self.check_invariants();
    }

    fn next_event(&self) -> Option<Nanos> {
        self.earliest().map(|(t, _)| t)
    }

    fn step(&mut self, finished: &mut Vec<Cmd>) {
        let (at, source) = self.earliest().expect("step without an event");
        match source {
            0 => {
                let (_, cmd) = self.buf.transfers.pop_front().expect("a transfer");
                self.acknowledge(&cmd, at);
                finished.push(cmd);
            }
            1 => {
                let (_, cmd) = self.hits.pop_first().expect("a hit");
                finished.push(cmd);
            }
            s => {
                let d = s - 2;
                self.dies[d].state = match self.dies[d].state {
                    State::Busy { op, .. } => match op.work {
                        Work::Read { slot, .. } => {
                            self.finish_part(slot, finished);
                            State::Idle
                        }
                        Work::Program { unit } => {
                            self.programmed(unit);
                            match self.gc_after(d) {
                                Some(ns) => State::Collecting { until: at + ns },
                                None => State::Idle,
                            }
                        }
                    },
                    State::Collecting { .. } => State::Idle,
                    State::Idle => unreachable!("an idle die has no event"),
                };
            }
        }
    }

    fn flush_begin(&mut self, high: bool, now: Nanos) -> u64 {
        let target = self.buf.acked;
        // The last data may fill only part of a page: program it padded.
        self.pad(now);
        if high {
            self.buf.high_flush = self.buf.high_flush.max(target);
        }
        target
    }

    fn durable(&self) -> u64 {
        self.durable_pos()
    }
}

/// A simulated SSD: [`SsdParams`] flash and buffer, `queue_depth` commands
/// inside, per-die (optionally priority-aware) firmware.
#[derive(Debug)]
pub struct SsdModel {
    front: Frontend,
    flash: Flash,
}

impl SsdModel {
    /// A drive of `capacity` bytes; `seed` drives garbage collection.
    /// Panics on invalid parameters (see [`SsdParams::validate`]).
    pub fn new(capacity: u64, params: SsdParams, firmware: Firmware, seed: u64) -> Self {
        if let Err(e) = params.validate().and_then(|()| firmware.validate()) {
            panic!("invalid SSD model parameters: {e}");
        }
        assert!(capacity > 0, "an SSD of zero bytes");
        let dies = (0..params.dies())
            .map(|_| Die {
                queue: Vec::new(),
                state: State::Idle,
                programs: 0,
            })
            .collect();
        Self {
            // An NVMe drive with a volatile buffer: a flush covers the
            // writes completed before it, once they are on the flash.
            front: Frontend::new(params.queue_depth, FlushKind::Drain),
            flash: Flash {
                p: params,
                fw: firmware,
                rng: SmallRng::seed_from_u64(seed),
                dies,
                buf: Buffer::default(),
                slots: Vec::with_capacity(params.queue_depth as usize),
                free: Vec::new(),
                hits: BTreeMap::new(),
                next_seq: 0,
                stats: SsdStats::default(),
            },
        }
    }

    /// Garbage-collection stalls so far.
    pub fn gc_stalls(&self) -> u64 {
        self.flash.stats.gc_stalls
    }

    /// What the drive did so far.
    pub fn stats(&self) -> SsdStats {
        self.flash.stats
    }

    /// Bytes in the write buffer (on the link or not yet programmed).
    pub fn buffered_bytes(&self) -> u64 {
        self.flash.buf.used
    }
}

impl DriveModel for SsdModel {
    fn submit(&mut self, req: Request, now: Nanos) {
        self.front.submit(&mut self.flash, req, now);
    }

    fn next_event(&self) -> Option<Nanos> {
        self.front.next_event(&self.flash)
    }

    fn pop_completed(&mut self, now: Nanos, out: &mut Vec<Completed>) {
        self.front.pop_completed(&mut self.flash, now, out);
    }

    fn outstanding(&self) -> usize {
        self.front.outstanding()
    }

    fn queue_depth(&self) -> u32 {
        self.front.depth()
    }
}
