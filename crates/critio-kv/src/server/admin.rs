//! Server commands: PING, ECHO, TIME, SELECT, HELLO, AUTH, RESET, QUIT,
//! INFO, CONFIG, COMMAND, SAVE, BGSAVE, BGREWRITEAOF, SHUTDOWN (CLIENT is
//! in `clients`).
//!
//! `HELLO [2|3] [AUTH user pass] [SETNAME name]` switches the connection's
//! protocol (RESP3's maps, nulls and verbatim text from the next reply
//! on, its own reply included) and answers what Redis 7 does: server,
//! version, proto, id, mode, role, modules.
//!
//! Authentication is Redis's with one user, `default`: with `requirepass`
//! set (`[server]`, `--requirepass`, CONFIG SET), a connection runs nothing
//! but AUTH, HELLO, RESET and QUIT until `AUTH pass`, `AUTH default pass`
//! or `HELLO 3 AUTH default pass` gives the password (NOAUTH otherwise,
//! WRONGPASS for a wrong one). Without a password the `default` user is
//! passwordless: AUTH with it accepts any password, as Redis does.
//!
//! CONFIG answers `GET` with what redis-benchmark, redis-cli and YCSB's
//! clients ask for, mapped onto critio-kv's settings; `SET` changes
//! `requirepass` and `protected-mode` at run time, and accepts any other
//! known parameter only with the value it has:
//!
//! | parameter            | value                                           |
//! |----------------------|-------------------------------------------------|
//! | `save`               | `"<checkpoint interval s> 1"` (`""` if off)     |
//! | `appendonly`, `appendfsync` | `yes`, `always` (every write is logged and durable before its reply) |
//! | `maxmemory`, `maxmemory-policy` | `0`, `noeviction`                    |
//! | `databases`          | `1`                                             |
//! | `maxclients`, `timeout`, `proto-max-bulk-len`, `bind`, `port`, `dir` | from `[server]` and the data directory |
//! | `requirepass`, `protected-mode` | as set now (`""` when no password is set) |

use super::command::{describe, find, syntax_error, wrong_arity, Ctx, Run, Spec, COMMANDS};
use super::data::int;
use super::info::{self, Job};
use super::reply::{Protocol, Reply};
use crate::glob;

pub(crate) fn ping(_: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    match a {
        [_] => Reply::Simple("PONG"),
        [_, msg] => Reply::Bulk(msg.to_vec()),
        _ => wrong_arity("ping"),
    }
}

pub(crate) fn echo(_: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    Reply::Bulk(a[1].to_vec())
}

pub(crate) fn time(_: &mut Ctx<'_>, _: &[&[u8]]) -> Reply {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Reply::Array(vec![
        Reply::Bulk(now.as_secs().to_string().into_bytes()),
        Reply::Bulk(now.subsec_micros().to_string().into_bytes()),
    ])
}

pub(crate) fn select(_: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    match int(a[1]) {
        Ok(0) => Reply::OK,
        Ok(_) => Reply::err("DB index is out of range"),
        Err(r) => r,
    }
}

/// The version HELLO and INFO report: the Redis release whose commands and
/// replies critio-kv follows.
pub(crate) const REDIS_VERSION: &str = "7.0.0";

const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

/// Redis's check of a user/password pair: the only user is `default`,
/// whose password is `requirepass` (none: any password is accepted).
fn authenticate(ctx: &mut Ctx<'_>, user: &[u8], pass: &[u8]) -> Result<(), Reply> {
    let ok = user == b"default"
        && ctx
            .shared
            .password()
            .is_none_or(|p| constant_time_eq(p.as_bytes(), pass));
    if ok {
        ctx.session.authenticated = true;
        Ok(())
    } else {
        Err(Reply::Error(WRONGPASS.into()))
    }
}

/// Compares without stopping at the first difference, so the time taken
/// does not tell a guesser how much of the password it got right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for (i, &x) in a.iter().enumerate() {
        diff |= usize::from(x ^ b.get(i).copied().unwrap_or(!x));
    }
    diff == 0
}

