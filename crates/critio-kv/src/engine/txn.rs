//! Transactions: any number of reads and writes over a set of keys named
//! up front, applied atomically and made durable as **one** log record.
//!
//! ```text
//!  Engine::transact(keys, f)
//!   ─> write path (ops.rs): stripes of `keys` locked, their entries looked up
//!   ─> f(&mut Txn): reads see the entries (values loaded only when asked),
//!                   then the transaction's own writes; writes go to an overlay
//!   ─> the overlay's final state per key ─> ops ─> one WAL record ─> apply
//! ```
//!
//! Every single-key command of the server (SET, INCR, HSET, EXPIRE, ...) is
//! a method of [`Txn`], so a command runs the same code alone and inside
//! `MULTI`/`EXEC`, where the server runs every queued command in one
//! transaction. Each method checks before it writes, so a command that
//! fails (WRONGTYPE, not an integer) leaves the transaction as it was, and
//! the commands after it still run, as in Redis.
//!
//! `f` may run more than once (the write path retries after waiting for
//! log or value-log space, with the locks released); only its last run's
//! writes are applied and only its last result is returned.

use std::collections::BTreeMap;

use hashbrown::HashMap;

use super::entry::{Value, KIND_HASH};
use super::ops::{now_ms, Found, SetOptions};
use super::wal::Op;
use super::{EngineError, Inner};

/// The kind of value a key holds (TYPE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A string.
    String,
    /// A hash.
    Hash,
}

impl Kind {
    pub(crate) fn of(tag: u8) -> Kind {
        if tag == KIND_HASH {
            Kind::Hash
        } else {
            Kind::String
        }
    }

    /// The name TYPE replies with.
    pub fn name(self) -> &'static str {
        match self {
            Kind::String => "string",
            Kind::Hash => "hash",
        }
    }

    /// The kind TYPE names `name` (SCAN's `TYPE` option), any case.
    pub fn parse(name: &[u8]) -> Option<Kind> {
        [Kind::String, Kind::Hash]
            .into_iter()
            .find(|k| k.name().as_bytes().eq_ignore_ascii_case(name))
    }
}

/// EXPIRE's condition (Redis 7: `NX`, `XX`, `GT`, `LT`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExpireIf {
    /// Always.
    #[default]
    Always,
    /// Only if the key has no expiry.
    Nx,
    /// Only if it has one.
    Xx,
    /// Only if the new expiry is later (no expiry counts as infinite).
    Gt,
    /// Only if the new expiry is earlier.
    Lt,
}

/// What SET did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetOutcome {
    /// Whether the value was set (NX/XX can prevent it).
    pub set: bool,
    /// The old string, when [`SetOptions::get`] asked for it.
    pub old: Option<Vec<u8>>,
}

/// A hash's fields.
type Fields = BTreeMap<Vec<u8>, Vec<u8>>;

/// A key's state as the transaction sees it.
#[derive(Clone, Debug)]
enum Slot {
    /// Not touched: the entry the write path looked up (`cur`).
    Stored,
    /// Read: the stored entry with its value loaded (None: absent).
    Loaded(Option<(Value, u64)>),
    /// Written by the transaction (None: deleted).
    Written(Option<(Value, u64)>),
}

/// A transaction in progress (see the module docs). Get one from
/// [`super::Engine::transact`].
pub struct Txn<'a> {
    inner: &'a Inner,
    keys: &'a [&'a [u8]],
    cur: &'a [Option<Found>],
    /// Per position in `keys` (duplicates use their first position).
    slots: Vec<Slot>,
    /// Each key's first position, for a transaction of more than
    /// [`SCAN_KEYS_MAX`] keys (fewer are found by a scan).
    index: Option<HashMap<&'a [u8], usize, foldhash::fast::RandomState>>,
    now: u64,
}

/// Up to this many keys, a key's position is found by comparing it with
/// each (cheaper than hashing it); beyond, through an index built once, so
/// that a command over many keys (MSET, MGET, DEL of thousands) costs in
/// proportion to its keys, not to their square.
const SCAN_KEYS_MAX: usize = 16;

