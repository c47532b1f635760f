//! Writeback: the oldest cached blocks go to the backing device as
//! non-critical I/O, on a background thread (or the caller's, with
//! `writeback_now`), one round at a time.
//!
//! ```text
//!  round: pick the oldest mapped blocks with no backing write in flight (pinned)
//!         read their slots from the cache (checking each against its record's crc)
//!         write contiguous runs to the backing device (writeback_inflight_max at a time)
//!         flush the backing device          <- the data is durable there before ...
//!         free records -> metadata log      <- ... the cache forgets it
//!         unmap the blocks still at that version (a newer one stays cached)
//!         flush the cache device            <- the slots are free after this
//! ```
//!
//! The thread runs rounds while the cache is at least `writeback_start_pct`
//! full until it is down to `writeback_stop_pct`, and whenever a write is
//! stalled for a slot. A failed round is retried after a pause; it changes
//! nothing (the blocks stay cached).

use std::sync::Arc;
use std::time::Duration;

use super::config::ROUND_BLOCKS_MAX;
use super::core::Placed;
use super::error::NvwcError;
use super::io::submit_all;
use super::record::{data_crc, Record};
use super::stats::add;
use super::{Shared, State};
use crate::class::Class;
use crate::device::{submit_and_wait, AlignedBuf, Command, DeviceError, Op};

/// The largest backing write of a round.
const RUN_BYTES_MAX: u64 = 1 << 20;
/// How long the thread pauses after a round that could do nothing, or failed.
const IDLE_PAUSE: Duration = Duration::from_millis(5);
const ERROR_PAUSE: Duration = Duration::from_millis(50);

impl Shared {
    /// One round of at most `max` blocks; returns the blocks written back.
    pub(super) fn writeback_round(self: &Arc<Self>, max: usize) -> Result<usize, DeviceError> {
        assert!(
            (1..=ROUND_BLOCKS_MAX as usize).contains(&max),
            "a round of {max} blocks"
        );
        let _round = self.round_lock.lock();
        if let Some(what) = self.poison.lock().clone() {
            return Err(NvwcError::Poisoned { what }.into_device(&self.info.name, Op::Write, 0));
        }
        let picks = self.state.lock().core.pick_writeback(max);
        let result = match picks.is_empty() {
            true => Ok(()),
            false => self.write_back(&picks),
        };
        self.state.lock().core.writeback_end(&picks, result.is_ok());
        if let Err(e) = result {
            add(&self.counters.writeback_errors, 1);
            return Err(e);
        }
        if !picks.is_empty() {
            add(&self.counters.writeback_rounds, 1);
            add(&self.counters.writeback_blocks, picks.len() as u64);
        }
        if self.state.lock().core.has_stale() {
            self.flush_cache_wait(Class::NonCritical)?;
        }
        Ok(picks.len())
    }

    /// Copies `picks` to the backing device, makes them durable there and
    /// logs their free records.
    fn write_back(self: &Arc<Self>, picks: &[Placed]) -> Result<(), DeviceError> {
        let l = &self.layout;
        let bb = l.block_bytes;
        let reads = (picks.iter())
            .map(|p| Command::read(l.slot_offset(p.slot), bb as usize, Class::NonCritical))
            .collect();
        let data = submit_all(&*self.cache, reads, 64)?;
        for (p, d) in picks.iter().zip(&data) {
            if data_crc(d.as_slice()) != p.crc {
                let e = NvwcError::Corrupt {
                    slot: p.slot,
                    block: p.block,
                };
                return Err(e.into_device(&self.info.name, Op::Read, l.slot_offset(p.slot)));
            }
        }
        let mut order: Vec<usize> = (0..picks.len()).collect();
        order.sort_by_key(|&i| picks[i].block);
        let mut writes: Vec<(u64, Vec<usize>)> = Vec::new();
        for i in order {
            let b = picks[i].block;
            match writes.last_mut() {
                Some((first, run))
                    if *first + run.len() as u64 == b
                        && (run.len() as u64 + 1) * bb <= RUN_BYTES_MAX =>
                {
                    run.push(i)
                }
                _ => writes.push((b, vec![i])),
            }
        }
        let cmds = (writes.into_iter())
            .map(|(first, run)| {
                let mut buf = AlignedBuf::zeroed(run.len() * bb as usize);
                for (k, chunk) in buf.as_mut_slice().chunks_exact_mut(bb as usize).enumerate() {
                    chunk.copy_from_slice(data[run[k]].as_slice());
                }
                Command::write(first * bb, buf, Class::NonCritical)
            })
            .collect();
        submit_all(
            &*self.backing,
            cmds,
            self.cfg.writeback_inflight_max as usize,
        )?;
        submit_and_wait(&*self.backing, Command::flush(Class::NonCritical)).result?;
        self.state.lock().core.mark_freeing(picks);
        let records = (picks.iter())
            .map(|p| Record::Free {
                slot: p.slot,
                block: p.block,
                seq: p.seq,
            })
            .collect();
        self.md_append_wait(records, Class::NonCritical)
    }

    /// Rounds until no block is dirty and no slot is stale.
    pub(super) fn writeback_all(self: &Arc<Self>) -> Result<(), DeviceError> {
        let batch = self.cfg.writeback_batch_blocks as usize;
        loop {
            let (dirty, stale) = {
                let st = self.state.lock();
                (st.core.dirty_count(), st.core.has_stale())
            };
            if dirty == 0 && !stale {
                return Ok(());
            }
            if self.writeback_round(batch)? == 0 && dirty > 0 {
                // Every dirty block waits for a backing write in flight.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// The writeback thread.
    pub(super) fn writeback_loop(self: Arc<Self>) {
        let batch = self.cfg.writeback_batch_blocks as usize;
        loop {
            {
                let mut st = self.state.lock();
                while !st.shutdown && !self.wants_writeback(&mut st) {
                    self.wake.wait_for(&mut st, Duration::from_millis(100));
                }
                if st.shutdown {
                    return;
                }
            }
            match self.writeback_round(batch) {
                Ok(n) if n > 0 => {}
                Ok(_) => self.pause(IDLE_PAUSE),
                Err(_) => self.pause(ERROR_PAUSE),
            }
        }
    }

    fn pause(&self, d: Duration) {
        let mut st = self.state.lock();
        if !st.shutdown {
            self.wake.wait_for(&mut st, d);
        }
    }

    /// Whether the thread has work: usage between the thresholds (with
    /// hysteresis), or writes stalled for a slot.
    fn wants_writeback(&self, st: &mut State) -> bool {
        if self.is_poisoned() {
            return false;
        }
        let pct = st.core.used() as f64 * 100.0 / st.core.slot_count() as f64;
        if pct >= self.cfg.writeback_start_pct {
            st.writeback_active = true;
        } else if pct <= self.cfg.writeback_stop_pct {
            st.writeback_active = false;
        }
        let work = st.core.dirty_count() > 0 || st.core.has_stale();
        (st.writeback_active && work) || !st.stalled.is_empty()
    }
}
