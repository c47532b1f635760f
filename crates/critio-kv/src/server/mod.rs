//! The Redis-protocol (RESP2, and RESP3 after `HELLO 3`) server: a few request workers (one per two
//! cores by default), each a foreground thread running an event loop over its
//! share of the connections. Marking the workers foreground is the line
//! paper 000 added to Redis.
//!
//! ```text
//!  acceptor ── max_clients? ──no──> "-ERR max number of clients reached", close
//!     │ yes: non-blocking, handed to a worker (round robin)
//!     v
//!  worker (context::set_foreground()), in rounds:
//!     epoll ─> each ready connection: read ─> frame::parse every complete
//!              request, in order ─> command::dispatch ─> engine (critical:
//!              its locks and page reads boost whatever they wait for;
//!              commits deferred to the round)
//!     ─> one commit wait for the round's writes (the log writer inherits)
//!     ─> send every reply of the round
//!     a protocol error: "-ERR Protocol error: ..." and close (only this client)
//!  stop: no more accepts; each connection runs the requests it has
//!        received, sends the replies, closes; the caller closes the engine
//!        (a final checkpoint)
//! ```
//!
//! | module    | what                                                   |
//! |-----------|--------------------------------------------------------|
//! | `config`  | `[server]` limits, and the whole config file of `critio serve` |
//! | `frame`   | request framing (sans-I/O), limits checked on headers   |
//! | `worker`  | the event loops: rounds, group commit, stop            |
//! | `conn`    | one connection's buffers: read, run, send              |
//! | `command` | the command table: names, arities, dispatch, AUTH gate  |
//! | `data`    | the key-value commands (GET, SET, HSET, EXPIRE, SCAN, ...), each over an engine transaction |
//! | `multi`   | MULTI, EXEC, DISCARD, WATCH: one transaction, one log record |
//! | `admin`   | PING, HELLO, AUTH, INFO, CONFIG, SAVE, BGSAVE, COMMAND, ... |
//! | `clients` | the connected clients: CLIENT LIST, INFO, KILL, SETNAME |
//! | `info`    | INFO's sections                                        |
//! | `prom`    | the same figures as Prometheus metrics (`[server] metrics`) |
//! | `prom_http` | the metrics endpoint: `GET /metrics` on its own thread |
//! | `reply`   | replies and their encoding                             |

mod admin;
mod clients;
mod command;
mod config;
mod conn;
mod data;
mod frame;
mod info;
mod multi;
mod prom;
mod prom_http;
mod reply;
mod worker;

use std::collections::HashMap;
use std::io::{self, Read as _, Write as _};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use critio::block::BlockLayer;
use critio::cache::PageCache;
use critio::metrics::LatencyHistogram;
use critio::nvwc::WriteCache;
use parking_lot::{Condvar, Mutex};

pub use config::{FileConfig, ServerConfig, MAX_CLIENTS_LIMIT, MAX_FRAME_BYTES_RANGE, WORKERS_MAX};
pub use frame::{parse, split_args, Args, Limits, Parsed, ProtocolError, INLINE_BYTES_MAX};
pub use prom::LATENCY_BUCKETS as METRICS_LATENCY_BUCKETS;
pub use reply::Reply;

use crate::engine::{Engine, EngineConfig};
use crate::stack::{Scheme, Stack, StackConfig};

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// A `[server]` field is out of range.
    #[error("config: `{field}` = {value} is invalid: {allowed}")]
    Invalid {
        /// The dotted field name.
        field: &'static str,
        /// The rejected value.
        value: String,
        /// What is allowed.
        allowed: String,
    },
    /// The config file is not valid (the message names the field).
    #[error("{0}")]
    Parse(String),
    /// The address cannot be bound.
    #[error("cannot listen on {addr}: {source} (is another server using the port?)")]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        source: io::Error,
    },
    /// The metrics address cannot be bound.
    #[error("cannot serve metrics on {addr}: {source} (is another server using the port?)")]
    MetricsBind {
        /// The address.
        addr: String,
        /// Why.
        source: io::Error,
    },
    /// A thread could not be started.
    #[error("cannot start a server thread: {0}")]
    Spawn(io::Error),
}

