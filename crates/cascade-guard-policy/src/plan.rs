//! What the cluster should contain, and how what it does contain differs
//! (pure): one plan and one diff behind the controller's apply, `status` and
//! `render`, so that `status` reports exactly what the controller would do.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::admission::{Compiled, compile};
use crate::drift::first_difference;
use crate::names::{
    CASCADE_POLICY_OBJECT_PREFIX, CLAIM_OBJECT_PREFIX, UPDATE_CASCADE_POLICY_OBJECT_PREFIX,
    UPDATE_CLAIM_OBJECT_PREFIX, UPDATE_XRD_OBJECT_PREFIX, XRD_OBJECT_PREFIX,
};
use crate::resolve::{Policy, Resolution, Source};
use crate::settings::CompileSettings;

/// The two kinds of admission object cascade-guard writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKind {
    Policy,
    Binding,
}

impl ObjectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::Policy => "ValidatingAdmissionPolicy",
            ObjectKind::Binding => "ValidatingAdmissionPolicyBinding",
        }
    }
}

/// Which inputs a pass read completely. Admission objects are only removed
/// for inputs read completely: an input that could not be read must not lift
/// protection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Known {
    pub xrds: bool,
    pub cascade_policies: bool,
}

/// One policy in force and the admission objects it compiles to (none for Off).
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub policy: Policy,
    pub objects: Vec<Compiled>,
}

impl Planned {
    /// The names of its objects (each policy and binding pair shares one).
    pub fn names(&self) -> Vec<String> {
        self.objects
            .iter()
            .filter_map(|c| c.policy.metadata.name.clone())
            .collect()
    }
}

/// What the cluster should contain.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    pub planned: Vec<Planned>,
    /// Names wanted exactly as they are in the cluster: the last good
    /// compilation of a CascadePolicy that now names a kind no CRD defines.
    pub kept: BTreeSet<String>,
}

/// Compiles every policy in force.
pub fn plan(resolution: &Resolution, settings: &CompileSettings, kept: BTreeSet<String>) -> Plan {
    Plan {
        planned: resolution
            .policies
            .iter()
            .map(|p| Planned {
                policy: p.clone(),
                objects: compile(p, settings),
            })
            .collect(),
        kept,
    }
}

impl Plan {
    /// Every name the plan wants, kept ones included.
    pub fn wanted_names(&self) -> BTreeSet<String> {
        let mut names = self.kept.clone();
        names.extend(self.planned.iter().flat_map(Planned::names));
        names
    }

    /// The object names each source compiles to, for sources that compile to any.
    pub fn compiled_names(&self) -> BTreeMap<Source, Vec<String>> {
        self.planned
            .iter()
            .map(|p| (p.policy.source.clone(), p.names()))
            .filter(|(_, names)| !names.is_empty())
            .collect()
    }

    /// How many admission objects it compiles to (policies and bindings).
    pub fn object_count(&self) -> usize {
        self.planned.iter().map(|p| p.objects.len() * 2).sum()
    }

    /// The compiled pair named `name`, with its policy.
    pub fn compiled(&self, name: &str) -> Option<(&Policy, &Compiled)> {
        self.planned.iter().find_map(|p| {
            let c = p
                .objects
                .iter()
                .find(|c| c.policy.metadata.name.as_deref() == Some(name))?;
            Some((&p.policy, c))
        })
    }
}

/// How one admission object in the cluster differs from the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Drift {
    /// Wanted, not in the cluster.
    Missing,
    /// In the cluster with other content than wanted; the first field that differs.
    Differs { path: String },
    /// In the cluster, labelled as cascade-guard's, but no policy wants it.
    /// `removable` is false while the input it came from could not be read
    /// completely: then it stays.
    Extra { removable: bool },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    pub kind: ObjectKind,
    pub name: String,
    /// The policy that wants it (None for an extra object).
    pub source: Option<Source>,
    pub drift: Drift,
}

/// cascade-guard's admission objects in the cluster, as JSON by name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Live {
    pub policies: BTreeMap<String, Value>,
    pub bindings: BTreeMap<String, Value>,
}

impl Live {
    /// From listed objects (unnamed ones, which the API server never returns,
    /// are skipped).
    pub fn from_lists(policies: &[Value], bindings: &[Value]) -> Live {
        let by_name = |objects: &[Value]| {
            objects
                .iter()
                .filter_map(|v| {
                    Some((
                        v.pointer("/metadata/name")?.as_str()?.to_string(),
                        v.clone(),
                    ))
                })
                .collect()
        };
        Live {
            policies: by_name(policies),
            bindings: by_name(bindings),
        }
    }

    fn of(&self, kind: ObjectKind) -> &BTreeMap<String, Value> {
        match kind {
            ObjectKind::Policy => &self.policies,
            ObjectKind::Binding => &self.bindings,
        }
    }
}

