//! The two I/O classes of request-centric prioritization (paper 000,
//! Section 3): critical and non-critical.
//!
//! Every layer speaks in these two classes: `context` decides which one a
//! task is in now, and `sync`, `cache`, `log`, `block`, `nvwc`, `device`
//! and `metrics` serve, queue and count by it. The type lives in this leaf
//! module, which depends on nothing else in the crate, so that the layers
//! below `context` can name a class without depending on the layer that
//! computes it. `critio::context::Class` and `critio::Class` re-export it.

use std::fmt;

use serde::Serialize;

/// The two I/O classes of request-centric prioritization (paper 000,
/// Section 3): two are enough.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Class {
    /// On the critical path of a request: served first at every layer.
    Critical,
    /// Everything else: served when no critical work waits, never starved.
    NonCritical,
}

impl Class {
    /// Both classes, critical first (the order every table prints them in).
    pub const ALL: [Class; 2] = [Class::Critical, Class::NonCritical];

    /// A short stable name, used in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Critical => "critical",
            Class::NonCritical => "non-critical",
        }
    }

    /// `0` for critical, `1` for non-critical: an index for per-class arrays.
    pub fn index(self) -> usize {
        match self {
            Class::Critical => 0,
            Class::NonCritical => 1,
        }
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_indices_are_stable() {
        assert_eq!(Class::ALL.map(Class::index), [0, 1]);
        assert_eq!(Class::Critical.to_string(), "critical");
        assert_eq!(Class::NonCritical.as_str(), "non-critical");
    }
}
