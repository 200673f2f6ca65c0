//! One admission sync pass (pure): the policies resolved, each
//! CascadePolicy's last good policy kept ([`crate::last_good`]), the plan
//! compiled ([`crate::plan::plan`]) and compared with the admission objects
//! in the cluster ([`crate::plan::diff`]). The controller makes the changes
//! it lists; `status` reports them. Both call [`pass`], so `status` says
//! exactly what the controller would do.

use serde_json::Value;

use crate::last_good::{LastGood, keep_last_good, recall};
use crate::naming::object_name;
use crate::plan::{AdmissionPlan, Difference, Known, Live, diff, plan};
use crate::resolve::{Resolution, Source};
use crate::settings::CompileSettings;

/// What a pass read of the cluster, besides the policies' inputs.
#[derive(Clone, Copy, Debug)]
pub struct Seen<'a> {
    /// Which of the policies' inputs were read completely: admission objects
    /// are only removed for inputs read completely, and a CascadePolicy's
    /// last good policy is forgotten only when the list of them is complete.
    pub known: Known,
    /// cascade-guard's admission objects in the cluster.
    pub live: &'a Live,
    /// Whether `live` holds all of them. Nothing is removed on a partial
    /// view of what is there.
    pub live_complete: bool,
}

/// What one pass wants, and what must change for the cluster to hold it.
#[derive(Clone, Debug, PartialEq)]
pub struct Pass {
    /// The policies in force: those resolved, plus the last good policy of
    /// each CascadePolicy that names a kind no CRD defines (its problem
    /// says so).
    pub resolution: Resolution,
    pub plan: AdmissionPlan,
    /// The changes, in the order to make them (see [`diff`]).
    pub changes: Vec<Difference>,
}

