//! The seed's platform on real Crossplane: Modelplane's real XRDs
//! (InferenceCluster, EKSCluster, ServingStack, from the fixtures) with the
//! project's own Compositions for function-patch-and-transform
//! (`testbed/crossplane/modelplane/compositions/`; Modelplane's call its own
//! functions) and the small charts the ServingStack installs
//! (`testbed/crossplane/modelplane/charts/`), packed with `tar` and served on loopback.
//!
//! An InferenceCluster `<n>` composes, in `modelplane-system`: EKSCluster `<n>`
//! (a local-cloud Cluster `<n>` writing Secret `<n>-kubeconfig`, and the
//! provider-helm and provider-kubernetes ProviderConfigs `<n>-kubeconfig`),
//! ServingStack `<n>-serving-stack` (Releases `<n>-serving-stack-<chart>` and
//! Object `<n>-serving-stack-gateway`, a LoadBalancer Service on the cloud
//! cluster) and Usage `<n>-usage-eks-by-backend`.
//!
//! What runs on such a cluster (the seed report's scenarios 2 and 3):
//! - a ModelDeployment `<m>` in a team's namespace, labelled
//!   [`CLUSTER_LABEL`]` = <n>`, composes ModelReplica `<m>-0` (a
//!   ProviderConfig `<m>-0-cluster` reaching the cluster, Object
//!   `<m>-0-engine`, a LoadBalancer Service, and Usage
//!   `<m>-0-config-in-use` of the one by the other) and the replica guard, Usage
//!   `<m>-replica-guard` of EKSCluster `<n>` by the ModelReplica;
//! - an InferenceGateway `<g>` (cluster-scoped), labelled likewise, composes
//!   in `modelplane-system` ServingStack `<g>-gateway` (installed on the
//!   cluster as the InferenceCluster's is) and Usage `<g>-guard` of EKSCluster
//!   `<n>` by that ServingStack.
//!
//! [`Platform`] says which copy: Modelplane's own groups ([`Platform::modelplane`],
//! what the demo and most tests install), or a variant under groups of its own
//! ([`Platform::variant`]), so that copies with different deletion policies
//! (an annotation on the XRDs, per kind) live side by side on one stack.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::manifest::FIELD_MANAGER;
use super::{CoreVersion, Crossplane, Error, api_error, io_error};

pub const SYSTEM_NAMESPACE: &str = "modelplane-system";
const INFERENCE_CLUSTER_COMPOSITION: &str = "inferenceclusters-local";
const WITHOUT_USAGE_COMPOSITION: &str = "inferenceclusters-local-without-usage";
/// The InferenceCluster Composition's entry for the Usage of the EKSCluster
/// by the ServingStack.
const USAGE_RESOURCE: &str = "usage-eks-by-backend";
/// Copies of Compositions without one hand-written Usage, beside the
/// originals: (Composition, its entry left out, the copy's name). What
/// sibling order must keep in order by itself: the seed's tree; a
/// ModelReplica's ProviderConfig composed beside the Object that uses it
/// (the ProviderConfigUsage race); an InferenceGateway whose ServingStack
/// nothing guards but a standalone ClusterUsage written beside it.
const WITHOUT: [(&str, &str, &str); 3] = [
    (
        INFERENCE_CLUSTER_COMPOSITION,
        USAGE_RESOURCE,
        WITHOUT_USAGE_COMPOSITION,
    ),
    (
        "modelreplicas-local",
        "config-in-use",
        "modelreplicas-local-without-usage",
    ),
    (
        "inferencegateways-local",
        "gateway-guard",
        "inferencegateways-local-without-guard",
    ),
];
/// The charts a ServingStack installs, as its Composition names them.
pub const CHARTS: [&str; 3] = ["cert-manager", "envoy-gateway", "kube-prometheus-stack"];
/// The XRDs of the fixtures this platform composes.
pub const XRD_DIRS: [&str; 6] = [
    "inferenceclusters",
    "eksclusters",
    "servingstacks",
    "modeldeployments",
    "modelreplicas",
    "inferencegateways",
];
const COMPOSITIONS: [&str; 6] = [
    "inferencecluster.yaml",
    "ekscluster.yaml",
    "servingstack.yaml",
    "modeldeployment.yaml",
    "modelreplica.yaml",
    "inferencegateway.yaml",
];
/// The label that places a ModelDeployment or an InferenceGateway on an
/// InferenceCluster (its name); Modelplane stamps it on ModelReplicas.
pub const CLUSTER_LABEL: &str = "modelplane.ai/cluster";

/// `testbed/crossplane/modelplane` in the repository.
pub fn dir() -> PathBuf {
    crate::testbed_dir().join("crossplane/modelplane")
}

