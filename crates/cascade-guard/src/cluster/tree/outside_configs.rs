//! ProviderConfigs made outside a tree on one of its Secrets (a person's
//! ProviderConfig on a cloud cluster's kubeconfig, or another tree's): the
//! managed resources that use one need what writes that Secret, though
//! nothing in the tree names them. Found among every ProviderConfig listed,
//! by the Secret their credentials name.

use std::collections::HashSet;

use kube::api::DynamicObject;

use super::{ListedKind, is_forbidden, serde_value};
use crate::policy::sibling::object::ObjectRef;
use crate::policy::sibling::references::references;

/// What the ProviderConfigs listed say of a tree.
#[derive(Debug, Default)]
pub(super) struct Found<'a> {
    /// Those whose credentials are a Secret read, not read themselves.
    pub configs: Vec<&'a DynamicObject>,
    /// Kinds that could not be listed (not a refusal): not read.
    pub unread: Vec<String>,
    /// Kinds the reader may not list (403).
    pub unlisted: Vec<String>,
}

/// The ProviderConfigs of `listed` made on a Secret among `read`; nothing
/// when no Secret was read.
pub(super) fn on_secrets<'a>(
    listed: &'a [(String, ListedKind)],
    read: &HashSet<ObjectRef>,
) -> Found<'a> {
    let mut found = Found::default();
    if !read
        .iter()
        .any(|r| r.kind == "Secret" && r.group.is_empty())
    {
        return found;
    }
    for (kind, list) in listed {
        let list = match list {
            Ok(list) => list,
            Err(e) if is_forbidden(e) => {
                found.unlisted.push(format!("{kind}s: {e}"));
                continue;
            }
            Err(e) => {
                found.unread.push(format!("{kind}s: {e}"));
                continue;
            }
        };
        for config in list {
            let value = serde_value(config);
            if ObjectRef::of_object(&value).is_some_and(|r| read.contains(&r)) {
                continue;
            }
            let on_a_secret_read = references(&value).iter().any(|r| {
                r.kind == "Secret"
                    && r.group.as_deref().unwrap_or("").is_empty()
                    && read.contains(&ObjectRef::new(
                        "",
                        "Secret",
                        r.namespace.as_deref(),
                        &r.name,
                    ))
            });
            if on_a_secret_read {
                found.configs.push(config);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn config(
        api_version: &str,
        namespace: Option<&str>,
        name: &str,
        secret: Value,
    ) -> DynamicObject {
        let mut metadata = json!({"name": name});
        if let Some(ns) = namespace {
            metadata["namespace"] = json!(ns);
        }
        serde_json::from_value(json!({
            "apiVersion": api_version,
            "kind": "ProviderConfig",
            "metadata": metadata,
            "spec": {"credentials": {"source": "Secret", "secretRef": secret}},
        }))
        .expect("a ProviderConfig")
    }

    fn failed(code: u16) -> ListedKind {
        Err(kube::Error::Api(Box::new(
            kube::core::Status::failure(
                "as said",
                if code == 403 {
                    "Forbidden"
                } else {
                    "InternalError"
                },
            )
            .with_code(code),
        )))
    }

    fn secret(namespace: &str, name: &str) -> ObjectRef {
        ObjectRef::new("", "Secret", Some(namespace), name)
    }

    /// Which listed ProviderConfigs a tree takes in: those on one of its
    /// Secrets (named with a namespace, or in the config's own), not those
    /// on another Secret or read already; a refused list said apart from a
    /// failed one; nothing at all without a Secret read.
    #[test]
    fn the_provider_configs_made_on_a_secret_of_the_tree_are_found() {
        let kubeconfig =
            json!({"name": "hub-kubeconfig", "namespace": "system", "key": "kubeconfig"});
        let listed: Vec<(String, ListedKind)> = vec![
            (
                "ProviderConfig".into(),
                Ok(vec![
                    config(
                        "kubernetes.m.crossplane.io/v1alpha1",
                        Some("system"),
                        "by-hand",
                        kubeconfig.clone(),
                    ),
                    config(
                        "kubernetes.m.crossplane.io/v1alpha1",
                        Some("system"),
                        "own-namespace",
                        json!({"name": "hub-kubeconfig", "key": "k"}),
                    ),
                    config(
                        "kubernetes.m.crossplane.io/v1alpha1",
                        Some("team"),
                        "other-namespace",
                        json!({"name": "hub-kubeconfig", "key": "k"}),
                    ),
                    config(
                        "kubernetes.m.crossplane.io/v1alpha1",
                        Some("system"),
                        "other-secret",
                        json!({"name": "other", "namespace": "system", "key": "k"}),
                    ),
                    config(
                        "kubernetes.m.crossplane.io/v1alpha1",
                        Some("system"),
                        "in-the-tree",
                        kubeconfig.clone(),
                    ),
                ]),
            ),
            ("ClusterProviderConfig".into(), failed(403)),
            ("ProviderConfig".into(), failed(500)),
        ];
        let mut read = HashSet::from([
            secret("system", "hub-kubeconfig"),
            ObjectRef::new(
                "kubernetes.m.crossplane.io",
                "ProviderConfig",
                Some("system"),
                "in-the-tree",
            ),
        ]);
        let found = on_secrets(&listed, &read);
        let names: Vec<&str> = found
            .configs
            .iter()
            .filter_map(|c| c.metadata.name.as_deref())
            .collect();
        assert_eq!(names, ["by-hand", "own-namespace"]);
        assert_eq!(found.unlisted.len(), 1, "{:?}", found.unlisted);
        assert!(found.unlisted[0].starts_with("ClusterProviderConfigs: "));
        assert_eq!(found.unread.len(), 1, "{:?}", found.unread);
        assert!(found.unread[0].starts_with("ProviderConfigs: "));
        // No Secret read: no ProviderConfig can be on one, and no list counts.
        read.retain(|r| r.kind != "Secret");
        let none = on_secrets(&listed, &read);
        assert!(none.configs.is_empty() && none.unread.is_empty() && none.unlisted.is_empty());
    }
}
