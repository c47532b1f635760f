//! SSD model tests, in virtual time: latencies, channel parallelism, seeded
//! garbage-collection stalls, priority per channel.

use super::model::{DriveModel, Firmware, Request};
use super::ssd::{SsdModel, SsdParams};
use super::testkit::{mean, ms, quantile, run, Stream};
use crate::device::Op;
use crate::time::{MS, US};

const GIB: u64 = 1 << 30;

fn ssd(fw: Firmware, seed: u64) -> SsdModel {
    SsdModel::new(16 * GIB, SsdParams::default(), fw, seed)
}

fn writes(qd: usize, high: bool) -> Stream {
    Stream {
        op: Op::Write,
        ..Stream::reads(qd, high)
    }
}

#[test]
fn reads_take_the_page_latency_and_channels_add_up() {
    let qd1 = run(
        &mut ssd(Firmware::default(), 1),
        &[Stream::reads(1, false)],
        1000,
        16 * GIB,
        1,
    );
    assert!(qd1.latencies[0].iter().all(|&l| l == 80 * US));
    let qd32 = run(
        &mut ssd(Firmware::default(), 1),
        &[Stream::reads(32, false)],
        20_000,
        16 * GIB,
        1,
    );
    eprintln!(
        "ssd random 4 KiB reads: QD1 {:.0} IOPS, QD32 {:.0} IOPS",
        qd1.iops(),
        qd32.iops()
    );
    assert!(
        qd32.iops() > 5.0 * qd1.iops(),
        "channels do not work in parallel"
    );
    let mut m = ssd(Firmware::default(), 1);
    m.submit(Request::read(0, 0, 64 * 1024), 0);
    assert_eq!(
        m.next_event(),
        Some(2 * 80 * US),
        "16 pages over 8 channels"
    );
}

#[test]
fn gc_stalls_happen_and_follow_the_seed() {
    let go = |seed| {
        let mut m = ssd(Firmware::default(), seed);
        let r = run(&mut m, &[writes(16, false)], 20_000, 16 * GIB, 4);
        (m.gc_stalls(), r)
    };
    let (stalls, a) = go(7);
    let (stalls_again, b) = go(7);
    let (other_stalls, c) = go(8);
    let worst = quantile(&a.latencies[0], 1.0);
    eprintln!(
        "ssd random 4 KiB writes QD16: {stalls} GC stalls, mean {:.2} ms, max {:.2} ms",
        ms(mean(&a.latencies[0])),
        ms(worst as f64)
    );
    assert!(stalls >= 5, "{stalls} GC stalls in 20000 writes");
    assert!(worst >= 2 * MS, "no write waited behind a stall");
    assert_eq!((stalls, &a.order), (stalls_again, &b.order));
    assert!(other_stalls != stalls || a.order != c.order);
}

#[test]
fn priority_aware_channels_serve_high_priority_first() {
    let streams = [Stream::reads(1, true), writes(64, false)];
    let plain = run(
        &mut ssd(Firmware::default(), 3),
        &streams,
        20_000,
        16 * GIB,
        3,
    );
    let prio = run(
        &mut ssd(Firmware::priority_aware(), 3),
        &streams,
        20_000,
        16 * GIB,
        3,
    );
    let (p, q) = (mean(&plain.latencies[0]), mean(&prio.latencies[0]));
    eprintln!(
        "ssd fg QD1 reads + bg QD64 writes: fg mean {:.2} ms plain, {:.2} ms priority-aware",
        ms(p),
        ms(q)
    );
    assert!(q * 2.0 < p, "priority did not help the foreground");
}
