//! Tests of the sans-I/O mapping core and of recovery's resolution, driven
//! step by step.

use std::collections::HashMap;

use super::core::{Core, Piece, Placed, Source};
use super::layout::Layout;
use super::record::Record;
use super::recovery::resolve;

fn wrote(core: &mut Core, block: u64) -> Placed {
    let p = core.alloc(block, block as u32);
    core.write_done(&p, true);
    core.check_invariants();
    p
}

#[test]
fn an_overwrite_goes_to_a_new_slot_and_the_old_one_waits_for_a_flush() {
    let mut c = Core::new(4, &[], 1);
    let a = wrote(&mut c, 10);
    assert_eq!(c.cached(10), Some(a.slot));
    let b = wrote(&mut c, 10);
    assert_ne!(a.slot, b.slot, "copy-on-write");
    assert_eq!(c.cached(10), Some(b.slot));
    assert_eq!((c.used(), c.dirty_count()), (2, 1));
    assert!(c.has_stale());
    let taken = c.flush_begin();
    assert_eq!(taken, vec![a.slot]);
    assert_eq!(c.free_count(), 2, "not free until the flush completes");
    c.flush_end(&taken, true);
    assert_eq!(c.free_count(), 3);
    c.check_invariants();
}

#[test]
fn a_failed_flush_keeps_the_slot_stale() {
    let mut c = Core::new(4, &[], 1);
    wrote(&mut c, 1);
    wrote(&mut c, 1);
    let taken = c.flush_begin();
    c.flush_end(&taken, false);
    assert!(c.has_stale());
    assert_eq!(c.free_count(), 2);
}

#[test]
fn a_slot_under_a_read_is_not_reused() {
    let mut c = Core::new(4, &[], 1);
    let a = wrote(&mut c, 5);
    let pieces = c.read_pieces(5, 1);
    assert_eq!(pieces[0].source, Source::Cache(a.slot));
    wrote(&mut c, 5);
    let taken = c.flush_begin();
    c.flush_end(&taken, true);
    assert_eq!(c.free_count(), 2, "pinned: released, not free");
    c.check_invariants();
    assert!(c.unpin(a.slot), "the last pin frees it");
    assert_eq!(c.free_count(), 3);
    c.check_invariants();
}

#[test]
fn an_older_overlapping_write_completing_late_does_not_win() {
    let mut c = Core::new(4, &[], 1);
    let old = c.alloc(3, 1);
    let new = c.alloc(3, 2);
    c.write_done(&new, true);
    c.write_done(&old, true);
    assert_eq!(c.cached(3), Some(new.slot));
    c.check_invariants();
}

#[test]
fn reads_are_split_into_runs_by_source() {
    let mut c = Core::new(8, &[], 1);
    wrote(&mut c, 0); // slot 0
    wrote(&mut c, 1); // slot 1
    wrote(&mut c, 3); // slot 2
    let pieces = c.read_pieces(0, 5);
    let want = [
        Piece {
            first: 0,
            n: 2,
            source: Source::Cache(0),
        },
        Piece {
            first: 2,
            n: 1,
            source: Source::Backing,
        },
        Piece {
            first: 3,
            n: 1,
            source: Source::Cache(2),
        },
        Piece {
            first: 4,
            n: 1,
            source: Source::Backing,
        },
    ];
    assert_eq!(pieces, want);
}

#[test]
fn writeback_waits_for_backing_writes_and_spares_newer_versions() {
    let mut c = Core::new(8, &[], 1);
    let a = wrote(&mut c, 1);
    let b = wrote(&mut c, 2);
    c.backing_begin(1, 1); // a bypassed write to block 1 still in flight
    let picks = c.pick_writeback(8);
    assert_eq!(picks, vec![b], "block 1 waits for its backing write");
    let newer = wrote(&mut c, 2); // overwritten during writeback
    c.writeback_end(&picks, true);
    assert_eq!(c.cached(2), Some(newer.slot), "the newer version stays");
    c.backing_end(1, 1);
    let picks = c.pick_writeback(8);
    assert_eq!(
        picks.iter().map(|p| p.block).collect::<Vec<_>>(),
        vec![1, 2]
    );
    c.writeback_end(&picks, true);
    assert_eq!((c.cached(1), c.cached(2)), (None, None));
    assert_eq!(c.dirty_count(), 0);
    let taken = c.flush_begin();
    assert_eq!(taken.len(), 3, "{a:?} {b:?} {newer:?}");
    c.flush_end(&taken, true);
    assert_eq!(c.free_count(), 8);
    c.check_invariants();
}

