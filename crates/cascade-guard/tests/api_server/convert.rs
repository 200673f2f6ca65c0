//! Convert mode on the real control plane: any delete of a protected object,
//! from any client, runs as a foreground cascade. Order is asserted from watch
//! events: the XR leaves the API only after every blocking dependent.

use cascade_guard_testkit::audit_log;
use cascade_guard_testkit::picture as picture_check;

use std::time::Duration;

use cascade_guard_testkit::tree::{
    Provider, assert_foreground, config_maps, create_tree, wait_held,
};
use cascade_guard_testkit::*;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use local_cluster::testing::Scope;
use local_cluster::timeline::Timeline;
use local_cluster::{Binaries, audit, wait};
use serde_json::json;

const FINALIZER: &str = "cascade-guard.dev/foreground-cascade";

async fn timeline(s: &Scope<'_>, ns: &str) -> Timeline {
    Timeline::start(
        &s.client,
        &[
            (CONVERT.resource(), Some(ns.to_string())),
            (config_maps(), Some(ns.to_string())),
        ],
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// kubectl, Helm-style and Flux-style Background deletes, a client that sends
/// no policy, a DeleteCollection and a namespace deletion: each completes as a
/// foreground cascade.
#[tokio::test]
async fn every_client_gets_a_foreground_cascade() {
    let env = env().await;
    let s = Scope::new(&env.cp, "every-client").await;
    let resource = CONVERT.resource();
    let kubectl = Binaries::locate().expect("binaries").kubectl;
    let clients = [
        "kubectl",
        "helm-uninstall",
        "flux-prune",
        "no-policy",
        "delete-collection",
        "namespace",
    ];
    let mut cases = Vec::new();
    for client in clients {
        let ns = format!("{}-{client}", s.namespace);
        Api::<Namespace>::all(s.client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}})).expect("ns"),
            )
            .await
            .expect("namespace");
        cases.push((client, ns));
    }
    let runs = cases.iter().map(|(client, ns)| {
        let s = &s;
        let resource = &resource;
        let kubectl = &kubectl;
        async move {
            let timeline = timeline(s, ns).await;
            let _provider =
                Provider::start(s.client.clone(), ns.clone(), Duration::from_millis(500));
            create_tree(&s.client, resource, ns, "tree", 2).await;
            wait_held(&s.client, resource, ns, "tree").await;
            match *client {
                "kubectl" => {
                    // The real kubectl: Background by default.
                    let out = std::process::Command::new(kubectl)
                        .args([
                            "delete",
                            "convertcomposites.table.cascade-guard.dev",
                            "tree",
                            "-n",
                            ns,
                            "--wait=false",
                        ])
                        .env("KUBECONFIG", env.cp.kubeconfig_path())
                        .output()
                        .expect("kubectl");
                    assert!(
                        out.status.success(),
                        "kubectl: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
                "helm-uninstall" | "flux-prune" => {
                    let user = if *client == "helm-uninstall" {
                        "system:serviceaccount:flux-system:helm-controller"
                    } else {
                        "system:serviceaccount:flux-system:kustomize-controller"
                    };
                    let c = env
                        .cp
                        .client_as(user, &["system:masters"])
                        .await
                        .expect("client");
                    let got = delete(
                        &c,
                        resource,
                        ns,
                        "tree",
                        &DeleteSpec::propagation("Background"),
                    )
                    .await;
                    assert!(got.allowed(), "{client}: {got:?}");
                }
                "no-policy" => {
                    let got = delete(&s.client, resource, ns, "tree", &DeleteSpec::default()).await;
                    assert!(got.allowed(), "{client}: {got:?}");
                }
                "delete-collection" => {
                    let got = delete_collection(
                        &s.client,
                        resource,
                        ns,
                        &DeleteSpec::propagation("Background"),
                    )
                    .await;
                    assert!(got.allowed(), "{client}: {got:?}");
                }
                _ => {
                    Api::<Namespace>::all(s.client.clone())
                        .delete(ns, &DeleteParams::default())
                        .await
                        .expect("delete namespace");
                }
            }
            let gone = timeline
                .wait_gone(&resource.kind, "tree", Duration::from_secs(60))
                .await;
            assert!(
                gone.is_some(),
                "{client}: the XR never left:\n{}\n{}",
                timeline.describe(),
                env.cp.log_tails(30)
            );
            assert_foreground(&timeline, &resource.kind, "tree", 2);
        }
    });
    futures::future::join_all(runs).await;
}

/// A Background DELETE in the middle of a cascade strips foregroundDeletion;
/// cascade-guard converts again and the XR still outlives its dependents.
#[tokio::test]
async fn a_background_redelete_mid_cascade_does_not_cut_it_short() {
    let env = env().await;
    let s = Scope::new(&env.cp, "redelete").await;
    let ns = s.namespace.clone();
    let resource = CONVERT.resource();
    let timeline = timeline(&s, &ns).await;
    create_tree(&s.client, &resource, &ns, "tree", 2).await;
    wait_held(&s.client, &resource, &ns, "tree").await;
    let background = DeleteSpec::propagation("Background");
    assert!(
        delete(&s.client, &resource, &ns, "tree", &background)
            .await
            .allowed()
    );
    let xrs: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), &ns, &resource);
    let in_foreground = || async {
        let xr = xrs.get("tree").await.ok()?;
        xr.finalizers()
            .iter()
            .any(|f| f == "foregroundDeletion")
            .then_some(())
    };
    assert!(
        wait::until(Duration::from_secs(30), in_foreground)
            .await
            .is_some(),
        "never converted"
    );
    // The dependents are being deleted, held by the provider's finalizer.
    let maps: Api<ConfigMap> = Api::namespaced(s.client.clone(), &ns);
    let terminating = wait::until(Duration::from_secs(30), || async {
        let cm = maps.get("tree-0").await.ok()?;
        cm.metadata.deletion_timestamp.map(|_| ())
    })
    .await;
    assert!(terminating.is_some());

    // Mid-cascade, someone deletes again with Background: foregroundDeletion
    // is stripped, and cascade-guard converts again: the audit log shows its
    // second Foreground DELETE.
    let again = delete(&s.client, &resource, &ns, "tree", &background).await;
    assert!(again.allowed(), "{again:?}");
    let reconverted = wait::until(Duration::from_secs(30), || async {
        (foreground_deletes(&env.cp, CONVERT.plural, &ns, "tree", CONTROLLER_USER) >= 2)
            .then_some(())
    })
    .await;
    assert!(reconverted.is_some(), "not converted again");
    assert!(
        wait::until(Duration::from_secs(30), in_foreground)
            .await
            .is_some(),
        "not back in a foreground cascade"
    );
    assert!(
        xrs.get_opt("tree").await.expect("get").is_some(),
        "the XR left with dependents held"
    );

    let _provider = Provider::start(s.client.clone(), ns.clone(), Duration::from_millis(100));
    let gone = timeline
        .wait_gone(&resource.kind, "tree", Duration::from_secs(60))
        .await;
    assert!(gone.is_some(), "never finished:\n{}", timeline.describe());
    assert_foreground(&timeline, &resource.kind, "tree", 2);
}