pub fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// The default platform's kinds (Modelplane's own groups).
pub fn inference_clusters() -> ApiResource {
    Platform::default().inference_clusters()
}
pub fn eks_clusters() -> ApiResource {
    Platform::default().eks_clusters()
}
pub fn serving_stacks() -> ApiResource {
    Platform::default().serving_stacks()
}
pub fn model_deployments() -> ApiResource {
    Platform::default().model_deployments()
}
pub fn model_replicas() -> ApiResource {
    Platform::default().model_replicas()
}
pub fn inference_gateways() -> ApiResource {
    Platform::default().inference_gateways()
}
/// Every XR kind of the platform, in [`XRD_DIRS`] order.
pub fn xr_kinds() -> [ApiResource; 6] {
    Platform::default().xr_kinds()
}
pub fn usages() -> ApiResource {
    resource("protection.crossplane.io", "v1beta1", "Usage", "usages")
}
pub fn releases() -> ApiResource {
    resource("helm.m.crossplane.io", "v1beta1", "Release", "releases")
}
pub fn objects() -> ApiResource {
    resource(
        "kubernetes.m.crossplane.io",
        "v1alpha1",
        "Object",
        "objects",
    )
}
pub fn helm_provider_configs() -> ApiResource {
    resource(
        "helm.m.crossplane.io",
        "v1beta1",
        "ProviderConfig",
        "providerconfigs",
    )
}
pub fn kubernetes_provider_configs() -> ApiResource {
    resource(
        "kubernetes.m.crossplane.io",
        "v1alpha1",
        "ProviderConfig",
        "providerconfigs",
    )
}

/// Every object of InferenceCluster `name`'s tree: (kind, namespace, name),
/// top first.
pub fn tree(name: &str) -> Vec<(ApiResource, Option<String>, String)> {
    Platform::default().tree(name)
}

/// Every object of ModelDeployment `name`'s tree in namespace `ns`:
/// (kind, namespace, name), top first.
pub fn model_deployment_tree(ns: &str, name: &str) -> Vec<(ApiResource, Option<String>, String)> {
    Platform::default().model_deployment_tree(ns, name)
}

/// Every object of InferenceGateway `name`'s tree, top first.
pub fn inference_gateway_tree(name: &str) -> Vec<(ApiResource, Option<String>, String)> {
    Platform::default().inference_gateway_tree(name)
}

/// A ModelDeployment `name` in namespace `ns`, on InferenceCluster `cluster`.
pub fn model_deployment(ns: &str, name: &str, cluster: &str) -> Value {
    Platform::default().model_deployment(ns, name, cluster)
}

/// An InferenceGateway `name` on InferenceCluster `cluster`.
pub fn inference_gateway(name: &str, cluster: &str) -> Value {
    Platform::default().inference_gateway(name, cluster)
}

/// What the local cloud's log (`local-cloud.log`) says InferenceCluster
/// `name`'s cloud cluster leaked when it was deleted: one line each.
pub fn leaked(log: &str, name: &str) -> Vec<String> {
    let prefix = format!("{SYSTEM_NAMESPACE}/{name}/");
    log.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|rest| rest.split_once(": "))
        .filter(|(_, what)| what.starts_with("leaked"))
        .map(|(_, what)| what.to_string())
        .collect()
}

/// The InferenceCluster `name`, on EKS.
pub fn inference_cluster(name: &str) -> Value {
    Platform::default().inference_cluster(name)
}

/// Which copy of the platform, and what its XRDs and Compositions carry.
///
/// The default is Modelplane's own groups, as the fixtures have them. A
/// variant ([`Platform::variant`]) has groups of its own, so that copies with
/// different deletion policies (an annotation on the XRDs, which applies to
/// every object of a kind) can be installed side by side on one stack. The
/// copies share the namespace, the providers and the local cloud, whose kinds
/// (cloud Clusters, Releases, Objects, ProviderConfigs, Usages) are not
/// copied: objects of different copies need different names, and an
/// InferenceCluster's name names its whole tree.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Platform {
    /// `None`: Modelplane's groups; `Some(v)`: `<v>.modelplane.ai` and
    /// `infrastructure.<v>.modelplane.ai`, Compositions `<name>-<v>`.
    variant: Option<String>,
    /// Put on every XRD; `null` leaves the fixtures' (none).
    annotations: Value,
    /// Every load balancer's deletion time, in seconds; `None` keeps the
    /// Compositions' (40 s for a gateway's, 60 s for an engine's).
    load_balancer_seconds: Option<u32>,
}

impl Platform {
    /// Modelplane's own groups, each XRD annotated with `annotations`.
    pub fn modelplane(annotations: Value) -> Self {
        Self {
            annotations,
            ..Self::default()
        }
    }

    /// A copy under groups `<name>.modelplane.ai` and
    /// `infrastructure.<name>.modelplane.ai` (valid group and XRD names for a
    /// DNS label `name`, checked by [`install`]), its Compositions named
    /// `<composition>-<name>`, each XRD annotated with `annotations`.
    pub fn variant(name: &str, annotations: Value) -> Self {
        Self {
            variant: Some(name.to_string()),
            annotations,
            load_balancer_seconds: None,
        }
    }

