//! `critio bench block-overhead`: what the block layer costs per request,
//! measured on the `mem` device (which completes inline, so any cost is the
//! layer's own): 4 KiB random reads issued directly to the device against
//! the same reads through the full block layer (admission, queues, dispatch,
//! completion, stats), side by side in alternating rounds. A second table
//! repeats the comparison on the simulated SSD (80 µs reads), to put the
//! per-request cost in proportion to a fast device's own latency.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use critio::block::{BlockConfig, BlockLayer};
use critio::context::Class;
use critio::device::mem::MemDevice;
use critio::device::sim::SimDevice;
use critio::device::{submit_and_wait, Command, Completion, Device};
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::report::{Goal, Report, Table, Target};
use super::BenchArgs;

const CAPACITY: u64 = 64 << 20;
const BLOCKS: u64 = CAPACITY / 4096;

/// Reads issued straight to the device, waiting for each completion.
fn direct(dev: &dyn Device, ops: u64, rng: &mut SmallRng) -> f64 {
    let slot: Arc<Mutex<Option<Completion>>> = Arc::new(Mutex::new(None));
    let start = Instant::now();
    for _ in 0..ops {
        let offset = rng.gen_range(0..BLOCKS) * 4096;
        if dev.info().name != "mem" {
            let c = submit_and_wait(dev, Command::read(offset, 4096, Class::Critical));
            c.result.expect("read");
            continue;
        }
        let s = slot.clone();
        dev.submit(
            Command::read(offset, 4096, Class::Critical),
            Box::new(move |c| *s.lock() = Some(c)),
        );
        let c = slot.lock().take().expect("mem completes inline");
        c.result.expect("read");
        black_box(c.buf.as_slice()[0]);
    }
    ops as f64 / start.elapsed().as_secs_f64()
}

/// The same reads through the block layer.
fn layered(layer: &BlockLayer, ops: u64, rng: &mut SmallRng) -> f64 {
    let start = Instant::now();
    for _ in 0..ops {
        let offset = rng.gen_range(0..BLOCKS) * 4096;
        black_box(layer.read(offset, 4096).expect("read"));
    }
    ops as f64 / start.elapsed().as_secs_f64()
}

/// The same comparison on the simulated SSD (real-time driver), QD 1.
fn ssd_comparison(ops: u64) -> Result<Table, String> {
    let dev = Arc::new(SimDevice::ssd(CAPACITY, 3).map_err(|e| e.to_string())?);
    let layer = BlockLayer::new(dev.clone(), BlockConfig::default()).map_err(|e| e.to_string())?;
    let mut rng = SmallRng::seed_from_u64(9);
    let (mut d, mut l) = (vec![], vec![]);
    for _ in 0..3 {
        d.push(direct(&*dev, ops, &mut rng));
        l.push(layered(&layer, ops, &mut rng));
    }
    let (dm, lm) = (median(&mut d), median(&mut l));
    let mut t = Table::new(
        &format!(
            "4 KiB random reads on the simulated SSD (80 us reads), QD 1, median of 3 x {ops}"
        ),
        &["path", "IOPS", "us/op", "vs direct"],
    );
    t.row(vec![
        json!("device directly"),
        json!(dm),
        json!(1e6 / dm),
        json!(1.0),
    ]);
    t.row(vec![
        json!("through the block layer"),
        json!(lm),
        json!(1e6 / lm),
        json!(lm / dm),
    ]);
    Ok(t)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the experiment.
pub fn run(args: &BenchArgs) -> Result<Report, String> {
    let (rounds, ops) = if args.quick {
        (5, 20_000)
    } else {
        (15, 200_000)
    };
    let dev = Arc::new(MemDevice::new(CAPACITY));
    let layer = BlockLayer::new(dev.clone(), BlockConfig::default()).map_err(|e| e.to_string())?;
    let mut rng = SmallRng::seed_from_u64(7);
    let (mut d, mut l, mut ratios) = (vec![], vec![], vec![]);
    direct(&*dev, ops / 10, &mut rng); // warm-up
    layered(&layer, ops / 10, &mut rng);
    for round in 0..rounds {
        let (a, b) = if round % 2 == 0 {
            let a = direct(&*dev, ops, &mut rng);
            (a, layered(&layer, ops, &mut rng))
        } else {
            let b = layered(&layer, ops, &mut rng);
            (direct(&*dev, ops, &mut rng), b)
        };
        d.push(a);
        l.push(b);
        ratios.push(b / a);
    }
    let ratio = median(&mut ratios);
    let mut t = Table::new(
        &format!(
            "4 KiB random reads on the mem device, one thread, median of {rounds} rounds x {ops}"
        ),
        &["path", "IOPS", "ns/op", "vs direct"],
    );
    let (dm, lm) = (median(&mut d), median(&mut l));
    t.row(vec![
        json!("device directly"),
        json!(dm),
        json!(1e9 / dm),
        json!(1.0),
    ]);
    t.row(vec![
        json!("through the block layer"),
        json!(lm),
        json!(1e9 / lm),
        json!(ratio),
    ]);
    let ssd_table = ssd_comparison(if args.quick { 500 } else { 5000 })?;
    Ok(Report {
        experiment: "block-overhead".into(),
        description: "the block layer's own cost per request: the mem device completes inline, \
                      so the difference is admission, queues, dispatch and completion bookkeeping"
            .into(),
        tables: vec![t, ssd_table],
        targets: vec![Target::new(
            "layer-iops-vs-direct",
            ratio,
            Goal::AtLeast(0.9),
            "x",
        )],
    })
}
