//! The HDD model: one actuator, a spinning platter, a command queue and
//! firmware that serves the command with the shortest positioning time
//! first (SPTF).
//!
//! ```text
//!            track = offset / track_bytes            angle = offset % track_bytes
//!   head ──seek(|Δtrack|)──> target track ──wait for the sector──> transfer(len)
//!
//!   seek(d)  = 0                                            if d == 0
//!            = seek_min + (seek_full - seek_min) * sqrt(d / max_d)   otherwise
//!   wait     = (target angle - platter angle after the seek) mod one revolution
//!   transfer = len / transfer rate
//! ```
//!
//! A track holds what passes under the head in one revolution
//! (`transfer rate x revolution time`, about 1.3 MB at the defaults), so a
//! command that starts where the previous one ended waits for no rotation:
//! sequential streams run at the transfer rate when the next command is
//! already queued. There is no track skew and no zoning, and writes take
//! their mechanical time (the volatile write cache is the driver's crash
//! bookkeeping, not a timing). The full stroke spans the device's capacity,
//! so a small simulated device behaves like a short-stroked disk: same
//! timings, fewer tracks.
//!
//! Seek defaults: 1.0 ms to a neighbouring track and 16 ms across the whole
//! disk. The square-root curve then averages `1 + 15 x 8/15` = 9.0 ms over
//! uniformly random pairs, between the 8.5 ms read and 9.5 ms write average
//! seeks that Hitachi's Deskstar 7K1000.C specification gives for its
//! two-disk 7200 rpm model; the 1.0 ms single-track seek is the Hitachi
//! 7K320 specification's (whose full stroke, a 2.5-inch disk's, is 20 ms).
//!
//! Read-ahead: after a read the head stays on the track and goes on reading
//! the following sectors into a segment of the drive's buffer, until
//! `readahead_bytes` past the read's end or until the firmware sends it
//! elsewhere. The drive keeps the last `readahead_segments` segments (each
//! what was read plus what was read ahead, at most `readahead_bytes`
//! before the end). A read wholly inside a segment is a hit: it moves no
//! head and costs only its transfer over the interface. A read that starts
//! inside the segment being read ahead waits only until the head reaches
//! its end. A write invalidates the segments it overlaps.
//!
//! ```text
//!   read [a, b) done at t ──> head streams b.. from t ──> segment [a, b + ahead)
//!   next read [b, c):  c <= ahead read so far  -> hit, interface time only
//!                      else                    -> done when the head passes c
//!   write [x, y) overlapping a segment          -> the segment is dropped
//! ```
//!
//! Calibration (defaults, 7200 rpm, random 4 KiB reads over the whole
//! device, measured by the tests in virtual time): about 77 IOPS at queue
//! depth 1 and well over twice that at 32, where SPTF finds a near command.
//! Pure SPTF leaves far commands waiting while near ones keep arriving: the
//! long tail paper 001 measured, bounded here by the firmware's `max_age_ns`
//! (see [`Firmware`]).

use std::collections::VecDeque;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::front::{Cmd, FlushKind, Frontend, Mechanism};
use super::model::{Completed, DriveModel, Firmware, Request};
use crate::device::Op;
use crate::time::{Nanos, US};

/// The timings of a simulated HDD.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HddParams {
    /// Spindle speed. Default: 7200 (8.33 ms per revolution).
    pub rpm: u32,
    /// Seek to a neighbouring track (settle included). Default: 1 ms
    /// (Hitachi 7K320 single-track seek, typical).
    pub seek_min_ns: Nanos,
    /// Seek across the whole device (full stroke). Default: 16 ms (see
    /// the module docs).
    pub seek_full_ns: Nanos,
    /// Media transfer rate. Default: 160 MB/s.
    pub transfer_bytes_per_sec: u64,
    /// Interface rate, for reads served from the buffer. Default: 300 MB/s
    /// (SATA 3 Gb/s).
    pub interface_bytes_per_sec: u64,
    /// How far the head reads ahead after a read, and a segment's size; 0
    /// turns read-ahead off. Default: 1 MiB.
    pub readahead_bytes: u64,
    /// Read-ahead segments the buffer keeps (the least recently filled
    /// goes first). Default: 4.
    pub readahead_segments: u32,
    /// Commands the drive holds (NCQ tags). Default: 32.
    pub queue_depth: u32,
}

