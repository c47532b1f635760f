//! [`Joint`]: one command's completion assembled from several device
//! commands (parts). A part that went to the backing device may get a
//! second attempt, its reissue to the cache, which then decides it.
//!
//! ```text
//!   part 0 (cache run)      ──done──┐
//!   part 1 (metadata)       ──done──┤   all parts resolved: Finished(result, payload), once
//!   part 2 (backing run)    ──done──┼─>
//!          └ reissue attempt──done──┘
//!
//!   a reissued part:   reissue ok                    -> resolved ok; the original's completion
//!                                                       (before or after) is suppressed
//!                      reissue failed                -> resolved by the original's completion
//!                      original done, reissue flying -> held until the reissue is done
//! ```
//!
//! Why the reissue decides even when the original finishes first: its
//! copy is already (or about to be) the block's newest cached version; if
//! the command completed on the original, a newer write could go to the
//! backing device and then lose to that older cached copy.

use parking_lot::Mutex;

use super::error::dup;
use crate::device::DeviceError;

/// Which attempt at a part completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The part's own device command.
    Original,
    /// Its reissue to the cache.
    Reissue,
}

#[derive(Debug, Default)]
struct Part {
    /// The original is in flight.
    original: bool,
    /// A reissue is in flight.
    reissue: bool,
    /// A reissue was made (at most one per part).
    reissued: bool,
    /// The original's result, held while the reissue is in flight.
    held: Option<Result<(), DeviceError>>,
    resolved: bool,
}

struct State<T> {
    parts: Vec<Part>,
    remaining: usize,
    error: Option<DeviceError>,
    payload: Option<T>,
}

/// What one attempt's completion did.
pub(crate) enum Outcome<T> {
    /// The command is not finished.
    Pending,
    /// The last part resolved: the command's result and its payload.
    Finished(Result<(), DeviceError>, T),
}

/// Parts of one command, and what is handed back when all are done.
pub(crate) struct Joint<T> {
    state: Mutex<State<T>>,
}

impl<T> Joint<T> {
    /// `parts` parts, each with its original attempt in flight, carrying
    /// `payload`.
    pub(crate) fn new(parts: usize, payload: T) -> Joint<T> {
        assert!(parts > 0, "a command of no parts");
        let parts: Vec<Part> = (0..parts)
            .map(|_| Part {
                original: true,
                ..Part::default()
            })
            .collect();
        Joint {
            state: Mutex::new(State {
                remaining: parts.len(),
                parts,
                error: None,
                payload: Some(payload),
            }),
        }
    }

    /// Adds a reissue attempt to each of `parts` that is not resolved and
    /// was not reissued yet, and runs `f` on those parts and the payload,
    /// atomically (so the command cannot finish in between). `None` if no
    /// part took one.
    pub(crate) fn add_attempts<R>(
        &self,
        parts: &[usize],
        f: impl FnOnce(&[usize], &mut T) -> R,
    ) -> Option<(Vec<usize>, R)> {
        let mut st = self.state.lock();
        let chosen: Vec<usize> = (parts.iter().copied())
            .filter(|&i| !st.parts[i].resolved && !st.parts[i].reissued)
            .collect();
        if chosen.is_empty() {
            return None;
        }
        for &i in &chosen {
            let p = &mut st.parts[i];
            (p.reissue, p.reissued) = (true, true);
        }
        let payload = st.payload.as_mut().expect("a part is unresolved");
        let r = f(&chosen, payload);
        Some((chosen, r))
    }

    /// Whether part `i` is resolved.
    pub(crate) fn is_resolved(&self, i: usize) -> bool {
        self.state.lock().parts[i].resolved
    }

    /// Runs `f` on the payload (until the command finishes).
    pub(crate) fn with_payload<R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        self.state.lock().payload.as_mut().map(f)
    }

    /// `attempt` at part `i` completed with `result`. Also returns whether
    /// an original's completion was suppressed (a reissue decided the part).
    pub(crate) fn done(
        &self,
        i: usize,
        attempt: Attempt,
        result: Result<(), DeviceError>,
    ) -> (Outcome<T>, bool) {
        let mut st = self.state.lock();
        let p = &mut st.parts[i];
        let (decided, suppressed) = match attempt {
            Attempt::Original => {
                assert!(p.original, "part {i}: a second original completion");
                p.original = false;
                if p.resolved {
                    return (Outcome::Pending, true); // the reissue decided
                }
                if p.reissue {
                    p.held = Some(result);
                    return (Outcome::Pending, false);
                }
                (result, false)
            }
            Attempt::Reissue => {
                assert!(
                    p.reissue,
                    "part {i}: a reissue completion without a reissue"
                );
                p.reissue = false;
                let held = p.held.take();
                match (result, held) {
                    (Ok(()), held) => (Ok(()), held.is_some()),
                    (Err(_), Some(held)) => (held, false),
                    (Err(_), None) if p.original => return (Outcome::Pending, false),
                    (Err(e), None) => (Err(e), false),
                }
            }
        };
        (st.resolve(i, decided), suppressed)
    }
}

