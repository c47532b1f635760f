//! The header block: where the log starts, and which incarnation wrote it.
//!
//! ```text
//!  block 0 of the region
//!  +---------------------+---------------------+------------------------+
//!  | slot 0 (bytes 0..)  | slot 1 (bytes 512..)| zeros                  |
//!  +---------------------+---------------------+------------------------+
//!  slot: magic "CRITIOWL" | version | block_bytes | region_bytes | seq | log_id
//!        | head_pos | head_pos_lsn | head_lsn | epoch | resume_lsn | crc32c
//! ```
//!
//! Header number `seq` goes to slot `seq % 2`; the whole block is written
//! with the other slot byte-identical, so a torn write (any prefix of the
//! device's sectors) leaves at least one valid slot, and the valid slot with
//! the highest `seq` wins. Each slot fits one 512-byte sector.
//!
//! | field          | meaning                                                   |
//! |----------------|-----------------------------------------------------------|
//! | `head_pos`     | byte offset in the data area of the record the scan starts at |
//! | `head_pos_lsn` | that record's LSN                                         |
//! | `head_lsn`     | the first live LSN (records before it are truncated; the scan checks but does not return them) |
//! | `epoch`        | counts opens; records of LSN >= `resume_lsn` carry this epoch, older ones a smaller one |
//! | `resume_lsn`   | the first LSN this incarnation appended                   |
//!
//! A block of zeros is a blank region, which `open` formats.

use super::Lsn;

/// Bytes per slot (one sector).
pub(crate) const SLOT_BYTES: usize = 512;
/// Slots in the header block.
pub(crate) const SLOTS: usize = 2;
/// The on-disk format this build reads and writes.
pub(crate) const FORMAT_VERSION: u32 = 1;

const MAGIC: [u8; 8] = *b"CRITIOWL";
const ENCODED: usize = 8 + 4 + 4 + 8 * 8 + 4;

const _: () = assert!(ENCODED <= SLOT_BYTES);
const _: () = assert!(SLOT_BYTES * SLOTS <= 4096);

/// One header, as in a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    /// Which update this is; the valid slot with the highest wins.
    pub(crate) seq: u64,
    /// A random id, covered by every record's checksum.
    pub(crate) log_id: u64,
    pub(crate) block_bytes: u32,
    pub(crate) region_bytes: u64,
    pub(crate) head_pos: u64,
    pub(crate) head_pos_lsn: Lsn,
    pub(crate) head_lsn: Lsn,
    pub(crate) epoch: u64,
    pub(crate) resume_lsn: Lsn,
}

/// What the header block holds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// All zeros: a region never formatted.
    Blank,
    /// The newest valid slot.
    Valid(Header),
    /// Neither zeros nor a valid slot, and why.
    Invalid(String),
}

impl Header {
    /// The header of a freshly formatted log.
    pub(crate) fn fresh(log_id: u64, block_bytes: u32, region_bytes: u64) -> Header {
        Header {
            seq: 1,
            log_id,
            block_bytes,
            region_bytes,
            head_pos: 0,
            head_pos_lsn: 1,
            head_lsn: 1,
            epoch: 1,
            resume_lsn: 1,
        }
    }

    /// Whether a record of `lsn` may carry `epoch` (see the module docs):
    /// records of this incarnation carry its epoch, older ones a smaller one.
    pub(crate) fn epoch_ok(&self, lsn: Lsn, epoch: u64) -> bool {
        if lsn >= self.resume_lsn {
            epoch == self.epoch
        } else {
            epoch < self.epoch
        }
    }

