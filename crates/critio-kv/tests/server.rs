//! The server end to end, through the `redis` client and raw sockets: every
//! command with real replies, pipelining, many concurrent clients, bad
//! input (malformed and oversized frames, oversized values, unknown
//! commands, wrong arity), the client limit, device errors, idle timeout
//! and a clean stop.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use critio::device::faulty::{FaultConfig, FaultyDevice};
use critio::device::mem::MemDevice;
use critio::device::DeviceSpec;
use critio_kv::engine::{Engine, EngineConfig};
use critio_kv::server::{Backend, Server, ServerConfig};
use critio_kv::stack::{default_critio_config, Scheme, Stack, StackConfig};
use redis::{Commands, Connection, FromRedisValue, RedisResult, Value};

const MIB: u64 = 1 << 20;
/// The test servers' largest value.
const VALUE_MAX: usize = 64 << 10;
/// The test servers' largest frame.
const FRAME_MAX: u64 = 256 << 10;

fn engine_config() -> EngineConfig {
    EngineConfig {
        log_bytes: 4 * MIB,
        value_bytes_max: VALUE_MAX,
        checkpoint_interval_ms: 200,
        ..EngineConfig::default()
    }
}

fn stack_config() -> StackConfig {
    let mut critio = default_critio_config();
    critio.cache.capacity_bytes = 4 * MIB;
    critio.log.record_bytes_max = 256 << 10;
    critio.log.batch_bytes_max = MIB;
    critio.log.pending_bytes_max = 2 * MIB;
    StackConfig {
        device: DeviceSpec::Mem,
        capacity: 64 * MIB,
        seed: 1,
        scheme: Scheme::Rcp,
        critio,
        engine: engine_config(),
        ..StackConfig::default()
    }
}

fn server_config() -> ServerConfig {
    ServerConfig {
        bind: "127.0.0.1:0".into(),
        max_frame_bytes: FRAME_MAX,
        max_clients: 64,
        ..ServerConfig::default()
    }
}

/// A server over a fresh in-memory store.
fn start(cfg: ServerConfig) -> (Server, Stack) {
    let sc = stack_config();
    let stack = Stack::open(&sc).expect("open the stack");
    let server = Server::start(cfg, Backend::of(&stack, &sc)).expect("start the server");
    (server, stack)
}

fn client(addr: SocketAddr) -> Connection {
    let c = redis::Client::open(format!("redis://{addr}/")).unwrap();
    c.get_connection_with_timeout(Duration::from_secs(5))
        .unwrap()
}

fn raw(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// Sends `bytes` and reads until `n` CRLF-ended lines arrived (or EOF).
fn exchange(s: &mut TcpStream, bytes: &[u8], n: usize) -> String {
    s.write_all(bytes).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.windows(2).filter(|w| w == b"\r\n").count() < n {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => got.extend_from_slice(&buf[..k]),
            Err(e) => panic!("read: {e} after {:?}", String::from_utf8_lossy(&got)),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// True if the server closed `s` (EOF or reset) within 5 s.
fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => return e.kind() != std::io::ErrorKind::WouldBlock,
        }
    }
}

fn err_text(e: redis::RedisError) -> String {
    format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or(""))
}

/// Runs one command given as words.
fn q<T: FromRedisValue>(c: &mut Connection, words: &[&str]) -> RedisResult<T> {
    let mut cmd = redis::cmd(words[0]);
    for w in &words[1..] {
        cmd.arg(*w);
    }
    cmd.query(c)
}

/// A counter of INFO stats.
fn stat(c: &mut Connection, name: &str) -> u64 {
    let info: String = ok(c, &["INFO", "stats"]);
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("INFO stats has no {name}"))
        .trim()
        .parse()
        .unwrap()
}

/// Runs one command that must succeed.
fn ok<T: FromRedisValue>(c: &mut Connection, words: &[&str]) -> T {
    q(c, words).unwrap_or_else(|e| panic!("{words:?}: {e}"))
}

/// Runs one command that must fail; its error code and message.
fn fails(c: &mut Connection, words: &[&str]) -> String {
    err_text(q::<Value>(c, words).expect_err("an error reply"))
}

fn get(c: &mut Connection, key: &str) -> Option<String> {
    ok(c, &["GET", key])
}

#[test]
fn string_commands_reply_like_redis() {
    let (server, _stack) = start(server_config());
    let mut c = client(server.local_addr());
    assert_eq!(ok::<String>(&mut c, &["PING"]), "PONG");
    assert_eq!(ok::<String>(&mut c, &["ECHO", "hi there"]), "hi there");
    assert_eq!(ok::<String>(&mut c, &["SET", "k", "v"]), "OK");
    assert_eq!(get(&mut c, "k").as_deref(), Some("v"));
    assert_eq!(get(&mut c, "missing"), None);
    assert_eq!(ok::<Option<String>>(&mut c, &["SET", "k", "w", "NX"]), None);
    assert_eq!(
        ok::<Option<String>>(&mut c, &["SET", "nope", "w", "XX"]),
        None
    );
    let set: Option<String> = ok(&mut c, &["SET", "k", "w", "XX"]);
    assert_eq!(set.as_deref(), Some("OK"));
    assert_eq!(get(&mut c, "k").as_deref(), Some("w"));
    assert_eq!(ok::<u64>(&mut c, &["EXISTS", "k", "k", "zz"]), 2);
    assert_eq!(ok::<u64>(&mut c, &["DEL", "k", "zz", "k"]), 1);
    assert_eq!(ok::<String>(&mut c, &["MSET", "a", "1", "b", "2"]), "OK");
    let got: Vec<Option<String>> = ok(&mut c, &["MGET", "a", "x", "b"]);
    assert_eq!(got, vec![Some("1".into()), None, Some("2".into())]);
    assert_eq!(ok::<i64>(&mut c, &["INCR", "n"]), 1);
    assert_eq!(ok::<i64>(&mut c, &["INCRBY", "n", "41"]), 42);
    assert_eq!(ok::<i64>(&mut c, &["DECR", "n"]), 41);
    assert_eq!(ok::<i64>(&mut c, &["DECRBY", "n", "50"]), -9);
    assert_eq!(ok::<i64>(&mut c, &["INCR", "a"]), 2);
    ok::<()>(&mut c, &["SET", "s", "text"]);
    assert!(fails(&mut c, &["INCR", "s"]).contains("not an integer"));
    assert!(fails(&mut c, &["INCRBY", "n", "x"]).contains("not an integer"));
    assert!(fails(&mut c, &["SET", "k", "v", "NX", "XX"]).contains("syntax error"));
    let e = fails(&mut c, &["SET", "k", "v", "EX", "0"]);
    assert!(e.contains("invalid expire time in 'set' command"), "{e}");
    assert!(ok::<u64>(&mut c, &["DBSIZE"]) >= 4);
    ok::<()>(&mut c, &["FLUSHDB"]);
    assert_eq!(ok::<u64>(&mut c, &["DBSIZE"]), 0);
    ok::<()>(&mut c, &["SET", "k", "v"]);
    ok::<()>(&mut c, &["FLUSHALL", "ASYNC"]);
    assert_eq!(ok::<u64>(&mut c, &["DBSIZE"]), 0);
}

/// A key longer than the engine stores (`engine.key_bytes_max`) cannot
/// exist: reading it finds nothing, as Redis would, and writing it is
/// refused with the limit, the rest of the command (MSET) with it.
#[test]
fn a_key_too_long_to_store_reads_as_absent_and_is_refused_for_writes() {
    let (server, _stack) = start(server_config());
    let mut c = client(server.local_addr());
    let long = "k".repeat(5000);
    let long = long.as_str();
    assert_eq!(get(&mut c, long), None);
    assert_eq!(ok::<u64>(&mut c, &["EXISTS", long]), 0);
    assert_eq!(ok::<u64>(&mut c, &["DEL", long]), 0);
    assert_eq!(ok::<i64>(&mut c, &["TTL", long]), -2);
    assert_eq!(ok::<String>(&mut c, &["TYPE", long]), "none");
    for write in [
        &["SET", long, "v"][..],
        &["INCR", long],
        &["HSET", long, "f", "v"],
        &["MSET", "a", "1", long, "v"],
    ] {
        let e = fails(&mut c, write);
        assert!(
            e.contains("key of 5000 bytes exceeds the 1024-byte limit"),
            "{e}"
        );
    }
    assert_eq!(get(&mut c, "a"), None, "MSET is all or nothing");
}

