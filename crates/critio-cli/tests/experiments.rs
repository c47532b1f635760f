//! A short smoke run of every experiment and the demo, through the real
//! `critio` binary: each finishes, prints its tables and one
//! `target ...: ... PASS|MISS` line per target, and writes JSON of the
//! documented shape. (Whether targets pass is for the full runs; a smoke run
//! is too short to judge.)

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn critio(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_critio"))
        .args(args)
        .output()
        .expect("cannot run the critio binary");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn io_uring_file_works(dir: &Path) -> Result<(), String> {
    let probe = critio::device::uring::UringDevice::open(
        dir.join("probe.img"),
        critio::device::uring::UringOptions {
            create_size: Some(1 << 20),
            ..Default::default()
        },
    );
    probe.map(|_| ()).map_err(|e| e.to_string())
}

/// Checks the JSON shape every experiment writes.
fn check_json(path: &Path, name: &str) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{name}: no JSON: {e}"));
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: bad JSON: {e}"));
    assert_eq!(v["experiment"], name);
    let tables = v["tables"].as_array().expect("tables");
    assert!(!tables.is_empty(), "{name}: no table");
    for t in tables {
        let width = t["columns"].as_array().expect("columns").len();
        for row in t["rows"].as_array().expect("rows") {
            assert_eq!(
                row.as_array().expect("row").len(),
                width,
                "{name}: ragged row"
            );
        }
    }
    let targets = v["targets"].as_array().expect("targets");
    assert!(!targets.is_empty(), "{name}: no target");
    for t in targets {
        assert!(
            t["measured"].is_number(),
            "{name}: target without a measurement"
        );
        assert!(t["pass"].is_boolean());
        assert!(t["goal"].is_object(), "{name}: goal {:?}", t["goal"]);
    }
}

const E4_SMALL: &str = r#"
[load]
records = 2000
quick_records = 2000
value_bytes = 512
read_proportion = 0.2
distribution = "zipfian"
zipf_theta = 0.99
clients = 4
duration_s = 1.0
warmup_s = 0.2
quick_duration_s = 0.5
device = "sim:hdd"
capacity_bytes = 268435456
cache_bytes = 16777216
checkpoint_interval_ms = 200
bgsave_every_s = 0.0

[write_cache]
device = "sim:ssd"
sizes_mib = [4]
quick_sizes_mib = [4]
full = "stall"
"#;

