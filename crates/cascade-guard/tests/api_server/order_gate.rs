//! Failing closed, on the real control plane: with sibling order enforced and
//! `--unordered-deletes=refuse` (the product's default), the delete of a root
//! whose tree the controller has not ordered is refused with the reason,
//! whatever the propagation; `plan` says so and exits 3. Once the controller
//! has read the tree, the same delete goes through and the siblings leave in
//! order (by etcd revision). `--sibling-order off` takes the gate, the hold
//! policy and every hold away.
//!
//! One test, in phases: the gate is cluster-wide, so this binary has a
//! control plane of its own, and the phases follow one another.

use std::process::Output;
use std::time::Duration;

use cascade_guard_testkit::tree::{
    Provider, assert_needed_after, config_maps, create_tree, tree_timeline,
};
use cascade_guard_testkit::*;
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PropagationPolicy};
use kube::{Api, Client, ResourceExt};
use local_cluster::testing::Scope;
use local_cluster::wait;
use serde_json::json;

const ORDERED_TREES: &str = "cascade-guard-ordered-trees";
/// Where the controller keeps its Lease, and so its record.
const HOME: &str = CONTROLLER_HOME;

/// XR `name` composing ConfigMaps `name-0` (which needs `name-1`) and
/// `name-1`.
async fn needy_tree(client: &Client, resource: &ApiResource, ns: &str, name: &str) -> String {
    let xr = create_tree(client, resource, ns, name, 2).await;
    let maps: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &config_maps());
    maps.patch(
        &format!("{name}-0"),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {
            "cascade-guard.dev/needs": format!("ConfigMap/{name}-1")}}})),
    )
    .await
    .expect("annotate the needer");
    xr.uid().expect("uid")
}

/// Waits until the controller's record says the tree of `uid` is ordered
/// (any generation: the root's is 1 here).
async fn wait_ordered(client: &Client, uid: &str) {
    let records: Api<ConfigMap> = Api::namespaced(client.clone(), HOME);
    let ordered = wait::until(Duration::from_secs(90), || async {
        let record = records.get_opt(ORDERED_TREES).await.ok()??;
        let marks = cascade_guard::policy::sibling::gate::decode_marks(&record.data?);
        let value = marks.get(uid)?.clone();
        value.chars().all(|c| c.is_ascii_digit()).then_some(())
    })
    .await;
    assert!(
        ordered.is_some(),
        "the controller never marked {uid} ordered"
    );
}

/// Waits until the gate refuses a dry-run foreground delete of `name` (the
/// API server loads a new policy a moment after it is written); the refusal.
async fn wait_refused(client: &Client, resource: &ApiResource, ns: &str, name: &str) -> String {
    let xrs: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, resource);
    let params = DeleteParams {
        dry_run: true,
        propagation_policy: Some(PropagationPolicy::Foreground),
        ..DeleteParams::default()
    };
    let refused = wait::until(Duration::from_secs(60), || async {
        match xrs.delete(name, &params).await {
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("in order") => {
                Some(s.message)
            }
            _ => None,
        }
    })
    .await;
    refused.unwrap_or_else(|| panic!("the gate never refused a foreground delete of {ns}/{name}"))
}

fn plan(env: &Env, resource: &ApiResource, ns: &str, name: &str) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_cascade-guard"))
        .args(["plan", &resource.plural, name, "-n", ns, "--kubeconfig"])
        .arg(env.cp.kubeconfig_path())
        .output()
        .expect("run plan")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test]
