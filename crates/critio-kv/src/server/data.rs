//! The key-value commands. Each is a function over a [`Txn`] (the engine's
//! transaction over the command's keys), so the same code runs a command
//! alone and inside MULTI/EXEC; the engine's errors are Redis error replies
//! already (`WRONGTYPE ...`, `ERR value is not an integer ...`), and a
//! write the engine could not log is never acknowledged.
//!
//! | commands | what |
//! |---|---|
//! | GET, SET [EX/PX/EXAT/PXAT n] [NX/XX] [KEEPTTL] [GET], SETNX, SETEX, PSETEX, GETSET, GETDEL, GETEX, MGET, MSET, MSETNX | strings |
//! | APPEND, STRLEN, INCR, DECR, INCRBY, DECRBY, INCRBYFLOAT | strings in place (a new record) |
//! | DEL, UNLINK, EXISTS, TYPE | any key |
//! | EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT [NX/XX/GT/LT], PERSIST, TTL, PTTL, EXPIRETIME, PEXPIRETIME | expiry, kept in each record, so it survives a restart |
//! | HSET, HMSET, HSETNX, HGET, HMGET, HGETALL, HDEL, HLEN, HEXISTS, HSTRLEN, HINCRBY, HINCRBYFLOAT, HKEYS, HVALS | hashes |
//! | DBSIZE, FLUSHALL, FLUSHDB, SCAN, KEYS, RANDOMKEY | the whole key space (not in MULTI) |
//!
//! Only GET has a second path: alone, it reads without a transaction and
//! may park its connection on a page cache miss (see `worker`).

use super::command::{count_lookup, syntax_error, wrong_arity, Ctx};
use super::reply::Reply;
use crate::engine::{Engine, ExpireIf, Kind, SetOptions, Txn};

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

/// A float argument (INCRBYFLOAT), or Redis's error.
fn float(arg: &[u8]) -> Result<f64, Reply> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|f| f.is_finite())
        .ok_or_else(|| Reply::err("value is not a valid float"))
}

fn upper(arg: &[u8]) -> String {
    String::from_utf8_lossy(arg).to_ascii_uppercase()
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `r?` for handlers: an error reply returns at once.
macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return Reply::from(e),
        }
    };
}

// ---- strings ----

/// GET alone: no transaction; with `may_park`, a page cache miss parks
/// the connection instead of waiting for the device.
pub(crate) fn get_alone(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
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

pub(crate) fn get(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    t.get(a[1]).into()
}

/// An expiry time in ms since the epoch, from `n` in `unit` (`EX`, `PX`,
/// `EXAT`, `PXAT`); `positive`: n must be above 0 (SET, SETEX, GETEX).
/// Redis's "invalid expire time in '<cmd>' command" otherwise.
fn expire_time(unit: &str, arg: &[u8], cmd: &str, positive: bool) -> Result<u64, Reply> {
    let n = int(arg)?;
    let bad = || Reply::err(format!("invalid expire time in '{cmd}' command"));
    if positive && n <= 0 {
        return Err(bad());
    }
    let now = now_ms() as i64;
    let at = match unit {
        "EX" => n.checked_mul(1000).and_then(|ms| ms.checked_add(now)),
        "PX" => n.checked_add(now),
        "EXAT" => n.checked_mul(1000),
        _ => Some(n), // PXAT
    };
    // In the past: 1, which has expired (the key is deleted).
    at.ok_or_else(bad).map(|t| t.max(1) as u64)
}

fn set_options(a: &[&[u8]]) -> Result<SetOptions, Reply> {
    let mut opts = SetOptions::default();
    let mut i = 3;
    while i < a.len() {
        let opt = upper(a[i]);
        let timed = opts.expire_at_ms.is_some() || opts.keep_ttl;
        match opt.as_str() {
            "NX" if !opts.xx => opts.nx = true,
            "XX" if !opts.nx => opts.xx = true,
            "GET" => opts.get = true,
            "KEEPTTL" if !timed => opts.keep_ttl = true,
            "EX" | "PX" | "EXAT" | "PXAT" if !timed && i + 1 < a.len() => {
                opts.expire_at_ms = Some(expire_time(&opt, a[i + 1], "set", true)?);
                i += 1;
            }
            _ => return Err(syntax_error()),
        }
        i += 1;
    }
    Ok(opts)
}

pub(crate) fn set(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    let opts = tri!(set_options(a));
    let out = tri!(t.set(a[1], a[2], opts));
    match (opts.get, out.set) {
        (true, _) => Reply::opt(out.old),
        (false, true) => Reply::OK,
        (false, false) => Reply::Nil,
    }
}

pub(crate) fn setnx(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    let opts = SetOptions {
        nx: true,
        ..SetOptions::default()
    };
    Reply::Int(tri!(t.set(a[1], a[2], opts)).set.into())
}

fn set_expiring(t: &mut Txn<'_>, a: &[&[u8]], unit: &str, cmd: &str) -> Reply {
    let at = tri!(expire_time(unit, a[2], cmd, true));
    let opts = SetOptions {
        expire_at_ms: Some(at),
        ..SetOptions::default()
    };
    tri!(t.set(a[1], a[3], opts));
    Reply::OK
}

pub(crate) fn setex(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    set_expiring(t, a, "EX", "setex")
}

pub(crate) fn psetex(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    set_expiring(t, a, "PX", "psetex")
}

pub(crate) fn getset(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    let opts = SetOptions {
        get: true,
        ..SetOptions::default()
    };
    Reply::opt(tri!(t.set(a[1], a[2], opts)).old)
}

pub(crate) fn getdel(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    t.get_del(a[1]).into()
}

/// GETEX key [EX s | PX ms | EXAT t | PXAT t | PERSIST].
pub(crate) fn getex(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    let change = match a.len() {
        2 => None,
        3 if upper(a[2]) == "PERSIST" => Some(None),
        4 => match upper(a[2]).as_str() {
            u @ ("EX" | "PX" | "EXAT" | "PXAT") => {
                Some(Some(tri!(expire_time(u, a[3], "getex", true))))
            }
            _ => return syntax_error(),
        },
        _ => return syntax_error(),
    };
    let v = tri!(t.get(a[1]));
    if v.is_some() {
        match change {
            None => {}
            Some(None) => {
                tri!(t.persist(a[1]));
            }
            Some(Some(at)) => {
                tri!(t.expire_at(a[1], at, ExpireIf::Always));
            }
        }
    }
    Reply::opt(v)
}

pub(crate) fn mget(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    Reply::Array(
        a[1..]
            .iter()
            // Another kind of value reads as nil, not WRONGTYPE.
            .map(|k| Reply::opt(t.get(k).ok().flatten()))
            .collect(),
    )
}

/// `k v k v ...` from `a[from..]`, or None if a value is missing.
fn pairs<'a>(a: &[&'a [u8]], from: usize) -> Option<Vec<(&'a [u8], &'a [u8])>> {
    let rest = &a[from..];
    (rest.len() % 2 == 0).then(|| rest.chunks(2).map(|p| (p[0], p[1])).collect())
}

