//! The references a managed resource's provider resolves (pure): Upjet's
//! `<field>Ref` and `<field>Refs` under `spec.forProvider` and
//! `spec.initProvider`, at any depth (a Subnet's `vpcIdRef`, an EKS
//! NodeGroup's `clusterNameRef`, a SecurityGroupRule's
//! `securityGroupIdRef`, the `subnetIdRefs` of a cluster's `vpcConfig`).
//!
//! A `...SecretRef` or `...ConfigMapRef` (a Release's `chart.pullSecretRef`,
//! an RDS Instance's `passwordSecretRef`) names a Secret or ConfigMap to
//! read, not a resource the provider resolves: left out. So is a reference
//! with an empty name (providers write empty structs).
//!
//! Crossplane resolves a `<field>Selector` into the `<field>Ref(s)` beside it
//! and the value into `<field>`; a selector with no reference beside it is
//! not resolved yet, and cascade-guard does not guess what it will pick. A
//! reference names no kind (the provider's generated code knows it), so the
//! graph matches it by name among the objects of the same provider
//! ([`super::graph`]).

use serde::Serialize;
use serde_json::{Map, Value};

/// One reference read: where, and the name (and namespace, when it names
/// one) of what it points to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedReference {
    /// The field, as `spec.forProvider.vpcConfig[0].subnetIdRefs[1]`.
    pub field: String,
    pub name: String,
    pub namespace: Option<String>,
}

/// What an object's resolved references say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Read {
    pub references: Vec<ResolvedReference>,
    /// The selectors with no reference beside them, by field.
    pub unresolved_selectors: Vec<String>,
    /// A `...Ref` or `...Refs` field that is not an object (or a list of
    /// them).
    pub malformed: Vec<String>,
}

/// The resolved references of `object`, in field order.
pub fn read(object: &Value) -> Read {
    let mut out = Read::default();
    for part in ["forProvider", "initProvider"] {
        if let Some(Value::Object(map)) = object.pointer(&format!("/spec/{part}")) {
            walk(map, &format!("spec.{part}"), &mut out);
        }
    }
    out
}

/// Field endings (lower case) of references to a Secret or ConfigMap to
/// read, which a provider does not resolve.
const DATA_REFERENCES: [&str; 6] = [
    "secretref",
    "secretrefs",
    "secretkeyref",
    "configmapref",
    "configmaprefs",
    "configmapkeyref",
];

