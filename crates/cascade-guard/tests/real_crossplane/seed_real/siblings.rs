//! Sibling order on real Crossplane beyond the seed's own tree (the tests
//! `without_its_usage_*` above): the shapes where a hand-written Usage is
//! missing or lets go too early. Each hazard is first shown under Off (a
//! foreground cascade alone, nothing held), then prevented under Refuse
//! (`--cascade=foreground`) and Convert (a plain delete), the order asserted
//! by etcd revisions from a watch begun before the objects existed.
//!
//! - A ProviderConfig composed beside the managed resource that uses it (a
//!   ModelReplica composed without its Usage `config-in-use`): in a
//!   foreground cascade the garbage collector deletes the Object's
//!   ProviderConfigUsage first (it blocks its owner's deletion), so the
//!   ProviderConfig, deleted beside it, finds no user and goes, and the
//!   Object can no longer reach its cluster (crossplane-runtime#848).
//! - A standalone Usage (EKSCluster by ServingStack) and a ClusterUsage
//!   (InferenceCluster by InferenceGateway) between two XRs, both deleted:
//!   Crossplane refuses the used XR's delete and records it; it makes the
//!   user the Usage's owner (without blockOwnerDeletion), so the user's
//!   cascade deletes the Usage in its first wave, and Crossplane, which waits
//!   for the user only for a composed Usage, replays the used XR's delete
//!   while the user's own resources still go. cascade-guard holds such a
//!   Usage until its user is gone.
//! - A need two levels down in a sibling XR: a cluster-scoped Fleet composes
//!   an InferenceCluster (without its Usage) and a ServingStack installed on
//!   its cluster, whose Releases need the ProviderConfigs under the
//!   InferenceCluster's EKSCluster. `plan` names the order beforehand.

use super::*;
use scene::{Objects, Scene, cloud_log, cluster_usages, open_cluster_xrd, revision};

/// The client each mode's deletes come from: Convert a plain `kubectl
/// delete`, Refuse the `--cascade=foreground` its refusal names, Off a
/// foreground cascade alone (what sibling order adds to).
fn foreground(mode: Mode) -> bool {
    mode != Mode::Convert
}

/// Waits until the scene's objects are gone, and asserts that the
/// ProviderConfig `config` started deleting only after its user, the Object
/// `engine`, had left.
async fn wait_gone_user_first(scene: &Scene, engine: &str, config: &str) {
    scene.wait_all_gone(TEARDOWN_TIMEOUT).await;
    let user_left = scene.gone("Object", engine);
    let pc_deleted = scene.terminating("ProviderConfig", config);
    assert!(
        user_left < pc_deleted,
        "{}: the ProviderConfig was deleted (#{pc_deleted}) before its user left (#{user_left})\n{}",
        scene.what,
        scene.timeline.describe()
    );
}

