//! The InferenceCluster guarded as Modelplane guards it, on real Crossplane:
//! one ClusterUsage of the cluster per ModelDeployment scheduled to it, each
//! with `replayDeletion`. A ClusterUsage names only cluster-scoped objects, and
//! a ModelDeployment is namespaced, so each guard states its reason instead of
//! a user (Modelplane's function composes them from the ModelDeployments it
//! sees; function-patch-and-transform cannot, so the test writes them as that
//! function would, and deletes each as its ModelDeployment leaves).
//!
//! Crossplane's webhook refuses the cluster's delete (409) while any guard
//! is left and records the request; when the last guard goes, Crossplane
//! replays it. Each attempt is read back from the audit log with the decision
//! it met: cascade-guard's policy (403), Crossplane's webhook (409), or
//! allowed.

use super::*;
use scene::{Scene, cluster_usages};

/// What one DELETE of the InferenceCluster met, as the audit log says.
#[derive(Debug, PartialEq)]
enum Met {
    /// Refused by cascade-guard's admission policy.
    CascadeGuard,
    /// Let through by cascade-guard, refused by Crossplane's webhook: the
    /// cluster is in use.
    InUse,
    Allowed,
}

/// One DELETE of the cluster: who sent it, with which propagation policy,
/// and what it met.
#[derive(Debug)]
struct Attempt {
    user: String,
    policy: Option<String>,
    met: Met,
}

fn attempts(stack: &Stack, resource: &ApiResource, name: &str) -> Vec<Attempt> {
    local_cluster::audit::read(&audit_log::audit_log(&stack.cp))
        .expect("the API server's audit log")
        .into_iter()
        .filter(|e| e.verb == "delete" && e.is_about(&resource.plural, "", name))
        // Not the dry runs that wait for the mode to be in effect.
        .filter(|e| {
            e.request_object
                .as_ref()
                .and_then(|o| o.get("dryRun"))
                .is_none_or(|d| d.as_array().is_none_or(Vec::is_empty))
        })
        .map(|e| Attempt {
            user: e.effective_username().to_string(),
            policy: e.propagation_policy().map(str::to_string),
            met: if e.refused_by_cascade_guard() {
                Met::CascadeGuard
            } else if e.response_code() == Some(409) {
                Met::InUse
            } else if e.response_code().is_some_and(|c| c < 300) {
                Met::Allowed
            } else {
                panic!("{name}: a delete met something else: {e:?}")
            },
        })
        .collect()
}

/// The ModelDeployments scheduled to the cluster, one guard each.
const DEPLOYMENTS: [&str; 2] = ["team-a-chat", "team-b-embed"];

