//! The device conformance suite: written once, run on every backend
//! (`tests/device_conformance.rs`).

use std::sync::mpsc;
use std::sync::Arc;

use critio::context::Class;
use critio::device::{submit_and_wait, AlignedBuf, Command, Device, DeviceError, Op};

/// A recognizable pattern for block `n` of a test.
pub fn pattern(seed: u64, len: usize) -> AlignedBuf {
    let mut b = AlignedBuf::zeroed(len);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in b.as_mut_slice().chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = x.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
    b
}

fn write(dev: &dyn Device, offset: u64, buf: AlignedBuf, class: Class) {
    let c = submit_and_wait(dev, Command::write(offset, buf, class));
    c.result
        .unwrap_or_else(|e| panic!("{}: write at {offset}: {e}", dev.info().name));
}

fn read(dev: &dyn Device, offset: u64, len: usize, class: Class) -> AlignedBuf {
    let c = submit_and_wait(dev, Command::read(offset, len, class));
    c.result
        .unwrap_or_else(|e| panic!("{}: read at {offset}: {e}", dev.info().name));
    c.buf
}

fn expect_err(dev: &dyn Device, cmd: Command) -> DeviceError {
    let what = format!("{:?} at {} len {}", cmd.op, cmd.offset, cmd.len());
    match submit_and_wait(dev, cmd).result {
        Ok(()) => panic!("{}: {what} should fail", dev.info().name),
        Err(e) => e,
    }
}

/// Runs every check on `dev`, which must be freshly created (reads zeros).
pub fn run_suite(dev: Arc<dyn Device>) {
    let info = dev.info().clone();
    let bs = info.block_size as usize;
    assert!(
        info.capacity >= 64 * 4096,
        "{}: test devices need 256 KiB",
        info.name
    );
    assert!(
        bs.is_power_of_two() && bs >= 512,
        "{}: block size {bs}",
        info.name
    );
    assert!(info.queue_depth >= 1);
    let last = info.capacity - 4096;

    // Fresh devices read zeros.
    assert!(read(&*dev, 4096, 4096, Class::Critical)
        .as_slice()
        .iter()
        .all(|&b| b == 0));

    // Round trips at the start, the end, several sizes, both classes.
    for (i, (offset, len, class)) in [
        (0, bs, Class::Critical),
        (last, 4096, Class::NonCritical),
        (8192, 16 * 4096, Class::NonCritical),
        (128 * 1024, 4096, Class::Critical),
    ]
    .into_iter()
    .enumerate()
    {
        let data = pattern(i as u64, len);
        write(&*dev, offset, data.clone(), class);
        assert_eq!(
            read(&*dev, offset, len, class),
            data,
            "{}: round trip {i}",
            info.name
        );
    }

    // An overwrite is what reads back.
    write(&*dev, 0, pattern(100, 4096), Class::Critical);
    write(&*dev, 0, pattern(101, 4096), Class::NonCritical);
    assert_eq!(read(&*dev, 0, 4096, Class::Critical), pattern(101, 4096));

    // Flush succeeds and leaves the data readable.
    submit_and_wait(&*dev, Command::flush(Class::Critical))
        .result
        .unwrap();
    assert_eq!(read(&*dev, 0, 4096, Class::Critical), pattern(101, 4096));

    // Bad commands are clear errors, not crashes or silent truncation.
    let e = expect_err(&*dev, Command::read(100, 4096, Class::Critical));
    assert!(
        matches!(e, DeviceError::Unaligned { what: "offset", .. }),
        "{e}"
    );
    assert!(
        e.to_string().contains("not a multiple of the block size"),
        "{e}"
    );
    let e = expect_err(&*dev, Command::read(0, bs + 1, Class::Critical));
    assert!(
        matches!(e, DeviceError::Unaligned { what: "length", .. }),
        "{e}"
    );
    let e = expect_err(
        &*dev,
        Command::write(info.capacity, AlignedBuf::zeroed(4096), Class::Critical),
    );
    assert!(
        matches!(e, DeviceError::OutOfRange { op: Op::Write, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("past the end"), "{e}");

    // Many commands in flight at once from several threads; each completes
    // exactly once with its own buffer.
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let dev = dev.clone();
            std::thread::spawn(move || {
                let (tx, rx) = mpsc::channel();
                let n = 16u64;
                for k in 0..n {
                    let offset = (t * n + k) * 4096;
                    let tx = tx.clone();
                    let class = if k % 2 == 0 {
                        Class::Critical
                    } else {
                        Class::NonCritical
                    };
                    dev.submit(
                        Command::write(offset, pattern(1000 + offset, 4096), class),
                        Box::new(move |c| tx.send((offset, c)).unwrap()),
                    );
                }
                for _ in 0..n {
                    let (offset, c) = rx.recv().unwrap();
                    c.result.unwrap();
                    assert_eq!(c.buf, pattern(1000 + offset, 4096), "buffer came back");
                }
                for k in 0..n {
                    let offset = (t * n + k) * 4096;
                    assert_eq!(
                        read(&*dev, offset, 4096, Class::NonCritical),
                        pattern(1000 + offset, 4096)
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}