    /// Every load balancer of this copy takes `seconds` to delete.
    pub fn with_load_balancer_seconds(mut self, seconds: u32) -> Self {
        self.load_balancer_seconds = Some(seconds);
        self
    }

    /// What every XRD is annotated with.
    pub fn annotations(&self) -> &Value {
        &self.annotations
    }

    /// `group` in this copy: one of Modelplane's (`modelplane.ai`,
    /// `<x>.modelplane.ai`) gets the variant before `modelplane.ai`; any
    /// other stays.
    pub fn group(&self, group: &str) -> String {
        let Some(variant) = &self.variant else {
            return group.to_string();
        };
        match group.strip_suffix("modelplane.ai") {
            Some(prefix) if prefix.is_empty() || prefix.ends_with('.') => {
                format!("{prefix}{variant}.modelplane.ai")
            }
            _ => group.to_string(),
        }
    }

    /// `api_version` (`<group>/<version>`) in this copy.
    fn api_version(&self, api_version: &str) -> String {
        match api_version.split_once('/') {
            Some((group, version)) => format!("{}/{version}", self.group(group)),
            None => api_version.to_string(),
        }
    }

    /// The name of Composition `name` in this copy.
    pub fn composition(&self, name: &str) -> String {
        match &self.variant {
            Some(variant) => format!("{name}-{variant}"),
            None => name.to_string(),
        }
    }

    fn modelplane_kind(&self, kind: &str, plural: &str) -> ApiResource {
        resource(&self.group("modelplane.ai"), "v1alpha1", kind, plural)
    }

    fn infrastructure_kind(&self, kind: &str, plural: &str) -> ApiResource {
        resource(
            &self.group("infrastructure.modelplane.ai"),
            "v1alpha1",
            kind,
            plural,
        )
    }

    pub fn inference_clusters(&self) -> ApiResource {
        self.modelplane_kind("InferenceCluster", "inferenceclusters")
    }
    pub fn eks_clusters(&self) -> ApiResource {
        self.infrastructure_kind("EKSCluster", "eksclusters")
    }
    pub fn serving_stacks(&self) -> ApiResource {
        self.infrastructure_kind("ServingStack", "servingstacks")
    }
    pub fn model_deployments(&self) -> ApiResource {
        self.modelplane_kind("ModelDeployment", "modeldeployments")
    }
    pub fn model_replicas(&self) -> ApiResource {
        self.modelplane_kind("ModelReplica", "modelreplicas")
    }
    pub fn inference_gateways(&self) -> ApiResource {
        self.modelplane_kind("InferenceGateway", "inferencegateways")
    }
    /// Every XR kind of this copy, in [`XRD_DIRS`] order.
    pub fn xr_kinds(&self) -> [ApiResource; 6] {
        [
            self.inference_clusters(),
            self.eks_clusters(),
            self.serving_stacks(),
            self.model_deployments(),
            self.model_replicas(),
            self.inference_gateways(),
        ]
    }

    /// Every object of InferenceCluster `name`'s tree: (kind, namespace,
    /// name), top first.
    pub fn tree(&self, name: &str) -> Vec<(ApiResource, Option<String>, String)> {
        let ns = Some(SYSTEM_NAMESPACE.to_string());
        let stack = format!("{name}-serving-stack");
        let config = format!("{name}-kubeconfig");
        let mut objects = vec![
            (self.inference_clusters(), None, name.to_string()),
            (self.eks_clusters(), ns.clone(), name.to_string()),
            (super::cloud::clusters(), ns.clone(), name.to_string()),
            (helm_provider_configs(), ns.clone(), config.clone()),
            (kubernetes_provider_configs(), ns.clone(), config),
            (self.serving_stacks(), ns.clone(), stack.clone()),
            (objects(), ns.clone(), format!("{stack}-gateway")),
            (usages(), ns.clone(), format!("{name}-usage-eks-by-backend")),
        ];
        for chart in CHARTS {
            objects.push((releases(), ns.clone(), format!("{stack}-{chart}")));
        }
        objects
    }

    /// Every object of ModelDeployment `name`'s tree in namespace `ns`:
    /// (kind, namespace, name), top first.
    pub fn model_deployment_tree(
        &self,
        ns: &str,
        name: &str,
    ) -> Vec<(ApiResource, Option<String>, String)> {
        let at = Some(ns.to_string());
        let replica = format!("{name}-0");
        vec![
            (self.model_deployments(), at.clone(), name.to_string()),
            (self.model_replicas(), at.clone(), replica.clone()),
            (usages(), at.clone(), format!("{name}-replica-guard")),
            (
                kubernetes_provider_configs(),
                at.clone(),
                format!("{replica}-cluster"),
            ),
            (usages(), at.clone(), format!("{replica}-config-in-use")),
            (objects(), at, format!("{replica}-engine")),
        ]
    }

