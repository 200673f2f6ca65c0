//! Convert mode's state machine (pure): what to do next with one object of a
//! Convert kind, given what the API server shows of it.
//!
//! It rests on two facts of the API server (docs/deletion-semantics.md §1, and the
//! characterization tests in crates/local-cluster): a Foreground DELETE of a
//! custom resource that is already terminating adds `foregroundDeletion` and
//! starts the garbage collector's foreground cascade; and an explicit
//! Background DELETE strips it again. So cascade-guard holds every object of a
//! Convert kind with its own finalizer; once the object is being deleted
//! without `foregroundDeletion`, it re-issues the delete as Foreground; and it
//! lets go only when nothing is left to cascade.
//!
//! An object that carries the finalizer is followed to the end whatever
//! happens to its policy: relabelled out of a selector, or its kind no longer
//! Convert, a live object is let go, and a deleting one is carried through its
//! cascade first ([`Reach`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kube_core::{Selector, SelectorExt};

use crate::Shape;
use crate::names::{FOREGROUND_CASCADE_FINALIZER, FOREGROUND_DELETION_FINALIZER, ORPHAN_FINALIZER};

/// Which live objects of a kind cascade-guard holds.
#[derive(Clone, Debug, PartialEq)]
pub enum Reach {
    /// Every object (a Convert policy without a selector).
    Every,
    /// Objects any of these selectors match (one per Convert policy).
    Selected(Vec<Selector>),
    /// None: the kind is no longer Convert, and cascade-guard only finishes
    /// what it holds.
    Nothing,
}

impl Reach {
    pub fn covers(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Reach::Every => true,
            Reach::Selected(selectors) => selectors.iter().any(|s| s.matches(labels)),
            Reach::Nothing => false,
        }
    }
}

/// What the watch shows of an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observed {
    pub deleting: bool,
    /// cascade-guard's finalizer is on it.
    pub held: bool,
    /// `foregroundDeletion` is on it: the garbage collector's cascade is running.
    pub in_foreground: bool,
    /// `orphan` is on it: someone deleted it with propagationPolicy Orphan
    /// (admission lets that through only with break-glass).
    pub orphaning: bool,
    /// Within the [`Reach`] of a Convert policy.
    pub in_reach: bool,
    pub shape: Shape,
}

impl Observed {
    pub fn new(deleting: bool, finalizers: &[String], in_reach: bool, shape: Shape) -> Self {
        let has = |f: &str| finalizers.iter().any(|x| x == f);
        Self {
            deleting,
            held: has(FOREGROUND_CASCADE_FINALIZER),
            in_foreground: has(FOREGROUND_DELETION_FINALIZER),
            orphaning: has(ORPHAN_FINALIZER),
            in_reach,
            shape,
        }
    }
}

/// What cascade-guard itself remembers of an object's deletion (in memory,
/// and whether it converted the delete on the object itself, as
/// [`crate::names::CONVERTED_ANNOTATION`]: see [`Memory::restored`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// Foreground deletes cascade-guard has issued for this object.
    pub conversions: u32,
    /// When it issued the last one.
    pub last_conversion: Option<Instant>,
    /// It was seen being deleted with Orphan: once the garbage collector has
    /// orphaned the dependents it drops `orphan`, and the object must still
    /// not be converted.
    pub orphaned: bool,
    /// It was seen in the garbage collector's foreground cascade before
    /// cascade-guard converted it: the delete was foreground already (a
    /// user's, Crossplane's replay, or the garbage collector's own for a
    /// dependent in a foreground cascade), which counts as the first
    /// conversion. Without it, cascade-guard would answer the garbage
    /// collector's clearing of `foregroundDeletion` with a Foreground delete
    /// of an object with nothing left, and wait on the garbage collector to
    /// clear it a second time, which a soak saw it never do.
    pub foreground_from_the_start: bool,
    /// When cascade-guard first saw the foreground cascade running on with
    /// nothing it can see left to wait for: an XR with no composed resource
    /// left, or any other kind, whose dependents it cannot see, from the
    /// cascade's start. `None` while it waits for something, or out of one.
    pub quiet_since: Option<Instant>,
    /// Cascades cascade-guard restarted because the garbage collector seemed
    /// to have missed their start ([`Step::RestartCascade`]), and when it
    /// last did.
    pub restarts: u32,
    pub last_restart: Option<Instant>,
    /// It removed `foregroundDeletion` to restart the cascade and has not yet
    /// seen its Foreground delete go through: convert, whatever else it
    /// remembers, or the object would be let go without a cascade.
    pub restarting: bool,
}

impl Memory {
    /// Foreground cascades started on the object: cascade-guard's
    /// conversions, and the foreground delete it was first seen in.
    pub fn cascades(&self) -> u32 {
        self.conversions + u32::from(self.foreground_from_the_start)
    }

