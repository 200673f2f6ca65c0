use super::*;
use crate::names::DELETION_POLICY_ANNOTATION;
use crate::xrd::tests::modelplane_xrds;
use crate::yaml_stream::{split_yaml_stream, to_yaml_stream};
use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeMap;

fn annotate(doc: &mut Value, value: &str) {
    doc["metadata"]["annotations"] = json!({ DELETION_POLICY_ANNOTATION: value });
}

/// Protected resources by binding: resource -> (mode annotation, actions).
/// A binding shared by XRDs names many resources.
fn bindings(r: &Rendered) -> BTreeMap<String, (String, Vec<String>)> {
    let mut out = BTreeMap::new();
    for b in r
        .objects
        .iter()
        .filter(|o| o["kind"] == "ValidatingAdmissionPolicyBinding")
    {
        let mode = b["metadata"]["annotations"]["cascade-guard.dev/mode"]
            .as_str()
            .unwrap()
            .to_string();
        let actions: Vec<String> =
            serde_json::from_value(b["spec"]["validationActions"].clone()).unwrap();
        // A binding matches what its policy does.
        let policy = r
            .objects
            .iter()
            .find(|p| {
                p["kind"] == "ValidatingAdmissionPolicy"
                    && p["metadata"]["name"] == b["spec"]["policyName"]
            })
            .unwrap();
        for rule in policy["spec"]["matchConstraints"]["resourceRules"]
            .as_array()
            .unwrap()
        {
            if rule["operations"][0] != "DELETE" {
                continue;
            }
            let group = rule["apiGroups"][0].as_str().unwrap();
            for resource in rule["resources"].as_array().unwrap() {
                let resource = format!("{}.{group}", resource.as_str().unwrap());
                let before = out.insert(resource.clone(), (mode.clone(), actions.clone()));
                assert_eq!(before, None, "{resource} in two DELETE bindings");
            }
        }
    }
    out
}

#[test]
fn modelplane_with_annotations() {
    let mut docs: Vec<Value> = modelplane_xrds().into_iter().map(|(_, v)| v).collect();
    let mut annotated = BTreeMap::new();
    for doc in &mut docs {
        let name = doc["metadata"]["name"].as_str().unwrap().to_string();
        let mode = match name.as_str() {
            "inferenceclusters.modelplane.ai" => "Refuse",
            "modeldeployments.modelplane.ai" => "warn",
            "servingstacks.infrastructure.modelplane.ai" => "Off",
            "inferencegateways.modelplane.ai" => "Convert",
            _ => continue,
        };
        annotate(doc, mode);
        annotated.insert(name, mode);
    }
    // Non-policy documents are ignored.
    docs.push(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}));
    let docs_len = docs.len();

    for default_mode in [Mode::Off, Mode::Refuse] {
        let r = render(docs.clone(), default_mode, &CompileSettings::default());
        assert_eq!(r.problems, vec![], "{default_mode}");
        assert_eq!(r.policies.len(), docs_len - 1);
        let got = bindings(&r);
        let mut want = BTreeMap::new();
        for p in &r.policies {
            let name = p.kind.resource();
            let mode = match annotated.get(&name) {
                Some(m) => crate::mode::read_mode_annotation(m).0,
                None => default_mode,
            };
            let actions = match mode {
                Mode::Off => continue,
                Mode::Warn => vec!["Warn".to_string(), "Audit".to_string()],
                _ => vec!["Deny".to_string()],
            };
            want.insert(name, (mode.to_string(), actions));
        }
        assert_eq!(got, want, "{default_mode}");
        // Exactly the annotated (non-Off) kinds, plus the rest when the default guards.
        let expected_count = match default_mode {
            Mode::Off => 3,
            _ => docs_len - 1 - 1,
        };
        assert_eq!(got.len(), expected_count, "{default_mode}");
        assert!(got.contains_key("inferenceclusters.modelplane.ai"));
        assert!(!got.contains_key("servingstacks.infrastructure.modelplane.ai"));
        // VAPs first, then bindings, pairwise by name.
        let half = r.objects.len() / 2;
        for i in 0..half {
            assert_eq!(r.objects[i]["kind"], "ValidatingAdmissionPolicy");
            assert_eq!(
                r.objects[half + i]["kind"],
                "ValidatingAdmissionPolicyBinding"
            );
            assert_eq!(
                r.objects[i]["metadata"]["name"],
                r.objects[half + i]["metadata"]["name"]
            );
            assert_eq!(
                r.objects[i]["apiVersion"],
                "admissionregistration.k8s.io/v1"
            );
        }
    }
}

