//! The cap on non-critical requests at the device, fixed or adaptive.
//!
//! A device reorders what it holds (NCQ, firmware, the kernel's own
//! scheduler), so every non-critical request at the device can delay a
//! critical one. Paper 000 caps them at one, which protects critical latency
//! but costs background throughput (its Figure 11). The `auto` cap finds the
//! largest cap the critical requests do not notice, and below a cap of one,
//! the highest background rate they do not notice:
//!
//! ```text
//!   critical device latency, background recent  ─┐  (mean of a window)
//!                                                 ├─ ratio <= target: rate *= 1.25, or once unpaced, cap += 1
//!   clean baseline (no background recently)      ─┘  ratio >  target: cap /= 2, or at cap 1, rate /= 2
//!   every probe_every (and at once with no baseline): hold background, let
//!       the device settle, and re-measure the baseline
//!   no critical traffic for idle_grace: cap grows to max, pacing ends (nobody
//!       to protect); when critical traffic returns, the cap restarts at 1
//!   the rate never falls below min_share (half) of background's own
//!       throughput: its bytes per second of the time pacing did not hold it
//!   one critical request >= stall_ratio (100) x the baseline and >= stall_min
//!       (20 ms), background recent: a stall. cap = 1 and rate /= 2 at once;
//!       no growth, and no letting go as idle, for stall_hold (1 s)
//! ```
//!
//! Why a rate: one background request at a time can still write hundreds of
//! MB/s, and a device with a write cache (a host-cached virtual disk, a
//! drive's DRAM) makes every flush wait for the background data written
//! before it, not only for what is in flight. On this project's test
//! machine, fio shows a QD 1 writer with fdatasync keeping its rate next to
//! a 200 MB/s background writer and losing 9x of it next to an unpaced
//! one. So a critical request counts as "clean" only when no background
//! request completed in the last `settle_ms` either, and the rate is halved
//! while clean latency cannot be kept. The rate never falls below
//! `min_rate_mib_s`, nor below `min_share` of the background's own
//! throughput (DESIGN §8: the background keeps at least half of what it
//! would write alone; on a host-cached disk that costs critical flushes
//! part of what pacing won, and is the price of progress). Its own
//! throughput is measured, not assumed: the bytes it writes per second
//! of the time pacing does not hold it, so a background always ready to
//! write, held most of the time, still shows its unpaced speed (at the
//! current cap). The block layer's starvation timer also sends a
//! background request every period whatever the pacing says: background
//! work always progresses. A probe alone holds it longer, and bounded: at
//! most `probe_max_ms` once per `probe_every_ms` (a probe ends as soon as
//! its clean samples arrive; a background write let through during it
//! would keep every sample unclean for `settle_ms`, longer than the
//! starvation period, so each probe would run to its limit).
//!
//! Pacing counts background writes only: a read leaves nothing in the
//! write cache, and the cap bounds it while it runs (a snapshot that reads
//! the store and writes a dump is paced on its dump, not twice).
//!
//! Decisions use a window's trimmed mean (its slowest sample dropped), not
//! single samples: a device's own tail (host caches, firmware) produces rare
//! slow critical requests with or without background, and cutting on each of
//! them would pin the cap at 1.
//!
//! Except a stall. On a volume capped in bandwidth (a cloud disk, a
//! cgroup's `io.max` or `blkio.throttle`), a background that uses up the
//! volume's budget makes the next critical request wait until the budget
//! refills: tens of ms, once, while every other critical request of the
//! window is fast. The trimmed mean drops that one sample, so the cap grew
//! and pacing stayed off while requests waited 80 ms at p99.9. A single
//! request of at least `stall_ratio` times the baseline and `stall_min_ms`
//! is far beyond a device's own tail (on this project's virtual disk, under
//! the background loop, its critical requests' p99.9 stays within 1-5 ms,
//! and a load sees a handful over 10 ms, rarely one over 20) and cuts at
//! once: cap 1, rate halved. The budget refills over a throttling period,
//! so growth waits `stall_hold_ms`: the windows of fast requests after a
//! stall (a dozen per 100 ms at this disk's commit rate) would otherwise
//! grow the rate 1.25-fold each, back past the volume's cap within the
//! period. A stall can also outlast
//! `idle_grace`, leaving no critical completion meanwhile, which must not
//! read as critical traffic gone.
//!
//! ```text
//! ```
//!
//! Sans-I/O: it sees latencies and times, never a clock.

use serde::{Deserialize, Serialize};

use crate::time::{Nanos, MS};

/// How many non-critical requests may be outstanding at the device.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NoncriticalCap {
    /// At most this many (0 means unlimited). Paper 000's default is 1.
    Fixed(u32),
    /// Adapted to the critical requests' measured device latency.
    Auto(AutoCapConfig),
}

