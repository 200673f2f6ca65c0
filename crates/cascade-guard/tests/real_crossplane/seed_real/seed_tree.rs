//! The seed's tree in each mode, with and without its Usage.

use super::*;

/// The seed's tree without its hand-written Usage (Modelplane #212's
/// shape), under Convert: `plan` shows the order beforehand, and a plain
/// delete tears it down in that order, nothing wedged, nothing leaked.
pub(crate) async fn without_its_usage_the_seed_tree_still_tears_down_in_order_under_convert() {
    let (stack, _shared) = shared_stack().await;
    let platform = Mode::Convert.platform();
    let tree = Tree::build_without_usage(stack, &platform, "bare-convert", true).await;
    stack.enter(Mode::Convert, &tree).await;
    let (code, said) =
        plan_once_it_exits(stack, &platform.inference_clusters(), &tree.name, 0).await;
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains(&format!(
            "ServingStack {SYSTEM_NAMESPACE}/{} must be gone before EKSCluster {SYSTEM_NAMESPACE}/{} goes",
            tree.stack_name(),
            tree.name
        )) && said.contains("No hazard"),
        "{said}"
    );
    let started = Instant::now();
    let (ok, stderr) = stack.kubectl_delete(&tree, false).await;
    assert!(ok, "kubectl delete: {stderr}");
    assert_torn_down_in_order(stack, &tree, "Convert without the Usage", started).await;
}

/// The same under Refuse: the plain delete is refused, and the
/// `--cascade=foreground` it names keeps the siblings in order too.
pub(crate) async fn without_its_usage_a_foreground_delete_under_refuse_keeps_the_order() {
    let (stack, _shared) = shared_stack().await;
    let platform = Mode::Refuse.platform();
    let tree = Tree::build_without_usage(stack, &platform, "bare-refuse", true).await;
    stack.enter(Mode::Refuse, &tree).await;
    let started = Instant::now();
    let (ok, stderr) = stack.kubectl_delete(&tree, true).await;
    assert!(ok, "kubectl delete --cascade=foreground: {stderr}");
    assert_torn_down_in_order(stack, &tree, "Refuse without the Usage", started).await;
}

/// The hazard itself: without the Usage and without holding (an Off kind),
/// even a foreground cascade deletes the EKSCluster beside the ServingStack,
/// and the gateway's Object wedges; `plan` names it beforehand and exits 3.
pub(crate) async fn without_its_usage_a_foreground_cascade_alone_wedges_the_gateway() {
    let (stack, _shared) = shared_stack().await;
    let platform = Mode::Off.platform();
    let tree = Tree::build_without_usage(stack, &platform, "bare-off", false).await;
    stack.enter(Mode::Off, &tree).await;
    let (code, said) = plan(stack, &platform, &tree.name);
    assert_eq!(code, Some(3), "{said}");
    assert!(
        said.contains(&format!(
            "Object {SYSTEM_NAMESPACE}/{}-gateway needs Cluster",
            tree.stack_name()
        )),
        "{said}"
    );
    let started = Instant::now();
    let (ok, stderr) = stack.kubectl_delete(&tree, true).await;
    assert!(ok, "kubectl delete --cascade=foreground: {stderr}");
    tree.wait_cluster_gone("Off without the Usage", started)
        .await;
    let objects = api(
        &tree.client,
        &platform_objects(&tree),
        Some(SYSTEM_NAMESPACE),
    );
    let gateway = format!("{}-gateway", tree.stack_name());
    let wedged = wait_wedged(&objects, &gateway, Duration::from_secs(90)).await;
    assert!(
        wedged.is_some(),
        "Object/{gateway} did not wedge\n{}\n{}",
        tree.states().await,
        tree.timeline.describe()
    );
    eprintln!("Off without the Usage: Object/{gateway} wedged: {wedged:?}");
    tree.clean_up().await;
}

/// Secrets, which the timeline of a tree watches in [`SYSTEM_NAMESPACE`]:
/// its cloud Cluster writes its kubeconfig into one.
pub(crate) fn secrets() -> ApiResource {
    modelplane::resource("", "v1", "Secret", "secrets")
}

