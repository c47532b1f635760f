//! What the engine stores per key: its kind (string or hash), optional
//! expiry, and value, with the encodings used in bucket pages, in blobs and
//! in log records.

use std::collections::BTreeMap;

/// A stored value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// A string (bytes).
    Str(Vec<u8>),
    /// A hash of fields to values.
    Hash(BTreeMap<Vec<u8>, Vec<u8>>),
}

/// The kind tag of a value in its encodings.
pub(crate) const KIND_STR: u8 = 0;
pub(crate) const KIND_HASH: u8 = 1;

impl Value {
    pub(crate) fn kind(&self) -> u8 {
        match self {
            Value::Str(_) => KIND_STR,
            Value::Hash(_) => KIND_HASH,
        }
    }

    /// The value's bytes in storage: a string as is, a hash as
    /// `[n u32]([len u32][field][len u32][value])*`.
    pub(crate) fn encode(&self) -> Vec<u8> {
        match self {
            Value::Str(s) => s.clone(),
            Value::Hash(h) => {
                let mut out = Vec::with_capacity(
                    4 + h.iter().map(|(f, v)| 8 + f.len() + v.len()).sum::<usize>(),
                );
                out.extend_from_slice(&(h.len() as u32).to_le_bytes());
                for (f, v) in h {
                    out.extend_from_slice(&(f.len() as u32).to_le_bytes());
                    out.extend_from_slice(f);
                    out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                    out.extend_from_slice(v);
                }
                out
            }
        }
    }

    /// Decodes a value of `kind` from its storage bytes.
    pub(crate) fn decode(kind: u8, bytes: &[u8]) -> Option<Value> {
        match kind {
            KIND_STR => Some(Value::Str(bytes.to_vec())),
            KIND_HASH => {
                let mut r = Reader(bytes);
                let n = r.u32()?;
                let mut h = BTreeMap::new();
                for _ in 0..n {
                    let f = r.bytes()?.to_vec();
                    let v = r.bytes()?.to_vec();
                    h.insert(f, v);
                }
                r.0.is_empty().then_some(Value::Hash(h))
            }
            _ => None,
        }
    }

    /// Bytes of the stored form.
    pub(crate) fn stored_len(&self) -> usize {
        match self {
            Value::Str(s) => s.len(),
            Value::Hash(h) => 4 + h.iter().map(|(f, v)| 8 + f.len() + v.len()).sum::<usize>(),
        }
    }
}

/// A key with its value and expiry (ms since the Unix epoch, 0 = none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The key.
    pub key: Vec<u8>,
    /// Expiry in ms since the Unix epoch; 0 = never.
    pub expire_at_ms: u64,
    /// The value.
    pub value: Value,
}

impl Entry {
    /// Whether the entry has expired at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        self.expire_at_ms != 0 && self.expire_at_ms <= now_ms
    }
}

/// A little-endian reader over a byte slice; every read checks bounds.
pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }

    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }

    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    /// A `[len u32][bytes]` field.
    pub(crate) fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_round_trip_and_garbage_is_rejected() {
        let mut h = BTreeMap::new();
        h.insert(b"f1".to_vec(), b"v1".to_vec());
        h.insert(b"".to_vec(), vec![0; 300]);
        let v = Value::Hash(h);
        let enc = v.encode();
        assert_eq!(enc.len(), v.stored_len());
        assert_eq!(Value::decode(KIND_HASH, &enc), Some(v));
        assert_eq!(Value::decode(KIND_HASH, &enc[..enc.len() - 1]), None);
        assert_eq!(Value::decode(9, b"x"), None);
        let s = Value::Str(b"abc".to_vec());
        assert_eq!(Value::decode(KIND_STR, &s.encode()), Some(s));
    }
}
