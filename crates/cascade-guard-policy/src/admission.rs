//! The ValidatingAdmissionPolicies and bindings policies compile to: one
//! pair per mode and shape for all XRDs, one pair per CascadePolicy.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::admissionregistration::v1::{
    AuditAnnotation, MatchCondition, MatchResources, NamedRuleWithOperations,
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingAdmissionPolicyBindingSpec, ValidatingAdmissionPolicySpec, Validation, Variable,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::cel::{DECISION_AUDIT_KEY, WrittenOut, compile_cel, compile_update_cel};
use crate::kind::Shape;
use crate::mode::Mode;
use crate::names::{
    MANAGED_BY_LABEL, MANAGED_BY_VALUE, MODE_ANNOTATION, MODE_FROM_ANNOTATION,
    PROTECTED_KIND_ANNOTATION, PROTECTED_KINDS_ANNOTATION, SOURCE_ANNOTATION,
};
use crate::naming::{PairName, fnv1a_64, is_shared};
use crate::resolve::{Policy, Source};
use crate::settings::CompileSettings;

/// The match condition of Refuse and Convert policies: true for exactly the
/// deletes the policy refuses.
pub const UNSAFE_DELETE_CONDITION: &str = "unsafe-delete";

/// The match condition of every UPDATE policy: true for exactly the updates
/// that take a cascade's finalizer or a composed resource away.
pub const GUARDED_UPDATE_CONDITION: &str = "guarded-change";

/// One ValidatingAdmissionPolicy and its binding (same name).
#[derive(Debug, Clone, PartialEq)]
pub struct Compiled {
    pub policy: ValidatingAdmissionPolicy,
    pub binding: ValidatingAdmissionPolicyBinding,
}

/// The binding's `validationActions` for a mode; None for Off, which
/// generates nothing.
pub fn validation_actions(mode: Mode) -> Option<Vec<String>> {
    let actions: &[&str] = match mode {
        Mode::Refuse | Mode::Convert => &["Deny"],
        Mode::Warn => &["Warn", "Audit"],
        Mode::Off => return None,
    };
    Some(actions.iter().map(|a| a.to_string()).collect())
}

/// What a policy compiles to on its own: the pair that checks DELETEs, then
/// the pair that checks UPDATEs; nothing for mode Off. An XRD's policy gets
/// the objects it would share with the other XRDs of its mode and shape,
/// naming only its own kind (see [`compile_all`]).
#[cfg(test)]
pub(crate) fn compile(policy: &Policy, settings: &CompileSettings) -> Vec<Compiled> {
    compile_all(std::slice::from_ref(policy), settings)
}

/// What a set of policies compiles to, in the order of the policies.
///
/// Every XRD policy of one mode and shape shares one DELETE pair and one
/// UPDATE pair that name all their kinds: the API server matches every
/// request in the cluster against every policy, so the cost of an
/// unprotected request then grows with the number of modes and shapes in use
/// (at most six pairs), not with the number of kinds (BENCHMARKS.md). Their
/// CEL reads nothing of the kind, so sharing changes no verdict. A
/// CascadePolicy keeps its own pair: its selector is its own, and its last
/// good compilation is kept by name (see [`crate::last_good`]).
#[cfg(test)]
pub(crate) fn compile_all(policies: &[Policy], settings: &CompileSettings) -> Vec<Compiled> {
    compile_with_names(policies, settings).0
}

/// What a set of policies compiles to (see `compile_all`, its tests' name
/// for the first half), and for each policy the names of the objects it is
/// put in (empty for Off), from one grouping of the policies.
pub fn compile_with_names(
    policies: &[Policy],
    settings: &CompileSettings,
) -> (Vec<Compiled>, Vec<Vec<String>>) {
    let groups = group(policies, settings.set_name.as_deref());
    let mut out = Vec::new();
    for group in &groups {
        let carriers: Vec<&Policy> = group.members.iter().map(|&i| &policies[i]).collect();
        let Some(first) = carriers.first() else {
            continue;
        };
        let Some(actions) = validation_actions(first.mode) else {
            continue;
        };
        let [delete, update] = group.names.clone();
        out.push(compile_delete(
            delete,
            first,
            &carriers,
            settings,
            actions.clone(),
        ));
        out.push(compile_update(update, first, &carriers, settings, actions));
    }
    (out, names_of_groups(policies, &groups))
}

