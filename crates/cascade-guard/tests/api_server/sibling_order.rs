//! Sibling order on the real control plane: in the tree of a Refuse or
//! Convert kind, an object a sibling needs (here through the
//! `cascade-guard.dev/needs` annotation) is held until that sibling is gone,
//! whatever deletes the tree; the order is asserted from etcd revisions
//! (the watch events' resourceVersions), not from timing. Without holding
//! (an Off kind), the garbage collector deletes both siblings at once: the
//! hazard, shown.

use std::time::Duration;

use cascade_guard_testkit::tree::{
    Provider, assert_needed_after, config_maps, create_tree, gone_revision, terminating_revision,
    tree_timeline, wait_held,
};
use cascade_guard_testkit::*;
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
    PropagationPolicy,
};
use kube::{Api, Client, ResourceExt};
use local_cluster::testing::Scope;
use local_cluster::timeline::Timeline;
use local_cluster::wait;
use serde_json::{Value, json};

/// The hold policy is one object for the whole control plane: the test that
/// weakens it has it to itself (every other test here relies on it; seen in
/// CI, where a foreground cascade met the weakened policy and deleted a held
/// object early).
static HOLD_POLICY: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// XR `tree` composing ConfigMaps `tree-0` (which needs `tree-1`, by the
/// annotation) and `tree-1`, each held by the test provider's finalizer.
async fn needy_tree(client: &Client, resource: &ApiResource, ns: &str) {
    create_tree(client, resource, ns, "tree", 2).await;
    let maps: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &config_maps());
    maps.patch(
        "tree-0",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"annotations": {"cascade-guard.dev/needs": "ConfigMap/tree-1"}}}),
        ),
    )
    .await
    .expect("annotate tree-0");
}

async fn wait_sibling_hold(client: &Client, ns: &str, name: &str) {
    let maps: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &config_maps());
    let held = wait_sibling_held(
        client,
        CONTROLLER_HOME,
        &config_maps(),
        Some(ns),
        name,
        Duration::from_secs(60),
    )
    .await;
    assert!(held, "cascade-guard never held {ns}/{name}");
    // The hold policy is in effect once a dry-run delete is refused (the API
    // server loads a new policy a moment after it is written).
    let dry_run = DeleteParams {
        dry_run: true,
        ..DeleteParams::default()
    };
    let refused = wait::until(Duration::from_secs(60), || async {
        maps.delete(name, &dry_run).await.err().map(|_| ())
    })
    .await;
    assert!(
        refused.is_some(),
        "the hold policy never refused a delete of {ns}/{name}"
    );
}

/// `tree-1` started deleting only after `tree-0` was gone, by etcd revision.
fn assert_in_order(timeline: &Timeline, what: &str) {
    assert_needed_after(timeline, "tree-0", "tree-1", what);
}

async fn delete_tree(
    client: &Client,
    resource: &ApiResource,
    ns: &str,
    policy: Option<PropagationPolicy>,
) {
    let xrs: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, resource);
    xrs.delete(
        "tree",
        &DeleteParams {
            propagation_policy: policy,
            ..DeleteParams::default()
        },
    )
    .await
    .expect("delete the tree");
}

/// What starts the teardown.
enum Teardown {
    /// A delete of the tree with this policy.
    Delete(Option<PropagationPolicy>),
    /// The tree given a controller that is gone: what a break-glass orphan
    /// delete of a composite above it can leave (seen with real Crossplane in
    /// the soak). The garbage collector deletes it (in the background) as a
    /// dependent of a gone owner, and cascade-guard must keep ordering it as
    /// a tree of its own.
    ControllerGone,
}

async fn controller_gone(client: &Client, resource: &ApiResource, ns: &str) {
    let xrs: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, resource);
    let owner = json!({
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "name": "gone",
        "uid": "00000000-0000-4000-8000-00000000dead",
        "controller": true,
    });
    xrs.patch(
        "tree",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"ownerReferences": [owner]}})),
    )
    .await
    .expect("give the tree a controller that is gone");
}

