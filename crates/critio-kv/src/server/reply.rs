//! Replies and their RESP2 encoding.
//!
//! | reply          | wire                         |
//! |----------------|------------------------------|
//! | `Simple("OK")` | `+OK\r\n`                    |
//! | `Error(m)`     | `-m\r\n` (CR/LF in m become spaces) |
//! | `Int(3)`       | `:3\r\n`                     |
//! | `Bulk(b"v")`   | `$1\r\nv\r\n`                |
//! | `Nil`          | `$-1\r\n`                    |
//! | `Array(v)`     | `*n\r\n` then each element   |

use std::io::Write as _;

use crate::engine::EngineError;

/// One reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// A status line.
    Simple(&'static str),
    /// An error; the text starts with its code (`ERR`, `WRONGTYPE`).
    Error(String),
    /// An integer.
    Int(i64),
    /// A bulk string.
    Bulk(Vec<u8>),
    /// The null bulk string.
    Nil,
    /// An array.
    Array(Vec<Reply>),
}

impl Reply {
    /// `+OK`.
    pub const OK: Reply = Reply::Simple("OK");

    /// An `ERR` error.
    pub fn err(msg: impl std::fmt::Display) -> Reply {
        Reply::Error(format!("ERR {msg}"))
    }

    /// A bulk string or nil.
    pub fn opt(v: Option<Vec<u8>>) -> Reply {
        v.map_or(Reply::Nil, Reply::Bulk)
    }

    /// Appends the encoding to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Reply::Simple(s) => line(out, b'+', s.as_bytes()),
            Reply::Error(e) => line(out, b'-', e.as_bytes()),
            Reply::Int(n) => {
                let _ = write!(out, ":{n}\r\n");
            }
            Reply::Bulk(b) => {
                let _ = write!(out, "${}\r\n", b.len());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Nil => out.extend_from_slice(b"$-1\r\n"),
            Reply::Array(v) => {
                let _ = write!(out, "*{}\r\n", v.len());
                for r in v {
                    r.encode(out);
                }
            }
        }
    }
}

/// A status or error line; a CR or LF inside would end the line early, so
/// it becomes a space.
fn line(out: &mut Vec<u8>, kind: u8, text: &[u8]) {
    out.push(kind);
    out.extend(text.iter().map(|&b| match b {
        b'\r' | b'\n' => b' ',
        b => b,
    }));
    out.extend_from_slice(b"\r\n");
}

impl From<EngineError> for Reply {
    /// The engine's messages are Redis error replies already.
    fn from(e: EngineError) -> Reply {
        Reply::Error(e.to_string())
    }
}

impl<T: Into<Reply>> From<Result<T, EngineError>> for Reply {
    fn from(r: Result<T, EngineError>) -> Reply {
        r.map_or_else(Reply::from, Into::into)
    }
}

impl From<u64> for Reply {
    fn from(n: u64) -> Reply {
        Reply::Int(i64::try_from(n).unwrap_or(i64::MAX))
    }
}

impl From<i64> for Reply {
    fn from(n: i64) -> Reply {
        Reply::Int(n)
    }
}

impl From<Option<Vec<u8>>> for Reply {
    fn from(v: Option<Vec<u8>>) -> Reply {
        Reply::opt(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_are_resp2() {
        let r = Reply::Array(vec![
            Reply::OK,
            Reply::err("bad\r\nthing"),
            Reply::Int(-3),
            Reply::Bulk(b"v".to_vec()),
            Reply::Nil,
        ]);
        let mut out = Vec::new();
        r.encode(&mut out);
        assert_eq!(
            out,
            b"*5\r\n+OK\r\n-ERR bad  thing\r\n:-3\r\n$1\r\nv\r\n$-1\r\n".to_vec()
        );
    }
}
