//! Scenario tests of priority inheritance: threads coordinated with
//! barriers and channels, asserting who is critical at each step and that
//! the inheritance is revoked exactly when the dependency ends.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::Duration;

use common::{wait_blocked, wait_until};
use critio::context::{self, Blocker, BlockingStatus, Class, TaskRef, WaitScope};
use critio::sync::{Condvar, Mutex, RwLock, SyncOptions};

/// Spawns a thread and returns its task once it has registered.
fn spawn_task(f: impl FnOnce() + Send + 'static) -> (TaskRef, JoinHandle<()>) {
    let (tx, rx) = channel();
    let handle = std::thread::spawn(move || {
        tx.send(context::current()).unwrap();
        f();
    });
    (rx.recv().unwrap(), handle)
}

fn gate() -> (Sender<()>, Receiver<()>) {
    channel()
}

#[test]
fn background_lock_holder_inherits_from_a_foreground_waiter_until_it_unlocks() {
    let lock = Arc::new(Mutex::named("scenario: holder", 0));
    let held = Arc::new(Barrier::new(2));
    let (release_tx, release_rx) = gate();
    let (holder, bg) = {
        let (lock, held) = (lock.clone(), held.clone());
        spawn_task(move || {
            let mut g = lock.lock();
            held.wait();
            release_rx.recv().unwrap();
            assert_eq!(
                context::current_class(),
                Class::Critical,
                "inherits while holding"
            );
            *g += 1;
            drop(g);
            assert_eq!(
                context::current_class(),
                Class::NonCritical,
                "revoked at unlock"
            );
        })
    };
    held.wait();
    assert_eq!(holder.class(), Class::NonCritical);

    let (waiter, fg) = {
        let lock = lock.clone();
        spawn_task(move || {
            context::set_foreground();
            *lock.lock() += 1;
        })
    };
    wait_blocked(
        &waiter,
        BlockingStatus::Lock {
            name: "scenario: holder",
        },
    );
    wait_until("the holder inherits", || holder.is_critical());
    assert_eq!(holder.inherited_count(), 1);
    assert!(!holder.is_foreground());

    release_tx.send(()).unwrap();
    bg.join().unwrap();
    fg.join().unwrap();
    assert_eq!(holder.inherited_count(), 0);
    assert_eq!(waiter.blocking_status(), None);
    assert_eq!(*lock.lock(), 2);
}

#[test]
fn a_background_waiter_does_not_make_the_holder_critical() {
    let lock = Arc::new(Mutex::named("scenario: bg waiter", ()));
    let guard = lock.lock();
    let (waiter, bg) = {
        let lock = lock.clone();
        spawn_task(move || drop(lock.lock()))
    };
    wait_blocked(
        &waiter,
        BlockingStatus::Lock {
            name: "scenario: bg waiter",
        },
    );
    assert_eq!(context::current_class(), Class::NonCritical);
    drop(guard);
    bg.join().unwrap();
}

#[test]
fn inheritance_switched_off_leaves_the_holder_non_critical() {
    let opts = SyncOptions::named("scenario: no inherit").inherit(false);
    let lock = Arc::new(Mutex::with_options((), opts));
    let guard = lock.lock();
    let (waiter, fg) = {
        let lock = lock.clone();
        spawn_task(move || {
            let _fg = context::foreground();
            drop(lock.lock());
        })
    };
    wait_blocked(
        &waiter,
        BlockingStatus::Lock {
            name: "scenario: no inherit",
        },
    );
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(context::current_class(), Class::NonCritical);
    drop(guard);
    fg.join().unwrap();
}

