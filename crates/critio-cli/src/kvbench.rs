//! Running critio-kv under a client load: the engine behind the demo and
//! the key-value experiments (E1, E5).
//!
//! ```text
//!  preload once: a store of `records` keys on a simulated SSD kept in a file (the template)
//!  per run:      copy the template ─> open the stack with the run's scheme ─> serve it
//!                ─> closed-loop clients (RESP over loopback, like real clients)
//!                ─> latency histogram, throughput, checkpoints, critical wait points
//! ```
//!
//! Every run starts from the same bytes, so runs differ only by scheme.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use critio::config::Config;
use critio::device::DeviceSpec;
use critio::metrics::{LatencyHistogram, MetricsSnapshot};
use critio_kv::engine::EngineConfig;
use critio_kv::server::{Backend, Server, ServerConfig};
use critio_kv::stack::default_critio_config;
use critio_kv::{Scheme, Stack, StackConfig};
use indicatif::ProgressBar;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::workload::{key_name, KvOp, KvWorkload};

/// One configuration to measure.
#[derive(Clone, Copy)]
pub struct RunSpec {
    /// The row label.
    pub label: &'static str,
    /// The scheme.
    pub scheme: Scheme,
    /// Checkpoints and BGSAVE on (off: the isolation limit).
    pub background: bool,
    /// A change after the scheme (ablations).
    pub tweak: Option<fn(&mut Config)>,
}

/// What one run measured.
pub struct KvResult {
    /// The run.
    pub label: &'static str,
    /// Latency of every measured operation.
    pub latency: LatencyHistogram,
    /// Operations per second.
    pub throughput: f64,
    /// Checkpoints completed during the measured window.
    pub checkpoints: u64,
    /// Their mean duration, ms.
    pub checkpoint_ms: f64,
    /// Where critical tasks waited.
    pub waits: MetricsSnapshot,
    /// Pages the cache wrote back during the window (its writeback thread,
    /// reclaim and flushes), in MiB.
    pub written_back_mib: f64,
    /// Writes that waited in dirty throttling during the window.
    pub throttled: u64,
    /// How the run is made on its device (the scheme as realized there,
    /// and for the isolation run what was sized).
    pub how: String,
}

/// How the isolation run is sized: the same load with no background I/O
/// competing, and nothing throttled for its absence. Without checkpoints
/// the value log's pages stay dirty, so the cache gets room on top of the
/// workload's for every page the run can dirty (room only dirty pages may
/// use: clean pages keep the workload's cache size, so reads hit as often
/// as in the other runs), its dirty limit is that room, and no page ages
/// into writeback: a request never waits on writeback or throttling.
#[derive(Clone, Copy, Debug)]
pub struct Isolation {
    /// Bytes the run may dirty: the fastest run so far's write rate over
    /// the whole run (warm-up included), twice over (the cache's parts
    /// fill unevenly).
    pub dirty_bytes: u64,
}

impl Isolation {
    /// Sized for `w` at up to `ops_per_s` operations a second for `secs`
    /// measured seconds.
    pub fn for_rate(w: &KvWorkload, ops_per_s: f64, secs: f64) -> Self {
        const RECORD_OVERHEAD: f64 = 96.0; // key, header, padding
        let writes = ops_per_s * (1.0 - w.read_proportion) * (w.warmup_s + secs + 1.0);
        let bytes = 2.0 * writes * (w.value_bytes as f64 + RECORD_OVERHEAD);
        let mib = ((bytes / (1u64 << 20) as f64).ceil() as u64).max(16);
        Isolation {
            dirty_bytes: mib << 20,
        }
    }

    fn apply(&self, cache: &mut critio::cache::CacheConfig) {
        let total = cache.capacity_bytes + self.dirty_bytes;
        // Reads see the cache every other run has; the room on top is for
        // dirty pages only.
        cache.clean_bytes_max = cache.capacity_bytes;
        let pct = (100.0 * self.dirty_bytes as f64 / total as f64).min(98.0);
        cache.capacity_bytes = total;
        cache.critical_dirty_pct = pct;
        cache.noncritical_dirty_pct = 1.0;
        cache.shared_dirty_pct = pct;
        cache.background_pct = 100.0;
        cache.dirty_expire_ms = 24 * 3600 * 1000;
    }

