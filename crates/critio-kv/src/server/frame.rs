//! Request framing, sans-I/O: the next request in a connection's input
//! buffer, or how many bytes it needs first, or why the input is not RESP.
//!
//! ```text
//!  '*' ── scan headers (bounded: args, frame bytes) ──┬─ incomplete: need ≥ N bytes
//!         *N\r\n $L\r\n <L bytes>\r\n ...             ├─ too big / not '$': protocol error
//!                                                     └─ complete: redis-protocol decodes it
//!  other ── a text line (inline command, as telnet sends): args split on spaces, quotes kept
//! ```
//!
//! The header scan skips over payloads without copying, so a large frame
//! arriving in pieces is checked against the limits as soon as its headers
//! arrive and is decoded once, when complete. Parsing itself is the
//! `redis-protocol` crate's.

use std::ops::Range;

use redis_protocol::resp2::decode::decode_range;
use redis_protocol::resp2::types::RangeFrame;

/// The longest inline request line, in bytes (Redis's).
pub const INLINE_BYTES_MAX: usize = 64 << 10;
/// The longest `*N` or `$L` header line, CRLF included.
const HEADER_BYTES_MAX: usize = 32;

const _: () = assert!(HEADER_BYTES_MAX < INLINE_BYTES_MAX);

/// The limits a request must keep.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The largest frame, in bytes.
    pub frame_bytes_max: usize,
    /// The most arguments.
    pub args_max: usize,
}

/// Why the input is not a request. The message follows `-ERR ` in the
/// reply, and the connection is closed after it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Protocol error: {0}")]
pub struct ProtocolError(pub String);

fn error<T>(what: impl Into<String>) -> Result<T, ProtocolError> {
    Err(ProtocolError(what.into()))
}

/// A request's arguments.
#[derive(Debug, PartialEq, Eq)]
pub enum Args {
    /// Byte ranges of the input buffer (RESP multibulk).
    Ranges(Vec<Range<usize>>),
    /// Owned (an inline command, unquoted).
    Owned(Vec<Vec<u8>>),
}

impl Args {
    /// The arguments, borrowing from `buf` (the buffer parsed).
    pub fn slices<'a>(&'a self, buf: &'a [u8]) -> Vec<&'a [u8]> {
        match self {
            Args::Ranges(r) => r.iter().map(|r| &buf[r.clone()]).collect(),
            Args::Owned(v) => v.iter().map(Vec::as_slice).collect(),
        }
    }
}

/// What the front of the buffer holds.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A request of `consumed` bytes; empty args: nothing to run (`*0`, a
    /// blank line).
    Request {
        /// Its arguments (the command name first).
        args: Args,
        /// Its length in the buffer.
        consumed: usize,
    },
    /// The request is not complete: read until the buffer holds at least
    /// this many bytes.
    Incomplete {
        /// A lower bound on the request's length.
        at_least: usize,
    },
}

/// Parses the request at the front of `buf`.
pub fn parse(buf: &[u8], limits: Limits) -> Result<Parsed, ProtocolError> {
    match buf.first() {
        None => Ok(Parsed::Incomplete { at_least: 1 }),
        Some(b'*') => multibulk(buf, limits),
        Some(_) => inline(buf),
    }
}

enum Scan {
    Complete(usize),
    Empty(usize),
    Incomplete(usize),
}

/// A header line `<byte><integer>\r\n` at `at`: the integer and where the
/// line ends, or None if it has not fully arrived.
fn header(buf: &[u8], at: usize, too_big: &str) -> Result<Option<(i64, usize)>, ProtocolError> {
    let window = &buf[at..buf.len().min(at + HEADER_BYTES_MAX)];
    let Some(cr) = window.iter().position(|&b| b == b'\r') else {
        if window.len() == HEADER_BYTES_MAX {
            return error(too_big);
        }
        return Ok(None);
    };
    let Some(&next) = buf.get(at + cr + 1) else {
        return Ok(None);
    };
    let n = std::str::from_utf8(&window[1..cr])
        .ok()
        .and_then(|t| t.parse::<i64>().ok());
    match (next, n) {
        (b'\n', Some(n)) => Ok(Some((n, at + cr + 2))),
        _ => error(if buf[at] == b'*' {
            "invalid multibulk length"
        } else {
            "invalid bulk length"
        }),
    }
}

