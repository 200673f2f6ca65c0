//! Convert mode survives its own failures: cascade-guard killed with SIGKILL at
//! random points (one replica, and the leader of two), deletes made while it
//! is down, and uninstall. Nothing is lost, nothing is orphaned, every cascade
//! runs in the foreground. Set CASCADE_GUARD_SEED to replay a run.

use cascade_guard_testkit::audit_log;

use std::time::Duration;

use cascade_guard::policy::names::{
    CONVERTED_ANNOTATION, FOREGROUND_CASCADE_FINALIZER, FOREGROUND_DELETION_FINALIZER,
};
use cascade_guard_testkit::rng::Rng;
use cascade_guard_testkit::tree::{
    Provider, assert_foreground, assert_needed_after, config_maps, create_tree, tree_timeline,
    wait_held,
};
use cascade_guard_testkit::*;
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DynamicObject, ListParams};
use kube::{Api, ResourceExt};
use local_cluster::testing::Scope;
use local_cluster::timeline::Timeline;
use local_cluster::wait;
use tokio::sync::Mutex;

/// The tests here start and kill controllers: one at a time.
static SERIAL: Mutex<()> = Mutex::const_new(());

async fn make_trees(s: &Scope<'_>, n: usize) -> Timeline {
    let resource = CONVERT.resource();
    let timeline = tree_timeline(&s.client, &resource, &s.namespace).await;
    for i in 0..n {
        create_tree(&s.client, &resource, &s.namespace, &format!("tree-{i}"), 2).await;
    }
    for i in 0..n {
        wait_held(&s.client, &resource, &s.namespace, &format!("tree-{i}")).await;
    }
    timeline
}

/// Deletes every tree with a client's default (Background, or no policy) at
/// random moments.
async fn delete_all(s: &Scope<'_>, n: usize, rng: &mut Rng) {
    let resource = CONVERT.resource();
    for i in 0..n {
        tokio::time::sleep(rng.millis(0, 300)).await;
        let spec = if rng.next_u64().is_multiple_of(2) {
            DeleteSpec::propagation("Background")
        } else {
            DeleteSpec::default()
        };
        let got = delete(
            &s.client,
            &resource,
            &s.namespace,
            &format!("tree-{i}"),
            &spec,
        )
        .await;
        assert!(got.allowed(), "tree-{i}: {got:?}");
    }
}

async fn assert_all_done(env: &Env, s: &Scope<'_>, timeline: &Timeline, n: usize) {
    let resource = CONVERT.resource();
    for i in 0..n {
        let name = format!("tree-{i}");
        let gone = timeline
            .wait_gone(&resource.kind, &name, Duration::from_secs(120))
            .await;
        assert!(
            gone.is_some(),
            "{name} never finished:\n{}\n{}",
            timeline.describe(),
            env.cp.log_tails(40)
        );
        assert_foreground(timeline, &resource.kind, &name, 2);
    }
    // Nothing orphaned: no dependent and no XR left behind.
    let maps: Api<ConfigMap> = Api::namespaced(s.client.clone(), &s.namespace);
    let left = maps
        .list(&ListParams::default().labels("crossplane.io/composite"))
        .await
        .expect("list");
    assert!(
        left.items.is_empty(),
        "orphaned: {:?}",
        left.items.iter().map(|c| c.name_any()).collect::<Vec<_>>()
    );
    let xrs: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), &s.namespace, &resource);
    assert!(
        xrs.list(&ListParams::default())
            .await
            .expect("list")
            .items
            .is_empty()
    );
}

#[tokio::test]
async fn sigkill_at_random_points_across_20_cascades_loses_nothing() {
    let _serial = SERIAL.lock().await;
    let env = bare_env().await;
    let _stop = env.controllers_stop_on_drop();
    let s = Scope::new(&env.cp, "sigkill").await;
    let mut rng = Rng::from_env("sigkill");
    let mut current = env.start_controller(&["--no-leader-election"]);
    let timeline = make_trees(&s, 20).await;
    let _provider = Provider::start(
        s.client.clone(),
        s.namespace.clone(),
        Duration::from_millis(400),
    );

    let mut deleter_rng = Rng(rng.next_u64() | 1);
    let deleting = delete_all(&s, 20, &mut deleter_rng);
    let chaos = async {
        let mut kills = 0;
        // Kill while deletes arrive and cascades run; deletes made while it is
        // down wait for it (the finalizer holds them).
        while kills < 8 {
            tokio::time::sleep(rng.millis(200, 1500)).await;
            env.kill_controller(current);
            kills += 1;
            tokio::time::sleep(rng.millis(0, 1500)).await;
            current = env.start_controller(&["--no-leader-election"]);
        }
        kills
    };
    let ((), kills) = tokio::join!(deleting, chaos);
    eprintln!("killed cascade-guard {kills} times");
    assert_all_done(env, &s, &timeline, 20).await;
    env.stop_controller(current);
}