/// Builds the needy tree of `kind` in a namespace of its own, waits until
/// `tree-1` is held (when `held`), starts the teardown (`how`) and waits
/// until the tree is gone: the timeline of it all.
async fn tear_down(test: &str, kind: &TestKind, held: bool, how: Teardown) -> Timeline {
    let _policy = HOLD_POLICY.read().await;
    let env = env().await;
    let s = Scope::new(&env.cp, test).await;
    let resource = kind.resource();
    let timeline = tree_timeline(&s.client, &resource, &s.namespace).await;
    let _provider = Provider::start(
        s.client.clone(),
        s.namespace.clone(),
        Duration::from_secs(2),
    );
    needy_tree(&s.client, &resource, &s.namespace).await;
    if kind.annotation == Some("Convert") {
        wait_held(&s.client, &resource, &s.namespace, "tree").await;
    }
    if held {
        wait_sibling_hold(&s.client, &s.namespace, "tree-1").await;
    }
    match how {
        Teardown::Delete(policy) => delete_tree(&s.client, &resource, &s.namespace, policy).await,
        Teardown::ControllerGone => controller_gone(&s.client, &resource, &s.namespace).await,
    }
    let gone = timeline
        .wait_gone(resource.kind.as_str(), "tree", Duration::from_secs(120))
        .await;
    assert!(
        gone.is_some(),
        "{test}: the tree never left\n{}",
        timeline.describe()
    );
    timeline
}

#[tokio::test]
async fn convert_deletes_what_a_sibling_needs_only_after_that_sibling_is_gone() {
    // A client that sends no policy: Convert makes it a foreground cascade.
    let timeline = tear_down("sibling-convert", &CONVERT, true, Teardown::Delete(None)).await;
    assert_in_order(&timeline, "Convert, no policy");
}

#[tokio::test]
async fn a_foreground_delete_under_refuse_keeps_the_siblings_order_too() {
    let foreground = Some(PropagationPolicy::Foreground);
    let timeline = tear_down(
        "sibling-refuse",
        &REFUSE,
        true,
        Teardown::Delete(foreground),
    )
    .await;
    assert_in_order(&timeline, "Refuse, --cascade=foreground");
}

/// A tree whose controller is gone is a tree of its own: the garbage
/// collector's delete of it (converted) keeps its siblings' order. Before,
/// such a tree was neither a root nor under one, its holds were let go as
/// orphaned, and its siblings went at once (a wedge in the soak: the cloud
/// cluster went before the Helm releases on it).
#[tokio::test]
async fn a_tree_whose_controller_is_gone_keeps_its_order() {
    let timeline = tear_down(
        "sibling-gone-owner",
        &CONVERT,
        true,
        Teardown::ControllerGone,
    )
    .await;
    assert_in_order(&timeline, "Convert, deleted by the garbage collector");
}

/// The hazard itself: with no holding (an Off kind), a foreground cascade
/// deletes the needed sibling while the one that needs it is still there.
#[tokio::test]
async fn without_holding_a_foreground_cascade_deletes_both_siblings_at_once() {
    let foreground = Some(PropagationPolicy::Foreground);
    let timeline = tear_down("sibling-off", &OFF, false, Teardown::Delete(foreground)).await;
    let what = "Off, --cascade=foreground";
    let needer_gone = gone_revision(&timeline, "tree-0", what);
    let needed_deleting = terminating_revision(&timeline, "tree-1", what);
    assert!(
        needed_deleting < needer_gone,
        "{what}: tree-1 was held although its kind is Off: deleted at revision {needed_deleting}, tree-0 gone at {needer_gone}\n{}",
        timeline.describe()
    );
}