/// A ModelReplica composed without the Usage of its ProviderConfig by its
/// engine's Object, on an InferenceCluster of its own, deleted under `mode`;
/// with `by_namespace`, by deleting its namespace instead.
async fn provider_config_beside_its_user(stack: &Stack, mode: Mode, by_namespace: bool) {
    let lower = if by_namespace {
        "namespace".to_string()
    } else {
        mode.as_str().to_lowercase()
    };
    let platform = mode.platform();
    let cluster = Tree::build(stack, &platform, &format!("pcu-{lower}")).await;
    let ns = format!("team-pcu-{lower}");
    create_namespace(&cluster.client, &ns).await;
    let replica = format!("pcu-{lower}-r");
    let (config, engine) = (format!("{replica}-cluster"), format!("{replica}-engine"));
    let at = Some(ns.clone());
    let scene = Scene::watch(
        stack,
        &format!(
            "a ProviderConfig beside its user ({mode:?}{})",
            if by_namespace {
                ", its namespace deleted"
            } else {
                ""
            }
        ),
        vec![
            (platform.model_replicas(), at.clone(), replica.clone()),
            (
                modelplane::kubernetes_provider_configs(),
                at.clone(),
                config.clone(),
            ),
            (modelplane::objects(), at.clone(), engine.clone()),
        ],
    )
    .await;
    let replicas = platform.model_replicas();
    scene
        .apply(
            &replicas,
            platform.model_replica_without_usage(&ns, &replica, &cluster.name),
        )
        .await;
    scene.wait_ready(&replicas, Some(&ns), &replica).await;
    stack
        .wait_in_effect(&replicas, Some(&ns), &replica, mode)
        .await;
    if mode != Mode::Off {
        scene
            .wait_held(
                &modelplane::kubernetes_provider_configs(),
                Some(&ns),
                &config,
            )
            .await;
    }
    let started = Instant::now();
    if by_namespace {
        let [_, kubernetes_usages] = provider_config_usages();
        wait_usage_held(
            &scene.client,
            &modelplane::objects(),
            &kubernetes_usages,
            &ns,
            &engine,
        )
        .await;
        Api::<k8s_openapi::api::core::v1::Namespace>::all(scene.client.clone())
            .delete(&ns, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("{}: delete namespace {ns}: {e}", scene.what));
    } else {
        let (ok, stderr) = stack
            .kubectl_delete_of(&replicas, Some(&ns), &replica, foreground(mode))
            .await;
        assert!(ok, "{}: kubectl delete {replica}: {stderr}", scene.what);
    }
    let mut wedged = None;
    // crossplane-runtime#1150, on the pinned provider-kubernetes v1.2.1: the
    // Object's provider writes its ProviderConfigUsage again at every
    // reconcile, which a terminating namespace forbids once the usage is
    // deleted; sibling order holds the usage until the provider is done, so
    // the Object goes, then its ProviderConfig, then the namespace.
    if by_namespace {
        let objects = api(&scene.client, &modelplane::objects(), Some(&ns));
        let gone = wait::until_lasting(TEARDOWN_TIMEOUT, || async {
            objects.get_opt(&engine).await.ok()?.is_none().then_some(())
        })
        .await;
        if gone.is_none() {
            let failure = objects
                .get_opt(&engine)
                .await
                .ok()
                .flatten()
                .and_then(|o| sync_failure(&o));
            panic!(
                "{}: Object/{engine} never went (its last sync failure: {failure:?})\n{}",
                scene.what,
                scene.timeline.describe()
            );
        }
        wait_gone_user_first(&scene, &engine, &config).await;
        let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(scene.client.clone());
        if let Err(e) = namespace_finishes(&namespaces, &ns).await {
            panic!("{}: {e}", scene.what);
        }
        eprintln!(
            "{}: in order, nothing wedged, the namespace gone, in {:?}",
            scene.what,
            started.elapsed()
        );
    } else if mode == Mode::Off {
        // The hazard, every time: the ProviderConfig is deleted beside the
        // Object that needs it. Whether the provider then loses the race
        // (its ProviderConfig controller sees no ProviderConfigUsage and lets
        // it go before the Object's next reconcile tracks one again) varies:
        // seen both ways on real Crossplane. Lost, the Object wedges on a
        // ProviderConfig that is gone and leaks its load balancer.
        let deleted = wait::until_lasting(Duration::from_secs(60), || async {
            scene
                .timeline
                .terminating("ProviderConfig", &config)
                .map(|_| ())
        })
        .await;
        assert!(
            deleted.is_some(),
            "{}: the ProviderConfig was not deleted\n{}",
            scene.what,
            scene.timeline.describe()
        );
        let objects = api(&scene.client, &modelplane::objects(), Some(&ns));
        let outcome = wait::until_lasting(TEARDOWN_TIMEOUT, || async {
            match objects.get_opt(&engine).await.ok()? {
                None => Some(None),
                Some(o) => {
                    let held = o.finalizers().iter().any(|f| f == MANAGED_FINALIZER);
                    let failure = sync_failure(&o).filter(|_| held)?;
                    failure.contains("provider config").then_some(Some(failure))
                }
            }
        })
        .await;
        let Some(outcome) = outcome else {
            panic!(
                "{}: Object/{engine} neither went nor wedged\n{}\n{}",
                scene.what,
                scene.states().await,
                scene.timeline.describe()
            );
        };
        let pc_deleted = scene.terminating("ProviderConfig", &config);
        let user_left = scene
            .timeline
            .gone("Object", &engine)
            .map(|e| revision(&e, &scene.what));
        assert!(
            user_left.is_none_or(|u| pc_deleted < u),
            "{}: the ProviderConfig was deleted (#{pc_deleted}) only after its user left ({user_left:?})\n{}",
            scene.what,
            scene.timeline.describe()
        );
        match &outcome {
            Some(failure) => eprintln!(
                "{}: the race lost: ProviderConfig/{config} went while Object/{engine} needed it, which wedged: {failure}",
                scene.what
            ),
            None => eprintln!(
                "{}: the race won this time: ProviderConfig/{config} deleted beside Object/{engine}, which went first",
                scene.what
            ),
        }
        wedged = outcome;
        scene.clean_up().await;
    } else {
        wait_gone_user_first(&scene, &engine, &config).await;
        scene.assert_before(
            ("ProviderConfig", &config),
            ("ModelReplica", &replica),
            "a foreground cascade removes the parent last",
        );
        scene.assert_crossplane_never_refused(stack);
        eprintln!(
            "{}: in order, nothing wedged, in {:?}",
            scene.what,
            started.elapsed()
        );
    }
    let (ok, stderr) = stack.kubectl_delete(&cluster, foreground(mode)).await;
    assert!(ok, "kubectl delete {}: {stderr}", cluster.name);
    assert!(
        cluster.wait_all_gone(TEARDOWN_TIMEOUT).await,
        "{}: the cluster's tree stayed: {:?}",
        scene.what,
        cluster.left().await
    );
    // A wedged engine's load balancer leaked with the cluster; nothing else.
    let leaked: Vec<String> = cluster
        .leaked(stack)
        .into_iter()
        .filter(|l| wedged.is_none() || !l.contains(&engine))
        .collect();
    assert!(leaked.is_empty(), "{}: {leaked:?}", scene.what);
}

