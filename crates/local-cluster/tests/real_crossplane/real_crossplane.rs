//! Characterization tests on real Crossplane: core (v2.4.0, or the release
//! `LOCAL_CLUSTER_CROSSPLANE_BIN_DIR` has; `scripts/compat.sh --crossplane`
//! runs every pinned one) with function-patch-and-transform,
//! provider-kubernetes and provider-helm, on the local control plane
//! (`local_cluster::real_crossplane`). Where releases differ, the tests assert
//! each release's behaviour (`Crossplane::version`). Each asserts what the
//! API server saw (its audit log). cascade-guard's design rests on these facts
//! (docs/deletion-semantics.md §4-§6), and the model in
//! `local_cluster::model` claims the same.
//!
//! Where real Crossplane and those two stand, as these tests found it
//! (2026-12-01):
//! - they agree on every fact tested here: an XR's finalizer is dropped at the
//!   first reconcile of a deleting XR and the garbage collector does the
//!   cascade (Background, or Foreground keeping the XR); composed resources'
//!   blocking controller reference, `crossplane.io/composite` label and
//!   `resourceRefs`; a dropped resource deleted by Crossplane with Foreground
//!   and a UID precondition; the Usage webhook's 409 and recorded policy, and
//!   the replay as Crossplane with that policy, without a precondition, about
//!   2 s after the Usage went; a claim's XR deleted with Foreground only for
//!   `compositeDeletePolicy: Foreground`, with no policy at all otherwise;
//!   providers wedging on their finalizer once their cluster is gone;
//! - timing the model leaves out: the garbage collector finds the kinds
//!   Crossplane creates (XR CRDs, Usages) only on its next 30-second discovery
//!   pass, so the first cascade through a new kind can wait that long;
//! - a Usage that is not composed (no `crossplane.io/composite` label) lets go
//!   as soon as its user is gone: the garbage collector deletes it (it has an
//!   owner reference to its user) within milliseconds, and the replay follows
//!   about 2 s later, with no 30-second re-check;
//! - the provider's own words for a wedge, which the model does not produce:
//!   provider-kubernetes `observe failed: cannot get object: failed to get API
//!   group resources: ...`, provider-helm `observe failed: failed to get last
//!   helm release: Kubernetes cluster unreachable: ...`, each as the Synced
//!   condition's message;
//! - a managed resource deleted soon after its external resource was created
//!   keeps its finalizer until crossplane-runtime's creation grace period (30 s
//!   after the create) is over, logging `Waiting for external resource
//!   existence to be confirmed`, though the external resource is long gone:
//!   a fresh tree takes that long to tear down on real providers, where the
//!   model's providers let go at once.

use local_cluster::skip;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PropagationPolicy};
use kube::{Api, Client};
use local_cluster::real_crossplane::modelplane::resource;
use local_cluster::real_crossplane::{
    self, CROSSPLANE_USER, CoreVersion, Crossplane, CrossplaneOptions,
};
use local_cluster::testing::{self, Scope};
use local_cluster::timeline::Timeline;
use local_cluster::{ControlPlane, Options, audit, wait};
use serde_json::{Value, json};
use tokio::sync::OnceCell;

const GROUP: &str = "characterize.local-cluster.dev";
const COMPOSITE_FINALIZER: &str = "composite.apiextensions.crossplane.io";
const COMPOSITE_LABEL: &str = "crossplane.io/composite";
const CASCADE_GUARD_FINALIZER: &str = "cascade-guard.dev/foreground-cascade";
const FOREGROUND: &str = "foregroundDeletion";
/// Crossplane needs a few seconds per step; the garbage collector finds a new
/// kind within 30 s; a Usage is re-checked every 30 s.
const TIMEOUT: Duration = Duration::from_secs(120);

fn xapps() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: "v1".into(),
        api_version: format!("{GROUP}/v1"),
        kind: "XApp".into(),
        plural: "xapps".into(),
    }
}

fn config_maps() -> ApiResource {
    ApiResource::erase::<ConfigMap>(&())
}

fn compositions() -> ApiResource {
    resource(
        "apiextensions.crossplane.io",
        "v1",
        "Composition",
        "compositions",
    )
}

fn xrds() -> ApiResource {
    resource(
        "apiextensions.crossplane.io",
        "v2",
        "CompositeResourceDefinition",
        "compositeresourcedefinitions",
    )
}

struct Stack {
    cp: &'static ControlPlane,
    // Kept for its processes' lifetime: they stop when it is dropped.
    crossplane: Crossplane,
}

async fn stack() -> &'static Stack {
    static STACK: OnceCell<Stack> = OnceCell::const_new();
    STACK
        .get_or_init(|| async {
            let cp = testing::shared(Options::default).await;
            let crossplane = match Crossplane::start(cp, CrossplaneOptions::default()).await {
                Ok(x) => x,
                Err(e) => panic!("cannot start Crossplane: {e}"),
            };
            eprintln!("real Crossplane started in {:?}", crossplane.started_in());
            let client = cp.admin().await.expect("admin client");
            if crossplane.version().major >= 2 {
                install_xrd(&client).await;
            }
            Stack { cp, crossplane }
        })
        .await
}