impl Default for HddParams {
    fn default() -> Self {
        Self {
            rpm: 7200,
            seek_min_ns: 1000 * US,
            seek_full_ns: 16_000 * US,
            transfer_bytes_per_sec: 160_000_000,
            interface_bytes_per_sec: 300_000_000,
            readahead_bytes: 1 << 20,
            readahead_segments: 4,
            queue_depth: 32,
        }
    }
}

impl HddParams {
    /// Checks the fields; the error names the bad one and what is allowed.
    pub fn validate(&self) -> Result<(), String> {
        if !(1000..=30_000).contains(&self.rpm) {
            return Err(format!(
                "hdd.rpm = {} must be within 1000..=30000",
                self.rpm
            ));
        }
        if self.seek_min_ns == 0 || self.seek_min_ns > self.seek_full_ns {
            return Err(format!(
                "hdd.seek_min_ns = {} must be positive and at most seek_full_ns = {}",
                self.seek_min_ns, self.seek_full_ns
            ));
        }
        for (field, rate) in [
            ("transfer_bytes_per_sec", self.transfer_bytes_per_sec),
            ("interface_bytes_per_sec", self.interface_bytes_per_sec),
        ] {
            if rate < 1_000_000 {
                return Err(format!("hdd.{field} = {rate} must be at least 1000000"));
            }
        }
        if self.readahead_bytes > 64 << 20 {
            return Err(format!(
                "hdd.readahead_bytes = {} must be at most 64 MiB",
                self.readahead_bytes
            ));
        }
        if self.readahead_segments > 64 {
            return Err(format!(
                "hdd.readahead_segments = {} must be at most 64",
                self.readahead_segments
            ));
        }
        if !(1..=256).contains(&self.queue_depth) {
            return Err(format!(
                "hdd.queue_depth = {} must be within 1..=256",
                self.queue_depth
            ));
        }
        Ok(())
    }
}

/// Where things are on the platter, in integer nanoseconds and tracks.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    rev_ns: Nanos,
    track_bytes: u64,
    max_distance: u64,
    seek_min_ns: Nanos,
    seek_span_ns: f64,
    transfer_bytes_per_sec: u64,
    interface_bytes_per_sec: u64,
}

impl Geometry {
    fn new(capacity: u64, p: &HddParams) -> Self {
        let rev_ns = 60_000_000_000 / u64::from(p.rpm);
        let track_bytes =
            (u128::from(p.transfer_bytes_per_sec) * u128::from(rev_ns) / 1_000_000_000) as u64;
        assert!(track_bytes >= 512, "a track must hold a sector");
        let tracks = capacity.div_ceil(track_bytes).max(2);
        Self {
            rev_ns,
            track_bytes,
            max_distance: tracks - 1,
            seek_min_ns: p.seek_min_ns,
            seek_span_ns: (p.seek_full_ns - p.seek_min_ns) as f64,
            transfer_bytes_per_sec: p.transfer_bytes_per_sec,
            interface_bytes_per_sec: p.interface_bytes_per_sec,
        }
    }

    fn track(&self, offset: u64) -> u64 {
        offset / self.track_bytes
    }

    /// The sector's angle, as the time into a revolution it passes the head.
    fn angle_ns(&self, offset: u64) -> Nanos {
        let within = u128::from(offset % self.track_bytes);
        (within * u128::from(self.rev_ns) / u128::from(self.track_bytes)) as Nanos
    }

    fn seek_ns(&self, from: u64, to: u64) -> Nanos {
        let d = from.abs_diff(to);
        if d == 0 {
            return 0;
        }
        let frac = (d as f64 / self.max_distance as f64).min(1.0);
        self.seek_min_ns + (self.seek_span_ns * frac.sqrt()) as Nanos
    }

    fn transfer_ns(&self, len: u64) -> Nanos {
        (u128::from(len) * 1_000_000_000 / u128::from(self.transfer_bytes_per_sec)) as Nanos
    }

