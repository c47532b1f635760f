//! The control block `critio run` shares with `critio-preload`, the
//! library it preloads into every process of the command's tree.
//!
//! ```text
//!   critio run (parent)                         every process of the tree (LD_PRELOAD)
//!   ─────────────────────                       ───────────────────────────────────────
//!   writes the rules, root pid ──┐          ┌── classifies each thread (rules below),
//!   controller, every window:    │  shared  │   records it in `threads`
//!     reads fg latency window ───┤  memory  ├── foreground: adds its I/O and sync latencies
//!     sets `rate_bytes_per_sec` ─┤ (a file  ├── background: paces its writes by the rate,
//!   prints stats / explain  <────┘ /dev/shm)└── hands them to writeback in `chunk_bytes`
//! ```
//!
//! Everything in [`Control`] is an atomic or is written once by the parent
//! before the command starts, so any process may map it and read or update
//! it without locks. The layout is `repr(C)` and versioned: a library that
//! finds another magic or version leaves every call alone.
//!
//! Classification ([`classify`]): the rules are tried in order and the first
//! that matches decides; a thread no rule matches is background.
//!
//! | rule            | matches                                                   |
//! |-----------------|-----------------------------------------------------------|
//! | `main`          | the main thread of the launched process                   |
//! | `title=GLOB`    | every thread of a process whose title (`/proc/PID/cmdline`, arguments joined by spaces) matches |
//! | `thread=GLOB`   | a thread whose name (`comm`, 15 bytes) matches            |
//!
//! A glob has `*` (any run of bytes) and `?` (one byte).

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

/// "critioRN": a mapped block starts with it.
pub const MAGIC: u64 = 0x4e52_6f69_7469_7263;
/// The layout's version.
pub const VERSION: u32 = 8;
/// The kernel's idle I/O class (`ionice -c3`): served only when no other
/// class has I/O pending.
pub const IOPRIO_IDLE: u16 = 3 << 13;

/// The kernel's best-effort class at `level` (0 high ..= 7 low; `ionice -c2
/// -n LEVEL`).
pub const fn ioprio_best_effort(level: u8) -> u16 {
    (2 << 13) | (level as u16 & 7)
}

/// Rules a block holds.
pub const RULES_MAX: usize = 16;
/// Bytes of one rule's pattern.
pub const PATTERN_MAX: usize = 110;
/// Threads the classification log holds: a ring, the newest kept (a
/// server that forks a process per connection logs without end).
pub const THREADS_MAX: usize = 4096;
/// Latency histogram buckets: bucket `i` holds [2^i, 2^(i+1)) ns.
pub const BUCKETS: usize = 40;
/// Threads that may be boosted at once.
pub const BOOSTED_MAX: usize = 256;
/// Boosts on record with their waiter ([`Control::boosters`]).
pub const BOOSTERS_MAX: usize = 1024;
/// Pipes whose last writer the block remembers ([`Control::pipe_writers`]).
pub const PIPE_SLOTS: usize = 1024;
/// Blocked threads whose wait the block records ([`Control::waits`]).
pub const WAIT_SLOTS: usize = 4096;
/// The environment variable naming the control block's file.
pub const ENV_CONTROL: &str = "CRITIO_RUN_CONTROL";

/// A thread's class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Class {
    /// Serves requests: best kernel I/O priority, latencies measured.
    Foreground = 1,
    /// Everything else: idle I/O priority, writes paced.
    Background = 2,
}

impl Class {
    fn from_u32(v: u32) -> Option<Class> {
        match v {
            1 => Some(Class::Foreground),
            2 => Some(Class::Background),
            _ => None,
        }
    }

    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Class::Foreground => "foreground",
            Class::Background => "background",
        }
    }
}

/// What a rule looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RuleKind {
    /// The launched process's main thread.
    Main = 1,
    /// The process title.
    Title = 2,
    /// The thread name.
    Thread = 3,
}

/// One classification rule, as stored in the block.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct Rule {
    kind: u8,
    class: u8,
    len: u8,
    pattern: [u8; PATTERN_MAX],
}

impl Rule {
    const EMPTY: Rule = Rule {
        kind: 0,
        class: 0,
        len: 0,
        pattern: [0; PATTERN_MAX],
    };

    /// Parses `main`, `title=GLOB` or `thread=GLOB` for `class`.
    pub fn parse(text: &str, class: Class) -> Result<Rule, String> {
        let (kind, pattern) = match text.split_once('=') {
            None if text == "main" => (RuleKind::Main, ""),
            Some(("title", p)) => (RuleKind::Title, p),
            Some(("thread", p)) => (RuleKind::Thread, p),
            _ => {
                return Err(format!(
                    "`{text}` is not a rule: use `main`, `title=GLOB` or `thread=GLOB`"
                ))
            }
        };
        if pattern.len() > PATTERN_MAX {
            return Err(format!(
                "`{text}`: a pattern has at most {PATTERN_MAX} bytes"
            ));
        }
        let mut r = Rule {
            kind: kind as u8,
            class: class as u8,
            len: pattern.len() as u8,
            pattern: [0; PATTERN_MAX],
        };
        r.pattern[..pattern.len()].copy_from_slice(pattern.as_bytes());
        Ok(r)
    }

