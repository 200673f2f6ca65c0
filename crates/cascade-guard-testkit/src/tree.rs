//! Composite trees for Convert tests: an XR whose composed resources are
//! ConfigMaps with a controller reference to it (`blockOwnerDeletion: true`)
//! and a provider-like finalizer that a simulated provider removes a while
//! after each is deleted, as provider-kubernetes and provider-helm do.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use local_cluster::testing::Scope;
use local_cluster::timeline::Timeline;
use local_cluster::wait;
use serde_json::json;
use tokio::task::JoinHandle;

use super::{HOLD, composite};

pub fn config_maps() -> ApiResource {
    ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        plural: "configmaps".into(),
    }
}

/// Creates XR `name` of `resource` in `ns` with `dependents` composed
/// ConfigMaps named `<name>-<i>`, listed in its resourceRefs.
pub async fn create_tree(
    client: &Client,
    resource: &ApiResource,
    ns: &str,
    name: &str,
    dependents: usize,
) -> DynamicObject {
    let xrs: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, resource);
    let mut xr = composite(resource, name, false);
    let refs: Vec<_> = (0..dependents)
        .map(|i| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": format!("{name}-{i}")}))
        .collect();
    xr.data["spec"] = json!({"crossplane": {"resourceRefs": refs}});
    let xr = xrs
        .create(&PostParams::default(), &xr)
        .await
        .expect("create XR");
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    for i in 0..dependents {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}-{i}"), "finalizers": [HOLD],
                "labels": {"crossplane.io/composite": name},
                "ownerReferences": [{"apiVersion": resource.api_version, "kind": resource.kind,
                    "name": name, "uid": xr.uid().expect("uid"), "controller": true, "blockOwnerDeletion": true}]}
        }))
        .expect("config map");
        maps.create(&PostParams::default(), &cm)
            .await
            .expect("create dependent");
    }
    xr
}

/// Waits until cascade-guard holds the XR with its finalizer.
pub async fn wait_held(client: &Client, resource: &ApiResource, ns: &str, name: &str) {
    let xrs: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, resource);
    let held = wait::until(Duration::from_secs(30), || async {
        let xr = xrs.get(name).await.ok()?;
        xr.finalizers()
            .iter()
            .any(|f| f == "cascade-guard.dev/foreground-cascade")
            .then_some(())
    })
    .await;
    assert!(held.is_some(), "cascade-guard never held {ns}/{name}");
}

/// A provider: removes the HOLD finalizer from each deleted ConfigMap in `ns`
/// `delay` after it first sees it deleted. Stops when dropped.
pub struct Provider(JoinHandle<()>);

impl Provider {
    pub fn start(client: Client, ns: String, delay: Duration) -> Self {
        Self::start_polling(client, ns, delay, Duration::from_millis(50))
    }

