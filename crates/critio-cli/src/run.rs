//! `critio run [OPTIONS] -- COMMAND ARGS...`: request-centric I/O priority
//! for a program nobody will rewrite.
//!
//! ```text
//!  critio run ── creates the control block (a file in /dev/shm), writes the rules
//!      │         writes the embedded critio-preload library out once (temp dir)
//!      │ spawn COMMAND with LD_PRELOAD=libcritio_preload.so, CRITIO_RUN_CONTROL=block
//!      │ (inherited by every child process and exec)
//!      v
//!  (background threads: idle I/O class, or best-effort 7 where they hold locks requests
//!   wait for (the postgres preset); CPU nice 10, and SCHED_IDLE with background_idle;
//!   foreground: best-effort 0)
//!  controller thread, every window_ms:
//!      mean foreground fsync latency of the window (from the block)
//!      above target_ratio x its clean baseline  -> background rate halved (not below min_rate)
//!      else                                     -> rate raised by step (up to max_rate)
//!      never below min_share (half) of the background's own throughput: its bytes per
//!      second of the time its writers spent outside pacing waits
//!      boosts whose waiter died ended; every second, wait and pipe-writer records of
//!      dead threads cleared (a reused tid must not inherit them)
//!      the CPU floor: a background thread (not boosted) that got less than
//!      background_cpu_min_share of the CPU it wanted runs a nice level lower
//!      (out of SCHED_IDLE), one with well over it a level higher again
//!  at exit (or on SIGUSR1): --stats prints the per-class latency histograms and the
//!  pacing decisions; --explain the class each process and thread was given, and why
//! ```
//!
//! The classification rules and what the library does with them are in
//! `critio-control` and `critio-preload`. Rules are tried in order:
//! `--background` rules first (the exceptions), then `--foreground` ones,
//! then the preset's; a thread none matches is background.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use critio::sys::{CpuTimes, IoPriority, SchedPolicy};
use critio_control::{quantile, Class, Control, Op, Rule, ENV_CONTROL};
use serde::Deserialize;

/// The library `critio run` preloads, built by build.rs.
const PRELOAD: &[u8] = include_bytes!(env!("CRITIO_PRELOAD_SO"));

/// `critio run`'s options.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Make matching threads foreground: `main` (the launched process's
    /// main thread), `title=GLOB` (processes by title), `thread=GLOB`
    /// (threads by name). Repeatable.
    #[arg(long = "foreground", value_name = "RULE")]
    foreground: Vec<String>,
    /// Make matching threads background (tried before the foreground
    /// rules). Repeatable.
    #[arg(long = "background", value_name = "RULE")]
    background: Vec<String>,
    /// Rules for a known program: `redis` (its main thread is foreground;
    /// fork children and bio threads background) or `postgres` (backends
    /// and the WAL writer foreground; checkpointer, background writer,
    /// autovacuum background).
    #[arg(long, value_name = "PROGRAM")]
    preset: Option<Preset>,
    /// A TOML file with rules and the controller's settings (see
    /// `RunConfig`; command-line rules come first).
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Print the class each process and thread was given, and by which rule.
    #[arg(long)]
    explain: bool,
    /// Print per-class latency histograms and the pacing decisions at exit
    /// (and whenever critio run gets SIGUSR1).
    #[arg(long)]
    stats: bool,
    /// Classify and set priorities, but do not pace background writes.
    #[arg(long)]
    no_pace: bool,
    /// Load the library but pass every call straight through.
    #[arg(long)]
    disable: bool,
    /// Run the command as this user (and its primary group); the control
    /// block is handed to it. For servers that refuse to run as root
    /// (PostgreSQL).
    #[arg(long, value_name = "USER")]
    user: Option<String>,
    /// The command and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    command: Vec<OsString>,
}

/// Programs with built-in rules.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Preset {
    /// Redis: the main thread serves requests.
    Redis,
    /// PostgreSQL: backend processes serve requests.
    Postgres,
}

impl Preset {
    /// (background rules, foreground rules).
    fn rules(self) -> (&'static [&'static str], &'static [&'static str]) {
        match self {
            Preset::Redis => (&[], &["main"]),
            // The WAL writer is on the commit path (a backend waits for
            // the WAL write lock it holds), so it is foreground too.
            Preset::Postgres => (
                &[
                    "title=postgres: autovacuum*",
                    "title=postgres: walsender*",
                    "title=postgres: logical replication*",
                ],
                &["title=postgres: * * *", "title=postgres: walwriter*"],
            ),
        }
    }
}