    /// One line for the output.
    pub fn describe(&self, w: &KvWorkload) -> String {
        format!(
            "isolation: rcp with no checkpoints and no BGSAVE; the page cache gets {} MiB for dirty pages only on top of its {} MiB (clean pages keep the {1} MiB), enough for every page the run can dirty, no page ages into writeback, and the log holds the run: no request waits on writeback (the written-back column shows it)",
            self.dirty_bytes >> 20,
            w.cache_bytes >> 20
        )
    }
}

/// A preloaded store, copied for each run. On a simulated device its
/// image lives in a temporary directory; on a real file (`file:PATH`,
/// `pool:PATH`) in a directory beside PATH, so every run's copy is on the
/// file system the user named, and is read through io_uring (or the
/// worker pool) with O_DIRECT like any store.
pub struct Template {
    dir: PathBuf,
    file: PathBuf,
    /// The device kind the workload named (its path is replaced per run).
    kind: DeviceSpec,
}

impl Template {
    fn device(&self, path: &Path) -> DeviceSpec {
        let path = path.to_path_buf();
        match &self.kind {
            DeviceSpec::Sim { profile, .. } => DeviceSpec::Sim {
                profile: *profile,
                file: Some(path),
            },
            DeviceSpec::Pool(_) => DeviceSpec::Pool(path),
            _ => DeviceSpec::Uring(path),
        }
    }

    /// Which device the runs are on: the simulation, or the real file's
    /// disk, its kernel I/O scheduler and the kernel.
    pub fn describe(&self) -> String {
        match &self.kind {
            DeviceSpec::Sim { .. } => format!(
                "{} (simulated, in memory and {})",
                self.kind,
                self.dir.display()
            ),
            real => format!(
                "{} in {} on {}",
                match real {
                    DeviceSpec::Pool(_) => "pool: (pread/pwrite workers, O_DIRECT)",
                    _ => "file: (io_uring, O_DIRECT)",
                },
                self.dir.display(),
                crate::bench::host::describe(&self.dir)
            ),
        }
    }
}

/// Where a workload's device keeps the template and the runs' copies.
fn template_for(device: &str) -> Result<Template, String> {
    let kind: DeviceSpec = device.parse()?;
    let base = match &kind {
        DeviceSpec::Mem => {
            return Err(
                "the key-value experiments copy a preloaded store for every run: use sim, \
                 sim:hdd, file:PATH or pool:PATH, not mem"
                    .into(),
            )
        }
        DeviceSpec::Sim { .. } => std::env::temp_dir(),
        DeviceSpec::Uring(p) | DeviceSpec::Pool(p) => match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        },
    };
    let dir = base.join(format!("critio-kvbench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Ok(Template {
        file: dir.join("template.img"),
        dir,
        kind,
    })
}

impl Drop for Template {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn stack_config(
    w: &KvWorkload,
    device: DeviceSpec,
    spec: &RunSpec,
    isolation: Option<Isolation>,
) -> StackConfig {
    let mut critio = default_critio_config();
    critio.cache.capacity_bytes = w.cache_bytes;
    if let Some(iso) = isolation {
        iso.apply(&mut critio.cache);
    }
    StackConfig {
        device,
        capacity: w.capacity_bytes,
        seed: 7,
        scheme: spec.scheme,
        critio,
        engine: EngineConfig {
            checkpoint_interval_ms: if spec.background {
                w.checkpoint_interval_ms
            } else {
                0
            },
            checkpoint_log_pct: if spec.background { 50 } else { 90 },
            // Half the device: room for the isolation run's whole log (a
            // group-commit batch is padded to whole blocks, so the log
            // takes several times the bytes written), whatever the scheme.
            log_bytes: w.capacity_bytes / 2,
            ..EngineConfig::default()
        },
        tweak: spec.tweak,
        write_cache: None,
    }
}

pub(crate) fn value(rng: &mut SmallRng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.gen_range(b'a'..=b'z')).collect()
}

