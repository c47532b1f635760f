//! The key-value servers a comparison runs, as the child processes a user
//! would run: stock `redis-server` (`appendonly yes`, `appendfsync always`)
//! and `critio serve --device file`, each in its own data directory on the
//! file system under test; with a pipelined preload, the background-work
//! loop (BGSAVE, then BGREWRITEAOF, each waited for, again and again), and
//! redis-benchmark runs against them.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use critio_kv::Scheme;
use indicatif::{ProgressBar, ProgressStyle};
use rand::SeedableRng;

use super::kv_background::{parse, TestResult};
use super::placement::{spawn_on, Placement};

/// How long a server may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a server may take to stop (a final checkpoint or AOF fsync).
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the background loop polls INFO for the end of a job.
const JOB_POLL: Duration = Duration::from_millis(20);
/// Keys per MSET in the preload.
const PRELOAD_MSET_KEYS: u64 = 64;
/// MSETs per pipeline in the preload.
const PRELOAD_PIPELINE: u64 = 8;
/// Connections preloading at once.
const PRELOAD_CONNECTIONS: usize = 4;

/// Which server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Stock Redis.
    Redis,
    /// critio-kv under a scheme.
    Critio(Scheme),
}

impl Kind {
    /// The name used in tables.
    pub fn label(self) -> String {
        match self {
            Kind::Redis => "redis".to_owned(),
            Kind::Critio(s) => format!("critio-kv {}", s.name()),
        }
    }
}

/// A running server.
pub struct Peer {
    /// Which server.
    pub kind: Kind,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its data directory (removed when it stops).
    pub dir: PathBuf,
    /// What it printed when it started (critio: its settings line).
    pub banner: Vec<String>,
    /// Where it and its load generator run.
    pub placement: Placement,
    child: Child,
}

/// `redis-server --version`, or why it cannot run.
pub fn redis_server_version() -> Result<String, String> {
    let out = Command::new("redis-server")
        .arg("--version")
        .output()
        .map_err(|_| "redis-server is not installed (Debian: apt-get install redis-server)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .unwrap_or("unknown")
        .to_owned())
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

fn connect(addr: SocketAddr) -> Result<redis::Connection, String> {
    redis::Client::open(format!("redis://{addr}/"))
        .and_then(|c| c.get_connection())
        .map_err(|e| format!("cannot connect to {addr}: {e}"))
}

/// Makes `dir` an empty directory: what an interrupted run left there (an
/// AOF or dump Redis would load and answer "LOADING" meanwhile, a store
/// critio-kv would recover) must not be measured.
fn fresh_dir(dir: &Path) -> Result<(), String> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))
}

/// Redis's durability in these comparisons: the AOF on, fsync per write
/// (what critio-kv gives).
const DURABLE: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];

impl Peer {
    /// Starts a stock redis-server in `dir` with the AOF on and fsync per
    /// write (the durability critio-kv gives), no RDB save points.
    pub fn redis(dir: &Path, placement: &Placement) -> Result<Peer, String> {
        Self::redis_under(dir, &[], None, placement)
    }

    /// [`Peer::redis`], launched as `WRAPPER... redis-server ARGS` (e.g.
    /// `critio run --preset redis --`) when `wrapper` is not empty, its
    /// standard error into `stderr` if given.
    pub fn redis_under(
        dir: &Path,
        wrapper: &[std::ffi::OsString],
        stderr: Option<&Path>,
        placement: &Placement,
    ) -> Result<Peer, String> {
        Self::redis_with(dir, wrapper, stderr, placement, DURABLE)
    }

    /// A stock redis-server in `dir` that writes nothing (no AOF, no RDB
    /// save points): a server whose requests never touch the disk, for a
    /// frontier measured beside a writer of a known rate.
    pub fn redis_in_memory(dir: &Path, placement: &Placement) -> Result<Peer, String> {
        Self::redis_with(dir, &[], None, placement, &["--appendonly", "no"])
    }