fn names_of_groups(policies: &[Policy], groups: &[Group]) -> Vec<Vec<String>> {
    let mut out = vec![Vec::new(); policies.len()];
    for group in groups {
        for &i in &group.members {
            if validation_actions(policies[i].mode).is_some() {
                out[i] = group.names.to_vec();
            }
        }
    }
    out
}

/// Policies that share one DELETE and one UPDATE pair.
struct Group {
    names: [String; 2],
    /// Indices into the policies, in their order.
    members: Vec<usize>,
}

/// Kinds of one mode and shape beyond which they are spread over
/// [`SPREAD`] pairs: an object's annotations may hold 256 KiB, about 2,000
/// kinds' origins. Each kind's pair is then fixed by a hash of its name, so
/// adding or removing a kind changes one pair only; crossing the threshold
/// writes the new pairs before the first one loses its kinds (see
/// [`crate::plan::diff`]).
pub const SHARED_KINDS_BEFORE_SPREAD: usize = 1000;
pub const SPREAD: u64 = 16;

/// The policies that share objects, in the order their first member appears:
/// the XRD policies of one mode and shape together (spread over [`SPREAD`]
/// pairs when there are very many), each other policy alone.
fn group(policies: &[Policy], set: Option<&str>) -> Vec<Group> {
    let mut per_variant: BTreeMap<(Mode, Shape), usize> = BTreeMap::new();
    for p in policies.iter().filter(|p| is_shared(p)) {
        *per_variant.entry((p.mode, p.kind.shape)).or_default() += 1;
    }
    let mut groups: Vec<Group> = Vec::new();
    let mut index: BTreeMap<[String; 2], usize> = BTreeMap::new();
    for (i, p) in policies.iter().enumerate() {
        let names = if is_shared(p) {
            let spread = per_variant
                .get(&(p.mode, p.kind.shape))
                .is_some_and(|n| *n > SHARED_KINDS_BEFORE_SPREAD);
            let part = if spread {
                fnv1a_64(p.kind.to_string().as_bytes()) % SPREAD
            } else {
                0
            };
            PairName::Shared {
                mode: p.mode,
                shape: p.kind.shape,
                part,
                set: set.map(str::to_string),
            }
            .names()
        } else {
            PairName::of(p).names()
        };
        match index.get(&names) {
            Some(&g) => groups[g].members.push(i),
            None => {
                index.insert(names.clone(), groups.len());
                groups.push(Group {
                    names,
                    members: vec![i],
                });
            }
        }
    }
    groups
}

/// The names of what [`compile`] makes of a policy on its own (empty for Off).
pub fn object_names(policy: &Policy) -> Vec<String> {
    if validation_actions(policy.mode).is_none() {
        return Vec::new();
    }
    PairName::of(policy).names().into()
}

/// One rule per group and scope, naming every plural of the policies' kinds
/// in it (sorted, each once), so that the objects do not change with the
/// order the kinds were read in.
fn rules(carriers: &[&Policy], operation: &str) -> Vec<NamedRuleWithOperations> {
    let mut by_group: BTreeMap<(&str, &str), BTreeSet<&str>> = BTreeMap::new();
    for p in carriers {
        by_group
            .entry((p.kind.group.as_str(), p.kind.scope.admission_scope()))
            .or_default()
            .insert(p.kind.plural.as_str());
    }
    by_group
        .into_iter()
        .map(|((group, scope), plurals)| NamedRuleWithOperations {
            api_groups: Some(vec![group.to_string()]),
            api_versions: Some(vec!["*".to_string()]),
            operations: Some(vec![operation.to_string()]),
            resources: Some(plurals.into_iter().map(str::to_string).collect()),
            scope: Some(scope.to_string()),
            resource_names: None,
        })
        .collect()
}

