//! What the cluster should contain, and how what it does contain differs
//! (pure): one plan and one diff behind the controller's apply, `status` and
//! `render`, so that `status` reports exactly what the controller would do.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::admission::{Compiled, compile_with_names};
use crate::drift::first_difference;
use crate::names::{
    CASCADE_POLICY_KIND, CASCADE_POLICY_OBJECT_PREFIX, CLAIM_OBJECT_PREFIX,
    PROTECTED_KINDS_ANNOTATION, SOURCE_ANNOTATION, UPDATE_CASCADE_POLICY_OBJECT_PREFIX,
    UPDATE_CLAIM_OBJECT_PREFIX, UPDATE_XRD_OBJECT_PREFIX, UPDATE_XRDS_OBJECT_PREFIX, XRD_KIND,
    XRD_OBJECT_PREFIX, XRDS_OBJECT_PREFIX,
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

/// One policy in force and the names of the admission objects that carry it
/// (none for Off; an XRD's are shared with the other XRDs of its mode and shape).
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub policy: Policy,
    pub names: Vec<String>,
}

impl Planned {
    /// The names of its objects (each policy and binding pair shares one).
    pub fn names(&self) -> Vec<String> {
        self.names.clone()
    }
}

/// The admission plan: the policies and bindings the cluster should contain
/// (the teardown plan of one tree is `cascade-guard plan`'s, `cli::plan::Plan`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AdmissionPlan {
    pub planned: Vec<Planned>,
    /// Every pair the policies compile to, in policy order.
    pub objects: Vec<Compiled>,
    /// Names wanted exactly as they are in the cluster: the last good
    /// compilation of a CascadePolicy that now names a kind no CRD defines.
    pub kept: BTreeSet<String>,
}

/// Compiles every policy in force.
pub fn plan(
    resolution: &Resolution,
    settings: &CompileSettings,
    kept: BTreeSet<String>,
) -> AdmissionPlan {
    let (objects, names) = compile_with_names(&resolution.policies, settings);
    AdmissionPlan {
        planned: resolution
            .policies
            .iter()
            .zip(names)
            .map(|(p, names)| Planned {
                policy: p.clone(),
                names,
            })
            .collect(),
        objects,
        kept,
    }
}

impl AdmissionPlan {
    /// Every name the plan wants, kept ones included.
    pub fn wanted_names(&self) -> BTreeSet<String> {
        let mut names = self.kept.clone();
        names.extend(
            self.objects
                .iter()
                .filter_map(|c| c.policy.metadata.name.clone()),
        );
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
        self.objects.len() * 2
    }

    /// The compiled pair named `name`, with the first policy it carries.
    pub fn compiled(&self, name: &str) -> Option<(&Policy, &Compiled)> {
        let compiled = self
            .objects
            .iter()
            .find(|c| c.policy.metadata.name.as_deref() == Some(name))?;
        let first = self
            .planned
            .iter()
            .find(|p| p.names.iter().any(|n| n == name))?;
        Some((&first.policy, compiled))
    }

    /// The policies the pair named `name` carries.
    pub fn carried_by<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Policy> + 'a {
        self.planned
            .iter()
            .filter(move |p| p.names.iter().any(|n| n == name))
            .map(|p| &p.policy)
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
    /// The policies that want it (none for an extra object; several for an
    /// object XRDs share).
    pub sources: Vec<Source>,
    /// Whether writing it takes a kind out of the object's rules (a kind
    /// leaving a shared pair): such a write waits while a write before it in
    /// the same pass failed, since that one may have been the kind's new pair
    /// (see [`may_write`]).
    pub loses: bool,
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
/// but the other order is the honest one), the pairs that start matching a
/// kind before those that stop (a kind moving from one shared pair to another,
/// when its XRD changes mode, is never in neither); then the extra bindings
/// before the extra policies (so no binding is left pointing at nothing).
pub fn diff(plan: &AdmissionPlan, live: &Live, known: Known) -> Vec<Difference> {
    let mut gaining = Vec::new();
    let mut others = Vec::new();
    for compiled in &plan.objects {
        let Some(name) = compiled.policy.metadata.name.clone() else {
            continue;
        };
        let sources: Vec<Source> = plan.carried_by(&name).map(|p| p.source.clone()).collect();
        let desired = [
            (ObjectKind::Policy, serde_json::to_value(&compiled.policy)),
            (ObjectKind::Binding, serde_json::to_value(&compiled.binding)),
        ];
        let mut changes = Vec::new();
        let mut gains = false;
        let mut loses = false;
        for (kind, desired) in desired {
            // Serialising generated types does not fail; if it did, the
            // object counts as missing and its write says why.
            let drift = match (desired, live.of(kind).get(&name)) {
                (_, None) | (Err(_), Some(_)) => Some(Drift::Missing),
                (Ok(desired), Some(live)) => {
                    let (want, have) = (matched(&desired, kind), matched(live, kind));
                    gains |= !covers(&have, &want);
                    loses |= !covers(&want, &have);
                    first_difference(&desired, live).map(|path| Drift::Differs { path })
                }
            };
            if let Some(drift) = drift {
                gains |= drift == Drift::Missing;
                changes.push(Difference {
                    kind,
                    name: name.clone(),
                    sources: sources.clone(),
                    loses: false,
                    drift,
                });
            }
        }
        for change in &mut changes {
            change.loses = loses;
        }
        if gains {
            gaining.extend(changes);
        } else {
            others.extend(changes);
        }
    }
    let mut out = gaining;
    out.extend(others);
    let wanted = plan.wanted_names();
    for kind in [ObjectKind::Binding, ObjectKind::Policy] {
        for (name, object) in live.of(kind).iter().filter(|(n, _)| !wanted.contains(*n)) {
            out.push(Difference {
                kind,
                name: name.clone(),
                sources: Vec::new(),
                loses: true,
                drift: Drift::Extra {
                    removable: removable(name, object, known),
                },
            });
        }
    }
    out
}

/// Whether a change may be made in a pass in which a write before it
/// failed: not one that takes a kind out of an object (a kind leaving a
/// shared pair, an extra object removed), as the failed write may have been
/// the one that put the kind in its new place. The rest (new objects, objects
/// put right after an edit) goes ahead.
pub fn may_write(change: &Difference, after_a_failed_write: bool) -> bool {
    !(after_a_failed_write && change.loses)
}

/// `a` matches all that `b` does (None: everything its policy matches).
fn covers(a: &Option<BTreeSet<[String; 4]>>, b: &Option<BTreeSet<[String; 4]>>) -> bool {
    match (a, b) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(a), Some(b)) => b.is_subset(a),
    }
}