/// Walks the headers of a multibulk request, checking the limits.
fn scan(buf: &[u8], limits: Limits) -> Result<Scan, ProtocolError> {
    let Some((n, mut at)) = header(buf, 0, "too big mbulk count string")? else {
        return Ok(Scan::Incomplete(buf.len() + 1));
    };
    if n <= 0 {
        return Ok(Scan::Empty(at));
    }
    if n > limits.args_max as i64 {
        return error("invalid multibulk length");
    }
    for _ in 0..n {
        match buf.get(at) {
            None => return Ok(Scan::Incomplete(at + 1)),
            Some(b'$') => {}
            Some(&c) => return error(format!("expected '$', got '{}'", c as char)),
        }
        let Some((len, body)) = header(buf, at, "too big bulk count string")? else {
            return Ok(Scan::Incomplete(buf.len() + 1));
        };
        if len < 0 {
            return error("invalid bulk length");
        }
        let end = (body as u64).saturating_add(len as u64 + 2);
        if end > limits.frame_bytes_max as u64 {
            return error(format!(
                "request of at least {end} bytes exceeds the {}-byte limit (server.max_frame_bytes)",
                limits.frame_bytes_max
            ));
        }
        at = end as usize;
    }
    Ok(if at <= buf.len() {
        Scan::Complete(at)
    } else {
        Scan::Incomplete(at)
    })
}

fn multibulk(buf: &[u8], limits: Limits) -> Result<Parsed, ProtocolError> {
    let len = match scan(buf, limits)? {
        Scan::Incomplete(at_least) => return Ok(Parsed::Incomplete { at_least }),
        Scan::Empty(consumed) => {
            return Ok(Parsed::Request {
                args: Args::Owned(Vec::new()),
                consumed,
            })
        }
        Scan::Complete(len) => len,
    };
    let decoded = decode_range(&buf[..len]).map_err(|e| ProtocolError(e.to_string()))?;
    let Some((RangeFrame::Array(items), consumed)) = decoded else {
        return error("not an array of bulk strings");
    };
    let ranges = items
        .into_iter()
        .map(|item| match item {
            RangeFrame::BulkString((start, end)) => Ok(start..end),
            _ => error("expected a bulk string"),
        })
        .collect::<Result<Vec<_>, _>>()?;
    debug_assert_eq!(consumed, len);
    Ok(Parsed::Request {
        args: Args::Ranges(ranges),
        consumed,
    })
}

fn inline(buf: &[u8]) -> Result<Parsed, ProtocolError> {
    let window = &buf[..buf.len().min(INLINE_BYTES_MAX)];
    let Some(nl) = window.iter().position(|&b| b == b'\n') else {
        if buf.len() > INLINE_BYTES_MAX {
            return error("too big inline request");
        }
        return Ok(Parsed::Incomplete {
            at_least: buf.len() + 1,
        });
    };
    let line = window[..nl].strip_suffix(b"\r").unwrap_or(&window[..nl]);
    let args =
        split_args(line).ok_or_else(|| ProtocolError("unbalanced quotes in request".to_owned()))?;
    Ok(Parsed::Request {
        args: Args::Owned(args),
        consumed: nl + 1,
    })
}

/// Splits an inline line like Redis's `sdssplitargs`: spaces separate,
/// "double quotes" take `\n \r \t \\ \" \xHH` escapes, 'single quotes'
/// take `\'`. None: unbalanced quotes.
pub fn split_args(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut args = Vec::new();
    let mut i = 0;
    loop {
        while line.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        let Some(&first) = line.get(i) else {
            return Some(args);
        };
        let mut arg = Vec::new();
        if first == b'"' || first == b'\'' {
            i = quoted(line, i + 1, first, &mut arg)?;
            if line.get(i).is_some_and(|b| !b.is_ascii_whitespace()) {
                return None; // a closing quote must end the argument
            }
        } else {
            while let Some(&b) = line.get(i).filter(|b| !b.is_ascii_whitespace()) {
                arg.push(b);
                i += 1;
            }
        }
        args.push(arg);
    }
}

