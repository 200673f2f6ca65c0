//! Whether an admission object in the cluster is the one cascade-guard
//! compiled: the one comparison behind both the controller's repair and
//! `cascade-guard status`.
//!
//! The whole `spec` counts, as the API server stores it: a field someone adds
//! (a binding's `objectSelector`, a policy's `excludeResourceRules`, another
//! validation) can narrow or lift protection as surely as one they change. So
//! the compiled spec is given the defaults the API server fills in, and both
//! sides lose the empty values its encoding omits; what is left must be equal.
//! In metadata only cascade-guard's own labels and annotations count: others
//! may add theirs (tools annotate what they see) without changing what the
//! object does.

use serde_json::{Map, Value};

/// The first place where `live` is not what `desired` (an object as compiled,
/// with `kind` set) becomes once stored, as a dotted path; None when it is.
pub fn first_difference(desired: &Value, live: &Value) -> Option<String> {
    let kind = desired.get("kind").and_then(Value::as_str).unwrap_or("");
    let spec = |object: &Value| {
        let mut spec = object.get("spec").cloned().unwrap_or(Value::Null);
        with_server_defaults(kind, &mut spec);
        without_empty_values(spec)
    };
    if let Some(path) = whole_difference(&spec(desired), &spec(live), "spec") {
        return Some(path);
    }
    for field in ["labels", "annotations"] {
        let pointer = format!("/metadata/{field}");
        let Some(Value::Object(wanted)) = desired.pointer(&pointer) else {
            continue;
        };
        let present = live.pointer(&pointer).and_then(Value::as_object);
        for (key, value) in wanted {
            if present.and_then(|p| p.get(key)) != Some(value) {
                return Some(format!("metadata.{field}.{key}"));
            }
        }
    }
    None
}

/// What the API server sets in a ValidatingAdmissionPolicy or binding spec
/// when the client leaves it out (admissionregistration/v1 defaulting), for
/// the fields cascade-guard leaves out. Setting them again is harmless, so
/// the live side may go through this too.
fn with_server_defaults(kind: &str, spec: &mut Value) {
    let Value::Object(spec) = spec else { return };
    match kind {
        "ValidatingAdmissionPolicy" => {
            spec.entry("failurePolicy")
                .or_insert_with(|| Value::from("Fail"));
            if let Some(Value::Object(m)) = spec.get_mut("matchConstraints") {
                match_resources_defaults(m);
            }
        }
        "ValidatingAdmissionPolicyBinding" => {
            if let Some(Value::Object(m)) = spec.get_mut("matchResources") {
                match_resources_defaults(m);
            }
        }
        _ => {}
    }
}

fn match_resources_defaults(m: &mut Map<String, Value>) {
    m.entry("matchPolicy")
        .or_insert_with(|| Value::from("Equivalent"));
    // The empty selectors the API server adds are dropped again below, like
    // every empty value; an added selector that selects something is not.
    for rules in ["resourceRules", "excludeResourceRules"] {
        if let Some(Value::Array(rules)) = m.get_mut(rules) {
            for rule in rules {
                if let Value::Object(rule) = rule {
                    rule.entry("scope").or_insert_with(|| Value::from("*"));
                }
            }
        }
    }
}