#[tokio::test]
async fn a_provider_config_beside_its_user_is_deleted_with_it_in_a_foreground_cascade_alone() {
    let (stack, _shared) = shared_stack().await;
    provider_config_beside_its_user(stack, Mode::Off, false).await;
}

#[tokio::test]
async fn under_convert_a_provider_config_beside_its_user_waits_for_it() {
    let (stack, _shared) = shared_stack().await;
    provider_config_beside_its_user(stack, Mode::Convert, false).await;
}

#[tokio::test]
async fn under_refuse_a_foreground_delete_keeps_a_provider_config_until_its_user_is_gone() {
    let (stack, _shared) = shared_stack().await;
    provider_config_beside_its_user(stack, Mode::Refuse, false).await;
}

/// The same, the ModelReplica's namespace deleted (the namespace
/// controller deletes it with no propagation policy; Convert makes that a
/// foreground cascade): the ProviderConfig and the Object's
/// ProviderConfigUsage are kept until the Object is done, so it does not
/// wedge on crossplane-runtime#1150, and the namespace goes.
#[tokio::test]
async fn under_convert_a_deleted_namespace_keeps_a_provider_config_and_its_usage_until_the_user_is_gone()
 {
    let (stack, _shared) = shared_stack().await;
    provider_config_beside_its_user(stack, Mode::Convert, true).await;
}

/// Which Usage is written between the two XRs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Between {
    /// A Usage in modelplane-system of EKSCluster `<n>` by ServingStack
    /// `<n>-stack`, which installs onto that EKSCluster's cloud cluster.
    Usage,
    /// A ClusterUsage of InferenceCluster `<n>` by InferenceGateway
    /// `<n>-gw` (composed without its own guard), whose gateway installs onto
    /// that InferenceCluster's cloud cluster.
    ClusterUsage,
}