#[test]
fn cascade_policies_from_documents() {
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "databases.db.example.org"},
        "spec": {"group": "db.example.org", "scope": "Namespaced",
                 "names": {"kind": "Database", "plural": "databases"}},
    });
    let cp = |name: &str, spec: Value| {
        json!({
            "apiVersion": "cascade-guard.dev/v1alpha1", "kind": "CascadePolicy",
            "metadata": {"name": name}, "spec": spec,
        })
    };
    let xrd = modelplane_xrds()
        .into_iter()
        .find(|(d, _)| d == "modelcaches")
        .unwrap()
        .1;
    let docs = vec![
        cp("db", json!({"group": "db.example.org", "kind": "Database"})),
        cp(
            "db-lower-off",
            json!({"group": "db.example.org", "kind": "Database", "mode": "off",
                                      "selector": {"matchLabels": "nope"}}),
        ),
        cp(
            "cache",
            json!({"group": "modelplane.ai", "kind": "ModelCache", "mode": "Warn"}),
        ),
        cp(
            "unknown",
            json!({"group": "db.example.org", "kind": "Table"}),
        ),
        json!({"apiVersion": "cascade-guard.dev/v1alpha1", "kind": "CascadePolicy", "spec": {}}),
        json!({"apiVersion": "v1", "kind": "List", "items": [crd, xrd]}),
    ];
    let r = render(docs, Mode::Off, &CompileSettings::default());
    let summary: Vec<(String, Mode)> = r
        .policies
        .iter()
        .map(|p| (p.source.to_string(), p.mode))
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                "CompositeResourceDefinition/modelcaches.modelplane.ai".to_string(),
                Mode::Off
            ),
            ("CascadePolicy/cache".to_string(), Mode::Warn),
            ("CascadePolicy/db".to_string(), Mode::Refuse),
            ("CascadePolicy/db-lower-off".to_string(), Mode::Refuse),
        ]
    );
    let problems: Vec<(String, &str)> = r
        .problems
        .iter()
        .map(|p| (p.subject.to_string(), p.reason))
        .collect();
    assert_eq!(
        problems,
        vec![
            ("CascadePolicy/db-lower-off".to_string(), "UnknownMode"),
            ("CascadePolicy/db-lower-off".to_string(), "InvalidSelector"),
            ("document 4".to_string(), "InvalidCascadePolicy"),
            ("CascadePolicy/unknown".to_string(), "UnknownKind"),
            ("CascadePolicy/cache".to_string(), "Overlap"),
            ("CascadePolicy/db-lower-off".to_string(), "Overlap"),
        ]
    );
    // The XRD's Off does not stop the CascadePolicy guarding ModelCache.
    // Three policies, each a DELETE and an UPDATE pair.
    assert_eq!(r.objects.len(), 12);
}