#[test]
fn every_experiment_runs_short_and_reports() {
    let dir = std::env::temp_dir().join(format!("critio-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ok, list) = critio(&["bench", "--list"]);
    assert!(ok, "{list}");
    let names: Vec<String> = list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    assert!(names.len() >= 8, "{list}");
    for name in &names {
        let json = dir.join(format!("{name}.json"));
        let mut args = vec![
            "bench",
            name.as_str(),
            "--quick",
            "--json",
            json.to_str().unwrap(),
        ];
        let file_arg = format!("file:{}", dir.join("real.img").display());
        if name == "real-device-mix" {
            if let Err(why) = io_uring_file_works(&dir) {
                eprintln!("skipped real-device-mix: {why}");
                continue;
            }
            args.extend(["--device", file_arg.as_str()]);
        }
        let redis_runs = [
            "kv-background",
            "kv-vs-redis",
            "kv-schedulers",
            "kv-cache-jobs",
            "run-redis",
        ];
        if redis_runs.contains(&name.as_str()) && which("redis-benchmark").is_none() {
            eprintln!("skipped {name}: redis-benchmark is not installed");
            continue;
        }
        if name == "run-redis" && which("redis-server").is_none() {
            eprintln!("skipped {name}: redis-server is not installed");
            continue;
        }
        if name == "run-postgres" && !Path::new("/usr/lib/postgresql").is_dir() {
            eprintln!("skipped {name}: PostgreSQL is not installed (Debian: postgresql)");
            continue;
        }
        let kv_dir = format!("file:{}", dir.join(name.as_str()).display());
        let on_a_file_system = [
            "kv-vs-redis",
            "kv-schedulers",
            "kv-cache-jobs",
            "run-redis",
            "run-postgres",
        ];
        if on_a_file_system.contains(&name.as_str()) {
            args.extend(["--device", kv_dir.as_str()]);
        }
        let small = dir.join("e4-small.toml");
        if name == "e4-write-cache" {
            // Ten runs of the built-in quick load take minutes: one size, a
            // small store.
            std::fs::write(&small, E4_SMALL).unwrap();
            args.extend(["--workload", small.to_str().unwrap()]);
        }
        let (ok, out) = critio(&args);
        assert!(ok, "{name} failed:\n{out}");
        assert!(out.lines().any(|l| l.starts_with("target ") && (l.ends_with(" PASS") || l.ends_with(" MISS"))), "{name}:\n{out}");
        check_json(&json, name);
        if name == "kv-vs-redis" {
            // Each p99.9 ratio beside what the same run allows it.
            assert!(out.contains("their ceiling in this run"), "{out}");
            // critio-kv's own account of each load: its rounds' parts and
            // its critical device time, read after the load.
            assert!(out.contains("inside critio-kv, per load"), "{out}");
            assert!(
                out.lines().any(|l| l.starts_with("fits")
                    && l.contains("critio-kv rcp")
                    && l.contains("background")
                    && l.contains(" SET ")),
                "{out}"
            );
        }
        if name == "kv-vs-redis" && which("fio").is_some() {
            // The device's own floor is measured in the same run.
            assert!(out.contains("the device alone: fio"), "{out}");
            assert!(out.contains("commit, unpaced writer"), "{out}");
        }
        if ["kv-vs-redis", "run-redis"].contains(&name.as_str()) {
            // The machine's own stalls are printed beside the tails.
            assert!(out.contains("stall max ms"), "{out}");
            assert!(
                out.contains("steal %") && out.contains("CPUs busy"),
                "{out}"
            );
            // The job in progress when a load ends counts by its share.
            assert!(out.contains("last job"), "{out}");
        }
        if name == "kv-schedulers" {
            // A smoke run beside other tests never switches the disk's
            // scheduler, and says so.
            assert!(out.contains("on the scheduler in place"), "{out}");
            assert!(out.contains("best-kernel-over-rcp"), "{out}");
        }
        if name == "e1-request-latency" {
            // On the simulated SSD the kernel baseline is an emulation,
            // and the output says so.
            assert!(out.contains("kernel-idle (emulated"), "{out}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_key_value_experiments_run_on_a_real_file_against_the_kernels_own_baselines() {
    let _turn = REAL_FILE_RUNS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("critio-smoke-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    if let Err(why) = io_uring_file_works(&dir) {
        eprintln!("skipped: {why}");
        return;
    }
    let device = format!("file:{}", dir.join("kv.img").display());
    let json = dir.join("e1.json");
    let (ok, out) = critio(&[
        "bench",
        "e1-request-latency",
        "--quick",
        "--device",
        &device,
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    check_json(&json, "e1-request-latency");
    // The device line names the disk's scheduler, and the baselines are
    // the kernel's: a pass-through, and ionice -c3 for kernel-idle.
    assert!(out.contains("device: file: (io_uring, O_DIRECT)"), "{out}");
    assert!(out.contains("scheduler"), "{out}");
    assert!(out.contains("kernel-idle: ionice -c3"), "{out}");
    assert!(
        out.contains("none: critio's block layer a FIFO pass-through"),
        "{out}"
    );
    // The isolation run wrote nothing back: its last two cells are 0 MiB
    // written back and 0 throttled writes.
    let iso = out
        .lines()
        .find(|l| l.starts_with("isolation"))
        .unwrap_or_else(|| panic!("no isolation row:\n{out}"));
    let cells: Vec<&str> = iso.split_whitespace().collect();
    assert_eq!(cells[cells.len() - 2..], ["0.000", "0"], "{iso}");
    // Nothing is left behind: the template and the runs' copies are gone.
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("critio-kvbench"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The two real-file key-value runs take turns, so that at most two
/// experiments load this 2-core machine at once (as before the second was
/// added): the lock and latency measurements of the others stay meaningful.
static REAL_FILE_RUNS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn the_quick_demo_runs_and_writes_its_plots() {
    let _turn = REAL_FILE_RUNS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("critio-demo-smoke-{}", std::process::id()));
    let (ok, out) = critio(&["demo", "--quick", "--out", dir.to_str().unwrap()]);
    assert!(ok, "{out}");
    for f in ["demo.json", "demo-ccdf.png", "demo-ccdf.svg"] {
        let meta = std::fs::metadata(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}\n{out}"));
        assert!(meta.len() > 1000, "{f} is too small");
    }
    assert!(out.contains("target rcp-p99.9-better-than-none"), "{out}");
    check_json(&dir.join("demo.json"), "demo");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unknown_experiments_and_bad_workloads_are_clear_errors() {
    let (ok, out) = critio(&["bench", "no-such-thing"]);
    assert!(!ok);
    assert!(out.contains("available:"), "{out}");
    let bad = std::env::temp_dir().join(format!("critio-bad-{}.toml", std::process::id()));
    std::fs::write(&bad, "records = \"many\"").unwrap();
    let (ok, out) = critio(&["demo", "--workload", bad.to_str().unwrap()]);
    assert!(!ok);
    assert!(out.contains("records"), "{out}");
    let _ = std::fs::remove_file(&bad);
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}
