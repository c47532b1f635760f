//! `critio run` on real programs: the interposition changes nothing a
//! program can see (results, errno, fork and threads, with the control
//! block present, disabled or absent), and real Redis under it writes,
//! snapshots and rewrites its AOF into files stock Redis loads back.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const CRITIO: &str = env!("CARGO_BIN_EXE_critio");
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/run/interpose.py");

fn python() -> Option<&'static str> {
    ["python3", "python"].into_iter().find(|p| {
        Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn interposed_calls_return_what_the_real_ones_return() {
    let Some(py) = python() else {
        eprintln!("skipped: no python3 to run {SCRIPT}");
        return;
    };
    let bare = Command::new(py).arg(SCRIPT).output().unwrap();
    let (bare_out, bare_err) = text(&bare);
    assert!(
        bare.status.success(),
        "bare run failed:\n{bare_out}\n{bare_err}"
    );

    // Everything foreground (the main thread), then everything background
    // (paced, handed to writeback), then loaded but disabled, then loaded
    // with no control block at all.
    let runs: [&[&str]; 4] = [
        &["--foreground", "main", "--explain", "--stats"],
        &[
            "--foreground",
            "thread=nothing-is-called-this",
            "--explain",
            "--stats",
        ],
        &["--foreground", "main", "--disable"],
        &[
            "--foreground",
            "main",
            "--",
            "env",
            "-u",
            "CRITIO_RUN_CONTROL",
        ],
    ];
    for opts in runs {
        let mut cmd = Command::new(CRITIO);
        cmd.arg("run").args(opts);
        if !opts.contains(&"--") {
            cmd.arg("--");
        }
        let o = cmd.args([py, SCRIPT]).output().unwrap();
        let (out, err) = text(&o);
        assert!(o.status.success(), "{opts:?}:\n{out}\n{err}");
        assert_eq!(out, bare_out, "{opts:?}: output differs from the bare run");
        if opts.contains(&"--stats") {
            assert!(err.contains("critio run: pacing:"), "{err}");
        }
    }
}

#[test]
fn explain_shows_each_thread_and_the_rule_that_decided() {
    let Some(py) = python() else {
        eprintln!("skipped: no python3");
        return;
    };
    let o = Command::new(CRITIO)
        .args([
            "run",
            "--foreground",
            "main",
            "--background",
            "thread=writer1",
        ])
        .args([
            "--foreground",
            "thread=writer*",
            "--explain",
            "--stats",
            "--",
        ])
        .args([py, SCRIPT])
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    let line = |name: &str| {
        err.lines()
            .find(|l| l.split_whitespace().nth(4) == Some(name))
            .unwrap_or_else(|| panic!("no thread {name} in:\n{err}"))
            .to_owned()
    };
    assert!(
        line("writer0").contains("foreground  thread=writer*"),
        "{err}"
    );
    assert!(
        line("writer1").contains("background  thread=writer1"),
        "{err}"
    );
    // The main thread, by `main`; the forked child is another process.
    assert!(err.contains("foreground  main"), "{err}");
    assert!(err.contains("background  (default)"), "{err}");
    // Background writers' chunks were handed to writeback.
    let chunks: u64 = err
        .split("critio run: pacing: ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(chunks >= 1, "{err}");
}

#[test]
fn a_background_appenders_chunks_are_written_back_and_all_but_the_last_dropped() {
    let Some(py) = python() else {
        eprintln!("skipped: no python3");
        return;
    };
    let dir = std::env::temp_dir().join(format!("critio-run-chunks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("dump");
    // Eight 1 MiB chunks appended in 64 KiB writes by a forked child (a
    // background process: only the launched one's main thread is
    // foreground), unpaced so that the test does not wait for a pace. The
    // parent polls for it: a blocking waitpid would make it foreground.
    let script = format!(
        "import os, time\npid = os.fork()\nif pid == 0:\n    \
         fd = os.open({:?}, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)\n    \
         for _ in range(128): os.write(fd, b'x' * 65536)\n    \
         os.close(fd)\n    os._exit(0)\n\
         while os.waitpid(pid, os.WNOHANG) == (0, 0): time.sleep(0.01)\n",
        file.to_str().unwrap()
    );
    let o = Command::new(CRITIO)
        .args(["run", "--foreground", "main", "--no-pace", "--stats", "--"])
        .args([py, "-c", &script])
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 8 << 20);
    let pacing = err
        .lines()
        .find_map(|l| l.strip_prefix("critio run: pacing: "))
        .unwrap_or_else(|| panic!("no pacing line in:\n{err}"));
    // Every chunk was started on its way; each but the last was then
    // waited for (when the next one was due) and dropped from the page
    // cache, so the writer never waits for the chunk it just wrote.
    assert!(
        pacing.starts_with("8 appended chunks, 8.0 MiB handed to writeback"),
        "{pacing}"
    );
    assert!(
        pacing.contains("7.0 MiB dropped from the page cache"),
        "{pacing}"
    );
    // The seven chunks after the first were timed: the writer's own
    // throughput, which a pace never goes below half of.
    assert!(pacing.contains("7.0 MiB written at "), "{pacing}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_rules_and_a_missing_command_are_clear_errors() {
    let run = |args: &[&str]| {
        let o = Command::new(CRITIO).arg("run").args(args).output().unwrap();
        assert!(!o.status.success());
        text(&o).1
    };
    assert!(run(&["--foreground", "pid=1", "--", "true"]).contains("title=GLOB"));
    assert!(run(&["--", "true"]).contains("no foreground rule"));
    let e = run(&["--preset", "redis", "--", "/nonexistent/program"]);
    assert!(e.contains("cannot run /nonexistent/program"), "{e}");
    // The command's exit status is critio run's.
    let o = Command::new(CRITIO)
        .args(["run", "--preset", "redis", "--", "sh", "-c", "exit 42"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(42));
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn cli(port: u16, args: &[&str]) -> String {
    let o = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts redis-server in `dir` (under `critio run` when `wrap`), waits
/// for it to answer, returns its port and process.
fn redis(dir: &Path, wrap: bool) -> (u16, std::process::Child) {
    let port = free_port();
    let mut cmd = if wrap {
        let mut c = Command::new(CRITIO);
        c.args([
            "run",
            "--preset",
            "redis",
            "--explain",
            "--stats",
            "--",
            "redis-server",
        ]);
        c
    } else {
        Command::new("redis-server")
    };
    let child = cmd
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .arg("--dir")
        .arg(dir)
        .args([
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
        ])
        .args(["--daemonize", "no", "--logfile", "redis.log"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("redis-server to answer", || cli(port, &["PING"]) == "PONG");
    (port, child)
}

fn wait_idle(port: u16) {
    wait_for("BGSAVE and BGREWRITEAOF to finish", || {
        let info = cli(port, &["INFO", "persistence"]);
        info.contains("rdb_bgsave_in_progress:0") && info.contains("aof_rewrite_in_progress:0")
    });
}

#[test]
fn redis_under_critio_run_snapshots_and_rewrites_into_files_stock_redis_loads() {
    for tool in ["redis-server", "redis-cli", "redis-benchmark"] {
        if Command::new(tool).arg("--version").output().is_err() {
            eprintln!("skipped: {tool} is not installed (Debian: redis-server, redis-tools)");
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let (port, child) = redis(dir.path(), true);
    let load = Command::new("redis-benchmark")
        .args([
            "-p",
            &port.to_string(),
            "-t",
            "set",
            "-n",
            "50000",
            "-r",
            "20000",
        ])
        .args(["-d", "1024", "-P", "16", "-q"])
        .output()
        .unwrap();
    assert!(load.status.success());
    assert_eq!(cli(port, &["BGSAVE"]), "Background saving started");
    wait_idle(port);
    assert_eq!(
        cli(port, &["BGREWRITEAOF"]),
        "Background append only file rewriting started"
    );
    wait_idle(port);
    let info = cli(port, &["INFO", "persistence"]);
    assert!(info.contains("rdb_last_bgsave_status:ok"), "{info}");
    assert!(info.contains("aof_last_bgrewrite_status:ok"), "{info}");
    cli(port, &["SET", "after-rewrite", "1"]);
    let keys = cli(port, &["DBSIZE"]);
    let digest = cli(port, &["DEBUG", "DIGEST"]);
    assert!(keys.parse::<u64>().unwrap() > 10_000, "{keys}");
    cli(port, &["SHUTDOWN", "NOSAVE"]);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("redis-aof-rewrite") || err.contains("redis-rdb-bgsave"),
        "{err}"
    );
    assert!(err.contains("foreground  main"), "{err}");

    // Stock Redis loads what Redis under critio run wrote: the same data.
    let (port, mut stock) = redis(dir.path(), false);
    wait_for("the AOF to load", || cli(port, &["DBSIZE"]) == keys);
    assert_eq!(cli(port, &["DEBUG", "DIGEST"]), digest);
    cli(port, &["SHUTDOWN", "NOSAVE"]);
    let _ = stock.wait();
    // And the snapshot loads too.
    assert!(dir.path().join("dump.rdb").exists());
}

/// Runs `command` under `critio run --preset redis` with background
/// writes paced at exactly 1 MiB/s and lock/child inheritance on or off;
/// returns the seconds it printed (`waited S`) and critio run's stderr.
fn paced_wait(dir: &Path, inherit: bool, command: &[&std::ffi::OsStr]) -> (f64, String) {
    let cfg = dir.join(format!("paced-{inherit}.toml"));
    std::fs::write(
        &cfg,
        format!(
            "start_rate_mib = 1.0\nmin_rate_mib = 1.0\nstep_mib = 0.0\ninherit_locks = {inherit}\n"
        ),
    )
    .unwrap();
    let o = Command::new(CRITIO)
        .args(["run", "--preset", "redis", "--stats", "--config"])
        .arg(&cfg)
        .arg("--")
        .args(command)
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    let secs = out.trim().strip_prefix("waited ").unwrap().parse().unwrap();
    (secs, err)
}

/// Compiles `tests/run/lock.c` with the system C compiler (None: there is
/// none).
fn lock_program(dir: &Path) -> Option<std::path::PathBuf> {
    c_program(dir, "lock", "-O1")
}

/// Compiles `tests/run/NAME.c` with the system C compiler at `opt` into
/// `dir` (None: there is no compiler).
fn c_program(dir: &Path, name: &str, opt: &str) -> Option<std::path::PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/run/{name}.c"));
    let exe = dir.join(name);
    let ok = Command::new("cc")
        .args([opt, "-pthread", "-o"])
        .arg(&exe)
        .arg(src)
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(exe)
}

/// The lock program (`tests/run/lock.c`) with `extra` arguments: the
/// background owner's (or signaller's) paced writes end much sooner when
/// the foreground waiter boosts it, and only then is a boost counted.
fn owner_is_boosted(extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = lock_program(dir.path()) else {
        eprintln!("skipped: no C compiler (cc) to build tests/run/lock.c");
        return;
    };
    // Background writes paced at 1 MiB/s and never faster: the owner needs
    // seconds to write 6 MiB unless the waiting main thread boosts it.
    let waited = |inherit: bool| {
        let data = dir.path().join(format!("data-{inherit}"));
        let mut args = vec![exe.as_os_str(), data.as_os_str(), "6".as_ref()];
        args.extend(extra.iter().map(std::ffi::OsStr::new));
        let (secs, err) = paced_wait(dir.path(), inherit, &args);
        (secs, !err.contains(" 0 lock owners boosted"), err)
    };
    let (without, boosted_without, err) = waited(false);
    assert!(!boosted_without, "{err}");
    assert!(
        without >= 2.0,
        "paced owner finished in {without} s:\n{err}"
    );
    let (with, boosted, err) = waited(true);
    assert!(boosted, "no boost:\n{err}");
    assert!(
        with * 2.0 < without,
        "waited {with} s with inheritance, {without} s without:\n{err}"
    );
}

#[test]
fn a_foreground_waiter_lifts_the_pacing_of_the_background_lock_owner() {
    owner_is_boosted(&[]);
}

#[test]
fn a_foreground_reader_lifts_the_pacing_of_the_background_rwlock_writer() {
    owner_is_boosted(&["rwlock"]);
}

#[test]
fn a_foreground_writer_lifts_the_pacing_of_the_background_rwlock_reader() {
    owner_is_boosted(&["rdheld"]);
}

#[test]
fn a_foreground_condvar_waiter_lifts_the_pacing_of_the_background_signaller() {
    owner_is_boosted(&["cond"]);
}

#[test]
fn a_waiter_cancelled_in_its_wait_leaves_no_boost_behind() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = c_program(dir.path(), "cancel", "-O1") else {
        eprintln!("skipped: no C compiler (cc) to build tests/run/cancel.c");
        return;
    };
    let o = Command::new(CRITIO)
        .args(["run", "--foreground", "thread=fg-waiter", "--stats", "--"])
        .arg(&exe)
        .arg(dir.path().join("f"))
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    // ioprio values: best-effort 0 is 2 << 13, idle 3 << 13.
    assert_eq!(
        out.trim(),
        format!("during {} after {}", 2 << 13, 3 << 13),
        "the signaller is boosted while the waiter waits, and background again once it was cancelled:\n{err}"
    );
}

#[test]
fn a_boost_follows_a_chain_of_background_lock_owners() {
    // main waits for bg-mid's mutex; bg-mid waits for the paced writer's.
    owner_is_boosted(&["chain"]);
}

#[test]
fn a_boost_follows_a_chain_into_a_child_process() {
    // main waits for the child; the child's main thread waits for the
    // mutex its paced writer thread holds.
    owner_is_boosted(&["fork-chain"]);
}

#[test]
fn a_foreground_waitpid_lifts_the_pacing_of_the_background_child() {
    // The child writes 6 MiB paced at 1 MiB/s; the parent (the launched
    // process's main thread: foreground) waits for it.
    python_wait_is_cut_by_inheritance(
        "child",
        r#"
import os, sys, time
pid = os.fork()
if pid == 0:
    write_paced(sys.argv[1], 6)
    os._exit(0)
time.sleep(0.2)  # the child has written (and been classified) by now
t0 = time.time()
os.waitpid(pid, 0)
print(f"waited {time.time() - t0:.3f}")
"#,
    );
}

#[test]
fn a_foreground_pipe_reader_lifts_the_pacing_of_the_background_writer() {
    // The child (background) writes "r" to a pipe, then 6 MiB to a file
    // paced at 1 MiB/s, then "d"; the parent (foreground) reads "r", and
    // then blocks reading the pipe until "d": it waits for the child
    // through the pipe alone (it never calls waitpid, which boosts too).
    python_wait_is_cut_by_inheritance(
        "piped",
        r#"
import os, sys, time
r = pipe_writer_child(sys.argv[1])
time.sleep(0.2)  # the child is classified and writing by now
t0 = time.time()
assert os.read(r, 1) == b"d"
print(f"waited {time.time() - t0:.3f}")
"#,
    );
}

/// Python the scripts of [`python_wait_is_cut_by_inheritance`] start
/// with: `write_paced(path, mib)` appends `mib` MiB to `path`, 64 KiB per
/// `write` (seconds of writing when paced at 1 MiB/s);
/// `pipe_writer_child(path)` forks a child that writes "r" to a new pipe,
/// then 6 MiB paced to `path`, then "d", and returns the pipe's read end
/// once "r" arrived (the child is writing).
const PY_PACED: &str = r#"
import os
def write_paced(path, mib):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    for _ in range(mib * 16):
        os.write(fd, b"x" * 65536)
    os.close(fd)
def pipe_writer_child(path):
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(r)
        os.write(w, b"r")
        write_paced(path, 6)
        os.write(w, b"d")
        os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"r"
    return r
"#;

/// Runs a Python `script` (given a data path) under [`paced_wait`] with
/// inheritance off and on: the foreground wait it prints must be cut by
/// more than half, and a boost counted, only with inheritance.
fn python_wait_is_cut_by_inheritance(name: &str, script: &str) {
    let Some(py) = python() else {
        eprintln!("skipped: no python3");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let script = format!("{PY_PACED}{script}");
    let waited = |inherit: bool| {
        let data = dir.path().join(format!("{name}-{inherit}"));
        let args: [&std::ffi::OsStr; 4] = [
            py.as_ref(),
            "-c".as_ref(),
            script.as_ref(),
            data.as_os_str(),
        ];
        paced_wait(dir.path(), inherit, &args)
    };
    let (without, err) = waited(false);
    assert!(
        without >= 2.0,
        "the paced writer finished in {without} s:\n{err}"
    );
    let (with, err) = waited(true);
    assert!(!err.contains(" 0 lock owners boosted"), "no boost:\n{err}");
    assert!(
        with * 2.0 < without,
        "waited {with} s with inheritance, {without} s without:\n{err}"
    );
}

#[test]
fn a_chain_passes_through_a_background_pipe_reader() {
    // The parent (foreground) waits for child C; C (background) reads a
    // pipe that grandchild G writes only after 6 MiB paced at 1 MiB/s. The
    // parent reaches G only through C's pipe read.
    python_wait_is_cut_by_inheritance(
        "pipe-chain",
        r#"
import os, sys, time
ready_r, ready_w = os.pipe()
c = os.fork()
if c == 0:
    r = pipe_writer_child(sys.argv[1])  # G
    os.write(ready_w, b"1")  # about to block: G is writing
    assert os.read(r, 1) == b"d"
    os._exit(0)
assert os.read(ready_r, 1) == b"1"
time.sleep(0.3)  # C is blocked reading by now
t0 = time.time()
os.waitpid(c, 0)
print(f"waited {time.time() - t0:.3f}")
"#,
    );
}

#[test]
fn a_descriptor_replaced_by_dup2_is_looked_at_afresh() {
    // The parent reads pipe A (written by a child that then exits) on
    // descriptor `ra`, then makes `ra` an end of pipe B with dup2 and
    // blocks on it: B's writer is the paced child, A's a dead one. With
    // A's key still cached for `ra`, the read would boost the dead writer.
    python_wait_is_cut_by_inheritance(
        "dup2",
        r#"
import os, sys, time
ra, wa = os.pipe()
rb, wb = os.pipe()
a = os.fork()
if a == 0:
    os.write(wa, b"a")
    os._exit(0)
os.waitpid(a, 0)
assert os.read(ra, 1) == b"a"
b = os.fork()
if b == 0:
    os.write(wb, b"r")
    write_paced(sys.argv[1], 6)
    os.write(wb, b"d")
    os._exit(0)
os.close(wb)
os.dup2(rb, ra)
assert os.read(ra, 1) == b"r"
time.sleep(0.2)
t0 = time.time()
assert os.read(ra, 1) == b"d"
print(f"waited {time.time() - t0:.3f}")
"#,
    );
}

#[test]
fn a_waiter_killed_in_its_wait_leaves_no_boost_behind() {
    let Some(py) = python() else {
        eprintln!("skipped: no python3");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Reader R (foreground by name) blocks reading a pipe whose last
    // writer is W (background), so W is boosted; R is then killed, which
    // runs no code of the library. Only after that does W write 4 MiB: if
    // R's boost outlived it, W would write unpaced.
    let script = r#"
import ctypes, os, signal, sys, time
r, w = os.pipe()
go_r, go_w = os.pipe()
wr = os.fork()
if wr == 0:
    os.close(go_w)
    os.write(w, b"r")
    assert os.read(go_r, 1) == b"g"
    t0 = time.time()
    write_paced(sys.argv[1], 4)
    print(f"waited {time.time() - t0:.3f}", flush=True)
    os._exit(0)
rd = os.fork()
if rd == 0:
    ctypes.CDLL(None).prctl(15, b"fg-reader")  # PR_SET_NAME: foreground
    assert os.read(r, 1) == b"r"
    os.read(r, 1)  # blocks, boosting W, until killed
    os._exit(1)
time.sleep(1.0)  # R is blocked, W boosted
os.kill(rd, signal.SIGKILL)
os.waitpid(rd, 0)
time.sleep(0.5)  # critio run has reaped R's boost (every window)
os.write(go_w, b"g")
while os.waitpid(wr, os.WNOHANG) == (0, 0):
    time.sleep(0.05)
"#;
    let cfg = dir.path().join("paced.toml");
    std::fs::write(
        &cfg,
        "start_rate_mib = 1.0\nmin_rate_mib = 1.0\nstep_mib = 0.0\ninherit_locks = true\n",
    )
    .unwrap();
    let o = Command::new(CRITIO)
        .args([
            "run",
            "--foreground",
            "main",
            "--foreground",
            "thread=fg-reader",
        ])
        .args(["--stats", "--config"])
        .arg(&cfg)
        .arg("--")
        .args([py, "-c", &format!("{PY_PACED}{script}")])
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(
        !err.contains(" 0 lock owners boosted"),
        "R never boosted W:\n{err}"
    );
    let secs: f64 = out.trim().strip_prefix("waited ").unwrap().parse().unwrap();
    assert!(
        secs >= 2.0,
        "W wrote 4 MiB in {secs} s: the dead reader's boost outlived it:\n{err}"
    );
}

#[test]
fn writes_in_place_are_started_on_their_way_but_never_paced() {
    let Some(py) = python() else {
        eprintln!("skipped: no python3");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // The background child rewrites the first MiB of a 2 MiB file six
    // times (as a database writes pages out, holding its own locks); at a
    // pace of 1 MiB/s an appended 6 MiB takes over 4 s (the test above),
    // in place it is not slowed. The parent times the child's writes.
    let script = r#"
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
os.ftruncate(fd, 2 << 20)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    t0 = time.time()
    for i in range(96):
        os.pwrite(fd, b"x" * 65536, (i % 16) * 65536)
    os.write(w, f"{time.time() - t0:.3f}".encode())
    os._exit(0)
os.waitpid(pid, 0)
print("waited " + os.read(r, 64).decode())
"#;
    let data = dir.path().join("in-place");
    let args: [&std::ffi::OsStr; 4] = [
        py.as_ref(),
        "-c".as_ref(),
        script.as_ref(),
        data.as_os_str(),
    ];
    let (took, err) = paced_wait(dir.path(), false, &args);
    assert!(took < 2.0, "in-place writes took {took} s:\n{err}");
    let kicked = err
        .split("; ")
        .find(|part| part.contains("chunks written in place"))
        .and_then(|part| part.split_whitespace().next()?.parse::<u32>().ok());
    assert!(
        kicked.is_some_and(|n| n >= 5),
        "in-place chunks not counted:\n{err}"
    );
    assert!(
        err.contains("critio run: pacing: 0 appended chunks"),
        "{err}"
    );
}

/// Runs Python `script` (after [`PY_PACED`]) under `critio run --preset
/// redis --explain`, with `config` as its config file if given and a path
/// in `dir` as its argument; returns what it printed (trimmed) and
/// critio run's stderr.
fn redis_preset_script(
    py: &str,
    dir: &Path,
    config: Option<&str>,
    script: &str,
) -> (String, String) {
    let mut cmd = Command::new(CRITIO);
    cmd.args(["run", "--preset", "redis", "--explain"]);
    if let Some(text) = config {
        let cfg = dir.join("preset.toml");
        std::fs::write(&cfg, text).unwrap();
        cmd.arg("--config").arg(cfg);
    }
    let o = cmd
        .arg("--")
        .args([py, "-c", &format!("{PY_PACED}{script}")])
        .arg(dir.join("f"))
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    (out.trim().to_owned(), err)
}

#[test]
fn background_threads_get_the_configured_kernel_io_priority() {
    let Some(py) = python() else {
        eprintln!("skipped: no python3");
        return;
    };
    if Command::new("ionice").arg("-p").arg("1").output().is_err() {
        eprintln!("skipped: no ionice (util-linux)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A fork child (background under the redis preset) writes a file (so
    // the library classifies it) and then asks ionice for its own priority.
    // The parent reads the answer from a pipe before it waits for the
    // child: a foreground waitpid would boost the child (inheritance).
    let script = r#"
import os, subprocess, sys
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"x")
    os.close(fd)
    out = subprocess.run(["ionice", "-p", str(os.getpid())], capture_output=True, text=True).stdout
    os.write(w, out.strip().encode())
    os._exit(0)
os.close(w)
print(os.read(r, 256).decode(), flush=True)
os.waitpid(pid, 0)
"#;
    let prio = |config: Option<&str>| redis_preset_script(py, dir.path(), config, script);
    let (idle, err) = prio(None);
    assert_eq!(idle, "idle", "{err}");
    assert!(
        err.contains("background threads get I/O priority idle"),
        "{err}"
    );
    let (be7, err) = prio(Some("background_ioprio = \"best-effort-7\"\n"));
    assert_eq!(be7, "best-effort: prio 7", "{err}");
    assert!(
        err.contains("background threads get I/O priority best-effort-7"),
        "{err}"
    );
    let o = Command::new(CRITIO)
        .args(["run", "--preset", "redis", "--config"])
        .arg({
            let cfg = dir.path().join("bad.toml");
            std::fs::write(&cfg, "background_ioprio = \"realtime\"\n").unwrap();
            cfg
        })
        .args(["--", "true"])
        .output()
        .unwrap();
    let (_, err) = text(&o);
    assert!(
        !o.status.success() && err.contains("best-effort-N"),
        "{err}"
    );
}

/// The interposition's cost on a background `fwrite` of 10 bytes, bare and
/// under `critio run` (a measurement, not a check; run with
/// `cargo test --release -p critio-cli --test run -- --ignored --nocapture fwrite_cost`).
#[test]
#[ignore]
fn fwrite_cost() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = c_program(dir.path(), "fwrite", "-O2") else {
        eprintln!("skipped: no C compiler (cc) to build tests/run/fwrite.c");
        return;
    };
    let out = dir.path().join("out");
    let ns = |wrapped: bool| -> f64 {
        let mut cmd = if wrapped {
            let mut c = Command::new(CRITIO);
            c.args(["run", "--foreground", "main", "--no-pace", "--"]);
            c.arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        let o = cmd.arg(&out).arg("20000000").output().unwrap();
        let (text, err) = text(&o);
        assert!(o.status.success(), "{text}\n{err}");
        text.trim()
            .strip_prefix("ns/fwrite ")
            .unwrap()
            .parse()
            .unwrap()
    };
    let (bare, wrapped) = (ns(false), ns(true));
    println!(
        "background fwrite of 10 bytes: {bare:.1} ns bare, {wrapped:.1} ns under critio run ({:.2}x)",
        wrapped / bare
    );
}

/// With `background_idle`, a background thread (a fork child under the
/// redis preset) runs `SCHED_IDLE` and the foreground main thread stays
/// `SCHED_OTHER`; without it, both are left `SCHED_OTHER`. Only a process
/// that runs as root may leave `SCHED_IDLE` again, so only such a one is
/// put in it.
#[test]
fn background_idle_puts_background_threads_in_sched_idle() {
    let Some(py) = python() else {
        eprintln!("skipped: no python3");
        return;
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: background_idle applies to processes that run as root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The child writes a file (so the library classifies it), then reports
    // its own policy through a pipe, read before the parent waits for it
    // (a foreground waitpid would boost the child).
    let script = r#"
import os, sys
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"x")
    os.close(fd)
    os.write(w, str(os.sched_getscheduler(0)).encode())
    os._exit(0)
os.close(w)
child = os.read(r, 64).decode()
fd = os.open(sys.argv[1] + ".parent", os.O_WRONLY | os.O_CREAT, 0o600)
os.write(fd, b"x")
os.close(fd)
print(child, os.sched_getscheduler(0), flush=True)
os.waitpid(pid, 0)
"#;
    let policies = |config: &str| redis_preset_script(py, dir.path(), Some(config), script);
    let idle = libc::SCHED_IDLE.to_string();
    let other = libc::SCHED_OTHER.to_string();
    let (on, err) = policies("background_idle = true\n");
    assert_eq!(on, format!("{idle} {other}"), "child, parent:\n{err}");
    assert!(err.contains("CPU nice 10 and SCHED_IDLE"), "{err}");
    let (off, err) = policies("");
    assert_eq!(off, format!("{other} {other}"), "child, parent:\n{err}");
}

/// A foreground process and a background one (its fork child) spin on
/// one CPU; the child reports its nice, which the parent samples while it
/// competes and after it stops.
const PY_CPU_FLOOR: &str = r#"
import os, sys, time
cpu = min(os.sched_getaffinity(0))
os.sched_setaffinity(0, {cpu})
r, w = os.pipe()
child = os.fork()
if child == 0:
    # A call the library hooks classifies this thread (background).
    with open(sys.argv[1], "wb") as f:
        f.write(b"x")
        os.fsync(f.fileno())
    os.write(w, b"1")
    parent = os.getppid()
    while os.getppid() == parent:  # spin, and end with the parent
        for _ in range(20000):
            pass
    os._exit(0)
assert os.read(r, 1) == b"1"
nice = lambda: os.getpriority(os.PRIO_PROCESS, child)
lowest, start = 19, time.time()
while time.time() - start < 3:  # compete for the CPU
    for _ in range(20000):
        pass
    lowest = min(lowest, nice())
start = time.time()  # leave the CPU to the child, up to 10 s
while nice() < 10 and time.time() - start < 10:
    time.sleep(0.05)
print("lowest", lowest, "after", nice())
os.kill(child, 9)
os.waitpid(child, 0)
"#;

/// The CPU floor: a background process crowded off its CPU by a
/// foreground one at nice 0 gets its nice lowered until it has its share,
/// and the full background nice back once it has the CPU to itself; with
/// the floor off it stays at nice 10 throughout.
#[test]
fn the_cpu_floor_relieves_a_crowded_background_process_and_gives_its_nice_back() {
    let Some(py) = python() else {
        eprintln!("skipped: no python3");
        return;
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: background threads are niced in processes that run as root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = |share: &str| {
        let cfg = dir.path().join(format!("floor-{share}.toml"));
        std::fs::write(&cfg, format!("background_cpu_min_share = {share}\n")).unwrap();
        let o = Command::new(CRITIO)
            .args(["run", "--foreground", "main", "--stats", "--config"])
            .arg(&cfg)
            .args(["--", py, "-c", PY_CPU_FLOOR])
            .arg(dir.path().join(format!("data-{share}")))
            .output()
            .unwrap();
        let (out, err) = text(&o);
        assert!(o.status.success(), "{out}\n{err}");
        let nums: Vec<i32> = out
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        assert_eq!(nums.len(), 2, "{out}");
        (nums[0], nums[1], err)
    };
    let (lowest, after, err) = run("0.5");
    assert!(lowest < 10, "never relieved (lowest nice {lowest}):\n{err}");
    assert_eq!(after, 10, "the nice was not given back:\n{err}");
    assert!(err.contains("CPU floor (0.5 of the CPU"), "{err}");
    let (lowest, after, err) = run("0");
    assert_eq!((lowest, after), (10, 10), "the floor is off:\n{err}");
}
