//! The key-value commands, each a thin translation to the engine's API.
//! The engine's errors are Redis error replies already (`WRONGTYPE ...`,
//! `ERR value of N bytes exceeds ...`, `ERR write not logged: ...`), and
//! a write the engine could not log is never acknowledged.
//!
//! | command                   | engine                         | reply            |
//! |---------------------------|--------------------------------|------------------|
//! | GET k                     | `get`                          | bulk or nil      |
//! | SET k v [EX/PX/EXAT/PXAT n] [NX/XX] | `set`                | +OK or nil       |
//! | DEL / EXISTS k..          | `del` / `exists`               | count            |
//! | MGET k.. / MSET k v..     | `mget` / `mset` (one record)   | array / +OK      |
//! | INCR/DECR k, INCRBY/DECRBY k n | `incr_by`                 | new value        |
//! | HSET/HMSET k f v.., HGET, HGETALL, HDEL | `hset`, `hget`, `hgetall`, `hdel` | count / +OK / ... |
//! | DBSIZE, FLUSHALL, FLUSHDB | `dbsize`, `flushall`           | count / +OK      |

use std::time::{SystemTime, UNIX_EPOCH};

use super::command::{count_lookup, syntax_error, wrong_arity, Ctx};
use super::reply::Reply;
use crate::engine::{Engine, SetOptions};

fn engine<'a>(ctx: &Ctx<'a>) -> &'a Engine {
    &ctx.shared.backend.engine
}

/// An integer argument, or Redis's error for one that is not.
pub(crate) fn int(arg: &[u8]) -> Result<i64, Reply> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| Reply::err("value is not an integer or out of range"))
}

fn upper(arg: &[u8]) -> String {
    String::from_utf8_lossy(arg).to_ascii_uppercase()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub(crate) fn get(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    let r = if ctx.session.may_park {
        match engine(ctx).try_get(a[1]) {
            Ok(Err(miss)) => {
                // Not run: the worker parks the connection, prefetches,
                // and runs this request again.
                ctx.session.parked = Some(miss);
                return Reply::Nil;
            }
            Ok(Ok(v)) => Ok(v),
            Err(e) => Err(e),
        }
    } else {
        engine(ctx).get(a[1])
    };
    if let Ok(v) = &r {
        count_lookup(ctx.shared, v.is_some());
    }
    r.into()
}

/// The expiry time of SET's `EX/PX/EXAT/PXAT n`, in ms since the epoch.
fn expire_at(option: &str, arg: &[u8]) -> Result<u64, Reply> {
    let n = int(arg)?;
    let bad = || Reply::err("invalid expire time in 'set' command");
    if n <= 0 {
        return Err(bad());
    }
    let n = n as u64;
    let at = match option {
        "EX" => n.checked_mul(1000).and_then(|ms| ms.checked_add(now_ms())),
        "PX" => n.checked_add(now_ms()),
        "EXAT" => n.checked_mul(1000),
        _ => Some(n), // PXAT
    };
    at.filter(|&t| t <= i64::MAX as u64).ok_or_else(bad)
}

fn set_options(a: &[&[u8]]) -> Result<SetOptions, Reply> {
    let mut opts = SetOptions::default();
    let mut i = 3;
    while i < a.len() {
        let opt = upper(a[i]);
        match opt.as_str() {
            "NX" => opts.nx = true,
            "XX" => opts.xx = true,
            "EX" | "PX" | "EXAT" | "PXAT" if opts.expire_at_ms.is_none() && i + 1 < a.len() => {
                opts.expire_at_ms = Some(expire_at(&opt, a[i + 1])?);
                i += 1;
            }
            "GET" | "KEEPTTL" => {
                return Err(Reply::err(format!("SET ... {opt} is not supported")));
            }
            _ => return Err(syntax_error()),
        }
        i += 1;
    }
    if opts.nx && opts.xx {
        return Err(syntax_error());
    }
    Ok(opts)
}

pub(crate) fn set(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    let opts = match set_options(a) {
        Ok(o) => o,
        Err(r) => return r,
    };
    match engine(ctx).set(a[1], a[2], opts) {
        Ok(true) => Reply::OK,
        Ok(false) => Reply::Nil,
        Err(e) => e.into(),
    }
}

pub(crate) fn del(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    engine(ctx).del(&a[1..]).into()
}

pub(crate) fn exists(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    engine(ctx).exists(&a[1..]).into()
}

pub(crate) fn mget(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    match engine(ctx).mget(&a[1..]) {
        Ok(values) => Reply::Array(values.into_iter().map(Reply::opt).collect()),
        Err(e) => e.into(),
    }
}

/// `k v k v ...` from `a[from..]`, or None if a value is missing.
fn pairs<'a>(a: &[&'a [u8]], from: usize) -> Option<Vec<(&'a [u8], &'a [u8])>> {
    let rest = &a[from..];
    (rest.len() % 2 == 0).then(|| rest.chunks(2).map(|p| (p[0], p[1])).collect())
}

