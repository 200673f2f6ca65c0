//! The ProviderConfigUsage a provider keeps for each namespaced managed
//! resource of a tree (pure), which sibling order holds until the provider
//! is done with that managed resource.
//!
//! A Crossplane provider (crossplane-runtime v2) records each managed
//! resource's use of its ProviderConfig in a ProviderConfigUsage: in the
//! ProviderConfig's API group, in the managed resource's namespace, named by
//! the managed resource's uid, and owned by it (controller, blocking). Every
//! reconcile, the one that deletes the external resource included, writes
//! it again first, and fails while it cannot.
//!
//! In a namespace being deleted that write fails for good once the
//! ProviderConfigUsage is gone: the namespace controller deletes it with
//! everything else (and the garbage collector does, in a foreground cascade
//! of the managed resource), and the API server refuses to create anything
//! in a terminating namespace. The managed resource then keeps its finalizer
//! for ever, its external resource leaks, and the namespace never goes
//! (crossplane-runtime#1150; the pinned providers have no fix). Updating a
//! ProviderConfigUsage that still exists is allowed there, so keeping it
//! until the provider has taken its finalizer off is enough, with one more
//! step in a foreground cascade of the managed resource: the provider
//! deletes the external resource only once every other finalizer is gone
//! (crossplane-runtime's managed reconciler), `foregroundDeletion`
//! included, which the garbage collector removes only once no dependent
//! blocks it, and the usage does (its owner reference). So the usage is
//! made to stop blocking ([`TrackedUsage::unblock`]): the garbage collector
//! lets the managed resource go on, the provider deletes, and then the
//! usage goes.

use std::collections::BTreeMap;

use crate::sibling::edge::Provenance;
use crate::sibling::graph::Graph;
use crate::sibling::object::ObjectRef;

/// The kind, in every provider's group.
pub const KIND: &str = "ProviderConfigUsage";

/// One managed resource of the tree and its ProviderConfigUsage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrackedUsage {
    pub managed: ObjectRef,
    pub usage: ObjectRef,
    /// The managed resource's uid (the usage's name, and its owner's uid).
    pub managed_uid: String,
    /// The provider still needs it: the managed resource is live, or being
    /// deleted with a finalizer of its provider's still on it.
    pub needed: bool,
    /// Needed, and the managed resource waits in a foreground cascade for
    /// its dependents: the usage's owner reference must stop blocking it.
    pub unblock: bool,
}