    /// Moves the quiet clock on with what one look saw: it starts when a
    /// foreground cascade shows nothing cascade-guard can see left, and stops
    /// when the cascade waits for something again or is no longer running.
    /// An XR's dependents not looked up yet leave it as it is.
    pub fn seen(self, observed: Observed, dependents: Dependents, now: Instant) -> Self {
        let running = observed.deleting && observed.held && observed.in_foreground;
        let nothing_seen_left = match observed.shape {
            Shape::CompositeResource => match dependents {
                Dependents::NotLookedUp => return self,
                Dependents::Remaining(_) => false,
                Dependents::None | Dependents::Unknowable => true,
            },
            Shape::Other | Shape::Claim => true,
        };
        let quiet_since = if running && nothing_seen_left {
            Some(self.quiet_since.unwrap_or(now))
        } else {
            None
        };
        Memory {
            quiet_since,
            ..self
        }
    }

    /// The last conversion was less than [`JUST_CONVERTED`] before `now`.
    pub fn just_converted(&self, now: Instant) -> bool {
        self.last_conversion
            .is_some_and(|at| now.saturating_duration_since(at) < JUST_CONVERTED)
    }

    /// When a quiet foreground cascade is due to be restarted: `after` a
    /// quiet spell starts, then after growing waits from the last restart
    /// ([`restart_interval`]).
    pub fn restart_due(&self, after: Duration) -> Option<Instant> {
        let quiet = self.quiet_since?;
        Some(match self.last_restart {
            Some(last) if last >= quiet => last + restart_interval(self.restarts).max(after),
            _ => quiet + after,
        })
    }

    /// The memory of a replica that may not have seen the conversion (a
    /// restart, a new leader): an object marked converted counts as converted
    /// once, so that the state machine goes on from a finished or cut-short
    /// cascade instead of starting it again. A replica that saw the cascade
    /// from its start (and marked it) has counted it already.
    pub fn restored(self, marked_converted: bool) -> Self {
        if marked_converted && self.cascades() == 0 {
            Memory {
                conversions: 1,
                ..self
            }
        } else {
            self
        }
    }
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

/// How far cascade-guard carries a deleting object before it lets go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carry {
    /// Until nothing is left to cascade (the controller), restarting a
    /// quiet foreground cascade after `restart_after` ([`Step::RestartCascade`];
    /// `None`: never).
    ToTheEnd { restart_after: Option<Duration> },
    /// Until the garbage collector's foreground cascade holds it: `uninstall`,
    /// where cascade-guard is leaving, and the garbage collector keeps the
    /// object until its blocking dependents are gone, as for any foreground
    /// delete.
    ToTheGarbageCollector,
}

/// Why cascade-guard removes its finalizer without a cascade to finish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LetGo {
    /// A live object no Convert policy reaches any more.
    OutOfReach,
    /// Deleted with Orphan on purpose (break-glass): its dependents are to
    /// stay, so there is no cascade to hold it for.
    Orphaning,
    /// In the garbage collector's foreground cascade, and cascade-guard is
    /// being uninstalled ([`Carry::ToTheGarbageCollector`]).
    HandedOver,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Add cascade-guard's finalizer.
    AddFinalizer,
    /// Nothing to do until the object changes.
    Wait,
    /// Issue a Foreground DELETE with a UID precondition.
    Convert,
    /// Convert again, but not before this much time: the cascade keeps being
    /// cut short (a stale garbage collector clears `foregroundDeletion` at
    /// once), and converting at the rate of the watch would flood the API.
    Backoff(Duration),
    /// Look up the XR's composed resources, then decide again.
    LookUpDependents,
    /// The cascade is done: remove cascade-guard's finalizer.
    Release,
    /// Remove cascade-guard's finalizer: there is no cascade to hold it for.
    LetGo(LetGo),
    /// The foreground cascade has run on with nothing cascade-guard can see
    /// left for a while ([`RESTART_AFTER`] by default): the garbage collector may have missed its
    /// start (it starts a cascade only on an edge its informer sees, and after
    /// an API server restart it can miss one: docs/deletion-semantics.md §2).
    /// Remove `foregroundDeletion` and delete in the foreground again, both
    /// with preconditions, while cascade-guard's finalizer keeps the object:
    /// the collector then sees the edge and decides itself whether anything
    /// is left. Harmless when it had not missed it: the cascade goes on.
    RestartCascade,
}

/// How long a foreground cascade may show nothing cascade-guard can see left
/// before it is restarted, by default. The garbage collector clears
/// `foregroundDeletion` within milliseconds of the last blocking dependent
/// going when it has seen the cascade start.
pub const RESTART_AFTER: Duration = Duration::from_secs(30);