/// cascade-guard never starts a deletion, and never touches a newer object
/// that reuses a deleted one's name: every DELETE it sends carries the UID
/// of the object it means.
#[tokio::test]
async fn it_never_starts_a_deletion_and_never_touches_a_recreated_object() {
    let env = env().await;
    let s = Scope::new(&env.cp, "recreated").await;
    let ns = s.namespace.clone();
    let resource = CONVERT.resource();
    let xrs: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), &ns, &resource);

    // Live objects are held, never deleted.
    for i in 0..3 {
        create_tree(&s.client, &resource, &ns, &format!("live-{i}"), 1).await;
    }
    for i in 0..3 {
        wait_held(&s.client, &resource, &ns, &format!("live-{i}")).await;
    }

    // One is deleted and, the moment it is gone, created again with the same name.
    let _provider = Provider::start(s.client.clone(), ns.clone(), Duration::from_millis(200));
    let old = create_tree(&s.client, &resource, &ns, "same", 1).await;
    wait_held(&s.client, &resource, &ns, "same").await;
    assert!(
        delete(
            &s.client,
            &resource,
            &ns,
            "same",
            &DeleteSpec::propagation("Background")
        )
        .await
        .allowed()
    );
    let gone = wait::until(Duration::from_secs(60), || async {
        match xrs.get_opt("same").await {
            Ok(None) => Some(()),
            _ => None,
        }
    })
    .await;
    assert!(gone.is_some(), "the first 'same' never finished");
    let new = create_tree(&s.client, &resource, &ns, "same", 1).await;
    assert_ne!(old.uid(), new.uid());
    // Held: cascade-guard has seen the new object (and everything before it).
    wait_held(&s.client, &resource, &ns, "same").await;

    for name in ["live-0", "live-1", "live-2", "same"] {
        let o = xrs.get(name).await.expect("still there");
        assert!(
            o.metadata.deletion_timestamp.is_none(),
            "cascade-guard deleted {name}"
        );
    }
    // From the audit log: every DELETE cascade-guard sent carried a UID
    // precondition, and none named the new object.
    let events = audit::read(&audit_log::audit_log(&env.cp)).expect("the API server's audit log");
    let ours: Vec<_> = events
        .iter()
        .filter(|e| e.verb == "delete" && e.effective_username() == CONTROLLER_USER)
        .filter(|e| e.object_ref.as_ref().is_some_and(|r| r.namespace == ns))
        .collect();
    assert!(!ours.is_empty(), "cascade-guard sent no delete at all");
    for e in ours {
        let uid = e
            .request_object
            .as_ref()
            .and_then(|o| o["preconditions"]["uid"].as_str());
        assert!(uid.is_some(), "a delete without a UID precondition: {e:?}");
        assert_ne!(
            uid.map(str::to_string),
            new.uid(),
            "a delete aimed at the new object: {e:?}"
        );
        assert_eq!(e.propagation_policy(), Some("Foreground"));
    }
}