/// v2 (namespaced) XRDs are new in Crossplane v2: on v1 a test of them has
/// nothing to run, and reports itself skipped (the legacy claim's test has
/// v1's cluster-scoped XRs).
fn not_on_v1(stack: &Stack, what: &str) -> bool {
    let version = stack.crossplane.version();
    let v1 = version.major < 2;
    if v1 {
        skip::skipped(&format!("Crossplane {version} has no {what}"));
    }
    v1
}

/// A v2 (namespaced) XRD whose XRs pick their Composition by name.
async fn install_xrd(client: &Client) {
    let xrd = json!({
        "apiVersion": "apiextensions.crossplane.io/v2",
        "kind": "CompositeResourceDefinition",
        "metadata": {"name": format!("xapps.{GROUP}")},
        "spec": {
            "group": GROUP,
            "names": {"kind": "XApp", "plural": "xapps"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "referenceable": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "note": {"type": "string"},
                    }},
                }}},
            }],
        },
    });
    apply(client, &xrds(), None, &xrd).await;
    wait_for_generated_crd(client, &format!("xapps.{GROUP}")).await;
}

/// Waits until Crossplane has created the CRD `name` for an XRD and it is
/// established.
async fn wait_for_generated_crd(client: &Client, name: &str) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let found = wait::until_lasting(TIMEOUT, || async {
        crds.get_opt(name).await.ok().flatten()
    })
    .await;
    assert!(found.is_some(), "Crossplane never created the CRD {name}");
    wait::crd_established(client, name, TIMEOUT)
        .await
        .expect("CRD established");
}

async fn apply(client: &Client, ar: &ApiResource, namespace: Option<&str>, object: &Value) {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .expect("object has a name")
        .to_string();
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    };
    api.patch(
        &name,
        &PatchParams::apply("characterization").force(),
        &Patch::Apply(object),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {} {name}: {e}", ar.kind));
}

/// A Composition that composes one ConfigMap per name through
/// function-patch-and-transform, each ready as soon as it exists.
fn composition(name: &str, parts: &[&str]) -> Value {
    let resources: Vec<Value> = parts
        .iter()
        .map(|part| {
            json!({
                "name": part,
                "base": {"apiVersion": "v1", "kind": "ConfigMap", "data": {"part": part}},
                "readinessChecks": [{"type": "None"}],
            })
        })
        .collect();
    json!({
        "apiVersion": "apiextensions.crossplane.io/v1",
        "kind": "Composition",
        "metadata": {"name": name},
        "spec": {
            "compositeTypeRef": {"apiVersion": format!("{GROUP}/v1"), "kind": "XApp"},
            "mode": "Pipeline",
            "pipeline": [{
                "step": "patch-and-transform",
                "functionRef": {"name": real_crossplane::FUNCTION_NAME},
                "input": {
                    "apiVersion": "pt.fn.crossplane.io/v1beta1",
                    "kind": "Resources",
                    "resources": resources,
                },
            }],
        },
    })
}

/// One test's tree: its Composition and XR, in the test's namespace.
struct App<'a> {
    s: &'a Scope<'a>,
    xrs: Api<DynamicObject>,
    maps: Api<ConfigMap>,
    composition: String,
    timeline: Timeline,
}

