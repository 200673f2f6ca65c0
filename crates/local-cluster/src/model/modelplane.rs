//! Modelplane (v0.3.1, the fixtures): its real XRDs turned into the CRDs
//! Crossplane would generate, and the trees its composition functions make,
//! with valid minimal specs.
//!
//! - An InferenceCluster (cluster-scoped) composes, in `modelplane-system`, an
//!   EKSCluster named after it (which composes the cloud cluster, a slow
//!   provider-held managed resource), a ServingStack `<name>-serving-stack`
//!   (which composes Helm Releases that install onto that cluster), and a Usage
//!   of the EKSCluster by the ServingStack with `replayDeletion: true`
//!   (functions/compose-inference-cluster, `compose_eks_usage`).
//! - A ModelDeployment composes ModelReplicas labelled
//!   `modelplane.ai/cluster: <cluster>` (functions/compose-model-deployment),
//!   each composing provider-kubernetes Objects on that cluster
//!   (functions/compose-model-replica).
//! - While ModelReplicas labelled for it exist, an InferenceCluster composes a
//!   reason-only ClusterUsage of itself with `replayDeletion: true`, and drops
//!   it when the last one is gone (`compose_replica_guard`); [`Guard`] does
//!   that.
//! - An InferenceGateway: at v0.3.1, compose-inference-gateway installs
//!   Traefik on the control plane itself through an in-cluster ProviderConfig,
//!   and its XRD names no cluster. The seed report describes InferenceGateways
//!   running on an InferenceCluster and held by its guard like ModelReplicas;
//!   the model follows the report: an InferenceGateway labelled
//!   `modelplane.ai/cluster` composes a Traefik Release and Objects (its
//!   GatewayClass and Gateway) on that cluster, and the guard counts it.
//!
//! Usages name their resources by `resourceRef` (upstream, by
//! `resourceSelector` with `matchControllerRef`, which Crossplane resolves to
//! the same objects).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, Preconditions,
    PropagationPolicy,
};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use super::composite::{COMPOSITE_LABEL, Node};
use super::provider::ProviderKind;
use super::usage::{self, Spec};
use super::{ModelError, ResourceRef};
use crate::crossplane;

pub const SYSTEM_NAMESPACE: &str = "modelplane-system";
/// The label compose-model-deployment stamps on ModelReplicas: the name of
/// the InferenceCluster they are scheduled to.
pub const CLUSTER_LABEL: &str = "modelplane.ai/cluster";
pub const GUARD_REASON: &str = "ModelReplicas are scheduled to this InferenceCluster";
/// The guard's composition key (compose-inference-cluster's
/// `_REPLICA_GUARD_RESOURCE_KEY`).
pub const GUARD_KEY: &str = "usage-replicas";

