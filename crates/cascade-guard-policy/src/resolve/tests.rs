use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
use serde_json::json;

fn xrd(name_plural: &str, group: &str, kind: &str, annotation: Option<&str>) -> XrdInput {
    XrdInput::Read(Xrd {
        name: format!("{name_plural}.{group}"),
        api_version: "apiextensions.crossplane.io/v2".into(),
        group: group.into(),
        kind: kind.into(),
        plural: name_plural.into(),
        scope: Scope::Cluster,
        deletion_policy: annotation.map(str::to_string),
        claim_names: None,
    })
}

fn cp(name: &str, group: &str, kind: &str, mode: Mode) -> CascadePolicyInput {
    CascadePolicyInput {
        name: name.into(),
        group: group.into(),
        kind: kind.into(),
        mode,
        selector: None,
    }
}

fn crd(group: &str, kind: &str, plural: &str) -> CrdInfo {
    CrdInfo {
        group: group.into(),
        kind: kind.into(),
        plural: plural.into(),
        scope: Scope::Namespaced,
    }
}

fn inputs(xrds: Vec<XrdInput>, cps: Vec<CascadePolicyInput>, crds: Vec<CrdInfo>) -> Inputs {
    Inputs {
        xrds,
        cascade_policies: cps,
        crds,
        xrd_default_mode: Mode::Warn,
        undiscovered_groups: BTreeSet::new(),
    }
}

/// (source, kind, mode) of each policy, for compact assertions.
fn summary(r: &Resolution) -> Vec<(String, String, Mode)> {
    r.policies
        .iter()
        .map(|p| (p.source.to_string(), p.kind.to_string(), p.mode))
        .collect()
}

fn reasons_of(r: &Resolution) -> Vec<(String, &'static str, Severity)> {
    r.problems
        .iter()
        .map(|p| (p.subject.to_string(), p.reason, p.severity))
        .collect()
}

#[test]
fn a_legacy_xrd_guards_its_claims_under_refuse_and_warn() {
    let legacy = |annotation: &str| {
        XrdInput::from_value(&json!({
            "apiVersion": "apiextensions.crossplane.io/v1",
            "kind": "CompositeResourceDefinition",
            "metadata": {"name": "xapps.example.org",
                         "annotations": {"cascade-guard.dev/deletion-policy": annotation}},
            "spec": {"group": "example.org",
                     "names": {"kind": "XApp", "plural": "xapps"},
                     "claimNames": {"kind": "App", "plural": "apps"},
                     "versions": [{"name": "v1"}]}
        }))
    };
    for (mode, claims) in [
        ("Refuse", true),
        ("Warn", true),
        ("Convert", false),
        ("Off", false),
    ] {
        let r = resolve(&inputs(vec![legacy(mode)], vec![], vec![]));
        let kinds: Vec<(String, Shape, Scope)> = r
            .policies
            .iter()
            .map(|p| (p.kind.to_string(), p.kind.shape, p.kind.scope))
            .collect();
        let mut want = vec![(
            "XApp.example.org".to_string(),
            Shape::CompositeResource,
            Scope::Cluster,
        )];
        if claims {
            want.push((
                "App.example.org".to_string(),
                Shape::Claim,
                Scope::Namespaced,
            ));
        }
        assert_eq!(kinds, want, "{mode}");
        if claims {
            let claim = &r.policies[1];
            assert_eq!(
                claim.source.to_string(),
                "CompositeResourceDefinition/xapps.example.org (its claims)"
            );
            assert_eq!(
                crate::admission::object_names(claim),
                [
                    format!("cascade-guard-xrds-{}-claim", mode.to_lowercase()),
                    format!("cascade-guard-update-xrds-{}-claim", mode.to_lowercase())
                ]
            );
        }
    }
}

#[test]
fn xrd_modes() {
    // (annotation, mode, problem reason)
    let cases: &[(Option<&str>, Mode, Option<&str>)] = &[
        (None, Mode::Warn, None), // the default mode of these inputs
        (Some("Refuse"), Mode::Refuse, None),
        (Some("Off"), Mode::Off, None),
        (Some(" convert "), Mode::Convert, None),
        (Some("Offf"), Mode::Refuse, Some("UnknownMode")),
        (Some(""), Mode::Refuse, Some("UnknownMode")),
    ];
    for (annotation, mode, reason) in cases {
        let r = resolve(&inputs(
            vec![xrd("widgets", "example.org", "Widget", *annotation)],
            vec![],
            vec![],
        ));
        assert_eq!(r.policies.len(), 1, "{annotation:?}");
        let p = &r.policies[0];
        assert_eq!(p.mode, *mode, "{annotation:?}");
        assert_eq!(p.kind.shape, Shape::CompositeResource);
        assert_eq!(
            p.source,
            Source::Xrd {
                name: "widgets.example.org".into(),
                annotated: annotation.is_some(),
                claim: false,
            }
        );
        assert_eq!(
            r.problems.first().map(|p| p.reason),
            *reason,
            "{annotation:?}"
        );
    }
}

