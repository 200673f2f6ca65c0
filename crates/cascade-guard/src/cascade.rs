//! Convert mode's state machine (pure): what to do next with one object of a
//! Convert kind, given what the API server shows of it.
//!
//! It rests on two facts of the API server (research §1, and the
//! characterization tests in crates/local-cluster): a Foreground DELETE of a
//! custom resource that is already terminating adds `foregroundDeletion` and
//! starts the garbage collector's foreground cascade; and an explicit
//! Background DELETE strips it again. So cascade-guard holds every object of a
//! Convert kind with its own finalizer; once the object is being deleted
//! without `foregroundDeletion`, it re-issues the delete as Foreground; and it
//! lets go only when nothing is left to cascade.

use crate::policy::Shape;
use crate::policy::names::{FOREGROUND_CASCADE_FINALIZER, FOREGROUND_DELETION_FINALIZER};

/// What the watch shows of an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observed {
    pub deleting: bool,
    /// cascade-guard's finalizer is on it.
    pub held: bool,
    /// `foregroundDeletion` is on it: the garbage collector's cascade is running.
    pub in_foreground: bool,
    pub shape: Shape,
}

impl Observed {
    pub fn new(deleting: bool, finalizers: &[String], shape: Shape) -> Self {
        let has = |f: &str| finalizers.iter().any(|x| x == f);
        Self {
            deleting,
            held: has(FOREGROUND_CASCADE_FINALIZER),
            in_foreground: has(FOREGROUND_DELETION_FINALIZER),
            shape,
        }
    }
}

/// What cascade-guard itself remembers of an object's deletion (in memory; a
/// restart forgets it, which costs one redundant Foreground delete).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// Foreground deletes cascade-guard has issued for this object.
    pub conversions: u32,
}

/// What is known of an XR's blocking dependents: its composed resources
/// (`resourceRefs`) that still exist with a blocking owner reference to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dependents {
    NotLookedUp,
    Remaining(usize),
    None,
    /// The lookup cannot tell (no RBAC to read a composed kind, say): decide
    /// as for kinds that are not XRs.
    Unknowable,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Add cascade-guard's finalizer.
    Hold,
    /// Nothing to do until the object changes.
    Wait,
    /// Issue a Foreground DELETE with a UID precondition.
    Convert,
    /// Look up the XR's composed resources, then decide again.
    LookUpDependents,
    /// The cascade is done: remove cascade-guard's finalizer.
    Release,
}

/// The next step for one object.
///
/// When `foregroundDeletion` disappears after a conversion, either the garbage
/// collector finished (no blocking dependents left) or a Background DELETE
/// stripped it. For XRs, the composed resources tell which: any left means
/// convert again. For other kinds cascade-guard cannot see the dependents, so
/// it converts once more and lets go when the garbage collector clears
/// `foregroundDeletion` a second time: a finished cascade clears again at once,
/// a stripped one runs on until its dependents are gone.
pub fn next_step(observed: Observed, memory: Memory, dependents: Dependents) -> Step {
    if !observed.deleting {
        return if observed.held {
            Step::Wait
        } else {
            Step::Hold
        };
    }
    // Never add a finalizer to a terminating object (the API server refuses
    // it), and never act on a deletion cascade-guard does not hold.
    if !observed.held || observed.in_foreground {
        return Step::Wait;
    }
    if memory.conversions == 0 {
        return Step::Convert;
    }
    match observed.shape {
        Shape::CompositeResource => match dependents {
            Dependents::NotLookedUp => Step::LookUpDependents,
            Dependents::Remaining(_) => Step::Convert,
            Dependents::None => Step::Release,
            Dependents::Unknowable => confirmed(memory),
        },
        Shape::Other => confirmed(memory),
    }
}

