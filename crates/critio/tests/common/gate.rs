//! A device that holds every command until the test releases it, so block
//! layer scenarios can assert what is at the device at each step.

use std::sync::Arc;

use critio::context::Class;
use critio::device::mem::MemDevice;
use critio::device::{Command, Completer, Device, DeviceInfo, Op};
use parking_lot::{Condvar, Mutex};

/// A held command: what arrived, in order.
pub struct Held {
    pub op: Op,
    pub offset: u64,
    pub class: Class,
    cmd: Option<(Command, Completer)>,
}

/// Which commands a gate holds (the rest pass straight through).
pub type HoldIf = Box<dyn Fn(Op, u64) -> bool + Send + Sync>;

/// Holds commands; executes them on a memory device when released.
pub struct GateDevice {
    mem: MemDevice,
    info: DeviceInfo,
    held: Mutex<Vec<Held>>,
    arrived: Condvar,
    hold_if: HoldIf,
}

impl GateDevice {
    /// A 1 MiB gate that holds every command.
    pub fn new(queue_depth: u32) -> Arc<Self> {
        Self::with(queue_depth, 1 << 20, Box::new(|_, _| true))
    }

    /// A gate of `capacity` bytes that holds the commands `hold_if` selects
    /// (by op and offset) and runs the others at once.
    pub fn with(queue_depth: u32, capacity: u64, hold_if: HoldIf) -> Arc<Self> {
        let mem = MemDevice::new(capacity);
        let info = DeviceInfo {
            name: "gate".into(),
            queue_depth,
            ..mem.info().clone()
        };
        Arc::new(Self {
            mem,
            info,
            held: Mutex::new(Vec::new()),
            arrived: Condvar::new(),
            hold_if,
        })
    }

    /// What has arrived so far (released or not): (offset, class) in order.
    pub fn arrivals(&self) -> Vec<(u64, Class)> {
        self.held
            .lock()
            .iter()
            .map(|h| (h.offset, h.class))
            .collect()
    }

    /// Waits until `n` commands have arrived.
    pub fn wait_arrivals(&self, n: usize) {
        let mut held = self.held.lock();
        let deadline = std::time::Instant::now() + super::PATIENCE;
        while held.len() < n {
            assert!(
                !self.arrived.wait_until(&mut held, deadline).timed_out(),
                "timed out waiting for {n} commands at the device"
            );
        }
    }

    /// Completes the held command at `offset`.
    pub fn release(&self, offset: u64) {
        let cmd = {
            let mut held = self.held.lock();
            let h = held
                .iter_mut()
                .find(|h| h.offset == offset && h.cmd.is_some())
                .unwrap_or_else(|| panic!("no held command at {offset}"));
            h.cmd.take().unwrap()
        };
        self.mem.submit(cmd.0, cmd.1);
    }

    /// Whether a command at `offset` is held now (arrived, not released).
    pub fn holds(&self, offset: u64) -> bool {
        self.held
            .lock()
            .iter()
            .any(|h| h.offset == offset && h.cmd.is_some())
    }

    /// Completes every held command.
    pub fn release_all(&self) {
        let cmds: Vec<_> = self
            .held
            .lock()
            .iter_mut()
            .filter_map(|h| h.cmd.take())
            .collect();
        for (cmd, done) in cmds {
            self.mem.submit(cmd, done);
        }
    }
}

impl Device for GateDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&self, cmd: Command, done: Completer) {
        if !(self.hold_if)(cmd.op, cmd.offset) {
            return self.mem.submit(cmd, done);
        }
        let mut held = self.held.lock();
        held.push(Held {
            op: cmd.op,
            offset: cmd.offset,
            class: cmd.class,
            cmd: Some((cmd, done)),
        });
        self.arrived.notify_all();
    }
}
