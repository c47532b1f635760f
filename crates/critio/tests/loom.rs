//! Model checks of the lock and condition-variable protocols with loom: every
//! interleaving (up to a preemption bound) of small scenarios, checking no
//! lost wake-up and no deadlock (loom fails a model in which every thread is
//! parked for good), mutual exclusion, and that inheritance counts return to
//! zero.
//!
//! Built only with `RUSTFLAGS="--cfg loom"`; `tests/loom_driver.rs` runs it
//! as part of `cargo test --workspace`. Directly:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p critio --test loom --release
//! ```

#![cfg(loom)]

use std::sync::Arc;

use critio::context::{self, Class, TaskRef};
use critio::sync::{Condvar, Event, Mutex, RwLock};
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::thread;

fn model(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(preemptions);
    builder.check(f);
}

/// Runs `f` as the foreground main thread of a model, then un-marks it.
fn as_foreground<R>(f: impl FnOnce() -> R) -> R {
    context::set_foreground();
    let r = f();
    context::clear_foreground();
    r
}

/// Spins (yielding to loom) until `task` inherits criticality. If the
/// inheritance never happens, loom reports the model as not terminating.
fn until_inherits() {
    while context::current().inherited_count() == 0 {
        thread::yield_now();
    }
}

#[test]
fn mutex_owner_inherits_while_a_foreground_task_waits_and_loses_it_at_unlock() {
    model(3, || {
        let m = Arc::new(Mutex::named("loom: inherit", 0u32));
        let held = Arc::new(AtomicBool::new(false));
        let bg = {
            let (m, held) = (m.clone(), held.clone());
            thread::spawn(move || {
                let mut g = m.lock();
                held.store(true, Ordering::SeqCst);
                until_inherits();
                assert_eq!(context::current_class(), Class::Critical);
                *g += 1;
                drop(g);
                assert_eq!(context::current_class(), Class::NonCritical);
            })
        };
        while !held.load(Ordering::SeqCst) {
            thread::yield_now();
        }
        as_foreground(|| *m.lock() += 1);
        bg.join().unwrap();
        assert_eq!(*m.lock(), 2);
    });
}

#[test]
fn condvar_helper_inherits_until_it_signals() {
    model(3, || {
        let state = Arc::new((
            Mutex::named("loom: h flag", false),
            Condvar::named("loom: h cv"),
        ));
        let registered = Arc::new(AtomicBool::new(false));
        let helper = {
            let (state, registered) = (state.clone(), registered.clone());
            thread::spawn(move || {
                state.1.notify_all();
                registered.store(true, Ordering::SeqCst);
                until_inherits();
                *state.0.lock() = true;
                state.1.notify_all();
                assert_eq!(context::current_class(), Class::NonCritical);
            })
        };
        while !registered.load(Ordering::SeqCst) {
            thread::yield_now();
        }
        as_foreground(|| drop(state.1.wait_while(state.0.lock(), |set| !*set)));
        helper.join().unwrap();
    });
}

#[test]
fn mutex_background_holder_and_foreground_waiter() {
    model(4, || {
        let m = Arc::new(Mutex::named("loom: m", 0u32));
        let bg = {
            let m = m.clone();
            thread::spawn(move || {
                *m.lock() += 1;
                context::current()
            })
        };
        as_foreground(|| *m.lock() += 1);
        let bg: TaskRef = bg.join().unwrap();
        assert_eq!(*m.lock(), 2);
        assert_eq!(bg.inherited_count(), 0, "inheritance revoked");
    });
}

#[test]
fn mutex_three_contenders() {
    model(3, || {
        let m = Arc::new(Mutex::named("loom: m3", 0u32));
        let spawn = |m: Arc<Mutex<u32>>| {
            thread::spawn(move || {
                *m.lock() += 1;
                context::current()
            })
        };
        let a = spawn(m.clone());
        let b = spawn(m.clone());
        as_foreground(|| *m.lock() += 1);
        for t in [a.join().unwrap(), b.join().unwrap()] {
            assert_eq!(t.inherited_count(), 0);
        }
        assert_eq!(*m.lock(), 3);
    });
}

#[test]
fn mutex_woken_waiter_loses_to_a_relocking_holder() {
    // The holder re-takes the lock while the waiter it woke is on its way
    // (barging); the waiter queues again at the front and, having lost
    // once (LOST_MAX is 1 under loom), is handed the lock next time.
    model(3, || {
        let m = Arc::new(Mutex::named("loom: barge", 0u32));
        let relocker = {
            let m = m.clone();
            thread::spawn(move || {
                for _ in 0..2 {
                    *m.lock() += 1;
                }
                context::current()
            })
        };
        let waiter = {
            let m = m.clone();
            thread::spawn(move || {
                *m.lock() += 1;
                context::current()
            })
        };
        for t in [relocker.join().unwrap(), waiter.join().unwrap()] {
            assert_eq!(t.inherited_count(), 0);
        }
        assert_eq!(*m.lock(), 3);
    });
}

#[test]
fn mutex_critical_waiter_is_never_barged_past() {
    model(3, || {
        let m = Arc::new(Mutex::named("loom: no barge", Vec::new()));
        let held = Arc::new(AtomicBool::new(false));
        let bg = {
            let (m, held) = (m.clone(), held.clone());
            thread::spawn(move || {
                let mut g = m.lock();
                held.store(true, Ordering::SeqCst);
                until_inherits(); // the foreground task is queued
                g.push("bg");
                drop(g);
                m.lock().push("bg again"); // would barge if it could
            })
        };
        while !held.load(Ordering::SeqCst) {
            thread::yield_now();
        }
        as_foreground(|| m.lock().push("fg"));
        bg.join().unwrap();
        assert_eq!(*m.lock(), ["bg", "fg", "bg again"]);
    });
}

