//! `critio serve`: the key-value server on a data directory.
//!
//! ```text
//!  --data DIR ──> DIR/critio-sim.img (--device sim: the simulated SSD, data in a file)
//!             └─> DIR/critio.img     (--device file: io_uring + O_DIRECT; pool: pread/pwrite)
//!  open: the image's own size if it exists (recovery), else --capacity
//!  run:  Stack::open (recover) ─> Server::start (and --metrics ADDR:
//!        http://ADDR/metrics) ─> wait for SIGINT / SIGTERM / a SHUTDOWN
//!  stop: no more accepts ─> commands in flight finish ─> engine.close()
//!        (a final checkpoint) ─> exit 0
//! ```

use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use critio::block::{AutoCapConfig, BlockScheme, NoncriticalCap};
use critio::class::Class;
use critio::device::sim::Profile;
use critio::device::DeviceSpec;
use critio::device::IO_LEN_MAX;
use critio_kv::server::{Backend, FileConfig, Server};
use critio_kv::stack::{Scheme, Stack, StackConfig};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// The device a data directory holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceKind {
    /// The simulated SSD, its data in DIR/critio-sim.img.
    Sim,
    /// DIR/critio.img through io_uring with O_DIRECT.
    File,
    /// DIR/critio.img through pread/pwrite worker threads.
    Pool,
}

/// `critio serve`'s options.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Listen on this address (default 127.0.0.1:6390, or [server] bind).
    #[arg(long, value_name = "ADDR")]
    bind: Option<String>,
    /// Clients must AUTH with this password first (Redis's requirepass;
    /// or [server] requirepass).
    #[arg(long, value_name = "PASSWORD")]
    requirepass: Option<String>,
    /// Redis's protected mode: with no password, refuse clients that do
    /// not connect over loopback (default yes, or [server] protected_mode).
    #[arg(long, value_name = "yes|no", value_parser = parse_yes_no)]
    protected_mode: Option<bool>,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g.
    /// 127.0.0.1:9190; or [server] metrics). Off by default.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// The data directory (created if missing).
    #[arg(long, value_name = "DIR", default_value = "critio-data")]
    data: PathBuf,
    /// The device in the data directory.
    #[arg(long, value_enum, default_value = "sim")]
    device: DeviceKind,
    /// The device size of a new store (8GiB, 512MiB, bytes); an existing
    /// image keeps its size. Default: 1GiB simulated, 8GiB for a file
    /// (reserved and written with zeros once when created, so its file
    /// system must have that much free, and no write later waits for the
    /// file system to allocate a block).
    #[arg(long, value_name = "SIZE")]
    capacity: Option<String>,
    /// The scheme: none, kernel-idle, static, sync-first, rcp.
    #[arg(long, default_value = "rcp")]
    scheme: Scheme,
    /// A TOML config: [server], [engine], and critio's [context], [sync],
    /// [block], [log], [cache].
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The simulated device's seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// `yes` or `no`, as Redis's options take them.
fn parse_yes_no(text: &str) -> Result<bool, String> {
    match text.to_ascii_lowercase().as_str() {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(format!("`{text}`: use yes or no")),
    }
}

/// `1GiB`, `512MiB`, `64M`, `4k`, or plain bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a size: use e.g. 1GiB, 512MiB or bytes"))?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => {
            return Err(format!(
                "`{text}`: unknown unit `{unit}` (use KiB, MiB, GiB, TiB)"
            ))
        }
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("`{text}` is too large"))
}