impl Preset {
    /// The kernel I/O priority the preset's background threads get.
    ///
    /// Redis: the idle class. Its background is fork children writing a
    /// snapshot or a rewritten log that no request waits for, and bio
    /// threads.
    ///
    /// PostgreSQL: best-effort 7, never idle. Its checkpointer and
    /// background writer write pages out while holding the page's content
    /// lock and I/O-in-progress flag (an LWLock in shared memory that
    /// critio cannot see), and a backend that touches the page waits for
    /// that write. In the idle class the write waits behind every backend's
    /// I/O, so the backend does too: paper 000's priority inversion, and
    /// `critio bench run-postgres` measured it (p99.9 0.39x stock in the
    /// idle class, 1.16x lower than stock in best-effort 7).
    fn background_ioprio(self) -> IoPriority {
        match self {
            Preset::Redis => IoPriority::Idle,
            Preset::Postgres => IoPriority::BestEffort(7),
        }
    }
}

/// Parses a background I/O priority, `idle` or `best-effort-N` (N in
/// 0..=7): `ionice -c3` (served only when nothing else waits, so safe only
/// for background work no request waits for) or `ionice -c2 -n N`.
pub fn parse_background_ioprio(s: &str) -> Result<IoPriority, String> {
    let bad = || {
        format!(
            "background_ioprio = \"{s}\": expected \"idle\" or \"best-effort-N\" with N in 0..=7"
        )
    };
    if s == "idle" {
        return Ok(IoPriority::Idle);
    }
    let level: u8 = s
        .strip_prefix("best-effort-")
        .and_then(|n| n.parse().ok())
        .ok_or_else(bad)?;
    IoPriority::BestEffort(level).check().map_err(|_| bad())
}

/// A background I/O priority as `parse_background_ioprio` reads it.
fn background_ioprio_name(p: IoPriority) -> String {
    match p {
        IoPriority::BestEffort(n) => format!("best-effort-{n}"),
        IoPriority::Idle => "idle".into(),
        other => format!("{other:?}"),
    }
}

/// The controller's settings (a `--config` file; every field optional).
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunConfig {
    /// Foreground rules, after the command line's.
    pub foreground: Vec<String>,
    /// Background rules, after the command line's.
    pub background: Vec<String>,
    /// A background writer hands its data to writeback every this many
    /// KiB (two such chunks are its most in flight). Default 1024.
    pub chunk_kib: u64,
    /// The background rate the controller starts at, MiB/s. Default 64.
    pub start_rate_mib: f64,
    /// It never paces below this (background progress), MiB/s. Default 8.
    pub min_rate_mib: f64,
    /// Nor below this share of the background's own throughput (what its
    /// writers write per second they are not waiting for the pace; DESIGN
    /// §8: background keeps at least half of it). 0 turns this floor off.
    /// Default 0.5.
    pub min_share: f64,
    /// Nor above this, MiB/s (beyond it writes go unpaced). Default 1024.
    pub max_rate_mib: f64,
    /// Added per window while the foreground's latency is near its
    /// baseline, MiB/s. Default 8.
    pub step_mib: f64,
    /// The controller's window, ms. Default 100.
    pub window_ms: u64,
    /// A window whose mean foreground fsync latency exceeds this times the
    /// baseline halves the rate. Default 2.0.
    pub target_ratio: f64,
    /// CPU nice value of background threads (0: leave it). Default 10.
    pub background_nice: i32,
    /// Kernel I/O priority of background threads: `idle` or
    /// `best-effort-N`. Default: the preset's (idle for Redis,
    /// best-effort-7 for PostgreSQL, whose background writers hold locks
    /// requests wait for), else idle.
    pub background_ioprio: Option<String>,
    /// A foreground thread that waits for a background thread (a
    /// `pthread_mutex` or write-held `pthread_rwlock` it holds, a
    /// `pthread_cond` it signalled last, a child in `waitpid`) boosts it,
    /// and the background threads it waits for in turn, until the wait
    /// ends. Default true.
    pub inherit_locks: bool,
    /// Background threads also run in the kernel's `SCHED_IDLE` CPU
    /// policy (only on a CPU no other thread wants) while not boosted, in
    /// processes that run as root (the right to leave it again). A trade:
    /// on a machine with few cores it keeps a fork child's serializing
    /// off the CPU the requests need, and slows the child down. Default
    /// false.
    pub background_idle: bool,
    /// The CPU floor (critio's `context.background_cpu_min_share`): a
    /// background thread that got less than this share of the CPU it
    /// wanted over a window (its run time over its run plus run-queue
    /// wait) has its nice lowered a level, and leaves `SCHED_IDLE`, until
    /// it has its share; raised back once it has well over it. In
    /// processes that run as root, like the nice itself. 0 turns it off.
    /// Default 0.5.
    pub background_cpu_min_share: f64,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            foreground: Vec::new(),
            background: Vec::new(),
            chunk_kib: 1024,
            start_rate_mib: 64.0,
            min_rate_mib: 8.0,
            min_share: 0.5,
            max_rate_mib: 1024.0,
            step_mib: 8.0,
            window_ms: 100,
            target_ratio: 2.0,
            background_nice: 10,
            background_ioprio: None,
            inherit_locks: true,
            background_idle: false,
            background_cpu_min_share: 0.5,
        }
    }
}

