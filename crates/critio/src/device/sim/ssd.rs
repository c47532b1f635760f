//! The SSD model: flash channels working in parallel, each with its own
//! queue, and seeded garbage-collection stalls.
//!
//! ```text
//!   command ──split by page──> channel (page % channels) queues
//!                                 ch0 [p p p]  ──read_ns / program_ns per page──>
//!                                 ch1 [p]      ──...
//!                                 ...          a command completes when all its parts have
//!   after a program: with probability ~ pages / gc_one_in_pages the channel
//!   stalls for gc_stall_min_ns..=gc_stall_max_ns (garbage collection)
//! ```
//!
//! Pages are striped over channels (`page % channels`), so a large command
//! uses every channel and a 4 KiB one uses one. Each channel serves its
//! queue first-in first-out; with priority-aware firmware it serves
//! high-priority parts first and a low-priority part that has waited past
//! the aging limit before either (see [`Firmware`]). A flush behaves like an
//! NVMe Flush: it covers the writes completed before it, does not wait for
//! those in flight, and no destaging cost is modelled.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::front::{Cmd, FlushKind, Frontend, Mechanism};
use super::model::{Completed, DriveModel, Firmware, Request};
use crate::device::Op;
use crate::time::{Nanos, MS, US};

/// The timings of a simulated SSD.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SsdParams {
    /// Independent flash channels. Default: 8.
    pub channels: u32,
    /// Flash page size; commands are split into pages. Default: 4096.
    pub page_bytes: u64,
    /// Time to read one page. Default: 80 µs.
    pub read_ns: Nanos,
    /// Time to program one page. Default: 500 µs.
    pub program_ns: Nanos,
    /// On average one garbage-collection stall per this many programmed
    /// pages on a channel; 0 turns stalls off. Default: 1024.
    pub gc_one_in_pages: u32,
    /// Shortest stall. Default: 2 ms.
    pub gc_stall_min_ns: Nanos,
    /// Longest stall. Default: 8 ms.
    pub gc_stall_max_ns: Nanos,
    /// Commands the drive holds at once. Default: 64.
    pub queue_depth: u32,
}

impl Default for SsdParams {
    fn default() -> Self {
        Self {
            channels: 8,
            page_bytes: 4096,
            read_ns: 80 * US,
            program_ns: 500 * US,
            gc_one_in_pages: 1024,
            gc_stall_min_ns: 2 * MS,
            gc_stall_max_ns: 8 * MS,
            queue_depth: 64,
        }
    }
}

impl SsdParams {
    /// Checks the fields; the error names the bad one and what is allowed.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=256).contains(&self.channels) {
            return Err(format!(
                "ssd.channels = {} must be within 1..=256",
                self.channels
            ));
        }
        if self.page_bytes < 512 || !self.page_bytes.is_power_of_two() {
            return Err(format!(
                "ssd.page_bytes = {} must be a power of two >= 512",
                self.page_bytes
            ));
        }
        if self.read_ns == 0 || self.program_ns == 0 {
            return Err("ssd.read_ns and ssd.program_ns must be positive".into());
        }
        if self.gc_stall_min_ns > self.gc_stall_max_ns {
            return Err(format!(
                "ssd.gc_stall_min_ns = {} must not exceed gc_stall_max_ns = {}",
                self.gc_stall_min_ns, self.gc_stall_max_ns
            ));
        }
        if !(1..=1024).contains(&self.queue_depth) {
            return Err(format!(
                "ssd.queue_depth = {} must be within 1..=1024",
                self.queue_depth
            ));
        }
        Ok(())
    }
}

/// The pages of one command that fall on one channel.
#[derive(Clone, Copy, Debug)]
struct Part {
    slot: usize,
    pages: u64,
    write: bool,
    high: bool,
    entered: Nanos,
    ticket: u64,
}

#[derive(Clone, Copy, Debug)]
enum State {
    Idle,
    Busy { part: Part, until: Nanos },
    Collecting { until: Nanos },
}

#[derive(Debug)]
struct Channel {
    queue: Vec<Part>,
    state: State,
}

impl Channel {
    fn event(&self) -> Option<Nanos> {
        match self.state {
            State::Idle => None,
            State::Busy { until, .. } | State::Collecting { until } => Some(until),
        }
    }
}

/// The channels and the commands in flight on them.
#[derive(Debug)]
struct Flash {
    p: SsdParams,
    fw: Firmware,
    rng: SmallRng,
    channels: Vec<Channel>,
    /// Commands in the drive and how many parts each has left.
    slots: Vec<Option<(Cmd, u64)>>,
    free: Vec<usize>,
    gc_stalls: u64,
}

impl Flash {
    /// The channel queue's choice: the most overdue part, else the first
    /// high-priority part when only those are candidates, else the oldest.
    fn pick(&self, queue: &[Part], now: Nanos) -> usize {
        let mut overdue: Option<(Nanos, u64, usize)> = None;
        for (i, part) in queue.iter().enumerate() {
            let deadline = self.fw.deadline(part.entered, part.high);
            if deadline <= now && overdue.is_none_or(|o| (deadline, part.ticket) < (o.0, o.1)) {
                overdue = Some((deadline, part.ticket, i));
            }
        }
        if let Some(o) = overdue {
            return o.2;
        }
        let first_high = queue.iter().position(|p| p.high);
        match first_high {
            Some(i) if self.fw.high_only(true) => i,
            _ => 0, // first in, first out
        }
    }