impl Default for NoncriticalCap {
    fn default() -> Self {
        NoncriticalCap::Fixed(1)
    }
}

/// Settings of the adaptive cap.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AutoCapConfig {
    /// The largest cap. Default 32.
    pub max: u32,
    /// Critical device latency with background at the device may be this
    /// many times the clean baseline. Default 1.5.
    pub target_ratio: f64,
    /// Critical completions per decision. Default 16.
    pub window: u32,
    /// How often the clean baseline is re-measured, in ms. Default 1000.
    pub probe_every_ms: u64,
    /// How long a probe may hold background dispatch, in ms. Default 100.
    pub probe_max_ms: u64,
    /// No critical completion for this long lets the cap grow freely, in ms.
    /// Default 100.
    pub idle_grace_ms: u64,
    /// A critical request is clean only if no background request completed
    /// this long before it was dispatched, in ms (the device's write cache
    /// settles). Default 20.
    pub settle_ms: u64,
    /// The lowest background rate pacing may set, in MiB/s. Default 8.
    pub min_rate_mib_s: u64,
    /// Nor below this share of the background's own throughput: what it
    /// writes per second of the time pacing does not hold it (DESIGN §8:
    /// background keeps at least half of its own throughput). 0 turns
    /// this floor off. Default 0.5.
    pub min_share: f64,
    /// A single critical request this many times the clean baseline, and
    /// at least `stall_min_ms`, with background at the device or just
    /// before it, is a stall: the cap drops to 1 and the pacing rate
    /// halves at once, whatever the window's mean says (see the module
    /// docs). 0 turns this off. Default 100.
    pub stall_ratio: f64,
    /// The shortest stall, in ms: a device's own rare slow requests
    /// (a host's cache, a drive's firmware) stay below it. Default 20.
    pub stall_min_ms: u64,
    /// After a stall, neither the cap nor the rate grows for this long, in
    /// ms. Default 1000.
    pub stall_hold_ms: u64,
}

impl Default for AutoCapConfig {
    fn default() -> Self {
        Self {
            max: 32,
            target_ratio: 1.5,
            window: 16,
            probe_every_ms: 1000,
            probe_max_ms: 100,
            idle_grace_ms: 100,
            settle_ms: 20,
            min_rate_mib_s: 8,
            min_share: 0.5,
            stall_ratio: 100.0,
            stall_min_ms: 20,
            stall_hold_ms: 1000,
        }
    }
}

/// Clean samples a probe collects before it ends.
const PROBE_SAMPLES: u32 = 4;
/// Weight of a new clean sample in the baseline.
const CLEAN_ALPHA: f64 = 0.2;
/// The span over which one sample of the background's own throughput is
/// taken (shorter spans see single requests, not a rate).
const OWN_SPAN: Nanos = 200 * MS;
/// Weight of a new sample of the background's own throughput.
const OWN_ALPHA: f64 = 0.3;

/// The live state of a cap.
#[derive(Clone, Debug)]
pub(crate) enum CapState {
    Fixed(u32),
    Auto(Box<AutoCap>),
}

impl CapState {
    pub(crate) fn new(cap: NoncriticalCap) -> Self {
        match cap {
            NoncriticalCap::Fixed(n) => CapState::Fixed(n),
            NoncriticalCap::Auto(cfg) => CapState::Auto(Box::new(AutoCap::new(cfg))),
        }
    }

    /// How many non-critical requests may be at the device now (None =
    /// unlimited).
    pub(crate) fn limit(&self, now: Nanos) -> Option<u32> {
        match self {
            CapState::Fixed(0) => None,
            CapState::Fixed(n) => Some(*n),
            CapState::Auto(a) => Some(a.limit(now)),
        }
    }

    /// Whether a probe holds every non-critical request now.
    pub(crate) fn probing(&self, now: Nanos) -> bool {
        match self {
            CapState::Auto(a) => a.probe_until.is_some_and(|until| now < until),
            CapState::Fixed(_) => false,
        }
    }

    /// The current cap, for reporting (u32::MAX = unlimited).
    pub(crate) fn current(&self) -> u32 {
        match self {
            CapState::Fixed(0) => u32::MAX,
            CapState::Fixed(n) => *n,
            CapState::Auto(a) => a.cap,
        }
    }

    /// A critical request completed after `latency` at the device;
    /// `nc_alongside`: background requests at the device when it was
    /// dispatched, plus one if any was sent while it was there. True if
    /// it was a stall (see the module docs).
    pub(crate) fn on_critical_complete(
        &mut self,
        latency: Nanos,
        nc_alongside: u32,
        dispatched: Nanos,
        now: Nanos,
    ) -> bool {
        match self {
            CapState::Auto(a) => a.on_critical_complete(latency, nc_alongside, dispatched, now),
            CapState::Fixed(_) => false,
        }
    }

