//! The device conformance suite, run on every backend. Backends the kernel
//! cannot provide here are skipped with a printed reason.

mod common;

use std::sync::Arc;

use critio::device::mem::MemDevice;

#[test]
fn mem_device_conforms() {
    common::conformance::run_suite(Arc::new(MemDevice::new(4 << 20)));
}
