//! `critio bench lock-overhead`: what priority inheritance costs a lock that
//! nobody waits for, and what FIFO hand-off costs under contention, measured
//! side by side with parking_lot's and std's mutexes in one run.
//!
//! Uncontended: each round times `lock(); unlock()` on each mutex in turn
//! (rotating the order), and the figure is the median over rounds of the
//! per-round ratio, which cancels most of the noise of a shared machine.
//! Contended: two threads increment one shared counter under the lock.

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use serde_json::json;

use super::report::{Goal, Report, Table, Target};
use super::BenchArgs;

const UNCONTENDED_GOAL_RATIO: f64 = 2.0;

trait Lockable: Send + Sync + 'static {
    const NAME: &'static str;
    fn make() -> Self;
    fn bump(&self);
}

impl Lockable for critio::sync::Mutex<u64> {
    const NAME: &'static str = "critio::sync::Mutex";
    fn make() -> Self {
        critio::sync::Mutex::named("bench", 0)
    }
    fn bump(&self) {
        *black_box(self).lock() += 1;
    }
}

impl Lockable for parking_lot::Mutex<u64> {
    const NAME: &'static str = "parking_lot::Mutex";
    fn make() -> Self {
        parking_lot::Mutex::new(0)
    }
    fn bump(&self) {
        *black_box(self).lock() += 1;
    }
}

impl Lockable for std::sync::Mutex<u64> {
    const NAME: &'static str = "std::sync::Mutex";
    fn make() -> Self {
        std::sync::Mutex::new(0)
    }
    fn bump(&self) {
        *black_box(self).lock().expect("not poisoned") += 1;
    }
}

fn ns_per_op<L: Lockable>(lock: &L, iters: u64) -> f64 {
    let start = Instant::now();
    for _ in 0..iters {
        lock.bump();
    }
    start.elapsed().as_nanos() as f64 / iters as f64
}

fn contended<L: Lockable>(threads: usize, iters: u64) -> f64 {
    let lock = Arc::new(L::make());
    let start = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (lock, start) = (lock.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                for _ in 0..iters {
                    lock.bump();
                }
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    for h in handles {
        h.join().expect("bench thread");
    }
    t0.elapsed().as_nanos() as f64 / (threads as u64 * iters) as f64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the experiment.
pub fn run(args: &BenchArgs) -> Result<Report, String> {
    let (rounds, iters, contended_iters) = if args.quick {
        (5, 200_000, 50_000)
    } else {
        (21, 1_000_000, 500_000)
    };
    let (c, p, s) = (
        critio::sync::Mutex::<u64>::make(),
        parking_lot::Mutex::<u64>::make(),
        std::sync::Mutex::<u64>::make(),
    );
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
        json!(critio::sync::Mutex::<u64>::NAME),
        json!(median(&mut tc)),
        json!(1.0),
    ]);
    table.row(vec![
        json!(parking_lot::Mutex::<u64>::NAME),
        json!(median(&mut tp)),
        json!(ratio),
    ]);
    table.row(vec![
        json!(std::sync::Mutex::<u64>::NAME),
        json!(median(&mut ts)),
        json!(median(&mut ratio_std)),
    ]);

    let threads = 2;
    let cc = contended::<critio::sync::Mutex<u64>>(threads, contended_iters);
    let cp = contended::<parking_lot::Mutex<u64>>(threads, contended_iters);
    let cs = contended::<std::sync::Mutex<u64>>(threads, contended_iters);
    let mut hand_off = Table::new(
        &format!("contended: {threads} threads x {contended_iters} increments of one counter"),
        &["mutex", "ns/op", "critio / this"],
    );
    hand_off.row(vec![
        json!(critio::sync::Mutex::<u64>::NAME),
        json!(cc),
        json!(1.0),
    ]);
    hand_off.row(vec![
        json!(parking_lot::Mutex::<u64>::NAME),
        json!(cp),
        json!(cc / cp),
    ]);
    hand_off.row(vec![
        json!(std::sync::Mutex::<u64>::NAME),
        json!(cs),
        json!(cc / cs),
    ]);

    Ok(Report {
        experiment: "lock-overhead".into(),
        description: "critio's priority-inheriting Mutex against parking_lot and std, measured \
                      side by side in one run (critio hands a contended lock over FIFO, \
                      parking_lot lets a running thread barge)"
            .into(),
        tables: vec![table, hand_off],
        targets: vec![Target::new(
            "uncontended-vs-parking_lot",
            ratio,
            Goal::AtMost(UNCONTENDED_GOAL_RATIO),
            "x",
        )],
    })
}