impl RunConfig {
    fn validate(&self) -> Result<(), String> {
        if self.chunk_kib == 0 || self.window_ms == 0 {
            return Err("chunk_kib and window_ms must be positive".into());
        }
        if !(0.0..=1.0).contains(&self.background_cpu_min_share) {
            return Err(format!(
                "background_cpu_min_share = {} must be within 0..=1 (0: off)",
                self.background_cpu_min_share
            ));
        }
        if !(self.min_rate_mib > 0.0
            && self.min_rate_mib <= self.start_rate_mib
            && self.start_rate_mib <= self.max_rate_mib)
        {
            return Err(format!(
                "rates must satisfy 0 < min_rate_mib ({}) <= start_rate_mib ({}) <= max_rate_mib ({})",
                self.min_rate_mib, self.start_rate_mib, self.max_rate_mib
            ));
        }
        if self.target_ratio.is_nan() || self.target_ratio < 1.0 || self.step_mib < 0.0 {
            return Err("target_ratio must be >= 1.0 and step_mib >= 0".into());
        }
        if !(0.0..=1.0).contains(&self.min_share) {
            return Err(format!(
                "min_share = {} must be within 0..=1",
                self.min_share
            ));
        }
        if let Some(p) = &self.background_ioprio {
            parse_background_ioprio(p)?;
        }
        if !(0..=19).contains(&self.background_nice) {
            return Err(format!(
                "background_nice = {} must be within 0..=19",
                self.background_nice
            ));
        }
        Ok(())
    }
}

const MIB: f64 = 1048576.0;

/// The control block: a file in /dev/shm mapped shared, removed on drop.
struct Block {
    path: PathBuf,
    ptr: *mut Control,
}

// SAFETY: the mapping is shared memory whose every mutable field is
// atomic; `Block` only hands out `&Control`.
unsafe impl Send for Block {}
// SAFETY: as above.
unsafe impl Sync for Block {}

