//! `critio bench e3-antagonists`: paper 004's experiment. A foreground
//! reader (4 KiB random reads, one at a time) shares a simulated HDD with 1
//! to 16 background antagonists (sequential 128 KiB readers and writers,
//! one request each at a time). Its mean and max latency should stay flat
//! as antagonists are added when its priority is enforced, and grow when it
//! is not.
//!
//! It composes the two sans-I/O cores in virtual time: critio's block
//! scheduler (`block::Scheduler`) feeding the drive model
//! (`device::sim::HddModel`), a discrete-event loop over the drive's
//! completions and the scheduler's timers. Schemes:
//!
//! | scheme            | block layer                                        |
//! |-------------------|----------------------------------------------------|
//! | `none`            | one FIFO, everything goes to the drive's queue     |
//! | `rcp`             | critical first, 1 background request at the drive  |
//! | `rcp+anticipation`| the same, holding background dispatch briefly after each foreground completion (paper 004) |

use std::collections::HashMap;

use critio::block::{BlockConfig, BlockScheme, NoncriticalCap, ReqInfo, Scheduler};
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
    foreground_think_us: u64,
    anticipation_us: u64,
    seed: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Scheme {
    None,
    Rcp,
    RcpAnticipation,
}

impl Scheme {
    fn name(self) -> &'static str {
        match self {
            Scheme::None => "none",
            Scheme::Rcp => "rcp",
            Scheme::RcpAnticipation => "rcp+anticipation",
        }
    }

    fn block(self, w: &E3Workload) -> BlockConfig {
        let base = BlockConfig::default();
        match self {
            Scheme::None => BlockConfig {
                scheme: BlockScheme::None,
                ..base
            },
            Scheme::Rcp => BlockConfig {
                noncritical_cap: NoncriticalCap::Fixed(1),
                ..base
            },
            Scheme::RcpAnticipation => BlockConfig {
                anticipation_us: w.anticipation_us,
                ..base
            },
        }
    }
}

/// One reader or antagonist: a closed loop with one request outstanding.
struct Stream {
    fg: bool,
    op: Op,
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
    bg_bytes: u64,
    /// Streams that issue their next request at a later time (think time).
    arrivals: Vec<(Nanos, usize)>,
    w: E3Workload,
}

impl Sim {
    fn new(w: &E3Workload, scheme: Scheme, antagonists: usize) -> Self {
        let region = CAPACITY / (antagonists as u64 + 1);
        let mut streams = vec![Stream {
            fg: true,
            op: Op::Read,
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
                next: start,
                region: (start, start + region),
            });
        }
        Sim {
            sched: Scheduler::new(scheme.block(w).sched(HddParams::default().queue_depth)),
            drive: HddModel::new(CAPACITY, HddParams::default(), Firmware::default(), w.seed),
            streams,
            inflight: HashMap::new(),
            rng: SmallRng::seed_from_u64(w.seed ^ antagonists as u64),
            next_id: 0,
            fg: LatencyHistogram::new(),
            bg_bytes: 0,
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
            self.bg_bytes += self.w.background_bytes;
            self.issue(s, c.at);
        }
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
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
    let hours = if args.quick { w.quick_hours } else { w.hours };
    let duration = (hours * 3600.0 * 1e9) as Nanos;
    let mut t = Table::new(
        &format!(
            "simulated 7200 rpm HDD; foreground {} KiB random reads (QD 1, {} us think time) vs N sequential {} KiB antagonists (QD 1 each, 1 in {} a writer); {hours} h of drive time per run",
            w.foreground_bytes / 1024, w.foreground_think_us, w.background_bytes / 1024, w.background_writer_every
        ),
        &["scheme", "antagonists", "fg mean ms", "fg p99 ms", "fg max ms", "fg reads", "bg MiB/s"],
    );
    let mut summary: HashMap<(&str, usize), (f64, f64)> = HashMap::new();
    for scheme in [Scheme::None, Scheme::Rcp, Scheme::RcpAnticipation] {
        for &n in &w.antagonists {
            let sim = Sim::new(&w, scheme, n).run(duration);
            let (mean, max) = (ms(sim.fg.mean()), ms(sim.fg.max()));
            t.row(vec![
                json!(scheme.name()),
                json!(n),
                json!(mean),
                json!(ms(sim.fg.quantile(0.99))),
                json!(max),
                json!(sim.fg.count()),
                json!(sim.bg_bytes as f64 / (hours * 3600.0) / (1 << 20) as f64),
            ]);
            summary.insert((scheme.name(), n), (mean, max));
        }
    }
    let (lo, hi) = (
        w.antagonists[0],
        *w.antagonists.last().expect("antagonist counts"),
    );
    // How much the foreground's (mean, max) grew from the fewest to the most antagonists.
    let growth = |s: &str| {
        let (a, b) = (summary[&(s, lo)], summary[&(s, hi)]);
        (b.0 / a.0, b.1 / a.1)
    };
    let targets = vec![
        Target::new(
            &format!("rcp-fg-mean-{hi}-vs-{lo}-antagonists"),
            growth("rcp").0,
            Goal::AtMost(1.5),
            "x",
        ),
        Target::new(
            &format!("rcp-fg-max-{hi}-vs-{lo}-antagonists"),
            growth("rcp").1,
            Goal::AtMost(1.5),
            "x",
        ),
        Target::new(
            &format!("none-fg-mean-{hi}-vs-{lo}-antagonists (grows)"),
            growth("none").0,
            Goal::AtLeast(1.5),
            "x",
        ),
    ];
    Ok(Report {
        experiment: "e3-antagonists".into(),
        description: "paper 004: foreground latency as background antagonists are added, on a simulated HDD (virtual time)".into(),
        tables: vec![t],
        targets,
    })
}