#[test]
fn set_expiry_options() {
    let (server, _stack) = start(server_config());
    let mut c = client(server.local_addr());
    ok::<()>(&mut c, &["SET", "px", "1", "PX", "100"]);
    ok::<()>(&mut c, &["SET", "ex", "1", "EX", "100"]);
    ok::<()>(&mut c, &["SET", "past", "1", "EXAT", "1"]);
    ok::<()>(&mut c, &["SET", "pxat", "1", "PXAT", "99999999999999"]);
    assert_eq!(get(&mut c, "px").as_deref(), Some("1"));
    assert_eq!(get(&mut c, "past"), None);
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(get(&mut c, "px"), None);
    assert_eq!(get(&mut c, "ex").as_deref(), Some("1"));
    assert_eq!(get(&mut c, "pxat").as_deref(), Some("1"));
    assert!(fails(&mut c, &["SET", "k", "v", "EX", "1", "PX", "1"]).contains("syntax error"));
    assert_eq!(
        ok::<Option<String>>(&mut c, &["SET", "k", "v", "GET"]),
        None
    );
    assert_eq!(
        ok::<Option<String>>(&mut c, &["SET", "k", "w", "GET"]).as_deref(),
        Some("v")
    );
}

#[test]
fn hash_commands_and_wrongtype() {
    let (server, _stack) = start(server_config());
    let mut c = client(server.local_addr());
    assert_eq!(ok::<u64>(&mut c, &["HSET", "h", "f1", "a", "f2", "b"]), 2);
    assert_eq!(ok::<u64>(&mut c, &["HSET", "h", "f1", "c", "f3", "d"]), 1);
    assert_eq!(ok::<String>(&mut c, &["HMSET", "h", "f4", "e"]), "OK");
    assert_eq!(ok::<String>(&mut c, &["HGET", "h", "f1"]), "c");
    assert_eq!(ok::<Option<String>>(&mut c, &["HGET", "h", "zz"]), None);
    let all: Vec<String> = ok(&mut c, &["HGETALL", "h"]);
    assert_eq!(all, ["f1", "c", "f2", "b", "f3", "d", "f4", "e"]);
    assert_eq!(ok::<u64>(&mut c, &["HDEL", "h", "f1", "f2", "zz"]), 2);
    assert!(ok::<Vec<String>>(&mut c, &["HGETALL", "nothing"]).is_empty());
    ok::<()>(&mut c, &["SET", "s", "v"]);
    assert!(fails(&mut c, &["HGET", "s", "f"]).starts_with("WRONGTYPE"));
    assert!(fails(&mut c, &["GET", "h"]).starts_with("WRONGTYPE"));
    let got: Vec<Option<String>> = ok(&mut c, &["MGET", "h", "s"]);
    assert_eq!(got, vec![None, Some("v".into())]);
    assert_eq!(ok::<u64>(&mut c, &["HDEL", "h", "f3", "f4"]), 2);
    assert_eq!(
        ok::<u64>(&mut c, &["EXISTS", "h"]),
        0,
        "an emptied hash is deleted"
    );
}

#[test]
fn info_and_config_get() {
    let (server, stack) = start(server_config());
    let mut c = client(server.local_addr());
    ok::<()>(&mut c, &["SET", "k", "v"]);
    // A critical wait in the store's registry, so INFO has one to show
    // however the test runs.
    stack.io.metrics().record_wait(
        "info_test",
        critio::context::Class::Critical,
        Duration::from_millis(2),
    );
    let info: String = ok(&mut c, &["INFO"]);
    for needle in [
        "# Server",
        "# Clients",
        "# Stats",
        "# Persistence",
        "# Critio",
        "# Keyspace",
        "# Memory",
        "# Replication",
        "# CPU",
        "role:master",
        "used_memory:",
        "used_cpu_user:",
        "connected_clients:1",
        "checkpoints:",
        "scheme:rcp",
        "block_critical_completions:",
        "block_critical_clean_us:",
        "block_critical_mixed_us:",
        "block_cap_stalls:",
        "cache_hits:",
        "log_records:",
        "inherit_lock:",
        "background_cpu_min_share:",
        "background_cpu_floor_raises:",
        "critical_wait_info_test:waits=",
        "db0:keys=1",
    ] {
        assert!(info.contains(needle), "INFO lacks {needle}:\n{info}");
    }
    let only: String = ok(&mut c, &["INFO", "keyspace"]);
    assert_eq!(only, "# Keyspace\r\ndb0:keys=1\r\n");
    // The worker, a foreground thread, writes its rounds' log batches
    // itself (log.committer_writes); a checkpoint's record, appended in
    // the background, may have the log writer take one now and then.
    for i in 0..10 {
        ok::<()>(&mut c, &["SET", &format!("k{i}"), "v"]);
    }
    let critio: String = ok(&mut c, &["INFO", "critio"]);
    let by_committer: u64 = critio
        .lines()
        .find_map(|l| l.strip_prefix("log_committer_batches:"))
        .unwrap_or_else(|| panic!("INFO lacks log_committer_batches:\n{critio}"))
        .parse()
        .unwrap();
    assert!(by_committer >= 1, "{critio}");
    // Counted as completions: on this memory device the block layer's fast
    // path times only a sample of them (block_critical_device_time).
    let critical_completions = |critio: &str| -> u64 {
        critio
            .lines()
            .find_map(|l| l.strip_prefix("block_critical_completions:"))
            .unwrap_or_else(|| panic!("INFO lacks block_critical_completions:\n{critio}"))
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{e}: {critio}"))
    };
    assert!(critical_completions(&critio) >= 10, "{critio}");
    // Where the workers' rounds went: one client waiting for each reply
    // gives one round per command. CONFIG RESETSTAT's own round is
    // counted after the reset, and INFO runs in the next round; the idle
    // worker's ticks in between (every 100 ms) are no rounds.
    ok::<()>(&mut c, &["CONFIG", "RESETSTAT"]);
    std::thread::sleep(Duration::from_millis(350));
    let critio: String = ok(&mut c, &["INFO", "critio"]);
    for part in ["run", "commit", "send"] {
        let line = critio
            .lines()
            .find(|l| l.starts_with(&format!("round_{part}:")))
            .unwrap_or_else(|| panic!("INFO lacks round_{part}:\n{critio}"));
        assert!(line.contains(":count=1,"), "{line}");
    }
    // The reset covers critio's own figures too (the ten SETs' log writes
    // and flushes were critical; nothing after the reset wrote).
    assert_eq!(critical_completions(&critio), 0, "{critio}");
    let cfg: Vec<String> = ok(&mut c, &["CONFIG", "GET", "save"]);
    assert_eq!(cfg, ["save", "1 1"]);
    let cfg: Vec<String> = ok(&mut c, &["CONFIG", "GET", "appendonly"]);
    assert_eq!(cfg, ["appendonly", "yes"]);
    let cfg: Vec<String> = ok(&mut c, &["config", "get", "max*"]);
    assert_eq!(cfg.len(), 6, "{cfg:?}");
    let cfg: Vec<String> = ok(&mut c, &["CONFIG", "GET", "databases", "no-such"]);
    assert_eq!(cfg, ["databases", "1"]);
    assert!(ok::<Vec<String>>(&mut c, &["CONFIG", "GET", "no-such"]).is_empty());
}

/// SHUTDOWN asks the program running the server to stop it and closes the
/// connection with no reply, as Redis does (clients read that as
/// success); its options are Redis's; an embedded server with no one to
/// ask refuses it with a reason; it is not allowed in MULTI.
#[test]
fn shutdown_asks_the_program_to_stop_and_closes_with_no_reply() {
    let (server, _stack) = start(server_config());
    let mut c = client(server.local_addr());
    let e = fails(&mut c, &["SHUTDOWN"]);
    assert!(e.contains("not available"), "{e}");
    assert!(fails(&mut c, &["SHUTDOWN", "LATER"]).contains("syntax"));
    assert!(fails(&mut c, &["SHUTDOWN", "ABORT"]).contains("No shutdown in progress"));
    let mut s = raw(server.local_addr());
    let r = exchange(&mut s, b"*1\r\n$5\r\nMULTI\r\n*1\r\n$8\r\nSHUTDOWN\r\n", 2);
    assert!(r.contains("not allowed inside a transaction"), "{r}");
    drop(server);

    let sc = stack_config();
    let stack = Stack::open(&sc).unwrap();
    let asked = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = asked.clone();
    let backend = Backend {
        on_shutdown: Some(Arc::new(move |conn: Option<TcpStream>| {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            // The program closes the connection once it has stopped.
            drop(conn);
        })),
        ..Backend::of(&stack, &sc)
    };
    let server = Server::start(server_config(), backend).unwrap();
    let mut other = client(server.local_addr());
    let mut s = raw(server.local_addr());
    // A request before it in the same packet gets its reply; SHUTDOWN none.
    s.write_all(b"*1\r\n$4\r\nPING\r\n*2\r\n$8\r\nSHUTDOWN\r\n$6\r\nNOSAVE\r\n")
        .unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert_eq!(String::from_utf8_lossy(&got), "+PONG\r\n");
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
    // The program decides when to stop; the others are served meanwhile.
    assert_eq!(get(&mut other, "k"), None);
    server.shutdown();
}