fn load_config(path: Option<&Path>, base: &FileConfig) -> Result<FileConfig, String> {
    let Some(path) = path else {
        return Ok(base.clone());
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    FileConfig::from_toml_str_over(&text, base).map_err(|e| format!("{}: {e}", path.display()))
}

/// The machine's memory, from /proc/meminfo.
fn mem_total_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Refuses a page cache larger than the machine's memory: its frames are
/// backed when the store opens, so it would run the machine out of memory
/// instead of caching anything.
fn check_memory(cache: u64, mem: Option<u64>) -> Result<(), String> {
    match mem {
        Some(mem) if cache > mem => Err(format!(
            "the page cache ([cache] capacity_bytes = {} MiB) is larger than this machine's \
             memory ({} MiB); its frames are backed at start, so set it well below that \
             (the real-device default is an eighth of the memory: {} MiB)",
            cache >> 20,
            mem >> 20,
            real_cache_bytes(Some(mem)) >> 20
        )),
        _ => Ok(()),
    }
}

/// The page cache on a real device: an eighth of the machine's memory
/// (the index of keys lives in memory too), at least 256 MiB, at most
/// 4 GiB; [`open_store`] cuts it to the device's size if that is less.
fn real_cache_bytes(mem: Option<u64>) -> u64 {
    let bytes = mem.map_or(1 << 30, |m| (m / 8).clamp(256 << 20, 4 << 30));
    bytes / (1 << 20) * (1 << 20)
}

/// The defaults a store gets on `kind`: the simulated SSD keeps the paper's
/// (a small cache, the fixed cap of 1); a real device gets a cache sized to
/// the machine, a checkpoint every second (each writes only the value
/// log's pages since the last one) and the adaptive cap (a real device's
/// queue and write cache need more than one background request in flight
/// to keep background work going). Background threads keep nice 10: with a
/// thread per connection, `critio bench kv-vs-redis` had measured that it
/// halved the BGSAVE and BGREWRITEAOF rounds of a saturated two-core
/// machine for no request latency, but with the request workers (a few
/// event loops) rcp under nice 10 finished as many rounds as under nice 0
/// (1.63 against 1.68 a second, still 1.8x Redis's; vda, mq-deadline) with SET and GET
/// p99.9 8.2 and 3.2 ms against 11.1 and 4.8.
fn defaults_for(kind: DeviceKind) -> FileConfig {
    let mut f = FileConfig::default();
    if kind != DeviceKind::Sim {
        f.critio.cache.capacity_bytes = real_cache_bytes(mem_total_bytes());
        f.engine.checkpoint_interval_ms = 1000;
        f.critio.block.noncritical_cap = NoncriticalCap::Auto(AutoCapConfig::default());
        f.critio.block.noncritical_request_max_bytes = REAL_REQUEST_MAX;
    }
    f
}

/// The longest background request of a bulk transfer on a real device
/// (`block.noncritical_request_max_bytes`). `critio bench kv-vs-redis`'s
/// device table on this project's virtual disk (vda, mq-deadline): a
/// commit (4 KiB `O_DSYNC` write, QD 1) next to an unpaced reader of one
/// request at a time had a p99.9 of 3.19 ms and did 571 commits a second
/// with 1 MiB reads (883 MB/s), 0.97 ms and 2225 a second with 128 KiB
/// reads (585 MB/s). 128 KiB is also the cache's writeback run (32 pages
/// of 4 KiB).
const REAL_REQUEST_MAX: u64 = 128 << 10;

/// One line saying the settings a user most often needs to know, and where
/// each came from.
fn describe_settings(
    f: &FileConfig,
    base: &FileConfig,
    kind: DeviceKind,
    scheme: Scheme,
) -> String {
    let from = |same: bool| {
        if !same {
            "from --config"
        } else if kind == DeviceKind::Sim {
            "default"
        } else {
            "real-device default"
        }
    };
    let cache = f.critio.cache.capacity_bytes;
    let effective = scheme.apply(&f.critio);
    let cap = match (effective.block.scheme, effective.block.noncritical_cap) {
        (BlockScheme::None, _) => "unlimited, one queue".to_owned(),
        (_, NoncriticalCap::Fixed(0)) => "unlimited".to_owned(),
        (_, NoncriticalCap::Fixed(n)) => n.to_string(),
        (_, NoncriticalCap::Auto(a)) => format!("adaptive (up to {})", a.max),
    };
    // Where a setting came from: the scheme when it overrides the config.
    let source = |by_scheme: bool, same: bool| {
        if by_scheme {
            format!("scheme {scheme}")
        } else {
            from(same).to_owned()
        }
    };
    let cap_from = source(
        effective.block != f.critio.block,
        f.critio.block.noncritical_cap == base.critio.block.noncritical_cap,
    );
    // A bulk transfer's background requests: a scan's reads, which its
    // thread waits for, and a dump's writes (sync-first makes the reads
    // critical; none has no classes).
    let scheme_cut = |sync| {
        let b = &effective.block;
        b.request_len_max(b.scheme.classify(sync, Class::NonCritical))
    };
    let (reads, writes) = (scheme_cut(true), scheme_cut(false));
    let cut = match (reads == IO_LEN_MAX, writes == IO_LEN_MAX) {
        (true, true) => "bulk background requests not cut".to_owned(),
        (false, _) => format!("bulk background requests at most {} KiB", reads >> 10),
        (true, false) => format!(
            "bulk background writes at most {} KiB, reads not cut",
            writes >> 10
        ),
    };
    let cut_cfg = f.critio.block.noncritical_request_max_bytes;
    let cut_from = source(
        reads.max(writes) == IO_LEN_MAX && cut_cfg != 0,
        cut_cfg == base.critio.block.noncritical_request_max_bytes,
    );
    let nice = match effective.context.background_nice {
        0 => "off".to_owned(),
        // Counted from each background thread's own nice (the server's).
        n if effective.context.background_idle => {
            format!("+{n} over the server's own and SCHED_IDLE")
        }
        n => format!("+{n} over the server's own"),
    };
    let nice_from = source(
        effective.context.background_nice != f.critio.context.background_nice,
        f.critio.context.background_nice == base.critio.context.background_nice,
    );
    let share = effective.context.background_cpu_min_share;
    let floor = match (effective.context.background_nice, share) {
        (0, _) => String::new(),
        (_, 0.0) => ", no CPU floor".to_owned(),
        (_, s) => format!(
            ", CPU floor {s} of the CPU it wants ({})",
            from(s == base.critio.context.background_cpu_min_share)
        ),
    };
    let every = effective.context.background_yield_us;
    let yields = match (effective.context.background_nice, every) {
        (0, _) => String::new(),
        (_, 0) => ", background CPU loops never yield".to_owned(),
        (_, us) => format!(
            ", background CPU loops yield every {us} us ({})",
            from(us == base.critio.context.background_yield_us)
        ),
    };
    // The cache's memory: backed by a background thread at start
    // (`cache.prefault`), or by each frame's first write.
    let backed = if f.critio.cache.prefault {
        "memory backed at start"
    } else {
        "memory backed as first used"
    };
    format!(
        "critio-kv: page cache {} MiB ({}; {backed}), checkpoint every {} ms ({}), background I/O at the device {} ({}), {cut} ({cut_from}), background CPU nice {} ({}){floor}{yields}, request workers {} ({}), cache-miss readers {} ({})",
        cache >> 20,
        from(cache == base.critio.cache.capacity_bytes),
        f.engine.checkpoint_interval_ms,
        from(f.engine.checkpoint_interval_ms == base.engine.checkpoint_interval_ms),
        cap,
        cap_from,
        nice,
        nice_from,
        f.server.workers_in_effect(),
        if f.server.workers == 0 {
            "default: one per two cores"
        } else {
            "from --config"
        },
        f.server.miss_readers,
        from(f.server.miss_readers == base.server.miss_readers),
    )
}

/// The image file a device of this kind keeps in a data directory.
fn image_name(kind: DeviceKind) -> &'static str {
    match kind {
        DeviceKind::Sim => "critio-sim.img",
        DeviceKind::File | DeviceKind::Pool => "critio.img",
    }
}