/// Without sight of the dependents: let go once the garbage collector has
/// cleared `foregroundDeletion` after a second conversion.
fn confirmed(memory: Memory) -> Step {
    if memory.conversions >= 2 {
        Step::Release
    } else {
        Step::Convert
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(deleting: bool, held: bool, in_foreground: bool, shape: Shape) -> Observed {
        Observed {
            deleting,
            held,
            in_foreground,
            shape,
        }
    }

    #[test]
    fn the_table() {
        use Dependents::*;
        use Shape::*;
        use Step::*;
        let m = |conversions| Memory { conversions };
        // (deleting, held, foreground, shape, conversions, dependents) -> step
        let cases = [
            // Live objects: hold them, once.
            (false, false, false, CompositeResource, 0, NotLookedUp, Hold),
            (false, true, false, CompositeResource, 0, NotLookedUp, Wait),
            (false, false, false, Other, 0, NotLookedUp, Hold),
            // A live object that somehow carries foregroundDeletion is still just held.
            (false, false, true, Other, 0, NotLookedUp, Hold),
            // Deleting, not held (from before installation, or released): not ours.
            (true, false, false, CompositeResource, 0, NotLookedUp, Wait),
            (true, false, true, CompositeResource, 3, Remaining(2), Wait),
            // Deleting, held, in foreground: the garbage collector is at work.
            (true, true, true, CompositeResource, 0, NotLookedUp, Wait),
            (true, true, true, Other, 5, None, Wait),
            // Deleting, held, no foregroundDeletion, never converted: convert.
            (
                true,
                true,
                false,
                CompositeResource,
                0,
                NotLookedUp,
                Convert,
            ),
            (true, true, false, CompositeResource, 0, None, Convert),
            (true, true, false, Other, 0, NotLookedUp, Convert),
            // XR after a conversion: decided by its composed resources.
            (
                true,
                true,
                false,
                CompositeResource,
                1,
                NotLookedUp,
                LookUpDependents,
            ),
            (
                true,
                true,
                false,
                CompositeResource,
                1,
                Remaining(3),
                Convert,
            ),
            (
                true,
                true,
                false,
                CompositeResource,
                4,
                Remaining(1),
                Convert,
            ),
            (true, true, false, CompositeResource, 1, None, Release),
            // XR whose composed resources cannot be read: the confirming round.
            (true, true, false, CompositeResource, 1, Unknowable, Convert),
            (true, true, false, CompositeResource, 2, Unknowable, Release),
            // Other kinds: one confirming round, then let go.
            (true, true, false, Other, 1, NotLookedUp, Convert),
            (true, true, false, Other, 2, NotLookedUp, Release),
            (true, true, false, Other, 9, NotLookedUp, Release),
        ];
        for (deleting, held, fg, shape, conversions, deps, want) in cases {
            let got = next_step(obs(deleting, held, fg, shape), m(conversions), deps);
            assert_eq!(
                got, want,
                "deleting={deleting} held={held} fg={fg} {shape:?} conversions={conversions} {deps:?}"
            );
        }
    }

    #[test]
    fn observed_reads_the_finalizers() {
        let f = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let o = Observed::new(
            true,
            &f(&[
                "x",
                FOREGROUND_CASCADE_FINALIZER,
                FOREGROUND_DELETION_FINALIZER,
            ]),
            Shape::Other,
        );
        assert!(o.held && o.in_foreground && o.deleting);
        let o = Observed::new(false, &f(&["x"]), Shape::Other);
        assert!(!o.held && !o.in_foreground);
    }

    /// Walks the machine through the life of an XR whose cascade is cut short
    /// by a Background delete, with the API server's responses written out.
    #[test]
    fn a_stripped_cascade_is_converted_again_and_released_only_when_empty() {
        let xr = |deleting, held, fg| obs(deleting, held, fg, Shape::CompositeResource);
        let mut memory = Memory::default();
        assert_eq!(
            next_step(xr(false, false, false), memory, Dependents::NotLookedUp),
            Step::Hold
        );
        // Someone deletes it with Background: terminating, held, no foregroundDeletion.
        assert_eq!(
            next_step(xr(true, true, false), memory, Dependents::NotLookedUp),
            Step::Convert
        );
        memory.conversions += 1;
        // Foreground is running.
        assert_eq!(
            next_step(xr(true, true, true), memory, Dependents::NotLookedUp),
            Step::Wait
        );
        // Stripped by a second Background delete while two composed resources remain.
        assert_eq!(
            next_step(xr(true, true, false), memory, Dependents::NotLookedUp),
            Step::LookUpDependents
        );
        assert_eq!(
            next_step(xr(true, true, false), memory, Dependents::Remaining(2)),
            Step::Convert
        );
        memory.conversions += 1;
        // The garbage collector finishes and clears foregroundDeletion.
        assert_eq!(
            next_step(xr(true, true, false), memory, Dependents::None),
            Step::Release
        );
    }
}