/// Two XRs and a standalone Usage with `replayDeletion` between them, both
/// XRs deleted (the used one first, as a new user tries) under `mode`.
async fn usage_between_two_xrs(stack: &Stack, mode: Mode, between: Between) {
    let lower = mode.as_str().to_lowercase();
    let platform = mode.platform();
    let ns = Some(SYSTEM_NAMESPACE.to_string());
    let (hub, wheel, usage) = match between {
        Between::Usage => {
            let hub = format!("su-{lower}");
            let wheel = format!("{hub}-stack");
            let usage = format!("{wheel}-uses-cluster");
            (hub, wheel, usage)
        }
        Between::ClusterUsage => {
            let hub = format!("scu-{lower}");
            let wheel = format!("{hub}-gw");
            let usage = format!("{wheel}-uses-cluster");
            (hub, wheel, usage)
        }
    };
    // The used XR, the user, the Usage; their kinds and namespace; the cloud
    // cluster (named like the EKSCluster, itself named like an
    // InferenceCluster); and what the user runs on that cluster.
    let (hub_kind, wheel_kind, usage_kind, xr_ns) = match between {
        Between::Usage => (
            platform.eks_clusters(),
            platform.serving_stacks(),
            modelplane::usages(),
            ns.clone(),
        ),
        Between::ClusterUsage => (
            platform.inference_clusters(),
            platform.inference_gateways(),
            cluster_usages(),
            None,
        ),
    };
    let mut objects = match between {
        Between::Usage => {
            let mut o = platform.eks_cluster_tree(&hub);
            o.extend(platform.serving_stack_tree(&wheel));
            o
        }
        Between::ClusterUsage => {
            let mut o = platform.tree(&hub);
            o.extend(
                platform
                    .inference_gateway_tree(&wheel)
                    .into_iter()
                    .filter(|(r, _, _)| r.kind != "Usage"),
            );
            o
        }
    };
    objects.push((usage_kind.clone(), xr_ns.clone(), usage.clone()));
    let on_the_cluster: Vec<(String, String)> = objects
        .iter()
        .filter(|(r, _, n)| {
            (r.kind == "Release" || r.kind == "Object")
                && n.starts_with(&match between {
                    Between::Usage => wheel.clone(),
                    Between::ClusterUsage => format!("{wheel}-gateway"),
                })
        })
        .map(|(r, _, n)| (r.kind.clone(), n.clone()))
        .collect();
    let scene = Scene::watch(
        stack,
        &format!("a standalone {between:?} between two XRs ({mode:?})"),
        objects,
    )
    .await;

    let (hub_object, wheel_object) = match between {
        Between::Usage => (
            platform.eks_cluster(&hub),
            platform.serving_stack(&wheel, &hub),
        ),
        Between::ClusterUsage => (
            platform.inference_cluster(&hub),
            platform.inference_gateway_without_guard(&wheel, &hub),
        ),
    };
    scene.apply(&hub_kind, hub_object).await;
    scene.wait_ready(&hub_kind, xr_ns.as_deref(), &hub).await;
    scene.apply(&wheel_kind, wheel_object).await;
    scene
        .wait_ready(&wheel_kind, xr_ns.as_deref(), &wheel)
        .await;
    let side = |r: &ApiResource, name: &str| json!({"apiVersion": r.api_version, "kind": r.kind, "resourceRef": {"name": name}});
    let mut metadata = json!({"name": usage});
    if let Some(ns) = &xr_ns {
        metadata["namespace"] = json!(ns);
    }
    scene
        .apply(
            &usage_kind,
            json!({
                "apiVersion": usage_kind.api_version,
                "kind": usage_kind.kind,
                "metadata": metadata,
                "spec": {
                    "of": side(&hub_kind, &hub),
                    "by": side(&wheel_kind, &wheel),
                    "replayDeletion": true,
                },
            }),
        )
        .await;
    scene
        .wait_labelled(
            &hub_kind,
            xr_ns.as_deref(),
            &hub,
            IN_USE_LABEL,
            Some("true"),
        )
        .await;
    stack
        .wait_in_effect(&hub_kind, xr_ns.as_deref(), &hub, mode)
        .await;
    stack
        .wait_in_effect(&wheel_kind, xr_ns.as_deref(), &wheel, mode)
        .await;
    if mode != Mode::Off {
        // Held for the user's tree: its value is the user's uid.
        scene.wait_held(&usage_kind, xr_ns.as_deref(), &usage).await;
    }

    let started = Instant::now();
    let (ok, stderr) = stack
        .kubectl_delete_of(&hub_kind, xr_ns.as_deref(), &hub, foreground(mode))
        .await;
    assert!(
        !ok && stderr.contains("in-use"),
        "{}: Crossplane's webhook should refuse the used XR's delete: {stderr}",
        scene.what
    );
    let (ok, stderr) = stack
        .kubectl_delete_of(&wheel_kind, xr_ns.as_deref(), &wheel, foreground(mode))
        .await;
    assert!(ok, "{}: kubectl delete {wheel}: {stderr}", scene.what);

    if mode == Mode::Off {
        // The hazard: the Usage goes in the user's first wave, and the
        // replay deletes the used XR while the user is still there.
        let early = wait::until_lasting(TEARDOWN_TIMEOUT, || async {
            scene.timeline.terminating(&hub_kind.kind, &hub).map(|_| ())
        })
        .await;
        assert!(
            early.is_some(),
            "{}: the used XR was never deleted\n{}",
            scene.what,
            scene.timeline.describe()
        );
        let replay = scene.terminating(&hub_kind.kind, &hub);
        let user_gone = scene
            .timeline
            .gone(&wheel_kind.kind, &wheel)
            .map(|e| revision(&e, &scene.what));
        assert!(
            user_gone.is_none_or(|g| replay < g),
            "{}: the replay (#{replay}) did not come before the user left ({user_gone:?})\n{}",
            scene.what,
            scene.timeline.describe()
        );
        eprintln!(
            "{}: {} {hub} deleted (#{replay}) while {} {wheel} was still there; the leaks: {:?}",
            scene.what,
            hub_kind.kind,
            wheel_kind.kind,
            modelplane::leaked(&cloud_log(stack), &hub)
        );
        // Wait for the cloud cluster to go, then free whatever wedged.
        let _ = scene
            .timeline
            .wait_gone("Cluster", &hub, TEARDOWN_TIMEOUT)
            .await;
        scene.clean_up().await;
        return;
    }

    scene.wait_all_gone(TEARDOWN_TIMEOUT * 2).await;
    let user_gone = scene.gone(&wheel_kind.kind, &wheel);
    let replay = scene.terminating(&hub_kind.kind, &hub);
    assert!(
        user_gone < replay,
        "{}: {} {hub} was deleted (#{replay}) before {} {wheel} was gone (#{user_gone})\n{}",
        scene.what,
        hub_kind.kind,
        wheel_kind.kind,
        scene.timeline.describe()
    );
    scene.assert_before(
        (&wheel_kind.kind, &wheel),
        (&usage_kind.kind, &usage),
        "the Usage is held until its user is gone",
    );
    for (kind, name) in &on_the_cluster {
        scene.assert_before(
            (kind, name),
            ("Cluster", &hub),
            "what runs on the cluster goes before it",
        );
    }
    scene.assert_nothing_leaked(stack, &hub);
    eprintln!(
        "{}: the used XR deleted only after its user was gone; everything gone in {:?}",
        scene.what,
        started.elapsed()
    );
}

