//! Across trees through a ProviderConfig made outside the tree (#45): a
//! platform engineer makes a provider-kubernetes ProviderConfig by hand on
//! InferenceCluster `<n>`'s kubeconfig Secret, and an Object of their own
//! that puts a load balancer onto that cloud cluster through it. Nothing in
//! `<n>`'s tree names the ProviderConfig or the Object: cascade-guard finds
//! the ProviderConfig by the Secret it is made on, and the Object by its
//! ProviderConfigUsage. `plan` names the Object beforehand; a plain delete of
//! `<n>` under Convert keeps the cloud cluster while the Object is there;
//! once it is deleted, everything goes, the Object before the cluster, and
//! no load balancer leaks.

use super::*;
use scene::Scene;

#[tokio::test]
async fn under_convert_a_cluster_a_hand_made_provider_config_leads_to_waits_for_its_user() {
    let (stack, _shared) = shared_stack().await;
    let mode = Mode::Convert;
    let platform = mode.platform();
    let hub = "byhand-convert".to_string();
    let (config, user) = (format!("{hub}-byhand"), format!("{hub}-byhand-lb"));
    let at = Some(SYSTEM_NAMESPACE.to_string());
    let (configs, objects_kind) = (
        modelplane::kubernetes_provider_configs(),
        modelplane::objects(),
    );
    let mut objects = platform.tree(&hub);
    objects.push((configs.clone(), at.clone(), config.clone()));
    objects.push((objects_kind.clone(), at.clone(), user.clone()));
    let scene = Scene::watch(
        stack,
        "a ProviderConfig made by hand on the cluster's kubeconfig (Convert)",
        objects,
    )
    .await;
    let hub_kind = platform.inference_clusters();
    scene
        .apply_ready(&hub_kind, platform.inference_cluster(&hub))
        .await;
    scene
        .apply(
            &configs,
            json!({
                "apiVersion": configs.api_version,
                "kind": "ProviderConfig",
                "metadata": {"name": config, "namespace": SYSTEM_NAMESPACE},
                "spec": {"credentials": {"source": "Secret", "secretRef": {
                    "name": format!("{hub}-kubeconfig"),
                    "namespace": SYSTEM_NAMESPACE,
                    "key": "kubeconfig",
                }}},
            }),
        )
        .await;
    scene
        .apply_ready(
            &objects_kind,
            json!({
                "apiVersion": objects_kind.api_version,
                "kind": "Object",
                "metadata": {"name": user, "namespace": SYSTEM_NAMESPACE},
                "spec": {
                    "providerConfigRef": {"kind": "ProviderConfig", "name": config},
                    "forProvider": {"manifest": {
                        "apiVersion": "v1",
                        "kind": "Service",
                        "metadata": {"name": user, "namespace": "default"},
                        "spec": {
                            "type": "LoadBalancer",
                            "selector": {"app": "byhand"},
                            "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
                        },
                    }},
                },
            }),
        )
        .await;
    stack.wait_in_effect(&hub_kind, None, &hub, mode).await;
    // `plan` names the Object as a user from outside, held for.
    let named = |said: &str| {
        said.contains("Outside the tree and needing it")
            && said.contains(&format!("Object {SYSTEM_NAMESPACE}/{user}"))
            && said.contains(&config)
            && said.contains("held until it is gone")
    };
    // Until the controller has read the tree since the provider recorded
    // the Object's usage, `plan` may exit 3 (not ordered yet) or not name it.
    let planned = wait::until_lasting(TEARDOWN_TIMEOUT, || async {
        let (code, said) = plan_of(stack, &hub_kind, &hub);
        (code == Some(0) && named(&said)).then_some(())
    })
    .await;
    if planned.is_none() {
        let (code, said) = plan_of(stack, &hub_kind, &hub);
        panic!(
            "{}: plan never named the Object made by hand held, with exit 0 (exit {code:?}):\n{said}",
            scene.what
        );
    }

    // As installed (the chart's RBAC), the controller watches the
    // provider's ProviderConfigUsages, so a new user is seen at once, not at
    // the tree's next read (the api test of a settled tree shows the rest).
    let log = stack.controller_logs();
    let watching = |l: &&str| {
        l.contains("kind=ProviderConfigUsage") && l.contains("group=kubernetes.m.crossplane.io")
    };
    assert!(
        log.lines()
            .filter(watching)
            .any(|l| l.contains("sibling order: watching the kind")),
        "{}: the controller never watched the ProviderConfigUsages",
        scene.what
    );
    assert!(
        !log.lines()
            .filter(watching)
            .any(|l| l.contains("cannot watch this kind")),
        "{}: the controller may not watch the ProviderConfigUsages",
        scene.what
    );

    let started = Instant::now();
    let (ok, stderr) = stack.kubectl_delete_of(&hub_kind, None, &hub, false).await;
    assert!(ok, "{}: kubectl delete {hub}: {stderr}", scene.what);
    scene
        .assert_cluster_stays(&hub, "the Object made by hand")
        .await;
    for (resource, name) in [(&objects_kind, &user), (&configs, &config)] {
        api(&scene.client, resource, Some(SYSTEM_NAMESPACE))
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("{}: delete {name}: {e}", scene.what));
    }
    scene.wait_all_gone(TEARDOWN_TIMEOUT * 2).await;
    scene.assert_before(
        ("Object", &user),
        ("Cluster", &hub),
        "what a ProviderConfig made by hand runs on the cluster goes before it",
    );
    scene.assert_nothing_leaked(stack, &hub);
    eprintln!(
        "{}: the cloud cluster kept until the Object made by hand was gone; everything gone in {:?}",
        scene.what,
        started.elapsed()
    );
}
