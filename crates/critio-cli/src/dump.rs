//! `critio dump`: the last BGSAVE of a store, as Redis commands.
//!
//! critio-kv's BGSAVE writes every key as of its start into the dump file
//! inside the store's image, where the server itself never reads it back
//! (a restart recovers from checkpoints and the log). This command makes
//! it a backup a user can move. With the store's server running (the
//! image's lock held: [`crate::serve::held_image`]) it reads the dump from
//! the image file on its own ([`critio_kv::engine::image_dump`], the
//! layout from the server's config, the reads `O_DIRECT`); with the server
//! stopped it opens the store ([`critio_kv::engine::Engine::dump_entries`],
//! beside the store's own index and a 64 MiB page cache). Either way it
//! reads the dump a chunk at a time (a chunk, a frame and an entry in
//! memory, whatever the dump's size), and writes each key as the commands
//! that recreate it, in the protocol `redis-cli --pipe` sends to a server:
//!
//! ```text
//!  string:  SET key value [PXAT ms]
//!  hash:    DEL key, HSET key field value ... (at most 256 fields a command) [, PEXPIREAT key ms]
//! ```
//!
//! `critio dump --data DIR --device file | redis-cli -p 6390 --pipe` loads
//! it into a critio-kv (or a Redis: both take these commands). Keys whose
//! expiry has passed by the time of the export are left out.
//!
//! The dump's checksum covers its whole body, so it is known to be
//! intact only once the last chunk is read: to a file, the commands go to
//! `FILE.partial` (locked, so that a second export to the same FILE at
//! once is refused), renamed to FILE (after an `fsync`) only then; to
//! standard output, which a reader may act on at once, the body is read
//! once for its checksum before anything is written
//! ([`critio_kv::engine::DumpEntries::check`]). A BGSAVE that ends while
//! a running server's dump is read makes the read end in an error (the
//! header it began with has changed, which the read checks after each
//! chunk, so no command comes from bytes of two dumps): to a file,
//! nothing is kept; between the check and the output pass, nothing is
//! written; during the output pass to standard output, what went out is
//! the start of the checked dump, and the command fails saying so.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use critio_kv::engine::{image_dump, DumpEntries, EngineError, Entry, Value};

use crate::serve::{engine_config, held_image, open_existing, DeviceKind};

/// `critio dump`'s options.
#[derive(Args, Debug)]
pub struct DumpArgs {
    /// The store's data directory, as given to `critio serve`.
    #[arg(long, value_name = "DIR", default_value = "critio-data")]
    data: PathBuf,
    /// The store's device, as given to `critio serve`.
    #[arg(long, value_enum, default_value = "sim")]
    device: DeviceKind,
    /// The config its server runs with (for its [engine] layout); the
    /// page cache is 64 MiB whatever it says.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Where to write the commands; `-` for standard output.
    #[arg(long, value_name = "FILE", default_value = "-")]
    out: PathBuf,
}

/// The page cache `critio dump` opens a store with: the dump is read past
/// it, so it only serves the store's recovery.
const CACHE_BYTES: u64 = 64 << 20;
/// Fields of a hash per HSET.
const HSET_FIELDS: usize = 256;