pub(crate) fn mset(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    let Some(p) = pairs(a, 1) else {
        return wrong_arity("mset");
    };
    for (k, v) in p {
        tri!(t.set(k, v, SetOptions::default()));
    }
    Reply::OK
}

pub(crate) fn msetnx(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    let Some(p) = pairs(a, 1) else {
        return wrong_arity("msetnx");
    };
    if p.iter().any(|(k, _)| t.exists(k)) {
        return Reply::Int(0);
    }
    for (k, v) in p {
        tri!(t.set(k, v, SetOptions::default()));
    }
    Reply::Int(1)
}

pub(crate) fn append(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    t.append(a[1], a[2]).into()
}

pub(crate) fn strlen(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    t.strlen(a[1]).into()
}

pub(crate) fn incr(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    t.incr_by(a[1], 1).into()
}

pub(crate) fn decr(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    t.incr_by(a[1], -1).into()
}

pub(crate) fn incrby(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    let n = tri!(int(a[2]));
    t.incr_by(a[1], n).into()
}

pub(crate) fn decrby(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    match int(a[2]).map(i64::checked_neg) {
        Ok(Some(n)) => t.incr_by(a[1], n).into(),
        Ok(None) => Reply::err("decrement would overflow"),
        Err(r) => r,
    }
}

pub(crate) fn incrbyfloat(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    match float(a[2]) {
        Ok(d) => t.incr_by_float(a[1], d).map(Some).into(),
        Err(r) => r,
    }
}

// ---- any key ----

pub(crate) fn del(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    Reply::Int(a[1..].iter().filter(|k| t.remove(k)).count() as i64)
}

pub(crate) fn exists(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    Reply::Int(a[1..].iter().filter(|k| t.exists(k)).count() as i64)
}

pub(crate) fn type_(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    Reply::Simple(t.meta(a[1]).map_or("none", |(k, _)| k.name()))
}

// ---- expiry ----