    fn interface_ns(&self, len: u64) -> Nanos {
        let ns = u128::from(len) * 1_000_000_000 / u128::from(self.interface_bytes_per_sec);
        (ns as Nanos).max(1)
    }
}

/// A queued command with its place on the platter.
#[derive(Clone, Copy, Debug)]
struct Slot {
    cmd: Cmd,
    track: u64,
    angle_ns: Nanos,
}

/// A range of sectors held in the drive's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Segment {
    start: u64,
    end: u64,
}

impl Segment {
    fn holds(&self, offset: u64, end: u64) -> bool {
        self.start <= offset && end <= self.end
    }

    fn overlaps(&self, offset: u64, end: u64) -> bool {
        offset < self.end && self.start < end
    }
}

/// The head reading ahead: from stream position `from` at `since`, until
/// `limit` or until the firmware sends it elsewhere.
#[derive(Clone, Copy, Debug)]
struct Ahead {
    /// Where the segment being filled starts.
    start: u64,
    from: u64,
    since: Nanos,
    limit: u64,
}

/// How a command is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// From a segment: no head movement.
    Hit,
    /// By the head already reading ahead over it.
    Stream,
    /// Seek, rotation, transfer.
    Mechanical,
}

/// A command's plan: how, the wait before its data moves (what SPTF
/// compares) and the whole service time.
#[derive(Clone, Copy, Debug)]
struct Plan {
    kind: Kind,
    positioning_ns: Nanos,
    service_ns: Nanos,
}

/// Actuator, platter, read-ahead buffer and the firmware's queue.
#[derive(Debug)]
struct Heads {
    geo: Geometry,
    fw: Firmware,
    p: HddParams,
    /// The platter's angle at time 0.
    phase_ns: Nanos,
    head_track: u64,
    queue: Vec<Slot>,
    busy: Option<(Cmd, Nanos)>,
    busy_kind: Kind,
    /// Filled read-ahead segments, the most recent last.
    segments: VecDeque<Segment>,
    ahead: Option<Ahead>,
    hits: u64,
}

impl Heads {
    /// Seek plus rotational wait from where the head is at `now`.
    fn positioning_ns(&self, s: &Slot, now: Nanos) -> Nanos {
        let seek = self.geo.seek_ns(self.head_track, s.track);
        let rev = self.geo.rev_ns;
        let platter = (now + seek + self.phase_ns) % rev;
        seek + (s.angle_ns + rev - platter) % rev
    }

    /// How far the head has read ahead by `now`.
    fn filled(a: &Ahead, geo: &Geometry, now: Nanos) -> u64 {
        let read = u128::from(now.saturating_sub(a.since)) * u128::from(geo.transfer_bytes_per_sec)
            / 1_000_000_000;
        a.from + read.min(u128::from(a.limit - a.from)) as u64
    }

    /// When the head reaches stream position `pos` (at least `from`).
    fn reach(a: &Ahead, geo: &Geometry, pos: u64) -> Nanos {
        a.since + geo.transfer_ns(pos.saturating_sub(a.from))
    }

    /// Whether the head is still reading ahead at `now`.
    fn streaming(a: &Ahead, geo: &Geometry, now: Nanos) -> bool {
        now < Self::reach(a, geo, a.limit)
    }

    /// A read hit the segment being read ahead, up to `end`: the drive
    /// reads on to keep `readahead_bytes` ahead of the reader, resuming
    /// (after the rotation to where it stopped) if it had stopped.
    fn extend_ahead(&mut self, end: u64, now: Nanos) {
        let ra = self.p.readahead_bytes;
        let Some(a) = self.ahead.as_mut() else {
            return;
        };
        let limit = end + ra;
        if limit <= a.limit {
            return;
        }
        a.start = a.start.max(end.saturating_sub(ra));
        if Self::streaming(a, &self.geo, now) {
            a.limit = limit;
            return;
        }
        let rev = self.geo.rev_ns;
        let platter = (now + self.phase_ns) % rev;
        let wait = (self.geo.angle_ns(a.limit) + rev - platter) % rev;
        *a = Ahead {
            start: a.start,
            from: a.limit,
            since: now + wait,
            limit,
        };
    }

