//! cascade-guard comes back by itself: within seconds of an API server
//! restart, and ready (protecting XRDs) on a cluster without the CascadePolicy
//! CRD, which it starts using as soon as the CRD is installed; and it brings
//! back a foreground cascade the garbage collector lost in an API server
//! restart. Each test runs its own control plane, since they restart or leave
//! out parts of it.

use std::time::{Duration, Instant};

use cascade_guard::api::CascadePolicy;
use cascade_guard_testkit::tree::{create_tree, wait_held};
use cascade_guard_testkit::*;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, CustomResourceExt, ResourceExt};
use local_cluster::testing::Scope;
use local_cluster::wait;
use serde_json::json;

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
    // Sibling order too: its index is fed by Convert's watch, which resumes
    // where it was after the restart (no list): the kind stays known and a
    // new tree's need is held.
    create_tree(&client, &resource, ns, "needy", 2).await;
    let maps: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &cascade_guard_testkit::tree::config_maps(),
    );
    maps.patch(
        "needy-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {
            "cascade-guard.dev/needs": "ConfigMap/needy-1"}}})),
    )
    .await
    .expect("annotate the needer");
    let needed_held = wait_sibling_held(
        &client,
        CONTROLLER_HOME,
        &cascade_guard_testkit::tree::config_maps(),
        Some(ns),
        "needy-1",
        Duration::from_secs(60),
    )
    .await;
    assert!(
        needed_held,
        "sibling order never held needy-1 after the API server restart:\n{}",
        env.cp.log_tails(80)
    );
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