#[tokio::test]
async fn a_standalone_usage_lets_go_before_its_user_is_gone_in_a_foreground_cascade_alone() {
    let (stack, _shared) = shared_stack().await;
    usage_between_two_xrs(stack, Mode::Off, Between::Usage).await;
}

#[tokio::test]
async fn under_convert_a_standalone_usage_keeps_the_used_xr_until_its_user_is_gone() {
    let (stack, _shared) = shared_stack().await;
    usage_between_two_xrs(stack, Mode::Convert, Between::Usage).await;
}

#[tokio::test]
async fn under_refuse_a_standalone_usage_keeps_the_used_xr_until_its_user_is_gone() {
    let (stack, _shared) = shared_stack().await;
    usage_between_two_xrs(stack, Mode::Refuse, Between::Usage).await;
}

#[tokio::test]
async fn under_convert_a_cluster_usage_keeps_the_used_xr_until_its_user_is_gone() {
    let (stack, _shared) = shared_stack().await;
    usage_between_two_xrs(stack, Mode::Convert, Between::ClusterUsage).await;
}

#[tokio::test]
async fn under_refuse_a_cluster_usage_keeps_the_used_xr_until_its_user_is_gone() {
    let (stack, _shared) = shared_stack().await;
    usage_between_two_xrs(stack, Mode::Refuse, Between::ClusterUsage).await;
}

