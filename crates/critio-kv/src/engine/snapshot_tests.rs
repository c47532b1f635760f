//! BGSAVE's point in time under stress: every dump holds each writer's keys
//! as they were at one moment of the BGSAVE call, while writers, the
//! cleaner (BGREWRITEAOF, expiry sweeps, partial cleans, cleaning for
//! space in a small value log, pauses between a batch's copies and its
//! repoints) and checkpoints all run; after each round the engine is
//! closed or dropped (a crash), and reopened: its last dump reads back the
//! same, and every key is as its writer's last op left it.
//!
//! ```text
//!  writer w (sequential ops 1, 2, ...: SET with and without expiry, SET NX,
//!            APPEND, DEL, MSET, EXPIRE, PERSIST, HSET, HDEL, transactions
//!            over three or four keys):
//!            started[w] = i; op i; its keys' states after i; acked[w] = i
//!  controller: a = acked[..]; BGSAVE; s = started[..]; wait; read the dump
//!  check:    for each writer some m in [a[w], s[w]] such that every key of
//!            w is in the dump exactly as after its op m, value and expiry
//!            (a key whose expiry had passed when BGSAVE returned may be
//!            missing; one in the dump must not have expired when BGSAVE
//!            was called); no other key is in the dump
//! ```
//!
//! `SEED=n` picks a run's ops and pauses (the interleaving is the
//! machine's); `ROUNDS` (reopens, default 3) and `DUMPS` (BGSAVEs per
//! round, default 40) make it longer. A hang fails it: every wait is
//! bounded, and a minute without a dump fails the test.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use critio::device::mem::MemDevice;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::clean::tests::{open_with, wait_until};
use super::ops::now_ms;
use super::{Engine, EngineConfig, EngineError, ExpireIf, SetOptions, Value};

const WRITERS: usize = 4;
/// String keys per writer (each writer also has one hash); the first
/// [`HOT`] are written most.
const STRINGS: usize = 32;
const HOT: usize = 6;
/// An appended string longer than this is SET afresh instead.
const LONG: usize = 6000;

/// A small engine over `dev`: a value log of about 4 MiB (so cleaning for
/// space runs), a checkpoint every 10 ms.
fn open(dev: &Arc<MemDevice>) -> Engine {
    let cfg = EngineConfig {
        log_bytes: 4 << 20,
        checkpoint_interval_ms: 10,
        value_bytes_max: 16 << 10,
        ..EngineConfig::default()
    };
    open_with(dev.clone(), cfg).unwrap()
}

/// A key's value and expiry as the check compares them (`desc`, the value
/// without its padding, only names it in messages).
#[derive(Clone, Debug)]
struct Seen {
    fp: u64,
    expire: u64,
    desc: String,
}

impl Seen {
    fn of(v: &Value, expire: u64) -> Seen {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let desc = match v {
            Value::Str(s) => {
                0u8.hash(&mut h);
                s.hash(&mut h);
                let d: Vec<u8> = s.iter().copied().filter(|&b| b != b'.').collect();
                format!("{:.120}", String::from_utf8_lossy(&d))
            }
            Value::Hash(m) => {
                1u8.hash(&mut h);
                m.hash(&mut h);
                let fields: Vec<String> = m
                    .iter()
                    .map(|(f, v)| {
                        format!(
                            "{}={}",
                            String::from_utf8_lossy(f),
                            String::from_utf8_lossy(v)
                        )
                    })
                    .collect();
                format!("{{{}}}", fields.join(","))
            }
        };
        Seen {
            fp: h.finish(),
            expire,
            desc,
        }
    }

    fn same(&self, other: &Seen) -> bool {
        self.fp == other.fp && self.expire == other.expire
    }
}

/// Whether a dump that holds `got` for a key may have been taken when the
/// key was `want`, at a moment between `call` and `returned` (ms, when
/// BGSAVE was called and when it returned): a key whose expiry had passed
/// at that moment is left out.
fn matches(want: Option<&Seen>, got: Option<&Seen>, call: u64, returned: u64) -> bool {
    match (want, got) {
        (None, None) => true,
        (None, Some(_)) => false,
        (Some(w), Some(g)) => w.same(g) && (w.expire == 0 || w.expire > call),
        (Some(w), None) => w.expire != 0 && w.expire <= returned,
    }
}

