//! `critio dump` as a user meets it: the last BGSAVE of a store, written
//! as the commands that recreate it, loads into a new server with the
//! same keys, values and expiry, and nothing written after the BGSAVE;
//! read while its server runs (from the image on its own) it is the same
//! as read from the stopped store; with no dump, or with a damaged one,
//! it refuses with a reason and writes nothing. The pool backend, so that
//! any temporary directory will do.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod common;
use common::Proc;

fn start(data: &Path) -> Proc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_critio"));
    cmd.args(["serve", "--bind", "127.0.0.1:0", "--device", "pool"])
        .args(["--capacity", "256MiB"])
        .arg("--data")
        .arg(data);
    common::listening(&mut cmd)
}

/// Stops a server as its user would (SIGTERM: a final checkpoint).
fn stop(mut p: Proc) {
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&p.child),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let status = p.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

fn dump(data: &Path, out: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_critio"))
        .args(["dump", "--device", "pool", "--data"])
        .arg(data)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap()
}

fn connect(addr: SocketAddr) -> redis::Connection {
    redis::Client::open(format!("redis://{addr}/"))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(10))
        .unwrap()
}

fn bgsave(con: &mut redis::Connection) {
    let _: String = redis::cmd("BGSAVE").query(con).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let info: String = redis::cmd("INFO").arg("persistence").query(con).unwrap();
        if info.contains("rdb_bgsave_in_progress:0") {
            assert!(info.contains("rdb_last_bgsave_status:ok"), "{info}");
            return;
        }
        assert!(Instant::now() < deadline, "BGSAVE still running: {info}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `commands` as `redis-cli --pipe` does, then a PING, and reads the
/// replies until the PING's: every command has been applied.
fn pipe(addr: SocketAddr, commands: &[u8]) {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut reader = s.try_clone().unwrap();
    let drain = std::thread::spawn(move || {
        let mut got = Vec::new();
        let mut buf = [0u8; 65536];
        while !got.ends_with(b"+PONG\r\n") {
            let n = reader.read(&mut buf).unwrap();
            assert!(n > 0, "the server closed the connection");
            got.extend_from_slice(&buf[..n]);
        }
        got
    });
    s.write_all(commands).unwrap();
    s.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
    let replies = drain.join().unwrap();
    // Every reply is one line (+OK, :n): none may be an error.
    let text = String::from_utf8_lossy(&replies);
    let errors: Vec<&str> = text.split("\r\n").filter(|l| l.starts_with('-')).collect();
    assert!(errors.is_empty(), "{errors:?}");
}

#[test]
fn the_last_bgsave_loads_into_a_new_server_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let (data, out) = (dir.path().join("a"), dir.path().join("backup.resp"));
    let p = start(&data);
    let mut con = connect(p.addr);
    let far = 4_000_000_000_000u64; // ms since the epoch: year 2096
    for i in 0..2000u32 {
        let v: Vec<u8> = (0..700).map(|j| (i * 7 + j) as u8).collect();
        let mut set = redis::cmd("SET");
        set.arg(format!("k{i}")).arg(v);
        if i % 10 == 0 {
            set.arg("PXAT").arg(far + u64::from(i));
        }
        let _: () = set.query(&mut con).unwrap();
    }
    let _: () = redis::cmd("SET")
        .arg(b"bin\r\n\x00\xff")
        .arg(b"\r\n*1\r\n")
        .query(&mut con)
        .unwrap();
    let mut hset = redis::cmd("HSET");
    hset.arg("h");
    for f in 0..600 {
        hset.arg(format!("f{f}")).arg(f);
    }
    let _: () = hset.query(&mut con).unwrap();
    let _: () = redis::cmd("PEXPIREAT")
        .arg("h")
        .arg(far)
        .query(&mut con)
        .unwrap();
    bgsave(&mut con);
    // After the BGSAVE: not in the dump.
    let _: () = redis::cmd("SET")
        .arg("after")
        .arg("x")
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("DEL").arg("k5").query(&mut con).unwrap();
    // While the server runs, the dump is read from its image on its own,
    // to a file and to standard output.
    let live = dir.path().join("live.resp");
    let o = dump(&data, &live);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("held by its running server") && err.contains("2002 keys"),
        "{err}"
    );
    let o = dump(&data, Path::new("-"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let live_stdout = o.stdout;
    drop(con);
    stop(p);

    let o = dump(&data, &out);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("2002 keys") && !err.contains("running"),
        "{err}"
    );
    assert!(!dir.path().join("backup.resp.partial").exists());
    let commands = std::fs::read(&out).unwrap();
    // The same dump, the same commands, however it was read.
    assert!(std::fs::read(&live).unwrap() == commands);
    assert!(live_stdout == commands);

    let fresh = start(&dir.path().join("b"));
    pipe(fresh.addr, &commands);
    let mut con = connect(fresh.addr);
    let n: u64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    assert_eq!(n, 2002);
    for i in 0..2000u32 {
        let v: Vec<u8> = (0..700).map(|j| (i * 7 + j) as u8).collect();
        let got: Vec<u8> = redis::cmd("GET")
            .arg(format!("k{i}"))
            .query(&mut con)
            .unwrap();
        assert_eq!(got, v, "k{i}");
        let at: i64 = redis::cmd("PEXPIRETIME")
            .arg(format!("k{i}"))
            .query(&mut con)
            .unwrap();
        let want = if i % 10 == 0 {
            (far + u64::from(i)) as i64
        } else {
            -1
        };
        assert_eq!(at, want, "k{i}");
    }
    let bin: Vec<u8> = redis::cmd("GET")
        .arg(b"bin\r\n\x00\xff")
        .query(&mut con)
        .unwrap();
    assert_eq!(bin, b"\r\n*1\r\n");
    let h: std::collections::HashMap<String, u32> =
        redis::cmd("HGETALL").arg("h").query(&mut con).unwrap();
    assert_eq!(h.len(), 600);
    assert!((0..600).all(|f| h[&format!("f{f}")] == f));
    let at: i64 = redis::cmd("PEXPIRETIME").arg("h").query(&mut con).unwrap();
    assert_eq!(at, far as i64);
    let after: Option<String> = redis::cmd("GET").arg("after").query(&mut con).unwrap();
    assert_eq!(after, None, "written after the BGSAVE");
    stock_redis_loads(&out, far);
    drop(fresh);

    // A second export to the same file while one runs (its partial file
    // locked): refused, the running one's file left alone; once that one
    // is gone (its lock with it), its partial file is taken over.
    let (second, second_partial) = (
        dir.path().join("second.resp"),
        dir.path().join("second.resp.partial"),
    );
    std::fs::write(&second_partial, b"another export's commands").unwrap();
    let running = std::fs::File::open(&second_partial).unwrap();
    rustix::fs::flock(&running, rustix::fs::FlockOperation::LockExclusive).unwrap();
    let o = dump(&data, &second);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("another critio dump"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&second_partial).unwrap(),
        b"another export's commands"
    );
    assert!(!second.exists());
    drop(running);
    let o = dump(&data, &second);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read(&second).unwrap() == commands && !second_partial.exists());

    // One byte of the dump's body damaged: refused, and nothing written,
    // to a file or to standard output.
    damage_dump(&data.join("critio.img"));
    let bad = dir.path().join("bad.resp");
    let o = dump(&data, &bad);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("damaged"), "{err}");
    assert!(!bad.exists() && !dir.path().join("bad.resp.partial").exists());
    let o = dump(&data, Path::new("-"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("damaged"), "{err}");
    assert!(o.stdout.is_empty(), "{} bytes out", o.stdout.len());
}