pub(crate) fn hello(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    let mut proto = ctx.session.protocol;
    let mut name = None;
    if let Some(v) = a.get(1) {
        proto = match int(v) {
            Ok(2) => Protocol::Resp2,
            Ok(3) => Protocol::Resp3,
            Ok(_) => return Reply::Error("NOPROTO unsupported protocol version".into()),
            Err(_) => return Reply::err("Protocol version is not an integer or out of range"),
        };
        let mut i = 2;
        while i < a.len() {
            let more = a.len() - i - 1;
            if a[i].eq_ignore_ascii_case(b"AUTH") && more >= 2 {
                if let Err(r) = authenticate(ctx, a[i + 1], a[i + 2]) {
                    return r;
                }
                i += 3;
            } else if a[i].eq_ignore_ascii_case(b"SETNAME") && more >= 1 {
                if let Err(r) = valid_name(a[i + 1]) {
                    return r;
                }
                name = Some(a[i + 1]);
                i += 2;
            } else {
                return Reply::err(format!(
                    "Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(a[i])
                ));
            }
        }
    }
    if !ctx.session.authenticated {
        return Reply::Error(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the \
             HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and \
             select the RESP protocol version at the same time"
                .into(),
        );
    }
    if let Some(n) = name {
        ctx.session.client.set_name(n);
    }
    ctx.session.protocol = proto;
    ctx.session.client.set_resp(proto.version());
    Reply::Map(vec![
        (Reply::text("server"), Reply::text("redis")),
        (Reply::text("version"), Reply::text(REDIS_VERSION)),
        (Reply::text("proto"), Reply::Int(proto.version())),
        (Reply::text("id"), Reply::Int(ctx.session.client.id as i64)),
        (Reply::text("mode"), Reply::text("standalone")),
        (Reply::text("role"), Reply::text("master")),
        (Reply::text("modules"), Reply::Array(Vec::new())),
    ])
}

pub(crate) fn auth(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    let (user, pass): (&[u8], &[u8]) = match a {
        [_, pass] => {
            if ctx.shared.password().is_none() {
                return Reply::err(
                    "AUTH <password> called without any password configured for the default \
                     user. Are you sure your configuration is correct?",
                );
            }
            (b"default", pass)
        }
        [_, user, pass] => (user, pass),
        _ => return syntax_error(),
    };
    match authenticate(ctx, user, pass) {
        Ok(()) => Reply::OK,
        Err(r) => r,
    }
}

/// RESET: the connection as it was when it connected (no MULTI, nothing
/// watched, RESP2, no name, authenticated only if no password is set).
pub(crate) fn reset(ctx: &mut Ctx<'_>, _: &[&[u8]]) -> Reply {
    ctx.session.multi = Default::default();
    ctx.session.protocol = Protocol::Resp2;
    ctx.session.authenticated = ctx.shared.password().is_none();
    let c = &ctx.session.client;
    c.set_name(b"");
    c.set_resp(2);
    c.set_multi(None);
    c.set_watching(0);
    Reply::Simple("RESET")
}

/// Redis's rule for client names: no spaces, newlines or other characters
/// outside `!`..`~`.
pub(crate) fn valid_name(name: &[u8]) -> Result<(), Reply> {
    if name.iter().all(|&c| (b'!'..=b'~').contains(&c)) {
        Ok(())
    } else {
        Err(Reply::err(
            "Client names cannot contain spaces, newlines or special characters.",
        ))
    }
}

pub(crate) fn quit(ctx: &mut Ctx<'_>, _: &[&[u8]]) -> Reply {
    ctx.session.quit = true;
    Reply::OK
}

/// SHUTDOWN [NOSAVE|SAVE] [NOW] [FORCE]: Redis's, on a server whose every
/// acknowledged write is already durable, so the options change nothing
/// (SAVE takes no new dump: every stop takes a checkpoint): the server
/// stops as on SIGTERM (the commands in flight finish, then a final
/// checkpoint). It asks the program that runs the server
/// ([`super::Backend::on_shutdown`]; refused where there is none, an
/// embedding program's server), handing it this connection, and sends no
/// reply: the connection closes when that program lets go of it, once
/// stopped, as Redis's closes when its process exits. Clients read that
/// as success (redis-py's `shutdown()` raises if it gets a reply); the
/// replies to requests before it are sent.
pub(crate) fn shutdown(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    for word in &a[1..] {
        if word.eq_ignore_ascii_case(b"ABORT") {
            return Reply::err("No shutdown in progress.");
        }
        let known = ["NOSAVE", "SAVE", "NOW", "FORCE"];
        if !known
            .iter()
            .any(|k| word.eq_ignore_ascii_case(k.as_bytes()))
        {
            return syntax_error();
        }
    }
    let Some(stop) = &ctx.shared.backend.on_shutdown else {
        return Reply::err(
            "SHUTDOWN is not available here: the program that embeds this server stops it",
        );
    };
    stop(ctx.session.client.stream.try_clone().ok());
    ctx.session.quit = true;
    ctx.session.silent = true;
    Reply::OK
}

