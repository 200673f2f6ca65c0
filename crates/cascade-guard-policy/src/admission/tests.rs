use super::*;
use crate::kind::{ProtectedKind, Scope, Shape};
use crate::naming::{object_name, update_object_name};
use crate::selector::is_dns_subdomain;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube_core::ResourceExt;

fn policy(source: Source, mode: Mode, scope: Scope, selector: Option<LabelSelector>) -> Policy {
    Policy {
        kind: ProtectedKind {
            group: "modelplane.ai".into(),
            kind: "InferenceCluster".into(),
            plural: "inferenceclusters".into(),
            scope,
            shape: Shape::CompositeResource,
        },
        mode,
        selector,
        source,
    }
}

fn xrd_source(name: &str) -> Source {
    Source::Xrd {
        name: name.into(),
        annotated: true,
        claim: false,
    }
}

#[test]
fn fnv_known_values() {
    // Published FNV-1a 64 test vectors.
    assert_eq!(fnv1a_64(b""), 0xcbf29ce484222325);
    assert_eq!(fnv1a_64(b"a"), 0xaf63dc4c8601ec8c);
    assert_eq!(fnv1a_64(b"foobar"), 0x85944171f73967e8);
}

#[test]
fn names() {
    let cases = [
        (
            xrd_source("inferenceclusters.modelplane.ai"),
            "cascade-guard-xrd-inferenceclusters.modelplane.ai",
        ),
        (
            Source::CascadePolicy {
                name: "databases".into(),
            },
            "cascade-guard-policy-databases",
        ),
    ];
    for (source, want) in cases {
        assert_eq!(object_name(&source), want);
    }
}

#[test]
fn long_and_odd_names_are_valid_distinct_and_stable() {
    let long_a = format!("{}.example.org", "a".repeat(250));
    let long_b = format!("{}.example.org", "a".repeat(251));
    let inputs = [
        long_a.clone(),
        long_b.clone(),
        format!("{}.", "b".repeat(260)),
        "Upper.Case".to_string(),
        "under_score".to_string(),
        "a..b".to_string(),
        "-.-".to_string(),
        "日本".to_string(),
    ];
    let mut seen = std::collections::BTreeSet::new();
    for raw in &inputs {
        let name = object_name(&xrd_source(raw));
        assert!(is_dns_subdomain(&name), "{raw:?} -> {name:?}");
        assert!(name.len() <= 253, "{raw:?}");
        assert!(name.starts_with("cascade-guard-xrd-"), "{name}");
        assert_eq!(name, object_name(&xrd_source(raw)), "stable");
        assert!(seen.insert(name), "{raw:?} collides");
    }
    let a = object_name(&xrd_source(&long_a));
    assert_eq!(a.len(), 253);
    assert!(a.starts_with(&format!("cascade-guard-xrd-{}", "a".repeat(200))));
}

#[test]
fn actions_by_mode() {
    // (mode, validation actions, audits why it allowed)
    let cases = [
        (Mode::Refuse, Some(vec!["Deny"]), false),
        (Mode::Convert, Some(vec!["Deny"]), false),
        (Mode::Warn, Some(vec!["Warn", "Audit"]), true),
        (Mode::Off, None, false),
    ];
    for (mode, want, audited) in cases {
        let p = policy(xrd_source("x.example.org"), mode, Scope::Cluster, None);
        let compiled = compile(&p, &CompileSettings::default());
        assert_eq!(compiled.len(), if want.is_some() { 2 } else { 0 });
        let names: Vec<String> = compiled.iter().map(|c| c.policy.name_any()).collect();
        assert_eq!(names, object_names(&p), "{mode}");
        for c in &compiled {
            assert_eq!(c.binding.name_any(), c.policy.name_any());
            assert_eq!(c.binding.spec.policy_name, c.policy.name_any());
        }
        let got = compiled
            .first()
            .map(|c| c.binding.spec.validation_actions.clone());
        let want = want.map(|w| w.into_iter().map(String::from).collect::<Vec<_>>());
        assert_eq!(got, want, "{mode}");
        // The UPDATE pair acts like the DELETE pair.
        assert_eq!(
            compiled
                .last()
                .map(|c| c.binding.spec.validation_actions.clone()),
            want,
            "{mode}"
        );
        assert_eq!(validation_actions(mode).is_some(), !compiled.is_empty());
        let audit_keys: Vec<String> = compiled
            .iter()
            .filter_map(|c| c.policy.spec.as_ref()?.audit_annotations.clone())
            .flatten()
            .map(|a| a.key)
            .collect();
        assert_eq!(audit_keys == ["decision"], audited, "{mode}");
        let conditions: Vec<String> = compiled
            .iter()
            .filter_map(|c| c.policy.spec.as_ref()?.match_conditions.clone())
            .flatten()
            .map(|c| c.name)
            .collect();
        // Warn's DELETE policy evaluates everything (to audit); every
        // UPDATE policy stops ordinary updates at its condition.
        let want_conditions: Vec<&str> = match (compiled.is_empty(), audited) {
            (true, _) => vec![],
            (false, true) => vec![GUARDED_UPDATE_CONDITION],
            (false, false) => vec![UNSAFE_DELETE_CONDITION, GUARDED_UPDATE_CONDITION],
        };
        assert_eq!(conditions, want_conditions, "{mode}");
    }
}

