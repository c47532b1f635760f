//! `critio serve` on a file image, as a user meets it: a new image that
//! cannot fit is refused up front, saying how to size it, and leaves
//! nothing behind, as does one too small for a store or a port already
//! taken; a data directory holding another device's store is refused
//! rather than given a second, empty one; a second server on a data
//! directory in use is refused while the first goes on serving; a
//! client's SHUTDOWN stops it as SIGTERM does, its data kept. The pool
//! backend (pread/pwrite through the page cache), so that any temporary
//! directory will do.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

mod common;
use common::Proc;

fn serve(data: &Path, capacity: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_critio"));
    cmd.args(["serve", "--bind", "127.0.0.1:0", "--device", "pool"])
        .args(["--capacity", capacity])
        .arg("--data")
        .arg(data);
    cmd
}

fn start(data: &Path) -> Proc {
    common::listening(&mut serve(data, "256MiB"))
}

/// Checks that the server at `addr` takes a write.
fn serves(addr: SocketAddr) {
    let mut con = connect(addr);
    redis::cmd("SET")
        .arg("k")
        .arg("v")
        .exec(&mut con)
        .expect("SET");
}

fn connect(addr: SocketAddr) -> redis::Connection {
    redis::Client::open(format!("redis://{addr}/"))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(10))
        .unwrap()
}

/// Runs a `critio serve` that should be refused: its stderr, once it has
/// exited unsuccessfully. One that starts serving instead fails the test
/// (killed after a minute) rather than hanging it.
fn refused(mut cmd: Command) -> String {
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("not refused: still running after a minute");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = std::fs::read_to_string(log.path()).unwrap();
    assert!(!status.success(), "not refused: {err}");
    err
}

#[test]
fn a_new_image_larger_than_the_free_space_is_refused_saying_how_to_size_it() {
    let dir = tempfile::tempdir().unwrap();
    let probe = std::fs::File::create(dir.path().join("probe")).unwrap();
    if rustix::fs::fallocate(&probe, rustix::fs::FallocateFlags::empty(), 0, 4096)
        == Err(rustix::io::Errno::OPNOTSUPP)
    {
        eprintln!("skipped: no fallocate here, so a new image is sparse and not checked");
        return;
    }
    let st = rustix::fs::statvfs(dir.path()).unwrap();
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    let size = (free + (64 << 30)).next_multiple_of(4096);
    let data = dir.path().join("data");
    let out = serve(&data, &size.to_string()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "not refused: {err}");
    assert!(err.contains("not enough free space"), "{err}");
    assert!(
        err.contains("--capacity gave the new image's size"),
        "{err}"
    );
    assert!(!data.join("critio.img").exists(), "no image left behind");
}

#[test]
fn a_second_server_on_the_same_data_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let first = start(&data);
    let mut con = connect(first.addr);
    redis::cmd("SET")
        .arg("k")
        .arg("v1")
        .exec(&mut con)
        .expect("SET");
    let out = serve(&data, "256MiB").output().unwrap();
    assert!(!out.status.success(), "a second server started");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use"), "{err}");
    let v: String = redis::cmd("GET").arg("k").query(&mut con).expect("GET");
    assert_eq!(v, "v1", "the first server goes on serving its data");
}

#[test]
fn a_taken_port_is_refused_before_an_image_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_critio"));
    cmd.args(["serve", "--device", "pool", "--capacity", "256MiB"])
        .args(["--bind", &addr, "--data"])
        .arg(&data);
    let err = refused(cmd);
    assert!(err.contains(&format!("cannot listen on {addr}")), "{err}");
    assert!(!data.join("critio.img").exists(), "an image was created");
}

#[test]
fn a_store_too_small_to_create_leaves_no_image_and_a_larger_one_then_starts() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let err = refused(serve(&data, "4KiB"));
    assert!(err.contains("too small"), "{err}");
    assert!(!err.contains("ERR "), "worded for a client: {err}");
    let err = refused(serve(&data, "0"));
    assert_eq!(err.matches("config: ").count(), 1, "{err}");
    assert!(
        err.contains("`device.capacity_bytes` = 0 is invalid"),
        "{err}"
    );
    assert!(
        !data.join("critio.img").exists(),
        "the image was left behind"
    );
    let server = start(&data);
    serves(server.addr);
}

#[test]
fn a_data_directory_holding_another_devices_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    // What a store on the simulated device leaves: its image, not ours.
    std::fs::write(data.join("critio-sim.img"), vec![1u8; 8192]).unwrap();
    let err = refused(serve(&data, "256MiB"));
    assert!(err.contains("holds a store of another device"), "{err}");
    assert!(
        err.contains("--device sim"),
        "says which device opens it: {err}"
    );
    assert!(
        !data.join("critio.img").exists(),
        "a second image was created"
    );
    // And the other way round: a file store, opened as the simulator's.
    std::fs::remove_file(data.join("critio-sim.img")).unwrap();
    std::fs::write(data.join("critio.img"), vec![1u8; 8192]).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_critio"));
    cmd.args([
        "serve",
        "--bind",
        "127.0.0.1:0",
        "--device",
        "sim",
        "--data",
    ])
    .arg(&data);
    let err = refused(cmd);
    assert!(err.contains("--device file (or pool)"), "{err}");
    assert!(!data.join("critio-sim.img").exists());
}

#[test]
fn a_default_cache_is_no_larger_than_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir.path().join("data"));
    let first = server.startup.first().expect("a settings line");
    // "page cache N MiB (real-device default; ...)": an eighth of the
    // machine's memory, at least 256 MiB, the device's size here.
    let mib: u64 = first
        .split("page cache ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no cache size in {first:?}"));
    let cut = server
        .startup
        .iter()
        .any(|l| l.contains("page cache 256 MiB instead: the device holds no more"));
    assert_eq!(cut, mib > 256, "{:?}", server.startup);
    serves(server.addr);
}

/// A client's SHUTDOWN stops the server as SIGTERM does: it exits 0 after
/// a final checkpoint, and a restart has every key. Its connection closes
/// only once the store is released: a `critio dump` run as soon as
/// SHUTDOWN returns (as README shows) is not refused as in use.
#[test]
fn a_clients_shutdown_stops_the_server_and_keeps_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = start(dir.path());
    let mut con = connect(p.addr);
    for i in 0..100 {
        let _: () = redis::cmd("SET")
            .arg(format!("k{i}"))
            .arg(i)
            .query(&mut con)
            .unwrap();
    }
    let _: String = redis::cmd("BGSAVE").query(&mut con).unwrap();
    while !redis::cmd("INFO")
        .arg("persistence")
        .query::<String>(&mut con)
        .unwrap()
        .contains("rdb_bgsave_in_progress:0")
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let r: redis::RedisResult<()> = redis::cmd("SHUTDOWN").query(&mut con);
    assert!(r.is_err(), "no reply: the connection closes");
    let out = dir.path().join("d.resp");
    let dump = Command::new(env!("CARGO_BIN_EXE_critio"))
        .args(["dump", "--device", "pool", "--data"])
        .arg(dir.path())
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&dump.stderr);
    assert!(dump.status.success() && said.contains("100 keys"), "{said}");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = p.child.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "still running");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    drop(p);
    let p = start(dir.path());
    let mut con = connect(p.addr);
    let n: u64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    assert_eq!(n, 100);
}