/// Publishes what each writer does: the op it started last and the op
/// acknowledged last.
struct Published {
    started: Vec<AtomicU64>,
    acked: Vec<AtomicU64>,
}

/// One writer: its keys, their values now, and every state each key went
/// through, by op.
struct Writer {
    w: usize,
    keys: Vec<Vec<u8>>,
    now: Vec<Option<(Value, u64)>>,
    /// Per key: (op, the key's state after it), from op 0 (absent).
    history: Vec<Vec<(u64, Option<Seen>)>>,
    op: u64,
    rng: SmallRng,
}

/// A key's index among its writer's: the strings, then the hash.
const HASH: usize = STRINGS;

impl Writer {
    fn new(w: usize, seed: u64) -> Writer {
        let mut keys: Vec<Vec<u8>> = (0..STRINGS)
            .map(|j| format!("w{w}s{j}").into_bytes())
            .collect();
        keys.push(format!("w{w}h").into_bytes());
        Writer {
            w,
            now: vec![None; keys.len()],
            history: vec![vec![(0, None)]; keys.len()],
            keys,
            op: 0,
            rng: SmallRng::seed_from_u64(seed ^ (w as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        }
    }

    /// The key's state after op `m`.
    fn state_at(&self, k: usize, m: u64) -> Option<&Seen> {
        let h = &self.history[k];
        let at = h.partition_point(|(op, _)| *op <= m);
        h[at - 1].1.as_ref()
    }

    /// A string value of key `j` written by op `i` (`.` pads it).
    fn value(&mut self, j: usize, i: u64) -> Vec<u8> {
        let mut v = format!("w{}s{j}@{i}:", self.w).into_bytes();
        let pad = self.rng.gen_range(20..3000);
        v.resize(v.len() + pad, b'.');
        v
    }

    fn tail(&mut self, i: u64) -> Vec<u8> {
        let mut t = format!("+{i}").into_bytes();
        let pad = self.rng.gen_range(0..200);
        t.resize(t.len() + pad, b'.');
        t
    }

    /// No expiry, one an hour away, or one due within 80 ms.
    fn expiry(&mut self) -> u64 {
        match self.rng.gen_range(0..20) {
            0..=10 => 0,
            11..=15 => now_ms() + 3_600_000,
            _ => now_ms() + self.rng.gen_range(0..80),
        }
    }

    /// A string key: mostly a hot one, so the cold ones keep their values
    /// (and expire) for a while.
    fn string(&mut self) -> usize {
        if self.rng.gen_bool(0.7) {
            self.rng.gen_range(0..HOT)
        } else {
            self.rng.gen_range(0..STRINGS)
        }
    }

    /// Distinct string keys.
    fn strings(&mut self, n: usize) -> Vec<usize> {
        let mut all: Vec<usize> = (0..STRINGS).collect();
        for i in 0..n {
            let j = self.rng.gen_range(i..STRINGS);
            all.swap(i, j);
        }
        all.truncate(n);
        all
    }

    fn string_len(&self, j: usize) -> usize {
        match &self.now[j] {
            Some((Value::Str(s), _)) => s.len(),
            Some(_) => unreachable!("string keys hold strings"),
            None => 0,
        }
    }

    /// Checks that key `k` was `alive` for an op that ran between `before`
    /// and `after` (ms), as its expiry says; the engine decided.
    fn check_alive(&self, k: usize, alive: bool, before: u64, after: u64) {
        let ok = match &self.now[k] {
            None => !alive,
            Some((_, 0)) => alive,
            Some((_, e)) if *e > after => alive,
            Some((_, e)) if *e <= before => !alive,
            Some(_) => true,
        };
        assert!(
            ok,
            "writer {}: key {:?} was {} for an op between {before} and {after} ms, holding {:?}",
            self.w,
            String::from_utf8_lossy(&self.keys[k]),
            if alive { "live" } else { "absent" },
            self.now[k].as_ref().map(|(_, e)| e)
        );
    }

    /// Key `j`'s string after appending `tail` to it, by an op that found
    /// it `alive`.
    fn appended(&self, j: usize, tail: &[u8], alive: bool) -> (Value, u64) {
        match (&self.now[j], alive) {
            (Some((Value::Str(s), e)), true) => {
                let mut s = s.clone();
                s.extend_from_slice(tail);
                (Value::Str(s), *e)
            }
            _ => (Value::Str(tail.to_vec()), 0),
        }
    }

    /// Whether an APPEND of `tail` to key `j` that returned `len` found the
    /// key live (a live string is never empty).
    fn append_found(&self, j: usize, tail: &[u8], len: u64) -> bool {
        let old = self.string_len(j);
        let alive = old > 0 && len == (old + tail.len()) as u64;
        assert!(
            alive || len == tail.len() as u64,
            "writer {}: APPEND to a {old}-byte string of {} bytes returned {len}",
            self.w,
            tail.len()
        );
        alive
    }

    /// Runs the next op on `e`; publishes it as started before, acked
    /// after.
    fn step(&mut self, e: &Engine, p: &Published) -> Result<(), EngineError> {
        let i = self.op + 1;
        p.started[self.w].store(i, Ordering::SeqCst);
        let before = now_ms();
        let mut changes: Vec<(usize, Option<(Value, u64)>)> = Vec::new();
        let key = |s: &Self, k: usize| s.keys[k].clone();
        match self.rng.gen_range(0..100) {
            0..=24 => {
                let j = self.string();
                let v = self.value(j, i);
                let expire = self.expiry();
                let opts = SetOptions {
                    expire_at_ms: (expire != 0).then_some(expire),
                    ..SetOptions::default()
                };
                assert!(e.set(&key(self, j), &v, opts)?);
                changes.push((j, Some((Value::Str(v), expire))));
            }
            25..=29 => {
                let j = self.string();
                let v = self.value(j, i);
                let opts = SetOptions {
                    nx: true,
                    ..SetOptions::default()
                };
                let set = e.set(&key(self, j), &v, opts)?;
                self.check_alive(j, !set, before, now_ms());
                if set {
                    changes.push((j, Some((Value::Str(v), 0))));
                }
            }
            30..=49 => {
                let j = self.string();
                let k = key(self, j);
                if self.string_len(j) > LONG {
                    let v = self.value(j, i);
                    assert!(e.set(&k, &v, SetOptions::default())?);
                    changes.push((j, Some((Value::Str(v), 0))));
                } else {
                    let tail = self.tail(i);
                    let len = e.transact(&[&k[..]], |t| t.append(&k, &tail))??;
                    let alive = self.append_found(j, &tail, len);
                    self.check_alive(j, alive, before, now_ms());
                    changes.push((j, Some(self.appended(j, &tail, alive))));
                }
            }
            50..=57 => {
                let n = self.rng.gen_range(1..=2);
                let js = self.strings(n);
                let ks: Vec<Vec<u8>> = js.iter().map(|&j| key(self, j)).collect();
                let refs: Vec<&[u8]> = ks.iter().map(|k| &k[..]).collect();
                e.del(&refs)?;
                changes.extend(js.into_iter().map(|j| (j, None)));
            }
            58..=67 => {
                let n = self.rng.gen_range(2..=3);
                let js = self.strings(n);
                let ks: Vec<Vec<u8>> = js.iter().map(|&j| key(self, j)).collect();
                let vs: Vec<Vec<u8>> = js.iter().map(|&j| self.value(j, i)).collect();
                let pairs: Vec<(&[u8], &[u8])> =
                    ks.iter().zip(&vs).map(|(k, v)| (&k[..], &v[..])).collect();
                e.mset(&pairs)?;
                for (j, v) in js.into_iter().zip(vs) {
                    changes.push((j, Some((Value::Str(v), 0))));
                }
            }
            68..=79 => {
                // One transaction: a SET (maybe with expiry), an APPEND (or
                // a SET of a long string) and a DEL, and maybe an HSET.
                let js = self.strings(3);
                let (a, b, c) = (js[0], js[1], js[2]);
                let va = self.value(a, i);
                let expire = self.expiry();
                let long_b = self.string_len(b) > LONG;
                let vb = if long_b {
                    self.value(b, i)
                } else {
                    self.tail(i)
                };
                let field = self.rng.gen_bool(0.5).then(|| {
                    (
                        format!("f{}", self.rng.gen_range(0..6)).into_bytes(),
                        format!("{i}").into_bytes(),
                    )
                });
                let mut ks: Vec<Vec<u8>> = vec![key(self, a), key(self, b), key(self, c)];
                if field.is_some() {
                    ks.push(key(self, HASH));
                }
                let refs: Vec<&[u8]> = ks.iter().map(|k| &k[..]).collect();
                let opts = SetOptions {
                    expire_at_ms: (expire != 0).then_some(expire),
                    ..SetOptions::default()
                };
                let (len, added) = e.transact(&refs, |t| -> Result<_, EngineError> {
                    t.set(&ks[0], &va, opts)?;
                    let len = if long_b {
                        t.set(&ks[1], &vb, SetOptions::default())?;
                        0
                    } else {
                        t.append(&ks[1], &vb)?
                    };
                    t.remove(&ks[2]);
                    let added = match &field {
                        Some((f, v)) => t.hset(&ks[3], &[(&f[..], &v[..])])?,
                        None => 0,
                    };
                    Ok((len, added))
                })??;
                changes.push((a, Some((Value::Str(va), expire))));
                if long_b {
                    changes.push((b, Some((Value::Str(vb), 0))));
                } else {
                    let alive = self.append_found(b, &vb, len);
                    self.check_alive(b, alive, before, now_ms());
                    changes.push((b, Some(self.appended(b, &vb, alive))));
                }
                changes.push((c, None));
                if let Some((f, v)) = field {
                    changes.push((HASH, Some(self.hset(f, v, added))));
                }
            }
            80..=89 => {
                let f = format!("f{}", self.rng.gen_range(0..6)).into_bytes();
                if self.rng.gen_bool(0.7) {
                    let v = format!("{i}").into_bytes();
                    let added = e.hset(&key(self, HASH), &[(&f[..], &v[..])])?;
                    changes.push((HASH, Some(self.hset(f, v, added))));
                } else {
                    let removed = e.hdel(&key(self, HASH), &[&f[..]])?;
                    let mut h = match &self.now[HASH] {
                        Some((Value::Hash(h), _)) => h.clone(),
                        _ => BTreeMap::new(),
                    };
                    let had = h.remove(&f).is_some();
                    assert_eq!(removed, u64::from(had), "writer {}: HDEL", self.w);
                    if had {
                        let state = (!h.is_empty()).then_some((Value::Hash(h), 0));
                        changes.push((HASH, state));
                    }
                }
            }
            90..=94 => {
                let j = self.string();
                let k = key(self, j);
                let at = now_ms() + 3_600_000;
                let done = e.transact(&[&k[..]], |t| t.expire_at(&k, at, ExpireIf::Always))??;
                self.check_alive(j, done, before, now_ms());
                if done {
                    let (v, _) = self.now[j].clone().expect("a live key");
                    changes.push((j, Some((v, at))));
                }
            }
            _ => {
                let j = self.string();
                let k = key(self, j);
                let done = e.transact(&[&k[..]], |t| t.persist(&k))??;
                match &self.now[j] {
                    Some((v, exp)) if *exp != 0 => {
                        let v = v.clone();
                        self.check_alive(j, done, before, now_ms());
                        if done {
                            changes.push((j, Some((v, 0))));
                        }
                    }
                    _ => assert!(!done, "writer {}: PERSIST of no expiry", self.w),
                }
            }
        }
        for (k, state) in changes {
            let seen = state.as_ref().map(|(v, e)| Seen::of(v, *e));
            self.now[k] = state;
            self.history[k].push((i, seen));
        }
        self.op = i;
        p.acked[self.w].store(i, Ordering::SeqCst);
        Ok(())
    }

    /// The hash after HSET of `f` = `v` returned `added`.
    fn hset(&self, f: Vec<u8>, v: Vec<u8>, added: u64) -> (Value, u64) {
        let mut h = match &self.now[HASH] {
            Some((Value::Hash(h), _)) => h.clone(),
            _ => BTreeMap::new(),
        };
        let new = h.insert(f, v).is_none();
        assert_eq!(added, u64::from(new), "writer {}: HSET", self.w);
        (Value::Hash(h), 0)
    }
}

/// One dump and the window it was called in.
struct Dump {
    /// Per writer: the op acknowledged last before BGSAVE was called, and
    /// the op started last when it returned.
    acked: Vec<u64>,
    started: Vec<u64>,
    /// When BGSAVE was called, and when the call returned (ms).
    call: u64,
    returned: u64,
    entries: HashMap<Vec<u8>, Seen>,
}

fn read_dump(e: &Engine) -> HashMap<Vec<u8>, Seen> {
    let mut out = HashMap::new();
    for x in e.read_dump().unwrap() {
        let seen = Seen::of(&x.value, x.expire_at_ms);
        assert!(
            out.insert(x.key.clone(), seen).is_none(),
            "the dump holds {:?} twice",
            String::from_utf8_lossy(&x.key)
        );
    }
    out
}

/// Checks dump `n` against the writers' histories.
fn check_dump(seed: u64, round: usize, n: usize, d: &Dump, writers: &[Writer]) {
    let ctx = format!(
        "dump {n} of round {round} (BGSAVE called at {} ms, returned at {} ms); reproduce with SEED={seed}",
        d.call, d.returned
    );
    let mut known = 0;
    for (w, wr) in writers.iter().enumerate() {
        let (a, s) = (d.acked[w], d.started[w]);
        let got: Vec<Option<&Seen>> = wr.keys.iter().map(|k| d.entries.get(k)).collect();
        known += got.iter().filter(|g| g.is_some()).count();
        let fits = |m: u64| {
            (0..wr.keys.len()).all(|k| matches(wr.state_at(k, m), got[k], d.call, d.returned))
        };
        if (a..=s).any(fits) {
            continue;
        }
        let mut why = String::new();
        for (k, key) in wr.keys.iter().enumerate() {
            let bad: Vec<u64> = (a..=s)
                .filter(|&m| !matches(wr.state_at(k, m), got[k], d.call, d.returned))
                .collect();
            if bad.is_empty() {
                continue;
            }
            why += &format!(
                "\n  {}: the dump holds {:?}; it does not fit after ops {:?}; states:",
                String::from_utf8_lossy(key),
                got[k].map(|g| (&g.desc, g.expire)),
                bad
            );
            let from = wr.history[k].partition_point(|(op, _)| *op <= a).max(1) - 1;
            for (op, st) in wr.history[k][from..].iter().take_while(|(op, _)| *op <= s) {
                why += &format!(
                    "\n    after op {op}: {:?}",
                    st.as_ref().map(|g| (&g.desc, g.expire))
                );
            }
        }
        panic!("writer {w}: no op in [{a}, {s}] after which its keys were as dumped:{why}\n{ctx}");
    }
    assert_eq!(
        known,
        d.entries.len(),
        "the dump holds keys no writer wrote: {:?}\n{ctx}",
        d.entries
            .keys()
            .filter(|k| !writers.iter().any(|w| w.keys.contains(k)))
            .map(|k| String::from_utf8_lossy(k))
            .collect::<Vec<_>>()
    );
}

/// Checks that every writer's keys in `e` are as its last op left them.
fn check_store(seed: u64, what: &str, e: &Engine, writers: &[Writer]) {
    for wr in writers {
        for (k, key) in wr.keys.iter().enumerate() {
            let before = now_ms();
            let got = e
                .transact(&[&key[..]], |t| t.entry(key).map(|x| x.cloned()))
                .unwrap()
                .unwrap();
            let after = now_ms();
            let ok = match (&wr.now[k], &got) {
                (None, None) => true,
                (Some((v, exp)), Some((gv, gexp))) => {
                    v == gv && exp == gexp && (*exp == 0 || *exp > before)
                }
                (Some((_, exp)), None) => *exp != 0 && *exp <= after,
                (None, Some(_)) => false,
            };
            assert!(
                ok,
                "{what}: key {:?} holds {:?}, its writer's last op left {:?}; reproduce with SEED={seed}",
                String::from_utf8_lossy(key),
                got.as_ref().map(|(v, e)| (Seen::of(v, *e).desc, e)),
                wr.now[k].as_ref().map(|(v, e)| (Seen::of(v, *e).desc, e)),
            );
        }
    }
}

/// Sets the flag when dropped (also when the round panics, so its
/// threads stop).
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Joins `t`, failing after 30 s ([`wait_until`]).
fn join<T>(what: &str, t: std::thread::JoinHandle<T>) -> T {
    wait_until(what, || t.is_finished());
    t.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// One round on `e`: writers, the cleaner and `dumps` BGSAVEs, each
/// checked; returns the engine, the writers and the last dump.
fn round(
    seed: u64,
    r: usize,
    dumps: usize,
    e: Engine,
    writers: Vec<Writer>,
    beat: &mpsc::Sender<()>,
) -> (Engine, Vec<Writer>, HashMap<Vec<u8>, Seen>) {
    let e = Arc::new(e);
    let stop = Arc::new(AtomicBool::new(false));
    let _stop = StopOnDrop(stop.clone());
    let p = Arc::new(Published {
        started: writers.iter().map(|w| AtomicU64::new(w.op)).collect(),
        acked: writers.iter().map(|w| AtomicU64::new(w.op)).collect(),
    });
    let threads: Vec<_> = writers
        .into_iter()
        .map(|mut wr| {
            let (e, p, stop) = (e.clone(), p.clone(), stop.clone());
            std::thread::spawn(move || {
                // Requests: not throttled to a background writer's few
                // dirty pages.
                let _fg = critio::context::foreground();
                while !stop.load(Ordering::SeqCst) {
                    if let Err(err) = wr.step(&e, &p) {
                        panic!("writer {}, op {}: {err}; SEED={seed}", wr.w, wr.op + 1);
                    }
                }
                wr
            })
        })
        .collect();
    let cleaner = {
        let (e, stop) = (e.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(seed ^ 0x0c1e_a0e5 ^ r as u64);
            // This thread's cleaning sometimes pauses between a batch's
            // copies and their repoints, so BGSAVEs begin and end there.
            let pauses = std::cell::RefCell::new(SmallRng::seed_from_u64(rng.gen()));
            super::clean::tests::BEFORE_REPOINT.with(|h| {
                *h.borrow_mut() = Some(Box::new(move || {
                    let mut rng = pauses.borrow_mut();
                    if rng.gen_ratio(1, 4) {
                        let us = rng.gen_range(0..3000);
                        std::thread::sleep(Duration::from_micros(us));
                    }
                }))
            });
            while !stop.load(Ordering::SeqCst) {
                let fail = |what: &str, err: EngineError| -> ! {
                    panic!("the cleaner's {what}: {err}; SEED={seed}")
                };
                match rng.gen_range(0..14) {
                    0..=2 => {
                        match e.bgrewrite() {
                            Ok(()) | Err(EngineError::Busy(_)) => {}
                            Err(err) => fail("BGREWRITEAOF", err),
                        }
                        wait_until("BGREWRITEAOF ends", || !e.background_running().1);
                    }
                    3..=4 => {
                        if let Err(err) = e.inner.sweep_expired() {
                            fail("expiry sweep", err);
                        }
                    }
                    5..=7 => {
                        // Part of the log: the clean tail stops anywhere.
                        let (tail, head) = e.inner.vlog.boundary();
                        let upto = tail + rng.gen_range(0..=head - tail);
                        if let Err(err) = e.inner.clean(upto, None) {
                            fail("partial clean", err);
                        }
                    }
                    8 => {
                        if let Err(err) = e.save() {
                            fail("checkpoint", err);
                        }
                    }
                    // Pauses, in which the writers fill the log and the
                    // checkpointer cleans for space.
                    9..=11 => std::thread::sleep(Duration::from_millis(rng.gen_range(1..60))),
                    _ => std::thread::sleep(Duration::from_millis(rng.gen_range(100..300))),
                }
            }
        })
    };
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x00b6_5a7e ^ r as u64);
    let mut taken = Vec::with_capacity(dumps);
    for n in 0..dumps {
        let before = e.background_stats().snapshots;
        let acked: Vec<u64> = p.acked.iter().map(|a| a.load(Ordering::SeqCst)).collect();
        let call = now_ms();
        e.bgsave()
            .unwrap_or_else(|err| panic!("BGSAVE {n}: {err}; SEED={seed}"));
        let returned = now_ms();
        let started: Vec<u64> = p.started.iter().map(|a| a.load(Ordering::SeqCst)).collect();
        wait_until("BGSAVE ends", || !e.background_running().0);
        let stats = e.background_stats();
        assert_eq!(
            stats.snapshots,
            before + 1,
            "BGSAVE {n} of round {r} failed: {:?}; SEED={seed}",
            stats.last_error
        );
        taken.push(Dump {
            acked,
            started,
            call,
            returned,
            entries: read_dump(&e),
        });
        let _ = beat.send(());
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..20)));
    }
    stop.store(true, Ordering::SeqCst);
    let writers: Vec<Writer> = threads
        .into_iter()
        .map(|t| join("a writer stops", t))
        .collect();
    join("the cleaner stops", cleaner);
    wait_until("the background jobs end", || {
        e.background_running() == (false, false)
    });
    for (n, d) in taken.iter().enumerate() {
        check_dump(seed, r, n, d, &writers);
    }
    check_store(seed, &format!("round {r}"), &e, &writers);
    let stats = e.background_stats();
    assert!(
        stats.last_error.is_none(),
        "round {r}: {:?}; SEED={seed}",
        stats.last_error
    );
    let e = Arc::into_inner(e).expect("no other thread holds the engine");
    let last = taken.pop().expect("at least one dump").entries;
    (e, writers, last)
}