    /// What it looks at.
    pub fn kind(&self) -> Option<RuleKind> {
        match self.kind {
            1 => Some(RuleKind::Main),
            2 => Some(RuleKind::Title),
            3 => Some(RuleKind::Thread),
            _ => None,
        }
    }

    /// The class it gives.
    pub fn class(&self) -> Class {
        Class::from_u32(u32::from(self.class)).unwrap_or(Class::Background)
    }

    /// Its glob.
    pub fn pattern(&self) -> &[u8] {
        &self.pattern[..usize::from(self.len).min(PATTERN_MAX)]
    }

    /// The rule as written on a command line.
    pub fn describe(&self) -> String {
        let p = String::from_utf8_lossy(self.pattern());
        match self.kind() {
            Some(RuleKind::Main) => "main".to_owned(),
            Some(RuleKind::Title) => format!("title={p}"),
            Some(RuleKind::Thread) => format!("thread={p}"),
            None => "(empty)".to_owned(),
        }
    }
}

/// What a thread is, as [`classify`] sees it.
#[derive(Clone, Copy, Debug)]
pub struct ThreadView<'a> {
    /// It is the launched process's main thread.
    pub root_main: bool,
    /// Its process's title.
    pub title: &'a [u8],
    /// Its name.
    pub name: &'a [u8],
}

/// The class of a thread and the rule that decided it (None: the default,
/// background).
pub fn classify(rules: &[Rule], t: &ThreadView<'_>) -> (Class, Option<usize>) {
    for (i, r) in rules.iter().enumerate() {
        let hit = match r.kind() {
            Some(RuleKind::Main) => t.root_main,
            Some(RuleKind::Title) => glob(r.pattern(), t.title),
            Some(RuleKind::Thread) => glob(r.pattern(), t.name),
            None => false,
        };
        if hit {
            return (r.class(), Some(i));
        }
    }
    (Class::Background, None)
}

/// Whether `text` matches `pattern` (`*`: any run, `?`: one byte), in time
/// linear in their lengths times a small factor (no backtracking blow-up).
pub fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p] == text[t]) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// The kinds of I/O call whose latencies are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// read, pread.
    Read = 0,
    /// write, pwrite, writev, fwrite.
    Write = 1,
    /// fsync, fdatasync, sync_file_range.
    Sync = 2,
}

/// Ops kept.
pub const OPS: usize = 3;

impl Op {
    /// All of them, in index order.
    pub const ALL: [Op; OPS] = [Op::Read, Op::Write, Op::Sync];

    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Sync => "fsync",
        }
    }
}

/// The bucket of a latency.
pub fn bucket(ns: u64) -> usize {
    (63 - ns.max(1).leading_zeros() as usize).min(BUCKETS - 1)
}

/// One thread as classified, in the log `--explain` prints.
#[repr(C)]
pub struct ThreadRec {
    /// Odd while the record is being rewritten: a reader that sees the same
    /// even value before and after reading it read one whole record.
    seq: AtomicU32,
    /// Its process.
    pub pid: AtomicI32,
    /// Its thread id.
    pub tid: AtomicI32,
    /// Its class (`Class as u32`; 0 in a record never written).
    pub class: AtomicU32,
    /// The deciding rule's index + 1 (0: the default).
    pub rule: AtomicU32,
    name: [AtomicU64; 2],
    title: [AtomicU64; 8],
}

fn pack(words: &[AtomicU64], bytes: &[u8]) {
    for (i, w) in words.iter().enumerate() {
        let mut b = [0u8; 8];
        for (j, slot) in b.iter_mut().enumerate() {
            *slot = bytes.get(i * 8 + j).copied().unwrap_or(0);
        }
        w.store(u64::from_le_bytes(b), Ordering::Relaxed);
    }
}

fn unpack(words: &[AtomicU64]) -> String {
    let mut out = Vec::with_capacity(words.len() * 8);
    for w in words {
        out.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
    }
    let end = out.iter().position(|&b| b == 0).unwrap_or(out.len());
    String::from_utf8_lossy(&out[..end]).into_owned()
}

/// A thread's record, read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadInfo {
    /// Its process.
    pub pid: i32,
    /// Its thread id.
    pub tid: i32,
    /// Its class.
    pub class: Class,
    /// The deciding rule's index (None: the default).
    pub rule: Option<usize>,
    /// Its name (up to 15 bytes).
    pub name: String,
    /// Its process's title (up to 64 bytes).
    pub title: String,
}