#[test]
fn objects_are_complete() {
    let selector = LabelSelector {
        match_labels: Some([("tier".to_string(), "prod".to_string())].into()),
        match_expressions: None,
    };
    for (scope, sel) in [
        (Scope::Namespaced, Some(selector.clone())),
        (Scope::Cluster, None),
        (Scope::Unknown, None),
    ] {
        let p = policy(
            Source::CascadePolicy { name: "ic".into() },
            Mode::Refuse,
            scope,
            sel.clone(),
        );
        let all = compile(&p, &CompileSettings::default());
        let c = &all[0];
        let vap = serde_json::to_value(&c.policy).unwrap();
        let binding = serde_json::to_value(&c.binding).unwrap();
        for obj in [&vap, &binding] {
            assert_eq!(obj["apiVersion"], "admissionregistration.k8s.io/v1");
            assert_eq!(obj["metadata"]["name"], "cascade-guard-policy-ic");
            assert_eq!(
                obj["metadata"]["labels"]["app.kubernetes.io/managed-by"],
                "cascade-guard"
            );
            let ann = &obj["metadata"]["annotations"];
            assert_eq!(ann["cascade-guard.dev/source"], "CascadePolicy/ic");
            assert_eq!(
                ann["cascade-guard.dev/protected-kind"],
                "InferenceCluster.modelplane.ai"
            );
            assert_eq!(ann["cascade-guard.dev/mode"], "Refuse");
            assert_eq!(ann["cascade-guard.dev/mode-from"], "cascadepolicy");
        }
        assert_eq!(vap["kind"], "ValidatingAdmissionPolicy");
        assert_eq!(binding["kind"], "ValidatingAdmissionPolicyBinding");

        let spec = &vap["spec"];
        assert_eq!(spec["failurePolicy"], "Fail");
        let rule = serde_json::json!({
            "apiGroups": ["modelplane.ai"],
            "apiVersions": ["*"],
            "operations": ["DELETE"],
            "resources": ["inferenceclusters"],
            "scope": scope.admission_scope(),
        });
        assert_eq!(
            spec["matchConstraints"],
            serde_json::json!({"resourceRules": [rule.clone()], "matchPolicy": "Exact"})
        );
        assert_eq!(spec["validations"][0]["reason"], "Forbidden");
        assert!(spec["validations"][0]["messageExpression"].is_string());
        assert!(spec["validations"][0]["message"].is_string());
        // Refuse here: the allow reasons are audited in Warn mode only,
        // and safe deletes stop at the match condition.
        assert!(spec.get("auditAnnotations").is_none());
        assert_eq!(spec["matchConditions"][0]["name"], "unsafe-delete");
        let condition = spec["matchConditions"][0]["expression"].as_str().unwrap();
        assert!(condition.starts_with("!(") && !condition.contains("variables."));
        // Written out: no variables (kubernetes/kubernetes#135757).
        assert!(spec.get("variables").is_none(), "{spec}");
        for e in [
            &spec["validations"][0]["expression"],
            &spec["validations"][0]["messageExpression"],
        ] {
            assert!(!e.as_str().unwrap().contains("variables."), "{e}");
        }

        let bspec = &binding["spec"];
        assert_eq!(bspec["policyName"], "cascade-guard-policy-ic");
        // No rules of its own: it matches what its policy does.
        assert!(bspec["matchResources"].get("resourceRules").is_none());
        assert_eq!(bspec["matchResources"]["matchPolicy"], "Exact");
        // The selector goes on the binding only.
        match &sel {
            Some(s) => assert_eq!(
                bspec["matchResources"]["objectSelector"],
                serde_json::to_value(s).unwrap()
            ),
            None => assert!(bspec["matchResources"].get("objectSelector").is_none()),
        }
        assert!(spec["matchConstraints"].get("objectSelector").is_none());

        // The UPDATE pair: the same kind and selector, on UPDATE.
        let update = &all[1];
        let uvap = serde_json::to_value(&update.policy).unwrap();
        let ubinding = serde_json::to_value(&update.binding).unwrap();
        assert_eq!(uvap["metadata"]["name"], "cascade-guard-update-policy-ic");
        assert_eq!(
            uvap["metadata"]["annotations"],
            vap["metadata"]["annotations"]
        );
        assert_eq!(uvap["metadata"]["labels"], vap["metadata"]["labels"]);
        let mut urule = rule.clone();
        urule["operations"] = serde_json::json!(["UPDATE"]);
        assert_eq!(
            uvap["spec"]["matchConstraints"],
            serde_json::json!({"resourceRules": [urule.clone()], "matchPolicy": "Exact"})
        );
        assert_eq!(uvap["spec"]["matchConditions"][0]["name"], "guarded-change");
        assert!(uvap["spec"].get("auditAnnotations").is_none());
        assert_eq!(uvap["spec"]["validations"].as_array().unwrap().len(), 2);
        assert!(
            ubinding["spec"]["matchResources"]
                .get("resourceRules")
                .is_none()
        );
        assert_eq!(
            ubinding["spec"]["matchResources"].get("objectSelector"),
            bspec["matchResources"].get("objectSelector")
        );
    }
}