/// provider-helm's and provider-kubernetes' ProviderConfigUsages.
/// Waits until sibling order holds the ProviderConfigUsage of the managed
/// resource `name` (of `resource`, in `ns`; the usage is named by its uid):
/// what keeps it from wedging on crossplane-runtime#1150 when its namespace
/// is deleted.
pub(crate) async fn wait_usage_held(
    client: &Client,
    resource: &ApiResource,
    usage: &ApiResource,
    ns: &str,
    name: &str,
) {
    let object = api(client, resource, Some(ns))
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("{} {ns}/{name}: {e}", resource.kind));
    let uid = object.uid().expect("a stored object has a uid");
    let held = cascade_guard_testkit::wait_sibling_held(
        client,
        LEASE_NAMESPACE,
        usage,
        Some(ns),
        &uid,
        Duration::from_secs(240),
    )
    .await;
    assert!(
        held,
        "the ProviderConfigUsage of {} {ns}/{name} was never held",
        resource.kind
    );
}

pub(crate) fn provider_config_usages() -> [ApiResource; 2] {
    [
        modelplane::resource(
            "helm.m.crossplane.io",
            "v1beta1",
            "ProviderConfigUsage",
            "providerconfigusages",
        ),
        modelplane::resource(
            "kubernetes.m.crossplane.io",
            "v1alpha1",
            "ProviderConfigUsage",
            "providerconfigusages",
        ),
    ]
}

/// The provider-kubernetes Object kind of a tree.
pub(crate) fn platform_objects(tree: &Tree) -> ApiResource {
    tree.on_the_cluster()
        .into_iter()
        .map(|(r, _)| r)
        .find(|r| r.kind == "Object")
        .expect("the tree has an Object")
}

/// `objects` as they are now, for `cascade_guard_testkit::invariant::edges` (a Secret's
/// data left out), and the ProviderConfigUsages in `usage_namespaces` that
/// any of them owns. `what` names the scenario in a failure.
pub(crate) async fn snapshot_of(
    client: &Client,
    what: &str,
    objects: impl IntoIterator<Item = (ApiResource, Option<String>, String)>,
    usage_namespaces: impl IntoIterator<Item = Option<String>>,
) -> Vec<Value> {
    let typed = |mut o: DynamicObject, r: &ApiResource| {
        o.types = Some(kube::api::TypeMeta {
            api_version: r.api_version.clone(),
            kind: r.kind.clone(),
        });
        o
    };
    let mut snapshot = Vec::new();
    let mut uids = Vec::new();
    for (r, ns, n) in objects {
        let found = api(client, &r, ns.as_deref())
            .get_opt(&n)
            .await
            .unwrap_or_else(|e| panic!("{what}: snapshot of {}/{n}: {e}", r.kind))
            .unwrap_or_else(|| panic!("{what}: snapshot: {}/{n} is missing", r.kind));
        let mut o = typed(found, &r);
        if r.kind == "Secret" {
            o.data = json!({});
        }
        uids.extend(o.metadata.uid.clone());
        snapshot.push(serde_json::to_value(&o).expect("an object as JSON"));
    }
    for ns in usage_namespaces {
        for r in provider_config_usages() {
            let Ok(list) = api(client, &r, ns.as_deref())
                .list(&Default::default())
                .await
            else {
                continue;
            };
            for o in list.items {
                if o.owner_references().iter().any(|o| uids.contains(&o.uid)) {
                    snapshot.push(serde_json::to_value(typed(o, &r)).expect("an object as JSON"));
                }
            }
        }
    }
    snapshot
}

/// What cascade-guard answers a delete that would strip `foregroundDeletion`
/// from an object whose foreground cascade is already running.
pub(crate) const CUTS_A_RUNNING_CASCADE_SHORT: &str = "it is already being deleted with foreground cascading, and this delete would cut that cascade short";