/// An image's length, if it exists.
fn image_len(image: &Path) -> Option<u64> {
    std::fs::metadata(image).map(|m| m.len()).ok()
}

/// Refuses to create a store in `dir` for `kind` when `dir` already holds
/// one for the other kind of image: the user would see an empty database
/// beside their data (most likely a `--device` left out or mistyped).
fn check_kind(dir: &Path, kind: DeviceKind) -> Result<(), String> {
    if image_len(&dir.join(image_name(kind))).is_some_and(|n| n > 0) {
        return Ok(());
    }
    let (other, names) = match kind {
        DeviceKind::Sim => (DeviceKind::File, "--device file (or pool)"),
        DeviceKind::File | DeviceKind::Pool => (DeviceKind::Sim, "--device sim"),
    };
    let theirs = dir.join(image_name(other));
    match image_len(&theirs) {
        Some(n) if n > 0 => Err(format!(
            "{} holds a store of another device ({}, {n} bytes), and --device {} would create a \
             new, empty one beside it; pass {names} to open that store, or another --data",
            dir.display(),
            theirs.display(),
            device_name(kind),
        )),
        _ => Ok(()),
    }
}

/// Leaves no image behind a store that could not be created (a later
/// start would take its size and fail the same way): removes it, or
/// empties it again if it was there empty before. Only while no one else
/// holds its lock: another server may be creating it at this moment.
fn discard_new_image(image: &Path, existed: bool) {
    use rustix::fs::{flock, FlockOperation};
    let Ok(file) = std::fs::File::options().write(true).open(image) else {
        return;
    };
    if flock(&file, FlockOperation::NonBlockingLockExclusive).is_err() {
        return;
    }
    let _ = match existed {
        false => std::fs::remove_file(image),
        true => file.set_len(0),
    };
}