    /// Every object of InferenceGateway `name`'s tree, top first.
    pub fn inference_gateway_tree(&self, name: &str) -> Vec<(ApiResource, Option<String>, String)> {
        let ns = Some(SYSTEM_NAMESPACE.to_string());
        let stack = format!("{name}-gateway");
        let mut objects = vec![
            (self.inference_gateways(), None, name.to_string()),
            (self.serving_stacks(), ns.clone(), stack.clone()),
            (usages(), ns.clone(), format!("{name}-guard")),
            (self::objects(), ns.clone(), format!("{stack}-gateway")),
        ];
        for chart in CHARTS {
            objects.push((releases(), ns.clone(), format!("{stack}-{chart}")));
        }
        objects
    }

    /// A ModelDeployment `name` in namespace `ns`, on InferenceCluster
    /// `cluster`.
    pub fn model_deployment(&self, ns: &str, name: &str, cluster: &str) -> Value {
        json!({
            "apiVersion": self.model_deployments().api_version,
            "kind": "ModelDeployment",
            "metadata": {"name": name, "namespace": ns, "labels": {CLUSTER_LABEL: cluster}},
            "spec": {
                "replicas": 1,
                "template": {"spec": {"engines": [{"name": "engine", "members": [{
                    "role": "Standalone",
                    "nodeSelector": {"devices": [{"name": "gpu",
                        "selectors": [{"cel": "device.driver == 'gpu.nvidia.com'"}]}]},
                    "template": {"spec": {"containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.11.0"}]}},
                }]}]}},
                "crossplane": {"compositionRef": {"name": self.composition("modeldeployments-local")}},
            },
        })
    }

    /// An InferenceGateway `name` on InferenceCluster `cluster`.
    pub fn inference_gateway(&self, name: &str, cluster: &str) -> Value {
        json!({
            "apiVersion": self.inference_gateways().api_version,
            "kind": "InferenceGateway",
            "metadata": {"name": name, "labels": {CLUSTER_LABEL: cluster}},
            "spec": {
                "backend": "Traefik",
                "traefik": {"version": "39.0.0"},
                "crossplane": {"compositionRef": {"name": self.composition("inferencegateways-local")}},
            },
        })
    }

    /// InferenceGateway `name` on InferenceCluster `cluster`, composed
    /// without its guard (the Usage of the cluster's EKSCluster by its
    /// ServingStack).
    pub fn inference_gateway_without_guard(&self, name: &str, cluster: &str) -> Value {
        let mut gateway = self.inference_gateway(name, cluster);
        gateway["spec"]["crossplane"]["compositionRef"]["name"] =
            json!(self.composition("inferencegateways-local-without-guard"));
        gateway
    }

    /// A standalone EKSCluster `name` in [`SYSTEM_NAMESPACE`]: the cloud
    /// cluster `name`, its kubeconfig Secret and ProviderConfigs
    /// `<name>-kubeconfig`, as an InferenceCluster composes it.
    pub fn eks_cluster(&self, name: &str) -> Value {
        json!({
            "apiVersion": self.eks_clusters().api_version,
            "kind": "EKSCluster",
            "metadata": {"name": name, "namespace": SYSTEM_NAMESPACE},
            "spec": {
                "region": "us-west-2",
                "nodePools": [{"name": "system", "role": "System", "instanceType": "m7i.xlarge"}],
                "crossplane": {"compositionRef": {"name": self.composition("eksclusters-local")}},
            },
        })
    }

    /// A standalone ServingStack `name` in [`SYSTEM_NAMESPACE`], installed
    /// on the cluster of EKSCluster `cluster` (through its kubeconfig).
    pub fn serving_stack(&self, name: &str, cluster: &str) -> Value {
        json!({
            "apiVersion": self.serving_stacks().api_version,
            "kind": "ServingStack",
            "metadata": {"name": name, "namespace": SYSTEM_NAMESPACE},
            "spec": {
                "secrets": [{"type": "Kubeconfig", "key": "kubeconfig", "name": format!("{cluster}-kubeconfig")}],
                "crossplane": {"compositionRef": {"name": self.composition("servingstacks-local")}},
            },
        })
    }

    /// Every object of a standalone ServingStack `name`'s tree: (kind,
    /// namespace, name), top first.
    pub fn serving_stack_tree(&self, name: &str) -> Vec<(ApiResource, Option<String>, String)> {
        let ns = Some(SYSTEM_NAMESPACE.to_string());
        let mut objects = vec![
            (self.serving_stacks(), ns.clone(), name.to_string()),
            (objects(), ns.clone(), format!("{name}-gateway")),
        ];
        for chart in CHARTS {
            objects.push((releases(), ns.clone(), format!("{name}-{chart}")));
        }
        objects
    }

    /// Every object of a standalone EKSCluster `name`'s tree, top first.
    pub fn eks_cluster_tree(&self, name: &str) -> Vec<(ApiResource, Option<String>, String)> {
        let ns = Some(SYSTEM_NAMESPACE.to_string());
        let config = format!("{name}-kubeconfig");
        vec![
            (self.eks_clusters(), ns.clone(), name.to_string()),
            (super::cloud::clusters(), ns.clone(), name.to_string()),
            (helm_provider_configs(), ns.clone(), config.clone()),
            (kubernetes_provider_configs(), ns, config),
        ]
    }

    /// A standalone ModelReplica `name` in namespace `ns` on InferenceCluster
    /// (or EKSCluster) `cluster`, composed without the Usage of its
    /// ProviderConfig by its engine's Object: the ProviderConfig
    /// `<name>-cluster` composed beside the Object `<name>-engine` that uses
    /// it, and nothing written by hand between them.
    pub fn model_replica_without_usage(&self, ns: &str, name: &str, cluster: &str) -> Value {
        json!({
            "apiVersion": self.model_replicas().api_version,
            "kind": "ModelReplica",
            "metadata": {"name": name, "namespace": ns, "labels": {CLUSTER_LABEL: cluster}},
            "spec": {
                "clusterName": cluster,
                "engines": [{"name": "engine", "members": [{
                    "role": "Standalone",
                    "nodePoolName": "gpu",
                    "deviceRequests": [{"name": "gpu", "deviceClassName": "gpu.nvidia.com"}],
                    "template": {"spec": {"containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.11.0"}]}},
                }]}],
                "crossplane": {"compositionRef": {"name": self.composition("modelreplicas-local-without-usage")}},
            },
        })
    }

    /// InferenceCluster `name` composed without the Usage of its EKSCluster
    /// by its ServingStack: nothing written by hand orders the two.
    pub fn inference_cluster_without_usage(&self, name: &str) -> Value {
        let mut ic = self.inference_cluster(name);
        ic["spec"]["crossplane"]["compositionRef"]["name"] =
            json!(self.composition(WITHOUT_USAGE_COMPOSITION));
        ic
    }

    /// The InferenceCluster `name`, on EKS.
    pub fn inference_cluster(&self, name: &str) -> Value {
        json!({
            "apiVersion": self.inference_clusters().api_version,
            "kind": "InferenceCluster",
            "metadata": {"name": name},
            "spec": {
                "cluster": {"source": "EKS", "eks": {"region": "us-west-2"}},
                "crossplane": {"compositionRef": {"name": self.composition(INFERENCE_CLUSTER_COMPOSITION)}},
            },
        })
    }

    /// A variant's name must make valid group and object names: a DNS label.
    fn check(&self) -> Result<(), Error> {
        let Some(variant) = &self.variant else {
            return Ok(());
        };
        let label = !variant.is_empty()
            && variant.len() <= 63
            && variant
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !variant.starts_with('-')
            && !variant.ends_with('-');
        if label {
            Ok(())
        } else {
            Err(Error::Io(format!(
                "platform variant {variant:?} is not a DNS label"
            )))
        }
    }

    /// This copy's XRDs: Modelplane's from the fixtures, in [`XRD_DIRS`]
    /// order, in this copy's groups and with its annotations.
    pub fn definitions(&self) -> Result<Vec<Value>, Error> {
        let mut out = Vec::new();
        for dir in XRD_DIRS {
            let mut xrd = definition(dir)?;
            if self.variant.is_some() {
                let names = xrd
                    .pointer("/spec/group")
                    .and_then(Value::as_str)
                    .zip(xrd.pointer("/spec/names/plural").and_then(Value::as_str))
                    .map(|(group, plural)| (self.group(group), plural.to_string()));
                let Some((group, plural)) = names else {
                    return Err(Error::Manifest {
                        path: definition_path(dir),
                        detail: "no spec.group or spec.names.plural".into(),
                    });
                };
                xrd["metadata"]["name"] = json!(format!("{plural}.{group}"));
                xrd["spec"]["group"] = json!(group);
            }
            if !self.annotations.is_null() {
                xrd["metadata"]["annotations"] = self.annotations.clone();
            }
            out.push(xrd);
        }
        Ok(out)
    }

    /// This copy's Compositions: the project's, with the charts' URLs filled
    /// in, each named for this copy, every apiVersion of Modelplane's groups
    /// (the composite type, the composed XRs, the Usages' `of` and `by`) in
    /// this copy's, and its load balancers' deletion time. Labels such as
    /// [`CLUSTER_LABEL`] stay: they are not API groups.
    pub fn compositions(&self, urls: &[(&str, String)]) -> Result<Vec<Value>, Error> {
        let mut out = compositions_with(urls)?;
        for (original, entry, copy) in WITHOUT {
            let Some(with) = out
                .iter()
                .find(|c| c.pointer("/metadata/name") == Some(&json!(original)))
            else {
                continue;
            };
            let mut without = with.clone();
            without["metadata"]["name"] = json!(copy);
            for step in without
                .pointer_mut("/spec/pipeline")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if let Some(resources) = step
                    .pointer_mut("/input/resources")
                    .and_then(Value::as_array_mut)
                {
                    resources.retain(|r| r["name"] != entry);
                }
            }
            out.push(without);
        }
        // A kind with a copy has two Compositions now: an XR composing it
        // (a ModelDeployment its ModelReplica) names the original, which
        // Crossplane would otherwise pick between the two at random.
        let copied: Vec<(String, String)> = WITHOUT
            .iter()
            .filter_map(|(original, _, _)| {
                let c = out
                    .iter()
                    .find(|c| c.pointer("/metadata/name") == Some(&json!(original)))?;
                let kind = c.pointer("/spec/compositeTypeRef/kind")?.as_str()?;
                Some((kind.to_string(), self.composition(original)))
            })
            .collect();
        for base in out
            .iter_mut()
            .filter_map(|c| c.pointer_mut("/spec/pipeline"))
            .filter_map(Value::as_array_mut)
            .flatten()
            .filter_map(|step| step.pointer_mut("/input/resources"))
            .filter_map(Value::as_array_mut)
            .flatten()
            .filter_map(|r| r.get_mut("base"))
        {
            let kind = base.get("kind").and_then(Value::as_str).unwrap_or_default();
            if let Some((_, name)) = copied.iter().find(|(k, _)| k == kind)
                && base.pointer("/spec/crossplane/compositionRef").is_none()
            {
                base["spec"]["crossplane"]["compositionRef"] = json!({ "name": name });
            }
        }
        for composition in &mut out {
            if let Some(name) = composition
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .map(|n| self.composition(n))
            {
                composition["metadata"]["name"] = json!(name);
            }
            self.rewrite(composition);
        }
        Ok(out)
    }

    fn rewrite(&self, value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (key, v) in map.iter_mut() {
                    match v {
                        Value::String(s) if key == "apiVersion" => *s = self.api_version(s),
                        Value::String(s) if key == super::load_balancer::DELETION_ANNOTATION => {
                            if let Some(seconds) = self.load_balancer_seconds {
                                *s = seconds.to_string();
                            }
                        }
                        v => self.rewrite(v),
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.rewrite(v)),
            _ => {}
        }
    }

    /// Waits until Crossplane has created and the API server established the
    /// CRDs of this copy's XRs.
    pub async fn wait_established(&self, client: &Client) -> Result<(), Error> {
        for r in self.xr_kinds() {
            let name = format!("{}.{}", r.plural, r.group);
            let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
            let found = crate::wait::until(Duration::from_secs(120), || async {
                crds.get_opt(&name).await.ok().flatten()
            })
            .await;
            if found.is_none() {
                return Err(Error::NotReady {
                    component: format!("the CRD Crossplane generates for {name}"),
                    last: "never created".into(),
                });
            }
            crate::wait::crd_established(client, &name, Duration::from_secs(60))
                .await
                .map_err(api_error(format!("waiting for CRD {name}")))?;
        }
        Ok(())
    }
}

