//! A typo in a CascadePolicy's kind does not lift the protection it gave
//! (issue #10): the policy keeps guarding the kind it last compiled for,
//! across a controller restart, until it names a kind that exists or is
//! deleted. Against the real control plane, with the real `cascade-guard run`.

use std::time::Duration;

use cascade_guard_testkit::*;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use local_cluster::testing::Scope;
use local_cluster::wait;
use serde_json::json;

fn buckets() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: "v1".into(),
        api_version: format!("{GROUP}/v1"),
        kind: "Bucket".into(),
        plural: "buckets".into(),
    }
}

/// Waits until the Ready condition's message contains `text`.
async fn condition_says(client: &Client, text: &str) -> (String, String, String) {
    let found = wait::until(Duration::from_secs(30), || async {
        ready_condition(client, "buckets")
            .await
            .filter(|(_, _, m)| m.contains(text))
    })
    .await;
    match found {
        Some(found) => found,
        None => panic!(
            "Ready never said {text:?}; it says {:?}",
            ready_condition(client, "buckets").await
        ),
    }
}

#[tokio::test]
async fn a_typo_in_the_kind_keeps_the_last_good_protection_until_fixed_or_deleted() {
    let env = bare_env().await;
    let _stop = env.controllers_stop_on_drop();
    let s = Scope::new(&env.cp, "last-good").await;
    let c = &s.client;
    let crds: Api<CustomResourceDefinition> = Api::all(c.clone());
    let crd = schemaless_crd("Bucket", "buckets", "bucket");
    crds.create(&PostParams::default(), &crd)
        .await
        .expect("create CRD");
    let served = wait::until(Duration::from_secs(30), || async {
        let api: Api<kube::api::DynamicObject> =
            Api::namespaced_with(c.clone(), &s.namespace, &buckets());
        api.list(&Default::default()).await.ok().map(|_| ())
    })
    .await;
    assert!(served.is_some(), "Bucket never served");

    let port = free_port();
    env.start_controller(&[
        "--no-leader-election",
        &format!("--http-address=127.0.0.1:{port}"),
    ]);
    let policies = cascade_policy_api(c);
    create(
        &policies,
        cascade_policy("buckets", "Bucket", "Refuse", None),
    )
    .await;
    env.wait_for_protection(c, &buckets()).await;
    let refused = || async {
        let outcome = delete(
            c,
            &buckets(),
            "protection-probe",
            "probe-buckets",
            &DeleteSpec::dry_run_background(),
        )
        .await;
        outcome.code == 403
    };
    let vaps: Api<ValidatingAdmissionPolicy> = Api::all(c.clone());
    let objects_exist = || async {
        vaps.get_opt("cascade-guard-policy-buckets")
            .await
            .ok()
            .flatten()
            .is_some()
            && vaps
                .get_opt("cascade-guard-update-policy-buckets")
                .await
                .ok()
                .flatten()
                .is_some()
    };
    let set_kind = |kind: &'static str| {
        let policies = policies.clone();
        async move {
            policies
                .patch(
                    "buckets",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"kind": kind}})),
                )
                .await
                .expect("change the kind");
        }
    };

    // The typo: the policy says so, and keeps guarding Bucket.
    set_kind("bucket").await;
    let (status, reason, message) = condition_says(c, "keeps guarding").await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "UnknownKind"),
        "{message}"
    );
    assert!(
        message.contains("Bucket.table.cascade-guard.dev (Refuse mode)"),
        "{message}"
    );
    // A pass after the change has run (the condition), and one more that
    // started after it had: neither removed the objects.
    wait_for_sync_pass(c, port).await;
    assert!(objects_exist().await, "the admission objects were removed");
    assert!(refused().await, "the typo lifted protection");

    // A restart: what is in the cluster is the last good compilation, read
    // back, kept, and repaired like any other policy's objects.
    env.kill_controller(0);
    // Edited while no controller runs: a selector that selects nothing.
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(c.clone());
    bindings
        .patch(
            "cascade-guard-policy-buckets",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"matchResources": {
                "objectSelector": {"matchLabels": {"nothing": "here"}}}}})),
        )
        .await
        .expect("edit the binding");
    let lifted = wait::until(Duration::from_secs(30), || async {
        (!refused().await).then_some(())
    })
    .await;
    assert!(lifted.is_some(), "the edit did not take effect");
    env.start_controller(&["--no-leader-election"]);
    let repaired = wait::until(Duration::from_secs(30), || async {
        refused().await.then_some(())
    })
    .await;
    assert!(
        repaired.is_some(),
        "the restarted controller did not repair the kept objects:\n{}",
        env.cp.log_tails(20)
    );
    let (_, reason, message) = condition_says(c, "keeps guarding").await;
    assert_eq!(reason, "UnknownKind", "{message}");
    assert!(
        objects_exist().await,
        "the restarted controller removed them"
    );

    // Fixed: compiled as usual; a typo again keeps guarding.
    set_kind("Bucket").await;
    let (status, reason, _) = condition_says(c, "are checked").await;
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Compiled"));
    set_kind("buket").await;
    condition_says(c, "keeps guarding").await;
    assert!(refused().await);

    // Deleted: the protection goes with it.
    policies
        .delete("buckets", &DeleteParams::default())
        .await
        .expect("delete the CascadePolicy");
    let gone = wait::until(Duration::from_secs(30), || async {
        (!objects_exist().await && !refused().await).then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "deleting the CascadePolicy did not lift its protection"
    );
}