#[tokio::test]
async fn the_leader_killed_while_a_second_replica_runs_loses_nothing() {
    let _serial = SERIAL.lock().await;
    let env = bare_env().await;
    let _stop = env.controllers_stop_on_drop();
    let s = Scope::new(&env.cp, "leader").await;
    let mut rng = Rng::from_env("leader");
    let flags = [
        // The chart's Role names the Lease it may keep: the default id, in
        // CONTROLLER_HOME (start_controller's default).
        "--leader-election-lease-duration=3s",
        "--leader-election-renew-interval=1s",
    ];
    let mut replicas = vec![env.start_controller(&flags), env.start_controller(&flags)];
    let timeline = make_trees(&s, 10).await;
    let _provider = Provider::start(
        s.client.clone(),
        s.namespace.clone(),
        Duration::from_millis(400),
    );
    let leases: Api<Lease> = Api::namespaced(s.client.clone(), CONTROLLER_HOME);

    let mut deleter_rng = Rng(rng.next_u64() | 1);
    let deleting = delete_all(&s, 10, &mut deleter_rng);
    let leader = |holder: &str, replicas: &[usize]| {
        replicas.iter().position(|&n| {
            env.controller_pid(n)
                .is_some_and(|pid| holder.ends_with(&format!("-{pid}")))
        })
    };
    let holder = || async {
        leases
            .get("cascade-guard")
            .await
            .ok()
            .and_then(|l| l.spec?.holder_identity)
            .unwrap_or_default()
    };
    let chaos = async {
        let mut kills = 0;
        for _ in 0..2 {
            // Wait for a live leader (the previous one's lease must expire first).
            let current = wait::until(Duration::from_secs(30), || async {
                let h = holder().await;
                leader(&h, &replicas).map(|i| (i, h))
            })
            .await;
            let Some((i, h)) = current else { break };
            tokio::time::sleep(rng.millis(100, 800)).await;
            env.kill_controller(replicas[i]);
            kills += 1;
            eprintln!("killed the leader {h}");
            // A new standby, as the Deployment would start.
            replicas[i] = env.start_controller(&flags);
        }
        kills
    };
    let ((), kills) = tokio::join!(deleting, chaos);
    assert_eq!(kills, 2, "the chaos never found a leader to kill");
    assert_all_done(env, &s, &timeline, 10).await;
    let lease = leases.get("cascade-guard").await.expect("lease");
    let transitions = lease
        .spec
        .and_then(|s| s.lease_transitions)
        .unwrap_or_default();
    assert!(
        transitions >= 2,
        "leadership moved {transitions} times for 2 kills"
    );
    for n in replicas {
        env.stop_controller(n);
    }
}

