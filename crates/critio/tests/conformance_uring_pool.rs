//! The real backends: the conformance suite on `pool` and `uring`, their
//! open errors, and the kernel I/O priorities they hand over.
//!
//! `uring` runs on a file under `CARGO_TARGET_TMPDIR` (beside the target
//! directory, so on a disk-backed filesystem); where this kernel or
//! filesystem lacks io_uring or O_DIRECT the test prints `skipped: <why>`
//! and passes. Tests that need the RT class drop their own thread's
//! `CAP_SYS_NICE`/`CAP_SYS_ADMIN` to see the fallback.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use common::TempPath;
use critio::context::Class;
use critio::device::pool::{PoolDevice, PoolOptions};
use critio::device::uring::{
    thread_ioprio, ClassPriorities, IoPriority, UringDevice, UringOptions,
};
use critio::device::{submit_and_wait, AlignedBuf, Command, Device, DeviceOpenError};
use rustix::thread::{capabilities, set_capabilities, CapabilitySet};

const SIZE: u64 = 4 << 20;

/// A directory on a disk-backed filesystem.
fn disk_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

/// A fresh uring device, or `None` (printed) where the kernel or the
/// filesystem cannot provide one.
fn uring_or_skip(path: &TempPath, options: UringOptions) -> Option<UringDevice> {
    let options = UringOptions {
        create_size: Some(SIZE),
        ..options
    };
    match UringDevice::open(&path.0, options) {
        Ok(dev) => Some(dev),
        Err(e @ DeviceOpenError::Unsupported { .. }) => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn pool(path: &TempPath, options: PoolOptions) -> PoolDevice {
    let options = PoolOptions {
        create_size: Some(SIZE),
        ..options
    };
    PoolDevice::open(&path.0, options).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `f` on a thread of its own without the privilege to use the RT
/// I/O class, and waits for it.
fn without_rt(f: impl FnOnce() + Send + 'static) {
    std::thread::spawn(move || {
        let mut caps = capabilities(None).expect("capget");
        caps.effective -= CapabilitySet::SYS_NICE | CapabilitySet::SYS_ADMIN;
        set_capabilities(None, caps).expect("dropping capabilities is always allowed");
        f()
    })
    .join()
    .unwrap()
}

fn write_read(dev: &dyn Device, offset: u64, class: Class) {
    let data = common::conformance::pattern(offset, 8192);
    let c = submit_and_wait(dev, Command::write(offset, data.clone(), class));
    c.result.unwrap();
    let c = submit_and_wait(dev, Command::read(offset, 8192, class));
    c.result.unwrap();
    assert_eq!(c.buf, data);
}

#[test]
fn pool_conforms_on_the_temp_dir() {
    let path = TempPath::new(&std::env::temp_dir(), "pool");
    let dev = pool(&path, PoolOptions::default());
    assert_eq!(dev.info().block_size, 512);
    assert_eq!(dev.info().capacity, SIZE);
    common::conformance::run_suite(Arc::new(dev));
}

#[test]
fn pool_with_o_direct_conforms_on_disk() {
    let path = TempPath::new(&disk_dir(), "pool-direct");
    let options = PoolOptions {
        direct: true,
        ..PoolOptions::default()
    };
    let dev = pool(&path, options);
    assert_eq!(dev.info().block_size, 4096);
    common::conformance::run_suite(Arc::new(dev));
}

#[test]
fn uring_conforms_on_disk() {
    let path = TempPath::new(&disk_dir(), "uring");
    let Some(dev) = uring_or_skip(&path, UringOptions::default()) else {
        return;
    };
    let info = dev.info().clone();
    assert_eq!(
        (info.block_size, info.capacity, info.queue_depth),
        (4096, SIZE, 128)
    );
    assert!(info.name.starts_with("uring:"), "{}", info.name);
    common::conformance::run_suite(Arc::new(dev));
}

#[test]
fn uring_flushes_in_its_callers_thread_and_the_block_layer_uses_it() {
    let path = TempPath::new(&disk_dir(), "uring-flush-here");
    let Some(dev) = uring_or_skip(&path, UringOptions::default()) else {
        return;
    };
    assert!(dev.flushes_here());
    assert!(matches!(dev.flush_here(), Some(Ok(()))));
    let dev = Arc::new(dev);
    let l = critio::block::BlockLayer::new(dev.clone(), Default::default()).unwrap();
    critio::context::set_foreground();
    l.write(0, AlignedBuf::from_slice(&[9; 4096])).unwrap();
    l.flush().unwrap();
    assert_eq!(l.read(0, 4096).unwrap().as_slice(), &[9; 4096]);
    let s = l.stats();
    assert_eq!(
        s.class(Class::Critical).completions,
        3,
        "write, flush, read"
    );
}

/// Reads and writes on the caller's own ring: the data round-trips (a
/// 1 MiB write over a 4 KiB read, each class), a bad command fails with
/// the validation error, a flush is handed back, and the rings of two
/// devices in one thread stay apart.
#[test]
fn uring_reads_and_writes_in_its_callers_thread() {
    let (pa, pb) = (
        TempPath::new(&disk_dir(), "uring-here-a"),
        TempPath::new(&disk_dir(), "uring-here-b"),
    );
    let (Some(a), Some(b)) = (
        uring_or_skip(&pa, UringOptions::default()),
        uring_or_skip(&pb, UringOptions::default()),
    ) else {
        return;
    };
    assert!(a.submits_here());
    let here = |dev: &dyn Device, cmd: Command| match dev.submit_here(cmd) {
        Ok(c) => c,
        Err(_) => panic!("a read or write was handed back"),
    };
    let big: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    let c = here(
        &a,
        Command::write(0, AlignedBuf::from_slice(&big), Class::NonCritical),
    );
    c.result.unwrap();
    let c = here(
        &b,
        Command::write(0, AlignedBuf::from_slice(&[3; 4096]), Class::Critical),
    );
    c.result.unwrap();
    let c = here(&a, Command::read(4096, 4096, Class::Critical));
    c.result.unwrap();
    assert_eq!(c.buf.as_slice(), &big[4096..8192]);
    let c = here(&b, Command::read(0, 4096, Class::NonCritical));
    assert_eq!(c.buf.as_slice(), &[3; 4096], "each device its own ring");
    let c = here(&a, Command::read(100, 4096, Class::Critical));
    assert!(c.result.is_err(), "a misaligned read fails");
    let flush = Command::flush(Class::Critical);
    assert!(a.submit_here(flush).is_err(), "a flush is handed back");
    // Through the shared ring the data is the same.
    let c = submit_and_wait(&a, Command::read(0, 1 << 20, Class::Critical));
    assert_eq!(c.buf.as_slice(), &big[..]);
}

/// A write done in its caller's thread (`pwrite`, which carries the
/// thread's I/O priority, not a per-request one) takes the request's
/// priority for the write and leaves the thread with its own after it,
/// whatever that was; with per-request priorities off the thread's own is
/// never touched.
#[test]
fn uring_write_in_its_callers_thread_gives_the_thread_its_priority_back() {
    let path = TempPath::new(&disk_dir(), "uring-here-prio");
    let Some(dev) = uring_or_skip(&path, UringOptions::default()) else {
        return;
    };
    let write = |dev: &UringDevice, class: Class, fill: u8| {
        let cmd = Command::write(0, AlignedBuf::from_slice(&[fill; 4096]), class);
        match dev.submit_here(cmd) {
            Ok(c) => c.result.unwrap(),
            Err(_) => panic!("a write was handed back"),
        }
    };
    let before = thread_ioprio(0).unwrap();
    for own in [
        IoPriority::None,
        IoPriority::BestEffort(5),
        IoPriority::Idle,
    ] {
        critio::sys::set_thread_ioprio(0, own).unwrap();
        for (i, class) in [Class::Critical, Class::NonCritical]
            .into_iter()
            .enumerate()
        {
            write(&dev, class, i as u8 + 1);
            assert_eq!(thread_ioprio(0).unwrap(), own, "after a {class:?} write");
        }
    }
    let c = submit_and_wait(&dev, Command::read(0, 4096, Class::Critical));
    assert_eq!(c.buf.as_slice(), &[2; 4096], "the writes landed");
    drop(dev);
    let off = UringOptions {
        per_request_ioprio: false,
        ..UringOptions::default()
    };
    let Some(dev) = uring_or_skip(&path, off) else {
        return;
    };
    critio::sys::set_thread_ioprio(0, IoPriority::BestEffort(6)).unwrap();
    write(&dev, Class::Critical, 7);
    assert_eq!(thread_ioprio(0).unwrap(), IoPriority::BestEffort(6));
    critio::sys::set_thread_ioprio(0, before).unwrap();
}

#[test]
fn uring_conforms_with_per_request_ioprio_off() {
    let path = TempPath::new(&disk_dir(), "uring-noprio");
    let options = UringOptions {
        per_request_ioprio: false,
        entries: 8,
        ..UringOptions::default()
    };
    let Some(dev) = uring_or_skip(&path, options) else {
        return;
    };
    assert_eq!(dev.effective_priorities(), ClassPriorities::NONE);
    // 8 entries: the suite's 64 concurrent writes also exercise the queue
    // of commands waiting for a slot.
    common::conformance::run_suite(Arc::new(dev));
}

#[test]
fn uring_requests_complete_with_each_priority_setting() {
    let settings = [
        (true, ClassPriorities::default()),
        (
            true,
            ClassPriorities {
                critical: IoPriority::BestEffort(0),
                non_critical: IoPriority::BestEffort(7),
            },
        ),
        (false, ClassPriorities::default()),
    ];
    for (i, (per_request_ioprio, priorities)) in settings.into_iter().enumerate() {
        let path = TempPath::new(&disk_dir(), &format!("uring-prio-{i}"));
        let options = UringOptions {
            per_request_ioprio,
            priorities,
            ..UringOptions::default()
        };
        let Some(dev) = uring_or_skip(&path, options) else {
            return;
        };
        write_read(&dev, 0, Class::Critical);
        write_read(&dev, 65536, Class::NonCritical);
        let flush = submit_and_wait(&dev, Command::flush(Class::NonCritical));
        flush.result.unwrap();
        let expected = if per_request_ioprio {
            priorities
        } else {
            ClassPriorities::NONE
        };
        // Running as root (as here and in CI), RT is never refused.
        if rustix::process::geteuid().is_root() {
            assert_eq!(dev.effective_priorities(), expected);
        }
    }
}

#[test]
fn uring_falls_back_to_best_effort_when_rt_is_refused() {
    let path = TempPath::new(&disk_dir(), "uring-fallback");
    let Some(dev) = uring_or_skip(&path, UringOptions::default()) else {
        return;
    };
    let dev = Arc::new(dev);
    let d = dev.clone();
    // The kernel checks the privilege of the thread that enters the ring.
    without_rt(move || {
        write_read(&*d, 4096, Class::Critical);
        write_read(&*d, 16384, Class::NonCritical);
    });
    let p = dev.effective_priorities();
    assert_eq!(p.critical, IoPriority::BestEffort(0));
    assert_eq!(p.non_critical, IoPriority::Idle);
    write_read(&*dev, 4096, Class::Critical);
    // A write in its caller's thread takes the request's priority for the
    // thread (`ioprio_set`), which the kernel refuses the same way.
    let path = TempPath::new(&disk_dir(), "uring-fallback-here");
    let Some(dev) = uring_or_skip(&path, UringOptions::default()) else {
        return;
    };
    let dev = Arc::new(dev);
    let d = dev.clone();
    without_rt(move || {
        let cmd = Command::write(0, AlignedBuf::from_slice(&[5; 4096]), Class::Critical);
        match d.submit_here(cmd) {
            Ok(c) => c.result.unwrap(),
            Err(_) => panic!("a write was handed back"),
        }
        assert_eq!(thread_ioprio(0).unwrap(), IoPriority::None, "given back");
    });
    assert_eq!(
        dev.effective_priorities().critical,
        IoPriority::BestEffort(0)
    );
    let c = submit_and_wait(&*dev, Command::read(0, 4096, Class::Critical));
    assert_eq!(c.buf.as_slice(), &[5; 4096]);
}

#[test]
fn pool_workers_run_at_their_class_priority() {
    let custom = ClassPriorities {
        critical: IoPriority::BestEffort(1),
        non_critical: IoPriority::BestEffort(6),
    };
    for (i, priorities) in [ClassPriorities::default(), custom].into_iter().enumerate() {
        let path = TempPath::new(&std::env::temp_dir(), &format!("pool-prio-{i}"));
        let options = PoolOptions {
            priorities,
            critical_workers: 3,
            non_critical_workers: 1,
            ..PoolOptions::default()
        };
        let dev = pool(&path, options);
        let effective = dev.effective_priorities();
        if rustix::process::geteuid().is_root() {
            assert_eq!(effective, priorities);
        }
        let tids = dev.worker_tids();
        assert_eq!(tids.len(), 4);
        for (class, tid) in tids {
            assert_eq!(
                thread_ioprio(tid).unwrap(),
                effective.of(class),
                "{class:?}"
            );
        }
    }
}

#[test]
fn pool_workers_fall_back_to_best_effort_when_rt_is_refused() {
    // Workers inherit the credentials of the thread that starts them.
    without_rt(|| {
        let path = TempPath::new(&std::env::temp_dir(), "pool-fallback");
        let dev = pool(&path, PoolOptions::default());
        let p = dev.effective_priorities();
        assert_eq!(p.critical, IoPriority::BestEffort(0));
        assert_eq!(p.non_critical, IoPriority::Idle);
        for (class, tid) in dev.worker_tids() {
            assert_eq!(thread_ioprio(tid).unwrap(), p.of(class));
        }
        write_read(&dev, 0, Class::Critical);
    });
}

#[test]
fn pool_without_worker_ioprio_leaves_threads_alone() {
    let path = TempPath::new(&std::env::temp_dir(), "pool-noprio");
    let opener = thread_ioprio(0).unwrap();
    let options = PoolOptions {
        set_worker_ioprio: false,
        ..PoolOptions::default()
    };
    let dev = pool(&path, options);
    assert_eq!(dev.effective_priorities(), ClassPriorities::NONE);
    for (_, tid) in dev.worker_tids() {
        assert_eq!(thread_ioprio(tid).unwrap(), opener);
    }
    write_read(&dev, 0, Class::NonCritical);
}

#[test]
fn a_missing_file_is_a_clear_error() {
    let path = TempPath::new(&disk_dir(), "missing");
    let shown = path.0.display().to_string();
    let errors = [
        UringDevice::open(&path.0, UringOptions::default()).err(),
        PoolDevice::open(&path.0, PoolOptions::default()).err(),
    ];
    for e in errors {
        let e = e.expect("opening a missing file fails");
        assert!(
            matches!(&e, DeviceOpenError::NotFound { path: p, .. } if *p == path.0),
            "{e:?}"
        );
        let e = e.to_string();
        assert!(e.contains(&shown), "{e}");
        assert!(e.contains("no such file"), "{e}");
        assert!(e.contains("pass a size"), "{e}");
    }
}

#[test]
fn o_direct_on_tmpfs_is_a_clear_error() {
    let shm = Path::new("/dev/shm");
    let is_tmpfs = rustix::fs::statfs(shm).is_ok_and(|s| s.f_type as u64 == 0x0102_1994);
    if !is_tmpfs {
        eprintln!("skipped: /dev/shm is not a tmpfs here");
        return;
    }
    let path = TempPath::new(shm, "direct");
    let options = UringOptions {
        create_size: Some(SIZE),
        ..UringOptions::default()
    };
    match UringDevice::open(&path.0, options) {
        Ok(_) => eprintln!(
            "skipped: tmpfs accepts O_DIRECT on this kernel (Linux 6.6 and later); \
             the error text is unit-tested in device::uring::file"
        ),
        Err(e) => {
            assert!(matches!(e, DeviceOpenError::Unsupported { .. }), "{e:?}");
            let e = e.to_string();
            assert!(e.contains("does not support O_DIRECT"), "{e}");
            assert!(e.contains("pool backend"), "{e}");
        }
    }
}

#[test]
fn bad_options_are_clear_errors() {
    let path = TempPath::new(&disk_dir(), "options");
    let options = UringOptions {
        entries: 100,
        create_size: Some(SIZE),
        ..UringOptions::default()
    };
    let e = UringDevice::open(&path.0, options).err().unwrap();
    assert!(
        matches!(
            e,
            DeviceOpenError::InvalidOption {
                field: "entries",
                ..
            }
        ),
        "{e:?}"
    );
    let e = e.to_string();
    assert!(e.contains("power of two"), "{e}");
    let options = PoolOptions {
        non_critical_workers: 0,
        priorities: ClassPriorities {
            critical: IoPriority::Realtime(8),
            ..ClassPriorities::default()
        },
        ..PoolOptions::default()
    };
    let e = PoolDevice::open(&path.0, options).err().unwrap();
    assert!(
        matches!(
            e,
            DeviceOpenError::InvalidOption {
                field: "non_critical_workers",
                ..
            }
        ),
        "{e:?}"
    );
    let e = e.to_string();
    assert!(e.contains("0 non-critical workers"), "{e}");
    let options = PoolOptions {
        create_size: Some(1000),
        ..PoolOptions::default()
    };
    let e = PoolDevice::open(&path.0, options).err().unwrap();
    assert!(
        matches!(
            e,
            DeviceOpenError::InvalidOption {
                field: "create_size",
                ..
            }
        ),
        "{e:?}"
    );
    let e = e.to_string();
    assert!(e.contains("multiple of the block size 512"), "{e}");
}

/// Submits `n` writes and drops the device at once: every completer has
/// run when the drop returns.
fn drop_waits_for_in_flight(dev: Box<dyn Device>, n: u64) {
    let (tx, rx) = mpsc::channel();
    for k in 0..n {
        let tx = tx.clone();
        let class = if k % 3 == 0 {
            Class::Critical
        } else {
            Class::NonCritical
        };
        let cmd = Command::write(k * 4096, AlignedBuf::zeroed(4096), class);
        dev.submit(cmd, Box::new(move |c| tx.send(c.result.is_ok()).unwrap()));
    }
    drop(dev);
    drop(tx);
    let done: Vec<bool> = rx.try_iter().collect();
    assert_eq!(done.len() as u64, n);
    assert!(done.iter().all(|&ok| ok));
}

#[test]
fn drop_completes_everything_in_flight() {
    let p = TempPath::new(&std::env::temp_dir(), "pool-drop");
    drop_waits_for_in_flight(Box::new(pool(&p, PoolOptions::default())), 200);
    let u = TempPath::new(&disk_dir(), "uring-drop");
    let options = UringOptions {
        entries: 16,
        ..UringOptions::default()
    };
    if let Some(dev) = uring_or_skip(&u, options) {
        drop_waits_for_in_flight(Box::new(dev), 200);
    }
}

/// A completer that drops the last reference to the device, on the
/// device's own thread.
fn drop_from_completer(dev: Arc<dyn Device>) {
    static DONE: AtomicUsize = AtomicUsize::new(0);
    let (tx, rx) = mpsc::channel();
    let keep = dev.clone();
    dev.submit(
        Command::read(0, 4096, Class::Critical),
        Box::new(move |c| {
            c.result.unwrap();
            drop(keep);
            DONE.fetch_add(1, Ordering::SeqCst);
            tx.send(()).unwrap();
        }),
    );
    drop(dev);
    rx.recv().unwrap();
    assert!(DONE.load(Ordering::SeqCst) >= 1);
}

#[test]
fn a_completer_may_drop_the_device() {
    let p = TempPath::new(&std::env::temp_dir(), "pool-selfdrop");
    drop_from_completer(Arc::new(pool(&p, PoolOptions::default())));
    let u = TempPath::new(&disk_dir(), "uring-selfdrop");
    if let Some(dev) = uring_or_skip(&u, UringOptions::default()) {
        drop_from_completer(Arc::new(dev));
    }
}

/// A new log on a file writes its ring once, so that no commit of the
/// first lap writes a block the file system has not written yet (a
/// hole, or a reserved block still marked unwritten: the write converts
/// it, and the next flush waits for a journal commit); a device that is
/// not a file is not written. Where the file system reports unwritten
/// blocks as holes (`SEEK_DATA`, as ext4 and xfs do), the test sees the
/// ring go from unwritten to written.
#[test]
fn a_new_log_on_a_file_writes_its_ring() {
    use std::sync::Arc;

    use critio::block::{BlockConfig, BlockLayer};
    use critio::config::SyncConfig;
    use critio::log::{Log, LogConfig};
    use rustix::fs::{seek, SeekFrom};

    let path = TempPath::new(&disk_dir(), "log-prealloc");
    let Some(dev) = uring_or_skip(&path, UringOptions::default()) else {
        return;
    };
    assert!(dev.info().allocates_on_first_write, "a regular file");
    let cfg = LogConfig {
        region_offset_bytes: 1 << 20,
        region_bytes: 2 << 20,
        batch_bytes_max: 256 << 10,
        record_bytes_max: 64 << 10,
        pending_bytes_max: 256 << 10,
        ..LogConfig::default()
    };
    // The ring: the region after its header block.
    let (ring_start, ring_end) = (cfg.region_offset_bytes + 4096, 3 << 20);
    let file = std::fs::File::open(&path.0).unwrap();
    // The first written byte at or after `at` (the file's end if none).
    let data_from = |at| match seek(&file, SeekFrom::Data(at)) {
        Ok(n) => n,
        Err(rustix::io::Errno::NXIO) => SIZE,
        Err(e) => panic!("SEEK_DATA: {e}"),
    };
    let sees_unwritten = data_from(ring_start) >= ring_end;
    let block = Arc::new(BlockLayer::new(Arc::new(dev), BlockConfig::default()).unwrap());
    let (log, _) = Log::open(block, &cfg, &SyncConfig::default()).unwrap();
    if sees_unwritten {
        let hole = seek(&file, SeekFrom::Hole(ring_start)).unwrap();
        assert!(
            data_from(ring_start) == ring_start && hole >= ring_end,
            "the ring [{ring_start}, {ring_end}) is written: data from {}, a hole at {hole}",
            data_from(ring_start)
        );
    } else {
        eprintln!("the file system does not report unwritten blocks: the ring's writing not seen");
    }
    log.close().unwrap();
    assert!(
        !critio::device::mem::MemDevice::new(1 << 20)
            .info()
            .allocates_on_first_write
    );
}
