//! Crash consistency of `critio serve`, end to end: the real binary,
//! killed with SIGKILL at a seeded moment while clients write and
//! checkpoints, snapshots and index rewrites run, then restarted on the
//! same directory. Every acknowledged write must be there with its last
//! acknowledged value; a write in flight at the kill may be there or not.
//!
//! Two devices. The simulated SSD (data in a file) keeps its volatile
//! write cache in the process, so a kill loses every write not yet
//! flushed: that checks the flushes. The real file (`--device file`:
//! io_uring, `O_DIRECT`) checks the path a deployment takes, with reads,
//! writes and flushes in flight in the kernel at the kill; what a power
//! cut would lose beyond that is the sim's part.
//!
//! ```text
//!  round: start ─> W writers (own keys: SET, INCR, HSET, MSET, DEL, and MULTI/EXEC
//!         of several) + BGSAVE/SAVE/BGREWRITEAOF
//!         ─> SIGKILL after a seeded delay ─> restart ─> every key == acked (or == pending),
//!            and a write in flight (MSET, a transaction) applied whole or not at all
//!  last:  SIGTERM (exit 0, final checkpoint) ─> restart ─> every key == acked exactly
//! ```
//!
//! `SEED=n` runs one seed; a failure prints `reproduce with SEED=n`.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use redis::Connection;

mod common;
use common::Proc;

const WRITERS: u64 = 4;
const KEYS_PER_WRITER: u64 = 120;
const ROUNDS: usize = 5;
const SEEDS: [u64; 4] = [1, 2, 3, 4];

const CONFIG: &str = "\
[engine]
log_bytes = 4194304
checkpoint_interval_ms = 150
value_bytes_max = 65536
[cache]
capacity_bytes = 2097152
[log]
record_bytes_max = 262144
batch_bytes_max = 1048576
pending_bytes_max = 2097152
";

/// A key's value as the client knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Val {
    Absent,
    Str(Vec<u8>),
    Hash(BTreeMap<Vec<u8>, Vec<u8>>),
}

/// The last acknowledged value, and the one in flight (if a command was
/// sent and has not returned).
#[derive(Clone, Debug)]
struct Expect {
    acked: Val,
    pending: Option<Val>,
}

type Model = HashMap<String, Expect>;

fn start(dir: &Path, device: &str) -> Proc {
    let config = dir.join("crash.toml");
    std::fs::write(&config, CONFIG).unwrap();
    common::listening(
        Command::new(env!("CARGO_BIN_EXE_critio"))
            .args([
                "serve",
                "--bind",
                "127.0.0.1:0",
                "--device",
                device,
                "--capacity",
                "64MiB",
            ])
            .arg("--data")
            .arg(dir.join("data"))
            .arg("--config")
            .arg(&config),
    )
}

fn connect(addr: SocketAddr) -> Connection {
    let c = redis::Client::open(format!("redis://{addr}/")).unwrap();
    let con = c
        .get_connection_with_timeout(Duration::from_secs(10))
        .unwrap();
    con.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    con
}

fn value(rng: &mut SmallRng) -> Vec<u8> {
    let len = if rng.gen_bool(0.1) {
        rng.gen_range(2048..20_000)
    } else {
        rng.gen_range(1..600)
    };
    (0..len).map(|_| rng.gen_range(b'a'..=b'z')).collect()
}

/// One writer's next request: a command, or 2-4 of them in MULTI/EXEC on
/// different keys; with the values it leaves if applied.
fn next_op(rng: &mut SmallRng, w: u64, model: &Model) -> (redis::Pipeline, Vec<(String, Val)>) {
    let mut pipe = redis::pipe();
    if !rng.gen_ratio(1, 6) {
        let (cmd, effects) = next_cmd(rng, w, model);
        pipe.add_command(cmd);
        return (pipe, effects);
    }
    pipe.atomic();
    let mut effects: Vec<(String, Val)> = Vec::new();
    for _ in 0..rng.gen_range(2..5) {
        let (cmd, e) = next_cmd(rng, w, model);
        // Each command's effect is computed from the acknowledged state,
        // so a key is written at most once per transaction.
        if e.iter().any(|(k, _)| effects.iter().any(|(o, _)| o == k)) {
            continue;
        }
        pipe.add_command(cmd);
        effects.extend(e);
    }
    (pipe, effects)
}