    fn redis_with(
        dir: &Path,
        wrapper: &[std::ffi::OsString],
        stderr: Option<&Path>,
        placement: &Placement,
        persistence: &[&str],
    ) -> Result<Peer, String> {
        fresh_dir(dir)?;
        let port = free_port()?;
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg("redis-server");
                c
            }
            None => Command::new("redis-server"),
        };
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(dir)
            .args(persistence)
            .args(["--save", "", "--daemonize", "no", "--maxclients", "1000"])
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .stdout(Stdio::null())
            .stderr(match stderr {
                Some(path) => std::fs::File::create(path)
                    .map_err(|e| format!("{}: {e}", path.display()))?
                    .into(),
                None => Stdio::null(),
            });
        let child = spawn_on(placement.server.as_deref(), || {
            cmd.spawn()
                .map_err(|e| format!("cannot run redis-server: {e}"))
        })?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut peer = Peer {
            kind: Kind::Redis,
            addr,
            dir: dir.to_path_buf(),
            banner: Vec::new(),
            placement: placement.clone(),
            child,
        };
        let started = Instant::now();
        while connect(addr).is_err() {
            if started.elapsed() > START_TIMEOUT || peer.child.try_wait().ok().flatten().is_some() {
                return Err(format!(
                    "redis-server did not start; see {}",
                    dir.join("redis.log").display()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(peer)
    }

    /// Starts `critio serve` (this binary) in `dir` on a new image file of
    /// `image_bytes` through io_uring, with `config` as its config file.
    pub fn critio(
        dir: &Path,
        scheme: Scheme,
        image_bytes: u64,
        config: &str,
        placement: &Placement,
    ) -> Result<Peer, String> {
        fresh_dir(dir)?;
        let cfg_path = dir.join("critio.toml");
        std::fs::write(&cfg_path, config).map_err(|e| format!("{}: {e}", cfg_path.display()))?;
        let exe = std::env::current_exe().map_err(|e| format!("cannot find critio: {e}"))?;
        let mut cmd = Command::new(exe);
        cmd.args(["serve", "--device", "file", "--bind", "127.0.0.1:0"])
            .args(["--scheme", scheme.name()])
            .args(["--capacity", &image_bytes.to_string()])
            .arg("--data")
            .arg(dir.join("data"))
            .arg("--config")
            .arg(&cfg_path)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = spawn_on(placement.server.as_deref(), || {
            cmd.spawn()
                .map_err(|e| format!("cannot run critio serve: {e}"))
        })?;
        let out = child.stdout.take().expect("stdout is piped");
        let mut lines = BufReader::new(out).lines();
        let mut banner = Vec::new();
        let addr = loop {
            let Some(Ok(line)) = lines.next() else {
                let _ = child.wait();
                return Err(format!("critio serve ({scheme}) exited before listening"));
            };
            if let Some(rest) = line.split("listening on ").nth(1) {
                let addr = rest.split_whitespace().next().unwrap_or("");
                break addr
                    .parse()
                    .map_err(|e| format!("critio serve printed a bad address `{addr}`: {e}"))?;
            }
            banner.push(line);
        };
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Ok(Peer {
            kind: Kind::Critio(scheme),
            addr,
            dir: dir.to_path_buf(),
            banner,
            placement: placement.clone(),
            child,
        })
    }

    /// A server of `kind` in `dir/redis` or `dir/critio-SCHEME`; critio-kv
    /// on an image of `image_bytes` (reserved in full when it starts: a
    /// short run asks for little, so it fits a small disk) with a page
    /// cache of `cache_bytes` and a checkpoint every second.
    pub fn start(
        kind: Kind,
        dir: &Path,
        image_bytes: u64,
        cache_bytes: u64,
        placement: &Placement,
    ) -> Result<Peer, String> {
        match kind {
            Kind::Redis => Peer::redis(&dir.join("redis"), placement),
            Kind::Critio(s) => Peer::critio(
                &dir.join(format!("critio-{s}")),
                s,
                image_bytes,
                &format!(
                    "[cache]\ncapacity_bytes = {cache_bytes}\n[engine]\ncheckpoint_interval_ms = 1000\n"
                ),
                placement,
            ),
        }
    }

    /// The server's process id (for a wrapped Redis: the wrapper's).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A new connection.
    pub fn connect(&self) -> Result<redis::Connection, String> {
        connect(self.addr)
    }

    /// Writes keys `key:000000000000`.. (redis-benchmark's `-r` names) with
    /// values of `value_bytes` (letters in turn, which compress well):
    /// MSETs of [`PRELOAD_MSET_KEYS`] keys, pipelined, from
    /// [`PRELOAD_CONNECTIONS`] connections.
    pub fn preload(&self, keys: u64, value_bytes: usize, bar: &ProgressBar) -> Result<(), String> {
        self.preload_values(keys, value_bytes, false, bar)
    }

    /// [`Peer::preload`] with random bytes for values if `random` (each
    /// key's own, seeded by its number): data that does not compress, so
    /// a snapshot of it is as large as the data.
    pub fn preload_values(
        &self,
        keys: u64,
        value_bytes: usize,
        random: bool,
        bar: &ProgressBar,
    ) -> Result<(), String> {
        let letters: Vec<u8> = (0..value_bytes).map(|i| b'a' + (i % 26) as u8).collect();
        let value_of = |i: u64| -> Vec<u8> {
            if !random {
                return letters.clone();
            }
            let mut v = vec![0u8; value_bytes];
            rand::RngCore::fill_bytes(&mut rand::rngs::SmallRng::seed_from_u64(i), &mut v);
            v
        };
        bar.set_length(keys);
        bar.set_position(0);
        let next = std::sync::atomic::AtomicU64::new(0);
        let step = PRELOAD_MSET_KEYS * PRELOAD_PIPELINE;
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..PRELOAD_CONNECTIONS)
                .map(|_| {
                    let (next, value_of) = (&next, &value_of);
                    s.spawn(move || -> Result<(), String> {
                        let mut con = self.connect()?;
                        loop {
                            let first = next.fetch_add(step, Ordering::Relaxed);
                            if first >= keys {
                                return Ok(());
                            }
                            let last = (first + step).min(keys);
                            let mut pipe = redis::pipe();
                            let mut at = first;
                            while at < last {
                                let end = (at + PRELOAD_MSET_KEYS).min(last);
                                let cmd = pipe.cmd("MSET");
                                for i in at..end {
                                    cmd.arg(format!("key:{i:012}")).arg(value_of(i));
                                }
                                cmd.ignore();
                                at = end;
                            }
                            pipe.query::<()>(&mut con)
                                .map_err(|e| format!("{}: preload: {e}", self.kind.label()))?;
                            bar.inc(last - first);
                        }
                    })
                })
                .collect();
            workers.into_iter().try_for_each(|w| {
                w.join()
                    .map_err(|_| "a preload thread panicked".to_owned())?
            })
        })
    }

    /// Resets the server's INFO figures (CONFIG RESETSTAT): critio-kv's
    /// counters, waits and block layer figures, so what INFO says next is
    /// of what ran since.
    pub fn reset_stats(&self) -> Result<(), String> {
        let mut con = self.connect()?;
        redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query::<()>(&mut con)
            .map_err(|e| format!("{}: CONFIG RESETSTAT: {e}", self.kind.label()))
    }

    /// The INFO text.
    pub fn info(&self) -> Result<String, String> {
        let mut con = self.connect()?;
        redis::cmd("INFO")
            .query(&mut con)
            .map_err(|e| format!("{}: INFO: {e}", self.kind.label()))
    }

    /// Stops the server (critio: SIGTERM, a final checkpoint; Redis:
    /// SHUTDOWN NOSAVE) and removes its data directory.
    pub fn stop(mut self) -> Result<(), String> {
        match self.kind {
            Kind::Redis => {
                if let Ok(mut con) = self.connect() {
                    let _: redis::RedisResult<()> =
                        redis::cmd("SHUTDOWN").arg("NOSAVE").query(&mut con);
                }
            }
            Kind::Critio(_) => terminate(&self.child),
        }
        let stopped = wait_or_kill(&mut self.child, STOP_TIMEOUT);
        let _ = std::fs::remove_dir_all(&self.dir);
        match stopped {
            true => Ok(()),
            false => Err(format!(
                "{} did not stop within {STOP_TIMEOUT:?}; killed",
                self.kind.label()
            )),
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        // A peer not stopped cleanly (an error path) must not outlive us:
        // neither it nor, when it is a wrapper (critio run), the server
        // under it; nor its data.
        if let Ok(None) = self.child.try_wait() {
            kill_tree(self.child.id());
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Sends `child` SIGTERM (a clean stop: a server's last checkpoint, fio's
/// report).
pub fn terminate(child: &Child) {
    let pid = rustix::process::Pid::from_child(child);
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
}

/// Waits up to `timeout` for `child` to end; true if it did. Otherwise
/// (or if it cannot be waited for) it and every process under it are
/// killed ([`kill_tree`]) and reaped, and false.
pub fn wait_or_kill(child: &mut Child, timeout: Duration) -> bool {
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return true,
            Ok(None) if started.elapsed() < timeout => {
                std::thread::sleep(Duration::from_millis(20))
            }
            _ => {
                kill_tree(child.id());
                let _ = child.wait();
                return false;
            }
        }
    }
}

/// SIGKILLs `pid` and every process under it (children first found,
/// through `/proc/PID/task/*/children`).
pub fn kill_tree(pid: u32) {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", all[i]));
        for task in tasks.into_iter().flatten().flatten() {
            let kids = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            all.extend(
                kids.split_whitespace()
                    .filter_map(|k| k.parse::<u32>().ok()),
            );
        }
        i += 1;
    }
    for p in all {
        // SAFETY: kill takes integers; these are our descendants.
        unsafe { libc::kill(p as i32, libc::SIGKILL) };
    }
}

/// A numeric `key:value` field of INFO text.
pub fn info_u64(info: &str, key: &str) -> Option<u64> {
    info_value(info, key)
}

/// A `key:value` field of INFO text, parsed.
pub fn info_value<T: std::str::FromStr>(info: &str, key: &str) -> Option<T> {
    info.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.trim().parse().ok())
}

