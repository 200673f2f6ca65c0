//! An object that carries cascade-guard's finalizer is never lost sight of,
//! whatever happens to its policy: relabelled out of a Convert selector, its
//! kind removed while cascade-guard is down, cascade-guard uninstalled in the
//! middle of a teardown. Nothing stays stuck, nothing leaves before what it
//! composed. Also: a cascade cut short again and again is converted again with
//! backoff, and an explicitly orphaning (break-glass) delete is left alone.

use std::time::Duration;

use cascade_guard_testkit::tree::{
    Provider, assert_foreground, config_maps, create_tree, wait_held,
};
use cascade_guard_testkit::*;
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use local_cluster::testing::Scope;
use local_cluster::timeline::Timeline;
use local_cluster::wait;
use serde_json::json;
use tokio::sync::Mutex;

/// The tests here start and stop controllers: one at a time.
static SERIAL: Mutex<()> = Mutex::const_new(());

const FINALIZER: &str = "cascade-guard.dev/foreground-cascade";

fn xrs(client: &Client, ns: &str, kind: &TestKind) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &kind.resource())
}

async fn label(api: &Api<DynamicObject>, name: &str, team: &str) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"team": team}}})),
    )
    .await
    .unwrap_or_else(|e| panic!("cannot label {name}: {e}"));
}

fn holds(o: &DynamicObject) -> bool {
    o.finalizers().iter().any(|f| f == FINALIZER)
}

/// Waits until `name` no longer carries the finalizer (and says whether it
/// is still there, not deleting).
async fn wait_released(api: &Api<DynamicObject>, name: &str) -> DynamicObject {
    wait::until(Duration::from_secs(30), || async {
        let o = api.get(name).await.ok()?;
        (!holds(&o)).then_some(o)
    })
    .await
    .unwrap_or_else(|| panic!("{name} was never let go"))
}

