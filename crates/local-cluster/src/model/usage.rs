//! Crossplane's Usage and ClusterUsage (`protection.crossplane.io/v1beta1`, the
//! real CRDs from the fixtures) and the controller that reconciles them
//! (internal/controller/protection/usage/reconciler.go):
//!
//! - a live Usage gets the finalizer `usage.apiextensions.crossplane.io`; its
//!   `of` resource gets the label `crossplane.io/in-use: "true"`, which makes the
//!   API server send that resource's DELETEs to the webhook ([`super::webhook`]);
//!   a Usage with a `by` gets a (non-controller) owner reference to it;
//! - a Usage being deleted that has a `by` and is composed (it carries
//!   `crossplane.io/composite`) keeps its finalizer while `by` exists, checking
//!   again later (every 30 s upstream); a reason-only Usage, or one whose `by`
//!   is gone, lets go at once: it removes the in-use label when no other Usage
//!   names the resource, and when `replayDeletion` is true and the resource
//!   carries a recorded deletion attempt, it deletes the resource again with
//!   the recorded policy, 2 s later, as Crossplane's service account, with no
//!   precondition;
//! - so a Usage blocks the deletion of `of` for as long as the Usage exists.
//!
//! Usages name their resources with `resourceRef`; resolving `resourceSelector`
//! (which upstream writes back as a `resourceRef`) is out of the model's scope,
//! and such Usages are ignored.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PropagationPolicy,
};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use super::composite::{COMPOSITE_LABEL, Node};
use super::webhook::DELETION_ATTEMPT_ANNOTATION;
use super::{Kinds, ModelError, ResourceRef, add_finalizer, remove_finalizer, text};

pub const GROUP: &str = "protection.crossplane.io";
pub const API_VERSION: &str = "protection.crossplane.io/v1beta1";
pub const FINALIZER: &str = "usage.apiextensions.crossplane.io";
pub const IN_USE_LABEL: &str = "crossplane.io/in-use";

pub fn usages() -> ApiResource {
    resource("Usage", "usages")
}

