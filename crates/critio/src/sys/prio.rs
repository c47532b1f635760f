//! Kernel I/O priorities, typed: what a class of critio I/O is handed to the
//! kernel's block layer and the drive as.
//!
//! The kernel serves I/O priority classes in this order (on schedulers that
//! honour them: mq-deadline honours the class of each request, BFQ only the
//! thread's, `none` neither):
//!
//! | [`IoPriority`]      | kernel class | who may use it                  |
//! |---------------------|--------------|---------------------------------|
//! | `Realtime(0..=7)`   | RT           | `CAP_SYS_NICE` or `CAP_SYS_ADMIN` |
//! | `BestEffort(0..=7)` | BE           | anyone                          |
//! | `Idle`              | IDLE         | anyone                          |
//! | `None`              | none (0)     | anyone: "no priority of my own" |
//!
//! Defaults ([`ClassPriorities::default`], DESIGN.md section 3): critical
//! I/O is `Realtime(0)`, non-critical I/O is `Idle`. Where RT is refused for
//! lack of privilege, critical I/O falls back to `BestEffort(0)`
//! ([`IoPriority::fallback`]): still ahead of all default (BE 4) and idle
//! I/O, and never an error.
//!
//! Two ways to hand a priority over: per request (the io_uring SQE's
//! `ioprio`, used by the `uring` backend) and per thread
//! ([`set_thread_ioprio`], used by the `pool` backend's workers and, to
//! mirror a task's class into the kernel, by the context layer).

use std::io;

use serde::{Deserialize, Serialize};

use super::raw as sys;
use crate::class::Class;

/// A kernel I/O priority: a class and, for RT and BE, a level (0 = highest,
/// 7 = lowest).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IoPriority {
    /// No priority of its own: the kernel uses the thread's (derived from
    /// its CPU nice value unless set with [`set_thread_ioprio`]).
    None,
    /// Real-time class, served first; needs `CAP_SYS_NICE`/`CAP_SYS_ADMIN`.
    Realtime(u8),
    /// Best-effort class (the kernel's default is level 4).
    BestEffort(u8),
    /// Idle class: served when nothing else is pending.
    Idle,
}

/// A level outside 0..=7.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("I/O priority {priority:?} has level {level}; levels go from 0 (highest) to 7 (lowest)")]
pub struct InvalidLevel {
    /// The priority as given.
    pub priority: IoPriority,
    /// Its level.
    pub level: u8,
}

impl IoPriority {
    /// What critical I/O becomes where RT is refused.
    pub const RT_FALLBACK: IoPriority = IoPriority::BestEffort(0);

    /// Checks that the level is in 0..=7.
    pub fn check(self) -> Result<Self, InvalidLevel> {
        match self {
            IoPriority::Realtime(level) | IoPriority::BestEffort(level)
                if level >= sys::IOPRIO_LEVELS =>
            {
                Err(InvalidLevel {
                    priority: self,
                    level,
                })
            }
            _ => Ok(self),
        }
    }

    /// The kernel's 16-bit value (`class << 13 | level`).
    ///
    /// # Panics
    ///
    /// If the level is above 7 (see [`IoPriority::check`]).
    pub fn encode(self) -> u16 {
        if let Err(e) = self.check() {
            panic!("{e}");
        }
        match self {
            IoPriority::None => sys::ioprio_value(sys::IOPRIO_CLASS_NONE, 0),
            IoPriority::Realtime(l) => sys::ioprio_value(sys::IOPRIO_CLASS_RT, u16::from(l)),
            IoPriority::BestEffort(l) => sys::ioprio_value(sys::IOPRIO_CLASS_BE, u16::from(l)),
            IoPriority::Idle => sys::ioprio_value(sys::IOPRIO_CLASS_IDLE, 0),
        }
    }

