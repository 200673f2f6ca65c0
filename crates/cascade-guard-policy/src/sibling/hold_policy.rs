//! The admission policies of sibling order's holds (pure): the hold policy,
//! which refuses the delete of what the record [`HOLDS`] names, and the
//! record guard, which keeps sibling order's two records cascade-guard's
//! alone; and the parts of them the gate's policies ([`super::gate`]) share.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ParamKind, ParamRef,
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingAdmissionPolicyBindingSpec, ValidatingAdmissionPolicySpec, Validation,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use crate::admission::Compiled;
use crate::cel::{break_glass_for, cel_string_literal, inline_variables, var};
use crate::names::{BREAK_GLASS_ANNOTATION, GROUP};
use crate::settings::CompileSettings;
use crate::sibling::gate::ORDERED_TREES;
use crate::sibling::holds_record::{HELD_KEY, HOLDS};

/// The name of the hold policy and its binding.
pub const HOLD_OBJECT_NAME: &str = "cascade-guard-sibling-order";
/// The name of the policy and binding that keep sibling order's two
/// ConfigMaps cascade-guard's alone.
pub const RECORD_GUARD_NAME: &str = "cascade-guard-sibling-order-records";
/// The label on the hold policy and binding, by which cascade-guard finds
/// them (they are not part of the policies' plan, whose objects carry the
/// managed-by label, so the sync pass leaves them alone).
pub const SIBLING_ORDER_LABEL: &str = "cascade-guard.dev/sibling-order";

/// A kind whose DELETEs the hold policy sees: `(group, plural)`.
pub type HeldKind = (String, String);

/// The ValidatingAdmissionPolicy and binding that hold what [`HOLDS`], in
/// `namespace`, names, for objects of `held_kinds`.
///
/// Its rules name the kinds held, not every kind: the API server makes the
/// record a CEL value at every evaluation of the policy, before any match
/// condition, whether or not the request is for a held object (about 0.2 ms
/// on Kubernetes 1.37), so the DELETEs of every other kind must not reach
/// it. Names cannot narrow the rules further: a DeleteCollection's items
/// (the namespace controller's way) come with no name, and would not match.
pub fn compile_hold(
    settings: &CompileSettings,
    namespace: &str,
    held_kinds: &BTreeSet<HeldKind>,
) -> Compiled {
    let controller = cel_string_literal(&settings.controller_user);
    // Crossplane's own deletes go through: a composition that drops a
    // resource, and a Usage's replay, which comes only once the Usage's user
    // is gone. cascade-guard never refuses Crossplane.
    let crossplane = cel_string_literal(&settings.crossplane_user);
    let variables = vec![
        // A DeleteCollection's items come with no request.name: only they
        // read the stored object, whose conversion is what a policy's
        // evaluation costs most. A cluster-scoped object's request has no
        // namespace at all: every field read is optional, since an error
        // here would refuse every delete in the cluster (and `namespace` is
        // a word CEL reserves).
        var(
            "name",
            "request.?name.orValue('') != '' ? request.name : oldObject.metadata.name",
        ),
        var("objectNamespace", "request.?namespace.orValue('')"),
        var(
            "key",
            "request.kind.kind + '_' + request.kind.group + '_' + variables.objectNamespace + '_' + variables.name",
        ),
        var(
            "holds",
            &format!(
                "request.operation == 'DELETE' && has(params.data) && '{HELD_KEY}' in params.data ? params.data['{HELD_KEY}'] : ''"
            ),
        ),
        // contains, not indexOf, to tell: indexOf turns the whole string
        // into code points at each call (cel-go), and this is every DELETE
        // of a held kind.
        var(
            "held",
            "variables.holds.contains('\\n' + variables.key + '\\t')",
        ),
        // The entry's third field, what it waits for: the line after the key
        // is `<root uid> <Kind.group> <held for>`. Read only to refuse, by
        // splitting: each variable is written out wherever it is read, and
        // an offset kept to cut with would be computed again at each use.
        var(
            "heldFor",
            "variables.held ? variables.holds.split('\\n' + variables.key + '\\t', 2)[1].split('\\n', 2)[0].split(' ', 3)[2] : ''",
        ),
    ];
    // Written out, no `spec.variables` (see `inline_variables`).
    let written = |e: &str| inline_variables(e, &variables);
    let validations = vec![Validation {
        expression: written(&format!(
            "!variables.held || request.userInfo.username == {crossplane} || ({})",
            break_glass_for(settings, "oldObject")
        )),
        message_expression: Some(written(&format!(
            "'cascade-guard holds ' + request.kind.kind + ' ' + variables.name + ' until ' + variables.heldFor + ' is gone (sibling order); it lets it go then. To delete it now: annotate it {BREAK_GLASS_ANNOTATION}=<reason>.'"
        ))),
        message: Some(format!(
            "cascade-guard holds this object until what needs it is gone (sibling order); to delete it now, annotate it {BREAK_GLASS_ANNOTATION}=<reason>"
        )),
        reason: Some("Forbidden".to_string()),
    }];
    let metadata = sibling_order_metadata(HOLD_OBJECT_NAME);
    let policy = ValidatingAdmissionPolicy {
        metadata: metadata.clone(),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".to_string()),
            param_kind: Some(record_param()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(hold_rules(held_kinds)),
                match_policy: Some(MATCH_POLICY.to_string()),
                ..MatchResources::default()
            }),
            match_conditions: Some(vec![MatchCondition {
                name: "not-cascade-guard".to_string(),
                expression: format!("request.userInfo.?username.orValue('') != {controller}"),
            }]),
            validations: Some(validations),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    };
    // Deny would refuse every delete in the cluster while the record is
    // missing; without it nothing is held, and the controller writes it
    // again at its next look.
    let binding = reading_record(metadata, HOLD_OBJECT_NAME, HOLDS, namespace, "Allow");
    Compiled { policy, binding }
}