/// `cascade-guard uninstall` (with the controller stopped) leaves no admission
/// policy and no finalizer behind, and deletes then go through unchecked.
#[tokio::test]
async fn uninstall_leaves_nothing_behind() {
    let _serial = SERIAL.lock().await;
    let env = bare_env().await;
    let _stop = env.controllers_stop_on_drop();
    let s = Scope::new(&env.cp, "uninstall").await;
    let n = env.start_controller(&["--no-leader-election"]);
    let resource = CONVERT.resource();
    create_tree(&s.client, &resource, &s.namespace, "held", 0).await;
    wait_held(&s.client, &resource, &s.namespace, "held").await;
    env.wait_for_protection(&s.client, &REFUSE.resource()).await;
    env.stop_controller(n);

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cascade-guard"))
        .args(["uninstall", "--kubeconfig"])
        .arg(env.cp.kubeconfig_path())
        .output()
        .expect("uninstall");
    assert!(
        out.status.success(),
        "uninstall: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let policies: Api<ValidatingAdmissionPolicy> = Api::all(s.client.clone());
    let left = policies
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=cascade-guard"))
        .await
        .expect("list");
    assert!(left.items.is_empty(), "policies left: {}", left.items.len());
    let xrs: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), &s.namespace, &resource);
    let held = xrs.get("held").await.expect("still there");
    assert!(
        !held
            .finalizers()
            .iter()
            .any(|f| f.starts_with("cascade-guard.dev/")),
        "{:?}",
        held.finalizers()
    );
    // Nothing refuses now, and nothing holds the object.
    let refuse_xr = REFUSE.resource();
    let api: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), &s.namespace, &refuse_xr);
    api.create(&Default::default(), &composite(&refuse_xr, "free", true))
        .await
        .expect("create");
    // The API server drops a deleted policy from its cache a moment later.
    let lifted = wait::until(Duration::from_secs(30), || async {
        let got = delete(
            &s.client,
            &refuse_xr,
            &s.namespace,
            "free",
            &DeleteSpec::propagation("Background"),
        )
        .await;
        got.allowed().then_some(())
    })
    .await;
    assert!(lifted.is_some(), "deletes still refused after uninstall");
    let got = delete(
        &s.client,
        &resource,
        &s.namespace,
        "held",
        &DeleteSpec::propagation("Background"),
    )
    .await;
    assert!(got.allowed(), "{got:?}");
    let gone = wait::until(Duration::from_secs(10), || async {
        xrs.get_opt("held").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(gone.is_some(), "the object stayed stuck after uninstall");
}

/// Sibling order across a restart mid-teardown: the tree's `tree-1` is held
/// for `tree-0` (the `cascade-guard.dev/needs` annotation), the tree is
/// deleted, and cascade-guard is SIGKILLed and started again while `tree-0`
/// is still going. The new process must not let go of `tree-1` before it
/// knows which kinds are ordered (it once did, at its first look, and
/// deleted it at once: found by the randomized real-Crossplane test).
#[tokio::test]
async fn a_restart_mid_teardown_keeps_what_sibling_order_holds() {
    let _serial = SERIAL.lock().await;
    let env = bare_env().await;
    let _stop = env.controllers_stop_on_drop();
    let s = Scope::new(&env.cp, "sibling-restart").await;
    let first = env.start_controller(&["--no-leader-election"]);
    let resource = CONVERT.resource();
    let timeline = tree_timeline(&s.client, &resource, &s.namespace).await;
    create_tree(&s.client, &resource, &s.namespace, "tree", 2).await;
    let maps: Api<DynamicObject> =
        Api::namespaced_with(s.client.clone(), &s.namespace, &config_maps());
    maps.patch(
        "tree-0",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(
            serde_json::json!({"metadata": {"annotations": {"cascade-guard.dev/needs": "ConfigMap/tree-1"}}}),
        ),
    )
    .await
    .expect("annotate tree-0");
    wait_held(&s.client, &resource, &s.namespace, "tree").await;
    let held = wait_sibling_held(
        &s.client,
        CONTROLLER_HOME,
        &config_maps(),
        Some(&s.namespace),
        "tree-1",
        Duration::from_secs(60),
    )
    .await;
    assert!(held, "tree-1 was never held");
    // In effect once the API server refuses a (dry-run) delete of it.
    let dry_run = kube::api::DeleteParams {
        dry_run: true,
        ..kube::api::DeleteParams::default()
    };
    let refused = wait::until(Duration::from_secs(60), || async {
        maps.delete("tree-1", &dry_run).await.err().map(|_| ())
    })
    .await;
    assert!(
        refused.is_some(),
        "the hold policy never refused tree-1's delete"
    );
    // tree-0 goes 15 s after its delete: the restart falls inside.
    let _provider = Provider::start(
        s.client.clone(),
        s.namespace.clone(),
        Duration::from_secs(15),
    );
    let got = delete(
        &s.client,
        &resource,
        &s.namespace,
        "tree",
        &DeleteSpec::default(),
    )
    .await;
    assert!(got.allowed(), "delete the tree: {got:?}");
    let deleting = wait::until(Duration::from_secs(30), || async {
        timeline.terminating("ConfigMap", "tree-0").map(|_| ())
    })
    .await;
    assert!(
        deleting.is_some(),
        "tree-0 was never deleted\n{}",
        timeline.describe()
    );
    env.kill_controller(first);
    env.start_controller(&["--no-leader-election"]);
    let gone = timeline
        .wait_gone(resource.kind.as_str(), "tree", Duration::from_secs(120))
        .await;
    assert!(
        gone.is_some(),
        "the tree never left\n{}",
        timeline.describe()
    );
    assert_needed_after(
        &timeline,
        "tree-0",
        "tree-1",
        "the restart let go of what sibling order held",
    );
}

/// A conversion survives a restart: cascade-guard converts a Background delete
/// and marks the XR converted, is SIGKILLed, and the garbage collector ends
/// the cascade while it is down (`foregroundDeletion` cleared, the XR still
/// held by cascade-guard's finalizer). The next replica, with nothing in
/// memory, reads the mark and lets the XR go: it issues no second Foreground
/// delete, which would re-add `foregroundDeletion` for a garbage collector
/// that has already finished with the object (found by the random faults on
/// real Crossplane: a new leader's re-add right after the garbage
/// collector's clear, around an API server restart, was never cleared again).
#[tokio::test]
async fn a_conversion_marked_on_the_xr_is_not_issued_again_after_a_restart() {
    let one = (Some("Foreground".to_string()), Some(200));
    marked_then_restarted("marked", "Background", &[one]).await;
}

/// The same for a delete that was foreground from the start (a user's
/// `--cascade=foreground`, Crossplane's replay, the garbage collector's own
/// delete of a dependent): cascade-guard marks the cascade it did not start,
/// and the next replica converts nothing. Unmarked, a new leader that came
/// after the garbage collector had ended the cascade of two nested XRs
/// converted both, and they stayed with `foregroundDeletion` (soak seed
/// 1796387107332808193, run 4, round 4).
#[tokio::test]
async fn a_foreground_cascade_seen_before_a_restart_is_not_converted_after_it() {
    marked_then_restarted("fg-marked", "Foreground", &[]).await;
}

/// Deletes XR `name` with `propagation`, waits until it is in a foreground
/// cascade and marked, kills the controller, lets the garbage collector end
/// the cascade, starts another and waits until the XR is gone; cascade-guard's
/// deletes of the XR (policy and response code) must be `expected`.
async fn marked_then_restarted(
    name: &str,
    propagation: &'static str,
    expected: &[(Option<String>, Option<i64>)],
) {
    let _serial = SERIAL.lock().await;
    let env = bare_env().await;
    let _stop = env.controllers_stop_on_drop();
    let s = Scope::new(&env.cp, name).await;
    let resource = CONVERT.resource();
    let first = env.start_controller(&["--no-leader-election"]);
    let timeline = tree_timeline(&s.client, &resource, &s.namespace).await;
    create_tree(&s.client, &resource, &s.namespace, name, 2).await;
    wait_held(&s.client, &resource, &s.namespace, name).await;
    let got = delete(
        &s.client,
        &resource,
        &s.namespace,
        name,
        &DeleteSpec::propagation(propagation),
    )
    .await;
    assert!(got.allowed(), "{got:?}");
    let xrs: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), &s.namespace, &resource);
    let has = |xr: &DynamicObject, finalizer: &str| xr.finalizers().iter().any(|f| f == finalizer);
    let converted = wait::until(Duration::from_secs(60), || async {
        let xr = xrs.get_opt(name).await.ok().flatten()?;
        (xr.annotations().contains_key(CONVERTED_ANNOTATION)
            && has(&xr, FOREGROUND_DELETION_FINALIZER))
        .then_some(())
    })
    .await;
    assert!(
        converted.is_some(),
        "never converted and marked: {:?}",
        xrs.get_opt(name).await
    );
    env.kill_controller(first);

    // The composed resources let go while cascade-guard is down: the garbage
    // collector ends the cascade.
    let _provider = Provider::start(s.client.clone(), s.namespace.clone(), Duration::ZERO);
    let ended = wait::until(Duration::from_secs(60), || async {
        let xr = xrs.get_opt(name).await.ok().flatten()?;
        (!has(&xr, FOREGROUND_DELETION_FINALIZER) && has(&xr, FOREGROUND_CASCADE_FINALIZER))
            .then_some(())
    })
    .await;
    assert!(
        ended.is_some(),
        "the garbage collector never ended the cascade: {:?}",
        xrs.get_opt(name).await
    );

    let second = env.start_controller(&["--no-leader-election"]);
    let gone = timeline
        .wait_gone(&resource.kind, name, Duration::from_secs(60))
        .await;
    assert!(
        gone.is_some(),
        "the XR was never let go:\n{}",
        timeline.describe()
    );
    let conversions: Vec<_> = local_cluster::audit::read(&audit_log::audit_log(&env.cp))
        .expect("the API server's audit log")
        .into_iter()
        .filter(|e| {
            e.verb == "delete"
                && e.effective_username() == CONTROLLER_USER
                && e.is_about(&resource.plural, &s.namespace, name)
        })
        .map(|e| {
            (
                e.propagation_policy().map(str::to_string),
                e.response_code(),
            )
        })
        .collect();
    let logs = [first, second].map(|n| {
        std::fs::read_to_string(env.cp.log_path(&format!("cascade-guard-{n}"))).unwrap_or_default()
    });
    assert_eq!(
        conversions,
        expected,
        "cascade-guard's deletes of the XR; its logs:\n{}",
        logs.join("\n----\n")
    );
    env.stop_controller(second);
}
