//! `critio bench e3-antagonists`: paper 004's experiment. A foreground
//! reader (4 KiB random reads, one at a time, with a think time) shares a
//! simulated HDD with 1 to 16 background antagonists (sequential 128 KiB
//! readers and writers, one request each at a time, spread over three
//! background priority levels). Its mean and max latency should stay flat
//! as antagonists are added when its priority is enforced, and grow when it
//! is not.
//!
//! It composes the two sans-I/O cores in virtual time: critio's block
//! scheduler (`block::Scheduler`) feeding the drive model
//! (`device::sim::HddModel`), a discrete-event loop over the drive's
//! completions and the scheduler's timers. Schemes, as paper 004 compares
//! them, then critio's:
//!
//! | scheme                         | block layer                                        |
//! |--------------------------------|----------------------------------------------------|
//! | `none`                         | one FIFO, everything goes to the drive's queue     |
//! | `priority`                     | lanes in priority order, work-conserving: whatever is queued goes to the drive |
//! | `priority+anticipation`        | lower lanes held while a higher one is at the drive and for a window after it (opened when its think time fits) |
//! | `priority+anticipation+tokens` | and per-lane batch budgets: a lane that used its budget yields |
//! | `rcp`                          | critical first, 1 background request at the drive, 10 ms starvation timer (paper 000) |
//! | `rcp+anticipation`             | the same with the anticipation window              |
//!
//! Paper 004's schemes expire a waiting request after `expire_ms` (the
//! anticipatory scheduler's `read_expire`); rcp's after paper 000's 10 ms.
//! That timer is why `rcp+anticipation` adds little beyond one antagonist
//! here: on a disk, one 128 KiB background request costs about as much as
//! the 10 ms period, so the forced dispatch, not the window, sets the
//! reader's wait.
//!
//! A second table runs `priority+anticipation` for readers that think less
//! and more than the window, with the think-time heuristic on and off: a
//! reader that comes back after the window closes gets no window (the
//! anticipatory scheduler's rule), so the drive is not held idle for it.

use std::collections::HashMap;

use critio::block::{BlockConfig, BlockScheme, LaneTokens, NoncriticalCap, ReqInfo, Scheduler};
use critio::context::Class;
use critio::device::sim::{Completed, DriveModel, Firmware, HddModel, HddParams, Request};
use critio::device::Op;
use critio::metrics::LatencyHistogram;
use critio::time::Nanos;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Deserialize;
use serde_json::json;

use super::report::{Goal, Report, Table, Target};
use super::BenchArgs;

const DEFAULT_WORKLOAD: &str = include_str!("../../../../workloads/e3-antagonists.toml");
const CAPACITY: u64 = 1 << 40;

/// The experiment's workload file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct E3Workload {
    antagonists: Vec<usize>,
    hours: f64,
    quick_hours: f64,
    foreground_bytes: u64,
    background_bytes: u64,
    background_writer_every: usize,
    /// Antagonist `i` runs at background level `i % levels`.
    levels: u8,
    foreground_think_us: u64,
    /// The think-time table: reader think times to run at the most
    /// antagonists, with the heuristic on and off.
    think_probe_us: Vec<u64>,
    anticipation_us: u64,
    /// Paper 004's schemes: a waiting request expires after this long.
    expire_ms: u64,
    /// Paper 004's token budgets: critical lane, then levels 0, 1, ...
    tokens: Vec<u32>,
    seed: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Scheme {
    None,
    Priority,
    PriorityAnticipation,
    PriorityAnticipationTokens,
    Rcp,
    RcpAnticipation,
}

const SCHEMES: [Scheme; 6] = [
    Scheme::None,
    Scheme::Priority,
    Scheme::PriorityAnticipation,
    Scheme::PriorityAnticipationTokens,
    Scheme::Rcp,
    Scheme::RcpAnticipation,
];

impl Scheme {
    fn name(self) -> &'static str {
        match self {
            Scheme::None => "none",
            Scheme::Priority => "priority",
            Scheme::PriorityAnticipation => "priority+anticipation",
            Scheme::PriorityAnticipationTokens => "priority+anticipation+tokens",
            Scheme::Rcp => "rcp",
            Scheme::RcpAnticipation => "rcp+anticipation",
        }
    }

    fn block(self, w: &E3Workload) -> Result<BlockConfig, String> {
        let base = BlockConfig::default();
        let paper004 = BlockConfig {
            noncritical_cap: NoncriticalCap::Fixed(0),
            starvation_period_ms: w.expire_ms,
            ..base
        };
        let cfg = match self {
            Scheme::None => BlockConfig {
                scheme: BlockScheme::None,
                ..base
            },
            Scheme::Priority => paper004,
            Scheme::PriorityAnticipation => BlockConfig {
                anticipation_us: w.anticipation_us,
                ..paper004
            },
            Scheme::PriorityAnticipationTokens => BlockConfig {
                anticipation_us: w.anticipation_us,
                tokens: LaneTokens::from_slice(&w.tokens)?,
                ..paper004
            },
            Scheme::Rcp => BlockConfig {
                noncritical_cap: NoncriticalCap::Fixed(1),
                ..base
            },
            Scheme::RcpAnticipation => BlockConfig {
                noncritical_cap: NoncriticalCap::Fixed(1),
                anticipation_us: w.anticipation_us,
                ..base
            },
        };
        cfg.validate().map_err(|e| e.to_string())?;
        Ok(cfg)
    }
}