/// One pass. `last_good` is what earlier passes remembered (a fresh one for
/// a single look, as `status` takes); `recorded` gives the
/// ValidatingAdmissionPolicy of that name as the cluster holds it, as JSON,
/// from which a CascadePolicy's last good policy is read back when nothing
/// is remembered (after a restart).
pub fn pass(
    resolution: Resolution,
    settings: &CompileSettings,
    seen: Seen<'_>,
    last_good: &mut LastGood,
    recorded: impl Fn(&str) -> Option<Value>,
) -> Pass {
    let read_back = |name: &str| {
        let object = object_name(&Source::CascadePolicy {
            name: name.to_string(),
        });
        recall(name, &recorded(&object)?)
    };
    let (resolution, kept) = keep_last_good(
        resolution,
        last_good,
        seen.known.cascade_policies,
        read_back,
    );
    let plan = plan(&resolution, settings, kept);
    let removable_for = if seen.live_complete {
        seen.known
    } else {
        Known::default()
    };
    let changes = diff(&plan, seen.live, removable_for);
    Pass {
        resolution,
        plan,
        changes,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::kind::{ProtectedKind, Shape};
    use crate::mode::Mode;
    use crate::plan::{Drift, ObjectKind};
    use crate::resolve::reasons::UNKNOWN_KIND;
    use crate::resolve::{Policy, Problem, Severity, Subject};

    const ALL_KNOWN: Known = Known {
        xrds: true,
        cascade_policies: true,
    };

    fn guarding(name: &str, kind: &str) -> Policy {
        Policy {
            kind: ProtectedKind::example(kind, Shape::Other),
            mode: Mode::Refuse,
            selector: None,
            source: Source::CascadePolicy { name: name.into() },
        }
    }

    fn resolved(policies: Vec<Policy>) -> Resolution {
        Resolution {
            policies,
            problems: vec![],
        }
    }

    /// `buckets` now names a kind no CRD defines.
    fn typo() -> Resolution {
        Resolution {
            policies: vec![],
            problems: vec![Problem {
                subject: Subject::CascadePolicy {
                    name: "buckets".into(),
                },
                reason: UNKNOWN_KIND,
                message: "no CustomResourceDefinition defines kind \"bucket\"; nothing is guarded for this policy until one does".into(),
                severity: Severity::Error,
            }],
        }
    }

    /// The cluster as it holds what `policies` compile to.
    fn holding(policies: Vec<Policy>) -> Live {
        let plan = plan(
            &resolved(policies),
            &CompileSettings::default(),
            BTreeSet::new(),
        );
        let mut live = Live::default();
        for c in &plan.objects {
            let name = c.policy.metadata.name.clone().unwrap_or_default();
            let policy = serde_json::to_value(&c.policy).unwrap_or_default();
            let binding = serde_json::to_value(&c.binding).unwrap_or_default();
            live.policies.insert(name.clone(), policy);
            live.bindings.insert(name, binding);
        }
        live
    }

    fn changes(pass: &Pass) -> Vec<(ObjectKind, String, Drift)> {
        pass.changes
            .iter()
            .map(|c| (c.kind, c.name.clone(), c.drift.clone()))
            .collect()
    }

    fn nothing_recorded(_: &str) -> Option<Value> {
        None
    }

    #[test]
    fn a_pass_is_last_good_then_plan_then_diff() {
        let settings = CompileSettings::default();
        let live = holding(vec![guarding("buckets", "Bucket")]);
        let in_sync = Seen {
            known: ALL_KNOWN,
            live: &live,
            live_complete: true,
        };
        let cases: [(&str, Resolution, Seen, usize, Vec<&str>); 4] = [
            (
                "what is there is wanted",
                resolved(vec![guarding("buckets", "Bucket")]),
                in_sync,
                1,
                vec![],
            ),
            (
                "a policy deleted: its two pairs go, bindings first",
                resolved(vec![]),
                in_sync,
                0,
                vec![
                    "binding extra",
                    "binding extra",
                    "policy extra",
                    "policy extra",
                ],
            ),
            (
                "a partial view of the cluster removes nothing",
                resolved(vec![]),
                Seen {
                    live_complete: false,
                    ..in_sync
                },
                0,
                vec!["binding kept", "binding kept", "policy kept", "policy kept"],
            ),
            (
                "a policy added: its two pairs are written, each policy first",
                resolved(vec![
                    guarding("buckets", "Bucket"),
                    guarding("vaults", "Vault"),
                ]),
                in_sync,
                2,
                vec![
                    "policy missing",
                    "binding missing",
                    "policy missing",
                    "binding missing",
                ],
            ),
        ];
        for (case, resolution, seen, in_force, want) in cases {
            let pass = pass(
                resolution.clone(),
                &settings,
                seen,
                &mut LastGood::default(),
                nothing_recorded,
            );
            assert_eq!(pass.resolution.policies.len(), in_force, "{case}");
            let got: Vec<String> = changes(&pass)
                .into_iter()
                .map(|(kind, _, drift)| {
                    let kind = match kind {
                        ObjectKind::Policy => "policy",
                        ObjectKind::Binding => "binding",
                    };
                    let drift = match drift {
                        Drift::Missing => "missing",
                        Drift::Differs { .. } => "differs",
                        Drift::Extra { removable: true } => "extra",
                        Drift::Extra { removable: false } => "kept",
                    };
                    format!("{kind} {drift}")
                })
                .collect();
            assert_eq!(got, want, "{case}");
            // The same as the plan and diff it glues.
            let plan = plan(&resolution, &settings, BTreeSet::new());
            assert_eq!(pass.plan, plan, "{case}");
        }
    }

    #[test]
    fn after_a_restart_a_typo_keeps_what_the_cluster_records() {
        let settings = CompileSettings::default();
        let live = holding(vec![guarding("buckets", "Bucket")]);
        let seen = Seen {
            known: ALL_KNOWN,
            live: &live,
            live_complete: true,
        };
        let recorded = |name: &str| live.policies.get(name).cloned();
        let read_back = pass(typo(), &settings, seen, &mut LastGood::default(), recorded);
        // Guarding Bucket as it last compiled: the policy is as it was; the
        // binding loses nothing either (the policy read back has no selector,
        // and none was there).
        assert_eq!(read_back.resolution.policies.len(), 1);
        assert_eq!(read_back.resolution.policies[0].kind.kind, "Bucket");
        assert_eq!(changes(&read_back), vec![]);
        assert!(
            read_back.resolution.problems[0]
                .message
                .contains("keeps guarding"),
            "{}",
            read_back.resolution.problems[0].message
        );

        // Nothing readable recorded: its objects stay as they are.
        let untouched = pass(
            typo(),
            &settings,
            seen,
            &mut LastGood::default(),
            nothing_recorded,
        );
        assert!(untouched.resolution.policies.is_empty());
        assert_eq!(changes(&untouched), vec![]);
        assert!(untouched.plan.kept.contains("cascade-guard-policy-buckets"));

        // Remembered from an earlier pass: kept without reading back.
        let mut memory = LastGood::default();
        pass(
            resolved(vec![guarding("buckets", "Bucket")]),
            &settings,
            seen,
            &mut memory,
            nothing_recorded,
        );
        let remembered = pass(typo(), &settings, seen, &mut memory, nothing_recorded);
        assert_eq!(remembered.resolution.policies.len(), 1);
        assert_eq!(changes(&remembered), vec![]);
    }
}