#[test]
fn update_names_never_equal_delete_names() {
    let sources = [
        xrd_source("update-x.example.org"),
        xrd_source("x.example.org"),
        Source::CascadePolicy {
            name: "update-x".into(),
        },
        Source::CascadePolicy { name: "x".into() },
        xrd_source(&"u".repeat(300)),
    ];
    let delete: std::collections::BTreeSet<String> = sources.iter().map(object_name).collect();
    for s in &sources {
        let name = update_object_name(s);
        assert!(is_dns_subdomain(&name), "{name}");
        assert!(!delete.contains(&name), "{name}");
    }
    assert_eq!(
        update_object_name(&xrd_source("x.example.org")),
        "cascade-guard-update-xrd-x.example.org"
    );
}

fn xrd_policy(kind: &str, group: &str, mode: Mode, shape: Shape, annotated: bool) -> Policy {
    Policy {
        kind: ProtectedKind {
            group: group.into(),
            kind: kind.into(),
            plural: format!("{}s", kind.to_lowercase()),
            scope: if shape == Shape::Claim {
                Scope::Namespaced
            } else {
                Scope::Cluster
            },
            shape,
        },
        mode,
        selector: None,
        source: Source::Xrd {
            name: format!("{}s.{group}", kind.to_lowercase()),
            annotated,
            claim: shape == Shape::Claim,
        },
    }
}