/// Installs `platform` on a running stack: the namespace, the charts
/// (served), its XRDs and Compositions, and waits until Crossplane has
/// established the XRs' CRDs. `scratch` is a directory for the packed charts,
/// one per concurrent install.
pub async fn install(
    client: &Client,
    crossplane: &Crossplane,
    scratch: &Path,
    platform: &Platform,
) -> Result<(), Error> {
    platform.check()?;
    ensure_namespace(client).await?;
    let urls = serve_charts(crossplane, scratch)?;
    let xrds = resource(
        "apiextensions.crossplane.io",
        "v2",
        "CompositeResourceDefinition",
        "compositeresourcedefinitions",
    );
    // An XRD's versions take `subresources` (ModelDeployment's scale) since
    // Crossplane v2.3.0, and earlier releases refuse the field. Nothing here
    // scales a ModelDeployment, so there it is left out.
    let scale = crossplane.version() >= CoreVersion::new(2, 3, 0);
    for mut xrd in platform.definitions()? {
        if !scale {
            let versions = xrd
                .pointer_mut("/spec/versions")
                .and_then(Value::as_array_mut);
            for version in versions.into_iter().flatten() {
                if let Some(version) = version.as_object_mut() {
                    version.remove("subresources");
                }
            }
        }
        apply(client, &xrds, &xrd).await?;
    }
    let compositions = resource(
        "apiextensions.crossplane.io",
        "v1",
        "Composition",
        "compositions",
    );
    for composition in platform.compositions(&urls)? {
        apply(client, &compositions, &composition).await?;
    }
    platform.wait_established(client).await
}