/// The policy and binding that refuse a change or delete of sibling order's
/// two ConfigMaps in `namespace` by anyone but cascade-guard: a forged entry
/// would hold or order what cascade-guard did not. It reads no parameter
/// and sees only the ConfigMap requests of that namespace (its binding's
/// namespace selector), so it costs the rest of the cluster nothing.
pub fn compile_record_guard(settings: &CompileSettings, namespace: &str) -> Compiled {
    let controller = cel_string_literal(&settings.controller_user);
    let holds = cel_string_literal(HOLDS);
    let ordered = cel_string_literal(ORDERED_TREES);
    // Written out, no `spec.variables` (see `inline_variables`).
    let name = [var(
        "name",
        "request.?name.orValue('') != '' ? request.name : oldObject.metadata.name",
    )];
    let written = |e: &str| inline_variables(e, &name);
    let metadata = sibling_order_metadata(RECORD_GUARD_NAME);
    let policy = ValidatingAdmissionPolicy {
        metadata: metadata.clone(),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".to_string()),
            param_kind: None,
            match_constraints: Some(MatchResources {
                resource_rules: Some(vec![NamedRuleWithOperations {
                    api_groups: Some(vec![String::new()]),
                    api_versions: Some(vec!["v1".to_string()]),
                    resources: Some(vec!["configmaps".to_string()]),
                    // Any name: a DeleteCollection's items have none.
                    operations: Some(vec!["UPDATE".to_string(), "DELETE".to_string()]),
                    scope: Some("Namespaced".to_string()),
                    resource_names: None,
                }]),
                match_policy: Some(MATCH_POLICY.to_string()),
                ..MatchResources::default()
            }),
            match_conditions: Some(vec![MatchCondition {
                name: "not-cascade-guard".to_string(),
                expression: format!("request.userInfo.?username.orValue('') != {controller}"),
            }]),
            validations: Some(vec![Validation {
                expression: written(&format!("!(variables.name in [{holds}, {ordered}])")),
                message_expression: Some(written(
                    "'only cascade-guard changes or deletes ConfigMap ' + variables.name + ': it says what cascade-guard holds and which trees it ordered, and its policies read it. To let go of everything: cascade-guard uninstall, or run the controller with --sibling-order off'",
                )),
                message: Some(
                    "only cascade-guard changes or deletes sibling order's ConfigMaps: they say what sibling order holds".to_string(),
                ),
                reason: Some("Forbidden".to_string()),
            }]),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    };
    let binding = ValidatingAdmissionPolicyBinding {
        metadata,
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: RECORD_GUARD_NAME.to_string(),
            validation_actions: vec!["Deny".to_string()],
            match_resources: Some(MatchResources {
                namespace_selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([(
                        "kubernetes.io/metadata.name".to_string(),
                        namespace.to_string(),
                    )])),
                    ..LabelSelector::default()
                }),
                ..MatchResources::default()
            }),
            param_ref: None,
        },
    };
    Compiled { policy, binding }
}