    /// The same, looking at the ConfigMaps every `every`.
    pub fn start_polling(client: Client, ns: String, delay: Duration, every: Duration) -> Self {
        Provider(tokio::spawn(async move {
            let maps: Api<ConfigMap> = Api::namespaced(client, &ns);
            let mut seen: std::collections::HashMap<String, std::time::Instant> =
                Default::default();
            loop {
                if let Ok(list) = maps.list(&ListParams::default()).await {
                    for cm in list.items {
                        if cm.metadata.deletion_timestamp.is_none()
                            || !cm.finalizers().iter().any(|f| f == HOLD)
                        {
                            continue;
                        }
                        let first = *seen
                            .entry(cm.uid().unwrap_or_default())
                            .or_insert_with(std::time::Instant::now);
                        if first.elapsed() >= delay {
                            let rest: Vec<String> = cm
                                .finalizers()
                                .iter()
                                .filter(|f| *f != HOLD)
                                .cloned()
                                .collect();
                            let _ = maps
                                .patch(
                                    &cm.name_any(),
                                    &PatchParams::default(),
                                    &Patch::Merge(json!({"metadata": {"finalizers": rest}})),
                                )
                                .await;
                        }
                    }
                }
                tokio::time::sleep(every).await;
            }
        }))
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Asserts, from the timeline, that XR `name` left the API after every one of
/// its `dependents` and was deleted in the foreground.
pub fn assert_foreground(timeline: &Timeline, kind: &str, name: &str, dependents: usize) {
    let xr_gone = timeline
        .gone(kind, name)
        .unwrap_or_else(|| panic!("{name} never left the API:\n{}", timeline.describe()));
    for i in 0..dependents {
        let d = format!("{name}-{i}");
        let gone = timeline
            .gone("ConfigMap", &d)
            .unwrap_or_else(|| panic!("{d} never left the API:\n{}", timeline.describe()));
        assert!(
            timeline.revision_of(&gone) < timeline.revision_of(&xr_gone),
            "{name} left before its dependent {d}:\n{}",
            timeline.describe()
        );
    }
    assert!(
        timeline.seen_with_finalizer(kind, name, "foregroundDeletion"),
        "{name} was never in a foreground cascade:\n{}",
        timeline.describe()
    );
}

/// etcd's revision of ConfigMap `name`'s removal. Fails when the timeline
/// never saw it leave, or saw it without a revision: an order between
/// revisions that are not there (`None < Some(_)`) would pass unchecked.
pub fn gone_revision(timeline: &Timeline, name: &str, what: &str) -> u64 {
    timeline
        .gone("ConfigMap", name)
        .and_then(|e| e.revision)
        .unwrap_or_else(|| {
            panic!(
                "{what}: {name} never seen leaving (with a revision)\n{}",
                timeline.describe()
            )
        })
}

/// etcd's revision of the first sight of ConfigMap `name` terminating;
/// fails as [`gone_revision`] does.
pub fn terminating_revision(timeline: &Timeline, name: &str, what: &str) -> u64 {
    timeline
        .terminating("ConfigMap", name)
        .and_then(|e| e.revision)
        .unwrap_or_else(|| {
            panic!(
                "{what}: {name} never seen terminating (with a revision)\n{}",
                timeline.describe()
            )
        })
}

/// ConfigMap `needed` started deleting only after ConfigMap `needer` was
/// gone, by etcd revision (sibling order's promise).
pub fn assert_needed_after(timeline: &Timeline, needer: &str, needed: &str, what: &str) {
    let needer_gone = gone_revision(timeline, needer, what);
    let needed_deleting = terminating_revision(timeline, needed, what);
    assert!(
        needed_deleting > needer_gone,
        "{what}: {needed} was deleted (revision {needed_deleting}) before {needer} was gone (revision {needer_gone})\n{}",
        timeline.describe()
    );
}

/// Watches `resource` and ConfigMaps in namespace `ns`.
pub async fn tree_timeline(client: &Client, resource: &ApiResource, ns: &str) -> Timeline {
    Timeline::start(
        client,
        &[
            (resource.clone(), Some(ns.to_string())),
            (config_maps(), Some(ns.to_string())),
        ],
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// A delete with no propagation policy, as Crossplane v2.0 and v2.1 send one.
pub fn plain(dry_run: bool) -> crate::DeleteSpec {
    crate::DeleteSpec {
        dry_run,
        ..crate::DeleteSpec::default()
    }
}

/// The scene of the `--hold-composed` tests in `s`'s namespace: a timeline
/// of the XRs and ConfigMaps, and a ConfigMap `parent` to compose XRs under
/// (any object can be an owner; Crossplane's is the parent XR).
pub struct Composing {
    pub timeline: Timeline,
    pub maps: Api<ConfigMap>,
    pub xrs: Api<DynamicObject>,
    pub parent: ConfigMap,
}

impl Composing {
    pub async fn new(s: &Scope<'_>, resource: &ApiResource) -> Self {
        let ns = &s.namespace;
        let timeline = tree_timeline(&s.client, resource, ns).await;
        let maps: Api<ConfigMap> = Api::namespaced(s.client.clone(), ns);
        let parent = maps
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "parent"}})).expect("parent"),
            )
            .await
            .expect("create the parent");
        let xrs = Api::namespaced_with(s.client.clone(), ns, resource);
        Self {
            timeline,
            maps,
            xrs,
            parent,
        }
    }

    /// XR `name` with one dependent, composed under `parent` (a controller
    /// owner reference).
    pub async fn composed(&self, s: &Scope<'_>, resource: &ApiResource, name: &str) {
        create_tree(&s.client, resource, &s.namespace, name, 1).await;
        self.xrs
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"ownerReferences": [{
                    "apiVersion": "v1", "kind": "ConfigMap", "name": "parent",
                    "uid": self.parent.uid().expect("uid"), "controller": true,
                }]}})),
            )
            .await
            .expect("make it composed");
    }
}