/// Across trees (#45): InferenceGateway `<n>-gw`, composed without its guard
/// Usage, installs its ServingStack's Releases and Object onto
/// InferenceCluster `<n>`'s cloud cluster through `<n>`'s ProviderConfigs.
/// `<n>` is deleted first, as under `mode` a user does. The ProviderConfigs'
/// usages name the gateway's managed resources: `plan` names them
/// beforehand, and the cloud cluster stays (held) while they are there; once
/// the gateway is deleted too, everything goes, the gateway's objects before
/// the cluster, and nothing leaks.
async fn another_tree_on_the_cluster(stack: &Stack, mode: Mode) {
    let lower = mode.as_str().to_lowercase();
    let platform = mode.platform();
    let hub = format!("xt-{lower}");
    let gateway = format!("{hub}-gw");
    let mut objects = platform.tree(&hub);
    objects.extend(
        platform
            .inference_gateway_tree(&gateway)
            .into_iter()
            .filter(|(r, _, _)| r.kind != "Usage"),
    );
    let on_the_cluster: Vec<(String, String)> = objects
        .iter()
        .filter(|(r, _, n)| {
            (r.kind == "Release" || r.kind == "Object") && n.starts_with(&format!("{gateway}-"))
        })
        .map(|(r, _, n)| (r.kind.clone(), n.clone()))
        .collect();
    assert!(!on_the_cluster.is_empty(), "the gateway installs nothing");
    let cluster_kind = objects
        .iter()
        .find(|(r, _, n)| r.kind == "Cluster" && *n == hub)
        .map(|(r, _, _)| r.clone())
        .expect("the tree has a cloud Cluster");
    let scene = Scene::watch(
        stack,
        &format!("another tree on the cluster ({mode:?})"),
        objects,
    )
    .await;
    let (hub_kind, gateway_kind) = (platform.inference_clusters(), platform.inference_gateways());
    scene
        .apply_ready(&hub_kind, platform.inference_cluster(&hub))
        .await;
    scene
        .apply(
            &gateway_kind,
            platform.inference_gateway_without_guard(&gateway, &hub),
        )
        .await;
    scene.wait_ready(&gateway_kind, None, &gateway).await;
    stack.wait_in_effect(&hub_kind, None, &hub, mode).await;
    scene
        .wait_held(&cluster_kind, Some(SYSTEM_NAMESPACE), &hub)
        .await;
    // The hold is in force a moment after it is written, and the
    // controller's record says so at its next look: until then `plan` says
    // the tree is not ordered yet, and exits 3.
    let (first_kind, first_name) = &on_the_cluster[0];
    let named = |said: &str| {
        said.contains("Outside the tree and needing it")
            && said.contains(&format!("{first_kind} {SYSTEM_NAMESPACE}/{first_name}"))
            && said.contains("held until it is gone")
    };
    let (code, said) = plan_once_it_exits(stack, &hub_kind, &hub, 0).await;
    assert!(
        code == Some(0) && named(&said),
        "{}: plan never named the gateway's objects held, with exit 0 (exit {code:?}):\n{said}",
        scene.what
    );

    let started = Instant::now();
    let (ok, stderr) = stack
        .kubectl_delete_of(&hub_kind, None, &hub, foreground(mode))
        .await;
    assert!(ok, "{}: kubectl delete {hub}: {stderr}", scene.what);
    scene.assert_cluster_stays(&hub, "the gateway").await;
    let (ok, stderr) = stack
        .kubectl_delete_of(&gateway_kind, None, &gateway, foreground(mode))
        .await;
    assert!(ok, "{}: kubectl delete {gateway}: {stderr}", scene.what);
    scene.wait_all_gone(TEARDOWN_TIMEOUT * 2).await;
    for (kind, name) in &on_the_cluster {
        scene.assert_before(
            (kind, name),
            ("Cluster", &hub),
            "what another tree runs on the cluster goes before it",
        );
    }
    scene.assert_crossplane_never_refused(stack);
    scene.assert_nothing_leaked(stack, &hub);
    eprintln!(
        "{}: the cloud cluster kept until the gateway was gone; everything gone in {:?}",
        scene.what,
        started.elapsed()
    );
}