/// Background jobs completed while the load ran.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rounds {
    /// BGSAVEs completed.
    pub bgsaves: u64,
    /// BGREWRITEAOFs completed.
    pub rewrites: u64,
    /// The share of the job in progress when the load ended that was done
    /// (INFO's `current_fork_perc`, which Redis reports for its fork child
    /// and critio-kv for its job's thread), 0 to 1. A job takes seconds, so
    /// in a phase of tens of seconds whole jobs alone would be counted
    /// to within one job, a fifth of what a phase completes.
    pub partial: f64,
    /// Seconds the completed BGSAVEs took in all, each from its command to
    /// INFO saying it no longer runs (with `rewrite_secs`: which of the two
    /// jobs a server's rounds go to).
    pub bgsave_secs: f64,
    /// Seconds the completed BGREWRITEAOFs took in all, timed the same way.
    pub rewrite_secs: f64,
}

impl Rounds {
    /// Jobs done, the one in progress by its share.
    pub fn jobs(&self) -> f64 {
        (self.bgsaves + self.rewrites) as f64 + self.partial
    }

    /// A completed BGSAVE's mean time, in s (None if none completed).
    pub fn bgsave_mean_secs(&self) -> Option<f64> {
        (self.bgsaves > 0).then(|| self.bgsave_secs / self.bgsaves as f64)
    }

