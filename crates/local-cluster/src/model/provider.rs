//! Managed resources and the providers that reconcile them, as far as deletion
//! goes (docs/deletion-semantics.md §6):
//!
//! - every managed resource carries crossplane-runtime's finalizer
//!   `finalizer.managedresource.crossplane.io`, added by its provider on the
//!   first reconcile (pkg/reconciler/managed/reconciler.go);
//! - once deleted, the provider deletes the external resource and then removes
//!   its finalizer; that takes a while (uninstalling a Helm release, deleting
//!   objects on a cluster, deleting a cloud cluster). It holds the external
//!   delete back while the object has any other finalizer, `foregroundDeletion`
//!   included;
//! - provider-helm's Releases and provider-kubernetes' Objects act on a target
//!   cluster: every reconcile, deletion included, first builds a client from the
//!   ProviderConfig's kubeconfig, and when that fails it requeues forever and
//!   the finalizer stays (crossplane-contrib/provider-kubernetes
//!   internal/controller/namespaced/object/object.go; provider-helm likewise).
//!   The model's target is the object that stands for the cluster (a cloud
//!   cluster managed resource): the provider can reach the cluster exactly while
//!   that object exists, and if it is gone before the delete finishes, the
//!   managed resource wedges.
//!
//! The model does not go through ProviderConfigs: upstream they cannot be
//! deleted while managed resources use them (`in-use.crossplane.io`), so the
//! cluster, not its ProviderConfig, is what goes missing. How long a delete
//! takes and which cluster it needs are written on the object itself, under
//! `spec.model` (read by the model only): `deleteAfterMillis` and `target`.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use super::composite::Node;
use super::{Kinds, ResourceRef, add_finalizer, remove_finalizer};

pub const MANAGED_FINALIZER: &str = "finalizer.managedresource.crossplane.io";

/// One managed-resource kind and the provider that reconciles it.
#[derive(Clone, Debug)]
pub struct ProviderKind {
    pub resource: ApiResource,
    /// The provider's service account. Upstream it is named after the
    /// ProviderRevision, with a hash; the model's are fixed.
    pub user: String,
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: format!("{group}/{version}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

impl ProviderKind {
    /// provider-helm's namespaced Release (`helm.m.crossplane.io/v1beta1`).
    pub fn helm_release() -> Self {
        Self {
            resource: resource(
                "helm.model.cascade-guard.dev",
                "v1beta1",
                "Release",
                "releases",
            ),
            user: "system:serviceaccount:crossplane-system:provider-helm-model".into(),
        }
    }

    /// provider-kubernetes' namespaced Object (`kubernetes.m.crossplane.io/v1alpha1`).
    pub fn kubernetes_object() -> Self {
        Self {
            resource: resource(
                "kubernetes.model.cascade-guard.dev",
                "v1alpha1",
                "Object",
                "objects",
            ),
            user: "system:serviceaccount:crossplane-system:provider-kubernetes-model".into(),
        }
    }

    /// A cloud cluster, as provider-upjet-aws' EKS Cluster
    /// (`eks.aws.m.upbound.io/v1beta1`): the target the others need.
    pub fn eks_cluster() -> Self {
        Self {
            resource: resource(
                "eks.model.cascade-guard.dev",
                "v1beta1",
                "Cluster",
                "clusters",
            ),
            user: "system:serviceaccount:crossplane-system:provider-aws-eks-model".into(),
        }
    }

    pub fn all() -> Vec<Self> {
        vec![
            Self::helm_release(),
            Self::kubernetes_object(),
            Self::eks_cluster(),
        ]
    }

    /// Its CRD: namespaced, any spec and status, a status subresource, in the
    /// `crossplane` and `managed` categories as upstream's.
    pub fn crd(&self) -> CustomResourceDefinition {
        let r = &self.resource;
        let crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{}.{}", r.plural, r.group)},
            "spec": {
                "group": r.group,
                "names": {"kind": r.kind, "plural": r.plural, "singular": r.kind.to_lowercase(),
                    "listKind": format!("{}List", r.kind), "categories": ["crossplane", "managed"]},
                "scope": "Namespaced",
                "versions": [{"name": r.version, "served": true, "storage": true,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                    }}}}]
            }
        });
        // The value above is a valid CRD by construction.
        serde_json::from_value(crd).unwrap_or_default()
    }

    /// A managed resource of this kind: created with its finalizer (its
    /// provider would add it on the first reconcile), deleted in `delete_after`
    /// once it may, and needing `target` to exist to finish.
    pub fn managed(
        &self,
        namespace: &str,
        name: &str,
        for_provider: Value,
        target: Option<&ResourceRef>,
        delete_after: Duration,
    ) -> Node {
        let mut model = json!({"deleteAfterMillis": delete_after.as_millis() as u64});
        if let Some(t) = target {
            model["target"] = json!(t);
        }
        let mut node = Node::new(
            self.resource.clone(),
            Some(namespace),
            name,
            json!({"spec": {"forProvider": for_provider, "model": model}}),
        );
        node.finalizers.push(MANAGED_FINALIZER.to_string());
        node
    }
}