#[tokio::test]
async fn under_convert_a_cluster_another_trees_releases_install_onto_waits_for_them() {
    let (stack, _shared) = shared_stack().await;
    another_tree_on_the_cluster(stack, Mode::Convert).await;
}

#[tokio::test]
async fn under_refuse_a_cluster_another_trees_releases_install_onto_waits_for_them() {
    let (stack, _shared) = shared_stack().await;
    another_tree_on_the_cluster(stack, Mode::Refuse).await;
}

/// A cluster-scoped XR kind `Fleet` of `mode`'s copy, annotated with
/// `mode`, and its Composition: InferenceCluster `<n>` (composed without its
/// Usage) and, beside it, ServingStack `<n>-edge` installed on that
/// InferenceCluster's cloud cluster. The edge's Releases need ProviderConfigs
/// two levels down in the sibling (Fleet, InferenceCluster, EKSCluster,
/// ProviderConfig), through a Secret written one more level down.
pub(super) async fn install_fleet(
    client: &Client,
    mode: Mode,
    platform: &modelplane::Platform,
) -> ApiResource {
    let lower = mode.as_str().to_lowercase();
    let group = format!("{lower}.fleet.local-cluster.dev");
    let fleets = modelplane::resource(&group, "v1", "Fleet", "fleets");
    apply_cluster_object(
        client,
        &v2_xrds(),
        open_cluster_xrd(&group, "Fleet", "fleets", mode),
    )
    .await;
    let format = |fmt: &str| json!([{"type": "string", "string": {"type": "Format", "fmt": fmt}}]);
    let resources = vec![
        json!({
            "name": "cluster",
            "base": {
                "apiVersion": platform.inference_clusters().api_version,
                "kind": "InferenceCluster",
                "spec": {
                    "cluster": {"source": "EKS", "eks": {"region": "us-west-2"}},
                    "crossplane": {"compositionRef": {"name": platform.composition("inferenceclusters-local-without-usage")}},
                },
            },
            "patches": [{"type": "FromCompositeFieldPath", "fromFieldPath": "metadata.name", "toFieldPath": "metadata.name"}],
        }),
        json!({
            "name": "edge",
            "base": {
                "apiVersion": platform.serving_stacks().api_version,
                "kind": "ServingStack",
                "metadata": {"namespace": SYSTEM_NAMESPACE},
                "spec": {
                    "secrets": [{"type": "Kubeconfig", "key": "kubeconfig", "name": "set-by-a-patch"}],
                    "crossplane": {"compositionRef": {"name": platform.composition("servingstacks-local")}},
                },
            },
            "patches": [
                {"type": "FromCompositeFieldPath", "fromFieldPath": "metadata.name",
                 "toFieldPath": "metadata.name", "transforms": format("%s-edge")},
                {"type": "FromCompositeFieldPath", "fromFieldPath": "metadata.name",
                 "toFieldPath": "spec.secrets[0].name", "transforms": format("%s-kubeconfig")},
            ],
        }),
    ];
    let mut composition = pt_composition(&group, "Fleet", resources);
    composition["metadata"]["name"] = json!(format!("fleets-{lower}"));
    apply_cluster_object(client, &compositions(), composition).await;
    wait_generated_crd(client, &format!("fleets.{group}")).await;
    fleets
}