fn walk(map: &Map<String, Value>, at: &str, out: &mut Read) {
    for (key, value) in map {
        let field = format!("{at}.{key}");
        let lower = key.to_ascii_lowercase();
        let data = DATA_REFERENCES.iter().any(|suffix| lower.ends_with(suffix));
        if data {
            continue;
        }
        if key.ends_with("Refs") {
            match value {
                Value::Array(items) => {
                    for (n, item) in items.iter().enumerate() {
                        one(item, &format!("{field}[{n}]"), out);
                    }
                }
                Value::Null => {}
                _ => out.malformed.push(field),
            }
        } else if key.ends_with("Ref") {
            if !value.is_null() {
                one(value, &field, out);
            }
        } else if let Some(stem) = key.strip_suffix("Selector") {
            let beside = [format!("{stem}Ref"), format!("{stem}Refs")];
            let resolved = beside
                .iter()
                .any(|k| map.get(k).is_some_and(|v| !v.is_null()));
            if !value.is_null() && !resolved {
                out.unresolved_selectors.push(field);
            }
        } else {
            match value {
                Value::Object(inner) => walk(inner, &field, out),
                Value::Array(items) => {
                    for (n, item) in items.iter().enumerate() {
                        if let Value::Object(inner) = item {
                            walk(inner, &format!("{field}[{n}]"), out);
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

fn one(value: &Value, field: &str, out: &mut Read) {
    if !value.is_object() {
        out.malformed.push(field.to_string());
        return;
    }
    match value.get("name").and_then(Value::as_str) {
        Some(name) if !name.is_empty() => out.references.push(ResolvedReference {
            field: field.to_string(),
            name: name.to_string(),
            namespace: value
                .get("namespace")
                .and_then(Value::as_str)
                .filter(|ns| !ns.is_empty())
                .map(str::to_string),
        }),
        _ => {}
    }
}

/// The provider an API group belongs to, for matching a reference that names
/// no kind: the group without its first label (`aws.upbound.io` for
/// `ec2.aws.upbound.io` and `eks.aws.upbound.io`, `aws.m.upbound.io` for
/// their namespaced twins); None for a group of one or two labels.
pub fn provider_of(group: &str) -> Option<&str> {
    let (_, rest) = group.split_once('.')?;
    rest.contains('.').then_some(rest)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn r(field: &str, name: &str, namespace: Option<&str>) -> ResolvedReference {
        ResolvedReference {
            field: field.to_string(),
            name: name.to_string(),
            namespace: namespace.map(str::to_string),
        }
    }

    #[test]
    fn references_are_read_at_any_depth_and_selectors_without_one_are_named() {
        type Case = (&'static str, Value, Read);
        let cases: Vec<Case> = vec![
            (
                "a Subnet's vpcIdRef, its selector resolved beside it",
                json!({"spec": {"forProvider": {
                    "vpcId": "vpc-1", "vpcIdRef": {"name": "net"},
                    "vpcIdSelector": {"matchControllerRef": true},
                }}}),
                Read {
                    references: vec![r("spec.forProvider.vpcIdRef", "net", None)],
                    ..Read::default()
                },
            ),
            (
                "a list in a nested block, and initProvider with a namespace",
                json!({"spec": {
                    "forProvider": {"vpcConfig": [{"subnetIdRefs": [{"name": "a"}, {"name": "b"}]}]},
                    "initProvider": {"roleArnRef": {"name": "role", "namespace": "infra"}},
                }}),
                Read {
                    references: vec![
                        r("spec.forProvider.vpcConfig[0].subnetIdRefs[0]", "a", None),
                        r("spec.forProvider.vpcConfig[0].subnetIdRefs[1]", "b", None),
                        r("spec.initProvider.roleArnRef", "role", Some("infra")),
                    ],
                    ..Read::default()
                },
            ),
            (
                "a selector not resolved yet",
                json!({"spec": {"forProvider": {"clusterNameSelector": {"matchLabels": {"a": "b"}}}}}),
                Read {
                    unresolved_selectors: vec!["spec.forProvider.clusterNameSelector".to_string()],
                    ..Read::default()
                },
            ),
            (
                "a reference with no name or an empty one, a Refs that is not a list, a Ref that is a string",
                json!({"spec": {"forProvider": {
                    "aRef": {"policy": {}}, "bRefs": "x", "cRef": null, "dRef": "x",
                    "eRef": {"name": ""},
                }}}),
                Read {
                    malformed: vec![
                        "spec.forProvider.bRefs".to_string(),
                        "spec.forProvider.dRef".to_string(),
                    ],
                    ..Read::default()
                },
            ),
            (
                "Secret and ConfigMap references are data, not resolved references; a KMS key's is one",
                json!({"spec": {"forProvider": {
                    "chart": {"pullSecretRef": {"name": "", "namespace": ""}},
                    "passwordSecretRef": {"name": "pw", "key": "k"},
                    "valuesFrom": [{"configMapKeyRef": {"name": "v"}}, {"secretKeyRef": {"name": "s"}}],
                    "kmsKeyRef": {"name": "key"},
                    "caConfigMapRef": {"name": "ca"},
                }}}),
                Read {
                    references: vec![r("spec.forProvider.kmsKeyRef", "key", None)],
                    ..Read::default()
                },
            ),
            (
                "providerConfigRef and other spec fields are not read here",
                json!({"spec": {"providerConfigRef": {"name": "pc"}, "writeConnectionSecretToRef": {"name": "s"}}}),
                Read::default(),
            ),
        ];
        for (what, object, want) in cases {
            assert_eq!(read(&object), want, "{what}");
        }
    }

    #[test]
    fn a_provider_is_the_group_without_its_first_label() {
        assert_eq!(provider_of("ec2.aws.upbound.io"), Some("aws.upbound.io"));
        assert_eq!(
            provider_of("ec2.aws.m.upbound.io"),
            Some("aws.m.upbound.io")
        );
        assert_eq!(provider_of("modelplane.ai"), None);
        assert_eq!(provider_of(""), None);
    }
}
