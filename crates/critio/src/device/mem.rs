//! `mem`: a device in memory that completes every command inline, inside
//! `submit`. For fast unit tests, and as the zero-latency device against
//! which the block layer's own overhead is measured.

use parking_lot::RwLock;

use super::{validate, Command, Completer, Completion, Device, DeviceError, DeviceInfo, Op};

/// The block size of a [`MemDevice`].
pub const MEM_BLOCK_SIZE: u32 = 512;

/// A device in memory.
pub struct MemDevice {
    info: DeviceInfo,
    data: RwLock<Vec<u8>>,
}

impl MemDevice {
    /// A zeroed device of `capacity` bytes (a multiple of 512).
    pub fn new(capacity: u64) -> Self {
        assert_eq!(
            capacity % u64::from(MEM_BLOCK_SIZE),
            0,
            "capacity must be block-aligned"
        );
        Self {
            info: DeviceInfo {
                name: "mem".into(),
                capacity,
                block_size: MEM_BLOCK_SIZE,
                queue_depth: 128,
                allocates_on_first_write: false,
            },
            data: RwLock::new(vec![
                0;
                usize::try_from(capacity).expect("capacity fits memory")
            ]),
        }
    }

    fn complete(&self, mut cmd: Command) -> Completion {
        let result = validate(&self.info, &cmd).map(|()| self.execute(&mut cmd));
        Completion {
            result,
            buf: cmd.buf,
        }
    }

    fn execute(&self, cmd: &mut Command) {
        let at = cmd.offset as usize;
        match cmd.op {
            Op::Read => {
                let data = self.data.read();
                let len = cmd.buf.len();
                cmd.buf.as_mut_slice().copy_from_slice(&data[at..at + len]);
            }
            Op::Write => {
                let len = cmd.buf.len();
                self.data.write()[at..at + len].copy_from_slice(cmd.buf.as_slice());
            }
            Op::Flush => {}
        }
    }
}

impl Device for MemDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&self, cmd: Command, done: Completer) {
        done(self.complete(cmd));
    }

    fn flushes_here(&self) -> bool {
        true
    }

    fn flush_here(&self) -> Option<Result<(), DeviceError>> {
        Some(Ok(()))
    }

    fn submits_here(&self) -> bool {
        true
    }

    /// The same as [`Device::submit`], which completes inline too, without
    /// the completion closure.
    fn submit_here(&self, cmd: Command) -> Result<Completion, Command> {
        Ok(self.complete(cmd))
    }
}