/// The block, as mapped by every process.
#[repr(C)]
pub struct Control {
    /// [`MAGIC`].
    pub magic: u64,
    /// [`VERSION`].
    pub version: u32,
    /// 0: every call passes straight through.
    pub enabled: AtomicU32,
    /// The launched process.
    pub root_pid: AtomicI32,
    /// Rules in use.
    pub n_rules: u32,
    /// The CPU nice value a background thread gets (0: left alone), so a
    /// fork child serializing a snapshot does not take the CPU its
    /// parent's requests need.
    pub background_nice: i32,
    /// The kernel I/O priority a background thread gets (`ioprio_set`'s
    /// value: [`IOPRIO_IDLE`] or [`ioprio_best_effort`]).
    pub background_ioprio: u32,
    /// 1: a foreground thread waiting for a background thread (a
    /// `pthread_mutex` or write-held `pthread_rwlock` it holds, a
    /// `pthread_cond` it signalled last, a child in `waitpid`) boosts it
    /// and the background threads it waits for in turn (0: off).
    pub inherit_locks: u32,
    /// 1: a background thread also runs in the kernel's `SCHED_IDLE`
    /// policy (CPU time only when no other thread wants it) while it is
    /// not boosted; a foreground or boosted thread runs `SCHED_OTHER` (0:
    /// policies left alone).
    pub background_idle: u32,
    /// The rules, in order.
    pub rules: [Rule; RULES_MAX],
    /// A background writer hands its dirty data to writeback once it has
    /// written this much, and then waits for the chunk before: at most two
    /// of its chunks are in flight.
    pub chunk_bytes: AtomicU64,
    /// The controller's pace for all background writes together, in
    /// bytes/s (0: unpaced).
    pub rate_bytes_per_sec: AtomicU64,
    /// The shared pacing clock: when the next background byte may go
    /// (CLOCK_MONOTONIC ns).
    pub pace_next_ns: AtomicU64,
    /// Foreground sync latencies since the controller last looked.
    pub fg_sync_ns: AtomicU64,
    /// How many.
    pub fg_sync_count: AtomicU64,
    /// Foreground read/write latencies since the controller last looked.
    pub fg_io_ns: AtomicU64,
    /// How many.
    pub fg_io_count: AtomicU64,
    /// Latency histograms: `[class - 1][op][bucket]`.
    pub hist: [[[AtomicU64; BUCKETS]; OPS]; 2],
    /// Chunks handed to writeback by background writers.
    pub paced_chunks: AtomicU64,
    /// Their bytes.
    pub paced_bytes: AtomicU64,
    /// Time background writers waited for the pace.
    pub pace_wait_ns: AtomicU64,
    /// Time they waited for their chunks' writeback.
    pub writeback_wait_ns: AtomicU64,
    /// Bytes of appended chunks and the time their writers took for them
    /// outside pacing waits (from the end of one chunk's pacing wait to
    /// the next chunk; a descriptor's first chunk is not counted): the
    /// background's own throughput, the floor of its pace.
    pub own_bytes: AtomicU64,
    /// See `own_bytes`.
    pub own_ns: AtomicU64,
    /// Bytes of written data dropped from the page cache.
    pub dropped_bytes: AtomicU64,
    /// Chunks written in place, only started on their way to the device
    /// (never waited for: the writer may hold its own locks).
    pub kicked_chunks: AtomicU64,
    /// Their bytes.
    pub kicked_bytes: AtomicU64,
    /// Boosts of a background thread by a foreground waiter (a lock it
    /// holds, a condition variable it signalled, a child process it waits
    /// for); each thread along a chain counts once.
    pub boosts: AtomicU64,
    /// Threads boosted now, by any process of the tree: `(tid << 32) |
    /// waiters` (see critio-preload's `inherit.rs`).
    pub boosted: [AtomicU64; BOOSTED_MAX],
    /// Each boost with its waiter: `(waiter tid << 32) | boosted tid`, so
    /// that `critio run` ends the boosts of a waiter that died in its wait
    /// (killed: neither the hook's return nor a thread-local destructor
    /// runs, and the boosted thread would stay unpaced for good).
    pub boosters: [AtomicU64; BOOSTERS_MAX],
    /// The last thread of the tree that wrote to each pipe, a
    /// [`LastThread`] table keyed by the pipe's inode: a thread that reads
    /// the pipe waits for it, and a foreground one that blocks boosts it
    /// (the writer is usually another process, so the table is shared).
    pub pipe_writers: [AtomicU64; PIPE_SLOTS],
    /// Who each blocked thread of the tree waits for, so that a boost
    /// follows a chain across processes: `(tid << 32) | owner`,
    /// direct-mapped by tid (see critio-preload's `inherit.rs`).
    pub waits: [AtomicU64; WAIT_SLOTS],
    /// Controller decisions: rate cut, rate raised.
    pub rate_cuts: AtomicU64,
    /// See `rate_cuts`.
    pub rate_raises: AtomicU64,
    /// Threads classified (may exceed [`THREADS_MAX`]).
    pub n_threads: AtomicU32,
    /// The classification log.
    pub threads: [ThreadRec; THREADS_MAX],
}