/// One reader or antagonist: a closed loop with one request outstanding.
struct Stream {
    fg: bool,
    op: Op,
    level: u8,
    next: u64,
    region: (u64, u64),
}

/// What the scheduler carries per request: (stream, offset, length).
type Payload = (usize, u64, u64);

struct Sim {
    sched: Scheduler<Payload>,
    drive: HddModel,
    streams: Vec<Stream>,
    inflight: HashMap<u64, (usize, Nanos)>,
    rng: SmallRng,
    next_id: u64,
    fg: LatencyHistogram,
    /// Background bytes completed per level.
    bg_bytes: Vec<u64>,
    /// Streams that issue their next request at a later time (think time).
    arrivals: Vec<(Nanos, usize)>,
    w: E3Workload,
}

impl Sim {
    fn new(w: &E3Workload, cfg: BlockConfig, antagonists: usize) -> Self {
        let region = CAPACITY / (antagonists as u64 + 1);
        let mut streams = vec![Stream {
            fg: true,
            op: Op::Read,
            level: 0,
            next: 0,
            region: (0, region),
        }];
        for i in 0..antagonists {
            let start = region * (i as u64 + 1);
            let op = if (i + 1) % w.background_writer_every == 0 {
                Op::Write
            } else {
                Op::Read
            };
            streams.push(Stream {
                fg: false,
                op,
                level: (i % usize::from(w.levels)) as u8,
                next: start,
                region: (start, start + region),
            });
        }
        Sim {
            sched: Scheduler::new(cfg.sched(HddParams::default().queue_depth)),
            drive: HddModel::new(CAPACITY, HddParams::default(), Firmware::default(), w.seed),
            streams,
            inflight: HashMap::new(),
            rng: SmallRng::seed_from_u64(w.seed ^ antagonists as u64),
            next_id: 0,
            fg: LatencyHistogram::new(),
            bg_bytes: vec![0; usize::from(w.levels)],
            arrivals: Vec::new(),
            w: w.clone(),
        }
    }

    /// Issues stream `s`'s next request at `now`.
    fn issue(&mut self, s: usize, now: Nanos) {
        let st = &mut self.streams[s];
        let (len, offset) = if st.fg {
            let len = self.w.foreground_bytes;
            (
                len,
                self.rng.gen_range(st.region.0 / len..st.region.1 / len) * len,
            )
        } else {
            let len = self.w.background_bytes;
            if st.next + len > st.region.1 {
                st.next = st.region.0;
            }
            st.next += len;
            (len, st.next - len)
        };
        self.next_id += 1;
        let class = if st.fg {
            Class::Critical
        } else {
            Class::NonCritical
        };
        let info = ReqInfo {
            class,
            level: st.level,
            op: st.op,
            offset,
            len,
        };
        let admitted = self.sched.submit(self.next_id, info, (s, offset, len), now);
        assert!(admitted, "every stream fits the admission pools");
        self.inflight.insert(self.next_id, (s, now));
    }

    fn dispatch(&mut self, now: Nanos) {
        while let Some(id) = self.sched.dispatch(now) {
            let (s, offset, len) = *self.sched.payload_mut(id).expect("dispatched request");
            let op = self.streams[s].op;
            let req = Request {
                id,
                op,
                offset,
                len,
                high_priority: false,
            };
            self.drive.submit(req, now);
        }
    }

    fn run(mut self, duration: Nanos) -> Self {
        for s in 0..self.streams.len() {
            self.issue(s, 0);
        }
        let mut done: Vec<Completed> = Vec::new();
        let mut now = 0;
        while now < duration {
            self.dispatch(now);
            let arrival = self.arrivals.iter().map(|a| a.0).min();
            let next = [self.drive.next_event(), self.sched.next_timer(now), arrival]
                .into_iter()
                .flatten()
                .min();
            now = next.expect("closed loops always have work").max(now);
            self.drive.pop_completed(now, &mut done);
            for c in done.drain(..) {
                self.complete(c);
            }
            let (due, later): (Vec<_>, Vec<_>) = self.arrivals.drain(..).partition(|a| a.0 <= now);
            self.arrivals = later;
            for (at, s) in due {
                self.issue(s, at);
            }
        }
        self
    }

