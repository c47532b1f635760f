//! HDD model tests, in virtual time: calibration, seek times, read-ahead,
//! the SPTF tail and what priority-aware firmware does to it, aging,
//! determinism, flush barriers.

use super::hdd::{HddModel, HddParams};
use super::model::{Completed, DriveModel, Firmware, Request};
use super::testkit::{mean, ms, quantile, run, Run, Stream};
use crate::device::Op;
use crate::time::{Nanos, MS, US};
use rand::{Rng, SeedableRng};

const TIB: u64 = 1 << 40;

fn hdd(fw: Firmware, seed: u64) -> HddModel {
    HddModel::new(TIB, HddParams::default(), fw, seed)
}

fn random_reads(qd: usize, total: usize) -> Run {
    run(
        &mut hdd(Firmware::default(), 1),
        &[Stream::reads(qd, false)],
        total,
        TIB,
        7,
    )
}

#[test]
fn qd1_random_4k_reads_calibrate_to_a_7200_rpm_drive() {
    let qd1 = random_reads(1, 4000).iops();
    let qd32 = random_reads(32, 20_000).iops();
    eprintln!("hdd random 4 KiB reads: QD1 {qd1:.0} IOPS, QD32 {qd32:.0} IOPS");
    // A 7200 rpm desktop disk: 9 ms average seek + 4.2 ms half a turn.
    assert!((65.0..=90.0).contains(&qd1), "QD1 {qd1:.0} IOPS");
    assert!(qd32 >= 1.5 * qd1, "QD32 {qd32:.0} vs QD1 {qd1:.0} IOPS");
}

#[test]
fn seeks_span_one_to_sixteen_milliseconds_and_average_nine() {
    let m = hdd(Firmware::default(), 1);
    let full = m.seek_ns(0, TIB - 1);
    let near = m.seek_ns(0, 2 << 20);
    eprintln!(
        "hdd seeks: neighbouring track {:.2} ms, full stroke {:.2} ms",
        ms(near as f64),
        ms(full as f64)
    );
    assert!((15 * MS..=18 * MS).contains(&full), "full stroke {full} ns");
    assert!(
        (MS..MS + MS / 10).contains(&near),
        "track to track {near} ns"
    );
    let n = 20_000u64;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
    let total: u64 = (0..n)
        .map(|_| m.seek_ns(rng.gen_range(0..TIB), rng.gen_range(0..TIB)))
        .sum();
    let avg = total as f64 / n as f64;
    eprintln!("hdd average random seek: {:.2} ms", ms(avg));
    assert!((8.5e6..=9.5e6).contains(&avg), "average seek {avg:.0} ns");
}

/// A sequential reader of 64 KiB that thinks `gap` between reads:
/// (latencies, read-ahead hits).
fn sequential_with_gaps(params: HddParams, gap: Nanos) -> (Vec<Nanos>, u64) {
    let mut m = HddModel::new(TIB, params, Firmware::default(), 4);
    let mut latencies = Vec::new();
    let mut out = Vec::new();
    let (mut t, len) = (0, 64 * 1024);
    for i in 0..200u64 {
        m.submit(Request::read(i, (1 << 30) + i * len, len), t);
        out.clear();
        while out.is_empty() {
            let next = m.next_event().expect("the read is outstanding");
            m.pop_completed(next, &mut out);
        }
        latencies.push(out[0].at - t);
        t = out[0].at + gap;
    }
    (latencies, m.readahead_hits())
}

#[test]
fn sequential_reads_hit_the_read_ahead_segment() {
    let on = HddParams::default();
    let off = HddParams {
        readahead_bytes: 0,
        ..on
    };
    let (with, hits) = sequential_with_gaps(on, 2 * MS);
    let (without, _) = sequential_with_gaps(off, 2 * MS);
    eprintln!(
        "hdd sequential 64 KiB reads, 2 ms apart: mean {:.2} ms with read-ahead ({hits} hits of 200), {:.2} ms without",
        ms(mean(&with)),
        ms(mean(&without))
    );
    assert!(hits >= 195, "{hits} read-ahead hits");
    // A hit moves 64 KiB over a 300 MB/s interface: 218 µs.
    assert!(
        quantile(&with, 0.5) < 300 * US,
        "a hit took mechanical time"
    );
    // Without it each read waits most of a turn for its first sector.
    assert!(mean(&without) > 10.0 * mean(&with));
}

