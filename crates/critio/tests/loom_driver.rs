//! Runs the loom model checks of `tests/loom.rs` as part of
//! `cargo test --workspace`.
//!
//! loom replaces critio's atomics, side locks and thread parking only when
//! the crate is compiled with `--cfg loom`, so the models need a build of
//! their own: this test runs a nested `cargo test` with that flag, in a
//! separate target directory, and fails if any model fails (a lost
//! wake-up, a deadlock, an inheritance count that does not return to zero).
//! The first run compiles critio and its dependencies once more (about a
//! minute on two cores); later runs reuse that build.
//!
//! Set `CRITIO_SKIP_LOOM=1` to skip it while iterating on something else.

#![cfg(not(loom))]

use std::path::Path;
use std::process::Command;

#[test]
fn loom_models_of_the_lock_and_condvar_protocols_pass() {
    if std::env::var_os("CRITIO_SKIP_LOOM").is_some() {
        eprintln!("loom models skipped: CRITIO_SKIP_LOOM is set");
        return;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let target_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("loom");
    let output = Command::new(cargo)
        .args(["test", "-p", "critio", "--test", "loom", "--release"])
        .env("RUSTFLAGS", "--cfg loom")
        .env("CARGO_TARGET_DIR", &target_dir)
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cannot run cargo for the loom models");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "loom models failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("test result:"))
        .expect("the loom run printed no test summary");
    assert!(
        !summary.contains(" 0 passed"),
        "the loom run ran no models: {summary}"
    );
    eprintln!("loom: {summary}");
}