/// When a kind stops being converted, every object of it is let go (nothing
/// stuck); when it is converted again, they are held again.
#[tokio::test]
async fn finalizers_follow_the_kind_in_and_out_of_convert_mode() {
    let env = env().await;
    let s = Scope::new(&env.cp, "in-and-out").await;
    let ns = s.namespace.clone();
    let resource = CONVERT_TOGGLED.resource();
    for i in 0..3 {
        create_tree(&s.client, &resource, &ns, &format!("xr-{i}"), 0).await;
    }
    for i in 0..3 {
        wait_held(&s.client, &resource, &ns, &format!("xr-{i}")).await;
    }
    let xrds = xrd_api(&s.client);
    let annotate = |mode: &str| {
        Patch::Merge(
            json!({"metadata": {"annotations": {"cascade-guard.dev/deletion-policy": mode}}}),
        )
    };
    xrds.patch(
        &CONVERT_TOGGLED.xrd_name(),
        &PatchParams::default(),
        &annotate("Refuse"),
    )
    .await
    .expect("annotate");
    let xrs: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), &ns, &resource);
    let released = wait::until(Duration::from_secs(30), || async {
        let list = xrs.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .all(|o| !o.finalizers().iter().any(|f| f == FINALIZER))
            .then_some(())
    })
    .await;
    assert!(
        released.is_some(),
        "finalizers left after leaving Convert:\n{}",
        env.cp.log_tails(20)
    );
    xrds.patch(
        &CONVERT_TOGGLED.xrd_name(),
        &PatchParams::default(),
        &annotate("Convert"),
    )
    .await
    .expect("annotate");
    for i in 0..3 {
        wait_held(&s.client, &resource, &ns, &format!("xr-{i}")).await;
    }
}