impl<'a> App<'a> {
    async fn new(s: &'a Scope<'a>, parts: &[&str]) -> Self {
        let composition_name = s.namespace.clone();
        apply(
            &s.client,
            &compositions(),
            None,
            &composition(&composition_name, parts),
        )
        .await;
        let timeline = Timeline::start(
            &s.client,
            &[
                (xapps(), Some(s.namespace.clone())),
                (config_maps(), Some(s.namespace.clone())),
            ],
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        Self {
            s,
            xrs: Api::namespaced_with(s.client.clone(), &s.namespace, &xapps()),
            maps: Api::namespaced(s.client.clone(), &s.namespace),
            composition: composition_name,
            timeline,
        }
    }

    async fn set_parts(&self, parts: &[&str]) {
        apply(
            &self.s.client,
            &compositions(),
            None,
            &composition(&self.composition, parts),
        )
        .await;
    }

    /// Creates an XR and waits until it is Ready with `parts` composed.
    async fn xr(&self, name: &str, parts: usize) -> DynamicObject {
        let xr = json!({
            "apiVersion": format!("{GROUP}/v1"),
            "kind": "XApp",
            "metadata": {"name": name, "namespace": self.s.namespace},
            "spec": {"crossplane": {"compositionRef": {"name": self.composition}}},
        });
        apply(&self.s.client, &xapps(), Some(&self.s.namespace), &xr).await;
        self.wait_composed(name, parts).await
    }

    /// Waits until the XR is Ready and lists `parts` composed resources.
    async fn wait_composed(&self, name: &str, parts: usize) -> DynamicObject {
        let ready = wait::until_lasting(TIMEOUT, || async {
            let xr = self.xrs.get_opt(name).await.ok().flatten()?;
            (is_ready(&xr) && resource_refs(&xr).len() == parts).then_some(xr)
        })
        .await;
        match ready {
            Some(xr) => xr,
            None => panic!(
                "XApp/{name} never became Ready with {parts} composed resources: {:?}",
                self.xrs.get_opt(name).await.ok().flatten().map(|x| x.data)
            ),
        }
    }

    /// The etcd revision `kind/name` left the API at ([`Timeline::revision_of`]).
    async fn wait_gone(&self, kind: &str, name: &str) -> u64 {
        match self.timeline.wait_gone(kind, name, TIMEOUT).await {
            Some(e) => self.timeline.revision_of(&e),
            None => panic!(
                "{kind}/{name} never left the API; timeline:\n{}",
                self.timeline.describe()
            ),
        }
    }
}

fn is_ready(object: &DynamicObject) -> bool {
    object
        .data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}

/// `spec.crossplane.resourceRefs`: (kind, name) of each composed resource.
fn resource_refs(xr: &DynamicObject) -> Vec<(String, String)> {
    xr.data
        .pointer("/spec/crossplane/resourceRefs")
        .and_then(Value::as_array)
        .map(|refs| {
            refs.iter()
                .filter_map(|r| {
                    Some((
                        r.get("kind")?.as_str()?.to_string(),
                        r.get("name")?.as_str()?.to_string(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn composed_names(xr: &DynamicObject) -> Vec<String> {
    resource_refs(xr).into_iter().map(|(_, n)| n).collect()
}

fn delete_with(policy: PropagationPolicy) -> DeleteParams {
    DeleteParams {
        propagation_policy: Some(policy),
        ..DeleteParams::default()
    }
}

/// The first complete DELETE of `resource` `namespace/name` that `matches`.
async fn audited_delete(
    cp: &ControlPlane,
    resource: &str,
    namespace: &str,
    name: &str,
    matches: impl Fn(&audit::Event) -> bool,
) -> audit::Event {
    let path = cp.audit_log_path();
    let found = wait::until_lasting(TIMEOUT, || async {
        audit::read(&path)
            .expect("the API server's audit log")
            .into_iter()
            .find(|e| e.verb == "delete" && e.is_about(resource, namespace, name) && matches(e))
    })
    .await;
    found.unwrap_or_else(|| {
        let seen: Vec<String> = audit::read(&path)
            .expect("the API server's audit log")
            .into_iter()
            .filter(|e| e.is_about(resource, namespace, name))
            .map(|e| {
                format!(
                    "{} by {} policy {:?} code {:?}",
                    e.verb,
                    e.effective_username(),
                    e.propagation_policy(),
                    e.response_code()
                )
            })
            .collect();
        panic!("no matching delete of {resource} {namespace}/{name}; seen: {seen:#?}")
    })
}

#[tokio::test]
async fn a_background_delete_removes_the_xr_at_once_and_the_collector_deletes_its_resources() {
    let stack = stack().await;
    if not_on_v1(stack, "v2 XRDs") {
        return;
    }
    let s = Scope::new(stack.cp, "xp-background").await;
    let app = App::new(&s, &["first", "second"]).await;
    let xr = app.xr("app", 2).await;
    assert!(
        xr.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == COMPOSITE_FINALIZER),
        "Crossplane holds a live XR with its finalizer: {:?}",
        xr.metadata.finalizers
    );
    let composed = composed_names(&xr);

    app.xrs
        .delete("app", &delete_with(PropagationPolicy::Background))
        .await
        .expect("background delete");
    let gone = app.wait_gone("XApp", "app").await;
    for name in &composed {
        let cm = app.wait_gone("ConfigMap", name).await;
        assert!(
            cm > gone,
            "ConfigMap/{name} left before its XR:\n{}",
            app.timeline.describe()
        );
        let event = audited_delete(stack.cp, "configmaps", &s.namespace, name, |_| true).await;
        assert_eq!(
            event.effective_username(),
            stack.cp.garbage_collector_username(),
            "the garbage collector, not Crossplane, deletes composed resources"
        );
        assert_eq!(event.propagation_policy(), Some("Background"));
    }
}

#[tokio::test]
async fn a_foreground_delete_keeps_the_xr_until_its_composed_resources_are_gone() {
    let stack = stack().await;
    if not_on_v1(stack, "v2 XRDs") {
        return;
    }
    let s = Scope::new(stack.cp, "xp-foreground").await;
    let app = App::new(&s, &["first", "second"]).await;
    let xr = app.xr("app", 2).await;
    let composed = composed_names(&xr);

    app.xrs
        .delete("app", &delete_with(PropagationPolicy::Foreground))
        .await
        .expect("foreground delete");
    let gone = app.wait_gone("XApp", "app").await;
    for name in &composed {
        let cm = app.wait_gone("ConfigMap", name).await;
        assert!(
            cm < gone,
            "the XR left before ConfigMap/{name}:\n{}",
            app.timeline.describe()
        );
        let event = audited_delete(stack.cp, "configmaps", &s.namespace, name, |_| true).await;
        assert_eq!(
            event.effective_username(),
            stack.cp.garbage_collector_username()
        );
    }
    // Crossplane let go of its own finalizer at once; only the garbage
    // collector's held the XR.
    assert!(
        app.timeline.seen_with_finalizer("XApp", "app", FOREGROUND),
        "never seen held by {FOREGROUND}:\n{}",
        app.timeline.describe()
    );
    let xr_delete = audited_delete(stack.cp, "xapps", &s.namespace, "app", |_| true).await;
    assert_eq!(xr_delete.propagation_policy(), Some("Foreground"));
}

#[tokio::test]
async fn composed_resources_carry_a_blocking_controller_reference_and_the_composite_label() {
    let stack = stack().await;
    if not_on_v1(stack, "v2 XRDs") {
        return;
    }
    let s = Scope::new(stack.cp, "xp-references").await;
    let app = App::new(&s, &["first", "second"]).await;
    let xr = app.xr("app", 2).await;
    let refs = resource_refs(&xr);
    assert_eq!(refs.len(), 2, "{refs:?}");
    for (kind, name) in &refs {
        assert_eq!(kind, "ConfigMap");
        let cm = app.maps.get(name).await.expect("composed ConfigMap exists");
        let owners = cm.metadata.owner_references.clone().unwrap_or_default();
        assert_eq!(owners.len(), 1, "{owners:?}");
        let owner = &owners[0];
        assert_eq!(owner.kind, "XApp");
        assert_eq!(owner.name, "app");
        assert_eq!(Some(&owner.uid), xr.metadata.uid.as_ref());
        assert_eq!(owner.controller, Some(true));
        assert_eq!(owner.block_owner_deletion, Some(true));
        let labels = cm.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get(COMPOSITE_LABEL).map(String::as_str), Some("app"));
    }
    // The XR carries the label too, with its own name.
    let labels = xr.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get(COMPOSITE_LABEL).map(String::as_str), Some("app"));
    app.xrs
        .delete("app", &delete_with(PropagationPolicy::Foreground))
        .await
        .expect("clean up");
}

#[tokio::test]
async fn a_resource_dropped_from_the_composition_is_deleted_by_crossplane() {
    let stack = stack().await;
    if not_on_v1(stack, "v2 XRDs") {
        return;
    }
    let s = Scope::new(stack.cp, "xp-dropped").await;
    let app = App::new(&s, &["kept", "dropped"]).await;
    let xr = app.xr("app", 2).await;
    let by_part = |part: &str| {
        let maps = app.maps.clone();
        let names = composed_names(&xr);
        let part = part.to_string();
        async move {
            for name in names {
                let cm = maps.get(&name).await.expect("composed ConfigMap");
                if cm.data.unwrap_or_default().get("part") == Some(&part) {
                    return name;
                }
            }
            panic!("no composed ConfigMap for {part}")
        }
    };
    let dropped = by_part("dropped").await;
    let kept = by_part("kept").await;

    app.set_parts(&["kept"]).await;
    app.wait_gone("ConfigMap", &dropped).await;
    let event = audited_delete(stack.cp, "configmaps", &s.namespace, &dropped, |_| true).await;
    assert_eq!(event.effective_username(), CROSSPLANE_USER);
    // Foreground with a UID precondition since v2.2.0; v1 to v2.1 send
    // neither, so a dropped nested XR cascades in the background there.
    let version = stack.crossplane.version();
    let since_v2_2 = version >= CoreVersion::new(2, 2, 0);
    assert_eq!(
        event.propagation_policy(),
        since_v2_2.then_some("Foreground"),
        "Crossplane {version}'s delete of a dropped resource"
    );
    assert_eq!(
        event
            .request_object
            .as_ref()
            .and_then(|o| o.pointer("/preconditions/uid"))
            .is_some(),
        since_v2_2,
        "Crossplane {version}'s delete carries a UID precondition (since v2.2.0): {:?}",
        event.request_object
    );
    let xr = app.wait_composed("app", 1).await;
    assert_eq!(composed_names(&xr), vec![kept.clone()]);
    assert!(app.maps.get_opt(&kept).await.expect("get").is_some());
    app.xrs
        .delete("app", &delete_with(PropagationPolicy::Foreground))
        .await
        .expect("clean up");
}

/// What a Usage test protects, and with which Usage: in v2, ConfigMaps and a
/// namespaced `protection.crossplane.io` Usage; in v1, whose Usage
/// (`apiextensions.crossplane.io`) is cluster-scoped and names what it
/// protects by name only, ClusterRoles.
struct UsageKinds {
    usage: ApiResource,
    used: ApiResource,
    /// The namespace of the Usage and of what it protects, if namespaced.
    namespace: Option<String>,
    /// Names made unique per test, for cluster-scoped objects.
    prefix: String,
}

impl UsageKinds {
    fn new(stack: &Stack, s: &Scope) -> Self {
        if stack.crossplane.version().major >= 2 {
            Self {
                usage: resource("protection.crossplane.io", "v1beta1", "Usage", "usages"),
                used: config_maps(),
                namespace: Some(s.namespace.clone()),
                prefix: String::new(),
            }
        } else {
            Self {
                usage: resource("apiextensions.crossplane.io", "v1beta1", "Usage", "usages"),
                used: resource(
                    "rbac.authorization.k8s.io",
                    "v1",
                    "ClusterRole",
                    "clusterroles",
                ),
                namespace: None,
                prefix: format!("{}-", s.namespace),
            }
        }
    }

    fn api(&self, client: &Client, resource: &ApiResource) -> Api<DynamicObject> {
        match &self.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
            None => Api::all_with(client.clone(), resource),
        }
    }

    fn name(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }
}

#[tokio::test]
async fn the_usage_webhook_refuses_a_used_resource_and_crossplane_replays_the_delete() {
    let stack = stack().await;
    let s = Scope::new(stack.cp, "xp-usage").await;
    let kinds = UsageKinds::new(stack, &s);
    let objects = kinds.api(&s.client, &kinds.used);
    let ns = kinds.namespace.as_deref();
    let (used, user, usage_name) = (
        kinds.name("used"),
        kinds.name("user"),
        kinds.name("used-by-user"),
    );
    for name in [&used, &user] {
        let object = json!({"apiVersion": kinds.used.api_version, "kind": kinds.used.kind, "metadata": {"name": name}});
        apply(&s.client, &kinds.used, ns, &object).await;
    }
    let reference = |name: &str| json!({"apiVersion": kinds.used.api_version, "kind": kinds.used.kind, "resourceRef": {"name": name}});
    let usage = json!({
        "apiVersion": kinds.usage.api_version,
        "kind": "Usage",
        "metadata": {"name": usage_name},
        "spec": {"of": reference(&used), "by": reference(&user), "replayDeletion": true},
    });
    apply(&s.client, &kinds.usage, ns, &usage).await;
    let labelled = wait::until_lasting(TIMEOUT, || async {
        let object = objects.get(&used).await.ok()?;
        let labels = object.metadata.labels.unwrap_or_default();
        (labels.get("crossplane.io/in-use").map(String::as_str) == Some("true")).then_some(())
    })
    .await;
    assert!(
        labelled.is_some(),
        "the Usage never marked its resource in use"
    );

    match objects
        .delete(&used, &delete_with(PropagationPolicy::Foreground))
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 409, "{status:?}");
            // v1 says "1 Usage(s)", v2 "1 usage(s)".
            let message = status.message.to_lowercase();
            assert!(
                message.contains("in-use by 1 usage")
                    && message.contains(
                        &format!("by resource {}/{user}", kinds.used.kind).to_lowercase()
                    ),
                "{}",
                status.message
            );
            eprintln!("the Usage webhook said: {}", status.message);
        }
        other => panic!("expected the webhook's 409, got {other:?}"),
    }
    let object = objects.get(&used).await.expect("still there");
    let annotations = object.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations
            .get("usage.crossplane.io/deletion-attempt-with-policy")
            .map(String::as_str),
        Some("Foreground"),
        "the webhook records the refused attempt's policy"
    );
    let in_namespace = ns.unwrap_or_default();
    let refused = audited_delete(stack.cp, &kinds.used.plural, in_namespace, &used, |e| {
        e.response_code() == Some(409)
    })
    .await;
    assert_eq!(refused.effective_username(), "admin");

    let user_deleted = Instant::now();
    objects
        .delete(&user, &delete_with(PropagationPolicy::Background))
        .await
        .expect("delete the user");
    let gone = wait::until_lasting(TIMEOUT, || async {
        objects.get_opt(&used).await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(gone.is_some(), "Crossplane never replayed the delete");
    eprintln!(
        "replayed delete: the used resource was gone {:?} after the user's delete",
        user_deleted.elapsed()
    );
    let replay = audited_delete(stack.cp, &kinds.used.plural, in_namespace, &used, |e| {
        e.response_code() == Some(200)
    })
    .await;
    assert_eq!(replay.effective_username(), CROSSPLANE_USER);
    assert_eq!(replay.propagation_policy(), Some("Foreground"));
    // The garbage collector removed the Usage once its user was gone (the
    // Usage has an owner reference to it).
    let usage_delete =
        audited_delete(stack.cp, "usages", in_namespace, &usage_name, |_| true).await;
    assert_eq!(
        usage_delete.effective_username(),
        stack.cp.garbage_collector_username()
    );
}

#[tokio::test]
async fn crossplane_keeps_a_finalizer_it_does_not_own_through_reconciles_and_composition_changes() {
    let stack = stack().await;
    if not_on_v1(stack, "v2 XRDs") {
        return;
    }
    let s = Scope::new(stack.cp, "xp-foreign-finalizer").await;
    let app = App::new(&s, &["first"]).await;
    app.xr("app", 1).await;
    app.xrs
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([
                    {"op": "add", "path": "/metadata/finalizers/-", "value": CASCADE_GUARD_FINALIZER}
                ]))
                .expect("JSON patch"),
            ),
        )
        .await
        .expect("add cascade-guard's finalizer");

