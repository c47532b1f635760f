//! The metadata log's on-media formats: 32-byte records and the header.
//!
//! ```text
//!  record (32 bytes, little-endian, never straddles a sector):
//!   0      1..4   4..8   8..16        16..24   24..28     28..32
//!  +------+------+------+------------+--------+----------+-----------------------------+
//!  | kind | "nwc"| slot | block      | seq    | data crc | crc32c(epoch ‖ bytes 0..28) |
//!  +------+------+------+------------+--------+----------+-----------------------------+
//!   kind 1 = map:  slot holds version `seq` of backing block `block`, whose
//!                  data has checksum `data crc`
//!   kind 2 = free: the backing device durably holds block `block` at least
//!                  as new as version `seq`: every map record of that block
//!                  up to `seq` is dead
//!
//!  header slot (one sector at byte 0 or 4096 of the cache device):
//!  +----------+---------+-------+-------------+-------+----------------+----------------+-----+
//!  | CRITNVWC | version | epoch | block_bytes | slots | metadata_bytes | backing_blocks | crc |
//!  +----------+---------+-------+-------------+-------+----------------+----------------+-----+
//! ```
//!
//! The record checksum is keyed by the log's epoch, so records an earlier
//! epoch left in a half are never replayed. All zeros is never a valid
//! record (kind 0) or header (no magic).

use crate::device::AlignedBuf;

/// Bytes per record.
pub const RECORD_BYTES: usize = 32;

const RECORD_TAG: [u8; 3] = *b"nwc";
const KIND_MAP: u8 = 1;
const KIND_FREE: u8 = 2;

/// One metadata record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Record {
    /// `slot` holds version `seq` of backing block `block`; `crc` is the
    /// data's checksum, checked at recovery.
    Map {
        slot: u32,
        block: u64,
        seq: u64,
        crc: u32,
    },
    /// The backing device durably holds `block` at least as new as `seq`
    /// (written back from `slot`).
    Free { slot: u32, block: u64, seq: u64 },
}

fn checksum(epoch: u64, body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&epoch.to_le_bytes()), body)
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

impl Record {
    /// The record's sequence number.
    pub(crate) fn seq(&self) -> u64 {
        match *self {
            Record::Map { seq, .. } | Record::Free { seq, .. } => seq,
        }
    }

    /// Encodes the record for the log of `epoch` into `out` (32 bytes).
    pub(crate) fn encode(&self, epoch: u64, out: &mut [u8]) {
        assert_eq!(out.len(), RECORD_BYTES);
        let (kind, slot, block, seq, crc) = match *self {
            Record::Map {
                slot,
                block,
                seq,
                crc,
            } => (KIND_MAP, slot, block, seq, crc),
            Record::Free { slot, block, seq } => (KIND_FREE, slot, block, seq, 0),
        };
        out[0] = kind;
        out[1..4].copy_from_slice(&RECORD_TAG);
        out[4..8].copy_from_slice(&slot.to_le_bytes());
        out[8..16].copy_from_slice(&block.to_le_bytes());
        out[16..24].copy_from_slice(&seq.to_le_bytes());
        out[24..28].copy_from_slice(&crc.to_le_bytes());
        let sum = checksum(epoch, &out[..28]);
        out[28..32].copy_from_slice(&sum.to_le_bytes());
    }

    /// Decodes 32 bytes written in `epoch`: `None` unless valid.
    pub(crate) fn decode(b: &[u8], epoch: u64) -> Option<Record> {
        assert_eq!(b.len(), RECORD_BYTES);
        if b[1..4] != RECORD_TAG || checksum(epoch, &b[..28]) != u32_at(b, 28) {
            return None;
        }
        let (slot, block, seq) = (u32_at(b, 4), u64_at(b, 8), u64_at(b, 16));
        match b[0] {
            KIND_MAP => Some(Record::Map {
                slot,
                block,
                seq,
                crc: u32_at(b, 24),
            }),
            KIND_FREE => Some(Record::Free { slot, block, seq }),
            _ => None,
        }
    }
}

/// Encodes `records` packed into whole sectors of `sector` bytes (the last
/// one padded with zeros).
pub(crate) fn encode_records(records: &[Record], epoch: u64, sector: usize) -> AlignedBuf {
    assert!(!records.is_empty(), "an empty metadata write");
    let bytes = (records.len() * RECORD_BYTES).div_ceil(sector) * sector;
    let mut buf = AlignedBuf::zeroed(bytes);
    for (r, out) in records
        .iter()
        .zip(buf.as_mut_slice().chunks_exact_mut(RECORD_BYTES))
    {
        r.encode(epoch, out);
    }
    buf
}