    /// The segment being read ahead, as filled at `now`.
    fn ahead_segment(&self, now: Nanos) -> Option<Segment> {
        self.ahead.map(|a| Segment {
            start: a.start,
            end: Self::filled(&a, &self.geo, now),
        })
    }

    fn plan(&self, s: &Slot, now: Nanos) -> Plan {
        let (offset, len) = (s.cmd.req.offset, s.cmd.req.len);
        let end = offset + len;
        if s.cmd.req.op == Op::Read {
            let held = self
                .segments
                .iter()
                .chain(self.ahead_segment(now).iter())
                .any(|g| g.holds(offset, end));
            if held {
                return Plan {
                    kind: Kind::Hit,
                    positioning_ns: 0,
                    service_ns: self.geo.interface_ns(len),
                };
            }
            let streaming = self.ahead.filter(|a| {
                a.start <= offset && offset <= a.limit && Self::streaming(a, &self.geo, now)
            });
            if let Some(a) = streaming {
                let reach = |pos: u64| Self::reach(&a, &self.geo, pos).max(now);
                return Plan {
                    kind: Kind::Stream,
                    positioning_ns: reach(offset) - now,
                    service_ns: reach(end) - now,
                };
            }
        }
        let positioning_ns = self.positioning_ns(s, now);
        Plan {
            kind: Kind::Mechanical,
            positioning_ns,
            service_ns: positioning_ns + self.geo.transfer_ns(len),
        }
    }

    /// The firmware's choice: the most overdue command if any is past its
    /// age limit, else SPTF (among high-priority commands only, when the
    /// firmware is priority-aware and one is queued). Ties go to the
    /// earlier submission.
    fn pick(&self, now: Nanos) -> usize {
        let any_high = self.queue.iter().any(|s| s.cmd.req.high_priority);
        let high_only = self.fw.high_only(any_high);
        let mut overdue: Option<(Nanos, u64, usize)> = None;
        let mut best: Option<(Nanos, u64, usize)> = None;
        for (i, s) in self.queue.iter().enumerate() {
            let high = s.cmd.req.high_priority;
            let deadline = self.fw.deadline(s.cmd.entered, high);
            if deadline <= now && overdue.is_none_or(|o| (deadline, s.cmd.ticket) < (o.0, o.1)) {
                overdue = Some((deadline, s.cmd.ticket, i));
            }
            if overdue.is_some() || (high_only && !high) {
                continue;
            }
            let cost = self.plan(s, now).positioning_ns;
            if best.is_none_or(|b| (cost, s.cmd.ticket) < (b.0, b.1)) {
                best = Some((cost, s.cmd.ticket, i));
            }
        }
        overdue.or(best).expect("pick from an empty queue").2
    }

    /// The head leaves to serve a command elsewhere at `now`: what it read
    /// ahead becomes a segment.
    fn stop_ahead(&mut self, now: Nanos) {
        let Some(seg) = self.ahead_segment(now) else {
            return;
        };
        self.ahead = None;
        self.head_track = self.geo.track(seg.end.max(1) - 1);
        if seg.end > seg.start {
            self.segments.push_back(seg);
        }
        while self.segments.len() > self.p.readahead_segments as usize {
            self.segments.pop_front();
        }
    }
}

impl Mechanism for Heads {
    fn enter(&mut self, cmd: Cmd) {
        assert!(
            cmd.req.offset.checked_add(cmd.req.len).is_some(),
            "a command past u64"
        );
        self.queue.push(Slot {
            cmd,
            track: self.geo.track(cmd.req.offset),
            angle_ns: self.geo.angle_ns(cmd.req.offset),
        });
    }

    fn dispatch(&mut self, now: Nanos) {
        if self.busy.is_some() || self.queue.is_empty() {
            return;
        }
        let i = self.pick(now);
        let s = self.queue.swap_remove(i);
        let plan = self.plan(&s, now);
        let (offset, end) = (s.cmd.req.offset, s.cmd.req.offset + s.cmd.req.len);
        match plan.kind {
            Kind::Hit => {
                self.hits += 1;
                if self
                    .ahead_segment(now)
                    .is_some_and(|g| g.holds(offset, end))
                {
                    self.extend_ahead(end, now);
                }
            }
            Kind::Stream => {}
            Kind::Mechanical => {
                self.stop_ahead(now);
                self.head_track = self.geo.track(end - 1);
            }
        }
        if s.cmd.req.op == Op::Write {
            self.segments.retain(|g| !g.overlaps(offset, end));
        }
        self.busy = Some((s.cmd, now + plan.service_ns));
        self.busy_kind = plan.kind;
    }