async fn a_delete_of_a_tree_the_controller_has_not_ordered_is_refused_with_the_reason() {
    let env = bare_env().await;
    let _stop = env.controllers_stop_on_drop();
    let refuse = &["--unordered-deletes=refuse", "--no-leader-election"];
    let first = env.start_controller(refuse);
    let s = Scope::new(&env.cp, "order-gate").await;
    let client = &s.client;
    let resource = REFUSE.resource();
    env.wait_for_protection(client, &resource).await;
    let _provider = Provider::start(client.clone(), s.namespace.clone(), Duration::from_secs(2));

    // Read and held: ordered, and plan says so.
    let tree = needy_tree(client, &resource, &s.namespace, "tree").await;
    wait_ordered(client, &tree).await;
    // The hold policy sees the DELETEs of the kind it holds (ConfigMaps),
    // and of no other kind: it reads its record at every evaluation, which
    // must not be every DELETE in the cluster.
    let live = Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .get("cascade-guard-sibling-order")
        .await
        .expect("the hold policy");
    let rules = serde_json::to_value(
        live.spec
            .and_then(|s| s.match_constraints)
            .and_then(|m| m.resource_rules),
    )
    .expect("rules");
    let deletes: Vec<(String, String)> = rules
        .as_array()
        .expect("rules")
        .iter()
        .filter(|r| r["operations"] == json!(["DELETE"]))
        .flat_map(|r| {
            let group = r["apiGroups"][0].as_str().unwrap_or("?").to_string();
            r["resources"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |p| (group.clone(), p.as_str().unwrap_or("?").to_string()))
        })
        .collect();
    assert_eq!(
        deletes,
        [(String::new(), "configmaps".to_string())],
        "{rules}"
    );
    let out = plan(env, &resource, &s.namespace, "tree");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("in an order that works"),
        "{}",
        text(&out)
    );

    // The controller stopped: plan no longer says safe.
    env.stop_controller(first);
    let out = plan(env, &resource, &s.namespace, "tree");
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(text(&out).contains("no controller runs"), "{}", text(&out));

    // A tree made while no controller runs: its foreground delete (what
    // Refuse's refusal suggests) is refused with the reason, and plan names
    // it.
    let fresh = needy_tree(client, &resource, &s.namespace, "fresh").await;
    let refusal = wait_refused(client, &resource, &s.namespace, "fresh").await;
    assert!(refusal.contains("has not read its tree yet"), "{refusal}");
    assert!(refusal.contains("cascade-guard plan"), "{refusal}");
    assert!(
        refusal.contains("cascade-guard.dev/break-glass"),
        "{refusal}"
    );
    let out = plan(env, &resource, &s.namespace, "fresh");
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        text(&out).contains("the controller has not read this tree"),
        "{}",
        text(&out)
    );
    // status says the same, per tree: the fresh one is not ordered.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cascade-guard"))
        .args(["status", "--kubeconfig"])
        .arg(env.cp.kubeconfig_path())
        .output()
        .expect("run status");
    let said = text(&out);
    assert!(
        said.contains("SIBLING ORDER TREES: ")
            && said
                .lines()
                .any(|l| l.contains(&format!("{}/fresh", s.namespace))
                    && l.contains("the controller has not read this tree")),
        "{said}"
    );
    // Sibling order's own policies type-check cleanly (status reads them).
    assert!(
        !said
            .lines()
            .any(|l| l.contains("cascade-guard-sibling-order") && l.contains("type")),
        "{said}"
    );

    // A tree read before, changed since (its generation moved): refused as
    // changed.
    let xrs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &s.namespace, &resource);
    xrs.patch(
        "tree",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"crossplane": {"resourceRefs": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "tree-0"},
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "tree-1"},
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "tree-2"},
        ]}}})),
    )
    .await
    .expect("change the tree");
    let refusal = wait_refused(client, &resource, &s.namespace, "tree").await;
    assert!(refusal.contains("changed since"), "{refusal}");

    // The controller back: it reads the fresh tree, holds fresh-1, and the
    // same delete goes through, in order.
    let _second = env.start_controller(refuse);
    wait_ordered(client, &fresh).await;
    let maps: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &s.namespace, &config_maps());
    let held = wait_sibling_held(
        client,
        HOME,
        &config_maps(),
        Some(&s.namespace),
        "fresh-1",
        Duration::from_secs(60),
    )
    .await;
    assert!(held, "fresh-1 was never held");
    let timeline = tree_timeline(client, &resource, &s.namespace).await;
    let deleted = wait::until(Duration::from_secs(30), || async {
        xrs.delete(
            "fresh",
            &DeleteParams {
                propagation_policy: Some(PropagationPolicy::Foreground),
                ..DeleteParams::default()
            },
        )
        .await
        .ok()
        .map(|_| ())
    })
    .await;
    assert!(
        deleted.is_some(),
        "the ordered tree's delete was still refused"
    );
    let gone = timeline
        .wait_gone(resource.kind.as_str(), "fresh", Duration::from_secs(120))
        .await;
    assert!(gone.is_some(), "fresh never left\n{}", timeline.describe());
    assert_needed_after(
        &timeline,
        "fresh-0",
        "fresh-1",
        "Refuse, ordered by the gate",
    );

    // A hold that cannot be made (the needed object's name makes its key
    // longer than 253 characters): the tree is not ordered, plan says why
    // and exits 3, and the delete is refused with the reason.
    let long = format!("long-{}", "n".repeat(240));
    let xr = create_tree(client, &resource, &s.namespace, "longtree", 1).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &s.namespace);
    cms.create(
        &Default::default(),
        &serde_json::from_value(json!({"metadata": {"name": long,
            "ownerReferences": [{"apiVersion": resource.api_version, "kind": resource.kind,
                "name": "longtree", "uid": xr.uid().expect("uid"), "controller": true,
                "blockOwnerDeletion": true}]}}))
        .expect("config map"),
    )
    .await
    .expect("create the long-named dependent");
    xrs.patch(
        "longtree",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"crossplane": {"resourceRefs": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "longtree-0"},
            {"apiVersion": "v1", "kind": "ConfigMap", "name": long},
        ]}}})),
    )
    .await
    .expect("compose it");
    maps.patch(
        "longtree-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {
            "cascade-guard.dev/needs": format!("ConfigMap/{long}")}}})),
    )
    .await
    .expect("annotate the needer");
    // Refused at first as not read yet, then, once read, with the reason.
    let mut refusal = String::new();
    for _ in 0..60 {
        refusal = wait_refused(client, &resource, &s.namespace, "longtree").await;
        if refusal.contains("too long") {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        refusal.contains("cannot order its tree") && refusal.contains("too long to be held"),
        "{refusal}"
    );
    let out = plan(env, &resource, &s.namespace, "longtree");
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(text(&out).contains("too long to be held"), "{}", text(&out));

    // Off: the gate, the hold policy and every hold go.
    env.stop_controller(_second);
    let _off = env.start_controller(&["--sibling-order=off", "--no-leader-election"]);
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let records: Api<ConfigMap> = Api::namespaced(client.clone(), HOME);
    let released = wait::until(Duration::from_secs(60), || async {
        let holds = records.get_opt("cascade-guard-holds").await.ok()?;
        let trees = records.get_opt(ORDERED_TREES).await.ok()?;
        let gate = policies
            .get_opt("cascade-guard-sibling-order-roots-composites")
            .await
            .ok()?;
        let hold = policies.get_opt("cascade-guard-sibling-order").await.ok()?;
        (holds.is_none() && trees.is_none() && gate.is_none() && hold.is_none()).then_some(())
    })
    .await;
    assert!(
        released.is_some(),
        "with --sibling-order off, a hold, the hold policy or the gate stayed"
    );
    // And nothing holds tree-1 back: its delete goes through.
    maps.delete("tree-1", &DeleteParams::default())
        .await
        .expect("tree-1's delete, with sibling order off");
}