#[test]
fn yaml_stream_round_trips_and_quotes_every_string() {
    // As a CRD states an enum of modes.
    let crd = json!({"enum": ["Refuse", "Convert", "Warn", "Off"]});
    let mut docs: Vec<Value> = modelplane_xrds().into_iter().map(|(_, v)| v).collect();
    let rendered = render(docs.clone(), Mode::Warn, &CompileSettings::default());
    docs.extend(rendered.objects);
    docs.push(crd);
    docs.push(json!({
        "odd keys": {"on": "Off", "1": "yes", "y": "~", "<<": "*ref", "": ""},
        "strings": ["Off", "1:20", "0777", "null", "", " lead", "trail ", "a: b", "- x", "# c",
                    "quote\" back\\ nl\n tab\t nul\u{0} nel\u{85} ls\u{2028} bom\u{feff} é🦀"],
        "scalars": [null, true, false, 0, -1, 1.5, 1e300],
        "empty": {"map": {}, "list": []},
        "nested": [[1, [2]], [{"a": [{"b": {}}]}]],
    }));
    let text = to_yaml_stream(&docs);
    let back: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .collect();
    assert_eq!(back, docs);
    // The mode enum, and every other string, is quoted.
    assert!(text.contains("- \"Off\"\n"));
    assert!(!text.contains(": Off\n") && !text.contains("- Off\n"));
    assert!(text.contains("\"on\": \"Off\""));
}

#[test]
fn a_named_set_names_only_the_shared_objects() {
    let mut docs: Vec<Value> = modelplane_xrds().into_iter().map(|(_, v)| v).collect();
    annotate(&mut docs[0], "Refuse");
    docs.push(json!({"apiVersion": "cascade-guard.dev/v1alpha1", "kind": "CascadePolicy",
            "metadata": {"name": "dbs"}, "spec": {"kind": "Database", "group": "db.example.org", "mode": "Refuse"}}));
    docs.push(
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "databases.db.example.org"},
            "spec": {"group": "db.example.org", "scope": "Namespaced",
                "names": {"kind": "Database", "plural": "databases"}}}),
    );
    let settings = CompileSettings {
        set_name: Some("team-a".into()),
        ..CompileSettings::default()
    };
    let r = render(docs, Mode::Off, &settings);
    assert_eq!(r.problems, vec![]);
    let names: Vec<(&str, &str)> = r
        .objects
        .iter()
        .map(|o| {
            (
                o["metadata"]["name"].as_str().unwrap(),
                o["spec"]["policyName"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert!(
        names.contains(&("cascade-guard-xrds-refuse-composite-team-a", "")),
        "{names:?}"
    );
    assert!(names.contains(&(
        "cascade-guard-update-xrds-refuse-composite-team-a",
        "cascade-guard-update-xrds-refuse-composite-team-a"
    )));
    assert!(names.contains(&("cascade-guard-policy-dbs", "cascade-guard-policy-dbs")));
    for bad in ["Team", "a.b", "", &"x".repeat(41)] {
        assert!(validate_set_name(bad).is_err(), "{bad:?}");
    }
    assert!(validate_set_name("team-a").is_ok());
}

fn xrd(name: &str, kind: &str, mode: Option<&str>) -> Value {
    let (plural, group) = name.split_once('.').unwrap();
    let mut doc = json!({
        "apiVersion": "apiextensions.crossplane.io/v2", "kind": "CompositeResourceDefinition",
        "metadata": {"name": name},
        "spec": {"group": group, "names": {"kind": kind, "plural": plural}, "scope": "Namespaced",
                 "versions": [{"name": "v1", "served": true, "referenceable": true}]}
    });
    if let Some(mode) = mode {
        annotate(&mut doc, mode);
    }
    doc
}

fn object(api_version: &str, kind: &str, name: &str) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name}})
}

