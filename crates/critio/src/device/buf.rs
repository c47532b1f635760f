//! Aligned I/O buffers without `unsafe`.
//!
//! O_DIRECT needs the buffer's address aligned (to the logical block size;
//! critio uses 4 KiB, which satisfies every device here). Instead of a
//! custom allocation, an `AlignedBuf` over-allocates a `Vec<u8>` by one
//! alignment unit and uses the aligned window inside it. Ownership of the
//! buffer moves into the device with a command and comes back with the
//! completion, so no buffer is ever shared with an in-flight I/O.

use std::fmt;

/// The alignment of every [`AlignedBuf`].
pub const BUF_ALIGN: usize = 4096;

/// A heap buffer whose contents start at a [`BUF_ALIGN`]-aligned address.
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

/// How far past `ptr` (a vector's allocation, one alignment unit larger
/// than the buffer needs) the first [`BUF_ALIGN`]-aligned byte is.
fn aligned_start(ptr: *const u8) -> usize {
    let start = (BUF_ALIGN - ptr as usize % BUF_ALIGN) % BUF_ALIGN;
    debug_assert_eq!((ptr as usize + start) % BUF_ALIGN, 0);
    start
}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes.
    pub fn zeroed(len: usize) -> Self {
        let raw = vec![0u8; len + BUF_ALIGN];
        let start = aligned_start(raw.as_ptr());
        Self { raw, start, len }
    }

    /// A buffer holding a copy of `data` (written once: not zeroed first).
    pub fn from_slice(data: &[u8]) -> Self {
        let mut b = Self::with_capacity(data.len());
        b.extend_from_slice(data);
        b
    }

    /// An empty buffer with room for `capacity` bytes, to be filled with
    /// [`AlignedBuf::extend_from_slice`] and [`AlignedBuf::extend_zeros`]:
    /// a buffer gathered from pieces (a writeback run's pages, a log
    /// batch's records) has each byte written once, where
    /// [`AlignedBuf::zeroed`] would write every byte twice (`perf` of a
    /// BGSAVE/BGREWRITEAOF loop of critio-kv on a real file showed the
    /// writeback thread's zeroing as 3% of the samples).
    pub fn with_capacity(capacity: usize) -> Self {
        let mut raw = Vec::with_capacity(capacity + BUF_ALIGN);
        let start = aligned_start(raw.as_ptr());
        raw.resize(start, 0);
        Self { raw, start, len: 0 }
    }

    /// Appends `data`.
    ///
    /// # Panics
    ///
    /// If it does not fit in the capacity the buffer was made with: the
    /// vector would move, and its contents lose their alignment.
    pub fn extend_from_slice(&mut self, data: &[u8]) {
        self.reserve_in_place(data.len());
        self.raw.extend_from_slice(data);
        self.len += data.len();
    }

    /// Appends `n` zero bytes (padding).
    ///
    /// # Panics
    ///
    /// As [`AlignedBuf::extend_from_slice`].
    pub fn extend_zeros(&mut self, n: usize) {
        self.reserve_in_place(n);
        self.raw.resize(self.raw.len() + n, 0);
        self.len += n;
    }

    fn reserve_in_place(&mut self, n: usize) {
        assert!(
            self.raw.len() + n <= self.raw.capacity(),
            "an AlignedBuf of {} bytes has no room for {n} more: it grows only within its capacity",
            self.len
        );
    }

    /// An empty buffer (for flushes).
    pub fn empty() -> Self {
        Self {
            raw: Vec::new(),
            start: 0,
            len: 0,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The contents.
    pub fn as_slice(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }

    /// The contents, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        Self::from_slice(self.as_slice())
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

impl PartialEq for AlignedBuf {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contents_are_aligned_and_sized() {
        for len in [0, 1, 512, 4096, 4097, 1 << 20] {
            let b = AlignedBuf::zeroed(len);
            assert_eq!(b.len(), len);
            if len > 0 {
                assert_eq!(b.as_slice().as_ptr() as usize % BUF_ALIGN, 0);
            }
            assert!(b.as_slice().iter().all(|&x| x == 0));
        }
        let c = AlignedBuf::from_slice(b"abc");
        assert_eq!(c.as_slice(), b"abc");
        assert_eq!(c.clone(), c);
    }

    #[test]
    fn a_buffer_gathered_in_pieces_is_aligned_and_holds_them_in_order() {
        for cap in [0, 3, 4096, 3 * 4096 + 100] {
            let mut b = AlignedBuf::with_capacity(cap);
            assert!(b.is_empty());
            let half = cap / 2;
            b.extend_from_slice(&vec![7; half]);
            b.extend_zeros(cap - half);
            assert_eq!(b.len(), cap);
            if cap > 0 {
                assert_eq!(b.as_slice().as_ptr() as usize % BUF_ALIGN, 0);
            }
            assert!(b.as_slice()[..half].iter().all(|&x| x == 7));
            assert!(b.as_slice()[half..].iter().all(|&x| x == 0));
        }
    }

    #[test]
    #[should_panic(expected = "grows only within its capacity")]
    fn a_gathered_buffer_never_grows_past_its_capacity() {
        let mut b = AlignedBuf::with_capacity(4);
        b.extend_from_slice(b"abcd");
        // Whatever slack the allocation has, this is past it.
        b.extend_zeros(1 << 20);
    }
}
