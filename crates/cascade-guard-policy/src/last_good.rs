//! A CascadePolicy that guarded a kind keeps guarding it when it comes to
//! name a kind no CRD defines (a typo: `Bucket` → `bucket`), with the policy
//! it last resolved to, until it names a kind that exists or is deleted.
//!
//! The controller remembers each CascadePolicy's policy while it runs; after
//! a restart it reads the policy back from the admission objects that policy
//! compiled to ([`recall`]), which are its last good compilation.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::kind::{ProtectedKind, Scope, Shape};
use crate::mode::Mode;
use crate::names::{MODE_ANNOTATION, PROTECTED_KIND_ANNOTATION, SOURCE_ANNOTATION};
use crate::naming::{object_name, update_object_name};
use crate::resolve::reasons::{KIND_NOT_DISCOVERED, UNKNOWN_KIND};
use crate::resolve::{Policy, Resolution, Source, Subject};

/// The last policy each CascadePolicy resolved to, by CascadePolicy name, so
/// that a typo in its kind does not lift the protection it gave.
#[derive(Debug, Default)]
pub struct LastGood(BTreeMap<String, Policy>);

/// A CascadePolicy that guarded a kind keeps guarding it when it comes to
/// name a kind no CRD defines (a typo: `Bucket` → `bucket`), until it names
/// one that exists or is deleted. Remembers each CascadePolicy's resolved
/// policy; returns the resolution with the remembered ones of the unknown
/// kinds added (their problem says so). For an unknown-kind CascadePolicy
/// with nothing remembered (after a restart) it asks `read_back` (by
/// CascadePolicy name) for the policy its admission objects in the cluster
/// say; when they say nothing readable, it returns their names: they are
/// left as they are. Forgets a CascadePolicy only when the list of them is
/// `complete` and it is not in it.
pub fn keep_last_good(
    mut resolution: Resolution,
    last_good: &mut LastGood,
    complete: bool,
    read_back: impl Fn(&str) -> Option<Policy>,
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
        let unknown_now = problem.reason == UNKNOWN_KIND || problem.reason == KIND_NOT_DISCOVERED;
        if !unknown_now || resolved.contains(name) {
            continue;
        }
        unknown.insert(name.clone());
        let source = Source::CascadePolicy { name: name.clone() };
        if !last_good.0.contains_key(name)
            && let Some(p) = read_back(name)
        {
            last_good.0.insert(name.clone(), p);
        }
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

/// The policy a CascadePolicy's DELETE ValidatingAdmissionPolicy was
/// compiled from, read back from it (as JSON): the kind from its rule and
/// annotations, the mode from its annotation, the shape from the rules it
/// holds. Not the selector: it lives on the binding, which anyone who could
/// edit it may have narrowed, so the policy read back guards every object of
/// its kind (wider, and so safer). None when the object is not the
/// CascadePolicy's or cannot be read.
pub fn recall(name: &str, policy: &Value) -> Option<Policy> {
    let annotation = |key: &str| policy.pointer("/metadata/annotations")?.get(key)?.as_str();
    let source = Source::CascadePolicy {
        name: name.to_string(),
    };
    if annotation(SOURCE_ANNOTATION)? != source.to_string() {
        return None;
    }
    let mode: Mode = annotation(MODE_ANNOTATION)?.parse().ok()?;
    let rule = policy.pointer("/spec/matchConstraints/resourceRules/0")?;
    let group = rule.pointer("/apiGroups/0")?.as_str()?;
    let plural = rule.pointer("/resources/0")?.as_str()?;
    let scope = match rule.get("scope").and_then(Value::as_str) {
        Some("Namespaced") => Scope::Namespaced,
        Some("Cluster") => Scope::Cluster,
        _ => Scope::Unknown,
    };
    let protected = annotation(PROTECTED_KIND_ANNOTATION)?;
    let kind = if group.is_empty() {
        protected
    } else {
        protected.strip_suffix(&format!(".{group}"))?
    };
    // Only composite resources get the nothing-to-cascade rule, which reads
    // their `resourceRefs`: written out in the validation (a claim's reads
    // `resourceRef`), or a variable in policies written by earlier builds.
    let composite = policy
        .pointer("/spec/validations/0/expression")
        .and_then(Value::as_str)
        .is_some_and(|e| e.contains(".resourceRefs"))
        || policy
            .pointer("/spec/variables")
            .and_then(Value::as_array)
            .is_some_and(|vs| {
                vs.iter()
                    .any(|v| v.get("name").and_then(Value::as_str) == Some("nothingToCascade"))
            });
    Some(Policy {
        kind: ProtectedKind {
            group: group.to_string(),
            kind: kind.to_string(),
            plural: plural.to_string(),
            scope,
            shape: if composite {
                Shape::CompositeResource
            } else {
                Shape::Other
            },
        },
        mode,
        selector: None,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::{ProtectedKind, Scope, Shape};
    use crate::{Mode, Problem, Severity};

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

    /// Discovery failing for a pass is no reason to drop a policy either.
    #[test]
    fn a_group_not_discovered_keeps_the_last_good_policy() {
        let mut memory = LastGood::default();
        let good = Resolution {
            policies: vec![policy("buckets", "Bucket", Mode::Refuse)],
            problems: vec![],
        };
        let unreadable = Resolution {
            policies: vec![],
            problems: vec![Problem {
                reason: KIND_NOT_DISCOVERED,
                severity: Severity::Warning,
                message: "API group \"example.org\" could not be read from discovery just now, so kind \"Bucket\" is not known for this pass".into(),
                ..unknown_kind("buckets")
            }],
        };
        keep_last_good(good, &mut memory, true, nothing);
        let (r, _) = keep_last_good(unreadable, &mut memory, false, nothing);
        assert_eq!(
            names(&r),
            vec![("CascadePolicy/buckets".into(), "Bucket".into())]
        );
        assert!(
            r.problems[0].message.contains("keeps guarding"),
            "{}",
            r.problems[0].message
        );
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
        let (r, untouched) = keep_last_good(good.clone(), &mut memory, true, nothing);
        assert_eq!(r, good);
        assert!(untouched.is_empty());

        // The typo: still Bucket, and the problem says so.
        let (r, untouched) = keep_last_good(typo.clone(), &mut memory, true, nothing);
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
        let (again, _) = keep_last_good(typo.clone(), &mut memory, true, nothing);
        assert_eq!(again, r);

        // Fixed to another kind that exists: that one, and remembered.
        let other = Resolution {
            policies: vec![policy("buckets", "Vault", Mode::Warn)],
            problems: vec![],
        };
        let (r, _) = keep_last_good(other, &mut memory, true, nothing);
        assert_eq!(names(&r)[0].1, "Vault");
        let (r, _) = keep_last_good(typo.clone(), &mut memory, true, nothing);
        assert_eq!(names(&r)[0].1, "Vault");

        // Deleted while the list is incomplete: not forgotten.
        let empty = Resolution::default();
        keep_last_good(empty.clone(), &mut memory, false, nothing);
        let (r, _) = keep_last_good(typo.clone(), &mut memory, true, nothing);
        assert_eq!(names(&r).len(), 1);
        // Deleted: forgotten; the same name with a typo later guards nothing.
        keep_last_good(empty, &mut memory, true, nothing);
        let (r, untouched) = keep_last_good(typo.clone(), &mut memory, true, nothing);
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

        // After a restart with the objects readable: read back and kept.
        let mut fresh = LastGood::default();
        let back = |name: &str| Some(policy(name, "Bucket", Mode::Convert));
        let (r, untouched) = keep_last_good(typo, &mut fresh, true, back);
        assert!(untouched.is_empty());
        assert_eq!(names(&r)[0].1, "Bucket");
        assert_eq!(r.policies[0].mode, Mode::Convert);
        assert!(
            r.problems[0]
                .message
                .contains("keeps guarding Bucket.example.org (Convert mode)")
        );
    }

    fn nothing(_: &str) -> Option<Policy> {
        None
    }

    #[test]
    fn a_policy_is_read_back_from_what_it_compiled_to() {
        use crate::admission::compile;
        use crate::settings::CompileSettings;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
        let selector = LabelSelector {
            match_labels: Some([("tier".to_string(), "prod".to_string())].into()),
            match_expressions: None,
        };
        for (group, scope, shape, mode, selector) in [
            (
                "example.org",
                Scope::Namespaced,
                Shape::CompositeResource,
                Mode::Refuse,
                None,
            ),
            (
                "db.example.org",
                Scope::Cluster,
                Shape::Other,
                Mode::Convert,
                Some(selector),
            ),
            (
                "example.org",
                Scope::Unknown,
                Shape::Other,
                Mode::Warn,
                None,
            ),
            (
                "example.org",
                Scope::Cluster,
                Shape::CompositeResource,
                Mode::Convert,
                None,
            ),
            (
                "example.org",
                Scope::Namespaced,
                Shape::CompositeResource,
                Mode::Warn,
                None,
            ),
        ] {
            let compiled_from = Policy {
                kind: ProtectedKind {
                    group: group.into(),
                    kind: "Bucket".into(),
                    plural: "buckets".into(),
                    scope,
                    shape,
                },
                mode,
                selector,
                source: Source::CascadePolicy { name: "b".into() },
            };
            let compiled = compile(&compiled_from, &CompileSettings::default());
            let vap = serde_json::to_value(&compiled[0].policy).unwrap();
            // All of it but the selector: every object of the kind.
            let want = Policy {
                selector: None,
                ..compiled_from.clone()
            };
            assert_eq!(recall("b", &vap).as_ref(), Some(&want));
            // Another CascadePolicy's object, or a mangled one: nothing.
            assert_eq!(recall("c", &vap), None);
            let mut mangled = vap.clone();
            mangled["metadata"]["annotations"]["cascade-guard.dev/mode"] = serde_json::json!("Of");
            assert_eq!(recall("b", &mangled), None);
            // As earlier builds wrote it: the composite's rule a variable.
            let mut older = vap.clone();
            older["spec"]["validations"][0]["expression"] =
                serde_json::json!("variables.nothingToCascade || variables.breakGlass");
            older["spec"]["variables"] = serde_json::json!(if shape == Shape::CompositeResource {
                vec![serde_json::json!({"name": "nothingToCascade", "expression": "true"})]
            } else {
                vec![]
            });
            assert_eq!(recall("b", &older).as_ref(), Some(&want));
        }
    }
}
