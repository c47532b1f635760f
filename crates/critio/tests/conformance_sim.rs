//! The simulated device and the fault injector: the conformance suite on
//! each, then power-cut, error-injection and persistence scenarios.
//!
//! The power-cut scenarios check the exact invariant of `device::crash`:
//! after a cut the media equals the last flushed state plus a subset of
//! the unflushed writes applied in completion order (each surviving write
//! whole, or as a prefix of its blocks when tearing is on), and no write
//! that failed with `PoweredOff` is visible. Each runs over many seeds and
//! prints `reproduce with SEED=...` when one fails.

mod common;

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::conformance::{pattern, run_suite};
use common::TempPath;
use critio::context::Class;
use critio::device::crash::CutReport;
use critio::device::faulty::{FaultConfig, FaultyDevice};
use critio::device::mem::MemDevice;
use critio::device::sim::{SimConfig, SimDevice};
use critio::device::{submit_and_wait, AlignedBuf, Command, Device, DeviceError, DeviceOpenError};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const MIB: u64 = 1 << 20;

fn fast_hdd(capacity: u64, seed: u64) -> SimConfig {
    SimConfig {
        speedup: 50.0,
        ..SimConfig::hdd(capacity, seed)
    }
}

fn fast_ssd(capacity: u64, seed: u64) -> SimConfig {
    SimConfig {
        speedup: 10.0,
        ..SimConfig::ssd(capacity, seed)
    }
}

#[test]
fn sim_hdd_conforms() {
    let dev = SimDevice::new(fast_hdd(4 * MIB, 1)).unwrap();
    assert_eq!(dev.info().queue_depth, 32);
    assert_eq!(dev.info().name, "sim-hdd");
    run_suite(Arc::new(dev));
}

#[test]
fn sim_ssd_conforms() {
    run_suite(Arc::new(SimDevice::new(fast_ssd(4 * MIB, 2)).unwrap()));
}

#[test]
fn sim_with_a_file_store_conforms() {
    let file = TempPath::new(&std::env::temp_dir(), "conform.img");
    let dev = SimDevice::new(fast_ssd(4 * MIB, 3).with_file(&file.0)).unwrap();
    run_suite(Arc::new(dev));
}

#[test]
fn faulty_with_faults_off_conforms() {
    let mem: Arc<dyn Device> = Arc::new(MemDevice::new(4 * MIB));
    let dev = FaultyDevice::new(mem, FaultConfig::default()).unwrap();
    assert_eq!(dev.info().name, "faulty(mem)");
    run_suite(Arc::new(dev));
}

#[test]
fn faulty_over_sim_conforms() {
    let sim: Arc<dyn Device> = Arc::new(SimDevice::new(fast_ssd(4 * MIB, 4)).unwrap());
    run_suite(Arc::new(
        FaultyDevice::new(sim, FaultConfig::default()).unwrap(),
    ));
}

