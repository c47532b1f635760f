//! SSD model tests, in virtual time: read latency and die parallelism, the
//! write buffer (fast acknowledgement, stalls when full, reads from it),
//! flushes that wait for the drain, garbage collection by the data-sheet
//! formula, priority per die, determinism.

use super::model::{DriveModel, Firmware, Request};
use super::ssd::{SsdModel, SsdParams};
use super::testkit::{mean, ms, quantile, run, Stream};
use crate::device::Op;
use crate::time::{Nanos, MS, US};

const GIB: u64 = 1 << 30;
const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

fn ssd(fw: Firmware, seed: u64) -> SsdModel {
    SsdModel::new(16 * GIB, SsdParams::default(), fw, seed)
}

fn no_gc() -> SsdParams {
    SsdParams {
        gc: false,
        ..SsdParams::default()
    }
}

fn writes(qd: usize, high: bool) -> Stream {
    Stream {
        op: Op::Write,
        ..Stream::reads(qd, high)
    }
}

/// Runs the model until `id` completes; returns its completion time.
fn until_done(m: &mut SsdModel, id: u64) -> Nanos {
    let mut out = Vec::new();
    while let Some(t) = m.next_event() {
        m.pop_completed(t, &mut out);
        if let Some(c) = out.iter().find(|c| c.id == id) {
            return c.at;
        }
    }
    panic!("request {id} never completed");
}

#[test]
fn reads_take_the_page_read_time_and_dies_add_up() {
    let qd1 = run(
        &mut ssd(Firmware::default(), 1),
        &[Stream::reads(1, false)],
        1000,
        16 * GIB,
        1,
    );
    assert!(
        qd1.latencies[0].iter().all(|&l| l == 50 * US),
        "tR is 50 µs"
    );
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
        "dies do not work in parallel"
    );
    let mut m = ssd(Firmware::default(), 1);
    m.submit(Request::read(0, 0, 64 * KIB), 0);
    assert_eq!(m.next_event(), Some(50 * US), "16 pages on 16 of 32 dies");
}

#[test]
fn a_write_is_acknowledged_from_the_buffer_in_microseconds() {
    let mut m = ssd(Firmware::default(), 1);
    m.submit(Request::write(0, 8192, 4096), 0);
    let at = until_done(&mut m, 0);
    eprintln!("ssd 4 KiB write into an empty buffer: {at} ns");
    assert_eq!(at, 2048, "4 KiB over a 2 GB/s link");
    assert_eq!(m.buffered_bytes(), 4096, "the data waits in the buffer");
}

#[test]
fn a_burst_beyond_the_buffer_waits_for_the_drain() {
    let burst = Stream {
        len: 64 * KIB,
        ..writes(64, false)
    };
    let go = |params: SsdParams| {
        let mut m = SsdModel::new(16 * GIB, params, Firmware::default(), 5);
        let r = run(&mut m, &[burst], 4096, 16 * GIB, 5);
        let mb_s = r.order.len() as f64 * 64.0 * 1024.0 / (r.end as f64 / 1e9) / 1e6;
        (r, mb_s, m.stats())
    };
    let (r, plain_mb_s, stats) = go(no_gc());
    let (_, gc_mb_s, _) = go(SsdParams::default());
    let l = &r.latencies[0];
    eprintln!(
        "ssd 64 KiB random writes QD64, 256 MiB: {plain_mb_s:.0} MB/s without GC, {gc_mb_s:.0} MB/s with; first ack {:.3} ms, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; {} waits for room",
        ms(l[0] as f64),
        ms(quantile(l, 0.5) as f64),
        ms(quantile(l, 0.99) as f64),
        ms(quantile(l, 1.0) as f64),
        stats.buffer_full_waits,
    );
    // 32 dies x 8 KiB per 900 µs.
    assert!(
        (270.0..=310.0).contains(&plain_mb_s),
        "{plain_mb_s:.0} MB/s"
    );
    assert!(gc_mb_s < plain_mb_s * 0.95, "GC costs no bandwidth");
    assert!(gc_mb_s > plain_mb_s * 0.6, "GC costs too much");
    assert!(l[0] < 100 * US, "the first writes go into an empty buffer");
    assert!(stats.buffer_full_waits > 3000, "the buffer never filled");
    assert!(quantile(l, 0.5) > 10 * MS, "a full buffer does not stall");
}

