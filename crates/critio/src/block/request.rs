//! A submitted request as its submitter and its waiters see it: a handle to
//! wait on, which is also the [`Blocker`] that promotes the request when a
//! critical task waits for it (paper 000, Section 4.2.2).
//!
//! Several tasks may wait for one request (readers of a page under
//! writeback); the first critical one promotes it, and all are woken when it
//! completes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::layer::{BlockError, Inner};
use super::ReqId;
use crate::context::{self, Blocker, BlockingStatus, InheritKind, TaskRef, WaitScope};
use crate::device::AlignedBuf;
use crate::shim::thread;

/// The shared state of one request.
pub(crate) struct IoState {
    id: ReqId,
    point: &'static str,
    done: AtomicBool,
    /// The outcome and the tasks to wake, under one lock: a completion and
    /// a waiter each take it once.
    inner: Mutex<IoInner>,
    layer: Weak<Inner>,
}

struct IoInner {
    result: Result<(), BlockError>,
    buf: Option<AlignedBuf>,
    waiters: Vec<TaskRef>,
}

impl IoState {
    pub(crate) fn new(id: ReqId, point: &'static str, layer: Weak<Inner>) -> Arc<Self> {
        Arc::new(Self {
            id,
            point,
            done: AtomicBool::new(false),
            inner: Mutex::new(IoInner {
                result: Ok(()),
                buf: None,
                waiters: Vec::new(),
            }),
            layer,
        })
    }

    /// Records the outcome and wakes every waiter.
    pub(crate) fn finish(&self, result: Result<(), BlockError>, buf: AlignedBuf) {
        let waiters = {
            let mut inner = self.inner.lock();
            inner.result = result;
            inner.buf = Some(buf);
            self.done.store(true, Ordering::Release);
            std::mem::take(&mut inner.waiters)
        };
        for t in waiters {
            t.unpark();
        }
    }

    /// Registers the current task to be woken at completion; false if the
    /// request has completed already.
    fn add_waiter(&self) -> bool {
        let mut inner = self.inner.lock();
        if self.done.load(Ordering::Acquire) {
            return false;
        }
        inner.waiters.push(context::current());
        true
    }
}

impl Blocker for IoState {
    fn record_wait(
        &self,
        point: &'static str,
        class: crate::class::Class,
        waited: std::time::Duration,
    ) {
        Inner::record_wait_in(&self.layer, point, class, waited);
    }
    fn resolve(&self, waiter: &TaskRef, _flipped: &mut Vec<TaskRef>) {
        if waiter.is_critical() {
            if let Some(layer) = self.layer.upgrade() {
                layer.promote(self.id, InheritKind::Io);
            }
        }
    }
}

/// A submitted request. Cloning gives another handle to the same request.
#[derive(Clone)]
pub struct IoHandle {
    pub(crate) state: Arc<IoState>,
}

impl IoHandle {
    /// The request's id.
    pub fn id(&self) -> ReqId {
        self.state.id
    }

    /// Whether the request has completed.
    pub fn is_done(&self) -> bool {
        self.state.done.load(Ordering::Acquire)
    }

    /// Promotes the request wherever it is, as a critical task waiting
    /// for it does (nothing once it is done, or without I/O inheritance):
    /// for a task that is about to wait for it after others.
    pub fn promote(&self) {
        if self.is_done() {
            return;
        }
        if let Some(layer) = self.state.layer.upgrade() {
            layer.promote(self.state.id, InheritKind::Io);
        }
    }

    /// Blocks until the request completes; returns its result. While the
    /// caller waits, its blocking status is "I/O n"; if it is critical (now or
    /// later, by inheritance) the request is promoted wherever it is.
    pub fn wait(&self) -> Result<(), BlockError> {
        self.block_until_done();
        self.state.inner.lock().result.clone()
    }

    fn block_until_done(&self) {
        if self.is_done() {
            return;
        }
        let status = BlockingStatus::Io {
            id: self.state.id,
            point: self.state.point,
        };
        let scope = WaitScope::enter(status, self.state.clone());
        if self.state.add_waiter() {
            while !self.is_done() {
                thread::park();
            }
        }
        drop(scope);
    }

    /// Takes the request's buffer (the data, for a read) after it completed;
    /// None before completion or if already taken.
    pub fn take_buf(&self) -> Option<AlignedBuf> {
        if !self.is_done() {
            return None;
        }
        self.state.inner.lock().buf.take()
    }

    /// Waits, then returns the buffer (result and buffer under one lock).
    pub fn wait_buf(&self) -> Result<AlignedBuf, BlockError> {
        self.block_until_done();
        let mut inner = self.state.inner.lock();
        inner.result.clone()?;
        Ok(inner
            .buf
            .take()
            .expect("the buffer of a completed request is taken once"))
    }
}