/// Loads `w.records` keys into a fresh store (in a temporary directory).
pub fn preload(w: &KvWorkload, progress: &ProgressBar) -> Result<Template, String> {
    let t = template_for(&w.device)?;
    let spec = RunSpec {
        label: "preload",
        scheme: Scheme::Rcp,
        background: false,
        tweak: None,
    };
    let stack =
        Stack::open(&stack_config(w, t.device(&t.file), &spec, None)).map_err(|e| e.to_string())?;
    let mut rng = SmallRng::seed_from_u64(1);
    let batch = 64u64;
    progress.set_length(w.records);
    for first in (0..w.records).step_by(batch as usize) {
        let pairs: Vec<(Vec<u8>, Vec<u8>)> = (first..(first + batch).min(w.records))
            .map(|i| (key_name(i).into_bytes(), value(&mut rng, w.value_bytes)))
            .collect();
        let refs: Vec<(&[u8], &[u8])> = pairs
            .iter()
            .map(|(k, v)| (k.as_slice(), v.as_slice()))
            .collect();
        stack.engine.mset(&refs).map_err(|e| e.to_string())?;
        progress.set_position(first + batch);
    }
    stack.engine.close().map_err(|e| e.to_string())?;
    Ok(t)
}

/// Copies the template to a run's file and syncs the copy, so its
/// writeback does not run during the measured window.
///
/// `dense`: every block of the copy is written (its holes as zeros), as a
/// database preallocates its files; on a real file system a write into a
/// hole allocates blocks and journals that, which no run should pay for.
/// Otherwise (a simulated drive's store) only the data is copied and the
/// holes stay holes. Data and holes are found with `SEEK_DATA`/`SEEK_HOLE`
/// (the whole file is data where the file system cannot say).
fn copy_durably(from: &Path, to: &Path, dense: bool) -> Result<(), String> {
    use std::io::{Read, Seek, Write};
    let err =
        |what: &str, e: &dyn std::fmt::Display| format!("cannot copy the template ({what}): {e}");
    let mut src = std::fs::File::open(from).map_err(|e| err("open", &e))?;
    let len = src.metadata().map_err(|e| err("stat", &e))?.len();
    let mut dst = std::fs::File::create(to).map_err(|e| err("create", &e))?;
    dst.set_len(len).map_err(|e| err("size", &e))?;
    let mut buf = vec![0u8; 1 << 20];
    let zeros = vec![0u8; 1 << 20];
    let mut at = 0u64;
    while at < len {
        // The next data extent [start, end), or the rest where the file
        // system cannot say.
        let start = match rustix::fs::seek(&src, rustix::fs::SeekFrom::Data(at)) {
            Ok(s) => s,
            Err(rustix::io::Errno::NXIO) => len, // only a hole is left
            Err(_) => at,
        };
        dst.seek(std::io::SeekFrom::Start(at))
            .map_err(|e| err("seek", &e))?;
        if dense {
            let mut hole = start - at;
            while hole > 0 {
                let n = (hole as usize).min(zeros.len());
                dst.write_all(&zeros[..n]).map_err(|e| err("write", &e))?;
                hole -= n as u64;
            }
        }
        if start >= len {
            break;
        }
        let end = rustix::fs::seek(&src, rustix::fs::SeekFrom::Hole(start)).unwrap_or(len);
        src.seek(std::io::SeekFrom::Start(start))
            .and_then(|_| dst.seek(std::io::SeekFrom::Start(start)))
            .map_err(|e| err("seek", &e))?;
        let mut left = end - start;
        while left > 0 {
            let n = (left as usize).min(buf.len());
            src.read_exact(&mut buf[..n]).map_err(|e| err("read", &e))?;
            dst.write_all(&buf[..n]).map_err(|e| err("write", &e))?;
            left -= n as u64;
        }
        at = end;
    }
    dst.sync_all()
        .map_err(|e| format!("cannot sync {}: {e}", to.display()))
}