/// The API server's verdicts on a held, live object of a Convert kind agree
/// with the decision table, for every client policy and requester: everything
/// goes through (and is converted) but an explicit Orphan.
#[tokio::test]
async fn the_api_server_agrees_with_the_decision_table_for_held_objects() {
    use cascade_guard::policy::{CompileSettings, Mode, ObjectState, Shape, decide};
    let env = env().await;
    let s = Scope::new(&env.cp, "convert-table").await;
    let resource = CONVERT.resource();
    create_tree(&s.client, &resource, &s.namespace, "held", 1).await;
    wait_held(&s.client, &resource, &s.namespace, "held").await;
    let xrs: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), &s.namespace, &resource);
    let stored = xrs.get("held").await.expect("held");
    let object = serde_json::to_value(&stored).expect("json");
    let users = [
        ("alice@example.com", false),
        (
            "system:serviceaccount:kube-system:generic-garbage-collector",
            true,
        ),
        (
            "system:serviceaccount:kube-system:namespace-controller",
            false,
        ),
        ("system:serviceaccount:crossplane-system:crossplane", false),
    ];
    let policies: [(Option<&str>, Option<bool>); 6] = [
        (None, None),
        (Some("Background"), None),
        (Some("Foreground"), None),
        (Some("Orphan"), None),
        (None, Some(true)),
        (None, Some(false)),
    ];
    let mut mismatches = Vec::new();
    for (user, uid) in users {
        let client = env
            .cp
            .client_as(user, &["system:masters"])
            .await
            .expect("client");
        for (propagation, orphan) in policies {
            let spec = DeleteSpec {
                propagation,
                orphan_dependents: orphan,
                uid: uid.then(|| stored.uid().expect("uid")),
                dry_run: true,
            };
            let got = delete(&client, &resource, &s.namespace, "held", &spec).await;
            let expected = decide(
                Mode::Convert,
                Shape::CompositeResource,
                &CompileSettings::default(),
                &spec.as_request(
                    user,
                    ObjectState::from_object(&object, Shape::CompositeResource),
                ),
            );
            if got.allowed() != expected.allowed {
                mismatches.push(format!(
                    "{user} {propagation:?} {orphan:?}: {} {}",
                    got.code, got.message
                ));
            }
            let orphan_asked = propagation == Some("Orphan") || orphan == Some(true);
            if got.allowed() == orphan_asked && !user.contains("garbage-collector") {
                mismatches.push(format!(
                    "{user} {propagation:?} {orphan:?}: unexpected {}",
                    got.code
                ));
            }
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

/// `cascade-guard trace` follows a real teardown to the end: every object
/// seen going, the XR last, and a summary that says so; `-o json` is one JSON
/// object per change.
#[tokio::test]
async fn trace_follows_a_teardown_to_the_end() {
    use cascade_guard::cli::trace::{Options, Output, trace};
    let env = env().await;
    let s = Scope::new(&env.cp, "trace").await;
    let resource = CONVERT.resource();
    create_tree(&s.client, &resource, &s.namespace, "traced", 3).await;
    wait_held(&s.client, &resource, &s.namespace, "traced").await;
    let _provider = Provider::start(
        s.client.clone(),
        s.namespace.clone(),
        Duration::from_millis(300),
    );

    let options = Options {
        resource: "convertcomposites.table.cascade-guard.dev".into(),
        name: "traced".into(),
        namespace: Some(s.namespace.clone()),
        output: Output::Text,
        interval: Duration::from_millis(100),
        timeout: Some(Duration::from_secs(60)),
        live: false,
        once: false,
        leader_election_id: "cascade-guard".into(),
    };
    let client = s.client.clone();
    let written = Written::default();
    let mut out = written.clone();
    let traced = tokio::spawn(async move {
        let summary = trace(&client, &options, &mut out).await;
        (summary, String::from_utf8(out.take()).expect("utf-8"))
    });
    // Delete once trace has drawn the tree it follows.
    let drawn = wait::until(Duration::from_secs(30), || async {
        written.text().contains("traced").then_some(())
    })
    .await;
    assert!(drawn.is_some(), "trace drew nothing: {}", written.text());
    let got = delete(
        &s.client,
        &resource,
        &s.namespace,
        "traced",
        &DeleteSpec::propagation("Background"),
    )
    .await;
    assert!(got.allowed(), "{got:?}");
    let (summary, text) = traced.await.expect("trace task");
    let summary = summary.expect("trace");
    assert!(summary.complete, "{text}");
    assert_eq!(summary.total, 4, "{text}");
    // trace looks every 100 ms: the XR is never seen gone before a dependent.
    let when = |object: &str| {
        summary
            .order
            .iter()
            .find(|g| g.object == object)
            .map(|g| g.at)
    };
    let xr = when(&format!("ConvertComposite/traced -n {}", s.namespace)).expect("XR seen gone");
    for i in 0..3 {
        let cm =
            when(&format!("ConfigMap/traced-{i} -n {}", s.namespace)).expect("dependent seen gone");
        assert!(cm <= xr, "{text}");
    }
    assert!(text.contains("foreground cascade"), "{text}");
    assert!(text.contains("teardown complete: 4 objects gone"), "{text}");

    // The binary, as a script would use it: JSON lines, exit 0 when complete.
    create_tree(&s.client, &resource, &s.namespace, "scripted", 1).await;
    wait_held(&s.client, &resource, &s.namespace, "scripted").await;
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_cascade-guard"))
        .args([
            "trace",
            "convertcomposites",
            "scripted",
            "-n",
            &s.namespace,
            "-o",
            "json",
            "--timeout",
            "60",
            "--kubeconfig",
        ])
        .arg(env.cp.kubeconfig_path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("trace binary");
    // Delete once it has said what it follows: its first JSON line.
    let mut child = child;
    let stdout = child.stdout.take().expect("stdout");
    let (first_tx, first_rx) = tokio::sync::oneshot::channel();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut lines = std::io::BufReader::new(stdout).lines();
        let mut all = Vec::new();
        if let Some(Ok(first)) = lines.next() {
            all.push(first);
            let _ = first_tx.send(());
        }
        all.extend(lines.map_while(Result::ok));
        all
    });
    tokio::time::timeout(Duration::from_secs(30), first_rx)
        .await
        .expect("trace printed nothing in 30 s")
        .expect("trace ended before printing");
    assert!(
        delete(
            &s.client,
            &resource,
            &s.namespace,
            "scripted",
            &DeleteSpec::default()
        )
        .await
        .allowed()
    );
    let (status, printed) = tokio::task::spawn_blocking(move || {
        let status = child.wait().expect("trace exit");
        (status, reader.join().expect("reader"))
    })
    .await
    .expect("join");
    assert!(status.success(), "{}", printed.join("\n"));
    let lines: Vec<serde_json::Value> = printed
        .iter()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let last = lines.last().expect("output");
    assert_eq!(last["summary"]["complete"], true, "{last}");
    assert!(lines.iter().any(|l| l["what"] == "gone"));
}

/// `cascade-guard trace` as it would be run by hand, with the control
/// plane's kubeconfig, started.
fn start_trace(env: &Env, namespace: &str, args: &[&str]) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_cascade-guard"))
        .args(["trace", "convertcomposites", "-n", namespace])
        .args(args)
        .arg("--kubeconfig")
        .arg(env.cp.kubeconfig_path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("trace binary")
}

/// Whether a started trace exited 0, and its stdout (its stderr with it
/// when it did not).
async fn trace_output(child: std::process::Child) -> (bool, String) {
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("join")
        .expect("trace ends");
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    if out.status.success() {
        (true, stdout)
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        (false, format!("{}: {stderr}\n{stdout}", out.status))
    }
}

async fn trace_binary(env: &Env, namespace: &str, args: &[&str]) -> (bool, String) {
    trace_output(start_trace(env, namespace, args)).await
}

/// The box of a Mermaid picture whose label has `words`: its id.
fn mermaid_box<'a>(text: &'a str, words: &str) -> &'a str {
    text.lines()
        .map(str::trim)
        .find(|l| l.starts_with('n') && l.contains("[\"") && l.contains(words))
        .and_then(|l| l.split('[').next())
        .unwrap_or_else(|| panic!("no box with {words:?} in:\n{text}"))
}

