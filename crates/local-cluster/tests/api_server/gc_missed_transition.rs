//! An experiment on the real control plane, not part of `scripts/test.sh`
//! (it restarts the API server and its outcome depends on timing): can the
//! garbage collector miss a `foregroundDeletion` that is re-added just after
//! it cleared it, when the API server has restarted?
//!
//! The collector starts an owner's foreground cascade on an edge its
//! informer sees: an update whose old object lacked `foregroundDeletion` and
//! whose new one has it (`deletionStartsWithFinalizer` in
//! `pkg/controller/garbagecollector/graph_builder.go`). It clears the
//! finalizer with a GET and a PATCH straight to the API server, whatever its
//! informer holds. After an API server restart every informer of the
//! collector reconnects on its own backoff timer, and one that finds its
//! resource version gone lists again: it then sees only the difference between
//! the object it held and the one it lists. If the dependents' informer is
//! back first, the collector clears the owner's `foregroundDeletion` while
//! the owner's informer still holds it set; a re-add before that informer
//! lists again makes no edge, and with no dependent left nothing enqueues the
//! owner again.
//!
//! `cargo test -p local-cluster --test deletion_semantics gc_missed_transition -- --ignored --nocapture`
//! (LOCAL_CLUSTER_BIN_DIR as for the other tests). It prints, per owner kind,
//! whether the re-added finalizer was cleared, then restarts
//! kube-controller-manager and prints it again. `GC_EXPERIMENT_NO_RESTART=1`
//! runs the same without the API server's restart.

use std::time::{Duration, Instant};

use futures::future::join_all;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions,
    PropagationPolicy,
};
use kube::{Api, Client};
use local_cluster::{ControlPlane, Options};
use serde_json::json;

use super::{FOREGROUND, GROUP, HOLD, crd, resource};

const NAMESPACE: &str = "gc-transition";
/// Owner kinds: each has its own informer in the collector, reconnecting on
/// its own timer.
const OWNER_KINDS: usize = 6;
/// Long enough for the informers' backoff to grow to seconds (0.8 s doubling,
/// with jitter), so that they come back at different times.
const DOWNTIME: Duration = Duration::from_secs(20);
/// How long a re-added finalizer gets to be cleared again. The collector does
/// it within milliseconds when it sees the edge.
const CLEAR_BOUND: Duration = Duration::from_secs(60);

fn owner_kind(i: usize) -> (String, String) {
    (format!("Owner{i}"), format!("owner{i}s"))
}

fn dependents() -> ApiResource {
    resource("Dependent", "dependents")
}

fn foreground(uid: Option<String>) -> DeleteParams {
    DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    }
}

async fn has_foreground(api: &Api<DynamicObject>, name: &str) -> Option<bool> {
    let o = api.get_opt(name).await.ok()??;
    Some(
        o.metadata
            .finalizers
            .unwrap_or_default()
            .iter()
            .any(|f| f == FOREGROUND),
    )
}