pub fn cluster_usages() -> ApiResource {
    resource("ClusterUsage", "clusterusages")
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: "v1beta1".into(),
        api_version: API_VERSION.into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// What a Usage says, as a builder takes it.
#[derive(Clone, Debug)]
pub struct Spec {
    /// The used resource (`of`); its namespace defaults to the Usage's.
    pub of: ResourceRef,
    /// The using resource (`by`), in the Usage's namespace or cluster-scoped.
    pub by: Option<ResourceRef>,
    pub reason: Option<String>,
    pub replay_deletion: bool,
}

impl Spec {
    fn body(&self) -> Value {
        let mut of_ref = json!({"name": self.of.name});
        if let Some(ns) = &self.of.namespace {
            of_ref["namespace"] = json!(ns);
        }
        let mut spec = json!({
            "of": {"apiVersion": self.of.api_version, "kind": self.of.kind, "resourceRef": of_ref},
            "replayDeletion": self.replay_deletion,
        });
        if let Some(by) = &self.by {
            spec["by"] = json!({"apiVersion": by.api_version, "kind": by.kind,
                "resourceRef": {"name": by.name}});
        }
        if let Some(reason) = &self.reason {
            spec["reason"] = json!(reason);
        }
        json!({ "spec": spec })
    }
}

/// A namespaced Usage, as a node of a composed tree.
pub fn usage(namespace: &str, name: &str, spec: &Spec) -> Node {
    Node::new(usages(), Some(namespace), name, spec.body())
}

/// A ClusterUsage, as a node of a composed tree.
pub fn cluster_usage(name: &str, spec: &Spec) -> Node {
    let mut spec = spec.clone();
    // A ClusterUsage's `of` is cluster-scoped (its resourceRef has no namespace).
    spec.of.namespace = None;
    Node::new(cluster_usages(), None, name, spec.body())
}

/// One Usage or ClusterUsage that names a resource.
#[derive(Clone, Debug)]
pub struct Found {
    pub cluster: bool,
    pub name: String,
    pub namespace: Option<String>,
    /// `by`: kind and name.
    pub by: Option<(String, String)>,
    pub reason: Option<String>,
}

fn group_of(api_version: &str) -> &str {
    api_version
        .split_once('/')
        .map(|(g, _)| g)
        .unwrap_or_default()
}

/// Every Usage and ClusterUsage whose `of` names this resource, being deleted
/// or not, matched as upstream's index does: API group (not version), kind,
/// name, and namespace (a Usage's `of` defaults to its own namespace; a
/// ClusterUsage's is cluster-scoped) (internal/protection/usage/finder.go).
pub async fn find_usages_of(
    client: &Client,
    api_version: &str,
    kind: &str,
    name: &str,
    namespace: &str,
) -> Result<Vec<Found>, kube::Error> {
    let group = group_of(api_version);
    let mut found = Vec::new();
    for (cluster, resource) in [(false, usages()), (true, cluster_usages())] {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        for u in api.list(&ListParams::default()).await?.items {
            let own_ns = u.metadata.namespace.clone().unwrap_or_default();
            let of = &u.data["spec"]["of"];
            let Some(of_name) = text(of, "/resourceRef/name") else {
                continue;
            };
            let of_ns = if cluster {
                String::new()
            } else {
                text(of, "/resourceRef/namespace")
                    .map(str::to_string)
                    .unwrap_or(own_ns)
            };
            if group_of(text(of, "/apiVersion").unwrap_or_default()) == group
                && text(of, "/kind") == Some(kind)
                && of_name == name
                && of_ns == namespace
            {
                let by = &u.data["spec"]["by"];
                found.push(Found {
                    cluster,
                    name: u.name_any(),
                    namespace: u.metadata.namespace.clone(),
                    by: text(by, "/kind")
                        .zip(text(by, "/resourceRef/name"))
                        .map(|(k, n)| (k.to_string(), n.to_string())),
                    reason: text(&u.data, "/spec/reason").map(str::to_string),
                });
            }
        }
    }
    Ok(found)
}

/// The webhook's refusal message (handler.go, `inUseMessage`), with the Go
/// type names it prints.
pub fn in_use_message(first: &Found, count: usize) -> String {
    let ty = if first.cluster {
        "*v1beta1.ClusterUsage"
    } else {
        "*v1beta1.Usage"
    };
    let id = match &first.namespace {
        Some(ns) => format!("{:?} (in namespace {ns:?})", first.name),
        None => format!("{:?}", first.name),
    };
    if let Some((kind, name)) = &first.by {
        return format!(
            "This resource is in-use by {count} usage(s), including the {ty} {id} by resource {kind}/{name}."
        );
    }
    if let Some(reason) = first.reason.as_deref().filter(|r| !r.is_empty()) {
        return format!(
            "This resource is in-use by {count} usage(s), including the {ty} {id} with reason: {reason:?}."
        );
    }
    format!("This resource is in-use by {count} usage(s), including the {ty} {id}.")
}

/// The Usage controller.
pub struct Controller {
    /// As Crossplane's service account.
    pub client: Client,
    pub kinds: Kinds,
    pub poll: Duration,
    pub replay_delay: Duration,
}

impl Controller {
    pub async fn run(self) {
        // Usages whose replay is scheduled: a replay is issued once, as
        // upstream issues it once, from the reconcile that releases the Usage.
        let replayed: Arc<Mutex<HashSet<String>>> = Arc::default();
        loop {
            for (cluster, resource) in [(false, usages()), (true, cluster_usages())] {
                let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource);
                let list = match api.list(&ListParams::default()).await {
                    Ok(l) => l.items,
                    Err(e) => {
                        tracing::debug!("list {}: {e}", resource.plural);
                        continue;
                    }
                };
                for u in list {
                    if let Err(e) = self.reconcile(cluster, &resource, &u, &replayed).await {
                        tracing::debug!("usage {}: {e}", u.name_any());
                    }
                }
            }
            tokio::time::sleep(self.poll).await;
        }
    }

    async fn reconcile(
        &self,
        cluster: bool,
        resource: &ApiResource,
        u: &DynamicObject,
        replayed: &Arc<Mutex<HashSet<String>>>,
    ) -> Result<(), ModelError> {
        let name = u.name_any();
        let own_ns = u.metadata.namespace.clone();
        let api: Api<DynamicObject> = match &own_ns {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, resource),
            None => Api::all_with(self.client.clone(), resource),
        };
        let spec = &u.data["spec"];
        let Some(of) = reference(&spec["of"], if cluster { None } else { own_ns.clone() }) else {
            // A selector that nothing resolved: out of the model's scope.
            return Ok(());
        };
        let by = reference(&spec["by"], own_ns.clone());
        let of_api = self.kinds.api_for(&of, own_ns.as_deref()).await?;

        if u.metadata.deletion_timestamp.is_some() {
            let composed = u
                .labels()
                .get(COMPOSITE_LABEL)
                .is_some_and(|v| !v.is_empty());
            if let (Some(by), true) = (&by, composed) {
                let by_api = self.kinds.api_for(by, own_ns.as_deref()).await?;
                if by_api.get_opt(&by.name).await?.is_some() {
                    // The using resource is still there: wait for it.
                    return Ok(());
                }
            }
            if let Some(used) = of_api.get_opt(&of.name).await? {
                let ns = used.metadata.namespace.clone().unwrap_or_default();
                let others =
                    find_usages_of(&self.client, &of.api_version, &of.kind, &of.name, &ns).await?;
                if others.len() < 2 && used.labels().contains_key(IN_USE_LABEL) {
                    let patch = json!({"metadata": {"labels": {IN_USE_LABEL: null}}});
                    of_api
                        .patch(&of.name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await?;
                }
                let policy = used.annotations().get(DELETION_ATTEMPT_ANNOTATION).cloned();
                let replay = spec["replayDeletion"].as_bool().unwrap_or(false);
                let uid = u.uid().unwrap_or_default();
                let first = replayed.lock().map(|mut r| r.insert(uid)).unwrap_or(false);
                if let (true, Some(policy), true) = (replay, policy, first) {
                    let delay = self.replay_delay;
                    let target = of.describe();
                    tokio::spawn(async move {
                        // After the Usage is gone (its finalizer goes below).
                        tokio::time::sleep(delay).await;
                        let params = DeleteParams {
                            propagation_policy: Some(match policy.as_str() {
                                "Foreground" => PropagationPolicy::Foreground,
                                "Orphan" => PropagationPolicy::Orphan,
                                _ => PropagationPolicy::Background,
                            }),
                            ..DeleteParams::default()
                        };
                        match of_api.delete(&of.name, &params).await {
                            Ok(_) => tracing::info!("replayed the deletion of {target} ({policy})"),
                            Err(e) => tracing::info!(
                                "error replaying the deletion of {target} ({policy}): {e}"
                            ),
                        }
                    });
                }
            }
            remove_finalizer(&api, &name, FINALIZER).await?;
            return Ok(());
        }

        add_finalizer(&api, &name, FINALIZER).await?;
        let Some(used) = of_api.get_opt(&of.name).await? else {
            return Ok(());
        };
        if used.labels().get(IN_USE_LABEL).map(String::as_str) != Some("true") {
            let patch = json!({"metadata": {"labels": {IN_USE_LABEL: "true"}}});
            of_api
                .patch(&of.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        if let Some(by) = by {
            let by_api = self.kinds.api_for(&by, own_ns.as_deref()).await?;
            let Some(using) = by_api.get_opt(&by.name).await? else {
                return Ok(());
            };
            let uid = using.uid().unwrap_or_default();
            let owners = u.metadata.owner_references.clone().unwrap_or_default();
            if !owners.iter().any(|o| o.uid == uid) {
                // crossplane-runtime meta.AsOwner: neither controller nor blocking.
                let mut owners = owners;
                owners.push(OwnerReference {
                    api_version: by.api_version.clone(),
                    kind: by.kind.clone(),
                    name: by.name.clone(),
                    uid,
                    ..OwnerReference::default()
                });
                let patch = json!({"metadata": {
                    "ownerReferences": owners,
                    "resourceVersion": u.metadata.resource_version,
                }});
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
        }
        Ok(())
    }
}

/// `of` or `by` as a reference, when it names its resource; a missing
/// namespace is `default_namespace`.
fn reference(v: &Value, default_namespace: Option<String>) -> Option<ResourceRef> {
    Some(ResourceRef {
        api_version: text(v, "/apiVersion")?.to_string(),
        kind: text(v, "/kind")?.to_string(),
        namespace: text(v, "/resourceRef/namespace")
            .map(str::to_string)
            .or(default_namespace),
        name: text(v, "/resourceRef/name")?.to_string(),
    })
}
