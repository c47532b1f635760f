//! `critio bench run-postgres`: unmodified PostgreSQL (Debian's), pgbench
//! TPC-B at a scale several times `shared_buffers`, checkpoints every 30 s,
//! stock against `critio run --preset postgres`, side by side in one run:
//!
//! ```text
//!  once: initdb (as the postgres user) -> pgbench -i -s SCALE -> stop
//!  for stock, critio run, stock with no checkpoint:
//!    copy of that cluster -> page cache dropped -> start (shared_buffers 128MB,
//!    checkpoint_timeout 30s, max_wal_size 4GB: every checkpoint is a timed one;
//!    the third: checkpoint_timeout 1d, max_wal_size 64GB: none during the run)
//!    -> pgbench -c 8 -j 2 -T SECONDS -l (every transaction's latency)
//!    -> checkpoints completed (pg_stat_bgwriter) -> stop
//! ```
//!
//! Targets (issue 14), from this one run: under `critio run`, p99.9 at
//! least 3x lower than stock, tps at least 1.0x, and at least 80% as many
//! checkpoints. The run with no checkpoint says what the checkpoints cost
//! stock's tail on this machine: the most that scheduling the
//! checkpointer's I/O could win back (the rest of the tail is the
//! workload's own: WAL flushes, backends evicting dirty buffers).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use super::host;
use super::report::{Goal, Report, Table, Target};
use super::BenchArgs;
use crate::run::lookup_user;

const CLIENTS: u32 = 8;
const THREADS: u32 = 2;
const SHARED_BUFFERS_MB: u64 = 128;

struct Size {
    scale: u32,
    seconds: u32,
}

fn size(quick: bool) -> Size {
    if quick {
        Size {
            scale: 4,
            seconds: 8,
        }
    } else {
        Size {
            scale: 100,
            seconds: 150,
        }
    }
}

/// The newest Debian PostgreSQL's binaries, or why there are none.
fn bin_dir() -> Result<PathBuf, String> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| "PostgreSQL is not installed (Debian: apt-get install postgresql)")?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("bin"))
        .filter(|b| {
            ["postgres", "initdb", "pgbench", "psql", "pg_ctl"]
                .iter()
                .all(|x| b.join(x).exists())
        })
        .collect();
    found.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    found.pop().ok_or_else(|| {
        "no PostgreSQL under /usr/lib/postgresql has postgres, initdb, pgbench, psql and pg_ctl"
            .into()
    })
}

/// The cluster's owner.
#[derive(Clone, Copy)]
struct User {
    uid: u32,
    gid: u32,
}

impl User {
    fn command(self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        c.uid(self.uid).gid(self.gid);
        c
    }
}