/// What the server serves: the engine, the layers whose stats INFO shows,
/// and how they were set up.
#[derive(Clone)]
pub struct Backend {
    /// The engine.
    pub engine: Arc<Engine>,
    /// Its block layer.
    pub block: Arc<BlockLayer>,
    /// Its page cache.
    pub cache: Arc<PageCache>,
    /// The scheme in force.
    pub scheme: Scheme,
    /// The device, as named on the command line.
    pub device: String,
    /// The engine's configuration.
    pub engine_config: EngineConfig,
    /// The data directory, if there is one (CONFIG GET dir).
    pub data_dir: Option<PathBuf>,
    /// The write cache in front of the device, if there is one (its
    /// figures are exported with the metrics).
    pub write_cache: Option<Arc<WriteCache>>,
    /// What a client's SHUTDOWN does: asks the program running the server
    /// to stop it (`critio serve` then stops as on SIGTERM), handing it
    /// that client's connection, which stays open as long as the program
    /// holds it: Redis's closes when its process exits, so a client that
    /// waits for it knows the server is gone (its store released). None:
    /// SHUTDOWN is refused with a reason.
    pub on_shutdown: Option<Arc<dyn Fn(Option<std::net::TcpStream>) + Send + Sync>>,
}

impl Backend {
    /// The backend of an open stack.
    pub fn of(stack: &Stack, cfg: &StackConfig) -> Backend {
        Backend {
            engine: stack.engine.clone(),
            block: stack.io.block().clone(),
            cache: stack.io.cache().clone(),
            scheme: cfg.scheme,
            device: cfg.device.to_string(),
            engine_config: cfg.engine,
            data_dir: None,
            write_cache: stack.io.write_cache().cloned(),
            on_shutdown: None,
        }
    }

    /// The registry of wait-point histograms and inheritance counters the
    /// stack records into, for INFO and the metrics endpoint. Every reader
    /// in the server gets it here: the stack's own (its block layer's).
    pub fn metrics(&self) -> &critio::metrics::Metrics {
        self.block.metrics().get()
    }
}

/// Server-wide counters (INFO stats).
#[derive(Default)]
pub(crate) struct Stats {
    pub connections_received: AtomicU64,
    pub rejected_connections: AtomicU64,
    pub commands_processed: AtomicU64,
    pub protocol_errors: AtomicU64,
    pub error_replies: AtomicU64,
    pub net_input_bytes: AtomicU64,
    pub net_output_bytes: AtomicU64,
    pub keyspace_hits: AtomicU64,
    pub keyspace_misses: AtomicU64,
    /// GETs that missed the page cache and parked their connection while
    /// a miss reader loaded the value.
    pub reads_parked: AtomicU64,
    /// Requests that found one of their keys' index stripes, or a GET's
    /// value's cache part, held by a background thread and parked their
    /// connection while a miss reader waited for it.
    pub parked_on_locks: AtomicU64,
    /// Where the workers' rounds spend their time (INFO `round_*`).
    pub rounds: Mutex<RoundTimes>,
}

/// How long each part of the workers' rounds took: running the ready
/// connections' requests, the one commit wait, sending the replies. A
/// reply waits for all three of its round, so these say which one a tail
/// comes from. One lock per round, not per request.
#[derive(Default)]
pub(crate) struct RoundTimes {
    pub run: LatencyHistogram,
    pub commit: LatencyHistogram,
    pub send: LatencyHistogram,
}

impl Stats {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn reset(&self) {
        for c in [
            &self.connections_received,
            &self.rejected_connections,
            &self.commands_processed,
            &self.protocol_errors,
            &self.error_replies,
            &self.net_input_bytes,
            &self.net_output_bytes,
            &self.keyspace_hits,
            &self.keyspace_misses,
            &self.reads_parked,
            &self.parked_on_locks,
        ] {
            c.store(0, Ordering::Relaxed);
        }
        *self.rounds.lock() = RoundTimes::default();
    }
}

/// The open connections: each one's [`clients::Client`], whose socket
/// handle lets a stop or CLIENT KILL end its reads.
#[derive(Default)]
pub(crate) struct Clients {
    next_id: u64,
    pub(crate) open: HashMap<u64, Arc<clients::Client>>,
}

