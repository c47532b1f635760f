//! Transactions: MULTI, EXEC, DISCARD, WATCH, UNWATCH, as Redis has them,
//! and atomic and durable as **one** log record.
//!
//! ```text
//!  MULTI ─> each command: checked (name, arity, allowed) ─> queued: +QUEUED
//!                         (an error here makes EXEC fail with EXECABORT)
//!  EXEC  ─> one engine transaction over every key the queued commands and
//!           WATCH name: stripes locked ─> watched keys unchanged? (else nil,
//!           nothing runs) ─> each command in order ─> the writes, one WAL
//!           record ─> durable with the round's commit ─> the array of replies
//! ```
//!
//! A command that fails at EXEC (WRONGTYPE, not an integer) fails alone and
//! writes nothing, the others still run, as in Redis. Key-value commands
//! and server commands that touch no key and take no engine lock (PING,
//! ECHO, TIME, DBSIZE, COMMAND) may be queued; the rest (SCAN, KEYS,
//! FLUSHALL, INFO, CONFIG, CLIENT, BGSAVE, ...) are refused inside MULTI
//! with Redis's "Command not allowed inside a transaction" (Redis allows
//! most of them: here they would run while the transaction holds its
//! stripe locks).
//!
//! WATCH remembers each key's version (where its record is in the value
//! log); EXEC compares them under the transaction's locks. A write to the
//! key, its expiry, or a FLUSHALL changes it. So does the cleaner moving
//! the key's record (BGREWRITEAOF, or a checkpoint short of space): then
//! EXEC returns nil although the value is the same, which a WATCH loop
//! retries; Redis never aborts for that.
//!
//! An aborted EXEC replies with the protocol crate's null (`$-1` in RESP2,
//! `_` in RESP3), which clients read as Redis's null array.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use super::command::{keys_of, Ctx, Run, Spec};
use super::reply::Reply;

/// The most a MULTI may queue: the whole transaction is one log record, so
/// a bigger one could not commit anyway.
const QUEUE_BYTES_MAX: usize = 64 << 20;
const QUEUE_COMMANDS_MAX: usize = 1 << 20;

struct Queued {
    spec: &'static Spec,
    args: Vec<Vec<u8>>,
}

/// A connection's MULTI queue and watched keys.
#[derive(Default)]
pub(crate) struct State {
    /// Some: in MULTI.
    queue: Option<Vec<Queued>>,
    queued_bytes: usize,
    /// A command failed to queue: EXEC aborts.
    failed: bool,
    /// Watched keys and their versions when watched.
    watched: Vec<(Vec<u8>, Option<u64>)>,
    /// The server's FLUSHALL count when the first key was watched.
    flushes: u64,
}

impl State {
    /// In MULTI: commands are queued.
    pub(crate) fn queueing(&self) -> bool {
        self.queue.is_some()
    }

    fn clear(&mut self) {
        *self = State::default();
    }
}

/// Commands that run at once even inside MULTI.
pub(crate) fn runs_now(spec: &Spec) -> bool {
    matches!(
        spec.name,
        "exec" | "discard" | "multi" | "watch" | "quit" | "reset"
    )
}

/// A command could not be queued (unknown, wrong arity, refused): if in
/// MULTI, EXEC will abort.
pub(crate) fn queue_failed(ctx: &mut Ctx<'_>) {
    let m = &mut ctx.session.multi;
    if m.queueing() {
        m.failed = true;
    }
}

/// Queues a command inside MULTI.
pub(crate) fn queue(ctx: &mut Ctx<'_>, spec: &'static Spec, args: &[&[u8]]) -> Reply {
    if let Run::Server(_) = spec.run {
        queue_failed(ctx);
        return Reply::err("Command not allowed inside a transaction");
    }
    let m = &mut ctx.session.multi;
    let bytes: usize = args.iter().map(|a| a.len() + 16).sum();
    let queue = m.queue.as_mut().expect("in MULTI");
    if queue.len() >= QUEUE_COMMANDS_MAX || m.queued_bytes + bytes > QUEUE_BYTES_MAX {
        m.failed = true;
        return Reply::err(format!(
            "transaction too large: at most {QUEUE_COMMANDS_MAX} commands and \
             {QUEUE_BYTES_MAX} bytes (it is logged as one record)"
        ));
    }
    m.queued_bytes += bytes;
    queue.push(Queued {
        spec,
        args: args.iter().map(|a| a.to_vec()).collect(),
    });
    ctx.session.client.set_multi(Some(queue.len()));
    Reply::Simple("QUEUED")
}

