//! The superblock: which checkpoint is current. Two slots, written
//! alternately, each checksummed; the valid one with the higher sequence
//! wins, so a torn superblock write falls back to the previous checkpoint
//! (whose pages and log records are still there: nothing is freed or
//! truncated until the new superblock is durable).
//!
//! ```text
//!  | "CKVS" | version u32 | seq u64 | checkpoint lsn u64 | value log tail u64 | head u64 |
//!  | value log bytes u64 | page bytes u32 | crc32c of the above |
//! ```

use super::entry::Reader;

const MAGIC: &[u8; 4] = b"CKVS";
/// Version 1 was the copy-on-write bucket index, which this engine does not
/// read.
const VERSION: u32 = 2;

/// A checkpoint's description.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Superblock {
    pub(crate) seq: u64,
    /// Every log record at or below this LSN is reflected in the checkpoint.
    pub(crate) lsn: u64,
    /// The value log's records are between these addresses.
    pub(crate) tail: u64,
    pub(crate) head: u64,
    /// The value log's size (a store opened with another layout is refused).
    pub(crate) vlog_bytes: u64,
    pub(crate) page_bytes: u32,
}

/// What a superblock slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    /// A valid superblock.
    Valid(Superblock),
    /// A valid superblock of another format version.
    OtherVersion(u32),
    /// Nothing valid (never written, or torn).
    Empty,
}

impl Superblock {
    pub(crate) fn encode(&self, block: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(block);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        for v in [self.seq, self.lsn, self.tail, self.head, self.vlog_bytes] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.page_bytes.to_le_bytes());
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out.resize(block, 0);
        out
    }

    pub(crate) fn decode(buf: &[u8]) -> Slot {
        if buf.len() < 12 || &buf[..4] != MAGIC {
            return Slot::Empty;
        }
        let version = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
        let body = 4 + 4 + 8 * 5 + 4;
        if version != VERSION {
            return Slot::OtherVersion(version);
        }
        if buf.len() < body + 4 {
            return Slot::Empty;
        }
        let crc = u32::from_le_bytes(buf[body..body + 4].try_into().expect("4 bytes"));
        if crc != crc32c::crc32c(&buf[..body]) {
            return Slot::Empty;
        }
        let mut r = Reader(&buf[8..body]);
        let mut next = || r.u64().expect("within the body");
        let (seq, lsn, tail, head, vlog_bytes) = (next(), next(), next(), next(), next());
        Slot::Valid(Superblock {
            seq,
            lsn,
            tail,
            head,
            vlog_bytes,
            page_bytes: Reader(&buf[body - 4..body]).u32().expect("4 bytes"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_torn_copies_are_rejected() {
        let sb = Superblock {
            seq: 3,
            lsn: 99,
            tail: 4096,
            head: 1 << 30,
            vlog_bytes: 1 << 28,
            page_bytes: 4096,
        };
        let mut buf = sb.encode(4096);
        assert_eq!(Superblock::decode(&buf), Slot::Valid(sb));
        buf[20] ^= 0xff;
        assert_eq!(Superblock::decode(&buf), Slot::Empty);
        assert_eq!(Superblock::decode(&[0; 4096]), Slot::Empty);
        let mut old = sb.encode(4096);
        old[4..8].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(Superblock::decode(&old), Slot::OtherVersion(1));
    }
}
