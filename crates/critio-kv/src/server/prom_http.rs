//! The metrics endpoint: a plain HTTP/1.1 listener on its own thread that
//! answers `GET /metrics` with the exposition of `prom`.
//!
//! Small on purpose (no web framework): one thread, one request per
//! connection, answered and closed. Scrapes come every few seconds from
//! one or two Prometheus servers, so serving them in turn is enough; the
//! read and write timeouts bound what a slow or silent client can hold
//! the thread for.
//!
//! ```text
//!  accept ─> read the request head (at most HEAD_MAX bytes, IO_TIMEOUT)
//!     GET|HEAD /metrics ─> 200, text/plain; version=0.0.4 (HEAD: no body)
//!     other path ─> 404;  other method on /metrics ─> 405 (Allow: GET, HEAD)
//!     unreadable head ─> 400
//!  ─> close
//!  stop (the server's): set the flag, connect to wake the accept, join
//! ```

use std::io::{self, Read as _, Write as _};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use prometheus_client::registry::Registry;

use super::{prom, ServerError};

/// The longest request head read; a longer one is answered 400.
const HEAD_MAX: usize = 8 << 10;
/// How long a connection may take to send its request, and to take the
/// reply.
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// The path served.
pub(crate) const PATH: &str = "/metrics";

/// Binds the metrics address (before anything else starts, so a bad
/// address fails the start with nothing to undo).
pub(crate) fn bind(addr: &str) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr).map_err(|source| ServerError::MetricsBind {
        addr: addr.to_owned(),
        source,
    })
}

/// The running endpoint; dropping it stops it.
pub(crate) struct Endpoint {
    addr: SocketAddr,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Endpoint {
    /// Serves `registry` on `listener` until stopped.
    pub(crate) fn start(
        listener: TcpListener,
        registry: Registry,
    ) -> Result<Endpoint, ServerError> {
        let addr = listener
            .local_addr()
            .map_err(|source| ServerError::MetricsBind {
                addr: "the metrics listener".to_owned(),
                source,
            })?;
        let stopping = Arc::new(AtomicBool::new(false));
        let flag = stopping.clone();
        let thread = std::thread::Builder::new()
            .name("kv-metrics".into())
            .spawn(move || serve(&listener, &registry, &flag))
            .map_err(ServerError::Spawn)?;
        Ok(Endpoint {
            addr,
            stopping,
            thread: Some(thread),
        })
    }

    /// The address it listens on (with the port chosen if 0 was asked).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and waits for the thread (a scrape in progress
    /// finishes first, bounded by [`IO_TIMEOUT`]).
    pub(crate) fn stop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.stopping.store(true, Ordering::SeqCst);
        super::wake_acceptor(self.addr);
        let _ = thread.join();
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop();
    }
}

fn serve(listener: &TcpListener, registry: &Registry, stopping: &AtomicBool) {
    for stream in listener.incoming() {
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        match stream {
            Ok(mut s) => {
                if let Err(e) = answer(&mut s, registry) {
                    // A client that went away or timed out: its problem.
                    if !matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::BrokenPipe
                            | io::ErrorKind::ConnectionReset
                    ) {
                        eprintln!("critio-kv: metrics: {e}");
                    }
                }
            }
            Err(e) => {
                eprintln!("critio-kv: metrics: accept: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Reads the request head: up to the blank line, [`HEAD_MAX`] bytes, or
/// the end of what the client sends in time. None if it never ended.
fn read_head(s: &mut TcpStream) -> io::Result<Option<Vec<u8>>> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
            return Ok(Some(head));
        }
        if head.len() >= HEAD_MAX {
            return Ok(None);
        }
        match s.read(&mut buf) {
            Ok(0) => return Ok(None),
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// What a request gets: status line, extra headers, body, and whether the
/// body is sent (not for HEAD).
struct Response {
    status: &'static str,
    headers: &'static str,
    content_type: &'static str,
    body: String,
    send_body: bool,
}

fn plain(status: &'static str, headers: &'static str, body: &str) -> Response {
    Response {
        status,
        headers,
        content_type: "text/plain; charset=utf-8",
        body: format!("{body}\n"),
        send_body: true,
    }
}

/// The response to a request whose head is `head` (None: unreadable).
fn respond(head: Option<&[u8]>, registry: &Registry) -> Response {
    let line = head
        .and_then(|h| h.split(|&b| b == b'\n').next())
        .and_then(|l| std::str::from_utf8(l).ok())
        .map(str::trim_end);
    let mut words = line.unwrap_or("").split(' ');
    let (Some(method), Some(target), Some(version)) = (words.next(), words.next(), words.next())
    else {
        return plain("400 Bad Request", "", "bad request");
    };
    if !version.starts_with("HTTP/") || words.next().is_some() {
        return plain("400 Bad Request", "", "bad request");
    }
    let path = target.split('?').next().unwrap_or("");
    if path != PATH {
        return plain(
            "404 Not Found",
            "",
            "not found: the metrics are at /metrics",
        );
    }
    if method != "GET" && method != "HEAD" {
        return plain(
            "405 Method Not Allowed",
            "Allow: GET, HEAD\r\n",
            "method not allowed",
        );
    }
    match prom::render(registry) {
        Ok(body) => Response {
            status: "200 OK",
            headers: "",
            content_type: prom::CONTENT_TYPE,
            body,
            send_body: method == "GET",
        },
        Err(_) => plain("500 Internal Server Error", "", "cannot encode the metrics"),
    }
}

/// Answers one connection's request and closes it.
fn answer(s: &mut TcpStream, registry: &Registry) -> io::Result<()> {
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    let head = read_head(s)?;
    let r = respond(head.as_deref(), registry);
    let mut reply = format!(
        "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n",
        r.status,
        r.content_type,
        r.body.len(),
        r.headers
    );
    if r.send_body {
        reply += &r.body;
    }
    s.write_all(reply.as_bytes())?;
    s.shutdown(Shutdown::Write)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(head: &str) -> &'static str {
        respond(Some(head.as_bytes()), &Registry::default()).status
    }

    #[test]
    fn requests_get_their_status() {
        assert_eq!(status("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), "200 OK");
        assert_eq!(status("GET /metrics?x=1 HTTP/1.0\r\n\r\n"), "200 OK");
        let head = respond(
            Some(b"HEAD /metrics HTTP/1.1\r\n\r\n"),
            &Registry::default(),
        );
        assert_eq!((head.status, head.send_body), ("200 OK", false));
        assert_eq!(status("GET / HTTP/1.1\r\n\r\n"), "404 Not Found");
        assert_eq!(status("POST /other HTTP/1.1\r\n\r\n"), "404 Not Found");
        assert_eq!(
            status("POST /metrics HTTP/1.1\r\n\r\n"),
            "405 Method Not Allowed"
        );
        assert_eq!(status("GET\r\n\r\n"), "400 Bad Request");
        assert_eq!(status("GET /metrics FTP/1\r\n\r\n"), "400 Bad Request");
        let unread = respond(None, &Registry::default());
        assert_eq!(unread.status, "400 Bad Request");
    }
}