    fn complete(&mut self, c: Completed) {
        self.sched.complete(c.id, c.at);
        let (s, issued) = self.inflight.remove(&c.id).expect("a known request");
        if self.streams[s].fg {
            self.fg.record_nanos(c.at - issued);
            // The reader processes what it read before it reads again.
            self.arrivals
                .push((c.at + self.w.foreground_think_us * 1000, s));
        } else {
            self.bg_bytes[usize::from(self.streams[s].level)] += self.w.background_bytes;
            self.issue(s, c.at);
        }
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// What one run measured.
#[derive(Clone, Debug)]
struct Outcome {
    mean: f64,
    p99: f64,
    max: f64,
    /// Background MiB/s in all, and per level.
    bg: f64,
    bg_levels: Vec<f64>,
}

fn load(args: &BenchArgs) -> Result<E3Workload, String> {
    let w: E3Workload = match &args.workload {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => {
            toml::from_str(DEFAULT_WORKLOAD).map_err(|e| format!("e3-antagonists.toml: {e}"))?
        }
    };
    if w.antagonists.is_empty() || w.levels == 0 || w.background_writer_every == 0 {
        return Err("e3-antagonists: antagonists, levels and background_writer_every must be non-empty / positive".into());
    }
    if w.levels > critio::block::BACKGROUND_LEVELS {
        return Err(format!(
            "e3-antagonists: levels = {} but there are {} background levels",
            w.levels,
            critio::block::BACKGROUND_LEVELS
        ));
    }
    Ok(w)
}

/// Runs the experiment.
pub fn run(args: &BenchArgs) -> Result<Report, String> {
    if let Some(d) = args
        .device
        .as_deref()
        .filter(|d| *d != "sim" && *d != "sim:hdd")
    {
        return Err(format!(
            "e3-antagonists runs in virtual time on the simulated HDD only (device `{d}` given)"
        ));
    }
    let w = load(args)?;
    let hours = if args.quick { w.quick_hours } else { w.hours };
    let duration = (hours * 3600.0 * 1e9) as Nanos;
    let levels: Vec<String> = (0..w.levels).map(|l| format!("bg L{l} MiB/s")).collect();
    let mut columns = vec![
        "scheme",
        "antagonists",
        "fg mean ms",
        "fg p99 ms",
        "fg max ms",
        "fg reads",
        "bg MiB/s",
    ];
    columns.extend(levels.iter().map(String::as_str));
    columns.extend(["anticipation holds", "windows skipped", "token rounds"]);
    let mut t = Table::new(
        &format!(
            "simulated 7200 rpm HDD; foreground {} KiB random reads (QD 1, {} us think time) vs N sequential {} KiB antagonists (QD 1 each, 1 in {} a writer, antagonist i at background level i % {}); anticipation window {} us; paper 004's schemes expire after {} ms, tokens {:?}; {hours} h of drive time per run",
            w.foreground_bytes / 1024,
            w.foreground_think_us,
            w.background_bytes / 1024,
            w.background_writer_every,
            w.levels,
            w.anticipation_us,
            w.expire_ms,
            w.tokens
        ),
        &columns,
    );
    let secs = hours * 3600.0;
    let mib = |b: u64| b as f64 / secs / f64::from(1 << 20);
    let mut summary: HashMap<(Scheme, usize), Outcome> = HashMap::new();
    for scheme in SCHEMES {
        let cfg = scheme.block(&w)?;
        for &n in &w.antagonists {
            let sim = Sim::new(&w, cfg, n).run(duration);
            let c = sim.sched.counters();
            let o = Outcome {
                mean: ms(sim.fg.mean()),
                p99: ms(sim.fg.quantile(0.99)),
                max: ms(sim.fg.max()),
                bg: mib(sim.bg_bytes.iter().sum()),
                bg_levels: sim.bg_bytes.iter().map(|&b| mib(b)).collect(),
            };
            let mut row = vec![
                json!(scheme.name()),
                json!(n),
                json!(o.mean),
                json!(o.p99),
                json!(o.max),
                json!(sim.fg.count()),
                json!(o.bg),
            ];
            row.extend(o.bg_levels.iter().map(|&b| json!(b)));
            row.extend([
                json!(c.anticipation_holds),
                json!(c.anticipation_skipped),
                json!(c.token_rounds),
            ]);
            t.row(row);
            summary.insert((scheme, n), o);
        }
    }
    let think = think_time_table(&w, duration)?;
    Ok(Report {
        experiment: "e3-antagonists".into(),
        description: "paper 004: foreground latency as background antagonists are added, on a simulated HDD (virtual time): work-conserving priority, anticipation and tokens, next to none and rcp".into(),
        tables: vec![t, think],
        targets: targets(&w, &summary),
    })
}

/// Paper 004's think-time heuristic: `priority+anticipation` at the most
/// antagonists, for readers that think less and more than the window,
/// with the heuristic on and off. A window held for a reader that comes
/// back after it closes only idles the drive.
fn think_time_table(w: &E3Workload, duration: Nanos) -> Result<Table, String> {
    let n = *w.antagonists.last().expect("antagonist counts");
    let mut t = Table::new(
        &format!(
            "the think-time heuristic: priority+anticipation ({} us window) with {n} antagonists, readers of several think times",
            w.anticipation_us
        ),
        &[
            "reader think us",
            "heuristic",
            "fg mean ms",
            "fg p99 ms",
            "bg MiB/s",
            "anticipation holds",
            "windows skipped",
        ],
    );
    let secs = duration as f64 / 1e9;
    for &think in &w.think_probe_us {
        for heuristic in [true, false] {
            let cfg = BlockConfig {
                anticipation_think_time: heuristic,
                ..Scheme::PriorityAnticipation.block(w)?
            };
            let w = E3Workload {
                foreground_think_us: think,
                ..w.clone()
            };
            let sim = Sim::new(&w, cfg, n).run(duration);
            let c = sim.sched.counters();
            let bg = sim.bg_bytes.iter().sum::<u64>() as f64 / secs / f64::from(1 << 20);
            let mean = ms(sim.fg.mean());
            t.row(vec![
                json!(think),
                json!(if heuristic { "on" } else { "off" }),
                json!(mean),
                json!(ms(sim.fg.quantile(0.99))),
                json!(bg),
                json!(c.anticipation_holds),
                json!(c.anticipation_skipped),
            ]);
        }
    }
    Ok(t)
}

fn targets(w: &E3Workload, r: &HashMap<(Scheme, usize), Outcome>) -> Vec<Target> {
    use Scheme::*;
    let (lo, hi) = (
        w.antagonists[0],
        *w.antagonists.last().expect("antagonist counts"),
    );
    let at = |s: Scheme| &r[&(s, hi)];
    // How much the foreground's mean or max grew from the fewest to the most antagonists.
    let growth = |s: Scheme, f: fn(&Outcome) -> f64| f(&r[&(s, hi)]) / f(&r[&(s, lo)]);
    let mut t = vec![
        Target::new(
            &format!("none-fg-mean-{hi}-vs-{lo}-antagonists (grows)"),
            growth(None, |o| o.mean),
            Goal::AtLeast(1.5),
            "x",
        ),
        Target::new(
            &format!("priority-fg-mean-{hi}-vs-{lo}-antagonists (work-conserving: grows)"),
            growth(Priority, |o| o.mean),
            Goal::AtLeast(1.5),
            "x",
        ),
        Target::new(
            &format!("priority+anticipation-fg-mean-{hi}-vs-{lo}-antagonists"),
            growth(PriorityAnticipation, |o| o.mean),
            Goal::AtMost(1.5),
            "x",
        ),
        Target::new(
            &format!("priority-vs-priority+anticipation-fg-mean-at-{hi} (anticipation's effect)"),
            at(Priority).mean / at(PriorityAnticipation).mean,
            Goal::AtLeast(2.0),
            "x",
        ),
        Target::new(
            &format!("tokens-bg-throughput-vs-anticipation-alone-at-{hi} (tokens' effect)"),
            at(PriorityAnticipationTokens).bg / at(PriorityAnticipation).bg.max(1e-9),
            Goal::AtLeast(1.5),
            "x",
        ),
        Target::new(
            &format!("tokens-fg-mean-{hi}-vs-{lo}-antagonists"),
            growth(PriorityAnticipationTokens, |o| o.mean),
            Goal::AtMost(1.5),
            "x",
        ),
        Target::new(
            &format!("rcp-fg-mean-{hi}-vs-{lo}-antagonists"),
            growth(Rcp, |o| o.mean),
            Goal::AtMost(1.5),
            "x",
        ),
        Target::new(
            &format!("rcp-fg-max-{hi}-vs-{lo}-antagonists"),
            growth(Rcp, |o| o.max),
            Goal::AtMost(1.5),
            "x",
        ),
    ];
    // Levels: under tokens each level gets its budget per round (4, 2, 1
    // by default), so level 0 moves several times what the last moves.
    let levels = &at(PriorityAnticipationTokens).bg_levels;
    if levels.len() >= 2 && hi >= levels.len() {
        let last = levels.len() - 1;
        t.push(Target::new(
            &format!("tokens-bg-L0-vs-L{last}-at-{hi} (levels ordered)"),
            levels[0] / levels[last].max(1e-9),
            Goal::AtLeast(2.0),
            "x",
        ));
    }
    t
}