/// Nobody but cascade-guard takes the label away, and a direct delete of the
/// held object is refused with what it waits for; break-glass gets through.
#[tokio::test]
async fn the_hold_is_guarded_and_break_glass_gets_past_it() {
    let _policy = HOLD_POLICY.read().await;
    let env = env().await;
    let s = Scope::new(&env.cp, "sibling-guard").await;
    let resource = CONVERT.resource();
    let _provider = Provider::start(
        s.client.clone(),
        s.namespace.clone(),
        Duration::from_secs(1),
    );
    needy_tree(&s.client, &resource, &s.namespace).await;
    wait_sibling_hold(&s.client, &s.namespace, "tree-1").await;
    // status lists what is held and what it waits for.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cascade-guard"))
        .args(["status", "-o", "json", "--kubeconfig"])
        .arg(env.cp.kubeconfig_path())
        .output()
        .expect("status");
    let report: Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    let held = report["siblingHolds"]
        .as_array()
        .and_then(|h| {
            h.iter()
                .find(|h| h["name"] == "tree-1" && h["namespace"] == s.namespace.as_str())
        })
        .cloned();
    let held = held.unwrap_or_else(|| panic!("status lists tree-1 as held: {report:#}"));
    assert_eq!(held["kind"], "ConfigMap");
    assert!(
        held["waitsFor"]
            .as_str()
            .is_some_and(|w| w.contains("tree-0")),
        "{held}"
    );
    let maps: Api<DynamicObject> =
        Api::namespaced_with(s.client.clone(), &s.namespace, &config_maps());
    // What is held is cascade-guard's to change: an admin's edit of its
    // ConfigMap is refused, and so is its delete, one by one or as a
    // collection (whose items come with no name).
    let holds: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(s.client.clone(), CONTROLLER_HOME);
    let edit = holds
        .patch(
            "cascade-guard-holds",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"held": "\n"}})),
        )
        .await;
    let refused = edit.expect_err("an admin took the entries out of cascade-guard's holds");
    assert!(
        refused
            .to_string()
            .contains("only cascade-guard changes or deletes ConfigMap cascade-guard-holds"),
        "{refused}"
    );
    let refused = holds
        .delete("cascade-guard-holds", &DeleteParams::default())
        .await
        .expect_err("an admin deleted cascade-guard's holds");
    assert!(
        refused
            .to_string()
            .contains("only cascade-guard changes or deletes"),
        "{refused}"
    );
    let all = holds
        .delete_collection(
            &DeleteParams::default(),
            &kube::api::ListParams::default().labels("cascade-guard.dev/sibling-order=true"),
        )
        .await;
    assert!(
        all.as_ref().is_err_and(|e| e
            .to_string()
            .contains("only cascade-guard changes or deletes")),
        "{all:?}"
    );

    // A label of the old kind, forged or restored from a backup, holds
    // nothing.
    let forged = maps
        .create(
            &Default::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "forged", "labels": {"cascade-guard.dev/hold": "any"}},
            }))
            .expect("a ConfigMap"),
        )
        .await
        .expect("create a labelled ConfigMap");
    maps.delete(
        &forged.metadata.name.unwrap_or_default(),
        &DeleteParams::default(),
    )
    .await
    .expect("a forged hold label holds nothing");
    let delete = maps.delete("tree-1", &DeleteParams::default()).await;
    let refused = delete.expect_err("an admin deleted a held object");
    assert!(
        refused.to_string().contains("until ConfigMap") && refused.to_string().contains("tree-0"),
        "{refused}"
    );
    // What refused it, and every other admission policy cascade-guard wrote
    // here, declares no variables: on Kubernetes 1.30 to 1.35 a policy's
    // variables can crash kube-apiserver (kubernetes/kubernetes#135757).
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(s.client.clone());
    let mut names = Vec::new();
    for p in policies
        .list(&Default::default())
        .await
        .expect("policies")
        .items
    {
        let name = p.name_any();
        let spec = p.spec.unwrap_or_default();
        assert!(spec.variables.is_none(), "{name} declares variables");
        names.push(name);
    }
    for ours in [
        "cascade-guard-sibling-order",
        "cascade-guard-sibling-order-records",
    ] {
        assert!(names.iter().any(|n| n == ours), "{ours} in {names:?}");
    }
    assert!(names.len() > 4, "{names:?}");
    // Break-glass, by an admin (system:masters may `use` it).
    maps.patch(
        "tree-1",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"annotations": {"cascade-guard.dev/break-glass": "test"}}}),
        ),
    )
    .await
    .expect("annotate break-glass");
    maps.delete("tree-1", &DeleteParams::default())
        .await
        .expect("break-glass lets the delete through");
}

/// A kind that stops being protected keeps nothing held: its trees' labels
/// come off.
#[tokio::test]
async fn a_kind_that_stops_being_protected_lets_go_of_what_it_held() {
    let _policy = HOLD_POLICY.read().await;
    let env = env().await;
    let s = Scope::new(&env.cp, "sibling-toggle").await;
    let resource = TOGGLED.resource();
    needy_tree(&s.client, &resource, &s.namespace).await;
    wait_sibling_hold(&s.client, &s.namespace, "tree-1").await;
    xrd_api(&s.client)
        .patch(
            &TOGGLED.xrd_name(),
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"cascade-guard.dev/deletion-policy": "Off"}}}),
            ),
        )
        .await
        .expect("make the kind Off");
    let released = wait::until(Duration::from_secs(60), || async {
        let held = sibling_held(
            &s.client,
            CONTROLLER_HOME,
            &config_maps(),
            Some(&s.namespace),
            "tree-1",
        )
        .await;
        (!held).then_some(())
    })
    .await;
    assert!(
        released.is_some(),
        "tree-1 is still held after its kind became Off"
    );
}

