//! The `[server]` section, and the whole config file of `critio serve`.
//!
//! ```toml
//! [server]
//! bind = "127.0.0.1:6390"
//! workers = 0                 # request event loops (0: one per two cores)
//! miss_readers = 16           # threads loading GETs' cache misses (0: a miss holds its worker)
//! max_clients = 1000          # a client beyond it gets an error and is closed
//! max_frame_bytes = 8388608   # one request frame (8 MiB)
//! max_args = 1048576          # arguments in one request
//! idle_timeout_ms = 0         # close a client silent this long (0: never)
//! shutdown_timeout_ms = 10000 # how long a stop waits for commands in flight
//! requirepass = ""            # clients must AUTH with it ("": no password)
//! protected_mode = true       # no password: serve only loopback clients
//! metrics = ""                # serve Prometheus metrics at http://ADDR/metrics ("": off)
//!
//! [engine]                    # crate::engine::EngineConfig
//! checkpoint_interval_ms = 10000
//!
//! [cache]                     # and [context], [sync], [block], [log]: critio::Config
//! capacity_bytes = 67108864
//! ```
//!
//! Fields left out keep their defaults (for critio's sections, those of
//! [`default_critio_config`]); unknown sections and fields are errors that
//! name them, and every value is validated with an error naming its field.

use serde::{Deserialize, Serialize};

use super::ServerError;
use crate::engine::{EngineConfig, EngineError};
use crate::stack::default_critio_config;

/// The server's limits and address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Where to listen. Default `127.0.0.1:6390` (Redis's 6379 plus 11, so
    /// both can run side by side).
    pub bind: String,
    /// Request workers: foreground threads, each an event loop over its
    /// share of the connections. Default 0: one per two cores (at least
    /// one), leaving the other cores to the log writer, the background
    /// jobs and the kernel's network stack. A GET that misses the page
    /// cache is handed to a miss reader (`miss_readers`) and does not hold
    /// its worker; other requests that wait for the device do. At most
    /// [`WORKERS_MAX`].
    ///
    /// Measured on a 2-core VM (virtio disk, 20 clients, 1 KiB values, the
    /// data 4x the cache), before miss readers existed: 4 workers served
    /// GETs at 19.4k/s against 14.1k/s for 1, but with the data in the
    /// cache cost 14% of SET and 18% of GET throughput. With 16 miss
    /// readers one worker served 20.8k GETs/s (14.8k without), and under a
    /// BGSAVE/BGREWRITEAOF loop 16.3k/s at a p99.9 of 24 ms (8.7k/s,
    /// 95 ms without).
    pub workers: u32,
    /// Miss readers: foreground threads that load values a GET did not
    /// find in the page cache, while the worker serves its other clients
    /// (the GET's connection waits, its requests kept in order, and runs
    /// the GET again once the value is loaded). 0: none, a miss holds its
    /// worker. Default 16 (a blocked reader costs no CPU). At most
    /// [`WORKERS_MAX`].
    pub miss_readers: u32,
    /// Clients connected at once. Default 1000, at most
    /// [`MAX_CLIENTS_LIMIT`].
    pub max_clients: u32,
    /// The largest request frame, in bytes; a bigger one is a protocol
    /// error that closes its connection. Default 8 MiB. At least 1 KiB, at
    /// most 1 GiB.
    pub max_frame_bytes: u64,
    /// The most arguments in one request. Default 1048576 (Redis's).
    pub max_args: u32,
    /// A client that sends nothing for this long is closed, in ms; 0 never
    /// closes one. Default 0.
    pub idle_timeout_ms: u64,
    /// How long a stop waits for connections to finish the command they
    /// are running, in ms. Default 10000.
    pub shutdown_timeout_ms: u64,
    /// Redis's `requirepass`: clients must `AUTH` with it before anything
    /// else. Default `""`: no password.
    pub requirepass: String,
    /// Redis's protected mode: with no password set, clients connecting
    /// from anywhere but the loopback interface are refused with Redis's
    /// DENIED message. Default true.
    pub protected_mode: bool,
    /// Where to serve Prometheus metrics (`http://ADDR/metrics`, the text
    /// exposition format; see the `prom` module for what is exported), an
    /// address and port such as `127.0.0.1:9190`. Default `""`: off. The
    /// endpoint has no authentication: bind it where only the scrapers
    /// reach.
    pub metrics: String,
}