#[test]
fn broken_xrds_stay_guarded_when_possible() {
    let broken = json!({
        "apiVersion": "apiextensions.crossplane.io/v2",
        "kind": "CompositeResourceDefinition",
        "metadata": {"name": "gadgets.example.org",
                     "annotations": {"cascade-guard.dev/deletion-policy": "Off"}},
        "spec": {"group": "example.org", "names": {"kind": "Gadget", "plural": "gadgets"}},
    });
    let nameless = json!({
        "apiVersion": "apiextensions.crossplane.io/v2",
        "kind": "CompositeResourceDefinition",
        "metadata": {"name": "mystery.example.org"},
        "spec": {"group": "example.org", "versions": [{"name": "v1"}]},
    });
    let r = resolve(&inputs(
        vec![
            XrdInput::from_value(&broken),
            XrdInput::from_value(&nameless),
        ],
        vec![],
        vec![],
    ));
    // Off is ignored on a broken XRD: Refuse, never unguarded.
    assert_eq!(
        summary(&r),
        vec![(
            "CompositeResourceDefinition/gadgets.example.org".into(),
            "Gadget.example.org".into(),
            Mode::Refuse
        )]
    );
    assert_eq!(
        reasons_of(&r),
        vec![
            (
                "CompositeResourceDefinition/gadgets.example.org".into(),
                "NoVersions",
                Severity::Error
            ),
            (
                "CompositeResourceDefinition/mystery.example.org".into(),
                "MissingKind",
                Severity::Error
            ),
        ]
    );
    assert!(
        r.problems[0]
            .message
            .contains("still guarded in Refuse mode")
    );
    assert!(r.problems[1].message.contains("guards nothing"));
}

/// A group that discovery could not read (the API server busy or
/// restarting) does not make its kinds "unknown": the policy says the
/// kind is not known for now, as a warning, and the last good policy stays.
#[test]
fn an_undiscovered_group_is_not_an_unknown_kind() {
    let mut i = inputs(
        vec![],
        vec![cp("p", "db.example.org", "Database", Mode::Refuse)],
        vec![],
    );
    i.undiscovered_groups.insert("db.example.org".into());
    let r = resolve(&i);
    assert!(r.policies.is_empty());
    assert_eq!(r.problems.len(), 1, "{:?}", r.problems);
    assert_eq!(r.problems[0].reason, reasons::KIND_NOT_DISCOVERED);
    assert_eq!(r.problems[0].severity, Severity::Warning);
    assert!(
        r.problems[0]
            .message
            .contains("could not be read from discovery")
    );
}

/// Each was compiled and in force once: `kubectl delete crd`, `kubectl
/// delete deployment` and `kubectl delete cpol` refused, cascade-guard's
/// finalizer on kube-apiserver's own Lease. Discovery serves those kinds,
/// so the controller's inputs carry them as the CRDs do here.
#[test]
fn forbidden_targets_are_refused_whoever_asks() {
    let crds = vec![
        crd(
            "apiextensions.k8s.io",
            "CustomResourceDefinition",
            "customresourcedefinitions",
        ),
        crd("apps", "Deployment", "deployments"),
        crd("coordination.k8s.io", "Lease", "leases"),
        crd("cascade-guard.dev", "CascadePolicy", "cascadepolicies"),
        crd("", "Pod", "pods"),
    ];
    let cps = vec![
        cp(
            "crds",
            "apiextensions.k8s.io",
            "CustomResourceDefinition",
            Mode::Refuse,
        ),
        cp("deployments", "apps", "Deployment", Mode::Refuse),
        cp("leases", "coordination.k8s.io", "Lease", Mode::Convert),
        cp("own", "cascade-guard.dev", "CascadePolicy", Mode::Refuse),
        cp("pods", "", "Pod", Mode::Warn),
    ];
    let xrds = vec![xrd("jobs", "batch.k8s.io", "Job", Some("Refuse"))];
    let r = resolve(&inputs(xrds, cps, crds));
    assert!(r.policies.is_empty(), "{:?}", r.policies);
    let reasons = reasons_of(&r);
    assert_eq!(reasons.len(), 6, "{reasons:?}");
    for (subject, reason, severity) in &reasons {
        assert_eq!(*reason, reasons::FORBIDDEN_KIND, "{subject}");
        assert_eq!(*severity, Severity::Error, "{subject}");
    }
    assert!(
        r.problems
            .iter()
            .any(|p| p.message.contains("cascade-guard's own kinds"))
    );
}