impl Block {
    fn create(
        rules: &[Rule],
        chunk_bytes: u64,
        background_nice: i32,
        background_ioprio: IoPriority,
    ) -> Result<Block, String> {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = Path::new("/dev/shm");
        let dir = if dir.is_dir() {
            dir.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = dir.join(format!("critio-run-{}-{nanos}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("cannot create the control block {}: {e}", path.display()))?;
        file.set_len(Control::SIZE as u64)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        // SAFETY: a fresh shared mapping of the whole file, which was just
        // sized to Control::SIZE and is zero-filled.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                Control::SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let _ = std::fs::remove_file(&path);
            return Err(format!(
                "cannot map the control block: {}",
                std::io::Error::last_os_error()
            ));
        }
        let ptr = p.cast::<Control>();
        let block = Block { path, ptr };
        // SAFETY: the mapping is page-aligned, Control::SIZE bytes, zeroed
        // (valid for every field), and no other process has it yet, so this
        // is the only reference.
        unsafe {
            (*ptr).init(
                rules,
                chunk_bytes,
                background_nice,
                background_ioprio.encode(),
            )?
        };
        Ok(block)
    }

    fn control(&self) -> &Control {
        // SAFETY: see `create`; from here on it is shared and only read or
        // updated through atomics.
        unsafe { &*self.ptr }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `create`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), Control::SIZE) };
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A user's uid and primary gid.
pub fn lookup_user(name: &str) -> Result<(u32, u32), String> {
    let cname = std::ffi::CString::new(name).map_err(|_| format!("bad user name `{name}`"))?;
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16384];
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call: the NUL-terminated name,
    // the passwd record, the scratch buffer and its length, the result slot.
    let rc = unsafe {
        libc::getpwnam_r(
            cname.as_ptr(),
            &mut pw,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() {
        return Err(format!("no user `{name}`"));
    }
    Ok((pw.pw_uid, pw.pw_gid))
}

/// Writes the embedded library out (once per content) and returns its path.
fn preload_path() -> Result<PathBuf, String> {
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let hash = PRELOAD.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let dir = std::env::temp_dir();
    let path = dir.join(format!("critio-preload-{hash:016x}-{me}.so"));
    // A copy is used only if it is ours, writable by no one else, and
    // byte for byte the library (anyone may create files in /tmp: a
    // planted one must never be preloaded into our command).
    let trusted = |p: &Path| {
        std::fs::symlink_metadata(p)
            .is_ok_and(|m| m.is_file() && m.uid() == me && m.mode() & 0o022 == 0)
            && std::fs::read(p).is_ok_and(|b| b == PRELOAD)
    };
    if trusted(&path) {
        return Ok(path);
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = dir.join(format!("critio-preload-{}-{nanos}.tmp", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&tmp)
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
    f.write_all(PRELOAD)
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
    drop(f);
    // Replaces a stale copy of ours; where another user's file holds the
    // name (a sticky /tmp refuses), the fresh unique file is used as is.
    if std::fs::rename(&tmp, &path).is_ok() && trusted(&path) {
        return Ok(path);
    }
    Ok(tmp)
}

/// The rules in force, in order, and the config.
fn rules_and_config(args: &RunArgs) -> Result<(Vec<Rule>, RunConfig), String> {
    let cfg: RunConfig = match &args.config {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            toml::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?
        }
        None => RunConfig::default(),
    };
    cfg.validate()?;
    let (pre_bg, pre_fg) = args.preset.map_or((&[][..], &[][..]), Preset::rules);
    let mut rules = Vec::new();
    let bg = args
        .background
        .iter()
        .chain(&cfg.background)
        .map(String::as_str);
    for r in bg.chain(pre_bg.iter().copied()) {
        rules.push(Rule::parse(r, Class::Background)?);
    }
    let fg = args
        .foreground
        .iter()
        .chain(&cfg.foreground)
        .map(String::as_str);
    for r in fg.chain(pre_fg.iter().copied()) {
        rules.push(Rule::parse(r, Class::Foreground)?);
    }
    if !rules.iter().any(|r| r.class() == Class::Foreground) {
        return Err(
            "no foreground rule: give --foreground RULE or --preset (everything would be background)"
                .into(),
        );
    }
    Ok((rules, cfg))
}

/// The background I/O priority: the config's, else the preset's, else idle.
fn background_ioprio(preset: Option<Preset>, cfg: &RunConfig) -> Result<IoPriority, String> {
    match &cfg.background_ioprio {
        Some(p) => parse_background_ioprio(p),
        None => Ok(preset.map_or(IoPriority::Idle, Preset::background_ioprio)),
    }
}

/// Runs the command; its exit code is critio run's.
pub fn run(args: RunArgs) -> Result<ExitCode, String> {
    let (rules, cfg) = rules_and_config(&args)?;
    let ioprio = background_ioprio(args.preset, &cfg)?;
    let block = Arc::new(Block::create(
        &rules,
        cfg.chunk_kib * 1024,
        cfg.background_nice,
        ioprio,
    )?);
    if args.explain {
        eprintln!(
            "critio run: background threads get I/O priority {}, CPU nice {}{}{} (if allowed); foreground best-effort-0",
            background_ioprio_name(ioprio),
            cfg.background_nice,
            if cfg.background_idle { " and SCHED_IDLE" } else { "" },
            match cfg.background_cpu_min_share {
                s if s > 0.0 && cfg.background_nice > 0 => format!(", CPU floor {s} of the CPU they want"),
                _ => String::new(),
            }
        );
    }
    // SAFETY: no other process has the block yet (the command is not
    // started), so this is the only access.
    unsafe {
        (*block.ptr).inherit_locks = u32::from(cfg.inherit_locks);
        (*block.ptr).background_idle = u32::from(cfg.background_idle);
    }
    let c = block.control();
    c.rate_bytes_per_sec.store(
        if args.no_pace {
            0
        } else {
            (cfg.start_rate_mib * MIB) as u64
        },
        Ordering::Relaxed,
    );
    let lib = preload_path()?;
    let preload = match std::env::var_os("LD_PRELOAD") {
        Some(old) if !old.is_empty() => {
            let mut v = lib.clone().into_os_string();
            v.push(":");
            v.push(old);
            v
        }
        _ => lib.into_os_string(),
    };
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env("LD_PRELOAD", preload)
        .env(ENV_CONTROL, &block.path);
    if let Some(user) = &args.user {
        let (uid, gid) = lookup_user(user)?;
        std::os::unix::fs::chown(&block.path, Some(uid), Some(gid))
            .map_err(|e| format!("cannot hand the control block to {user}: {e}"))?;
        std::os::unix::process::CommandExt::uid(&mut cmd, uid);
        std::os::unix::process::CommandExt::gid(&mut cmd, gid);
    }
    // The block is complete before the command starts: the child records
    // its own pid as the root (between fork and exec), and interposition
    // is on from the command's first instruction, so nothing it does
    // early (a thread that signals or writes at once) goes unseen.
    let root = block.ptr as usize;
    // SAFETY: the closure runs in the child between fork and exec and only
    // calls getpid and stores into the shared mapping (an atomic, mapped
    // before the fork, so mapped in the child too): both async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            let c = &*(root as *const Control);
            c.root_pid.store(libc::getpid(), Ordering::Relaxed);
            Ok(())
        });
    }
    c.enable(!args.disable);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", args.command[0].to_string_lossy()))?;
    c.root_pid.store(child.id() as i32, Ordering::Relaxed);