    /// A completed BGREWRITEAOF's mean time, in s (None if none completed).
    pub fn rewrite_mean_secs(&self) -> Option<f64> {
        (self.rewrites > 0).then(|| self.rewrite_secs / self.rewrites as f64)
    }
}

/// The share of the job in progress that is done, from INFO persistence
/// (0 if none runs, or the server does not say).
fn job_in_progress(info: &str) -> f64 {
    let running = ["rdb_bgsave_in_progress", "aof_rewrite_in_progress"]
        .iter()
        .any(|k| info_u64(info, k) == Some(1));
    match (running, info_value::<f64>(info, "current_fork_perc")) {
        (true, Some(p)) => (p / 100.0).clamp(0.0, 1.0),
        _ => 0.0,
    }
}

/// BGSAVE and BGREWRITEAOF back to back on their own connection, each
/// waited for (INFO's `*_in_progress`), until stopped.
pub struct BackgroundLoop {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Result<Rounds, String>>,
    /// A connection of its own, to read the progress of the job in
    /// progress when the load ends.
    progress: redis::Connection,
}

impl BackgroundLoop {
    /// Starts the loop against `peer`.
    pub fn start(peer: &Peer) -> Result<BackgroundLoop, String> {
        let mut con = peer.connect()?;
        let progress = peer.connect()?;
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut rounds = Rounds::default();
                let jobs = [
                    ("BGSAVE", "rdb_bgsave_in_progress"),
                    ("BGREWRITEAOF", "aof_rewrite_in_progress"),
                ];
                'outer: loop {
                    for (i, (cmd, busy)) in jobs.iter().enumerate() {
                        if stop.load(Ordering::SeqCst) {
                            break 'outer;
                        }
                        // A job Redis started itself (an automatic AOF
                        // rewrite once the file has doubled) must end
                        // first: Redis runs one child at a time.
                        let mut started = Instant::now();
                        loop {
                            match redis::cmd(cmd).query::<redis::Value>(&mut con) {
                                Ok(_) => break,
                                Err(e)
                                    if e.to_string().contains("child process is active")
                                        || e.to_string().contains("already in progress") =>
                                {
                                    wait_idle(&mut con, "rdb_bgsave_in_progress")?;
                                    wait_idle(&mut con, "aof_rewrite_in_progress")?;
                                    started = Instant::now();
                                }
                                Err(e) => return Err(format!("{cmd}: {e}")),
                            }
                        }
                        wait_idle(&mut con, busy)?;
                        if stop.load(Ordering::SeqCst) {
                            break 'outer; // ended after the load: not counted
                        }
                        let secs = started.elapsed().as_secs_f64();
                        if i == 0 {
                            rounds.bgsaves += 1;
                            rounds.bgsave_secs += secs;
                        } else {
                            rounds.rewrites += 1;
                            rounds.rewrite_secs += secs;
                        }
                    }
                }
                Ok(rounds)
            })
        };
        Ok(BackgroundLoop {
            stop,
            handle,
            progress,
        })
    }

    /// Stops the loop after the job in progress: the jobs completed
    /// before, and the share of that one done when the load ended.
    pub fn stop(mut self) -> Result<Rounds, String> {
        // Stopped first: a job that ends between the two is counted by
        // neither (the loop sees the stop; INFO sees no job running), never
        // by both.
        self.stop.store(true, Ordering::SeqCst);
        let info: String = redis::cmd("INFO")
            .arg("persistence")
            .query(&mut self.progress)
            .map_err(|e| format!("INFO: {e}"))?;
        let mut rounds = self
            .handle
            .join()
            .map_err(|_| "the background loop panicked".to_owned())??;
        rounds.partial = job_in_progress(&info);
        Ok(rounds)
    }
}