/// What CONFIG SET may change while the server runs.
struct Runtime {
    /// `requirepass` (None: no password).
    password: Option<String>,
    /// Redis's protected mode.
    protected_mode: bool,
}

/// What the acceptor and the workers share.
pub(crate) struct Shared {
    pub cfg: ServerConfig,
    pub backend: Backend,
    pub addr: SocketAddr,
    pub started: Instant,
    pub stats: Stats,
    pub jobs: info::JobLog,
    pub(crate) clients: Mutex<Clients>,
    /// FLUSHALLs so far (WATCH notices one).
    pub(crate) flushes: AtomicU64,
    runtime: Mutex<Runtime>,
    clients_cv: Condvar,
    stopping: AtomicBool,
    /// Where workers hand the reads that missed the page cache (None: no
    /// miss readers; a miss holds its worker).
    misses: Option<worker::MissQueue>,
}

impl Shared {
    /// Clients connected now.
    pub(crate) fn connected(&self) -> usize {
        self.clients.lock().open.len()
    }

    /// Registers an accepted connection; None if the server is full or
    /// stopping.
    fn admit(&self, stream: &TcpStream) -> Option<Arc<clients::Client>> {
        let mut c = self.clients.lock();
        if self.stopping.load(Ordering::SeqCst) || c.open.len() >= self.cfg.max_clients as usize {
            return None;
        }
        let handle = stream.try_clone().ok()?;
        c.next_id += 1;
        let client = Arc::new(clients::Client::new(c.next_id, handle));
        c.open.insert(client.id, client.clone());
        Some(client)
    }

    /// The password (`requirepass`), if one is set.
    pub(crate) fn password(&self) -> Option<String> {
        self.runtime.lock().password.clone()
    }

    pub(crate) fn set_password(&self, password: Option<String>) {
        self.runtime.lock().password = password;
    }

    pub(crate) fn protected_mode(&self) -> bool {
        self.runtime.lock().protected_mode
    }

    pub(crate) fn set_protected_mode(&self, on: bool) {
        self.runtime.lock().protected_mode = on;
    }

    /// Counts a FLUSHALL (before it runs, so a WATCH that saw the old
    /// count cannot miss it).
    pub(crate) fn flushed(&self) {
        self.flushes.fetch_add(1, Ordering::SeqCst);
    }

    /// Redis's protected mode: with it on and no password set, only
    /// clients on a loopback address are served.
    fn refuses(&self, peer: Option<SocketAddr>) -> bool {
        let rt = self.runtime.lock();
        rt.protected_mode && rt.password.is_none() && !peer.is_some_and(|p| is_loopback(&p))
    }

    fn leave(&self, id: u64) {
        let mut c = self.clients.lock();
        c.open.remove(&id);
        self.clients_cv.notify_all();
    }
}

/// A running server. [`Server::shutdown`] stops it; dropping it does too.
pub struct Server {
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
    workers: Vec<(Arc<worker::Mailbox>, JoinHandle<()>)>,
    readers: Vec<JoinHandle<()>>,
    metrics: Option<prom_http::Endpoint>,
}

/// A server's addresses, bound and not yet served: what
/// [`Server::bind`] gives, so that a program can learn that its port is
/// taken before it opens (or creates) its store.
pub struct Bound {
    cfg: ServerConfig,
    listener: TcpListener,
    addr: SocketAddr,
    metrics_listener: Option<TcpListener>,
}

impl Bound {
    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Starts serving `backend` on the bound addresses.
    pub fn start(self, backend: Backend) -> Result<Server, ServerError> {
        Server::serve(self, backend)
    }
}

impl Server {
    /// Binds `cfg.bind` (and `cfg.metrics`, if set) and starts accepting.
    pub fn start(cfg: ServerConfig, backend: Backend) -> Result<Server, ServerError> {
        Server::bind(cfg)?.start(backend)
    }

    /// Checks `cfg` and binds its addresses (`bind`, and `metrics` if
    /// set); [`Bound::start`] serves them.
    pub fn bind(cfg: ServerConfig) -> Result<Bound, ServerError> {
        cfg.validate()?;
        let listener = TcpListener::bind(&cfg.bind).map_err(|source| ServerError::Bind {
            addr: cfg.bind.clone(),
            source,
        })?;
        let addr = listener.local_addr().map_err(|source| ServerError::Bind {
            addr: cfg.bind.clone(),
            source,
        })?;
        let metrics_listener = match cfg.metrics.as_str() {
            "" => None,
            at => Some(prom_http::bind(at)?),
        };
        Ok(Bound {
            cfg,
            listener,
            addr,
            metrics_listener,
        })
    }