#[test]
fn cascade_policy_kind_lookup() {
    let xrds = vec![xrd("widgets", "example.org", "Widget", None)];
    let crds = vec![
        crd("example.org", "Widget", "widgets"),
        crd("db.example.org", "Database", "databases"),
    ];
    // (group, kind, expected shape or None for UnknownKind)
    let cases: &[(&str, &str, Option<Shape>)] = &[
        ("example.org", "Widget", Some(Shape::CompositeResource)),
        ("db.example.org", "Database", Some(Shape::Other)),
        ("db.example.org", "database", None),
        ("example.org", "Database", None),
        ("nothing.example.org", "Thing", None),
    ];
    for (group, kind, shape) in cases {
        let r = resolve(&inputs(
            xrds.clone(),
            vec![cp("p", group, kind, Mode::Refuse)],
            crds.clone(),
        ));
        let from_cp: Vec<&Policy> = r
            .policies
            .iter()
            .filter(|p| matches!(p.source, Source::CascadePolicy { .. }))
            .collect();
        match shape {
            Some(s) => {
                assert_eq!(from_cp.len(), 1, "{group}/{kind}");
                assert_eq!(from_cp[0].kind.shape, *s, "{group}/{kind}");
            }
            None => {
                assert!(from_cp.is_empty(), "{group}/{kind}");
                assert_eq!(
                    reasons_of(&r),
                    vec![("CascadePolicy/p".into(), "UnknownKind", Severity::Error)],
                    "{group}/{kind}"
                );
            }
        }
    }
}

#[test]
fn xrd_kind_counts_as_known_without_its_crd() {
    let r = resolve(&inputs(
        vec![xrd("widgets", "example.org", "Widget", Some("Off"))],
        vec![cp("w", "example.org", "Widget", Mode::Refuse)],
        vec![],
    ));
    assert_eq!(r.policies.len(), 2);
    assert_eq!(r.policies[1].kind.plural, "widgets");
    assert_eq!(r.policies[1].kind.shape, Shape::CompositeResource);
}

#[test]
fn overlaps_warn_on_the_later_source_and_keep_both() {
    let r = resolve(&inputs(
        vec![xrd("widgets", "example.org", "Widget", Some("Refuse"))],
        vec![
            cp("zz-off", "example.org", "Widget", Mode::Off),
            cp("aa-warn", "example.org", "Widget", Mode::Warn),
            cp("other", "db.example.org", "Database", Mode::Refuse),
        ],
        vec![crd("db.example.org", "Database", "databases")],
    ));
    assert_eq!(
        summary(&r),
        vec![
            (
                "CompositeResourceDefinition/widgets.example.org".into(),
                "Widget.example.org".into(),
                Mode::Refuse
            ),
            (
                "CascadePolicy/aa-warn".into(),
                "Widget.example.org".into(),
                Mode::Warn
            ),
            (
                "CascadePolicy/other".into(),
                "Database.db.example.org".into(),
                Mode::Refuse
            ),
            (
                "CascadePolicy/zz-off".into(),
                "Widget.example.org".into(),
                Mode::Off
            ),
        ]
    );
    assert_eq!(
        reasons_of(&r),
        vec![
            ("CascadePolicy/aa-warn".into(), "Overlap", Severity::Warning),
            ("CascadePolicy/zz-off".into(), "Overlap", Severity::Warning),
        ]
    );
    assert!(
        r.problems[0]
            .message
            .contains("CompositeResourceDefinition/widgets.example.org (mode Refuse)")
    );
    assert!(
        r.problems[1]
            .message
            .contains("CascadePolicy/aa-warn (mode Warn)")
    );
    assert!(r.problems[1].message.contains("strictest mode wins"));
}

