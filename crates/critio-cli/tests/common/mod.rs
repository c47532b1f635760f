//! What the tests that run `critio serve` share: the server process,
//! started and waited for until it listens.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

/// A server process; killed when dropped.
pub struct Proc {
    pub child: Child,
    pub addr: SocketAddr,
    /// What it printed before it listened.
    #[allow(dead_code)] // not every test reads it
    pub startup: Vec<String>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Spawns `cmd` (a `critio serve`), reads its output until it says where
/// it listens, and keeps draining it so the server never blocks on a full
/// pipe.
pub fn listening(cmd: &mut Command) -> Proc {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run critio serve");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut startup = Vec::new();
    let addr = loop {
        let line = lines
            .next()
            .expect("critio serve exited before listening")
            .unwrap();
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
        startup.push(line);
    };
    std::thread::spawn(move || for _ in lines {});
    Proc {
        child,
        addr,
        startup,
    }
}
