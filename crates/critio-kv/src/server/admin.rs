//! Server commands: PING, ECHO, SELECT, HELLO, AUTH, QUIT, INFO, CONFIG,
//! CLIENT, COMMAND, SAVE, BGSAVE, BGREWRITEAOF.
//!
//! `HELLO [2|3] [AUTH user pass] [SETNAME name]` switches the connection's
//! protocol (RESP3's maps, nulls and verbatim text from the next reply
//! on, its own reply included) and answers what Redis 7 does: server,
//! version, proto, id, mode, role, modules. There is no password to check
//! yet (no `requirepass`), so AUTH, as Redis's passwordless `default`
//! user, accepts user `default` with any password and refuses any other
//! user with Redis's WRONGPASS.
//!
//! CONFIG answers `GET` with what redis-benchmark, redis-cli and YCSB's
//! clients ask for, mapped onto critio-kv's settings:
//!
//! | parameter            | value                                           |
//! |----------------------|-------------------------------------------------|
//! | `save`               | `"<checkpoint interval s> 1"` (`""` if off)     |
//! | `appendonly`, `appendfsync` | `yes`, `always` (every write is logged and durable before its reply) |
//! | `maxmemory`, `maxmemory-policy` | `0`, `noeviction`                    |
//! | `databases`          | `1`                                             |
//! | `maxclients`, `timeout`, `proto-max-bulk-len`, `bind`, `port`, `dir` | from `[server]` and the data directory |

use super::command::{describe, find, syntax_error, wrong_arity, Ctx, COMMANDS};
use super::data::int;
use super::info::{self, Job};
use super::reply::{Protocol, Reply};

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

/// Redis's check of a user/password pair, with no password set: the
/// `default` user has none (`nopass`), and no other user exists.
fn authenticate(user: &[u8]) -> Result<(), Reply> {
    if user == b"default" {
        Ok(())
    } else {
        Err(Reply::Error(WRONGPASS.into()))
    }
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
                if let Err(r) = authenticate(a[i + 1]) {
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
    if let Some(n) = name {
        ctx.session.name = Some(n.to_vec()).filter(|n| !n.is_empty());
    }
    ctx.session.protocol = proto;
    Reply::Map(vec![
        (Reply::text("server"), Reply::text("redis")),
        (Reply::text("version"), Reply::text(REDIS_VERSION)),
        (Reply::text("proto"), Reply::Int(proto.version())),
        (Reply::text("id"), Reply::Int(ctx.session.id as i64)),
        (Reply::text("mode"), Reply::text("standalone")),
        (Reply::text("role"), Reply::text("master")),
        (Reply::text("modules"), Reply::Array(Vec::new())),
    ])
}

pub(crate) fn auth(_: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    match a {
        [_, _] => Reply::err(
            "AUTH <password> called without any password configured for the default user. \
             Are you sure your configuration is correct?",
        ),
        [_, user, _] => match authenticate(user) {
            Ok(()) => Reply::OK,
            Err(r) => r,
        },
        _ => syntax_error(),
    }
}

/// Redis's rule for client names: no spaces, newlines or other characters
/// outside `!`..`~`.
fn valid_name(name: &[u8]) -> Result<(), Reply> {
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

fn unknown_subcommand(sub: &[u8], cmd: &str) -> Reply {
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
    ]
}

pub(crate) fn config(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    let sub = String::from_utf8_lossy(a[1]).to_ascii_uppercase();
    match sub.as_str() {
        "GET" if a.len() < 3 => wrong_arity("config|get"),
        "GET" => {
            let mut out = Vec::new();
            for (name, value) in parameters(ctx) {
                if a[2..].iter().any(|p| glob(p, name.as_bytes())) {
                    out.push((Reply::text(name), Reply::Bulk(value.into_bytes())));
                }
            }
            Reply::Map(out)
        }
        "SET" => Reply::err("CONFIG SET is not supported: set it in the config file and restart"),
        "RESETSTAT" => {
            ctx.shared.stats.reset();
            Reply::OK
        }
        "HELP" => help(&[
            "CONFIG GET <pattern>: parameters matching the pattern, and their values.",
            "CONFIG RESETSTAT: reset the INFO stats counters.",
        ]),
        _ => unknown_subcommand(a[1], "CONFIG"),
    }
}

fn help(lines: &[&str]) -> Reply {
    Reply::Array(lines.iter().map(|l| Reply::text(l)).collect())
}

pub(crate) fn client(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    let sub = String::from_utf8_lossy(a[1]).to_ascii_uppercase();
    match (sub.as_str(), a.len()) {
        ("SETINFO", 4) => Reply::OK,
        ("SETNAME", 3) => match valid_name(a[2]) {
            Ok(()) => {
                ctx.session.name = Some(a[2].to_vec()).filter(|n| !n.is_empty());
                Reply::OK
            }
            Err(r) => r,
        },
        ("GETNAME", 2) => Reply::opt(ctx.session.name.clone()),
        ("ID", 2) => Reply::Int(ctx.session.id as i64),
        ("SETINFO" | "SETNAME" | "GETNAME" | "ID", _) => {
            wrong_arity(&format!("client|{}", sub.to_ascii_lowercase()))
        }
        _ => unknown_subcommand(a[1], "CLIENT"),
    }
}

pub(crate) fn command(_: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    let Some(sub) = a.get(1) else {
        return Reply::Array(COMMANDS.iter().map(describe).collect());
    };
    match String::from_utf8_lossy(sub).to_ascii_uppercase().as_str() {
        "COUNT" => Reply::Int(COMMANDS.len() as i64),
        "DOCS" => Reply::Array(Vec::new()),
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

/// Glob matching as CONFIG GET does it (`*`, `?`, case-insensitive),
/// iterative: the last `*` is the only backtrack point, so it is
/// O(pattern × text).
pub(crate) fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == b'?' || c.eq_ignore_ascii_case(&text[t]) => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p.min(pattern.len())..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn glob_matches_like_config_get() {
        assert!(glob(b"*", b"save"));
        assert!(glob(b"max*", b"maxmemory-policy"));
        assert!(glob(b"SAVE", b"save"));
        assert!(glob(b"s?ve", b"save"));
        assert!(glob(b"*o*y", b"maxmemory-policy"));
        assert!(!glob(b"max", b"maxclients"));
        assert!(!glob(b"x*", b"save"));
        assert!(glob(b"", b""));
    }
}
