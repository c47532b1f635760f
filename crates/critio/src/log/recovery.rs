//! Recovery: scan the ring from the head, return the records in order, and
//! say how the log ended (sans-I/O: the scan reads through a closure).
//!
//! From the head, the scan accepts the record with the next expected LSN
//! at the first of these places that holds one (valid checksum, the
//! expected LSN, an epoch the header allows):
//!
//! ```text
//!   1. right after the previous record            (records of one batch are packed)
//!   2. the next block boundary                    (a batch ends in zero padding, or
//!                                                  appending resumed there after a crash)
//!   3. the start of the next lap                  (the batch did not fit before the end)
//! ```
//!
//! and stops when none does. Then it classifies the end ([`Tail`]): a record
//! with the expected LSN but a bad checksum or cut short by the ring's end
//! is torn; any valid record with a *higher* LSN further on (searched at
//! every 8-byte position to the end of the live lap) means the bad record
//! is corruption, not a torn tail, and those later records would be lost.
//! Requiring the exact next LSN is what makes older laps, zero padding and
//! records of earlier incarnations (the epoch rule, see `header.rs`) a clean
//! end instead of garbage to replay.
//!
//! Recovery reads the whole ring once (in 1 MiB reads), and keeps every
//! live record in memory: at most the region's size.

use super::header::Header;
use super::record::{payload, verify, RecordHeader, RECORD_ALIGN, RECORD_HEADER_BYTES};
use super::ring::Geometry;
use super::{Lsn, RECORD_BYTES_LIMIT};

/// How the log ended, as recovery found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tail {
    /// After the last valid record: zeros, padding, or an older lap.
    Clean,
    /// The next record was being written when the log stopped: its checksum
    /// fails or it is cut short, and nothing valid follows. It was never
    /// acknowledged (a commit returns only after its batch is flushed), so
    /// nothing acknowledged is lost; appending resumes over it.
    Torn {
        /// The torn record's device offset.
        offset: u64,
        /// The LSN it would have had.
        lsn: Lsn,
    },
    /// A bad record followed by `later_records` valid ones: the media
    /// changed under an acknowledged record, and resuming drops the later
    /// ones. [`Log::open`](super::Log::open) refuses this unless
    /// `log.allow_corrupt_truncate` is set; the caller should report it
    /// loudly either way (see [`LogError::Corrupt`](super::LogError::Corrupt)).
    Corrupt {
        /// The bad record's device offset (where the next record should
        /// have started, if its header is unreadable too).
        offset: u64,
        /// The LSN expected there.
        lsn: Lsn,
        /// Valid records found after it (lost by resuming).
        later_records: u64,
    },
}

/// What recovery found: the live records, in LSN order, and how the log
/// ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Recovery {
    /// Every live record (LSN >= `head_lsn`), in order, consecutive LSNs.
    pub records: Vec<(Lsn, Vec<u8>)>,
    /// How the log ended.
    pub tail: Tail,
    /// The first live LSN (records before it were truncated).
    pub head_lsn: Lsn,
    /// The LSN the next append gets.
    pub next_lsn: Lsn,
    /// The region was blank and has been formatted (no records).
    pub formatted: bool,
}

/// What a scan found, with what the ring needs to resume.
#[derive(Debug)]
pub(crate) struct Scan {
    pub(crate) records: Vec<(Lsn, Vec<u8>)>,
    pub(crate) tail: Tail,
    pub(crate) next_lsn: Lsn,
    /// Virtual position of the head record (lap 0).
    pub(crate) head_v: u64,
    /// Where appending resumes: the block after the last valid record.
    pub(crate) resume_v: u64,
    /// `(lsn, v)` of records that start a block, ascending.
    pub(crate) marks: Vec<(Lsn, u64)>,
}

/// Bytes read at once.
const READ_CHUNK: u64 = 1 << 20;

/// Reads the ring through `read(ring offset, len)`, one window at a time.
struct Reader<'a, E> {
    geo: Geometry,
    read: &'a mut dyn FnMut(u64, usize) -> Result<Vec<u8>, E>,
    start: u64,
    bytes: Vec<u8>,
}