#[test]
fn a_flush_waits_until_the_buffer_is_programmed() {
    let p = no_gc();
    let mut m = SsdModel::new(16 * GIB, p, Firmware::default(), 1);
    // Nothing buffered: at once.
    m.submit(Request::flush(0), 0);
    assert_eq!(until_done(&mut m, 0), 0);
    // One 4 KiB write: its page is padded and programmed.
    m.submit(Request::write(1, 0, 4096), 0);
    let acked = until_done(&mut m, 1);
    m.submit(Request::flush(2), acked);
    assert_eq!(until_done(&mut m, 2), acked + p.program_ns);
    // 4 MiB: 512 two-plane pages, 16 on each of the 32 dies.
    let t0 = 10 * MS;
    for i in 0..4 {
        m.submit(Request::write(10 + i, GIB + i * MIB, MIB), t0);
    }
    let acked = until_done(&mut m, 13);
    m.submit(Request::flush(20), acked);
    let write_after = Request::write(21, 2 * GIB, MIB);
    m.submit(write_after, acked);
    let done = until_done(&mut m, 20);
    let drain = done - t0;
    eprintln!(
        "ssd flush after 4 MiB of writes: writes acked in {:.2} ms, flush done {:.2} ms after the first write",
        ms((acked - t0) as f64),
        ms(drain as f64)
    );
    assert!(drain >= 16 * p.program_ns, "faster than the flash");
    assert!(
        drain <= 16 * p.program_ns + (acked - t0),
        "slower than the drain"
    );
    assert_eq!(m.outstanding(), 0, "the later write waits for nothing");
}

#[test]
fn a_read_of_buffered_data_is_served_from_the_buffer() {
    let mut m = ssd(Firmware::default(), 1);
    m.submit(Request::write(0, GIB, 64 * KIB), 0);
    let t = until_done(&mut m, 0);
    m.submit(Request::read(1, GIB + 4096, 8192), t);
    m.submit(Request::read(2, GIB + 60 * KIB, 8192), t);
    assert_eq!(until_done(&mut m, 1) - t, 4096, "8 KiB over the link");
    assert_eq!(
        until_done(&mut m, 2) - t,
        50 * US,
        "half of it is not buffered"
    );
    assert_eq!(m.stats().buffer_hits, 1);
}

#[test]
fn gc_stalls_follow_the_data_sheet_formula() {
    // One die, one plane, four pages a block: a collection every four
    // programs, then a read on that die waits for it.
    let p = SsdParams {
        channels: 1,
        dies_per_channel: 1,
        planes_per_die: 1,
        pages_per_block: 4,
        ..SsdParams::default()
    };
    let stalls: Vec<Nanos> = (0..3).map(|v| p.gc_stall_ns(v)).collect();
    assert_eq!(stalls, [3500 * US, 4450 * US, 5400 * US]);
    for seed in 0..8 {
        let mut m = SsdModel::new(GIB, p, Firmware::default(), seed);
        for i in 0..4 {
            m.submit(Request::write(i, i * 4096, 4096), 0);
        }
        let acked = until_done(&mut m, 3);
        m.submit(Request::flush(9), acked);
        let flushed = until_done(&mut m, 9);
        m.submit(Request::read(10, GIB / 2, 4096), flushed);
        let wait = until_done(&mut m, 10) - flushed - p.read_ns;
        let s = m.stats();
        assert_eq!((s.gc_stalls, s.programs), (1, 4));
        assert_eq!(wait, p.gc_stall_ns(s.gc_valid_pages as u32), "seed {seed}");
        assert!(stalls.contains(&wait), "valid pages beyond 50% of a block");
    }
    // The default drive: one stall per 128 programs on each die.
    let mut m = ssd(Firmware::default(), 7);
    run(
        &mut m,
        &[Stream {
            len: 64 * KIB,
            ..writes(64, false)
        }],
        4096,
        16 * GIB,
        4,
    );
    let s = m.stats();
    let d = SsdParams::default();
    eprintln!(
        "ssd 256 MiB of writes: {} programs, {} GC stalls, mean {:.1} valid pages, mean stall {:.1} ms",
        s.programs,
        s.gc_stalls,
        s.gc_valid_pages as f64 / s.gc_stalls as f64,
        ms(s.gc_ns as f64 / s.gc_stalls as f64)
    );
    let blocks = s.programs / 128;
    assert!(
        s.gc_stalls <= blocks && s.gc_stalls + 32 > blocks,
        "one stall per block per die"
    );
    assert_eq!(
        s.gc_ns,
        s.gc_stalls * d.erase_ns + s.gc_valid_pages * (d.read_ns + d.program_ns)
    );
}

#[test]
fn priority_aware_dies_serve_high_priority_reads_first() {
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
    let (p, q) = (&plain.latencies[0], &prio.latencies[0]);
    eprintln!(
        "ssd fg QD1 reads + bg QD64 writes: fg mean {:.2} ms p99 {:.2} ms plain, mean {:.2} ms p99 {:.2} ms priority-aware",
        ms(mean(p)),
        ms(quantile(p, 0.99) as f64),
        ms(mean(q)),
        ms(quantile(q, 0.99) as f64),
    );
    assert!(
        mean(q) * 2.0 < mean(p),
        "priority did not help the foreground"
    );
}

#[test]
fn same_seed_same_run_other_seed_other_run() {
    let go = |seed| {
        let mut m = ssd(Firmware::default(), seed);
        let r = run(
            &mut m,
            &[writes(16, false), Stream::reads(4, false)],
            40_000,
            16 * GIB,
            4,
        );
        (m.stats(), r.order)
    };
    let (a, b, c) = (go(7), go(7), go(8));
    assert!(a.0.gc_stalls > 0, "no GC stalls in 40000 requests");
    assert_eq!(a, b);
    assert_ne!(a, c);
}
