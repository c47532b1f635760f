//! The client matrix: critio-kv driven by the clients people use, each
//! from its own registry, running the same script (tests/clients/):
//! commands with typed replies, a pipeline, a transaction (MULTI/EXEC and
//! WATCH), the usual error replies, and a reconnect after the server
//! restarts on its data.
//!
//! | client | how | installed by |
//! |---|---|---|
//! | redis-py (latest), RESP3 and `protocol=2` | `clients/matrix.py` | pip, into `target/client-matrix/py` |
//! | go-redis v9, RESP3 and RESP2 | `clients/go` | the Go module proxy, built to `target/client-matrix/go-matrix` |
//! | node-redis, RESP3 and RESP2 | `clients/node/matrix.mjs` | npm, into `clients/node/node_modules` |
//! | redis-cli, redis-benchmark | the commands | Debian's redis-tools |
//!
//! `tests/clients/install.sh` installs them (`.ci/run` runs it). A client
//! that is missing is skipped with a message, unless
//! `CRITIO_CLIENT_MATRIX=required` (set by `.ci/run`): then it fails.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use critio::device::DeviceSpec;
use critio_kv::server::{Backend, Server, ServerConfig};
use critio_kv::stack::{default_critio_config, Scheme, Stack, StackConfig};

const MIB: u64 = 1 << 20;
/// The steps every script prints, in order.
const STEPS: [&str; 5] = ["commands", "pipeline", "transaction", "errors", "reconnect"];

/// critio-kv on a pool device in a directory, restartable on its port.
struct Kv {
    dir: tempfile::TempDir,
    port: u16,
    running: Option<(Server, Stack)>,
}

impl Kv {
    fn start() -> Kv {
        let mut kv = Kv {
            dir: tempfile::tempdir().unwrap(),
            port: 0,
            running: None,
        };
        kv.open();
        kv
    }

    fn open(&mut self) {
        let mut critio = default_critio_config();
        critio.cache.capacity_bytes = 16 * MIB;
        let sc = StackConfig {
            device: DeviceSpec::Pool(self.dir.path().join("kv.img")),
            capacity: 256 * MIB,
            scheme: Scheme::Rcp,
            critio,
            ..StackConfig::default()
        };
        let stack = Stack::open(&sc).expect("open the stack");
        let cfg = ServerConfig {
            bind: format!("127.0.0.1:{}", self.port),
            ..ServerConfig::default()
        };
        let server = Server::start(cfg, Backend::of(&stack, &sc)).expect("start the server");
        self.port = server.local_addr().port();
        self.running = Some((server, stack));
    }

    /// Stops the server (commands in flight finish; no final checkpoint,
    /// so what was acknowledged comes back from the log) and starts it
    /// again on the same port.
    fn restart(&mut self) {
        if let Some((server, stack)) = self.running.take() {
            server.shutdown();
            drop(stack);
        }
        self.open();
    }
}

fn required() -> bool {
    std::env::var("CRITIO_CLIENT_MATRIX").is_ok_and(|v| v == "required")
}