impl<E> Reader<'_, E> {
    /// Bytes `[v, v + len)`, which must lie within one lap.
    fn get(&mut self, v: u64, len: u64) -> Result<&[u8], E> {
        let lap_end = self.geo.lap_end(v);
        assert!(v + len <= lap_end, "a read never crosses the ring's end");
        let cached = v >= self.start && v + len <= self.start + self.bytes.len() as u64;
        if !cached {
            let start = self.geo.align_down(v);
            let need = self.geo.align_up(v + len) - start;
            let n = need.max(READ_CHUNK).min(lap_end - start);
            self.bytes = (self.read)(self.geo.phys(start), n as usize)?;
            assert_eq!(self.bytes.len() as u64, n, "short read from the log");
            self.start = start;
        }
        let at = (v - self.start) as usize;
        Ok(&self.bytes[at..at + len as usize])
    }
}

/// What is at a position.
enum Probe {
    /// A whole record with a wanted LSN and a matching checksum.
    Valid { lsn: Lsn, size: u64 },
    /// A wanted LSN and an allowed epoch, but a bad checksum or cut short.
    Plausible,
    /// Anything else (zeros, another LSN, an older incarnation, garbage).
    Stale,
}

struct Scanner<'a, E> {
    r: Reader<'a, E>,
    hdr: Header,
    /// No record of the live lap reaches past this.
    limit: u64,
}

impl<E> Scanner<'_, E> {
    fn probe(&mut self, v: u64, lsns: std::ops::RangeInclusive<Lsn>) -> Result<Probe, E> {
        let end = self.r.geo.lap_end(v).min(self.limit);
        if v + RECORD_HEADER_BYTES > end {
            return Ok(Probe::Stale);
        }
        let h = RecordHeader::parse(self.r.get(v, RECORD_HEADER_BYTES)?);
        let sane = u64::from(h.len) <= RECORD_BYTES_LIMIT;
        if !lsns.contains(&h.lsn) || !self.hdr.epoch_ok(h.lsn, h.epoch) || !sane {
            return Ok(Probe::Stale);
        }
        let size = h.encoded_len();
        if v + size > end {
            return Ok(Probe::Plausible);
        }
        let log_id = self.hdr.log_id;
        Ok(match verify(log_id, self.r.get(v, size)?) {
            true => Probe::Valid { lsn: h.lsn, size },
            false => Probe::Plausible,
        })
    }

    /// Where the record after one ending at `pos` may start (see the module
    /// docs), ascending, within the live lap.
    fn candidates(&self, pos: u64) -> Vec<u64> {
        let geo = &self.r.geo;
        let mut c = vec![pos, geo.align_up(pos), geo.lap_end(pos)];
        c.dedup();
        c.retain(|&v| v < self.limit);
        c
    }

    /// The first candidate after `pos` holding `lsn`, and its size.
    fn next_record(&mut self, pos: u64, lsn: Lsn) -> Result<Option<(u64, u64)>, E> {
        for c in self.candidates(pos) {
            if let Probe::Valid { size, .. } = self.probe(c, lsn..=lsn)? {
                return Ok(Some((c, size)));
            }
        }
        Ok(None)
    }

    /// The first candidate after `pos` that looks like a torn `lsn`.
    fn torn_record(&mut self, pos: u64, lsn: Lsn) -> Result<Option<u64>, E> {
        for c in self.candidates(pos) {
            if let Probe::Plausible = self.probe(c, lsn..=lsn)? {
                return Ok(Some(c));
            }
        }
        Ok(None)
    }

    /// Valid records with LSNs above `lsn` from `from` to the end of the
    /// live lap, searched at every record alignment.
    fn count_later(&mut self, from: u64, lsn: Lsn) -> Result<u64, E> {
        let geo = self.r.geo;
        let lsn_max = lsn.saturating_add(geo.data_len / RECORD_HEADER_BYTES);
        let (mut v, mut min, mut found) = (from, lsn + 1, 0);
        while v < self.limit {
            if v + RECORD_HEADER_BYTES > geo.lap_end(v).min(self.limit) {
                v = geo.lap_end(v);
                continue;
            }
            match self.probe(v, min..=lsn_max)? {
                Probe::Valid { lsn, size } => {
                    found += 1;
                    min = lsn + 1;
                    v += size;
                }
                _ => v += RECORD_ALIGN,
            }
        }
        Ok(found)
    }
}

