//! The operations the server calls, all through one write path:
//!
//! ```text
//!  bucket stripes (sorted) ─> load buckets ─> decide ops ─> room in the data region?
//!   ─> epoch (shared) ─> log append (no waiting while locked)
//!   ─> apply to the buckets ─> store them (fresh pages) ─> unlock ─> commit (durable)
//!
//! Lock order: stripes, then the epoch. A checkpoint boundary takes only the
//! epoch (exclusive), FLUSHALL every stripe and then the epoch.
//! ```
//!
//! Logging and applying under the same stripe locks keeps each key's log
//! order equal to its apply order, so replay rebuilds exactly this state.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use super::entry::{Entry, Value};
use super::store::{now_ms, Bucket};
use super::wal::{self, Op};
use super::{Engine, EngineError, Inner};

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
                let len = e.value.stored_len();
                if len > self.cfg.value_bytes_max {
                    return Err(EngineError::ValueTooLarge {
                        len,
                        max: self.cfg.value_bytes_max,
                    });
                }
            }
        }
        Ok(())
    }

    /// Reads one key.
    pub(crate) fn read(&self, key: &[u8]) -> Result<Option<Entry>, EngineError> {
        self.check_key(key)?;
        let b = self.bucket_of(key);
        let _stripe = self.stripes[Self::stripe_of(b)].lock();
        let bucket = self.load_bucket(b)?;
        self.entry_in(&bucket, key, now_ms())
    }

    /// The write path: `decide` sees the current entries of `keys` (None:
    /// absent or expired) and returns the operations to log and apply, and
    /// the caller's result.
    pub(crate) fn mutate<R>(
        &self,
        keys: &[&[u8]],
        mut decide: impl FnMut(&[Option<Entry>]) -> Result<(Vec<Op>, R), EngineError>,
    ) -> Result<R, EngineError> {
        for k in keys {
            self.check_key(k)?;
        }
        if let Some(why) = self.failed.lock().clone() {
            return Err(EngineError::Failed(why));
        }
        loop {
            let indices: Vec<usize> = keys.iter().map(|k| self.bucket_of(k)).collect();
            let mut stripes: Vec<usize> = indices.iter().map(|&b| Self::stripe_of(b)).collect();
            stripes.sort_unstable();
            stripes.dedup();
            let _guards: Vec<_> = stripes.iter().map(|&s| self.stripes[s].lock()).collect();
            let mut unique = indices.clone();
            unique.sort_unstable();
            unique.dedup();
            let buckets: Vec<Bucket> = unique
                .iter()
                .map(|&b| self.load_bucket(b))
                .collect::<Result<_, _>>()?;
            let now = now_ms();
            let current = keys
                .iter()
                .zip(&indices)
                .map(|(k, b)| {
                    let bucket = buckets.iter().find(|x| x.index == *b).expect("loaded");
                    self.entry_in(bucket, k, now)
                })
                .collect::<Result<Vec<_>, _>>()?;
            let (ops, result) = decide(&current)?;
            if ops.is_empty() {
                return Ok(result);
            }
            self.check_ops(&ops)?;
            self.check_space(&ops)?;
            // Only logging and applying (memory) happen under the epoch lock,
            // so a checkpoint boundary never waits for a writer's disk reads.
            let _epoch = self.epoch.read();
            let payload = wal::encode(&ops);
            let Some(lsn) = self.log.try_append(&payload)? else {
                drop(_guards);
                drop(_epoch);
                self.log.wait_for_space(payload.len())?;
                continue;
            };
            if let Err(e) = self.apply_logged(&ops, buckets) {
                *self.failed.lock() = Some(e.to_string());
                return Err(e);
            }
            drop(_guards);
            drop(_epoch);
            self.log.commit(lsn)?;
            return Ok(result);
        }
    }
}

impl Inner {
    /// Applies logged `ops` to their loaded buckets and stores them.
    fn apply_logged(&self, ops: &[Op], mut buckets: Vec<Bucket>) -> Result<(), EngineError> {
        for op in ops {
            let key = match op {
                Op::Put(e) => &e.key,
                Op::Del(k) => k,
                Op::FlushAll => unreachable!("FLUSHALL has its own path"),
            };
            let b = self.bucket_of(key);
            let bucket = buckets.iter_mut().find(|x| x.index == b).expect("loaded");
            self.apply(bucket, op)?;
        }
        for bucket in buckets {
            self.store_bucket(bucket)?;
        }
        Ok(())
    }
}

fn string(e: &Option<Entry>) -> Result<Option<&Vec<u8>>, EngineError> {
    match e {
        None => Ok(None),
        Some(Entry {
            value: Value::Str(s),
            ..
        }) => Ok(Some(s)),
        Some(_) => Err(EngineError::WrongType),
    }
}

fn hash(e: &Option<Entry>) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, EngineError> {
    match e {
        None => Ok(BTreeMap::new()),
        Some(Entry {
            value: Value::Hash(h),
            ..
        }) => Ok(h.clone()),
        Some(_) => Err(EngineError::WrongType),
    }
}