/// Crossplane's deletes of `objects` that were refused (403), but one kind:
/// a Usage's replay of a Background delete it had blocked, sent when the
/// used object is by then in a foreground cascade (deleted since by someone
/// else). Granted, it would strip `foregroundDeletion` and cut that cascade
/// short; refused, nothing is lost: Crossplane sends a replay once, from a
/// goroutine, logs the error and removes the Usage's finalizer anyway
/// (`internal/controller/protection/usage/reconciler.go`), and the object is
/// already being deleted. Those are printed, not failed (soak seed
/// 1796387107332808193, round 9: the garbage collector's Background delete
/// of an EKSCluster blocked by its Usage, then the clean-up's foreground
/// delete, then the replay).
pub(crate) fn crossplane_refusals(
    events: &[local_cluster::audit::Event],
    objects: &[(ApiResource, Option<String>, String)],
) -> Vec<String> {
    let mut refused = Vec::new();
    for e in events.iter().filter(|e| {
        e.verb == "delete"
            && !e.dry_run()
            && e.effective_username() == local_cluster::real_crossplane::CROSSPLANE_USER
            && e.response_code() == Some(403)
            && objects
                .iter()
                .any(|(r, ns, n)| e.is_about(&r.plural, ns.as_deref().unwrap_or_default(), n))
    }) {
        let message = e
            .response_status
            .as_ref()
            .and_then(|s| s.get("message"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        let said = format!(
            "{:?} ({:?}): {message}",
            e.object_ref,
            e.propagation_policy()
        );
        if message.contains(CUTS_A_RUNNING_CASCADE_SHORT) {
            eprintln!("a replay of a delete already under way in the foreground, refused: {said}");
        } else {
            refused.push(said);
        }
    }
    refused
}

/// Waits for the tree to go, then asserts its order and that nothing leaked.
pub(crate) async fn assert_torn_down_in_order(
    stack: &Stack,
    tree: &Tree,
    what: &str,
    started: Instant,
) {
    assert!(
        tree.wait_all_gone(TEARDOWN_TIMEOUT).await,
        "{what}: left {:?}\n{}\n{}",
        tree.left().await,
        tree.states().await,
        tree.timeline.describe()
    );
    tree.assert_order(what);
    assert_crossplane_never_refused(stack, tree, what);
    assert!(
        tree.leaked(stack).is_empty(),
        "{what}: {:?}",
        tree.leaked(stack)
    );
    eprintln!(
        "{what}: everything gone, in order, in {:?}",
        started.elapsed()
    );
}

pub(crate) async fn without_cascade_guard_a_plain_delete_wedges_the_serving_stack_and_leaks_its_load_balancer()
 {
    let (stack, _shared) = shared_stack().await;
    let tree = Tree::build(stack, &Mode::Off.platform(), "seed-off").await;
    stack.enter(Mode::Off, &tree).await;
    let started = Instant::now();
    let (ok, stderr) = stack.kubectl_delete(&tree, false).await;
    assert!(ok, "kubectl delete: {stderr}");

    // The XR is gone at once: Crossplane drops its finalizer, and nothing
    // else holds it.
    let ic = tree
        .timeline
        .wait_gone("InferenceCluster", &tree.name, Duration::from_secs(30))
        .await;
    assert!(ic.is_some(), "{}", tree.timeline.describe());
    eprintln!(
        "Off: the InferenceCluster was gone after {:?}",
        started.elapsed()
    );
    // The cloud cluster goes once the Usage lets go of the EKSCluster...
    tree.wait_cluster_gone("Off", started).await;
    // ...while the gateway's load balancer was still being deleted: its
    // Object wedges on the provider's finalizer, unable to reach the cluster.
    let mut wedged = Vec::new();
    for (r, n) in tree.on_the_cluster() {
        if tree.timeline.gone(&r.kind, &n).is_some() {
            continue;
        }
        let objects = api(&tree.client, &r, Some(SYSTEM_NAMESPACE));
        if let Some(message) = wait_wedged(&objects, &n, Duration::from_secs(90)).await {
            eprintln!("Off: {}/{n} wedged: {message}", r.kind);
            wedged.push(format!("{}/{n}", r.kind));
        }
    }
    let gateway = format!("Object/{}-gateway", tree.stack_name());
    assert!(
        wedged.contains(&gateway),
        "{gateway} did not wedge (wedged: {wedged:?})\n{}\n{}",
        tree.states().await,
        tree.timeline.describe()
    );
    // Still wedged after the provider's next attempt: nothing will ever let
    // it go.
    let gateway_name = format!("{}-gateway", tree.stack_name());
    let tried = provider_warnings(&tree.client, &gateway_name).await;
    let retried = wait::until_lasting(Duration::from_secs(150), || async {
        (provider_warnings(&tree.client, &gateway_name).await > tried).then_some(())
    })
    .await;
    assert!(
        retried.is_some(),
        "the provider never tried {gateway} again ({tried} failures reported)\n{}",
        tree.states().await
    );
    assert!(tree.left().await.contains(&gateway));
    let leaked = tree.leaked(stack);
    assert!(
        leaked.iter().any(|l| l.contains(&format!(
            "load balancer of Service default/{}-gateway",
            tree.stack_name()
        ))),
        "the local cloud recorded no leaked load balancer: {leaked:?}"
    );
    eprintln!("Off: wedged {wedged:?}; {leaked:?}");
    tree.clean_up().await;
}

pub(crate) async fn refuse_refuses_the_plain_delete_and_a_foreground_delete_tears_down_in_order() {
    let (stack, _shared) = shared_stack().await;
    let tree = Tree::build(stack, &Mode::Refuse.platform(), "seed-refuse").await;
    stack.enter(Mode::Refuse, &tree).await;
    let (ok, stderr) = stack.kubectl_delete(&tree, false).await;
    assert!(!ok, "the plain delete was allowed");
    assert!(
        stderr.contains("(Forbidden)")
            && stderr.contains(&format!(
                "cascade-guard refused to delete InferenceCluster {}",
                tree.name
            ))
            && stderr.contains("--cascade=foreground"),
        "unexpected refusal: {stderr}"
    );
    eprintln!("Refuse: kubectl said: {}", stderr.trim());
    let started = Instant::now();
    let (ok, stderr) = stack.kubectl_delete(&tree, true).await;
    assert!(ok, "kubectl delete --cascade=foreground: {stderr}");
    assert_torn_down_in_order(stack, &tree, "Refuse", started).await;
}

pub(crate) async fn convert_tears_a_plain_delete_down_in_order() {
    let (stack, _shared) = shared_stack().await;
    let tree = Tree::build(stack, &Mode::Convert.platform(), "seed-convert").await;
    stack.enter(Mode::Convert, &tree).await;
    let started = Instant::now();
    let (ok, stderr) = stack.kubectl_delete(&tree, false).await;
    assert!(ok, "kubectl delete: {stderr}");
    assert_torn_down_in_order(stack, &tree, "Convert", started).await;
    assert!(
        tree.timeline
            .seen_with_finalizer("InferenceCluster", &tree.name, "foregroundDeletion"),
        "cascade-guard never converted the delete\n{}",
        tree.timeline.describe()
    );
}

/// Waits until managed resource `name` is deleted but held by its provider's
/// finalizer with the provider reporting a failure: its message.
pub(crate) async fn wait_wedged(
    objects: &Api<DynamicObject>,
    name: &str,
    timeout: Duration,
) -> Option<String> {
    wait::until_lasting(timeout, || async {
        let o = objects.get_opt(name).await.ok().flatten()?;
        o.metadata.deletion_timestamp.as_ref()?;
        let held = o.finalizers().iter().any(|f| f == MANAGED_FINALIZER);
        held.then(|| sync_failure(&o)).flatten()
    })
    .await
}

/// How many failed reconciles a provider has reported for the Object `name`:
/// the counts of its Warning Events about it (one per failed attempt, as
/// client-go counts repeats).
pub(crate) async fn provider_warnings(client: &Client, name: &str) -> i32 {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::all(client.clone());
    let selector = format!("involvedObject.kind=Object,involvedObject.name={name},type=Warning");
    events
        .list(&kube::api::ListParams::default().fields(&selector))
        .await
        .map(|l| l.items.iter().map(|e| e.count.unwrap_or(1)).sum())
        .unwrap_or(0)
}

/// Waits until cascade-guard holds `name` with its finalizer (Convert).
pub(crate) async fn wait_held(objects: &Api<DynamicObject>, name: &str) {
    let held = wait::until_lasting(Duration::from_secs(60), || async {
        let o = objects.get_opt(name).await.ok().flatten()?;
        o.finalizers()
            .iter()
            .any(|f| f == HOLD_FINALIZER)
            .then_some(())
    })
    .await;
    assert!(held.is_some(), "cascade-guard never held {name}");
}

/// Waits until `name` is Ready, then reads the string at `pointer` in it.
pub(crate) async fn when_ready(
    objects: &Api<DynamicObject>,
    name: &str,
    pointer: &str,
) -> Option<String> {
    wait::until_lasting(BUILD_TIMEOUT, || async {
        let o = objects.get_opt(name).await.ok().flatten()?;
        if !is_ready(&o) {
            return None;
        }
        o.data
            .pointer(pointer)
            .and_then(Value::as_str)
            .map(str::to_string)
    })
    .await
}

/// Waits until Crossplane has created CRD `name` and it is established.
pub(crate) async fn wait_generated_crd(client: &Client, name: &str) {
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    let found = wait::until_lasting(BUILD_TIMEOUT, || async {
        crds.get_opt(name).await.ok().flatten()
    })
    .await;
    assert!(found.is_some(), "Crossplane never created the CRD {name}");
    wait::crd_established(client, name, BUILD_TIMEOUT)
        .await
        .expect("CRD established");
}

pub(crate) async fn create_namespace(client: &Client, name: &str) {
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(
            &kube::api::PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace"),
        )
        .await;
}
