//! Telling that Crossplane's replay of a delete was refused (pure).
//!
//! When a Usage blocks a delete with `replayDeletion`, Crossplane records the
//! attempt's propagation policy on the object and, once the Usage is gone,
//! sends the delete again, once, as itself. Under Refuse a Background replay
//! is refused; Crossplane says so only in its own log and does not try again,
//! so the object stays with the recorded attempt on it and nobody told. This
//! is how such an object looks, and what to tell its owner.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::holders::IN_USE_LABEL;

/// Where Crossplane records the propagation policy of a delete a Usage blocked.
pub const DELETION_ATTEMPT_ANNOTATION: &str = "usage.crossplane.io/deletion-attempt-with-policy";

/// How long an object must look refused before it is said to be: Crossplane
/// replays about two seconds after the Usage goes.
pub const REPLAY_GRACE: Duration = Duration::from_secs(10);

/// The recorded propagation policy ("" when the attempt sent none) when the
/// object looks like a replay that did not go through: a recorded attempt
/// other than Foreground, no Usage holding it any more, and not being deleted.
pub fn refused_replay<'a>(
    annotations: &'a BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
    deleting: bool,
) -> Option<&'a str> {
    let policy = annotations.get(DELETION_ATTEMPT_ANNOTATION)?;
    let in_use = labels.get(IN_USE_LABEL).is_some_and(|v| v == "true");
    (policy != "Foreground" && !in_use && !deleting).then_some(policy.as_str())
}

/// What the Event on such an object says: what happened, and both ways out.
pub fn replay_note(policy: &str, target: &str) -> String {
    let sent = if policy.is_empty() {
        "no propagationPolicy".to_string()
    } else {
        format!("propagationPolicy {policy}")
    };
    format!(
        "A delete with {sent} was held by a Crossplane Usage and replayed by Crossplane once the Usage went; \
         cascade-guard's Refuse policy refused the replay, so the object was not deleted and Crossplane will not try again. \
         To delete it: kubectl delete {target} --cascade=foreground. \
         To keep it: kubectl annotate {target} {DELETION_ATTEMPT_ANNOTATION}-"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn only_a_recorded_unsafe_attempt_no_usage_holds_any_more() {
        let recorded = |p: &str| map(&[(DELETION_ATTEMPT_ANNOTATION, p)]);
        let in_use = map(&[(IN_USE_LABEL, "true")]);
        let free = map(&[]);
        let cases = [
            (map(&[]), &free, false, None),
            (recorded("Background"), &free, false, Some("Background")),
            (recorded(""), &free, false, Some("")),
            (recorded("Orphan"), &free, false, Some("Orphan")),
            // Replayed with Foreground: cascade-guard allows it.
            (recorded("Foreground"), &free, false, None),
            // The Usage still holds it: the replay has not happened yet.
            (recorded("Background"), &in_use, false, None),
            // Being deleted: the replay (or another delete) went through.
            (recorded("Background"), &free, true, None),
        ];
        for (annotations, labels, deleting, want) in cases {
            assert_eq!(
                refused_replay(&annotations, labels, deleting),
                want,
                "{annotations:?} {labels:?} {deleting}"
            );
        }
    }

    #[test]
    fn the_note_gives_both_ways_out() {
        let note = replay_note("Background", "xapps.example.org a -n team");
        assert!(note.contains("propagationPolicy Background"), "{note}");
        assert!(
            note.contains("kubectl delete xapps.example.org a -n team --cascade=foreground"),
            "{note}"
        );
        assert!(
            note.contains(&format!(
                "kubectl annotate xapps.example.org a -n team {DELETION_ATTEMPT_ANNOTATION}-"
            )),
            "{note}"
        );
        assert!(replay_note("", "x").contains("no propagationPolicy"));
    }
}
