//! The operations the server calls, all through one write path:
//!
//! ```text
//!  stripes (sorted) ─> current entries (values read only if the op needs them)
//!   ─> decide ops ─> room in the value log? (else unlock, wait, retry)
//!   ─> epoch (shared) ─> WAL append (else unlock, wait, retry)
//!   ─> value-log append ─> index ─> unlock ─> WAL commit (durable)
//!
//! Lock order: stripes, then the epoch, then the value log. A checkpoint
//! boundary takes only the epoch (exclusive), FLUSHALL every stripe.
//! ```
//!
//! Logging and applying under the same stripe locks keeps each key's log
//! order equal to its apply order, so replay rebuilds exactly this state.

use critio::cache::CachedRead;
use critio::sync::MutexGuard;

use super::entry::Value;
use super::index::{Index, Loc, Stripe, STRIPES};
use super::record::{self, Record, KIND_DEL};
use super::txn::{Kind, Txn};
use super::vlog::{Reservation, Who};
use super::wal::{self, Op};
use super::{Engine, EngineError, Inner};

/// How long an event loop's read spins for a key's stripe a background
/// thread holds before it hands the request to a miss reader: a BGSAVE's
/// lookup holds one for a moment, the cleaner a batch's stripes for 37 µs
/// at the median (at the lock ceiling, not preempted; see `clean.rs`),
/// and the hand-off costs two thread wake-ups, each of them a wait for a
/// CPU when the CPUs are busy. Under a BGSAVE/BGREWRITEAOF loop
/// (critio-kv, 300k keys, GETs alone; vda) it cut the requests parked on
/// a stripe from 590-680 to 30-40 per 600k GETs (parked on locks less
/// `cache_busy`).
const STRIPE_SPIN: std::time::Duration = std::time::Duration::from_micros(100);

/// A hash's (field, value) pairs.
pub type FieldValues = Vec<(Vec<u8>, Vec<u8>)>;

/// SET's options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetOptions {
    /// Only if the key does not exist.
    pub nx: bool,
    /// Only if the key exists.
    pub xx: bool,
    /// Expire at this time (ms since the Unix epoch).
    pub expire_at_ms: Option<u64>,
    /// Keep the key's expiry (`KEEPTTL`; without it and without
    /// `expire_at_ms`, SET clears any expiry).
    pub keep_ttl: bool,
    /// Return the old string (`GET`; WRONGTYPE if the key holds a hash).
    pub get: bool,
}

/// A key's current entry: where it is, and its value if the operation
/// asked for it.
pub(crate) struct Found {
    pub(crate) loc: Loc,
    pub(crate) value: Option<Value>,
}

/// What a request that did not wait needs before it runs again without
/// waiting long: a value record [`Engine::try_get`] did not find in the
/// page cache, or found there under a cache part a background thread held,
/// or an index stripe a background thread held ([`Engine::try_get`],
/// [`Engine::busy`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefetch(Need);

