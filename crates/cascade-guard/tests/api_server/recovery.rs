//! cascade-guard comes back by itself: within seconds of an API server
//! restart, and ready (protecting XRDs) on a cluster without the CascadePolicy
//! CRD, which it starts using as soon as the CRD is installed. Each test runs
//! its own control plane, since they restart or leave out parts of it.

#[path = "../support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use cascade_guard::api::CascadePolicy;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, CustomResourceExt, ResourceExt};
use local_cluster::testing::Scope;
use local_cluster::wait;
use serde_json::json;
use support::tree::{create_tree, wait_held};
use support::*;

fn log(env: &Env) -> String {
    std::fs::read_to_string(env.cp.log_path("cascade-guard-0")).unwrap_or_default()
}

/// Without the CascadePolicy CRD the controller protects XRDs and is ready;
/// it says so once (a log line, a metric), and uses CascadePolicies as soon as
/// the CRD is installed.
#[tokio::test]
async fn ready_without_the_cascade_policy_crd_and_using_it_once_installed() {
    let mut options = options();
    let policy_crd = CascadePolicy::crd();
    options
        .crds
        .retain(|c| c.metadata.name != policy_crd.metadata.name);
    let env = bare_with(options).await;
    let _stop = env.controllers_stop_on_drop();
    let s = Scope::new(&env.cp, "no-policy-crd").await;
    let port = free_port();
    env.start_controller(&[
        "--no-leader-election",
        &format!("--http-address=127.0.0.1:{port}"),
    ]);
    env.wait_for_protection(&s.client, &REFUSE.resource()).await;
    let ready = wait::until(Duration::from_secs(30), || async {
        (http_get(port, "/readyz")?.0 == 200).then_some(())
    })
    .await;
    assert!(ready.is_some(), "never ready:\n{}", log(&env));
    let (_, metrics) = http_get(port, "/metrics").expect("metrics");
    assert!(
        metrics.contains(r#"cascade_guard_input_available{input="CascadePolicy"} 0"#),
        "{metrics}"
    );
    // Two passes later (each looks for the CRD again), still one line about
    // it, and no watch failing in a loop.
    for _ in 0..2 {
        wait_for_sync_pass(&s.client, port).await;
    }
    let said = log(&env);
    assert_eq!(
        said.matches("the CascadePolicy CRD is not installed")
            .count(),
        1,
        "{said}"
    );
    assert!(!said.contains("cannot watch CascadePolicies"), "{said}");

    let crds: Api<CustomResourceDefinition> = Api::all(s.client.clone());
    crds.create(&PostParams::default(), &policy_crd)
        .await
        .expect("install the CRD");
    wait::crd_established(
        &s.client,
        policy_crd.metadata.name.as_deref().unwrap_or_default(),
        Duration::from_secs(30),
    )
    .await
    .expect("the CRD is established");
    create(
        &cascade_policy_api(&s.client),
        cascade_policy("leaves", "Leaf", "Refuse", None),
    )
    .await;
    env.wait_for_protection(&s.client, &leaves()).await;
    let (_, metrics) = http_get(port, "/metrics").expect("metrics");
    assert!(
        metrics.contains(r#"cascade_guard_input_available{input="CascadePolicy"} 1"#),
        "{metrics}"
    );
}

/// After kube-apiserver restarts, a new object of a Convert kind is held, and
/// an XRD annotation change takes effect, within seconds of the API server
/// serving again (kube's default watch backoff let them wait up to 30 s).
#[tokio::test]
async fn watches_recover_within_seconds_of_an_api_server_restart() {
    // Owned: its controllers stop when it is dropped.
    let mut env = bare_with(options()).await;
    env.start_controller(&["--no-leader-election"]);
    let client = env.cp.admin().await.expect("admin client");
    env.wait_for_protection(&client, &REFUSE.resource()).await;
    env.wait_for_protection(&client, &TOGGLED.resource()).await;
    let ns = "restart";
    create(
        &Api::all_with(client.clone(), &namespaces()),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
    )
    .await;
    let resource = CONVERT.resource();
    create_tree(&client, &resource, ns, "before", 0).await;
    wait_held(&client, &resource, ns, "before").await;
    // Let the API server's downtime run the watches' backoff up.
    let stopped_for = Duration::from_secs(20);
    env.cp
        .restart("kube-apiserver", stopped_for)
        .await
        .unwrap_or_else(|e| panic!("cannot restart kube-apiserver: {e}"));
    let back = Instant::now();
    let client = env.cp.admin().await.expect("admin client");

    create_tree(&client, &resource, ns, "after", 0).await;
    let xrs: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
    let held = wait::until(Duration::from_secs(60), || async {
        let xr = xrs.get("after").await.ok()?;
        xr.finalizers()
            .iter()
            .any(|f| f == "cascade-guard.dev/foreground-cascade")
            .then_some(())
    })
    .await;
    assert!(
        held.is_some(),
        "never held after the restart:\n{}",
        env.cp.log_tails(80)
    );
    let held_after = back.elapsed();
    if let Ok(dump) = std::env::var("RECOVERY_LOG_DUMP") {
        let _ = std::fs::copy(env.cp.log_path("cascade-guard-0"), dump);
    }

    xrd_api(&client)
        .patch(
            &TOGGLED.xrd_name(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "cascade-guard.dev/deletion-policy": "Off"}}})),
        )
        .await
        .expect("annotate the XRD");
    let changed = Instant::now();
    let probe = TOGGLED.resource();
    let api = Api::namespaced_with(client.clone(), "protection-probe", &probe);
    let name = format!("probe-{}", probe.plural);
    let _ = api
        .create(&PostParams::default(), &composite(&probe, &name, true))
        .await;
    let lifted = wait::until(Duration::from_secs(60), || async {
        let got = delete(
            &client,
            &probe,
            "protection-probe",
            &name,
            &DeleteSpec::dry_run_background(),
        )
        .await;
        got.allowed().then_some(())
    })
    .await;
    assert!(lifted.is_some(), "the annotation change never took effect");
    let annotation_took = changed.elapsed();
    println!(
        "after a {}s API server outage: new object held {:.1}s after it served again; annotation change in effect {:.1}s after it was made",
        stopped_for.as_secs(),
        held_after.as_secs_f64(),
        annotation_took.as_secs_f64()
    );
    // Generous: the watches retry at most 2 s apart, and the API server
    // reloads admission policies every second; kube's default backoff took
    // 19 to 50 s here.
    assert!(
        held_after < Duration::from_secs(15),
        "held {held_after:?} after the API server came back"
    );
    assert!(
        annotation_took < Duration::from_secs(15),
        "annotation took {annotation_took:?}"
    );
}

fn namespaces() -> kube::api::ApiResource {
    kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Namespace>(&())
}