/// Runs `critio dump`.
pub fn run(args: DumpArgs) -> Result<(), String> {
    let started = Instant::now();
    if let Some(image) = held_image(&args.data, args.device) {
        // Its server runs: the image's lock keeps a second opener out, and
        // the dump is read from the file on its own.
        let cfg = engine_config(args.device, args.config.as_deref())?;
        // A background job beside the server's requests: the lowest
        // best-effort I/O priority (the kernel's schedulers that weigh
        // levels serve the server's reads first; none starves it) and 10
        // CPU nice levels down. Best effort: refused, it runs as it is.
        let _ = critio::sys::set_thread_ioprio(0, critio::sys::IoPriority::BestEffort(7));
        let _ = rustix::process::setpriority_process(None, 10);
        eprintln!(
            "critio dump: {} is held by its running server: reading its last dump from the \
             file, at I/O priority best-effort 7 and nice 10 (a BGSAVE that ends meanwhile \
             makes this run fail: run it again)",
            image.display()
        );
        let summary = export(&|| image_dump(&image, &cfg), &args.out, started)?;
        eprintln!("{summary}");
        return Ok(());
    }
    let stack = open_existing(&args.data, args.device, args.config.as_deref(), CACHE_BYTES)?;
    let result = export(&|| stack.engine.dump_entries(), &args.out, started);
    // The export writes nothing to the store; the close takes a final
    // checkpoint, as a server's stop does.
    let closed = stack
        .engine
        .close()
        .map_err(|e| format!("cannot close the store: {e}"));
    let summary = result?;
    closed?;
    eprintln!("{summary}");
    Ok(())
}

/// Writes the entries of the dump `open` reads to `out` (`-`: standard
/// output); what it did.
fn export<'a>(
    open: &dyn Fn() -> Result<DumpEntries<'a>, EngineError>,
    out: &Path,
    started: Instant,
) -> Result<String, String> {
    let entries = open().map_err(|e| format!("cannot read the dump: {e}"))?;
    if !entries.exists() {
        return Err(
            "the store holds no dump (or a BGSAVE is writing over the last one): run BGSAVE on \
             its server (redis-cli -p PORT BGSAVE), wait until INFO persistence says \
             rdb_bgsave_in_progress:0, then run critio dump"
                .to_owned(),
        );
    }
    let to_stdout = out == Path::new("-");
    let entries = if to_stdout {
        let checked = entries.id();
        entries.check().map_err(|e| {
            format!("the dump is damaged or was replaced, nothing was written: {e}")
        })?;
        let again = open().map_err(|e| format!("cannot read the dump: {e}"))?;
        if again.id() != checked {
            return Err(
                "a BGSAVE replaced the dump while it was checked, nothing was written: run again"
                    .to_owned(),
            );
        }
        again
    } else {
        entries
    };
    let partial = partial_path(out);
    // The partial file's lock, held until it is renamed: a second export
    // to the same FILE at once is refused rather than write over this
    // one's (a lock dies with its process: a killed export's partial
    // file is taken over).
    let mut held = None;
    let sink: Box<dyn Write> = if to_stdout {
        Box::new(std::io::stdout().lock())
    } else {
        let f = take_partial(&partial)?;
        held = Some(
            f.try_clone()
                .map_err(|e| format!("cannot write {}: {e}", partial.display()))?,
        );
        Box::new(Streamed::new(f))
    };
    let mut w = Written::new(BufWriter::with_capacity(1 << 20, sink));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let total = entries.keys();
    let mut expired = 0u64;
    let mut written = 0u64;
    let mut last_note = Instant::now();
    let outcome = (|| -> Result<(), String> {
        for entry in entries {
            let entry = entry.map_err(|e| match (&e, to_stdout) {
                (EngineError::Busy(_), true) => {
                    format!("{e}; the commands written so far are the start of the dump only")
                }
                _ => format!("the dump is damaged or was replaced: {e}"),
            })?;
            if entry.expire_at_ms != 0 && entry.expire_at_ms <= now {
                expired += 1;
                continue;
            }
            commands(&mut w, &entry).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
            written += 1;
            if last_note.elapsed() >= Duration::from_secs(2) {
                last_note = Instant::now();
                eprintln!(
                    "critio dump: {} of {total} keys ({:.0}%)",
                    written + expired,
                    (written + expired) as f64 * 100.0 / total.max(1) as f64
                );
            }
        }
        w.flush()
            .map_err(|e| format!("cannot write {}: {e}", out.display()))
    })();
    let bytes = w.bytes;
    let sink = w.inner.into_inner();
    let outcome = outcome.and_then(|()| {
        sink.map(drop)
            .map_err(|e| format!("cannot write {}: {}", out.display(), e.error()))
    });
    if let Err(e) = outcome {
        if !to_stdout {
            let _ = std::fs::remove_file(&partial);
        }
        return Err(e);
    }
    if let Some(f) = held {
        let done = f
            .sync_all()
            .and_then(|()| std::fs::rename(&partial, out))
            .and_then(|()| sync_dir_of(out));
        if let Err(e) = done {
            let _ = std::fs::remove_file(&partial);
            return Err(format!("cannot write {}: {e}", out.display()));
        }
    }
    let expired_note = match expired {
        0 => String::new(),
        n => format!(", {n} expired since the BGSAVE left out"),
    };
    Ok(format!(
        "critio dump: {written} keys, {bytes} bytes of commands, to {} in {:.1} s{expired_note}",
        if to_stdout {
            "standard output".to_owned()
        } else {
            out.display().to_string()
        },
        started.elapsed().as_secs_f64()
    ))
}

