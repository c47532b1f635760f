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

use std::sync::atomic::Ordering;

use super::reply::{Protocol, Reply};
use super::{admin, data, Shared, Stats};

/// One connection's state.
pub(crate) struct Session {
    /// The client id (CLIENT ID).
    pub id: u64,
    /// CLIENT SETNAME (or HELLO's SETNAME).
    pub name: Option<Vec<u8>>,
    /// The protocol its replies are in (HELLO).
    pub protocol: Protocol,
    /// QUIT was received: close after the reply.
    pub quit: bool,
    /// A read that misses the page cache may park the connection instead
    /// of waiting for the device (its worker has miss readers).
    pub may_park: bool,
    /// Set by a read that missed while `may_park`: the request did not
    /// run; it runs again once this is prefetched.
    pub parked: Option<crate::engine::Prefetch>,
}

impl Session {
    pub(crate) fn new(id: u64) -> Session {
        Session {
            id,
            name: None,
            protocol: Protocol::Resp2,
            quit: false,
            may_park: false,
            parked: None,
        }
    }
}

/// What a handler sees.
pub(crate) struct Ctx<'a> {
    pub shared: &'a Shared,
    pub session: &'a mut Session,
}

/// A command's handler: the words of the request, the name first.
pub(crate) type Handler = fn(&mut Ctx<'_>, &[&[u8]]) -> Reply;

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
    pub run: Handler,
}

const W: &[&str] = &["write"];
const R: &[&str] = &["readonly", "fast"];
const A: &[&str] = &["admin", "noscript"];
const F: &[&str] = &["fast"];
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

/// Every command, in `COMMAND`'s order.
pub(crate) static COMMANDS: &[Spec] = &[
    spec!("get", 2, R, ONE, data::get),
    spec!("set", -3, W, ONE, data::set),
    spec!("del", -2, W, ALL, data::del),
    spec!("exists", -2, R, ALL, data::exists),
    spec!("mget", -2, R, ALL, data::mget),
    spec!("mset", -3, W, (1, -1, 2), data::mset),
    spec!("incr", 2, W, ONE, data::incr),
    spec!("incrby", 3, W, ONE, data::incrby),
    spec!("decr", 2, W, ONE, data::decr),
    spec!("decrby", 3, W, ONE, data::decrby),
    spec!("hset", -4, W, ONE, data::hset),
    spec!("hmset", -4, W, ONE, data::hmset),
    spec!("hget", 3, R, ONE, data::hget),
    spec!("hgetall", 2, &["readonly"], ONE, data::hgetall),
    spec!("hdel", -3, W, ONE, data::hdel),
    spec!("dbsize", 1, R, NONE, data::dbsize),
    spec!("flushall", -1, W, NONE, data::flushall),
    spec!("flushdb", -1, W, NONE, data::flushall),
    spec!("ping", -1, F, NONE, admin::ping),
    spec!("echo", 2, F, NONE, admin::echo),
    spec!("select", 2, F, NONE, admin::select),
    spec!(
        "hello",
        -1,
        &["noscript", "loading", "stale", "fast"],
        NONE,
        admin::hello
    ),
    spec!(
        "auth",
        -2,
        &["noscript", "loading", "stale", "fast"],
        NONE,
        admin::auth
    ),
    spec!("quit", -1, F, NONE, admin::quit),
    spec!("info", -1, &["loading", "stale"], NONE, admin::info),
    spec!("config", -2, A, NONE, admin::config),
    spec!("client", -2, A, NONE, admin::client),
    spec!("command", -1, &["loading", "stale"], NONE, admin::command),
    spec!("save", 1, A, NONE, admin::save),
    spec!("bgsave", -1, A, NONE, admin::bgsave),
    spec!("bgrewriteaof", 1, A, NONE, admin::bgrewriteaof),
];

/// The command named `name` (any case).
pub(crate) fn find(name: &[u8]) -> Option<&'static Spec> {
    COMMANDS
        .iter()
        .find(|s| s.name.as_bytes().eq_ignore_ascii_case(name))
}

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

/// Runs one request (`args` is not empty).
pub(crate) fn dispatch(ctx: &mut Ctx<'_>, args: &[&[u8]]) -> Reply {
    assert!(!args.is_empty(), "an empty request has nothing to run");
    let Some(spec) = find(args[0]) else {
        Stats::add(&ctx.shared.stats.commands_processed, 1);
        Stats::add(&ctx.shared.stats.error_replies, 1);
        return unknown(args);
    };
    let reply = if arity_ok(spec.arity, args.len()) {
        (spec.run)(ctx, args)
    } else {
        wrong_arity(spec.name)
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