pub(crate) fn multi(ctx: &mut Ctx<'_>, _: &[&[u8]]) -> Reply {
    let m = &mut ctx.session.multi;
    if m.queueing() {
        return Reply::err("MULTI calls can not be nested");
    }
    m.queue = Some(Vec::new());
    m.queued_bytes = 0;
    m.failed = false;
    ctx.session.client.set_multi(Some(0));
    Reply::OK
}

pub(crate) fn discard(ctx: &mut Ctx<'_>, _: &[&[u8]]) -> Reply {
    if !ctx.session.multi.queueing() {
        return Reply::err("DISCARD without MULTI");
    }
    end(ctx);
    Reply::OK
}

/// Leaves MULTI and forgets the watched keys.
fn end(ctx: &mut Ctx<'_>) {
    ctx.session.multi.clear();
    ctx.session.client.set_multi(None);
    ctx.session.client.set_watching(0);
}

pub(crate) fn watch(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    if ctx.session.multi.queueing() {
        return Reply::err("WATCH inside MULTI is not allowed");
    }
    let keys = &a[1..];
    let versions = match ctx.shared.backend.engine.versions(keys) {
        Ok(v) => v,
        Err(e) => return e.into(),
    };
    let m = &mut ctx.session.multi;
    if m.watched.is_empty() {
        m.flushes = ctx.shared.flushes.load(Ordering::SeqCst);
    }
    for (k, v) in keys.iter().zip(versions) {
        if !m.watched.iter().any(|(w, _)| w == k) {
            m.watched.push((k.to_vec(), v));
        }
    }
    ctx.session.client.set_watching(m.watched.len());
    Reply::OK
}

pub(crate) fn unwatch(ctx: &mut Ctx<'_>, _: &[&[u8]]) -> Reply {
    ctx.session.multi.watched.clear();
    ctx.session.client.set_watching(0);
    Reply::OK
}

pub(crate) fn exec(ctx: &mut Ctx<'_>, _: &[&[u8]]) -> Reply {
    if !ctx.session.multi.queueing() {
        return Reply::err("EXEC without MULTI");
    }
    let state = std::mem::take(&mut ctx.session.multi);
    end(ctx);
    if state.failed {
        return Reply::Error("EXECABORT Transaction discarded because of previous errors.".into());
    }
    if !state.watched.is_empty() && ctx.shared.flushes.load(Ordering::SeqCst) != state.flushes {
        return Reply::Nil;
    }
    let queue = state.queue.unwrap_or_default();
    let args: Vec<Vec<&[u8]>> = queue
        .iter()
        .map(|q| q.args.iter().map(Vec::as_slice).collect())
        .collect();
    let mut seen = HashSet::new();
    let mut keys: Vec<&[u8]> = Vec::new();
    let named = state.watched.iter().map(|(k, _)| vec![k.as_slice()]);
    let queued = queue.iter().zip(&args).map(|(q, a)| keys_of(q.spec, a));
    for k in named.chain(queued).flatten() {
        if seen.insert(k) {
            keys.push(k);
        }
    }
    let shared = ctx.shared;
    let result = shared.backend.engine.transact(&keys, |t| {
        if state.watched.iter().any(|(k, v)| t.version(k) != *v) {
            return None;
        }
        let replies = queue
            .iter()
            .zip(&args)
            .map(|(q, a)| match q.spec.run {
                Run::Data(h) | Run::Read(_, h) => h(t, a),
                Run::Pure(h) => h(ctx, a),
                Run::Server(_) => unreachable!("refused when queued"),
            })
            .collect();
        Some(replies)
    });
    match result {
        Ok(Some(replies)) => Reply::Array(replies),
        Ok(None) => Reply::Nil,
        Err(e) => e.into(),
    }
}