/// The namespace the platform composes into.
pub async fn ensure_namespace(client: &Client) -> Result<(), Error> {
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": SYSTEM_NAMESPACE}}))
            .map_err(|e| Error::Io(format!("namespace: {e}")))?;
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(api_error("creating modelplane-system")(e)),
    }
}

/// Packs the charts and serves them on loopback: each chart's name with its URL.
pub fn serve_charts(
    crossplane: &Crossplane,
    scratch: &Path,
) -> Result<Vec<(&'static str, String)>, Error> {
    let mut urls = Vec::new();
    for chart in CHARTS {
        let packed = pack_chart(&dir().join("charts").join(chart), scratch)?;
        let name = format!("{chart}-0.1.0.tgz");
        urls.push((chart, crossplane.serve(&name, packed)?));
    }
    Ok(urls)
}

/// Modelplane's real XRD from the fixtures' `apis/<dir>/definition.yaml`, as
/// it is there (without annotations).
pub fn definition(dir: &str) -> Result<Value, Error> {
    read_yaml(&definition_path(dir))
}

fn definition_path(dir: &str) -> PathBuf {
    crate::crossplane::fixtures_dir().join(format!("modelplane/apis/{dir}/definition.yaml"))
}

/// The project's Compositions, with the charts' URLs filled in.
pub fn compositions_with(urls: &[(&str, String)]) -> Result<Vec<Value>, Error> {
    let mut out = Vec::new();
    for file in COMPOSITIONS {
        let path = dir().join("compositions").join(file);
        let mut text = std::fs::read_to_string(&path).map_err(io_error(&path))?;
        for (chart, url) in urls {
            text = text.replace(&format!("{{{{chart:{chart}}}}}"), url);
        }
        out.push(serde_yaml::from_str(&text).map_err(|e| Error::Manifest {
            path: path.clone(),
            detail: e.to_string(),
        })?);
    }
    Ok(out)
}

