//! 4 KiB random reads through the block layer from a foreground thread, on
//! the mem device, in a loop: what `critio bench block-overhead` times, as
//! a program to profile.
//!
//! ```sh
//! cargo build --release -p critio --example block_read_loop
//! perf record -g target/release/examples/block_read_loop 10000000
//! perf report --no-children
//! ```

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use critio::block::{BlockConfig, BlockLayer};
use critio::context;
use critio::device::mem::MemDevice;

const CAPACITY: u64 = 64 << 20;

fn main() {
    let reads: u64 = match std::env::args().nth(1).map(|s| s.parse()) {
        None => 10_000_000,
        Some(Ok(n)) => n,
        Some(Err(e)) => {
            eprintln!("usage: block_read_loop [READS]: {e}");
            std::process::exit(2);
        }
    };
    let layer = BlockLayer::new(Arc::new(MemDevice::new(CAPACITY)), BlockConfig::default())
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
        black_box(layer.read(offset, 4096).expect("read"));
    }
    let ns = start.elapsed().as_nanos() as f64 / reads.max(1) as f64;
    println!("{reads} reads, {ns:.1} ns a read");
}
