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
//! already queued. There is no read-ahead cache, no track skew and no
//! zoning. The full stroke spans the device's capacity, so a small
//! simulated device behaves like a short-stroked disk: same timings, fewer
//! tracks.
//!
//! Calibration (defaults, 7200 rpm, random 4 KiB reads over the whole
//! device, measured by the tests in virtual time): about 115 IOPS at queue
//! depth 1 and well over twice that at 32, where SPTF finds a near command.
//! Pure SPTF leaves far commands waiting while near ones keep arriving: the
//! long tail paper 001 measured, bounded here by the firmware's `max_age_ns`
//! (see [`Firmware`]).

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::front::{Cmd, FlushKind, Frontend, Mechanism};
use super::model::{Completed, DriveModel, Firmware, Request};
use crate::time::{Nanos, US};

/// The timings of a simulated HDD.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HddParams {
    /// Spindle speed. Default: 7200 (8.33 ms per revolution).
    pub rpm: u32,
    /// Seek to a neighbouring track (settle included). Default: 500 µs.
    pub seek_min_ns: Nanos,
    /// Seek across the whole device. Default: 8 ms.
    pub seek_full_ns: Nanos,
    /// Media transfer rate. Default: 160 MB/s.
    pub transfer_bytes_per_sec: u64,
    /// Commands the drive holds (NCQ tags). Default: 32.
    pub queue_depth: u32,
}

impl Default for HddParams {
    fn default() -> Self {
        Self {
            rpm: 7200,
            seek_min_ns: 500 * US,
            seek_full_ns: 8000 * US,
            transfer_bytes_per_sec: 160_000_000,
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
        if self.transfer_bytes_per_sec < 1_000_000 {
            return Err(format!(
                "hdd.transfer_bytes_per_sec = {} must be at least 1000000",
                self.transfer_bytes_per_sec
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
}

/// A queued command with its place on the platter.
#[derive(Clone, Copy, Debug)]
struct Slot {
    cmd: Cmd,
    track: u64,
    angle_ns: Nanos,
}

/// Actuator, platter and the firmware's queue.
#[derive(Debug)]
struct Heads {
    geo: Geometry,
    fw: Firmware,
    /// The platter's angle at time 0.
    phase_ns: Nanos,
    head_track: u64,
    queue: Vec<Slot>,
    busy: Option<(Cmd, Nanos)>,
}

impl Heads {
    /// Seek plus rotational wait from where the head is at `now`.
    fn positioning_ns(&self, s: &Slot, now: Nanos) -> Nanos {
        let seek = self.geo.seek_ns(self.head_track, s.track);
        let rev = self.geo.rev_ns;
        let platter = (now + seek + self.phase_ns) % rev;
        seek + (s.angle_ns + rev - platter) % rev
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
            let cost = self.positioning_ns(s, now);
            if best.is_none_or(|b| (cost, s.cmd.ticket) < (b.0, b.1)) {
                best = Some((cost, s.cmd.ticket, i));
            }
        }
        overdue.or(best).expect("pick from an empty queue").2
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
        let service = self.positioning_ns(&s, now) + self.geo.transfer_ns(s.cmd.req.len);
        self.head_track = self.geo.track(s.cmd.req.offset + s.cmd.req.len - 1);
        self.busy = Some((s.cmd, now + service));
    }

    fn next_event(&self) -> Option<Nanos> {
        self.busy.map(|(_, done)| done)
    }

    fn step(&mut self, finished: &mut Vec<Cmd>) {
        let (cmd, _) = self.busy.take().expect("step without an event");
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
