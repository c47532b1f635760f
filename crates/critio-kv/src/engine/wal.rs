//! What the engine writes to the write-ahead log: logical operations, each
//! stating the resulting value (an INCR logs the new number, an HSET the
//! whole hash), so replaying them in order over a checkpoint's state is
//! exact and replaying one twice is harmless.
//!
//! ```text
//!  record: | n u32 | op ... |
//!  op put:  | 1 | klen u32 | key | kind u8 | expire_ms u64 | vlen u32 | value |
//!  op del:  | 2 | klen u32 | key |
//!  op flushall: | 3 |
//! ```

use super::entry::{Entry, Reader, Value};

/// One logged operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Put(Entry),
    Del(Vec<u8>),
    FlushAll,
}

const PUT: u8 = 1;
const DEL: u8 = 2;
const FLUSHALL: u8 = 3;

/// Encodes the operations of one request as one log record.
pub(crate) fn encode(ops: &[Op]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for op in ops {
        match op {
            Op::Put(e) => {
                out.push(PUT);
                out.extend_from_slice(&(e.key.len() as u32).to_le_bytes());
                out.extend_from_slice(&e.key);
                out.push(e.value.kind());
                out.extend_from_slice(&e.expire_at_ms.to_le_bytes());
                let v = e.value.encode();
                out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                out.extend_from_slice(&v);
            }
            Op::Del(k) => {
                out.push(DEL);
                out.extend_from_slice(&(k.len() as u32).to_le_bytes());
                out.extend_from_slice(k);
            }
            Op::FlushAll => out.push(FLUSHALL),
        }
    }
    out
}

/// Decodes a record; None if it is not one this engine wrote.
pub(crate) fn decode(bytes: &[u8]) -> Option<Vec<Op>> {
    let mut r = Reader(bytes);
    let n = r.u32()?;
    let mut ops = Vec::with_capacity(n.min(1024) as usize);
    for _ in 0..n {
        let op = match r.u8()? {
            PUT => {
                let key = r.bytes()?.to_vec();
                let kind = r.u8()?;
                let expire_at_ms = r.u64()?;
                let value = Value::decode(kind, r.bytes()?)?;
                Op::Put(Entry {
                    key,
                    expire_at_ms,
                    value,
                })
            }
            DEL => Op::Del(r.bytes()?.to_vec()),
            FLUSHALL => Op::FlushAll,
            _ => return None,
        };
        ops.push(op);
    }
    r.0.is_empty().then_some(ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn records_round_trip() {
        let mut h = BTreeMap::new();
        h.insert(b"f".to_vec(), b"v".to_vec());
        let ops = vec![
            Op::Put(Entry {
                key: b"k".to_vec(),
                expire_at_ms: 9,
                value: Value::Str(vec![7; 3000]),
            }),
            Op::Put(Entry {
                key: b"h".to_vec(),
                expire_at_ms: 0,
                value: Value::Hash(h),
            }),
            Op::Del(b"gone".to_vec()),
            Op::FlushAll,
        ];
        let enc = encode(&ops);
        assert_eq!(decode(&enc), Some(ops));
        assert_eq!(decode(&enc[..enc.len() - 1]), None);
    }
}