    /// The priority a kernel value stands for; `None` (the `Option`) for a
    /// class the kernel does not define. Hint bits (3..12) are ignored.
    pub fn decode(value: u16) -> Option<IoPriority> {
        let level = (value & sys::IOPRIO_LEVEL_MASK) as u8;
        match value >> sys::IOPRIO_CLASS_SHIFT {
            sys::IOPRIO_CLASS_NONE => Some(IoPriority::None),
            sys::IOPRIO_CLASS_RT => Some(IoPriority::Realtime(level)),
            sys::IOPRIO_CLASS_BE => Some(IoPriority::BestEffort(level)),
            sys::IOPRIO_CLASS_IDLE => Some(IoPriority::Idle),
            _ => Option::None,
        }
    }

    /// Whether this is the real-time class (the one that needs privilege).
    pub fn is_realtime(self) -> bool {
        matches!(self, IoPriority::Realtime(_))
    }

    /// What to use instead when the kernel refuses this priority for lack
    /// of privilege: RT becomes [`IoPriority::RT_FALLBACK`]; every other
    /// class needs no privilege and stays.
    pub fn fallback(self) -> IoPriority {
        if self.is_realtime() {
            IoPriority::RT_FALLBACK
        } else {
            self
        }
    }
}

/// The kernel I/O priority of each critio class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClassPriorities {
    /// For critical I/O. Default: `Realtime(0)`, the highest there is.
    pub critical: IoPriority,
    /// For non-critical I/O. Default: `Idle`; `BestEffort(7)` is the milder
    /// alternative where idle I/O would starve (BFQ).
    pub non_critical: IoPriority,
}

impl Default for ClassPriorities {
    fn default() -> Self {
        Self {
            critical: IoPriority::Realtime(0),
            non_critical: IoPriority::Idle,
        }
    }
}

impl ClassPriorities {
    /// No priority for either class (the "none" baseline): the kernel uses
    /// each submitting thread's own.
    pub const NONE: ClassPriorities = ClassPriorities {
        critical: IoPriority::None,
        non_critical: IoPriority::None,
    };

    /// Priority *levels* within the best-effort class: BE 0 for critical,
    /// BE 7 for non-critical. For use under critio's own block layer, which
    /// orders the classes itself and guarantees background progress with its
    /// starvation timer: the kernel sees which I/O matters (BFQ uses levels),
    /// but does not enforce a strict order of its own. Strict classes
    /// (`Realtime` over `Idle`) under mq-deadline hold every lower-class
    /// request while *any* higher-class one is queued or in flight, so a
    /// continuous critical reader starves background writes however critio
    /// caps them (`critio bench real-device-mix` shows it side by side).
    pub const LEVELS: ClassPriorities = ClassPriorities {
        critical: IoPriority::BestEffort(0),
        non_critical: IoPriority::BestEffort(7),
    };

    /// What `ionice -c3` on the background threads gives: non-critical I/O
    /// in the idle class, critical I/O at best-effort 4, the level the
    /// kernel gives a thread whose priority nobody set (its nice 0). The
    /// kernel's I/O scheduler alone decides; critio only labels.
    pub const IDLE_BACKGROUND: ClassPriorities = ClassPriorities {
        critical: IoPriority::BestEffort(4),
        non_critical: IoPriority::Idle,
    };

    /// The priority of `class`.
    pub fn of(&self, class: Class) -> IoPriority {
        match class {
            Class::Critical => self.critical,
            Class::NonCritical => self.non_critical,
        }
    }

    /// Checks both levels.
    pub fn check(self) -> Result<Self, InvalidLevel> {
        self.critical.check()?;
        self.non_critical.check()?;
        Ok(self)
    }
}

/// Sets the kernel I/O priority of thread `tid` (a Linux thread id, as
/// `critio::context::Task::os_tid` gives; 0 = the calling thread). It
/// applies to every I/O the thread issues without a per-request priority,
/// including buffered writeback the kernel attributes to it.
///
/// Errors: `PermissionDenied` (EPERM) for `Realtime` without
/// `CAP_SYS_NICE`/`CAP_SYS_ADMIN` (see [`set_thread_ioprio_or_fallback`]),
/// `NotFound` (ESRCH) for a thread that does not exist.
pub fn set_thread_ioprio(tid: i32, priority: IoPriority) -> io::Result<()> {
    sys::ioprio_set(tid, priority.encode())
}