/// What must change for the cluster to hold the plan: for each wanted name,
/// the policy before its binding (a binding to a missing policy does nothing,
/// but the other order is the honest one); then the extra bindings before the
/// extra policies (so no binding is left pointing at nothing).
pub fn diff(plan: &Plan, live: &Live, known: Known) -> Vec<Difference> {
    let mut out = Vec::new();
    for planned in &plan.planned {
        for compiled in &planned.objects {
            let Some(name) = compiled.policy.metadata.name.clone() else {
                continue;
            };
            let desired = [
                (ObjectKind::Policy, serde_json::to_value(&compiled.policy)),
                (ObjectKind::Binding, serde_json::to_value(&compiled.binding)),
            ];
            for (kind, desired) in desired {
                // Serialising generated types does not fail; if it did, the
                // object counts as missing and its write says why.
                let drift = match (desired, live.of(kind).get(&name)) {
                    (_, None) | (Err(_), Some(_)) => Some(Drift::Missing),
                    (Ok(desired), Some(live)) => {
                        first_difference(&desired, live).map(|path| Drift::Differs { path })
                    }
                };
                if let Some(drift) = drift {
                    out.push(Difference {
                        kind,
                        name: name.clone(),
                        source: Some(planned.policy.source.clone()),
                        drift,
                    });
                }
            }
        }
    }
    let wanted = plan.wanted_names();
    for kind in [ObjectKind::Binding, ObjectKind::Policy] {
        for name in live.of(kind).keys().filter(|n| !wanted.contains(*n)) {
            out.push(Difference {
                kind,
                name: name.clone(),
                source: None,
                drift: Drift::Extra {
                    removable: removable(name, known),
                },
            });
        }
    }
    out
}

