//! The local cloud's load balancers: what a cloud's service controller does
//! for a `LoadBalancer` Service in one of its clusters. It gives the Service
//! an address and holds it with the cleanup finalizer; when the Service is
//! deleted, the load balancer takes a while to delete (the annotation
//! [`DELETION_ANNOTATION`], in seconds, [`DEFAULT_DELETION`] without it) and
//! only then the finalizer goes. A cluster deleted before that leaks the load
//! balancer, as the seed report's did.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

/// The finalizer Kubernetes' service controller puts on a load-balanced
/// Service until the cloud's load balancer is gone.
pub const CLEANUP_FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";
/// How long deleting a Service's load balancer takes, in seconds.
pub const DELETION_ANNOTATION: &str = "cloud.local-cluster.dev/load-balancer-deletion-seconds";
pub const DEFAULT_DELETION: Duration = Duration::from_secs(5);

const POLL: Duration = Duration::from_millis(500);

/// What a Service needs next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A new load balancer: hold the Service and give it an address.
    Provision,
    /// Deleting: the load balancer is gone once `after` has passed since the
    /// delete was first seen.
    Release {
        after: Duration,
    },
    Nothing,
}

pub fn next_step(service: &Service) -> Step {
    let is_load_balancer = service
        .spec
        .as_ref()
        .and_then(|s| s.type_.as_deref())
        .is_some_and(|t| t == "LoadBalancer");
    let held = service
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == CLEANUP_FINALIZER);
    match (
        is_load_balancer,
        held,
        service.metadata.deletion_timestamp.is_some(),
    ) {
        (true, false, false) => Step::Provision,
        (_, true, true) => Step::Release {
            after: deletion_time(service),
        },
        _ => Step::Nothing,
    }
}

/// The annotation's seconds; a missing or unreadable value reads as the
/// default.
pub fn deletion_time(service: &Service) -> Duration {
    service
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DELETION_ANNOTATION))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_DELETION)
}

/// `namespace/name` of a Service.
fn key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or_default(),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Runs the load balancers of one cloud cluster until the task is aborted;
/// `note` gets a line for each thing it does.
pub async fn run(client: Client, cluster: String, note: impl Fn(&str) + Send + 'static) {
    let api: Api<Service> = Api::all(client.clone());
    // When each deleting Service was first seen.
    let mut deleting: BTreeMap<String, Instant> = BTreeMap::new();
    loop {
        if let Ok(list) = api.list(&ListParams::default()).await {
            for service in &list.items {
                let key = key(service);
                match next_step(service) {
                    Step::Provision => match provision(&client, service, &cluster).await {
                        Ok(()) => note(&format!("{cluster}: load balancer for {key} up")),
                        Err(e) => note(&format!("{cluster}: load balancer for {key}: {e}")),
                    },
                    Step::Release { after } => {
                        let since = *deleting.entry(key.clone()).or_insert_with(Instant::now);
                        if since.elapsed() >= after {
                            match release(&client, service).await {
                                Ok(()) => {
                                    note(&format!("{cluster}: load balancer for {key} deleted"));
                                    deleting.remove(&key);
                                }
                                Err(e) => note(&format!("{cluster}: releasing {key}: {e}")),
                            }
                        }
                    }
                    Step::Nothing => {}
                }
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The load balancers of a cluster that still exist: `namespace/name` of each
/// Service holding one; an error when the cluster cannot say (read as none,
/// it would say that nothing leaked).
pub async fn live(client: &Client) -> Result<Vec<String>, kube::Error> {
    let api: Api<Service> = Api::all(client.clone());
    let list = api.list(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .filter(|s| {
            s.metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == CLEANUP_FINALIZER)
        })
        .map(key)
        .collect())
}

async fn provision(client: &Client, service: &Service, cluster: &str) -> Result<(), kube::Error> {
    let api: Api<Service> = Api::namespaced(
        client.clone(),
        service.metadata.namespace.as_deref().unwrap_or("default"),
    );
    let name = service.metadata.name.clone().unwrap_or_default();
    let mut finalizers = service.metadata.finalizers.clone().unwrap_or_default();
    finalizers.push(CLEANUP_FINALIZER.to_string());
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": service.metadata.resource_version,
    }});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let hostname = format!(
        "{name}.{}.{cluster}.lb.local-cloud",
        service.metadata.namespace.as_deref().unwrap_or("default")
    );
    let status = json!({"status": {"loadBalancer": {"ingress": [{"hostname": hostname}]}}});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

async fn release(client: &Client, service: &Service) -> Result<(), kube::Error> {
    let api: Api<Service> = Api::namespaced(
        client.clone(),
        service.metadata.namespace.as_deref().unwrap_or("default"),
    );
    let rest: Vec<String> = service
        .metadata
        .finalizers
        .iter()
        .flatten()
        .filter(|f| *f != CLEANUP_FINALIZER)
        .cloned()
        .collect();
    let patch = json!({"metadata": {
        "finalizers": rest,
        "resourceVersion": service.metadata.resource_version,
    }});
    let name = service.metadata.name.clone().unwrap_or_default();
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(kind: &str, held: bool, deleting: bool, seconds: Option<&str>) -> Service {
        let mut value = json!({
            "metadata": {"name": "gw", "namespace": "default"},
            "spec": {"type": kind},
        });
        if held {
            value["metadata"]["finalizers"] = json!([CLEANUP_FINALIZER]);
        }
        if deleting {
            value["metadata"]["deletionTimestamp"] = json!("2026-12-01T00:00:00Z");
        }
        if let Some(s) = seconds {
            value["metadata"]["annotations"] = json!({DELETION_ANNOTATION: s});
        }
        serde_json::from_value(value).expect("a Service")
    }

    #[test]
    fn a_new_load_balancer_is_provisioned_and_other_services_are_left_alone() {
        assert_eq!(
            next_step(&service("LoadBalancer", false, false, None)),
            Step::Provision
        );
        assert_eq!(
            next_step(&service("LoadBalancer", true, false, None)),
            Step::Nothing
        );
        assert_eq!(
            next_step(&service("ClusterIP", false, false, None)),
            Step::Nothing
        );
        assert_eq!(
            next_step(&service("LoadBalancer", false, true, None)),
            Step::Nothing
        );
    }

    #[test]
    fn a_deleted_load_balancer_takes_its_annotated_time_or_the_default() {
        assert_eq!(
            next_step(&service("LoadBalancer", true, true, Some("40"))),
            Step::Release {
                after: Duration::from_secs(40)
            }
        );
        assert_eq!(
            next_step(&service("LoadBalancer", true, true, Some("soon"))),
            Step::Release {
                after: DEFAULT_DELETION
            }
        );
    }
}