#[test]
fn save_bgsave_bgrewriteaof_and_their_status() {
    let (server, _stack) = start(server_config());
    let mut c = client(server.local_addr());
    ok::<()>(&mut c, &["SET", "k", "v"]);
    assert_eq!(ok::<String>(&mut c, &["SAVE"]), "OK");
    assert_eq!(
        ok::<String>(&mut c, &["BGSAVE"]),
        "Background saving started"
    );
    let started: String = ok(&mut c, &["BGREWRITEAOF"]);
    assert_eq!(started, "Background append only file rewriting started");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let p: String = ok(&mut c, &["INFO", "persistence"]);
        let done =
            p.contains("rdb_bgsave_in_progress:0") && p.contains("aof_rewrite_in_progress:0");
        if done {
            assert!(p.contains("rdb_last_bgsave_status:ok"), "{p}");
            assert!(p.contains("rdb_saves:1"), "{p}");
            assert!(p.contains("aof_rewrites:1"), "{p}");
            // Redis's progress fields, at rest with no job running.
            assert!(p.contains("current_fork_perc:0.00\r\n"), "{p}");
            assert!(p.contains("current_save_keys_processed:0\r\n"), "{p}");
            break;
        }
        assert!(Instant::now() < deadline, "jobs did not finish:\n{p}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn select_command_client_and_quit() {
    let (server, _stack) = start(server_config());
    let mut c = client(server.local_addr());
    assert_eq!(ok::<String>(&mut c, &["SELECT", "0"]), "OK");
    assert!(fails(&mut c, &["SELECT", "1"]).contains("DB index is out of range"));
    let n: i64 = ok(&mut c, &["COMMAND", "COUNT"]);
    assert!(n >= 29, "{n}");
    let docs: Vec<Value> = ok(&mut c, &["COMMAND", "DOCS", "get", "hset"]);
    assert_eq!(docs.len(), 4, "two names, two maps: {docs:?}");
    assert_eq!(
        ok::<Vec<Value>>(&mut c, &["COMMAND", "INFO", "get", "nope"]).len(),
        2
    );
    assert_eq!(ok::<Vec<Value>>(&mut c, &["COMMAND"]).len() as i64, n);
    ok::<()>(&mut c, &["CLIENT", "SETNAME", "me"]);
    assert_eq!(ok::<String>(&mut c, &["CLIENT", "GETNAME"]), "me");
    let mut s = raw(server.local_addr());
    assert_eq!(exchange(&mut s, b"QUIT\r\n", 1), "+OK\r\n");
    assert!(closed(&mut s));
}

/// `HELLO 3` switches a connection to RESP3 (its own reply included):
/// nulls, maps and verbatim text, as Redis 7 sends them; `HELLO 2` and
/// connections that never say HELLO stay RESP2. A RESP3 client (redis-rs
/// with `protocol=resp3`, which opens with HELLO 3 like redis-py 8 and
/// node-redis) connects and works.
#[test]
fn hello_switches_to_resp3_and_real_resp3_clients_connect() {
    let (server, _stack) = start(server_config());
    let addr = server.local_addr();
    let mut s = raw(addr);
    let hello = exchange(&mut s, b"HELLO 3 SETNAME app\r\n", 26);
    assert!(hello.starts_with("%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n"));
    assert!(hello.contains("$5\r\nproto\r\n:3\r\n"), "{hello}");
    assert!(hello.ends_with("$7\r\nmodules\r\n*0\r\n"), "{hello}");
    assert_eq!(exchange(&mut s, b"GET nope\r\n", 1), "_\r\n");
    assert_eq!(exchange(&mut s, b"CLIENT GETNAME\r\n", 2), "$3\r\napp\r\n");
    assert_eq!(exchange(&mut s, b"HSET h f v\r\n", 1), ":1\r\n");
    assert_eq!(
        exchange(&mut s, b"HGETALL h\r\n", 5),
        "%1\r\n$1\r\nf\r\n$1\r\nv\r\n"
    );
    // Back to RESP2; a plain connection is RESP2 throughout.
    let hello2 = exchange(&mut s, b"HELLO 2\r\n", 26);
    assert!(hello2.starts_with("*14\r\n"), "{hello2}");
    assert_eq!(exchange(&mut s, b"GET nope\r\n", 1), "$-1\r\n");
    let mut plain = raw(addr);
    assert_eq!(
        exchange(&mut plain, b"HGETALL h\r\n", 5),
        "*2\r\n$1\r\nf\r\n$1\r\nv\r\n"
    );
    // Redis's errors.
    assert_eq!(
        exchange(&mut plain, b"HELLO 4\r\n", 1),
        "-NOPROTO unsupported protocol version\r\n"
    );
    assert_eq!(
        exchange(&mut plain, b"HELLO 3 AUTH someone pw\r\n", 1),
        "-WRONGPASS invalid username-password pair or user is disabled.\r\n"
    );
    assert_eq!(
        exchange(&mut plain, b"HELLO 3 BOGUS\r\n", 1),
        "-ERR Syntax error in HELLO option 'BOGUS'\r\n"
    );
    assert!(exchange(&mut plain, b"CLIENT SETNAME \"a b\"\r\n", 1).starts_with("-ERR Client names"));
    assert_eq!(exchange(&mut plain, b"AUTH default pw\r\n", 1), "+OK\r\n");
    assert!(
        exchange(&mut plain, b"AUTH pw\r\n", 1).starts_with("-ERR AUTH <password> called without")
    );
    // A failed HELLO left the protocol as it was.
    assert_eq!(exchange(&mut plain, b"GET nope\r\n", 1), "$-1\r\n");
    // INFO is verbatim text in RESP3 (read last: its text has many lines).
    let mut v = raw(addr);
    exchange(&mut v, b"HELLO 3\r\n", 26);
    let info = exchange(&mut v, b"INFO server\r\n", 3);
    assert!(
        info.starts_with('=') && info.contains("txt:# Server"),
        "{info}"
    );

    let c = redis::Client::open(format!("redis://{addr}/?protocol=resp3")).unwrap();
    let mut c = c
        .get_connection_with_timeout(Duration::from_secs(5))
        .unwrap();
    ok::<()>(&mut c, &["SET", "k", "v"]);
    assert_eq!(get(&mut c, "k").as_deref(), Some("v"));
    assert_eq!(get(&mut c, "nope"), None);
    let h: HashMap<String, String> = ok(&mut c, &["HGETALL", "h"]);
    assert_eq!(h.get("f").map(String::as_str), Some("v"));
    let cfg: HashMap<String, String> = ok(&mut c, &["CONFIG", "GET", "appendfsync"]);
    assert_eq!(cfg.get("appendfsync").map(String::as_str), Some("always"));
    let info: String = ok(&mut c, &["INFO", "server"]);
    assert!(info.contains("redis_version:"), "{info}");
}

#[test]
fn unknown_commands_and_wrong_arity_use_redis_wording() {
    let (server, _stack) = start(server_config());
    let mut s = raw(server.local_addr());
    let cases: [(&[u8], &str); 6] = [
        (
            b"*2\r\n$3\r\nFOO\r\n$3\r\nbar\r\n",
            "-ERR unknown command 'FOO', with args beginning with: 'bar' \r\n",
        ),
        (
            b"nosuch\r\n",
            "-ERR unknown command 'nosuch', with args beginning with: \r\n",
        ),
        (
            b"*1\r\n$3\r\nGET\r\n",
            "-ERR wrong number of arguments for 'get' command\r\n",
        ),
        (
            b"MSET a 1 b\r\n",
            "-ERR wrong number of arguments for 'mset' command\r\n",
        ),
        (
            b"HSET h f\r\n",
            "-ERR wrong number of arguments for 'hset' command\r\n",
        ),
        (
            b"CONFIG GET\r\n",
            "-ERR wrong number of arguments for 'config|get' command\r\n",
        ),
    ];
    for (send, want) in cases {
        assert_eq!(exchange(&mut s, send, 1), want);
    }
    // The connection survives all of that.
    assert_eq!(exchange(&mut s, b"PING\r\n", 1), "+PONG\r\n");
    assert_eq!(exchange(&mut s, b"PING \"a b\"\r\n", 2), "$3\r\na b\r\n");
}

#[test]
fn pipelines_are_answered_in_order() {
    let (server, _stack) = start(server_config());
    let mut c = client(server.local_addr());
    let mut p = redis::pipe();
    for i in 0..500 {
        p.set(format!("p{i}"), i).ignore();
        p.incr("pn", 1);
    }
    p.get("p499");
    let got: Vec<i64> = p.query(&mut c).unwrap();
    assert_eq!(got.len(), 501);
    assert_eq!(&got[..500], &(1..=500).collect::<Vec<i64>>()[..]);
    assert_eq!(got[500], 499);
    // Raw: several frames, inline and multibulk, in one write and split
    // across writes.
    let mut s = raw(server.local_addr());
    let batch = b"SET x 1\r\n*2\r\n$4\r\nINCR\r\n$1\r\nx\r\nGET x\r\n*1\r\n$4\r\nPING\r\n";
    assert_eq!(
        exchange(&mut s, batch, 5),
        "+OK\r\n:2\r\n$1\r\n2\r\n+PONG\r\n"
    );
    s.write_all(b"*2\r\n$4\r\nIN").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(exchange(&mut s, b"CR\r\n$1\r\nx\r\n", 1), ":3\r\n");
}

/// A pipeline of binary-safe writes and reads (SET, GET, APPEND, DEL on
/// three keys; values with CR, LF and any byte) written in pieces cut at
/// generated points, with a pause after each so the server reads them
/// apart, gets byte for byte the replies a model of the store predicts,
/// in order.
#[test]
fn a_pipeline_cut_anywhere_is_answered_as_if_whole() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    let (server, _stack) = start(server_config());
    let addr = server.local_addr();
    let ops = prop::collection::vec(
        (0u8..4, 0u8..3, prop::collection::vec(any::<u8>(), 0..300)),
        1..16,
    );
    let cuts = prop::collection::vec(1usize..400, 0..12);
    let case = std::cell::Cell::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 32,
        ..Config::default()
    });
    let outcome = runner.run(&(ops, cuts), |(ops, cuts)| {
        case.set(case.get() + 1);
        let case = case.get();
        let mut model: HashMap<u8, Vec<u8>> = HashMap::new();
        let (mut req, mut want) = (Vec::new(), Vec::new());
        for (kind, k, v) in &ops {
            let key = format!("cut{case}:{k}").into_bytes();
            let bulk = |out: &mut Vec<u8>, b: &[u8]| {
                out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            };
            let (name, with_value): (&[u8], bool) = match kind {
                0 => (b"SET", true),
                1 => (b"GET", false),
                2 => (b"APPEND", true),
                _ => (b"DEL", false),
            };
            req.extend_from_slice(format!("*{}\r\n", 2 + usize::from(with_value)).as_bytes());
            bulk(&mut req, name);
            bulk(&mut req, &key);
            if with_value {
                bulk(&mut req, v);
            }
            match kind {
                0 => {
                    model.insert(*k, v.clone());
                    want.extend_from_slice(b"+OK\r\n");
                }
                1 => match model.get(k) {
                    Some(cur) => bulk(&mut want, cur),
                    None => want.extend_from_slice(b"$-1\r\n"),
                },
                2 => {
                    let cur = model.entry(*k).or_default();
                    cur.extend_from_slice(v);
                    want.extend_from_slice(format!(":{}\r\n", cur.len()).as_bytes());
                }
                _ => {
                    let n = u8::from(model.remove(k).is_some());
                    want.extend_from_slice(format!(":{n}\r\n").as_bytes());
                }
            }
        }
        let mut s = raw(addr);
        let mut at = 0usize;
        for cut in cuts.iter().chain(std::iter::once(&usize::MAX)) {
            let end = req.len().min(at.saturating_add(*cut));
            s.write_all(&req[at..end]).unwrap();
            at = end;
            if at == req.len() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while got.len() < want.len() {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => panic!("read: {e} after {} of {} bytes", got.len(), want.len()),
            }
        }
        prop_assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want)
        );
        Ok(())
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
}

