//! A closed-loop discrete-event harness for the model tests: each stream
//! keeps its queue depth of requests outstanding, in virtual time, no
//! sleeping.

use std::collections::HashMap;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::model::{Completed, DriveModel, Request};
use crate::device::Op;
use crate::time::Nanos;

/// One closed-loop stream of requests.
#[derive(Clone, Copy, Debug)]
pub struct Stream {
    pub qd: usize,
    pub high: bool,
    pub op: Op,
    pub len: u64,
    /// Sequential from a random start instead of uniformly random.
    pub sequential: bool,
}

impl Stream {
    /// Random 4 KiB reads at queue depth `qd`.
    pub fn reads(qd: usize, high: bool) -> Self {
        Self {
            qd,
            high,
            op: Op::Read,
            len: 4096,
            sequential: false,
        }
    }
}

/// What a run measured.
#[derive(Debug, Default)]
pub struct Run {
    /// Per stream, each request's latency.
    pub latencies: Vec<Vec<Nanos>>,
    /// Every completion, in order.
    pub order: Vec<Completed>,
    /// Virtual time of the last completion.
    pub end: Nanos,
}

impl Run {
    /// Completions per second of virtual time, all streams.
    pub fn iops(&self) -> f64 {
        self.order.len() as f64 / (self.end as f64 / 1e9)
    }
}

struct Harness<'a> {
    model: &'a mut dyn DriveModel,
    streams: &'a [Stream],
    capacity: u64,
    rng: SmallRng,
    cursors: Vec<u64>,
    inflight: HashMap<u64, (usize, Nanos)>,
    next_id: u64,
}

impl Harness<'_> {
    fn issue(&mut self, s: usize, now: Nanos) {
        let st = self.streams[s];
        let blocks = self.capacity / st.len;
        let offset = if st.sequential {
            let at = self.cursors[s];
            self.cursors[s] = (at + st.len) % (blocks * st.len);
            at
        } else {
            self.rng.gen_range(0..blocks) * st.len
        };
        let id = self.next_id;
        self.next_id += 1;
        let req = Request {
            id,
            op: st.op,
            offset,
            len: st.len,
            high_priority: st.high,
        };
        self.inflight.insert(id, (s, now));
        self.model.submit(req, now);
    }
}

/// Runs `streams` on `model` until `total` requests completed.
pub fn run(
    model: &mut dyn DriveModel,
    streams: &[Stream],
    total: usize,
    capacity: u64,
    seed: u64,
) -> Run {
    let mut rng = SmallRng::seed_from_u64(seed);
    let cursors = streams
        .iter()
        .map(|s| rng.gen_range(0..capacity / s.len) * s.len)
        .collect();
    let mut h = Harness {
        model,
        streams,
        capacity,
        rng,
        cursors,
        inflight: HashMap::new(),
        next_id: 0,
    };
    let mut out = Run {
        latencies: vec![Vec::new(); streams.len()],
        ..Run::default()
    };
    for (s, st) in streams.iter().enumerate() {
        for _ in 0..st.qd {
            h.issue(s, 0);
        }
    }
    let mut buf = Vec::new();
    while out.order.len() < total {
        let t = h.model.next_event().expect("work is outstanding");
        h.model.pop_completed(t, &mut buf);
        for c in buf.drain(..) {
            let (s, t0) = h.inflight.remove(&c.id).expect("a completion we issued");
            assert!(c.at >= t0 && c.at <= t, "completion time out of range");
            out.latencies[s].push(c.at - t0);
            out.order.push(c);
            out.end = c.at;
            h.issue(s, t);
        }
    }
    out
}

/// The `p` quantile (0..=1) of `xs`.
pub fn quantile(xs: &[Nanos], p: f64) -> Nanos {
    assert!(!xs.is_empty(), "quantile of nothing");
    let mut v = xs.to_vec();
    v.sort_unstable();
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    v[i]
}

/// The mean of `xs`.
pub fn mean(xs: &[Nanos]) -> f64 {
    assert!(!xs.is_empty(), "mean of nothing");
    xs.iter().map(|&x| x as f64).sum::<f64>() / xs.len() as f64
}

/// Milliseconds, for messages.
pub fn ms(ns: f64) -> f64 {
    ns / 1e6
}
