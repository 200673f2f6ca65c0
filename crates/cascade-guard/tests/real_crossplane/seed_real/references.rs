//! A reference the provider resolves, as Upjet's resources reference each
//! other, on real Crossplane: a cluster-scoped `Exposed` composes a local
//! cloud `Cluster` and a cloud `LoadBalancer` whose
//! `spec.forProvider.clusterNameSelector` (`matchControllerRef`) the local
//! cloud resolves into `clusterNameRef` and `clusterName`, as Crossplane's
//! resolver does. Nothing else ties them: no Usage, no owner between them,
//! no ProviderConfig. The load balancer is released through its cluster,
//! which takes longer than the cluster takes to go.
//!
//! Off (a foreground cascade alone) deletes both at once: the cluster goes
//! first and the resource wedges (its load balancer leaks too when the
//! cluster stops before releasing it). Under Convert (a
//! plain delete) and Refuse (`--cascade=foreground`) sibling order reads the
//! resolved reference as an edge and holds the Cluster until the
//! LoadBalancer is gone; `plan` names the edge beforehand.

use super::*;
use local_cluster::real_crossplane::cloud::clusters;
use local_cluster::real_crossplane::cloud_load_balancer::load_balancers;
use scene::{Objects, Scene, cloud_log, open_cluster_xrd, revision};

/// How long the load balancer takes to release: longer than the cloud
/// cluster takes to delete (3 s), so that a cluster deleted beside it goes
/// first.
const RELEASE_SECONDS: u64 = 10;

/// The group of the `Exposed` kind of `mode`'s copy.
pub(crate) fn exposed_group(mode: &str) -> String {
    format!("{mode}.exposed.local-cluster.dev")
}

/// The `Exposed` XRD of `mode` and its Composition: Cluster `<n>` and
/// LoadBalancer `<n>-lb` in the platform's namespace, the load balancer
/// selecting its cluster by controller.
async fn install_exposed(client: &Client, mode: Mode) -> ApiResource {
    let group = exposed_group(&mode.as_str().to_lowercase());
    let exposed = modelplane::resource(&group, "v1", "Exposed", "exposeds");
    apply_cluster_object(
        client,
        &v2_xrds(),
        open_cluster_xrd(&group, "Exposed", "exposeds", mode),
    )
    .await;
    let name = json!({"type": "FromCompositeFieldPath", "fromFieldPath": "metadata.name", "toFieldPath": "metadata.name"});
    let format = |fmt: &str| json!([{"type": "string", "string": {"type": "Format", "fmt": fmt}}]);
    let resources = vec![
        json!({
            "name": "cluster",
            "base": {
                "apiVersion": clusters().api_version,
                "kind": "Cluster",
                "metadata": {"namespace": SYSTEM_NAMESPACE},
                "spec": {"writeConnectionSecretToRef": {"name": "set-by-a-patch"}},
            },
            "patches": [
                name,
                {"type": "FromCompositeFieldPath", "fromFieldPath": "metadata.name",
                 "toFieldPath": "spec.writeConnectionSecretToRef.name", "transforms": format("%s-kubeconfig")},
            ],
        }),
        json!({
            "name": "load-balancer",
            "base": {
                "apiVersion": load_balancers().api_version,
                "kind": "LoadBalancer",
                "metadata": {"namespace": SYSTEM_NAMESPACE},
                "spec": {
                    "deletionSeconds": RELEASE_SECONDS,
                    "forProvider": {"port": 443, "clusterNameSelector": {"matchControllerRef": true}},
                },
            },
            "patches": [
                {"type": "FromCompositeFieldPath", "fromFieldPath": "metadata.name",
                 "toFieldPath": "metadata.name", "transforms": format("%s-lb")},
            ],
        }),
    ];
    let lower = mode.as_str().to_lowercase();
    let mut composition = pt_composition(&group, "Exposed", resources);
    composition["metadata"]["name"] = json!(format!("exposeds-{lower}"));
    apply_cluster_object(client, &compositions(), composition).await;
    wait_generated_crd(client, &format!("exposeds.{group}")).await;
    exposed
}