    /// A critical request completed whose device time was not measured
    /// (the block layer's fast path times only a sample on a fast device):
    /// no latency sample, but critical traffic is there all the same, so
    /// the cap is not idle. `now`: when it completed, or a later time if
    /// that is not known (the core learns of it late).
    pub(crate) fn on_critical_untimed(&mut self, now: Nanos) {
        if let CapState::Auto(a) = self {
            a.critical_seen(now);
        }
    }

    /// A critical write of `bytes` completed (the pacing floor follows the
    /// critical write rate).
    pub(crate) fn on_critical_written(&mut self, bytes: u64) {
        if let CapState::Auto(a) = self {
            a.crit_written += bytes;
        }
    }

    pub(crate) fn on_noncritical_complete(&mut self, bytes: u64, now: Nanos) {
        if let CapState::Auto(a) = self {
            a.on_noncritical_complete(bytes, now);
        }
    }

    /// Whether pacing lets a non-critical request of `bytes` go now.
    pub(crate) fn paced_ok(&mut self, bytes: u64, now: Nanos) -> bool {
        match self {
            CapState::Auto(a) => a.pace.ready_at(bytes, now) <= now,
            CapState::Fixed(_) => true,
        }
    }

    /// A non-critical request of `bytes` goes to the device.
    pub(crate) fn on_noncritical_dispatch(&mut self, bytes: u64, now: Nanos) {
        if let CapState::Auto(a) = self {
            a.pace.take(bytes, now);
            a.own.held(false, now);
        }
    }

    /// Whether pacing (not the cap, not a probe) is what holds the
    /// non-critical queue now: the time it does is left out of the
    /// background's own throughput.
    pub(crate) fn note_pace_hold(&mut self, held: bool, now: Nanos) {
        if let CapState::Auto(a) = self {
            a.own.held(held, now);
        }
    }

    /// The background's own throughput as last estimated, in bytes/s.
    pub(crate) fn own_rate(&self) -> Option<f64> {
        match self {
            CapState::Auto(a) => a.own.rate,
            CapState::Fixed(_) => None,
        }
    }

    /// When pacing lets a request of `bytes` go, if it holds it now.
    pub(crate) fn pace_deadline(&self, bytes: u64, now: Nanos) -> Option<Nanos> {
        match self {
            CapState::Auto(a) => Some(a.pace.ready_at(bytes, now)).filter(|&t| t > now),
            CapState::Fixed(_) => None,
        }
    }

    /// The background rate pacing allows, in bytes/s (None: unpaced).
    pub(crate) fn rate(&self) -> Option<f64> {
        match self {
            CapState::Auto(a) => a.pace.rate,
            CapState::Fixed(_) => None,
        }
    }

    /// The adaptive cap's view: (clean baseline, mean of the last decided
    /// window with background at the device), in ns.
    pub(crate) fn view(&self) -> (Option<f64>, Option<f64>) {
        match self {
            CapState::Auto(a) => (a.clean, a.last_mixed),
            CapState::Fixed(_) => (None, None),
        }
    }

    /// When a probe ends by timeout, if one is running.
    pub(crate) fn probe_deadline(&self) -> Option<Nanos> {
        match self {
            CapState::Auto(a) => a.probe_until,
            CapState::Fixed(_) => None,
        }
    }
}

/// A token bucket for non-critical bytes, unlimited while `rate` is None.
#[derive(Clone, Debug, Default)]
pub(crate) struct Pace {
    rate: Option<f64>,
    tokens: f64,
    at: Nanos,
}

/// The most bytes the bucket holds: 10 ms at the rate, at least 256 KiB
/// (so one large request always fits).
fn burst(rate: f64) -> f64 {
    (rate * 0.010).max(256.0 * 1024.0)
}

impl Pace {
    fn refill(&self, now: Nanos) -> f64 {
        match self.rate {
            None => f64::INFINITY,
            Some(r) => {
                let dt = now.saturating_sub(self.at) as f64 / 1e9;
                (self.tokens + r * dt).min(burst(r))
            }
        }
    }

    /// When a request of `bytes` may go (a request larger than the burst
    /// goes once the bucket is full).
    fn ready_at(&self, bytes: u64, now: Nanos) -> Nanos {
        let Some(r) = self.rate else { return now };
        if bytes == 0 {
            return now; // nothing to pace (a read), even with the bucket in debt
        }
        let need = (bytes as f64).min(burst(r));
        let have = self.refill(now);
        if have >= need {
            return now;
        }
        now + ((need - have) / r * 1e9).ceil() as Nanos
    }