#[test]
fn a_critical_waiter_is_handed_the_lock_before_a_barging_non_critical_locker() {
    const NAME: &str = "scenario: no barging";
    let lock = Arc::new(Mutex::named(NAME, Vec::new()));
    let held = Arc::new(Barrier::new(2));
    let (release_tx, release_rx) = gate();
    let (holder, bg) = {
        let (lock, held) = (lock.clone(), held.clone());
        spawn_task(move || {
            let mut g = lock.lock();
            held.wait();
            release_rx.recv().unwrap();
            g.push("holder");
            drop(g);
            // Running, and re-taking the lock at once: it would barge past
            // a woken non-critical waiter.
            lock.lock().push("holder again");
        })
    };
    held.wait();
    // Another non-critical task trying to take the lock the whole time.
    let barger = {
        let lock = lock.clone();
        std::thread::spawn(move || loop {
            if let Some(mut g) = lock.try_lock() {
                g.push("barger");
                return;
            }
            std::thread::yield_now();
        })
    };
    let (waiter, fg) = {
        let lock = lock.clone();
        spawn_task(move || {
            context::set_foreground();
            lock.lock().push("foreground");
        })
    };
    wait_blocked(&waiter, BlockingStatus::Lock { name: NAME });
    wait_until("the holder inherits", || holder.is_critical());

    release_tx.send(()).unwrap();
    bg.join().unwrap();
    fg.join().unwrap();
    barger.join().unwrap();
    let order = lock.lock().clone();
    assert_eq!(
        order[..2],
        ["holder", "foreground"],
        "the critical waiter went first: {order:?}"
    );
    assert_eq!(order.len(), 4, "{order:?}");
    assert_eq!(holder.inherited_count(), 0);
}

#[test]
fn every_reader_of_an_rwlock_inherits_and_each_is_revoked_as_it_leaves() {
    let lock = Arc::new(RwLock::named("scenario: rw", 0));
    let reading = Arc::new(Barrier::new(3));
    let mut readers = Vec::new();
    let mut releases = Vec::new();
    for _ in 0..2 {
        let (lock, reading) = (lock.clone(), reading.clone());
        let (tx, rx) = gate();
        releases.push(tx);
        readers.push(spawn_task(move || {
            let g = lock.read();
            reading.wait();
            rx.recv().unwrap();
            drop(g);
            assert_eq!(context::current_class(), Class::NonCritical);
        }));
    }
    reading.wait();
    let (writer, fg) = {
        let lock = lock.clone();
        spawn_task(move || {
            context::set_foreground();
            *lock.write() += 1;
        })
    };
    wait_blocked(
        &writer,
        BlockingStatus::Lock {
            name: "scenario: rw",
        },
    );
    for (r, _) in &readers {
        wait_until("both readers inherit", || r.is_critical());
        assert_eq!(r.inherited_count(), 1);
    }

    releases[0].send(()).unwrap();
    wait_until("first reader revoked", || !readers[0].0.is_critical());
    assert!(readers[1].0.is_critical(), "second reader still holds");
    assert_eq!(
        writer.blocking_status(),
        Some(BlockingStatus::Lock {
            name: "scenario: rw"
        })
    );

    releases[1].send(()).unwrap();
    fg.join().unwrap();
    for (r, h) in readers {
        h.join().unwrap();
        assert_eq!(r.inherited_count(), 0);
    }
    assert_eq!(*lock.read(), 1);
}

/// A condvar with its predicate.
struct Signal {
    flag: Mutex<bool>,
    cv: Condvar,
}

impl Signal {
    fn new(name: &'static str, window: Duration) -> Arc<Self> {
        Arc::new(Self {
            flag: Mutex::named("scenario: signal flag", false),
            cv: Condvar::with_options(SyncOptions::named(name).helper_window(window)),
        })
    }

    fn wait(&self) {
        drop(self.cv.wait_while(self.flag.lock(), |set| !*set));
    }

    fn fire(&self) {
        *self.flag.lock() = true;
        self.cv.notify_all();
    }
}

