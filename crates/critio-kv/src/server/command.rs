//! The command table: each command's name, arity (Redis's convention:
//! `n` exactly n words with the name, `-n` at least n), flags and key
//! positions (for `COMMAND`), and its handler.
//!
//! Dispatch checks the name and the arity, with Redis's exact messages:
//!
//! ```text
//!  -ERR unknown command 'FOO', with args beginning with: 'a' 'b'
//!  -ERR wrong number of arguments for 'get' command
//! ```

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use super::clients::Client;
use super::reply::{Protocol, Reply};
use super::{admin, clients, data, multi, Shared, Stats};
use crate::engine::Txn;

/// One connection's state.
pub(crate) struct Session {
    /// The client as CLIENT LIST shows it (its id, name, ...).
    pub client: Arc<Client>,
    /// The protocol its replies are in (HELLO).
    pub protocol: Protocol,
    /// It has authenticated (or no password is set).
    pub authenticated: bool,
    /// QUIT was received: close after the reply.
    pub quit: bool,
    /// This request's reply is not sent (SHUTDOWN's).
    pub silent: bool,
    /// A request that would wait (a read that misses the page cache, a key
    /// whose index stripe a background thread holds) may park the connection
    /// instead (its worker has miss readers).
    pub may_park: bool,
    /// Set by a request that would have waited, while `may_park`: it did
    /// not run; it runs again once this is prefetched (waited for).
    pub parked: Option<crate::engine::Prefetch>,
    /// MULTI's queue and WATCH's keys.
    pub multi: multi::State,
}

impl Session {
    pub(crate) fn new(client: Arc<Client>, authenticated: bool) -> Session {
        Session {
            client,
            protocol: Protocol::Resp2,
            authenticated,
            quit: false,
            silent: false,
            may_park: false,
            parked: None,
            multi: multi::State::default(),
        }
    }
}

/// What a handler sees.
pub(crate) struct Ctx<'a> {
    pub shared: &'a Shared,
    pub session: &'a mut Session,
}