#[test]
fn strict_refuses_what_protects_nothing_unless_skipped_on_purpose() {
    let composition = object("apiextensions.crossplane.io/v1", "Composition", "c");
    let deployment = object("apps/v1", "Deployment", "web");
    let settings = CompileSettings::default();
    let reasons = |r: &Rendered, skip: &[&str], strict: bool| -> Vec<&'static str> {
        let passed = passed_over(r, &Skip::new(skip).unwrap());
        review_problems(r, &passed, strict)
            .iter()
            .map(|p| p.reason)
            .collect()
    };

    // Nothing at all: an empty directory protects nothing, a warning
    // without --strict and an error with it.
    let empty = render(vec![], Mode::Refuse, &settings);
    let problems = review_problems(&empty, &PassedOver::default(), false);
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].reason, NOTHING_PROTECTED);
    assert_eq!(problems[0].severity, Severity::Warning);
    assert!(!fails(&problems, false));
    assert!(fails(&problems, true));
    assert_eq!(
        problems[0].to_string(),
        "warning: the input: nothing is protected: no XRD or CascadePolicy in the input compiles to an admission policy (every one is Off, or there are none) (NothingProtected)"
    );
    let strict = review_problems(&empty, &PassedOver::default(), true);
    assert_eq!(strict[0].severity, Severity::Error);

    // A Composition (package content) and a Deployment: the Deployment
    // is named, and nothing is protected.
    let other = render(
        vec![composition.clone(), deployment.clone()],
        Mode::Refuse,
        &settings,
    );
    assert!(other.problems.is_empty(), "not a problem without --strict");
    assert_eq!(reasons(&other, &[], false), [NOTHING_PROTECTED]);
    let passed = passed_over(&other, &Skip::default());
    let strict = review_problems(&other, &passed, true);
    assert_eq!(strict.len(), 2, "{strict:?}");
    assert_eq!(
        strict[0].to_string(),
        "error: document 1: Deployment.apps web is not an XRD, CascadePolicy or CRD, so it protects nothing; pass --skip Deployment if it is here on purpose (NotAnInput)"
    );

    // An XRD beside them: only the Deployment is left to say, unless
    // skipped, in any case and as Kind or Kind.group.
    let package = render(
        vec![xrd("xs.example.org", "X", None), composition, deployment],
        Mode::Refuse,
        &settings,
    );
    assert_eq!(reasons(&package, &[], true), [NOT_AN_INPUT]);
    for skip in [
        "Deployment",
        "deployment",
        "DEPLOYMENT.APPS",
        "Deployment.apps",
    ] {
        assert_eq!(reasons(&package, &[skip], true), [] as [&str; 0], "{skip}");
    }
    assert_eq!(
        reasons(&package, &["Deployment.batch"], true),
        [NOT_AN_INPUT]
    );
}

#[test]
fn crossplane_package_kinds_are_skipped_by_default() {
    // (apiVersion, kind, package content?)
    let cases: &[(&str, &str, bool)] = &[
        ("apiextensions.crossplane.io/v1", "Composition", true),
        (
            "apiextensions.crossplane.io/v1",
            "CompositionRevision",
            true,
        ),
        (
            "apiextensions.crossplane.io/v1beta1",
            "EnvironmentConfig",
            true,
        ),
        (
            "apiextensions.crossplane.io/v1alpha1",
            "ManagedResourceDefinition",
            true,
        ),
        (
            "apiextensions.crossplane.io/v1alpha1",
            "ManagedResourceActivationPolicy",
            true,
        ),
        ("apiextensions.crossplane.io/v1beta1", "Usage", true),
        ("protection.crossplane.io/v1beta1", "Usage", true),
        ("protection.crossplane.io/v1beta1", "ClusterUsage", true),
        ("pkg.crossplane.io/v1", "Provider", true),
        ("pkg.crossplane.io/v1", "Function", true),
        ("pkg.crossplane.io/v1", "Configuration", true),
        ("pkg.crossplane.io/v1beta1", "DeploymentRuntimeConfig", true),
        ("pkg.crossplane.io/v1beta1", "ImageConfig", true),
        ("meta.pkg.crossplane.io/v1", "Configuration", true),
        ("kubernetes.crossplane.io/v1alpha1", "ProviderConfig", true),
        ("aws.m.upbound.io/v1beta1", "ClusterProviderConfig", true),
        // Not package content: a user's kind, or a Crossplane kind of the
        // wrong group, or a ProviderConfig without a group.
        ("apps/v1", "Deployment", false),
        ("v1", "ConfigMap", false),
        ("v1", "ProviderConfig", false),
        ("example.org/v1", "Composition", false),
        ("apiextensions.crossplane.io/v1", "composition", false),
        ("pkg.crossplane.io/v1", "Lock", false),
        (
            "kubernetes.crossplane.io/v1alpha1",
            "ProviderConfigUsage",
            false,
        ),
    ];
    for (api_version, kind, want) in cases {
        let doc = object(api_version, kind, "n");
        assert_eq!(
            is_package_kind(&document_kind(&doc)),
            *want,
            "{api_version} {kind}"
        );
    }
}