    fn take(&mut self, bytes: u64, now: Nanos) {
        if self.rate.is_some() {
            self.tokens = self.refill(now) - bytes as f64;
            self.at = now;
        }
    }

    fn set(&mut self, rate: Option<f64>, now: Nanos) {
        self.tokens = match rate {
            Some(r) => self.refill(now).min(burst(r)).max(0.0),
            None => 0.0,
        };
        self.at = now;
        self.rate = rate;
    }
}

/// The background's own throughput: the bytes it writes per second of the
/// time pacing does not hold it. Held by pacing at a rate `r`, a
/// background that is always ready to write spends most of its time
/// held, so its bytes over the rest of the time are what it would write
/// unpaced (at the current cap); a background with little to write has
/// idle time in the rest, which makes the estimate lower, never higher.
#[derive(Clone, Debug, Default)]
struct OwnRate {
    /// Smoothed estimate, bytes/s (None until the first span ends).
    rate: Option<f64>,
    held_since: Option<Nanos>,
    span_start: Nanos,
    held_ns: Nanos,
    bytes: u64,
}

impl OwnRate {
    /// Pacing holds the background (`true`) or not, from `now` on.
    fn held(&mut self, held: bool, now: Nanos) {
        match (held, self.held_since) {
            (true, None) => self.held_since = Some(now),
            (false, Some(t)) => {
                self.held_ns += now.saturating_sub(t);
                self.held_since = None;
            }
            _ => {}
        }
    }

    /// `bytes` of background writes completed at `now`; ends the span (a
    /// sample) once it is `OWN_SPAN` long.
    fn completed(&mut self, bytes: u64, now: Nanos) {
        self.bytes += bytes;
        let span = now.saturating_sub(self.span_start);
        if span < OWN_SPAN {
            return;
        }
        if let Some(t) = self.held_since {
            self.held_ns += now.saturating_sub(t);
            self.held_since = Some(now);
        }
        // At least a millisecond free: a span held throughout says
        // nothing about the rate (one request, then tokens awaited).
        let free = span.saturating_sub(self.held_ns);
        if self.bytes > 0 && free >= MS {
            let sample = self.bytes as f64 / (free as f64 / 1e9);
            self.rate = Some(match self.rate {
                None => sample,
                Some(r) => r + OWN_ALPHA * (sample - r),
            });
        }
        self.span_start = now;
        self.held_ns = 0;
        self.bytes = 0;
    }
}

#[derive(Clone, Debug)]
pub(crate) struct AutoCap {
    cfg: AutoCapConfig,
    cap: u32,
    pace: Pace,
    own: OwnRate,
    /// Non-critical bytes completed since `nc_since` (the throughput the
    /// first pacing rate starts from), and critical bytes written.
    nc_bytes: u64,
    crit_written: u64,
    nc_since: Nanos,
    /// Twice the critical write rate of the last decision, in bytes/s: the
    /// pacing floor (see `min_rate`).
    crit_floor: f64,
    last_nc_complete: Option<Nanos>,
    clean: Option<f64>,
    mixed_sum: f64,
    mixed_n: u32,
    mixed_max: f64,
    last_mixed: Option<f64>,
    seen: u32,
    probe_until: Option<Nanos>,
    probe_clean: u32,
    last_probe: Nanos,
    last_critical: Option<Nanos>,
    /// When the last stall was seen.
    last_stall: Option<Nanos>,
}

impl AutoCap {
    fn new(cfg: AutoCapConfig) -> Self {
        assert!(cfg.max >= 1 && cfg.window >= 1 && cfg.target_ratio >= 1.0);
        Self {
            cfg,
            cap: 1,
            pace: Pace::default(),
            own: OwnRate::default(),
            nc_bytes: 0,
            crit_written: 0,
            nc_since: 0,
            crit_floor: 0.0,
            last_nc_complete: None,
            clean: None,
            mixed_sum: 0.0,
            mixed_n: 0,
            mixed_max: 0.0,
            last_mixed: None,
            seen: 0,
            probe_until: None,
            probe_clean: 0,
            last_probe: 0,
            last_critical: None,
            last_stall: None,
        }
    }

    fn limit(&self, now: Nanos) -> u32 {
        match self.probe_until {
            Some(until) if now < until => 0,
            _ => self.cap,
        }
    }

    fn target(&self) -> Option<f64> {
        self.clean.map(|c| c * self.cfg.target_ratio)
    }