    let done = Arc::new(AtomicBool::new(false));
    let usr1 = Arc::new(AtomicBool::new(false));
    let _ = signal_hook::flag::register(signal_hook::consts::SIGUSR1, usr1.clone());
    // SIGTERM and SIGHUP are passed on to the command; SIGINT (a terminal's
    // Ctrl-C already reaches the command's whole process group) is only
    // survived, so that the statistics are printed and the block removed
    // once the command exits.
    let forward = Arc::new(AtomicBool::new(false));
    let _ = signal_hook::flag::register(signal_hook::consts::SIGTERM, forward.clone());
    let hup = Arc::new(AtomicBool::new(false));
    let _ = signal_hook::flag::register(signal_hook::consts::SIGHUP, hup.clone());
    let _ = signal_hook::flag::register(
        signal_hook::consts::SIGINT,
        Arc::new(AtomicBool::new(false)),
    );
    let controller = {
        let (block, done, cfg) = (block.clone(), done.clone(), cfg.clone());
        let (usr1, forward, pace, stats) =
            (usr1.clone(), forward.clone(), !args.no_pace, args.stats);
        let pid = child.id() as i32;
        std::thread::spawn(move || {
            let mut ctl = Controller::new(&cfg);
            let mut reaped_at = Instant::now();
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(cfg.window_ms));
                if pace {
                    ctl.window(block.control());
                }
                ctl.floor.window(block.control());
                reap_boosts(block.control());
                if reaped_at.elapsed() >= REAP_EVERY {
                    reaped_at = Instant::now();
                    block
                        .control()
                        .reap_dead_records(|tid| thread_state(tid).is_some());
                }
                for (flag, sig) in [(&forward, libc::SIGTERM), (&hup, libc::SIGHUP)] {
                    if flag.swap(false, Ordering::Relaxed) {
                        // SAFETY: kill takes integers; the child is ours.
                        unsafe { libc::kill(pid, sig) };
                    }
                }
                if usr1.swap(false, Ordering::Relaxed) && stats {
                    print_stats(block.control(), &ctl);
                }
            }
            ctl
        })
    };
    let status = child
        .wait()
        .map_err(|e| format!("waiting for the command: {e}"))?;
    done.store(true, Ordering::Relaxed);
    let ctl = controller.join().map_err(|_| "the controller panicked")?;
    if args.explain {
        print_explain(c);
    }
    if args.stats {
        print_stats(c, &ctl);
    }
    let code = match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        _ => 1,
    };
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// Ends the boosts of waiters that died in their wait (a process killed
/// while it waited: neither the hook's return nor a thread-local destructor
/// ran, so the boosted thread would stay unpaced at full priority for
/// good). A boosted thread left with no waiter gets its background
/// priorities back, as the waiter's own end of the wait would have given
/// them: the I/O priority, and the nice value and (with
/// `background_idle`) `SCHED_IDLE` where its process runs as root (only
/// such a process nices its background threads or makes them idle).
fn reap_boosts(c: &Control) {
    for tid in c.reap_boosters(|tid| thread_state(tid).is_some_and(|s| s.alive)) {
        if c.logged_class(tid) != Some(Class::Background) {
            continue;
        }
        let Some(state) = thread_state(tid) else {
            continue;
        };
        if let Some(prio) = IoPriority::decode(c.background_ioprio as u16) {
            let _ = critio::sys::set_thread_ioprio(tid, prio);
        }
        if c.background_nice != 0 && state.root {
            // SAFETY: setpriority takes integers and changes only thread
            // `tid`'s nice value.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, c.background_nice) };
        }
        if c.background_idle != 0
            && state.root
            && critio::sys::thread_policy(tid).is_ok_and(|p| p == SchedPolicy::Normal)
        {
            let _ = critio::sys::set_thread_policy(tid, SchedPolicy::Idle);
        }
    }
}

/// How often the wait and pipe-writer records of dead threads are cleared
/// (`Control::reap_dead_records`; a thread exists while `/proc/TID` does,
/// a zombie too, its tid not free yet): a read of its status per record.
const REAP_EVERY: Duration = Duration::from_secs(1);

/// What `/proc/TID/status` says of a thread.
struct ThreadState {
    /// Neither a zombie nor dead.
    alive: bool,
    /// Its effective user is root.
    root: bool,
}

/// Thread `tid`'s state (None: no such thread).
fn thread_state(tid: i32) -> Option<ThreadState> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    let alive = field("State:").is_some_and(|s| !s.starts_with('Z') && !s.starts_with('X'));
    // "Uid: real effective saved fs"
    let root = field("Uid:").and_then(|u| u.split_whitespace().nth(1)) == Some("0");
    Some(ThreadState { alive, root })
}