/// One command, with the values it leaves if applied.
fn next_cmd(rng: &mut SmallRng, w: u64, model: &Model) -> (redis::Cmd, Vec<(String, Val)>) {
    let key = |rng: &mut SmallRng, kind: &str| {
        format!("w{w}:{kind}{}", rng.gen_range(0..KEYS_PER_WRITER / 3))
    };
    let acked = |k: &String| model.get(k).map_or(Val::Absent, |e| e.acked.clone());
    let mut cmd = redis::Cmd::new();
    let effects = match rng.gen_range(0..10) {
        0..=3 => {
            let (k, v) = (key(rng, "s"), value(rng));
            cmd.arg("SET").arg(&k).arg(&v);
            vec![(k, Val::Str(v))]
        }
        4 => {
            let k = key(rng, "s");
            cmd.arg("DEL").arg(&k);
            vec![(k, Val::Absent)]
        }
        5 | 6 => {
            let k = key(rng, "c");
            let n = match acked(&k) {
                Val::Str(s) => String::from_utf8(s).unwrap().parse::<i64>().unwrap(),
                _ => 0,
            };
            cmd.arg("INCR").arg(&k);
            vec![(k, Val::Str((n + 1).to_string().into_bytes()))]
        }
        7 | 8 => {
            let k = key(rng, "h");
            let (f, v) = (format!("f{}", rng.gen_range(0..8)).into_bytes(), value(rng));
            let mut h = match acked(&k) {
                Val::Hash(h) => h,
                _ => BTreeMap::new(),
            };
            cmd.arg("HSET").arg(&k).arg(&f).arg(&v);
            h.insert(f, v);
            vec![(k, Val::Hash(h))]
        }
        _ => {
            cmd.arg("MSET");
            let mut effects = Vec::new();
            for _ in 0..rng.gen_range(2..5) {
                let (k, v) = (key(rng, "s"), value(rng));
                if effects.iter().any(|(e, _)| *e == k) {
                    continue;
                }
                cmd.arg(&k).arg(&v);
                effects.push((k, Val::Str(v)));
            }
            effects
        }
    };
    (cmd, effects)
}

/// Writes until a command fails (the server was killed) or `stop`.
fn writer(
    addr: SocketAddr,
    w: u64,
    seed: u64,
    mut model: Model,
    stop: &AtomicBool,
) -> (Model, u64) {
    let mut rng = SmallRng::seed_from_u64(seed ^ (w << 32));
    let mut con = connect(addr);
    let mut acked = 0;
    while !stop.load(Ordering::Relaxed) {
        let (cmd, effects) = next_op(&mut rng, w, &model);
        for (k, v) in &effects {
            let e = model.entry(k.clone()).or_insert(Expect {
                acked: Val::Absent,
                pending: None,
            });
            e.pending = Some(v.clone());
        }
        if cmd.query::<redis::Value>(&mut con).is_err() {
            break; // in flight at the kill: pending stays
        }
        for (k, _) in &effects {
            let e = model.get_mut(k).unwrap();
            e.acked = e.pending.take().unwrap();
        }
        acked += 1;
    }
    (model, acked)
}

/// Starts checkpoints, snapshots and rewrites at seeded moments.
fn background(addr: SocketAddr, seed: u64, stop: &AtomicBool) {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0xb6);
    let mut con = connect(addr);
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(rng.gen_range(10..120)));
        let cmd = ["BGSAVE", "SAVE", "BGREWRITEAOF"][rng.gen_range(0..3)];
        match redis::cmd(cmd).query::<redis::Value>(&mut con) {
            Ok(_) => {}
            Err(e) if e.is_io_error() || e.is_connection_dropped() => return,
            Err(_) => {} // already in progress
        }
    }
}

/// A key's value now (hash keys are named `w<n>:h<i>`).
fn read_back(con: &mut Connection, key: &str) -> Val {
    let probe = if key.contains(":h") { "HGETALL" } else { "GET" };
    let v: redis::Value = redis::cmd(probe).arg(key).query(con).unwrap();
    match v {
        redis::Value::Nil => Val::Absent,
        redis::Value::BulkString(b) => Val::Str(b),
        redis::Value::Array(items) if items.is_empty() => Val::Absent,
        redis::Value::Array(items) => {
            let bytes: Vec<Vec<u8>> = items
                .into_iter()
                .map(|i| redis::from_redis_value(&i).unwrap())
                .collect();
            Val::Hash(
                bytes
                    .chunks(2)
                    .map(|p| (p[0].clone(), p[1].clone()))
                    .collect(),
            )
        }
        other => panic!("{key}: unexpected reply {other:?}"),
    }
}