    fn serve(bound: Bound, backend: Backend) -> Result<Server, ServerError> {
        let Bound {
            cfg,
            listener,
            addr,
            metrics_listener,
        } = bound;
        let (misses, miss_jobs) = match cfg.miss_readers {
            0 => (None, None),
            _ => {
                let (q, jobs) = worker::MissQueue::new();
                (Some(q), Some(Arc::new(Mutex::new(jobs))))
            }
        };
        let runtime = Runtime {
            password: Some(cfg.requirepass.clone()).filter(|p| !p.is_empty()),
            protected_mode: cfg.protected_mode,
        };
        let shared = Arc::new(Shared {
            cfg,
            backend,
            addr,
            started: Instant::now(),
            stats: Stats::default(),
            jobs: info::JobLog::default(),
            clients: Mutex::new(Clients::default()),
            flushes: AtomicU64::new(0),
            runtime: Mutex::new(runtime),
            clients_cv: Condvar::new(),
            stopping: AtomicBool::new(false),
            misses,
        });
        let mut server = Server {
            shared: shared.clone(),
            acceptor: None,
            workers: Vec::new(),
            readers: Vec::new(),
            metrics: None,
        };
        for i in 0..shared.cfg.miss_readers {
            let (s, jobs) = (shared.clone(), miss_jobs.clone().expect("a queue"));
            let thread = std::thread::Builder::new()
                .name(format!("kv-reader-{i}"))
                .spawn(move || worker::miss_reader(&s, &jobs))
                .map_err(ServerError::Spawn)?;
            server.readers.push(thread);
        }
        for i in 0..shared.cfg.workers_in_effect() {
            let mailbox = Arc::new(worker::Mailbox::new().map_err(ServerError::Spawn)?);
            let (s, m) = (shared.clone(), mailbox.clone());
            let thread = std::thread::Builder::new()
                .name(format!("kv-worker-{i}"))
                .spawn(move || worker::run(&s, &m))
                .map_err(ServerError::Spawn)?;
            server.workers.push((mailbox, thread));
        }
        if let Some(l) = metrics_listener {
            let registry = prom::registry(shared.clone());
            server.metrics = Some(prom_http::Endpoint::start(l, registry)?);
        }
        let mailboxes: Vec<_> = server.workers.iter().map(|(m, _)| m.clone()).collect();
        server.acceptor = Some(
            std::thread::Builder::new()
                .name("kv-acceptor".into())
                .spawn(move || accept_loop(&shared, &listener, &mailboxes))
                .map_err(ServerError::Spawn)?,
        );
        Ok(server)
    }

    /// The address it listens on (with the port chosen if `bind` gave 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// Clients connected now.
    pub fn connected(&self) -> usize {
        self.shared.connected()
    }

