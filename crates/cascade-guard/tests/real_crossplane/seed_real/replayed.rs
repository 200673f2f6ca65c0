//! A Background delete that a Usage held, replayed by Crossplane under Refuse.

use super::*;

// ---------------------------------------------------------------------------
// A replayed Background delete under Refuse. Crossplane's Usage webhook
// records the policy of a delete it refuses (the annotation below), and when
// the Usage goes it replays that delete once, 2 s later, as its own service
// account (crossplane v2.3.4, internal/controller/protection/usage/
// reconciler.go). Under Refuse a user's Background delete of a protected XR
// never reaches the Usage webhook (admission policies run before webhooks), so
// a Background attempt is recorded only while the kind was not yet under
// Refuse: here under Warn, the gentle roll-out before Refuse. Crossplane's
// replay is then refused like anyone's, and Crossplane does not try again.

pub(crate) const DELETION_ATTEMPT_ANNOTATION: &str =
    "usage.crossplane.io/deletion-attempt-with-policy";

/// `kubectl delete <target> -n <ns> [extra]`: (succeeded, stdout + stderr).
pub(crate) async fn kubectl_delete_args(
    stack: &Stack,
    target: &str,
    ns: &str,
    extra: &[&str],
) -> (bool, String) {
    let out = tokio::process::Command::new(&stack.kubectl)
        .args(["delete", target, "-n", ns, "--wait=false"])
        .args(extra)
        .env("KUBECONFIG", stack.cp.kubeconfig_path())
        .output()
        .await
        .expect("kubectl runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A Background attempt recorded under Warn and replayed by Crossplane under
/// Refuse: refused, and then nothing is stuck (the XR and what it composed
/// are intact and not terminating), and what happened is on record where a
/// user looks: the XR keeps Crossplane's annotation with the recorded policy
/// and gets cascade-guard's `ReplayedDeleteRefused` Event, and Crossplane's
/// log has cascade-guard's refusal with the command that works, which then
/// tears it down in order.
pub(crate) async fn a_replayed_background_delete_under_refuse_leaves_nothing_stuck_and_says_why() {
    let (stack, _shared) = shared_stack().await;
    let client = stack.cp.admin().await.expect("admin client");
    let kind = "ReplayApp";
    let xrds = v2_xrds();
    apply_cluster_object(&client, &xrds, dropped_xrd(kind, Mode::Warn)).await;
    let config_map = config_map_part();
    apply_cluster_object(
        &client,
        &compositions(),
        pt_composition(DROP_GROUP, kind, vec![config_map]),
    )
    .await;
    let target = format!("replayapps.{DROP_GROUP}");
    wait_generated_crd(&client, &target).await;
    let ns = "seed-replay";
    create_namespace(&client, ns).await;
    let apps = modelplane::resource(DROP_GROUP, "v1", kind, "replayapps");
    let app_api = api(&client, &apps, Some(ns));
    let timeline = xrs_and_config_maps(&client, &apps, ns).await;
    create_drop_xr(&app_api, kind, ns, "app").await;
    let composed = when_ready(&app_api, "app", "/spec/crossplane/resourceRefs/0/name")
        .await
        .unwrap_or_else(|| panic!("{kind} app never became Ready\n{}", timeline.describe()));
    // Warn in effect (a server-side dry run warns; nothing is recorded yet).
    let warned = wait::until_lasting(Duration::from_secs(60), || async {
        let (_, said) = kubectl_delete_args(stack, &target, ns, &["app", "--dry-run=server"]).await;
        said.contains("cascade-guard warning").then_some(())
    })
    .await;
    assert!(warned.is_some(), "Warn never in effect for {kind}");

    // An operator holds the XR for a maintenance window: a reason-only Usage
    // that replays the deletes it refuses.
    let usages = api(&client, &modelplane::usages(), Some(ns));
    usages
        .patch(
            "maintenance",
            &PatchParams::apply("seed-real").force(),
            &Patch::Apply(json!({
                "apiVersion": "protection.crossplane.io/v1beta1", "kind": "Usage",
                "metadata": {"name": "maintenance", "namespace": ns},
                "spec": {
                    "of": {"apiVersion": format!("{DROP_GROUP}/v1"), "kind": kind,
                        "resourceRef": {"name": "app"}},
                    "reason": "maintenance window",
                    "replayDeletion": true,
                },
            })),
        )
        .await
        .unwrap_or_else(|e| panic!("create the Usage: {e}"));
    let in_use = wait::until_lasting(Duration::from_secs(60), || async {
        let o = app_api.get_opt("app").await.ok().flatten()?;
        (o.labels().get(IN_USE_LABEL).map(String::as_str) == Some("true")).then_some(())
    })
    .await;
    assert!(in_use.is_some(), "{kind} app never became in use");

    // The user's plain delete: cascade-guard warns, the Usage refuses and
    // records the policy.
    let (ok, said) = kubectl_delete_args(stack, &target, ns, &["app"]).await;
    assert!(!ok, "the delete of an XR in use went through: {said}");
    assert!(
        said.contains("cascade-guard warning")
            && said.contains("nousages.protection.crossplane.io")
            && said.contains("maintenance window"),
        "unexpected answer: {said}"
    );
    eprintln!("replay: the user's delete under Warn: {}", said.trim());
    let app = app_api.get("app").await.expect("the XR");
    assert_eq!(
        app.annotations()
            .get(DELETION_ATTEMPT_ANNOTATION)
            .map(String::as_str),
        Some("Background"),
        "the Usage webhook did not record the attempt"
    );

    // The roll-out moves on to Refuse.
    let xrd = format!("replayapps.{DROP_GROUP}");
    api(&client, &xrds, None)
        .patch(
            &xrd,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {POLICY_ANNOTATION: "Refuse"}}})),
        )
        .await
        .unwrap_or_else(|e| panic!("annotate {xrd}: {e}"));
    let dry_run = DeleteParams {
        dry_run: true,
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    let refusing = wait::until_lasting(Duration::from_secs(60), || async {
        matches!(app_api.delete("app", &dry_run).await,
            Err(kube::Error::Api(ref s)) if s.code == 403)
        .then_some(())
    })
    .await;
    assert!(refusing.is_some(), "Refuse never in effect for {kind}");

    // The maintenance window ends: Crossplane lets go and replays the
    // Background delete, which cascade-guard refuses.
    usages
        .delete("maintenance", &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete the Usage: {e}"));
    let replayed = wait::until_lasting(Duration::from_secs(90), || async {
        local_cluster::audit::read(&audit_log::audit_log(&stack.cp))
            .expect("the API server's audit log")
            .into_iter()
            .find(|e| {
                e.verb == "delete"
                    && !e.dry_run()
                    && e.is_about(&apps.plural, ns, "app")
                    && e.effective_username() == local_cluster::real_crossplane::CROSSPLANE_USER
            })
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "Crossplane never replayed the delete\n{}",
            stack.cp.log_tails(20)
        )
    });
    assert_eq!(
        (replayed.response_code(), replayed.propagation_policy()),
        (Some(403), Some("Background")),
        "Crossplane's replay"
    );
    // Nothing stuck once both have done all they do about the replay:
    // Crossplane has let the Usage go (it replays once, as it does), and
    // cascade-guard has told the XR's owner, on the XR, with both ways out.
    let usage_gone = wait::until_lasting(Duration::from_secs(60), || async {
        usages
            .get_opt("maintenance")
            .await
            .ok()
            .and_then(|u| u.is_none().then_some(()))
    })
    .await;
    assert!(usage_gone.is_some(), "Crossplane never let the Usage go");
    let command = format!("kubectl delete {target} app -n {ns} --cascade=foreground");
    let told = wait::until_lasting(Duration::from_secs(60), || async {
        cascade_guard_testkit::events_about(&client, "app")
            .await
            .into_iter()
            .find(|(reason, note)| reason == "ReplayedDeleteRefused" && note.contains(&command))
    })
    .await;
    let (_, note) =
        told.unwrap_or_else(|| panic!("no ReplayedDeleteRefused Event with {command:?}"));
    assert!(
        note.contains(&format!(
            "kubectl annotate {target} app -n {ns} {DELETION_ATTEMPT_ANNOTATION}-"
        )),
        "{note}"
    );
    eprintln!("replay: the XR's Event: {note}");
    // The XR and its ConfigMap are there, not terminating, and no longer in
    // use; the recorded policy stays.
    let app = app_api.get("app").await.expect("the XR is still there");
    assert!(
        app.metadata.deletion_timestamp.is_none() && is_ready(&app),
        "the XR after the refused replay: {:?}",
        app.metadata
    );
    assert!(!app.labels().contains_key(IN_USE_LABEL));
    assert_eq!(
        app.annotations()
            .get(DELETION_ATTEMPT_ANNOTATION)
            .map(String::as_str),
        Some("Background")
    );
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), ns);
    let map = maps
        .get(&composed)
        .await
        .expect("the composed ConfigMap is still there");
    assert!(map.metadata.deletion_timestamp.is_none());
    // What an operator reads in Crossplane's log: the replay, refused by
    // cascade-guard, with the command that works.
    let log = std::fs::read_to_string(stack.cp.log_path("crossplane")).unwrap_or_default();
    let line = log
        .lines()
        .find(|l| {
            l.contains("Error when replaying deletion of the used resource")
                && l.contains(&format!("cascade-guard refused to delete {kind} app"))
        })
        .unwrap_or_else(|| panic!("no refused replay in Crossplane's log"));
    assert!(line.contains("--cascade=foreground"), "{line}");
    eprintln!("replay: Crossplane logged: {line}");

    let (ok, said) =
        kubectl_delete_args(stack, &target, ns, &["app", "--cascade=foreground"]).await;
    assert!(ok, "kubectl delete --cascade=foreground: {said}");
    let gone = timeline.wait_gone(kind, "app", TEARDOWN_TIMEOUT).await;
    let map_gone = timeline.gone("ConfigMap", &composed);
    let what = "the replay";
    assert!(
        gone.as_ref()
            .zip(map_gone.as_ref())
            .is_some_and(|(xr, map)| scene::revision(map, what) < scene::revision(xr, what)),
        "the XR did not go after its ConfigMap\n{}",
        timeline.describe()
    );
}
