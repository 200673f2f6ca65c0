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
    let order: Vec<(&str, ObjectKind)> = found.iter().map(|d| (d.name.as_str(), d.kind)).collect();
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
