//! The real functions behind the interposed ones, found once with
//! `dlsym(RTLD_NEXT, name)` and cached.

use std::sync::atomic::{AtomicUsize, Ordering};

/// A lazily resolved symbol of the next object in the lookup order.
pub struct Real {
    name: &'static [u8],
    addr: AtomicUsize,
}

impl Real {
    /// `name` must end with a NUL byte.
    pub const fn new(name: &'static [u8]) -> Self {
        Self {
            name,
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
        // SAFETY: `name` is a NUL-terminated byte string with static
        // lifetime; dlsym only reads it.
        let found = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr().cast()) } as usize;
        self.addr.store(found, Ordering::Relaxed);
        found
    }
}

/// Declares a cached real function and a safe-to-call accessor that
/// returns it as a typed function pointer.
macro_rules! real_fn {
    ($vis:vis $name:ident = $sym:literal : fn($($arg:ty),*) -> $ret:ty) => {
        $vis fn $name() -> Option<unsafe extern "C" fn($($arg),*) -> $ret> {
            static R: $crate::real::Real = $crate::real::Real::new(concat!($sym, "\0").as_bytes());
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