    // A change of the XR's spec and of its Composition: two reconciles that
    // rewrite the XR (its resourceRefs, its status).
    app.xrs
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"note": "changed"}})),
        )
        .await
        .expect("change the XR");
    app.set_parts(&["first", "second"]).await;
    let xr = app.wait_composed("app", 2).await;
    let finalizers = xr.metadata.finalizers.clone().unwrap_or_default();
    assert!(
        finalizers.iter().any(|f| f == CASCADE_GUARD_FINALIZER)
            && finalizers.iter().any(|f| f == COMPOSITE_FINALIZER),
        "{finalizers:?}"
    );

    // Deleting it: Crossplane drops its own finalizer, and only its own.
    app.xrs
        .delete("app", &delete_with(PropagationPolicy::Background))
        .await
        .expect("delete");
    let held = wait::until(TIMEOUT, || async {
        let xr = app.xrs.get_opt("app").await.ok().flatten()?;
        let f = xr.metadata.finalizers.unwrap_or_default();
        (f == vec![CASCADE_GUARD_FINALIZER.to_string()]).then_some(())
    })
    .await;
    assert!(
        held.is_some(),
        "expected only cascade-guard's finalizer left on the deleting XR: {:?}",
        app.xrs
            .get_opt("app")
            .await
            .ok()
            .flatten()
            .map(|x| x.metadata.finalizers)
    );
    app.xrs
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("let go");
    app.wait_gone("XApp", "app").await;
}