/// Whether an extra object may be removed: only when the input its name says
/// it came from was read completely (an object of unknown origin, when both were).
fn removable(name: &str, known: Known) -> bool {
    let from_xrd = [
        XRD_OBJECT_PREFIX,
        UPDATE_XRD_OBJECT_PREFIX,
        CLAIM_OBJECT_PREFIX,
        UPDATE_CLAIM_OBJECT_PREFIX,
    ];
    if from_xrd.iter().any(|p| name.starts_with(p)) {
        known.xrds
    } else if name.starts_with(CASCADE_POLICY_OBJECT_PREFIX)
        || name.starts_with(UPDATE_CASCADE_POLICY_OBJECT_PREFIX)
    {
        known.cascade_policies
    } else {
        known.xrds && known.cascade_policies
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::{ProtectedKind, Scope, Shape};
    use crate::mode::Mode;

    fn policy(kind: &str, mode: Mode, source: Source) -> Policy {
        Policy {
            kind: ProtectedKind {
                group: "example.org".into(),
                kind: kind.into(),
                plural: format!("{}s", kind.to_lowercase()),
                scope: Scope::Cluster,
                shape: Shape::CompositeResource,
            },
            mode,
            selector: None,
            source,
        }
    }

    fn xrd(name: &str) -> Source {
        Source::Xrd {
            name: name.into(),
            annotated: true,
            claim: false,
        }
    }

    fn resolution(policies: Vec<Policy>) -> Resolution {
        Resolution {
            policies,
            problems: vec![],
        }
    }

    const ALL_KNOWN: Known = Known {
        xrds: true,
        cascade_policies: true,
    };

    /// The cluster as the API server would hold the plan's objects.
    fn live_of(plan: &Plan) -> Live {
        let mut live = Live::default();
        for p in &plan.planned {
            for c in &p.objects {
                let name = c.policy.metadata.name.clone().unwrap_or_default();
                live.policies.insert(
                    name.clone(),
                    serde_json::to_value(&c.policy).unwrap_or_default(),
                );
                live.bindings
                    .insert(name, serde_json::to_value(&c.binding).unwrap_or_default());
            }
        }
        live
    }

    #[test]
    fn off_plans_nothing_and_others_plan_a_delete_and_an_update_pair() {
        let plan = plan(
            &resolution(vec![
                policy("A", Mode::Refuse, xrd("as.example.org")),
                policy("B", Mode::Off, xrd("bs.example.org")),
            ]),
            &CompileSettings::default(),
            BTreeSet::new(),
        );
        assert_eq!(plan.planned.len(), 2);
        assert!(plan.planned[1].objects.is_empty());
        assert_eq!(plan.object_count(), plan.planned[0].objects.len() * 2);
        let names = plan.compiled_names();
        assert_eq!(names.len(), 1, "Off compiles to nothing: {names:?}");
        assert!(
            plan.wanted_names()
                .iter()
                .all(|n| names[&xrd("as.example.org")].contains(n))
        );
        let (from, pair) = plan
            .compiled(&plan.planned[0].names()[0])
            .expect("the policy is in the plan");
        assert_eq!(from.kind.kind, "A");
        assert_eq!(
            Some(pair.binding.spec.policy_name.as_str()),
            pair.policy.metadata.name.as_deref()
        );
    }

    #[test]
    fn diff_names_missing_differing_and_extra_objects_in_write_order() {
        let settings = CompileSettings::default();
        let wanted = plan(
            &resolution(vec![policy("A", Mode::Refuse, xrd("as.example.org"))]),
            &settings,
            BTreeSet::new(),
        );
        let in_sync = live_of(&wanted);
        assert_eq!(diff(&wanted, &in_sync, ALL_KNOWN), vec![]);

        let name = wanted.planned[0].names()[0].clone();
        let mut live = in_sync.clone();
        live.policies.remove(&name);
        if let Some(binding) = live.bindings.get_mut(&name) {
            binding["spec"]["validationActions"] = serde_json::json!(["Audit"]);
        }
        // Another source's objects, and ones of no known origin.
        let stale = plan(
            &resolution(vec![policy(
                "Z",
                Mode::Refuse,
                Source::CascadePolicy { name: "z".into() },
            )]),
            &settings,
            BTreeSet::new(),
        );
        let stale_live = live_of(&stale);
        live.policies.extend(stale_live.policies);
        live.bindings.extend(stale_live.bindings);
        live.policies
            .insert("cascade-guard-odd".into(), serde_json::json!({}));

        let found = diff(&wanted, &live, ALL_KNOWN);
        let got: Vec<(ObjectKind, &str, &Drift)> = found
            .iter()
            .map(|d| (d.kind, d.name.as_str(), &d.drift))
            .collect();
        let stale_names = stale.planned[0].names();
        let differs = Drift::Differs {
            path: "spec.validationActions[0]".into(),
        };
        let mut want = vec![
            (ObjectKind::Policy, name.as_str(), &Drift::Missing),
            (ObjectKind::Binding, name.as_str(), &differs),
        ];
        let extra = Drift::Extra { removable: true };
        // Bindings first, then policies, each by name.
        let mut extra_bindings: Vec<&str> = stale_names.iter().map(String::as_str).collect();
        extra_bindings.sort();
        let mut extra_policies = extra_bindings.clone();
        extra_policies.push("cascade-guard-odd");
        extra_policies.sort();
        want.extend(
            extra_bindings
                .iter()
                .map(|n| (ObjectKind::Binding, *n, &extra)),
        );
        want.extend(
            extra_policies
                .iter()
                .map(|n| (ObjectKind::Policy, *n, &extra)),
        );
        assert_eq!(got, want);
        assert_eq!(found[0].source, Some(xrd("as.example.org")));
        assert_eq!(found.last().map(|d| d.source.clone()), Some(None));
    }

    #[test]
    fn kept_objects_are_wanted_and_unread_inputs_keep_their_objects() {
        let settings = CompileSettings::default();
        let old = plan(
            &resolution(vec![policy(
                "Z",
                Mode::Convert,
                Source::CascadePolicy { name: "z".into() },
            )]),
            &settings,
            BTreeSet::new(),
        );
        let live = live_of(&old);
        let kept: BTreeSet<String> = old.planned[0].names().into_iter().collect();
        let empty = Resolution {
            policies: vec![],
            problems: vec![],
        };
        assert_eq!(
            diff(&plan(&empty, &settings, kept), &live, ALL_KNOWN),
            vec![]
        );

        let cases = [
            (ALL_KNOWN, true),
            (
                Known {
                    xrds: true,
                    cascade_policies: false,
                },
                false,
            ),
            (
                Known {
                    xrds: false,
                    cascade_policies: true,
                },
                true,
            ),
        ];
        for (known, removable) in cases {
            let found = diff(&plan(&empty, &settings, BTreeSet::new()), &live, known);
            assert!(!found.is_empty());
            assert!(
                found.iter().all(|d| d.drift == Drift::Extra { removable }),
                "{known:?}: {found:?}"
            );
        }
    }

    #[test]
    fn objects_are_removable_only_with_their_input_read() {
        let cases = [
            ("cascade-guard-update-xrd-x.example.org", true, false, true),
            ("cascade-guard-update-xrd-x.example.org", false, true, false),
            ("cascade-guard-update-policy-x", false, true, true),
            ("cascade-guard-update-policy-x", true, false, false),
            ("cascade-guard-xrd-x.example.org", true, false, true),
            ("cascade-guard-policy-x", true, false, false),
            ("cascade-guard-other", true, false, false),
            ("cascade-guard-other", true, true, true),
            ("cascade-guard-claim-x.example.org", true, false, true),
            (
                "cascade-guard-update-claim-x.example.org",
                false,
                true,
                false,
            ),
        ];
        for (name, xrds, cascade_policies, want) in cases {
            let known = Known {
                xrds,
                cascade_policies,
            };
            assert_eq!(removable(name, known), want, "{name}");
        }
    }
}
