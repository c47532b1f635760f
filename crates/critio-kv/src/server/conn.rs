//! One connection: read, run every complete request in the buffer in
//! order (pipelining), write the replies, read again.
//!
//! ```text
//!  input:  [ req | req | req | partial.. ]   run the three, keep the partial,
//!                                            read until it has `at_least` bytes
//!  output: replies, written when the input runs dry or past 64 KiB
//! ```
//!
//! Bounds: the input holds at most one partial request (at most
//! `max_frame_bytes`, checked on its headers) plus one read; the output is
//! written out past [`OUTPUT_FLUSH_BYTES`].

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use super::command::{self, Ctx, Session};
use super::frame::{self, Limits, Parsed};
use super::reply::Reply;
use super::{Shared, Stats};

/// The smallest read.
const READ_CHUNK: usize = 16 << 10;
/// The largest read.
const READ_MAX: usize = 1 << 20;
/// Replies are written out once they pass this.
const OUTPUT_FLUSH_BYTES: usize = 64 << 10;

const _: () = assert!(READ_CHUNK <= READ_MAX);

/// Serves one connection until the client leaves, sends a bad frame,
/// QUITs, idles out or the server stops.
pub(crate) fn run(shared: &Arc<Shared>, stream: TcpStream, id: u64) {
    // The enlightenment API: this thread serves requests.
    critio::context::set_foreground();
    let _ = stream.set_nodelay(true);
    if shared.cfg.idle_timeout_ms > 0 {
        let _ = stream.set_read_timeout(Some(Duration::from_millis(shared.cfg.idle_timeout_ms)));
    }
    let mut conn = Conn {
        shared,
        stream,
        input: Vec::with_capacity(READ_CHUNK),
        output: Vec::with_capacity(READ_CHUNK),
        session: Session::new(id),
    };
    let _ = conn.serve(); // an I/O error only ends this connection
}

struct Conn<'a> {
    shared: &'a Shared,
    stream: TcpStream,
    input: Vec<u8>,
    output: Vec<u8>,
    session: Session,
}

/// What the buffered input needs next.
enum Step {
    /// Read until the input holds this many bytes.
    Need(usize),
    /// Write what is pending, then close.
    Close,
}

impl Conn<'_> {
    fn serve(&mut self) -> io::Result<()> {
        let mut need = 1;
        loop {
            if self.input.len() >= need {
                match self.run_buffered()? {
                    Step::Need(n) => need = n,
                    Step::Close => return self.flush(),
                }
            }
            self.flush()?;
            if !self.fill(need)? {
                return Ok(());
            }
        }
    }

    /// Runs every complete request in the input, in order.
    fn run_buffered(&mut self) -> io::Result<Step> {
        let limits = Limits {
            frame_bytes_max: self.shared.cfg.max_frame_bytes as usize,
            args_max: self.shared.cfg.max_args as usize,
        };
        let mut at = 0;
        let step = loop {
            let parsed = match frame::parse(&self.input[at..], limits) {
                Ok(p) => p,
                Err(e) => {
                    Stats::add(&self.shared.stats.protocol_errors, 1);
                    Reply::err(e).encode(&mut self.output);
                    break Step::Close;
                }
            };
            let (args, consumed) = match parsed {
                Parsed::Incomplete { at_least } => break Step::Need(at_least),
                Parsed::Request { args, consumed } => (args, consumed),
            };
            let request = &self.input[at..at + consumed];
            let args = args.slices(request);
            if !args.is_empty() {
                let mut ctx = Ctx {
                    shared: self.shared,
                    session: &mut self.session,
                };
                command::dispatch(&mut ctx, &args).encode(&mut self.output);
            }
            at += consumed;
            if self.session.quit {
                break Step::Close;
            }
            if self.output.len() >= OUTPUT_FLUSH_BYTES {
                self.flush()?;
            }
        };
        self.input.drain(..at);
        if self.input.capacity() > 4 * READ_MAX && self.input.len() < READ_CHUNK {
            self.input.shrink_to(READ_CHUNK);
        }
        Ok(step)
    }

    /// Reads more input, toward `need` bytes. False: the client is gone
    /// (or idled out, or the server is stopping).
    fn fill(&mut self, need: usize) -> io::Result<bool> {
        let len = self.input.len();
        let want = need.saturating_sub(len).clamp(READ_CHUNK, READ_MAX);
        self.input.resize(len + want, 0);
        let read = loop {
            match self.stream.read(&mut self.input[len..]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other,
            }
        };
        let n = match read {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                0
            }
            Err(e) => {
                self.input.truncate(len);
                return Err(e);
            }
        };
        self.input.truncate(len + n);
        Stats::add(&self.shared.stats.net_input_bytes, n as u64);
        Ok(n > 0)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.output.is_empty() {
            return Ok(());
        }
        let result = self.stream.write_all(&self.output);
        Stats::add(
            &self.shared.stats.net_output_bytes,
            self.output.len() as u64,
        );
        self.output.clear();
        if self.output.capacity() > 4 * OUTPUT_FLUSH_BYTES {
            self.output.shrink_to(OUTPUT_FLUSH_BYTES);
        }
        result
    }
}
