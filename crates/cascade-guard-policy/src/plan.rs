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
    fn live_of(plan: &AdmissionPlan) -> Live {
        let mut live = Live::default();
        for c in &plan.objects {
            let name = c.policy.metadata.name.clone().unwrap_or_default();
            live.policies.insert(
                name.clone(),
                serde_json::to_value(&c.policy).unwrap_or_default(),
            );
            live.bindings
                .insert(name, serde_json::to_value(&c.binding).unwrap_or_default());
        }
        live
    }

    /// The plan for one XRD under Refuse.
    fn one_refuse_xrd(settings: &CompileSettings) -> AdmissionPlan {
        plan(
            &resolution(vec![policy("A", Mode::Refuse, xrd("as.example.org"))]),
            settings,
            BTreeSet::new(),
        )
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
        assert!(plan.planned[1].names.is_empty());
        assert_eq!(plan.object_count(), 4);
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
        let wanted = one_refuse_xrd(&settings);
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
        assert_eq!(found[0].sources, vec![xrd("as.example.org")]);
        assert_eq!(found.last().map(|d| d.sources.clone()), Some(vec![]));
    }

    #[test]
    fn a_binding_without_rules_matches_all_its_policy_does() {
        let settings = CompileSettings::default();
        let wanted = one_refuse_xrd(&settings);
        let name = wanted.planned[0].names()[0].clone();
        let rules =
            live_of(&wanted).policies[&name]["spec"]["matchConstraints"]["resourceRules"].clone();
        let mut narrowed = rules.clone();
        narrowed[0]["resources"] = serde_json::json!(["others"]);
        // A binding given its policy's rules (as 0.1.0 wrote it) or other
        // rules (someone narrowed it) is put right, and taking rules away
        // takes no kind away; an empty list constrains nothing, as none.
        for (live_rules, want) in [
            (rules, Some(false)),
            (narrowed, Some(false)),
            (serde_json::json!([]), None),
        ] {
            let mut live = live_of(&wanted);
            if let Some(b) = live.bindings.get_mut(&name) {
                b["spec"]["matchResources"]["resourceRules"] = live_rules.clone();
            }
            let found = diff(&wanted, &live, ALL_KNOWN);
            let got: Vec<(ObjectKind, bool, &Drift)> =
                found.iter().map(|d| (d.kind, d.loses, &d.drift)).collect();
            let d = Drift::Differs {
                path: "spec.matchResources.resourceRules".into(),
            };
            let want: Vec<(ObjectKind, bool, &Drift)> = want
                .map(|loses| (ObjectKind::Binding, loses, &d))
                .into_iter()
                .collect();
            assert_eq!(got, want, "{live_rules}");
        }
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
            assert_eq!(removable(name, &Value::Null, known), want, "{name}");
        }
    }

    #[test]
    fn an_extra_object_is_placed_by_the_source_it_records() {
        use serde_json::json;
        let xrds_only = Known {
            xrds: true,
            cascade_policies: false,
        };
        let recording = |key: &str, value: &str| json!({"metadata": {"annotations": {key: value}}});
        let cases = [
            // What the object records, whatever its name says.
            (
                "cascade-guard-other",
                recording(
                    SOURCE_ANNOTATION,
                    "CompositeResourceDefinition/x.example.org (its claims)",
                ),
                true,
            ),
            (
                "cascade-guard-policy-x",
                recording(
                    SOURCE_ANNOTATION,
                    "CompositeResourceDefinition/x.example.org",
                ),
                true,
            ),
            (
                "cascade-guard-xrd-x.example.org",
                recording(SOURCE_ANNOTATION, "CascadePolicy/x"),
                false,
            ),
            (
                "cascade-guard-other",
                recording(PROTECTED_KINDS_ANNOTATION, "{}"),
                true,
            ),
            // Nothing readable recorded: what the name says.
            (
                "cascade-guard-xrd-x.example.org",
                recording(SOURCE_ANNOTATION, "x"),
                true,
            ),
            ("cascade-guard-policy-x", json!({}), false),
            ("cascade-guard-other", json!({}), false),
        ];
        for (name, object, want) in cases {
            assert_eq!(
                removable(name, &object, xrds_only),
                want,
                "{name}: {object}"
            );
        }
        // What cascade-guard writes records what its name says.
        let written = plan(
            &resolution(vec![
                policy("A", Mode::Refuse, xrd("as.example.org")),
                policy("Z", Mode::Warn, Source::CascadePolicy { name: "z".into() }),
            ]),
            &CompileSettings::default(),
            BTreeSet::new(),
        );
        let live = live_of(&written);
        for (name, object) in live.policies.iter().chain(&live.bindings) {
            assert!(recorded_input(object).is_some(), "{name}");
            assert_eq!(recorded_input(object), named_input(name), "{name}");
        }
    }

    #[test]
    fn a_kind_changing_mode_joins_its_new_pair_before_it_leaves_the_old() {
        let settings = CompileSettings::default();
        let before = plan(
            &resolution(vec![
                policy("A", Mode::Refuse, xrd("as.example.org")),
                policy("B", Mode::Refuse, xrd("bs.example.org")),
                policy("C", Mode::Convert, xrd("cs.example.org")),
            ]),
            &settings,
            BTreeSet::new(),
        );
        let live = live_of(&before);
        // B's XRD now says Convert: the Convert pairs gain B, the Refuse ones lose it.
        let after = plan(
            &resolution(vec![
                policy("A", Mode::Refuse, xrd("as.example.org")),
                policy("B", Mode::Convert, xrd("bs.example.org")),
                policy("C", Mode::Convert, xrd("cs.example.org")),
            ]),
            &settings,
            BTreeSet::new(),
        );
        let found = diff(&after, &live, ALL_KNOWN);
        let order: Vec<(&str, ObjectKind)> =
            found.iter().map(|d| (d.name.as_str(), d.kind)).collect();
        let pair = |name| [(name, ObjectKind::Policy), (name, ObjectKind::Binding)];
        let mut want = Vec::new();
        for name in [
            "cascade-guard-xrds-convert-composite",
            "cascade-guard-update-xrds-convert-composite",
            "cascade-guard-xrds-refuse-composite",
            "cascade-guard-update-xrds-refuse-composite",
        ] {
            want.extend(pair(name));
        }
        assert_eq!(order, want);
        let convert = &found[0];
        assert_eq!(
            convert.sources,
            vec![xrd("bs.example.org"), xrd("cs.example.org")]
        );
    }

    #[test]
    fn an_upgrade_from_per_kind_objects_writes_the_shared_ones_first() {
        let settings = CompileSettings::default();
        let wanted = one_refuse_xrd(&settings);
        let mut live = Live::default();
        for name in [
            "cascade-guard-xrd-as.example.org",
            "cascade-guard-update-xrd-as.example.org",
        ] {
            live.policies.insert(name.into(), serde_json::json!({}));
            live.bindings.insert(name.into(), serde_json::json!({}));
        }
        for (known, removable) in [
            (ALL_KNOWN, true),
            (
                Known {
                    xrds: false,
                    cascade_policies: true,
                },
                false,
            ),
        ] {
            let found = diff(&wanted, &live, known);
            let drifts: Vec<&Drift> = found.iter().map(|d| &d.drift).collect();
            let extra = Drift::Extra { removable };
            let mut want = vec![&Drift::Missing; 4];
            want.extend([&extra; 4]);
            assert_eq!(drifts, want, "{known:?}");
        }
        for name in [
            "cascade-guard-xrds-convert-claim",
            "cascade-guard-update-xrds-warn-composite",
        ] {
            assert!(removable(
                name,
                &Value::Null,
                Known {
                    xrds: true,
                    cascade_policies: false
                }
            ));
            assert!(!removable(
                name,
                &Value::Null,
                Known {
                    xrds: false,
                    cascade_policies: true
                }
            ));
        }
    }

    #[test]
    fn crossing_the_spread_threshold_writes_the_new_pairs_before_the_first_loses_kinds() {
        let settings = CompileSettings::default();
        let kinds = |n: usize| -> Vec<Policy> {
            (0..n)
                .map(|i| {
                    policy(
                        &format!("K{i}"),
                        Mode::Refuse,
                        xrd(&format!("k{i}s.example.org")),
                    )
                })
                .collect()
        };
        let n = crate::admission::SHARED_KINDS_BEFORE_SPREAD;
        let before = plan(&resolution(kinds(n)), &settings, BTreeSet::new());
        assert_eq!(before.objects.len(), 2);
        let after = plan(&resolution(kinds(n + 1)), &settings, BTreeSet::new());
        let found = diff(&after, &live_of(&before), ALL_KNOWN);
        let first = "cascade-guard-xrds-refuse-composite";
        let position = |name: &str| found.iter().position(|d| d.name == name);
        let first_at = position(first).expect("the first pair changes");
        assert!(
            found[first_at..].iter().all(|d| d.drift != Drift::Missing),
            "{found:?}"
        );
        let missing = found.iter().filter(|d| d.drift == Drift::Missing).count();
        assert!(missing >= 2 * 8, "{missing}");
    }

    #[test]
    fn after_a_failed_write_nothing_takes_a_kind_away_in_the_same_pass() {
        let settings = CompileSettings::default();
        let before = plan(
            &resolution(vec![
                policy("A", Mode::Refuse, xrd("as.example.org")),
                policy("B", Mode::Refuse, xrd("bs.example.org")),
            ]),
            &settings,
            BTreeSet::new(),
        );
        let mut live = live_of(&before);
        live.policies.insert(
            "cascade-guard-xrd-as.example.org".into(),
            serde_json::json!({}),
        );
        // B moves to Convert; a binding edited to Warn is put right.
        if let Some(b) = live
            .bindings
            .get_mut("cascade-guard-update-xrds-refuse-composite")
        {
            b["spec"]["validationActions"] = serde_json::json!(["Warn"]);
        }
        let after = plan(
            &resolution(vec![
                policy("A", Mode::Refuse, xrd("as.example.org")),
                policy("B", Mode::Convert, xrd("bs.example.org")),
            ]),
            &settings,
            BTreeSet::new(),
        );
        let found = diff(&after, &live, ALL_KNOWN);
        // (name, kind, loses, may go ahead after a failure)
        let got: Vec<(&str, ObjectKind, bool, bool)> = found
            .iter()
            .map(|d| (d.name.as_str(), d.kind, d.loses, may_write(d, true)))
            .collect();
        let p = ObjectKind::Policy;
        let b = ObjectKind::Binding;
        assert_eq!(
            got,
            [
                ("cascade-guard-xrds-convert-composite", p, false, true),
                ("cascade-guard-xrds-convert-composite", b, false, true),
                (
                    "cascade-guard-update-xrds-convert-composite",
                    p,
                    false,
                    true
                ),
                (
                    "cascade-guard-update-xrds-convert-composite",
                    b,
                    false,
                    true
                ),
                ("cascade-guard-xrds-refuse-composite", p, true, false),
                ("cascade-guard-xrds-refuse-composite", b, true, false),
                ("cascade-guard-update-xrds-refuse-composite", p, true, false),
                ("cascade-guard-update-xrds-refuse-composite", b, true, false),
                ("cascade-guard-xrd-as.example.org", p, true, false),
            ]
        );
        assert!(found.iter().all(|d| may_write(d, false)));
    }
}