#[test]
fn a_condvar_helper_inherits_until_it_signals() {
    let sig = Signal::new("scenario: cv signal", Duration::from_secs(30));
    let (go_tx, go_rx) = gate();
    let (helper, h) = {
        let sig = sig.clone();
        spawn_task(move || {
            sig.cv.notify_all(); // signals once: now a helper
            go_rx.recv().unwrap();
            assert_eq!(context::current_class(), Class::Critical);
            sig.fire();
            assert_eq!(
                context::current_class(),
                Class::NonCritical,
                "revoked at signal"
            );
        })
    };
    wait_until("the helper registers", || {
        sig.cv.helpers() == vec![helper.id()]
    });
    let (waiter, fg) = {
        let sig = sig.clone();
        spawn_task(move || {
            context::set_foreground();
            sig.wait();
        })
    };
    wait_blocked(
        &waiter,
        BlockingStatus::Condvar {
            name: "scenario: cv signal",
        },
    );
    wait_until("the helper inherits", || helper.is_critical());
    go_tx.send(()).unwrap();
    h.join().unwrap();
    fg.join().unwrap();
    assert_eq!(helper.inherited_count(), 0);
}

#[test]
fn a_condvar_helper_that_stops_signalling_is_dropped_after_the_window() {
    let window = critio::sync::HELPER_WINDOW_DEFAULT;
    let sig = Signal::new("scenario: cv window", window);
    let (go_tx, go_rx) = gate();
    let (helper, h) = {
        let sig = sig.clone();
        spawn_task(move || {
            sig.cv.notify_all();
            go_rx.recv().unwrap();
            sig.fire();
        })
    };
    wait_until("the helper registers", || {
        sig.cv.helpers() == vec![helper.id()]
    });
    let dropped_before = critio::metrics::global().snapshot().helpers_dropped;
    let (waiter, fg) = {
        let sig = sig.clone();
        spawn_task(move || {
            context::set_foreground();
            sig.wait();
        })
    };
    wait_blocked(
        &waiter,
        BlockingStatus::Condvar {
            name: "scenario: cv window",
        },
    );
    wait_until("the helper inherits within the window", || {
        helper.is_critical()
    });
    let inherited_at = std::time::Instant::now();
    wait_until("the helper is dropped after the window", || {
        !helper.is_critical() && sig.cv.helpers().is_empty()
    });
    assert!(
        inherited_at.elapsed() < 2 * window,
        "dropped about one window after its last signal"
    );
    assert!(critio::metrics::global().snapshot().helpers_dropped > dropped_before);
    assert_eq!(helper.inherited_count(), 0);
    assert_eq!(
        waiter.blocking_status(),
        Some(BlockingStatus::Condvar {
            name: "scenario: cv window"
        })
    );

    go_tx.send(()).unwrap(); // signalling again makes it a helper again
    h.join().unwrap();
    fg.join().unwrap();
    assert_eq!(sig.cv.helpers(), vec![helper.id()]);
}

#[test]
fn an_explicit_helper_is_never_dropped_by_the_window() {
    let sig = Signal::new("scenario: cv explicit", Duration::from_millis(50));
    let (go_tx, go_rx) = gate();
    let (helper, h) = {
        let sig = sig.clone();
        spawn_task(move || {
            go_rx.recv().unwrap();
            sig.fire();
        })
    };
    sig.cv.register_helper(helper.clone());
    let (waiter, fg) = {
        let sig = sig.clone();
        spawn_task(move || {
            let _fg = context::foreground();
            sig.wait();
        })
    };
    wait_blocked(
        &waiter,
        BlockingStatus::Condvar {
            name: "scenario: cv explicit",
        },
    );
    wait_until("the explicit helper inherits", || helper.is_critical());
    std::thread::sleep(Duration::from_millis(200));
    assert!(helper.is_critical(), "explicit helper outlived the window");
    go_tx.send(()).unwrap();
    h.join().unwrap();
    fg.join().unwrap();
    assert_eq!(helper.inherited_count(), 0);
    sig.cv.unregister_helper(helper.id());
    assert!(sig.cv.helpers().is_empty());
}