/// The device spec of `kind`'s image.
fn device_spec(kind: DeviceKind, image: PathBuf) -> DeviceSpec {
    match kind {
        DeviceKind::Sim => DeviceSpec::Sim {
            profile: Profile::Ssd,
            file: Some(image),
        },
        DeviceKind::File => DeviceSpec::Uring(image),
        DeviceKind::Pool => DeviceSpec::Pool(image),
    }
}

/// The name `--device` gives `kind`.
fn device_name(kind: DeviceKind) -> String {
    kind.to_possible_value()
        .map_or("?".to_owned(), |v| v.get_name().to_owned())
}

/// The image of the store in `data` if a running server holds it (its
/// lock: `flock`, which the file and pool devices take), for reading it
/// on its own (`critio dump` while the server runs); None if no process
/// holds it, or the device keeps no such image (the simulator's).
pub fn held_image(data: &Path, device: DeviceKind) -> Option<PathBuf> {
    use rustix::fs::{flock, FlockOperation};
    if device == DeviceKind::Sim {
        return None;
    }
    let image = data.join(image_name(device));
    let file = std::fs::File::open(&image).ok()?;
    // Refused only while another open file holds the exclusive lock; a
    // shared one taken here goes with `file`.
    match flock(&file, FlockOperation::NonBlockingLockShared) {
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => Some(image),
        _ => None,
    }
}

/// The `[engine]` config of a store's server on `device` with `config`
/// (the defaults for that device where it says nothing): its layout.
pub fn engine_config(
    device: DeviceKind,
    config: Option<&Path>,
) -> Result<critio_kv::engine::EngineConfig, String> {
    Ok(load_config(config, &defaults_for(device))?.engine)
}

/// Opens (recovering) the store a server left in `data` for another
/// command (`critio dump`): never creates one. The page cache is
/// `cache_bytes` whatever `config` says (which gives the store's layout:
/// a server's cache of gigabytes would only be backed for nothing); the
/// scheme is `none` (no requests to protect).
pub fn open_existing(
    data: &Path,
    device: DeviceKind,
    config: Option<&Path>,
    cache_bytes: u64,
) -> Result<Stack, String> {
    let base = defaults_for(device);
    let mut file = load_config(config, &base)?;
    file.critio.cache.capacity_bytes = cache_bytes;
    check_memory(file.critio.cache.capacity_bytes, mem_total_bytes())?;
    check_kind(data, device)?;
    let image = data.join(image_name(device));
    let capacity = match image_len(&image) {
        Some(n) if n > 0 => n,
        _ => {
            return Err(format!(
                "{} holds no critio-kv store for --device {} (no {}): pass the --data and \
                 --device its server was started with",
                data.display(),
                device_name(device),
                image.display()
            ))
        }
    };
    let cfg = StackConfig {
        device: device_spec(device, image),
        capacity,
        scheme: Scheme::None,
        critio: file.critio,
        engine: file.engine,
        ..StackConfig::default()
    };
    Stack::open(&cfg).map_err(|e| {
        let text = e.to_string();
        format!(
            "cannot open the store: {}",
            text.strip_prefix("ERR ").unwrap_or(&text)
        )
    })
}

