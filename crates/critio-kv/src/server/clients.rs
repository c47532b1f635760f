//! The connected clients, as CLIENT LIST, CLIENT INFO and CLIENT KILL see
//! them: one [`Client`] per connection, shared between its worker (which
//! updates it) and whoever lists or kills it.
//!
//! A command costs its client two relaxed atomic stores (the time and the
//! command); names and library tags take a small lock only when they
//! change or are listed. CLIENT KILL shuts the connection's socket down;
//! its worker sees the hang-up and closes it as it would any other.
//!
//! ```text
//!  id=7 addr=127.0.0.1:50312 laddr=127.0.0.1:6390 fd=-1 name=app age=3 idle=0
//!  flags=N db=0 sub=0 psub=0 ssub=0 multi=-1 watch=0 ... cmd=client|list
//!  user=default redir=-1 resp=2 lib-name=redis-py lib-ver=5.0.1
//! ```

use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

use super::admin;
use super::command::{self, wrong_arity, Ctx, COMMANDS};
use super::reply::Reply;

/// What CLIENT SETNAME and SETINFO set.
#[derive(Default)]
struct Names {
    name: Option<Vec<u8>>,
    lib_name: Option<Vec<u8>>,
    lib_ver: Option<Vec<u8>>,
}

/// One connected client.
pub(crate) struct Client {
    pub id: u64,
    /// A handle on the connection's socket (CLIENT KILL, a stop).
    pub stream: TcpStream,
    addr: String,
    laddr: String,
    since: Instant,
    /// When its last command ran, in ms after `since`.
    last_ms: AtomicU64,
    /// Its last command: an index into the command table plus one (0: none).
    last_cmd: AtomicUsize,
    /// 2 or 3.
    resp: AtomicU8,
    /// Commands queued in MULTI (-1: not in MULTI).
    multi: AtomicI64,
    /// Keys it watches.
    watching: AtomicU64,
    names: Mutex<Names>,
}

impl Client {
    pub(crate) fn new(id: u64, stream: TcpStream) -> Client {
        let addr = stream
            .peer_addr()
            .map_or_else(|_| "?".into(), |a| a.to_string());
        let laddr = stream
            .local_addr()
            .map_or_else(|_| "?".into(), |a| a.to_string());
        Client {
            id,
            stream,
            addr,
            laddr,
            since: Instant::now(),
            last_ms: AtomicU64::new(0),
            last_cmd: AtomicUsize::new(0),
            resp: AtomicU8::new(2),
            multi: AtomicI64::new(-1),
            watching: AtomicU64::new(0),
            names: Mutex::new(Names::default()),
        }
    }

    /// Notes a command about to run (`spec`: its index in the table).
    pub(crate) fn ran(&self, spec: usize) {
        let ms = self.since.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
        self.last_cmd.store(spec + 1, Ordering::Relaxed);
    }

    pub(crate) fn set_resp(&self, version: i64) {
        self.resp.store(version as u8, Ordering::Relaxed);
    }

    pub(crate) fn set_multi(&self, queued: Option<usize>) {
        self.multi
            .store(queued.map_or(-1, |n| n as i64), Ordering::Relaxed);
    }

    pub(crate) fn set_watching(&self, keys: usize) {
        self.watching.store(keys as u64, Ordering::Relaxed);
    }

    pub(crate) fn name(&self) -> Option<Vec<u8>> {
        self.names.lock().name.clone()
    }

    pub(crate) fn set_name(&self, name: &[u8]) {
        self.names.lock().name = Some(name.to_vec()).filter(|n| !n.is_empty());
    }