const LEGACY_GROUP: &str = "legacy.characterize.local-cluster.dev";

fn legacy_xrs() -> ApiResource {
    resource(LEGACY_GROUP, "v1", "XLegacyApp", "xlegacyapps")
}

fn legacy_claims() -> ApiResource {
    resource(LEGACY_GROUP, "v1", "LegacyApp", "legacyapps")
}

/// A legacy (`apiextensions.crossplane.io/v1`) XRD, cluster-scoped XRs with a
/// namespaced claim, and a Composition composing one ConfigMap in
/// `namespace` (on v1 a ClusterRole). Installed once; each use has its own
/// namespace for claims.
async fn install_legacy_xrd(client: &Client, namespace: &str, version: CoreVersion) {
    // v1's XR CRDs have no `namespace` in `spec.resourceRefs`, so a
    // cluster-scoped XR composes only cluster-scoped resources there (v1.20.0
    // refuses its own update: `.spec.resourceRefs[0].namespace: field not
    // declared in schema`): a ClusterRole instead of the ConfigMap.
    let base = if version.major >= 2 {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": namespace}, "data": {"part": "config"}})
    } else {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "rules": []})
    };
    let xrd = json!({
        "apiVersion": "apiextensions.crossplane.io/v1",
        "kind": "CompositeResourceDefinition",
        "metadata": {"name": format!("xlegacyapps.{LEGACY_GROUP}")},
        "spec": {
            "group": LEGACY_GROUP,
            "names": {"kind": "XLegacyApp", "plural": "xlegacyapps"},
            "claimNames": {"kind": "LegacyApp", "plural": "legacyapps"},
            "versions": [{
                "name": "v1", "served": true, "referenceable": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"note": {"type": "string"}}},
                }}},
            }],
        },
    });
    let xrds_v1 = resource(
        "apiextensions.crossplane.io",
        "v1",
        "CompositeResourceDefinition",
        "compositeresourcedefinitions",
    );
    apply(client, &xrds_v1, None, &xrd).await;
    for crd in [
        format!("xlegacyapps.{LEGACY_GROUP}"),
        format!("legacyapps.{LEGACY_GROUP}"),
    ] {
        wait_for_generated_crd(client, &crd).await;
    }
    let composition = json!({
        "apiVersion": "apiextensions.crossplane.io/v1",
        "kind": "Composition",
        "metadata": {"name": format!("legacy-{namespace}")},
        "spec": {
            "compositeTypeRef": {"apiVersion": format!("{LEGACY_GROUP}/v1"), "kind": "XLegacyApp"},
            "mode": "Pipeline",
            "pipeline": [{
                "step": "patch-and-transform",
                "functionRef": {"name": real_crossplane::FUNCTION_NAME},
                "input": {
                    "apiVersion": "pt.fn.crossplane.io/v1beta1",
                    "kind": "Resources",
                    "resources": [{
                        "name": "config",
                        "base": base,
                        "readinessChecks": [{"type": "None"}],
                    }],
                },
            }],
        },
    });
    apply(client, &compositions(), None, &composition).await;
}

