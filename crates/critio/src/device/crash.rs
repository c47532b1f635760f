//! Power-cut bookkeeping shared by `sim` and `faulty`: which completed writes
//! are not yet durable, and what the media holds after the power goes.
//!
//! A drive with a volatile write cache acknowledges a write before it is on
//! the media; only a completed flush makes it durable. A flush covers at
//! least every write that *completed before the flush was submitted* (the
//! NVMe and ATA rule): `faulty` covers exactly those, `sim` every write
//! completed by the time the flush completes (its firmware finishes the
//! writes submitted before a flush first). The caller passes the position
//! the flush covers ([`CrashLog::mark`]).
//!
//! Every completed write since the last covering flush is kept here with its
//! pre-image (what the media held before it) and its data, in completion
//! order. At a power cut each one independently survives, is dropped, or
//! (when tearing is enabled) survives torn: only a prefix of its sectors
//! (the device's blocks, 512 bytes on `sim`) reaches the media. The result is exactly
//!
//! ```text
//!   last flushed state  +  the surviving writes, applied in completion order
//! ```
//!
//! produced by undoing every unflushed write newest-first (restoring the
//! pre-images) and then re-applying the survivors oldest-first:
//!
//! ```text
//!   log:    W1(pre1,post1)  W2(pre2,post2)  W3(pre3,post3)      fates: keep, drop, torn(2)
//!   undo:   pre3 -> pre2 -> pre1             (media back at the last flush)
//!   redo:   post1 -> post3[..2 sectors]       (survivors, in order)
//! ```
//!
//! | fate of an unflushed write | tearing off | tearing on |
//! |----------------------------|-------------|------------|
//! | survives whole             | 1/2         | 1/3        |
//! | dropped                    | 1/2         | 1/3        |
//! | torn: sectors `[0, k)`, `1 <= k < n` | never | 1/3 (single-sector writes: survive or drop) |
//! | in flight at the cut (*doomed*) | dropped | dropped |
//!
//! The log is bounded like a drive's cache: past `limit_bytes` the oldest
//! writes are destaged (count as durable), so a workload that never flushes
//! keeps bounded memory. Overlapping writes in flight at the same time have
//! no defined order on any device; callers must not rely on one.

use std::collections::VecDeque;

use rand::Rng;

/// One completed, not yet durable write.
#[derive(Debug)]
struct Entry {
    offset: u64,
    pre: Vec<u8>,
    post: Vec<u8>,
    /// In flight when the power went: always dropped.
    doomed: bool,
}

/// Bytes to write at an offset to bring the media to its post-cut state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Patch {
    /// Byte offset.
    pub offset: u64,
    /// The bytes.
    pub data: Vec<u8>,
}

/// What a power cut did to the unflushed writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CutReport {
    /// Completed writes not covered by a flush when the power went.
    pub unflushed: u64,
    /// Of those, the ones that reached the media whole.
    pub survived: u64,
    /// The ones lost entirely.
    pub dropped: u64,
    /// The ones of which only a prefix of sectors reached the media.
    pub torn: u64,
    /// Writes the media applied but whose completion the power beat:
    /// always undone, not counted above.
    pub in_flight: u64,
}

/// What happens to one unflushed write at a power cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Survive,
    Drop,
    /// Only the first `k` sectors survive.
    Torn(usize),
}

/// The completed writes that a power cut may still lose, in completion order.
#[derive(Debug)]
pub struct CrashLog {
    entries: VecDeque<Entry>,
    /// The sequence number of `entries[0]`.
    first_seq: u64,
    bytes: u64,
    limit_bytes: u64,
    /// A torn write keeps whole sectors of this many bytes.
    sector_bytes: usize,
}

impl CrashLog {
    /// An empty log that destages its oldest writes past `limit_bytes` and
    /// tears writes at `sector_bytes` (the device's block size).
    pub fn new(limit_bytes: u64, sector_bytes: u32) -> Self {
        assert!(limit_bytes > 0, "a write cache needs a size");
        assert!(
            sector_bytes.is_power_of_two(),
            "a sector of {sector_bytes} bytes"
        );
        Self {
            entries: VecDeque::new(),
            first_seq: 0,
            bytes: 0,
            limit_bytes,
            sector_bytes: sector_bytes as usize,
        }
    }

    /// Records a completed write of `post` at `offset` over `pre`.
    pub fn record(&mut self, offset: u64, pre: Vec<u8>, post: Vec<u8>) {
        self.push(offset, pre, post, false);
    }

    /// Records a write that the media applied but that was still in flight
    /// when the power went: it is undone by the next [`power_cut`].
    ///
    /// [`power_cut`]: CrashLog::power_cut
    pub fn record_doomed(&mut self, offset: u64, pre: Vec<u8>, post: Vec<u8>) {
        self.push(offset, pre, post, true);
    }

    fn push(&mut self, offset: u64, pre: Vec<u8>, post: Vec<u8>, doomed: bool) {
        assert_eq!(pre.len(), post.len(), "pre-image and data differ in size");
        assert!(!post.is_empty(), "an empty write");
        assert_eq!(
            post.len() % self.sector_bytes,
            0,
            "a write of partial sectors"
        );
        self.bytes += post.len() as u64;
        self.entries.push_back(Entry {
            offset,
            pre,
            post,
            doomed,
        });
        // Destage the oldest (never the newest: it was just acknowledged).
        while self.bytes > self.limit_bytes && self.entries.len() > 1 {
            self.pop_oldest();
        }
    }

    fn pop_oldest(&mut self) {
        let e = self.entries.pop_front().expect("a non-empty log");
        self.bytes -= e.post.len() as u64;
        self.first_seq += 1;
    }

