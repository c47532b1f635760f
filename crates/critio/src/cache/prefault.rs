//! Backing the cache's frames with memory ahead of their first use, off
//! the request path.
//!
//! A part's frames are one zeroed allocation (`core.rs`), which the kernel
//! backs lazily: the first write to each page faults, and the kernel
//! allocates and zeroes memory for it in the thread that wrote. With
//! transparent huge pages that is 2 MiB at once, and on a virtual machine
//! whose host backs the guest's memory lazily as well it is slow: on this
//! project's test machine a request thread spent about 3 ms in one such
//! fault (`perf`: `clear_page_erms` under `do_huge_pmd_anonymous_page`,
//! below `Inner::write_page`). Whoever brings a page into a frame first
//! touches it, and while the cache fills that is often a request (an
//! append's new page, a miss's load): SETs of critio-kv on a real file,
//! with a 1 GiB cache filling, took those 3 ms about once per thousand,
//! which was the p99.9 of its worker's rounds (INFO `round_run`).
//!
//! So a background thread (`critio-prefault`) asks the kernel to back the
//! frames ahead of use, then exits. It first asks for huge pages over the
//! frames (`MADV_HUGEPAGE`): critio's own program allocates with mimalloc
//! built without them (a fresh buffer of a background job faulting 2 MiB
//! in while it held a cache part kept GETs waiting for milliseconds), but
//! the frames, backed here off the request path and kept as long as the
//! cache, are what a request's page-table walk crosses most:
//!
//! ```text
//!   parts:   [part 0 frames.........] [part 1 frames.........] ...
//!   first:    madvise(MADV_HUGEPAGE) over each part's aligned 2 MiB stretches
//!             (MADV_NOHUGEPAGE when the frames are freed: `advise`)
//!   rounds:   chunk 0 of part 0, chunk 0 of part 1, ..., chunk 1 of part 0, ...
//!   a chunk:  madvise(MADV_POPULATE_WRITE), 2 MiB (one huge page)
//! ```
//!
//! Round-robin over the parts from their first frames, because a part
//! hands out its free frames first to last, and every part fills at once
//! (a page's part is a hash). It changes no byte (a populated page reads as
//! zero, as it would have), so it takes no lock and runs beside the
//! cache's users; it runs at the background's nice, non-critical. What it
//! costs: the process holds the cache's whole memory a few seconds after
//! start, as a database's buffer pool does, where it would otherwise grow
//! as the cache fills. `cache.prefault = false` keeps the lazy way. A
//! kernel without `MADV_POPULATE_WRITE` (before 5.14) stops it at the first
//! chunk, with a note on standard error: the frames are then backed as
//! they are first written, as before.
//!
//! [`back_spare`] does the same for a buffer that a thread is about to fill
//! a page at a time under a part's lock (a scan's chunk,
//! `PageCache::start_read_through`): its memory is backed in one system
//! call before, instead of by a fault inside each copy while a request may
//! wait for the part. With the allocator handing a freed chunk's memory
//! back to the kernel, a BGSAVE under load otherwise took about a
//! thousand such faults a second.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::Inner;
use crate::context;

/// How much one `madvise` backs: one transparent huge page on x86-64.
pub(crate) const CHUNK: usize = 2 << 20;