/// Waits until INFO's `busy` field (and Redis's `aof_rewrite_scheduled`)
/// is 0.
fn wait_idle(con: &mut redis::Connection, busy: &str) -> Result<(), String> {
    loop {
        let info: String = redis::cmd("INFO")
            .arg("persistence")
            .query(con)
            .map_err(|e| format!("INFO: {e}"))?;
        let running = info_u64(&info, busy).unwrap_or(0)
            + info_u64(&info, "aof_rewrite_scheduled").unwrap_or(0);
        if running == 0 {
            return Ok(());
        }
        std::thread::sleep(JOB_POLL);
    }
}

/// A progress bar for one server's runs, named `prefix`.
pub fn progress_bar(prefix: &str) -> ProgressBar {
    let pb = ProgressBar::new(1);
    let style = ProgressStyle::with_template("{prefix:>28} [{bar:30}] {pos}/{len} {msg}")
        .expect("static template")
        .progress_chars("=> ");
    pb.set_style(style);
    pb.set_prefix(prefix.to_owned());
    pb
}

/// One redis-benchmark test (`set` or `get`) against `peer`.
pub fn benchmark(
    peer: &Peer,
    test: &str,
    requests: u64,
    clients: u32,
    keyspace: u64,
    value_bytes: usize,
) -> Result<TestResult, String> {
    let mut cmd = Command::new("redis-benchmark");
    cmd.args(["-h", "127.0.0.1", "-p", &peer.addr.port().to_string()])
        .args(["-t", test, "-n", &requests.to_string()])
        .args(["-c", &clients.to_string(), "-r", &keyspace.to_string()])
        .args(["-d", &value_bytes.to_string()]);
    let out = spawn_on(peer.placement.client.as_deref(), || {
        cmd.output()
            .map_err(|e| format!("cannot run redis-benchmark: {e}"))
    })?;
    if !out.status.success() {
        return Err(format!(
            "redis-benchmark failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "\n");
    parse(&text)
        .into_iter()
        .next()
        .ok_or_else(|| format!("redis-benchmark -t {test} printed no result"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_fields_parse() {
        let info = "# Persistence\r\nrdb_bgsave_in_progress:1\r\naof_rewrites:12\r\n";
        assert_eq!(info_u64(info, "rdb_bgsave_in_progress"), Some(1));
        assert_eq!(info_u64(info, "aof_rewrites"), Some(12));
        assert_eq!(info_u64(info, "aof_rewrite"), None);
    }

    #[test]
    fn the_job_in_progress_counts_by_its_share_done_only_while_it_runs() {
        let running =
            "rdb_bgsave_in_progress:1\r\naof_rewrite_in_progress:0\r\ncurrent_fork_perc:41.78\r\n";
        assert!((job_in_progress(running) - 0.4178).abs() < 1e-9);
        // Redis keeps the last job's share after it ended.
        let ended =
            "rdb_bgsave_in_progress:0\r\naof_rewrite_in_progress:0\r\ncurrent_fork_perc:41.78\r\n";
        assert_eq!(job_in_progress(ended), 0.0);
        assert_eq!(
            job_in_progress("aof_rewrite_in_progress:1\r\n"),
            0.0,
            "not said"
        );
        let r = Rounds {
            bgsaves: 2,
            rewrites: 1,
            partial: 0.5,
            bgsave_secs: 3.0,
            rewrite_secs: 4.0,
        };
        assert_eq!(r.jobs(), 3.5);
        assert_eq!(
            (r.bgsave_mean_secs(), r.rewrite_mean_secs()),
            (Some(1.5), Some(4.0))
        );
        assert_eq!(Rounds::default().bgsave_mean_secs(), None);
    }
}
