//! The seed's platform on real Crossplane: Modelplane's real XRDs
//! (InferenceCluster, EKSCluster, ServingStack, from the fixtures) with the
//! project's own Compositions for function-patch-and-transform
//! (`crossplane/modelplane/compositions/`; Modelplane's call its own
//! functions) and the small charts the ServingStack installs
//! (`crossplane/modelplane/charts/`), packed with `tar` and served on loopback.
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

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::manifest::FIELD_MANAGER;
use super::{Crossplane, Error, api_error, io_error};

pub const SYSTEM_NAMESPACE: &str = "modelplane-system";
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

/// `crossplane/modelplane` in the repository.
pub fn dir() -> PathBuf {
    crate::controlplane_dir().join("../crossplane/modelplane")
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

pub fn inference_clusters() -> ApiResource {
    resource(
        "modelplane.ai",
        "v1alpha1",
        "InferenceCluster",
        "inferenceclusters",
    )
}
pub fn eks_clusters() -> ApiResource {
    resource(
        "infrastructure.modelplane.ai",
        "v1alpha1",
        "EKSCluster",
        "eksclusters",
    )
}
pub fn serving_stacks() -> ApiResource {
    resource(
        "infrastructure.modelplane.ai",
        "v1alpha1",
        "ServingStack",
        "servingstacks",
    )
}
pub fn model_deployments() -> ApiResource {
    resource(
        "modelplane.ai",
        "v1alpha1",
        "ModelDeployment",
        "modeldeployments",
    )
}
pub fn model_replicas() -> ApiResource {
    resource("modelplane.ai", "v1alpha1", "ModelReplica", "modelreplicas")
}
pub fn inference_gateways() -> ApiResource {
    resource(
        "modelplane.ai",
        "v1alpha1",
        "InferenceGateway",
        "inferencegateways",
    )
}
/// Every XR kind of the platform, in [`XRD_DIRS`] order.
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
    let ns = Some(SYSTEM_NAMESPACE.to_string());
    let stack = format!("{name}-serving-stack");
    let config = format!("{name}-kubeconfig");
    let mut objects = vec![
        (inference_clusters(), None, name.to_string()),
        (eks_clusters(), ns.clone(), name.to_string()),
        (super::cloud::clusters(), ns.clone(), name.to_string()),
        (helm_provider_configs(), ns.clone(), config.clone()),
        (kubernetes_provider_configs(), ns.clone(), config),
        (serving_stacks(), ns.clone(), stack.clone()),
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
pub fn model_deployment_tree(ns: &str, name: &str) -> Vec<(ApiResource, Option<String>, String)> {
    let at = Some(ns.to_string());
    let replica = format!("{name}-0");
    vec![
        (model_deployments(), at.clone(), name.to_string()),
        (model_replicas(), at.clone(), replica.clone()),
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
pub fn inference_gateway_tree(name: &str) -> Vec<(ApiResource, Option<String>, String)> {
    let ns = Some(SYSTEM_NAMESPACE.to_string());
    let stack = format!("{name}-gateway");
    let mut objects = vec![
        (inference_gateways(), None, name.to_string()),
        (serving_stacks(), ns.clone(), stack.clone()),
        (usages(), ns.clone(), format!("{name}-guard")),
        (self::objects(), ns.clone(), format!("{stack}-gateway")),
    ];
    for chart in CHARTS {
        objects.push((releases(), ns.clone(), format!("{stack}-{chart}")));
    }
    objects
}

/// A ModelDeployment `name` in namespace `ns`, on InferenceCluster `cluster`.
pub fn model_deployment(ns: &str, name: &str, cluster: &str) -> Value {
    json!({
        "apiVersion": "modelplane.ai/v1alpha1",
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
            "crossplane": {"compositionRef": {"name": "modeldeployments-local"}},
        },
    })
}

/// An InferenceGateway `name` on InferenceCluster `cluster`.
pub fn inference_gateway(name: &str, cluster: &str) -> Value {
    json!({
        "apiVersion": "modelplane.ai/v1alpha1",
        "kind": "InferenceGateway",
        "metadata": {"name": name, "labels": {CLUSTER_LABEL: cluster}},
        "spec": {
            "backend": "Traefik",
            "traefik": {"version": "39.0.0"},
            "crossplane": {"compositionRef": {"name": "inferencegateways-local"}},
        },
    })
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
    json!({
        "apiVersion": "modelplane.ai/v1alpha1",
        "kind": "InferenceCluster",
        "metadata": {"name": name},
        "spec": {
            "cluster": {"source": "EKS", "eks": {"region": "us-west-2"}},
            "crossplane": {"compositionRef": {"name": "inferenceclusters-local"}},
        },
    })
}

/// Installs the platform on a running stack: the namespace, the charts
/// (served), the XRDs (each with `annotations` added) and the Compositions,
/// and waits until Crossplane has established the XRs' CRDs. `scratch` is a
/// directory for the packed charts.
pub async fn install(
    client: &Client,
    crossplane: &Crossplane,
    scratch: &Path,
    annotations: &Value,
) -> Result<(), Error> {
    ensure_namespace(client).await?;
    let urls = serve_charts(crossplane, scratch)?;
    let xrds = resource(
        "apiextensions.crossplane.io",
        "v2",
        "CompositeResourceDefinition",
        "compositeresourcedefinitions",
    );
    for d in XRD_DIRS {
        let mut xrd = definition(d)?;
        xrd["metadata"]["annotations"] = annotations.clone();
        apply(client, &xrds, &xrd).await?;
    }
    let compositions = resource(
        "apiextensions.crossplane.io",
        "v1",
        "Composition",
        "compositions",
    );
    for composition in compositions_with(&urls)? {
        apply(client, &compositions, &composition).await?;
    }
    wait_established(client).await
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
    read_yaml(
        &crate::crossplane::fixtures_dir().join(format!("modelplane/apis/{dir}/definition.yaml")),
    )
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
/// CRDs of the platform's XRs.
pub async fn wait_established(client: &Client) -> Result<(), Error> {
    for r in xr_kinds() {
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