/// The prefault thread, stopped and joined when the cache is dropped.
pub(crate) struct Prefault {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Prefault {
    /// Starts backing `spans` (each part's frames: address, length), in
    /// chunks, round-robin; `inner` keeps the frames alive and counts the
    /// bytes backed.
    pub(crate) fn start(inner: Arc<Inner>, spans: Vec<(usize, usize)>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("critio-prefault".into())
                .spawn(move || {
                    context::set_background();
                    run(&inner, &spans, &stop);
                })
                .expect("cannot spawn the prefault thread")
        };
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Prefault {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The chunks of `spans` in the order they are backed: the first chunk of
/// each span, then the second of each, and so on. Only the span's whole
/// pages are backed (`madvise` wants an aligned address and rounds the
/// length up; a partial page at either end is shared with other memory).
/// A span's first chunk ends at the next multiple of [`CHUNK`], so the
/// later ones are aligned huge pages.
pub(crate) fn chunks(spans: &[(usize, usize)], page: usize) -> Vec<(usize, usize)> {
    let mut per_span: Vec<Vec<(usize, usize)>> = spans
        .iter()
        .map(|&span| {
            let (mut at, end) = aligned_inside(span, page).map_or((0, 0), |(a, l)| (a, a + l));
            let mut out = Vec::new();
            while at < end {
                let next = (at + 1).next_multiple_of(CHUNK).min(end);
                out.push((at, next - at));
                at = next;
            }
            out
        })
        .collect();
    let rounds = per_span.iter().map(Vec::len).max().unwrap_or(0);
    let mut order = Vec::with_capacity(per_span.iter().map(Vec::len).sum());
    for r in 0..rounds {
        for span in &mut per_span {
            if let Some(&c) = span.get(r) {
                order.push(c);
            }
        }
    }
    order
}

/// The whole `unit`s (pages, or [`CHUNK`]s) inside `span` (address,
/// length), as one range; None if it holds none.
fn aligned_inside((addr, len): (usize, usize), unit: usize) -> Option<(usize, usize)> {
    let (start, end) = (addr.next_multiple_of(unit), (addr + len) / unit * unit);
    (end > start).then(|| (start, end - start))
}

/// Asks for huge pages over the aligned [`CHUNK`]s of a part's frames
/// (`huge`), or, as the frames are freed, for none: their memory goes
/// back to the allocator, whose later buffers there should fault in
/// 4 KiB at a time as everywhere else in the `critio` program. Without
/// transparent huge pages (`EINVAL`) nothing changes.
pub(crate) fn advise(span: (usize, usize), huge: bool) {
    if let Some((addr, len)) = aligned_inside(span, CHUNK) {
        let _ = crate::sys::advise_huge_pages(addr, len, huge);
    }
}

/// Backs the whole pages of `buf`'s spare capacity with memory now
/// (`MADV_POPULATE_WRITE`, one system call), so that filling it later
/// takes no page fault: for a buffer a thread fills under a cache part's
/// lock, a page at a time, which would otherwise fault a fresh page in
/// with each copy while a request may wait for the part. The allocator
/// hands a large buffer fresh memory, or memory it gave back to the
/// kernel after the last one was freed. Best effort: a kernel without the
/// advice (before 5.14) leaves the faults where they were.
pub(crate) fn back_spare(buf: &mut Vec<u8>) {
    let spare = buf.spare_capacity_mut();
    let span = (spare.as_ptr() as usize, spare.len());
    if let Some((addr, len)) = aligned_inside(span, rustix::param::page_size()) {
        let _ = crate::sys::populate_write(addr, len);
    }
}

fn run(inner: &Inner, spans: &[(usize, usize)], stop: &AtomicBool) {
    let page = rustix::param::page_size();
    for &span in spans {
        advise(span, true);
    }
    for (addr, len) in chunks(spans, page) {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        if let Err(e) = crate::sys::populate_write(addr, len) {
            eprintln!(
                "critio: the cache's memory is backed as it is first written, not ahead \
                 (madvise MADV_POPULATE_WRITE: {e})"
            );
            return;
        }
        inner
            .counters
            .prefaulted_bytes
            .fetch_add(len as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The resident bytes (`Rss` of `/proc/self/smaps`) of the mapping
    /// that holds `addr`.
    fn resident(addr: usize) -> usize {
        let rss = crate::sys::mapping_field(addr, "Rss")
            .unwrap()
            .expect("mapped");
        let kb = rss.trim_end_matches("kB").trim();
        kb.parse::<usize>().unwrap() << 10
    }

    /// A buffer's spare capacity is backed by `back_spare`, untouched by
    /// any write, so filling it faults nothing in; its bytes are kept.
    #[test]
    fn back_spare_backs_a_buffers_room_ahead_of_its_writes() {
        let page = rustix::param::page_size();
        // 64 MiB: more than any allocator serves from its heap, so the
        // buffer is a fresh mapping of its own, not backed yet.
        let mut buf: Vec<u8> = Vec::with_capacity(64 << 20);
        buf.extend_from_slice(&[7; 100]);
        let at = buf.as_ptr() as usize;
        if resident(at) > 4 << 20 {
            return; // the allocator reused backed memory: nothing to show
        }
        if crate::sys::populate_write(at.next_multiple_of(page), page).is_err() {
            return; // a kernel before 5.14: the advice does nothing
        }
        back_spare(&mut buf);
        assert!(
            resident(at) >= (64 << 20) - 2 * page,
            "{} bytes of 64 MiB backed",
            resident(at)
        );
        assert_eq!(buf, vec![7; 100]);
    }

    #[test]
    fn chunks_go_round_robin_over_the_spans_and_cover_them() {
        let page = 4096;
        // One span starting mid-chunk (not page-aligned), one aligned.
        let a = (CHUNK * 10 + 100, 3 * CHUNK);
        let b = (CHUNK * 20, CHUNK + page);
        let order = chunks(&[a, b], page);
        // a: [aligned start, 11 C), [11 C, 12 C), [12 C, 13 C) (its last
        // 100 bytes are not a whole page); b: [20 C, 21 C), [21 C, 21 C + page)
        let first_a = (CHUNK * 10 + page, CHUNK - page);
        assert_eq!(
            order,
            vec![
                first_a,
                (CHUNK * 20, CHUNK),
                (CHUNK * 11, CHUNK),
                (CHUNK * 21, page),
                (CHUNK * 12, CHUNK),
            ]
        );
        // Every whole page of each span is in exactly one chunk.
        for (addr, len) in [a, b] {
            let covered: usize = order
                .iter()
                .filter(|&&(c, _)| c >= addr && c < addr + len)
                .map(|&(_, l)| l)
                .sum();
            let whole = (addr + len) / page * page - addr.next_multiple_of(page);
            assert_eq!(covered, whole);
        }
    }

    #[test]
    fn the_huge_span_is_the_aligned_chunks_inside() {
        assert_eq!(
            aligned_inside((CHUNK + 1, 3 * CHUNK), CHUNK),
            Some((2 * CHUNK, 2 * CHUNK))
        );
        assert_eq!(
            aligned_inside((CHUNK, 2 * CHUNK), CHUNK),
            Some((CHUNK, 2 * CHUNK))
        );
        assert_eq!(aligned_inside((CHUNK + 1, CHUNK), CHUNK), None);
    }

    #[test]
    fn the_advice_sets_and_clears_the_huge_page_flag() {
        if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
            return; // a kernel without transparent huge pages
        }
        let bytes = vec![0u8; 4 * CHUNK].into_boxed_slice();
        let span = (bytes.as_ptr() as usize, bytes.len());
        let inside = span.0.next_multiple_of(CHUNK);
        let flags = || crate::sys::mapping_flags(inside).unwrap().expect("mapped");
        advise(span, true);
        assert!(flags().iter().any(|f| f == "hg"), "{:?}", flags());
        advise(span, false);
        assert!(!flags().iter().any(|f| f == "hg"), "{:?}", flags());
        assert!(flags().iter().any(|f| f == "nh"), "{:?}", flags());
    }

    #[test]
    fn populating_keeps_what_is_written() {
        let mut bytes = vec![0u8; 4 * CHUNK].into_boxed_slice();
        bytes[CHUNK + 5] = 7;
        let (addr, len) = (bytes.as_ptr() as usize, bytes.len());
        for (a, l) in chunks(&[(addr, len)], rustix::param::page_size()) {
            match crate::sys::populate_write(a, l) {
                Ok(()) => {}
                // A kernel before 5.14: nothing to check here.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return,
                Err(e) => panic!("madvise: {e}"),
            }
        }
        assert_eq!(bytes[CHUNK + 5], 7);
        assert_eq!(bytes.iter().map(|&b| u64::from(b)).sum::<u64>(), 7);
    }
}
