//! The request workers: a few foreground threads (one per two cores by
//! default), each running an event loop over its share of the connections,
//! in rounds, as Redis's event loop does:
//!
//! ```text
//!  epoll_wait ─> the connections with input (or room to send)
//!   round:  engine.defer_commits()
//!           each one: read what it has ─> run its complete requests
//!                     (writes logged and applied, their commits deferred)
//!           commit once: wait until the round's highest LSN is durable
//!             (the worker is foreground, so the log writer inherits: the
//!              batch write and flush are critical at every layer)
//!           each one: send its replies; what the socket does not take
//!                     waits for EPOLLOUT, and the connection reads nothing
//!                     more until it is sent
//! ```
//!
//! Why: with a thread per connection every request costs a wake-up and a
//! context switch or two (the read, the commit), and twenty runnable
//! request threads on two cores queue behind each other's time slices;
//! that, not the device, was the tail of GET on a real file (p99.9 3.3 ms
//! against Redis's 0.4 ms with the same load). A round serves every ready
//! client for one wake-up and one commit wait.
//!
//! What a round costs a client: a reply waits for the round's commit, so a
//! read in the same round as a write waits for that write's flush (Redis's
//! `appendfsync always` does the same). Each round's three parts (running
//! the requests, the commit wait, sending) go into histograms (INFO
//! `round_run`, `round_commit`, `round_send`): on a real file under
//! background I/O, they show the SET tail is the commit's, not the run's.
//!
//! A GET whose value is not in the page cache does not hold the worker:
//!
//! ```text
//!  GET misses ─> the connection parks (the GET stays first in its input,
//!                epoll watches nothing of it) ─> the miss queue
//!  a miss reader (foreground: its read is critical) loads the value's
//!  pages ─> posts the connection back to its worker ─> the GET runs again
//!  (allowed to wait this once, so an eviction in between cannot starve it)
//! ```
//!
//! so a worker's other clients go on while the device serves the miss, and
//! replies stay in request order.
//!
//! Why reader threads blocked in their reads, and not reads the worker
//! keeps in flight itself (submitted through the device's shared ring,
//! each completion posting the connection back): that was tried, at the
//! 4x size on this project's 2-vCPU virtual machine (1M keys of 1 KiB, a
//! 256 MiB cache, 600k GETs from 20 clients, three in four missing),
//! three alternated runs each. The worker went from 12.8-14.6 s to
//! 27.0-29.0 s of CPU per load, every read's submission (a system call
//! and a virtio notification) now on the event loop's core, and GETs went
//! from 18.2-20.5k/s to 17.0-18.2k/s, p99.9 17.1-17.2 ms to 17.3-18.0 and
//! p99.2 5.3-6.1 ms to 11.1-12.0, though the server used 11-18% less CPU
//! in all. With one event loop per two cores, the readers put the
//! misses' system calls on the other core.
//!
//! A request that finds an index stripe of one of its keys held by a
//! background thread (the log rewrite copying those keys, a checkpoint, a
//! snapshot) parks the same way: its miss reader waits for the stripe (a
//! foreground waiter, so the holder inherits criticality), and one
//! worker's other clients do not wait for a background job's lock. Other
//! requests that wait for the device (a full log, a miss of another
//! command) hold their worker meanwhile.

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustix::buffer::spare_capacity;
use rustix::event::{epoll, eventfd, EventfdFlags, Timespec};

use super::conn::Conn;
use super::{Shared, Stats};
use crate::engine::Prefetch;

/// The event-loop token of a worker's wake-up eventfd.
const WAKE: u64 = u64::MAX;
/// How long a worker sleeps with nothing to do (it checks idle clients and
/// the stop flag at least this often).
const TICK: Duration = Duration::from_millis(100);
/// Events taken per `epoll_wait`.
const EVENTS: usize = 256;

/// Where the acceptor hands a worker its new connections, and the miss
/// readers the connections they resumed.
pub(crate) struct Mailbox {
    inbox: Mutex<Vec<Conn>>,
    resumed: Mutex<Vec<u64>>,
    wake: OwnedFd,
}