/// A fake admission stage: the non-critical pool is full for good, the
/// critical pool always has room. Resolving a waiter that is critical admits
/// it (wakes it to retry as critical), as the block and cache layers will.
#[derive(Default)]
struct FakeAdmission {
    admitted_as_critical: AtomicBool,
    resolutions: AtomicUsize,
}

impl Blocker for FakeAdmission {
    fn resolve(&self, waiter: &TaskRef, _flipped: &mut Vec<TaskRef>) {
        self.resolutions.fetch_add(1, Ordering::SeqCst);
        if waiter.is_critical() {
            self.admitted_as_critical.store(true, Ordering::SeqCst);
            waiter.unpark();
        }
    }
}

impl FakeAdmission {
    fn enter(self: &Arc<Self>) {
        let status = BlockingStatus::Admission {
            stage: "admission: fake",
        };
        let scope = WaitScope::enter(status, self.clone());
        while !self.admitted_as_critical.load(Ordering::SeqCst) {
            std::thread::park();
        }
        drop(scope);
    }
}

/// Paper 000, Section 4.4: a foreground task blocked on a mutex held by a
/// task waiting on a condvar whose helper waits on another mutex held by a
/// task blocked in an admission stage. The chain resolves to the last task,
/// and unwinds exactly.
#[test]
fn the_four_step_chain_of_paper_000_resolves_to_the_last_task() {
    let m1 = Arc::new(Mutex::named("chain: m1 (inode)", ()));
    let m2 = Arc::new(Mutex::named("chain: m2 (handle)", ()));
    let journal = Signal::new("chain: journal", Duration::from_secs(30));
    let admission = Arc::new(FakeAdmission::default());
    let (b3_go_tx, b3_go_rx) = gate();

    // B3 holds m2 and blocks in admission; once admitted it waits for the
    // test's go, then releases m2.
    let b3_has_m2 = Arc::new(Barrier::new(2));
    let (b3, b3_h) = {
        let (m2, adm, ready) = (m2.clone(), admission.clone(), b3_has_m2.clone());
        spawn_task(move || {
            let g = m2.lock();
            ready.wait();
            adm.enter();
            b3_go_rx.recv().unwrap();
            drop(g);
            assert_eq!(
                context::current_class(),
                Class::NonCritical,
                "B3 revoked at unlock"
            );
        })
    };
    b3_has_m2.wait();
    wait_blocked(
        &b3,
        BlockingStatus::Admission {
            stage: "admission: fake",
        },
    );

    // B2 is the journal's helper (it has signalled before) and needs m2.
    let (b2, b2_h) = {
        let (m2, journal) = (m2.clone(), journal.clone());
        spawn_task(move || {
            journal.cv.notify_all();
            let g = m2.lock();
            assert_eq!(
                context::current_class(),
                Class::Critical,
                "B2 helps a critical waiter"
            );
            journal.fire();
            assert_eq!(
                context::current_class(),
                Class::NonCritical,
                "B2 revoked at signal"
            );
            drop(g);
        })
    };
    wait_blocked(
        &b2,
        BlockingStatus::Lock {
            name: "chain: m2 (handle)",
        },
    );
    assert_eq!(journal.cv.helpers(), vec![b2.id()]);

    // B1 holds m1 and waits for the journal.
    let b1_has_m1 = Arc::new(Barrier::new(2));
    let (b1, b1_h) = {
        let (m1, journal, ready) = (m1.clone(), journal.clone(), b1_has_m1.clone());
        spawn_task(move || {
            let g = m1.lock();
            ready.wait();
            journal.wait();
            assert_eq!(
                context::current_class(),
                Class::Critical,
                "B1 still blocks F"
            );
            drop(g);
            assert_eq!(
                context::current_class(),
                Class::NonCritical,
                "B1 revoked at unlock"
            );
        })
    };
    b1_has_m1.wait();
    wait_blocked(
        &b1,
        BlockingStatus::Condvar {
            name: "chain: journal",
        },
    );

    for t in [&b1, &b2, &b3] {
        assert_eq!(
            t.class(),
            Class::NonCritical,
            "nobody is critical before F arrives"
        );
    }
    assert!(!admission.admitted_as_critical.load(Ordering::SeqCst));

    // F arrives.
    let (f, f_h) = {
        let m1 = m1.clone();
        spawn_task(move || {
            context::set_foreground();
            drop(m1.lock());
        })
    };
    wait_blocked(
        &f,
        BlockingStatus::Lock {
            name: "chain: m1 (inode)",
        },
    );
    wait_until("the chain reaches B3's admission stage", || {
        admission.admitted_as_critical.load(Ordering::SeqCst)
    });
    for (name, t) in [("B1", &b1), ("B2", &b2), ("B3", &b3)] {
        assert_eq!(
            t.class(),
            Class::Critical,
            "{name} on the chain is critical"
        );
        assert_eq!(t.inherited_count(), 1, "{name} inherits once");
    }

    // Unwind: B3 releases m2, B2 signals, B1 releases m1, F runs.
    b3_go_tx.send(()).unwrap();
    for h in [b3_h, b2_h, b1_h, f_h] {
        h.join().unwrap();
    }
    for t in [&b1, &b2, &b3] {
        assert_eq!(t.inherited_count(), 0, "every inheritance revoked");
    }
}