    /// The client's CLIENT LIST line (without the newline).
    fn line(&self) -> String {
        let names = self.names.lock();
        fn text(v: &Option<Vec<u8>>) -> String {
            v.as_deref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default()
        }
        let age = self.since.elapsed();
        let idle_ms = (age.as_millis() as u64).saturating_sub(self.last_ms.load(Ordering::Relaxed));
        let cmd = match self.last_cmd.load(Ordering::Relaxed) {
            0 => "NULL",
            i => COMMANDS[i - 1].name,
        };
        let multi = self.multi.load(Ordering::Relaxed);
        let flags = if multi >= 0 { "x" } else { "N" };
        format!(
            "id={} addr={} laddr={} fd=-1 name={} age={} idle={} flags={flags} db=0 sub=0 psub=0 \
             ssub=0 multi={multi} watch={} qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 \
             obl=0 oll=0 omem=0 tot-mem=0 events=r cmd={cmd} user=default redir=-1 resp={} \
             lib-name={} lib-ver={}",
            self.id,
            self.addr,
            self.laddr,
            text(&names.name),
            age.as_secs(),
            idle_ms / 1000,
            self.watching.load(Ordering::Relaxed),
            self.resp.load(Ordering::Relaxed),
            text(&names.lib_name),
            text(&names.lib_ver),
        )
    }
}

/// What CLIENT KILL's filters select.
#[derive(Default)]
struct Filter {
    id: Option<u64>,
    addr: Option<Vec<u8>>,
    laddr: Option<Vec<u8>>,
    skip_me: bool,
}

impl Filter {
    fn selects(&self, c: &Client, me: u64) -> bool {
        !(self.skip_me && c.id == me)
            && self.id.is_none_or(|id| id == c.id)
            && self.addr.as_deref().is_none_or(|a| a == c.addr.as_bytes())
            && self
                .laddr
                .as_deref()
                .is_none_or(|a| a == c.laddr.as_bytes())
    }
}

/// CLIENT KILL's `<filter> <value> ...` form.
fn parse_filter(a: &[&[u8]]) -> Result<Filter, Reply> {
    let mut f = Filter {
        skip_me: true,
        ..Filter::default()
    };
    if a.len() % 2 != 0 {
        return Err(command::syntax_error());
    }
    for pair in a.chunks(2) {
        let (name, value) = (pair[0].to_ascii_uppercase(), pair[1]);
        match name.as_slice() {
            b"ID" => match std::str::from_utf8(value).ok().and_then(|v| v.parse().ok()) {
                Some(id) if id > 0 => f.id = Some(id),
                _ => return Err(Reply::err("client-id should be greater than 0")),
            },
            b"ADDR" => f.addr = Some(value.to_vec()),
            b"LADDR" => f.laddr = Some(value.to_vec()),
            b"SKIPME" => match value.to_ascii_lowercase().as_slice() {
                b"yes" => f.skip_me = true,
                b"no" => f.skip_me = false,
                _ => return Err(command::syntax_error()),
            },
            // Every client is `default`; there are no other users.
            b"USER" if value == b"default" => {}
            b"USER" => {
                return Err(Reply::err(format!(
                    "No such user '{}'",
                    String::from_utf8_lossy(value)
                )))
            }
            b"TYPE" if value.eq_ignore_ascii_case(b"normal") => {}
            b"TYPE" => {
                return Err(Reply::err(format!(
                    "Unknown client type '{}'",
                    String::from_utf8_lossy(value)
                )))
            }
            _ => return Err(command::syntax_error()),
        }
    }
    Ok(f)
}

/// Closes the clients `f` selects; returns how many. The caller itself
/// is not shut down here: it closes after its reply (`quit`).
fn kill(ctx: &mut Ctx<'_>, f: &Filter) -> usize {
    let me = ctx.session.client.id;
    let victims: Vec<_> = ctx
        .shared
        .clients
        .lock()
        .open
        .values()
        .filter(|c| f.selects(c, me))
        .cloned()
        .collect();
    for c in &victims {
        if c.id == me {
            ctx.session.quit = true;
        } else {
            let _ = c.stream.shutdown(Shutdown::Both);
        }
    }
    victims.len()
}