/// Every (group, resource, scope, operation) an admission object's rules
/// match, from its JSON; None for a binding without rules (or an empty
/// list), which matches whatever its policy does.
fn matched(object: &Value, kind: ObjectKind) -> Option<BTreeSet<[String; 4]>> {
    let pointer = match kind {
        ObjectKind::Policy => "/spec/matchConstraints/resourceRules",
        ObjectKind::Binding => "/spec/matchResources/resourceRules",
    };
    let unconstrained = object
        .pointer(pointer)
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty);
    if kind == ObjectKind::Binding && unconstrained {
        return None;
    }
    let strings = |rule: &Value, field: &str| -> Vec<String> {
        rule.get(field)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut out = BTreeSet::new();
    for rule in object
        .pointer(pointer)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let scope = rule
            .get("scope")
            .and_then(Value::as_str)
            .unwrap_or("*")
            .to_string();
        for group in strings(rule, "apiGroups") {
            for resource in strings(rule, "resources") {
                for operation in strings(rule, "operations") {
                    out.insert([group.clone(), resource.clone(), scope.clone(), operation]);
                }
            }
        }
    }
    Some(out)
}

/// The input an admission object came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Input {
    Xrds,
    CascadePolicies,
}

/// Whether an extra object may be removed: only when the input it came from
/// was read completely (an object of unknown origin, when both were). Where
/// it came from is what it records ([`recorded_input`]); only an object that
/// records nothing (written by hand) is placed by its name's prefix.
fn removable(name: &str, object: &Value, known: Known) -> bool {
    match recorded_input(object).or_else(|| named_input(name)) {
        Some(Input::Xrds) => known.xrds,
        Some(Input::CascadePolicies) => known.cascade_policies,
        None => known.xrds && known.cascade_policies,
    }
}

/// Where an object says it came from: a shared pair lists its XRDs' kinds
/// ([`PROTECTED_KINDS_ANNOTATION`]), a pair of one source names it
/// ([`SOURCE_ANNOTATION`], `Kind/name`).
fn recorded_input(object: &Value) -> Option<Input> {
    let annotations = object.pointer("/metadata/annotations")?;
    if annotations.get(PROTECTED_KINDS_ANNOTATION).is_some() {
        return Some(Input::Xrds);
    }
    let source = annotations.get(SOURCE_ANNOTATION)?.as_str()?;
    match source.split_once('/')?.0 {
        XRD_KIND => Some(Input::Xrds),
        CASCADE_POLICY_KIND => Some(Input::CascadePolicies),
        _ => None,
    }
}

/// Where an object's name says it came from.
fn named_input(name: &str) -> Option<Input> {
    let from_xrd = [
        XRDS_OBJECT_PREFIX,
        UPDATE_XRDS_OBJECT_PREFIX,
        XRD_OBJECT_PREFIX,
        UPDATE_XRD_OBJECT_PREFIX,
        CLAIM_OBJECT_PREFIX,
        UPDATE_CLAIM_OBJECT_PREFIX,
    ];
    if from_xrd.iter().any(|p| name.starts_with(p)) {
        Some(Input::Xrds)
    } else if name.starts_with(CASCADE_POLICY_OBJECT_PREFIX)
        || name.starts_with(UPDATE_CASCADE_POLICY_OBJECT_PREFIX)
    {
        Some(Input::CascadePolicies)
    } else {
        None
    }
}

#[cfg(test)]
mod tests;
