//! Server commands: PING, ECHO, SELECT, QUIT, INFO, CONFIG, CLIENT,
//! COMMAND, SAVE, BGSAVE, BGREWRITEAOF.
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
use super::reply::Reply;

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

pub(crate) fn quit(ctx: &mut Ctx<'_>, _: &[&[u8]]) -> Reply {
    ctx.session.quit = true;
    Reply::OK
}

pub(crate) fn info(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    Reply::Bulk(info::render(ctx.shared, &a[1..]).into_bytes())
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
                    out.push(Reply::Bulk(name.as_bytes().to_vec()));
                    out.push(Reply::Bulk(value.into_bytes()));
                }
            }
            Reply::Array(out)
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
    Reply::Array(
        lines
            .iter()
            .map(|l| Reply::Bulk(l.as_bytes().to_vec()))
            .collect(),
    )
}

pub(crate) fn client(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    let sub = String::from_utf8_lossy(a[1]).to_ascii_uppercase();
    match (sub.as_str(), a.len()) {
        ("SETINFO", 4) => Reply::OK,
        ("SETNAME", 3) => {
            ctx.session.name = Some(a[2].to_vec()).filter(|n| !n.is_empty());
            Reply::OK
        }
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
        "LIST" => Reply::Array(
            COMMANDS
                .iter()
                .map(|s| Reply::Bulk(s.name.as_bytes().to_vec()))
                .collect(),
        ),
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