/// The hold policy edited by someone else (its checks made to pass
/// everything) is put back: the held object is refused again.
#[tokio::test]
async fn an_edited_hold_policy_is_put_back() {
    use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
    let _policy = HOLD_POLICY.write().await;
    let env = env().await;
    let s = Scope::new(&env.cp, "sibling-edited").await;
    let resource = CONVERT.resource();
    let _provider = Provider::start(
        s.client.clone(),
        s.namespace.clone(),
        Duration::from_secs(1),
    );
    needy_tree(&s.client, &resource, &s.namespace).await;
    wait_sibling_hold(&s.client, &s.namespace, "tree-1").await;
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(s.client.clone());
    policies
        .patch(
            "cascade-guard-sibling-order",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"validations": [{"expression": "true"}]}})),
        )
        .await
        .expect("weaken the hold policy");
    // Within a few of the loop's one-second ticks, well inside the 20-second
    // resync these tests run with: the edit itself is noticed.
    let restored = wait::until(Duration::from_secs(10), || async {
        let p = policies.get("cascade-guard-sibling-order").await.ok()?;
        let validations = p.spec?.validations?;
        (validations.len() == 1 && validations[0].expression != "true").then_some(())
    })
    .await;
    assert!(
        restored.is_some(),
        "the edited hold policy was not put back"
    );
    // And in effect again: a dry-run delete of the held object is refused.
    wait_sibling_hold(&s.client, &s.namespace, "tree-1").await;
}

/// The hold policy sees every DELETE of the kinds it holds: one it does not hold
/// goes through, whatever its scope and however it is sent (a cluster-scoped
/// object's request has no namespace at all; a DeleteCollection's items no
/// name). An error in its expressions would refuse them all.
#[tokio::test]
async fn what_the_hold_policy_does_not_hold_deletes_whatever_its_scope() {
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
    use k8s_openapi::api::rbac::v1::ClusterRole;
    let _policy = HOLD_POLICY.read().await;
    let env = env().await;
    let s = Scope::new(&env.cp, "sibling-scopes").await;
    let resource = CONVERT.resource();
    needy_tree(&s.client, &resource, &s.namespace).await;
    wait_sibling_hold(&s.client, &s.namespace, "tree-1").await;
    let roles: Api<ClusterRole> = Api::all(s.client.clone());
    let role: ClusterRole =
        serde_json::from_value(json!({"metadata": {"name": "sibling-scopes-unheld"}}))
            .expect("a ClusterRole");
    roles
        .create(&Default::default(), &role)
        .await
        .expect("create a ClusterRole");
    roles
        .delete("sibling-scopes-unheld", &DeleteParams::default())
        .await
        .expect("a cluster-scoped object the hold policy does not hold deletes");
    let namespaces: Api<Namespace> = Api::all(s.client.clone());
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "sibling-scopes-unheld"}}))
            .expect("a Namespace");
    namespaces
        .create(&Default::default(), &ns)
        .await
        .expect("create a Namespace");
    namespaces
        .delete("sibling-scopes-unheld", &DeleteParams::default())
        .await
        .expect("a namespace deletes");
    let maps: Api<ConfigMap> = Api::namespaced(s.client.clone(), &s.namespace);
    for name in ["loose-0", "loose-1"] {
        let cm: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": name, "labels": {"sibling-scopes": "loose"}}}),
        )
        .expect("a ConfigMap");
        maps.create(&Default::default(), &cm).await.expect("create");
    }
    maps.delete_collection(
        &DeleteParams::default(),
        &kube::api::ListParams::default().labels("sibling-scopes=loose"),
    )
    .await
    .expect("a DeleteCollection of objects not held goes through");
    // And what it holds stays held: a DeleteCollection that takes it in is
    // refused.
    let refused = maps
        .delete_collection(&DeleteParams::default(), &kube::api::ListParams::default())
        .await;
    assert!(
        refused.is_err(),
        "a DeleteCollection deleted a held object: {refused:?}"
    );
}