/// Like [`set_thread_ioprio`], but where RT is refused for lack of
/// privilege, sets [`IoPriority::fallback`] instead. Returns the priority
/// actually set.
pub fn set_thread_ioprio_or_fallback(tid: i32, priority: IoPriority) -> io::Result<IoPriority> {
    match set_thread_ioprio(tid, priority) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) && priority.is_realtime() => {
            let fallback = priority.fallback();
            set_thread_ioprio(tid, fallback)?;
            Ok(fallback)
        }
        other => other.map(|()| priority),
    }
}

/// The kernel I/O priority of thread `tid` (0 = the calling thread).
pub fn thread_ioprio(tid: i32) -> io::Result<IoPriority> {
    let value = sys::ioprio_get(tid)?;
    IoPriority::decode(value).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("ioprio_get returned {value:#x}, whose class is unknown"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_matches_the_kernel_layout() {
        assert_eq!(IoPriority::None.encode(), 0);
        assert_eq!(IoPriority::Realtime(0).encode(), 1 << 13);
        assert_eq!(IoPriority::Realtime(4).encode(), (1 << 13) | 4);
        assert_eq!(IoPriority::BestEffort(7).encode(), (2 << 13) | 7);
        assert_eq!(IoPriority::Idle.encode(), 3 << 13);
        for p in [
            IoPriority::None,
            IoPriority::Realtime(3),
            IoPriority::BestEffort(0),
            IoPriority::Idle,
        ] {
            assert_eq!(IoPriority::decode(p.encode()), Some(p));
        }
        assert_eq!(IoPriority::decode(4 << 13), Option::None);
        // Hint bits do not change the class or level.
        assert_eq!(
            IoPriority::decode((2 << 13) | (1 << 3) | 5),
            Some(IoPriority::BestEffort(5))
        );
    }

    #[test]
    fn bad_levels_are_clear_errors() {
        let e = IoPriority::BestEffort(8).check().unwrap_err();
        assert!(e.to_string().contains("from 0 (highest) to 7"), "{e}");
        assert!(ClassPriorities {
            critical: IoPriority::Realtime(9),
            ..ClassPriorities::default()
        }
        .check()
        .is_err());
        assert!(ClassPriorities::default().check().is_ok());
    }

    #[test]
    #[should_panic(expected = "levels go from 0")]
    fn encoding_a_bad_level_panics() {
        IoPriority::Realtime(8).encode();
    }

    #[test]
    fn fallback_only_changes_realtime() {
        assert_eq!(
            IoPriority::Realtime(5).fallback(),
            IoPriority::BestEffort(0)
        );
        assert_eq!(IoPriority::Idle.fallback(), IoPriority::Idle);
        assert_eq!(
            IoPriority::BestEffort(7).fallback(),
            IoPriority::BestEffort(7)
        );
    }

    #[test]
    fn a_thread_reads_back_what_it_set() {
        // Each test runs on its own thread, and the priority is per thread.
        for p in [IoPriority::Idle, IoPriority::BestEffort(6)] {
            set_thread_ioprio(0, p).unwrap();
            assert_eq!(thread_ioprio(0).unwrap(), p);
        }
        let tid = rustix::thread::gettid().as_raw_nonzero().get();
        set_thread_ioprio(tid, IoPriority::BestEffort(2)).unwrap();
        assert_eq!(thread_ioprio(tid).unwrap(), IoPriority::BestEffort(2));
        let got = set_thread_ioprio_or_fallback(0, IoPriority::Realtime(1)).unwrap();
        assert_eq!(thread_ioprio(0).unwrap(), got);
        set_thread_ioprio(0, IoPriority::None).unwrap();
    }
}