    fn encode(&self) -> [u8; ENCODED] {
        let mut b = [0u8; ENCODED];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.block_bytes.to_le_bytes());
        let words = [
            self.region_bytes,
            self.seq,
            self.log_id,
            self.head_pos,
            self.head_pos_lsn,
            self.head_lsn,
            self.epoch,
            self.resume_lsn,
        ];
        for (i, w) in words.iter().enumerate() {
            b[16 + 8 * i..24 + 8 * i].copy_from_slice(&w.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b[..ENCODED - 4]);
        b[ENCODED - 4..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes a slot: `Ok(None)` if it is all zeros.
    fn decode(slot: &[u8]) -> Result<Option<Header>, String> {
        if slot.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        if slot[0..8] != MAGIC {
            return Err("no log magic".into());
        }
        let u32_at = |i: usize| u32::from_le_bytes(slot[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(slot[i..i + 8].try_into().expect("8 bytes"));
        let crc = crc32c::crc32c(&slot[..ENCODED - 4]);
        if crc != u32_at(ENCODED - 4) {
            return Err("header checksum mismatch".into());
        }
        let version = u32_at(8);
        if version != FORMAT_VERSION {
            return Err(format!(
                "format version {version}; this build reads version {FORMAT_VERSION}"
            ));
        }
        Ok(Some(Header {
            block_bytes: u32_at(12),
            region_bytes: u64_at(16),
            seq: u64_at(24),
            log_id: u64_at(32),
            head_pos: u64_at(40),
            head_pos_lsn: u64_at(48),
            head_lsn: u64_at(56),
            epoch: u64_at(64),
            resume_lsn: u64_at(72),
        }))
    }

    /// Reads the header block.
    pub(crate) fn read(block: &[u8]) -> Found {
        assert!(block.len() >= SLOT_BYTES * SLOTS);
        if block.iter().all(|&b| b == 0) {
            return Found::Blank;
        }
        let mut best: Option<Header> = None;
        let mut why = Vec::new();
        for i in 0..SLOTS {
            match Header::decode(&block[i * SLOT_BYTES..(i + 1) * SLOT_BYTES]) {
                Ok(Some(h)) if best.is_none_or(|b| h.seq > b.seq) => best = Some(h),
                Ok(_) => {}
                Err(e) => why.push(format!("slot {i}: {e}")),
            }
        }
        match best {
            Some(h) => Found::Valid(h),
            None if why.is_empty() => Found::Invalid("both slots are empty".into()),
            None => Found::Invalid(why.join("; ")),
        }
    }

    /// Puts this header into its slot of `image` (the header block as on
    /// disk), leaving the other slot as it is.
    pub(crate) fn write_into(&self, image: &mut [u8]) {
        assert!(image.len() >= SLOT_BYTES * SLOTS);
        assert!(self.seq >= 1, "header sequence numbers start at 1");
        let at = (self.seq % SLOTS as u64) as usize * SLOT_BYTES;
        image[at..at + ENCODED].copy_from_slice(&self.encode());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(seq: u64) -> Header {
        Header {
            seq,
            head_pos: 8192 + seq,
            ..Header::fresh(0xfeed, 4096, 1 << 20)
        }
    }

    #[test]
    fn blank_block_then_newest_slot_wins() {
        let mut image = vec![0u8; 4096];
        assert_eq!(Header::read(&image), Found::Blank);
        sample(1).write_into(&mut image);
        assert_eq!(Header::read(&image), Found::Valid(sample(1)));
        sample(2).write_into(&mut image);
        assert_eq!(Header::read(&image), Found::Valid(sample(2)));
        sample(3).write_into(&mut image);
        assert_eq!(Header::read(&image), Found::Valid(sample(3)));
    }

    #[test]
    fn a_torn_update_falls_back_to_the_other_slot() {
        let mut image = vec![0u8; 4096];
        sample(1).write_into(&mut image);
        sample(2).write_into(&mut image);
        let mut torn = image.clone();
        sample(3).write_into(&mut torn); // slot 1
                                         // Keep only the first 40 bytes of slot 1's new contents.
        let mut media = image.clone();
        media[SLOT_BYTES..SLOT_BYTES + 40].copy_from_slice(&torn[SLOT_BYTES..SLOT_BYTES + 40]);
        assert_eq!(Header::read(&media), Found::Valid(sample(2)));
    }

    #[test]
    fn garbage_and_other_versions_are_invalid_with_a_reason() {
        let mut image = vec![0u8; 4096];
        image[100] = 1;
        assert!(matches!(Header::read(&image), Found::Invalid(w) if w.contains("magic")));
        let mut enc = sample(1).encode();
        enc[8] = 2; // version 2, with a valid checksum
        let crc = crc32c::crc32c(&enc[..ENCODED - 4]);
        enc[ENCODED - 4..].copy_from_slice(&crc.to_le_bytes());
        let mut image = vec![0u8; 4096];
        image[..ENCODED].copy_from_slice(&enc);
        let found = Header::read(&image);
        assert!(
            matches!(&found, Found::Invalid(w) if w.contains("version 2")),
            "{found:?}"
        );
        image[..ENCODED].copy_from_slice(&sample(1).encode());
        image[20] ^= 1;
        let found = Header::read(&image);
        assert!(
            matches!(&found, Found::Invalid(w) if w.contains("checksum")),
            "{found:?}"
        );
    }

    #[test]
    fn epochs_separate_incarnations() {
        let h = Header {
            epoch: 3,
            resume_lsn: 10,
            ..sample(1)
        };
        assert!(h.epoch_ok(9, 2));
        assert!(
            !h.epoch_ok(9, 3),
            "a record before resume_lsn is from an earlier open"
        );
        assert!(h.epoch_ok(10, 3));
        assert!(!h.epoch_ok(11, 2), "a stale record whose LSN was reused");
    }
}
