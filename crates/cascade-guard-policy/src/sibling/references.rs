//! What an object references, as a reader of the cluster must fetch it.

use serde::Serialize;
use serde_json::Value;

use super::needs_annotation::{NEEDS_ANNOTATION, NeedsEntry, parse_needs};
use super::object::{ObjectRef, group_of, str_at};

/// An object that another one names, as a reader of the cluster must fetch
/// it for [`graph`](super::graph::graph) to follow the reference. A providerConfigRef names no API
/// group: `group` is None, any group serving `kind` may hold it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reference {
    pub group: Option<String>,
    pub kind: String,
    /// The namespace to look in when `kind` is namespaced (the referrer's own
    /// unless the reference names one); ignored for a cluster-scoped kind.
    pub namespace: Option<String>,
    pub name: String,
}

/// What `object` names that [`graph`](super::graph::graph) would follow, other than its owners
/// and the resources it composes: its ProviderConfig, a ProviderConfig's
/// credentials Secret, the Secret it writes its connection details to, a
/// provider-kubernetes Object's references, and the objects its
/// [`NEEDS_ANNOTATION`] names (composition resource names are its siblings,
/// already in the tree). Malformed references are left out here; [`graph`](super::graph::graph)
/// reports them.
pub fn references(object: &Value) -> Vec<Reference> {
    let Some(own) = ObjectRef::of_object(object) else {
        return Vec::new();
    };
    let own_ns = own.namespace.as_deref();
    let mut out = Vec::new();
    let mut push = |group: Option<&str>, kind: &str, namespace: Option<&str>, name: &str| {
        out.push(Reference {
            group: group.map(str::to_string),
            kind: kind.to_string(),
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
        });
    };
    if let Some(r) = object.pointer("/spec/providerConfigRef")
        && let Some(name) = str_at(r, "/name")
    {
        let kind = str_at(r, "/kind").unwrap_or("ProviderConfig");
        let namespace = (kind != "ClusterProviderConfig")
            .then_some(own_ns)
            .flatten();
        push(None, kind, namespace, name);
    }
    let mut secret = |pointer: &str| {
        if let Some(r) = object.pointer(pointer)
            && let Some(name) = str_at(r, "/name")
        {
            let namespace = str_at(r, "/namespace").or(own_ns);
            push(Some(""), "Secret", namespace, name);
        }
    };
    if matches!(
        own.kind.as_str(),
        "ProviderConfig" | "ClusterProviderConfig"
    ) {
        secret("/spec/credentials/secretRef");
    }
    secret("/spec/writeConnectionSecretToRef");
    let kubernetes_object = own.kind == "Object"
        && matches!(
            own.group.as_str(),
            "kubernetes.crossplane.io" | "kubernetes.m.crossplane.io"
        );
    if kubernetes_object {
        let entries = object.pointer("/spec/references").and_then(Value::as_array);
        for entry in entries.into_iter().flatten() {
            for target in ["dependsOn", "patchesFrom"].map(|f| entry.get(f)) {
                if let Some(t) = target
                    && let (Some(api_version), Some(kind), Some(name)) = (
                        str_at(t, "/apiVersion"),
                        str_at(t, "/kind"),
                        str_at(t, "/name"),
                    )
                {
                    let namespace = str_at(t, "/namespace").or(own_ns);
                    push(Some(group_of(api_version)), kind, namespace, name);
                }
            }
        }
    }
    // A Usage's two sides: the one outside the tree is read so that the
    // Usage resolves (the user of a standalone Usage is held for, the used
    // object it protects).
    let usage = matches!(own.kind.as_str(), "Usage" | "ClusterUsage")
        && matches!(
            own.group.as_str(),
            "protection.crossplane.io" | "apiextensions.crossplane.io"
        );
    if usage {
        let default = (own.kind == "Usage").then_some(own_ns).flatten();
        for side in ["/spec/of", "/spec/by"] {
            if let Some(s) = object.pointer(side)
                && let (Some(api_version), Some(kind), Some(name)) = (
                    str_at(s, "/apiVersion"),
                    str_at(s, "/kind"),
                    str_at(s, "/resourceRef/name"),
                )
            {
                let namespace = str_at(s, "/resourceRef/namespace").or(default);
                push(Some(group_of(api_version)), kind, namespace, name);
            }
        }
    }
    let annotation = object
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(NEEDS_ANNOTATION))
        .and_then(Value::as_str);
    for entry in annotation.map(parse_needs).into_iter().flatten().flatten() {
        if let NeedsEntry::Object {
            group,
            kind,
            namespace,
            name,
        } = entry
        {
            push(Some(&group), &kind, namespace.as_deref().or(own_ns), &name);
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::sibling::test_objects::*;

    #[test]
    fn references_name_what_a_reader_must_fetch() {
        let r = |group: Option<&str>, kind: &str, ns: Option<&str>, name: &str| Reference {
            group: group.map(str::to_string),
            kind: kind.to_string(),
            namespace: ns.map(str::to_string),
            name: name.to_string(),
        };
        let mut release = obj(
            "helm.m.crossplane.io/v1beta1",
            "Release",
            Some("apps"),
            "web",
        );
        release["spec"] = json!({"providerConfigRef": {"name": "helm"}});
        let mut cluster_pc = obj("helm.crossplane.io/v1beta1", "Release", None, "legacy");
        cluster_pc["spec"] =
            json!({"providerConfigRef": {"name": "all", "kind": "ClusterProviderConfig"}});
        let mut pc = obj(
            "helm.m.crossplane.io/v1beta1",
            "ProviderConfig",
            Some("apps"),
            "helm",
        );
        pc["spec"] = json!({"credentials": {"secretRef": {"name": "kubeconfig", "key": "k"}}});
        let mut writer = obj("cloud.example.org/v1", "Cluster", Some("apps"), "prod");
        writer["spec"] =
            json!({"writeConnectionSecretToRef": {"name": "conn", "namespace": "sys"}});
        let mut object = obj(
            "kubernetes.m.crossplane.io/v1alpha1",
            "Object",
            Some("apps"),
            "o",
        );
        object["spec"] = json!({"references": [
            {"dependsOn": {"apiVersion": "v1", "kind": "Namespace", "name": "team"},
             "patchesFrom": {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "namespace": "x"}},
            {"dependsOn": {"kind": "Broken"}},
        ]});
        let mut annotated = obj("example.org/v1", "Thing", Some("apps"), "t");
        annotated["metadata"]["annotations"] = json!({NEEDS_ANNOTATION:
            "sibling, Database.db.example.org/main, Secret/other/creds, not valid"});
        let mut usage = obj(
            "protection.crossplane.io/v1beta1",
            "Usage",
            Some("apps"),
            "u",
        );
        usage["spec"] = json!({
            "of": {"apiVersion": "infra.example.org/v1", "kind": "Hub", "resourceRef": {"name": "hub"}},
            "by": {"apiVersion": "infra.example.org/v1", "kind": "Wheel", "resourceRef": {"name": "wheel", "namespace": "other"}},
        });
        let mut cluster_usage = obj(
            "protection.crossplane.io/v1beta1",
            "ClusterUsage",
            None,
            "cu",
        );
        cluster_usage["spec"] = json!({
            "of": {"apiVersion": "example.org/v1", "kind": "Hub", "resourceRef": {"name": "hub"}},
            "by": {"apiVersion": "example.org/v1", "kind": "Wheel", "resourceSelector": {"matchLabels": {"a": "b"}}},
        });
        let cases: Vec<(&str, &Value, Vec<Reference>)> = vec![
            (
                "a Usage's two sides, in its namespace unless they name one",
                &usage,
                vec![
                    r(Some("infra.example.org"), "Hub", Some("apps"), "hub"),
                    r(Some("infra.example.org"), "Wheel", Some("other"), "wheel"),
                ],
            ),
            (
                "a ClusterUsage's sides are cluster-scoped; a selector is not followed",
                &cluster_usage,
                vec![r(Some("example.org"), "Hub", None, "hub")],
            ),
            (
                "providerConfigRef in the object's namespace",
                &release,
                vec![r(None, "ProviderConfig", Some("apps"), "helm")],
            ),
            (
                "ClusterProviderConfig has no namespace",
                &cluster_pc,
                vec![r(None, "ClusterProviderConfig", None, "all")],
            ),
            (
                "a ProviderConfig's credentials",
                &pc,
                vec![r(Some(""), "Secret", Some("apps"), "kubeconfig")],
            ),
            (
                "the connection Secret it writes",
                &writer,
                vec![r(Some(""), "Secret", Some("sys"), "conn")],
            ),
            (
                "an Object's dependsOn and patchesFrom, the broken one left out",
                &object,
                vec![
                    r(Some(""), "ConfigMap", Some("x"), "cm"),
                    r(Some(""), "Namespace", Some("apps"), "team"),
                ],
            ),
            (
                "the annotation's objects, not its siblings or malformed entries",
                &annotated,
                vec![
                    r(Some("db.example.org"), "Database", Some("apps"), "main"),
                    r(Some(""), "Secret", Some("other"), "creds"),
                ],
            ),
        ];
        for (what, object, want) in cases {
            let mut want = want;
            want.sort();
            assert_eq!(references(object), want, "{what}");
        }
        assert!(references(&json!({"kind": "NoName"})).is_empty());
    }
}