#[test]
fn xrds_of_one_mode_and_shape_share_one_pair_naming_every_kind() {
    let selector = LabelSelector {
        match_labels: Some([("tier".to_string(), "prod".to_string())].into()),
        match_expressions: None,
    };
    let mut own = policy(
        Source::CascadePolicy { name: "dbs".into() },
        Mode::Refuse,
        Scope::Namespaced,
        Some(selector.clone()),
    );
    own.kind.kind = "Database".into();
    own.kind.plural = "databases".into();
    let policies = vec![
        xrd_policy(
            "B",
            "b.example.org",
            Mode::Refuse,
            Shape::CompositeResource,
            true,
        ),
        xrd_policy(
            "A",
            "a.example.org",
            Mode::Refuse,
            Shape::CompositeResource,
            false,
        ),
        xrd_policy(
            "C",
            "a.example.org",
            Mode::Refuse,
            Shape::CompositeResource,
            true,
        ),
        own.clone(),
        xrd_policy(
            "D",
            "a.example.org",
            Mode::Convert,
            Shape::CompositeResource,
            true,
        ),
        xrd_policy("AClaim", "a.example.org", Mode::Refuse, Shape::Claim, true),
        xrd_policy(
            "E",
            "a.example.org",
            Mode::Off,
            Shape::CompositeResource,
            true,
        ),
    ];
    let settings = CompileSettings::default();
    let all = compile_all(&policies, &settings);
    let names: Vec<String> = all.iter().map(|c| c.policy.name_any()).collect();
    assert_eq!(
        names,
        [
            "cascade-guard-xrds-refuse-composite",
            "cascade-guard-update-xrds-refuse-composite",
            "cascade-guard-policy-dbs",
            "cascade-guard-update-policy-dbs",
            "cascade-guard-xrds-convert-composite",
            "cascade-guard-update-xrds-convert-composite",
            "cascade-guard-xrds-refuse-claim",
            "cascade-guard-update-xrds-refuse-claim",
        ]
    );
    // Every policy's names are those of a compiled pair that matches its kind.
    for p in &policies {
        for name in object_names(p) {
            let c = all.iter().find(|c| c.policy.name_any() == name).unwrap();
            let vap = serde_json::to_value(&c.policy).unwrap();
            let rules = vap["spec"]["matchConstraints"]["resourceRules"]
                .as_array()
                .unwrap();
            assert!(
                rules
                    .iter()
                    .any(|r| r["apiGroups"][0] == p.kind.group.as_str()
                        && r["resources"]
                            .as_array()
                            .unwrap()
                            .contains(&p.kind.plural.clone().into())),
                "{name} does not match {}",
                p.kind
            );
        }
    }
    // One rule per group and scope, plurals sorted; the binding has the
    // same rules and no selector.
    let shared = serde_json::to_value(&all[0].policy).unwrap();
    let rule = |group: &str, resources: &[&str]| {
        serde_json::json!({"apiGroups": [group], "apiVersions": ["*"], "operations": ["DELETE"],
                "resources": resources, "scope": "Cluster"})
    };
    assert_eq!(
        shared["spec"]["matchConstraints"]["resourceRules"],
        serde_json::json!([
            rule("a.example.org", &["as", "cs"]),
            rule("b.example.org", &["bs"])
        ])
    );
    let binding = serde_json::to_value(&all[0].binding).unwrap();
    assert_eq!(
        binding["spec"]["matchResources"],
        serde_json::json!({"matchPolicy": "Exact"})
    );
    // Per kind, where its policy comes from.
    let ann = &shared["metadata"]["annotations"];
    assert_eq!(ann["cascade-guard.dev/mode"], "Refuse");
    assert!(ann.get("cascade-guard.dev/source").is_none());
    let kinds: serde_json::Value =
        serde_json::from_str(ann["cascade-guard.dev/protected-kinds"].as_str().unwrap()).unwrap();
    assert_eq!(
        kinds,
        serde_json::json!({
            "A.a.example.org": {"source": "CompositeResourceDefinition/as.a.example.org", "modeFrom": "xrd-default-mode"},
            "B.b.example.org": {"source": "CompositeResourceDefinition/bs.b.example.org", "modeFrom": "xrd-annotation"},
            "C.a.example.org": {"source": "CompositeResourceDefinition/cs.a.example.org", "modeFrom": "xrd-annotation"},
        })
    );
    // The CascadePolicy keeps its own pair, with its selector.
    let mine = serde_json::to_value(&all[2].binding).unwrap();
    assert_eq!(
        mine["spec"]["matchResources"]["objectSelector"],
        serde_json::to_value(&selector).unwrap()
    );
    assert_eq!(compile(&own, &settings), all[2..4].to_vec());

    // The order the XRDs were read in changes nothing.
    let mut reversed = policies.clone();
    reversed.reverse();
    let again = compile_all(&reversed, &settings);
    for c in &all {
        let same = again
            .iter()
            .find(|a| a.policy.name_any() == c.policy.name_any())
            .unwrap();
        assert_eq!(same, c);
    }
}

