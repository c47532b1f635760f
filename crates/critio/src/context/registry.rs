//! Lazy registration of OS threads as tasks, and lookup by id.
//!
//! A thread becomes a task the first time it touches critio; its thread-local
//! registration removes it from the registry when the thread exits. Lookup by
//! id is needed only on slow paths (a critical waiter boosting a lock owner
//! whose id it read from the lock word), so the registry is one mutex-guarded
//! map: a leaf lock, never held while anything else is taken.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use super::task::{Task, TaskId, TaskRef};
use crate::shim::{SideGuard, SideMutex};

/// Ids are never reused, so a stale id can never name the wrong task.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Ids must fit the owner field of a mutex's lock word.
const TASK_ID_MAX: TaskId = (1 << 62) - 1;

type Map = HashMap<TaskId, Weak<Task>>;

// The registry lock is a loom lock under loom: a task created by one thread
// and found here by another must be ordered for the model checker too.
#[cfg(not(loom))]
static REGISTRY: std::sync::LazyLock<SideMutex<Map>> =
    std::sync::LazyLock::new(|| SideMutex::new(HashMap::new()));

#[cfg(loom)]
loom::lazy_static! {
    static ref REGISTRY: SideMutex<Map> = SideMutex::new(HashMap::new());
}

fn registry() -> SideGuard<'static, Map> {
    REGISTRY.lock()
}

/// The thread-local registration; unregisters when the thread exits.
pub(crate) struct Registration(pub(crate) TaskRef);

impl Registration {
    fn new() -> Self {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        assert!(id <= TASK_ID_MAX, "task ids exhausted");
        let task = Arc::new(Task::new(id));
        registry().insert(id, Arc::downgrade(&task));
        Registration(task)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // Under loom the registry is rebuilt for every execution and is torn
        // down before thread-locals, so there is nothing to remove from.
        #[cfg(not(loom))]
        registry().remove(&self.0.id());
    }
}

#[cfg(not(loom))]
std::thread_local! {
    pub(crate) static CURRENT: Registration = Registration::new();
}

#[cfg(loom)]
loom::thread_local! {
    pub(crate) static CURRENT: Registration = Registration::new();
}

/// The live task with this id, if its thread is still running.
pub fn lookup(id: TaskId) -> Option<TaskRef> {
    registry().get(&id).and_then(Weak::upgrade)
}

/// Every live task.
#[cfg(not(loom))]
pub(crate) fn all() -> Vec<TaskRef> {
    registry().values().filter_map(Weak::upgrade).collect()
}

/// How many threads are registered as tasks right now.
pub fn registered_count() -> usize {
    registry().len()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::context;

    #[test]
    fn threads_register_lazily_with_stable_ids_and_unregister_on_exit() {
        let (id_a, id_b) =
            std::thread::spawn(|| (context::current().id(), context::current().id()))
                .join()
                .unwrap();
        assert_eq!(id_a, id_b);
        assert!(lookup(id_a).is_none(), "exited thread stays registered");
        let here = context::current();
        assert_eq!(lookup(here.id()).unwrap().id(), here.id());
        assert_ne!(here.id(), id_a);
    }
}