/// The background rate's controller: AIMD on the foreground's mean fsync
/// latency against its clean baseline (the lowest window mean seen,
/// drifting up 0.1% per window, about 1% a second at the default window,
/// so a device that got slower for good is re-learnt).
#[derive(Debug)]
struct Controller {
    cfg: RunConfig,
    rate: f64,
    baseline: Option<f64>,
    windows: u64,
    rate_min_seen: f64,
    rate_sum: f64,
    /// The background's own throughput, bytes/s (smoothed over windows).
    own: Option<f64>,
    /// `own_bytes` and `own_ns` as last used.
    own_seen: (u64, u64),
    started: Instant,
    floor: CpuFloor,
}

impl Controller {
    fn new(cfg: &RunConfig) -> Self {
        let rate = cfg.start_rate_mib * MIB;
        Self {
            cfg: cfg.clone(),
            rate,
            baseline: None,
            windows: 0,
            rate_min_seen: rate,
            rate_sum: 0.0,
            own: None,
            own_seen: (0, 0),
            started: Instant::now(),
            floor: CpuFloor::new(cfg),
        }
    }

    fn window(&mut self, c: &Control) {
        let sum = c.fg_sync_ns.swap(0, Ordering::Relaxed);
        let n = c.fg_sync_count.swap(0, Ordering::Relaxed);
        let (min, max, step) = (
            self.cfg.min_rate_mib * MIB,
            self.cfg.max_rate_mib * MIB,
            self.cfg.step_mib * MIB,
        );
        let over = if n == 0 {
            false
        } else {
            let mean = sum as f64 / n as f64;
            let base = self.baseline.map_or(mean, |b| (b * 1.001).min(mean));
            self.baseline = Some(base);
            mean > self.cfg.target_ratio * base
        };
        let floor = self.own_rate(c) * self.cfg.min_share;
        if over {
            self.rate = (self.rate / 2.0).max(min);
            c.rate_cuts.fetch_add(1, Ordering::Relaxed);
        } else {
            self.rate = (self.rate + step).min(max);
            c.rate_raises.fetch_add(1, Ordering::Relaxed);
        }
        self.rate = self.rate.max(floor.min(max));
        let paced = if self.rate >= max {
            0
        } else {
            self.rate as u64
        };
        c.rate_bytes_per_sec.store(paced, Ordering::Relaxed);
        self.windows += 1;
        self.rate_min_seen = self.rate_min_seen.min(self.rate);
        self.rate_sum += self.rate;
    }

    /// The background's own throughput in bytes/s, updated from what its
    /// writers published since the last window (0 before any).
    fn own_rate(&mut self, c: &Control) -> f64 {
        let now = (
            c.own_bytes.load(Ordering::Relaxed),
            c.own_ns.load(Ordering::Relaxed),
        );
        let (bytes, ns) = (now.0 - self.own_seen.0, now.1 - self.own_seen.1);
        // Fewer than 10 ms of writing says little: wait for more.
        if ns >= 10_000_000 {
            let sample = bytes as f64 / (ns as f64 / 1e9);
            self.own = Some(self.own.map_or(sample, |r| r + 0.3 * (sample - r)));
            self.own_seen = now;
        }
        self.own.unwrap_or(0.0)
    }
}

/// The CPU floor for the program's background threads, applied from
/// outside as critio's `context` applies it to its own
/// ([`critio::context::next_relief`]): each window, every background thread
/// of the tree that is not boosted and runs as root (the processes whose
/// background threads are niced) is read (`/proc/TID/schedstat`); one that
/// got less than `background_cpu_min_share` of the CPU it wanted is
/// relieved a nice level (and leaves `SCHED_IDLE`), one with well over it
/// is given a level back. The library re-applies the full background nice
/// when a boost ends; the next window relieves the thread again.
#[derive(Debug)]
struct CpuFloor {
    min_share: f64,
    window: Duration,
    /// Per background thread: its times at the last window and its relief.
    threads: HashMap<i32, (CpuTimes, i32)>,
    /// Times a thread was relieved by one more level.
    raises: u64,
    /// The most any thread was relieved.
    relief_max: i32,
}

impl CpuFloor {
    fn new(cfg: &RunConfig) -> Self {
        Self {
            min_share: cfg.background_cpu_min_share,
            window: Duration::from_millis(cfg.window_ms),
            threads: HashMap::new(),
            raises: 0,
            relief_max: 0,
        }
    }

    fn window(&mut self, c: &Control) {
        let full = c.background_nice;
        if self.min_share == 0.0 || full == 0 {
            return;
        }
        // The log is oldest first: a thread's last record is its class now.
        let latest: HashMap<i32, Class> = c.thread_classes().collect();
        let mut next = HashMap::with_capacity(self.threads.len());
        for (tid, class) in latest {
            if class != Class::Background {
                continue;
            }
            if !thread_state(tid).is_some_and(|s| s.alive && s.root) {
                continue;
            }
            let Ok(now) = critio::sys::thread_cpu_times(tid) else {
                continue;
            };
            let (old, relief) = match self.threads.get(&tid) {
                None => (0, 0), // its first window
                Some(&(before, old)) => (
                    old,
                    critio::context::next_relief(
                        old,
                        now.since(before),
                        self.min_share,
                        full,
                        self.window,
                    ),
                ),
            };
            if relief > old {
                self.raises += 1;
                self.relief_max = self.relief_max.max(relief);
            }
            next.insert(tid, (now, relief));
            if !c.boosted(tid) {
                let idle = (c.background_idle != 0).then_some(relief == 0);
                apply_relief(tid, full - relief, idle);
            }
        }
        self.threads = next;
    }
}