/// Opens (recovering) the store in the data directory.
///
/// A default page cache (`cache_default`: not from `--config`) larger than
/// the device is cut to the device's size, saying so: it could never hold
/// more, and its frames are backed at start.
fn open_store(
    args: &ServeArgs,
    mut file: FileConfig,
    cache_default: bool,
) -> Result<(Stack, StackConfig, PathBuf), String> {
    std::fs::create_dir_all(&args.data).map_err(|e| {
        format!(
            "cannot create the data directory {}: {e}",
            args.data.display()
        )
    })?;
    let dir = args.data.canonicalize().unwrap_or(args.data.clone());
    let size = match (&args.capacity, args.device) {
        (Some(text), _) => parse_size(text)?,
        (None, DeviceKind::Sim) => 1 << 30,
        (None, _) => 8 << 30,
    };
    check_kind(&dir, args.device)?;
    let image = dir.join(image_name(args.device));
    let existing = image_len(&image);
    // An image with data keeps its size; a missing or empty one is new.
    let reopen = existing.is_some_and(|n| n > 0);
    let capacity = existing.filter(|_| reopen).unwrap_or(size);
    let device = device_spec(args.device, image.clone());
    let cache = &mut file.critio.cache.capacity_bytes;
    if cache_default && *cache > capacity {
        *cache = (capacity >> 20 << 20).max(16 << 20);
        println!(
            "critio-kv: page cache {} MiB instead: the device holds no more",
            *cache >> 20
        );
    }
    let cfg = StackConfig {
        device,
        capacity,
        seed: args.seed,
        scheme: args.scheme,
        critio: file.critio,
        engine: file.engine,
        ..StackConfig::default()
    };
    println!(
        "critio-kv {}: {} {} ({capacity} bytes, scheme {})",
        critio_kv::VERSION,
        if reopen { "recovering" } else { "creating" },
        cfg.device,
        cfg.scheme
    );
    let started = std::time::Instant::now();
    let opened = Stack::open(&cfg);
    if opened.is_err() && !reopen {
        discard_new_image(&image, existing.is_some());
    }
    // The engine's errors are worded for clients ("ERR ..."); not here.
    let opened = opened.map_err(|e| {
        let text = e.to_string();
        text.strip_prefix("ERR ").unwrap_or(&text).to_owned()
    });
    let stack = opened.map_err(|e| match (reopen, args.device) {
        (false, DeviceKind::File | DeviceKind::Pool) => format!(
            "cannot open the store: {e} ({})",
            if args.capacity.is_some() {
                "--capacity gave the new image's size"
            } else {
                "a new image is 8GiB unless --capacity says otherwise"
            }
        ),
        _ => format!("cannot open the store: {e}"),
    })?;
    if !reopen && args.device != DeviceKind::Sim {
        println!(
            "critio-kv: created in {:.1} s (a new image is written once with zeros, so that no \
             later write waits for the file system to allocate its blocks)",
            started.elapsed().as_secs_f64()
        );
    }
    for note in stack.io.notes() {
        println!("critio-kv: note: {note}");
    }
    if args.device != DeviceKind::Sim {
        if let Some(note) = critio::sys::disk_of(&image).and_then(|d| idling_note(&d)) {
            println!("critio-kv: note: {note}");
        }
    }
    Ok((stack, cfg, dir))
}

/// A note when the disk's I/O scheduler idles for a queue: bfq waits up to
/// `slice_idle` after a queue's request for its next one before serving
/// another queue, and bfq takes a request's priority from its thread, not
/// from the request, so it neither knows which queue holds a request's
/// I/O nor preempts the idling for it. On this project's virtual machine
/// (docs/RESULTS.md, kv-schedulers) that left an rcp SET waiting up to
/// 457 ms behind BGSAVE and BGREWRITEAOF; with `slice_idle` 0, at most
/// 11 ms.
fn idling_note(disk: &critio::sys::Disk) -> Option<String> {
    let us = disk.slice_idle_us.filter(|&us| us > 0)?;
    (disk.scheduler.as_deref() == Some("bfq")).then(|| {
        format!(
            "{name} uses bfq, which idles up to {ms} ms for one thread's I/O before it serves \
             another's, so a request can wait behind background I/O for as long as bfq serves it \
             (hundreds of ms measured); `echo 0 > /sys/block/{name}/queue/iosched/slice_idle` \
             (as root), or the mq-deadline or none scheduler, removes that wait",
            name = disk.name,
            ms = us as f64 / 1000.0
        )
    })
}

