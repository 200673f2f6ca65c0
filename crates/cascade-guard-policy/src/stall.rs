//! Telling a stalled cascade from a slow one (pure). A cascade makes progress
//! when one of the dependents it waits for goes, or one more starts being
//! deleted; one that does neither for the stall time is stalled, usually on a
//! finalizer that can never finish (a provider whose cluster is gone) or a
//! Usage whose user never goes. Convert's controller looks at each cascade it
//! holds and says so when it stalls, and when it moves again.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// One dependent a cascade still waits for, as looked up.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Left {
    /// `Kind/name`, with ` -n namespace` when namespaced.
    pub object: String,
    pub deleting: bool,
    /// What holds it, in words ([`crate::holders::describe_dependent`]).
    pub holder: String,
}

/// What a look at a cascade found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// Moving, or not still for long enough to say.
    Moving,
    /// Still for the stall time: say so, once.
    Stalled,
    /// Still stalled (said already).
    StillStalled,
    /// Moving again after a stall: say so, once.
    Resumed,
}

/// A cascade's clock: when it last moved, and what it waited for then.
#[derive(Clone, Debug)]
pub struct Clock {
    since: Instant,
    left: Vec<Left>,
    stalled: bool,
}

impl Clock {
    pub fn start(left: Vec<Left>, now: Instant) -> Self {
        Self {
            since: now,
            left,
            stalled: false,
        }
    }

    pub fn is_stalled(&self) -> bool {
        self.stalled
    }

    /// What the cascade waits for, as last looked up.
    pub fn left(&self) -> &[Left] {
        &self.left
    }

    /// How long it has not moved.
    pub fn still_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.since)
    }

    /// One look: `left` is what the cascade waits for now.
    pub fn look(&mut self, left: Vec<Left>, now: Instant, stall_after: Duration) -> Turn {
        let moved = progressed(&self.left, &left);
        self.left = left;
        if moved {
            self.since = now;
            return if std::mem::replace(&mut self.stalled, false) {
                Turn::Resumed
            } else {
                Turn::Moving
            };
        }
        if self.stalled {
            Turn::StillStalled
        } else if self.still_for(now) >= stall_after {
            self.stalled = true;
            Turn::Stalled
        } else {
            Turn::Moving
        }
    }
}

/// Whether anything `before` waited for is gone, or started being deleted.
fn progressed(before: &[Left], now: &[Left]) -> bool {
    let was: BTreeSet<&str> = before.iter().map(|l| l.object.as_str()).collect();
    let is: BTreeSet<&str> = now.iter().map(|l| l.object.as_str()).collect();
    let was_deleting: BTreeSet<&str> = before
        .iter()
        .filter(|l| l.deleting)
        .map(|l| l.object.as_str())
        .collect();
    was.difference(&is).next().is_some()
        || now
            .iter()
            .any(|l| l.deleting && !was_deleting.contains(l.object.as_str()))
}

/// The Event note for a stalled cascade: how long, and what holds what.
pub fn stalled_note(still_for: Duration, left: &[Left], kind_shows_dependents: bool) -> String {
    let minutes = still_for.as_secs() / 60;
    let seconds = still_for.as_secs() % 60;
    let waited = if minutes > 0 {
        format!("{minutes}m{seconds:02}s")
    } else {
        format!("{seconds}s")
    };
    if !kind_shows_dependents {
        return format!(
            "no progress for {waited}: the garbage collector is still deleting what it owns (cascade-guard cannot see this kind's dependents; look for objects with an ownerReference to it)"
        );
    }
    if left.is_empty() {
        return format!("no progress for {waited}, with nothing left that it lists");
    }
    let each: Vec<String> = left
        .iter()
        .map(|l| format!("{} ({})", l.object, l.holder))
        .collect();
    format!("no progress for {waited}; left: {}", each.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn left(object: &str, deleting: bool) -> Left {
        Left {
            object: object.into(),
            deleting,
            holder: if deleting {
                "deleting"
            } else {
                "not deleted yet"
            }
            .into(),
        }
    }

    #[test]
    fn a_cascade_stalls_after_the_stall_time_without_progress_and_resumes_on_progress() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let after = Duration::from_secs(60);
        let mut clock = Clock::start(vec![left("A/a", true), left("B/b", false)], t0);
        // (what is left, when) -> what the look says
        let cases = [
            (
                vec![left("A/a", true), left("B/b", false)],
                30,
                Turn::Moving,
            ),
            (
                vec![left("A/a", true), left("B/b", false)],
                60,
                Turn::Stalled,
            ),
            (
                vec![left("A/a", true), left("B/b", false)],
                90,
                Turn::StillStalled,
            ),
            // A holder's words changing is not progress.
            (
                vec![
                    Left {
                        holder: "deleting: finalizer x".into(),
                        ..left("A/a", true)
                    },
                    left("B/b", false),
                ],
                100,
                Turn::StillStalled,
            ),
            // One more started deleting: progress.
            (
                vec![left("A/a", true), left("B/b", true)],
                120,
                Turn::Resumed,
            ),
            (
                vec![left("A/a", true), left("B/b", true)],
                150,
                Turn::Moving,
            ),
            (
                vec![left("A/a", true), left("B/b", true)],
                180,
                Turn::Stalled,
            ),
            // One went: progress.
            (vec![left("B/b", true)], 200, Turn::Resumed),
            // A new dependent that is not deleting is not progress.
            (
                vec![left("B/b", true), left("C/c", false)],
                259,
                Turn::Moving,
            ),
            (
                vec![left("B/b", true), left("C/c", false)],
                260,
                Turn::Stalled,
            ),
        ];
        for (now_left, secs, want) in cases {
            let got = clock.look(now_left.clone(), at(secs), after);
            assert_eq!(got, want, "at {secs}s with {now_left:?}");
            assert_eq!(
                clock.is_stalled(),
                matches!(want, Turn::Stalled | Turn::StillStalled)
            );
        }
    }

    #[test]
    fn the_note_names_what_is_left_and_what_holds_it() {
        let l = vec![
            Left {
                object: "Release/r -n ns".into(),
                deleting: true,
                holder: "deleting: provider finalizer f".into(),
            },
            Left {
                object: "Cluster/c -n ns".into(),
                deleting: false,
                holder: "not deleted: a Crossplane Usage protects it".into(),
            },
        ];
        assert_eq!(
            stalled_note(Duration::from_secs(605), &l, true),
            "no progress for 10m05s; left: Release/r -n ns (deleting: provider finalizer f); Cluster/c -n ns (not deleted: a Crossplane Usage protects it)"
        );
        assert!(
            stalled_note(Duration::from_secs(5), &[], false)
                .starts_with("no progress for 5s: the garbage collector")
        );
    }
}