impl Mailbox {
    pub(crate) fn new() -> io::Result<Mailbox> {
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(Mailbox {
            inbox: Mutex::new(Vec::new()),
            resumed: Mutex::new(Vec::new()),
            wake,
        })
    }

    /// Hands `conn` to the worker.
    pub(crate) fn post(&self, conn: Conn) {
        self.inbox.lock().push(conn);
        self.wake();
    }

    /// Hands back connection `id`, its parked read prefetched.
    fn resume(&self, id: u64) {
        self.resumed.lock().push(id);
        self.wake();
    }

    /// Wakes the worker (a new connection, or the server is stopping).
    pub(crate) fn wake(&self) {
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    fn drain_wake(&self) {
        let mut buf = [0u8; 8];
        let _ = rustix::io::read(&self.wake, &mut buf);
    }
}

/// A read that missed the page cache, for a miss reader.
struct Miss {
    prefetch: Prefetch,
    conn: u64,
    mailbox: Arc<Mailbox>,
}

/// Where workers queue their misses for the miss readers.
pub(crate) struct MissQueue(mpsc::Sender<Miss>);

/// The miss readers' end of the queue.
pub(crate) struct MissJobs(mpsc::Receiver<Miss>);

impl MissQueue {
    pub(crate) fn new() -> (MissQueue, MissJobs) {
        let (tx, rx) = mpsc::channel();
        (MissQueue(tx), MissJobs(rx))
    }
}

/// A miss reader: loads what parked reads need, then hands each
/// connection back to its worker; returns once the server stops.
pub(crate) fn miss_reader(shared: &Arc<Shared>, jobs: &Mutex<MissJobs>) {
    // It reads for requests: its loads are critical at every layer.
    critio::context::set_foreground();
    loop {
        let job = jobs.lock().0.recv_timeout(TICK);
        match job {
            Ok(m) => {
                // A failure shows when the GET runs again (and may wait).
                let _ = shared.backend.engine.prefetch(&m.prefetch);
                m.mailbox.resume(m.conn);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if shared.stopping.load(Ordering::SeqCst) {
                    return;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Which readiness a connection waits for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Interest {
    /// Input (nothing left to send).
    Read,
    /// Room to send (replies pending; reads wait).
    Write,
    /// Nothing: parked until a miss reader resumes it (the kernel still
    /// reports a hang-up or an error).
    Parked,
}

impl Interest {
    fn flags(self) -> epoll::EventFlags {
        match self {
            Interest::Read => epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
            Interest::Write => epoll::EventFlags::OUT,
            Interest::Parked => epoll::EventFlags::empty(),
        }
    }
}

struct Entry {
    conn: Conn,
    interest: Interest,
}

impl Entry {
    /// Watches the connection for `want` (if it does not already).
    fn watch(&mut self, epoll: &OwnedFd, want: Interest) -> io::Result<()> {
        if want != self.interest {
            let data = epoll::EventData::new_u64(self.conn.id);
            epoll::modify(epoll, &self.conn.stream, data, want.flags())?;
            self.interest = want;
        }
        Ok(())
    }
}

/// One worker's event loop.
struct Worker<'a> {
    shared: &'a Shared,
    mailbox: &'a Arc<Mailbox>,
    epoll: OwnedFd,
    conns: HashMap<u64, Entry>,
    /// Connections with complete requests left in their input after a
    /// round (they run next round without waiting for the socket).
    runnable: Vec<u64>,
    last_idle_scan: Instant,
}

/// Runs a worker until the server stops. Failures to set up the event loop
/// are printed, and the worker's connections are closed.
pub(crate) fn run(shared: &Arc<Shared>, mailbox: &Arc<Mailbox>) {
    // The enlightenment API: this thread serves requests.
    critio::context::set_foreground();
    let epoll = match epoll::create(epoll::CreateFlags::CLOEXEC) {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("critio-kv: a worker cannot create its event loop: {e}");
            return;
        }
    };
    if let Err(e) = epoll::add(
        &epoll,
        &mailbox.wake,
        epoll::EventData::new_u64(WAKE),
        epoll::EventFlags::IN,
    ) {
        eprintln!("critio-kv: a worker cannot watch its mailbox: {e}");
        return;
    }
    let mut w = Worker {
        shared,
        mailbox,
        epoll,
        conns: HashMap::new(),
        runnable: Vec::new(),
        last_idle_scan: Instant::now(),
    };
    w.serve();
}

impl Worker<'_> {
    fn serve(&mut self) {
        let mut events = Vec::with_capacity(EVENTS);
        let mut ready: Vec<(u64, bool)> = Vec::with_capacity(EVENTS);
        let tick = Timespec::try_from(TICK).expect("the tick fits a timespec");
        let zero = Timespec::default();
        loop {
            let timeout = if self.runnable.is_empty() {
                &tick
            } else {
                &zero
            };
            events.clear();
            match epoll::wait(&self.epoll, spare_capacity(&mut events), Some(timeout)) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    eprintln!("critio-kv: epoll_wait: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            ready.clear();
            for ev in &events {
                // A copy: the kernel's event struct is packed.
                let (flags, data) = (ev.flags, ev.data);
                let token = data.u64();
                if token == WAKE {
                    self.mailbox.drain_wake();
                    self.adopt();
                    self.resume();
                } else {
                    let writable = flags.intersects(
                        epoll::EventFlags::OUT | epoll::EventFlags::ERR | epoll::EventFlags::HUP,
                    );
                    ready.push((token, writable));
                }
            }
            ready.extend(self.runnable.drain(..).map(|t| (t, false)));
            ready.sort_unstable_by_key(|(t, _)| *t);
            // One entry a connection, writable if any of its entries is.
            ready.dedup_by(|later, kept| {
                let same = later.0 == kept.0;
                kept.1 |= same && later.1;
                same
            });
            if self.shared.stopping.load(Ordering::SeqCst) {
                self.finish();
                return;
            }
            // A tick or a mailbox wake-up with nothing ready is no round
            // (nothing to run, commit or send, and none in the timings).
            if !ready.is_empty() {
                self.round(&ready);
            }
            self.close_idle();
        }
    }

    /// Registers the connections the acceptor posted.
    fn adopt(&mut self) {
        let new = std::mem::take(&mut *self.mailbox.inbox.lock());
        for conn in new {
            let id = conn.id;
            let added = epoll::add(
                &self.epoll,
                &conn.stream,
                epoll::EventData::new_u64(id),
                Interest::Read.flags(),
            );
            if let Err(e) = added {
                eprintln!("critio-kv: cannot watch connection {id}: {e}");
                self.shared.leave(id);
                continue;
            }
            self.conns.insert(
                id,
                Entry {
                    conn,
                    interest: Interest::Read,
                },
            );
        }
    }

    /// Takes back the connections whose parked read was prefetched: each
    /// runs next round (or once its pending replies are sent).
    fn resume(&mut self) {
        let ids = std::mem::take(&mut *self.mailbox.resumed.lock());
        for id in ids {
            let Some(e) = self.conns.get_mut(&id) else {
                continue; // closed meanwhile
            };
            e.conn.resume();
            if e.interest == Interest::Parked {
                if e.watch(&self.epoll, Interest::Read).is_err() {
                    self.close(id);
                    continue;
                }
                self.runnable.push(id);
            }
        }
    }

    /// One round over the ready connections (see the module doc).
    fn round(&mut self, ready: &[(u64, bool)]) {
        let shared = self.shared;
        let started = Instant::now();
        let round = shared.backend.engine.defer_commits();
        let lsn = || round.lsn();
        let may_park = shared.misses.is_some();
        let mut touched = Vec::with_capacity(ready.len());
        let mut dead = Vec::new();
        for &(id, writable) in ready {
            let Some(e) = self.conns.get_mut(&id) else {
                continue;
            };
            let c = &mut e.conn;
            if c.pending_output() {
                if !writable {
                    continue;
                }
                match c.send(self.shared) {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(_) => {
                        dead.push(id);
                        continue;
                    }
                }
            } else if c.parked && writable {
                // Parked, nothing asked for: a hang-up or an error.
                dead.push(id);
                continue;
            }
            if c.parked {
                // Its replies are sent; it waits for its miss reader.
                if e.watch(&self.epoll, Interest::Parked).is_err() {
                    dead.push(id);
                }
                continue;
            }
            if c.read_available(self.shared).is_err() {
                dead.push(id);
                continue;
            }
            c.run_requests(self.shared, &lsn, may_park);
            touched.push(id);
        }
        let ran = Instant::now();
        let committed = round.commit().map_err(|e| e.to_string());
        drop(round);
        let commit_done = Instant::now();
        for id in touched {
            let Some(e) = self.conns.get_mut(&id) else {
                continue;
            };
            match &committed {
                Ok(()) => e.conn.acknowledge(),
                Err(why) => e.conn.fail_round(why),
            }
            if e.conn.send(self.shared).is_err() || e.conn.done() {
                dead.push(id);
                continue;
            }
            if let Some(prefetch) = e.conn.prefetch.take() {
                let counter = if prefetch.waits_for_lock() {
                    &shared.stats.parked_on_locks
                } else {
                    &shared.stats.reads_parked
                };
                Stats::add(counter, 1);
                let miss = Miss {
                    prefetch,
                    conn: id,
                    mailbox: self.mailbox.clone(),
                };
                let queued = shared.misses.as_ref().map(|q| q.0.send(miss));
                if !matches!(queued, Some(Ok(()))) {
                    e.conn.resume(); // no reader: the GET runs again, waiting
                    self.runnable.push(id);
                }
            }
            let want = if e.conn.pending_output() {
                Interest::Write
            } else if e.conn.parked {
                Interest::Parked
            } else {
                Interest::Read
            };
            if e.watch(&self.epoll, want).is_err() {
                dead.push(id);
                continue;
            }
            if want == Interest::Read && e.conn.has_runnable_input() {
                self.runnable.push(id);
            }
        }
        {
            let sent = Instant::now();
            let mut t = shared.stats.rounds.lock();
            t.run.record(ran - started);
            t.commit.record(commit_done - ran);
            t.send.record(sent - commit_done);
        }
        for id in dead {
            self.close(id);
        }
    }

    fn close(&mut self, id: u64) {
        if let Some(e) = self.conns.remove(&id) {
            let _ = epoll::delete(&self.epoll, &e.conn.stream);
            self.shared.leave(id);
        }
    }

    /// Closes clients silent longer than `idle_timeout_ms` (checked once
    /// a tick; a client with replies still to take is not idle).
    fn close_idle(&mut self) {
        let timeout = self.shared.cfg.idle_timeout_ms;
        if timeout == 0 || self.last_idle_scan.elapsed() < TICK {
            return;
        }
        self.last_idle_scan = Instant::now();
        let limit = Duration::from_millis(timeout);
        let idle: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, e)| !e.conn.pending_output() && e.conn.last_active.elapsed() >= limit)
            .map(|(&id, _)| id)
            .collect();
        for id in idle {
            self.close(id);
        }
    }

    /// The server is stopping: every connection runs the requests it has
    /// received, sends their replies (blocking, until the stop's deadline),
    /// and closes.
    fn finish(&mut self) {
        self.adopt();
        let deadline = Instant::now() + Duration::from_millis(self.shared.cfg.shutdown_timeout_ms);
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        let engine = &self.shared.backend.engine;
        for id in ids {
            let Some(e) = self.conns.get_mut(&id) else {
                continue;
            };
            let c = &mut e.conn;
            // A parked read runs here, waiting for the device.
            c.resume();
            let _ = c.read_available(self.shared);
            let _ = c.stream.set_nonblocking(false);
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || c.stream.set_write_timeout(Some(left)).is_err() {
                    break;
                }
                let round = engine.defer_commits();
                let lsn = || round.lsn();
                c.run_requests(self.shared, &lsn, false);
                match round.commit() {
                    Ok(()) => c.acknowledge(),
                    Err(err) => c.fail_round(&err.to_string()),
                }
                drop(round);
                if !matches!(c.send(self.shared), Ok(true)) || !c.has_runnable_input() {
                    break;
                }
            }
            self.close(id);
        }
    }
}