#[test]
fn invalid_selector_widens_the_policy() {
    let bad = LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "tier".into(),
            operator: "Exists".into(),
            values: Some(vec!["prod".into()]),
        }]),
    };
    let good = LabelSelector {
        match_labels: Some([("tier".to_string(), "prod".to_string())].into()),
        match_expressions: None,
    };
    let cases = [
        (bad, None, Some("InvalidSelector")),
        (good.clone(), Some(good), None),
    ];
    for (given, kept, reason) in cases {
        let mut policy = cp("p", "db.example.org", "Database", Mode::Refuse);
        policy.selector = Some(given);
        let r = resolve(&inputs(
            vec![],
            vec![policy],
            vec![crd("db.example.org", "Database", "databases")],
        ));
        assert_eq!(r.policies.len(), 1);
        assert_eq!(r.policies[0].selector, kept);
        assert_eq!(r.problems.first().map(|p| p.reason), reason);
        if reason.is_some() {
            assert!(r.problems[0].message.contains("wider"));
            assert!(r.problems[0].message.contains("takes no values"));
        }
    }
}

#[test]
fn output_order_does_not_depend_on_input_order() {
    let xrds = vec![
        xrd("b", "example.org", "B", None),
        xrd("a", "example.org", "A", None),
    ];
    let cps = vec![
        cp("y", "db.example.org", "Database", Mode::Refuse),
        cp("x", "db.example.org", "Database", Mode::Warn),
    ];
    let crds = vec![crd("db.example.org", "Database", "databases")];
    let forward = resolve(&inputs(xrds.clone(), cps.clone(), crds.clone()));
    let mut xr = xrds;
    xr.reverse();
    let mut cr = cps;
    cr.reverse();
    let backward = resolve(&inputs(xr, cr, crds));
    assert_eq!(forward, backward);
    assert_eq!(
        summary(&forward)
            .iter()
            .map(|s| s.0.as_str())
            .collect::<Vec<_>>(),
        [
            "CompositeResourceDefinition/a.example.org",
            "CompositeResourceDefinition/b.example.org",
            "CascadePolicy/x",
            "CascadePolicy/y"
        ]
    );
}

#[test]
fn duplicate_names_are_errors() {
    let r = resolve(&inputs(
        vec![
            xrd("a", "example.org", "A", None),
            xrd("a", "example.org", "A", None),
        ],
        vec![],
        vec![],
    ));
    assert!(reasons_of(&r).contains(&(
        "CompositeResourceDefinition/a.example.org".into(),
        "DuplicateName",
        Severity::Error
    )));
}

#[test]
fn crd_reading() {
    let crd_doc = |scope: Value| {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "databases.db.example.org"},
            "spec": {"group": "db.example.org", "scope": scope,
                     "names": {"kind": "Database", "plural": "databases"}},
        })
    };
    assert_eq!(
        read_crd_info(&crd_doc(json!("Namespaced"))),
        Ok(crd("db.example.org", "Database", "databases"))
    );
    assert_eq!(
        read_crd_info(&crd_doc(json!("Cluster"))).map(|c| c.scope),
        Ok(Scope::Cluster)
    );
    assert!(matches!(
        read_crd_info(&crd_doc(json!("Everywhere"))),
        Err(CrdError::UnknownScope { .. })
    ));
    let mut no_plural = crd_doc(json!("Cluster"));
    no_plural["spec"]["names"] = json!({"kind": "Database"});
    assert_eq!(read_crd_info(&no_plural), Err(CrdError::MissingPlural));
    assert!(matches!(
        read_crd_info(&json!({"kind": "Pod"})),
        Err(CrdError::NotACrd { .. })
    ));

    // Crossplane's own CRDs are readable.
    let dir = crate::xrd::tests::fixtures().join("crossplane-crds");
    let text = std::fs::read_to_string(
        dir.join("apiextensions.crossplane.io_compositeresourcedefinitions.yaml"),
    )
    .unwrap();
    let value: Value = serde_yaml::from_str(&text).unwrap();
    let info = read_crd_info(&value).unwrap();
    assert_eq!(
        (
            info.group.as_str(),
            info.kind.as_str(),
            info.plural.as_str(),
            info.scope
        ),
        (
            "apiextensions.crossplane.io",
            "CompositeResourceDefinition",
            "compositeresourcedefinitions",
            Scope::Cluster
        )
    );
}