    fn on_critical_complete(
        &mut self,
        latency: Nanos,
        nc_alongside: u32,
        dispatched: Nanos,
        now: Nanos,
    ) -> bool {
        self.critical_seen(now);
        let lat = latency as f64;
        let settled = self
            .last_nc_complete
            .is_none_or(|t| dispatched.saturating_sub(t) >= self.cfg.settle_ms * MS);
        if nc_alongside == 0 && settled {
            self.clean = Some(match self.clean {
                None => lat,
                Some(c) => c + CLEAN_ALPHA * (lat - c),
            });
            if self.probe_until.is_some() {
                self.probe_clean += 1;
                if self.probe_clean >= PROBE_SAMPLES {
                    self.probe_until = None;
                }
            }
        } else {
            if self.is_stall(lat) {
                self.stall(now);
                self.maybe_probe(now);
                return true;
            }
            self.mixed_sum += lat;
            self.mixed_n += 1;
            self.mixed_max = self.mixed_max.max(lat);
        }
        self.seen += 1;
        if self.seen >= self.cfg.window {
            self.decide(now);
        }
        self.maybe_probe(now);
        false
    }

    /// A critical latency `stall_ratio` times the clean baseline or more,
    /// and at least `stall_min_ms`.
    fn is_stall(&self, lat: f64) -> bool {
        self.cfg.stall_ratio > 0.0
            && lat >= (self.cfg.stall_min_ms * MS) as f64
            && self.clean.is_some_and(|c| lat >= c * self.cfg.stall_ratio)
    }

    /// A stall: cap 1 and half the rate now, no growth for a while. The
    /// window so far is dropped (it is decided).
    fn stall(&mut self, now: Nanos) {
        self.last_stall = Some(now);
        self.cap = 1;
        self.cut(now); // at a cap of one: halves the rate
        self.reset_window();
    }

    /// Within `stall_hold_ms` of the last stall.
    fn holding(&self, now: Nanos) -> bool {
        self.last_stall
            .is_some_and(|t| now.saturating_sub(t) < self.cfg.stall_hold_ms * MS)
    }

    /// A critical request completed at `now`, timed or not (times may
    /// come out of order: the latest counts).
    fn critical_seen(&mut self, now: Nanos) {
        if self.idle(now) {
            self.cap = 1; // critical traffic is back: start low again
            self.reset_window();
        }
        self.last_critical = Some(self.last_critical.map_or(now, |t| t.max(now)));
    }

    fn decide(&mut self, now: Nanos) {
        if let (Some(target), true) = (self.target(), self.mixed_n >= 2) {
            let mean = (self.mixed_sum - self.mixed_max) / f64::from(self.mixed_n - 1);
            self.last_mixed = Some(mean);
            if mean <= target {
                self.grow(now);
            } else {
                self.cut(now);
            }
        }
        self.reset_window();
    }

    /// Background throughput since the last decision, in bytes/s (and the
    /// floor updated from the critical write rate over the same time).
    fn nc_throughput(&mut self, now: Nanos) -> f64 {
        let secs = now.saturating_sub(self.nc_since).max(MS) as f64 / 1e9;
        let rate = self.nc_bytes as f64 / secs;
        self.crit_floor = 2.0 * self.crit_written as f64 / secs;
        self.nc_bytes = 0;
        self.crit_written = 0;
        self.nc_since = now;
        rate
    }

    /// The lowest rate pacing sets: `min_rate_mib_s`; `min_share` of the
    /// background's own throughput (its progress: DESIGN §8 asks for half);
    /// and at least twice the rate at which critical requests write. What
    /// requests write (a log's records) is mostly written again in the
    /// background (the data those records describe, by writeback and
    /// checkpoints); paced below that rate, the background falls behind
    /// until the requests wait for it (a full log, dirty limits), through
    /// inheritance but late.
    fn min_rate(&self) -> f64 {
        let own = self.own.rate.unwrap_or(0.0) * self.cfg.min_share;
        ((self.cfg.min_rate_mib_s << 20) as f64)
            .max(self.crit_floor)
            .max(own)
    }

    /// Critical latency stays near the baseline: more background.
    fn grow(&mut self, now: Nanos) {
        let seen = self.nc_throughput(now);
        if self.holding(now) {
            return;
        }
        match self.pace.rate {
            // Unpaced once the rate is well above what background uses.
            Some(r) if r * 1.25 > 4.0 * seen.max(self.min_rate()) => self.pace.set(None, now),
            Some(r) => self.pace.set(Some((r * 1.25).max(self.min_rate())), now),
            None => self.cap = (self.cap + 1).min(self.cfg.max),
        }
    }

