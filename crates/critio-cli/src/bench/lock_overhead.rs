//! `critio bench lock-overhead`: what priority inheritance costs a lock that
//! nobody waits for, and what a contended hand-off costs, measured side by
//! side with parking_lot's and std's mutexes in one run.
//!
//! Uncontended: each round times `lock(); unlock()` on each mutex in turn
//! (rotating the order), and the figure is the median over rounds of the
//! per-round ratio, which cancels most of the noise of a shared machine.
//! Contended: two threads increment one shared counter under the lock; each
//! thread times itself (first start to last end), each round runs every mutex
//! in rotating order, and the target is the median over rounds of critio's
//! time over parking_lot's. The counter also records how often the lock
//! passed from one thread to the other: a round in which it hardly did (one
//! thread ran its loop while the other waited for a CPU) measured no
//! contention and does not count towards the target.

use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use super::report::{Goal, Report, Table, Target};
use super::BenchArgs;

const UNCONTENDED_GOAL_RATIO: f64 = 2.0;
const CONTENDED_GOAL_RATIO: f64 = 3.0;
const CONTENDED_THREADS: usize = 2;

/// What the benchmark locks protect: a counter, and which thread last
/// held the lock, so a run can count how often the lock changed hands.
#[derive(Default)]
struct Counter {
    count: u64,
    last: u64,
    transfers: u64,
}

impl Counter {
    fn bump(&mut self, me: u64) {
        self.count += 1;
        if self.last != me {
            self.last = me;
            self.transfers += 1;
        }
    }
}

trait Lockable: Send + Sync + 'static {
    const NAME: &'static str;
    fn make() -> Self;
    fn with(&self, f: impl FnOnce(&mut Counter));
    fn bump(&self, me: u64) {
        self.with(|c| c.bump(me));
    }
}

impl Lockable for critio::sync::Mutex<Counter> {
    const NAME: &'static str = "critio::sync::Mutex";
    fn make() -> Self {
        critio::sync::Mutex::named("bench", Counter::default())
    }
    fn with(&self, f: impl FnOnce(&mut Counter)) {
        f(&mut black_box(self).lock());
    }
}

impl Lockable for parking_lot::Mutex<Counter> {
    const NAME: &'static str = "parking_lot::Mutex";
    fn make() -> Self {
        parking_lot::Mutex::new(Counter::default())
    }
    fn with(&self, f: impl FnOnce(&mut Counter)) {
        f(&mut black_box(self).lock());
    }
}

impl Lockable for std::sync::Mutex<Counter> {
    const NAME: &'static str = "std::sync::Mutex";
    fn make() -> Self {
        std::sync::Mutex::new(Counter::default())
    }
    fn with(&self, f: impl FnOnce(&mut Counter)) {
        f(&mut black_box(self).lock().expect("not poisoned"));
    }
}

type CritioM = critio::sync::Mutex<Counter>;
type ParkingLotM = parking_lot::Mutex<Counter>;
type StdM = std::sync::Mutex<Counter>;

fn ns_per_op<L: Lockable>(lock: &L, iters: u64) -> f64 {
    let start = Instant::now();
    for _ in 0..iters {
        lock.bump(1);
    }
    start.elapsed().as_nanos() as f64 / iters as f64
}

/// One contended run: ns per increment over the span from the first
/// thread's start to the last one's end, and how many times the lock passed
/// from one thread to the other. The threads start together from a spinning
/// barrier, so each is on a CPU when the run begins.
fn contended<L: Lockable>(threads: usize, iters: u64) -> (f64, u64) {
    let lock = Arc::new(L::make());
    let arrived = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (1..=threads as u64)
        .map(|me| {
            let (lock, arrived) = (lock.clone(), arrived.clone());
            std::thread::spawn(move || {
                arrived.fetch_add(1, Ordering::SeqCst);
                while arrived.load(Ordering::SeqCst) < threads {
                    std::hint::spin_loop();
                }
                let t0 = Instant::now();
                for _ in 0..iters {
                    lock.bump(me);
                }
                (t0, Instant::now())
            })
        })
        .collect();
    let spans: Vec<(Instant, Instant)> = handles
        .into_iter()
        .map(|h| h.join().expect("bench thread"))
        .collect();
    let first = spans.iter().map(|s| s.0).min().expect("threads");
    let last = spans.iter().map(|s| s.1).max().expect("threads");
    let ns = (last - first).as_nanos() as f64 / (threads as u64 * iters) as f64;
    let mut transfers = 0;
    lock.with(|c| {
        assert_eq!(c.count, threads as u64 * iters, "mutual exclusion");
        transfers = c.transfers;
    });
    (ns, transfers)
}

/// A round counts towards the contended target only if, with both critio
/// and parking_lot, the lock passed between the threads at least this many
/// times: on a busy machine one thread may run its whole loop while the
/// other waits for a CPU, and that run measured no contention at all.
const CONTENDED_TRANSFERS_MIN: u64 = 50;

/// Contended runs of the three mutexes, `rounds` times in rotating order.
struct Contended {
    /// ns/op per round: critio, parking_lot, std.
    ns: [Vec<f64>; 3],
    /// Lock transfers between the threads per round, same order.
    transfers: [Vec<f64>; 3],
    /// critio / parking_lot per round in which both were contended.
    ratio_pl: Vec<f64>,
}

