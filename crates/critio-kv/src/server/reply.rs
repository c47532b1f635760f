//! Replies, encoded in the protocol each connection speaks: RESP2 until a
//! client says `HELLO 3`, RESP3 after. The wire format is the
//! `redis-protocol` crate's; this module only says which frame a reply is
//! in each protocol (RESP2 has no map, no null type and no verbatim
//! string, so they fall back to what Redis sends a RESP2 client):
//!
//! | reply            | RESP2                       | RESP3                     |
//! |------------------|-----------------------------|---------------------------|
//! | `Simple("OK")`   | `+OK`                       | `+OK`                     |
//! | `Error(m)`       | `-m` (CR/LF in m become spaces) | `-m`                  |
//! | `Int(3)`         | `:3`                        | `:3`                      |
//! | `Bulk(b"v")`     | `$1 v`                      | `$1 v`                    |
//! | `Nil`            | `$-1`                       | `_`                       |
//! | `Array(v)`       | `*n` then each element      | `*n` then each element    |
//! | `Map(kv)`        | `*2n` k1 v1 k2 v2 ..        | `%n` k1 v1 ..             |
//! | `Verbatim(text)` | `$n text`                   | `=n txt:text`             |

use redis_protocol::resp2::types::{OwnedFrame as Frame2, Resp2Frame as _};
use redis_protocol::resp3::types::{
    FrameMap, OwnedFrame as Frame3, Resp3Frame as _, VerbatimStringFormat,
};

use crate::engine::EngineError;

/// The protocol a connection speaks (`HELLO 2|3`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Protocol {
    /// RESP2, every connection's protocol until `HELLO 3`.
    #[default]
    Resp2,
    /// RESP3.
    Resp3,
}

impl Protocol {
    /// 2 or 3, as HELLO reports it.
    pub fn version(self) -> i64 {
        match self {
            Protocol::Resp2 => 2,
            Protocol::Resp3 => 3,
        }
    }
}

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
    /// No value (a missing key).
    Nil,
    /// An array.
    Array(Vec<Reply>),
    /// Pairs in order (HGETALL, CONFIG GET, HELLO).
    Map(Vec<(Reply, Reply)>),
    /// Text meant for people (INFO).
    Verbatim(Vec<u8>),
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

    /// A bulk string of `text`.
    pub fn text(text: &str) -> Reply {
        Reply::Bulk(text.as_bytes().to_vec())
    }

    /// Appends the encoding in `proto` to `out`.
    pub fn encode(self, proto: Protocol, out: &mut Vec<u8>) {
        let at = out.len();
        match proto {
            Protocol::Resp2 => {
                let frame = self.into_resp2();
                out.resize(at + frame.encode_len(false), 0);
                redis_protocol::resp2::encode::encode(&mut out[at..], &frame, false)
            }
            Protocol::Resp3 => {
                let frame = self.into_resp3();
                out.resize(at + frame.encode_len(false), 0);
                redis_protocol::resp3::encode::complete::encode(&mut out[at..], &frame, false)
            }
        }
        .expect("the buffer is sized by encode_len");
    }

    fn into_resp2(self) -> Frame2 {
        match self {
            Reply::Simple(s) => Frame2::SimpleString(one_line(s.as_bytes())),
            Reply::Error(e) => Frame2::Error(error_line(e)),
            Reply::Int(n) => Frame2::Integer(n),
            Reply::Bulk(b) | Reply::Verbatim(b) => Frame2::BulkString(b),
            Reply::Nil => Frame2::Null,
            Reply::Array(v) => Frame2::Array(v.into_iter().map(Reply::into_resp2).collect()),
            Reply::Map(kv) => Frame2::Array(
                kv.into_iter()
                    .flat_map(|(k, v)| [k.into_resp2(), v.into_resp2()])
                    .collect(),
            ),
        }
    }

    fn into_resp3(self) -> Frame3 {
        match self {
            Reply::Simple(s) => Frame3::SimpleString {
                data: one_line(s.as_bytes()),
                attributes: None,
            },
            Reply::Error(e) => Frame3::SimpleError {
                data: error_line(e),
                attributes: None,
            },
            Reply::Int(n) => Frame3::Number {
                data: n,
                attributes: None,
            },
            Reply::Bulk(b) => Frame3::BlobString {
                data: b,
                attributes: None,
            },
            Reply::Nil => Frame3::Null,
            Reply::Array(v) => Frame3::Array {
                data: v.into_iter().map(Reply::into_resp3).collect(),
                attributes: None,
            },
            Reply::Map(kv) => Frame3::Map {
                data: kv
                    .into_iter()
                    .map(|(k, v)| (k.into_resp3(), v.into_resp3()))
                    .collect::<FrameMap<_, _>>(),
                attributes: None,
            },
            Reply::Verbatim(b) => Frame3::VerbatimString {
                data: b,
                format: VerbatimStringFormat::Text,
                attributes: None,
            },
        }
    }
}

/// A status line's text: a CR or LF inside would end the line early, so
/// it becomes a space.
fn one_line(text: &[u8]) -> Vec<u8> {
    text.iter()
        .map(|&b| match b {
            b'\r' | b'\n' => b' ',
            b => b,
        })
        .collect()
}

fn error_line(e: String) -> String {
    if e.contains(['\r', '\n']) {
        e.replace(['\r', '\n'], " ")
    } else {
        e
    }
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

    fn sample() -> Reply {
        Reply::Array(vec![
            Reply::OK,
            Reply::err("bad\r\nthing"),
            Reply::Int(-3),
            Reply::Bulk(b"v".to_vec()),
            Reply::Nil,
            Reply::Map(vec![
                (Reply::text("b"), Reply::Int(1)),
                (Reply::text("a"), Reply::Int(2)),
            ]),
            Reply::Verbatim(b"# x".to_vec()),
        ])
    }

    #[test]
    fn resp2_encodings_are_what_redis_sends() {
        let mut out = Vec::new();
        sample().encode(Protocol::Resp2, &mut out);
        let want: &[u8] = b"*7\r\n+OK\r\n-ERR bad  thing\r\n:-3\r\n$1\r\nv\r\n$-1\r\n\
            *4\r\n$1\r\nb\r\n:1\r\n$1\r\na\r\n:2\r\n$3\r\n# x\r\n";
        assert_eq!(String::from_utf8_lossy(&out), String::from_utf8_lossy(want));
    }

    #[test]
    fn resp3_has_null_maps_in_order_and_verbatim_text() {
        let mut out = Vec::new();
        sample().encode(Protocol::Resp3, &mut out);
        let want: &[u8] = b"*7\r\n+OK\r\n-ERR bad  thing\r\n:-3\r\n$1\r\nv\r\n_\r\n\
            %2\r\n$1\r\nb\r\n:1\r\n$1\r\na\r\n:2\r\n=7\r\ntxt:# x\r\n";
        assert_eq!(String::from_utf8_lossy(&out), String::from_utf8_lossy(want));
    }
}