/// Every valid record of `epoch` in `bytes` (a scanned log half).
pub(crate) fn decode_records(bytes: &[u8], epoch: u64) -> Vec<Record> {
    bytes
        .chunks_exact(RECORD_BYTES)
        .filter_map(|b| Record::decode(b, epoch))
        .collect()
}

/// The checksum a map record keeps of a block's data.
pub(crate) fn data_crc(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

const MAGIC: [u8; 8] = *b"CRITNVWC";
const FORMAT_VERSION: u32 = 1;
const HEADER_ENCODED: usize = 48;

/// What a cache device was formatted for; reopening with another geometry
/// is refused (its records would be misread).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub(crate) block_bytes: u32,
    pub(crate) slots: u32,
    pub(crate) metadata_bytes: u64,
    pub(crate) backing_blocks: u64,
}

/// One header slot: the log's current epoch (its half is `epoch % 2`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) epoch: u64,
    pub(crate) geometry: Geometry,
}

impl Header {
    /// The header as one sector of `sector` bytes.
    pub(crate) fn encode(&self, sector: usize) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(sector);
        let b = buf.as_mut_slice();
        let g = &self.geometry;
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[12..20].copy_from_slice(&self.epoch.to_le_bytes());
        b[20..24].copy_from_slice(&g.block_bytes.to_le_bytes());
        b[24..28].copy_from_slice(&g.slots.to_le_bytes());
        b[28..36].copy_from_slice(&g.metadata_bytes.to_le_bytes());
        b[36..44].copy_from_slice(&g.backing_blocks.to_le_bytes());
        let crc = crc32c::crc32c(&b[..HEADER_ENCODED - 4]);
        b[44..48].copy_from_slice(&crc.to_le_bytes());
        buf
    }

    /// Decodes a header slot: `Ok(None)` if it is blank (all zeros).
    pub(crate) fn decode(slot: &[u8]) -> Result<Option<Header>, String> {
        if slot.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        if slot[0..8] != MAGIC {
            return Err("no write-cache magic".into());
        }
        if crc32c::crc32c(&slot[..HEADER_ENCODED - 4]) != u32_at(slot, 44) {
            return Err("header checksum mismatch".into());
        }
        let version = u32_at(slot, 8);
        if version != FORMAT_VERSION {
            return Err(format!(
                "format version {version}; this build reads version {FORMAT_VERSION}"
            ));
        }
        Ok(Some(Header {
            epoch: u64_at(slot, 12),
            geometry: Geometry {
                block_bytes: u32_at(slot, 20),
                slots: u32_at(slot, 24),
                metadata_bytes: u64_at(slot, 28),
                backing_blocks: u64_at(slot, 36),
            },
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_only_in_their_epoch() {
        let recs = [
            Record::Map {
                slot: 3,
                block: 1 << 40,
                seq: 99,
                crc: 0xdead_beef,
            },
            Record::Free {
                slot: 3,
                block: 7,
                seq: 100,
            },
        ];
        let buf = encode_records(&recs, 5, 512);
        assert_eq!(buf.len(), 512);
        assert_eq!(decode_records(buf.as_slice(), 5), recs);
        assert!(
            decode_records(buf.as_slice(), 6).is_empty(),
            "another epoch"
        );
        assert!(
            decode_records(&[0u8; 512], 0).is_empty(),
            "zeros are no record"
        );
        let mut torn = buf.as_slice().to_vec();
        torn[9] ^= 1;
        assert_eq!(
            decode_records(&torn, 5),
            recs[1..],
            "a damaged record is dropped"
        );
        assert_eq!(recs[0].seq(), 99);
    }

    #[test]
    fn records_pack_into_whole_sectors() {
        let recs: Vec<Record> = (0..17)
            .map(|i| Record::Free {
                slot: i,
                block: u64::from(i),
                seq: u64::from(i),
            })
            .collect();
        assert_eq!(encode_records(&recs, 1, 512).len(), 1024);
        assert_eq!(encode_records(&recs[..16], 1, 512).len(), 512);
        assert_eq!(encode_records(&recs, 1, 4096).len(), 4096);
    }

    #[test]
    fn headers_round_trip_and_reject_damage() {
        let h = Header {
            epoch: 12,
            geometry: Geometry {
                block_bytes: 4096,
                slots: 64,
                metadata_bytes: 1 << 21,
                backing_blocks: 1000,
            },
        };
        let buf = h.encode(512);
        assert_eq!(Header::decode(buf.as_slice()), Ok(Some(h)));
        assert_eq!(Header::decode(&[0u8; 512]), Ok(None));
        let mut bad = buf.as_slice().to_vec();
        bad[13] ^= 1;
        assert!(Header::decode(&bad).unwrap_err().contains("checksum"));
        bad[0] = b'X';
        assert!(Header::decode(&bad).unwrap_err().contains("magic"));
    }
}
