//! One connection's buffers and state, driven by its worker's event loop:
//! read what the socket has, run every complete request in the buffer in
//! order (pipelining), and send the replies once the round's writes are
//! durable.
//!
//! ```text
//!  input:  [ req | req | req | partial.. ]   run the three, keep the partial,
//!                                            read until it has `at_least` bytes
//!  output: replies of this round ─> (worker: round committed) ─> send;
//!          what the socket does not take waits for it to be writable, and
//!          the connection reads nothing more until it is all sent
//! ```
//!
//! A failed commit (the log is poisoned) replaces each reply to a write of
//! the round with an error; the connection stays open, and later writes
//! fail at once with the log's error.
//!
//! Bounds: the input holds at most one partial request (at most
//! `max_frame_bytes`, checked on its headers) plus one round's reads
//! ([`READ_ROUND_MAX`]); a round stops running a connection's requests once
//! its output passes [`OUTPUT_ROUND_BYTES`], so one pipelining client cannot
//! hold its worker or grow its output without bound.

use std::io::{self, Write};
use std::net::TcpStream;
use std::time::Instant;

use rustix::buffer::spare_capacity;

use super::command::{self, Ctx, Session};
use super::frame::{self, Limits, Parsed};
use super::reply::Reply;
use super::{Shared, Stats};

/// One read.
const READ_CHUNK: usize = 16 << 10;
/// The most a round reads from one connection.
pub(crate) const READ_ROUND_MAX: usize = 1 << 20;
/// A round runs no more of a connection's requests once its output passes
/// this (the rest run after it is sent).
pub(crate) const OUTPUT_ROUND_BYTES: usize = 64 << 10;

/// One client connection.
pub(crate) struct Conn {
    pub(crate) id: u64,
    pub(crate) stream: TcpStream,
    input: Vec<u8>,
    /// The input needs this many bytes before a request can run.
    need: usize,
    output: Vec<u8>,
    /// Bytes of `output` already sent.
    sent: usize,
    /// The output ranges of this round's replies to writes (a failed
    /// commit replaces each with an error).
    unacked: Vec<(usize, usize)>,
    session: Session,
    pub(crate) last_active: Instant,
    /// Close once the output is sent (QUIT, a protocol error, a failed
    /// commit).
    closing: bool,
    /// The client sent its last byte: run its complete requests, send the
    /// replies, close.
    eof: bool,
    /// A read missed the page cache: the request stays first in the input
    /// and the connection runs nothing until its worker resumes it.
    pub(crate) parked: bool,
    /// What the parked request needs loaded (taken by the worker).
    pub(crate) prefetch: Option<crate::engine::Prefetch>,
    /// The first request after a resume may wait for the device (so a
    /// value evicted again before the retry cannot park it forever).
    retry_blocking: bool,
}

impl Conn {
    pub(crate) fn new(
        client: std::sync::Arc<super::clients::Client>,
        stream: TcpStream,
        authenticated: bool,
    ) -> Conn {
        Conn {
            id: client.id,
            stream,
            input: Vec::with_capacity(READ_CHUNK),
            need: 1,
            output: Vec::new(),
            sent: 0,
            unacked: Vec::new(),
            session: Session::new(client, authenticated),
            last_active: Instant::now(),
            closing: false,
            eof: false,
            parked: false,
            prefetch: None,
            retry_blocking: false,
        }
    }

    /// The worker prefetched what the parked request needs: it runs next,
    /// and may wait for the device this time.
    pub(crate) fn resume(&mut self) {
        self.parked = false;
        self.retry_blocking = true;
    }

    /// Output not yet sent.
    pub(crate) fn pending_output(&self) -> bool {
        self.sent < self.output.len()
    }

    /// Whether complete requests wait in the input (a round stopped at
    /// the output limit).
    pub(crate) fn has_runnable_input(&self) -> bool {
        !self.closing && !self.parked && self.input.len() >= self.need
    }

    /// Nothing more to do: close it.
    pub(crate) fn done(&self) -> bool {
        !self.pending_output()
            && (self.closing || (self.eof && !self.parked && !self.has_runnable_input()))
    }