fn run(seed: u64, rounds: usize, dumps: usize, beat: &mpsc::Sender<()>) {
    let dev = Arc::new(MemDevice::new(10 << 20));
    let mut e = open(&dev);
    let mut writers: Vec<Writer> = (0..WRITERS).map(|w| Writer::new(w, seed)).collect();
    for r in 0..rounds {
        let (done, ws, last) = round(seed, r, dumps, e, writers, beat);
        writers = ws;
        // A clean close, or a crash (no final checkpoint: the log replays).
        if r % 2 == 0 {
            done.close().unwrap();
        }
        drop(done);
        e = open(&dev);
        let reread = read_dump(&e);
        let same = reread.len() == last.len()
            && last
                .iter()
                .all(|(k, v)| reread.get(k).is_some_and(|g| g.same(v)));
        assert!(
            same,
            "round {r}: the last dump reads back otherwise after a reopen ({} keys, {} before); SEED={seed}",
            reread.len(),
            last.len()
        );
        check_store(seed, &format!("reopened after round {r}"), &e, &writers);
    }
    e.close().unwrap();
    let ops: u64 = writers.iter().map(|w| w.op).sum();
    eprintln!("seed {seed}: {rounds} rounds of {dumps} dumps, {ops} ops");
}

/// See the module docs.
#[test]
fn every_dump_holds_each_writers_keys_as_of_one_moment_of_its_bgsave_call() {
    let env = |name: &str, default: u64| -> u64 {
        std::env::var(name).map_or(default, |v| {
            v.parse().unwrap_or_else(|_| panic!("{name} is a number"))
        })
    };
    let seeds: Vec<u64> = match std::env::var("SEED") {
        Ok(s) => vec![s.parse().expect("SEED is a number")],
        Err(_) => vec![1],
    };
    let (rounds, dumps) = (env("ROUNDS", 3) as usize, env("DUMPS", 40) as usize);
    for seed in seeds {
        let (beat, heard) = mpsc::channel();
        let t = std::thread::spawn(move || run(seed, rounds, dumps, &beat));
        // Each dump beats: a minute without one is a hang.
        loop {
            match heard.recv_timeout(Duration::from_secs(60)) {
                Ok(()) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("no dump for a minute: a hang; reproduce with SEED={seed}")
                }
            }
        }
        if let Err(p) = t.join() {
            std::panic::resume_unwind(p);
        }
    }
}
