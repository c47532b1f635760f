//! The superblock: which checkpoint is current. Two slots, written
//! alternately, each checksummed; the valid one with the higher sequence
//! wins, so a torn superblock write falls back to the previous checkpoint
//! (whose pages and log records are still there: nothing is freed or
//! truncated until the new superblock is durable).
//!
//! ```text
//!  | "CKVS" | version u32 | seq u64 | checkpoint lsn u64 | meta page u64 | meta len u64 |
//!  | meta crc u32 | buckets u32 | page bytes u32 | data pages u64 | crc32c of the above |
//! ```

use super::entry::Reader;

const MAGIC: &[u8; 4] = b"CKVS";
const VERSION: u32 = 1;

/// A checkpoint's description.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Superblock {
    pub(crate) seq: u64,
    /// Every log record at or below this LSN is reflected in the checkpoint.
    pub(crate) lsn: u64,
    /// The directory and live bitmap, as one extent of the data region.
    pub(crate) meta_page: u64,
    pub(crate) meta_len: u64,
    pub(crate) meta_crc: u32,
    pub(crate) buckets: u32,
    pub(crate) page_bytes: u32,
    pub(crate) data_pages: u64,
}

impl Superblock {
    pub(crate) fn encode(&self, block: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(block);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        for v in [self.seq, self.lsn, self.meta_page, self.meta_len] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.meta_crc.to_le_bytes());
        out.extend_from_slice(&self.buckets.to_le_bytes());
        out.extend_from_slice(&self.page_bytes.to_le_bytes());
        out.extend_from_slice(&self.data_pages.to_le_bytes());
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out.resize(block, 0);
        out
    }

    pub(crate) fn decode(buf: &[u8]) -> Option<Superblock> {
        let body = 4 + 4 + 8 * 4 + 4 * 3 + 8;
        if buf.len() < body + 4 || &buf[..4] != MAGIC {
            return None;
        }
        let crc = u32::from_le_bytes(buf[body..body + 4].try_into().ok()?);
        if crc != crc32c::crc32c(&buf[..body]) {
            return None;
        }
        let mut r = Reader(&buf[4..body]);
        if r.u32()? != VERSION {
            return None;
        }
        Some(Superblock {
            seq: r.u64()?,
            lsn: r.u64()?,
            meta_page: r.u64()?,
            meta_len: r.u64()?,
            meta_crc: r.u32()?,
            buckets: r.u32()?,
            page_bytes: r.u32()?,
            data_pages: r.u64()?,
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
            meta_page: 10,
            meta_len: 5000,
            meta_crc: 7,
            buckets: 1024,
            page_bytes: 4096,
            data_pages: 1 << 20,
        };
        let mut buf = sb.encode(4096);
        assert_eq!(Superblock::decode(&buf), Some(sb));
        buf[20] ^= 0xff;
        assert_eq!(Superblock::decode(&buf), None);
        assert_eq!(Superblock::decode(&[0; 4096]), None);
    }
}