/// Runs the server until SIGINT, SIGTERM or a client's SHUTDOWN.
pub fn run(args: ServeArgs) -> Result<(), String> {
    let mut signals = Signals::new([SIGINT, SIGTERM])
        .map_err(|e| format!("cannot handle SIGINT/SIGTERM: {e}"))?;
    let base = defaults_for(args.device);
    let mut file = load_config(args.config.as_deref(), &base)?;
    check_memory(file.critio.cache.capacity_bytes, mem_total_bytes())?;
    println!(
        "{}",
        describe_settings(&file, &base, args.device, args.scheme)
    );
    if let Some(bind) = &args.bind {
        file.server.bind = bind.clone();
    }
    if let Some(pass) = &args.requirepass {
        file.server.requirepass = pass.clone();
    }
    if let Some(on) = args.protected_mode {
        file.server.protected_mode = on;
    }
    if let Some(addr) = &args.metrics {
        file.server.metrics = addr.clone();
    }
    // The ports first: one that is taken is refused before the store is
    // opened, or a new image created and written.
    let bound = Server::bind(file.server.clone()).map_err(|e| e.to_string())?;
    let cache_default = file.critio.cache.capacity_bytes == base.critio.cache.capacity_bytes;
    let (stack, stack_cfg, dir) = open_store(&args, file, cache_default)?;
    // What ends the wait below: a signal, or a client's SHUTDOWN with its
    // connection, held open until the store is closed.
    type Stop = (&'static str, Option<std::net::TcpStream>);
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<Stop>();
    let by_client = stop_tx.clone();
    let backend = Backend {
        data_dir: Some(dir.clone()),
        on_shutdown: Some(std::sync::Arc::new(move |conn| {
            let _ = by_client.send(("SHUTDOWN from a client", conn));
        })),
        ..Backend::of(&stack, &stack_cfg)
    };
    let server = bound.start(backend).map_err(|e| e.to_string())?;
    println!(
        "critio-kv listening on {} (data dir {}, device {}, scheme {}, {} keys)",
        server.local_addr(),
        dir.display(),
        device_name(args.device),
        stack_cfg.scheme,
        stack.engine.dbsize()
    );
    if let Some(addr) = server.metrics_addr() {
        println!("critio-kv: Prometheus metrics at http://{addr}/metrics");
    }
    let _ = std::io::stdout().flush();
    std::thread::spawn(move || {
        for signal in signals.forever() {
            let name = if signal == SIGINT {
                "SIGINT received"
            } else {
                "SIGTERM received"
            };
            let _ = stop_tx.send((name, None));
        }
    });
    let (why, asker) = stop_rx.recv().unwrap_or(("SIGTERM received", None));
    println!("critio-kv: {why}: finishing commands in flight");
    let stuck = server.shutdown();
    if stuck > 0 {
        eprintln!("critio-kv: {stuck} connections were still running a command");
    }
    stack
        .engine
        .close()
        .map_err(|e| format!("the final checkpoint failed: {e}"))?;
    let keys = stack.engine.dbsize();
    // The store's image (and its lock) first, then the connection of a
    // client that asked for the stop: once it closes, a command that opens
    // the store (`critio dump`) may run.
    drop(stack);
    drop(asker);
    println!("critio-kv: stopped after a final checkpoint ({keys} keys)");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bfq_s_idling_gets_a_note_and_other_schedulers_none() {
        let disk = |sched: &str, idle: Option<u64>| critio::sys::Disk {
            name: "vda".to_owned(),
            scheduler: Some(sched.to_owned()),
            nr_requests: Some(64),
            slice_idle_us: idle,
        };
        let note = idling_note(&disk("bfq", Some(8000))).expect("a note");
        assert!(note.contains("idles up to 8 ms"), "{note}");
        assert!(
            note.contains("/sys/block/vda/queue/iosched/slice_idle"),
            "{note}"
        );
        assert_eq!(idling_note(&disk("bfq", Some(0))), None, "idling off");
        assert_eq!(idling_note(&disk("mq-deadline", None)), None);
        assert_eq!(idling_note(&disk("none", None)), None);
    }

    #[test]
    fn a_cache_larger_than_the_memory_is_refused() {
        assert!(check_memory(4 << 30, Some(24 << 30)).is_ok());
        assert!(
            check_memory(24 << 30, Some(24 << 30)).is_ok(),
            "the user's call"
        );
        let err = check_memory(100 << 30, Some(24 << 30)).unwrap_err();
        assert!(err.contains("102400 MiB"), "{err}");
        assert!(err.contains("memory (24576 MiB)"), "{err}");
        assert!(
            err.contains("3072 MiB"),
            "says what the default would be: {err}"
        );
        assert!(
            check_memory(100 << 30, None).is_ok(),
            "no /proc/meminfo: unchecked"
        );
    }

    #[test]
    fn a_real_device_gets_machine_sized_defaults_and_a_file_overrides_them() {
        assert_eq!(real_cache_bytes(Some(24 << 30)), 3 << 30);
        assert_eq!(real_cache_bytes(Some(64 << 30)), 4 << 30, "at most 4 GiB");
        assert_eq!(
            real_cache_bytes(Some(1 << 30)),
            256 << 20,
            "at least 256 MiB"
        );
        assert_eq!(real_cache_bytes(None), 1 << 30);
        let sim = defaults_for(DeviceKind::Sim);
        assert_eq!(
            sim,
            FileConfig::default(),
            "the simulation keeps the paper's"
        );
        let file = defaults_for(DeviceKind::File);
        assert_eq!(file.engine.checkpoint_interval_ms, 1000);
        assert!(matches!(
            file.critio.block.noncritical_cap,
            NoncriticalCap::Auto(_)
        ));
        let cut =
            FileConfig::from_toml_str_over("[block]\nnoncritical_request_max_bytes = 65536", &file)
                .unwrap();
        let every = FileConfig::from_toml_str_over("[engine]\ncheckpoint_interval_ms = 250", &file)
            .unwrap();
        let lazy = FileConfig::from_toml_str_over("[cache]\nprefault = false", &file).unwrap();
        use DeviceKind::{File, Sim};
        let cases: [(&FileConfig, DeviceKind, Scheme, &[&str]); 8] = [
            (
                &file,
                File,
                Scheme::Rcp,
                &[
                    "memory backed at start",
                    "adaptive (up to 32) (real-device default)",
                    "bulk background requests at most 128 KiB (real-device default)",
                    "background CPU nice +10 over the server's own (real-device default)",
                    "CPU floor 0.5 of the CPU it wants (real-device default)",
                    "background CPU loops yield every 500 us (real-device default)",
                ],
            ),
            (
                &sim,
                Sim,
                Scheme::Rcp,
                &[
                    "background CPU nice +10 over the server's own (default)",
                    "bulk background requests not cut (default)",
                ],
            ),
            (
                &file,
                File,
                Scheme::None,
                &[
                    "unlimited, one queue (scheme none)",
                    "bulk background requests not cut (scheme none)",
                ],
            ),
            // A scan's reads are critical under sync-first.
            (
                &file,
                File,
                Scheme::SyncFirst,
                &["bulk background writes at most 128 KiB, reads not cut (scheme sync-first)"],
            ),
            (
                &file,
                File,
                Scheme::Static,
                &["bulk background requests at most 128 KiB (real-device default)"],
            ),
            (
                &cut,
                File,
                Scheme::Rcp,
                &["bulk background requests at most 64 KiB (from --config)"],
            ),
            (
                &every,
                File,
                Scheme::Rcp,
                &["checkpoint every 250 ms (from --config)"],
            ),
            (&lazy, File, Scheme::Rcp, &["memory backed as first used"]),
        ];
        for (f, kind, scheme, want) in cases {
            let base = if kind == Sim { &sim } else { &file };
            let line = describe_settings(f, base, kind, scheme);
            for w in want {
                assert!(line.contains(w), "{scheme}: {w}: {line}");
            }
        }
        let line = describe_settings(&file, &file, File, Scheme::None);
        assert!(
            !line.contains("CPU floor"),
            "none: no background nice, no floor: {line}"
        );
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("64m").unwrap(), 64 << 20);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("1XB").unwrap_err().contains("unit"));
        assert!(parse_size("GiB").is_err());
    }
}