#[tokio::test]
async fn deleting_a_legacy_claim_deletes_its_xr_with_the_claims_composite_delete_policy() {
    let stack = stack().await;
    let s = Scope::new(stack.cp, "xp-legacy-claim").await;
    install_legacy_xrd(&s.client, &s.namespace, stack.crossplane.version()).await;
    let claims: Api<DynamicObject> =
        Api::namespaced_with(s.client.clone(), &s.namespace, &legacy_claims());
    let timeline = Timeline::start(
        &s.client,
        &[
            (legacy_claims(), Some(s.namespace.clone())),
            (legacy_xrs(), None),
        ],
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));

    for (policy, sent) in [("Background", None), ("Foreground", Some("Foreground"))] {
        let name = policy.to_lowercase();
        let claim = json!({
            "apiVersion": format!("{LEGACY_GROUP}/v1"),
            "kind": "LegacyApp",
            "metadata": {"name": name, "namespace": s.namespace},
            "spec": {
                "compositeDeletePolicy": policy,
                "compositionRef": {"name": format!("legacy-{}", s.namespace)},
            },
        });
        apply(&s.client, &legacy_claims(), Some(&s.namespace), &claim).await;
        let xr_name = wait::until_lasting(TIMEOUT, || async {
            let claim = claims.get_opt(&name).await.ok().flatten()?;
            if !is_ready(&claim) {
                return None;
            }
            claim
                .data
                .pointer("/spec/resourceRef/name")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .await;
        let Some(xr_name) = xr_name else {
            // What Crossplane says about them, for a release that differs.
            let claim = claims.get_opt(&name).await.ok().flatten();
            let xr_name = claim
                .as_ref()
                .and_then(|c| c.data.pointer("/spec/resourceRef/name"));
            let xrs: Api<DynamicObject> = Api::all_with(s.client.clone(), &legacy_xrs());
            let xr = match xr_name.and_then(Value::as_str) {
                Some(xr) => xrs.get_opt(xr).await.ok().flatten(),
                None => None,
            };
            let conditions = |o: Option<&DynamicObject>| {
                o.and_then(|o| o.data.pointer("/status/conditions"))
                    .cloned()
            };
            panic!(
                "claim {name} never became Ready with an XR; claim: {:?}; XR: {:?}",
                conditions(claim.as_ref()),
                conditions(xr.as_ref())
            )
        };

        claims
            .delete(&name, &delete_with(PropagationPolicy::Background))
            .await
            .expect("delete the claim");
        let claim_gone = timeline
            .wait_gone("LegacyApp", &name, TIMEOUT)
            .await
            .unwrap_or_else(|| panic!("claim {name} never left:\n{}", timeline.describe()));
        let xr_gone = timeline
            .wait_gone("XLegacyApp", &xr_name, TIMEOUT)
            .await
            .unwrap_or_else(|| panic!("XR {xr_name} never left:\n{}", timeline.describe()));
        let event = audited_delete(stack.cp, "xlegacyapps", "", &xr_name, |_| true).await;
        assert_eq!(event.effective_username(), CROSSPLANE_USER, "{policy}");
        assert_eq!(event.propagation_policy(), sent, "{policy}");
        eprintln!(
            "compositeDeletePolicy {policy}: Crossplane sent {:?} for the XR; claim gone at revision {}, XR gone at revision {}",
            event.propagation_policy(),
            timeline.revision_of(&claim_gone),
            timeline.revision_of(&xr_gone)
        );
        if policy == "Foreground" {
            assert!(
                timeline.revision_of(&claim_gone) > timeline.revision_of(&xr_gone),
                "with Foreground the claim waits for its XR:\n{}",
                timeline.describe()
            );
        }
    }
}

fn cloud_clusters() -> ApiResource {
    real_crossplane::cloud::clusters()
}

fn objects() -> ApiResource {
    resource(
        "kubernetes.m.crossplane.io",
        "v1alpha1",
        "Object",
        "objects",
    )
}

fn releases() -> ApiResource {
    resource("helm.m.crossplane.io", "v1beta1", "Release", "releases")
}

const MANAGED_FINALIZER: &str = "finalizer.managedresource.crossplane.io";

/// A chart of one ConfigMap, as a .tgz made with tar.
fn chart(dir: &std::path::Path) -> Vec<u8> {
    let root = dir.join("chart-src");
    let templates = root.join("probe/templates");
    std::fs::create_dir_all(&templates).expect("chart dir");
    std::fs::write(
        root.join("probe/Chart.yaml"),
        "apiVersion: v2\nname: probe\nversion: 0.1.0\n",
    )
    .expect("Chart.yaml");
    std::fs::write(
        templates.join("configmap.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-probe\ndata:\n  chart: probe\n",
    )
    .expect("template");
    let tgz = dir.join("probe-0.1.0.tgz");
    let status = std::process::Command::new("tar")
        .arg("-czf")
        .arg(&tgz)
        .arg("-C")
        .arg(&root)
        .arg("probe")
        .status()
        .expect("run tar");
    assert!(status.success(), "tar failed: {status}");
    std::fs::read(&tgz).expect("read chart")
}

/// A cloud Cluster, its ProviderConfigs, and an Object and a Release on it.
struct Target<'a> {
    s: &'a Scope<'a>,
    name: String,
}

impl<'a> Target<'a> {
    async fn create(s: &'a Scope<'a>, name: &str, chart_url: &str) -> Self {
        let secret = format!("{name}-conn");
        let cluster = json!({
            "apiVersion": format!("{}/{}", real_crossplane::cloud::GROUP, real_crossplane::cloud::VERSION),
            "kind": "Cluster",
            "metadata": {"name": name},
            "spec": {"deletionSeconds": 2, "writeConnectionSecretToRef": {"name": secret}},
        });
        apply(&s.client, &cloud_clusters(), Some(&s.namespace), &cluster).await;
        let credentials = json!({
            "source": "Secret",
            "secretRef": {"namespace": s.namespace, "name": secret, "key": real_crossplane::cloud::KUBECONFIG_KEY},
        });
        for (group, version) in [
            ("kubernetes.m.crossplane.io", "v1alpha1"),
            ("helm.m.crossplane.io", "v1beta1"),
        ] {
            let pc = json!({
                "apiVersion": format!("{group}/{version}"),
                "kind": "ProviderConfig",
                "metadata": {"name": name},
                "spec": {"credentials": credentials},
            });
            let ar = resource(group, version, "ProviderConfig", "providerconfigs");
            apply(&s.client, &ar, Some(&s.namespace), &pc).await;
        }
        let object = json!({
            "apiVersion": "kubernetes.m.crossplane.io/v1alpha1",
            "kind": "Object",
            "metadata": {"name": name},
            "spec": {
                "providerConfigRef": {"kind": "ProviderConfig", "name": name},
                "forProvider": {"manifest": {
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": format!("{name}-object"), "namespace": "default"},
                    "data": {"from": "provider-kubernetes"},
                }},
            },
        });
        apply(&s.client, &objects(), Some(&s.namespace), &object).await;
        let release = json!({
            "apiVersion": "helm.m.crossplane.io/v1beta1",
            "kind": "Release",
            "metadata": {"name": name},
            "spec": {
                "providerConfigRef": {"kind": "ProviderConfig", "name": name},
                "forProvider": {
                    "chart": {"name": "probe", "version": "0.1.0", "url": chart_url},
                    "namespace": "default",
                },
            },
        });
        apply(&s.client, &releases(), Some(&s.namespace), &release).await;
        let target = Self {
            s,
            name: name.to_string(),
        };
        for ar in [cloud_clusters(), objects(), releases()] {
            target.wait_ready(&ar).await;
        }
        target
    }

    fn api(&self, ar: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.s.client.clone(), &self.s.namespace, ar)
    }

    async fn wait_ready(&self, ar: &ApiResource) {
        let api = self.api(ar);
        let ready = wait::until_lasting(TIMEOUT, || async {
            let o = api.get_opt(&self.name).await.ok().flatten()?;
            is_ready(&o).then_some(())
        })
        .await;
        assert!(
            ready.is_some(),
            "{}/{} never became Ready: {:?}",
            ar.kind,
            self.name,
            api.get_opt(&self.name).await.ok().flatten().map(|o| o.data)
        );
    }

    /// A client for the cloud cluster, from the connection Secret.
    async fn cloud_client(&self) -> Client {
        let secrets: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(self.s.client.clone(), &self.s.namespace);
        let secret = secrets
            .get(&format!("{}-conn", self.name))
            .await
            .expect("connection Secret");
        let bytes = secret
            .data
            .unwrap_or_default()
            .get(real_crossplane::cloud::KUBECONFIG_KEY)
            .expect("kubeconfig key")
            .0
            .clone();
        let kubeconfig: kube::config::Kubeconfig =
            serde_yaml::from_slice(&bytes).expect("a kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("config");
        Client::try_from(config).expect("client")
    }

    async fn delete(&self, ar: &ApiResource) {
        self.api(ar)
            .delete(&self.name, &delete_with(PropagationPolicy::Background))
            .await
            .unwrap_or_else(|e| panic!("delete {} {}: {e}", ar.kind, self.name));
    }

    async fn wait_gone(&self, ar: &ApiResource) {
        let api = self.api(ar);
        let gone = wait::until_lasting(TIMEOUT, || async {
            api.get_opt(&self.name).await.ok()?.is_none().then_some(())
        })
        .await;
        assert!(
            gone.is_some(),
            "{}/{} never left: {:?}",
            ar.kind,
            self.name,
            api.get_opt(&self.name)
                .await
                .ok()
                .flatten()
                .map(|o| (o.metadata.finalizers, o.data))
        );
    }
}

/// The Synced=False message a provider reports on a resource, once it has.
fn sync_failure(object: &DynamicObject) -> Option<String> {
    object
        .data
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| {
            c.get("type").and_then(Value::as_str) == Some("Synced")
                && c.get("status").and_then(Value::as_str) == Some("False")
        })
        .and_then(|c| c.get("message").and_then(Value::as_str))
        .map(str::to_string)
}