    fn gc_after(&mut self, pages: u64) -> Option<Nanos> {
        if self.p.gc_one_in_pages == 0 {
            return None;
        }
        let none = (1.0 - 1.0 / f64::from(self.p.gc_one_in_pages)).powf(pages as f64);
        if !self.rng.gen_bool((1.0 - none).clamp(0.0, 1.0)) {
            return None;
        }
        self.gc_stalls += 1;
        Some(
            self.rng
                .gen_range(self.p.gc_stall_min_ns..=self.p.gc_stall_max_ns),
        )
    }

    /// One part finished: the command completes with its last part.
    fn finish_part(&mut self, part: Part, finished: &mut Vec<Cmd>) {
        let entry = self.slots[part.slot]
            .as_mut()
            .expect("a part of a live command");
        assert!(entry.1 > 0, "a command with no parts left");
        entry.1 -= 1;
        if entry.1 == 0 {
            let (cmd, _) = self.slots[part.slot].take().expect("checked above");
            self.free.push(part.slot);
            finished.push(cmd);
        }
    }
}

impl Mechanism for Flash {
    fn enter(&mut self, cmd: Cmd) {
        let page = self.p.page_bytes;
        let first = cmd.req.offset / page;
        let n = (cmd.req.offset + cmd.req.len - 1) / page - first + 1;
        let chans = u64::from(self.p.channels);
        let parts = n.min(chans);
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        self.slots[slot] = Some((cmd, parts));
        for c in 0..parts {
            let part = Part {
                slot,
                pages: (n - c).div_ceil(chans),
                write: cmd.req.op == Op::Write,
                high: cmd.req.high_priority,
                entered: cmd.entered,
                ticket: cmd.ticket,
            };
            self.channels[((first + c) % chans) as usize]
                .queue
                .push(part);
        }
    }

    fn dispatch(&mut self, now: Nanos) {
        for c in 0..self.channels.len() {
            let ch = &self.channels[c];
            if !matches!(ch.state, State::Idle) || ch.queue.is_empty() {
                continue;
            }
            let i = self.pick(&ch.queue, now);
            let part = self.channels[c].queue.remove(i);
            let per_page = if part.write {
                self.p.program_ns
            } else {
                self.p.read_ns
            };
            let until = now + per_page * part.pages;
            self.channels[c].state = State::Busy { part, until };
        }
    }

    fn next_event(&self) -> Option<Nanos> {
        self.channels.iter().filter_map(Channel::event).min()
    }

    fn step(&mut self, finished: &mut Vec<Cmd>) {
        let (c, at) = self
            .channels
            .iter()
            .enumerate()
            .filter_map(|(c, ch)| ch.event().map(|t| (c, t)))
            .min_by_key(|&(c, t)| (t, c))
            .expect("step without an event");
        match self.channels[c].state {
            State::Busy { part, .. } => {
                self.finish_part(part, finished);
                let stall = if part.write {
                    self.gc_after(part.pages)
                } else {
                    None
                };
                self.channels[c].state = match stall {
                    Some(ns) => State::Collecting { until: at + ns },
                    None => State::Idle,
                };
            }
            State::Collecting { .. } => self.channels[c].state = State::Idle,
            State::Idle => unreachable!("an idle channel has no event"),
        }
    }
}

/// A simulated SSD: [`SsdParams`] timings, `queue_depth` commands inside,
/// per-channel FIFO (optionally priority-aware) firmware.
#[derive(Debug)]
pub struct SsdModel {
    front: Frontend,
    flash: Flash,
}

impl SsdModel {
    /// A drive of `capacity` bytes; `seed` drives the garbage-collection
    /// stalls. Panics on invalid parameters (see [`SsdParams::validate`]).
    pub fn new(capacity: u64, params: SsdParams, firmware: Firmware, seed: u64) -> Self {
        if let Err(e) = params.validate().and_then(|()| firmware.validate()) {
            panic!("invalid SSD model parameters: {e}");
        }
        assert!(capacity > 0, "an SSD of zero bytes");
        let channels = (0..params.channels)
            .map(|_| Channel {
                queue: Vec::new(),
                state: State::Idle,
            })
            .collect();
        Self {
            // An NVMe drive: a flush covers the writes completed before it
            // and does not wait for those in flight.
            front: Frontend::new(params.queue_depth, FlushKind::CompletedOnly),
            flash: Flash {
                p: params,
                fw: firmware,
                rng: SmallRng::seed_from_u64(seed),
                channels,
                slots: Vec::with_capacity(params.queue_depth as usize),
                free: Vec::new(),
                gc_stalls: 0,
            },
        }
    }

    /// Garbage-collection stalls so far.
    pub fn gc_stalls(&self) -> u64 {
        self.flash.gc_stalls
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