/// A server command's handler: the words of the request, the name first.
pub(crate) type Handler = fn(&mut Ctx<'_>, &[&[u8]]) -> Reply;

/// A key-value command's handler: it runs in a transaction over the
/// command's keys (alone, or with the rest of a MULTI).
pub(crate) type DataHandler = fn(&mut Txn<'_>, &[&[u8]]) -> Reply;

/// How a command runs.
#[derive(Clone, Copy)]
pub(crate) enum Run {
    /// A key-value command over its keys.
    Data(DataHandler),
    /// GET: alone without a transaction (it may park on a cache miss), in
    /// MULTI as a key-value command.
    Read(Handler, DataHandler),
    /// A server command that touches no key and takes no engine lock: it
    /// may be queued in MULTI, where it runs inside the transaction.
    Pure(Handler),
    /// Any other server command: not allowed in MULTI.
    Server(Handler),
}

/// One command.
pub(crate) struct Spec {
    /// Lower-case name.
    pub name: &'static str,
    /// `n`: exactly n words; `-n`: at least n.
    pub arity: i32,
    /// Redis's command flags, for `COMMAND`.
    pub flags: &'static [&'static str],
    /// First key, last key (-1: the last word), step.
    pub keys: (i32, i32, i32),
    /// The handler.
    pub run: Run,
}

const W: &[&str] = &["write"];
const WF: &[&str] = &["write", "fast"];
const R: &[&str] = &["readonly", "fast"];
const RS: &[&str] = &["readonly"];
const A: &[&str] = &["admin", "noscript"];
const F: &[&str] = &["fast"];
const CONN: &[&str] = &["noscript", "loading", "stale", "fast"];
const NONE: (i32, i32, i32) = (0, 0, 0);
const ONE: (i32, i32, i32) = (1, 1, 1);
const ALL: (i32, i32, i32) = (1, -1, 1);

macro_rules! spec {
    ($name:literal, $arity:expr, $flags:expr, $keys:expr, $run:expr) => {
        Spec {
            name: $name,
            arity: $arity,
            flags: $flags,
            keys: $keys,
            run: $run,
        }
    };
}

use Run::{Data, Pure, Server};

/// Every command, in `COMMAND`'s order.
pub(crate) static COMMANDS: &[Spec] = &[
    spec!("get", 2, R, ONE, Run::Read(data::get_alone, data::get)),
    spec!("set", -3, W, ONE, Data(data::set)),
    spec!("setnx", 3, WF, ONE, Data(data::setnx)),
    spec!("setex", 4, W, ONE, Data(data::setex)),
    spec!("psetex", 4, W, ONE, Data(data::psetex)),
    spec!("getset", 3, WF, ONE, Data(data::getset)),
    spec!("getdel", 2, WF, ONE, Data(data::getdel)),
    spec!("getex", -2, WF, ONE, Data(data::getex)),
    spec!("mget", -2, R, ALL, Data(data::mget)),
    spec!("mset", -3, W, (1, -1, 2), Data(data::mset)),
    spec!("msetnx", -3, W, (1, -1, 2), Data(data::msetnx)),
    spec!("append", 3, WF, ONE, Data(data::append)),
    spec!("strlen", 2, R, ONE, Data(data::strlen)),
    spec!("incr", 2, WF, ONE, Data(data::incr)),
    spec!("decr", 2, WF, ONE, Data(data::decr)),
    spec!("incrby", 3, WF, ONE, Data(data::incrby)),
    spec!("decrby", 3, WF, ONE, Data(data::decrby)),
    spec!("incrbyfloat", 3, WF, ONE, Data(data::incrbyfloat)),
    spec!("del", -2, W, ALL, Data(data::del)),
    spec!("unlink", -2, WF, ALL, Data(data::del)),
    spec!("exists", -2, R, ALL, Data(data::exists)),
    spec!("type", 2, R, ONE, Data(data::type_)),
    spec!("expire", -3, WF, ONE, Data(data::expire)),
    spec!("pexpire", -3, WF, ONE, Data(data::pexpire)),
    spec!("expireat", -3, WF, ONE, Data(data::expireat)),
    spec!("pexpireat", -3, WF, ONE, Data(data::pexpireat)),
    spec!("persist", 2, WF, ONE, Data(data::persist)),
    spec!("ttl", 2, R, ONE, Data(data::ttl)),
    spec!("pttl", 2, R, ONE, Data(data::pttl)),
    spec!("expiretime", 2, R, ONE, Data(data::expiretime)),
    spec!("pexpiretime", 2, R, ONE, Data(data::pexpiretime)),
    spec!("hset", -4, WF, ONE, Data(data::hset)),
    spec!("hmset", -4, WF, ONE, Data(data::hmset)),
    spec!("hsetnx", 4, WF, ONE, Data(data::hsetnx)),
    spec!("hget", 3, R, ONE, Data(data::hget)),
    spec!("hmget", -3, R, ONE, Data(data::hmget)),
    spec!("hgetall", 2, RS, ONE, Data(data::hgetall)),
    spec!("hkeys", 2, RS, ONE, Data(data::hkeys)),
    spec!("hvals", 2, RS, ONE, Data(data::hvals)),
    spec!("hlen", 2, R, ONE, Data(data::hlen)),
    spec!("hexists", 3, R, ONE, Data(data::hexists)),
    spec!("hstrlen", 3, R, ONE, Data(data::hstrlen)),
    spec!("hdel", -3, WF, ONE, Data(data::hdel)),
    spec!("hincrby", 4, WF, ONE, Data(data::hincrby)),
    spec!("hincrbyfloat", 4, WF, ONE, Data(data::hincrbyfloat)),
    spec!("dbsize", 1, R, NONE, Pure(data::dbsize)),
    spec!("scan", -2, RS, NONE, Server(data::scan)),
    spec!("keys", 2, RS, NONE, Server(data::keys)),
    spec!("randomkey", 1, RS, NONE, Server(data::randomkey)),
    spec!("flushall", -1, W, NONE, Server(data::flushall)),
    spec!("flushdb", -1, W, NONE, Server(data::flushall)),
    spec!(
        "multi",
        1,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        NONE,
        Server(multi::multi)
    ),
    spec!(
        "exec",
        1,
        &["noscript", "loading", "stale", "skip_slowlog"],
        NONE,
        Server(multi::exec)
    ),
    spec!(
        "discard",
        1,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        NONE,
        Server(multi::discard)
    ),
    spec!(
        "watch",
        -2,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        ALL,
        Server(multi::watch)
    ),
    spec!(
        "unwatch",
        1,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        NONE,
        Server(multi::unwatch)
    ),
    spec!("ping", -1, F, NONE, Pure(admin::ping)),
    spec!("echo", 2, F, NONE, Pure(admin::echo)),
    spec!(
        "time",
        1,
        &["loading", "stale", "fast"],
        NONE,
        Pure(admin::time)
    ),
    spec!("select", 2, CONN, NONE, Server(admin::select)),
    spec!("hello", -1, CONN, NONE, Server(admin::hello)),
    spec!("auth", -2, CONN, NONE, Server(admin::auth)),
    spec!("quit", -1, F, NONE, Server(admin::quit)),
    spec!("reset", 1, CONN, NONE, Server(admin::reset)),
    // Not in MULTI: it reads the engine's background state, whose locks a
    // transaction holding stripe locks must not wait for.
    spec!("info", -1, &["loading", "stale"], NONE, Server(admin::info)),
    spec!("config", -2, A, NONE, Server(admin::config)),
    spec!("client", -2, A, NONE, Server(clients::client)),
    spec!(
        "command",
        -1,
        &["loading", "stale"],
        NONE,
        Pure(admin::command)
    ),
    spec!("save", 1, A, NONE, Server(admin::save)),
    spec!("bgsave", -1, A, NONE, Server(admin::bgsave)),
    spec!("bgrewriteaof", 1, A, NONE, Server(admin::bgrewriteaof)),
    spec!("shutdown", -1, A, NONE, Server(admin::shutdown)),
];

/// The command named `name` (any case).
pub(crate) fn find(name: &[u8]) -> Option<&'static Spec> {
    lookup(name).map(|i| &COMMANDS[i])
}