#[tokio::test]
async fn provider_resources_uninstall_while_their_cluster_lives_and_wedge_once_it_is_gone() {
    let stack = stack().await;
    let s = Scope::new(stack.cp, "xp-providers").await;
    let dir = stack.cp.dir().join(&s.namespace);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let chart_url = stack
        .crossplane
        .serve("probe-0.1.0.tgz", chart(&dir))
        .expect("serve the chart");

    let started = Instant::now();
    let step = |what: &str| eprintln!("providers test: {what} at {:?}", started.elapsed());
    // Both trees at once: each waits mostly on its own cloud cluster.
    let (alive, doomed) = tokio::join!(
        Target::create(&s, "alive", &chart_url),
        Target::create(&s, "doomed", &chart_url)
    );

    step("both trees ready");
    // With the cluster alive: both uninstall from it and go.
    let cloud = alive.cloud_client().await;
    let cloud_maps: Api<ConfigMap> = Api::namespaced(cloud.clone(), "default");
    for name in ["alive-object", "alive-probe"] {
        assert!(
            cloud_maps.get_opt(name).await.expect("get").is_some(),
            "ConfigMap {name} was not created in the cloud cluster"
        );
    }
    alive.delete(&objects()).await;
    alive.delete(&releases()).await;
    alive.wait_gone(&objects()).await;
    step("the live cluster's Object gone");
    alive.wait_gone(&releases()).await;
    for name in ["alive-object", "alive-probe"] {
        assert!(
            cloud_maps.get_opt(name).await.expect("get").is_none(),
            "ConfigMap {name} was left in the cloud cluster"
        );
    }

    step("the live cluster's resources gone");
    // With the cluster deleted first: both wedge on their finalizer.
    doomed.delete(&cloud_clusters()).await;
    doomed.wait_gone(&cloud_clusters()).await;
    step("the doomed cluster gone");
    doomed.delete(&objects()).await;
    doomed.delete(&releases()).await;
    for ar in [objects(), releases()] {
        let api = doomed.api(&ar);
        let failure = wait::until_lasting(TIMEOUT, || async {
            let o = api.get_opt("doomed").await.ok().flatten()?;
            // Only once the delete has reached the provider.
            o.metadata.deletion_timestamp.as_ref()?;
            sync_failure(&o)
        })
        .await;
        let Some(message) = failure else {
            panic!("{} reported no failure to delete", ar.kind);
        };
        eprintln!("{} wedged: {message}", ar.kind);
        let o = api.get("doomed").await.expect("still there");
        assert!(
            o.metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == MANAGED_FINALIZER),
            "{}: {:?}",
            ar.kind,
            o.metadata.finalizers
        );
        // Break glass, so that the namespace can go.
        api.patch(
            "doomed",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("remove the finalizer");
    }
    step("both wedged");
    // Not waited for: stopping a control plane takes seconds, and the test
    // binary's exit stops it anyway.
    alive.delete(&cloud_clusters()).await;
}