/// Scans the ring described by `hdr` (see the module docs). `read(offset,
/// len)` reads `len` bytes at `offset` within the ring.
pub(crate) fn scan<E>(
    geo: Geometry,
    hdr: &Header,
    read: &mut dyn FnMut(u64, usize) -> Result<Vec<u8>, E>,
) -> Result<Scan, E> {
    assert!(hdr.head_pos < geo.data_len && hdr.head_pos % RECORD_ALIGN == 0);
    let head_v = hdr.head_pos;
    let mut s = Scanner {
        r: Reader {
            geo,
            read,
            start: 0,
            bytes: Vec::new(),
        },
        hdr: *hdr,
        limit: geo.align_down(head_v) + geo.data_len,
    };
    let records_max = geo.data_len / RECORD_HEADER_BYTES;
    let (mut pos, mut lsn) = (head_v, hdr.head_pos_lsn);
    let (mut records, mut marks) = (Vec::new(), Vec::new());
    while let Some((at, size)) = s.next_record(pos, lsn)? {
        if at % geo.block == 0 && at > head_v {
            marks.push((lsn, at));
        }
        if lsn >= hdr.head_lsn {
            records.push((lsn, payload(s.r.get(at, size)?).to_vec()));
        }
        pos = at + size;
        lsn += 1;
        assert!(
            lsn - hdr.head_pos_lsn <= records_max,
            "more records than fit"
        );
    }
    let torn = s.torn_record(pos, lsn)?;
    let later_records = s.count_later(pos, lsn)?;
    let tail = match (torn, later_records) {
        (at, 1..) => Tail::Corrupt {
            offset: geo.device_offset(at.unwrap_or(pos)),
            lsn,
            later_records,
        },
        (Some(at), 0) => Tail::Torn {
            offset: geo.device_offset(at),
            lsn,
        },
        (None, 0) => Tail::Clean,
    };
    Ok(Scan {
        records,
        tail,
        next_lsn: lsn.max(hdr.head_lsn),
        head_v,
        resume_v: geo.align_up(pos),
        marks,
    })
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use super::super::record::Draft;
    use super::*;

    const B: u64 = 4096;
    const ID: u64 = 0xabc;

    /// A ring image in memory, written the way the writer writes.
    struct Img {
        geo: Geometry,
        data: Vec<u8>,
        hdr: Header,
        write_v: u64,
    }

    impl Img {
        fn new(ring_blocks: u64) -> Img {
            let geo = Geometry::new(0, (ring_blocks + 1) * B, B);
            Img {
                geo,
                data: vec![0; geo.data_len as usize],
                hdr: Header::fresh(ID, B as u32, (ring_blocks + 1) * B),
                write_v: 0,
            }
        }

        /// Writes records `lsns` (payload = `len` bytes of the LSN) as one
        /// batch; returns the batch's start.
        fn batch(&mut self, lsns: std::ops::RangeInclusive<Lsn>, len: usize) -> u64 {
            let mut bytes = Vec::new();
            for lsn in lsns {
                bytes.extend(Draft::new(ID, &vec![lsn as u8; len]).seal(lsn, self.hdr.epoch));
            }
            let padded = self.geo.align_up(bytes.len() as u64);
            bytes.resize(padded as usize, 0);
            let mut start = self.write_v;
            if start + padded > self.geo.lap_end(start) {
                start = self.geo.lap_end(start);
            }
            let at = self.geo.phys(start) as usize;
            self.data[at..at + bytes.len()].copy_from_slice(&bytes);
            self.write_v = start + padded;
            start
        }

        fn scan(&self) -> Scan {
            let data = &self.data;
            let mut read = |off: u64, len: usize| -> Result<Vec<u8>, Infallible> {
                Ok(data[off as usize..off as usize + len].to_vec())
            };
            scan(self.geo, &self.hdr, &mut read).unwrap()
        }

        /// Reopens as `open` does: the next incarnation resumes where the
        /// scan says.
        fn reopen(&mut self) -> Scan {
            let s = self.scan();
            self.hdr.epoch += 1;
            self.hdr.resume_lsn = s.next_lsn;
            self.write_v = s.resume_v;
            s
        }
    }

    fn lsns(s: &Scan) -> Vec<Lsn> {
        s.records.iter().map(|r| r.0).collect()
    }

    #[test]
    fn a_clean_log_recovers_every_record_and_resumes_after_the_last() {
        let mut img = Img::new(16);
        img.batch(1..=3, 100);
        img.batch(4..=4, 5000);
        img.batch(5..=9, 10);
        let s = img.scan();
        assert_eq!(lsns(&s), (1..=9).collect::<Vec<_>>());
        assert_eq!(s.records[3].1, vec![4u8; 5000]);
        assert_eq!(s.tail, Tail::Clean);
        assert_eq!(s.next_lsn, 10);
        assert_eq!(s.resume_v, img.write_v);
        assert_eq!(s.marks, vec![(4, B), (5, 3 * B)]);
    }

    #[test]
    fn an_empty_ring_is_clean_and_resumes_at_the_head() {
        let s = Img::new(4).scan();
        assert!(s.records.is_empty());
        assert_eq!((s.tail, s.next_lsn, s.resume_v), (Tail::Clean, 1, 0));
    }

    #[test]
    fn a_torn_last_record_is_a_torn_tail_and_nothing_after_it_is_replayed() {
        let mut img = Img::new(16);
        img.batch(1..=2, 100);
        let at = img.batch(3..=5, 1000);
        // Tear record 4: keep its header, lose the end of its payload.
        let rec4 = at + RECORD_HEADER_BYTES + 1000;
        // A prefix of the batch's sectors reached the media: from the middle
        // of record 4 on, the block holds what it held before (zeros).
        img.data[(rec4 + 500) as usize..(at + B) as usize].fill(0);
        let s = img.scan();
        assert_eq!(lsns(&s), vec![1, 2, 3]);
        assert_eq!(
            s.tail,
            Tail::Torn {
                offset: B + rec4,
                lsn: 4
            }
        );
        assert_eq!(s.resume_v, at + B, "the block after record 3");
    }

    #[test]
    fn a_bad_record_followed_by_valid_ones_is_corruption() {
        let mut img = Img::new(16);
        img.batch(1..=2, 100);
        let at = img.batch(3..=3, 100);
        img.batch(4..=6, 100);
        img.batch(7..=7, 100);
        img.data[(at + 30) as usize] ^= 0x40;
        let s = img.scan();
        assert_eq!(lsns(&s), vec![1, 2]);
        assert_eq!(
            s.tail,
            Tail::Corrupt {
                offset: B + at,
                lsn: 3,
                later_records: 4
            }
        );
        // A corrupt header (its LSN) is found the same way.
        let mut img2 = Img::new(16);
        img2.batch(1..=2, 100);
        let at = img2.batch(3..=3, 100);
        img2.batch(4..=4, 100);
        img2.data[(at + 8) as usize] ^= 1;
        let s = img2.scan();
        assert_eq!(lsns(&s), vec![1, 2]);
        assert!(
            matches!(
                s.tail,
                Tail::Corrupt {
                    lsn: 3,
                    later_records: 1,
                    ..
                }
            ),
            "{:?}",
            s.tail
        );
    }

    #[test]
    fn records_wrap_around_the_ring_and_older_laps_end_it_cleanly() {
        let mut img = Img::new(8);
        for i in 0..6 {
            img.batch(1 + 2 * i..=2 + 2 * i, 1000);
        }
        // Truncate to record 9 (the fifth batch, block 4) and keep going.
        img.hdr.head_pos = 4 * B;
        img.hdr.head_pos_lsn = 9;
        img.hdr.head_lsn = 10;
        let wrapped = img.batch(13..=14, 3000); // 2 blocks: fits at 6..8
        img.batch(15..=16, 3000); // wraps to lap 1, block 0
        assert_eq!(wrapped, 6 * B);
        let s = img.scan();
        assert_eq!(lsns(&s), (10..=16).collect::<Vec<_>>());
        assert_eq!(
            s.records[0].1,
            vec![10u8; 1000],
            "record 9 is checked, not returned"
        );
        assert_eq!(s.tail, Tail::Clean, "block 2 of lap 0 holds records 5-6");
        assert_eq!(s.resume_v, 8 * B + 2 * B);
    }

    #[test]
    fn a_batch_that_skips_the_end_of_the_ring_is_found_at_the_start() {
        let mut img = Img::new(8);
        img.batch(1..=1, 5000); // blocks 0-1
        img.batch(2..=2, 5000); // 2-3
        img.batch(3..=3, 5000); // 4-5
        img.hdr.head_pos = 2 * B;
        img.hdr.head_pos_lsn = 2;
        img.hdr.head_lsn = 2;
        img.batch(4..=4, 100); // block 6
        let at = img.batch(5..=5, 5000); // does not fit in block 7: lap 1
        assert_eq!(at, 8 * B);
        let s = img.scan();
        assert_eq!(lsns(&s), vec![2, 3, 4, 5]);
        assert_eq!(s.tail, Tail::Clean);
    }

    #[test]
    fn after_a_torn_tail_the_next_incarnation_resumes_and_no_stale_record_returns() {
        let mut img = Img::new(16);
        img.batch(1..=2, 100);
        let at = img.batch(3..=5, 3000); // 3 blocks
                                         // A non-prefix tear: record 3 is damaged, 4 and 5 reached the media.
        img.data[(at + 50) as usize] ^= 1;
        let s = img.reopen();
        assert!(matches!(
            s.tail,
            Tail::Corrupt {
                lsn: 3,
                later_records: 2,
                ..
            }
        ));
        // The caller allowed truncation; the next incarnation reuses LSN 3.
        img.batch(3..=3, 10);
        let s = img.reopen();
        assert_eq!(lsns(&s), vec![1, 2, 3]);
        assert_eq!(s.records[2].1, vec![3u8; 10]);
        assert_eq!(s.tail, Tail::Clean, "the old record 5 is of an older epoch");
        // And even with nothing appended in between, they stay dead.
        let s = img.reopen();
        assert_eq!((lsns(&s), s.tail), (vec![1, 2, 3], Tail::Clean));
    }

    #[test]
    fn a_resumed_log_skips_the_torn_bytes_before_the_next_block() {
        let mut img = Img::new(16);
        let at = img.batch(1..=3, 100);
        // Tear record 3 (mid-block, right after record 2).
        let rec3 = at + 2 * (RECORD_HEADER_BYTES + 104);
        img.data[(rec3 + 40) as usize] ^= 1;
        let s = img.reopen();
        assert!(matches!(s.tail, Tail::Torn { lsn: 3, .. }));
        assert_eq!(s.resume_v, B);
        img.batch(3..=4, 100);
        let s = img.reopen();
        assert_eq!(lsns(&s), vec![1, 2, 3, 4]);
        assert_eq!(
            s.tail,
            Tail::Clean,
            "the torn record 3 of the older epoch is stale"
        );
    }

    #[test]
    fn records_of_another_log_in_the_region_are_not_replayed() {
        let mut img = Img::new(8);
        img.batch(1..=3, 100);
        img.hdr.log_id = ID + 1; // formatted again over the old records
        let s = img.scan();
        assert!(s.records.is_empty());
        // The old record 1 looks like a torn first record; never corruption.
        assert!(matches!(s.tail, Tail::Clean | Tail::Torn { lsn: 1, .. }));
    }
}