/// CLIENT and its subcommands.
pub(crate) fn client(ctx: &mut Ctx<'_>, a: &[&[u8]]) -> Reply {
    let sub = String::from_utf8_lossy(a[1]).to_ascii_uppercase();
    let arity = |ok: bool| {
        if ok {
            None
        } else {
            Some(wrong_arity(&format!("client|{}", sub.to_ascii_lowercase())))
        }
    };
    let check = match sub.as_str() {
        "ID" | "GETNAME" | "INFO" => arity(a.len() == 2),
        "SETNAME" => arity(a.len() == 3),
        "SETINFO" => arity(a.len() == 4),
        "KILL" => arity(a.len() >= 3),
        "LIST" => arity(a.len() == 2 || a.len() >= 4),
        _ => None,
    };
    if let Some(r) = check {
        return r;
    }
    let me = ctx.session.client.clone();
    match sub.as_str() {
        "ID" => Reply::Int(me.id as i64),
        "GETNAME" => Reply::opt(me.name()),
        "SETNAME" => match admin::valid_name(a[2]) {
            Ok(()) => {
                me.set_name(a[2]);
                Reply::OK
            }
            Err(r) => r,
        },
        "SETINFO" => {
            let attr = a[2].to_ascii_uppercase();
            if let Err(r) = admin::valid_name(a[3]) {
                return r;
            }
            let v = Some(a[3].to_vec()).filter(|v| !v.is_empty());
            match attr.as_slice() {
                b"LIB-NAME" => me.names.lock().lib_name = v,
                b"LIB-VER" => me.names.lock().lib_ver = v,
                _ => {
                    return Reply::err(format!(
                        "Unrecognized option '{}'",
                        String::from_utf8_lossy(a[2])
                    ))
                }
            }
            Reply::OK
        }
        "INFO" => Reply::Verbatim(format!("{}\n", me.line()).into_bytes()),
        "LIST" => {
            let ids: Option<Vec<u64>> = match a.get(2) {
                None => None,
                Some(t) if t.eq_ignore_ascii_case(b"ID") => {
                    let parsed: Option<Vec<u64>> = a[3..]
                        .iter()
                        .map(|x| std::str::from_utf8(x).ok()?.parse().ok())
                        .collect();
                    match parsed {
                        Some(ids) => Some(ids),
                        None => return Reply::err("Invalid client ID"),
                    }
                }
                Some(t) if t.eq_ignore_ascii_case(b"TYPE") && a.len() == 4 => {
                    if a[3].eq_ignore_ascii_case(b"normal") {
                        None
                    } else {
                        return Reply::err(format!(
                            "Unknown client type '{}'",
                            String::from_utf8_lossy(a[3])
                        ));
                    }
                }
                Some(_) => return command::syntax_error(),
            };
            let mut clients: Vec<_> = ctx.shared.clients.lock().open.values().cloned().collect();
            clients.sort_by_key(|c| c.id);
            let mut out = String::new();
            for c in clients {
                if ids.as_ref().is_none_or(|ids| ids.contains(&c.id)) {
                    out += &c.line();
                    out.push('\n');
                }
            }
            Reply::Verbatim(out.into_bytes())
        }
        "KILL" if a.len() == 3 => {
            // The old form: CLIENT KILL addr:port, the caller included.
            let f = Filter {
                addr: Some(a[2].to_vec()),
                ..Filter::default()
            };
            match kill(ctx, &f) {
                0 => Reply::err("No such client"),
                _ => Reply::OK,
            }
        }
        "KILL" => match parse_filter(&a[2..]) {
            Ok(f) => Reply::Int(kill(ctx, &f) as i64),
            Err(r) => r,
        },
        "HELP" => admin::help(&[
            "CLIENT ID | GETNAME | SETNAME <name> | INFO",
            "CLIENT SETINFO LIB-NAME|LIB-VER <value>",
            "CLIENT LIST [TYPE normal] [ID id ...]",
            "CLIENT KILL <ip:port> | CLIENT KILL [ID id] [ADDR ip:port] [LADDR ip:port] [SKIPME yes|no] [USER default]",
        ]),
        _ => admin::unknown_subcommand(a[1], "CLIENT"),
    }
}