    fn next_event(&self) -> Option<Nanos> {
        self.busy.map(|(_, done)| done)
    }

    fn step(&mut self, finished: &mut Vec<Cmd>) {
        let (cmd, at) = self.busy.take().expect("step without an event");
        let (offset, end) = (cmd.req.offset, cmd.req.offset + cmd.req.len);
        let ahead = self.p.readahead_bytes;
        if cmd.req.op == Op::Read && ahead > 0 && self.p.readahead_segments > 0 {
            match (self.busy_kind, self.ahead) {
                // The head read on through the command: it keeps streaming.
                (Kind::Stream, Some(a)) => {
                    self.ahead = Some(Ahead {
                        start: a.start.max(end.saturating_sub(ahead)),
                        from: end,
                        since: at,
                        limit: end + ahead,
                    })
                }
                (Kind::Mechanical, _) => {
                    self.ahead = Some(Ahead {
                        start: offset.max(end.saturating_sub(ahead)),
                        from: end,
                        since: at,
                        limit: end + ahead,
                    })
                }
                _ => {}
            }
        }
        finished.push(cmd);
    }
}

/// A simulated HDD: [`HddParams`] timings, NCQ of `queue_depth`, SPTF
/// firmware (optionally priority-aware).
#[derive(Debug)]
pub struct HddModel {
    front: Frontend,
    heads: Heads,
}

impl HddModel {
    /// A drive of `capacity` bytes; `seed` sets the platter's phase and the
    /// head's starting track. Panics on invalid parameters (see
    /// [`HddParams::validate`]).
    pub fn new(capacity: u64, params: HddParams, firmware: Firmware, seed: u64) -> Self {
        if let Err(e) = params.validate().and_then(|()| firmware.validate()) {
            panic!("invalid HDD model parameters: {e}");
        }
        assert!(capacity > 0, "an HDD of zero bytes");
        let geo = Geometry::new(capacity, &params);
        let mut rng = SmallRng::seed_from_u64(seed);
        Self {
            // A SATA drive: FLUSH CACHE is not queued, the queue drains first.
            front: Frontend::new(params.queue_depth, FlushKind::Barrier),
            heads: Heads {
                geo,
                fw: firmware,
                p: params,
                segments: VecDeque::new(),
                ahead: None,
                hits: 0,
                busy_kind: Kind::Mechanical,
                phase_ns: rng.gen_range(0..geo.rev_ns),
                head_track: rng.gen_range(0..=geo.max_distance),
                queue: Vec::with_capacity(params.queue_depth as usize),
                busy: None,
            },
        }
    }

    /// Time for one revolution.
    pub fn revolution_ns(&self) -> Nanos {
        self.heads.geo.rev_ns
    }

    /// Seek time between the tracks holding two offsets.
    pub fn seek_ns(&self, from: u64, to: u64) -> Nanos {
        let g = &self.heads.geo;
        g.seek_ns(g.track(from), g.track(to))
    }

    /// Reads served from the read-ahead buffer so far.
    pub fn readahead_hits(&self) -> u64 {
        self.heads.hits
    }
}

impl DriveModel for HddModel {
    fn submit(&mut self, req: Request, now: Nanos) {
        self.front.submit(&mut self.heads, req, now);
    }

    fn next_event(&self) -> Option<Nanos> {
        self.front.next_event(&self.heads)
    }

    fn pop_completed(&mut self, now: Nanos, out: &mut Vec<Completed>) {
        self.front.pop_completed(&mut self.heads, now, out);
    }

    fn outstanding(&self) -> usize {
        self.front.outstanding()
    }

    fn queue_depth(&self) -> u32 {
        self.front.depth()
    }
}