/// GETs of values the page cache no longer holds park their connection
/// while a miss reader loads them: a pipeline of GETs mixed with writes
/// still gets every reply right and in order, and INFO counts the parked
/// reads; with no miss readers the same replies come from blocking reads.
#[test]
fn gets_that_miss_the_cache_park_and_answer_in_order() {
    for readers in [16, 0] {
        let (server, _stack) = start(ServerConfig {
            workers: 1,
            miss_readers: readers,
            ..server_config()
        });
        let mut c = client(server.local_addr());
        // 3000 values of 4 KiB: three times the 4 MiB cache.
        let value = |i: usize| format!("{i:04}").repeat(1024);
        let mut p = redis::pipe();
        for i in 0..3000 {
            p.set(format!("m{i}"), value(i)).ignore();
        }
        p.query::<()>(&mut c).unwrap();
        let mut p = redis::pipe();
        for i in (0..3000).step_by(7) {
            p.get(format!("m{i}"));
            p.incr("n", 1);
        }
        let got: Vec<redis::Value> = p.query(&mut c).unwrap();
        let mut n = 0;
        for (k, i) in (0..3000).step_by(7).enumerate() {
            let v: String = redis::from_redis_value(&got[2 * k]).unwrap();
            assert!(v == value(i), "GET m{i} answered with another value");
            n += 1;
            let count: i64 = redis::from_redis_value(&got[2 * k + 1]).unwrap();
            assert_eq!(count, n, "INCR out of order");
        }
        let parked = stat(&mut c, "critio_reads_parked");
        if readers == 0 {
            assert_eq!(parked, 0);
        } else {
            assert!(
                parked > 0,
                "no GET missed the cache: the test proves nothing"
            );
        }
        assert_eq!(server.shutdown(), 0);
    }
}

/// A request whose key's index stripe another thread holds (a background
/// job copying the key, say) parks its connection while a miss reader
/// waits for the stripe: the worker's other clients are served meanwhile,
/// and the parked requests answer, in order, once the holder lets go.
#[test]
fn requests_on_a_held_key_park_and_the_worker_serves_the_others() {
    let (server, stack) = start(ServerConfig {
        workers: 1,
        ..server_config()
    });
    let addr = server.local_addr();
    let mut c = client(addr);
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _: () = ok(&mut c, &["SET", "held", "before"]);
    // A thread that holds the stripe of "held" until told to let go.
    let engine = stack.engine.clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let mut first = true;
        engine
            .transact(&[b"held", b"held2"], |_| {
                if std::mem::take(&mut first) {
                    ready_tx.send(()).unwrap();
                    let _ = go_rx.recv();
                }
            })
            .unwrap();
    });
    ready_rx.recv().unwrap();
    // A read (GET) and a write (SET, then GET) of held keys.
    let mut parked = raw(addr);
    parked
        .write_all(b"*2\r\n$3\r\nGET\r\n$4\r\nheld\r\n")
        .unwrap();
    let mut parked2 = raw(addr);
    parked2
        .write_all(
            b"*3\r\n$3\r\nSET\r\n$5\r\nheld2\r\n$5\r\nafter\r\n*2\r\n$3\r\nGET\r\n$5\r\nheld2\r\n",
        )
        .unwrap();
    // The same worker answers another client while those wait (its key
    // is in another stripe: stripes are a fixed hash of the key).
    let started = Instant::now();
    for i in 0..20 {
        let _: () = ok(&mut c, &["SET", "other", &i.to_string()]);
        let v: String = ok(&mut c, &["GET", "other"]);
        assert_eq!(v, i.to_string());
    }
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the other client waited for the held stripe"
    );
    for s in [&mut parked, &mut parked2] {
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("a request on a held key answered: {other:?}"),
        }
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    }
    go_tx.send(()).unwrap();
    holder.join().unwrap();
    assert_eq!(exchange(&mut parked, b"", 2), "$6\r\nbefore\r\n");
    assert_eq!(exchange(&mut parked2, b"", 3), "+OK\r\n$5\r\nafter\r\n");
    let parked_on_locks = stat(&mut c, "critio_requests_parked_on_locks");
    assert!(parked_on_locks >= 2, "{parked_on_locks} requests parked");
    assert_eq!(server.shutdown(), 0);
}