/// The ProviderConfigUsage of each namespaced managed resource in the tree:
/// an object with a uid whose `spec.providerConfigRef` names a
/// ProviderConfig (or ClusterProviderConfig) among the objects, which says
/// the provider's group. A cluster-scoped managed resource is left out: its
/// usage is cluster-scoped too, and no namespace deletion reaches it.
pub fn tracked_usages(graph: &Graph) -> Vec<TrackedUsage> {
    let mut out: BTreeMap<ObjectRef, TrackedUsage> = BTreeMap::new();
    for edge in graph
        .edges
        .iter()
        .filter(|e| e.provenance == Provenance::ProviderConfigRef)
    {
        let Some(node) = graph.node(&edge.object).filter(|n| n.in_tree) else {
            continue;
        };
        let (Some(namespace), Some(uid)) = (&node.object.namespace, &node.uid) else {
            continue;
        };
        let usage = ObjectRef::new(&edge.needs.group, KIND, Some(namespace), uid);
        let needed = !node.deleting || node.finalizing;
        out.entry(usage.clone()).or_insert_with(|| TrackedUsage {
            managed: node.object.clone(),
            usage,
            managed_uid: uid.clone(),
            needed,
            unblock: needed && node.deleting && node.waiting_for_dependents,
        });
    }
    out.into_values().collect()
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::sibling::graph::graph;

    fn xr() -> Value {
        json!({
            "apiVersion": "example.org/v1", "kind": "XR",
            "metadata": {"name": "root", "namespace": "ns", "uid": "root"},
        })
    }

    fn owned(mut object: Value) -> Value {
        object["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "example.org/v1", "kind": "XR", "name": "root", "uid": "root",
            "controller": true, "blockOwnerDeletion": true,
        }]);
        object
    }

    fn provider_config(group: &str, kind: &str, namespace: Option<&str>) -> Value {
        let mut metadata = json!({"name": "pc", "uid": format!("pc-{group}")});
        if let Some(ns) = namespace {
            metadata["namespace"] = json!(ns);
        }
        owned(json!({"apiVersion": format!("{group}/v1beta1"), "kind": kind, "metadata": metadata}))
    }

    /// A Release of helm.m.crossplane.io using ProviderConfig `pc`.
    fn release(namespace: Option<&str>, finalizers: &[&str], deleting: bool) -> Value {
        let mut metadata = json!({"name": "app", "uid": "uid-app", "finalizers": finalizers});
        if let Some(ns) = namespace {
            metadata["namespace"] = json!(ns);
        }
        if deleting {
            metadata["deletionTimestamp"] = json!("2026-12-05T00:00:00Z");
        }
        owned(json!({
            "apiVersion": "helm.m.crossplane.io/v1beta1", "kind": "Release",
            "metadata": metadata,
            "spec": {"providerConfigRef": {"name": "pc", "kind": "ProviderConfig"}},
        }))
    }

    #[test]
    fn a_namespaced_managed_resource_has_its_usage_needed_until_its_provider_is_done() {
        let managed = ObjectRef::new("helm.m.crossplane.io", "Release", Some("ns"), "app");
        let usage = ObjectRef::new("helm.m.crossplane.io", KIND, Some("ns"), "uid-app");
        let tracked = |needed, unblock| {
            vec![TrackedUsage {
                managed: managed.clone(),
                usage: usage.clone(),
                managed_uid: "uid-app".to_string(),
                needed,
                unblock,
            }]
        };
        let pc = || provider_config("helm.m.crossplane.io", "ProviderConfig", Some("ns"));
        let finalizer = "finalizer.managedresource.crossplane.io";
        type Case = (&'static str, Vec<Value>, Vec<TrackedUsage>);
        let cases: Vec<Case> = vec![
            (
                "live",
                vec![xr(), pc(), release(Some("ns"), &[finalizer], false)],
                tracked(true, false),
            ),
            (
                "deleting in the background, the provider's finalizer on",
                vec![xr(), pc(), release(Some("ns"), &[finalizer], true)],
                tracked(true, false),
            ),
            (
                "deleting in a foreground cascade, the provider's finalizer on: unblock",
                vec![
                    xr(),
                    pc(),
                    release(Some("ns"), &["foregroundDeletion", finalizer], true),
                ],
                tracked(true, true),
            ),
            (
                "deleting, only the garbage collector's finalizer left",
                vec![
                    xr(),
                    pc(),
                    release(Some("ns"), &["foregroundDeletion"], true),
                ],
                tracked(false, false),
            ),
            (
                "its ProviderConfig not among the objects: no group to tell",
                vec![xr(), release(Some("ns"), &[finalizer], false)],
                vec![],
            ),
        ];
        for (what, objects, want) in cases {
            let g = graph(&objects, "root").expect("root");
            assert_eq!(tracked_usages(&g), want, "{what}");
        }
    }

    #[test]
    fn a_cluster_provider_config_gives_its_group_and_the_usage_stays_in_the_namespace() {
        let objects = vec![
            xr(),
            provider_config("kubernetes.m.crossplane.io", "ClusterProviderConfig", None),
            owned(json!({
                "apiVersion": "kubernetes.m.crossplane.io/v1alpha1", "kind": "Object",
                "metadata": {"name": "obj", "namespace": "ns", "uid": "uid-obj"},
                "spec": {"providerConfigRef": {"name": "pc", "kind": "ClusterProviderConfig"}},
            })),
        ];
        let g = graph(&objects, "root").expect("root");
        let usages: Vec<ObjectRef> = tracked_usages(&g).into_iter().map(|t| t.usage).collect();
        assert_eq!(
            usages,
            vec![ObjectRef::new(
                "kubernetes.m.crossplane.io",
                KIND,
                Some("ns"),
                "uid-obj"
            )]
        );
    }

    #[test]
    fn cluster_scoped_and_outside_managed_resources_have_none() {
        // A legacy, cluster-scoped managed resource and its ProviderConfig.
        let legacy = vec![
            json!({"apiVersion": "example.org/v1", "kind": "XR", "metadata": {"name": "root", "uid": "root"}}),
            provider_config("helm.crossplane.io", "ProviderConfig", None),
            owned(json!({
                "apiVersion": "helm.crossplane.io/v1beta1", "kind": "Release",
                "metadata": {"name": "app", "uid": "uid-app"},
                "spec": {"providerConfigRef": {"name": "pc"}},
            })),
        ];
        let g = graph(&legacy, "root").expect("root");
        assert_eq!(tracked_usages(&g), vec![]);
        // A managed resource only referenced, not in the tree.
        let mut outside = release(Some("ns"), &[], false);
        outside["metadata"]["ownerReferences"] = json!([]);
        let pc = provider_config("helm.m.crossplane.io", "ProviderConfig", Some("ns"));
        let g = graph(&[xr(), pc, outside], "root").expect("root");
        assert!(
            !g.edges.is_empty(),
            "the edge to its ProviderConfig is read"
        );
        assert_eq!(tracked_usages(&g), vec![]);
    }
}
