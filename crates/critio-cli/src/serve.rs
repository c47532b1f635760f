//! `critio serve`: the key-value server on a data directory.
//!
//! ```text
//!  --data DIR ──> DIR/critio-sim.img (--device sim: the simulated SSD, data in a file)
//!             └─> DIR/critio.img     (--device file: io_uring + O_DIRECT; pool: pread/pwrite)
//!  open: the image's own size if it exists (recovery), else --capacity
//!  run:  Stack::open (recover) ─> Server::start ─> wait for SIGINT / SIGTERM
//!  stop: no more accepts ─> commands in flight finish ─> engine.close()
//!        (a final checkpoint) ─> exit 0
//! ```

use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use critio::device::sim::Profile;
use critio::device::DeviceSpec;
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
    /// The data directory (created if missing).
    #[arg(long, value_name = "DIR", default_value = "critio-data")]
    data: PathBuf,
    /// The device in the data directory.
    #[arg(long, value_enum, default_value = "sim")]
    device: DeviceKind,
    /// The device size of a new store (1GiB, 512MiB, bytes); an existing
    /// image keeps its size.
    #[arg(long, value_name = "SIZE", default_value = "1GiB")]
    capacity: String,
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

fn load_config(path: Option<&Path>) -> Result<FileConfig, String> {
    let Some(path) = path else {
        return Ok(FileConfig::default());
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    FileConfig::from_toml_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The device spec and capacity for `dir`.
fn device_in(dir: &Path, kind: DeviceKind, capacity: u64) -> (DeviceSpec, u64, bool) {
    let image = dir.join(match kind {
        DeviceKind::Sim => "critio-sim.img",
        DeviceKind::File | DeviceKind::Pool => "critio.img",
    });
    let existing = std::fs::metadata(&image).map(|m| m.len()).ok();
    let spec = match kind {
        DeviceKind::Sim => DeviceSpec::Sim {
            profile: Profile::Ssd,
            file: Some(image),
        },
        DeviceKind::File => DeviceSpec::Uring(image),
        DeviceKind::Pool => DeviceSpec::Pool(image),
    };
    let reopen = existing.is_some_and(|n| n > 0);
    (
        spec,
        existing.filter(|_| reopen).unwrap_or(capacity),
        reopen,
    )
}

/// Opens (recovering) the store in the data directory.
fn open_store(args: &ServeArgs, file: FileConfig) -> Result<(Stack, StackConfig, PathBuf), String> {
    std::fs::create_dir_all(&args.data).map_err(|e| {
        format!(
            "cannot create the data directory {}: {e}",
            args.data.display()
        )
    })?;
    let dir = args.data.canonicalize().unwrap_or(args.data.clone());
    let (device, capacity, reopen) = device_in(&dir, args.device, parse_size(&args.capacity)?);
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
    let stack = Stack::open(&cfg).map_err(|e| format!("cannot open the store: {e}"))?;
    Ok((stack, cfg, dir))
}

/// Runs the server until SIGINT or SIGTERM.
pub fn run(args: ServeArgs) -> Result<(), String> {
    let mut signals = Signals::new([SIGINT, SIGTERM])
        .map_err(|e| format!("cannot handle SIGINT/SIGTERM: {e}"))?;
    let mut file = load_config(args.config.as_deref())?;
    if let Some(bind) = &args.bind {
        file.server.bind = bind.clone();
    }
    let server_cfg = file.server.clone();
    server_cfg.validate().map_err(|e| e.to_string())?;
    let (stack, stack_cfg, dir) = open_store(&args, file)?;
    let backend = Backend {
        data_dir: Some(dir.clone()),
        ..Backend::of(&stack, &stack_cfg)
    };
    let server = Server::start(server_cfg, backend).map_err(|e| e.to_string())?;
    let kind = args.device.to_possible_value();
    println!(
        "critio-kv listening on {} (data dir {}, device {}, scheme {}, {} keys)",
        server.local_addr(),
        dir.display(),
        kind.as_ref().map_or("?", |v| v.get_name()),
        stack_cfg.scheme,
        stack.engine.dbsize()
    );
    let _ = std::io::stdout().flush();
    let signal = signals.forever().next().unwrap_or(SIGTERM);
    let name = if signal == SIGINT {
        "SIGINT"
    } else {
        "SIGTERM"
    };
    println!("critio-kv: {name} received: finishing commands in flight");
    let stuck = server.shutdown();
    if stuck > 0 {
        eprintln!("critio-kv: {stuck} connections were still running a command");
    }
    stack
        .engine
        .close()
        .map_err(|e| format!("the final checkpoint failed: {e}"))?;
    let keys = stack.engine.dbsize();
    println!("critio-kv: stopped after a final checkpoint ({keys} keys)");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_size;

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