/// How long a cascade just converted is left to the garbage collector
/// before an XR's composed resources are looked at: no restart can be due so
/// soon (its quiet clock starts after the conversion, and restarts wait
/// longer), and with many deletes at once the lookups of those converted
/// first held back the conversions of the rest.
pub const JUST_CONVERTED: Duration = Duration::from_secs(5);

/// The least time between restart `restarts` and the next: 1 min doubling to
/// 16 min. A kind whose dependents cascade-guard cannot see is restarted
/// through a long cascade too; each restart is two requests.
pub fn restart_interval(restarts: u32) -> Duration {
    Duration::from_secs(60u64 << restarts.saturating_sub(1).min(4))
}

/// What to do with a live object: only holding and letting go apply.
pub fn live_step(observed: Observed) -> Step {
    match (observed.held, observed.in_reach) {
        (false, true) => Step::AddFinalizer,
        (true, false) => Step::LetGo(LetGo::OutOfReach),
        _ => Step::Wait,
    }
}

/// The next step for one object.
///
/// When `foregroundDeletion` disappears after a conversion (or after the
/// foreground delete the object was first seen in), either the garbage
/// collector finished (no blocking dependents left) or a Background DELETE
/// stripped it. For XRs, the composed resources tell which: any left means
/// convert again. For other kinds cascade-guard cannot see the dependents, so
/// it converts once more and lets go when the garbage collector clears
/// `foregroundDeletion` a second time: a finished cascade clears again at once,
/// a stripped one runs on until its dependents are gone.
///
/// A deleting object is carried through whether or not it is still in reach:
/// the delete was let through because cascade-guard held it.
pub fn next_step(
    observed: Observed,
    memory: Memory,
    dependents: Dependents,
    now: Instant,
    carry: Carry,
) -> Step {
    if !observed.deleting {
        return live_step(observed);
    }
    // Never add a finalizer to a terminating object (the API server refuses
    // it), and never act on a deletion cascade-guard does not hold.
    if !observed.held {
        return Step::Wait;
    }
    if observed.in_foreground {
        return match carry {
            Carry::ToTheEnd { restart_after } => {
                in_foreground_step(observed.shape, memory, dependents, now, restart_after)
            }
            Carry::ToTheGarbageCollector => Step::LetGo(LetGo::HandedOver),
        };
    }
    // Half-way through a restart: put the cascade back.
    if memory.restarting {
        return Step::Convert;
    }
    if observed.orphaning || memory.orphaned {
        return Step::LetGo(LetGo::Orphaning);
    }
    if memory.cascades() == 0 {
        return Step::Convert;
    }
    let step = match observed.shape {
        Shape::CompositeResource => match dependents {
            Dependents::NotLookedUp => Step::LookUpDependents,
            Dependents::Remaining(_) => Step::Convert,
            Dependents::None => Step::Release,
            Dependents::Unknowable => confirmed(memory),
        },
        // Claims are never Convert kinds; like any other kind if one were.
        Shape::Other | Shape::Claim => confirmed(memory),
    };
    match (step, memory.last_conversion) {
        (Step::Convert, Some(last)) => {
            let due = last + reconversion_interval(memory.conversions);
            match due.checked_duration_since(now) {
                Some(wait) if !wait.is_zero() => Step::Backoff(wait),
                _ => Step::Convert,
            }
        }
        _ => step,
    }
}

/// While the garbage collector's cascade runs: wait, and restart a cascade
/// that has been quiet too long ([`Step::RestartCascade`]).
fn in_foreground_step(
    shape: Shape,
    memory: Memory,
    dependents: Dependents,
    now: Instant,
    restart_after: Option<Duration>,
) -> Step {
    if shape == Shape::CompositeResource {
        match dependents {
            Dependents::NotLookedUp if memory.just_converted(now) => return Step::Wait,
            Dependents::NotLookedUp => return Step::LookUpDependents,
            Dependents::Remaining(_) => return Step::Wait,
            Dependents::None | Dependents::Unknowable => {}
        }
    }
    match restart_after.and_then(|after| memory.restart_due(after)) {
        Some(due) if now >= due => Step::RestartCascade,
        _ => Step::Wait,
    }
}

/// The least time between conversion `conversions` and the next: none for
/// the second (the confirming round of kinds that are not XRs), then 1 s
/// doubling to 30 s.
pub fn reconversion_interval(conversions: u32) -> Duration {
    match conversions {
        0 | 1 => Duration::ZERO,
        n => Duration::from_secs(1u64 << (n - 2).min(5)).min(Duration::from_secs(30)),
    }
}

/// Without sight of the dependents: let go once the garbage collector has
/// cleared `foregroundDeletion` after a second conversion.
fn confirmed(memory: Memory) -> Step {
    if memory.cascades() >= 2 {
        Step::Release
    } else {
        Step::Convert
    }
}

#[cfg(test)]
mod tests;