/// Reads a quoted argument from `i` (after the opening quote) into `out`;
/// returns the index after the closing quote.
fn quoted(line: &[u8], mut i: usize, quote: u8, out: &mut Vec<u8>) -> Option<usize> {
    loop {
        let &b = line.get(i)?;
        let next = line.get(i + 1).copied();
        match (b, next) {
            (q, _) if q == quote => return Some(i + 1),
            (b'\\', Some(b'x')) if quote == b'"' => {
                let hex = line
                    .get(i + 2..i + 4)
                    .and_then(|h| std::str::from_utf8(h).ok());
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 4;
                        continue;
                    }
                    None => out.push(b'\\'),
                }
            }
            (b'\\', Some(c)) if quote == b'"' => {
                out.push(match c {
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    b'b' => 8,
                    b'a' => 7,
                    other => other,
                });
                i += 2;
                continue;
            }
            (b'\\', Some(b'\'')) if quote == b'\'' => {
                out.push(b'\'');
                i += 2;
                continue;
            }
            (b, _) => out.push(b),
        }
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        frame_bytes_max: 1024,
        args_max: 8,
    };

    fn args(buf: &[u8]) -> (Vec<Vec<u8>>, usize) {
        match parse(buf, LIMITS).unwrap() {
            Parsed::Request { args, consumed } => (
                args.slices(buf).iter().map(|a| a.to_vec()).collect(),
                consumed,
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn multibulk_requests_parse_and_report_their_length() {
        let buf = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n$4\r\nPING\r\n";
        let (a, n) = args(buf);
        assert_eq!(a, vec![b"GET".to_vec(), b"k".to_vec()]);
        assert_eq!(n, 20);
        assert_eq!(args(&buf[n..]).0, vec![b"PING".to_vec()]);
        assert_eq!(args(b"*0\r\n"), (vec![], 4));
    }

    #[test]
    fn partial_frames_say_how_much_they_need() {
        let buf = b"*2\r\n$3\r\nGET\r\n$100\r\nxy";
        for cut in 0..buf.len() {
            assert!(matches!(
                parse(&buf[..cut], LIMITS).unwrap(),
                Parsed::Incomplete { .. }
            ));
        }
        let Parsed::Incomplete { at_least } = parse(buf, LIMITS).unwrap() else {
            panic!()
        };
        assert_eq!(at_least, 13 + 6 + 102);
    }

    #[test]
    fn bad_frames_are_protocol_errors() {
        for (buf, needle) in [
            (&b"*x\r\n"[..], "invalid multibulk length"),
            (b"*9\r\n", "invalid multibulk length"),
            (b"*1\r\n:1\r\n", "expected '$', got ':'"),
            (b"*1\r\n$-1\r\n", "invalid bulk length"),
            (b"*1\r\n$2000\r\n", "max_frame_bytes"),
            (
                b"*1\r\n$1111111111111111111111111111111111\r\n",
                "too big bulk",
            ),
            (b"\"unbalanced\r\n", "unbalanced quotes"),
        ] {
            let e = parse(buf, LIMITS).unwrap_err().to_string();
            assert!(e.starts_with("Protocol error: "), "{e}");
            assert!(e.contains(needle), "{e}");
        }
        let long = vec![b'a'; INLINE_BYTES_MAX + 1];
        assert!(parse(&long, LIMITS).unwrap_err().0.contains("inline"));
    }

    #[test]
    fn a_header_whose_cr_ends_the_window_still_parses() {
        // 31 bytes before the CR: the LF lies just past the header window.
        let mut buf = format!("*1\r\n${:0>30}\r\nx\r\n", 1).into_bytes();
        assert_eq!(args(&buf).0, vec![b"x".to_vec()]);
        buf.truncate(4 + 32);
        assert!(matches!(
            parse(&buf, LIMITS).unwrap(),
            Parsed::Incomplete { .. }
        ));
    }

    #[test]
    fn inline_commands_split_like_redis() {
        assert_eq!(
            args(b"set k \"a b\\x41\\n\" 'it\\'s'\r\n").0,
            vec![
                b"set".to_vec(),
                b"k".to_vec(),
                b"a bA\n".to_vec(),
                b"it's".to_vec()
            ]
        );
        assert_eq!(args(b"\r\n"), (vec![], 2));
        assert_eq!(split_args(b"\"a\"b"), None);
    }

    /// Properties over generated input: what a connection may receive,
    /// whole, in pieces, or as garbage.
    mod props {
        use proptest::prelude::*;

        use super::super::*;
        use super::LIMITS;

        const WIDE: Limits = Limits {
            frame_bytes_max: 64 << 10,
            args_max: 16,
        };

        fn encode(args: &[Vec<u8>]) -> Vec<u8> {
            let mut out = format!("*{}\r\n", args.len()).into_bytes();
            for a in args {
                out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
                out.extend_from_slice(a);
                out.extend_from_slice(b"\r\n");
            }
            out
        }

        fn request(buf: &[u8], limits: Limits) -> Option<(Vec<Vec<u8>>, usize)> {
            match parse(buf, limits) {
                Ok(Parsed::Request { args, consumed }) => Some((
                    args.slices(buf).iter().map(|a| a.to_vec()).collect(),
                    consumed,
                )),
                _ => None,
            }
        }

        /// Bytes that are mostly RESP's own, so the generator reaches the
        /// parser's branches rather than the inline path alone.
        fn resp_ish() -> impl Strategy<Value = Vec<u8>> {
            let byte = prop_oneof![
                4 => prop::sample::select(b"*$\r\n-0123456789 \"'\\x".to_vec()),
                1 => any::<u8>(),
            ];
            prop::collection::vec(byte, 0..120)
        }

        fn some_args(max_len: usize) -> impl Strategy<Value = Vec<Vec<u8>>> {
            prop::collection::vec(prop::collection::vec(any::<u8>(), 0..max_len), 1..8)
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

            /// Any input gives a request that lies within the buffer, a
            /// need for more bytes than the buffer has, or a protocol
            /// error: never a panic, and never a need the buffer already
            /// meets (a reader would spin).
            #[test]
            fn any_input_gives_a_request_a_need_or_an_error(
                buf in prop_oneof![resp_ish(), prop::collection::vec(any::<u8>(), 0..120)],
            ) {
                match parse(&buf, LIMITS) {
                    Ok(Parsed::Request { args, consumed }) => {
                        prop_assert!(consumed > 0 && consumed <= buf.len());
                        let slices = args.slices(&buf);
                        if buf[0] == b'*' {
                            prop_assert!(consumed <= LIMITS.frame_bytes_max);
                            prop_assert!(slices.len() <= LIMITS.args_max);
                        }
                    }
                    Ok(Parsed::Incomplete { at_least }) => prop_assert!(at_least > buf.len()),
                    Err(e) => prop_assert!(e.to_string().starts_with("Protocol error: ")),
                }
            }

            /// A request that arrives in pieces: every piece short of the
            /// whole asks for more (at most the request's length, at least
            /// one byte more than it has), the whole gives its arguments
            /// back, and what follows it does not change it.
            #[test]
            fn a_request_in_pieces_parses_as_it_does_whole(
                args in some_args(300),
                after in resp_ish(),
            ) {
                let enc = encode(&args);
                for cut in 0..enc.len() {
                    match parse(&enc[..cut], WIDE) {
                        Ok(Parsed::Incomplete { at_least }) => {
                            prop_assert!(at_least > cut && at_least <= enc.len(), "cut {cut}: {at_least}");
                        }
                        other => prop_assert!(false, "cut {cut} of {}: {other:?}", enc.len()),
                    }
                }
                prop_assert_eq!(request(&enc, WIDE), Some((args.clone(), enc.len())));
                let mut more = enc.clone();
                more.extend_from_slice(&after);
                prop_assert_eq!(request(&more, WIDE), Some((args, enc.len())));
            }

            /// A request over the frame limit never parses, in any piece:
            /// it is refused as soon as the header that takes it over has
            /// arrived, and stays refused as more arrives.
            #[test]
            fn a_request_over_the_limit_is_refused_and_stays_refused(args in some_args(400)) {
                let small = Limits { frame_bytes_max: 256, args_max: 16 };
                let enc = encode(&args);
                let mut refused = false;
                for cut in 0..=enc.len() {
                    match parse(&enc[..cut], small) {
                        Ok(Parsed::Request { .. }) => {
                            prop_assert!(enc.len() <= 256, "{} bytes parsed under a 256-byte limit", enc.len());
                        }
                        Ok(Parsed::Incomplete { .. }) => prop_assert!(!refused, "cut {cut}"),
                        Err(e) => {
                            prop_assert!(e.0.contains("max_frame_bytes"), "{e}");
                            refused = true;
                        }
                    }
                }
                prop_assert_eq!(refused, enc.len() > 256);
            }

            /// Any bytes, each written as a `\xHH` escape inside double
            /// quotes, come back from an inline request as they were.
            #[test]
            fn quoted_inline_arguments_come_back_as_they_were(
                args in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..8),
            ) {
                let mut line = Vec::new();
                for a in &args {
                    line.push(b'"');
                    for b in a {
                        line.extend_from_slice(format!("\\x{b:02x}").as_bytes());
                    }
                    line.extend_from_slice(b"\" ");
                }
                line.extend_from_slice(b"\r\n");
                prop_assert_eq!(request(&line, LIMITS), Some((args, line.len())));
            }
        }
    }
}