fn xr(group: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: "v1alpha1".into(),
        api_version: format!("{group}/v1alpha1"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

pub fn inference_clusters() -> ApiResource {
    xr("modelplane.ai", "InferenceCluster", "inferenceclusters")
}
pub fn eks_clusters() -> ApiResource {
    xr("infrastructure.modelplane.ai", "EKSCluster", "eksclusters")
}
pub fn serving_stacks() -> ApiResource {
    xr(
        "infrastructure.modelplane.ai",
        "ServingStack",
        "servingstacks",
    )
}
pub fn model_deployments() -> ApiResource {
    xr("modelplane.ai", "ModelDeployment", "modeldeployments")
}
pub fn model_replicas() -> ApiResource {
    xr("modelplane.ai", "ModelReplica", "modelreplicas")
}
pub fn inference_gateways() -> ApiResource {
    xr("modelplane.ai", "InferenceGateway", "inferencegateways")
}

/// The six XR kinds the scenarios use.
pub fn xr_kinds() -> [ApiResource; 6] {
    [
        inference_clusters(),
        eks_clusters(),
        serving_stacks(),
        model_deployments(),
        model_replicas(),
        inference_gateways(),
    ]
}

/// Their folders under the fixtures' `modelplane/apis/`, in [`xr_kinds`]
/// order: the real platform's own list, so the model and real Crossplane read
/// the same XRDs.
pub use crate::real_crossplane::modelplane::XRD_DIRS;

/// The real XRDs, as in the fixtures.
pub fn xrds() -> Result<Vec<Value>, ModelError> {
    XRD_DIRS
        .iter()
        .map(|d| {
            crossplane::fixture(&format!("modelplane/apis/{d}/definition.yaml"))
                .map_err(ModelError::Fixture)
        })
        .collect()
}

/// Every CRD the model needs, to install before the garbage collector starts:
/// Crossplane's XRD, Usage and ClusterUsage CRDs (the real ones), the CRD
/// Crossplane generates for each Modelplane XRD, and the managed-resource kinds.
pub fn crds() -> Result<Vec<CustomResourceDefinition>, ModelError> {
    let mut crds = Vec::new();
    for file in [
        crossplane::XRD_CRD,
        crossplane::USAGE_CRD,
        crossplane::CLUSTER_USAGE_CRD,
    ] {
        crds.push(crossplane::crossplane_crd(file).map_err(ModelError::Fixture)?);
    }
    for xrd in xrds()? {
        crds.push(crossplane::xrd_to_crd(&xrd).map_err(ModelError::Fixture)?);
    }
    crds.extend(ProviderKind::all().iter().map(ProviderKind::crd));
    Ok(crds)
}

/// An InferenceCluster on EKS, as compose-inference-cluster composes it.
#[derive(Clone, Debug)]
pub struct InferenceCluster {
    pub name: String,
    /// How long the cloud provider takes to delete the EKS cluster.
    pub cluster_delete: Duration,
    /// The ServingStack's Helm releases (chart name) and how long each takes
    /// to uninstall.
    pub releases: Vec<(String, Duration)>,
}

/// The charts a ServingStack installs (functions/compose-serving-stack).
pub const SERVING_CHARTS: [&str; 5] = [
    "cert-manager",
    "envoy-gateway",
    "kube-prometheus-stack",
    "lws",
    "nvidia-dra-driver-gpu",
];

impl InferenceCluster {
    pub fn tree(&self) -> Node {
        let n = &self.name;
        let ns = Some(SYSTEM_NAMESPACE);
        let cluster = ProviderKind::eks_cluster()
            .managed(
                SYSTEM_NAMESPACE,
                n,
                json!({"region": "us-west-2", "version": "1.36"}),
                None,
                self.cluster_delete,
            )
            .key("cluster");
        let eks = Node::xr(
            eks_clusters(),
            ns,
            n,
            json!({"region": "us-west-2",
                "nodePools": [{"name": "system", "role": "System", "instanceType": "m7i.xlarge"}]}),
        )
        .key("eks-cluster")
        .compose(cluster);
        let stack_name = format!("{n}-serving-stack");
        let mut stack = Node::xr(
            serving_stacks(),
            ns,
            &stack_name,
            json!({"secrets": [{"type": "Kubeconfig", "name": format!("{n}-kubeconfig"), "key": "kubeconfig"}]}),
        )
        .key("serving-stack");
        for (chart, uninstall) in &self.releases {
            stack = stack.compose(
                ProviderKind::helm_release()
                    .managed(
                        SYSTEM_NAMESPACE,
                        &format!("{n}-{chart}"),
                        json!({"chart": {"name": chart, "repository": "https://charts.example.org",
                            "version": "1.0.0"}, "namespace": chart}),
                        Some(&cluster_of(n)),
                        *uninstall,
                    )
                    .key(chart),
            );
        }
        let usage = usage::usage(
            SYSTEM_NAMESPACE,
            &format!("{n}-usage-eks-by-backend"),
            &Spec {
                of: ResourceRef::new(&eks_clusters(), Some(SYSTEM_NAMESPACE), n),
                by: Some(ResourceRef::new(&serving_stacks(), None, &stack_name)),
                reason: None,
                replay_deletion: true,
            },
        )
        .key("usage-eks-by-backend");
        Node::xr(
            inference_clusters(),
            None,
            n,
            json!({"cluster": {"source": "EKS", "eks": {"region": "us-west-2"}}}),
        )
        .compose(eks)
        .compose(stack)
        .compose(usage)
    }
}

/// The cloud cluster of InferenceCluster `name`.
pub fn cluster_of(name: &str) -> ResourceRef {
    ResourceRef::new(
        &ProviderKind::eks_cluster().resource,
        Some(SYSTEM_NAMESPACE),
        name,
    )
}

/// One ModelReplica of a ModelDeployment.
#[derive(Clone, Debug)]
pub struct Replica {
    /// Its provider-kubernetes Objects: how long each takes to delete.
    pub objects: Vec<Duration>,
    /// An extra XR level between the replica and its Objects (Modelplane
    /// composes none; the randomized test uses it for deeper trees).
    pub nested: Option<ApiResource>,
}

/// A ModelDeployment scheduled to one InferenceCluster.
#[derive(Clone, Debug)]
pub struct ModelDeployment {
    pub namespace: String,
    pub name: String,
    /// The InferenceCluster's name.
    pub cluster: String,
    pub replicas: Vec<Replica>,
}

fn engine_for_deployment() -> Value {
    json!({"name": "engine", "members": [{
        "role": "Standalone",
        "nodeSelector": {"devices": [{"name": "gpu",
            "selectors": [{"cel": "device.driver == 'gpu.nvidia.com'"}]}]},
        "template": {"spec": {"containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.11.0"}]}}
    }]})
}