    /// Reads what the socket has (at most [`READ_ROUND_MAX`]); notes the
    /// end of input (the complete requests before it still run).
    ///
    /// A read that fills less than the room it was given took everything
    /// the socket held, so it is the last: the worker's epoll is
    /// level-triggered and reports the socket again if more has arrived
    /// (or the peer has closed). Reading on until the socket said
    /// `EAGAIN` cost about every request a second `read`: under a GET load
    /// (20 clients) the worker made 3.1 system calls per GET, 1.8 of them
    /// reads; 2.5 with 0.9 reads after (`perf stat -e raw_syscalls:...`).
    pub(crate) fn read_available(&mut self, shared: &Shared) -> io::Result<()> {
        let mut total = 0;
        while total < READ_ROUND_MAX && !self.closing && !self.eof {
            let len = self.input.len();
            let want = self
                .need
                .saturating_sub(len)
                .clamp(READ_CHUNK, READ_ROUND_MAX);
            // Into the spare capacity, not zeroed first: zeroing 16 KiB per
            // read (and again for the read that finds the socket empty) was
            // 5% of the worker's time under a 1 KiB SET load.
            self.input.reserve(want);
            let room = self.input.capacity() - len;
            let read = rustix::io::read(&self.stream, spare_capacity(&mut self.input));
            let n = match read {
                Ok(n) => n,
                Err(e) => match io::Error::from(e).kind() {
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::WouldBlock => break,
                    _ => return Err(e.into()),
                },
            };
            debug_assert_eq!(self.input.len(), len + n);
            if n == 0 {
                self.eof = true;
                break;
            }
            total += n;
            self.last_active = Instant::now();
            if n < room {
                break;
            }
        }
        Stats::add(&shared.stats.net_input_bytes, total as u64);
        Ok(())
    }

    /// Runs the complete requests in the input, in order, until the round's
    /// output limit. `round_lsn` reads the round's highest deferred LSN, so
    /// the connection knows which of its replies wait for the commit. With
    /// `may_park`, a read that misses the page cache stops the run: the
    /// connection is `parked` with its `prefetch`, the request kept.
    pub(crate) fn run_requests(
        &mut self,
        shared: &Shared,
        round_lsn: &dyn Fn() -> u64,
        may_park: bool,
    ) {
        if self.parked {
            return;
        }
        let limits = Limits {
            frame_bytes_max: shared.cfg.max_frame_bytes as usize,
            args_max: shared.cfg.max_args as usize,
        };
        let mut at = 0;
        while !self.session.quit && self.output.len() - self.sent < OUTPUT_ROUND_BYTES {
            let parsed = match frame::parse(&self.input[at..], limits) {
                Ok(p) => p,
                Err(e) => {
                    Stats::add(&shared.stats.protocol_errors, 1);
                    Reply::err(e).encode(self.session.protocol, &mut self.output);
                    self.closing = true;
                    self.input.clear();
                    self.need = 1;
                    return;
                }
            };
            let (args, consumed) = match parsed {
                Parsed::Incomplete { at_least } => {
                    self.need = at_least;
                    break;
                }
                Parsed::Request { args, consumed } => (args, consumed),
            };
            let request = &self.input[at..at + consumed];
            let args = args.slices(request);
            if !args.is_empty() {
                let before = round_lsn();
                let mark = self.output.len();
                self.session.may_park = may_park && !self.retry_blocking;
                let mut ctx = Ctx {
                    shared,
                    session: &mut self.session,
                };
                let reply = command::dispatch(&mut ctx, &args);
                if let Some(p) = self.session.parked.take() {
                    self.parked = true;
                    self.prefetch = Some(p);
                    break;
                }
                self.retry_blocking = false;
                if !std::mem::take(&mut self.session.silent) {
                    reply.encode(self.session.protocol, &mut self.output);
                }
                if round_lsn() != before {
                    self.unacked.push((mark, self.output.len()));
                }
            }
            at += consumed;
            self.need = 1;
        }
        if self.session.quit {
            self.closing = true;
        }
        self.input.drain(..at);
        if self.input.capacity() > 4 * READ_ROUND_MAX && self.input.len() < READ_CHUNK {
            self.input.shrink_to(READ_CHUNK);
        }
    }

    /// The round's commit succeeded: every reply may go.
    pub(crate) fn acknowledge(&mut self) {
        self.unacked.clear();
    }

    /// The round's commit failed: each reply to a write of the round is
    /// replaced by an error saying why (none of them was acknowledged);
    /// the other replies stand, in order.
    pub(crate) fn fail_round(&mut self, why: &str) {
        if self.unacked.is_empty() {
            return;
        }
        let old = std::mem::take(&mut self.output);
        let mut at = 0;
        for (from, to) in self.unacked.drain(..) {
            self.output.extend_from_slice(&old[at..from]);
            Reply::Error(why.to_owned()).encode(self.session.protocol, &mut self.output);
            at = to;
        }
        self.output.extend_from_slice(&old[at..]);
    }

    /// Sends what the socket takes now. Ok(true): all of it is sent.
    pub(crate) fn send(&mut self, shared: &Shared) -> io::Result<bool> {
        debug_assert!(self.unacked.is_empty(), "replies sent before their commit");
        while self.sent < self.output.len() {
            match self.stream.write(&self.output[self.sent..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.sent += n;
                    Stats::add(&shared.stats.net_output_bytes, n as u64);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        self.output.clear();
        self.sent = 0;
        if self.output.capacity() > 4 * OUTPUT_ROUND_BYTES {
            self.output.shrink_to(OUTPUT_ROUND_BYTES);
        }
        Ok(true)
    }
}