/// `first` is one of `carriers`: they share its mode and shape.
fn compile_delete(
    name: String,
    first: &Policy,
    carriers: &[&Policy],
    settings: &CompileSettings,
    actions: Vec<String>,
) -> Compiled {
    let mode = first.mode;
    let cel = compile_cel(mode, first.kind.shape, settings);
    // With the match condition the validation and its message run only on a
    // refusal, so they are written out (BENCHMARKS.md, run 9: the variables
    // cost every protected delete). Warn evaluates everything on every
    // delete and shares the variables between validation, message and audit
    // annotation.
    let with_condition = mode != Mode::Warn;
    let (variables, validation, message_expression) = if with_condition {
        let out = WrittenOut::new(&cel.variables);
        (
            variables(out.kept.clone()),
            out.expression(&cel.validation),
            out.expression(&cel.message_expression),
        )
    } else {
        (
            variables(cel.variables),
            cel.validation,
            cel.message_expression,
        )
    };
    // objectSelector is matched against the stored object's labels on DELETE.
    assemble(
        name,
        carriers,
        rules(carriers, "DELETE"),
        actions,
        ValidatingAdmissionPolicySpec {
            // Refuse and Convert pass safe deletes on this condition alone:
            // the API server then skips the validation and its message (both
            // evaluated on every request otherwise). The validation keeps the
            // full rule, so the verdict does not rest on the condition. Warn
            // evaluates everything, to audit why it allowed.
            match_conditions: with_condition.then(|| {
                vec![MatchCondition {
                    name: UNSAFE_DELETE_CONDITION.to_string(),
                    expression: cel.refusal_condition.clone(),
                }]
            }),
            variables,
            validations: Some(vec![Validation {
                expression: validation,
                message: Some(cel.message),
                message_expression: Some(message_expression),
                reason: Some(cel.reason.to_string()),
            }]),
            // The API server evaluates audit annotations on every request, so
            // only Warn, whose point is the record, carries why it allowed.
            audit_annotations: (mode == Mode::Warn).then(|| {
                vec![AuditAnnotation {
                    key: DECISION_AUDIT_KEY.to_string(),
                    value_expression: cel.decision_expression,
                }]
            }),
            ..ValidatingAdmissionPolicySpec::default()
        },
    )
}

/// The policy that keeps a cascade's finalizers and an XR's composed
/// resources from being taken away by an update. Every mode has the match
/// condition, Warn included: updates are far more frequent than deletes, and
/// an ordinary one must cost no more than that condition. On UPDATE a
/// binding's objectSelector matches when the old or the new labels match, so
/// taking the label off in the same update does not escape it.
fn compile_update(
    name: String,
    first: &Policy,
    carriers: &[&Policy],
    settings: &CompileSettings,
    actions: Vec<String>,
) -> Compiled {
    let cel = compile_update_cel(first.mode, first.kind.shape, settings);
    let out = WrittenOut::new(&cel.variables);
    assemble(
        name,
        carriers,
        rules(carriers, "UPDATE"),
        actions,
        ValidatingAdmissionPolicySpec {
            match_conditions: Some(vec![MatchCondition {
                name: GUARDED_UPDATE_CONDITION.to_string(),
                expression: cel.match_condition,
            }]),
            // Written out, as for a delete: the match condition stops nearly
            // every update, and the variables would cost each one.
            variables: variables(out.kept.clone()),
            validations: Some(
                cel.validations
                    .into_iter()
                    .map(|v| Validation {
                        expression: out.expression(&v.expression),
                        message: Some(v.message),
                        message_expression: Some(out.expression(&v.message_expression)),
                        reason: Some(cel.reason.to_string()),
                    })
                    .collect(),
            ),
            ..ValidatingAdmissionPolicySpec::default()
        },
    )
}

