//! A CascadePolicy that guarded a kind keeps guarding it when it comes to
//! name a kind no CRD defines (a typo: `Bucket` → `bucket`), with the policy
//! it last resolved to, until it names a kind that exists or is deleted.

use std::collections::{BTreeMap, BTreeSet};

use super::admission::{object_name, update_object_name};
use super::resolve::reasons::UNKNOWN_KIND;
use super::resolve::{Policy, Resolution, Source, Subject};

/// The last policy each CascadePolicy resolved to, by CascadePolicy name, so
/// that a typo in its kind does not lift the protection it gave.
#[derive(Debug, Default)]
pub struct LastGood(BTreeMap<String, Policy>);

/// A CascadePolicy that guarded a kind keeps guarding it when it comes to
/// name a kind no CRD defines (a typo: `Bucket` → `bucket`), until it names
/// one that exists or is deleted. Remembers each CascadePolicy's resolved
/// policy; returns the resolution with the remembered ones of the unknown
/// kinds added (their problem says so), and the admission object names of
/// unknown-kind CascadePolicies with nothing remembered (after a restart):
/// what is in the cluster is their last good compilation, left untouched.
/// Forgets a CascadePolicy only when the list of them is `complete` and it
/// is not in it.
pub fn keep_last_good(
    mut resolution: Resolution,
    last_good: &mut LastGood,
    complete: bool,
) -> (Resolution, BTreeSet<String>) {
    let mut resolved = BTreeSet::new();
    for p in &resolution.policies {
        if let Source::CascadePolicy { name } = &p.source {
            last_good.0.insert(name.clone(), p.clone());
            resolved.insert(name.clone());
        }
    }
    let mut unknown = BTreeSet::new();
    let mut untouched = BTreeSet::new();
    for problem in &mut resolution.problems {
        let Subject::CascadePolicy { name } = &problem.subject else {
            continue;
        };
        if problem.reason != UNKNOWN_KIND || resolved.contains(name) {
            continue;
        }
        unknown.insert(name.clone());
        let source = Source::CascadePolicy { name: name.clone() };
        let kept = match last_good.0.get(name) {
            Some(p) => format!(
                "it keeps guarding {} ({} mode) as it last compiled, until it names a kind that exists or is deleted",
                p.kind, p.mode
            ),
            None => {
                untouched.insert(object_name(&source));
                untouched.insert(update_object_name(&source));
                "its admission objects in the cluster, if any, stay as they are until it names a kind that exists or is deleted".to_string()
            }
        };
        // The resolver's "nothing is guarded" no longer holds.
        let cause = problem
            .message
            .split("; nothing is guarded")
            .next()
            .unwrap_or_default()
            .to_string();
        problem.message = format!("{cause}; {kept}");
    }
    for name in &unknown {
        if let Some(p) = last_good.0.get(name) {
            resolution.policies.push(p.clone());
        }
    }
    if complete {
        last_good
            .0
            .retain(|name, _| resolved.contains(name) || unknown.contains(name));
    }
    (resolution, untouched)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::kind::{ProtectedKind, Scope, Shape};
    use crate::policy::{Mode, Problem, Severity};

    fn policy(name: &str, kind: &str, mode: Mode) -> Policy {
        Policy {
            kind: ProtectedKind {
                group: "example.org".into(),
                kind: kind.into(),
                plural: format!("{}s", kind.to_lowercase()),
                scope: Scope::Cluster,
                shape: Shape::Other,
            },
            mode,
            selector: None,
            source: Source::CascadePolicy { name: name.into() },
        }
    }

    fn unknown_kind(name: &str) -> Problem {
        Problem {
            subject: Subject::CascadePolicy { name: name.into() },
            reason: UNKNOWN_KIND,
            message: "no CustomResourceDefinition defines kind \"bucket\" in group \"example.org\" (kinds are case-sensitive); nothing is guarded for this policy until one does".into(),
            severity: Severity::Error,
        }
    }

    fn names(r: &Resolution) -> Vec<(String, String)> {
        r.policies
            .iter()
            .map(|p| (p.source.to_string(), p.kind.kind.clone()))
            .collect()
    }

    #[test]
    fn a_typo_keeps_the_last_good_policy_until_fixed_or_deleted() {
        let mut memory = LastGood::default();
        let good = Resolution {
            policies: vec![policy("buckets", "Bucket", Mode::Refuse)],
            problems: vec![],
        };
        let typo = Resolution {
            policies: vec![],
            problems: vec![unknown_kind("buckets")],
        };
        let (r, untouched) = keep_last_good(good.clone(), &mut memory, true);
        assert_eq!(r, good);
        assert!(untouched.is_empty());

        // The typo: still Bucket, and the problem says so.
        let (r, untouched) = keep_last_good(typo.clone(), &mut memory, true);
        assert_eq!(
            names(&r),
            [("CascadePolicy/buckets".to_string(), "Bucket".to_string())]
        );
        assert!(untouched.is_empty());
        assert_eq!(r.problems.len(), 1);
        let message = &r.problems[0].message;
        assert!(!message.contains("nothing is guarded"), "{message}");
        assert!(
            message.contains("keeps guarding Bucket.example.org (Refuse mode)"),
            "{message}"
        );
        // Again (a later pass): the same.
        let (again, _) = keep_last_good(typo.clone(), &mut memory, true);
        assert_eq!(again, r);

        // Fixed to another kind that exists: that one, and remembered.
        let other = Resolution {
            policies: vec![policy("buckets", "Vault", Mode::Warn)],
            problems: vec![],
        };
        let (r, _) = keep_last_good(other, &mut memory, true);
        assert_eq!(names(&r)[0].1, "Vault");
        let (r, _) = keep_last_good(typo.clone(), &mut memory, true);
        assert_eq!(names(&r)[0].1, "Vault");

        // Deleted while the list is incomplete: not forgotten.
        let empty = Resolution::default();
        keep_last_good(empty.clone(), &mut memory, false);
        let (r, _) = keep_last_good(typo.clone(), &mut memory, true);
        assert_eq!(names(&r).len(), 1);
        // Deleted: forgotten; the same name with a typo later guards nothing.
        keep_last_good(empty, &mut memory, true);
        let (r, untouched) = keep_last_good(typo, &mut memory, true);
        assert!(r.policies.is_empty());
        // Nothing remembered (as after a restart): the objects stay as they are.
        assert_eq!(
            untouched,
            BTreeSet::from([
                "cascade-guard-policy-buckets".to_string(),
                "cascade-guard-update-policy-buckets".to_string()
            ])
        );
        assert!(r.problems[0].message.contains("stay as they are"));
    }
}