fn expire_cond(a: &[&[u8]]) -> Result<ExpireIf, Reply> {
    let mut cond = ExpireIf::Always;
    for opt in a {
        let next = match upper(opt).as_str() {
            "NX" => ExpireIf::Nx,
            "XX" => ExpireIf::Xx,
            "GT" => ExpireIf::Gt,
            "LT" => ExpireIf::Lt,
            o => return Err(Reply::err(format!("Unsupported option {o}"))),
        };
        let both = |x, y| [x, y].contains(&cond) && [x, y].contains(&next) && cond != next;
        if both(ExpireIf::Nx, ExpireIf::Xx)
            || both(ExpireIf::Nx, ExpireIf::Gt)
            || both(ExpireIf::Nx, ExpireIf::Lt)
        {
            return Err(Reply::err(
                "NX and XX, GT or LT options at the same time are not compatible",
            ));
        }
        if both(ExpireIf::Gt, ExpireIf::Lt) {
            return Err(Reply::err(
                "GT and LT options at the same time are not compatible",
            ));
        }
        cond = next;
    }
    Ok(cond)
}

fn expire_with(t: &mut Txn<'_>, a: &[&[u8]], unit: &str, cmd: &str) -> Reply {
    let at = tri!(expire_time(unit, a[2], cmd, false));
    let cond = tri!(expire_cond(&a[3..]));
    Reply::Int(tri!(t.expire_at(a[1], at, cond)).into())
}

pub(crate) fn expire(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    expire_with(t, a, "EX", "expire")
}

pub(crate) fn pexpire(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    expire_with(t, a, "PX", "pexpire")
}

pub(crate) fn expireat(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    expire_with(t, a, "EXAT", "expireat")
}

pub(crate) fn pexpireat(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    expire_with(t, a, "PXAT", "pexpireat")
}

pub(crate) fn persist(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    Reply::Int(tri!(t.persist(a[1])).into())
}

pub(crate) fn ttl(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    match t.pttl(a[1]) {
        ms if ms < 0 => Reply::Int(ms),
        // Rounded, as Redis does.
        ms => Reply::Int((ms + 500) / 1000),
    }
}

pub(crate) fn pttl(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    Reply::Int(t.pttl(a[1]))
}

pub(crate) fn expiretime(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    match t.meta(a[1]) {
        None => Reply::Int(-2),
        Some((_, 0)) => Reply::Int(-1),
        Some((_, at)) => Reply::Int((at / 1000) as i64),
    }
}

pub(crate) fn pexpiretime(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    match t.meta(a[1]) {
        None => Reply::Int(-2),
        Some((_, 0)) => Reply::Int(-1),
        Some((_, at)) => Reply::Int(at as i64),
    }
}

// ---- hashes ----

pub(crate) fn hset(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    let Some(p) = pairs(a, 2) else {
        return wrong_arity("hset");
    };
    t.hset(a[1], &p).into()
}

pub(crate) fn hmset(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    let Some(p) = pairs(a, 2) else {
        return wrong_arity("hmset");
    };
    tri!(t.hset(a[1], &p));
    Reply::OK
}

pub(crate) fn hsetnx(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    Reply::Int(tri!(t.hsetnx(a[1], a[2], a[3])).into())
}

pub(crate) fn hget(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    t.hget(a[1], a[2]).into()
}

pub(crate) fn hmget(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    let h = tri!(t.hgetall(a[1]));
    Reply::Array(
        a[2..]
            .iter()
            .map(|f| Reply::opt(h.get(*f).cloned()))
            .collect(),
    )
}

pub(crate) fn hgetall(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    let h = tri!(t.hgetall(a[1]));
    Reply::Map(
        h.into_iter()
            .map(|(f, v)| (Reply::Bulk(f), Reply::Bulk(v)))
            .collect(),
    )
}

pub(crate) fn hkeys(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    let h = tri!(t.hgetall(a[1]));
    Reply::Array(h.into_keys().map(Reply::Bulk).collect())
}

pub(crate) fn hvals(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    let h = tri!(t.hgetall(a[1]));
    Reply::Array(h.into_values().map(Reply::Bulk).collect())
}

pub(crate) fn hlen(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    Reply::Int(tri!(t.hgetall(a[1])).len() as i64)
}

pub(crate) fn hexists(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    Reply::Int(tri!(t.hget(a[1], a[2])).is_some().into())
}

pub(crate) fn hstrlen(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    Reply::Int(tri!(t.hget(a[1], a[2])).map_or(0, |v| v.len() as i64))
}

pub(crate) fn hdel(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    t.hdel(a[1], &a[2..]).into()
}

pub(crate) fn hincrby(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    match int(a[3]) {
        Ok(n) => t.hincr_by(a[1], a[2], n).into(),
        Err(r) => r,
    }
}

pub(crate) fn hincrbyfloat(t: &mut Txn<'_>, a: &[&[u8]]) -> Reply {
    match float(a[3]) {
        Ok(d) => t.hincr_by_float(a[1], a[2], d).map(Some).into(),
        Err(r) => r,
    }
}

