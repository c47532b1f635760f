//! Records: how one payload is laid out in the log, and how a scan checks
//! one.
//!
//! ```text
//!  0       4       8               16              24                24+len  (8-aligned)
//!  +-------+-------+---------------+---------------+-----------------+-----+
//!  | len   | crc   | lsn           | epoch         | payload (len B) | 0.. |
//!  +-------+-------+---------------+---------------+-----------------+-----+
//!  little endian; crc = crc32c(log_id ‖ payload ‖ len ‖ lsn ‖ epoch)
//! ```
//!
//! The checksum covers the log's id (kept in the header, not in the record),
//! so a record written by an earlier log in the same region never checks.
//! Its payload part is computed before the log's lock is taken
//! ([`Draft`]); only the 20 header bytes are added under it.

use super::Lsn;

/// Bytes before the payload.
pub const RECORD_HEADER_BYTES: u64 = 24;
/// Every record starts and ends on a multiple of this.
pub const RECORD_ALIGN: u64 = 8;

const _: () = assert!(RECORD_HEADER_BYTES % RECORD_ALIGN == 0);
const _: () = assert!(RECORD_ALIGN.is_power_of_two());

/// `n` rounded up to a multiple of `to` (a power of two or any positive
/// number).
pub(crate) fn align_up(n: u64, to: u64) -> u64 {
    assert!(to > 0);
    n.div_ceil(to) * to
}

/// Bytes a record with a `payload_len`-byte payload takes in the log.
pub(crate) fn encoded_len(payload_len: u64) -> u64 {
    align_up(RECORD_HEADER_BYTES + payload_len, RECORD_ALIGN)
}

/// A record encoded except for its LSN and epoch.
pub(crate) struct Draft {
    bytes: Vec<u8>,
    payload_crc: u32,
}

impl Draft {
    /// Copies `payload` into a record buffer and checksums it.
    pub(crate) fn new(log_id: u64, payload: &[u8]) -> Draft {
        let len =
            u32::try_from(payload.len()).expect("payload length fits u32 (checked by append)");
        let size = encoded_len(u64::from(len)) as usize;
        let mut bytes = vec![0u8; size];
        bytes[0..4].copy_from_slice(&len.to_le_bytes());
        let end = RECORD_HEADER_BYTES as usize + payload.len();
        bytes[RECORD_HEADER_BYTES as usize..end].copy_from_slice(payload);
        let payload_crc = crc32c::crc32c_append(crc32c::crc32c(&log_id.to_le_bytes()), payload);
        Draft { bytes, payload_crc }
    }

    /// Bytes the record takes in the log.
    pub(crate) fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// Completes the record with its LSN and epoch.
    pub(crate) fn seal(mut self, lsn: Lsn, epoch: u64) -> Vec<u8> {
        assert!(lsn >= 1, "LSNs start at 1");
        self.bytes[8..16].copy_from_slice(&lsn.to_le_bytes());
        self.bytes[16..24].copy_from_slice(&epoch.to_le_bytes());
        let crc = finish_crc(self.payload_crc, &self.bytes);
        self.bytes[4..8].copy_from_slice(&crc.to_le_bytes());
        self.bytes
    }
}

/// Adds the header fields (len, lsn, epoch) of `record` to a payload crc.
fn finish_crc(payload_crc: u32, record: &[u8]) -> u32 {
    let crc = crc32c::crc32c_append(payload_crc, &record[0..4]);
    crc32c::crc32c_append(crc, &record[8..24])
}

/// A record's header as read from the log (not yet checked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecordHeader {
    pub(crate) len: u32,
    pub(crate) crc: u32,
    pub(crate) lsn: Lsn,
    pub(crate) epoch: u64,
}

impl RecordHeader {
    /// Parses the first [`RECORD_HEADER_BYTES`] of `b`.
    pub(crate) fn parse(b: &[u8]) -> RecordHeader {
        assert!(b.len() >= RECORD_HEADER_BYTES as usize);
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        RecordHeader {
            len: u32_at(0),
            crc: u32_at(4),
            lsn: u64_at(8),
            epoch: u64_at(16),
        }
    }

    /// Bytes the whole record takes in the log.
    pub(crate) fn encoded_len(&self) -> u64 {
        encoded_len(u64::from(self.len))
    }
}

/// Whether `record` (header and payload, at least `encoded_len` bytes) has
/// a checksum matching its contents under `log_id`.
pub(crate) fn verify(log_id: u64, record: &[u8]) -> bool {
    let h = RecordHeader::parse(record);
    let end = RECORD_HEADER_BYTES as usize + h.len as usize;
    assert!(record.len() >= end, "verify needs the whole record");
    let payload = &record[RECORD_HEADER_BYTES as usize..end];
    let payload_crc = crc32c::crc32c_append(crc32c::crc32c(&log_id.to_le_bytes()), payload);
    finish_crc(payload_crc, record) == h.crc
}

/// The payload of a whole record.
pub(crate) fn payload(record: &[u8]) -> &[u8] {
    let h = RecordHeader::parse(record);
    &record[RECORD_HEADER_BYTES as usize..RECORD_HEADER_BYTES as usize + h.len as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_record_round_trips_and_is_aligned() {
        for len in [0usize, 1, 7, 8, 9, 100, 4096] {
            let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let rec = Draft::new(42, &data).seal(9, 3);
            assert_eq!(rec.len() as u64, encoded_len(len as u64));
            assert_eq!(rec.len() as u64 % RECORD_ALIGN, 0);
            let h = RecordHeader::parse(&rec);
            assert_eq!((h.len as usize, h.lsn, h.epoch), (len, 9, 3));
            assert_eq!(h.encoded_len(), rec.len() as u64);
            assert!(verify(42, &rec));
            assert_eq!(payload(&rec), &data[..]);
            assert!(rec[RECORD_HEADER_BYTES as usize + len..]
                .iter()
                .all(|&b| b == 0));
        }
    }

    #[test]
    fn any_flipped_bit_or_another_log_id_fails_the_check() {
        let rec = Draft::new(7, b"hello, log").seal(5, 1);
        assert!(!verify(8, &rec), "another log's record");
        let checked = RECORD_HEADER_BYTES as usize + 10;
        for byte in (0..checked).filter(|i| !(4..8).contains(i)) {
            for bit in 0..8 {
                let mut bad = rec.clone();
                bad[byte] ^= 1 << bit;
                let h = RecordHeader::parse(&bad);
                if (h.len as usize) > bad.len() - RECORD_HEADER_BYTES as usize {
                    continue; // a longer length: the scan sees a cut-short record
                }
                assert!(
                    !verify(7, &bad),
                    "flip of bit {bit} in byte {byte} undetected"
                );
            }
        }
    }

    #[test]
    fn a_zeroed_header_is_lsn_zero_which_is_never_valid() {
        let h = RecordHeader::parse(&[0u8; 24]);
        assert_eq!(h.lsn, 0);
        assert_eq!(h.encoded_len(), RECORD_HEADER_BYTES);
    }
}