impl Control {
    /// Bytes a block takes.
    pub const SIZE: usize = std::mem::size_of::<Control>();

    /// Whether a mapped block is one this code understands.
    pub fn valid(&self) -> bool {
        self.magic == MAGIC && self.version == VERSION
    }

    /// The rules in use.
    pub fn rules(&self) -> &[Rule] {
        &self.rules[..(self.n_rules as usize).min(RULES_MAX)]
    }

    /// Initializes a zeroed block: magic, rules, root pid 0 (set once the
    /// command is spawned), disabled until [`Control::enable`].
    pub fn init(
        &mut self,
        rules: &[Rule],
        chunk_bytes: u64,
        background_nice: i32,
        background_ioprio: u16,
    ) -> Result<(), String> {
        if rules.len() > RULES_MAX {
            return Err(format!("at most {RULES_MAX} rules"));
        }
        self.magic = MAGIC;
        self.version = VERSION;
        self.n_rules = rules.len() as u32;
        self.rules = [Rule::EMPTY; RULES_MAX];
        self.rules[..rules.len()].copy_from_slice(rules);
        self.chunk_bytes.store(chunk_bytes, Ordering::Relaxed);
        self.background_nice = background_nice.clamp(0, 19);
        self.background_ioprio = u32::from(background_ioprio);
        self.inherit_locks = 1;
        self.background_idle = 0;
        Ok(())
    }

    /// Turns interposition on (or off: every call passes through).
    pub fn enable(&self, on: bool) {
        self.enabled.store(u32::from(on), Ordering::Release);
    }

