//! Bucket pages: the persistent hash index. Each of the `buckets` buckets is
//! a chain of pages holding its entries; small values live inline, large
//! ones in a blob (contiguous pages) the entry points to.
//!
//! ```text
//!  page: | "CKVB" | crc32c(rest) | next page u64 | count u16 | entries... | zero padding |
//!  entry: | klen u16 | kind u8 | flags u8 | expire_ms u64 | vlen u32 | key | value        (inline)
//!                                         flags & BLOB:             | key | page u64 | crc u32
//! ```
//!
//! Pages are never updated in place once a checkpoint may reference them:
//! the engine writes a changed chain to fresh pages (copy-on-write), so a
//! torn or lost write after a crash only ever hits pages no durable
//! checkpoint points to. The checksum catches the rest (media errors).

use super::entry::Reader;

const MAGIC: &[u8; 4] = b"CKVB";
const HEADER: usize = 4 + 4 + 8 + 2;
const ENTRY_HEADER: usize = 2 + 1 + 1 + 8 + 4;
const BLOB_REF: usize = 8 + 4;
const FLAG_BLOB: u8 = 1;

/// Values up to this size are stored inline in the bucket page.
pub(crate) const INLINE_MAX: usize = 2048;

/// Where an entry's value is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Data {
    Inline(Vec<u8>),
    Blob { page: u64, len: u32, crc: u32 },
}

/// An entry as stored in a bucket page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    pub(crate) key: Vec<u8>,
    pub(crate) kind: u8,
    pub(crate) expire_at_ms: u64,
    pub(crate) data: Data,
}

impl Slot {
    fn encoded_len(&self) -> usize {
        ENTRY_HEADER
            + self.key.len()
            + match &self.data {
                Data::Inline(v) => v.len(),
                Data::Blob { .. } => BLOB_REF,
            }
    }
}

/// The largest entry a page holds (the engine keeps keys and inline values
/// under it).
pub(crate) fn slot_max(page: usize) -> usize {
    page - HEADER
}

/// A page that does not decode: checksum, magic or layout is wrong.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct BadPage(pub(crate) &'static str);

/// Splits `slots` into pages (in order), each within `page` bytes.
pub(crate) fn pack(slots: &[Slot], page: usize) -> Vec<Vec<&Slot>> {
    let mut pages: Vec<Vec<&Slot>> = Vec::new();
    let mut used = 0;
    for s in slots {
        let n = s.encoded_len();
        assert!(
            n <= slot_max(page),
            "entry of {n} bytes does not fit a page"
        );
        if pages.is_empty() || used + n > page {
            pages.push(Vec::new());
            used = HEADER;
        }
        pages.last_mut().expect("a page was pushed").push(s);
        used += n;
    }
    pages
}

/// Encodes one page of a chain, pointing to `next` (0 = last).
pub(crate) fn encode_page(slots: &[&Slot], next: u64, page: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(page);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[0; 4]); // crc, filled below
    out.extend_from_slice(&next.to_le_bytes());
    out.extend_from_slice(&(slots.len() as u16).to_le_bytes());
    for s in slots {
        out.extend_from_slice(&(s.key.len() as u16).to_le_bytes());
        out.push(s.kind);
        out.push(if matches!(s.data, Data::Blob { .. }) {
            FLAG_BLOB
        } else {
            0
        });
        out.extend_from_slice(&s.expire_at_ms.to_le_bytes());
        match &s.data {
            Data::Inline(v) => {
                out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                out.extend_from_slice(&s.key);
                out.extend_from_slice(v);
            }
            Data::Blob { page: p, len, crc } => {
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(&s.key);
                out.extend_from_slice(&p.to_le_bytes());
                out.extend_from_slice(&crc.to_le_bytes());
            }
        }
    }
    assert!(out.len() <= page, "page overflow");
    out.resize(page, 0);
    let crc = crc32c::crc32c(&out[8..]);
    out[4..8].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes a page: (next page, entries).
pub(crate) fn decode_page(buf: &[u8]) -> Result<(u64, Vec<Slot>), BadPage> {
    if &buf[..4] != MAGIC {
        return Err(BadPage("not a bucket page (bad magic)"));
    }
    let crc = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
    if crc != crc32c::crc32c(&buf[8..]) {
        return Err(BadPage("bucket page checksum mismatch"));
    }
    let mut r = Reader(&buf[8..]);
    let bad = || BadPage("bucket page entry runs past the page");
    let next = r.u64().ok_or_else(bad)?;
    let count = r.u16().ok_or_else(bad)?;
    let mut slots = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let klen = r.u16().ok_or_else(bad)? as usize;
        let kind = r.u8().ok_or_else(bad)?;
        let flags = r.u8().ok_or_else(bad)?;
        let expire_at_ms = r.u64().ok_or_else(bad)?;
        let vlen = r.u32().ok_or_else(bad)?;
        let key = r.take(klen).ok_or_else(bad)?.to_vec();
        let data = if flags & FLAG_BLOB != 0 {
            Data::Blob {
                page: r.u64().ok_or_else(bad)?,
                len: vlen,
                crc: r.u32().ok_or_else(bad)?,
            }
        } else {
            Data::Inline(r.take(vlen as usize).ok_or_else(bad)?.to_vec())
        };
        slots.push(Slot {
            key,
            kind,
            expire_at_ms,
            data,
        });
    }
    Ok((next, slots))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(key: &str, v: usize) -> Slot {
        Slot {
            key: key.as_bytes().to_vec(),
            kind: 0,
            expire_at_ms: 7,
            data: Data::Inline(vec![1; v]),
        }
    }

    #[test]
    fn chains_pack_encode_and_decode() {
        let slots: Vec<Slot> = (0..9).map(|i| slot(&format!("k{i}"), 1000)).collect();
        let pages = pack(&slots, 4096);
        assert_eq!(pages.len(), 3, "three 1 KiB entries per 4 KiB page");
        let mut back = Vec::new();
        for (i, p) in pages.iter().enumerate() {
            let buf = encode_page(p, i as u64 + 10, 4096);
            let (next, s) = decode_page(&buf).unwrap();
            assert_eq!(next, i as u64 + 10);
            back.extend(s);
        }
        assert_eq!(back, slots);
        let blob = Slot {
            data: Data::Blob {
                page: 99,
                len: 1 << 20,
                crc: 5,
            },
            ..slot("big", 0)
        };
        let buf = encode_page(&[&blob], 0, 4096);
        assert_eq!(decode_page(&buf).unwrap().1, vec![blob]);
    }

    #[test]
    fn corruption_is_detected() {
        let s = slot("k", 10);
        let mut buf = encode_page(&[&s], 0, 4096);
        buf[100] ^= 1;
        assert_eq!(
            decode_page(&buf),
            Err(BadPage("bucket page checksum mismatch"))
        );
        assert!(decode_page(&[0; 4096]).is_err());
        assert!(pack(&[], 4096).is_empty());
    }
}