fn owned_kind(kind: &str, plural: &str) -> kube::api::ApiResource {
    kube::api::ApiResource {
        group: GROUP.into(),
        version: "v1".into(),
        api_version: format!("{GROUP}/v1"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// The API of each owner kind `Owner{i}` in `ns`.
fn owner_apis(client: &kube::Client, ns: &str, kinds: usize) -> Vec<Api<kube::api::DynamicObject>> {
    (0..kinds)
        .map(|i| {
            Api::namespaced_with(
                client.clone(),
                ns,
                &owned_kind(&format!("Owner{i}"), &format!("owner{i}s")),
            )
        })
        .collect()
}

fn has_finalizer(o: &kube::api::DynamicObject, finalizer: &str) -> bool {
    o.finalizers().iter().any(|f| f == finalizer)
}

/// A foreground cascade the garbage collector lost is restarted. After an
/// API server restart the collector can miss a `foregroundDeletion` re-added
/// just after it cleared it, and the object then waits for ever
/// (docs/deletion-semantics.md §2); here cascade-guard's own confirming
/// delete of kinds whose dependents it cannot see re-adds it, as the
/// collector's informers come back one by one. Every owner is gone within a
/// bound, whatever the collector missed. An owner whose dependent stays shows
/// that a restart is safe: restarted, it stays, in its cascade, until its
/// dependent goes.
#[tokio::test]
async fn a_foreground_cascade_the_garbage_collector_lost_is_restarted() {
    // Six owner kinds: the collector watches each on its own timer.
    const KINDS: usize = 6;
    let mut options = options();
    for i in 0..KINDS {
        options.crds.push(schemaless_crd(
            &format!("Owner{i}"),
            &format!("owner{i}s"),
            &format!("owner{i}"),
        ));
    }
    options
        .crds
        .push(schemaless_crd("Dependent", "dependents", "dependent"));
    let mut env = bare_with(options).await;
    let client = env.cp.admin().await.expect("admin client");
    let policies = cascade_policy_api(&client);
    for i in 0..KINDS {
        create(
            &policies,
            cascade_policy(&format!("owner{i}s"), &format!("Owner{i}"), "Convert", None),
        )
        .await;
    }
    let port = free_port();
    // Longer than the default, so that the confirming deletes come first
    // (the collector's first clearing comes 18 to 55 s after the restart).
    env.start_controller(&[
        "--no-leader-election",
        &format!("--http-address=127.0.0.1:{port}"),
        "--restart-quiet-cascades-after=90s",
    ]);
    let ns = "lost-cascades";
    create(
        &Api::all_with(client.clone(), &namespaces()),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
    )
    .await;
    let owners = owner_apis(&client, ns, KINDS);
    let dependents = owned_kind("Dependent", "dependents");
    let deps: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), ns, &dependents);
    // (owner kind, owner name, dependent name): the last one's dependent stays.
    let mut trees: Vec<(usize, String, String)> = (0..KINDS)
        .map(|i| (i, format!("owner-{i}"), format!("dep-{i}")))
        .collect();
    trees.push((0, "staying".into(), "dep-staying".into()));
    for (i, owner, dep) in &trees {
        let o = create(
            &owners[*i],
            json!({"apiVersion": format!("{GROUP}/v1"), "kind": format!("Owner{i}"),
                "metadata": {"name": owner}, "spec": {}}),
        )
        .await;
        create(
            &deps,
            json!({"apiVersion": format!("{GROUP}/v1"), "kind": "Dependent",
                "metadata": {"name": dep, "finalizers": [HOLD], "ownerReferences": [{
                    "apiVersion": format!("{GROUP}/v1"), "kind": format!("Owner{i}"),
                    "name": owner, "uid": o.metadata.uid, "controller": true,
                    "blockOwnerDeletion": true}]},
                "spec": {}}),
        )
        .await;
        wait_held(
            &client,
            &owned_kind(&format!("Owner{i}"), &format!("owner{i}s")),
            ns,
            owner,
        )
        .await;
    }
    // Deleted as kubectl does (Background): cascade-guard converts each.
    for (i, owner, _) in &trees {
        owners[*i]
            .delete(owner, &kube::api::DeleteParams::background())
            .await
            .expect("delete owner");
    }
    // Every cascade has started once the collector has deleted every dependent.
    let started = wait::until(Duration::from_secs(60), || async {
        let list = deps.list(&Default::default()).await.ok()?;
        (list.items.len() == trees.len()
            && list
                .items
                .iter()
                .all(|d| d.metadata.deletion_timestamp.is_some()))
        .then_some(())
    })
    .await;
    assert!(
        started.is_some(),
        "the cascades never started:\n{}",
        log(&env)
    );

    env.cp
        .restart("kube-apiserver", Duration::from_secs(20))
        .await
        .unwrap_or_else(|e| panic!("cannot restart kube-apiserver: {e}"));
    let client = env.cp.admin().await.expect("admin client");
    let owners = owner_apis(&client, ns, KINDS);
    let deps: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), ns, &dependents);
    // Let the dependents go (not the staying one's): the collector clears
    // each owner's foregroundDeletion, and cascade-guard confirms with a
    // Foreground delete that re-adds it.
    for (_, _, dep) in &trees[..KINDS] {
        release_hold(&deps, dep).await;
    }
    let released = Instant::now();
    let bound = Duration::from_secs(300);
    let gone_after: Vec<Option<Duration>> =
        futures::future::join_all(trees[..KINDS].iter().map(|(i, owner, _)| {
            let api = owners[*i].clone();
            async move {
                wait::until(bound, || async {
                    matches!(api.get_opt(owner).await, Ok(None)).then_some(released.elapsed())
                })
                .await
            }
        }))
        .await;
    let restarted: Vec<bool> =
        futures::future::join_all(trees[..KINDS].iter().map(|(_, owner, _)| {
            let client = client.clone();
            async move {
                events_about(&client, owner)
                    .await
                    .iter()
                    .any(|(reason, _)| reason == "CascadeRestarted")
            }
        }))
        .await;
    for ((_, owner, _), (gone, restarted)) in trees.iter().zip(gone_after.iter().zip(&restarted)) {
        println!(
            "{owner}: {}, {}",
            gone.map_or("NOT gone".into(), |d| format!(
                "gone {:.1} s after its dependent",
                d.as_secs_f64()
            )),
            if *restarted {
                "restarted"
            } else {
                "not restarted"
            }
        );
    }
    let m = metrics(port);
    for line in m
        .lines()
        .filter(|l| l.starts_with("cascade_guard_cascade_restarts"))
    {
        println!("{line}");
    }
    assert!(
        gone_after.iter().all(Option::is_some),
        "owners left {}s after their dependents went: {gone_after:?}\n{}",
        bound.as_secs(),
        env.cp.log_tails(60)
    );

    // The staying owner: restarted, and still in its cascade, its dependent
    // still there.
    let (_, staying, staying_dep) = &trees[KINDS];
    let restarted = wait::until(Duration::from_secs(240), || async {
        events_about(&client, staying)
            .await
            .into_iter()
            .find(|(reason, _)| reason == "CascadeRestarted")
    })
    .await;
    let (_, note) = restarted.unwrap_or_else(|| {
        panic!(
            "the staying owner's cascade was never restarted:\n{}",
            log(&env)
        )
    });
    println!("staying: {note}");
    let o = owners[0]
        .get(staying)
        .await
        .expect("the staying owner went early");
    assert!(
        has_finalizer(&o, "foregroundDeletion"),
        "the restart left the staying owner out of its cascade: {:?}",
        o.finalizers()
    );
    assert!(
        has_finalizer(&o, "cascade-guard.dev/foreground-cascade"),
        "the restart let go of the staying owner: {:?}",
        o.finalizers()
    );
    assert!(
        deps.get_opt(staying_dep).await.expect("get").is_some(),
        "the staying owner's dependent went"
    );
    release_hold(&deps, staying_dep).await;
    let gone = wait::until(Duration::from_secs(120), || async {
        matches!(owners[0].get_opt(staying).await, Ok(None)).then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "the staying owner stayed after its dependent went:\n{}",
        log(&env)
    );
}