async fn timeline(s: &Scope<'_>, kind: &TestKind) -> Timeline {
    Timeline::start(
        &s.client,
        &[
            (kind.resource(), Some(s.namespace.clone())),
            (config_maps(), Some(s.namespace.clone())),
        ],
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Relabelled out of a Convert selector: a live object is let go; one deleted
/// while cascade-guard was down (the delete is then allowed, since no binding
/// matches its labels) is carried through its cascade, not left on the
/// finalizer forever.
#[tokio::test]
async fn an_object_relabelled_out_of_reach_is_let_go_or_carried_through() {
    let _serial = SERIAL.lock().await;
    let env = bare_env().await;
    let _stop = env.controllers_stop_on_drop();
    let s = Scope::new(&env.cp, "relabelled").await;
    let n = env.start_controller(&["--no-leader-election"]);
    let policies = cascade_policy_api(&s.client);
    let policy = cascade_policy(
        "selected-team-a",
        SELECTED.kind,
        "Convert",
        Some(json!({"matchLabels": {"team": "a"}})),
    );
    let _ = policies
        .delete("selected-team-a", &DeleteParams::default())
        .await;
    create(&policies, policy).await;
    let api = xrs(&s.client, &s.namespace, &SELECTED);
    let resource = SELECTED.resource();
    let timeline = timeline(&s, &SELECTED).await;

    // Live: in reach it is held; out of reach, let go.
    create_tree(&s.client, &resource, &s.namespace, "moved", 0).await;
    label(&api, "moved", "a").await;
    wait_held(&s.client, &resource, &s.namespace, "moved").await;
    label(&api, "moved", "b").await;
    let moved = wait_released(&api, "moved").await;
    assert!(moved.metadata.deletion_timestamp.is_none());
    // And back in reach: held again.
    label(&api, "moved", "a").await;
    wait_held(&s.client, &resource, &s.namespace, "moved").await;

    // Deleting: relabelled and deleted while cascade-guard is down.
    create_tree(&s.client, &resource, &s.namespace, "carried", 2).await;
    label(&api, "carried", "a").await;
    wait_held(&s.client, &resource, &s.namespace, "carried").await;
    env.stop_controller(n);
    label(&api, "carried", "b").await;
    let got = delete(
        &s.client,
        &resource,
        &s.namespace,
        "carried",
        &DeleteSpec::propagation("Background"),
    )
    .await;
    assert!(
        got.allowed(),
        "out of the selector, nothing refuses: {got:?}"
    );
    let stuck = api.get("carried").await.expect("held by the finalizer");
    assert!(holds(&stuck) && stuck.metadata.deletion_timestamp.is_some());

    let _provider = Provider::start(
        s.client.clone(),
        s.namespace.clone(),
        Duration::from_millis(300),
    );
    env.start_controller(&["--no-leader-election"]);
    let gone = timeline
        .wait_gone(SELECTED.kind, "carried", Duration::from_secs(90))
        .await;
    assert!(
        gone.is_some(),
        "carried stayed on the finalizer:\n{}",
        timeline.describe()
    );
    assert_foreground(&timeline, SELECTED.kind, "carried", 2);
    policies
        .delete("selected-team-a", &DeleteParams::default())
        .await
        .expect("delete the policy");
}

/// A Convert kind whose XRD and then CRD are deleted while cascade-guard is
/// down: its objects, terminating with the CRD, are found at start although
/// no policy names the kind, and each is carried through its cascade; the CRD
/// then goes.
#[tokio::test]
async fn a_kind_removed_while_the_controller_is_down_is_finished() {
    let _serial = SERIAL.lock().await;
    let env = bare_env().await;
    let _stop = env.controllers_stop_on_drop();
    let s = Scope::new(&env.cp, "kind-removed").await;
    let n = env.start_controller(&["--no-leader-election"]);
    let resource = DOOMED.resource();
    let timeline = timeline(&s, &DOOMED).await;
    create_tree(&s.client, &resource, &s.namespace, "doomed", 2).await;
    create_tree(&s.client, &resource, &s.namespace, "idle", 0).await;
    wait_held(&s.client, &resource, &s.namespace, "doomed").await;
    wait_held(&s.client, &resource, &s.namespace, "idle").await;
    env.stop_controller(n);

    xrd_api(&s.client)
        .delete(&DOOMED.xrd_name(), &DeleteParams::default())
        .await
        .expect("delete the XRD");
    let crds: Api<CustomResourceDefinition> = Api::all(s.client.clone());
    crds.delete(&DOOMED.xrd_name(), &DeleteParams::default())
        .await
        .expect("delete the CRD");
    // The CRD's own finalizer deletes every object of the kind; cascade-guard's
    // holds them.
    let terminating = wait::until(Duration::from_secs(30), || async {
        let o = xrs(&s.client, &s.namespace, &DOOMED)
            .get("doomed")
            .await
            .ok()?;
        o.metadata.deletion_timestamp.is_some().then_some(())
    })
    .await;
    assert!(
        terminating.is_some(),
        "deleting the CRD did not delete its objects"
    );

    let _provider = Provider::start(
        s.client.clone(),
        s.namespace.clone(),
        Duration::from_millis(300),
    );
    env.start_controller(&["--no-leader-election"]);
    for name in ["doomed", "idle"] {
        let gone = timeline
            .wait_gone(DOOMED.kind, name, Duration::from_secs(90))
            .await;
        assert!(
            gone.is_some(),
            "{name} stayed on the finalizer:\n{}",
            timeline.describe()
        );
    }
    assert_foreground(&timeline, DOOMED.kind, "doomed", 2);
    let crd_gone = wait::until(Duration::from_secs(60), || async {
        crds.get_opt(&DOOMED.xrd_name())
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    assert!(crd_gone.is_some(), "the CRD stayed terminating");
}

/// The README's uninstall order: with the controller stopped, a plain delete
/// of a held XR is let through and waits on cascade-guard. `uninstall` turns
/// it into a foreground cascade before it lets go, so the XR still leaves
/// after what it composed. While a controller runs, `uninstall` refuses.
#[tokio::test]
async fn uninstall_converts_a_waiting_delete_before_letting_go() {
    let _serial = SERIAL.lock().await;
    let env = bare_env().await;
    let _stop = env.controllers_stop_on_drop();
    let s = Scope::new(&env.cp, "uninstall-order").await;
    let n = env.start_controller(&[]);
    let resource = CONVERT.resource();
    let timeline = timeline(&s, &CONVERT).await;
    create_tree(&s.client, &resource, &s.namespace, "busy", 2).await;
    wait_held(&s.client, &resource, &s.namespace, "busy").await;
    env.wait_for_protection(&s.client, &REFUSE.resource()).await;

    // A controller holds the Lease: uninstall says so and removes nothing.
    let refused = uninstall(env, &[]);
    assert!(!refused.status.success(), "uninstall went ahead");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("is running"), "{said}");
    let vaps: Api<ValidatingAdmissionPolicy> = Api::all(s.client.clone());
    let managed = ListParams::default().labels("app.kubernetes.io/managed-by=cascade-guard");
    assert!(!vaps.list(&managed).await.expect("list").items.is_empty());

    env.stop_controller(n);
    let got = delete(
        &s.client,
        &resource,
        &s.namespace,
        "busy",
        &DeleteSpec::propagation("Background"),
    )
    .await;
    assert!(got.allowed(), "{got:?}");
    let waiting = xrs(&s.client, &s.namespace, &CONVERT)
        .get("busy")
        .await
        .expect("held");
    assert!(
        !waiting
            .finalizers()
            .iter()
            .any(|f| f == "foregroundDeletion")
    );

    let done = uninstall(env, &[]);
    assert!(
        done.status.success(),
        "uninstall: {}",
        String::from_utf8_lossy(&done.stderr)
    );
    let busy = xrs(&s.client, &s.namespace, &CONVERT)
        .get("busy")
        .await
        .expect("still cascading");
    assert!(!holds(&busy), "{:?}", busy.finalizers());
    assert!(
        foreground_deletes(&env.cp, CONVERT.plural, &s.namespace, "busy", "admin") >= 1,
        "uninstall never converted the delete"
    );
    assert!(vaps.list(&managed).await.expect("list").items.is_empty());

    // The garbage collector holds it until its composed resources are gone.
    let _provider = Provider::start(
        s.client.clone(),
        s.namespace.clone(),
        Duration::from_millis(300),
    );
    let gone = timeline
        .wait_gone(CONVERT.kind, "busy", Duration::from_secs(60))
        .await;
    assert!(gone.is_some(), "busy never left:\n{}", timeline.describe());
    assert_foreground(&timeline, CONVERT.kind, "busy", 2);
}

fn uninstall(env: &Env, extra: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_cascade-guard"))
        .args(["uninstall", "--timeout", "60s", "--kubeconfig"])
        .arg(env.cp.kubeconfig_path())
        .args(extra)
        .output()
        .expect("run uninstall")
}

/// A cascade cut short over and over (here by Background deletes in a loop;
/// after an API server restart, by a stale garbage collector) is converted
/// again with growing pauses, not at the rate of the watch.
#[tokio::test]
async fn a_cascade_cut_short_again_and_again_is_converted_with_backoff() {
    let _serial = SERIAL.lock().await;
    let env = bare_env().await;
    let _stop = env.controllers_stop_on_drop();
    let s = Scope::new(&env.cp, "backoff").await;
    env.start_controller(&["--no-leader-election"]);
    let resource = CONVERT.resource();
    let timeline = timeline(&s, &CONVERT).await;
    create_tree(&s.client, &resource, &s.namespace, "cut", 1).await;
    wait_held(&s.client, &resource, &s.namespace, "cut").await;
    let api = xrs(&s.client, &s.namespace, &CONVERT);
    let strips = 60;
    for _ in 0..strips {
        let got = delete(
            &s.client,
            &resource,
            &s.namespace,
            "cut",
            &DeleteSpec::propagation("Background"),
        )
        .await;
        assert!(got.allowed(), "{got:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(api.get("cut").await.is_ok(), "cut left mid-cascade");
    let conversions = foreground_deletes(
        &env.cp,
        CONVERT.plural,
        &s.namespace,
        "cut",
        CONTROLLER_USER,
    );
    // Every strip the controller saw was answered by a conversion until the
    // backoff set in: without it, conversions follow strips one for one.
    assert!(conversions >= 2, "never converted again: {conversions}");
    assert!(
        conversions * 2 < strips,
        "{conversions} conversions for {strips} strips in 6 s: no backoff"
    );
    // Left alone, it still finishes in the foreground.
    let _provider = Provider::start(
        s.client.clone(),
        s.namespace.clone(),
        Duration::from_millis(100),
    );
    let gone = timeline
        .wait_gone(CONVERT.kind, "cut", Duration::from_secs(90))
        .await;
    assert!(gone.is_some(), "cut never left:\n{}", timeline.describe());
    assert_foreground(&timeline, CONVERT.kind, "cut", 1);
}

/// Break-glass with `--cascade=orphan` under Convert: the delete orphans what
/// the XR composed; cascade-guard lets go instead of turning it into a
/// foreground cascade, which would delete them.
#[tokio::test]
async fn an_orphaning_break_glass_delete_is_left_alone() {
    let _serial = SERIAL.lock().await;
    let env = bare_env().await;
    let _stop = env.controllers_stop_on_drop();
    let s = Scope::new(&env.cp, "orphan").await;
    env.start_controller(&["--no-leader-election"]);
    let resource = CONVERT.resource();
    create_tree(&s.client, &resource, &s.namespace, "abandoned", 1).await;
    wait_held(&s.client, &resource, &s.namespace, "abandoned").await;
    let api = xrs(&s.client, &s.namespace, &CONVERT);
    api.patch(
        "abandoned",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"annotations": {"cascade-guard.dev/break-glass": "test"}}}),
        ),
    )
    .await
    .expect("annotate");
    let got = delete(
        &s.client,
        &resource,
        &s.namespace,
        "abandoned",
        &DeleteSpec::propagation("Orphan"),
    )
    .await;
    assert!(got.allowed(), "{got:?}");
    let gone = wait::until(Duration::from_secs(30), || async {
        api.get_opt("abandoned").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(gone.is_some(), "the orphaning delete never finished");
    // Its composed resource stays, orphaned.
    let maps: Api<ConfigMap> = Api::namespaced(s.client.clone(), &s.namespace);
    let dependent = maps
        .get("abandoned-0")
        .await
        .expect("orphaned, not deleted");
    assert!(dependent.metadata.deletion_timestamp.is_none());
    assert!(dependent.owner_references().is_empty());
    // (A conversion after the garbage collector has orphaned the dependents
    // and dropped `orphan` would be harmless, and is rare: cascade-guard lets
    // go as soon as it sees `orphan`. One while `orphan` is on it would have
    // deleted the dependent, checked above.)
}

/// The notes of the Events `reason` about object `name` in `ns`.
async fn events(client: &Client, ns: &str, name: &str, reason: &str) -> Vec<String> {
    let api: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), ns);
    let selector = format!("involvedObject.name={name},reason={reason}");
    api.list(&ListParams::default().fields(&selector))
        .await
        .map(|l| l.items.into_iter().filter_map(|e| e.message).collect())
        .unwrap_or_default()
}

/// A cascade whose composed resources wait on a finalizer that does not go
/// is reported stalled after the stall time (an Event naming what is left and
/// what holds it, the gauge, `status`), and cleared when it moves again: one
/// cascade-guard holds (Convert, a plain delete) ...
#[tokio::test]
async fn a_cascade_that_stops_moving_is_reported_and_cleared_when_it_moves() {
    stops_moving(&CONVERT, "Background").await;
}

/// ... and a foreground cascade of a kind guarded by admission alone (Refuse).
#[tokio::test]
async fn a_foreground_cascade_of_a_refuse_kind_that_stops_moving_is_reported() {
    stops_moving(&REFUSE, "Foreground").await;
}

async fn stops_moving(kind: &TestKind, propagation: &'static str) {
    let _serial = SERIAL.lock().await;
    let env = bare_env().await;
    let _stop = env.controllers_stop_on_drop();
    let s = Scope::new(&env.cp, &format!("stalled-{}", kind.plural)).await;
    let port = free_port();
    env.start_controller(&[
        "--no-leader-election",
        "--stall-after=3s",
        &format!("--http-address=127.0.0.1:{port}"),
    ]);
    let resource = kind.resource();
    let timeline = timeline(&s, kind).await;
    create_tree(&s.client, &resource, &s.namespace, "stuck", 2).await;
    if kind.annotation == Some("Convert") {
        wait_held(&s.client, &resource, &s.namespace, "stuck").await;
    } else {
        env.wait_for_protection(&s.client, &resource).await;
    }
    let got = delete(
        &s.client,
        &resource,
        &s.namespace,
        "stuck",
        &DeleteSpec::propagation(propagation),
    )
    .await;
    assert!(got.allowed(), "{got:?}");

    let stalled = wait::until(Duration::from_secs(60), || async {
        events(&s.client, &s.namespace, "stuck", "CascadeStalled")
            .await
            .into_iter()
            .next()
    })
    .await
    .expect("no CascadeStalled event");
    for part in [
        "ConfigMap/stuck-0",
        "ConfigMap/stuck-1",
        "finalizer table.cascade-guard.dev/hold",
    ] {
        assert!(stalled.contains(part), "{part} not in: {stalled}");
    }
    let gauge = format!(
        "cascade_guard_stalled_cascades{{kind=\"{}.{GROUP}\"}}",
        kind.kind
    );
    let counted = wait::until(Duration::from_secs(30), || async {
        metrics(port).contains(&format!("{gauge} 1")).then_some(())
    })
    .await;
    assert!(counted.is_some(), "{}", metrics(port));
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_cascade-guard"))
        .args(["status", "--kubeconfig"])
        .arg(env.cp.kubeconfig_path())
        .output()
        .expect("status");
    let said = String::from_utf8_lossy(&status.stdout);
    assert!(said.contains("STALLED"), "{said}");
    assert!(said.contains("stuck stalled: no progress"), "{said}");

    // One composed resource goes: progress.
    let maps = Api::namespaced_with(s.client.clone(), &s.namespace, &config_maps());
    release_hold(&maps, "stuck-0").await;
    let resumed = wait::until(Duration::from_secs(30), || async {
        events(&s.client, &s.namespace, "stuck", "CascadeResumed")
            .await
            .into_iter()
            .next()
    })
    .await;
    assert!(resumed.is_some(), "no CascadeResumed event");

    // (The one left stalls again 3 s later; with it gone, nothing is stalled.)
    release_hold(&maps, "stuck-1").await;
    let gone = timeline
        .wait_gone(kind.kind, "stuck", Duration::from_secs(60))
        .await;
    assert!(gone.is_some(), "stuck never left:\n{}", timeline.describe());
    assert_foreground(&timeline, kind.kind, "stuck", 2);
    let cleared = wait::until(Duration::from_secs(30), || async {
        metrics(port).contains(&format!("{gauge} 0")).then_some(())
    })
    .await;
    assert!(cleared.is_some(), "{}", metrics(port));
}