fn contended_rounds(rounds: usize, iters: u64) -> Contended {
    let mut c = Contended {
        ns: Default::default(),
        transfers: Default::default(),
        ratio_pl: Vec::new(),
    };
    for round in 0..rounds {
        let mut ns = [0.0; 3];
        let mut transfers = [0; 3];
        for k in 0..3 {
            let which = (round + k) % 3;
            let (t, n) = match which {
                0 => contended::<CritioM>(CONTENDED_THREADS, iters),
                1 => contended::<ParkingLotM>(CONTENDED_THREADS, iters),
                _ => contended::<StdM>(CONTENDED_THREADS, iters),
            };
            ns[which] = t;
            transfers[which] = n;
            c.ns[which].push(t);
            c.transfers[which].push(n as f64);
        }
        if transfers[0] >= CONTENDED_TRANSFERS_MIN && transfers[1] >= CONTENDED_TRANSFERS_MIN {
            c.ratio_pl.push(ns[0] / ns[1]);
        }
    }
    c
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the experiment.
pub fn run(args: &BenchArgs) -> Result<Report, String> {
    let (rounds, iters, contended_rounds_n, contended_iters) = if args.quick {
        (5, 200_000, 5, 1_000_000)
    } else {
        (21, 1_000_000, 11, 2_000_000)
    };
    let (c, p, s) = (CritioM::make(), ParkingLotM::make(), StdM::make());
    let (mut tc, mut tp, mut ts, mut ratio_pl, mut ratio_std) =
        (vec![], vec![], vec![], vec![], vec![]);
    for round in 0..rounds {
        // Warm up once, then rotate the order so no lock always runs first.
        let mut times = [0.0; 3];
        for k in 0..3 {
            let which = (round + k) % 3;
            times[which] = match which {
                0 => ns_per_op(&c, iters),
                1 => ns_per_op(&p, iters),
                _ => ns_per_op(&s, iters),
            };
        }
        tc.push(times[0]);
        tp.push(times[1]);
        ts.push(times[2]);
        ratio_pl.push(times[0] / times[1]);
        ratio_std.push(times[0] / times[2]);
    }
    let ratio = median(&mut ratio_pl);
    let mut table = Table::new(
        &format!("uncontended lock+unlock, median of {rounds} rounds x {iters} ops"),
        &["mutex", "ns/op", "critio / this"],
    );
    table.row(vec![
        json!(CritioM::NAME),
        json!(median(&mut tc)),
        json!(1.0),
    ]);
    table.row(vec![
        json!(ParkingLotM::NAME),
        json!(median(&mut tp)),
        json!(ratio),
    ]);
    table.row(vec![
        json!(StdM::NAME),
        json!(median(&mut ts)),
        json!(median(&mut ratio_std)),
    ]);

    let mut c = contended_rounds(contended_rounds_n, contended_iters);
    // On a loaded machine every round may have run uncontended: run more
    // (up to three times as many) until one was contended with both.
    let mut extra = 0;
    while c.ratio_pl.is_empty() && extra < 3 * contended_rounds_n {
        let more = contended_rounds(1, contended_iters);
        for i in 0..3 {
            c.ns[i].extend(&more.ns[i]);
            c.transfers[i].extend(&more.transfers[i]);
        }
        c.ratio_pl.extend(more.ratio_pl);
        extra += 1;
    }
    let counted = c.ratio_pl.len();
    // With no contended round there is nothing to compare: the target is
    // then not met (NaN), rather than met by an uncontended run.
    let contended_ratio = if counted == 0 {
        f64::NAN
    } else {
        median(&mut c.ratio_pl)
    };
    let mut hand_off = Table::new(
        &format!(
            "contended: {CONTENDED_THREADS} threads x {contended_iters} increments of one counter, \
             median of {} rounds; critio / parking_lot is the median of the \
             {counted} rounds in which the lock changed threads >= {CONTENDED_TRANSFERS_MIN} \
             times with both",
            contended_rounds_n + extra
        ),
        &["mutex", "ns/op", "critio / this", "lock transfers"],
    );
    let c_ns = median(&mut c.ns[0]);
    let names = [CritioM::NAME, ParkingLotM::NAME, StdM::NAME];
    for (i, name) in names.into_iter().enumerate() {
        let ns = median(&mut c.ns[i]);
        let vs = match i {
            0 => 1.0,
            1 => contended_ratio,
            _ => c_ns / ns,
        };
        hand_off.row(vec![
            json!(name),
            json!(ns),
            if vs.is_nan() { json!("-") } else { json!(vs) },
            json!(median(&mut c.transfers[i])),
        ]);
    }

    Ok(Report {
        experiment: "lock-overhead".into(),
        description: "critio's priority-inheriting Mutex against parking_lot and std, measured \
                      side by side in one run (under contention critio, like parking_lot, lets \
                      a running thread re-take the lock while no critical task waits, and \
                      hands it over FIFO while one does)"
            .into(),
        tables: vec![table, hand_off],
        targets: vec![
            Target::new(
                "uncontended-vs-parking_lot",
                ratio,
                Goal::AtMost(UNCONTENDED_GOAL_RATIO),
                "x",
            ),
            Target::new(
                "contended-handoff-vs-parking_lot",
                contended_ratio,
                Goal::AtMost(CONTENDED_GOAL_RATIO),
                "x",
            ),
        ],
    })
}