/// Makes a rename into `path`'s directory durable.
fn sync_dir_of(path: &Path) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

/// Opens `partial` for an export, empty, with its lock (`flock`) taken;
/// refused while another export holds it.
fn take_partial(partial: &Path) -> Result<std::fs::File, String> {
    use rustix::fs::{flock, FlockOperation};
    let f = std::fs::File::options()
        .write(true)
        .create(true)
        .truncate(false)
        .open(partial)
        .map_err(|e| format!("cannot create {}: {e}", partial.display()))?;
    match flock(&f, FlockOperation::NonBlockingLockExclusive) {
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
            return Err(format!(
                "another critio dump is writing to the same file ({} is locked): wait for it, \
                 or choose another --out",
                partial.display()
            ))
        }
        // A file system without locks: as before them.
        _ => {}
    }
    f.set_len(0)
        .map_err(|e| format!("cannot write {}: {e}", partial.display()))?;
    Ok(f)
}

/// Where a file export is written until the dump has been read whole.
fn partial_path(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    out.with_file_name(name)
}

/// A writer that counts its bytes.
struct Written<W: Write> {
    inner: W,
    bytes: u64,
}

impl<W: Write> Written<W> {
    fn new(inner: W) -> Self {
        Self { inner, bytes: 0 }
    }
}

impl<W: Write> Write for Written<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A file written front to back and not read again: every [`WINDOW`] or
/// so its last window's pages go to the disk (`sync_file_range`) and the
/// window's before are waited for and dropped from the page cache
/// (`POSIX_FADV_DONTNEED`; the last window stays, flushed by the export's
/// `fsync`), so that an export of gigabytes never holds
/// more than two windows dirty for the kernel to flush at once (beside a
/// running server on a small machine, a gigabyte flushed at once held its
/// requests up for tens of milliseconds) nor pushes others' pages out of
/// the cache.
struct Streamed {
    file: std::fs::File,
    /// Bytes written, where the window being filled began, and where the
    /// one before it began (its writeback started, not yet waited for).
    at: u64,
    window_start: u64,
    before: Option<u64>,
}

/// [`Streamed`]'s window.
const WINDOW: u64 = 8 << 20;

impl Streamed {
    fn new(file: std::fs::File) -> Self {
        Self {
            file,
            at: 0,
            window_start: 0,
            before: None,
        }
    }

    /// Starts the full window's writeback; waits for the one before and
    /// drops it from the cache. (A window ends where the write that filled
    /// it ended: a buffered writer's writes overshoot [`WINDOW`].)
    fn turn(&mut self) -> std::io::Result<()> {
        use rustix::fs::{fadvise, Advice};
        let start = self.window_start;
        sync_range(&self.file, start, self.at - start, false)?;
        if let Some(before) = self.before {
            sync_range(&self.file, before, start - before, true)?;
            let _ = fadvise(
                &self.file,
                before,
                std::num::NonZeroU64::new(start - before),
                Advice::DontNeed,
            );
        }
        self.before = Some(start);
        self.window_start = self.at;
        Ok(())
    }
}

