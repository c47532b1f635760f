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
//!     │   hdd.rs: seek + rotation, SPTF            │                  and their pre-images
//!     │   ssd.rs: channels, program/read, GC stall │
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
//! What the defaults measure (virtual time, random 4 KiB reads over the
//! device, from the unit tests):
//!
//! | workload                                  | HDD (7200 rpm)         | SSD (8 channels) |
//! |-------------------------------------------|------------------------|------------------|
//! | QD 1                                      | ~116 IOPS              | 12 500 IOPS      |
//! | QD 32                                     | ~305 IOPS              | ~88 000 IOPS     |
//! | foreground QD 1 + background QD 32, fg p99.9 | ~725 ms; ~74 ms priority-aware | |
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
//! on (the default) a write is durable only once a flush submitted after
//! it (or completing after it) completes; [`SimDevice::power_cut`] drops a seeded
//! subset of the others (see `device::crash`).

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