fn engine_for_replica() -> Value {
    json!({"name": "engine", "members": [{
        "role": "Standalone",
        "nodePoolName": "gpu",
        "deviceRequests": [{"name": "gpu", "deviceClassName": "gpu.nvidia.com"}],
        "template": {"spec": {"containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.11.0"}]}}
    }]})
}

/// A minimal valid spec for each XR kind, for nested levels.
pub fn minimal_spec(resource: &ApiResource, cluster: &str) -> Value {
    match resource.kind.as_str() {
        "InferenceCluster" => json!({"cluster": {"source": "EKS", "eks": {"region": "us-west-2"}}}),
        "EKSCluster" => json!({"region": "us-west-2",
            "nodePools": [{"name": "system", "role": "System", "instanceType": "m7i.xlarge"}]}),
        "ServingStack" => {
            json!({"secrets": [{"type": "Kubeconfig", "name": format!("{cluster}-kubeconfig"), "key": "kubeconfig"}]})
        }
        "ModelDeployment" => {
            json!({"replicas": 1, "template": {"spec": {"engines": [engine_for_deployment()]}}})
        }
        "ModelReplica" => json!({"clusterName": cluster, "engines": [engine_for_replica()]}),
        "InferenceGateway" => json!({"backend": "Traefik", "traefik": {"version": "39.0.0"}}),
        _ => json!({}),
    }
}

impl ModelDeployment {
    pub fn tree(&self) -> Node {
        let cluster = cluster_of(&self.cluster);
        let ns = Some(self.namespace.as_str());
        let mut md = Node::xr(
            model_deployments(),
            ns,
            &self.name,
            json!({"replicas": self.replicas.len(),
                "template": {"spec": {"engines": [engine_for_deployment()]}}}),
        );
        for (i, r) in self.replicas.iter().enumerate() {
            let replica_name = format!("{}-{i}", self.name);
            let mut objects: Vec<Node> = r
                .objects
                .iter()
                .enumerate()
                .map(|(j, delete)| {
                    ProviderKind::kubernetes_object()
                        .managed(
                            &self.namespace,
                            &format!("{replica_name}-{j}"),
                            json!({"manifest": {"apiVersion": "apps/v1", "kind": "Deployment",
                                "metadata": {"name": format!("{replica_name}-engine-{j}"),
                                    "namespace": "modelplane-serving"}}}),
                            Some(&cluster),
                            *delete,
                        )
                        .key(&format!("engine-{j}"))
                })
                .collect();
            if let Some(kind) = &r.nested {
                let mut nested = Node::xr(
                    kind.clone(),
                    ns,
                    &format!("{replica_name}-nested"),
                    minimal_spec(kind, &self.cluster),
                );
                nested.children = objects;
                objects = vec![nested];
            }
            let mut replica = Node::xr(
                model_replicas(),
                ns,
                &replica_name,
                json!({"clusterName": self.cluster, "engines": [engine_for_replica()]}),
            )
            .label(CLUSTER_LABEL, &self.cluster)
            .key(&format!("replica-{i}"));
            replica.children = objects;
            md = md.compose(replica);
        }
        md
    }
}

/// An InferenceGateway on an InferenceCluster (see the module's note).
#[derive(Clone, Debug)]
pub struct InferenceGateway {
    pub name: String,
    /// The InferenceCluster's name.
    pub cluster: String,
    /// How long Traefik's Release takes to uninstall.
    pub release_uninstall: Duration,
    /// How long its GatewayClass and Gateway Objects take to delete.
    pub objects_delete: Duration,
}

impl InferenceGateway {
    pub fn tree(&self) -> Node {
        let cluster = cluster_of(&self.cluster);
        let n = &self.name;
        let object = |kind: &str, key: &str| {
            ProviderKind::kubernetes_object()
                .managed(
                    SYSTEM_NAMESPACE,
                    &format!("{n}-{key}"),
                    json!({"manifest": {"apiVersion": "gateway.networking.k8s.io/v1", "kind": kind,
                        "metadata": {"name": "modelplane"}}}),
                    Some(&cluster),
                    self.objects_delete,
                )
                .key(key)
        };
        Node::xr(
            inference_gateways(),
            None,
            n,
            json!({"backend": "Traefik", "traefik": {"version": "39.0.0"}}),
        )
        .label(CLUSTER_LABEL, &self.cluster)
        .compose(
            ProviderKind::helm_release()
                .managed(
                    SYSTEM_NAMESPACE,
                    &format!("{n}-traefik"),
                    json!({"chart": {"name": "traefik", "repository": "https://traefik.github.io/charts",
                        "version": "39.0.0"}, "namespace": "traefik-system"}),
                    Some(&cluster),
                    self.release_uninstall,
                )
                .key("traefik"),
        )
        .compose(object("GatewayClass", "gateway-class"))
        .compose(object("Gateway", "gateway"))
    }
}