/// The most request workers.
pub const WORKERS_MAX: u32 = 256;
/// The largest `max_clients`.
pub const MAX_CLIENTS_LIMIT: u32 = 65_536;
/// The allowed range of `max_frame_bytes`.
pub const MAX_FRAME_BYTES_RANGE: std::ops::RangeInclusive<u64> = 1024..=1 << 30;

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            bind: "127.0.0.1:6390".to_owned(),
            workers: 0,
            miss_readers: 16,
            max_clients: 1000,
            max_frame_bytes: 8 << 20,
            max_args: 1 << 20,
            idle_timeout_ms: 0,
            shutdown_timeout_ms: 10_000,
            requirepass: String::new(),
            protected_mode: true,
            metrics: String::new(),
        }
    }
}

const _: () = assert!(1000 <= MAX_CLIENTS_LIMIT);
const _: () = assert!(8 << 20 <= *MAX_FRAME_BYTES_RANGE.end());

fn invalid(field: &'static str, value: impl ToString, allowed: &str) -> ServerError {
    ServerError::Invalid {
        field,
        value: value.to_string(),
        allowed: allowed.to_owned(),
    }
}

impl ServerConfig {
    /// The number of request workers `workers` gives (0: one per two
    /// cores, at least one).
    pub fn workers_in_effect(&self) -> usize {
        match self.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get().div_ceil(2)),
            n => n as usize,
        }
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ServerError> {
        if self.bind.parse::<std::net::SocketAddr>().is_err() {
            return Err(invalid(
                "server.bind",
                &self.bind,
                "must be an address and port such as 127.0.0.1:6390",
            ));
        }
        if !self.metrics.is_empty() && self.metrics.parse::<std::net::SocketAddr>().is_err() {
            return Err(invalid(
                "server.metrics",
                &self.metrics,
                "must be an address and port such as 127.0.0.1:9190, or \"\" for no metrics",
            ));
        }
        if self.workers > WORKERS_MAX {
            return Err(invalid(
                "server.workers",
                self.workers,
                "must be within 0..=256 (0: one per two cores)",
            ));
        }
        if self.miss_readers > WORKERS_MAX {
            return Err(invalid(
                "server.miss_readers",
                self.miss_readers,
                "must be within 0..=256 (0: a miss holds its worker)",
            ));
        }
        if !(1..=MAX_CLIENTS_LIMIT).contains(&self.max_clients) {
            return Err(invalid(
                "server.max_clients",
                self.max_clients,
                "must be within 1..=65536",
            ));
        }
        if !MAX_FRAME_BYTES_RANGE.contains(&self.max_frame_bytes) {
            return Err(invalid(
                "server.max_frame_bytes",
                self.max_frame_bytes,
                "must be within 1024..=1073741824",
            ));
        }
        if self.max_args == 0 {
            return Err(invalid("server.max_args", 0, "must be at least 1"));
        }
        if self.shutdown_timeout_ms == 0 {
            return Err(invalid(
                "server.shutdown_timeout_ms",
                0,
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

/// Everything a config file of `critio serve` sets.
#[derive(Clone, Debug, PartialEq)]
pub struct FileConfig {
    /// `[server]`.
    pub server: ServerConfig,
    /// `[engine]`.
    pub engine: EngineConfig,
    /// `[context]`, `[sync]`, `[block]`, `[log]`, `[cache]`.
    pub critio: critio::config::Config,
}

impl Default for FileConfig {
    fn default() -> Self {
        Self {
            server: ServerConfig::default(),
            engine: EngineConfig::default(),
            critio: default_critio_config(),
        }
    }
}

const CRITIO_SECTIONS: [&str; 5] = ["context", "sync", "block", "log", "cache"];

impl FileConfig {
    /// Parses and validates a config file's text, laid over the defaults.
    pub fn from_toml_str(text: &str) -> Result<FileConfig, ServerError> {
        Self::from_toml_str_over(text, &FileConfig::default())
    }

    /// Parses and validates a config file's text, field by field over
    /// `base` (what a field left out keeps).
    pub fn from_toml_str_over(text: &str, base: &FileConfig) -> Result<FileConfig, ServerError> {
        let parse = |e: toml::de::Error| ServerError::Parse(format!("config file: {e}"));
        let file: toml::Table = toml::from_str(text).map_err(parse)?;
        let mut server = table_of(&base.server)?;
        let mut engine = table_of(&base.engine)?;
        let mut critio = table_of(&base.critio)?;
        for (name, value) in file {
            let toml::Value::Table(fields) = value else {
                return Err(ServerError::Parse(format!(
                    "config file: `{name}` must be a [{name}] section"
                )));
            };
            let target = match name.as_str() {
                "server" => &mut server,
                "engine" => &mut engine,
                n if CRITIO_SECTIONS.contains(&n) => match critio
                    .entry(name.clone())
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                {
                    toml::Value::Table(t) => t,
                    _ => unreachable!("a config section serializes to a table"),
                },
                _ => {
                    return Err(ServerError::Parse(format!(
                        "config file: unknown section or key `{name}`: the sections are server, engine, {}",
                        CRITIO_SECTIONS.join(", ")
                    )))
                }
            };
            target.extend(fields);
        }
        let server: ServerConfig = toml::Value::Table(server).try_into().map_err(parse)?;
        let engine: EngineConfig = toml::Value::Table(engine).try_into().map_err(parse)?;
        let critio: critio::config::Config =
            toml::Value::Table(critio).try_into().map_err(parse)?;
        server.validate()?;
        engine.validate().map_err(|e| match e {
            EngineError::Config(m) => ServerError::Parse(format!("config: {m}")),
            other => ServerError::Parse(other.to_string()),
        })?;
        critio
            .validate()
            .map_err(|e| ServerError::Parse(e.to_string()))?;
        Ok(FileConfig {
            server,
            engine,
            critio,
        })
    }
}

/// A config section (or the critio sections) as a TOML table.
fn table_of(value: &impl Serialize) -> Result<toml::Table, ServerError> {
    match toml::Value::try_from(value) {
        Ok(toml::Value::Table(t)) => Ok(t),
        Ok(_) => unreachable!("a struct serializes to a table"),
        Err(e) => Err(ServerError::Parse(format!("default config: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        ServerConfig::default().validate().unwrap();
        let f = FileConfig::from_toml_str("").unwrap();
        assert_eq!(f, FileConfig::default());
    }

    #[test]
    fn sections_merge_over_the_serve_defaults() {
        let text =
            "[server]\nmax_clients = 4\nmetrics = \"127.0.0.1:9190\"\n[engine]\ndump_pct = 40\n\
                    [cache]\ncapacity_bytes = 1048576\n[log]\nbatch_bytes_max = 6291456\n";
        let f = FileConfig::from_toml_str(text).unwrap();
        assert_eq!(f.server.max_clients, 4);
        assert_eq!(f.server.metrics, "127.0.0.1:9190");
        assert_eq!(f.engine.dump_pct, 40);
        assert_eq!(f.critio.cache.capacity_bytes, 1 << 20);
        assert_eq!(f.critio.log.batch_bytes_max, 6 << 20);
        // Not given: the serve default, not LogConfig's.
        let d = default_critio_config();
        assert_eq!(f.critio.log.record_bytes_max, d.log.record_bytes_max);
    }

    #[test]
    fn a_file_lays_over_the_base_it_is_given() {
        let mut base = FileConfig::default();
        base.engine.checkpoint_interval_ms = 1000;
        base.critio.cache.capacity_bytes = 1 << 30;
        let f = FileConfig::from_toml_str_over("[cache]\npage_bytes = 8192\n", &base).unwrap();
        assert_eq!(f.engine.checkpoint_interval_ms, 1000, "kept from the base");
        assert_eq!(f.critio.cache.capacity_bytes, 1 << 30);
        assert_eq!(f.critio.cache.page_bytes, 8192);
        let f = FileConfig::from_toml_str_over("[engine]\ncheckpoint_interval_ms = 5\n", &base)
            .unwrap();
        assert_eq!(f.engine.checkpoint_interval_ms, 5, "the file wins");
    }

    #[test]
    fn bad_fields_are_named() {
        for (text, needle) in [
            ("[server]\nmax_clients = 0", "server.max_clients"),
            ("[server]\nworkers = 1000", "server.workers"),
            ("[server]\nbind = \"nowhere\"", "server.bind"),
            ("[server]\nmetrics = \"9190\"", "server.metrics"),
            ("[server]\nmax_frame_bytes = 10", "server.max_frame_bytes"),
            ("[server]\nmax_clientz = 3", "max_clientz"),
            ("[engine]\nlive_max_pct = 95", "engine.live_max_pct"),
            ("[cache]\npage_bytes = 1000", "cache.page_bytes"),
            ("[cache]\npage_byts = 4096", "page_byts"),
            ("[nope]\nx = 1", "nope"),
        ] {
            let e = FileConfig::from_toml_str(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }
}