fn run_ok(mut cmd: Command, what: &str) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn chown_tree(dir: &Path, u: User) -> Result<(), String> {
    let out = Command::new("chown")
        .arg("-R")
        .arg(format!("{}:{}", u.uid, u.gid))
        .arg(dir)
        .output()
        .map_err(|e| format!("chown: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "chown -R {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A running cluster.
struct Server {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    user: User,
    child: Child,
}

impl Server {
    /// Starts postgres on `data`, under `wrapper` if any; `checkpoints`:
    /// every 30 s, else none for a day (and WAL room for it).
    fn start(
        bin: &Path,
        data: &Path,
        user: User,
        wrapper: &[OsString],
        checkpoints: bool,
    ) -> Result<Server, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let postgres = bin.join("postgres");
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                // critio run switches to the user itself (--user).
                let mut c = Command::new(program);
                c.args(args).arg(&postgres);
                c
            }
            None => user.command(&postgres),
        };
        let log = std::fs::File::create(data.with_extension("log"))
            .map_err(|e| format!("{}: {e}", data.display()))?;
        let child = cmd
            .arg("-D")
            .arg(data)
            .args(["-p", &port.to_string(), "-k"])
            .arg(data)
            .args(["-c", "listen_addresses="])
            .args(["-c", &format!("shared_buffers={SHARED_BUFFERS_MB}MB")])
            .args(if checkpoints {
                ["-c", "checkpoint_timeout=30s", "-c", "max_wal_size=4GB"]
            } else {
                ["-c", "checkpoint_timeout=1d", "-c", "max_wal_size=64GB"]
            })
            .args(["-c", "fsync=on", "-c", "synchronous_commit=on"])
            .args(["-c", "log_checkpoints=on"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start postgres: {e}"))?;
        let mut s = Server {
            bin: bin.to_path_buf(),
            data: data.to_path_buf(),
            port,
            user,
            child,
        };
        let started = Instant::now();
        while s.psql("SELECT 1").is_err() {
            if started.elapsed() > Duration::from_secs(120)
                || s.child.try_wait().ok().flatten().is_some()
            {
                return Err(format!(
                    "postgres did not start; see {}",
                    data.with_extension("log").display()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(s)
    }

    fn client(&self, program: &str) -> Command {
        let mut c = self.user.command(self.bin.join(program));
        c.arg("-h")
            .arg(&self.data)
            .args(["-p", &self.port.to_string(), "-U", "postgres"]);
        c
    }

    fn psql(&self, sql: &str) -> Result<String, String> {
        let mut c = self.client("psql");
        c.args(["-d", "postgres", "-tAc", sql]);
        run_ok(c, "psql").map(|s| s.trim().to_owned())
    }

    /// Checkpoints completed so far (timed and requested).
    fn checkpoints(&self) -> Result<u64, String> {
        let v = self.psql("SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter")?;
        v.parse()
            .map_err(|_| format!("pg_stat_bgwriter said `{v}`"))
    }

    /// A smart shutdown, the same both ways (SIGTERM to the postmaster, or
    /// to critio run, which passes it on; no clients are left).
    fn stop(mut self) -> Result<(), String> {
        super::peers::terminate(&self.child);
        match super::peers::wait_or_kill(&mut self.child, Duration::from_secs(120)) {
            true => Ok(()),
            false => Err("postgres did not stop within 120 s; killed".into()),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // The postmaster and its backends (and critio run above them) must
        // not outlive an error, nor keep the cluster's files open.
        if let Ok(None) = self.child.try_wait() {
            super::peers::kill_tree(self.child.id());
            let _ = self.child.wait();
        }
    }
}

/// What one pgbench run measured.
struct Run {
    name: &'static str,
    tps: f64,
    transactions: usize,
    p50: f64,
    p99: f64,
    p999: f64,
    max: f64,
    checkpoints: u64,
    stats: Vec<String>,
}

/// Transaction latencies (ms) from pgbench's per-transaction logs.
fn latencies(dir: &Path, prefix: &str) -> Result<Vec<f64>, String> {
    let mut lat = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let path = e.map_err(|e| e.to_string())?.path();
        let is_log = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(prefix));
        if !is_log {
            continue;
        }
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        // client_id transaction_no time_us script_no time_epoch time_us
        lat.extend(
            text.lines()
                .filter_map(|l| l.split_whitespace().nth(2)?.parse::<f64>().ok())
                .map(|us| us / 1e3),
        );
        let _ = std::fs::remove_file(&path);
    }
    lat.sort_by(f64::total_cmp);
    Ok(lat)
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn drop_caches() -> bool {
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

fn bench(server: &Server, size: &Size, dir: &Path, name: &'static str) -> Result<Run, String> {
    let before = server.checkpoints()?;
    let prefix = format!("pgbench-{}", name.replace(' ', "-"));
    let mut c = server.client("pgbench");
    c.current_dir(dir)
        .args(["-c", &CLIENTS.to_string(), "-j", &THREADS.to_string()])
        .args([
            "-T",
            &size.seconds.to_string(),
            "-l",
            "--log-prefix",
            &prefix,
        ])
        .arg("postgres");
    let out = run_ok(c, "pgbench")?;
    let tps = out
        .lines()
        .find(|l| l.starts_with("tps = "))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("pgbench printed no tps:\n{out}"))?;
    let lat = latencies(dir, &prefix)?;
    Ok(Run {
        name,
        tps,
        transactions: lat.len(),
        p50: quantile(&lat, 0.5),
        p99: quantile(&lat, 0.99),
        p999: quantile(&lat, 0.999),
        max: lat.last().copied().unwrap_or(0.0),
        checkpoints: server.checkpoints()?.saturating_sub(before),
        stats: Vec::new(),
    })
}

/// Runs the experiment.
pub fn run(args: &BenchArgs) -> Result<Report, String> {
    let bin = bin_dir()?;
    let (uid, gid) = lookup_user("postgres").map_err(|e| {
        format!("{e}: PostgreSQL runs as the `postgres` user (Debian's package creates it)")
    })?;
    let user = User { uid, gid };
    let version = run_ok(
        {
            let mut c = Command::new(bin.join("postgres"));
            c.arg("--version");
            c
        },
        "postgres --version",
    )?
    .trim()
    .to_owned();
    let root = args.file_system_dir("run-postgres")?;
    let dir = root.join(format!("run-postgres-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let result = run_in(args, &bin, user, &version, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run_in(
    args: &BenchArgs,
    bin: &Path,
    user: User,
    version: &str,
    dir: &Path,
) -> Result<Report, String> {
    chown_tree(dir, user)?;
    let machine = host::describe(dir);
    let size = size(args.quick);
    let template = dir.join("template");
    eprintln!(
        "run-postgres: {version} on {} ({machine}); initdb and pgbench -i -s {}",
        dir.display(),
        size.scale
    );
    let mut c = user.command(bin.join("initdb"));
    c.arg("-D")
        .arg(&template)
        .args(["-U", "postgres", "--auth=trust", "--no-sync"]);
    run_ok(c, "initdb")?;
    {
        let s = Server::start(bin, &template, user, &[], true)?;
        let mut c = s.client("pgbench");
        c.args(["-i", "-q", "-s", &size.scale.to_string(), "postgres"]);
        run_ok(c, "pgbench -i")?;
        s.psql("CHECKPOINT")?;
        s.stop()?;
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find critio: {e}"))?;
    let mut runs = Vec::new();
    let setups = [
        ("stock", false, true),
        ("critio run", true, true),
        ("no checkpoint", false, false),
    ];
    for (name, wrapped, checkpoints) in setups {
        let data = dir.join(name.replace(' ', "-"));
        let out = Command::new("cp")
            .arg("-a")
            .arg(&template)
            .arg(&data)
            .output()
            .map_err(|e| format!("cp: {e}"))?;
        if !out.status.success() {
            return Err(format!("cp -a: {}", String::from_utf8_lossy(&out.stderr)));
        }
        if !drop_caches() {
            eprintln!("run-postgres: cannot drop the page cache (not root?): runs start warm");
        }
        let wrapper: Vec<OsString> = if wrapped {
            vec![
                exe.clone().into(),
                "run".into(),
                "--user".into(),
                "postgres".into(),
                "--preset".into(),
                "postgres".into(),
                "--stats".into(),
                "--explain".into(),
                "--".into(),
            ]
        } else {
            Vec::new()
        };
        eprintln!(
            "run-postgres: {name}: pgbench -c {CLIENTS} -j {THREADS} -T {}",
            size.seconds
        );
        let server = Server::start(bin, &data, user, &wrapper, checkpoints)?;
        let mut run = bench(&server, &size, dir, name)?;
        server.stop()?;
        if wrapped {
            let log = std::fs::read_to_string(data.with_extension("log")).unwrap_or_default();
            run.stats = log
                .lines()
                .filter(|l| l.starts_with("critio run") || l.starts_with("  "))
                .map(str::to_owned)
                .collect();
        }
        let _ = std::fs::remove_dir_all(&data);
        runs.push(run);
    }
    for line in runs.iter().flat_map(|r| &r.stats) {
        eprintln!("run-postgres: {line}");
    }
    let mut t = Table::new(
        &format!(
            "pgbench TPC-B, scale {} (~{} MiB, shared_buffers {SHARED_BUFFERS_MB} MB), -c {CLIENTS} -j {THREADS} -T {}; checkpoint_timeout 30s, and stock with none (latencies in ms, from pgbench -l)",
            size.scale,
            size.scale * 15,
            size.seconds
        ),
        &["setup", "tps", "transactions", "p50", "p99", "p99.9", "max", "checkpoints"],
    );
    for r in &runs {
        t.row(vec![
            json!(r.name),
            json!(r.tps),
            json!(r.transactions),
            json!(r.p50),
            json!(r.p99),
            json!(r.p999),
            json!(r.max),
            json!(r.checkpoints),
        ]);
    }
    let (stock, critio, quiet) = (&runs[0], &runs[1], &runs[2]);
    let ratio = |a: f64, b: f64| a / b.max(1e-9);
    let targets = vec![
        Target::new(
            "stock-p99.9-vs-critio-run (critio run lower)",
            ratio(stock.p999, critio.p999),
            Goal::AtLeast(3.0),
            "x",
        ),
        Target::new(
            "critio-run-tps-vs-stock",
            ratio(critio.tps, stock.tps),
            Goal::AtLeast(1.0),
            "x",
        ),
        Target::new(
            "critio-run-checkpoints-vs-stock",
            // No checkpoint in either run (a short one): nothing was lost.
            if stock.checkpoints == 0 && critio.checkpoints == 0 {
                1.0
            } else {
                ratio(critio.checkpoints as f64, stock.checkpoints as f64)
            },
            Goal::AtLeast(0.8),
            "x",
        ),
        Target::new(
            "stock-p99.9-vs-no-checkpoint (what checkpoints cost stock's tail: \
             below 3x, the first target is out of reach of checkpoint I/O scheduling)",
            ratio(stock.p999, quiet.p999),
            Goal::AtLeast(3.0),
            "x",
        ),
    ];
    Ok(Report {
        experiment: "run-postgres".into(),
        description: format!(
            "unmodified {version} on {} ({machine}): pgbench, stock against critio run --preset postgres, \
             and stock with no checkpoint during the run (the tail without the checkpointer's I/O), \
             each from a copy of the same cluster with the page cache dropped",
            dir.display()
        ),
        tables: vec![t],
        targets,
    })
}