/// A kind made Refuse with many trees already there (a platform team turning
/// protection on): every tree becomes due in one look, which reads their
/// roots by listing the kind rather than one GET each, and holds what each
/// needs; one of them torn down keeps its order. The kind was Warn, whose
/// watch (the admission-only kinds') already fed sibling order's index: no
/// second watch of it.
#[tokio::test]
async fn a_kind_made_refuse_with_many_trees_holds_every_need() {
    const TREES: usize = 80;
    let _policy = HOLD_POLICY.read().await;
    let env = env().await;
    let s = Scope::new(&env.cp, "sibling-many").await;
    let resource = WARN.resource();
    let maps: Api<DynamicObject> =
        Api::namespaced_with(s.client.clone(), &s.namespace, &config_maps());
    let _provider = Provider::start(
        s.client.clone(),
        s.namespace.clone(),
        Duration::from_secs(1),
    );
    for i in 0..TREES {
        let name = format!("t{i}");
        create_tree(&s.client, &resource, &s.namespace, &name, 2).await;
        maps.patch(
            &format!("{name}-0"),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "cascade-guard.dev/needs": format!("ConfigMap/{name}-1")
            }}})),
        )
        .await
        .expect("annotate the needer");
    }
    xrd_api(&s.client)
        .patch(
            &WARN.xrd_name(),
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"cascade-guard.dev/deletion-policy": "Refuse"}}}),
            ),
        )
        .await
        .expect("make the kind Refuse");
    for i in 0..TREES {
        let held = wait_sibling_held(
            &s.client,
            CONTROLLER_HOME,
            &config_maps(),
            Some(&s.namespace),
            &format!("t{i}-1"),
            Duration::from_secs(120),
        )
        .await;
        assert!(held, "t{i}-1 was never held");
    }
    let log =
        std::fs::read_to_string(env.cp.log_path("cascade-guard-0")).expect("the controller's log");
    assert!(
        log.lines()
            .any(|l| l.contains("by listing their kind") && l.contains("WarnComposite")),
        "the trees were not read by listing their kind"
    );
    let timeline = tree_timeline(&s.client, &resource, &s.namespace).await;
    wait_sibling_hold(&s.client, &s.namespace, "t7-1").await;
    let xrs: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), &s.namespace, &resource);
    xrs.delete(
        "t7",
        &DeleteParams {
            propagation_policy: Some(PropagationPolicy::Foreground),
            ..DeleteParams::default()
        },
    )
    .await
    .expect("delete t7 in the foreground");
    let gone = timeline
        .wait_gone(resource.kind.as_str(), "t7", Duration::from_secs(120))
        .await;
    assert!(gone.is_some(), "t7 never left\n{}", timeline.describe());
    assert_needed_after(&timeline, "t7-0", "t7-1", "a tree of a kind made Refuse");
}

/// A kind of a provider made up for the test, in [`GROUP`].
fn provider_kind(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, "v1", kind), plural)
}

/// A namespaced object of `resource` controlled by `owner`.
fn composed_by(resource: &ApiResource, name: &str, owner: &DynamicObject) -> Value {
    json!({
        "apiVersion": resource.api_version, "kind": resource.kind,
        "metadata": {"name": name, "ownerReferences": [{
            "apiVersion": owner.types.as_ref().map(|t| t.api_version.clone()),
            "kind": owner.types.as_ref().map(|t| t.kind.clone()),
            "name": owner.metadata.name, "uid": owner.metadata.uid,
            "controller": true, "blockOwnerDeletion": true,
        }]},
    })
}

