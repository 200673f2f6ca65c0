//! The local cloud's `LoadBalancer` (`cloud.local-cluster.dev`), a managed
//! resource that references its Cluster the way Upjet's resources reference
//! theirs: `spec.forProvider.clusterNameRef`, or a `clusterNameSelector`
//! (by labels, or `matchControllerRef`: the Cluster composed by the same
//! composite) that the controller resolves into the reference and the value
//! `spec.forProvider.clusterName`, as Crossplane's reference resolver does.
//!
//! The load balancer is a `LoadBalancer` Service in the cloud cluster, which
//! the cluster's service controller ([`super::load_balancer`]) gives an
//! address and takes a while to release. Deleting the resource deletes that
//! Service through the cluster's API and waits for it: with the cluster gone
//! first, the resource cannot finish (it keeps its finalizer and says why in
//! `Synced`) and the cluster's deletion logged the load balancer as leaked.
//! The order the reference implies, and only it, keeps both from happening.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::Error;
use super::cloud::GROUP;
use super::cloud::VERSION;
use super::load_balancer::DELETION_ANNOTATION;

/// The resource's finalizer: the load balancer may still exist in the cloud.
pub const FINALIZER: &str = "cloud.local-cluster.dev/load-balancer";
/// The namespace of the cloud cluster the Services are made in.
const SERVICE_NAMESPACE: &str = "default";

pub fn load_balancers() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: "LoadBalancer".into(),
        plural: "loadbalancers".into(),
    }
}

/// The LoadBalancer CRD: namespaced, Upjet's reference fields under
/// `forProvider`, how long releasing takes, Crossplane-style conditions.
pub fn crd() -> Result<CustomResourceDefinition, Error> {
    let selector = json!({"type": "object", "properties": {
        "matchControllerRef": {"type": "boolean"},
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
    }});
    super::cloud::managed_crd(
        "LoadBalancer",
        &[
            ("CLUSTER", ".spec.forProvider.clusterName"),
            ("ADDRESS", ".status.atProvider.address"),
        ],
        json!({
            "deletionSeconds": {"type": "integer", "minimum": 0},
            "forProvider": {"type": "object", "properties": {
                "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                "clusterName": {"type": "string"},
                "clusterNameRef": {"type": "object", "required": ["name"], "properties": {
                    "name": {"type": "string"},
                }},
                "clusterNameSelector": selector,
            }},
        }),
    )
}

/// A `clusterNameSelector`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    pub match_labels: BTreeMap<String, String>,
    pub match_controller_ref: bool,
}

/// What the controller reads from a LoadBalancer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BalancerView {
    pub namespace: String,
    pub name: String,
    pub deleting: bool,
    pub finalizers: Vec<String>,
    pub resource_version: Option<String>,
    pub controller_uid: Option<String>,
    pub cluster_name: Option<String>,
    pub cluster_ref: Option<String>,
    pub selector: Option<Selector>,
    pub port: i32,
    pub deletion_time: Option<Duration>,
    /// The Service made in the cloud (`status.atProvider.service`).
    pub provisioned: bool,
    /// `Synced`'s message when it is False.
    pub failure: Option<String>,
    pub ready: bool,
}

fn text(object: &Value, pointer: &str) -> Option<String> {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

fn condition<'a>(object: &'a Value, kind: &str) -> Option<&'a Value> {
    object
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

fn controller_uid(object: &DynamicObject) -> Option<String> {
    object
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.clone())
}

impl BalancerView {
    pub fn of(object: &DynamicObject) -> Option<Self> {
        let value = serde_json::to_value(object).ok()?;
        let selector = value
            .pointer("/spec/forProvider/clusterNameSelector")
            .map(|s| Selector {
                match_labels: s
                    .get("matchLabels")
                    .and_then(Value::as_object)
                    .map(|m| {
                        m.iter()
                            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                            .collect()
                    })
                    .unwrap_or_default(),
                match_controller_ref: s
                    .get("matchControllerRef")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            });
        let synced = condition(&value, "Synced");
        Some(Self {
            namespace: object.metadata.namespace.clone()?,
            name: object.metadata.name.clone()?,
            deleting: object.metadata.deletion_timestamp.is_some(),
            finalizers: object.metadata.finalizers.clone().unwrap_or_default(),
            resource_version: object.metadata.resource_version.clone(),
            controller_uid: controller_uid(object),
            cluster_name: text(&value, "/spec/forProvider/clusterName"),
            cluster_ref: text(&value, "/spec/forProvider/clusterNameRef/name"),
            selector,
            port: value
                .pointer("/spec/forProvider/port")
                .and_then(Value::as_i64)
                .and_then(|p| i32::try_from(p).ok())
                .unwrap_or(80),
            deletion_time: value
                .pointer("/spec/deletionSeconds")
                .and_then(Value::as_u64)
                .map(Duration::from_secs),
            provisioned: text(&value, "/status/atProvider/service").is_some(),
            failure: synced
                .filter(|c| c["status"] == "False")
                .and_then(|c| c["message"].as_str())
                .map(str::to_string),
            ready: condition(&value, "Ready").is_some_and(|c| c["status"] == "True"),
        })
    }