    /// Whether interposition is on.
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire) != 0
    }

    /// Adds one latency sample.
    pub fn record(&self, class: Class, op: Op, ns: u64) {
        self.hist[class as usize - 1][op as usize][bucket(ns)].fetch_add(1, Ordering::Relaxed);
        if class == Class::Foreground {
            let (sum, count) = if op == Op::Sync {
                (&self.fg_sync_ns, &self.fg_sync_count)
            } else {
                (&self.fg_io_ns, &self.fg_io_count)
            };
            sum.fetch_add(ns, Ordering::Relaxed);
            count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Logs a thread's classification (past [`THREADS_MAX`] over the
    /// oldest record); no allocation, so a preloaded library may call it
    /// anywhere. A record's `seq` is odd while it is rewritten, so readers
    /// never mix two records.
    pub fn log_thread(
        &self,
        pid: i32,
        tid: i32,
        class: Class,
        rule: Option<usize>,
        name: &[u8],
        title: &[u8],
    ) {
        let i = self.n_threads.fetch_add(1, Ordering::Relaxed) as usize % THREADS_MAX;
        let rec = &self.threads[i];
        rec.seq.fetch_add(1, Ordering::Relaxed); // odd: being written
        std::sync::atomic::fence(Ordering::Release);
        rec.pid.store(pid, Ordering::Relaxed);
        rec.tid.store(tid, Ordering::Relaxed);
        rec.rule
            .store(rule.map_or(0, |r| r as u32 + 1), Ordering::Relaxed);
        pack(&rec.name, name);
        pack(&rec.title, title);
        rec.class.store(class as u32, Ordering::Relaxed);
        rec.seq.fetch_add(1, Ordering::Release); // even: whole again
    }

    /// Reads one whole record with `read` (None: it is being rewritten, or
    /// was rewritten meanwhile, or was never written).
    fn read_rec<T>(rec: &ThreadRec, read: impl FnOnce(&ThreadRec) -> T) -> Option<T> {
        let before = rec.seq.load(Ordering::Acquire);
        if before % 2 == 1 || before == 0 {
            return None;
        }
        let value = read(rec);
        std::sync::atomic::fence(Ordering::Acquire);
        (rec.seq.load(Ordering::Relaxed) == before).then_some(value)
    }

    /// The records kept, oldest first.
    fn kept(&self) -> impl DoubleEndedIterator<Item = &ThreadRec> {
        let n = self.n_threads.load(Ordering::Acquire) as usize;
        (n.saturating_sub(THREADS_MAX)..n).map(|i| &self.threads[i % THREADS_MAX])
    }

    /// Whether `tid` is boosted now (its writes go unpaced).
    pub fn boosted(&self, tid: i32) -> bool {
        self.boosted.iter().any(|s| {
            let v = s.load(Ordering::Relaxed);
            (v >> 32) as u32 == tid as u32 && v & 0xffff_ffff > 0
        })
    }

    /// Adds a waiter to `tid`'s boost; false if the table is full. A tid
    /// has at most one slot with waiters: an existing one is counted up
    /// first.
    pub fn add_boost_waiter(&self, tid: i32) -> bool {
        let key = u64::from(tid as u32) << 32;
        let mine = |v: u64| v >> 32 == key >> 32 && v & 0xffff_ffff > 0;
        for slot in &self.boosted {
            let mut cur = slot.load(Ordering::Relaxed);
            while mine(cur) {
                match slot.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Relaxed)
                {
                    Ok(_) => return true,
                    Err(seen) => cur = seen,
                }
            }
        }
        let start = tid_slot(tid, BOOSTED_MAX);
        for i in 0..BOOSTED_MAX {
            let slot = &self.boosted[(start + i) % BOOSTED_MAX];
            let cur = slot.load(Ordering::Relaxed);
            if cur & 0xffff_ffff == 0
                && slot
                    .compare_exchange(cur, key | 1, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                return true;
            }
        }
        false
    }

    /// Removes a waiter from `tid`'s boost; returns the waiters left (the
    /// slot is checked to be `tid`'s on every attempt, so a slot taken over
    /// meanwhile is never counted down).
    pub fn remove_boost_waiter(&self, tid: i32) -> u64 {
        for slot in &self.boosted {
            let mut cur = slot.load(Ordering::Relaxed);
            while (cur >> 32) as u32 == tid as u32 && cur & 0xffff_ffff > 0 {
                match slot.compare_exchange_weak(cur, cur - 1, Ordering::AcqRel, Ordering::Relaxed)
                {
                    Ok(_) => return (cur & 0xffff_ffff) - 1,
                    Err(seen) => cur = seen,
                }
            }
        }
        0
    }

    /// Records that `waiter` boosts `tid`; false if the table is full.
    pub fn add_booster(&self, waiter: i32, tid: i32) -> bool {
        let v = (u64::from(waiter as u32) << 32) | u64::from(tid as u32);
        let start = tid_slot(waiter, BOOSTERS_MAX);
        (0..BOOSTERS_MAX).any(|i| {
            self.boosters[(start + i) % BOOSTERS_MAX]
                .compare_exchange(0, v, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })
    }

    /// Forgets one record of `waiter` boosting `tid`; false if there is
    /// none (it was reaped).
    pub fn remove_booster(&self, waiter: i32, tid: i32) -> bool {
        let v = (u64::from(waiter as u32) << 32) | u64::from(tid as u32);
        let start = tid_slot(waiter, BOOSTERS_MAX);
        (0..BOOSTERS_MAX).any(|i| {
            self.boosters[(start + i) % BOOSTERS_MAX]
                .compare_exchange(v, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })
    }

    /// Ends the boosts of waiters that `alive` says are gone: each record
    /// is taken and its boosted thread counted down. Returns the threads
    /// left with no waiter (to be made background again).
    pub fn reap_boosters(&self, alive: impl Fn(i32) -> bool) -> Vec<i32> {
        let mut unboosted = Vec::new();
        for slot in &self.boosters {
            if let Some(v) = take_if(slot, |v| !alive((v >> 32) as u32 as i32)) {
                let tid = v as u32 as i32;
                if self.remove_boost_waiter(tid) == 0 {
                    unboosted.push(tid);
                }
            }
        }
        unboosted
    }

    /// Clears the wait and pipe-writer records of threads that `alive`
    /// says are gone. A killed thread (its process killed in a wait, or
    /// between a pipe write and the reader's look) never clears its own,
    /// and once the kernel hands its tid to another thread a boost would
    /// follow the record to that one. A wait whose owner is gone is
    /// cleared too: nobody is left to boost along it. The kernel reuses a
    /// tid only after cycling through the whole pid space, so a record
    /// reaped within a second of its thread's death cannot reach a new
    /// one in practice. Returns how many records were cleared.
    pub fn reap_dead_records(&self, alive: impl Fn(i32) -> bool) -> usize {
        // A thread that recorded a new wait meanwhile keeps it.
        let cleared = (self.waits.iter())
            .filter_map(|slot| {
                take_if(slot, |v| {
                    !(alive((v >> 32) as u32 as i32) && alive(v as u32 as i32))
                })
            })
            .count();
        cleared + LastThread::reap(&self.pipe_writers, alive)
    }

    /// The class `tid` was last logged with, if any (a scan of the log,
    /// newest first; no allocation).
    pub fn logged_class(&self, tid: i32) -> Option<Class> {
        self.kept().rev().find_map(|r| {
            Self::read_rec(r, |r| {
                (r.tid.load(Ordering::Relaxed) == tid)
                    .then(|| Class::from_u32(r.class.load(Ordering::Relaxed)))
            })
            .flatten()
        })?
    }

    /// Each kept record's thread and class, oldest first, without the
    /// names and titles [`Control::threads`] copies out: for a caller that
    /// reads the log every window (`critio run`'s CPU floor).
    pub fn thread_classes(&self) -> impl Iterator<Item = (i32, Class)> + '_ {
        self.kept().filter_map(|rec| {
            Self::read_rec(rec, |rec| {
                let class = Class::from_u32(rec.class.load(Ordering::Relaxed))?;
                Some((rec.tid.load(Ordering::Relaxed), class))
            })
            .flatten()
        })
    }

    /// The classification log kept, oldest first.
    pub fn threads(&self) -> Vec<ThreadInfo> {
        self.kept()
            .filter_map(|rec| {
                Self::read_rec(rec, |rec| {
                    let class = Class::from_u32(rec.class.load(Ordering::Relaxed))?;
                    let rule = rec.rule.load(Ordering::Relaxed);
                    Some(ThreadInfo {
                        pid: rec.pid.load(Ordering::Relaxed),
                        tid: rec.tid.load(Ordering::Relaxed),
                        class,
                        rule: rule.checked_sub(1).map(|r| r as usize),
                        name: unpack(&rec.name),
                        title: unpack(&rec.title),
                    })
                })
                .flatten()
            })
            .collect()
    }

    /// A histogram's counts.
    pub fn histogram(&self, class: Class, op: Op) -> [u64; BUCKETS] {
        let h = &self.hist[class as usize - 1][op as usize];
        std::array::from_fn(|i| h[i].load(Ordering::Relaxed))
    }
}

/// The latency below which `q` of a histogram's samples lie (the bucket's
/// upper bound), in ns; None when empty.
pub fn quantile(h: &[u64; BUCKETS], q: f64) -> Option<u64> {
    let total: u64 = h.iter().sum();
    if total == 0 {
        return None;
    }
    let want = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, &c) in h.iter().enumerate() {
        seen += c;
        if seen >= want {
            return Some(2u64 << i);
        }
    }
    Some(2u64 << (BUCKETS - 1))
}