/// Whether each owner's `foregroundDeletion` is gone within `CLEAR_BOUND`.
async fn cleared_within_bound(owners: &[Api<DynamicObject>]) -> Vec<Option<Duration>> {
    join_all(owners.iter().map(|api| async move {
        let start = Instant::now();
        while start.elapsed() < CLEAR_BOUND {
            if has_foreground(api, "owner").await == Some(false) {
                return Some(start.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        None
    }))
    .await
}

#[tokio::test]
#[ignore = "an experiment: restarts the API server; its outcome depends on timing"]
async fn a_foreground_deletion_re_added_while_the_collector_lists_again_is_cleared_or_not() {
    let mut crds: Vec<_> = (0..OWNER_KINDS)
        .map(|i| {
            let (kind, plural) = owner_kind(i);
            crd(&kind, &plural)
        })
        .collect();
    crds.push(crd("Dependent", "dependents"));
    let mut cp = ControlPlane::start(Options {
        crds,
        ..Options::default()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let client: Client = cp.admin().await.expect("admin client");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).expect("namespace"),
        )
        .await
        .expect("create namespace");
    let owners: Vec<Api<DynamicObject>> = (0..OWNER_KINDS)
        .map(|i| {
            let (kind, plural) = owner_kind(i);
            Api::namespaced_with(client.clone(), NAMESPACE, &resource(&kind, &plural))
        })
        .collect();
    let deps: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, &dependents());

    // Each owner held by a finalizer of ours (as cascade-guard's holds an
    // XR), with one blocking dependent that our finalizer keeps terminating.
    for (i, api) in owners.iter().enumerate() {
        let (kind, plural) = owner_kind(i);
        let mut o =
            DynamicObject::new("owner", &resource(&kind, &plural)).data(json!({"spec": {}}));
        o.metadata.finalizers = Some(vec![HOLD.into()]);
        let o = api.create(&PostParams::default(), &o).await.expect("owner");
        let mut d =
            DynamicObject::new(&format!("dependent-{i}"), &dependents()).data(json!({"spec": {}}));
        d.metadata.finalizers = Some(vec![HOLD.into()]);
        d.metadata.owner_references = Some(vec![OwnerReference {
            api_version: format!("{GROUP}/v1"),
            kind,
            name: "owner".into(),
            uid: o.metadata.uid.clone().expect("uid"),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        deps.create(&PostParams::default(), &d)
            .await
            .expect("dependent");
    }
    for api in &owners {
        api.delete("owner", &foreground(None))
            .await
            .expect("foreground delete");
    }
    // The collector has started every cascade once it deleted every dependent.
    let start = Instant::now();
    loop {
        let list = deps
            .list(&Default::default())
            .await
            .expect("list dependents");
        if list.items.len() == OWNER_KINDS
            && list
                .items
                .iter()
                .all(|d| d.metadata.deletion_timestamp.is_some())
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the cascades never started"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // GC_EXPERIMENT_NO_RESTART=1: the same without the restart, the control.
    let restart = std::env::var_os("GC_EXPERIMENT_NO_RESTART").is_none();
    if restart {
        cp.restart("kube-apiserver", DOWNTIME)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let restarted = Instant::now();
    // Let the dependents go: the collector clears each owner's finalizer once
    // its informer of dependents sees them gone.
    for i in 0..OWNER_KINDS {
        deps.patch(
            &format!("dependent-{i}"),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("release dependent");
    }
    // The moment the collector clears an owner, delete it in the foreground
    // again (as a second client, or a controller with no memory of the first
    // delete, would).
    let re_added = join_all(owners.iter().map(|api| async move {
        loop {
            if restarted.elapsed() > Duration::from_secs(120) {
                return None;
            }
            if has_foreground(api, "owner").await == Some(false) {
                let cleared = restarted.elapsed();
                let uid = api.get("owner").await.ok()?.metadata.uid;
                api.delete("owner", &foreground(uid)).await.ok()?;
                return Some((cleared, restarted.elapsed()));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }))
    .await;
    let after = cleared_within_bound(&owners).await;
    if restart {
        println!(
            "after the API server's restart ({} s down):",
            DOWNTIME.as_secs()
        );
    } else {
        println!("without a restart:");
    }
    for (i, (added, cleared)) in re_added.iter().zip(&after).enumerate() {
        println!(
            "  Owner{i}: cleared {}, re-added {}, {}",
            added.map_or("never".into(), |(c, _)| format!(
                "{:.3} s in",
                c.as_secs_f64()
            )),
            added.map_or("never".into(), |(_, a)| format!(
                "{:.3} s in",
                a.as_secs_f64()
            )),
            match cleared {
                Some(d) => format!("cleared again {:.1} s later", d.as_secs_f64()),
                None => format!("NOT cleared in {} s", CLEAR_BOUND.as_secs()),
            }
        );
    }

    // A new collector builds its graph from a fresh list: an owner deleting
    // with the finalizer is a cascade to start.
    cp.restart("kube-controller-manager", Duration::from_secs(1))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let after_kcm = cleared_within_bound(&owners).await;
    println!("after a restart of kube-controller-manager:");
    for (i, cleared) in after_kcm.iter().enumerate() {
        println!(
            "  Owner{i}: {}",
            match cleared {
                Some(d) => format!("cleared {:.1} s after", d.as_secs_f64()),
                None => format!("NOT cleared in {} s", CLEAR_BOUND.as_secs()),
            }
        );
    }
    cp.stop();
}