impl<'a> Txn<'a> {
    pub(crate) fn new(inner: &'a Inner, keys: &'a [&'a [u8]], cur: &'a [Option<Found>]) -> Self {
        let index = (keys.len() > SCAN_KEYS_MAX).then(|| {
            let mut index = HashMap::with_capacity_and_hasher(keys.len(), Default::default());
            for (p, k) in keys.iter().enumerate() {
                index.entry(*k).or_insert(p);
            }
            index
        });
        Txn {
            inner,
            keys,
            cur,
            slots: vec![Slot::Stored; keys.len()],
            index,
            now: now_ms(),
        }
    }

    /// The position of `key` in the transaction's keys (its first, if
    /// named twice). Touching a key the transaction did not name is a bug
    /// of the caller.
    fn pos(&self, key: &[u8]) -> usize {
        let found = match &self.index {
            Some(index) => index.get(key).copied(),
            None => self.keys.iter().position(|k| *k == key),
        };
        found.unwrap_or_else(|| {
            panic!(
                "key {:?} was not named when the transaction began",
                String::from_utf8_lossy(key)
            )
        })
    }

    /// The time the transaction runs at, in ms since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        self.now
    }

    /// The key's kind and expiry (0: none), if it exists; no value is
    /// read.
    pub fn meta(&self, key: &[u8]) -> Option<(Kind, u64)> {
        let p = self.pos(key);
        match &self.slots[p] {
            Slot::Stored => self.cur[p]
                .as_ref()
                .map(|f| (Kind::of(f.loc.kind), f.loc.expire_at_ms)),
            Slot::Loaded(e) | Slot::Written(e) => {
                e.as_ref().map(|(v, exp)| (Kind::of(v.kind()), *exp))
            }
        }
    }

    /// Whether the key exists.
    pub fn exists(&self, key: &[u8]) -> bool {
        self.meta(key).is_some()
    }

    /// The key's stored version, as it was when the transaction began
    /// (its writes do not change it): None if absent. Any write to the key
    /// since gives it another version (WATCH compares them). A record the
    /// cleaner moved also gets another one.
    pub fn version(&self, key: &[u8]) -> Option<u64> {
        self.cur[self.pos(key)].as_ref().map(|f| f.loc.addr)
    }

    /// The key's value and expiry, read from the value log the first time.
    pub fn entry(&mut self, key: &[u8]) -> Result<Option<&(Value, u64)>, EngineError> {
        let p = self.pos(key);
        if let Slot::Stored = self.slots[p] {
            let loaded = match &self.cur[p] {
                None => None,
                Some(f) => Some((self.inner.load_value(key, &f.loc)?, f.loc.expire_at_ms)),
            };
            self.slots[p] = Slot::Loaded(loaded);
        }
        match &self.slots[p] {
            Slot::Loaded(e) | Slot::Written(e) => Ok(e.as_ref()),
            Slot::Stored => unreachable!("loaded above"),
        }
    }

    /// Writes the key (its expiry: 0 none). An expiry that is not in the
    /// future deletes the key, as Redis's SET with a past `EXAT`/`PXAT`
    /// does: the transaction's later commands find it absent.
    pub fn put(&mut self, key: &[u8], value: Value, expire_at_ms: u64) {
        if expire_at_ms != 0 && expire_at_ms <= self.now {
            self.remove(key);
            return;
        }
        let p = self.pos(key);
        self.slots[p] = Slot::Written(Some((value, expire_at_ms)));
    }

    /// Deletes the key; returns whether it existed.
    pub fn remove(&mut self, key: &[u8]) -> bool {
        let existed = self.exists(key);
        let p = self.pos(key);
        self.slots[p] = Slot::Written(None);
        existed
    }

    /// The operations that make the stored state the transaction's: one
    /// per key it wrote, in the order the keys were named.
    pub(crate) fn into_ops(self) -> Vec<Op> {
        let mut ops = Vec::new();
        for (p, slot) in self.slots.into_iter().enumerate() {
            let Slot::Written(state) = slot else { continue };
            let key = self.keys[p];
            match state {
                Some((value, expire_at_ms)) => ops.push(Op::Put(super::Entry {
                    key: key.to_vec(),
                    expire_at_ms,
                    value,
                })),
                // Deleting what was not there logs nothing.
                None if self.cur[p].is_some() => ops.push(Op::Del(key.to_vec())),
                None => {}
            }
        }
        ops
    }