/// Takes a record out of `slot` (leaves 0) if there is one and `gone`
/// says so of it; a record replaced meanwhile is left alone.
fn take_if(slot: &AtomicU64, gone: impl Fn(u64) -> bool) -> Option<u64> {
    let v = slot.load(Ordering::Acquire);
    (v != 0
        && gone(v)
        && slot
            .compare_exchange(v, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok())
    .then_some(v)
}

/// The home slot of thread `tid` in a table of `slots` (open addressing
/// or direct mapping by tid).
pub fn tid_slot(tid: i32, slots: usize) -> usize {
    (tid as u32 as usize).wrapping_mul(0x9E37_79B9) % slots
}

/// A direct-mapped record of the last thread that acted on an object (a
/// condition variable signalled, a pipe written): `(tag << 22) | tid` per
/// slot, where the slot and the 42-bit tag both come from a hash of the
/// object's key (a tid is below 2^22, the kernel's PID_MAX_LIMIT). A
/// collision overwrites: the record is a heuristic, like paper 000's
/// helper record, and a wrong entry costs only a needless boost.
pub struct LastThread;

impl LastThread {
    const TID_BITS: u32 = 22;

    fn hash(key: u64, slots: usize) -> (usize, u64) {
        let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let slot = (h >> 40) as usize % slots; // 24 bits: tables up to 16M slots
        let tag = (h & ((1 << (64 - Self::TID_BITS)) - 1)) | 1; // never 0: 0 is an empty slot
        (slot, tag)
    }

    /// `tid` acted on the object `key` last.
    pub fn note(table: &[AtomicU64], key: u64, tid: i32) {
        let (slot, tag) = Self::hash(key, table.len());
        let tid = u64::from(tid as u32) & ((1 << Self::TID_BITS) - 1);
        table[slot].store((tag << Self::TID_BITS) | tid, Ordering::Relaxed);
    }

    /// Forgets `tid` as the last thread of `key`, if it still is.
    pub fn forget(table: &[AtomicU64], key: u64, tid: i32) {
        let (slot, tag) = Self::hash(key, table.len());
        let tid = u64::from(tid as u32) & ((1 << Self::TID_BITS) - 1);
        let mine = (tag << Self::TID_BITS) | tid;
        if table[slot].load(Ordering::Relaxed) == mine {
            let _ = table[slot].compare_exchange(mine, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// Clears the records of threads that `alive` says are gone; returns
    /// how many.
    pub fn reap(table: &[AtomicU64], alive: impl Fn(i32) -> bool) -> usize {
        (table.iter())
            .filter_map(|slot| take_if(slot, |v| !alive((v & ((1 << Self::TID_BITS) - 1)) as i32)))
            .count()
    }

    /// The last thread that acted on `key` (0: none recorded).
    pub fn get(table: &[AtomicU64], key: u64) -> i32 {
        let (slot, tag) = Self::hash(key, table.len());
        let v = table[slot].load(Ordering::Relaxed);
        if v >> Self::TID_BITS == tag {
            (v & ((1 << Self::TID_BITS) - 1)) as i32
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_waiters_boosts_are_reaped_and_a_live_ones_kept() {
        let c = zeroed();
        // 10 boosts 7 (and 8); 11 boosts 7 too.
        for (waiter, tid) in [(10, 7), (10, 8), (11, 7)] {
            assert!(c.add_boost_waiter(tid) && c.add_booster(waiter, tid));
        }
        assert!(c.boosted(7) && c.boosted(8));
        // 10 died: 8 has no waiter left, 7 still has 11.
        let mut left = c.reap_boosters(|t| t != 10);
        left.sort();
        assert_eq!(left, vec![8]);
        assert!(c.boosted(7) && !c.boosted(8));
        // 11's own end of the wait finds its record and counts 7 down.
        assert!(c.remove_booster(11, 7));
        assert_eq!(c.remove_boost_waiter(7), 0);
        // A record already reaped is not found twice.
        assert!(!c.remove_booster(10, 8));
        assert!(c.reap_boosters(|_| false).is_empty());
    }

    #[test]
    fn the_last_thread_is_kept_per_key_and_unknown_keys_have_none() {
        let table: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];
        assert_eq!(LastThread::get(&table, 7), 0);
        LastThread::note(&table, 7, 1234);
        LastThread::note(&table, 7, 4321);
        assert_eq!(LastThread::get(&table, 7), 4321);
        // Another key in the same slot does not read 7's thread: the tag
        // differs (a collision may overwrite, never mix).
        let other = (8..10_000)
            .find(|&k| LastThread::hash(k, 64).0 == LastThread::hash(7, 64).0)
            .unwrap();
        assert_eq!(LastThread::get(&table, other), 0);
        LastThread::note(&table, other, 99);
        assert_eq!(LastThread::get(&table, other), 99);
        assert_eq!(LastThread::get(&table, 7), 0);
        // Only the thread recorded is forgotten.
        LastThread::forget(&table, other, 98);
        assert_eq!(LastThread::get(&table, other), 99);
        LastThread::forget(&table, other, 99);
        assert_eq!(LastThread::get(&table, other), 0);
    }

    #[test]
    fn records_of_dead_threads_are_reaped_and_live_ones_kept() {
        let c = zeroed();
        let wait = |tid: u64, owner: u64| (tid << 32) | owner;
        // 5 waits for 6, 7 for 8 and 9 for 10; 8 and 9 died.
        c.waits[0].store(wait(5, 6), Ordering::Relaxed);
        c.waits[1].store(wait(7, 8), Ordering::Relaxed);
        c.waits[2].store(wait(9, 10), Ordering::Relaxed);
        // 6 and 8 wrote pipes 100 and 200 last.
        LastThread::note(&c.pipe_writers, 100, 6);
        LastThread::note(&c.pipe_writers, 200, 8);
        let dead = [8, 9];
        assert_eq!(c.reap_dead_records(|t| !dead.contains(&t)), 3);
        assert_eq!(c.waits[0].load(Ordering::Relaxed), wait(5, 6));
        assert_eq!(c.waits[1].load(Ordering::Relaxed), 0, "a dead owner");
        assert_eq!(c.waits[2].load(Ordering::Relaxed), 0, "a dead waiter");
        assert_eq!(LastThread::get(&c.pipe_writers, 100), 6);
        assert_eq!(LastThread::get(&c.pipe_writers, 200), 0);
        // Nothing is left to reap.
        assert_eq!(c.reap_dead_records(|t| !dead.contains(&t)), 0);
    }

    #[test]
    fn globs_match_as_documented() {
        assert!(glob(
            b"postgres: * * *",
            b"postgres: bench bench [local] idle"
        ));
        assert!(!glob(b"postgres: * * *", b"postgres: checkpointer"));
        assert!(glob(b"redis-rdb-*", b"redis-rdb-bgsave"));
        assert!(glob(b"bio_?of", b"bio_aof"));
        assert!(glob(b"*", b""));
        assert!(!glob(b"a", b""));
        assert!(glob(
            b"*a*a*a*a*b",
            &[b"a".repeat(60), b"b".to_vec()].concat()
        ));
        assert!(!glob(b"*a*a*a*a*b", &b"a".repeat(60)));
    }

    #[test]
    fn the_first_matching_rule_decides_and_the_default_is_background() {
        let rules = [
            Rule::parse("title=postgres: autovacuum*", Class::Background).unwrap(),
            Rule::parse("title=postgres: * * *", Class::Foreground).unwrap(),
            Rule::parse("main", Class::Foreground).unwrap(),
        ];
        let view = |title: &'static str, root_main| ThreadView {
            root_main,
            title: title.as_bytes(),
            name: b"postgres",
        };
        assert_eq!(
            classify(&rules, &view("postgres: u db [local] idle", false)),
            (Class::Foreground, Some(1))
        );
        assert_eq!(
            classify(&rules, &view("postgres: autovacuum worker db x", false)),
            (Class::Background, Some(0))
        );
        assert_eq!(
            classify(&rules, &view("postgres: checkpointer", false)),
            (Class::Background, None)
        );
        assert_eq!(
            classify(&rules, &view("redis-server *:6379", true)),
            (Class::Foreground, Some(2))
        );
        let e = Rule::parse("pid=1", Class::Foreground).unwrap_err();
        assert!(e.contains("title=GLOB"), "{e}");
        assert_eq!(rules[1].describe(), "title=postgres: * * *");
    }

    #[test]
    fn a_zeroed_block_initializes_logs_and_reads_back() {
        let mut block: Box<Control> = zeroed();
        assert!(!block.valid());
        let rules = [Rule::parse("main", Class::Foreground).unwrap()];
        block.init(&rules, 1 << 20, 10, IOPRIO_IDLE).unwrap();
        assert!(block.valid() && !block.is_enabled());
        block.enable(true);
        let info = ThreadInfo {
            pid: 7,
            tid: 9,
            class: Class::Background,
            rule: None,
            name: "bio_aof".into(),
            title: "redis-rdb-bgsave".into(),
        };
        block.log_thread(
            7,
            9,
            Class::Background,
            None,
            b"bio_aof",
            b"redis-rdb-bgsave",
        );
        assert_eq!(block.threads(), vec![info]);
        assert_eq!(block.logged_class(9), Some(Class::Background));
        assert_eq!(block.logged_class(10), None);
        block.record(Class::Foreground, Op::Sync, 1500);
        assert_eq!(block.histogram(Class::Foreground, Op::Sync)[10], 1);
        assert_eq!(block.fg_sync_count.load(Ordering::Relaxed), 1);
        assert_eq!(
            quantile(&block.histogram(Class::Foreground, Op::Sync), 0.99),
            Some(2048)
        );
        assert_eq!(quantile(&[0; BUCKETS], 0.5), None);
    }

    #[test]
    fn the_thread_log_keeps_the_newest_past_its_size() {
        let mut block: Box<Control> = zeroed();
        let rules = [Rule::parse("main", Class::Foreground).unwrap()];
        block.init(&rules, 1 << 20, 10, IOPRIO_IDLE).unwrap();
        let total = THREADS_MAX + 10;
        for tid in 1..=total as i32 {
            let class = if tid % 2 == 0 {
                Class::Foreground
            } else {
                Class::Background
            };
            block.log_thread(tid, tid, class, None, b"t", b"title");
        }
        let kept = block.threads();
        assert_eq!(kept.len(), THREADS_MAX);
        let classes: Vec<(i32, Class)> = block.thread_classes().collect();
        let from_threads: Vec<(i32, Class)> = kept.iter().map(|t| (t.tid, t.class)).collect();
        assert_eq!(classes, from_threads, "the same records, without names");
        assert_eq!(kept[0].tid, 11, "the oldest ten were overwritten");
        assert_eq!(kept.last().unwrap().tid, total as i32);
        assert_eq!(block.logged_class(total as i32), Some(Class::Foreground));
        assert_eq!(
            block.logged_class(total as i32 - 1),
            Some(Class::Background)
        );
        assert_eq!(block.logged_class(3), None, "overwritten");
        // A tid logged again (a retitled process) reads as its newest class.
        block.log_thread(11, 11, Class::Foreground, Some(0), b"t", b"title");
        assert_eq!(block.logged_class(11), Some(Class::Foreground));
    }

    /// A zeroed block on the heap, as a fresh mapping gives it.
    fn zeroed() -> Box<Control> {
        let layout = std::alloc::Layout::new::<Control>();
        // SAFETY: every field of Control is an integer, an atomic or an
        // array of them, for which all-zero bytes are a valid value; the
        // allocation has Control's layout and is owned by the Box.
        unsafe {
            let p = std::alloc::alloc_zeroed(layout).cast::<Control>();
            assert!(!p.is_null());
            Box::from_raw(p)
        }
    }
}