/// `trace --once -o dot|mermaid` on a real teardown that a finalizer holds:
/// both pictures read (Graphviz's dot, the Mermaid grammar check), each
/// dependent deleting and held by its finalizer outlined as the blocker,
/// the XR waiting for them; then, followed to its end, every object gone,
/// ranked in the order the looks saw them leave.
#[tokio::test]
async fn trace_draws_what_holds_a_real_teardown_and_the_order_it_left_in() {
    let env = env().await;
    let s = Scope::new(&env.cp, "trace-picture").await;
    let ns = s.namespace.clone();
    let resource = CONVERT.resource();
    create_tree(&s.client, &resource, &ns, "pictured", 2).await;
    wait_held(&s.client, &resource, &ns, "pictured").await;
    // A plain delete, which Convert turns into a foreground cascade; no
    // provider runs yet, so each ConfigMap's finalizer holds it.
    let got = delete(
        &s.client,
        &resource,
        &ns,
        "pictured",
        &DeleteSpec::propagation("Background"),
    )
    .await;
    assert!(got.allowed(), "{got:?}");
    let maps: Api<ConfigMap> = Api::namespaced(s.client.clone(), &ns);
    let xrs: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), &ns, &resource);
    let held = wait::until(Duration::from_secs(30), || async {
        let xr = xrs.get("pictured").await.ok()?;
        let waiting = xr.finalizers().iter().any(|f| f == "foregroundDeletion");
        let list = maps.list(&ListParams::default()).await.ok()?;
        let deleting = list
            .items
            .iter()
            .filter(|m| m.metadata.deletion_timestamp.is_some())
            .count();
        (waiting && deleting == 2).then_some(())
    })
    .await;
    assert!(held.is_some(), "the cascade never reached the ConfigMaps");

    let (ok, dot) = trace_binary(env, &ns, &["pictured", "--once", "-o", "dot"]).await;
    assert!(ok, "trace --once -o dot failed:\n{dot}");
    picture_check::run_dot("plain", &dot);
    for i in 0..2 {
        let label = format!(
            "label=\"ConfigMap\\n{ns}/pictured-{i}\\ndeleting (before trace looked)\\nfinalizer {HOLD}\""
        );
        let node = dot
            .lines()
            .find(|l| l.contains(&label))
            .unwrap_or_else(|| panic!("no {label} in:\n{dot}"));
        assert!(
            node.contains("color=\"#d35400\", penwidth=3"),
            "not the blocker: {node}"
        );
    }
    assert!(
        dot.contains("waiting for its dependents (foreground cascade)"),
        "{dot}"
    );
    assert_eq!(dot.matches("its owner waits for it").count(), 2, "{dot}");
    assert!(dot.contains("what holds the rest (2)"), "{dot}");

    let (ok, mermaid) = trace_binary(env, &ns, &["pictured", "--once", "-o", "mermaid"]).await;
    assert!(ok, "trace --once -o mermaid failed:\n{mermaid}");
    if let Err(why) = picture_check::check_mermaid(&mermaid) {
        panic!("{why}\n{mermaid}");
    }
    let blockers: Vec<&str> = (0..2)
        .map(|i| mermaid_box(&mermaid, &format!("{ns}/pictured-{i}<br>")))
        .collect();
    assert!(
        mermaid.contains(&format!("  class {} blocker\n", blockers.join(","))),
        "{mermaid}"
    );

    // The provider lets go (2 s after it first sees each ConfigMap deleted,
    // so that trace reads the tree first): followed to the end, every object
    // gone, the ConfigMaps ranked before (or with) the XR that waited.
    let follow = start_trace(
        env,
        &ns,
        &[
            "pictured",
            "-o",
            "dot",
            "--timeout",
            "60",
            "--interval-ms",
            "100",
        ],
    );
    let _provider = Provider::start(s.client.clone(), ns.clone(), Duration::from_secs(2));
    let (ok, dot) = trace_output(follow).await;
    assert!(ok, "trace -o dot did not see the teardown complete:\n{dot}");
    picture_check::run_dot("plain", &dot);
    assert!(dot.contains("teardown complete: 3 objects gone"), "{dot}");
    assert!(
        !dot.contains("penwidth=3"),
        "a blocker left in a finished teardown:\n{dot}"
    );
    let rank_of = |name: &str| {
        let node = dot
            .lines()
            .find(|l| l.contains(&format!("\\n{ns}/{name}\\n")))
            .unwrap_or_else(|| panic!("no {name} in:\n{dot}"));
        let id = node.trim().split(' ').next().expect("an id").to_string();
        dot.lines()
            .position(|l| l.contains("rank=same") && l.contains(&format!(" {id};")))
            .unwrap_or_else(|| panic!("{name} on no rank:\n{dot}"))
    };
    let xr = rank_of("pictured");
    for i in 0..2 {
        assert!(rank_of(&format!("pictured-{i}")) <= xr, "{dot}");
    }
    assert!(dot.contains("left at "), "{dot}");
}

