//! `critio demo`: for now, a live walk through lock inheritance: a
//! background task holds a lock, a foreground task waits for it, and the
//! background task runs as critical exactly until it releases. The full demo
//! (critio-kv under a YCSB-A load with checkpoints, four schemes side by
//! side) arrives with issue 6.

use std::sync::{mpsc, Arc};
use std::time::Duration;

use critio::context::{self, TaskRef};
use critio::sync::Mutex;

fn show(step: &str, task: &TaskRef) {
    println!(
        "  {step:<44} background task {} is {:<12} (inherits from {} waiter(s))",
        task.id(),
        task.class(),
        task.inherited_count()
    );
}

/// Runs the walk-through and prints each step.
pub fn run() -> Result<(), String> {
    println!("critio demo: priority inheritance through a lock\n");
    let inode = Arc::new(Mutex::named("inode", ()));
    let (tx, rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let background = {
        let inode = inode.clone();
        std::thread::spawn(move || {
            let guard = inode.lock();
            tx.send(context::current()).expect("demo channel");
            release_rx.recv().expect("demo channel");
            drop(guard);
        })
    };
    let bg = rx.recv().map_err(|e| e.to_string())?;
    show("background holds `inode`:", &bg);
    let foreground = {
        let inode = inode.clone();
        std::thread::spawn(move || {
            context::set_foreground();
            drop(inode.lock());
        })
    };
    while bg.inherited_count() == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    show("foreground waits for `inode`:", &bg);
    release_tx.send(()).map_err(|e| e.to_string())?;
    background
        .join()
        .map_err(|_| "background thread panicked")?;
    foreground
        .join()
        .map_err(|_| "foreground thread panicked")?;
    show("background released `inode`:", &bg);
    let snap = critio::metrics::global().snapshot();
    println!("\n{}", snap.critical_wait_table());
    println!(
        "The full demo (critio-kv under YCSB-A with checkpoints, schemes none / kernel-idle / \
         static / rcp side by side) arrives with issue 6."
    );
    Ok(())
}
