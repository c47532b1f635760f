//! Builds `critio-preload` (the library `critio run` puts in LD_PRELOAD)
//! and hands its path to the critio binary, which embeds it: `critio run`
//! then works from the one binary, wherever it is installed.
//!
//! The library is built by a nested `cargo build` into its own target
//! directory under OUT_DIR (so it never waits on the outer build's lock),
//! always optimized: it runs inside every process of the launched tree.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest.join("../..");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    let target = out.join("preload-target");
    for dir in ["crates/critio-preload", "crates/critio-control"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    println!(
        "cargo:rerun-if-changed={}",
        root.join("Cargo.lock").display()
    );
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(&root)
        .args(["build", "--release", "--quiet", "-p", "critio-preload"])
        .arg("--target-dir")
        .arg(&target)
        // The outer build's settings for its own crates do not apply.
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .status()
        .expect("cannot run cargo to build critio-preload");
    assert!(status.success(), "building critio-preload failed");
    let lib = target.join("release/libcritio_preload.so");
    assert!(lib.exists(), "{} was not built", lib.display());
    println!("cargo:rustc-env=CRITIO_PRELOAD_SO={}", lib.display());
}