/// The index in [`COMMANDS`] of the command named `name` (any case): one
/// hash lookup of the name lower-cased on the stack.
fn lookup(name: &[u8]) -> Option<usize> {
    static BY_NAME: OnceLock<HashMap<&'static [u8], usize>> = OnceLock::new();
    let by_name = BY_NAME.get_or_init(|| {
        COMMANDS
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.as_bytes(), i))
            .collect()
    });
    let mut lower = [0u8; NAME_BYTES_MAX];
    let lower = lower.get_mut(..name.len())?;
    for (l, c) in lower.iter_mut().zip(name) {
        *l = c.to_ascii_lowercase();
    }
    by_name.get(&*lower).copied()
}

/// Longer than any command's name.
const NAME_BYTES_MAX: usize = 32;
const _: () = {
    let mut i = 0;
    while i < COMMANDS.len() {
        assert!(COMMANDS[i].name.len() <= NAME_BYTES_MAX);
        i += 1;
    }
};

fn arity_ok(arity: i32, words: usize) -> bool {
    let n = arity.unsigned_abs() as usize;
    if arity >= 0 {
        words == n
    } else {
        words >= n
    }
}

/// `-ERR wrong number of arguments for 'name' command`.
pub(crate) fn wrong_arity(name: &str) -> Reply {
    Reply::err(format!("wrong number of arguments for '{name}' command"))
}

/// `-ERR syntax error`.
pub(crate) fn syntax_error() -> Reply {
    Reply::err("syntax error")
}

/// Redis's message for an unknown command: the name and the first
/// arguments as typed, quoted, at most 128 characters of them.
fn unknown(args: &[&[u8]]) -> Reply {
    let mut rest = String::new();
    for a in &args[1..] {
        if rest.len() >= 128 {
            break;
        }
        let room = 128 - rest.len();
        let text = String::from_utf8_lossy(a);
        let cut: String = text.chars().take(room).collect();
        rest += &format!("'{cut}' ");
    }
    let name: String = String::from_utf8_lossy(args[0]).chars().take(128).collect();
    Reply::err(format!(
        "unknown command '{name}', with args beginning with: {rest}"
    ))
}

/// The keys of a request, by its spec's (first, last, step).
pub(crate) fn keys_of<'a>(spec: &Spec, args: &[&'a [u8]]) -> Vec<&'a [u8]> {
    let (first, last, step) = spec.keys;
    if first <= 0 || args.len() <= first as usize {
        return Vec::new();
    }
    let last = if last < 0 {
        args.len() as i32 + last
    } else {
        last
    };
    (first..=last)
        .step_by(step.max(1) as usize)
        .filter_map(|i| args.get(i as usize).copied())
        .collect()
}