    // ---- strings ----

    /// The key's string; WRONGTYPE if it holds another kind.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        Ok(self.string(key)?.map(|(s, _)| s))
    }

    /// The string and expiry, or WRONGTYPE.
    fn string(&mut self, key: &[u8]) -> Result<Option<(Vec<u8>, u64)>, EngineError> {
        match self.meta(key) {
            None => return Ok(None),
            Some((Kind::Hash, _)) => return Err(EngineError::WrongType),
            Some((Kind::String, _)) => {}
        }
        match self.entry(key)? {
            Some((Value::Str(s), exp)) => Ok(Some((s.clone(), *exp))),
            _ => Err(EngineError::WrongType),
        }
    }

    /// SET with its options.
    pub fn set(
        &mut self,
        key: &[u8],
        value: &[u8],
        opts: SetOptions,
    ) -> Result<SetOutcome, EngineError> {
        let meta = self.meta(key);
        let old = if opts.get { self.get(key)? } else { None };
        let exists = meta.is_some();
        if (opts.nx && exists) || (opts.xx && !exists) {
            return Ok(SetOutcome { set: false, old });
        }
        let expire = match opts.expire_at_ms {
            Some(at) => at,
            None if opts.keep_ttl => meta.map_or(0, |m| m.1),
            None => 0,
        };
        self.put(key, Value::Str(value.to_vec()), expire);
        Ok(SetOutcome { set: true, old })
    }

    /// GETDEL: the string, and the key deleted.
    pub fn get_del(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        let old = self.get(key)?;
        if old.is_some() {
            self.remove(key);
        }
        Ok(old)
    }

    /// INCRBY: the new value; the expiry is kept.
    pub fn incr_by(&mut self, key: &[u8], delta: i64) -> Result<i64, EngineError> {
        let (now, exp) = match self.string(key)? {
            None => (0, 0),
            Some((s, exp)) => (parse_int(&s).ok_or(EngineError::NotInteger)?, exp),
        };
        let next = now.checked_add(delta).ok_or(EngineError::Overflow)?;
        self.put(key, Value::Str(next.to_string().into_bytes()), exp);
        Ok(next)
    }

    /// INCRBYFLOAT: the new value as Redis prints it.
    pub fn incr_by_float(&mut self, key: &[u8], delta: f64) -> Result<Vec<u8>, EngineError> {
        let (now, exp) = match self.string(key)? {
            None => (0.0, 0),
            Some((s, exp)) => (parse_float(&s).ok_or(EngineError::NotFloat)?, exp),
        };
        let next = now + delta;
        if !next.is_finite() {
            return Err(EngineError::NanOrInfinity);
        }
        let text = format_float(next).into_bytes();
        self.put(key, Value::Str(text.clone()), exp);
        Ok(text)
    }

    /// APPEND: the new length.
    pub fn append(&mut self, key: &[u8], tail: &[u8]) -> Result<u64, EngineError> {
        let (mut s, exp) = self.string(key)?.unwrap_or_default();
        s.extend_from_slice(tail);
        let len = s.len() as u64;
        self.put(key, Value::Str(s), exp);
        Ok(len)
    }

    /// STRLEN.
    pub fn strlen(&mut self, key: &[u8]) -> Result<u64, EngineError> {
        Ok(self.get(key)?.map_or(0, |s| s.len() as u64))
    }

    // ---- hashes ----

    /// The key's hash and expiry (empty if absent); WRONGTYPE otherwise.
    fn hash(&mut self, key: &[u8]) -> Result<(Fields, u64), EngineError> {
        match self.meta(key) {
            None => return Ok((BTreeMap::new(), 0)),
            Some((Kind::String, _)) => return Err(EngineError::WrongType),
            Some((Kind::Hash, _)) => {}
        }
        match self.entry(key)? {
            Some((Value::Hash(h), exp)) => Ok((h.clone(), *exp)),
            _ => Err(EngineError::WrongType),
        }
    }

    /// HSET: how many fields were new.
    pub fn hset(&mut self, key: &[u8], fields: &[(&[u8], &[u8])]) -> Result<u64, EngineError> {
        let (mut h, exp) = self.hash(key)?;
        let mut added = 0;
        for (f, v) in fields {
            added += u64::from(h.insert(f.to_vec(), v.to_vec()).is_none());
        }
        self.put(key, Value::Hash(h), exp);
        Ok(added)
    }

    /// HSETNX: whether the field was set.
    pub fn hsetnx(&mut self, key: &[u8], field: &[u8], value: &[u8]) -> Result<bool, EngineError> {
        let (mut h, exp) = self.hash(key)?;
        if h.contains_key(field) {
            return Ok(false);
        }
        h.insert(field.to_vec(), value.to_vec());
        self.put(key, Value::Hash(h), exp);
        Ok(true)
    }

    /// Every (field, value) of the hash, in field order.
    pub fn hgetall(&mut self, key: &[u8]) -> Result<Fields, EngineError> {
        Ok(self.hash(key)?.0)
    }

    /// HGET.
    pub fn hget(&mut self, key: &[u8], field: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        Ok(self.hash(key)?.0.remove(field))
    }

    /// HDEL: how many fields existed. An emptied hash is deleted.
    pub fn hdel(&mut self, key: &[u8], fields: &[&[u8]]) -> Result<u64, EngineError> {
        let (mut h, exp) = self.hash(key)?;
        let removed = fields.iter().filter(|f| h.remove(**f).is_some()).count() as u64;
        if removed > 0 {
            if h.is_empty() {
                self.remove(key);
            } else {
                self.put(key, Value::Hash(h), exp);
            }
        }
        Ok(removed)
    }

    /// HINCRBY: the field's new value.
    pub fn hincr_by(&mut self, key: &[u8], field: &[u8], delta: i64) -> Result<i64, EngineError> {
        let (mut h, exp) = self.hash(key)?;
        let now = match h.get(field) {
            None => 0,
            Some(v) => parse_int(v).ok_or(EngineError::HashNotInteger)?,
        };
        let next = now.checked_add(delta).ok_or(EngineError::Overflow)?;
        h.insert(field.to_vec(), next.to_string().into_bytes());
        self.put(key, Value::Hash(h), exp);
        Ok(next)
    }

    /// HINCRBYFLOAT: the field's new value as Redis prints it.
    pub fn hincr_by_float(
        &mut self,
        key: &[u8],
        field: &[u8],
        delta: f64,
    ) -> Result<Vec<u8>, EngineError> {
        let (mut h, exp) = self.hash(key)?;
        let now = match h.get(field) {
            None => 0.0,
            Some(v) => parse_float(v).ok_or(EngineError::HashNotFloat)?,
        };
        let next = now + delta;
        if !next.is_finite() {
            return Err(EngineError::NanOrInfinity);
        }
        let text = format_float(next).into_bytes();
        h.insert(field.to_vec(), text.clone());
        self.put(key, Value::Hash(h), exp);
        Ok(text)
    }

    // ---- expiry ----

    /// Sets the key's expiry to `at_ms` (ms since the Unix epoch) if
    /// `cond` holds; an expiry not in the future deletes the key. Returns
    /// whether it did either (false: no such key, or `cond` failed).
    pub fn expire_at(
        &mut self,
        key: &[u8],
        at_ms: u64,
        cond: ExpireIf,
    ) -> Result<bool, EngineError> {
        let Some((_, old)) = self.meta(key) else {
            return Ok(false);
        };
        let ok = match cond {
            ExpireIf::Always => true,
            ExpireIf::Nx => old == 0,
            ExpireIf::Xx => old != 0,
            ExpireIf::Gt => old != 0 && at_ms > old,
            ExpireIf::Lt => old == 0 || at_ms < old,
        };
        if !ok {
            return Ok(false);
        }
        if at_ms <= self.now {
            self.remove(key);
            return Ok(true);
        }
        // The record carries the expiry, so the value is written again.
        let value = match self.entry(key)? {
            Some((v, _)) => v.clone(),
            None => return Ok(false),
        };
        self.put(key, value, at_ms);
        Ok(true)
    }

    /// PERSIST: whether an expiry was removed.
    pub fn persist(&mut self, key: &[u8]) -> Result<bool, EngineError> {
        match self.meta(key) {
            Some((_, exp)) if exp != 0 => {
                let value = match self.entry(key)? {
                    Some((v, _)) => v.clone(),
                    None => return Ok(false),
                };
                self.put(key, value, 0);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// PTTL: -2 no such key, -1 no expiry, else ms left.
    pub fn pttl(&self, key: &[u8]) -> i64 {
        match self.meta(key) {
            None => -2,
            Some((_, 0)) => -1,
            Some((_, at)) => at.saturating_sub(self.now) as i64,
        }
    }
}

/// A string as a 64-bit integer, as Redis reads it (no spaces, no `+`).
pub(crate) fn parse_int(s: &[u8]) -> Option<i64> {
    let t = std::str::from_utf8(s).ok()?;
    if t.starts_with('+') || (t.len() > 1 && t.starts_with('0')) || t.starts_with("-0") {
        return None;
    }
    t.parse().ok()
}

/// A string as a float, as INCRBYFLOAT reads it (no spaces, no NaN).
pub(crate) fn parse_float(s: &[u8]) -> Option<f64> {
    let t = std::str::from_utf8(s).ok()?;
    if t.is_empty() || t.trim() != t {
        return None;
    }
    let f: f64 = t.parse().ok()?;
    (!f.is_nan()).then_some(f)
}

/// A float as INCRBYFLOAT prints it: no exponent, no trailing zeros
/// (`10.5`, `3`, `5.0e3` as `5000`). Redis computes in `long double` and
/// prints 17 digits, so 0.1 + 0.2 shows as `0.3`; in `f64` that takes
/// rounding to 15 significant digits (integers below 1e17 print exactly).
pub(crate) fn format_float(f: f64) -> String {
    if f == 0.0 {
        return "0".into();
    }
    if f.fract() == 0.0 && f.abs() < 1e17 {
        return format!("{}", f as i64);
    }
    let exp = f.abs().log10().floor() as i64;
    let decimals = (14 - exp).max(0) as usize;
    let mut s = format!("{f:.decimals$}");
    if s.contains('.') {
        let t = s.trim_end_matches('0').trim_end_matches('.').len();
        s.truncate(t);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_parse_and_print_like_redis() {
        assert_eq!(parse_int(b"42"), Some(42));
        assert_eq!(parse_int(b"-7"), Some(-7));
        for bad in [&b"+1"[..], b" 1", b"01", b"1.0", b"", b"-0", b"x"] {
            assert_eq!(parse_int(bad), None, "{bad:?}");
        }
        assert_eq!(parse_float(b"10.5"), Some(10.5));
        assert_eq!(parse_float(b"5.0e3"), Some(5000.0));
        for bad in [&b" 1"[..], b"nan", b"", b"abc"] {
            assert_eq!(parse_float(bad), None, "{bad:?}");
        }
        assert_eq!(format_float(10.6), "10.6");
        assert_eq!(format_float(5000.0), "5000");
        assert_eq!(format_float(3.0), "3");
        assert_eq!(format_float(-0.0), "0");
        assert_eq!(format_float(0.1 + 0.2), "0.3");
        assert_eq!(format_float(10.5 + 0.1), "10.6");
        assert_eq!(format_float(1e-20), "0.00000000000000000001");
        assert_eq!(format_float(9007199254740992.0), "9007199254740992");
        assert_eq!(format_float(-1.25), "-1.25");
    }

    /// A write whose expiry has passed (SET with a past PXAT) deletes the
    /// key, as Redis's SET does, also for the commands after it in the same
    /// transaction (MULTI/EXEC): they used to find the expired value, so an
    /// EXPIRE there brought it back to life with a new expiry, an APPEND
    /// appended to it (and the result stayed expired), a SET KEEPTTL kept
    /// the past expiry (and its value read as absent). Found by the
    /// mixed-operation power-cut test.
    #[test]
    fn a_write_whose_expiry_has_passed_deletes_the_key_for_the_rest_of_its_transaction() {
        use std::sync::Arc;

        use critio::device::mem::MemDevice;

        use crate::engine::clean::tests::open;
        let dev = Arc::new(MemDevice::new(32 << 20));
        let far = 4_000_000_000_000; // ms since the epoch, in 2096
        let past = SetOptions {
            expire_at_ms: Some(1),
            ..SetOptions::default()
        };
        let keep_ttl = SetOptions {
            keep_ttl: true,
            ..SetOptions::default()
        };
        {
            let e = open(&dev);
            e.set(b"k", b"old", SetOptions::default()).unwrap();
            let keys: [&[u8]; 3] = [b"k", b"a", b"t"];
            let replies = e
                .transact(&keys, |t| {
                    t.set(b"k", b"expired", past).unwrap();
                    let revived = t.expire_at(b"k", far, ExpireIf::Always).unwrap();
                    t.set(b"a", b"expired", past).unwrap();
                    let len = t.append(b"a", b"tail").unwrap();
                    t.set(b"t", b"expired", past).unwrap();
                    t.set(b"t", b"kept", keep_ttl).unwrap();
                    (revived, t.exists(b"k"), len, t.pttl(b"t"))
                })
                .unwrap();
            assert_eq!(replies, (false, false, 4, -1));
            // No close: the reopen replays the log record.
        }
        let e = open(&dev);
        assert_eq!(e.get(b"k").unwrap(), None, "the expired value came back");
        assert_eq!(e.get(b"a").unwrap(), Some(b"tail".to_vec()));
        assert_eq!(e.get(b"t").unwrap(), Some(b"kept".to_vec()));
        assert_eq!(e.dbsize(), 2);
        e.close().unwrap();
    }

    /// A transaction over more keys than a scan serves finds them through
    /// its index, with the same meaning: a key named twice is one key, and
    /// its last write is what the transaction leaves.
    #[test]
    fn a_key_named_twice_is_one_key_with_few_keys_or_many() {
        use std::sync::Arc;

        use critio::device::mem::MemDevice;

        use crate::engine::clean::tests::open;
        let dev = Arc::new(MemDevice::new(32 << 20));
        let e = open(&dev);
        for distinct in [3, SCAN_KEYS_MAX, SCAN_KEYS_MAX + 1, 5000] {
            let names: Vec<Vec<u8>> = (0..distinct)
                .map(|i| format!("k{distinct}-{i}").into_bytes())
                .collect();
            // Each key twice: the first pass writes "1", the second "2"
            // after reading back the first.
            let keys: Vec<&[u8]> = names.iter().chain(&names).map(Vec::as_slice).collect();
            let seen = e
                .transact(&keys, |t| {
                    for k in &keys[..distinct] {
                        t.set(k, b"1", SetOptions::default()).unwrap();
                    }
                    let mut seen = Vec::new();
                    for k in &keys[distinct..] {
                        seen.push(t.get(k).unwrap());
                        t.set(k, b"2", SetOptions::default()).unwrap();
                    }
                    seen
                })
                .unwrap();
            assert!(
                seen.iter().all(|v| v.as_deref() == Some(&b"1"[..])),
                "{distinct} keys"
            );
            for k in &names {
                assert_eq!(e.get(k).unwrap(), Some(b"2".to_vec()), "{distinct} keys");
            }
        }
        assert_eq!(
            e.dbsize() as usize,
            3 + SCAN_KEYS_MAX + SCAN_KEYS_MAX + 1 + 5000
        );
        e.close().unwrap();
    }

    #[test]
    fn kinds_name_and_parse() {
        use crate::engine::entry::KIND_STR;
        assert_eq!(Kind::parse(b"HASH"), Some(Kind::Hash));
        assert_eq!(Kind::parse(b"string"), Some(Kind::String));
        assert_eq!(Kind::parse(b"list"), None);
        assert_eq!(Kind::of(KIND_STR).name(), "string");
    }
}