/// `sync_file_range` over `len` bytes of `file` from `at`: start their
/// writeback, or (`wait`) also wait for it, before and after.
fn sync_range(file: &std::fs::File, at: u64, len: u64, wait: bool) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let flags = if wait {
        libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER
    } else {
        libc::SYNC_FILE_RANGE_WRITE
    };
    // SAFETY: the call takes a descriptor `file` keeps open and integers;
    // no memory is passed.
    let r = unsafe { libc::sync_file_range(file.as_raw_fd(), at as i64, len as i64, flags) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl Write for Streamed {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.at += n as u64;
        if self.at - self.window_start >= WINDOW {
            self.turn()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// The commands that recreate `entry`.
fn commands(w: &mut impl Write, entry: &Entry) -> std::io::Result<()> {
    let key = &entry.key[..];
    let at = entry.expire_at_ms.to_string();
    match &entry.value {
        Value::Str(v) if entry.expire_at_ms == 0 => resp(w, &[b"SET", key, v]),
        Value::Str(v) => resp(w, &[b"SET", key, v, b"PXAT", at.as_bytes()]),
        Value::Hash(h) => {
            resp(w, &[b"DEL", key])?;
            let fields: Vec<(&Vec<u8>, &Vec<u8>)> = h.iter().collect();
            for part in fields.chunks(HSET_FIELDS) {
                let mut args: Vec<&[u8]> = Vec::with_capacity(2 + 2 * part.len());
                args.push(b"HSET");
                args.push(key);
                for (f, v) in part {
                    args.push(f);
                    args.push(v);
                }
                resp(w, &args)?;
            }
            if entry.expire_at_ms != 0 {
                resp(w, &[b"PEXPIREAT", key, at.as_bytes()])?;
            }
            Ok(())
        }
    }
}

/// One command as a RESP array of bulk strings.
fn resp(w: &mut impl Write, args: &[&[u8]]) -> std::io::Result<()> {
    write!(w, "*{}\r\n", args.len())?;
    for a in args {
        write!(w, "${}\r\n", a.len())?;
        w.write_all(a)?;
        w.write_all(b"\r\n")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn text(entry: &Entry) -> String {
        let mut out = Vec::new();
        commands(&mut out, entry).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn each_kind_of_entry_becomes_the_commands_that_recreate_it() {
        let s = |v: &[u8], at| Entry {
            key: b"k".to_vec(),
            expire_at_ms: at,
            value: Value::Str(v.to_vec()),
        };
        assert_eq!(
            text(&s(b"v\r\n", 0)),
            "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv\r\n\r\n"
        );
        assert_eq!(
            text(&s(b"", 1700000000123)),
            "*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n$4\r\nPXAT\r\n$13\r\n1700000000123\r\n"
        );
        let mut h = BTreeMap::new();
        for i in 0..HSET_FIELDS + 1 {
            h.insert(format!("f{i}").into_bytes(), b"x".to_vec());
        }
        let hash = Entry {
            key: b"h".to_vec(),
            expire_at_ms: 5,
            value: Value::Hash(h),
        };
        let t = text(&hash);
        assert!(t.starts_with("*2\r\n$3\r\nDEL\r\n$1\r\nh\r\n"), "{t}");
        assert_eq!(t.matches("HSET").count(), 2, "256 fields a command");
        assert!(t.contains(&format!("*{}\r\n$4\r\nHSET", 2 + 2 * HSET_FIELDS)));
        assert!(
            t.contains("*4\r\n$4\r\nHSET\r\n$1\r\nh\r\n"),
            "the last field alone"
        );
        assert!(t.ends_with("*3\r\n$9\r\nPEXPIREAT\r\n$1\r\nh\r\n$1\r\n5\r\n"));
    }

    #[test]
    fn a_file_export_is_written_beside_its_name_first() {
        assert_eq!(
            partial_path(Path::new("/b/dump.resp")),
            Path::new("/b/dump.resp.partial")
        );
    }
}