/// How sibling order's policies match: every version is in their rules, and
/// what they name (custom resources, Secrets, ConfigMaps) has no equivalent
/// in another group, so Equivalent would only add a lookup of equivalents to
/// every request they do not match (measured: BENCHMARKS.md, #46).
pub(crate) const MATCH_POLICY: &str = "Exact";

/// The DELETEs of the kinds held, by group; with none held, one rule that
/// matches nothing (a policy must have one).
fn hold_rules(held_kinds: &BTreeSet<HeldKind>) -> Vec<NamedRuleWithOperations> {
    let mut by_group: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (group, plural) in held_kinds {
        by_group.entry(group).or_default().push(plural.clone());
    }
    if by_group.is_empty() {
        by_group.insert(GROUP, vec!["nothing-held".to_string()]);
    }
    by_group
        .into_iter()
        .map(|(group, resources)| delete_rule(group, resources))
        .collect()
}

/// A rule matching the DELETEs of `resources` of `group`, any version and
/// scope.
pub(crate) fn delete_rule(group: &str, resources: Vec<String>) -> NamedRuleWithOperations {
    NamedRuleWithOperations {
        api_groups: Some(vec![group.to_string()]),
        api_versions: Some(vec!["*".to_string()]),
        resources: Some(resources),
        operations: Some(vec!["DELETE".to_string()]),
        scope: Some("*".to_string()),
        resource_names: None,
    }
}

/// The parameter of sibling order's policies: a ConfigMap. Not a custom
/// resource: the API server hands a custom resource to CEL by a JSON round
/// trip of the whole object, and a ConfigMap by a conversion whose cost
/// follows the number of its entries, not their size (measured on 1.37:
/// BENCHMARKS.md).
pub(crate) fn record_param() -> ParamKind {
    ParamKind {
        api_version: Some("v1".to_string()),
        kind: Some("ConfigMap".to_string()),
    }
}

/// A binding of `policy` that refuses (Deny) with the record `record` of
/// `namespace` as its parameter, `not_found` when it is missing.
pub(crate) fn reading_record(
    metadata: ObjectMeta,
    policy: &str,
    record: &str,
    namespace: &str,
    not_found: &str,
) -> ValidatingAdmissionPolicyBinding {
    ValidatingAdmissionPolicyBinding {
        metadata,
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: policy.to_string(),
            validation_actions: vec!["Deny".to_string()],
            match_resources: None,
            param_ref: Some(ParamRef {
                name: Some(record.to_string()),
                namespace: Some(namespace.to_string()),
                parameter_not_found_action: Some(not_found.to_string()),
                selector: None,
            }),
        },
    }
}