impl Prefetch {
    /// It waits for a lock a background thread held (an index stripe, a
    /// cache part), not for the device.
    pub fn waits_for_lock(&self) -> bool {
        matches!(self.0, Need::Stripe(_) | Need::Part { .. })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Need {
    /// The record at `addr`, of `size` bytes, loaded into the cache.
    Read { addr: u64, size: u32 },
    /// This index stripe free: waiting for it (as a foreground thread)
    /// makes its holder critical until it lets go.
    Stripe(usize),
    /// The record at `addr` was cached, but a background thread held a
    /// cache part of its pages: loading it waits for the part (as a
    /// foreground thread: the holder is critical until it lets go).
    Part { addr: u64, size: u32 },
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Value-log records of operations, contiguous, with each one's size.
pub(crate) struct Encoded {
    pub(crate) bytes: Vec<u8>,
    pub(crate) sizes: Vec<usize>,
}

impl Encoded {
    pub(crate) fn of(ops: &[Op]) -> Encoded {
        let mut e = Encoded {
            bytes: Vec::new(),
            sizes: Vec::with_capacity(ops.len()),
        };
        for op in ops {
            let at = e.bytes.len();
            match op {
                Op::Put(entry) => {
                    let value = entry.value.encode();
                    record::encode(
                        &Record {
                            kind: entry.value.kind(),
                            expire_at_ms: entry.expire_at_ms,
                            key: &entry.key,
                            value: &value,
                        },
                        &mut e.bytes,
                    );
                }
                Op::Del(key) => record::encode(
                    &Record {
                        kind: KIND_DEL,
                        expire_at_ms: 0,
                        key,
                        value: &[],
                    },
                    &mut e.bytes,
                ),
                Op::FlushAll => record::encode(
                    &Record {
                        kind: record::KIND_FLUSHALL,
                        expire_at_ms: 0,
                        key: &[],
                        value: &[],
                    },
                    &mut e.bytes,
                ),
            }
            e.sizes.push(e.bytes.len() - at);
        }
        e
    }

    pub(crate) fn largest(&self) -> u64 {
        self.sizes.iter().copied().max().unwrap_or(0) as u64
    }
}

/// The stripes a write holds, in stripe order.
pub(crate) struct Held<'a> {
    stripes: Vec<(usize, MutexGuard<'a, Stripe>)>,
}

impl<'a> Held<'a> {
    /// Locks the stripes of `keys`, in stripe order.
    pub(crate) fn lock(index: &'a Index, keys: &[&[u8]]) -> Held<'a> {
        let mut s: Vec<usize> = keys.iter().map(|k| Index::stripe_of(k)).collect();
        s.sort_unstable();
        s.dedup();
        Held {
            stripes: s.into_iter().map(|i| (i, index.lock(i))).collect(),
        }
    }

    /// The (held) stripe of `key`.
    pub(crate) fn of(&mut self, key: &[u8]) -> &mut Stripe {
        let s = Index::stripe_of(key);
        let at = self
            .stripes
            .binary_search_by_key(&s, |(i, _)| *i)
            .expect("the key's stripe is held");
        &mut self.stripes[at].1
    }
}

impl Inner {
    fn check_key(&self, key: &[u8]) -> Result<(), EngineError> {
        if key.len() > self.cfg.key_bytes_max {
            return Err(EngineError::KeyTooLarge {
                len: key.len(),
                max: self.cfg.key_bytes_max,
            });
        }
        Ok(())
    }

    fn check_ops(&self, ops: &[Op]) -> Result<(), EngineError> {
        for op in ops {
            if let Op::Put(e) = op {
                self.check_key(&e.key)?;
                let len = e.value.stored_len();
                if len > self.cfg.value_bytes_max {
                    return Err(EngineError::ValueTooLarge {
                        what: match e.value {
                            Value::Str(_) => "value",
                            Value::Hash(_) => "hash (its fields and values together)",
                        },
                        len,
                        max: self.cfg.value_bytes_max,
                    });
                }
            }
        }
        Ok(())
    }

    /// Reads the value of the record at `loc`, checking it is `key`'s.
    pub(crate) fn load_value(&self, key: &[u8], loc: &Loc) -> Result<Value, EngineError> {
        let buf = self.vlog.read(loc.addr, loc.size)?;
        self.decode_value(key, loc, &buf)
    }

    /// The value of `key` from its record's bytes `buf`, checked to be
    /// `key`'s.
    fn decode_value(&self, key: &[u8], loc: &Loc, buf: &[u8]) -> Result<Value, EngineError> {
        let r = self.vlog.decode(loc.addr, buf)?;
        if r.key != key || r.kind != loc.kind {
            return Err(EngineError::Corrupt(format!(
                "value log record at {} is not key {:?}'s",
                loc.addr,
                String::from_utf8_lossy(key)
            )));
        }
        Value::decode(r.kind, r.value)
            .ok_or_else(|| EngineError::Corrupt(format!("value of key {key:?} does not decode")))
    }

    /// `key`'s entry in its (locked) stripe, if present and not expired;
    /// its value is read only if `load`.
    fn lookup(
        &self,
        stripe: &Stripe,
        key: &[u8],
        now: u64,
        load: bool,
    ) -> Result<Option<Found>, EngineError> {
        let Some(loc) = stripe.get(key).filter(|l| !l.expired(now)) else {
            return Ok(None);
        };
        let value = if load {
            Some(self.load_value(key, &loc)?)
        } else {
            None
        };
        Ok(Some(Found { loc, value }))
    }

    /// Reads one key.
    pub(crate) fn read(&self, key: &[u8]) -> Result<Option<Found>, EngineError> {
        let stripe = self.index.lock(Index::stripe_of(key));
        self.lookup(&stripe, key, now_ms(), true)
    }

    /// Reads one key if its value is cached and neither its stripe nor a
    /// cache part of its value's pages is held by a background thread:
    /// Err names the record to prefetch on a miss or a held part, or the
    /// stripe to wait for. Never waits for the device or for a
    /// background thread's lock (another request's, briefly).
    fn read_cached(&self, key: &[u8]) -> Result<Result<Option<Found>, Prefetch>, EngineError> {
        let s = Index::stripe_of(key);
        // Another request's hold (microseconds) is waited for.
        let Some(stripe) = self.index.lock_unless_background(s, STRIPE_SPIN) else {
            return Ok(Err(Prefetch(Need::Stripe(s))));
        };
        let Some(Found { loc, .. }) = self.lookup(&stripe, key, now_ms(), false)? else {
            return Ok(Ok(None));
        };
        let (addr, size) = (loc.addr, loc.size);
        match self.vlog.read_cached(addr, size)? {
            (CachedRead::Hit, buf) => {
                let value = Some(self.decode_value(key, &loc, &buf)?);
                Ok(Ok(Some(Found { loc, value })))
            }
            (CachedRead::Miss, _) => Ok(Err(Prefetch(Need::Read { addr, size }))),
            (CachedRead::Busy, _) => Ok(Err(Prefetch(Need::Part { addr, size }))),
        }
    }

    /// The write path: `decide` sees the current entries of `keys` (None:
    /// absent or expired; values read only if `load`) and returns the
    /// operations to log and apply, and the caller's result.
    pub(crate) fn mutate<R>(
        &self,
        keys: &[&[u8]],
        load: bool,
        mut decide: impl FnMut(&[Option<Found>]) -> Result<(Vec<Op>, R), EngineError>,
    ) -> Result<R, EngineError> {
        // No write puts a key longer than `key_bytes_max` in the index
        // (`check_ops` refuses it), so reading one finds it absent, as
        // Redis would answer.
        loop {
            if let Some(e) = self.failure() {
                return Err(e);
            }
            // Throttled here, the writer holds no lock: the value log's
            // append does not throttle under its lock (`prepare_appending`).
            self.cache.balance_dirty()?;
            let mut held = Held::lock(&self.index, keys);
            let now = now_ms();
            let current = keys
                .iter()
                .map(|k| self.lookup(held.of(k), k, now, load))
                .collect::<Result<Vec<_>, _>>()?;
            let (ops, result) = decide(&current)?;
            if ops.is_empty() {
                return Ok(result);
            }
            self.check_ops(&ops)?;
            let enc = Encoded::of(&ops);
            let growth = live_growth(&ops, &enc, &mut held);
            let bytes = enc.bytes.len() as u64;
            let reserved = self
                .vlog
                .try_reserve(bytes, enc.largest(), growth, Who::Writer);
            if matches!(reserved, Err(EngineError::NoSpace)) {
                self.want_sweep(); // expired keys may hold the budget
            }
            let Some(mut res) = reserved? else {
                drop(held);
                self.vlog
                    .wait_for_space(bytes, enc.largest(), || self.want_cleaning());
                continue;
            };
            // Only logging and applying (memory) happen under the epoch lock,
            // so a checkpoint boundary never waits for a writer's disk reads.
            let epoch = self.epoch.read();
            let payload = wal::encode(&ops);
            let Some(lsn) = self.log.try_append(&payload)? else {
                drop((res, epoch, held));
                self.log.wait_for_space(payload.len())?;
                continue;
            };
            if let Err(e) = self.apply(&ops, &enc, &mut res, &mut held) {
                self.fail(e.to_string());
                return Err(e);
            }
            drop((res, epoch, held));
            self.commit_or_defer(lsn)?;
            return Ok(result);
        }
    }

    /// Appends logged `ops` (encoded as `enc`) to the value log and points
    /// the index at them, in the held stripes.
    pub(crate) fn apply(
        &self,
        ops: &[Op],
        enc: &Encoded,
        res: &mut Reservation<'_>,
        held: &mut Held<'_>,
    ) -> Result<(), EngineError> {
        let (addrs, snapshot) = self.vlog.append(res, &enc.bytes, &enc.sizes)?;
        for ((op, &addr), &size) in ops.iter().zip(&addrs).zip(&enc.sizes) {
            let (key, loc) = match op {
                Op::Put(e) => {
                    let loc = Loc {
                        addr,
                        size: size as u32,
                        kind: e.value.kind(),
                        expire_at_ms: e.expire_at_ms,
                    };
                    (&e.key, Some(loc))
                }
                Op::Del(k) => (k, None),
                Op::FlushAll => unreachable!("FLUSHALL has its own path"),
            };
            let old = held.of(key).set(key, loc, snapshot);
            let delta = loc.map_or(0, |l| i64::from(l.size)) - old.map_or(0, |l| i64::from(l.size));
            self.vlog.add_live(delta);
            self.index
                .count(i64::from(loc.is_some()) - i64::from(old.is_some()));
        }
        Ok(())
    }

    /// Asks the checkpointer to clean (a writer waits for space).
    pub(crate) fn want_cleaning(&self) {
        self.ckpt.lock().requested = true;
        self.ckpt_cv.notify_all();
    }

    /// Asks the checkpointer to drop expired keys (a writer was refused
    /// for the live-data limit, which they count against).
    pub(crate) fn want_sweep(&self) {
        let mut st = self.ckpt.lock();
        if !st.sweep {
            st.sweep = true;
            drop(st);
            self.ckpt_cv.notify_all();
        }
    }
}

/// How much the live data grows if `ops` apply (each put adds its record,
/// each key changed gives back its old one).
fn live_growth(ops: &[Op], enc: &Encoded, held: &mut Held<'_>) -> i64 {
    let mut growth = 0i64;
    for (op, &size) in ops.iter().zip(&enc.sizes) {
        let key = match op {
            Op::Put(e) => {
                growth += size as i64;
                &e.key
            }
            Op::Del(k) => k,
            Op::FlushAll => continue,
        };
        if let Some(old) = held.of(key).get(key) {
            growth -= i64::from(old.size);
        }
    }
    growth
}

/// The string of a key read with its value; WRONGTYPE for a hash.
fn string(found: Option<Found>) -> Result<Option<Vec<u8>>, EngineError> {
    match found {
        None => Ok(None),
        Some(Found {
            value: Some(Value::Str(s)),
            ..
        }) => Ok(Some(s)),
        Some(_) => Err(EngineError::WrongType),
    }
}

impl Engine {
    /// GET.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        let found = self.inner.read(key)?;
        string(found)
    }

    /// GET if the value is in the page cache and neither the key's index
    /// stripe nor its value's cache parts are held by a background thread;
    /// otherwise what to
    /// [`Engine::prefetch`] before GET finds them so. Never waits for the
    /// device or for a background job's lock, so an event loop serving many
    /// clients can hand the wait to a thread that may.
    pub fn try_get(&self, key: &[u8]) -> Result<Result<Option<Vec<u8>>, Prefetch>, EngineError> {
        Ok(match self.inner.read_cached(key)? {
            Ok(found) => Ok(string(found)?),
            Err(p) => Err(p),
        })
    }

    /// Loads a value a [`Engine::try_get`] missed into the page cache, in
    /// the caller's class (a foreground thread's read is critical), or
    /// waits until the stripe it found held is free (a foreground waiter
    /// makes the holder critical meanwhile). The value's place may have
    /// changed meanwhile (an overwrite, a log rewrite), or the stripe be
    /// taken again: then the retried request misses or waits once more.
    pub fn prefetch(&self, p: &Prefetch) -> Result<(), EngineError> {
        match p.0 {
            Need::Read { addr, size } | Need::Part { addr, size } => {
                self.inner.vlog.prefetch(addr, size)
            }
            Need::Stripe(s) => {
                drop(self.inner.index.lock(s));
                Ok(())
            }
        }
    }

    /// Whether a request over `keys` would now wait for a lock a thread
    /// that is not foreground (a background job) holds: the first such
    /// stripe, to [`Engine::prefetch`] (wait for) before the request runs.
    /// A stripe another request holds is not named: it is held for
    /// microseconds, less than a hand-off costs. A snapshot of a moment:
    /// the request may still wait, briefly, if the stripe is taken again.
    pub fn busy(&self, keys: &[&[u8]]) -> Option<Prefetch> {
        // The lock word names its holder: nothing is locked to ask.
        keys.iter()
            .map(|k| Index::stripe_of(k))
            .find(|&s| self.inner.index.held_by_background(s))
            .map(|s| Prefetch(Need::Stripe(s)))
    }

    /// Runs `f` as one transaction over `keys` (see [`Txn`]): every key it
    /// reads or writes must be among `keys`; its writes are applied
    /// atomically and logged as one record, durable before this returns
    /// (or at the caller's group commit, see [`Engine::defer_commits`]).
    /// `f` may run more than once; the last run's result is returned.
    pub fn transact<R>(
        &self,
        keys: &[&[u8]],
        mut f: impl FnMut(&mut Txn<'_>) -> R,
    ) -> Result<R, EngineError> {
        let inner = &*self.inner;
        inner.mutate(keys, false, |cur| {
            let mut t = Txn::new(inner, keys, cur);
            let r = f(&mut t);
            Ok((t.into_ops(), r))
        })
    }

    /// Like [`Engine::transact`] for one operation that may fail: an error
    /// is returned as is (the operation wrote nothing before failing).
    fn transact1<R>(
        &self,
        keys: &[&[u8]],
        f: impl FnMut(&mut Txn<'_>) -> Result<R, EngineError>,
    ) -> Result<R, EngineError> {
        self.transact(keys, f)?
    }

    /// SET, with NX/XX/expiry. Returns whether it was set.
    pub fn set(&self, key: &[u8], value: &[u8], opts: SetOptions) -> Result<bool, EngineError> {
        self.transact1(&[key], |t| t.set(key, value, opts).map(|o| o.set))
    }

    /// DEL: returns how many keys existed.
    pub fn del(&self, keys: &[&[u8]]) -> Result<u64, EngineError> {
        self.transact(keys, |t| keys.iter().filter(|k| t.remove(k)).count() as u64)
    }

    /// EXISTS: counts keys that exist (a key named twice counts twice).
    pub fn exists(&self, keys: &[&[u8]]) -> Result<u64, EngineError> {
        let now = now_ms();
        let mut n = 0;
        for k in keys {
            let stripe = self.inner.index.lock(Index::stripe_of(k));
            n += u64::from(stripe.get(k).is_some_and(|l| !l.expired(now)));
        }
        Ok(n)
    }

    /// MGET: a string per key, None for absent keys and other kinds.
    pub fn mget(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>, EngineError> {
        // Another kind of value reads as None, not WRONGTYPE.
        keys.iter()
            .map(|k| Ok(string(self.inner.read(k)?).ok().flatten()))
            .collect()
    }

    /// MSET: sets every pair, atomically (one log record).
    pub fn mset(&self, pairs: &[(&[u8], &[u8])]) -> Result<(), EngineError> {
        let keys: Vec<&[u8]> = pairs.iter().map(|p| p.0).collect();
        self.transact(&keys, |t| {
            for (k, v) in pairs {
                t.put(k, Value::Str(v.to_vec()), 0);
            }
        })
    }

    /// INCRBY: returns the new value.
    pub fn incr_by(&self, key: &[u8], delta: i64) -> Result<i64, EngineError> {
        self.transact1(&[key], |t| t.incr_by(key, delta))
    }

    /// HSET: returns how many fields were new.
    pub fn hset(&self, key: &[u8], fields: &[(&[u8], &[u8])]) -> Result<u64, EngineError> {
        self.transact1(&[key], |t| t.hset(key, fields))
    }

    /// HGET.
    pub fn hget(&self, key: &[u8], field: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        self.transact1(&[key], |t| t.hget(key, field))
    }

    /// HGETALL: every (field, value), in field order.
    pub fn hgetall(&self, key: &[u8]) -> Result<FieldValues, EngineError> {
        self.transact1(&[key], |t| Ok(t.hgetall(key)?.into_iter().collect()))
    }

    /// HDEL: returns how many fields existed. An emptied hash is deleted.
    pub fn hdel(&self, key: &[u8], fields: &[&[u8]]) -> Result<u64, EngineError> {
        self.transact1(&[key], |t| t.hdel(key, fields))
    }

    /// The version of each key now (None: absent), as [`Txn::version`]
    /// gives it: what WATCH remembers.
    pub fn versions(&self, keys: &[&[u8]]) -> Result<Vec<Option<u64>>, EngineError> {
        self.transact(keys, |t| keys.iter().map(|k| t.version(k)).collect())
    }

    /// One step of SCAN: the live keys of the index's stripes from
    /// `cursor` on, stripe by stripe, until `count` keys are found or
    /// `10 × count` stripes were visited; returns the cursor to continue
    /// from (0: done) and the keys that match `pattern` (Redis's glob) and
    /// `kind`. A key present for the whole scan is returned at least once.
    pub fn scan(
        &self,
        cursor: u64,
        count: usize,
        pattern: Option<&[u8]>,
        kind: Option<Kind>,
    ) -> (u64, Vec<Vec<u8>>) {
        let count = count.max(1);
        let mut out = Vec::new();
        let mut s = cursor as usize;
        let mut visited = 0;
        let now = now_ms();
        while s < STRIPES && out.len() < count && visited < count.saturating_mul(10) {
            let stripe = self.inner.index.lock(s);
            for (key, loc) in stripe.live(now) {
                if kind.is_some_and(|k| Kind::of(loc.kind) != k)
                    || pattern.is_some_and(|p| !crate::glob::matches(p, key, false))
                {
                    continue;
                }
                out.push(key.to_vec());
            }
            s += 1;
            visited += 1;
        }
        let next = if s >= STRIPES { 0 } else { s as u64 };
        (next, out)
    }

    /// DBSIZE (keys that expired but were not dropped yet still count).
    pub fn dbsize(&self) -> u64 {
        self.inner.index.keys()
    }

    /// FLUSHALL: deletes every key.
    pub fn flushall(&self) -> Result<(), EngineError> {
        self.inner.flushall()
    }
}