/// A finalizer the API server refuses at first (here an admission policy
/// denies every update in the namespace) is added once it can be: the object
/// is retried, not forgotten.
#[tokio::test]
async fn a_hold_that_fails_is_retried_until_it_lands() {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    let env = env().await;
    let s = Scope::new(&env.cp, "hold-retry").await;
    let ns = s.namespace.clone();
    let resource = CONVERT.resource();
    let name = format!("deny-updates-{ns}");
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(s.client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(s.client.clone());
    policies
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {"resourceRules": [{
                        "apiGroups": [GROUP], "apiVersions": ["*"],
                        "operations": ["UPDATE"], "resources": [CONVERT.plural]}]},
                    "matchConditions": [{"name": "this-test",
                        "expression": format!("object.metadata.namespace == '{ns}'")}],
                    "validations": [{"expression": "false", "message": "the test denies updates"}]
                }
            }))
            .expect("policy"),
        )
        .await
        .expect("create policy");
    bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"policyName": name, "validationActions": ["Deny"]}
            }))
            .expect("binding"),
        )
        .await
        .expect("create binding");

    // In force once a dry-run update of a first object is denied.
    create_tree(&s.client, &resource, &ns, "probe", 0).await;
    let xrs: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), &ns, &resource);
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let in_force = wait::until(Duration::from_secs(30), || async {
        let label = Patch::Merge(json!({"metadata": {"labels": {"probe": "yes"}}}));
        match xrs.patch("probe", &dry_run, &label).await {
            Err(kube::Error::Api(e)) if e.message.contains("the test denies updates") => Some(()),
            _ => None,
        }
    })
    .await;
    assert!(in_force.is_some(), "the test's policy never took effect");

    create_tree(&s.client, &resource, &ns, "late", 0).await;
    // cascade-guard tried, and was refused: its log says so for this object.
    let tried = wait::until(Duration::from_secs(30), || async {
        let log = std::fs::read_to_string(env.cp.log_path("cascade-guard-0")).ok()?;
        log.lines()
            .any(|l| l.contains("cannot add the finalizer") && l.contains("name=late"))
            .then_some(())
    })
    .await;
    assert!(tried.is_some(), "cascade-guard never tried to hold late");
    let late = xrs.get("late").await.expect("late");
    assert!(
        !late.finalizers().iter().any(|f| f == FINALIZER),
        "held although every update was denied"
    );

    bindings
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete binding");
    policies
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete policy");
    wait_held(&s.client, &resource, &ns, "late").await;
    wait_held(&s.client, &resource, &ns, "probe").await;
}

