//! Helpers shared by the scenario tests.

#![allow(dead_code)]

pub mod conformance;
pub mod gate;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use critio::context::{BlockingStatus, TaskRef};

/// How long a scenario waits for a state before failing (generous: CI
/// machines are shared and slow).
pub const PATIENCE: Duration = Duration::from_secs(20);

/// Polls `cond` until it holds; panics naming `what` after [`PATIENCE`].
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < PATIENCE, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits until `task` is blocked with exactly `status`.
pub fn wait_blocked(task: &TaskRef, status: BlockingStatus) {
    wait_until(&format!("task {} blocks on {status}", task.id()), || {
        task.blocking_status() == Some(status)
    });
}

/// The seed for a seeded test: `SEED` from the environment, else `default`.
pub fn seed_or(default: u64) -> u64 {
    std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// A file path under `dir`, unique to this process and moment (so tests
/// running at once never share one), removed when dropped.
pub struct TempPath(pub PathBuf);

impl TempPath {
    pub fn new(dir: &Path, name: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let path = dir.join(format!("critio-{}-{nanos}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        Self(path)
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
