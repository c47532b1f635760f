//! Criterion micro-benchmarks of critio's Mutex against parking_lot's:
//! uncontended lock+unlock, and a contended hand-off between two threads.
//! `critio bench lock-overhead` prints the same comparison as a ratio.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};

fn uncontended(c: &mut Criterion) {
    let mut g = c.benchmark_group("uncontended lock+unlock");
    let m = critio::sync::Mutex::named("bench", 0u64);
    g.bench_function("critio", |b| b.iter(|| *black_box(&m).lock() += 1));
    let p = parking_lot::Mutex::new(0u64);
    g.bench_function("parking_lot", |b| b.iter(|| *black_box(&p).lock() += 1));
    g.finish();
}

/// Two threads take turns on one lock; the time per iteration covers one
/// lock+unlock by each.
fn hand_off<M: Send + Sync + 'static>(iters: u64, make: impl Fn() -> M, bump: fn(&M)) -> Duration {
    let m = Arc::new(make());
    let other = {
        let m = m.clone();
        std::thread::spawn(move || {
            for _ in 0..iters {
                bump(&m);
            }
        })
    };
    let start = Instant::now();
    for _ in 0..iters {
        bump(&m);
    }
    other.join().unwrap();
    start.elapsed()
}

fn contended(c: &mut Criterion) {
    let mut g = c.benchmark_group("contended hand-off (2 threads)");
    g.bench_function("critio", |b| {
        b.iter_custom(|iters| {
            hand_off(
                iters,
                || critio::sync::Mutex::named("bench", 0u64),
                |m| *m.lock() += 1,
            )
        })
    });
    g.bench_function("parking_lot", |b| {
        b.iter_custom(|iters| hand_off(iters, || parking_lot::Mutex::new(0u64), |m| *m.lock() += 1))
    });
    g.finish();
}

criterion_group!(benches, uncontended, contended);
criterion_main!(benches);