#[test]
fn a_kind_whose_names_cannot_be_in_a_rule_gets_a_pair_of_its_own() {
    let settings = CompileSettings::default();
    let good = xrd_policy(
        "A",
        "a.example.org",
        Mode::Refuse,
        Shape::CompositeResource,
        true,
    );
    for (plural, group) in [
        ("*", "a.example.org"),
        ("as/status", "a.example.org"),
        ("", "a.example.org"),
        ("Widgets", "a.example.org"),
        ("bs", "*"),
    ] {
        let mut odd = xrd_policy("B", group, Mode::Refuse, Shape::CompositeResource, true);
        odd.kind.plural = plural.to_string();
        assert!(!is_shared(&odd), "{plural:?} {group:?}");
        let all = compile_all(&[good.clone(), odd.clone()], &settings);
        let names: Vec<String> = all.iter().map(|c| c.policy.name_any()).collect();
        let own = object_names(&odd);
        assert_eq!(own[0], object_name(&odd.source));
        assert_eq!(
            names,
            [
                "cascade-guard-xrds-refuse-composite".to_string(),
                "cascade-guard-update-xrds-refuse-composite".to_string(),
                own[0].clone(),
                own[1].clone(),
            ]
        );
        let shared = serde_json::to_value(&all[0].policy).unwrap();
        assert_eq!(
            shared["spec"]["matchConstraints"]["resourceRules"]
                .as_array()
                .unwrap()
                .len(),
            1,
            "{plural:?}: {shared}"
        );
    }
}

fn many(n: usize, mode: Mode) -> Vec<Policy> {
    (0..n)
        .map(|i| {
            xrd_policy(
                &format!("Kind{i}"),
                &format!("g{}.example.org", i % 7),
                mode,
                Shape::CompositeResource,
                i % 2 == 0,
            )
        })
        .collect()
}

#[test]
fn very_many_kinds_of_one_mode_spread_over_pairs_fixed_by_their_names() {
    let settings = CompileSettings::default();
    let names =
        |all: &[Compiled]| -> Vec<String> { all.iter().map(|c| c.policy.name_any()).collect() };
    // Up to the threshold, one pair.
    let at = many(SHARED_KINDS_BEFORE_SPREAD, Mode::Refuse);
    assert_eq!(compile_all(&at, &settings).len(), 2);
    // Beyond it, up to SPREAD pairs; every kind in exactly one DELETE policy.
    let policies = many(5000, Mode::Refuse);
    let (all, per_policy) = compile_with_names(&policies, &settings);
    assert!(
        all.len() <= 2 * SPREAD as usize && all.len() > 2 * 8,
        "{:?}",
        names(&all)
    );
    let mut seen = BTreeSet::new();
    for c in &all {
        let vap = serde_json::to_value(&c.policy).unwrap();
        let annotations = serde_json::to_string(&vap["metadata"]["annotations"]).unwrap();
        // The API server's limit for all of an object's annotations.
        assert!(annotations.len() < 256 * 1024, "{}", annotations.len());
        if c.policy
            .name_any()
            .starts_with(crate::names::UPDATE_XRDS_OBJECT_PREFIX)
        {
            continue;
        }
        for rule in vap["spec"]["matchConstraints"]["resourceRules"]
            .as_array()
            .unwrap()
        {
            for r in rule["resources"].as_array().unwrap() {
                let key = format!(
                    "{}.{}",
                    r.as_str().unwrap(),
                    rule["apiGroups"][0].as_str().unwrap()
                );
                assert!(seen.insert(key.clone()), "{key} twice");
                // The names agree with what was compiled.
                let i = policies
                    .iter()
                    .position(|p| p.kind.resource() == key)
                    .unwrap();
                assert_eq!(per_policy[i][0], c.policy.name_any());
            }
        }
    }
    assert_eq!(seen.len(), 5000);
    // One more kind changes the pair it lands in, and no other.
    let mut more = policies.clone();
    more.extend(many(5001, Mode::Refuse).pop());
    let after = compile_all(&more, &settings);
    let changed: Vec<String> = after
        .iter()
        .filter(|c| !all.contains(c))
        .map(|c| c.policy.name_any())
        .collect();
    assert_eq!(changed.len(), 2, "{changed:?}");
    assert_eq!(names(&after).len(), names(&all).len());
}