    pub fn has_finalizer(&self) -> bool {
        self.finalizers.iter().any(|f| f == FINALIZER)
    }

    /// The Service the load balancer is, in the cloud cluster: named by the
    /// resource's namespace and name, which the cluster alone cannot tell.
    pub fn service_name(&self) -> String {
        format!("lb-{}-{}", self.namespace, self.name)
    }
}

/// A Cluster a selector may pick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub controller_uid: Option<String>,
}

impl Candidate {
    pub fn of(object: &DynamicObject) -> Option<Self> {
        Some(Self {
            name: object.metadata.name.clone()?,
            labels: object.metadata.labels.clone().unwrap_or_default(),
            controller_uid: controller_uid(object),
        })
    }
}

/// What resolving the reference gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The value is set: the cluster's name.
    Resolved(String),
    /// Write the reference and the value.
    Write(String),
    /// Nothing to pick yet, or nothing to pick by: why.
    Unresolved(String),
}

/// Resolves the cluster reference as Crossplane's resolver does: a value
/// already set stays; a reference gives the value; a selector picks the
/// first matching Cluster (by name) of the same namespace and writes both.
pub fn resolve(view: &BalancerView, candidates: &[Candidate]) -> Resolution {
    if let Some(name) = &view.cluster_name {
        return Resolution::Resolved(name.clone());
    }
    if let Some(name) = &view.cluster_ref {
        return Resolution::Write(name.clone());
    }
    let Some(selector) = &view.selector else {
        return Resolution::Unresolved(
            "spec.forProvider has no clusterName, clusterNameRef or clusterNameSelector".into(),
        );
    };
    if selector.match_controller_ref && view.controller_uid.is_none() {
        return Resolution::Unresolved(
            "clusterNameSelector matches the controller, and this resource has none".into(),
        );
    }
    let mut picked: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| {
            selector
                .match_labels
                .iter()
                .all(|(k, v)| c.labels.get(k) == Some(v))
        })
        .filter(|c| !selector.match_controller_ref || c.controller_uid == view.controller_uid)
        .collect();
    picked.sort_by(|a, b| a.name.cmp(&b.name));
    match picked.first() {
        Some(c) => Resolution::Write(c.name.clone()),
        None => Resolution::Unresolved("clusterNameSelector matches no Cluster yet".into()),
    }
}

/// What the controller does next for one LoadBalancer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    AddFinalizer,
    /// Write the reference and the value: this cluster.
    WriteReference(String),
    /// Say why it cannot be resolved yet.
    Unresolved(String),
    /// Make (or check) the Service in this cluster.
    Provision(String),
    /// Delete the Service in this cluster, then let go.
    Release(String),
    /// Nothing was made in the cloud: let go at once.
    LetGo,
    Nothing,
}

pub fn next_step(view: &BalancerView, candidates: &[Candidate]) -> Step {
    match (view.deleting, view.has_finalizer()) {
        (false, false) => Step::AddFinalizer,
        (true, false) => Step::Nothing,
        (true, true) => match &view.cluster_name {
            Some(cluster) if view.provisioned => Step::Release(cluster.clone()),
            _ => Step::LetGo,
        },
        (false, true) => match resolve(view, candidates) {
            Resolution::Resolved(cluster) => Step::Provision(cluster),
            Resolution::Write(cluster) => Step::WriteReference(cluster),
            Resolution::Unresolved(why) => Step::Unresolved(why),
        },
    }
}

/// The admin clients of the cloud clusters that run, by `namespace/name`.
pub type CloudClients = std::sync::Arc<std::sync::Mutex<BTreeMap<String, Client>>>;