    /// The position a flush submitted now covers: pass it to [`flushed`]
    /// when that flush completes.
    ///
    /// [`flushed`]: CrashLog::flushed
    pub fn mark(&self) -> u64 {
        self.first_seq + self.entries.len() as u64
    }

    /// A flush submitted at `mark` completed: every write before it is
    /// durable.
    pub fn flushed(&mut self, mark: u64) {
        assert!(mark <= self.mark(), "a flush mark from the future");
        while self.first_seq < mark {
            self.pop_oldest();
        }
    }

    /// Completed writes that are not durable yet.
    pub fn unflushed(&self) -> usize {
        self.entries.len()
    }

    /// The power goes: decides each unflushed write's fate with `rng` and
    /// returns the patches that turn the media (holding every completed
    /// write) into the post-cut state, to apply in order. The log is empty
    /// afterwards.
    pub fn power_cut(&mut self, rng: &mut impl Rng, torn: bool) -> (Vec<Patch>, CutReport) {
        let mut entries: Vec<Entry> = self.entries.drain(..).collect();
        self.first_seq += entries.len() as u64;
        self.bytes = 0;
        let sector = self.sector_bytes;
        let fates: Vec<Fate> = entries
            .iter()
            .map(|e| fate(e.doomed, e.post.len() / sector, rng, torn))
            .collect();
        let doomed = entries.iter().filter(|e| e.doomed).count() as u64;
        let mut report = CutReport {
            unflushed: entries.len() as u64 - doomed,
            in_flight: doomed,
            ..CutReport::default()
        };
        let mut patches = Vec::with_capacity(entries.len() * 2);
        for e in entries.iter_mut().rev() {
            patches.push(Patch {
                offset: e.offset,
                data: std::mem::take(&mut e.pre),
            });
        }
        for (e, fate) in entries.into_iter().zip(fates) {
            let mut data = e.post;
            match fate {
                Fate::Survive => report.survived += 1,
                Fate::Drop => {
                    report.dropped += u64::from(!e.doomed);
                    continue;
                }
                Fate::Torn(k) => {
                    report.torn += 1;
                    data.truncate(k * sector);
                }
            }
            patches.push(Patch {
                offset: e.offset,
                data,
            });
        }
        debug_assert_eq!(
            report.survived + report.dropped + report.torn,
            report.unflushed
        );
        (patches, report)
    }
}

fn fate(doomed: bool, sectors: usize, rng: &mut impl Rng, torn: bool) -> Fate {
    // Draw for doomed writes too, so the fates of the others do not depend
    // on how many were in flight.
    let roll = if torn {
        rng.gen_range(0..3u32)
    } else {
        rng.gen_range(0..2u32)
    };
    let k = if sectors > 1 {
        rng.gen_range(1..sectors)
    } else {
        0
    };
    match (doomed, roll) {
        (true, _) => Fate::Drop,
        (false, 0) => Fate::Survive,
        (false, 1) => Fate::Drop,
        (false, _) if k == 0 => Fate::Survive,
        (false, _) => Fate::Torn(k),
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    use super::*;

    fn apply(media: &mut [u8], patches: &[Patch]) {
        for p in patches {
            let at = p.offset as usize;
            media[at..at + p.data.len()].copy_from_slice(&p.data);
        }
    }

    fn write(media: &mut [u8], log: &mut CrashLog, offset: usize, byte: u8, len: usize) {
        let pre = media[offset..offset + len].to_vec();
        media[offset..offset + len].fill(byte);
        log.record(offset as u64, pre, vec![byte; len]);
    }

    #[test]
    fn a_flush_makes_earlier_writes_durable() {
        let mut media = vec![0u8; 4096];
        let mut log = CrashLog::new(1 << 20, 512);
        write(&mut media, &mut log, 0, 1, 512);
        let mark = log.mark();
        write(&mut media, &mut log, 512, 2, 512);
        log.flushed(mark);
        assert_eq!(log.unflushed(), 1);
        let mut rng = SmallRng::seed_from_u64(1);
        let (patches, report) = log.power_cut(&mut rng, false);
        apply(&mut media, &patches);
        assert_eq!(report.unflushed, 1);
        assert!(media[..512].iter().all(|&b| b == 1));
        let second = &media[512..1024];
        assert!(second.iter().all(|&b| b == 2) || second.iter().all(|&b| b == 0));
    }

    #[test]
    fn overwrites_resolve_to_the_last_survivor() {
        for seed in 0..200 {
            let mut media = vec![0u8; 2048];
            let mut log = CrashLog::new(1 << 20, 512);
            for byte in 1..=4u8 {
                write(&mut media, &mut log, 0, byte, 2048);
            }
            let mut rng = SmallRng::seed_from_u64(seed);
            let (patches, report) = log.power_cut(&mut rng, true);
            apply(&mut media, &patches);
            // Every sector holds 0 or one write's byte; bytes never increase
            // along the write (a torn newer write is a prefix over older).
            let sectors: Vec<u8> = media.chunks(512).map(|s| s[0]).collect();
            for s in media.chunks(512) {
                assert!(s.iter().all(|&b| b == s[0]), "seed {seed}: a torn sector");
            }
            assert!(sectors.windows(2).all(|w| w[0] >= w[1]), "seed {seed}");
            assert_eq!(report.unflushed, 4);
        }
    }

    #[test]
    fn the_log_is_bounded() {
        let mut media = vec![0u8; 8192];
        let mut log = CrashLog::new(2048, 512);
        for i in 0..8 {
            write(&mut media, &mut log, i * 1024, 7, 1024);
        }
        assert_eq!(log.unflushed(), 2);
        assert_eq!(log.mark(), 8);
    }
}