/// One worker, two clients: one sends a pipeline whose replies (about
/// 20 MiB) it does not read for a while; the other is served meanwhile, and
/// the first gets every reply, in order, once it reads.
#[test]
fn a_client_that_does_not_read_holds_neither_its_worker_nor_memory() {
    let (server, _stack) = start(ServerConfig {
        workers: 1,
        ..server_config()
    });
    let mut c = client(server.local_addr());
    let value = "v".repeat(1024);
    let _: () = c.set("big", &value).unwrap();
    let n = 20_000;
    let mut slow = raw(server.local_addr());
    let sender = {
        let mut s = slow.try_clone().unwrap();
        std::thread::spawn(move || {
            let frames = b"GET big\r\n".repeat(n);
            s.write_all(&frames).unwrap();
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    for i in 0..50 {
        let _: () = c.set(format!("k{i}"), i).unwrap();
        assert_eq!(get(&mut c, &format!("k{i}")), Some(i.to_string()));
    }
    let reply = format!("$1024\r\n{value}\r\n");
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    while got.len() < n * reply.len() {
        match slow.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => got.extend_from_slice(&buf[..k]),
            Err(e) => panic!("read: {e} after {} bytes", got.len()),
        }
    }
    sender.join().unwrap();
    assert_eq!(got.len(), n * reply.len());
    assert!(got.chunks(reply.len()).all(|r| r == reply.as_bytes()));
}

#[test]
fn many_concurrent_clients_stay_consistent() {
    const THREADS: usize = 32;
    const OPS: usize = 100;
    let (server, _stack) = start(server_config());
    let addr = server.local_addr();
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = client(addr);
                for j in 0..OPS {
                    let _: i64 = c.incr("counter", 1).unwrap();
                    let _: () = c.set(format!("t{t}:{}", j % 10), j).unwrap();
                    let _: u64 = c.hset("h", format!("t{t}"), j).unwrap();
                    if j % 25 == 0 {
                        let _: Option<String> = c.get(format!("t{}:0", (t + 1) % THREADS)).unwrap();
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let mut c = client(addr);
    assert_eq!(c.get::<_, i64>("counter").unwrap(), (THREADS * OPS) as i64);
    for t in 0..THREADS {
        for k in 0..10 {
            let last = OPS - 10 + k;
            assert_eq!(c.get::<_, usize>(format!("t{t}:{k}")).unwrap(), last);
        }
        assert_eq!(
            c.hget::<_, _, usize>("h", format!("t{t}")).unwrap(),
            OPS - 1
        );
    }
    assert_eq!(
        redis::cmd("DBSIZE").query::<usize>(&mut c).unwrap(),
        2 + THREADS * 10
    );
}

#[test]
fn malformed_frames_close_only_their_connection() {
    let (server, _stack) = start(server_config());
    let addr = server.local_addr();
    let mut good = client(addr);
    let _: () = good.set("k", "v").unwrap();
    for (bad, want) in [
        (
            &b"*1\r\n:5\r\n"[..],
            "-ERR Protocol error: expected '$', got ':'\r\n",
        ),
        (
            b"*x\r\n",
            "-ERR Protocol error: invalid multibulk length\r\n",
        ),
        (
            b"*1\r\n$-5\r\n",
            "-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            b"SET a \"b\r\n",
            "-ERR Protocol error: unbalanced quotes in request\r\n",
        ),
    ] {
        let mut s = raw(addr);
        assert_eq!(exchange(&mut s, bad, 1), want);
        assert!(closed(&mut s));
        assert_eq!(good.get::<_, String>("k").unwrap(), "v");
    }
}

#[test]
fn oversized_frames_and_values_are_refused() {
    let (server, _stack) = start(server_config());
    let addr = server.local_addr();
    let mut good = client(addr);
    // A frame over max_frame_bytes: refused on its header, before the body.
    let mut s = raw(addr);
    let header = format!("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n${}\r\n", FRAME_MAX);
    let reply = exchange(&mut s, header.as_bytes(), 1);
    assert!(
        reply.starts_with("-ERR Protocol error: request of at least"),
        "{reply}"
    );
    assert!(reply.contains("server.max_frame_bytes"), "{reply}");
    assert!(closed(&mut s));
    // A value over the engine's limit: an error for that command only.
    let big = vec![b'x'; VALUE_MAX + 1];
    let e = good.set::<_, _, ()>("big", &big).unwrap_err();
    let text = err_text(e);
    assert!(text.contains("ERR value of 65537 bytes"), "{text}");
    assert!(text.contains("engine.value_bytes_max"), "{text}");
    let fits = vec![b'y'; VALUE_MAX];
    let _: () = good.set("big", &fits).unwrap();
    assert_eq!(good.get::<_, Vec<u8>>("big").unwrap(), fits);
    // A hash is one value: the field that takes it over the limit is
    // refused, and the error says the whole hash is what is too large.
    let half = vec![b'h'; VALUE_MAX / 2];
    let _: () = good.hset("h", "a", &half).unwrap();
    let e = good.hset::<_, _, _, ()>("h", "b", &half).unwrap_err();
    let text = err_text(e);
    assert!(
        text.contains("ERR hash (its fields and values together) of"),
        "{text}"
    );
    assert!(text.contains("engine.value_bytes_max"), "{text}");
    assert_eq!(good.hlen::<_, u64>("h").unwrap(), 1);
}

#[test]
fn clients_beyond_the_limit_are_turned_away() {
    let cfg = ServerConfig {
        max_clients: 2,
        ..server_config()
    };
    let (server, _stack) = start(cfg);
    let addr = server.local_addr();
    let mut a = raw(addr);
    let mut b = raw(addr);
    assert_eq!(exchange(&mut a, b"PING\r\n", 1), "+PONG\r\n");
    assert_eq!(exchange(&mut b, b"PING\r\n", 1), "+PONG\r\n");
    let mut third = raw(addr);
    let mut reply = String::new();
    let _ = third.read_to_string(&mut reply);
    assert_eq!(reply, "-ERR max number of clients reached\r\n");
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.connected() > 1 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut d = raw(addr);
    assert_eq!(exchange(&mut d, b"PING\r\n", 1), "+PONG\r\n");
    let info = server.info(&["stats"]);
    assert!(info.contains("rejected_connections:1"), "{info}");
    drop(b);
}

#[test]
fn device_failure_fails_writes_and_never_acknowledges_them() {
    let faulty = Arc::new(
        FaultyDevice::new(Arc::new(MemDevice::new(64 * MIB)), FaultConfig::default()).unwrap(),
    );
    let sc = stack_config();
    let mut config = sc.critio.clone();
    config.cache.capacity_bytes = 4 * MIB;
    let io = critio::Stack::over(faulty.clone(), &config).unwrap();
    let engine = Arc::new(Engine::open(&io, sc.engine).unwrap());
    let backend = Backend {
        engine,
        block: io.block().clone(),
        cache: io.cache().clone(),
        scheme: Scheme::Rcp,
        device: "faulty:mem".into(),
        engine_config: sc.engine,
        data_dir: None,
        write_cache: None,
        on_shutdown: None,
    };
    let server = Server::start(server_config(), backend).unwrap();
    let mut c = client(server.local_addr());
    let _: () = c.set("before", "1").unwrap();
    faulty.power_cut().unwrap();
    for i in 0..5 {
        let e = c.set::<_, _, ()>(format!("after{i}"), "1").unwrap_err();
        assert_eq!(e.code(), Some("ERR"), "{e}");
    }
    let e = c.incr::<_, _, i64>("n", 1).unwrap_err();
    assert_eq!(e.code(), Some("ERR"), "{e}");
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
    // A pipeline mixing writes and reads in one round: each write's reply
    // is an error, each read's stands, in order, on an open connection.
    let mut s = raw(server.local_addr());
    let got = exchange(&mut s, b"SET p 1\r\nGET before\r\nSET q 2\r\nPING\r\n", 5);
    let lines: Vec<&str> = got.lines().collect();
    assert!(lines[0].starts_with("-ERR"), "{got}");
    assert_eq!(&lines[1..3], ["$1", "1"], "{got}");
    assert!(lines[3].starts_with("-ERR"), "{got}");
    assert_eq!(lines[4], "+PONG", "{got}");
}

#[test]
fn a_full_device_refuses_writes_with_an_error() {
    let mut sc = stack_config();
    sc.capacity = 12 * MIB;
    let stack = Stack::open(&sc).unwrap();
    let server = Server::start(server_config(), Backend::of(&stack, &sc)).unwrap();
    let mut c = client(server.local_addr());
    let value = vec![b'v'; VALUE_MAX - 1024];
    let mut acked = 0;
    let error = loop {
        match c.set::<_, _, ()>(format!("k{acked}"), &value) {
            Ok(()) => acked += 1,
            Err(e) => break e,
        }
        assert!(acked < 1000, "a 12 MiB device took 1000 values of 63 KiB");
    };
    assert!(err_text(error).contains("no space left"));
    assert!(acked > 10, "{acked}");
    for i in 0..acked {
        assert_eq!(c.get::<_, Vec<u8>>(format!("k{i}")).unwrap(), value);
    }
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
}

#[test]
fn idle_clients_are_closed_and_stop_finishes_cleanly() {
    let cfg = ServerConfig {
        idle_timeout_ms: 100,
        ..server_config()
    };
    let (server, stack) = start(cfg);
    let mut idle = raw(server.local_addr());
    assert_eq!(exchange(&mut idle, b"PING\r\n", 1), "+PONG\r\n");
    std::thread::sleep(Duration::from_millis(300));
    assert!(closed(&mut idle));
    let mut c = client(server.local_addr());
    let _: () = c.set("k", "v").unwrap();
    assert_eq!(server.shutdown(), 0);
    assert!(c.get::<_, String>("k").is_err());
    stack.engine.close().unwrap();
}

#[test]
fn the_rest_of_the_string_and_key_commands_reply_like_redis() {
    let (server, _stack) = start(server_config());
    let mut c = client(server.local_addr());
    assert_eq!(ok::<i64>(&mut c, &["SETNX", "n", "1"]), 1);
    assert_eq!(ok::<i64>(&mut c, &["SETNX", "n", "2"]), 0);
    assert_eq!(
        ok::<Option<String>>(&mut c, &["GETSET", "n", "3"]).as_deref(),
        Some("1")
    );
    assert_eq!(ok::<i64>(&mut c, &["APPEND", "n", "45"]), 3);
    assert_eq!(ok::<i64>(&mut c, &["STRLEN", "n"]), 3);
    assert_eq!(ok::<i64>(&mut c, &["STRLEN", "missing"]), 0);
    assert_eq!(ok::<String>(&mut c, &["INCRBYFLOAT", "n", "0.5"]), "345.5");
    assert_eq!(ok::<String>(&mut c, &["INCRBYFLOAT", "f", "0.1"]), "0.1");
    assert_eq!(ok::<String>(&mut c, &["INCRBYFLOAT", "f", "0.2"]), "0.3");
    assert!(fails(&mut c, &["INCRBYFLOAT", "f", "x"]).contains("not a valid float"));
    assert_eq!(
        ok::<Option<String>>(&mut c, &["GETDEL", "n"]).as_deref(),
        Some("345.5")
    );
    assert_eq!(ok::<i64>(&mut c, &["EXISTS", "n"]), 0);
    assert_eq!(ok::<i64>(&mut c, &["MSETNX", "m1", "a", "m2", "b"]), 1);
    assert_eq!(ok::<i64>(&mut c, &["MSETNX", "m2", "x", "m3", "y"]), 0);
    assert_eq!(get(&mut c, "m3"), None);
    assert_eq!(ok::<i64>(&mut c, &["UNLINK", "m1", "m2", "m3"]), 2);
    ok::<()>(&mut c, &["HSET", "h", "f", "v"]);
    ok::<()>(&mut c, &["SET", "s", "v"]);
    assert_eq!(ok::<String>(&mut c, &["TYPE", "h"]), "hash");
    assert_eq!(ok::<String>(&mut c, &["TYPE", "s"]), "string");
    assert_eq!(ok::<String>(&mut c, &["TYPE", "nope"]), "none");
    assert!(fails(&mut c, &["APPEND", "h", "x"]).starts_with("WRONGTYPE"));
    let t: Vec<String> = ok(&mut c, &["TIME"]);
    assert!(
        t[0].parse::<u64>().unwrap() > 1_700_000_000 && t[1].parse::<u32>().unwrap() < 1_000_000
    );
    // Hashes.
    assert_eq!(ok::<i64>(&mut c, &["HSETNX", "h", "f", "x"]), 0);
    assert_eq!(ok::<i64>(&mut c, &["HSETNX", "h", "g", "2"]), 1);
    assert_eq!(ok::<i64>(&mut c, &["HLEN", "h"]), 2);
    assert_eq!(ok::<i64>(&mut c, &["HEXISTS", "h", "g"]), 1);
    assert_eq!(ok::<i64>(&mut c, &["HSTRLEN", "h", "f"]), 1);
    assert_eq!(ok::<i64>(&mut c, &["HINCRBY", "h", "g", "5"]), 7);
    assert!(fails(&mut c, &["HINCRBY", "h", "f", "1"]).contains("hash value is not an integer"));
    assert_eq!(
        ok::<String>(&mut c, &["HINCRBYFLOAT", "h", "g", "1.5"]),
        "8.5"
    );
    assert_eq!(ok::<Vec<String>>(&mut c, &["HKEYS", "h"]), ["f", "g"]);
    assert_eq!(ok::<Vec<String>>(&mut c, &["HVALS", "h"]), ["v", "8.5"]);
    assert_eq!(
        ok::<Vec<Option<String>>>(&mut c, &["HMGET", "h", "f", "zz", "g"]),
        [Some("v".into()), None, Some("8.5".into())]
    );
    assert_eq!(ok::<i64>(&mut c, &["HLEN", "nope"]), 0);
    assert!(fails(&mut c, &["HLEN", "s"]).starts_with("WRONGTYPE"));
}

#[test]
fn expiry_commands_reply_like_redis() {
    let (server, _stack) = start(server_config());
    let mut c = client(server.local_addr());
    ok::<()>(&mut c, &["SET", "k", "v"]);
    assert_eq!(ok::<i64>(&mut c, &["TTL", "k"]), -1);
    assert_eq!(ok::<i64>(&mut c, &["TTL", "nope"]), -2);
    assert_eq!(ok::<i64>(&mut c, &["EXPIRE", "nope", "10"]), 0);
    assert_eq!(ok::<i64>(&mut c, &["EXPIRE", "k", "100", "XX"]), 0);
    assert_eq!(ok::<i64>(&mut c, &["EXPIRE", "k", "100", "NX"]), 1);
    assert_eq!(ok::<i64>(&mut c, &["TTL", "k"]), 100);
    assert_eq!(ok::<i64>(&mut c, &["EXPIRE", "k", "50", "GT"]), 0);
    assert_eq!(ok::<i64>(&mut c, &["EXPIRE", "k", "50", "LT"]), 1);
    let pttl: i64 = ok(&mut c, &["PTTL", "k"]);
    assert!((49_000..=50_000).contains(&pttl), "{pttl}");
    let at: i64 = ok(&mut c, &["EXPIRETIME", "k"]);
    let pat: i64 = ok(&mut c, &["PEXPIRETIME", "k"]);
    assert_eq!(at, pat / 1000);
    assert_eq!(get(&mut c, "k").as_deref(), Some("v"), "the value is kept");
    assert_eq!(ok::<i64>(&mut c, &["PERSIST", "k"]), 1);
    assert_eq!(ok::<i64>(&mut c, &["PERSIST", "k"]), 0);
    assert_eq!(ok::<i64>(&mut c, &["TTL", "k"]), -1);
    assert!(fails(&mut c, &["EXPIRE", "k", "1", "NX", "XX"]).contains("not compatible"));
    assert!(fails(&mut c, &["EXPIRE", "k", "x"]).contains("not an integer"));
    // SET without KEEPTTL clears the expiry; with it, keeps it.
    ok::<()>(&mut c, &["PEXPIRE", "k", "100000"]);
    ok::<()>(&mut c, &["SET", "k", "w", "KEEPTTL"]);
    assert!(ok::<i64>(&mut c, &["PTTL", "k"]) > 0);
    ok::<()>(&mut c, &["SET", "k", "w"]);
    assert_eq!(ok::<i64>(&mut c, &["PTTL", "k"]), -1);
    // SETEX/PSETEX/GETEX; a time in the past deletes the key.
    ok::<()>(&mut c, &["SETEX", "e", "100", "v"]);
    assert_eq!(ok::<i64>(&mut c, &["TTL", "e"]), 100);
    ok::<()>(&mut c, &["PSETEX", "p", "60", "v"]);
    assert!(fails(&mut c, &["SETEX", "e", "0", "v"]).contains("invalid expire time in 'setex'"));
    assert_eq!(
        ok::<Option<String>>(&mut c, &["GETEX", "e", "PERSIST"]).as_deref(),
        Some("v")
    );
    assert_eq!(ok::<i64>(&mut c, &["TTL", "e"]), -1);
    ok::<()>(&mut c, &["GETEX", "e", "EX", "30"]);
    assert_eq!(ok::<i64>(&mut c, &["TTL", "e"]), 30);
    assert_eq!(ok::<i64>(&mut c, &["EXPIRE", "e", "-1"]), 1);
    assert_eq!(ok::<i64>(&mut c, &["EXISTS", "e"]), 0);
    std::thread::sleep(Duration::from_millis(120));
    assert_eq!(get(&mut c, "p"), None, "PSETEX's 60 ms passed");
    // Expiry applies to hashes too, and HSET keeps it.
    ok::<()>(&mut c, &["HSET", "h", "f", "v"]);
    ok::<()>(&mut c, &["EXPIRE", "h", "100"]);
    ok::<()>(&mut c, &["HSET", "h", "g", "w"]);
    assert_eq!(ok::<i64>(&mut c, &["TTL", "h"]), 100);
}

/// A server on a store in a directory, to restart.
fn start_on(dir: &std::path::Path) -> (Server, Stack) {
    let sc = StackConfig {
        device: DeviceSpec::Pool(dir.join("kv.img")),
        ..stack_config()
    };
    let stack = Stack::open(&sc).expect("open the stack");
    let server = Server::start(server_config(), Backend::of(&stack, &sc)).expect("start");
    (server, stack)
}

#[test]
fn expiry_and_transactions_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (server, stack) = start_on(dir.path());
        let mut c = client(server.local_addr());
        ok::<()>(&mut c, &["SET", "k", "v", "EX", "1000"]);
        ok::<()>(&mut c, &["HSET", "h", "f", "v"]);
        ok::<()>(&mut c, &["PEXPIRE", "h", "300"]);
        let r: Vec<Value> = redis::pipe()
            .atomic()
            .cmd("INCR")
            .arg("n")
            .cmd("SET")
            .arg("t")
            .arg("x")
            .query(&mut c)
            .unwrap();
        assert_eq!(r.len(), 2);
        drop(c);
        server.shutdown();
        // No final checkpoint: what was acknowledged is in the log.
        drop(stack);
    }
    std::thread::sleep(Duration::from_millis(350));
    let (server, stack) = start_on(dir.path());
    let mut c = client(server.local_addr());
    let ttl: i64 = ok(&mut c, &["TTL", "k"]);
    assert!((990..=1000).contains(&ttl), "{ttl}");
    assert_eq!(
        ok::<i64>(&mut c, &["EXISTS", "h"]),
        0,
        "h expired while down"
    );
    assert_eq!(get(&mut c, "n").as_deref(), Some("1"));
    assert_eq!(get(&mut c, "t").as_deref(), Some("x"));
    drop(c);
    server.shutdown();
    stack.engine.close().unwrap();
}

#[test]
fn multi_exec_runs_queued_commands_as_one_transaction() {
    let (server, _stack) = start(server_config());
    let addr = server.local_addr();
    let mut s = raw(addr);
    assert_eq!(exchange(&mut s, b"MULTI\r\n", 1), "+OK\r\n");
    assert_eq!(exchange(&mut s, b"SET a 1\r\n", 1), "+QUEUED\r\n");
    assert_eq!(exchange(&mut s, b"INCR a\r\n", 1), "+QUEUED\r\n");
    assert_eq!(exchange(&mut s, b"HSET a f v\r\n", 1), "+QUEUED\r\n");
    assert_eq!(exchange(&mut s, b"PING\r\n", 1), "+QUEUED\r\n");
    assert_eq!(exchange(&mut s, b"GET a\r\n", 1), "+QUEUED\r\n");
    assert_eq!(
        exchange(&mut s, b"EXEC\r\n", 7),
        "*5\r\n+OK\r\n:2\r\n-WRONGTYPE Operation against a key holding the wrong kind of value\r\n+PONG\r\n$1\r\n2\r\n"
    );
    // Errors while queueing abort the whole transaction.
    exchange(&mut s, b"MULTI\r\n", 1);
    exchange(&mut s, b"SET b 1\r\n", 1);
    assert!(exchange(&mut s, b"NOPE\r\n", 1).starts_with("-ERR unknown command"));
    assert!(exchange(&mut s, b"GET\r\n", 1).starts_with("-ERR wrong number"));
    assert_eq!(
        exchange(&mut s, b"KEYS *\r\n", 1),
        "-ERR Command not allowed inside a transaction\r\n"
    );
    assert_eq!(
        exchange(&mut s, b"MULTI\r\n", 1),
        "-ERR MULTI calls can not be nested\r\n"
    );
    assert_eq!(
        exchange(&mut s, b"WATCH a\r\n", 1),
        "-ERR WATCH inside MULTI is not allowed\r\n"
    );
    assert_eq!(
        exchange(&mut s, b"EXEC\r\n", 1),
        "-EXECABORT Transaction discarded because of previous errors.\r\n"
    );
    assert_eq!(exchange(&mut s, b"EXISTS b\r\n", 1), ":0\r\n");
    assert_eq!(
        exchange(&mut s, b"EXEC\r\n", 1),
        "-ERR EXEC without MULTI\r\n"
    );
    assert_eq!(
        exchange(&mut s, b"DISCARD\r\n", 1),
        "-ERR DISCARD without MULTI\r\n"
    );
    exchange(&mut s, b"MULTI\r\n", 1);
    exchange(&mut s, b"SET b 1\r\n", 1);
    assert_eq!(exchange(&mut s, b"DISCARD\r\n", 1), "+OK\r\n");
    assert_eq!(exchange(&mut s, b"EXISTS b\r\n", 1), ":0\r\n");
    // An empty transaction.
    exchange(&mut s, b"MULTI\r\n", 1);
    assert_eq!(exchange(&mut s, b"EXEC\r\n", 1), "*0\r\n");

    // WATCH: a change by another client aborts EXEC (nil), and nothing runs.
    let mut c = client(addr);
    let mut other = client(addr);
    ok::<()>(&mut c, &["SET", "w", "1"]);
    ok::<()>(&mut c, &["WATCH", "w", "absent"]);
    ok::<()>(&mut other, &["SET", "w", "2"]);
    ok::<()>(&mut c, &["MULTI"]);
    ok::<()>(&mut c, &["SET", "w", "3"]);
    assert_eq!(ok::<Value>(&mut c, &["EXEC"]), Value::Nil);
    assert_eq!(get(&mut c, "w").as_deref(), Some("2"));
    // Unchanged: it runs. Creating a watched key counts as a change.
    ok::<()>(&mut c, &["WATCH", "w"]);
    ok::<()>(&mut c, &["MULTI"]);
    ok::<()>(&mut c, &["SET", "w", "3"]);
    assert_eq!(ok::<Vec<String>>(&mut c, &["EXEC"]), ["OK"]);
    ok::<()>(&mut c, &["WATCH", "fresh"]);
    ok::<()>(&mut other, &["SET", "fresh", "1"]);
    ok::<()>(&mut c, &["MULTI"]);
    ok::<()>(&mut c, &["DEL", "fresh"]);
    assert_eq!(ok::<Value>(&mut c, &["EXEC"]), Value::Nil);
    // UNWATCH forgets; FLUSHALL counts as a change.
    ok::<()>(&mut c, &["WATCH", "w"]);
    ok::<()>(&mut other, &["SET", "w", "4"]);
    ok::<()>(&mut c, &["UNWATCH"]);
    ok::<()>(&mut c, &["MULTI"]);
    ok::<()>(&mut c, &["GET", "w"]);
    assert_eq!(ok::<Vec<String>>(&mut c, &["EXEC"]), ["4"]);
    ok::<()>(&mut c, &["WATCH", "nothing"]);
    ok::<()>(&mut other, &["FLUSHALL"]);
    ok::<()>(&mut c, &["MULTI"]);
    ok::<()>(&mut c, &["PING"]);
    assert_eq!(ok::<Value>(&mut c, &["EXEC"]), Value::Nil);

    // The redis crate's atomic pipeline (MULTI ... EXEC), and a WATCH loop.
    let (a, b): (i64, i64) = redis::pipe()
        .atomic()
        .cmd("INCRBY")
        .arg("x")
        .arg(5)
        .cmd("INCRBY")
        .arg("x")
        .arg(6)
        .query(&mut c)
        .unwrap();
    assert_eq!((a, b), (5, 11));
    let n: i64 = redis::transaction(&mut c, &["x"], |c, pipe| {
        let x: i64 = c.get("x")?;
        pipe.set("x", x * 2).ignore().get("x").query(c)
    })
    .map(|(v,): (i64,)| v)
    .unwrap();
    assert_eq!(n, 22);
}

#[test]
fn concurrent_transactions_never_interleave() {
    let (server, _stack) = start(server_config());
    let addr = server.local_addr();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = client(addr);
                for i in 0..200 {
                    let v = format!("{t}-{i}");
                    let _: () = redis::pipe()
                        .atomic()
                        .set("p", &v)
                        .ignore()
                        .set("q", &v)
                        .ignore()
                        .query(&mut c)
                        .unwrap();
                    let (p, q): (String, String) = redis::pipe()
                        .atomic()
                        .get("p")
                        .get("q")
                        .query(&mut c)
                        .unwrap();
                    assert_eq!(p, q, "a transaction saw another half done");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn scan_and_keys_walk_the_key_space() {
    let (server, _stack) = start(server_config());
    let mut c = client(server.local_addr());
    for i in 0..500 {
        ok::<()>(&mut c, &["SET", &format!("user:{i}"), "v"]);
    }
    for i in 0..20 {
        ok::<()>(&mut c, &["HSET", &format!("h:{i}"), "f", "v"]);
    }
    ok::<()>(&mut c, &["SET", "gone", "v", "PX", "1"]);
    std::thread::sleep(Duration::from_millis(5));
    let mut seen = std::collections::HashSet::new();
    let mut cursor = "0".to_string();
    let mut calls = 0;
    loop {
        let (next, keys): (String, Vec<String>) =
            ok(&mut c, &["SCAN", &cursor, "MATCH", "user:*", "COUNT", "50"]);
        calls += 1;
        assert!(keys.iter().all(|k| k.starts_with("user:")));
        seen.extend(keys);
        if next == "0" {
            break;
        }
        cursor = next;
    }
    assert_eq!(seen.len(), 500);
    assert!(calls > 3, "COUNT bounds a call: {calls}");
    let mut hashes = 0;
    let mut cursor = "0".to_string();
    loop {
        let (next, keys): (String, Vec<String>) =
            ok(&mut c, &["SCAN", &cursor, "COUNT", "1000", "TYPE", "hash"]);
        hashes += keys.len();
        if next == "0" {
            break;
        }
        cursor = next;
    }
    assert_eq!(hashes, 20);
    let mut keys: Vec<String> = ok(&mut c, &["KEYS", "user:1?"]);
    keys.sort();
    assert_eq!(keys.len(), 10);
    assert_eq!(
        ok::<Vec<String>>(&mut c, &["KEYS", "gone"]),
        Vec::<String>::new()
    );
    let any: Option<String> = ok(&mut c, &["RANDOMKEY"]);
    assert!(any.is_some());
    assert!(fails(&mut c, &["SCAN", "x"]).contains("invalid cursor"));
    assert!(fails(&mut c, &["SCAN", "0", "COUNT", "0"]).contains("syntax error"));
    // A scan of the redis crate's kind.
    let all: Vec<String> = c.scan_match("h:*").unwrap().collect();
    assert_eq!(all.len(), 20);
}

#[test]
fn requirepass_demands_auth_before_anything_else() {
    let cfg = ServerConfig {
        requirepass: "s3cret".into(),
        ..server_config()
    };
    let (server, _stack) = start(cfg);
    let addr = server.local_addr();
    let mut s = raw(addr);
    assert_eq!(
        exchange(&mut s, b"GET k\r\n", 1),
        "-NOAUTH Authentication required.\r\n"
    );
    assert!(exchange(&mut s, b"HELLO 3\r\n", 1).starts_with("-NOAUTH HELLO must be called"));
    assert_eq!(
        exchange(&mut s, b"AUTH wrong\r\n", 1),
        "-WRONGPASS invalid username-password pair or user is disabled.\r\n"
    );
    assert_eq!(exchange(&mut s, b"AUTH s3cret\r\n", 1), "+OK\r\n");
    assert_eq!(exchange(&mut s, b"SET k v\r\n", 1), "+OK\r\n");
    // RESET logs the connection out again.
    assert_eq!(exchange(&mut s, b"RESET\r\n", 1), "+RESET\r\n");
    assert!(exchange(&mut s, b"GET k\r\n", 1).starts_with("-NOAUTH"));
    let hello = exchange(&mut s, b"HELLO 3 AUTH default s3cret\r\n", 26);
    assert!(hello.starts_with("%7"), "{hello}");
    // Clients authenticate from the URL.
    let c = redis::Client::open(format!("redis://:s3cret@{addr}/")).unwrap();
    let mut c = c
        .get_connection_with_timeout(Duration::from_secs(5))
        .unwrap();
    assert_eq!(get(&mut c, "k").as_deref(), Some("v"));
    let bad = redis::Client::open(format!("redis://:nope@{addr}/")).unwrap();
    assert!(bad
        .get_connection_with_timeout(Duration::from_secs(5))
        .is_err());
    // CONFIG SET changes it for new connections and AUTHs.
    ok::<()>(&mut c, &["CONFIG", "SET", "requirepass", ""]);
    let mut fresh = raw(addr);
    assert_eq!(exchange(&mut fresh, b"GET k\r\n", 2), "$1\r\nv\r\n");
    assert!(fails(&mut c, &["CONFIG", "SET", "maxclients", "5"]).contains("config file"));
    assert!(fails(&mut c, &["CONFIG", "SET", "nope", "5"]).contains("Unknown option"));
    ok::<()>(&mut c, &["CONFIG", "SET", "maxclients", "64"]);
}

#[test]
fn protected_mode_refuses_clients_beyond_loopback_without_a_password() {
    // A non-loopback address of this machine, if it has one (the route a
    // UDP socket would take; nothing is sent).
    let probe = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    let outside = probe
        .connect("192.0.2.1:9")
        .ok()
        .and_then(|()| probe.local_addr().ok())
        .map(|a| a.ip())
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified());
    let Some(ip) = outside else {
        eprintln!("skipped: this machine has no non-loopback IPv4 address to connect from");
        return;
    };
    let cfg = ServerConfig {
        bind: "0.0.0.0:0".into(),
        ..server_config()
    };
    let (server, _stack) = start(cfg);
    let port = server.local_addr().port();
    let mut s = raw(SocketAddr::new(ip, port));
    let reply = exchange(&mut s, b"PING\r\n", 1);
    assert!(
        reply.starts_with("-DENIED Redis is running in protected mode"),
        "{reply}"
    );
    // Loopback is served; turning protected mode off serves everyone.
    let mut c = client(SocketAddr::new("127.0.0.1".parse().unwrap(), port));
    ok::<()>(&mut c, &["CONFIG", "SET", "protected-mode", "no"]);
    let mut s = raw(SocketAddr::new(ip, port));
    assert_eq!(exchange(&mut s, b"PING\r\n", 1), "+PONG\r\n");
}

#[test]
fn client_list_info_and_kill() {
    let (server, _stack) = start(server_config());
    let addr = server.local_addr();
    let mut a = client(addr);
    let mut b = client(addr);
    ok::<()>(&mut a, &["CLIENT", "SETNAME", "alpha"]);
    ok::<()>(&mut a, &["CLIENT", "SETINFO", "LIB-NAME", "mylib"]);
    let b_id: i64 = ok(&mut b, &["CLIENT", "ID"]);
    let list: String = ok(&mut a, &["CLIENT", "LIST"]);
    assert_eq!(list.lines().count(), 2, "{list}");
    assert!(
        list.contains("name=alpha") && list.contains("lib-name=mylib"),
        "{list}"
    );
    assert!(list.contains(&format!("id={b_id} ")), "{list}");
    let info: String = ok(&mut a, &["CLIENT", "INFO"]);
    assert!(
        info.contains("name=alpha") && info.contains("cmd=client"),
        "{info}"
    );
    let one: String = ok(&mut a, &["CLIENT", "LIST", "ID", &b_id.to_string()]);
    assert_eq!(one.lines().count(), 1);
    assert_eq!(
        ok::<i64>(&mut a, &["CLIENT", "KILL", "ID", &b_id.to_string()]),
        1
    );
    assert!(q::<String>(&mut b, &["PING"]).is_err(), "b was closed");
    assert_eq!(ok::<i64>(&mut a, &["CLIENT", "KILL", "ID", "999999"]), 0);
    assert!(fails(&mut a, &["CLIENT", "KILL", "1.2.3.4:5"]).contains("No such client"));
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.connected() != 1 {
        assert!(Instant::now() < deadline, "the killed client stayed");
        std::thread::sleep(Duration::from_millis(10));
    }
}