#[test]
fn a_compaction_leaves_out_blocks_whose_free_records_are_being_logged() {
    let mut c = Core::new(4, &[], 1);
    let a = wrote(&mut c, 1);
    let b = wrote(&mut c, 2);
    let picks = c.pick_writeback(1);
    assert_eq!(picks, vec![a]);
    c.mark_freeing(&picks);
    // Its free record may already be in the old half, which the compaction
    // drops: a map record for it in the new half would outlive it.
    let (records, _) = c.snapshot();
    assert_eq!(records, vec![super::write::map_record(&b)]);
    c.writeback_end(&picks, true);
    assert_eq!(c.cached(1), None);
    c.check_invariants();
}

#[test]
fn a_failed_write_leaves_a_dead_slot_until_a_compaction() {
    let mut c = Core::new(4, &[], 1);
    let keep = wrote(&mut c, 1);
    let p = c.alloc(1, 9);
    let writing = c.alloc(2, 7);
    c.write_done(&p, false);
    assert_eq!(c.cached(1), Some(keep.slot), "the old version stays");
    let (records, dead) = c.snapshot();
    assert_eq!(dead, vec![p.slot]);
    assert_eq!(records.len(), 2, "mapped and writing slots: {records:?}");
    c.compacted(&dead);
    assert_eq!(c.free_count(), 2);
    c.write_done(&writing, true);
    c.check_invariants();
}

fn layout() -> Layout {
    let cfg = super::NvwcConfig {
        cache_bytes: 16 * 4096,
        ..Default::default()
    };
    let dev = |capacity| crate::device::DeviceInfo {
        name: "t".into(),
        capacity,
        block_size: 512,
        queue_depth: 1,
        allocates_on_first_write: false,
    };
    Layout::new(&cfg, &dev(cfg.cache_device_bytes()), &dev(1 << 20)).unwrap()
}

fn map(slot: u32, block: u64, seq: u64, crc: u32) -> Record {
    Record::Map {
        slot,
        block,
        seq,
        crc,
    }
}

#[test]
fn recovery_takes_the_newest_matching_record_that_is_not_killed() {
    let l = layout();
    let crcs: HashMap<u32, u32> = [(0, 100), (1, 101), (2, 555), (3, 103)].into();
    let records = [
        map(0, 7, 1, 100), // block 7, v1, superseded by v2 below
        map(1, 7, 2, 101), // block 7, v2: wins
        map(2, 8, 3, 102), // block 8: its data never landed (crc 555) ...
        map(3, 8, 4, 999), // ... nor this newer one: block 8 is not cached
        map(3, 9, 5, 103), // block 9 in slot 3, then written back:
        Record::Free {
            slot: 3,
            block: 9,
            seq: 5,
        },
    ];
    let (placed, unverified) = resolve(&records, &crcs, &l);
    assert_eq!(
        placed,
        vec![Placed {
            slot: 1,
            block: 7,
            seq: 2,
            crc: 101
        }]
    );
    assert_eq!(unverified, 2);
}

#[test]
fn recovery_falls_back_to_an_older_version_whose_newer_write_was_lost() {
    let l = layout();
    let crcs: HashMap<u32, u32> = [(0, 100), (1, 0)].into();
    let records = [map(0, 7, 1, 100), map(1, 7, 2, 101)];
    let (placed, _) = resolve(&records, &crcs, &l);
    assert_eq!(placed.len(), 1);
    assert_eq!((placed[0].slot, placed[0].seq), (0, 1));
}

#[test]
fn recovery_gives_a_reused_slot_to_its_newest_owner() {
    let l = layout();
    // Slot 0 held block 7 (v1), block 7 moved on and was written back,
    // slot 0 now holds block 8 whose data happens to equal block 7's v1.
    let crcs: HashMap<u32, u32> = [(0, 100)].into();
    let records = [map(0, 7, 1, 100), map(0, 8, 5, 100)];
    let (placed, _) = resolve(&records, &crcs, &l);
    assert_eq!(placed.len(), 1);
    assert_eq!(placed[0].block, 8);
}