/// Puts background thread `tid` at `nice` and, where the idle policy is
/// on (`idle` is Some), in `SCHED_IDLE` or out of it; each only if it
/// differs.
fn apply_relief(tid: i32, nice: i32, idle: Option<bool>) {
    let Some(pid) = rustix::process::Pid::from_raw(tid) else {
        return;
    };
    if rustix::process::getpriority_process(Some(pid)).is_ok_and(|n| n != nice) {
        let _ = rustix::process::setpriority_process(Some(pid), nice);
    }
    let (Some(idle), Ok(policy)) = (idle, critio::sys::thread_policy(tid)) else {
        return;
    };
    match (policy, idle) {
        (SchedPolicy::Normal, true) => {
            let _ = critio::sys::set_thread_policy(tid, SchedPolicy::Idle);
        }
        (SchedPolicy::Idle, false) => {
            let _ = critio::sys::set_thread_policy(tid, SchedPolicy::Normal);
        }
        _ => {}
    }
}

fn ms(ns: u64) -> String {
    format!("{:.3}", ns as f64 / 1e6)
}

fn print_stats(c: &Control, ctl: &Controller) {
    eprintln!("critio run: I/O latency per class (histogram bucket bounds, ms)");
    eprintln!(
        "  {:<11} {:<6} {:>10} {:>9} {:>9} {:>9} {:>9}",
        "class", "op", "calls", "p50", "p99", "p99.9", "max"
    );
    for class in [Class::Foreground, Class::Background] {
        for op in Op::ALL {
            let h = c.histogram(class, op);
            let n: u64 = h.iter().sum();
            if n == 0 {
                continue;
            }
            let q = |q| quantile(&h, q).map_or("-".into(), ms);
            eprintln!(
                "  {:<11} {:<6} {:>10} {:>9} {:>9} {:>9} {:>9}",
                class.name(),
                op.name(),
                n,
                q(0.5),
                q(0.99),
                q(0.999),
                q(1.0)
            );
        }
    }
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    eprintln!(
        "critio run: pacing: {} appended chunks, {:.1} MiB handed to writeback ({:.1} s waiting for it), \
         {:.1} s waiting for the pace, {:.1} MiB dropped from the page cache, {:.1} MiB written at {:.0} MiB/s \
         outside pacing waits; {} chunks written in place \
         started on their way ({:.1} MiB, never waited for); {} lock owners boosted (or children waited for)",
        get(&c.paced_chunks),
        get(&c.paced_bytes) as f64 / MIB,
        get(&c.writeback_wait_ns) as f64 / 1e9,
        get(&c.pace_wait_ns) as f64 / 1e9,
        get(&c.dropped_bytes) as f64 / MIB,
        get(&c.own_bytes) as f64 / MIB,
        get(&c.own_bytes) as f64 / MIB / (get(&c.own_ns).max(1) as f64 / 1e9),
        get(&c.kicked_chunks),
        get(&c.kicked_bytes) as f64 / MIB,
        get(&c.boosts),
    );
    let mean = if ctl.windows > 0 {
        ctl.rate_sum / ctl.windows as f64 / MIB
    } else {
        ctl.rate / MIB
    };
    eprintln!(
        "critio run: controller: {} windows in {:.1} s, {} cuts, {} raises; rate now {:.0} MiB/s, \
         mean {:.0}, lowest {:.0}; background's own throughput {}; foreground fsync baseline {}",
        ctl.windows,
        ctl.started.elapsed().as_secs_f64(),
        get(&c.rate_cuts),
        get(&c.rate_raises),
        ctl.rate / MIB,
        mean,
        ctl.rate_min_seen / MIB,
        ctl.own
            .map_or("not measured".into(), |r| format!("{:.0} MiB/s", r / MIB)),
        ctl.baseline
            .map_or("not measured".into(), |b| format!("{} ms", ms(b as u64))),
    );
    eprintln!(
        "critio run: CPU floor ({} of the CPU a background thread wants): {} times a thread was relieved a nice level more, by at most {}",
        ctl.floor.min_share,
        ctl.floor.raises,
        ctl.floor.relief_max,
    );
}

