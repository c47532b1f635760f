//! `sim`: a simulated HDD or SSD — a seeded timing model with an internal
//! command queue and reordering firmware, over a store in memory or a file.
//!
//! ```text
//!                 SimDevice (driver.rs): one thread, real time x speedup
//!   Device::submit ──> DriveModel::submit(req, now) ... next_event() ... pop_completed(now)
//!                          │                                               │
//!     ┌────────────────────┴──────────────────────┐                       v
//!     │ model core, sans-I/O (front.rs):           │        store.rs: memory | file
//!     │ host FIFO ─> 32 slots ─> firmware pick     │        crash.rs: unflushed writes
//!     │   hdd.rs: seek + rotation, SPTF, read-ahead│                  and their pre-images
//!     │   ssd.rs: DRAM buffer, dies: tR/tPROG/tBERS│
//!     │           GC from the data sheet           │
//!     └────────────────────────────────────────────┘
//! ```
//!
//! The model core ([`HddModel`], [`SsdModel`], both [`DriveModel`]) is a
//! pure function of the submissions and the times they are made at: the
//! driver runs it on a clock; the experiments run it in virtual time as a
//! discrete-event simulation, millions of requests in seconds. Everything
//! random comes from the seed.
//!
//! What the firmware does ([`Firmware`]):
//!
//! | firmware              | critical commands                  | non-critical commands                  |
//! |-----------------------|------------------------------------|----------------------------------------|
//! | default (throughput)  | SPTF with everything else (HDD), FIFO per channel (SSD) | same; the long tail of paper 001 |
//! | `priority_aware`      | first, SPTF among themselves       | when no critical one is queued, or after `aging_ms` |
//!
//! What the defaults measure (virtual time, from the unit tests; random
//! 4 KiB requests over the device unless said otherwise):
//!
//! | workload                                  | HDD (7200 rpm, 16 ms stroke) | SSD (8 ch x 4 dies, MT29F16G08MAAWP MLC, 8 MiB buffer) |
//! |-------------------------------------------|------------------------|------------------|
//! | seek: neighbouring track / average / full stroke | 1.0 / 9.0 / 16.0 ms | |
//! | reads, QD 1                               | ~76 IOPS               | 20 000 IOPS (tR 50 µs) |
//! | reads, QD 32                              | ~181 IOPS              | ~377 000 IOPS (no channel bus or controller limit) |
//! | sequential 64 KiB reads 2 ms apart        | 0.33 ms mean (read-ahead hits); 6.8 ms without | |
//! | a write into an empty buffer              |                        | 2 µs (4 KiB over 2 GB/s) |
//! | 64 KiB writes QD 64, 256 MiB              |                        | 301 MB/s without GC, 234 MB/s with; p50 14.4 ms once the buffer is full |
//! | flush after 4 MiB of writes               |                        | 14.9 ms (16 programs of 900 µs per die) |
//! | GC stall (mean over a 256 MiB write run)  |                        | 35.7 ms: 33.9 valid pages x 950 µs + 3.5 ms |
//! | fg QD 1 reads + bg (HDD: QD 32 reads; SSD: QD 64 writes), fg | p99.9 ~1287 ms; ~361 ms priority-aware | mean 17.4 ms, p99 89 ms; 0.92 ms, 13.6 ms priority-aware |
//!
//! Driving a model in virtual time:
//!
//! ```
//! use critio::device::sim::{DriveModel, Firmware, HddModel, HddParams, Request};
//!
//! let mut drive = HddModel::new(1 << 40, HddParams::default(), Firmware::priority_aware(), 7);
//! drive.submit(Request::read(1, 1 << 30, 4096), 0);
//! drive.submit(Request::read(2, 1 << 39, 4096).with_priority(true), 0);
//! let mut done = Vec::new();
//! while let Some(t) = drive.next_event() {
//!     drive.pop_completed(t, &mut done); // then submit more work at `t`
//! }
//! assert_eq!(done.len(), 2);
//! assert!(done[0].at <= done[1].at);
//! ```
//!
//! A command's `Class::Critical` is its high priority. With the write cache
//! on (the default) a write is durable only once a flush covering it
//! completes: on the HDD a flush submitted after it (or completing after
//! it), on the SSD one submitted after it completed (the SSD's flush waits
//! until those writes are out of its DRAM buffer and on the flash);
//! [`SimDevice::power_cut`] drops a seeded subset of the others (see
//! `device::crash`).

mod config;
mod driver;
mod front;
mod hdd;
mod model;
mod ssd;
mod store;

#[cfg(test)]
mod hdd_tests;
#[cfg(test)]
mod ssd_tests;
#[cfg(test)]
mod testkit;

pub use config::{Profile, SimConfig, SIM_BLOCK_SIZE, SPEEDUP_RANGE};
pub use driver::SimDevice;
pub use front::HOST_QUEUE_MAX;
pub use hdd::{HddModel, HddParams};
pub use model::{Completed, DriveModel, Firmware, Request};
pub use ssd::{SsdModel, SsdParams};
pub use store::StoreKind;