    /// Critical latency is above target: less background.
    fn cut(&mut self, now: Nanos) {
        let seen = self.nc_throughput(now);
        if self.cap > 1 {
            self.cap /= 2;
            return;
        }
        let next = match self.pace.rate {
            Some(r) => r / 2.0,
            None => seen / 2.0,
        };
        self.pace.set(Some(next.max(self.min_rate())), now);
    }

    fn reset_window(&mut self) {
        self.seen = 0;
        self.mixed_sum = 0.0;
        self.mixed_n = 0;
        self.mixed_max = 0.0;
    }

    /// No critical completion for `idle_grace` (or ever).
    fn idle(&self, now: Nanos) -> bool {
        self.last_critical
            .is_none_or(|t| now.saturating_sub(t) >= self.cfg.idle_grace_ms * MS)
    }

    /// Starts a probe when one is due, or at once while there is no
    /// baseline yet.
    fn maybe_probe(&mut self, now: Nanos) {
        if let Some(until) = self.probe_until {
            if now >= until {
                self.probe_until = None; // timed out: keep the old baseline
            }
            return;
        }
        let due = now.saturating_sub(self.last_probe) >= self.cfg.probe_every_ms * MS;
        if due || self.clean.is_none() {
            self.last_probe = now;
            self.probe_clean = 0;
            self.probe_until = Some(now + self.cfg.probe_max_ms * MS);
        }
    }