/// What a managed resource says it needs.
pub fn target_of(object: &DynamicObject) -> Option<ResourceRef> {
    serde_json::from_value(object.data.pointer("/spec/model/target")?.clone()).ok()
}

/// One provider: reconciles every object of its kind.
pub struct Provider {
    pub client: Client,
    pub kind: ProviderKind,
    /// Resolves targets.
    pub kinds: Kinds,
    pub poll: Duration,
}

impl Provider {
    pub async fn run(self) {
        let all: Api<DynamicObject> = Api::all_with(self.client.clone(), &self.kind.resource);
        // When each object's external delete started, by UID.
        let mut started: HashMap<String, Instant> = HashMap::new();
        let mut wedged: HashSet<String> = HashSet::new();
        loop {
            match all.list(&ListParams::default()).await {
                Ok(list) => {
                    let live: HashSet<String> = list.items.iter().filter_map(|o| o.uid()).collect();
                    started.retain(|uid, _| live.contains(uid));
                    wedged.retain(|uid| live.contains(uid));
                    for object in list.items {
                        self.reconcile(&object, &mut started, &mut wedged).await;
                    }
                }
                Err(e) => tracing::debug!("list {}: {e}", self.kind.resource.plural),
            }
            tokio::time::sleep(self.poll).await;
        }
    }

    async fn reconcile(
        &self,
        object: &DynamicObject,
        started: &mut HashMap<String, Instant>,
        wedged: &mut HashSet<String>,
    ) {
        let name = object.name_any();
        let uid = object.uid().unwrap_or_default();
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &object.namespace().unwrap_or_default(),
            &self.kind.resource,
        );
        let finalizers = object.finalizers();
        let held = finalizers.iter().any(|f| f == MANAGED_FINALIZER);
        if object.metadata.deletion_timestamp.is_none() {
            if !held && let Err(e) = add_finalizer(&api, &name, MANAGED_FINALIZER).await {
                tracing::debug!("{} {name}: {e}", self.kind.resource.kind);
            }
            return;
        }
        if !held || finalizers.iter().any(|f| f != MANAGED_FINALIZER) {
            // Not ours any more, or another finalizer still holds the object:
            // the external delete waits.
            return;
        }
        if let Some(target) = target_of(object) {
            let reachable = match self.kinds.api_for(&target, None).await {
                Ok(t) => matches!(t.get_opt(&target.name).await, Ok(Some(_))),
                Err(_) => false,
            };
            if !reachable {
                // Cannot build a client for the cluster: requeue, forever.
                if wedged.insert(uid) {
                    let message = format!(
                        "connect failed: cannot reach the target cluster: {} is gone",
                        target.describe()
                    );
                    tracing::info!("{} {name} wedged: {message}", self.kind.resource.kind);
                    let status = json!({"status": {"conditions": [{
                        "type": "Synced", "status": "False", "reason": "ReconcileError",
                        "message": message,
                        "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
                    }]}});
                    let _ = api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                        .await;
                }
                return;
            }
        }
        let delete_after = Duration::from_millis(
            object
                .data
                .pointer("/spec/model/deleteAfterMillis")
                .and_then(Value::as_u64)
                .unwrap_or(0),
        );
        let since = *started.entry(uid.clone()).or_insert_with(Instant::now);
        if since.elapsed() >= delete_after {
            match remove_finalizer(&api, &name, MANAGED_FINALIZER).await {
                Ok(_) => {
                    started.remove(&uid);
                }
                Err(e) => tracing::debug!("{} {name}: {e}", self.kind.resource.kind),
            }
        }
    }
}
