//! 4 KiB random reads through the block layer from a foreground thread, on
//! the mem device, in a loop: what `critio bench block-overhead` times, as
//! a program to profile. With `direct`, the same reads go straight to the
//! device (`Device::submit_here`), the bench's baseline.
//!
//! ```sh
//! cargo build --release -p critio --example block_read_loop
//! perf record -g target/release/examples/block_read_loop 10000000
//! perf report --no-children
//! target/release/examples/block_read_loop 10000000 direct
//! ```

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use critio::block::{BlockConfig, BlockLayer};
use critio::context;
use critio::device::mem::MemDevice;
use critio::device::{Command, Device};

const CAPACITY: u64 = 64 << 20;

fn main() {
    let mut args = std::env::args().skip(1);
    let reads: u64 = match args.next().map(|s| s.parse()) {
        None => 10_000_000,
        Some(Ok(n)) => n,
        Some(Err(e)) => {
            eprintln!("usage: block_read_loop [READS] [direct]: {e}");
            std::process::exit(2);
        }
    };
    let direct = match args.next().as_deref() {
        None => false,
        Some("direct") => true,
        Some(other) => {
            eprintln!("usage: block_read_loop [READS] [direct]: unknown {other:?}");
            std::process::exit(2);
        }
    };
    let device = Arc::new(MemDevice::new(CAPACITY));
    let layer = BlockLayer::new(device.clone(), BlockConfig::default())
        .expect("the default config is valid");
    let _fg = context::foreground();
    let mut x: u64 = 12345;
    let start = Instant::now();
    for _ in 0..reads {
        // A linear congruential step: cheap, and not the layer's cost.
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let offset = ((x >> 33) % (CAPACITY / 4096)) * 4096;
        if direct {
            let c = device
                .submit_here(Command::read(offset, 4096, critio::class::Class::Critical))
                .unwrap_or_else(|_| unreachable!("the mem device reads in its caller's thread"));
            c.result.expect("read");
            black_box(c.buf);
        } else {
            black_box(layer.read(offset, 4096).expect("read"));
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / reads.max(1) as f64;
    let path = if direct { "direct" } else { "block layer" };
    println!("{reads} reads ({path}), {ns:.1} ns a read");
}