/// Removes a run's copy of the store when the run ends.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// One client's closed loop until `stop`; records latencies after `measure`.
fn client(
    addr: std::net::SocketAddr,
    w: &KvWorkload,
    seed: u64,
    stop: &AtomicBool,
    measure: &AtomicBool,
    ops: &AtomicU64,
) -> Result<LatencyHistogram, String> {
    let client = redis::Client::open(format!("redis://{addr}/")).map_err(|e| e.to_string())?;
    let mut con = client.get_connection().map_err(|e| e.to_string())?;
    let keys = w.chooser();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut buf = value(&mut rng, w.value_bytes);
    let mut hist = LatencyHistogram::new();
    while !stop.load(Ordering::Relaxed) {
        let op = w.next_op(&keys, &mut rng);
        let start = Instant::now();
        let result = match op {
            KvOp::Read(k) => redis::cmd("GET")
                .arg(key_name(k))
                .query::<Option<Vec<u8>>>(&mut con)
                .map(|_| ()),
            KvOp::Update(k) => {
                let i = rng.gen_range(0..buf.len());
                buf[i] = rng.gen_range(b'a'..=b'z');
                redis::cmd("SET")
                    .arg(key_name(k))
                    .arg(&buf)
                    .query::<()>(&mut con)
            }
        };
        result.map_err(|e| format!("client: {e}"))?;
        if measure.load(Ordering::Relaxed) {
            hist.record(start.elapsed());
            ops.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(hist)
}

/// What one measured window of client load gave.
pub(crate) struct Window<T> {
    /// Request latencies in the window.
    pub latency: LatencyHistogram,
    /// The window's length, in seconds.
    pub elapsed: f64,
    /// Where critical tasks waited in the window.
    pub waits: MetricsSnapshot,
    /// What `observe` returned as the window opened, and as it closed.
    pub before: T,
    pub after: T,
}

/// Serves `stack` over RESP on loopback, runs `w.clients` closed-loop
/// clients, warms up for `w.warmup_s`, then measures for `secs`: metrics
/// are reset as the window opens, `observe` is called as it opens and
/// closes, and `tick` every 100 ms within it. Shuts the server down.
pub(crate) fn measure_window<T>(
    stack: &Stack,
    cfg: &StackConfig,
    w: &KvWorkload,
    secs: f64,
    progress: &ProgressBar,
    observe: impl Fn() -> T,
    mut tick: impl FnMut(),
) -> Result<Window<T>, String> {
    let server = Server::start(
        ServerConfig {
            bind: "127.0.0.1:0".into(),
            ..ServerConfig::default()
        },
        Backend::of(stack, cfg),
    )
    .map_err(|e| e.to_string())?;
    let addr = server.local_addr();
    let (stop, measure, ops) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let clients: Vec<_> = (0..w.clients)
        .map(|i| {
            let (w, stop, measure, ops) = (w.clone(), stop.clone(), measure.clone(), ops.clone());
            std::thread::spawn(move || client(addr, &w, 100 + i as u64, &stop, &measure, &ops))
        })
        .collect();
    progress.set_message("warming up");
    std::thread::sleep(Duration::from_secs_f64(w.warmup_s));
    stack.io.metrics().reset();
    let before = observe();
    measure.store(true, Ordering::Relaxed);
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < secs {
        std::thread::sleep(Duration::from_millis(100));
        progress.set_position((start.elapsed().as_secs_f64() / secs * 1000.0) as u64);
        progress.set_message(format!("{} ops", ops.load(Ordering::Relaxed)));
        tick();
    }
    measure.store(false, Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    let waits = stack.io.metrics().snapshot();
    let after = observe();
    stop.store(true, Ordering::Relaxed);
    let mut latency = LatencyHistogram::new();
    for c in clients {
        latency.merge(&c.join().map_err(|_| "client thread panicked")??);
    }
    server.shutdown();
    Ok(Window {
        latency,
        elapsed,
        waits,
        before,
        after,
    })
}

/// Runs one configuration on a copy of the template; a run without
/// background work (the isolation limit) is sized by `isolation`.
pub fn run(
    w: &KvWorkload,
    t: &Template,
    spec: &RunSpec,
    secs: f64,
    isolation: Isolation,
    progress: &ProgressBar,
) -> Result<KvResult, String> {
    let file = t.dir.join(format!(
        "run-{}.img",
        spec.label.replace(|c: char| !c.is_alphanumeric(), "-")
    ));
    let dense = !matches!(t.kind, DeviceSpec::Sim { .. });
    copy_durably(&t.file, &file, dense)?;
    let _remove = RemoveOnDrop(file.clone()); // after the stack below closes, on every path
    let isolation = (!spec.background).then_some(isolation);
    let device = t.device(&file);
    let how = match isolation {
        Some(iso) => iso.describe(w),
        None => spec.scheme.describe(&device),
    };
    let cfg = stack_config(w, device, spec, isolation);
    let stack = Stack::open(&cfg).map_err(|e| e.to_string())?;
    let engine = stack.engine.clone();
    let cache = stack.io.cache().clone();
    let mut last_bgsave = Instant::now();
    let win = measure_window(
        &stack,
        &cfg,
        w,
        secs,
        progress,
        || (engine.background_stats(), cache.stats()),
        || {
            if spec.background
                && w.bgsave_every_s > 0.0
                && last_bgsave.elapsed().as_secs_f64() >= w.bgsave_every_s
            {
                let _ = engine.bgsave(); // "already in progress" is fine
                last_bgsave = Instant::now();
            }
        },
    )?;
    drop(engine);
    drop(stack);
    let ((before, cache_before), (after, cache_after)) = (win.before, win.after);
    let (latency, elapsed, waits) = (win.latency, win.elapsed, win.waits);
    let checkpoints = after.checkpoints - before.checkpoints;
    let ms = after.checkpoint_ms_total - before.checkpoint_ms_total;
    let page = cfg.critio.cache.page_bytes as f64;
    let written_back_mib = (cache_after.writeback_pages - cache_before.writeback_pages) as f64
        * page
        / (1u64 << 20) as f64;
    Ok(KvResult {
        label: spec.label,
        throughput: latency.count() as f64 / elapsed,
        latency,
        checkpoints,
        checkpoint_ms: if checkpoints > 0 {
            ms / checkpoints as f64
        } else {
            0.0
        },
        waits,
        written_back_mib,
        throttled: cache_after.throttled - cache_before.throttled,
        how: if isolation.is_some() && (checkpoints > 0 || written_back_mib > 0.0) {
            format!(
                "{how}. NOT ISOLATED in this run: {checkpoints} checkpoints and {written_back_mib:.0} MiB written back (the log or the cache filled: give the workload a larger capacity_bytes)"
            )
        } else {
            how
        },
    })
}

#[cfg(test)]
mod tests {
    use std::io::{Seek, SeekFrom, Write};
    use std::os::unix::fs::MetadataExt;

    use super::copy_durably;

    #[test]
    fn a_copy_of_a_sparse_store_has_its_bytes_and_keeps_its_holes_unless_dense() {
        let dir = std::env::temp_dir().join(format!("critio-copy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (from, to) = (dir.join("a.img"), dir.join("b.img"));
        let mut f = std::fs::File::create(&from).unwrap();
        f.set_len(256 << 20).unwrap();
        for (at, byte) in [(0u64, 1u8), (100 << 20, 2), ((256 << 20) - 4096, 3)] {
            f.seek(SeekFrom::Start(at)).unwrap();
            f.write_all(&[byte; 4096]).unwrap();
        }
        drop(f);
        let blocks = |p: &std::path::Path| std::fs::metadata(p).unwrap().blocks();
        copy_durably(&from, &to, false).unwrap();
        assert_eq!(std::fs::read(&from).unwrap(), std::fs::read(&to).unwrap());
        // 512-byte blocks: far below the 256 MiB a dense copy takes (where
        // the file system keeps holes at all).
        let (a, b) = (blocks(&from), blocks(&to));
        assert!(b <= a.max(8 << 10) * 2, "copy took {b} blocks, source {a}");
        copy_durably(&from, &to, true).unwrap();
        assert_eq!(std::fs::read(&from).unwrap(), std::fs::read(&to).unwrap());
        assert!(
            blocks(&to) >= (256 << 20) / 512,
            "a dense copy has every block"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