fn put(key: &[u8], value: Value, expire_at_ms: u64) -> Op {
    Op::Put(Entry {
        key: key.to_vec(),
        expire_at_ms,
        value,
    })
}

impl Engine {
    /// GET.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        Ok(string(&self.inner.read(key)?)?.cloned())
    }

    /// SET, with NX/XX/expiry. Returns whether it was set.
    pub fn set(&self, key: &[u8], value: &[u8], opts: SetOptions) -> Result<bool, EngineError> {
        self.inner.mutate(&[key], |cur| {
            let exists = cur[0].is_some();
            if (opts.nx && exists) || (opts.xx && !exists) {
                return Ok((vec![], false));
            }
            let op = put(
                key,
                Value::Str(value.to_vec()),
                opts.expire_at_ms.unwrap_or(0),
            );
            Ok((vec![op], true))
        })
    }

    /// DEL: returns how many keys existed.
    pub fn del(&self, keys: &[&[u8]]) -> Result<u64, EngineError> {
        self.inner.mutate(keys, |cur| {
            let mut ops = Vec::new();
            for (k, e) in keys.iter().zip(cur) {
                let dup = ops.iter().any(|o| matches!(o, Op::Del(d) if d == k));
                if e.is_some() && !dup {
                    ops.push(Op::Del(k.to_vec()));
                }
            }
            let n = ops.len() as u64;
            Ok((ops, n))
        })
    }

    /// EXISTS: counts keys that exist (a key named twice counts twice).
    pub fn exists(&self, keys: &[&[u8]]) -> Result<u64, EngineError> {
        let mut n = 0;
        for k in keys {
            n += u64::from(self.inner.read(k)?.is_some());
        }
        Ok(n)
    }

    /// MGET: a string per key, None for absent keys and other kinds.
    pub fn mget(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>, EngineError> {
        keys.iter()
            .map(|k| Ok(string(&self.inner.read(k)?).ok().flatten().cloned()))
            .collect()
    }

    /// MSET: sets every pair, atomically (one log record).
    pub fn mset(&self, pairs: &[(&[u8], &[u8])]) -> Result<(), EngineError> {
        let keys: Vec<&[u8]> = pairs.iter().map(|p| p.0).collect();
        self.inner.mutate(&keys, |_| {
            let ops = pairs
                .iter()
                .map(|(k, v)| put(k, Value::Str(v.to_vec()), 0))
                .collect();
            Ok((ops, ()))
        })
    }

    /// INCRBY: returns the new value.
    pub fn incr_by(&self, key: &[u8], delta: i64) -> Result<i64, EngineError> {
        self.inner.mutate(&[key], |cur| {
            let now = match string(&cur[0])? {
                None => 0,
                Some(s) => std::str::from_utf8(s)
                    .ok()
                    .and_then(|t| t.parse::<i64>().ok())
                    .ok_or(EngineError::NotInteger)?,
            };
            let next = now.checked_add(delta).ok_or(EngineError::Overflow)?;
            let expire = cur[0].as_ref().map_or(0, |e| e.expire_at_ms);
            Ok((
                vec![put(key, Value::Str(next.to_string().into_bytes()), expire)],
                next,
            ))
        })
    }

    /// HSET: returns how many fields were new.
    pub fn hset(&self, key: &[u8], fields: &[(&[u8], &[u8])]) -> Result<u64, EngineError> {
        self.inner.mutate(&[key], |cur| {
            let mut h = hash(&cur[0])?;
            let mut added = 0;
            for (f, v) in fields {
                added += u64::from(h.insert(f.to_vec(), v.to_vec()).is_none());
            }
            let expire = cur[0].as_ref().map_or(0, |e| e.expire_at_ms);
            Ok((vec![put(key, Value::Hash(h), expire)], added))
        })
    }

    /// HGET.
    pub fn hget(&self, key: &[u8], field: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        Ok(hash(&self.inner.read(key)?)?.remove(field))
    }

    /// HGETALL: every (field, value), in field order.
    pub fn hgetall(&self, key: &[u8]) -> Result<FieldValues, EngineError> {
        Ok(hash(&self.inner.read(key)?)?.into_iter().collect())
    }

    /// HDEL: returns how many fields existed. An emptied hash is deleted.
    pub fn hdel(&self, key: &[u8], fields: &[&[u8]]) -> Result<u64, EngineError> {
        self.inner.mutate(&[key], |cur| {
            let mut h = hash(&cur[0])?;
            let removed = fields.iter().filter(|f| h.remove(**f).is_some()).count() as u64;
            if removed == 0 {
                return Ok((vec![], 0));
            }
            let expire = cur[0].as_ref().map_or(0, |e| e.expire_at_ms);
            let op = if h.is_empty() {
                Op::Del(key.to_vec())
            } else {
                put(key, Value::Hash(h), expire)
            };
            Ok((vec![op], removed))
        })
    }

    /// DBSIZE (keys that expired but were not rewritten yet still count).
    pub fn dbsize(&self) -> u64 {
        self.inner.keys.load(Ordering::Relaxed)
    }

    /// FLUSHALL: deletes every key.
    pub fn flushall(&self) -> Result<(), EngineError> {
        self.inner.flushall()
    }
}
