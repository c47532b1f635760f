//! `critio bench block-overhead`: what the block layer costs per request,
//! measured on the `mem` device (which completes inline, so any cost is the
//! layer's own): 4 KiB random reads issued directly to the device, the
//! cheapest way it offers, against the same reads through the full block
//! layer (admission, queues, dispatch, completion, stats), from a
//! foreground thread (critical requests, as on a request's path: the
//! target) and from a background one (non-critical requests, tracked for
//! promotion), in rounds whose order rotates. A second table gives what the
//! layer's clock costs (read twice per request, a floor under the layer's
//! cost), a third repeats the comparison on the simulated SSD (80 µs
//! reads), to put the per-request cost in proportion to a fast device's
//! own latency.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use critio::block::{BlockConfig, BlockLayer};
use critio::context::{self, Class};
use critio::device::mem::MemDevice;
use critio::device::sim::SimDevice;
use critio::device::{submit_and_wait, Command, Device};
use critio::time::Clock;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::report::{Goal, Report, Table, Target};
use super::BenchArgs;

const CAPACITY: u64 = 64 << 20;
const BLOCKS: u64 = CAPACITY / 4096;

/// Reads issued straight to the device, each waited for, the cheapest
/// way the device offers: in the calling thread where it can
/// ([`Device::submit_here`]; the mem device completes inline), else through
/// its completion callback.
fn direct(dev: &dyn Device, ops: u64, rng: &mut SmallRng) -> f64 {
    let here = dev.submits_here();
    let start = Instant::now();
    for _ in 0..ops {
        let offset = rng.gen_range(0..BLOCKS) * 4096;
        let cmd = Command::read(offset, 4096, Class::Critical);
        let c = if here {
            dev.submit_here(cmd)
                .unwrap_or_else(|cmd| submit_and_wait(dev, cmd))
        } else {
            submit_and_wait(dev, cmd)
        };
        c.result.expect("read");
        black_box(c.buf.as_slice()[0]);
    }
    ops as f64 / start.elapsed().as_secs_f64()
}

/// The same reads through the block layer, issued by a foreground thread
/// (critical requests, as on a request's path) or a background one
/// (non-critical: admitted, queued and paced apart, and promotable while
/// outstanding).
fn layered(layer: &BlockLayer, ops: u64, rng: &mut SmallRng, foreground: bool) -> f64 {
    let _fg = foreground.then(context::foreground);
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
        l.push(layered(&layer, ops, &mut rng, true));
    }
    let (dm, lm) = (median(&mut d), median(&mut l));
    let mut t = Table::new(
        &format!(
            "4 KiB random reads on the simulated SSD (80 us reads), QD 1, foreground, median of 3 x {ops}"
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

/// What one read of the layer's clock costs: the layer reads it twice
/// per request (at submission and at completion: the device time feeds the
/// adaptive cap and the stats), a floor under its cost that no queue or
/// lock work can remove.
fn clock_cost(rounds: usize, ops: u64) -> Table {
    let clock = Clock::new();
    let mut ns = Vec::new();
    for _ in 0..rounds {
        let start = Instant::now();
        for _ in 0..ops {
            black_box(clock.now());
        }
        ns.push(start.elapsed().as_nanos() as f64 / ops as f64);
    }
    let per_read = median(&mut ns);
    let mut t = Table::new(
        &format!("the layer's clock, median of {rounds} rounds x {ops} reads"),
        &["what", "ns"],
    );
    t.row(vec![json!("one read"), json!(per_read)]);
    t.row(vec![
        json!("two reads (per request)"),
        json!(2.0 * per_read),
    ]);
    t
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
    // Per path: IOPS of each round, and the ratio to the direct round run
    // next to it (the order rotates, so no path always runs first).
    let (mut d, mut fg, mut bg) = (vec![], vec![], vec![]);
    let (mut fg_ratio, mut bg_ratio) = (vec![], vec![]);
    direct(&*dev, ops / 10, &mut rng); // warm-up
    layered(&layer, ops / 10, &mut rng, true);
    layered(&layer, ops / 10, &mut rng, false);
    for round in 0..rounds {
        let mut iops = [0.0; 3];
        for k in 0..3 {
            let path = (round + k) % 3;
            iops[path] = match path {
                0 => direct(&*dev, ops, &mut rng),
                1 => layered(&layer, ops, &mut rng, true),
                _ => layered(&layer, ops, &mut rng, false),
            };
        }
        d.push(iops[0]);
        fg.push(iops[1]);
        bg.push(iops[2]);
        fg_ratio.push(iops[1] / iops[0]);
        bg_ratio.push(iops[2] / iops[0]);
    }
    let ratio = median(&mut fg_ratio);
    let mut t = Table::new(
        &format!(
            "4 KiB random reads on the mem device, one thread, median of {rounds} rounds x {ops}"
        ),
        &["path", "IOPS", "ns/op", "vs direct"],
    );
    let dm = median(&mut d);
    t.row(vec![
        json!("device directly"),
        json!(dm),
        json!(1e9 / dm),
        json!(1.0),
    ]);
    for (name, iops, r) in [
        ("block layer, foreground", median(&mut fg), ratio),
        (
            "block layer, background",
            median(&mut bg),
            median(&mut bg_ratio),
        ),
    ] {
        t.row(vec![json!(name), json!(iops), json!(1e9 / iops), json!(r)]);
    }
    let clock_table = clock_cost(rounds, ops);
    let ssd_table = ssd_comparison(if args.quick { 500 } else { 5000 })?;
    Ok(Report {
        experiment: "block-overhead".into(),
        description: "the block layer's own cost per request: the mem device completes inline, \
                      so the difference is admission, queues, dispatch and completion bookkeeping; \
                      a foreground thread's reads are critical, a background thread's are not"
            .into(),
        tables: vec![t, clock_table, ssd_table],
        targets: vec![Target::new(
            "layer-foreground-iops-vs-direct",
            ratio,
            Goal::AtLeast(0.9),
            "x",
        )],
    })
}