#[test]
fn bad_configs_are_clear_errors() {
    let e = SimDevice::hdd(1000, 0)
        .err()
        .expect("capacity 1000 is invalid");
    assert!(
        matches!(
            e,
            DeviceOpenError::InvalidOption {
                field: "capacity",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("multiple of 512"), "{e}");
    let e = SimDevice::new(SimConfig::ssd(MIB, 0).with_file("/nonexistent-dir/x.img"))
        .err()
        .expect("a file in a missing directory");
    assert!(matches!(e, DeviceOpenError::NotFound { .. }), "{e}");
    assert!(e.to_string().contains("backing file"), "{e}");
    assert!(e.to_string().contains("/nonexistent-dir/x.img"), "{e}");
    let mem: Arc<dyn Device> = Arc::new(MemDevice::new(MIB));
    let bad = FaultConfig {
        read_error_rate: 1.5,
        ..FaultConfig::default()
    };
    let e = FaultyDevice::new(mem, bad).err().expect("a rate above 1");
    assert!(e.to_string().contains("read_error_rate"), "{e}");
}

// ---------------------------------------------------------------------------
// Power cuts

/// A device that can lose power.
trait Cuttable: Device {
    fn cut(&self) -> CutReport;
    fn on(&self);
}

impl Cuttable for SimDevice {
    fn cut(&self) -> CutReport {
        self.power_cut().unwrap()
    }
    fn on(&self) {
        self.restart()
    }
}

impl Cuttable for FaultyDevice {
    fn cut(&self) -> CutReport {
        self.power_cut().unwrap()
    }
    fn on(&self) {
        self.restart()
    }
}

const SECTOR: usize = 512;
/// The region the scenario writes: 64 KiB, 128 sectors.
const REGION: usize = 64 * 1024;

/// One write the scenario made: its id (the data is `pattern(id)`), where,
/// how long.
#[derive(Clone, Copy, Debug)]
struct Written {
    id: u64,
    offset: usize,
    len: usize,
}

impl Written {
    fn data(&self) -> AlignedBuf {
        pattern(self.id, self.len)
    }
}

/// What the scenario did before the cut.
#[derive(Default)]
struct History {
    /// Writes covered by a completed flush, in order.
    durable: Vec<Written>,
    /// Completed writes not covered by a flush, in completion order.
    unflushed: Vec<Written>,
    /// Writes that failed with `PoweredOff`.
    failed: Vec<Written>,
}

fn random_write(rng: &mut SmallRng, id: u64) -> Written {
    let sectors = REGION / SECTOR;
    let len = rng.gen_range(1..=16usize);
    let first = rng.gen_range(0..=sectors - len);
    Written {
        id,
        offset: first * SECTOR,
        len: len * SECTOR,
    }
}

/// QD1 writes and flushes, then a few concurrent writes to distinct
/// sectors with the cut while they are in flight.
fn drive(dev: &dyn Cuttable, seed: u64) -> (History, CutReport) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut h = History::default();
    let ops = rng.gen_range(5..40u64);
    for id in 1..=ops {
        if rng.gen_bool(0.2) {
            submit_and_wait(dev, Command::flush(Class::Critical))
                .result
                .unwrap();
            h.durable.append(&mut h.unflushed);
            continue;
        }
        let w = random_write(&mut rng, seed * 1000 + id);
        let cmd = Command::write(w.offset as u64, w.data(), Class::NonCritical);
        submit_and_wait(dev, cmd).result.unwrap();
        h.unflushed.push(w);
    }
    let (tx, rx) = mpsc::channel();
    let inflight = rng.gen_range(0..4usize);
    for k in 0..inflight {
        // Distinct 16 KiB quarters, so their mutual order does not matter.
        let w = Written {
            id: seed * 1000 + 900 + k as u64,
            offset: k * REGION / 4,
            len: rng.gen_range(1..=32usize) * SECTOR,
        };
        let tx = tx.clone();
        let cmd = Command::write(w.offset as u64, w.data(), Class::NonCritical);
        dev.submit(cmd, Box::new(move |c| tx.send((w, c.result)).unwrap()));
    }
    let report = dev.cut();
    for _ in 0..inflight {
        let (w, result) = rx.recv_timeout(common::PATIENCE).expect("a completion");
        match result {
            Ok(()) => h.unflushed.push(w),
            Err(DeviceError::PoweredOff { .. }) => h.failed.push(w),
            Err(e) => panic!("an in-flight write failed with {e}"),
        }
    }
    (h, report)
}

/// Sector `s` of write `w`, if `w` covers it.
fn sector_of(w: &Written, data: &AlignedBuf, s: usize) -> Option<Vec<u8>> {
    let at = s * SECTOR;
    (at >= w.offset && at < w.offset + w.len).then(|| {
        let i = at - w.offset;
        data.as_slice()[i..i + SECTOR].to_vec()
    })
}

/// Checks the media against the history; says what is wrong.
fn check(h: &History, report: &CutReport, media: &[u8], torn: bool) -> Result<(), String> {
    let mut expected = vec![0u8; REGION];
    for w in &h.durable {
        expected[w.offset..w.offset + w.len].copy_from_slice(w.data().as_slice());
    }
    if report.unflushed != h.unflushed.len() as u64 {
        return Err(format!(
            "the device saw {} unflushed writes, the test {}",
            report.unflushed,
            h.unflushed.len()
        ));
    }
    let sector = |buf: &[u8], s: usize| buf[s * SECTOR..(s + 1) * SECTOR].to_vec();
    for w in &h.unflushed {
        let data = w.data();
        let visible: Vec<usize> = (0..REGION / SECTOR)
            .filter(|&s| sector_of(w, &data, s).is_some_and(|d| d == sector(media, s)))
            .collect();
        let Some(&last) = visible.last() else {
            continue; // dropped (or wholly overwritten by later survivors)
        };
        let end = if torn {
            (last + 1) * SECTOR
        } else {
            w.offset + w.len
        };
        expected[w.offset..end].copy_from_slice(&data.as_slice()[..end - w.offset]);
    }
    for w in &h.failed {
        let data = w.data();
        if (0..REGION / SECTOR)
            .any(|s| sector_of(w, &data, s).is_some_and(|d| d == sector(media, s)))
        {
            return Err(format!(
                "write {} failed with PoweredOff but is visible",
                w.id
            ));
        }
    }
    match (0..REGION / SECTOR).find(|&s| sector(media, s) != sector(&expected, s)) {
        None => Ok(()),
        Some(s) => Err(format!(
            "sector {s} is not 'flushed state + surviving writes in order' \
             ({} durable, {} unflushed writes; {report:?})",
            h.durable.len(),
            h.unflushed.len()
        )),
    }
}

fn scenario(make: impl Fn(u64, bool) -> Box<dyn Cuttable>, what: &str) {
    let seeds: Vec<u64> = match std::env::var("SEED").ok().and_then(|s| s.parse().ok()) {
        Some(seed) => vec![seed],
        None => (1..=50).collect(),
    };
    let mut totals = CutReport::default();
    for seed in seeds {
        let torn = seed % 2 == 0;
        let dev = make(seed, torn);
        let (h, report) = drive(&*dev, seed);
        assert!(
            submit_and_wait(&*dev, Command::read(0, 4096, Class::Critical))
                .result
                .is_err(),
            "{what}: a powered-off device served a read; reproduce with SEED={seed}"
        );
        dev.on();
        let c = submit_and_wait(&*dev, Command::read(0, REGION, Class::Critical));
        c.result.unwrap();
        if let Err(e) = check(&h, &report, c.buf.as_slice(), torn) {
            panic!("{what}: {e}; reproduce with SEED={seed}");
        }
        totals.unflushed += report.unflushed;
        totals.survived += report.survived;
        totals.dropped += report.dropped;
        totals.torn += report.torn;
        totals.in_flight += report.in_flight;
    }
    eprintln!("{what}: power cuts over the seeds: {totals:?}");
    assert!(
        totals.survived > 0 && totals.dropped > 0,
        "{what}: {totals:?}"
    );
}

#[test]
fn sim_power_cut_keeps_flushed_writes_and_an_ordered_subset_of_the_rest() {
    scenario(
        |seed, torn| {
            let config = SimConfig {
                torn_writes: torn,
                ..fast_ssd(MIB, seed)
            };
            Box::new(SimDevice::new(config).unwrap())
        },
        "sim-ssd",
    );
}

#[test]
fn sim_hdd_power_cut_keeps_flushed_writes() {
    scenario(
        |seed, torn| {
            let config = SimConfig {
                torn_writes: torn,
                speedup: 200.0,
                ..SimConfig::hdd(MIB, seed)
            };
            Box::new(SimDevice::new(config).unwrap())
        },
        "sim-hdd",
    );
}

#[test]
fn faulty_power_cut_keeps_flushed_writes_and_an_ordered_subset_of_the_rest() {
    scenario(
        |seed, torn| {
            let mem: Arc<dyn Device> = Arc::new(MemDevice::new(MIB));
            let config = FaultConfig {
                seed,
                torn_writes: torn,
                ..FaultConfig::default()
            };
            Box::new(FaultyDevice::new(mem, config).unwrap())
        },
        "faulty(mem)",
    );
}

#[test]
fn faulty_over_a_slow_device_undoes_writes_in_flight_at_the_cut() {
    scenario(
        |seed, torn| {
            let sim: Arc<dyn Device> = Arc::new(SimDevice::new(fast_hdd(MIB, seed)).unwrap());
            let config = FaultConfig {
                seed,
                torn_writes: torn,
                ..FaultConfig::default()
            };
            Box::new(FaultyDevice::new(sim, config).unwrap())
        },
        "faulty(sim-hdd)",
    );
}

#[test]
fn a_sim_flush_covers_writes_submitted_before_it() {
    for seed in 0..10 {
        let dev = SimDevice::new(fast_hdd(MIB, seed)).unwrap();
        let (tx, rx) = mpsc::channel();
        for k in 0..8u64 {
            let tx = tx.clone();
            let cmd = Command::write(k * 8192, pattern(k + 1, 4096), Class::NonCritical);
            dev.submit(cmd, Box::new(move |c| tx.send(c.result.is_ok()).unwrap()));
        }
        submit_and_wait(&dev, Command::flush(Class::Critical))
            .result
            .unwrap();
        dev.power_cut().unwrap();
        dev.restart();
        assert!(
            (0..8).all(|_| rx.recv().unwrap()),
            "reproduce with SEED={seed}"
        );
        for k in 0..8u64 {
            let c = submit_and_wait(&dev, Command::read(k * 8192, 4096, Class::Critical));
            assert!(
                c.buf == pattern(k + 1, 4096),
                "write {k} lost; reproduce with SEED={seed}"
            );
        }
    }
}

#[test]
fn without_a_write_cache_every_completed_write_survives() {
    let config = SimConfig {
        write_cache: false,
        ..fast_ssd(MIB, 5)
    };
    let dev = SimDevice::new(config).unwrap();
    let w = Command::write(4096, pattern(5, 4096), Class::Critical);
    submit_and_wait(&dev, w).result.unwrap();
    assert_eq!(dev.power_cut().unwrap(), CutReport::default());
    dev.restart();
    let c = submit_and_wait(&dev, Command::read(4096, 4096, Class::Critical));
    assert_eq!(c.buf, pattern(5, 4096));
}

// ---------------------------------------------------------------------------
// Injected faults

#[test]
fn injected_errors_come_at_their_rate_and_never_corrupt_data() {
    let seed = common::seed_or(17);
    let mem: Arc<dyn Device> = Arc::new(MemDevice::new(MIB));
    let config = FaultConfig {
        seed,
        read_error_rate: 0.1,
        write_error_rate: 0.1,
        flush_error_rate: 0.1,
        ..FaultConfig::default()
    };
    let dev = FaultyDevice::new(mem, config).unwrap();
    let mut rng = SmallRng::seed_from_u64(seed);
    let blocks = 16u64;
    let mut shadow: Vec<u64> = vec![0; blocks as usize]; // pattern id, 0 = zeros
    let (mut ops, mut errors) = (0u32, 0u32);
    for i in 1..=3000u64 {
        let b = rng.gen_range(0..blocks);
        let c = if rng.gen_bool(0.5) {
            let c = submit_and_wait(
                &dev,
                Command::write(b * 4096, pattern(i, 4096), Class::Critical),
            );
            if c.result.is_ok() {
                shadow[b as usize] = i;
            }
            c
        } else {
            let c = submit_and_wait(&dev, Command::read(b * 4096, 4096, Class::Critical));
            if c.result.is_ok() {
                let want = shadow[b as usize];
                let expect = if want == 0 {
                    AlignedBuf::zeroed(4096)
                } else {
                    pattern(want, 4096)
                };
                assert!(
                    c.buf == expect,
                    "block {b} corrupted; reproduce with SEED={seed}"
                );
            }
            c
        };
        ops += 1;
        match c.result {
            Ok(()) => {}
            Err(DeviceError::Injected { .. }) => errors += 1,
            Err(e) => panic!("unexpected {e}; reproduce with SEED={seed}"),
        }
    }
    let rate = f64::from(errors) / f64::from(ops);
    eprintln!(
        "faulty: {errors} injected errors in {ops} commands ({rate:.3}); {:?}",
        dev.stats()
    );
    assert!(
        (0.07..=0.13).contains(&rate),
        "rate {rate}; reproduce with SEED={seed}"
    );
    let s = dev.stats();
    assert_eq!(u64::from(errors), s.read_errors + s.write_errors);
}

#[test]
fn a_failed_flush_makes_nothing_durable() {
    let mem: Arc<dyn Device> = Arc::new(MemDevice::new(MIB));
    let config = FaultConfig {
        flush_error_rate: 1.0,
        ..FaultConfig::default()
    };
    let dev = FaultyDevice::new(mem, config).unwrap();
    submit_and_wait(&dev, Command::write(0, pattern(1, 4096), Class::Critical))
        .result
        .unwrap();
    let e = submit_and_wait(&dev, Command::flush(Class::Critical))
        .result
        .unwrap_err();
    assert!(matches!(e, DeviceError::Injected { .. }), "{e}");
    assert_eq!(dev.unflushed(), 1);
}

#[test]
fn no_space_after_the_configured_bytes() {
    let mem: Arc<dyn Device> = Arc::new(MemDevice::new(MIB));
    let config = FaultConfig {
        no_space_after_bytes: Some(8192),
        ..FaultConfig::default()
    };
    let dev = FaultyDevice::new(mem, config).unwrap();
    for i in 0..2 {
        let c = submit_and_wait(
            &dev,
            Command::write(i * 4096, pattern(i, 4096), Class::Critical),
        );
        c.result.unwrap();
    }
    let e = submit_and_wait(&dev, Command::write(0, pattern(9, 4096), Class::Critical))
        .result
        .unwrap_err();
    assert!(matches!(e, DeviceError::NoSpace { .. }), "{e}");
    let c = submit_and_wait(&dev, Command::read(0, 4096, Class::Critical));
    assert_eq!(c.buf, pattern(0, 4096), "a refused write changed the data");
}

#[test]
fn latency_spikes_delay_completions_without_blocking_the_submitter() {
    let mem: Arc<dyn Device> = Arc::new(MemDevice::new(MIB));
    let spike = Duration::from_millis(100);
    let config = FaultConfig {
        seed: common::seed_or(3),
        latency_spike_rate: 0.5,
        latency_spike: spike,
        ..FaultConfig::default()
    };
    let dev = FaultyDevice::new(mem, config).unwrap();
    let (tx, rx) = mpsc::channel();
    let start = Instant::now();
    let n = 40;
    for i in 0..n {
        let tx = tx.clone();
        let cmd = Command::read(i * 4096, 4096, Class::Critical);
        dev.submit(
            cmd,
            Box::new(move |c| tx.send((c.result.is_ok(), start.elapsed())).unwrap()),
        );
    }
    assert!(start.elapsed() < spike, "submit blocked on a spike");
    let done: Vec<_> = (0..n)
        .map(|_| rx.recv_timeout(common::PATIENCE).unwrap())
        .collect();
    assert!(done.iter().all(|&(ok, _)| ok));
    let late = done.iter().filter(|&&(_, t)| t >= spike).count() as u64;
    assert_eq!(late, dev.stats().latency_spikes);
    assert!((5..=35).contains(&late), "{late} of {n} spiked");
}

// ---------------------------------------------------------------------------
// Persistence

#[test]
fn a_file_store_survives_a_reopen_and_a_power_cut() {
    let file = TempPath::new(&std::env::temp_dir(), "reopen.img");
    let config = fast_ssd(MIB, 6).with_file(&file.0);
    {
        let dev = SimDevice::new(config.clone()).unwrap();
        assert!(
            dev.info().name.starts_with("sim-ssd:"),
            "{}",
            dev.info().name
        );
        submit_and_wait(
            &dev,
            Command::write(8192, pattern(1, 4096), Class::Critical),
        )
        .result
        .unwrap();
        submit_and_wait(&dev, Command::flush(Class::Critical))
            .result
            .unwrap();
        // An unflushed overwrite, then the power goes.
        submit_and_wait(
            &dev,
            Command::write(8192, pattern(2, 4096), Class::Critical),
        )
        .result
        .unwrap();
        let report = dev.power_cut().unwrap();
        assert_eq!(report.unflushed, 1);
    }
    let dev = SimDevice::new(config).unwrap();
    let c = submit_and_wait(&dev, Command::read(8192, 4096, Class::Critical));
    assert!(
        c.buf == pattern(1, 4096) || c.buf == pattern(2, 4096),
        "neither version"
    );
    submit_and_wait(&dev, Command::write(0, pattern(3, 4096), Class::Critical))
        .result
        .unwrap();
    drop(dev);
    let dev = SimDevice::new(fast_ssd(MIB, 7).with_file(&file.0)).unwrap();
    let c = submit_and_wait(&dev, Command::read(0, 4096, Class::Critical));
    assert_eq!(
        c.buf,
        pattern(3, 4096),
        "a clean shutdown keeps every completed write"
    );
}