#[test]
fn a_write_invalidates_the_read_ahead_segment() {
    let mut m = hdd(Firmware::default(), 6);
    let mut out = Vec::new();
    let mut serve = |m: &mut HddModel, req: Request, at: Nanos| {
        m.submit(req, at);
        out.clear();
        while out.is_empty() {
            let next = m.next_event().expect("outstanding");
            m.pop_completed(next, &mut out);
        }
        out[0].at - at
    };
    let base = 1 << 30;
    let first = serve(&mut m, Request::read(0, base, 4096), 0);
    let t = first + 5 * MS; // 800 KB read ahead by now
    let hit = serve(&mut m, Request::read(1, base + 64 * 1024, 4096), t);
    assert!(hit < 100 * US, "not a hit: {hit} ns");
    let t = t + hit + MS;
    let w = serve(&mut m, Request::write(2, base + 128 * 1024, 4096), t);
    let t = t + w + MS;
    let after = serve(&mut m, Request::read(3, base + 64 * 1024, 4096), t);
    eprintln!(
        "hdd read-ahead: hit {:.3} ms; after an overlapping write the same read takes {:.2} ms",
        ms(hit as f64),
        ms(after as f64)
    );
    assert!(after > MS, "the segment survived the write: {after} ns");
    assert_eq!(m.readahead_hits(), 1);
}

#[test]
fn queued_sequential_reads_stream_at_the_transfer_rate() {
    let s = Stream {
        qd: 4,
        high: false,
        op: Op::Read,
        len: 64 * 1024,
        sequential: true,
    };
    let r = run(&mut hdd(Firmware::default(), 2), &[s], 2000, TIB, 3);
    let mb_s = r.iops() * 64.0 * 1024.0 / 1e6;
    eprintln!("hdd sequential 64 KiB reads at QD4: {mb_s:.0} MB/s");
    assert!(mb_s > 100.0, "{mb_s:.0} MB/s");
}

/// Foreground QD1 random reads (high priority) next to background QD32
/// random reads: (foreground latencies, background IOPS).
fn foreground_under_background(fw: Firmware, seed: u64) -> (Vec<Nanos>, f64) {
    let streams = [Stream::reads(1, true), Stream::reads(32, false)];
    let r = run(&mut hdd(fw, seed), &streams, 60_000, TIB, seed);
    let bg_iops = r.latencies[1].len() as f64 / (r.end as f64 / 1e9);
    (r.latencies[0].clone(), bg_iops)
}

#[test]
fn sptf_gives_the_foreground_a_long_tail_and_priority_cuts_it() {
    let (plain, plain_bg) = foreground_under_background(Firmware::default(), 11);
    let (prio, prio_bg) = foreground_under_background(Firmware::priority_aware(), 11);
    let show = |name: &str, l: &[Nanos], bg: f64| {
        eprintln!(
            "hdd fg QD1 + bg QD32, {name}: fg n={} mean {:.1} ms p99 {:.1} p99.9 {:.1} max {:.1} ms; bg {bg:.0} IOPS",
            l.len(),
            ms(mean(l)),
            ms(quantile(l, 0.99) as f64),
            ms(quantile(l, 0.999) as f64),
            ms(quantile(l, 1.0) as f64),
        );
    };
    show("throughput firmware", &plain, plain_bg);
    show("priority-aware firmware", &prio, prio_bg);
    let plain_tail = quantile(&plain, 0.999);
    let prio_tail = quantile(&prio, 0.999);
    assert!(
        plain.len() >= 500 && prio.len() >= 500,
        "too few foreground samples"
    );
    assert!(
        plain_tail as f64 > 5.0 * mean(&plain),
        "SPTF tail {:.1} ms is not long against its mean {:.1} ms",
        ms(plain_tail as f64),
        ms(mean(&plain))
    );
    // The foreground alone keeps a 16 ms-stroke disk nearly busy, so the
    // background gets through by aging, in trains that the foreground then
    // waits behind: the cut is about 3.5x, and the tail stays below the
    // aging limit.
    assert!(prio_tail * 3 < plain_tail, "priority does not cut the tail");
    assert!(
        prio_tail < Firmware::default().aging_ns,
        "prioritized p99.9 past the aging limit"
    );
    // The foreground now takes most of the drive's time (QD1 random reads
    // gain nothing from reordering), but aging keeps the background going.
    assert!(
        prio_bg > 0.1 * plain_bg,
        "background starved: {prio_bg:.0} IOPS"
    );
}

/// Foreground QD1 (high priority) + background QD32: (foreground latencies,
/// total IOPS).
fn mix_total(fw: Firmware, seed: u64) -> (Vec<Nanos>, f64) {
    let streams = [Stream::reads(1, true), Stream::reads(32, false)];
    let r = run(&mut hdd(fw, seed), &streams, 60_000, TIB, seed);
    (r.latencies[0].clone(), r.iops())
}

