//! What holds an object that is being deleted, in words a person can act on
//! (pure): `trace` shows it for every object of a tree, and a stalled cascade
//! names it for each dependent left.

use crate::names::{FOREGROUND_CASCADE_FINALIZER, FOREGROUND_DELETION_FINALIZER, ORPHAN_FINALIZER};

/// The label Crossplane's Usage controller puts on a resource a Usage protects.
pub const IN_USE_LABEL: &str = "crossplane.io/in-use";

/// One finalizer: who is doing what.
pub fn describe_finalizer(f: &str) -> String {
    match f {
        FOREGROUND_DELETION_FINALIZER => "waiting for its dependents (foreground cascade)".into(),
        ORPHAN_FINALIZER => "orphaning its dependents".into(),
        FOREGROUND_CASCADE_FINALIZER => {
            "held by cascade-guard until nothing is left to cascade".into()
        }
        "kubernetes" => "namespace content being deleted".into(),
        f if f.starts_with("finalizer.managedresource.crossplane.io") => {
            format!("provider finalizer {f} (the provider is deleting the external resource)")
        }
        f => format!("finalizer {f}"),
    }
}

/// A deleting object and what holds it.
pub fn describe_deleting(finalizers: &[String]) -> String {
    if finalizers.is_empty() {
        return "deleting".to_string();
    }
    let held: Vec<String> = finalizers.iter().map(|f| describe_finalizer(f)).collect();
    format!("deleting: {}", held.join("; "))
}

/// A dependent left in a cascade: deleting and held by its finalizers, or
/// not deleted yet (in use by a Crossplane Usage, or not reached yet).
pub fn describe_dependent(deleting: bool, finalizers: &[String], in_use: bool) -> String {
    match (deleting, in_use) {
        (true, _) => describe_deleting(finalizers),
        (false, true) => {
            "not deleted: a Crossplane Usage protects it until what uses it is gone".to_string()
        }
        (false, false) => "not deleted yet".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finalizers_and_dependents_in_words() {
        let f = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let cases = [
            (true, f(&[]), false, "deleting"),
            (
                true,
                f(&["finalizer.managedresource.crossplane.io"]),
                false,
                "deleting: provider finalizer finalizer.managedresource.crossplane.io (the provider is deleting the external resource)",
            ),
            (
                true,
                f(&["example.com/x", FOREGROUND_DELETION_FINALIZER]),
                false,
                "deleting: finalizer example.com/x; waiting for its dependents (foreground cascade)",
            ),
            (
                false,
                f(&[]),
                true,
                "not deleted: a Crossplane Usage protects it until what uses it is gone",
            ),
            (false, f(&[]), false, "not deleted yet"),
        ];
        for (deleting, finalizers, in_use, want) in cases {
            assert_eq!(describe_dependent(deleting, &finalizers, in_use), want);
        }
    }

    #[test]
    fn finalizers_are_described_for_people() {
        for (f, want) in [
            ("foregroundDeletion", "dependents"),
            ("cascade-guard.dev/foreground-cascade", "cascade-guard"),
            ("finalizer.managedresource.crossplane.io", "provider"),
            ("example.org/other", "finalizer example.org/other"),
        ] {
            assert!(describe_finalizer(f).contains(want), "{f}");
        }
    }
}