pub(crate) fn info(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    Reply::Verbatim(info::render(ctx.shared, &a[1..]).into_bytes())
}

pub(crate) fn save(ctx: &mut Ctx<'_>, _: &[&[u8]]) -> Reply {
    match ctx.shared.backend.engine.save() {
        Ok(_) => Reply::OK,
        Err(e) => e.into(),
    }
}

pub(crate) fn bgsave(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    match a {
        [_] => {}
        [_, s] if s.eq_ignore_ascii_case(b"SCHEDULE") => {}
        _ => return syntax_error(),
    }
    start(ctx, Job::Snapshot, "Background saving started")
}

pub(crate) fn bgrewriteaof(ctx: &mut Ctx<'_>, _: &[&[u8]]) -> Reply {
    start(
        ctx,
        Job::Rewrite,
        "Background append only file rewriting started",
    )
}

fn start(ctx: &Ctx<'_>, job: Job, started: &'static str) -> Reply {
    let engine = &ctx.shared.backend.engine;
    let before = engine.background_stats();
    let result = match job {
        Job::Snapshot => engine.bgsave(),
        Job::Rewrite => engine.bgrewrite(),
    };
    match result {
        Ok(()) => {
            ctx.shared.jobs.started(job, &before);
            Reply::Simple(started)
        }
        Err(e) => e.into(),
    }
}

pub(crate) fn unknown_subcommand(sub: &[u8], cmd: &str) -> Reply {
    Reply::err(format!(
        "unknown subcommand '{}'. Try {cmd} HELP.",
        String::from_utf8_lossy(sub)
    ))
}

/// The parameters CONFIG GET knows, with their values now.
fn parameters(ctx: &Ctx<'_>) -> Vec<(&'static str, String)> {
    let s = ctx.shared;
    let interval_s = s
        .backend
        .engine_config
        .checkpoint_interval_ms
        .div_ceil(1000);
    vec![
        ("bind", s.addr.ip().to_string()),
        ("port", s.addr.port().to_string()),
        ("databases", "1".into()),
        ("maxclients", s.cfg.max_clients.to_string()),
        ("timeout", (s.cfg.idle_timeout_ms / 1000).to_string()),
        ("proto-max-bulk-len", s.cfg.max_frame_bytes.to_string()),
        (
            "save",
            if interval_s == 0 {
                String::new()
            } else {
                format!("{interval_s} 1")
            },
        ),
        ("appendonly", "yes".into()),
        ("appendfsync", "always".into()),
        ("maxmemory", "0".into()),
        ("maxmemory-policy", "noeviction".into()),
        (
            "dir",
            s.backend
                .data_dir
                .as_ref()
                .map_or(String::new(), |d| d.display().to_string()),
        ),
        ("requirepass", s.password().unwrap_or_default()),
        (
            "protected-mode",
            if s.protected_mode() { "yes" } else { "no" }.into(),
        ),
    ]
}

