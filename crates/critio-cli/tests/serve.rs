//! `critio serve` on a file image, as a user meets it: a new image that
//! cannot fit is refused up front, saying how to size it, and leaves
//! nothing behind; a second server on a data directory in use is refused
//! while the first goes on serving. The pool backend (pread/pwrite through
//! the page cache), so that any temporary directory will do.

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

fn connect(addr: SocketAddr) -> redis::Connection {
    redis::Client::open(format!("redis://{addr}/"))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(10))
        .unwrap()
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