/// Runs a request's command now (outside MULTI, or at EXEC for a pure
/// command queued there).
fn run(ctx: &mut Ctx<'_>, spec: &Spec, args: &[&[u8]]) -> Reply {
    match spec.run {
        Run::Read(alone, _) => alone(ctx, args),
        Run::Pure(h) | Run::Server(h) => h(ctx, args),
        Run::Data(h) => {
            let keys = keys_of(spec, args);
            if ctx.session.may_park {
                if let Some(busy) = ctx.shared.backend.engine.busy(&keys) {
                    // Not run: a background job holds one of its keys'
                    // stripes; the worker parks the connection until the
                    // stripe is free, and serves its other clients.
                    ctx.session.parked = Some(busy);
                    return Reply::Nil;
                }
            }
            match ctx.shared.backend.engine.transact(&keys, |t| h(t, args)) {
                Ok(r) => r,
                Err(e) => e.into(),
            }
        }
    }
}

/// NOAUTH: a password is set and the client has not given it.
const NOAUTH: &str = "NOAUTH Authentication required.";

/// Runs one request (`args` is not empty).
pub(crate) fn dispatch(ctx: &mut Ctx<'_>, args: &[&[u8]]) -> Reply {
    assert!(!args.is_empty(), "an empty request has nothing to run");
    let index = lookup(args[0]);
    let found = index.map(|i| &COMMANDS[i]);
    let reply = match found {
        // Before AUTH only the handshake runs (Redis's "no-auth" commands).
        _ if !ctx.session.authenticated
            && !found.is_some_and(|s| matches!(s.name, "auth" | "hello" | "quit" | "reset")) =>
        {
            multi::queue_failed(ctx);
            Reply::Error(NOAUTH.into())
        }
        None => {
            multi::queue_failed(ctx);
            unknown(args)
        }
        Some(spec) if !arity_ok(spec.arity, args.len()) => {
            multi::queue_failed(ctx);
            wrong_arity(spec.name)
        }
        Some(spec) => {
            ctx.session.client.ran(index.expect("found"));
            if ctx.session.multi.queueing() && !multi::runs_now(spec) {
                multi::queue(ctx, spec, args)
            } else {
                run(ctx, spec, args)
            }
        }
    };
    if ctx.session.parked.is_some() {
        return reply; // not run: it runs again after its prefetch
    }
    Stats::add(&ctx.shared.stats.commands_processed, 1);
    if matches!(reply, Reply::Error(_)) {
        Stats::add(&ctx.shared.stats.error_replies, 1);
    }
    reply
}

/// Counts a GET's hit or miss (INFO keyspace_hits / keyspace_misses).
pub(crate) fn count_lookup(shared: &Shared, hit: bool) {
    let c = if hit {
        &shared.stats.keyspace_hits
    } else {
        &shared.stats.keyspace_misses
    };
    c.fetch_add(1, Ordering::Relaxed);
}

/// A spec as `COMMAND INFO` shows it: name, arity, flags, first key, last
/// key, step.
pub(crate) fn describe(s: &Spec) -> Reply {
    Reply::Array(vec![
        Reply::text(s.name),
        Reply::Int(s.arity.into()),
        Reply::Array(s.flags.iter().map(|f| Reply::Simple(f)).collect()),
        Reply::Int(s.keys.0.into()),
        Reply::Int(s.keys.1.into()),
        Reply::Int(s.keys.2.into()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_lower_case_and_arities_sane() {
        for (i, s) in COMMANDS.iter().enumerate() {
            assert_eq!(s.name, s.name.to_ascii_lowercase());
            assert!(s.arity != 0, "{}", s.name);
            assert!(COMMANDS[..i].iter().all(|o| o.name != s.name));
        }
        assert!(find(b"GeT").is_some());
        assert!(arity_ok(-3, 5) && !arity_ok(-3, 2) && arity_ok(2, 2) && !arity_ok(2, 3));
    }

    #[test]
    fn unknown_command_message_is_redis_s() {
        let r = unknown(&[b"FOO", b"a", b"bc"]);
        assert_eq!(
            r,
            Reply::Error("ERR unknown command 'FOO', with args beginning with: 'a' 'bc' ".into())
        );
        let r = unknown(&[b"x"]);
        assert_eq!(
            r,
            Reply::Error("ERR unknown command 'x', with args beginning with: ".into())
        );
    }
}
