//! A small embedded store on critio: fixed-size slots in a page-cache file,
//! each write logged first, a background thread checkpointing.
//!
//! ```text
//! cargo run --example embedded_store                      # on memory
//! cargo run --example embedded_store -- file:/tmp/s.img   # on a real file (io_uring, O_DIRECT)
//! ```
//!
//! What it shows: one `Config` opens the whole stack; the request thread is
//! marked foreground, so its log commits and reads are critical at every
//! layer; the checkpoint thread is background, and when a request waits for
//! the lock the checkpoint holds, the checkpoint inherits criticality until
//! it lets go. Reopening the same file replays the log over the last
//! checkpoint.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use critio::config::Config;
use critio::context;
use critio::device::DeviceSpec;
use critio::sync::RwLock;
use critio::Stack;

const SLOT: usize = 256;
const SLOTS: u64 = 4096;

/// A log record: the slot number, then its new contents.
fn record(slot: u32, value: &[u8]) -> Vec<u8> {
    let mut r = slot.to_le_bytes().to_vec();
    r.extend_from_slice(value);
    r
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = Config::default();
    if let Some(spec) = std::env::args().nth(1) {
        config.device.spec = spec.parse::<DeviceSpec>()?;
    }
    config.device.capacity_bytes = 64 << 20;
    config.cache.capacity_bytes = 4 << 20;
    config.log.region_offset_bytes = 0;
    config.log.region_bytes = 8 << 20;

    let stack = Arc::new(Stack::open(&config)?);
    let (log, recovery) = stack.open_log()?;
    let data = stack.add_file("slots", SLOTS * SLOT as u64)?;
    for note in stack.notes() {
        println!("note: {note}");
    }
    for r in stack.regions() {
        println!("region {r} on {}", stack.device().info().name);
    }

    // Recovery: the slots hold the last checkpoint; redo what the log has.
    for (_, payload) in &recovery.records {
        let slot = u32::from_le_bytes(payload[..4].try_into()?);
        stack
            .cache()
            .write(data, u64::from(slot) * SLOT as u64, &payload[4..])?;
    }
    println!("recovered {} logged writes", recovery.records.len());

    // Writers hold `epoch` shared from logging to applying; the checkpoint
    // takes it exclusively for an instant, so every record it truncates is
    // in the cache before the flush.
    let epoch = Arc::new(RwLock::with_options((), stack.sync_options("store: epoch")));
    let log = Arc::new(log);
    let stop = Arc::new(AtomicBool::new(false));

    let checkpointer = {
        let (stack, log, epoch, stop) = (stack.clone(), log.clone(), epoch.clone(), stop.clone());
        std::thread::spawn(move || -> Result<u32, critio::StackError> {
            context::set_background();
            let mut rounds = 0;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
                let upto = {
                    let _all_applied = epoch.write();
                    log.next_lsn() - 1
                };
                stack.cache().flush_all()?;
                log.truncate(upto)?;
                rounds += 1;
            }
            Ok(rounds)
        })
    };

    // The request thread.
    context::set_foreground();
    let started = Instant::now();
    let writes = 2000u32;
    for i in 0..writes {
        let slot = i % SLOTS as u32;
        let value = [b'a' + (i % 26) as u8; SLOT];
        let _applying = epoch.read();
        log.append_commit(&record(slot, &value))?;
        stack
            .cache()
            .write(data, u64::from(slot) * SLOT as u64, &value)?;
    }
    let mut back = [0u8; SLOT];
    stack.cache().read(data, 7 * SLOT as u64, &mut back)?;
    assert_eq!(back, [b'a' + 7; SLOT]);
    let elapsed = started.elapsed();
    context::clear_foreground();

    stop.store(true, Ordering::Relaxed);
    let rounds = checkpointer.join().expect("the checkpointer panicked")?;
    let waits = stack.metrics().snapshot();
    let commit = waits
        .wait_points
        .iter()
        .find(|w| w.point == "log: commit wait" && w.class == critio::Class::Critical);
    println!(
        "{writes} durable writes in {:.0} ms, {rounds} checkpoints in the background",
        elapsed.as_secs_f64() * 1e3
    );
    if let Some(w) = commit {
        println!(
            "critical commit waits: {} (p99 {:.0} us)",
            w.latency.count, w.latency.p99_us
        );
    }
    for class in stack.block().stats().classes {
        println!(
            "block layer, {:?}: {} I/Os, device time p99 {:.0} us",
            class.class, class.completions, class.device_time.p99_us
        );
    }
    Ok(())
}