pub(crate) fn mset(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    let Some(p) = pairs(a, 1) else {
        return wrong_arity("mset");
    };
    match engine(ctx).mset(&p) {
        Ok(()) => Reply::OK,
        Err(e) => e.into(),
    }
}

fn add(ctx: &Ctx<'_>, key: &[u8], delta: i64) -> Reply {
    engine(ctx).incr_by(key, delta).into()
}

pub(crate) fn incr(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    add(ctx, a[1], 1)
}

pub(crate) fn decr(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    add(ctx, a[1], -1)
}

pub(crate) fn incrby(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    match int(a[2]) {
        Ok(n) => add(ctx, a[1], n),
        Err(r) => r,
    }
}

pub(crate) fn decrby(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    match int(a[2]).map(i64::checked_neg) {
        Ok(Some(n)) => add(ctx, a[1], n),
        Ok(None) => Reply::err("decrement would overflow"),
        Err(r) => r,
    }
}

pub(crate) fn hset(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    let Some(p) = pairs(a, 2) else {
        return wrong_arity("hset");
    };
    engine(ctx).hset(a[1], &p).into()
}

pub(crate) fn hmset(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    let Some(p) = pairs(a, 2) else {
        return wrong_arity("hmset");
    };
    match engine(ctx).hset(a[1], &p) {
        Ok(_) => Reply::OK,
        Err(e) => e.into(),
    }
}

pub(crate) fn hget(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    engine(ctx).hget(a[1], a[2]).into()
}

pub(crate) fn hgetall(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    match engine(ctx).hgetall(a[1]) {
        Ok(fields) => Reply::Map(
            fields
                .into_iter()
                .map(|(f, v)| (Reply::Bulk(f), Reply::Bulk(v)))
                .collect(),
        ),
        Err(e) => e.into(),
    }
}

pub(crate) fn hdel(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    engine(ctx).hdel(a[1], &a[2..]).into()
}

pub(crate) fn dbsize(ctx: &mut Ctx<'_>, _: &[&[u8]]) -> Reply {
    engine(ctx).dbsize().into()
}

/// FLUSHALL and FLUSHDB (one database), with `ASYNC` or `SYNC` accepted:
/// either way it is done when the reply is sent.
pub(crate) fn flushall(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    match a.get(1).map(|x| upper(x)) {
        None => {}
        Some(m) if a.len() == 2 && (m == "ASYNC" || m == "SYNC") => {}
        Some(_) => return syntax_error(),
    }
    match engine(ctx).flushall() {
        Ok(()) => Reply::OK,
        Err(e) => e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_options_parse_like_redis() {
        let o = set_options(&[b"set", b"k", b"v", b"nx", b"PX", b"100"]).unwrap();
        assert!(o.nx && !o.xx);
        assert!(o.expire_at_ms.unwrap() > now_ms());
        assert_eq!(
            set_options(&[b"set", b"k", b"v", b"exat", b"5"])
                .unwrap()
                .expire_at_ms,
            Some(5000)
        );
        for bad in [
            &[&b"set"[..], b"k", b"v", b"nx", b"xx"][..],
            &[b"set", b"k", b"v", b"ex"],
            &[b"set", b"k", b"v", b"ex", b"1", b"px", b"1"],
            &[b"set", b"k", b"v", b"bogus"],
        ] {
            assert_eq!(set_options(bad).unwrap_err(), syntax_error());
        }
        let e = set_options(&[b"set", b"k", b"v", b"ex", b"0"]).unwrap_err();
        assert_eq!(e, Reply::err("invalid expire time in 'set' command"));
        let e = set_options(&[b"set", b"k", b"v", b"ex", b"x"]).unwrap_err();
        assert_eq!(e, Reply::err("value is not an integer or out of range"));
    }
}
