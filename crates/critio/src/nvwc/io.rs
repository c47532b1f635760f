//! Blocking helpers for the threads that may block (writeback, open): many
//! commands in flight at once, waited for together. Never used on a
//! device's completion path.

use std::sync::mpsc;

use crate::device::{AlignedBuf, Command, Device, DeviceError};

/// Submits `cmds` to `dev` with at most `inflight_max` in flight, waits for
/// all, and returns their buffers in order, or the first error (submitting
/// no more after it).
pub(crate) fn submit_all(
    dev: &dyn Device,
    cmds: Vec<Command>,
    inflight_max: usize,
) -> Result<Vec<AlignedBuf>, DeviceError> {
    assert!(inflight_max > 0);
    let n = cmds.len();
    let (tx, rx) = mpsc::channel();
    let mut out: Vec<Option<AlignedBuf>> = (0..n).map(|_| None).collect();
    let mut error: Option<DeviceError> = None;
    let mut cmds = cmds.into_iter().enumerate();
    let mut in_flight = 0usize;
    loop {
        while in_flight < inflight_max && error.is_none() {
            let Some((i, cmd)) = cmds.next() else {
                break;
            };
            let tx = tx.clone();
            dev.submit(
                cmd,
                Box::new(move |c| {
                    // The receiver lives until every submitted command is back.
                    let _ = tx.send((i, c));
                }),
            );
            in_flight += 1;
        }
        if in_flight == 0 {
            break;
        }
        let (i, c) = rx.recv().expect("a device dropped a completer");
        in_flight -= 1;
        match c.result {
            Ok(()) => out[i] = Some(c.buf),
            Err(e) => {
                error.get_or_insert(e);
            }
        }
    }
    match error {
        Some(e) => Err(e),
        None => Ok(out
            .into_iter()
            .map(|b| b.expect("every command completed"))
            .collect()),
    }
}