    /// A non-critical request completed; `bytes` is what pacing counts of
    /// it (its writes; 0 for a read, which leaves nothing in the device's
    /// write cache, so the critical samples after it may still be clean).
    fn on_noncritical_complete(&mut self, bytes: u64, now: Nanos) {
        self.nc_bytes += bytes;
        self.own.completed(bytes, now);
        if bytes > 0 {
            self.last_nc_complete = Some(now);
        }
        // Not within a stall's hold: a stall long enough to look idle
        // (no critical completion meanwhile) is no reason to let go.
        if self.idle(now) && !self.holding(now) {
            self.cap = (self.cap + 1).min(self.cfg.max);
            self.pace.set(None, now);
            self.probe_until = None;
        }
        if self.probe_until.is_some_and(|until| now >= until) {
            self.probe_until = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auto() -> CapState {
        CapState::new(NoncriticalCap::Auto(AutoCapConfig::default()))
    }

    /// An adaptive cap whose floor is the configured rates alone (the
    /// tests that feed completions without holding anything by pacing).
    fn auto_no_share() -> CapState {
        CapState::new(NoncriticalCap::Auto(AutoCapConfig {
            min_share: 0.0,
            ..AutoCapConfig::default()
        }))
    }

    /// An adaptive cap with a clean baseline of 1 ms from four critical
    /// completions, and the time after them.
    fn baselined() -> (CapState, Nanos) {
        let mut c = auto_no_share();
        let mut now = 0;
        for _ in 0..4 {
            now += MS;
            c.on_critical_complete(MS, 0, 0, now);
        }
        (c, now)
    }

    /// Held by pacing 8 ms of every 10 and writing 1 MiB in the other 2:
    /// 100 MiB/s over the wall clock, 500 MiB/s of its own.
    #[test]
    fn own_throughput_leaves_out_the_time_pacing_holds_the_background() {
        let mut o = OwnRate::default();
        let mut now = 0;
        for _ in 0..60 {
            o.held(true, now);
            now += 8 * MS;
            o.held(false, now);
            now += 2 * MS;
            o.completed(1 << 20, now);
        }
        let mib = o.rate.expect("estimated") / f64::from(1 << 20);
        assert!((450.0..=550.0).contains(&mib), "{mib}");
        // Nothing held: the wall-clock rate, converging from above.
        for _ in 0..400 {
            now += 10 * MS;
            o.completed(1 << 20, now);
        }
        let mib = o.rate.expect("estimated") / f64::from(1 << 20);
        assert!((95.0..=110.0).contains(&mib), "{mib}");
    }

    #[test]
    fn fixed_caps_and_unlimited() {
        assert_eq!(CapState::new(NoncriticalCap::Fixed(1)).limit(0), Some(1));
        assert_eq!(CapState::new(NoncriticalCap::Fixed(0)).limit(0), None);
    }

    #[test]
    fn grows_while_critical_latency_stays_near_the_baseline() {
        let (mut c, mut now) = baselined();
        for _ in 0..(16 * 10) {
            now += MS;
            c.on_critical_complete(MS + MS / 5, 1, now, now); // 1.2x: fine
        }
        assert!(c.current() >= 8, "cap grew to {}", c.current());
    }

    #[test]
    fn halves_when_the_window_mean_rises_but_ignores_a_lone_outlier() {
        let (mut c, mut now) = baselined();
        for _ in 0..(16 * 6) {
            now += MS;
            c.on_critical_complete(MS, 1, now, now);
        }
        let grown = c.current();
        assert!(grown >= 4);
        for _ in 0..16 {
            now += MS;
            c.on_critical_complete(2 * MS, 3, now, now); // 2x > 1.5x target
        }
        assert!(c.current() <= grown / 2, "{} -> {}", grown, c.current());
        let before = c.current();
        now += MS;
        c.on_critical_complete(20 * MS, 3, now, now); // one slow request
        for _ in 0..15 {
            now += MS;
            c.on_critical_complete(MS, 3, now, now);
        }
        assert!(
            c.current() > before,
            "a lone outlier in a good window does not cut"
        );
    }

    /// A window of good critical samples (1.2x the 1 ms baseline) beside
    /// a background writing 400 KiB per ms.
    fn good_window(c: &mut CapState, now: &mut Nanos) {
        for _ in 0..16 {
            *now += MS;
            c.on_noncritical_complete(400 * 1024, *now);
            c.on_critical_complete(MS + MS / 5, 1, *now, *now);
        }
    }

    /// A bandwidth-capped volume (a cloud disk, a cgroup's `io.max`) that
    /// the background has used up holds the next critical request for
    /// tens of ms, once: one slow sample in a good window, which the
    /// window's trimmed mean would never see.
    #[test]
    fn a_stall_cuts_the_cap_to_one_and_paces_at_once_and_holds_growth() {
        let (mut c, mut now) = baselined();
        for _ in 0..6 {
            good_window(&mut c, &mut now);
        }
        assert!(c.current() >= 4, "grew to {}", c.current());
        assert_eq!(c.rate(), None);
        // 150 ms: over 100x the 1 ms baseline and over 20 ms.
        now += 150 * MS;
        c.on_critical_complete(150 * MS, 1, now - 150 * MS, now);
        assert_eq!(c.current(), 1, "cut to one at once");
        let paced = c.rate().expect("paced at once");
        // Good windows within the hold (a second): no growth.
        for _ in 0..20 {
            good_window(&mut c, &mut now); // 16 ms each
        }
        assert_eq!(c.current(), 1);
        assert_eq!(c.rate(), Some(paced), "held");
        // After it, the rate grows again.
        now += 1000 * MS;
        good_window(&mut c, &mut now);
        assert!(c.rate().is_none_or(|r| r > paced), "grows after the hold");
    }

    /// The same slow request below `stall_min_ms`, or below `stall_ratio`
    /// times the baseline, is one outlier of its window.
    #[test]
    fn a_slow_request_short_of_a_stall_is_an_outlier() {
        for slow in [15 * MS, 90 * MS] {
            // 15 ms: 150x a 100 us baseline but under 20 ms; 90 ms: over
            // 20 ms but under 100x a 1 ms baseline.
            let base = if slow < 20 * MS { MS / 10 } else { MS };
            let mut c = auto_no_share();
            let mut now = 0;
            for _ in 0..4 {
                now += MS;
                c.on_critical_complete(base, 0, 0, now);
            }
            for _ in 0..6 {
                for _ in 0..16 {
                    now += MS;
                    c.on_critical_complete(base, 1, now, now);
                }
            }
            let grown = c.current();
            assert!(grown >= 4, "grew to {grown}");
            now += slow;
            c.on_critical_complete(slow, 1, now - slow, now);
            assert_eq!(c.current(), grown, "{slow} ns: no stall");
            assert_eq!(c.rate(), None);
        }
    }

    /// A stall longer than `idle_grace` leaves no critical completion for
    /// that long; the background completing meanwhile must not end the
    /// pacing the stall set.
    #[test]
    fn no_critical_completion_within_a_stall_s_hold_is_not_idle() {
        let (mut c, mut now) = baselined();
        good_window(&mut c, &mut now);
        now += 150 * MS;
        c.on_critical_complete(150 * MS, 1, now - 150 * MS, now);
        let paced = c.rate().expect("paced");
        for _ in 0..300 {
            now += MS;
            c.on_noncritical_complete(400 * 1024, now);
        }
        assert_eq!(c.rate(), Some(paced));
        assert_eq!(c.current(), 1);
        // Past the hold, idle again: the cap opens.
        for _ in 0..1000 {
            now += MS;
            c.on_noncritical_complete(400 * 1024, now);
        }
        assert_eq!(c.rate(), None);
        assert!(c.current() > 1);
    }

    #[test]
    fn restarts_at_one_when_critical_traffic_returns_after_idle() {
        let mut c = auto();
        for i in 0..100 {
            c.on_noncritical_complete(4096, i * MS);
        }
        assert_eq!(c.current(), 32);
        c.on_critical_complete(MS, 32, 1000 * MS, 1000 * MS);
        assert_eq!(c.current(), 1);
    }

    #[test]
    fn grows_freely_without_critical_traffic() {
        let mut c = auto();
        for i in 0..100 {
            c.on_noncritical_complete(4096, i * MS);
        }
        assert_eq!(c.current(), 32);
    }

    #[test]
    fn probes_hold_background_until_clean_samples_arrive_or_time_out() {
        let mut c = auto();
        c.on_critical_complete(MS, 1, 2000 * MS, 2000 * MS); // triggers a probe
        assert_eq!(c.limit(2000 * MS + 1), Some(0), "held during the probe");
        for i in 1..=4 {
            c.on_critical_complete(MS, 0, 2000 * MS + i, 2000 * MS + i);
        }
        assert_eq!(c.limit(2000 * MS + 10), Some(c.current()), "probe over");
        c.on_critical_complete(MS, 1, 3100 * MS, 3100 * MS); // next probe
        assert_eq!(c.limit(3100 * MS + 1), Some(0));
        assert_eq!(
            c.limit(3100 * MS + 101 * MS),
            Some(c.current()),
            "timed out"
        );
    }

    /// A background writing 400 MB/s at one request at a time while every
    /// critical request is 3x its baseline: pacing halves the rate down to
    /// the floor, and a request waits for its tokens.
    #[test]
    fn at_a_cap_of_one_pacing_halves_the_background_rate_down_to_the_floor() {
        let (mut c, mut now) = baselined();
        assert_eq!(c.rate(), None, "unpaced at first");
        let mut rates = Vec::new();
        for _ in 0..12 {
            for _ in 0..16 {
                now += MS;
                c.on_noncritical_complete(400 * 1024, now); // 400 KiB per ms
                c.on_critical_complete(3 * MS, 0, now, now); // recent background: not clean
            }
            rates.push(c.rate());
        }
        let mib = |r: Option<f64>| r.map(|b| b / f64::from(1 << 20));
        let first = mib(rates[0]).expect("paced after one window");
        // Half the background throughput seen since the start (6.25 MiB
        // over ~21 ms, the baseline's milliseconds included): ~150 MiB/s.
        assert!((120.0..=200.0).contains(&first), "{first}");
        assert!(mib(rates[1]).unwrap() < first, "halves again");
        assert_eq!(
            mib(*rates.last().unwrap()),
            Some(8.0),
            "never below the floor"
        );
        // At 8 MiB/s a 1 MiB request waits until the bucket holds it.
        c.on_noncritical_dispatch(1 << 20, now);
        assert!(!c.paced_ok(1 << 20, now));
        let at = c.pace_deadline(1 << 20, now).expect("held");
        assert!(
            at > now && at <= now + 130 * MS,
            "256 KiB at 8 MiB/s: {}",
            at - now
        );
        assert!(c.paced_ok(1 << 20, at));
    }

    /// Requests writing 64 KiB per ms (a log's records, ~62 MiB/s) raise
    /// the floor to twice that rate: pacing never starves the background
    /// below what it must write back for them.
    #[test]
    fn the_pacing_floor_follows_the_critical_write_rate() {
        let (mut c, mut now) = baselined();
        for _ in 0..12 {
            for _ in 0..16 {
                now += MS;
                c.on_noncritical_complete(400 * 1024, now);
                c.on_critical_written(64 * 1024);
                c.on_critical_complete(3 * MS, 0, now, now);
            }
        }
        let floor = c.rate().expect("paced") / f64::from(1 << 20);
        assert!(
            (100.0..=140.0).contains(&floor),
            "twice 62.5 MiB/s, not the configured 8: {floor}"
        );
    }

    #[test]
    fn pacing_relaxes_and_ends_when_critical_latency_comes_back() {
        let (mut c, mut now) = baselined();
        for _ in 0..16 {
            now += MS;
            c.on_noncritical_complete(400 * 1024, now);
            c.on_critical_complete(3 * MS, 0, now, now);
        }
        let paced = c.rate().expect("paced");
        for _ in 0..16 {
            now += MS;
            c.on_noncritical_complete(100 * 1024, now);
            c.on_critical_complete(MS, 0, now, now); // near the baseline again
        }
        let relaxed = c.rate().expect("still paced");
        assert!(relaxed > paced, "{paced} -> {relaxed}");
        for _ in 0..(16 * 20) {
            now += MS;
            c.on_noncritical_complete(4 * 1024, now); // background barely uses it
            c.on_critical_complete(MS, 0, now, now);
        }
        assert_eq!(
            c.rate(),
            None,
            "unpaced: the rate is far above what is used"
        );
        assert!(c.current() > 1, "then the cap grows again");
    }
}