/// Flips a byte early in the body of the dump in `image` (its header page
/// starts with "CKVD").
fn damage_dump(image: &Path) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::options()
        .read(true)
        .write(true)
        .open(image)
        .unwrap();
    let len = f.metadata().unwrap().len();
    let mut magic = [0u8; 4];
    let header = (0..len / 4096)
        .map(|p| p * 4096)
        .find(|&at| {
            f.read_exact_at(&mut magic, at).unwrap();
            &magic == b"CKVD"
        })
        .expect("a dump header");
    // The body starts in the body area (after the header page) where
    // the header's `start` (version 3, bytes 28..36) says.
    let mut start = [0u8; 8];
    f.read_exact_at(&mut start, header + 28).unwrap();
    let at = header + 4096 + u64::from_le_bytes(start) + 100;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x5a], at).unwrap();
    f.sync_all().unwrap();
}

/// The same file through `redis-cli --pipe` into a stock Redis (skipped,
/// saying so, where either is not installed).
fn stock_redis_loads(file: &Path, far: u64) {
    for tool in ["redis-server", "redis-cli"] {
        if Command::new(tool).arg("--version").output().is_err() {
            eprintln!(
                "skipped stock Redis: {tool} is not installed (Debian: redis-server, redis-tools)"
            );
            return;
        }
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let piped = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "--pipe"])
        .stdin(std::fs::File::open(file).unwrap())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&piped.stdout);
    let mut con = connect(addr);
    let n: u64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    let h: u64 = redis::cmd("HLEN").arg("h").query(&mut con).unwrap();
    let at: i64 = redis::cmd("PEXPIRETIME")
        .arg("k10")
        .query(&mut con)
        .unwrap();
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        piped.status.success() && said.contains("errors: 0"),
        "{said}"
    );
    assert_eq!((n, h, at), (2002, 600, (far + 10) as i64));
}

#[test]
fn a_store_with_no_dump_or_no_store_is_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (data, out) = (dir.path().join("a"), dir.path().join("backup.resp"));
    let o = dump(&data, &out);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("holds no critio-kv store"),
        "{err}"
    );
    let p = start(&data);
    let mut con = connect(p.addr);
    let _: () = redis::cmd("SET").arg("k").arg("v").query(&mut con).unwrap();
    let _: String = redis::cmd("SAVE").query(&mut con).unwrap();
    // Running, and stopped.
    let o = dump(&data, &out);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("run BGSAVE"), "{err}");
    drop(con);
    stop(p);
    let o = dump(&data, &out);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("run BGSAVE"), "{err}");
    assert!(!out.exists() && !dir.path().join("backup.resp.partial").exists());
}