/// The I/O of one LoadBalancer's step; a line for the cloud's log when
/// something failed, or when the resource wedged on a cluster that is gone.
pub async fn reconcile(
    client: &Client,
    clouds: &CloudClients,
    view: &BalancerView,
    candidates: &[Candidate],
) -> Option<String> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &view.namespace, &load_balancers());
    let key = format!("{}/{}", view.namespace, view.name);
    let cloud = |cluster: &str| -> Option<Client> {
        let clients = clouds.lock().ok()?;
        clients
            .get(&format!("{}/{cluster}", view.namespace))
            .cloned()
    };
    let mut wedged = None;
    let outcome = match next_step(view, candidates) {
        Step::AddFinalizer => {
            let mut finalizers = view.finalizers.clone();
            finalizers.push(FINALIZER.to_string());
            let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": view.resource_version}});
            merge(&api, &view.name, &patch).await
        }
        Step::WriteReference(cluster) => {
            let patch = json!({"spec": {"forProvider": {
                "clusterNameRef": {"name": cluster},
                "clusterName": cluster,
            }}});
            merge(&api, &view.name, &patch).await
        }
        Step::Unresolved(why) => set_synced(&api, view, Some(&why)).await,
        Step::Provision(cluster) => match cloud(&cluster) {
            Some(cloud) => provision(&api, &cloud, view, &cluster).await,
            None => {
                let why =
                    format!("cannot make the load balancer: cluster {cluster} is not running");
                set_synced(&api, view, Some(&why)).await
            }
        },
        Step::Release(cluster) => match cloud(&cluster) {
            Some(cloud) => release(&api, &cloud, view).await,
            None => {
                let why = format!(
                    "cannot delete the load balancer {}: cluster {cluster} is gone",
                    view.service_name()
                );
                if view.failure.as_deref() != Some(&why) {
                    wedged = Some(format!("{key}: {why}"));
                }
                set_synced(&api, view, Some(&why)).await
            }
        },
        Step::LetGo => let_go(&api, view).await,
        Step::Nothing => Ok(()),
    };
    match outcome {
        Ok(()) => wedged,
        Err(e) => Some(format!("{key}: {e}")),
    }
}

async fn merge(api: &Api<DynamicObject>, name: &str, patch: &Value) -> Result<(), kube::Error> {
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(|_| ())
}

/// `Synced` False with `failure`, or True; written only when it changes.
async fn set_synced(
    api: &Api<DynamicObject>,
    view: &BalancerView,
    failure: Option<&str>,
) -> Result<(), kube::Error> {
    if view.failure.as_deref() == failure {
        return Ok(());
    }
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let synced = match failure {
        Some(why) => {
            json!({"type": "Synced", "status": "False", "reason": "ReconcileError", "message": why, "lastTransitionTime": now})
        }
        None => {
            json!({"type": "Synced", "status": "True", "reason": "ReconcileSuccess", "lastTransitionTime": now})
        }
    };
    let ready = if view.ready {
        json!({"type": "Ready", "status": "True", "reason": "Available", "lastTransitionTime": now})
    } else {
        json!({"type": "Ready", "status": "False", "reason": "Creating", "lastTransitionTime": now})
    };
    let status = json!({"status": {"conditions": [synced, ready]}});
    api.patch_status(&view.name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map(|_| ())
}

/// The Service made once; the resource Ready once it has an address.
async fn provision(
    api: &Api<DynamicObject>,
    cloud: &Client,
    view: &BalancerView,
    cluster: &str,
) -> Result<(), kube::Error> {
    let services: Api<Service> = Api::namespaced(cloud.clone(), SERVICE_NAMESPACE);
    let name = view.service_name();
    let service = match services.get_opt(&name).await? {
        Some(s) => s,
        None => {
            let mut annotations = BTreeMap::new();
            if let Some(t) = view.deletion_time {
                annotations.insert(DELETION_ANNOTATION.to_string(), t.as_secs().to_string());
            }
            let service: Service = serde_json::from_value(json!({
                "metadata": {"name": name, "annotations": annotations},
                "spec": {"type": "LoadBalancer", "ports": [{"port": view.port}]},
            }))
            .map_err(kube::Error::SerdeError)?;
            services.create(&PostParams::default(), &service).await?
        }
    };
    let address = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .and_then(|i| i.first())
        .and_then(|i| i.hostname.clone().or_else(|| i.ip.clone()));
    let Some(address) = address else {
        return Ok(());
    };
    if view.ready && view.provisioned && view.failure.is_none() {
        return Ok(());
    }
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = json!({"status": {
        "atProvider": {"address": address, "service": name, "cluster": cluster},
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "Available", "lastTransitionTime": now},
            {"type": "Synced", "status": "True", "reason": "ReconcileSuccess", "lastTransitionTime": now},
        ],
    }});
    api.patch_status(&view.name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map(|_| ())
}