#[test]
fn deadline_firmware_bounds_the_foreground_wait_and_keeps_the_throughput() {
    let (plain, plain_total) = mix_total(Firmware::default(), 13);
    let (prio, prio_total) = mix_total(Firmware::priority_deadline(60 * MS), 13);
    let (_, strict_total) = mix_total(Firmware::priority_aware(), 13);
    eprintln!(
        "hdd fg QD1 + bg QD32: deadline 60 ms fg max {:.1} ms (plain {:.1}); total IOPS plain {plain_total:.0}, deadline {prio_total:.0}, strict {strict_total:.0}",
        ms(quantile(&prio, 1.0) as f64),
        ms(quantile(&plain, 1.0) as f64),
    );
    // A high-priority command waits at most the deadline for its turn, plus
    // the command in service and its own positioning.
    assert!(
        quantile(&prio, 1.0) < 60 * MS + 50 * MS,
        "deadline not kept"
    );
    assert!(quantile(&prio, 0.999) * 5 < quantile(&plain, 0.999));
    assert!(
        prio_total > 0.85 * plain_total,
        "the drive lost its reordering"
    );
    assert!(
        strict_total < prio_total,
        "strict precedence costs throughput"
    );
}

#[test]
fn aging_bounds_the_wait_of_low_priority_commands() {
    let streams = [Stream::reads(32, true), Stream::reads(4, false)];
    let fw = Firmware::priority_aware();
    let r = run(&mut hdd(fw, 5), &streams, 20_000, TIB, 5);
    let low = &r.latencies[1];
    let worst = quantile(low, 1.0);
    eprintln!(
        "hdd high QD32 + low QD4, aging {} ms: {} low served, worst wait {:.0} ms",
        fw.aging_ns / MS,
        low.len(),
        ms(worst as f64)
    );
    assert!(low.len() >= 20, "low priority starved");
    assert!(
        worst >= fw.aging_ns,
        "low priority was served without aging"
    );
    assert!(
        worst < fw.aging_ns + 400 * MS,
        "aging did not bound the wait"
    );

    let never = Firmware {
        aging_ns: 60_000 * MS,
        max_age_ns: 60_000 * MS,
        ..fw
    };
    let r = run(&mut hdd(never, 5), &streams, 3000, TIB, 5);
    assert!(r.end < 60_000 * MS);
    assert!(
        r.latencies[1].is_empty(),
        "without aging, low priority should starve"
    );
}

#[test]
fn same_seed_same_run_other_seed_other_run() {
    let streams = [Stream::reads(1, true), Stream::reads(8, false)];
    let a = run(&mut hdd(Firmware::default(), 42), &streams, 2000, TIB, 9);
    let b = run(&mut hdd(Firmware::default(), 42), &streams, 2000, TIB, 9);
    let c = run(&mut hdd(Firmware::default(), 43), &streams, 2000, TIB, 9);
    assert_eq!(a.order, b.order);
    assert_ne!(a.order, c.order);
}

#[test]
fn a_flush_waits_for_earlier_writes_only() {
    let mut m = hdd(Firmware::default(), 3);
    let mut out: Vec<Completed> = Vec::new();
    m.submit(Request::flush(0), 10);
    m.submit(Request::write(1, 4096, 4096), 10);
    m.submit(Request::flush(2), 10);
    m.submit(Request::write(3, 1 << 39, 4096), 10);
    while let Some(t) = m.next_event() {
        m.pop_completed(t, &mut out);
    }
    let at = |id| out.iter().find(|c| c.id == id).expect("completed").at;
    assert_eq!(at(0), 10, "a flush with no earlier writes is immediate");
    assert_eq!(at(2), at(1), "the flush completes with the write before it");
    assert_eq!(m.outstanding(), 0);
    assert_eq!(out.len(), 4);
}

#[test]
fn at_most_queue_depth_commands_enter_the_drive() {
    let mut m = hdd(Firmware::priority_aware(), 4);
    // 40 low-priority reads fill the 32 slots; a high one queued behind
    // them on the host waits for a slot before the firmware can prefer it.
    for id in 0..40 {
        m.submit(Request::read(id, id * (1 << 30), 4096), 0);
    }
    m.submit(Request::read(40, 0, 4096).with_priority(true), 0);
    assert_eq!(m.outstanding(), 41);
    assert_eq!(m.queue_depth(), 32);
    let mut out = Vec::new();
    while let Some(t) = m.next_event() {
        m.pop_completed(t, &mut out);
    }
    let pos = out.iter().position(|c| c.id == 40).expect("completed");
    assert!(
        pos >= 9,
        "the high read overtook the host FIFO (position {pos})"
    );
    assert!(
        pos <= 10,
        "the high read was not first once inside (position {pos})"
    );
}