/// Documents render passes over: package content, and kinds of a user's.
fn not_inputs() -> Vec<Value> {
    vec![
        object("apiextensions.crossplane.io/v1", "Composition", "a"),
        object("apiextensions.crossplane.io/v1", "Composition", "b"),
        object("pkg.crossplane.io/v1", "Function", "f"),
        object("apps/v1", "Deployment", "web"),
        object("v1", "ConfigMap", "cm"),
    ]
}

#[test]
fn skip_values_match_without_case_and_say_when_they_match_nothing() {
    let mut docs = not_inputs();
    docs.insert(0, xrd("xs.example.org", "X", Some("Refuse")));
    let r = render(docs, Mode::Off, &CompileSettings::default());
    // (--skip values, skipped on purpose, left unexpected, unused values)
    type Case = (
        &'static [&'static str],
        &'static [(&'static str, usize)],
        &'static [&'static str],
        &'static [&'static str],
    );
    let cases: &[Case] = &[
        (&[], &[], &["Deployment.apps", "ConfigMap"], &[]),
        (
            &["deployment", "CONFIGMAP"],
            &[("ConfigMap", 1), ("Deployment.apps", 1)],
            &[],
            &[],
        ),
        // A package kind given anyway counts as used, not as a typo.
        (
            &["composition"],
            &[],
            &["Deployment.apps", "ConfigMap"],
            &[],
        ),
        (
            &["Compositon", "Deployment.batch", "configmap"],
            &[("ConfigMap", 1)],
            &["Deployment.apps"],
            &["Compositon", "Deployment.batch"],
        ),
    ];
    for (skip, skipped, unexpected, unused) in cases {
        let passed = passed_over(&r, &Skip::new(*skip).unwrap());
        let package: Vec<(&str, usize)> = passed
            .package
            .iter()
            .map(|(k, n)| (k.as_str(), *n))
            .collect();
        assert_eq!(
            package,
            [
                ("Composition.apiextensions.crossplane.io", 2),
                ("Function.pkg.crossplane.io", 1)
            ],
            "{skip:?}"
        );
        let got: Vec<(&str, usize)> = passed
            .skipped
            .iter()
            .map(|(k, n)| (k.as_str(), *n))
            .collect();
        assert_eq!(got, *skipped, "{skip:?}");
        let got: Vec<&str> = passed.unexpected.iter().map(|i| i.kind.as_str()).collect();
        assert_eq!(got, *unexpected, "{skip:?}");
        assert_eq!(passed.unused_skips, *unused, "{skip:?}");
    }

    for (values, want) in [
        (&[""][..], Some(SkipError::Empty)),
        (&["Composition", " "], Some(SkipError::Empty)),
        (
            &["apps/Deployment"],
            Some(SkipError::NotAKind("apps/Deployment".into())),
        ),
        (
            &["Deployment apps"],
            Some(SkipError::NotAKind("Deployment apps".into())),
        ),
        (&[" Composition "], None),
    ] {
        assert_eq!(Skip::new(values).err(), want, "{values:?}");
    }
}

#[test]
fn notes_say_what_was_passed_over() {
    let mut docs = not_inputs();
    docs.push(object("v1", "ConfigMap", "cm2"));
    let r = render(docs, Mode::Off, &CompileSettings::default());
    let package = "skipped 3 documents of Crossplane package kinds: Composition.apiextensions.crossplane.io 2, Function.pkg.crossplane.io 1";
    // (--skip values, --strict, the notes)
    let cases: &[(&[&str], bool, &[&str])] = &[
        (
            &[],
            false,
            &[
                package,
                "passed over 3 documents that are not an XRD, CascadePolicy or CRD: ConfigMap 2, Deployment.apps 1 (--strict fails on each unless its kind is given to --skip)",
            ],
        ),
        // Under --strict each is an error instead.
        (&[], true, &[package]),
        (
            &["Deployment", "nope"],
            true,
            &[
                package,
                "skipped 1 document given to --skip: Deployment.apps 1",
                "warning: --skip nope matches no document",
            ],
        ),
    ];
    for (skip, strict, want) in cases {
        let passed = passed_over(&r, &Skip::new(*skip).unwrap());
        assert_eq!(notes(&passed, *strict), *want, "{skip:?} {strict}");
    }
    // Nothing passed over, nothing to say.
    assert_eq!(notes(&PassedOver::default(), false), [] as [String; 0]);
}