fn print_explain(c: &Control) {
    let rules = c.rules();
    eprintln!("critio run: classification (first matching rule decides; none: background)");
    eprintln!(
        "  {:>7} {:>7}  {:<11} {:<26} {:<16} title",
        "pid", "tid", "class", "rule", "thread"
    );
    for t in c.threads() {
        let rule = t
            .rule
            .and_then(|i| rules.get(i))
            .map_or("(default)".to_owned(), Rule::describe);
        eprintln!(
            "  {:>7} {:>7}  {:<11} {:<26} {:<16} {}",
            t.pid,
            t.tid,
            t.class.name(),
            rule,
            t.name,
            t.title
        );
    }
    let n = c.n_threads.load(Ordering::Relaxed) as usize;
    if n > critio_control::THREADS_MAX {
        eprintln!(
            "  ({} earlier ones not shown: the log keeps the newest {})",
            n - critio_control::THREADS_MAX,
            critio_control::THREADS_MAX
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_is_alive_until_it_is_reaped_and_then_gone() {
        // SAFETY: gettid and geteuid have no preconditions.
        let (me, root) = unsafe { (libc::gettid(), libc::geteuid() == 0) };
        let s = thread_state(me).expect("this thread");
        assert!(s.alive);
        assert_eq!(s.root, root);
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        while thread_state(pid).is_some_and(|s| s.alive) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(thread_state(pid).is_some_and(|s| !s.alive), "a zombie");
        child.wait().unwrap();
        assert!(thread_state(pid).is_none(), "reaped");
    }

    #[test]
    fn a_thread_that_ended_no_longer_exists() {
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        let exists = |tid: i32| thread_state(tid).is_some();
        assert!(exists(me));
        // SAFETY: as above.
        let t = std::thread::spawn(|| unsafe { libc::gettid() });
        let tid = t.join().unwrap();
        assert!(tid != me);
        // A joined thread's tid is released once its exit completes.
        let gone = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(5));
            !exists(tid)
        });
        assert!(gone, "thread {tid} still exists after it was joined");
        assert!(!exists(0) && !exists(-1));
    }

    /// Every window's foreground fsyncs are 4x the first window's, so the
    /// controller cuts every time; the background's writers report 200
    /// MiB/s of their own. The rate stops at half of that, not at
    /// min_rate, and with min_share 0 it falls to min_rate.
    #[test]
    fn the_pace_keeps_half_of_the_backgrounds_own_throughput() {
        let run = |min_share: f64| {
            let cfg = RunConfig {
                min_share,
                ..RunConfig::default()
            };
            let block = Block::create(&[], 1 << 20, 0, IoPriority::Idle).unwrap();
            let c = block.control();
            let mut ctl = Controller::new(&cfg);
            for i in 0..40u64 {
                let fsync_ns = if i == 0 { 1_000_000 } else { 4_000_000 };
                c.fg_sync_ns.store(fsync_ns, Ordering::Relaxed);
                c.fg_sync_count.store(1, Ordering::Relaxed);
                // 20 MiB in 100 ms outside pacing waits: 200 MiB/s.
                c.own_bytes.fetch_add(20 << 20, Ordering::Relaxed);
                c.own_ns.fetch_add(100_000_000, Ordering::Relaxed);
                ctl.window(c);
            }
            c.rate_bytes_per_sec.load(Ordering::Relaxed) as f64 / MIB
        };
        let kept = run(0.5);
        assert!((99.0..=101.0).contains(&kept), "half of 200: {kept}");
        assert_eq!(run(0.0), 8.0, "share off: min_rate");
    }

    #[test]
    fn background_ioprio_parses_and_defaults_by_preset() {
        assert_eq!(parse_background_ioprio("idle"), Ok(IoPriority::Idle));
        assert_eq!(
            parse_background_ioprio("best-effort-7"),
            Ok(IoPriority::BestEffort(7))
        );
        for bad in ["best-effort-8", "be7", "", "best-effort-"] {
            let e = parse_background_ioprio(bad).unwrap_err();
            assert!(e.contains("best-effort-N"), "{e}");
        }
        assert_eq!(IoPriority::BestEffort(7).encode(), (2 << 13) | 7);
        assert_eq!(IoPriority::Idle.encode(), 3 << 13);
        let cfg = RunConfig::default();
        assert_eq!(
            background_ioprio(Some(Preset::Postgres), &cfg),
            Ok(IoPriority::BestEffort(7))
        );
        assert_eq!(
            background_ioprio(Some(Preset::Redis), &cfg),
            Ok(IoPriority::Idle)
        );
        assert_eq!(background_ioprio(None, &cfg), Ok(IoPriority::Idle));
        let cfg = RunConfig {
            background_ioprio: Some("best-effort-3".into()),
            ..RunConfig::default()
        };
        assert_eq!(
            background_ioprio(Some(Preset::Postgres), &cfg),
            Ok(IoPriority::BestEffort(3)),
            "the config wins over the preset"
        );
        let bad = RunConfig {
            background_ioprio: Some("realtime".into()),
            ..RunConfig::default()
        };
        assert!(bad.validate().is_err());
    }
}