/// A policy with `spec`'s CEL, matching `rules`, failing closed, and its
/// binding with the policies' selector (shared objects have none).
fn assemble(
    name: String,
    carriers: &[&Policy],
    rules: Vec<NamedRuleWithOperations>,
    actions: Vec<String>,
    spec: ValidatingAdmissionPolicySpec,
) -> Compiled {
    let metadata = metadata(&name, carriers);
    let selector = match carriers {
        [only] => only.selector.clone(),
        _ => None,
    };
    let vap = ValidatingAdmissionPolicy {
        metadata: metadata.clone(),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".to_string()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(rules),
                // Every version is in the rule, and a custom resource has no
                // equivalent in another group, so Equivalent (the default)
                // would only add a second pass to every request's matching.
                match_policy: Some("Exact".to_string()),
                ..MatchResources::default()
            }),
            ..spec
        }),
        status: None,
    };
    let binding = ValidatingAdmissionPolicyBinding {
        metadata,
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: name.clone(),
            validation_actions: actions,
            // No rules of its own: a binding without them matches what its
            // policy does, where rules restated here would make the API
            // server scan every protected request's resource list a second
            // time (BENCHMARKS.md, run 9).
            match_resources: Some(MatchResources {
                object_selector: selector,
                match_policy: Some("Exact".to_string()),
                ..MatchResources::default()
            }),
            param_ref: None,
        },
    };
    Compiled {
        policy: vap,
        binding,
    }
}

fn variables(cel: Vec<super::cel::CelVariable>) -> Option<Vec<Variable>> {
    (!cel.is_empty()).then(|| {
        cel.into_iter()
            .map(|v| Variable {
                name: v.name.to_string(),
                expression: v.expression,
            })
            .collect()
    })
}

/// A shared object says, per kind, where its policy comes from
/// ([`PROTECTED_KINDS_ANNOTATION`]); a CascadePolicy's own object says it in
/// one annotation each.
fn metadata(name: &str, carriers: &[&Policy]) -> ObjectMeta {
    let mut annotations = BTreeMap::new();
    if let Some(first) = carriers.first() {
        annotations.insert(MODE_ANNOTATION.to_string(), first.mode.to_string());
        if is_shared(first) {
            let kinds: BTreeMap<String, BTreeMap<&str, String>> = carriers
                .iter()
                .map(|p| {
                    (
                        p.kind.to_string(),
                        BTreeMap::from([
                            ("source", p.source.to_string()),
                            ("modeFrom", mode_from(&p.source).to_string()),
                        ]),
                    )
                })
                .collect();
            // A map of strings always serialises.
            annotations.insert(
                PROTECTED_KINDS_ANNOTATION.to_string(),
                serde_json::to_string(&kinds).unwrap_or_default(),
            );
        } else {
            annotations.insert(SOURCE_ANNOTATION.to_string(), first.source.to_string());
            annotations.insert(
                PROTECTED_KIND_ANNOTATION.to_string(),
                first.kind.to_string(),
            );
            annotations.insert(
                MODE_FROM_ANNOTATION.to_string(),
                mode_from(&first.source).to_string(),
            );
        }
    }
    ObjectMeta {
        name: Some(name.to_string()),
        labels: Some(BTreeMap::from([(
            MANAGED_BY_LABEL.to_string(),
            MANAGED_BY_VALUE.to_string(),
        )])),
        annotations: Some(annotations),
        ..ObjectMeta::default()
    }
}

/// The value of [`MODE_FROM_ANNOTATION`]: so the objects themselves say
/// whether an XRD's protection is its own or the default's.
pub fn mode_from(source: &Source) -> &'static str {
    match source {
        Source::Xrd {
            annotated: true, ..
        } => "xrd-annotation",
        Source::Xrd {
            annotated: false, ..
        } => "xrd-default-mode",
        Source::CascadePolicy { .. } => "cascadepolicy",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cel::SCHEMA_DEPENDENT_VARIABLES;
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
            // Refuse: the validation and message are written out, but for
            // the rules over fields the kind's schema may lack.
            let kept: Vec<&str> = spec["variables"]
                .as_array()
                .map(|vs| vs.iter().filter_map(|v| v["name"].as_str()).collect())
                .unwrap_or_default();
            assert!(
                kept.iter().all(|n| SCHEMA_DEPENDENT_VARIABLES.contains(n)),
                "{kept:?}"
            );
            for e in [
                &spec["validations"][0]["expression"],
                &spec["validations"][0]["messageExpression"],
            ] {
                let mut e = e.as_str().unwrap().to_string();
                for n in &kept {
                    e = e.replace(&format!("variables.{n}"), "");
                }
                assert!(!e.contains("variables."), "{e}");
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
            serde_json::from_str(ann["cascade-guard.dev/protected-kinds"].as_str().unwrap())
                .unwrap();
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
}