/// Nulls, empty lists and empty objects removed, deepest first: the API
/// server's encoding omits them, so on the wire they mean the same as absent.
fn without_empty_values(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, without_empty_values(v)))
                .filter(|(_, v)| !is_empty(v))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_empty_values).collect()),
        other => other,
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// The first path where the two differ in any way: a field on either side
/// only, another value, a list of another length.
fn whole_difference(a: &Value, b: &Value, path: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|k| {
                let here = format!("{path}.{k}");
                match (a.get(k), b.get(k)) {
                    (Some(av), Some(bv)) => whole_difference(av, bv, &here),
                    _ => Some(here),
                }
            })
        }
        (Value::Array(a), Value::Array(b)) => {
            if a.len() != b.len() {
                return Some(path.to_string());
            }
            a.iter()
                .zip(b)
                .enumerate()
                .find_map(|(i, (av, bv))| whole_difference(av, bv, &format!("{path}[{i}]")))
        }
        (a, b) => (a != b).then(|| path.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vap(spec: Value) -> Value {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": "p", "labels": {"app.kubernetes.io/managed-by": "cascade-guard"},
                "annotations": {"cascade-guard.dev/mode": "Refuse"}},
            "spec": spec,
        })
    }

    fn binding(spec: Value) -> Value {
        let mut b = vap(spec);
        b["kind"] = json!("ValidatingAdmissionPolicyBinding");
        b
    }

    fn rule() -> Value {
        json!({"apiGroups": ["g"], "apiVersions": ["*"], "operations": ["DELETE"], "resources": ["xs"]})
    }

    #[test]
    fn the_table() {
        let desired_vap = vap(json!({
            "matchConstraints": {"resourceRules": [rule()], "matchPolicy": "Exact"},
            "validations": [{"expression": "true", "message": "m"}],
        }));
        // As the API server stores it: defaults filled in, extra metadata.
        let mut stored_rule = rule();
        stored_rule["scope"] = json!("*");
        let mut stored_vap = vap(json!({
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [stored_rule.clone()], "matchPolicy": "Exact",
                "namespaceSelector": {}, "objectSelector": {}},
            "validations": [{"expression": "true", "message": "m"}],
        }));
        stored_vap["metadata"]["uid"] = json!("u");
        stored_vap["metadata"]["annotations"]["someone/else"] = json!("x");
        stored_vap["status"] = json!({"observedGeneration": 1});

        let desired_binding = binding(json!({
            "policyName": "p", "validationActions": ["Deny"],
            "matchResources": {"resourceRules": [rule()], "objectSelector": {"matchLabels": {}}},
        }));
        let stored_binding = binding(json!({
            "policyName": "p", "validationActions": ["Deny"],
            "matchResources": {"resourceRules": [stored_rule], "matchPolicy": "Equivalent",
                "namespaceSelector": {}, "objectSelector": {}},
        }));

        let edit = |base: &Value, pointer: &str, value: Value| {
            let mut v = base.clone();
            let (parent, key) = pointer.rsplit_once('/').unwrap();
            v.pointer_mut(parent).unwrap()[key] = value;
            v
        };
        let cases: Vec<(&str, &Value, Value, Option<&str>)> = vec![
            ("as stored", &desired_vap, stored_vap.clone(), None),
            (
                "binding as stored",
                &desired_binding,
                stored_binding.clone(),
                None,
            ),
            (
                "objectSelector added to a binding",
                &desired_binding,
                edit(
                    &stored_binding,
                    "/spec/matchResources/objectSelector",
                    json!({"matchLabels": {"x": "y"}}),
                ),
                Some("spec.matchResources.objectSelector"),
            ),
            (
                "namespaceSelector added to a policy",
                &desired_vap,
                edit(
                    &stored_vap,
                    "/spec/matchConstraints/namespaceSelector",
                    json!({"matchExpressions": [{"key": "k", "operator": "Exists"}]}),
                ),
                Some("spec.matchConstraints.namespaceSelector"),
            ),
            (
                "excludeResourceRules added",
                &desired_vap,
                edit(
                    &stored_vap,
                    "/spec/matchConstraints/excludeResourceRules",
                    json!([rule()]),
                ),
                Some("spec.matchConstraints.excludeResourceRules"),
            ),
            (
                "a validation added",
                &desired_vap,
                edit(
                    &stored_vap,
                    "/spec/validations",
                    json!([{"expression": "true", "message": "m"}, {"expression": "false"}]),
                ),
                Some("spec.validations"),
            ),
            (
                "a match condition added",
                &desired_vap,
                edit(
                    &stored_vap,
                    "/spec/matchConditions",
                    json!([{"name": "n", "expression": "false"}]),
                ),
                Some("spec.matchConditions"),
            ),
            (
                "failurePolicy changed",
                &desired_vap,
                edit(&stored_vap, "/spec/failurePolicy", json!("Ignore")),
                Some("spec.failurePolicy"),
            ),
            (
                "matchPolicy changed",
                &desired_vap,
                edit(
                    &stored_vap,
                    "/spec/matchConstraints/matchPolicy",
                    json!("Equivalent"),
                ),
                Some("spec.matchConstraints.matchPolicy"),
            ),
            (
                "an action added",
                &desired_binding,
                edit(
                    &stored_binding,
                    "/spec/validationActions",
                    json!(["Deny", "Audit"]),
                ),
                Some("spec.validationActions"),
            ),
            (
                "our label removed",
                &desired_vap,
                edit(&stored_vap, "/metadata/labels", json!({})),
                Some("metadata.labels.app.kubernetes.io/managed-by"),
            ),
            (
                "no spec",
                &desired_vap,
                edit(&stored_vap, "/spec", json!(null)),
                Some("spec"),
            ),
        ];
        for (label, desired, live, want) in cases {
            assert_eq!(first_difference(desired, &live).as_deref(), want, "{label}");
        }
    }

    #[test]
    fn annotations_are_compared_by_key() {
        // pointer_mut cannot address a key with a slash: set it directly.
        let desired = vap(json!({}));
        let mut live = desired.clone();
        live["metadata"]["annotations"]["cascade-guard.dev/mode"] = json!("Warn");
        assert_eq!(
            first_difference(&desired, &live).as_deref(),
            Some("metadata.annotations.cascade-guard.dev/mode")
        );
    }

    #[test]
    fn empty_values_are_absent() {
        let cases = [
            (
                json!({"a": {}, "b": [], "c": null, "d": 0, "e": false, "f": ""}),
                json!({"d": 0, "e": false, "f": ""}),
            ),
            (json!({"a": {"b": {"c": {}}}}), json!({})),
            (json!([{}, {"a": []}]), json!([{}, {}])),
        ];
        for (input, want) in cases {
            assert_eq!(without_empty_values(input.clone()), want, "{input}");
        }
    }
}
