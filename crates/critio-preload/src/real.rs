//! The real functions behind the interposed ones, found once with
//! `dlsym(RTLD_NEXT, name)` and cached.

use std::sync::atomic::{AtomicUsize, Ordering};

/// A lazily resolved symbol of the next object in the lookup order.
pub struct Real {
    name: &'static [u8],
    version: Option<&'static [u8]>,
    addr: AtomicUsize,
}

impl Real {
    /// `name` must end with a NUL byte.
    pub const fn new(name: &'static [u8]) -> Self {
        Self {
            name,
            version: None,
            addr: AtomicUsize::new(0),
        }
    }

    /// A symbol glibc defines in several versions: `version` (NUL-ended)
    /// is asked for first (`dlvsym`), since plain `dlsym` may return an
    /// old one (glibc's condition variables before 2.3.2 are a different
    /// object); where that version does not exist (other architectures
    /// start later), the default one.
    pub const fn versioned(name: &'static [u8], version: &'static [u8]) -> Self {
        Self {
            name,
            version: Some(version),
            addr: AtomicUsize::new(0),
        }
    }

    /// The symbol's address (0 if no later object defines it).
    pub fn addr(&self) -> usize {
        let a = self.addr.load(Ordering::Relaxed);
        if a != 0 {
            return a;
        }
        debug_assert_eq!(self.name.last(), Some(&0));
        let versioned = self.version.map_or(0, |v| {
            debug_assert_eq!(v.last(), Some(&0));
            // SAFETY: `name` and `v` are NUL-terminated byte strings with
            // static lifetime; dlvsym only reads them.
            unsafe {
                libc::dlvsym(
                    libc::RTLD_NEXT,
                    self.name.as_ptr().cast(),
                    v.as_ptr().cast(),
                ) as usize
            }
        });
        let found = if versioned != 0 {
            versioned
        } else {
            // SAFETY: `name` is a NUL-terminated byte string with static
            // lifetime; dlsym only reads it.
            unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr().cast()) as usize }
        };
        self.addr.store(found, Ordering::Relaxed);
        found
    }
}

/// Declares a cached real function and a safe-to-call accessor that
/// returns it as a typed function pointer.
macro_rules! real_fn {
    ($vis:vis $name:ident = $sym:literal : fn($($arg:ty),*) -> $ret:ty) => {
        $crate::real::real_fn!(@ $vis $name, $crate::real::Real::new(concat!($sym, "\0").as_bytes()), fn($($arg),*) -> $ret);
    };
    ($vis:vis $name:ident = $sym:literal @ $ver:literal : fn($($arg:ty),*) -> $ret:ty) => {
        $crate::real::real_fn!(@ $vis $name, $crate::real::Real::versioned(concat!($sym, "\0").as_bytes(), concat!($ver, "\0").as_bytes()), fn($($arg),*) -> $ret);
    };
    (@ $vis:vis $name:ident, $real:expr, fn($($arg:ty),*) -> $ret:ty) => {
        $vis fn $name() -> Option<unsafe extern "C" fn($($arg),*) -> $ret> {
            static R: $crate::real::Real = $real;
            let a = R.addr();
            if a == 0 {
                return None;
            }
            // SAFETY: `a` is the address libc's dynamic linker resolved for
            // this very symbol name, whose C prototype is the one declared
            // here (the POSIX signature).
            Some(unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($arg),*) -> $ret>(a) })
        }
    };
}
pub(crate) use real_fn;