/// A fake I/O: promotion is one-way, like a real request's.
#[derive(Default)]
struct FakeIo {
    promoted: AtomicBool,
    done: AtomicBool,
}

impl Blocker for FakeIo {
    fn resolve(&self, waiter: &TaskRef, _flipped: &mut Vec<TaskRef>) {
        if waiter.is_critical() {
            self.promoted.store(true, Ordering::SeqCst);
        }
    }
}

#[test]
fn a_lock_owner_waiting_for_io_promotes_it_when_a_foreground_task_waits_for_the_lock() {
    let lock = Arc::new(Mutex::named("io chain: lock", ()));
    let io = Arc::new(FakeIo::default());
    let locked = Arc::new(Barrier::new(2));
    let (owner, owner_h) = {
        let (lock, io, locked) = (lock.clone(), io.clone(), locked.clone());
        spawn_task(move || {
            let g = lock.lock();
            locked.wait();
            let status = BlockingStatus::Io {
                id: 7,
                point: "io chain: read",
            };
            let scope = WaitScope::enter(status, io.clone());
            while !io.done.load(Ordering::SeqCst) {
                std::thread::park_timeout(Duration::from_millis(1));
            }
            drop(scope);
            drop(g);
        })
    };
    locked.wait();
    wait_blocked(
        &owner,
        BlockingStatus::Io {
            id: 7,
            point: "io chain: read",
        },
    );
    std::thread::sleep(Duration::from_millis(10));
    assert!(
        !io.promoted.load(Ordering::SeqCst),
        "no critical waiter yet"
    );
    let (_f, f_h) = {
        let lock = lock.clone();
        spawn_task(move || {
            context::set_foreground();
            drop(lock.lock());
        })
    };
    wait_until("the owner's I/O is promoted", || {
        io.promoted.load(Ordering::SeqCst)
    });
    io.done.store(true, Ordering::SeqCst);
    owner_h.join().unwrap();
    f_h.join().unwrap();
    assert_eq!(owner.inherited_count(), 0);
}

#[test]
fn a_critical_task_waiting_for_io_promotes_it_at_once() {
    let io = Arc::new(FakeIo::default());
    let _fg = context::foreground();
    let status = BlockingStatus::Io {
        id: 9,
        point: "io: direct",
    };
    let scope = WaitScope::enter(status, io.clone());
    assert!(io.promoted.load(Ordering::SeqCst));
    assert_eq!(context::current().blocking_status(), Some(status));
    drop(scope);
    assert_eq!(context::current().blocking_status(), None);
    let h = critio::metrics::global().wait_histogram("io: direct", Class::Critical);
    assert_eq!(h.count(), 1, "the wait is recorded at its wait point");
}