#[test]
fn mutex_waiter_turning_critical_while_the_lock_is_free_is_handed_it() {
    // W waits for m while holding n; the holder of m releases it for
    // barging; the foreground task then waits for n, so W turns critical
    // while queued on m: whether m is free or re-taken at that moment, W
    // gets it and every inheritance ends.
    model(2, || {
        let m = Arc::new(Mutex::named("loom: free m", 0u32));
        let n = Arc::new(Mutex::named("loom: free n", ()));
        let holds_n = Arc::new(AtomicBool::new(false));
        let holder = {
            let m = m.clone();
            thread::spawn(move || {
                for _ in 0..2 {
                    *m.lock() += 1;
                }
                context::current()
            })
        };
        let w = {
            let (m, n, holds_n) = (m.clone(), n.clone(), holds_n.clone());
            thread::spawn(move || {
                let g = n.lock();
                holds_n.store(true, Ordering::SeqCst);
                *m.lock() += 1;
                drop(g);
                context::current()
            })
        };
        while !holds_n.load(Ordering::SeqCst) {
            thread::yield_now();
        }
        as_foreground(|| drop(n.lock()));
        for t in [holder.join().unwrap(), w.join().unwrap()] {
            assert_eq!(t.inherited_count(), 0, "inheritance revoked");
        }
        assert_eq!(*m.lock(), 3);
    });
}

#[test]
fn condvar_signal_is_never_lost() {
    model(4, || {
        let state = Arc::new((
            Mutex::named("loom: flag", false),
            Condvar::named("loom: cv"),
        ));
        let helper = {
            let state = state.clone();
            thread::spawn(move || {
                state.1.notify_one(); // a helper from history
                *state.0.lock() = true;
                state.1.notify_one();
                context::current()
            })
        };
        as_foreground(|| drop(state.1.wait_while(state.0.lock(), |set| !*set)));
        let helper = helper.join().unwrap();
        assert_eq!(helper.inherited_count(), 0, "helper revoked");
    });
}

#[test]
fn condvar_waiter_holding_a_lock_another_foreground_task_needs() {
    // F waits for m, held by B, which waits on a condvar signalled by H.
    model(3, || {
        let m = Arc::new(Mutex::named("loom: chain m", ()));
        let state = Arc::new((
            Mutex::named("loom: chain flag", false),
            Condvar::named("loom: chain cv"),
        ));
        let b = {
            let (m, state) = (m.clone(), state.clone());
            thread::spawn(move || {
                let g = m.lock();
                drop(state.1.wait_while(state.0.lock(), |set| !*set));
                drop(g);
                context::current()
            })
        };
        let h = {
            let state = state.clone();
            thread::spawn(move || {
                *state.0.lock() = true;
                state.1.notify_all();
                context::current()
            })
        };
        as_foreground(|| drop(m.lock()));
        for t in [b.join().unwrap(), h.join().unwrap()] {
            assert_eq!(t.inherited_count(), 0);
        }
    });
}

#[test]
fn event_set_is_never_lost() {
    model(4, || {
        let e = Arc::new(Event::named("loom: event"));
        let setter = {
            let e = e.clone();
            thread::spawn(move || {
                e.set();
                context::current()
            })
        };
        as_foreground(|| e.wait());
        assert!(e.is_set());
        assert_eq!(setter.join().unwrap().inherited_count(), 0);
    });
}

#[test]
fn rwlock_readers_and_a_foreground_writer() {
    model(3, || {
        let l = Arc::new(RwLock::named("loom: rw", 0u32));
        let reader = |l: Arc<RwLock<u32>>| {
            thread::spawn(move || {
                let v = *l.read();
                assert!(v <= 1);
                context::current()
            })
        };
        let r1 = reader(l.clone());
        let r2 = reader(l.clone());
        as_foreground(|| *l.write() += 1);
        for t in [r1.join().unwrap(), r2.join().unwrap()] {
            assert_eq!(t.inherited_count(), 0);
        }
        assert_eq!(*l.read(), 1);
    });
}

#[test]
fn rwlock_woken_writer_loses_to_a_relocking_writer() {
    // Like the mutex model: a writer re-takes the lock while the writer it
    // woke is on its way; a reader arrives meanwhile.
    model(2, || {
        let l = Arc::new(RwLock::named("loom: rw barge", 0u32));
        let relocker = {
            let l = l.clone();
            thread::spawn(move || {
                for _ in 0..2 {
                    *l.write() += 1;
                }
                context::current()
            })
        };
        let writer = {
            let l = l.clone();
            thread::spawn(move || {
                *l.write() += 1;
                context::current()
            })
        };
        assert!(*l.read() <= 3);
        for t in [relocker.join().unwrap(), writer.join().unwrap()] {
            assert_eq!(t.inherited_count(), 0);
        }
        assert_eq!(*l.read(), 3);
    });
}

#[test]
fn rwlock_critical_writer_is_never_barged_past() {
    model(3, || {
        let l = Arc::new(RwLock::named("loom: rw no barge", Vec::new()));
        let held = Arc::new(AtomicBool::new(false));
        let bg = {
            let (l, held) = (l.clone(), held.clone());
            thread::spawn(move || {
                let mut g = l.write();
                held.store(true, Ordering::SeqCst);
                until_inherits(); // the foreground writer is queued
                g.push("bg");
                drop(g);
                l.write().push("bg again"); // would barge if it could
            })
        };
        while !held.load(Ordering::SeqCst) {
            thread::yield_now();
        }
        as_foreground(|| l.write().push("fg"));
        bg.join().unwrap();
        assert_eq!(*l.read(), ["bg", "fg", "bg again"]);
    });
}