/// The nested case under `mode`: a Fleet deleted (Convert plainly, else
/// with `--cascade=foreground`).
async fn nested_need(stack: &Stack, mode: Mode) {
    let lower = mode.as_str().to_lowercase();
    let platform = mode.platform();
    let client = stack.cp.admin().await.expect("admin client");
    let fleets = install_fleet(&client, mode, &platform).await;
    let name = format!("nest-{lower}");
    let edge = format!("{name}-edge");
    let mut objects: Objects = vec![(fleets.clone(), None, name.clone())];
    objects.extend(
        platform
            .tree(&name)
            .into_iter()
            .filter(|(r, _, _)| r.kind != "Usage"),
    );
    objects.extend(platform.serving_stack_tree(&edge));
    let scene = Scene::watch(
        stack,
        &format!("a need two levels down ({mode:?})"),
        objects,
    )
    .await;
    scene
        .apply(
            &fleets,
            json!({"apiVersion": fleets.api_version, "kind": "Fleet", "metadata": {"name": name}, "spec": {}}),
        )
        .await;
    scene.wait_ready(&fleets, None, &name).await;
    stack.wait_in_effect(&fleets, None, &name, mode).await;
    if mode != Mode::Off {
        scene
            .wait_held(&platform.inference_clusters(), None, &name)
            .await;
    }
    let (code, said) =
        plan_once_it_exits(stack, &fleets, &name, if mode == Mode::Off { 3 } else { 0 }).await;
    let order = format!(
        "ServingStack {SYSTEM_NAMESPACE}/{edge} must be gone before InferenceCluster {name} goes"
    );
    assert!(said.contains(&order), "{}: plan:\n{said}", scene.what);
    assert_eq!(
        code,
        Some(if mode == Mode::Off { 3 } else { 0 }),
        "{}: plan:\n{said}",
        scene.what
    );
    let started = Instant::now();
    let (ok, stderr) = stack
        .kubectl_delete_of(&fleets, None, &name, foreground(mode))
        .await;
    assert!(ok, "{}: kubectl delete {name}: {stderr}", scene.what);
    if mode == Mode::Off {
        let objects = api(&client, &modelplane::objects(), Some(SYSTEM_NAMESPACE));
        let gateway = format!("{edge}-gateway");
        let wedged = wait_wedged(&objects, &gateway, TEARDOWN_TIMEOUT).await;
        assert!(
            wedged.is_some(),
            "{}: Object/{gateway} did not wedge\n{}\n{}",
            scene.what,
            scene.states().await,
            scene.timeline.describe()
        );
        eprintln!("{}: Object/{gateway} wedged: {wedged:?}", scene.what);
        scene.clean_up().await;
        return;
    }
    scene.wait_all_gone(TEARDOWN_TIMEOUT).await;
    let edge_gone = scene.gone("ServingStack", &edge);
    let cluster_deleted = scene.terminating("InferenceCluster", &name);
    assert!(
        edge_gone < cluster_deleted,
        "{}: InferenceCluster {name} was deleted (#{cluster_deleted}) before ServingStack {edge} was gone (#{edge_gone})\n{}",
        scene.what,
        scene.timeline.describe()
    );
    for (r, _, n) in platform.serving_stack_tree(&edge).iter().skip(1) {
        scene.assert_before(
            (&r.kind, n),
            ("Cluster", &name),
            "what runs on the cluster goes before it",
        );
    }
    scene.assert_nothing_leaked(stack, &name);
    eprintln!(
        "{}: in order, nothing wedged or leaked, in {:?}",
        scene.what,
        started.elapsed()
    );
}

#[tokio::test]
async fn a_need_two_levels_down_in_a_sibling_wedges_a_foreground_cascade_alone() {
    let (stack, _shared) = shared_stack().await;
    nested_need(stack, Mode::Off).await;
}

#[tokio::test]
async fn under_convert_a_need_two_levels_down_in_a_sibling_is_kept() {
    let (stack, _shared) = shared_stack().await;
    nested_need(stack, Mode::Convert).await;
}

#[tokio::test]
async fn under_refuse_a_foreground_delete_keeps_a_need_two_levels_down_in_a_sibling() {
    let (stack, _shared) = shared_stack().await;
    nested_need(stack, Mode::Refuse).await;
}
