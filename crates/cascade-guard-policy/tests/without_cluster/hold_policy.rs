//! The hold policy, pinned whole: each field is what keeps sibling order's
//! holds from refusing what they must not. Failure policy Fail (a hold that
//! errs holds); DELETE of the held kinds only, with no selector (a
//! DeleteCollection's items carry no labels a selector could read, and the
//! record decides what is held); cascade-guard itself not matched; Crossplane
//! let through, and only on DELETE, the one operation it matches; the
//! binding Deny, reading the record, and allowing all while the record is
//! missing.

use std::collections::BTreeSet;

use cascade_guard_policy::CompileSettings;
use cascade_guard_policy::sibling::hold_policy::compile_hold;
use serde_json::{Value, json};

const CONTROLLER: &str = "system:serviceaccount:cg:cascade-guard";
const CROSSPLANE: &str = "system:serviceaccount:crossplane-system:crossplane";

fn settings() -> CompileSettings {
    CompileSettings {
        controller_user: CONTROLLER.to_string(),
        crossplane_user: CROSSPLANE.to_string(),
        ..CompileSettings::default()
    }
}

fn rule(group: &str, resources: &[&str]) -> Value {
    json!({
        "apiGroups": [group], "apiVersions": ["*"], "operations": ["DELETE"],
        "resources": resources, "scope": "*",
    })
}

/// The whole policy, with `rules` for the held kinds. Written out, with no
/// `spec.variables` (kubernetes/kubernetes#135757): each piece below is
/// what a variable held, in parentheses wherever it is read.
fn policy(rules: Value) -> Value {
    let name = "(request.?name.orValue('') != '' ? request.name : oldObject.metadata.name)";
    let namespace = "(request.?namespace.orValue(''))";
    let key = format!(
        "(request.kind.kind + '_' + request.kind.group + '_' + {namespace} + '_' + {name})"
    );
    let holds = "(request.operation == 'DELETE' && has(params.data) && 'held' in params.data ? params.data['held'] : '')";
    let held = format!(r"({holds}.contains('\n' + {key} + '\t'))");
    let held_for = format!(
        r"({held} ? {holds}.split('\n' + {key} + '\t', 2)[1].split('\n', 2)[0].split(' ', 3)[2] : '')"
    );
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {
            "name": "cascade-guard-sibling-order",
            "labels": {"cascade-guard.dev/sibling-order": "true"},
        },
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "matchConstraints": {"matchPolicy": "Exact", "resourceRules": rules},
            "matchConditions": [{
                "name": "not-cascade-guard",
                "expression": format!("request.userInfo.?username.orValue('') != \"{CONTROLLER}\""),
            }],
            "validations": [{
                "expression": format!(
                    "!{held} || request.userInfo.username == \"{CROSSPLANE}\" || (has(oldObject.metadata.annotations) && 'cascade-guard.dev/break-glass' in oldObject.metadata.annotations && oldObject.metadata.annotations['cascade-guard.dev/break-glass'] != '' && authorizer.group('cascade-guard.dev').resource('breakglass').check('use').allowed())"
                ),
                "messageExpression": format!("'cascade-guard holds ' + request.kind.kind + ' ' + {name} + ' until ' + {held_for} + ' is gone (sibling order); it lets it go then. To delete it now: annotate it cascade-guard.dev/break-glass=<reason>.'"),
                "message": "cascade-guard holds this object until what needs it is gone (sibling order); to delete it now, annotate it cascade-guard.dev/break-glass=<reason>",
                "reason": "Forbidden",
            }],
        },
    })
}

#[test]
fn the_hold_policy_and_its_binding_are_pinned_whole() {
    let held = BTreeSet::from([
        (String::new(), "secrets".to_string()),
        (
            "helm.m.crossplane.io".to_string(),
            "providerconfigs".to_string(),
        ),
        ("helm.m.crossplane.io".to_string(), "releases".to_string()),
    ]);
    let compiled = compile_hold(&settings(), "cg", &held);
    assert_eq!(
        serde_json::to_value(&compiled.policy).expect("serializes"),
        policy(json!([
            rule("", &["secrets"]),
            rule("helm.m.crossplane.io", &["providerconfigs", "releases"]),
        ]))
    );
    assert_eq!(
        serde_json::to_value(&compiled.binding).expect("serializes"),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {
                "name": "cascade-guard-sibling-order",
                "labels": {"cascade-guard.dev/sibling-order": "true"},
            },
            "spec": {
                "policyName": "cascade-guard-sibling-order",
                "validationActions": ["Deny"],
                "paramRef": {"name": "cascade-guard-holds", "namespace": "cg",
                             "parameterNotFoundAction": "Allow"},
            },
        })
    );
}

/// Nothing held: a rule that matches nothing, never every DELETE.
#[test]
fn with_nothing_held_the_hold_policy_matches_nothing() {
    let compiled = compile_hold(&settings(), "cg", &BTreeSet::new());
    assert_eq!(
        serde_json::to_value(&compiled.policy).expect("serializes"),
        policy(json!([rule("cascade-guard.dev", &["nothing-held"])]))
    );
}