impl<T> State<T> {
    fn resolve(&mut self, i: usize, result: Result<(), DeviceError>) -> Outcome<T> {
        let p = &mut self.parts[i];
        assert!(!p.resolved, "part {i} resolved twice");
        p.resolved = true;
        if let Err(e) = result {
            self.error.get_or_insert(e);
        }
        self.remaining -= 1;
        if self.remaining > 0 {
            return Outcome::Pending;
        }
        let result = match &self.error {
            None => Ok(()),
            Some(e) => Err(dup(e)),
        };
        let payload = self.payload.take().expect("a command finishes once");
        Outcome::Finished(result, payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err() -> DeviceError {
        DeviceError::PoweredOff { device: "t".into() }
    }

    fn finished<T>(o: (Outcome<T>, bool)) -> Option<(bool, bool)> {
        match o {
            (Outcome::Finished(r, _), s) => Some((r.is_ok(), s)),
            (Outcome::Pending, _) => None,
        }
    }

    fn pending<T>(o: (Outcome<T>, bool)) -> Option<bool> {
        match o {
            (Outcome::Pending, s) => Some(s),
            _ => None,
        }
    }

    #[test]
    fn finishes_once_when_every_part_resolved() {
        let j = Joint::new(2, 7u32);
        assert_eq!(pending(j.done(0, Attempt::Original, Ok(()))), Some(false));
        match j.done(1, Attempt::Original, Ok(())).0 {
            Outcome::Finished(Ok(()), 7) => {}
            _ => panic!("should finish"),
        }
    }

    fn reissued() -> Joint<()> {
        let j = Joint::new(1, ());
        assert_eq!(j.add_attempts(&[0], |p, _| p.len()), Some((vec![0], 1)));
        assert_eq!(
            j.add_attempts(&[0], |p, _| p.len()),
            None,
            "one reissue per part"
        );
        j
    }

    #[test]
    fn a_reissue_decides_its_part_and_the_original_is_suppressed() {
        // The reissue first: the original's later completion is suppressed.
        let j = reissued();
        assert_eq!(
            finished(j.done(0, Attempt::Reissue, Ok(()))),
            Some((true, false))
        );
        assert_eq!(pending(j.done(0, Attempt::Original, Ok(()))), Some(true));
        // The original first: held (not finished) until the reissue is done.
        let j = reissued();
        assert_eq!(pending(j.done(0, Attempt::Original, Ok(()))), Some(false));
        assert_eq!(
            finished(j.done(0, Attempt::Reissue, Ok(()))),
            Some((true, true))
        );
    }

    #[test]
    fn a_failed_reissue_leaves_the_part_to_the_original() {
        let j = reissued();
        assert_eq!(
            pending(j.done(0, Attempt::Reissue, Err(err()))),
            Some(false)
        );
        assert_eq!(
            finished(j.done(0, Attempt::Original, Ok(()))),
            Some((true, false))
        );
        let j = reissued();
        assert_eq!(
            pending(j.done(0, Attempt::Original, Err(err()))),
            Some(false)
        );
        assert_eq!(
            finished(j.done(0, Attempt::Reissue, Err(err()))),
            Some((false, false))
        );
        let j = reissued();
        assert_eq!(pending(j.done(0, Attempt::Original, Ok(()))), Some(false));
        assert_eq!(
            finished(j.done(0, Attempt::Reissue, Err(err()))),
            Some((true, false))
        );
    }

    #[test]
    fn only_unresolved_parts_are_reissued() {
        let j = Joint::new(2, ());
        assert!(pending(j.done(0, Attempt::Original, Ok(()))).is_some());
        assert!(j.is_resolved(0) && !j.is_resolved(1));
        let r = j.add_attempts(&[0, 1], |p, _| p.to_vec());
        assert_eq!(r, Some((vec![1], vec![1])));
    }
}