/// Checks every key against the model and folds what was found into it.
/// The writer's request in flight at the kill (its only one: a writer
/// stops at its first failure) must be applied whole or not at all.
fn verify(addr: SocketAddr, model: &mut Model, seed: u64, round: usize) {
    let mut con = connect(addr);
    let (mut applied, mut lost) = (Vec::new(), Vec::new());
    for (key, e) in model.iter_mut() {
        let got = read_back(&mut con, key);
        if let Some(p) = &e.pending {
            if *p != e.acked {
                if got == *p {
                    applied.push(key.clone());
                } else {
                    lost.push(key.clone());
                }
            }
        }
        let ok = got == e.acked || e.pending.as_ref() == Some(&got);
        assert!(
            ok,
            "seed {seed} round {round}: {key} = {} but acknowledged {} (in flight: {})",
            show(&got),
            show(&e.acked),
            e.pending.as_ref().map_or("none".into(), show)
        );
        e.acked = got;
        e.pending = None;
    }
    assert!(
        applied.is_empty() || lost.is_empty(),
        "seed {seed} round {round}: a request in flight was half applied: {applied:?} written, {lost:?} not"
    );
}

fn show(v: &Val) -> String {
    match v {
        Val::Absent => "absent".into(),
        Val::Str(s) => format!("{:?}", String::from_utf8_lossy(&s[..s.len().min(24)])),
        Val::Hash(h) => format!("hash of {} fields", h.len()),
    }
}

/// One round: write, kill (or stop cleanly), restart, verify.
fn round(
    dir: &Path,
    device: &str,
    seed: u64,
    round: usize,
    models: Vec<Model>,
    clean: bool,
) -> Vec<Model> {
    let mut rng = SmallRng::seed_from_u64(seed.wrapping_mul(1000) + round as u64);
    let mut server = start(dir, device);
    let addr = server.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = models
        .into_iter()
        .enumerate()
        .map(|(w, m)| {
            let (stop, s) = (stop.clone(), seed + round as u64);
            std::thread::spawn(move || writer(addr, w as u64, s, m, &stop))
        })
        .collect();
    let bg = {
        let (stop, s) = (stop.clone(), seed + round as u64);
        std::thread::spawn(move || background(addr, s, &stop))
    };
    std::thread::sleep(Duration::from_millis(rng.gen_range(150..900)));
    if clean {
        stop.store(true, Ordering::Relaxed);
    } else {
        server.child.kill().unwrap(); // SIGKILL
    }
    let (mut models, acked): (Vec<Model>, Vec<u64>) =
        writers.into_iter().map(|h| h.join().unwrap()).unzip();
    stop.store(true, Ordering::Relaxed);
    bg.join().unwrap();
    if clean {
        let pid = server.child.id().to_string();
        let ok = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(ok.success());
        let status = server.child.wait().unwrap();
        assert!(
            status.success(),
            "seed {seed}: critio serve exited with {status} on SIGTERM"
        );
    }
    drop(server);
    let restarted = start(dir, device);
    let mut in_flight = 0;
    for m in &mut models {
        in_flight += m.values().filter(|e| e.pending.is_some()).count();
        verify(restarted.addr, m, seed, round);
    }
    eprintln!(
        "{device}: seed {seed} round {round}: {} writes acknowledged, {in_flight} keys in flight at the {}",
        acked.iter().sum::<u64>(),
        if clean { "stop" } else { "kill" }
    );
    models
}

fn run_seed(device: &str, seed: u64) {
    // In the target directory, not /tmp: `O_DIRECT` needs a file system
    // that has it, which a tmpfs /tmp does not.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut models: Vec<Model> = (0..WRITERS).map(|_| Model::new()).collect();
    for r in 0..ROUNDS {
        models = round(dir.path(), device, seed, r, models, r == ROUNDS - 1);
    }
    let keys: usize = models.iter().map(HashMap::len).sum();
    assert!(keys > 0, "seed {seed}: nothing was written");
}

/// Runs `seeds` (or the one `SEED` names) on `device`.
fn run_seeds(device: &str, seeds: &[u64]) {
    let seeds: Vec<u64> = match std::env::var("SEED") {
        Ok(s) => vec![s.parse().expect("SEED must be a number")],
        Err(_) => seeds.to_vec(),
    };
    let started = Instant::now();
    for seed in seeds {
        let result = std::panic::catch_unwind(|| run_seed(device, seed));
        if let Err(e) = result {
            eprintln!("reproduce with SEED={seed} ({device})");
            std::panic::resume_unwind(e);
        }
    }
    eprintln!(
        "crash test ({device}): {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn acknowledged_writes_survive_sigkill() {
    run_seeds("sim", &SEEDS);
}

#[test]
fn acknowledged_writes_survive_sigkill_on_a_real_file() {
    run_seeds("file", &SEEDS[..2]);
}