/// Skips (or, when the matrix is required, fails) for a missing client.
fn missing(what: &str, why: &str) {
    assert!(
        !required(),
        "{what} is missing ({why}); run crates/critio-kv/tests/clients/install.sh"
    );
    eprintln!("skipped {what}: {why} (crates/critio-kv/tests/clients/install.sh installs it)");
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

/// Runs a matrix script (`cmd PORT PROTOCOL`) against a fresh server:
/// restarts the server when the script says "restart", and checks it
/// printed every step.
fn run_script(what: &str, mut cmd: Command, protocol: &str) {
    let mut kv = Kv::start();
    let mut child = cmd
        .arg(kv.port.to_string())
        .arg(protocol)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut done = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(line) if line == "restart" => {
                kv.restart();
                let stdin = child.stdin.as_mut().unwrap();
                stdin.write_all(b"go\n").unwrap();
                stdin.flush().unwrap();
            }
            Ok(line) => match line.strip_prefix("ok ") {
                Some(step) => done.push(step.to_owned()),
                None => eprintln!("{what}: {line}"),
            },
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                panic!("{what}: no output for 120 s after {done:?}");
            }
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && done == STEPS,
        "{what}: {} after steps {done:?}:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn redis_py_resp3_and_resp2() {
    let py = workspace().join("target/client-matrix/py/bin/python");
    let ok = Command::new(&py)
        .args(["-c", "import redis"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        return missing("redis-py", &format!("{} cannot import redis", py.display()));
    }
    for protocol in ["3", "2"] {
        let mut cmd = Command::new(&py);
        cmd.arg(scripts().join("matrix.py"));
        run_script(&format!("redis-py protocol={protocol}"), cmd, protocol);
    }
}

#[test]
fn go_redis_v9_resp3_and_resp2() {
    let bin = workspace().join("target/client-matrix/go-matrix");
    if !bin.exists() {
        return missing("go-redis", &format!("{} is not built", bin.display()));
    }
    for protocol in ["3", "2"] {
        run_script(
            &format!("go-redis protocol={protocol}"),
            Command::new(&bin),
            protocol,
        );
    }
}

#[test]
fn node_redis_resp3_and_resp2() {
    let dir = scripts().join("node");
    let installed = dir.join("node_modules/redis/package.json").exists();
    let node = Command::new("node").arg("--version").output().is_ok();
    if !installed || !node {
        return missing(
            "node-redis",
            "node or clients/node/node_modules/redis is absent",
        );
    }
    for protocol in ["3", "2"] {
        let mut cmd = Command::new("node");
        cmd.arg(dir.join("matrix.mjs"));
        run_script(&format!("node-redis RESP{protocol}"), cmd, protocol);
    }
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok()
}

/// Runs redis-cli with `args` (and `input` on stdin); its stdout.
fn cli(port: u16, args: &[&str], input: &str) -> String {
    let mut child = Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run redis-cli");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "redis-cli {args:?}: {}", out.status);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn redis_cli_and_redis_benchmark() {
    if !have("redis-cli") || !have("redis-benchmark") {
        return missing(
            "redis-cli/redis-benchmark",
            "not on PATH (Debian redis-tools)",
        );
    }
    let mut kv = Kv::start();
    let p = kv.port;
    assert_eq!(cli(p, &["SET", "k", "v"], ""), "OK\n");
    assert_eq!(cli(p, &["GET", "k"], ""), "v\n");
    assert_eq!(cli(p, &["HSET", "h", "a", "1"], ""), "1\n");
    assert_eq!(cli(p, &["-3", "HGETALL", "h"], ""), "a 1\n");
    assert_eq!(
        cli(p, &[], "MULTI\nSET t 1\nINCR t\nEXEC\n"),
        "OK\nQUEUED\nQUEUED\nOK\n2\n"
    );
    assert_eq!(
        cli(p, &["INCR", "h"], ""),
        "WRONGTYPE Operation against a key holding the wrong kind of value\n\n"
    );
    assert_eq!(
        cli(p, &["GET"], ""),
        "ERR wrong number of arguments for 'get' command\n\n"
    );
    assert!(cli(p, &["NOSUCHCOMMAND"], "").starts_with("ERR unknown command 'NOSUCHCOMMAND'"));
    // A pipeline: many commands on stdin, answered in order.
    let input: String = (0..200).map(|i| format!("SET p{i} {i}\n")).collect();
    assert_eq!(
        cli(p, &[], &input).lines().filter(|l| *l == "OK").count(),
        200
    );
    kv.restart();
    assert_eq!(cli(p, &["GET", "t"], ""), "2\n");
    assert_eq!(cli(p, &["DBSIZE"], ""), "203\n");
    for proto in [&[][..], &["-3"][..]] {
        let out = Command::new("redis-benchmark")
            .args([
                "-p",
                &p.to_string(),
                "-t",
                "set,get,incr,mset",
                "-n",
                "2000",
                "-q",
            ])
            .args(proto)
            .output()
            .expect("run redis-benchmark");
        let text = String::from_utf8_lossy(&out.stdout).replace('\r', "\n");
        assert!(out.status.success(), "redis-benchmark {proto:?}: {text}");
        for test in ["SET", "GET", "INCR", "MSET (10 keys)"] {
            assert!(
                text.lines()
                    .any(|l| l.starts_with(&format!("{test}: "))
                        && l.contains("requests per second")),
                "redis-benchmark {proto:?} has no {test} result:\n{text}"
            );
        }
    }
}