    /// Where the metrics are served (`http://ADDR/metrics`), if they are
    /// (`cfg.metrics` set), with the port chosen if it gave 0.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(prom_http::Endpoint::addr)
    }

    /// The Prometheus text exposition a scrape of `/metrics` would get now
    /// (whether or not the endpoint is on).
    pub fn metrics_text(&self) -> String {
        prom::render(&prom::registry(self.shared.clone()))
            .expect("encoding into a String does not fail")
    }

    /// The text `INFO` would reply with for `sections` (all if empty).
    pub fn info(&self, sections: &[&str]) -> String {
        let args: Vec<&[u8]> = sections.iter().map(|s| s.as_bytes()).collect();
        info::render(&self.shared, &args)
    }

    /// Stops accepting, lets every connection finish the requests it has
    /// received, and waits for them (at most `shutdown_timeout_ms`, then
    /// their sockets are shut). Returns how many connections were still
    /// running a command when it gave up (0 normally).
    pub fn shutdown(mut self) -> usize {
        self.stop()
    }

    fn stop(&mut self) -> usize {
        // Once (shutdown, then drop); also after a start that failed with
        // some workers already running.
        if self.shared.stopping.swap(true, Ordering::SeqCst) {
            return 0;
        }
        if let Some(acceptor) = self.acceptor.take() {
            wake_acceptor(self.shared.addr);
            let _ = acceptor.join();
        }
        if let Some(mut metrics) = self.metrics.take() {
            metrics.stop();
        }
        let deadline = Instant::now() + Duration::from_millis(self.shared.cfg.shutdown_timeout_ms);
        for (mailbox, _) in &self.workers {
            mailbox.wake();
        }
        let mut c = self.shared.clients.lock();
        while !c.open.is_empty() && Instant::now() < deadline {
            self.shared.clients_cv.wait_until(&mut c, deadline);
        }
        for client in c.open.values() {
            let _ = client.stream.shutdown(Shutdown::Both);
        }
        let left = c.open.len();
        drop(c);
        if left == 0 {
            // Every connection is closed: the workers are returning.
            for (_, thread) in self.workers.drain(..) {
                let _ = thread.join();
            }
            for thread in self.readers.drain(..) {
                let _ = thread.join();
            }
        }
        left
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Unblocks the acceptor's `accept` with a connection of our own.
fn wake_acceptor(addr: SocketAddr) {
    let mut target = addr;
    if target.ip().is_unspecified() {
        target.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let _ = TcpStream::connect_timeout(&target, Duration::from_secs(1));
}

/// Whether a client's address is the machine's own (IPv4 127/8, ::1, or
/// an IPv4-mapped 127/8): protected mode serves only these.
fn is_loopback(peer: &SocketAddr) -> bool {
    match peer.ip() {
        std::net::IpAddr::V4(ip) => ip.is_loopback(),
        std::net::IpAddr::V6(ip) => {
            ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// Redis's reply to a client protected mode refuses.
const DENIED: &str = "-DENIED Redis is running in protected mode because protected mode is \
enabled and no password is set for the default user. In this mode connections are only accepted \
from the loopback interface. If you want to connect from external computers to Redis you may \
adopt one of the following solutions: 1) Just disable protected mode sending the command 'CONFIG \
SET protected-mode no' from the loopback interface by connecting to Redis from the same host the \
server is running, however MAKE SURE Redis is not publicly accessible from internet if you do so. \
Use CONFIG REWRITE to make this change permanent. 2) Alternatively you can just disable the \
protected mode by editing the Redis configuration file, and setting the protected mode option to \
'no', and then restarting the server. 3) If you started the server manually just for testing, \
restart it with the '--protected-mode no' option. 4) Set up an authentication password for the \
default user. NOTE: You only need to do one of the above things in order for the server to start \
accepting connections from the outside.\r\n";

/// Tells a client it is refused (`msg`, a whole RESP error line), and
/// closes its connection without blocking the acceptor. What it already
/// sent is read and dropped first, so the close does not reset the
/// connection before the error arrives.
fn turn_away(stream: &mut TcpStream, msg: &str) {
    let _ = stream.write_all(msg.as_bytes());
    let _ = stream.shutdown(Shutdown::Write);
    if stream.set_nonblocking(true).is_ok() {
        let mut sink = [0u8; 4096];
        while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: &TcpListener, workers: &[Arc<worker::Mailbox>]) {
    for stream in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let mut stream = match stream {
            Ok(s) => s,
            Err(e) => {
                // Out of file descriptors and the like: say so, back off.
                eprintln!("critio-kv: accept: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        Stats::add(&shared.stats.connections_received, 1);
        if shared.refuses(stream.peer_addr().ok()) {
            Stats::add(&shared.stats.rejected_connections, 1);
            turn_away(&mut stream, DENIED);
            continue;
        }
        let Some(client) = shared.admit(&stream) else {
            Stats::add(&shared.stats.rejected_connections, 1);
            turn_away(&mut stream, "-ERR max number of clients reached\r\n");
            continue;
        };
        let id = client.id;
        let _ = stream.set_nodelay(true);
        if let Err(e) = stream.set_nonblocking(true) {
            eprintln!("critio-kv: cannot make a connection non-blocking: {e}");
            shared.leave(id);
            continue;
        }
        let authenticated = shared.password().is_none();
        workers[(id as usize) % workers.len()].post(conn::Conn::new(client, stream, authenticated));
    }
}