/// Waits until Crossplane has created and the API server established the
/// CRDs of the default platform's XRs.
pub async fn wait_established(client: &Client) -> Result<(), Error> {
    Platform::default().wait_established(client).await
}

fn read_yaml(path: &Path) -> Result<Value, Error> {
    let text = std::fs::read_to_string(path).map_err(io_error(path))?;
    serde_yaml::from_str(&text).map_err(|e| Error::Manifest {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })
}

/// Server-side apply of a cluster-scoped object.
async fn apply(client: &Client, ar: &ApiResource, object: &Value) -> Result<(), Error> {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let api: Api<DynamicObject> = Api::all_with(client.clone(), ar);
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .map_err(api_error(format!("applying {} {name}", ar.kind)))?;
    Ok(())
}

/// A chart directory packed as Helm reads it: a gzipped tar whose one top
/// folder is the chart's name.
fn pack_chart(chart: &Path, scratch: &Path) -> Result<Vec<u8>, Error> {
    std::fs::create_dir_all(scratch).map_err(io_error(scratch))?;
    let name = chart
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::Io(format!("no chart name in {}", chart.display())))?;
    let parent = chart
        .parent()
        .ok_or_else(|| Error::Io(format!("no parent of {}", chart.display())))?;
    let tgz = scratch.join(format!("{name}-0.1.0.tgz"));
    let output = std::process::Command::new("tar")
        .arg("-czf")
        .arg(&tgz)
        .arg("-C")
        .arg(parent)
        .arg(name)
        .output()
        .map_err(|e| Error::Io(format!("cannot run tar: {e}")))?;
    if !output.status.success() {
        return Err(Error::Io(format!(
            "tar {}: {}",
            chart.display(),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    std::fs::read(&tgz).map_err(io_error(&tgz))
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::Platform;

    fn urls() -> Vec<(&'static str, String)> {
        super::CHARTS
            .iter()
            .map(|c| (*c, format!("http://127.0.0.1:1/{c}")))
            .collect()
    }

    /// Every string in `value` at a key named `key`.
    fn strings_at(value: &Value, key: &str, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    match v {
                        Value::String(s) if k == key => out.push(s.clone()),
                        v => strings_at(v, key, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| strings_at(v, key, out)),
            _ => {}
        }
    }

    #[test]
    fn the_default_platform_is_the_fixtures_and_compositions_as_they_are() {
        let annotations = json!({"cascade-guard.dev/deletion-policy": "Off"});
        let platform = Platform::modelplane(annotations.clone());
        let mut expected = Vec::new();
        for dir in super::XRD_DIRS {
            let mut xrd = super::definition(dir).expect("fixture");
            xrd["metadata"]["annotations"] = annotations.clone();
            expected.push(xrd);
        }
        assert_eq!(platform.definitions().expect("definitions"), expected);
        let mut compositions = platform.compositions(&urls()).expect("compositions");
        // Beside the project's own: a copy of three without a Usage each.
        for (original, entry, copy) in super::WITHOUT.iter().rev() {
            let without = compositions.pop().expect("a derived composition");
            assert_eq!(without["metadata"]["name"], *copy);
            let names = |c: &Value| -> Vec<String> {
                c.pointer("/spec/pipeline/0/input/resources")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|r| r["name"].as_str().map(str::to_string))
                    .collect()
            };
            let from = compositions
                .iter()
                .find(|c| c["metadata"]["name"] == *original)
                .expect("the original");
            let mut want = names(from);
            want.retain(|n| n != entry);
            assert_eq!(names(&without), want, "{copy}");
            assert!(names(from).iter().any(|n| n == entry), "{original}");
        }
        // A ModelDeployment names its ModelReplica's original Composition,
        // now that a copy is beside it; the rest is the project's as it is.
        let md = compositions
            .iter_mut()
            .find(|c| c["metadata"]["name"] == "modeldeployments-local")
            .expect("the ModelDeployment's");
        let replica = md
            .pointer_mut("/spec/pipeline/0/input/resources/0/base/spec/crossplane")
            .and_then(Value::as_object_mut)
            .expect("the replica's spec.crossplane");
        assert_eq!(
            replica.remove("compositionRef"),
            Some(json!({"name": "modelreplicas-local"}))
        );
        if replica.is_empty() {
            md["spec"]["pipeline"][0]["input"]["resources"][0]["base"]["spec"]
                .as_object_mut()
                .expect("spec")
                .remove("crossplane");
        }
        assert_eq!(
            compositions,
            super::compositions_with(&urls()).expect("compositions")
        );
        assert_eq!(
            super::inference_clusters().api_version,
            "modelplane.ai/v1alpha1"
        );
        assert_eq!(
            super::inference_cluster("prod")["spec"]["crossplane"]["compositionRef"]["name"],
            "inferenceclusters-local"
        );
    }

    #[test]
    fn a_variant_has_groups_compositions_and_load_balancers_of_its_own() {
        let platform = Platform::variant("off", json!({"a": "b"})).with_load_balancer_seconds(7);
        assert_eq!(platform.group("modelplane.ai"), "off.modelplane.ai");
        assert_eq!(
            platform.group("infrastructure.modelplane.ai"),
            "infrastructure.off.modelplane.ai"
        );
        assert_eq!(platform.group("notmodelplane.ai"), "notmodelplane.ai");
        assert_eq!(
            platform.group("protection.crossplane.io"),
            "protection.crossplane.io"
        );
        let xrds = platform.definitions().expect("definitions");
        let names: Vec<&str> = xrds
            .iter()
            .filter_map(|x| x.pointer("/metadata/name").and_then(Value::as_str))
            .collect();
        let kinds: Vec<String> = platform
            .xr_kinds()
            .iter()
            .map(|r| format!("{}.{}", r.plural, r.group))
            .collect();
        assert_eq!(names, kinds);
        assert!(
            xrds.iter()
                .all(|x| x["metadata"]["annotations"] == json!({"a": "b"}))
        );

        let compositions = platform.compositions(&urls()).expect("compositions");
        let mut api_versions = Vec::new();
        let mut seconds = Vec::new();
        for c in &compositions {
            strings_at(c, "apiVersion", &mut api_versions);
            strings_at(
                c,
                super::super::load_balancer::DELETION_ANNOTATION,
                &mut seconds,
            );
        }
        assert!(
            api_versions
                .iter()
                .filter(|v| v.contains("modelplane.ai"))
                .all(|v| v.starts_with("off.modelplane.ai/")
                    || v.starts_with("infrastructure.off.modelplane.ai/")),
            "{api_versions:?}"
        );
        // The Usages' `of` and `by` too.
        assert!(api_versions.contains(&"infrastructure.off.modelplane.ai/v1alpha1".to_string()));
        // The gateway's, the engine's and the engine's in the copy without its Usage.
        assert_eq!(seconds, vec!["7".to_string(); 3]);
        // The label that places consumers on a cluster is not a group.
        let text = serde_json::to_string(&compositions).expect("json");
        assert!(text.contains("metadata.labels[modelplane.ai/cluster]"));
        let ic = platform.inference_cluster("prod");
        assert_eq!(ic["apiVersion"], "off.modelplane.ai/v1alpha1");
        let name = &ic["spec"]["crossplane"]["compositionRef"]["name"];
        assert!(
            compositions.iter().any(|c| &c["metadata"]["name"] == name
                && c["spec"]["compositeTypeRef"]["apiVersion"] == ic["apiVersion"]),
            "no Composition {name} for {}",
            ic["apiVersion"]
        );
        assert!(Platform::variant("Off", json!({})).check().is_err());
        assert!(Platform::variant("a.b", json!({})).check().is_err());
    }

    #[test]
    fn leaked_reads_only_the_named_clusters_leaks() {
        let log = "modelplane-system/prod/u1: cloud cluster up at https://127.0.0.1:1
modelplane-system/prod/u1: leaked the load balancer of Service default/gw
modelplane-system/prod-2/u2: leaked the load balancer of Service default/other
";
        assert_eq!(
            super::leaked(log, "prod"),
            vec!["leaked the load balancer of Service default/gw".to_string()]
        );
    }
}