/// compose-inference-cluster's replica guard: while ModelReplicas (and, per
/// the seed report, InferenceGateways) labelled for an InferenceCluster exist,
/// it composes a reason-only ClusterUsage of that InferenceCluster; when none
/// is left it stops composing it, and Crossplane deletes it as it deletes any
/// composed resource dropped from the desired state (Foreground, with a UID
/// precondition) and drops it from `resourceRefs`. A deleted InferenceCluster
/// is not reconciled any more, as Crossplane stops at its finalizer.
pub struct Guard {
    /// As Crossplane's service account.
    pub client: Client,
    pub poll: Duration,
}

impl Guard {
    pub async fn run(self) {
        loop {
            if let Err(e) = self.pass().await {
                tracing::debug!("replica guard: {e}");
            }
            tokio::time::sleep(self.poll).await;
        }
    }

    async fn pass(&self) -> Result<(), ModelError> {
        let mut consumers: BTreeMap<String, usize> = BTreeMap::new();
        for resource in [model_replicas(), inference_gateways()] {
            let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource);
            for o in api
                .list(&ListParams::default().labels(CLUSTER_LABEL))
                .await?
                .items
            {
                if let Some(c) = o.labels().get(CLUSTER_LABEL) {
                    *consumers.entry(c.clone()).or_default() += 1;
                }
            }
        }
        let clusters: Api<DynamicObject> =
            Api::all_with(self.client.clone(), &inference_clusters());
        let usages: Api<DynamicObject> =
            Api::all_with(self.client.clone(), &usage::cluster_usages());
        for ic in clusters.list(&ListParams::default()).await?.items {
            if ic.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let name = ic.name_any();
            let guard = format!("{name}-{GUARD_KEY}");
            let want = consumers.get(&name).copied().unwrap_or(0) > 0;
            let have = usages.get_opt(&guard).await?;
            match (want, have) {
                (true, None) => {
                    let node = usage::cluster_usage(
                        &guard,
                        &Spec {
                            of: ResourceRef::new(&inference_clusters(), None, &name),
                            by: None,
                            reason: Some(GUARD_REASON.to_string()),
                            replay_deletion: true,
                        },
                    )
                    .key(GUARD_KEY);
                    let root = ic
                        .labels()
                        .get(COMPOSITE_LABEL)
                        .cloned()
                        .unwrap_or_else(|| name.clone());
                    let owner = OwnerReference {
                        api_version: inference_clusters().api_version,
                        kind: inference_clusters().kind,
                        name: name.clone(),
                        uid: ic.uid().unwrap_or_default(),
                        controller: Some(true),
                        block_owner_deletion: Some(true),
                    };
                    node.create_composed(&self.client, &root, owner).await?;
                    self.set_ref(&clusters, &name, &guard, true).await?;
                }
                (false, Some(u)) if u.metadata.deletion_timestamp.is_none() => {
                    let params = DeleteParams {
                        propagation_policy: Some(PropagationPolicy::Foreground),
                        preconditions: Some(Preconditions {
                            uid: u.uid(),
                            resource_version: None,
                        }),
                        ..DeleteParams::default()
                    };
                    usages.delete(&guard, &params).await?;
                    self.set_ref(&clusters, &name, &guard, false).await?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Adds or removes the guard in the InferenceCluster's resourceRefs.
    async fn set_ref(
        &self,
        clusters: &Api<DynamicObject>,
        ic: &str,
        guard: &str,
        present: bool,
    ) -> Result<(), ModelError> {
        for _ in 0..10 {
            let Some(object) = clusters.get_opt(ic).await? else {
                return Ok(());
            };
            let mut refs: Vec<Value> = object
                .data
                .pointer("/spec/crossplane/resourceRefs")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let is_guard =
                |r: &Value| r["kind"] == "ClusterUsage" && r["name"].as_str() == Some(guard);
            let had = refs.iter().any(is_guard);
            if had == present {
                return Ok(());
            }
            if present {
                refs.push(json!({"apiVersion": usage::API_VERSION, "kind": "ClusterUsage", "name": guard}));
            } else {
                refs.retain(|r| !is_guard(r));
            }
            let patch = json!({
                "metadata": {"resourceVersion": object.metadata.resource_version},
                "spec": {"crossplane": {"resourceRefs": refs}},
            });
            match clusters
                .patch(ic, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}