/// An `Exposed` deleted under `mode` (Convert plainly, else with
/// `--cascade=foreground`).
async fn resolved_reference(stack: &Stack, mode: Mode) {
    let lower = mode.as_str().to_lowercase();
    let client = stack.cp.admin().await.expect("admin client");
    let exposed = install_exposed(&client, mode).await;
    let name = format!("refs-{lower}");
    let lb = format!("{name}-lb");
    let at = Some(SYSTEM_NAMESPACE.to_string());
    let objects: Objects = vec![
        (exposed.clone(), None, name.clone()),
        (clusters(), at.clone(), name.clone()),
        (load_balancers(), at.clone(), lb.clone()),
    ];
    let scene = Scene::watch(stack, &format!("a resolved reference ({mode:?})"), objects).await;
    scene
        .apply(
            &exposed,
            json!({"apiVersion": exposed.api_version, "kind": "Exposed", "metadata": {"name": name}, "spec": {}}),
        )
        .await;
    scene.wait_ready(&exposed, None, &name).await;
    let balancer = api(&client, &load_balancers(), Some(SYSTEM_NAMESPACE))
        .get(&lb)
        .await
        .unwrap_or_else(|e| panic!("{}: LoadBalancer {lb}: {e}", scene.what));
    assert_eq!(
        balancer.data["spec"]["forProvider"]["clusterNameRef"]["name"], name,
        "{}: the selector was not resolved into the reference: {:?}",
        scene.what, balancer.data["spec"]
    );
    stack.wait_in_effect(&exposed, None, &name, mode).await;
    if mode != Mode::Off {
        scene
            .wait_held(&clusters(), Some(SYSTEM_NAMESPACE), &name)
            .await;
    }
    let code = if mode == Mode::Off { 3 } else { 0 };
    let (got, said) = plan_once_it_exits(stack, &exposed, &name, code).await;
    for line in [
        format!("{lb} must be gone before"),
        "a resolved spec.forProvider reference".to_string(),
    ] {
        assert!(said.contains(&line), "{}: plan:\n{said}", scene.what);
    }
    assert_eq!(got, Some(code), "{}: plan:\n{said}", scene.what);
    let started = Instant::now();
    let (ok, stderr) = stack
        .kubectl_delete_of(&exposed, None, &name, mode != Mode::Convert)
        .await;
    assert!(ok, "{}: kubectl delete {name}: {stderr}", scene.what);
    if mode == Mode::Off {
        let balancers = api(&client, &load_balancers(), Some(SYSTEM_NAMESPACE));
        let wedged = wait::until_lasting(TEARDOWN_TIMEOUT, || async {
            let o = balancers.get_opt(&lb).await.ok().flatten()?;
            sync_failure(&o).filter(|m| m.contains("is gone"))
        })
        .await;
        assert!(
            wedged.is_some(),
            "{}: LoadBalancer/{lb} did not wedge\n{}\n{}",
            scene.what,
            scene.states().await,
            scene.timeline.describe()
        );
        // The cluster left while its load balancer's resource still stood.
        let cluster_gone = wait::until_lasting(Duration::from_secs(120), || async {
            scene
                .timeline
                .gone("Cluster", &name)
                .map(|e| revision(&e, &scene.what))
        })
        .await;
        assert!(
            cluster_gone.is_some(),
            "{}: Cluster/{name} did not go\n{}",
            scene.what,
            scene.timeline.describe()
        );
        assert!(
            scene.timeline.gone("LoadBalancer", &lb).is_none(),
            "{}: LoadBalancer/{lb} went, yet it is wedged\n{}",
            scene.what,
            scene.timeline.describe()
        );
        // Whether the load balancer itself leaked depends on when each
        // delete was taken up (the Service may have been released in the
        // cluster's last seconds): printed, not asserted.
        let leaked = modelplane::leaked(&cloud_log(stack), &name);
        eprintln!(
            "{}: Cluster/{name} gone (#{cluster_gone:?}) while LoadBalancer/{lb} wedged ({wedged:?}); leaked {leaked:?}",
            scene.what
        );
        scene.clean_up().await;
        return;
    }
    scene.wait_all_gone(TEARDOWN_TIMEOUT).await;
    let lb_gone = scene.gone("LoadBalancer", &lb);
    let cluster_deleted = scene.terminating("Cluster", &name);
    assert!(
        lb_gone < cluster_deleted,
        "{}: Cluster {name} was deleted (#{cluster_deleted}) before LoadBalancer {lb} was gone (#{lb_gone})\n{}",
        scene.what,
        scene.timeline.describe()
    );
    scene.assert_nothing_leaked(stack, &name);
    eprintln!(
        "{}: in order, nothing wedged or leaked, in {:?}",
        scene.what,
        started.elapsed()
    );
    // The load balancer's release took its time through the cluster.
    assert!(
        cloud_log(stack).contains(&format!(
            "load balancer for default/lb-{SYSTEM_NAMESPACE}-{lb} deleted"
        )),
        "{}: the cloud did not release the load balancer:\n{}",
        scene.what,
        cloud_log(stack)
    );
}

#[tokio::test]
async fn a_resolved_reference_wedges_a_foreground_cascade_alone() {
    let (stack, _shared) = shared_stack().await;
    resolved_reference(stack, Mode::Off).await;
}

#[tokio::test]
async fn under_convert_a_cluster_a_resolved_reference_names_waits_for_its_user() {
    let (stack, _shared) = shared_stack().await;
    resolved_reference(stack, Mode::Convert).await;
}

#[tokio::test]
async fn under_refuse_a_foreground_delete_keeps_a_cluster_a_resolved_reference_names() {
    let (stack, _shared) = shared_stack().await;
    resolved_reference(stack, Mode::Refuse).await;
}
