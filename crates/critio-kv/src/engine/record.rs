//! Value-log records: what the data region holds, one record per version
//! of a key (or a deletion, or a FLUSHALL), each checksummed and
//! self-describing, so recovery rebuilds the index by reading them in
//! order.
//!
//! ```text
//!  record: | len u32 | crc32c u32 | kind u8 | 0 u8 | klen u16 | expire_ms u64 | key | value | 0-7 zero bytes |
//!           len counts header + key + value (not the padding to 8 bytes);
//!           crc covers len and everything after the crc, up to len
//!  pad:    | 0xFFFF_FFFF | 0xFFFF_FFFF |   the rest of the region's lap is unused
//! ```
//!
//! A record never wraps past the end of the region: an append that would
//! is preceded by a pad, and the record starts the next lap. A record holds
//! no address of its own, so the cleaner relocates it by copying its bytes.

use super::entry::{KIND_HASH, KIND_STR};

/// Records start at multiples of this.
pub(crate) const ALIGN: usize = 8;
/// Bytes before the key.
pub(crate) const HEADER: usize = 20;
/// A deleted key.
pub(crate) const KIND_DEL: u8 = 0x10;
/// Every key deleted.
pub(crate) const KIND_FLUSHALL: u8 = 0x11;
const PAD: u32 = 0xFFFF_FFFF;
/// Bytes of a pad record.
pub(crate) const PAD_BYTES: usize = 8;

const _: () = assert!(HEADER >= PAD_BYTES);
const _: () = assert!(PAD_BYTES == ALIGN);

/// A decoded record, borrowing its key and value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record<'a> {
    pub(crate) kind: u8,
    pub(crate) expire_at_ms: u64,
    pub(crate) key: &'a [u8],
    pub(crate) value: &'a [u8],
}

impl Record<'_> {
    /// Whether it holds a value (not a deletion or FLUSHALL).
    pub(crate) fn is_value(&self) -> bool {
        matches!(self.kind, KIND_STR | KIND_HASH)
    }
}

/// What the bytes at a position hold.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decoded<'a> {
    /// A record and its length with padding.
    Record(Record<'a>, usize),
    /// The rest of this lap is unused.
    Pad,
    /// The buffer ends inside the record: this many bytes are needed.
    Short(usize),
    /// Not a record: a checksum or layout error.
    Bad(&'static str),
}

/// Rounds up to the record alignment.
pub(crate) fn aligned(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// Bytes a record of this key and value takes, padding included.
pub(crate) fn size(key: usize, value: usize) -> usize {
    aligned(HEADER + key + value)
}

fn checksum(len: u32, rest: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&len.to_le_bytes()), rest)
}

/// Appends one record to `out` (padded to [`ALIGN`]).
pub(crate) fn encode(r: &Record<'_>, out: &mut Vec<u8>) {
    assert!(
        r.key.len() <= u16::MAX as usize,
        "key too long for a record"
    );
    let len = HEADER + r.key.len() + r.value.len();
    let len32 = u32::try_from(len).expect("record too long");
    let start = out.len();
    out.extend_from_slice(&len32.to_le_bytes());
    out.extend_from_slice(&[0; 4]); // the checksum, below
    out.push(r.kind);
    out.push(0);
    out.extend_from_slice(&(r.key.len() as u16).to_le_bytes());
    out.extend_from_slice(&r.expire_at_ms.to_le_bytes());
    out.extend_from_slice(r.key);
    out.extend_from_slice(r.value);
    let crc = checksum(len32, &out[start + 8..start + len]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    out.resize(start + aligned(len), 0);
}

/// The pad record.
pub(crate) fn pad() -> [u8; PAD_BYTES] {
    let mut p = [0u8; PAD_BYTES];
    p[..4].copy_from_slice(&PAD.to_le_bytes());
    p[4..].copy_from_slice(&PAD.to_le_bytes());
    p
}

/// Decodes the record at the start of `buf`; `max_len` bounds a record's
/// length (so garbage cannot ask for gigabytes).
pub(crate) fn decode(buf: &[u8], max_len: usize) -> Decoded<'_> {
    if buf.len() < PAD_BYTES {
        return Decoded::Short(PAD_BYTES);
    }
    let word = |at: usize| u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
    let len32 = word(0);
    if len32 == PAD && word(4) == PAD {
        return Decoded::Pad;
    }
    let len = len32 as usize;
    if len < HEADER || len > max_len {
        return Decoded::Bad("record length out of range");
    }
    if buf.len() < len {
        return Decoded::Short(aligned(len));
    }
    if checksum(len32, &buf[8..len]) != word(4) {
        return Decoded::Bad("record checksum");
    }
    let kind = buf[8];
    let klen = u16::from_le_bytes([buf[10], buf[11]]) as usize;
    if HEADER + klen > len {
        return Decoded::Bad("key runs past the record");
    }
    let expire_at_ms = u64::from_le_bytes(buf[12..20].try_into().expect("8 bytes"));
    let rec = Record {
        kind,
        expire_at_ms,
        key: &buf[HEADER..HEADER + klen],
        value: &buf[HEADER + klen..len],
    };
    let known = rec.is_value() || kind == KIND_DEL || kind == KIND_FLUSHALL;
    if !known {
        return Decoded::Bad("unknown record kind");
    }
    Decoded::Record(rec, aligned(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_damage_is_caught() {
        let r = Record {
            kind: KIND_STR,
            expire_at_ms: 77,
            key: b"key",
            value: &[9; 1000],
        };
        let mut buf = Vec::new();
        encode(&r, &mut buf);
        encode(
            &Record {
                kind: KIND_DEL,
                expire_at_ms: 0,
                key: b"gone",
                value: &[],
            },
            &mut buf,
        );
        assert_eq!(buf.len(), size(3, 1000) + size(4, 0));
        assert_eq!(buf.len() % ALIGN, 0);
        assert_eq!(decode(&buf, 1 << 20), Decoded::Record(r, size(3, 1000)));
        let second = &buf[size(3, 1000)..];
        assert!(matches!(decode(second, 1 << 20), Decoded::Record(d, _) if d.kind == KIND_DEL));
        assert_eq!(
            decode(&buf[..100], 1 << 20),
            Decoded::Short(size(3, 1000)),
            "the rest is needed"
        );
        let mut bad = buf.clone();
        bad[500] ^= 1;
        assert_eq!(decode(&bad, 1 << 20), Decoded::Bad("record checksum"));
        assert_eq!(decode(&pad(), 1 << 20), Decoded::Pad);
        assert!(matches!(decode(&[0; 64], 1 << 20), Decoded::Bad(_)));
        assert!(
            matches!(decode(&buf, 100), Decoded::Bad(_)),
            "over the bound"
        );
    }
}