// ---- the whole key space ----

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
    ctx.shared.flushed();
    match engine(ctx).flushall() {
        Ok(()) => Reply::OK,
        Err(e) => e.into(),
    }
}

/// SCAN cursor [MATCH pattern] [COUNT n] [TYPE kind]. The cursor is the
/// index's next stripe (see [`Engine::scan`]).
pub(crate) fn scan(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    let cursor = match std::str::from_utf8(a[1])
        .ok()
        .and_then(|c| c.parse::<u64>().ok())
    {
        Some(c) => c,
        None => return Reply::err("invalid cursor"),
    };
    let (mut pattern, mut count, mut kind) = (None, 10usize, None);
    let mut i = 2;
    while i < a.len() {
        if i + 1 >= a.len() {
            return syntax_error();
        }
        match upper(a[i]).as_str() {
            "MATCH" => pattern = Some(a[i + 1]).filter(|p| *p != b"*"),
            "COUNT" => match int(a[i + 1]) {
                Ok(n) if n >= 1 => count = n as usize,
                Ok(_) => return syntax_error(),
                Err(r) => return r,
            },
            // An unknown type matches nothing, as in Redis.
            "TYPE" => kind = Some(Kind::parse(a[i + 1])),
            _ => return syntax_error(),
        }
        i += 2;
    }
    let (next, keys) = match kind {
        Some(None) => (0, Vec::new()),
        Some(Some(k)) => engine(ctx).scan(cursor, count, pattern, Some(k)),
        None => engine(ctx).scan(cursor, count, pattern, None),
    };
    Reply::Array(vec![
        Reply::Bulk(next.to_string().into_bytes()),
        Reply::Array(keys.into_iter().map(Reply::Bulk).collect()),
    ])
}

/// KEYS pattern: every key that matches (a walk of the whole index, as in
/// Redis; SCAN is the incremental form).
pub(crate) fn keys(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    let pattern = Some(a[1]).filter(|p| *p != b"*");
    let (mut cursor, mut out) = (0, Vec::new());
    loop {
        let (next, keys) = engine(ctx).scan(cursor, usize::MAX / 16, pattern, None);
        out.extend(keys.into_iter().map(Reply::Bulk));
        if next == 0 {
            return Reply::Array(out);
        }
        cursor = next;
    }
}

/// RANDOMKEY: a key from a random stripe on (nil if there is none).
pub(crate) fn randomkey(ctx: &mut Ctx<'_>, _: &[&[u8]]) -> Reply {
    let start = now_ms().wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52; // 0..4096
    for cursor in [start, 0] {
        let mut c = cursor;
        loop {
            let (next, keys) = engine(ctx).scan(c, 1, None, None);
            if let Some(k) = keys.into_iter().next() {
                return Reply::Bulk(k);
            }
            if next == 0 {
                break;
            }
            c = next;
        }
    }
    Reply::Nil
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
        let o = set_options(&[b"set", b"k", b"v", b"keepttl", b"get"]).unwrap();
        assert!(o.keep_ttl && o.get);
        for bad in [
            &[&b"set"[..], b"k", b"v", b"nx", b"xx"][..],
            &[b"set", b"k", b"v", b"ex"],
            &[b"set", b"k", b"v", b"ex", b"1", b"px", b"1"],
            &[b"set", b"k", b"v", b"ex", b"1", b"keepttl"],
            &[b"set", b"k", b"v", b"bogus"],
        ] {
            assert_eq!(set_options(bad).unwrap_err(), syntax_error());
        }
        let e = set_options(&[b"set", b"k", b"v", b"ex", b"0"]).unwrap_err();
        assert_eq!(e, Reply::err("invalid expire time in 'set' command"));
        let e = set_options(&[b"set", b"k", b"v", b"ex", b"x"]).unwrap_err();
        assert_eq!(e, Reply::err("value is not an integer or out of range"));
    }

    #[test]
    fn expire_conditions_combine_like_redis() {
        assert_eq!(expire_cond(&[]).unwrap(), ExpireIf::Always);
        assert_eq!(expire_cond(&[b"gt"]).unwrap(), ExpireIf::Gt);
        assert!(expire_cond(&[b"nx", b"xx"]).is_err());
        assert!(expire_cond(&[b"gt", b"lt"]).is_err());
        assert!(expire_cond(&[b"bogus"]).is_err());
        // In the past: a time that has passed (the key is deleted).
        assert!(expire_time("EX", b"-5", "expire", false).unwrap() < now_ms());
        assert_eq!(expire_time("PXAT", b"-5", "pexpireat", false).unwrap(), 1);
        assert!(expire_time("EX", b"9223372036854775807", "expire", false).is_err());
    }
}