/// A writer the test can read while `trace` writes to it.
#[derive(Clone, Default)]
struct Written(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Written {
    fn text(&self) -> String {
        self.0
            .lock()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    fn take(&self) -> Vec<u8> {
        self.0
            .lock()
            .map(|mut b| std::mem::take(&mut *b))
            .unwrap_or_default()
    }
}

impl std::io::Write for Written {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut b) = self.0.lock() {
            b.extend_from_slice(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A delete that is a foreground cascade already (`--cascade=foreground`):
/// once the garbage collector ends it, cascade-guard releases the XR without
/// a Foreground delete of its own. One, re-adding `foregroundDeletion` just
/// after the garbage collector had cleared it, once left an XR wedged on real
/// Crossplane (soak seed 1796387107332808193, round 4).
#[tokio::test]
async fn a_foreground_delete_is_let_go_without_a_conversion() {
    let env = env().await;
    let s = Scope::new(&env.cp, "fg-from-start").await;
    let resource = CONVERT.resource();
    create_tree(&s.client, &resource, &s.namespace, "fg", 2).await;
    wait_held(&s.client, &resource, &s.namespace, "fg").await;
    let got = delete(
        &s.client,
        &resource,
        &s.namespace,
        "fg",
        &DeleteSpec::propagation("Foreground"),
    )
    .await;
    assert!(got.allowed(), "{got:?}");
    let _provider = Provider::start(s.client.clone(), s.namespace.clone(), Duration::ZERO);
    let xrs: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), &s.namespace, &resource);
    let gone = wait::until(Duration::from_secs(60), || async {
        matches!(xrs.get_opt("fg").await, Ok(None)).then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "fg never left: {:?}",
        xrs.get_opt("fg").await
    );
    let conversions = audit::read(&audit_log::audit_log(&env.cp))
        .expect("the API server's audit log")
        .into_iter()
        .filter(|e| {
            e.verb == "delete"
                && e.effective_username() == CONTROLLER_USER
                && e.is_about(&resource.plural, &s.namespace, "fg")
        })
        .count();
    assert_eq!(conversions, 0, "cascade-guard deleted fg itself");
}