/// A Release of another tree begins to use a settled tree's ProviderConfig
/// (a new gateway on an old cluster), and a Release made by hand, in no
/// tree, another's. A settled tree is read again only when its root changes
/// or at its resync (an hour here): the new user's own tree, read as it is
/// made, makes the first due, and the provider's ProviderConfigUsage (which
/// the controller watches) the second. Each ProviderConfig is held for its
/// Release long before that resync. Its own control plane: a controller
/// with a resync of an hour.
#[tokio::test]
async fn a_new_user_gets_a_settled_trees_provider_config_held() {
    let configs = provider_kind("ProviderConfig", "providerconfigs");
    let usages = provider_kind("ProviderConfigUsage", "providerconfigusages");
    let releases = provider_kind("Release", "releases");
    let mut options = options();
    for r in [&configs, &usages, &releases] {
        let singular = r.kind.to_lowercase();
        options
            .crds
            .push(schemaless_crd(&r.kind, &r.plural, &singular));
    }
    let env = bare_with(options).await;
    let _stop = env.controllers_stop_on_drop();
    env.start_controller(&["--resync-seconds=3600"]);
    let s = Scope::new(&env.cp, "outside-user").await;
    let resource = REFUSE.resource();
    env.wait_for_protection(&s.client, &resource).await;
    let api = |r: &ApiResource| -> Api<DynamicObject> {
        Api::namespaced_with(s.client.clone(), &s.namespace, r)
    };
    let apply = |r: &ApiResource, value: Value| {
        let api = api(r);
        async move {
            let name = value["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            api.patch(
                &name,
                &PatchParams::apply("test").force(),
                &Patch::Apply(&value),
            )
            .await
            .unwrap_or_else(|e| panic!("apply {name}: {e}"))
        }
    };
    // A tree: XR `hub` composing ProviderConfig `pc`.
    let ref_to = |r: &ApiResource, name: &str| json!({"apiVersion": r.api_version, "kind": r.kind, "name": name});
    let root = |name: &str, composed: Value| {
        json!({
            "apiVersion": resource.api_version, "kind": resource.kind,
            "metadata": {"name": name},
            "spec": {"crossplane": {"resourceRefs": [composed]}},
        })
    };
    for (hub, pc) in [("hub", "pc"), ("hub-2", "pc-2")] {
        let hub = apply(&resource, root(hub, ref_to(&configs, pc))).await;
        apply(&configs, composed_by(&configs, pc, &hub)).await;
    }
    for hub in ["hub", "hub-2"] {
        wait_ordered(
            &s.client,
            CONTROLLER_HOME,
            &resource,
            Some(&s.namespace),
            hub,
        )
        .await;
    }
    // Settled: no longer read every few seconds as a young tree is.
    tokio::time::sleep(Duration::from_secs(130)).await;
    for pc in ["pc", "pc-2"] {
        assert!(
            !sibling_held(&s.client, CONTROLLER_HOME, &configs, Some(&s.namespace), pc).await,
            "{pc} is held with no user"
        );
    }
    // What a provider records of a Release's use of a ProviderConfig: a
    // ProviderConfigUsage labelled with its name, naming the Release.
    let record_use = |release: &DynamicObject, pc: &str| {
        let mut usage = composed_by(&usages, &format!("{}-usage", release.name_any()), release);
        usage["metadata"]["ownerReferences"][0]["controller"] = json!(false);
        usage["metadata"]["labels"] = json!({"crossplane.io/provider-config": pc});
        usage["providerConfigRef"] = json!({"name": pc, "kind": "ProviderConfig"});
        usage["resourceRef"] = ref_to(&releases, &release.name_any());
        apply(&usages, usage)
    };
    // Another tree: XR `gateway` composing Release `rel` on `pc`, whose
    // provider records that use (a ProviderConfigUsage labelled with the
    // ProviderConfig's name, naming the Release).
    let gateway = apply(&resource, root("gateway", ref_to(&releases, "rel"))).await;
    let mut release = composed_by(&releases, "rel", &gateway);
    release["spec"] = json!({"providerConfigRef": {"name": "pc", "kind": "ProviderConfig"}});
    let release = apply(&releases, release).await;
    record_use(&release, "pc").await;
    // A Release made by hand on `pc-2`, in no tree.
    let solo = apply(
        &releases,
        json!({
            "apiVersion": releases.api_version, "kind": releases.kind,
            "metadata": {"name": "solo"},
            "spec": {"providerConfigRef": {"name": "pc-2", "kind": "ProviderConfig"}},
        }),
    )
    .await;
    record_use(&solo, "pc-2").await;
    for (pc, user) in [
        ("pc", "the gateway's Release"),
        ("pc-2", "the Release made by hand"),
    ] {
        let held = wait_sibling_held(
            &s.client,
            CONTROLLER_HOME,
            &configs,
            Some(&s.namespace),
            pc,
            Duration::from_secs(60),
        )
        .await;
        assert!(
            held,
            "the settled tree's {pc} was not held for {user} within a minute (its resync is an hour)"
        );
    }
}