/// The metadata of an admission object of sibling order's: its name, and
/// the label by which cascade-guard (and `uninstall`) find it.
pub(crate) fn sibling_order_metadata(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        labels: Some(BTreeMap::from([(
            SIBLING_ORDER_LABEL.to_string(),
            "true".to_string(),
        )])),
        ..ObjectMeta::default()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_hold_policy_is_pinned_whole() {
        let settings = CompileSettings {
            controller_user: "system:serviceaccount:cg:cascade-guard".to_string(),
            crossplane_user: "system:serviceaccount:crossplane-system:crossplane".to_string(),
            ..CompileSettings::default()
        };
        let held = BTreeSet::from([
            ("".to_string(), "secrets".to_string()),
            (
                "helm.m.crossplane.io".to_string(),
                "providerconfigs".to_string(),
            ),
            ("helm.m.crossplane.io".to_string(), "releases".to_string()),
        ]);
        let compiled = compile_hold(&settings, "cg", &held);
        let policy = serde_json::to_value(&compiled.policy).expect("serializes");
        let spec = &policy["spec"];
        assert_eq!(
            policy["metadata"],
            json!({"name": HOLD_OBJECT_NAME, "labels": {SIBLING_ORDER_LABEL: "true"}})
        );
        assert_eq!(spec["failurePolicy"], "Fail");
        assert_eq!(
            spec["paramKind"],
            json!({"apiVersion": "v1", "kind": "ConfigMap"})
        );
        assert_eq!(
            spec["matchConstraints"],
            json!({"matchPolicy": "Exact", "resourceRules": [
                {"apiGroups": [""], "apiVersions": ["*"], "resources": ["secrets"],
                 "operations": ["DELETE"], "scope": "*"},
                {"apiGroups": ["helm.m.crossplane.io"], "apiVersions": ["*"],
                 "resources": ["providerconfigs", "releases"],
                 "operations": ["DELETE"], "scope": "*"},
            ]})
        );
        assert_eq!(
            spec["matchConditions"],
            json!([{"name": "not-cascade-guard",
                    "expression": "request.userInfo.?username.orValue('') != \"system:serviceaccount:cg:cascade-guard\""}])
        );
        // Written out: no variables (kubernetes/kubernetes#135757).
        assert!(spec.get("variables").is_none(), "{spec}");
        assert!(!spec.to_string().contains("variables."), "{spec}");
        // Every request field read is optional but the kind (always there):
        // an error would refuse every delete in the cluster, and a
        // cluster-scoped object's request has no namespace.
        assert!(!spec.to_string().contains("request.namespace"), "{spec}");
        let validations = spec["validations"].as_array().expect("validations");
        assert_eq!(validations.len(), 1);
        let delete = validations[0]["expression"].as_str().unwrap_or_default();
        let held = "((request.operation == 'DELETE' && has(params.data) && 'held' in params.data ? params.data['held'] : '').contains('\\n' + (request.kind.kind + '_' + request.kind.group + '_' + (request.?namespace.orValue('')) + '_' + (request.?name.orValue('') != '' ? request.name : oldObject.metadata.name)) + '\\t'))";
        assert!(
            delete.starts_with(&format!("!{held} || request.userInfo.username == \"system:serviceaccount:crossplane-system:crossplane\" || ("))
                && delete.contains("authorizer.group('cascade-guard.dev')"),
            "{delete}"
        );
        for v in validations {
            assert_eq!(v["reason"], "Forbidden");
        }
        let binding = serde_json::to_value(&compiled.binding).expect("serializes");
        assert_eq!(
            binding["spec"],
            json!({"policyName": HOLD_OBJECT_NAME, "validationActions": ["Deny"],
                   "paramRef": {"name": "cascade-guard-holds", "namespace": "cg",
                                "parameterNotFoundAction": "Allow"}})
        );
        // Nothing held: a rule that matches nothing, never every DELETE.
        let none = serde_json::to_value(&compile_hold(&settings, "cg", &BTreeSet::new()).policy)
            .expect("serializes");
        assert_eq!(
            none["spec"]["matchConstraints"]["resourceRules"],
            json!([{"apiGroups": ["cascade-guard.dev"], "apiVersions": ["*"],
                    "resources": ["nothing-held"], "operations": ["DELETE"], "scope": "*"}])
        );
    }

    #[test]
    fn the_record_guard_is_pinned_whole() {
        let settings = CompileSettings {
            controller_user: "system:serviceaccount:cg:cascade-guard".to_string(),
            ..CompileSettings::default()
        };
        let compiled = compile_record_guard(&settings, "cg");
        assert_eq!(
            serde_json::to_value(&compiled.policy).expect("serializes"),
            json!({
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": RECORD_GUARD_NAME, "labels": {SIBLING_ORDER_LABEL: "true"}},
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {"matchPolicy": "Exact", "resourceRules": [
                        {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                         "operations": ["UPDATE", "DELETE"], "scope": "Namespaced"}]},
                    "matchConditions": [{"name": "not-cascade-guard",
                        "expression": "request.userInfo.?username.orValue('') != \"system:serviceaccount:cg:cascade-guard\""}],
                    "validations": [{
                        "expression": "!((request.?name.orValue('') != '' ? request.name : oldObject.metadata.name) in [\"cascade-guard-holds\", \"cascade-guard-ordered-trees\"])",
                        "messageExpression": "'only cascade-guard changes or deletes ConfigMap ' + (request.?name.orValue('') != '' ? request.name : oldObject.metadata.name) + ': it says what cascade-guard holds and which trees it ordered, and its policies read it. To let go of everything: cascade-guard uninstall, or run the controller with --sibling-order off'",
                        "message": "only cascade-guard changes or deletes sibling order's ConfigMaps: they say what sibling order holds",
                        "reason": "Forbidden"}]
                }
            })
        );
        assert_eq!(
            serde_json::to_value(&compiled.binding).expect("serializes")["spec"],
            json!({"policyName": RECORD_GUARD_NAME, "validationActions": ["Deny"],
                   "matchResources": {"namespaceSelector": {"matchLabels": {
                       "kubernetes.io/metadata.name": "cg"}}}})
        );
    }
}