/// Deletes the Service and, once the cluster has released it, lets go of
/// the resource.
async fn release(
    api: &Api<DynamicObject>,
    cloud: &Client,
    view: &BalancerView,
) -> Result<(), kube::Error> {
    let services: Api<Service> = Api::namespaced(cloud.clone(), SERVICE_NAMESPACE);
    let name = view.service_name();
    match services.get_opt(&name).await? {
        None => let_go(api, view).await,
        Some(s) if s.metadata.deletion_timestamp.is_some() => Ok(()),
        Some(_) => match services.delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e),
        },
    }
}

async fn let_go(api: &Api<DynamicObject>, view: &BalancerView) -> Result<(), kube::Error> {
    let rest: Vec<&String> = view
        .finalizers
        .iter()
        .filter(|f| f.as_str() != FINALIZER)
        .collect();
    let patch = json!({"metadata": {"finalizers": rest, "resourceVersion": view.resource_version}});
    merge(api, &view.name, &patch).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> BalancerView {
        BalancerView {
            namespace: "ns".into(),
            name: "lb".into(),
            deleting: false,
            finalizers: vec![FINALIZER.into()],
            resource_version: None,
            controller_uid: Some("xr".into()),
            cluster_name: None,
            cluster_ref: None,
            selector: None,
            port: 80,
            deletion_time: None,
            provisioned: false,
            failure: None,
            ready: false,
        }
    }

    fn candidate(name: &str, controller: Option<&str>, labels: &[(&str, &str)]) -> Candidate {
        Candidate {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            controller_uid: controller.map(str::to_string),
        }
    }

    #[test]
    fn resolve_reads_the_value_then_the_reference_then_the_selector() {
        let by_controller = Selector {
            match_controller_ref: true,
            ..Selector::default()
        };
        let by_label = Selector {
            match_labels: [("tier".to_string(), "edge".to_string())].into(),
            match_controller_ref: false,
        };
        let others = [
            candidate("b", Some("xr"), &[]),
            candidate("a", Some("other"), &[("tier", "edge")]),
            candidate("c", Some("xr"), &[("tier", "edge")]),
        ];
        let cases: Vec<(&str, BalancerView, Resolution)> = vec![
            (
                "a value stays",
                BalancerView {
                    cluster_name: Some("v".into()),
                    cluster_ref: Some("r".into()),
                    ..view()
                },
                Resolution::Resolved("v".into()),
            ),
            (
                "a reference gives the value",
                BalancerView {
                    cluster_ref: Some("r".into()),
                    ..view()
                },
                Resolution::Write("r".into()),
            ),
            (
                "the controller's, first by name",
                BalancerView {
                    selector: Some(by_controller.clone()),
                    ..view()
                },
                Resolution::Write("b".into()),
            ),
            (
                "by label, any controller",
                BalancerView {
                    selector: Some(by_label),
                    ..view()
                },
                Resolution::Write("a".into()),
            ),
            (
                "no controller to match",
                BalancerView {
                    selector: Some(by_controller),
                    controller_uid: None,
                    ..view()
                },
                Resolution::Unresolved(
                    "clusterNameSelector matches the controller, and this resource has none".into(),
                ),
            ),
        ];
        for (what, v, want) in cases {
            assert_eq!(resolve(&v, &others), want, "{what}");
        }
        let nothing = BalancerView {
            selector: Some(Selector {
                match_controller_ref: true,
                ..Selector::default()
            }),
            ..view()
        };
        assert!(
            matches!(resolve(&nothing, &[]), Resolution::Unresolved(_)),
            "no candidate yet"
        );
        assert!(matches!(
            resolve(&view(), &others),
            Resolution::Unresolved(_)
        ));
    }

    #[test]
    fn a_load_balancer_is_held_made_once_resolved_and_released_through_its_cluster() {
        let held_resolved = BalancerView {
            cluster_name: Some("c".into()),
            ..view()
        };
        let cases: Vec<(&str, BalancerView, Step)> = vec![
            (
                "new: the finalizer first",
                BalancerView {
                    finalizers: vec![],
                    ..view()
                },
                Step::AddFinalizer,
            ),
            (
                "resolved: made in its cluster",
                held_resolved.clone(),
                Step::Provision("c".into()),
            ),
            (
                "deleting, made: released through its cluster",
                BalancerView {
                    deleting: true,
                    provisioned: true,
                    ..held_resolved.clone()
                },
                Step::Release("c".into()),
            ),
            (
                "deleting, never made: nothing to release",
                BalancerView {
                    deleting: true,
                    ..held_resolved.clone()
                },
                Step::LetGo,
            ),
            (
                "deleting, let go already",
                BalancerView {
                    deleting: true,
                    finalizers: vec!["other".into()],
                    ..held_resolved
                },
                Step::Nothing,
            ),
        ];
        for (what, v, want) in cases {
            assert_eq!(next_step(&v, &[]), want, "{what}");
        }
    }
}