#[test]
fn the_summary_says_which_kinds_got_which_mode() {
    let many: Vec<Value> = (0..10)
        .map(|i| xrd(&format!("k{i}s.many.org"), &format!("K{i}"), Some("Warn")))
        .collect();
    // (XRDs, default mode, the summary)
    let cases: Vec<(Vec<Value>, Mode, &str)> = vec![
        (
            vec![],
            Mode::Refuse,
            "0 kinds: the input has no XRD or CascadePolicy that resolves",
        ),
        (
            vec![xrd("xs.example.org", "X", None)],
            Mode::Off,
            "1 kind: Off 1 (X.example.org)",
        ),
        (
            vec![
                xrd("inferenceclusters.modelplane.ai", "InferenceCluster", None),
                xrd(
                    "modeldeployments.modelplane.ai",
                    "ModelDeployment",
                    Some("Refuse"),
                ),
                xrd(
                    "servingstacks.infrastructure.modelplane.ai",
                    "ServingStack",
                    Some("Off"),
                ),
                xrd("gateways.modelplane.ai", "Gateway", Some("Convert")),
            ],
            Mode::Refuse,
            "4 kinds: Refuse 2 (InferenceCluster.modelplane.ai, ModelDeployment.modelplane.ai), Convert 1 (Gateway.modelplane.ai), Off 1 (ServingStack.infrastructure.modelplane.ai)",
        ),
        (
            many,
            Mode::Off,
            "10 kinds: Warn 10 (K0.many.org, K1.many.org, K2.many.org, K3.many.org, K4.many.org, K5.many.org, K6.many.org, K7.many.org and 2 more)",
        ),
    ];
    for (docs, mode, want) in cases {
        let r = render(docs, mode, &CompileSettings::default());
        assert_eq!(summary(&r.policies), want);
    }
}

#[test]
fn problems_name_the_file_and_the_document_in_it() {
    let unnamed_cp =
        json!({"apiVersion": "cascade-guard.dev/v1alpha1", "kind": "CascadePolicy", "spec": {}});
    let docs = vec![
        Document {
            file: Some("platform/apis/a.yaml".into()),
            index: 0,
            value: xrd("xs.example.org", "X", Some("Refuse")),
        },
        Document {
            file: Some("platform/apis/b.yaml".into()),
            index: 2,
            value: unnamed_cp,
        },
        Document {
            file: Some("platform/apis/b.yaml".into()),
            index: 3,
            value: object("apps/v1", "Deployment", "web"),
        },
    ];
    let r = render_documents(docs, Mode::Off, &CompileSettings::default());
    let subjects: Vec<String> = r.problems.iter().map(|p| p.subject.to_string()).collect();
    assert_eq!(subjects, ["platform/apis/b.yaml, document 2"]);
    let passed = passed_over(&r, &Skip::default());
    let strict = review_problems(&r, &passed, true);
    assert_eq!(strict.len(), 1);
    assert!(
        strict[0]
            .to_string()
            .starts_with("error: platform/apis/b.yaml, document 3: Deployment.apps web"),
        "{}",
        strict[0]
    );

    // The index is the document's place in the stream, empty ones
    // included, as a YAML parse error counts.
    let stream = split_yaml_stream("---\n---\nkind: A\n---\n# c\n---\nkind: B\n").unwrap();
    let indexes: Vec<usize> = stream.iter().map(|(i, _)| *i).collect();
    assert_eq!(indexes, [1, 3]);
}