/// CONFIG SET name value [name value ...]: all or nothing.
fn config_set(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    if a.len() < 4 || a.len() % 2 != 0 {
        return wrong_arity("config|set");
    }
    let now = parameters(ctx);
    let mut changes = Vec::new();
    for pair in a[2..].chunks(2) {
        let name = String::from_utf8_lossy(pair[0]).to_ascii_lowercase();
        let value = String::from_utf8_lossy(pair[1]).into_owned();
        let fail = |why: &str| {
            Reply::err(format!(
                "CONFIG SET failed (possibly related to argument '{name}') - {why}"
            ))
        };
        let Some((_, current)) = now.iter().find(|(n, _)| *n == name) else {
            return fail("Unknown option or number of arguments for CONFIG SET");
        };
        match name.as_str() {
            "requirepass" => changes.push((name, value)),
            "protected-mode" => match value.to_ascii_lowercase().as_str() {
                "yes" | "no" => changes.push((name, value.to_ascii_lowercase())),
                _ => return fail("argument must be 'yes' or 'no'"),
            },
            // The rest are set in the config file; setting what is already
            // in force is accepted.
            _ if *current == value => {}
            _ => {
                return fail(&format!(
                    "critio-kv sets it only in its config file (it is {current:?})"
                ))
            }
        }
    }
    for (name, value) in changes {
        match name.as_str() {
            "requirepass" => ctx
                .shared
                .set_password(Some(value).filter(|v| !v.is_empty())),
            _ => ctx.shared.set_protected_mode(value == "yes"),
        }
    }
    Reply::OK
}

pub(crate) fn config(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    let sub = String::from_utf8_lossy(a[1]).to_ascii_uppercase();
    match sub.as_str() {
        "GET" if a.len() < 3 => wrong_arity("config|get"),
        "GET" => {
            let mut out = Vec::new();
            for (name, value) in parameters(ctx) {
                if a[2..].iter().any(|p| glob::matches(p, name.as_bytes(), true)) {
                    out.push((Reply::text(name), Reply::Bulk(value.into_bytes())));
                }
            }
            Reply::Map(out)
        }
        "SET" => config_set(ctx, a),
        "RESETSTAT" => {
            ctx.shared.stats.reset();
            ctx.shared.backend.metrics().reset();
            ctx.shared.backend.block.reset_stats();
            Reply::OK
        }
        "HELP" => help(&[
            "CONFIG GET <pattern>: parameters matching the pattern, and their values.",
            "CONFIG SET <parameter> <value> [...]: requirepass, protected-mode; others only to their value.",
            "CONFIG RESETSTAT: reset the INFO stats counters, and critio's wait and block layer figures.",
        ]),
        _ => unknown_subcommand(a[1], "CONFIG"),
    }
}

pub(crate) fn help(lines: &[&str]) -> Reply {
    Reply::Array(lines.iter().map(|l| Reply::text(l)).collect())
}

pub(crate) fn command(_: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    let Some(sub) = a.get(1) else {
        return Reply::Array(COMMANDS.iter().map(describe).collect());
    };
    match String::from_utf8_lossy(sub).to_ascii_uppercase().as_str() {
        "COUNT" => Reply::Int(COMMANDS.len() as i64),
        "DOCS" => {
            let docs = |s: &Spec| {
                (
                    Reply::text(s.name),
                    Reply::Map(vec![
                        (Reply::text("group"), Reply::text(group(s))),
                        (Reply::text("arity"), Reply::Int(s.arity.into())),
                    ]),
                )
            };
            Reply::Map(match &a[2..] {
                [] => COMMANDS.iter().map(docs).collect(),
                names => names.iter().filter_map(|n| find(n)).map(docs).collect(),
            })
        }
        "LIST" => Reply::Array(COMMANDS.iter().map(|s| Reply::text(s.name)).collect()),
        "INFO" => Reply::Array(
            a[2..]
                .iter()
                .map(|n| find(n).map_or(Reply::Nil, describe))
                .collect(),
        ),
        _ => unknown_subcommand(sub, "COMMAND"),
    }
}

/// The command's group, as COMMAND DOCS names it.
fn group(s: &Spec) -> &'static str {
    match s.name {
        "del" | "unlink" | "exists" | "type" | "expire" | "pexpire" | "expireat" | "pexpireat"
        | "persist" | "ttl" | "pttl" | "expiretime" | "pexpiretime" | "scan" | "keys"
        | "randomkey" => "generic",
        "multi" | "exec" | "discard" | "watch" | "unwatch" => "transactions",
        "ping" | "echo" | "select" | "hello" | "auth" | "quit" | "reset" | "client" => "connection",
        n if n.starts_with('h') && !matches!(n, "hello") => "hash",
        _ if matches!(s.run, Run::Data(_) | Run::Read(..)) => "string",
        _ => "server",
    }
}
