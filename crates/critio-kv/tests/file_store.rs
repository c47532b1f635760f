//! A store on a real file (the pool backend: pread/pwrite through the
//! page cache, in the build's temporary directory, which is on disk):
//! what only a file system brings. A new store's regions are written
//! once, so no later write meets a block the file system has not written;
//! a second store opened on the same image is refused while the first has
//! it.

use std::path::PathBuf;

use critio::device::DeviceSpec;
use critio_kv::engine::{EngineConfig, Layout, SetOptions};
use critio_kv::stack::default_critio_config;
use critio_kv::{Scheme, Stack, StackConfig};
use rustix::fs::{seek, SeekFrom};

const MIB: u64 = 1 << 20;
const CAPACITY: u64 = 128 * MIB;

/// An image path of its own in the build's temporary directory, removed
/// on drop.
struct Image(PathBuf);

impl Image {
    fn new(name: &str) -> Self {
        let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("kv-file-{name}-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        Image(p)
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn engine_config() -> EngineConfig {
    EngineConfig {
        log_bytes: 32 * MIB,
        ..EngineConfig::default()
    }
}

fn open(image: &Image) -> Result<Stack, String> {
    let mut critio = default_critio_config();
    critio.cache.capacity_bytes = 4 * MIB;
    Stack::open(&StackConfig {
        device: DeviceSpec::Pool(image.0.clone()),
        capacity: CAPACITY,
        scheme: Scheme::Rcp,
        critio,
        engine: engine_config(),
        ..StackConfig::default()
    })
    .map_err(|e| e.to_string())
}

/// The first written byte at or after `at` (`end` if none).
fn data_from(file: &std::fs::File, at: u64, end: u64) -> u64 {
    match seek(file, SeekFrom::Data(at)) {
        Ok(n) => n,
        Err(rustix::io::Errno::NXIO) => end,
        Err(e) => panic!("SEEK_DATA: {e}"),
    }
}

/// Whether the file system says which reserved blocks are still
/// unwritten (as holes: ext4 and xfs do).
fn reports_unwritten() -> bool {
    let probe = Image::new("probe");
    let f = std::fs::File::create(&probe.0).unwrap();
    rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, MIB).is_ok()
        && data_from(&f, 0, MIB) == MIB
}

#[test]
fn a_new_store_on_a_file_has_its_dump_file_and_value_log_written_once() {
    if !reports_unwritten() {
        eprintln!("skipped: the file system does not report unwritten blocks");
        return;
    }
    let image = Image::new("regions");
    let stack = open(&image).unwrap();
    let cfg = engine_config();
    let layout = Layout::new(CAPACITY, cfg.log_bytes, cfg.dump_pct, 4096).unwrap();
    let (start, end) = (layout.dump.0, layout.data.0 + layout.data.1 * layout.page);
    let file = std::fs::File::open(&image.0).unwrap();
    let hole = seek(&file, SeekFrom::Hole(start)).unwrap();
    assert!(
        data_from(&file, start, end) == start && hole >= end,
        "the dump file and the value log [{start}, {end}) are written: data from {}, a hole at \
         {hole}",
        data_from(&file, start, end)
    );
    drop(stack);
}

#[test]
fn a_second_store_on_the_same_image_is_refused_and_the_first_keeps_its_data() {
    let image = Image::new("locked");
    let first = open(&image).unwrap();
    first
        .engine
        .set(b"k", b"before", SetOptions::default())
        .unwrap();
    let e = open(&image)
        .err()
        .expect("a second store on the image is refused");
    assert!(e.contains("in use"), "{e}");
    assert_eq!(
        first.engine.get(b"k").unwrap().as_deref(),
        Some(&b"before"[..])
    );
    first
        .engine
        .set(b"k", b"after", SetOptions::default())
        .unwrap();
    drop(first);
    let again = open(&image).expect("free once the first is closed");
    assert_eq!(
        again.engine.get(b"k").unwrap().as_deref(),
        Some(&b"after"[..])
    );
}

/// While a store's server holds its image, the last dump reads from the
/// file on its own (`critio dump` on a running server): the same entries
/// as the server's own read. A BGSAVE that ends while it is read makes
/// the read end in an error, never a mix of two dumps; a config of
/// another layout is refused.
#[test]
fn the_last_dump_reads_from_the_image_while_its_store_is_open() {
    use critio_kv::engine::{image_dump, EngineError};
    let image = Image::new("image-dump");
    let stack = open(&image).unwrap();
    let e = &stack.engine;
    let bgsave = || {
        e.bgsave().unwrap();
        while e.background_running() != (false, false) {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert!(e.background_stats().last_error.is_none());
    };
    e.save().unwrap();
    let none = image_dump(&image.0, &engine_config()).unwrap();
    assert!(!none.exists(), "no dump yet");
    for i in 0..3000u32 {
        let v = format!("{i}").repeat(100);
        e.set(
            format!("k{i}").as_bytes(),
            v.as_bytes(),
            SetOptions::default(),
        )
        .unwrap();
    }
    bgsave();
    let own = e.read_dump().unwrap();
    assert_eq!(own.len(), 3000);
    let read = image_dump(&image.0, &engine_config()).unwrap();
    assert!(read.exists() && read.keys() == 3000);
    let read: Vec<_> = read.collect::<Result<_, _>>().unwrap();
    assert!(read == own, "the server's own read and the file's differ");
    image_dump(&image.0, &engine_config())
        .unwrap()
        .check()
        .unwrap();

    // A BGSAVE that ends after the header was read: the body is still the
    // old one (beside which the new one went), but the read ends in an
    // error, before the first chunk's entries, rather than pass the old
    // dump off as the current one.
    let reading = image_dump(&image.0, &engine_config()).unwrap();
    let before = reading.id();
    e.set(b"later", b"x", SetOptions::default()).unwrap();
    bgsave();
    let items: Vec<_> = reading.collect();
    assert!(
        matches!(&items[..], [Err(EngineError::Busy(m))] if m.contains("replaced")),
        "{} items, the last {:?}",
        items.len(),
        items.last()
    );
    let now = image_dump(&image.0, &engine_config()).unwrap();
    assert!(now.id() != before && now.keys() == 3001);
    assert!(image_dump(&image.0, &engine_config())
        .unwrap()
        .check()
        .is_ok());

    // Another layout: refused, not read from the wrong place.
    let other = EngineConfig {
        dump_pct: 20,
        ..engine_config()
    };
    let err = image_dump(&image.0, &other).err().expect("refused");
    assert!(err.to_string().contains("not this store's"), "{err}");
    stack.engine.close().unwrap();
}