async fn guarded_by_cluster_usages(stack: &Stack, mode: Mode) {
    let lower = mode.as_str().to_lowercase();
    let platform = mode.platform();
    let ics = platform.inference_clusters();
    let name = format!("guarded-{lower}");
    let guards: Vec<String> = DEPLOYMENTS
        .iter()
        .map(|d| format!("{name}-serves-{d}"))
        .collect();
    let mut objects = platform.tree(&name);
    for guard in &guards {
        objects.push((cluster_usages(), None, guard.clone()));
    }
    let on_the_cluster: Vec<(String, String)> = objects
        .iter()
        .filter(|(r, _, _)| r.kind == "Release" || r.kind == "Object")
        .map(|(r, _, n)| (r.kind.clone(), n.clone()))
        .collect();
    let scene = Scene::watch(
        stack,
        &format!("an InferenceCluster guarded per ModelDeployment ({mode:?})"),
        objects,
    )
    .await;
    scene.apply(&ics, platform.inference_cluster(&name)).await;
    scene.wait_ready(&ics, None, &name).await;
    for (guard, deployment) in guards.iter().zip(DEPLOYMENTS) {
        scene
            .apply(
                &cluster_usages(),
                json!({
                    "apiVersion": cluster_usages().api_version,
                    "kind": "ClusterUsage",
                    "metadata": {"name": guard},
                    "spec": {
                        "of": {
                            "apiVersion": ics.api_version,
                            "kind": ics.kind,
                            "resourceRef": {"name": name},
                        },
                        "reason": format!("ModelDeployment {deployment} serves on it"),
                        "replayDeletion": true,
                    },
                }),
            )
            .await;
    }
    scene
        .wait_labelled(&ics, None, &name, IN_USE_LABEL, Some("true"))
        .await;
    stack.wait_in_effect(&ics, None, &name, mode).await;

    let started = Instant::now();
    if mode == Mode::Refuse {
        // The plain delete never reaches Crossplane's webhook.
        let (ok, stderr) = stack.kubectl_delete_of(&ics, None, &name, false).await;
        assert!(
            !ok && stderr.contains("cascade-guard refused"),
            "{}: a plain delete under Refuse: {stderr}",
            scene.what
        );
    }
    // Convert's plain delete, or the foreground delete Refuse's message names:
    // cascade-guard lets it through, Crossplane's webhook refuses it.
    let (ok, stderr) = stack
        .kubectl_delete_of(&ics, None, &name, mode == Mode::Refuse)
        .await;
    assert!(
        !ok && stderr.contains("in-use"),
        "{}: Crossplane's webhook should refuse the guarded cluster's delete: {stderr}",
        scene.what
    );
    // The ModelDeployments leave, one after the other.
    let guard_api = api(&scene.client, &cluster_usages(), None);
    for guard in &guards {
        guard_api
            .delete(guard, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("{}: delete {guard}: {e}", scene.what));
        let gone = scene
            .timeline
            .wait_gone("ClusterUsage", guard, BUILD_TIMEOUT)
            .await;
        assert!(
            gone.is_some(),
            "{}: guard {guard} never left\n{}",
            scene.what,
            scene.states().await
        );
    }

    scene.wait_all_gone(TEARDOWN_TIMEOUT).await;
    // Crossplane's replay came only after the last guard was deleted. Not
    // "gone": Crossplane arms its replay while it lets the last Usage go, and
    // removes the Usage's finalizer after that (retried on conflict), so
    // under load the replay can land before the guard leaves.
    let last_guard = guards
        .iter()
        .map(|g| scene.terminating("ClusterUsage", g))
        .max()
        .expect("two guards");
    let replayed = scene.terminating(&ics.kind, &name);
    assert!(
        last_guard < replayed,
        "{}: the cluster was deleted (#{replayed}) before its last guard was (#{last_guard})\n{}",
        scene.what,
        scene.timeline.describe()
    );
    for (kind, object) in &on_the_cluster {
        scene.assert_before(
            (kind, object),
            ("Cluster", &name),
            "what runs on the cluster goes before it",
        );
    }
    scene.assert_nothing_leaked(stack, &name);

    // Each attempt and what it met: the user's first (under Refuse a plain
    // delete refused by cascade-guard, then the foreground one; under
    // Convert the plain one), let through by cascade-guard and refused as in
    // use; then Crossplane's replays with the policy the user asked for,
    // each refused as in use while a guard was left (Crossplane may replay
    // as each guard goes) or allowed, and Convert's own Foreground delete of
    // the held cluster. Nothing after the user's was refused by cascade-guard.
    let seen = attempts(stack, &ics, &name);
    let (user_policy, user_met): (&str, &[Met]) = if mode == Mode::Refuse {
        ("Foreground", &[Met::CascadeGuard, Met::InUse])
    } else {
        ("Background", &[Met::InUse])
    };
    let user = seen.first().map(|a| a.user.clone()).unwrap_or_default();
    let (mine, rest) = seen.split_at(seen.iter().take_while(|a| a.user == user).count());
    assert_eq!(
        mine.iter().map(|a| &a.met).collect::<Vec<_>>(),
        user_met.iter().collect::<Vec<_>>(),
        "{}: the user's attempts: {seen:#?}",
        scene.what
    );
    assert_eq!(
        mine.last().and_then(|a| a.policy.as_deref()),
        Some(user_policy),
        "{}: {seen:#?}",
        scene.what
    );
    let crossplane = local_cluster::real_crossplane::CROSSPLANE_USER;
    assert!(
        rest.iter().all(|a| match a.met {
            Met::CascadeGuard => false,
            Met::InUse => a.user == crossplane && a.policy.as_deref() == Some(user_policy),
            Met::Allowed => a.user != crossplane || a.policy.as_deref() == Some(user_policy),
        }),
        "{}: after the user's: {seen:#?}",
        scene.what
    );
    assert!(
        rest.iter()
            .any(|a| a.user == crossplane && a.met == Met::Allowed),
        "{}: Crossplane's replay never went through: {seen:#?}",
        scene.what
    );
    eprintln!(
        "{}: the attempts {:?}; everything gone in order in {:?}",
        scene.what,
        seen.iter()
            .map(|a| format!("{} {:?}: {:?}", a.user, a.policy, a.met))
            .collect::<Vec<_>>(),
        started.elapsed()
    );
}

#[tokio::test]
async fn under_refuse_a_guarded_inference_cluster_is_refused_then_replayed_in_order() {
    let (stack, _shared) = shared_stack().await;
    guarded_by_cluster_usages(stack, Mode::Refuse).await;
}

#[tokio::test]
async fn under_convert_a_guarded_inference_cluster_is_refused_then_replayed_in_order() {
    let (stack, _shared) = shared_stack().await;
    guarded_by_cluster_usages(stack, Mode::Convert).await;
}
