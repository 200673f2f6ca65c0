//! The seed report's scenarios 2 and 3: a ModelDeployment and an
//! InferenceGateway on an InferenceCluster deleted while they go away.

use super::*;

// ---------------------------------------------------------------------------
// The seed report's scenarios 2 and 3: a ModelDeployment (in a team's
// namespace) and an InferenceGateway running on an InferenceCluster, each with
// a guard (a Usage of the cluster's EKSCluster by its ModelReplica or its
// ServingStack, `testbed/crossplane/modelplane/compositions/`), and the
// InferenceCluster deleted while they go away. One more Convert test deletes
// the ModelDeployment with its namespace (the namespace controller deletes
// everything in it, the ModelDeployment's composed objects and
// provider-kubernetes' ProviderConfigUsages included; sibling order holds
// each usage while its provider needs it).

/// A teardown that waits for the consumers' load balancers (60 s for an
/// engine's), their guards' 30-second re-checks, then the InferenceCluster's.
pub(crate) const CONSUMERS_TEARDOWN_TIMEOUT: Duration = Duration::from_secs(480);

/// ModelDeployments (namespace, name) and an InferenceGateway on one
/// InferenceCluster, watched from before they exist.
pub(crate) struct Consumers {
    /// Their InferenceCluster's copy of the platform.
    pub(crate) platform: modelplane::Platform,
    pub(crate) model_deployments: Vec<(String, String)>,
    pub(crate) gateway: String,
    pub(crate) timeline: Timeline,
}

impl Consumers {
    /// Creates them on `tree`'s cluster and waits until they are Ready and
    /// their guards are in place.
    pub(crate) async fn create(tree: &Tree, model_deployments: Vec<(String, String)>) -> Self {
        let gateway = format!("{}-gw", tree.name);
        let mut consumers = Self {
            platform: tree.platform.clone(),
            model_deployments,
            gateway,
            timeline: Timeline::start(&tree.client, &[])
                .await
                .unwrap_or_else(|e| panic!("{e}")),
        };
        let mut watched: Vec<(ApiResource, Option<String>)> = Vec::new();
        for (r, ns, _) in consumers.objects() {
            if !watched.iter().any(|(w, n)| w == &r && n == &ns) {
                watched.push((r, ns));
            }
        }
        consumers.timeline = Timeline::start(&tree.client, &watched)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let params = PatchParams::apply("seed-real").force();
        for (ns, name) in &consumers.model_deployments {
            create_namespace(&tree.client, ns).await;
            api(&tree.client, &tree.platform.model_deployments(), Some(ns))
                .patch(
                    name,
                    &params,
                    &Patch::Apply(tree.platform.model_deployment(ns, name, &tree.name)),
                )
                .await
                .unwrap_or_else(|e| panic!("create ModelDeployment {name}: {e}"));
        }
        api(&tree.client, &tree.platform.inference_gateways(), None)
            .patch(
                &consumers.gateway,
                &params,
                &Patch::Apply(
                    tree.platform
                        .inference_gateway(&consumers.gateway, &tree.name),
                ),
            )
            .await
            .unwrap_or_else(|e| panic!("create InferenceGateway: {e}"));
        let started = Instant::now();
        let tops = consumers.tops_and_guards();
        let ready = wait::until_lasting(BUILD_TIMEOUT, || async {
            for (r, ns, n) in &tops {
                let o = api(&tree.client, r, ns.as_deref())
                    .get_opt(n)
                    .await
                    .ok()??;
                if !is_ready(&o) {
                    return None;
                }
            }
            Some(())
        })
        .await;
        assert!(
            ready.is_some(),
            "{}: the consumers never became Ready: {}\n{}",
            tree.name,
            consumers.states(&tree.client).await,
            consumers.timeline.describe()
        );
        eprintln!(
            "{}: the consumers were ready in {:?}",
            tree.name,
            started.elapsed()
        );
        consumers
    }

    pub(crate) fn objects(&self) -> Vec<(ApiResource, Option<String>, String)> {
        let mut objects = Vec::new();
        for (ns, name) in &self.model_deployments {
            objects.extend(self.platform.model_deployment_tree(ns, name));
        }
        objects.extend(self.platform.inference_gateway_tree(&self.gateway));
        objects
    }

    /// The top XRs and the guards.
    pub(crate) fn tops_and_guards(&self) -> Vec<(ApiResource, Option<String>, String)> {
        self.objects()
            .into_iter()
            .filter(|(r, _, n)| {
                r.kind == "ModelDeployment"
                    || r.kind == "InferenceGateway"
                    || (r.kind == "Usage" && n.ends_with("guard"))
            })
            .collect()
    }

    /// What runs on the cloud cluster: the releases and Objects.
    pub(crate) fn on_the_cluster(&self) -> Vec<(ApiResource, Option<String>, String)> {
        self.objects()
            .into_iter()
            .filter(|(r, _, _)| r.kind == "Release" || r.kind == "Object")
            .collect()
    }

    pub(crate) async fn states(&self, client: &Client) -> String {
        states_of(client, &self.objects()).await
    }

    pub(crate) async fn left(&self, client: &Client) -> Vec<String> {
        left_of(client, &self.objects()).await
    }

    /// etcd's revision of its delete, from either timeline.
    pub(crate) fn gone_seq(&self, tree: &Tree, kind: &str, name: &str) -> u64 {
        let entry = self
            .timeline
            .gone(kind, name)
            .or_else(|| tree.timeline.gone(kind, name));
        match entry {
            Some(e) => scene::revision(&e, &tree.name),
            None => panic!(
                "{kind}/{name} never seen leaving the API\n{}",
                self.timeline.describe()
            ),
        }
    }

    /// Each consumer's parts left before their XR (a foreground cascade),
    /// and everything on the cloud cluster before the cluster.
    pub(crate) fn assert_order(&self, tree: &Tree, what: &str) {
        let cluster = self.gone_seq(tree, "Cluster", &tree.name);
        for (r, _, n) in self.on_the_cluster() {
            let needer = self.gone_seq(tree, &r.kind, &n);
            assert!(
                needer < cluster,
                "{what}: Cluster/{} left (#{cluster}) before {}/{n} (#{needer})\n{}\n{}",
                tree.name,
                r.kind,
                self.timeline.describe(),
                tree.timeline.describe()
            );
        }
        for (_, name) in &self.model_deployments {
            let engine = self.gone_seq(tree, "Object", &format!("{name}-0-engine"));
            let replica = self.gone_seq(tree, "ModelReplica", &format!("{name}-0"));
            let md = self.gone_seq(tree, "ModelDeployment", name);
            assert!(
                engine < replica && replica < md,
                "{what}: Object #{engine}, ModelReplica #{replica}, ModelDeployment #{md}\n{}",
                self.timeline.describe()
            );
        }
        let stack = self.gone_seq(tree, "ServingStack", &format!("{}-gateway", self.gateway));
        let gateway = self.gone_seq(tree, "InferenceGateway", &self.gateway);
        assert!(
            stack < gateway,
            "{what}: ServingStack #{stack}, InferenceGateway #{gateway}\n{}",
            self.timeline.describe()
        );
    }

    /// Removes the providers' finalizer from what is left on the cluster, as
    /// an operator does with a wedged resource, and waits for all to go.
    pub(crate) async fn clean_up(&self, client: &Client) {
        for (r, ns, n) in self.on_the_cluster() {
            let _ = api(client, &r, ns.as_deref())
                .patch(
                    &n,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                )
                .await;
        }
        let gone = wait::until_lasting(Duration::from_secs(180), || async {
            self.left(client).await.is_empty().then_some(())
        })
        .await;
        assert!(
            gone.is_some(),
            "clean-up left {:?}",
            self.left(client).await
        );
    }
}

/// Waits for `kind/name` (an Object) to be terminating, seen on either
/// timeline. Five minutes: after a namespace's deletion the namespace
/// controller deletes its objects a resource type at a time, over every type
/// served (over a hundred here); under a loaded run each took 2 to 3 s, and
/// it reached the engine's kind 100 s after the namespace's delete, past the
/// minute this waited before (the ModelDeployment not yet terminating,
/// nothing holding it).
pub(crate) async fn wait_terminating(consumers: &Consumers, kind: &str, name: &str) {
    let seen = wait::until_lasting(Duration::from_secs(300), || async {
        consumers.timeline.terminating(kind, name).map(|_| ())
    })
    .await;
    assert!(
        seen.is_some(),
        "{kind}/{name} never terminating\n{}",
        consumers.timeline.describe()
    );
}

pub(crate) fn assert_refused(outcome: &(bool, String), kind: &str, name: &str) {
    let (ok, stderr) = outcome;
    assert!(!ok, "the plain delete of {kind} {name} was allowed");
    assert!(
        stderr.contains("(Forbidden)")
            && stderr.contains(&format!("cascade-guard refused to delete {kind} {name}"))
            && stderr.contains("--cascade=foreground"),
        "unexpected refusal of {kind} {name}: {stderr}"
    );
}

/// Scenarios 2 and 3 under `mode` on InferenceCluster `use-<mode>`.
/// With `by_namespace` (Convert only), the ModelDeployment goes with its
/// namespace instead of by a plain delete.
pub(crate) async fn consumers_outcome(stack: &Stack, mode: Mode, by_namespace: bool) {
    let lower = if by_namespace {
        "namespace".to_string()
    } else {
        mode.as_str().to_lowercase()
    };
    let tree = Tree::build(stack, &mode.platform(), &format!("use-{lower}")).await;
    let model_deployments = vec![(format!("team-{lower}"), format!("{}-llama", tree.name))];
    let consumers = Consumers::create(&tree, model_deployments).await;
    stack.enter(mode, &tree).await;
    let client = &tree.client;
    let mds = tree.platform.model_deployments();
    let igs = tree.platform.inference_gateways();
    for (ns, name) in &consumers.model_deployments {
        stack.wait_in_effect(&mds, Some(ns), name, mode).await;
    }
    stack
        .wait_in_effect(&igs, None, &consumers.gateway, mode)
        .await;
    let what = format!("consumers ({mode:?})");
    let (md_ns, md) = consumers.model_deployments[0].clone();
    let engine = format!("{md}-0-engine");
    let started = Instant::now();
    match mode {
        Mode::Off => {
            // Both go away, and the InferenceCluster is deleted meanwhile.
            for (r, ns, name) in [
                (&mds, Some(md_ns.as_str()), md.as_str()),
                (&igs, None, consumers.gateway.as_str()),
            ] {
                let (ok, stderr) = stack.kubectl_delete_of(r, ns, name, false).await;
                assert!(ok, "kubectl delete {name}: {stderr}");
            }
            let (ok, stderr) = stack.kubectl_delete(&tree, false).await;
            assert!(ok, "kubectl delete: {stderr}");
            tree.wait_cluster_gone(&what, started).await;
            // The ModelReplica and its guard went at once; the engine's
            // Object, still deleting its load balancer, wedges.
            let objects = api(client, &modelplane::objects(), Some(&md_ns));
            let failure = wait_wedged(&objects, &engine, Duration::from_secs(120)).await;
            let Some(failure) = failure else {
                panic!(
                    "{what}: Object {engine} did not wedge\n{}\n{}",
                    consumers.states(client).await,
                    consumers.timeline.describe()
                );
            };
            let guard = consumers
                .timeline
                .gone("Usage", &format!("{md}-replica-guard"))
                .map(|e| e.at - started);
            eprintln!("{what}: the guard let go after {guard:?}; {engine} wedged: {failure}");
            let leaked = tree.leaked(stack);
            assert!(
                leaked
                    .iter()
                    .any(|l| l.contains(&format!("load balancer of Service default/{engine}"))),
                "{what}: no leaked load balancer of {engine}: {leaked:?}"
            );
            eprintln!("{what}: {leaked:?}");
            consumers.clean_up(client).await;
            tree.clean_up().await;
            return;
        }
        Mode::Refuse => {
            let refused = stack
                .kubectl_delete_of(&mds, Some(&md_ns), &md, false)
                .await;
            assert_refused(&refused, "ModelDeployment", &md);
            let refused = stack
                .kubectl_delete_of(&igs, None, &consumers.gateway, false)
                .await;
            assert_refused(&refused, "InferenceGateway", &consumers.gateway);
            for (r, ns, name) in [
                (&mds, Some(md_ns.as_str()), md.as_str()),
                (&igs, None, consumers.gateway.as_str()),
            ] {
                let (ok, stderr) = stack.kubectl_delete_of(r, ns, name, true).await;
                assert!(ok, "kubectl delete --cascade=foreground {name}: {stderr}");
            }
            wait_terminating(&consumers, "Object", &engine).await;
            // While they go away: the plain delete is refused, the foreground
            // one goes through and waits for the guards.
            let refused = stack.kubectl_delete(&tree, false).await;
            assert_refused(&refused, "InferenceCluster", &tree.name);
            let (ok, stderr) = stack.kubectl_delete(&tree, true).await;
            assert!(ok, "kubectl delete --cascade=foreground: {stderr}");
        }
        Mode::Warn => panic!("no consumers scenario under Warn"),
        Mode::Convert => {
            if by_namespace {
                let [_, kubernetes_usages] = provider_config_usages();
                wait_usage_held(
                    client,
                    &modelplane::objects(),
                    &kubernetes_usages,
                    &md_ns,
                    &engine,
                )
                .await;
                Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
                    .delete(&md_ns, &DeleteParams::default())
                    .await
                    .unwrap_or_else(|e| panic!("delete namespace {md_ns}: {e}"));
            } else {
                let (ok, stderr) = stack
                    .kubectl_delete_of(&mds, Some(&md_ns), &md, false)
                    .await;
                assert!(ok, "kubectl delete {md}: {stderr}");
            }
            let (ok, stderr) = stack
                .kubectl_delete_of(&igs, None, &consumers.gateway, false)
                .await;
            assert!(ok, "kubectl delete {}: {stderr}", consumers.gateway);
            wait_terminating(&consumers, "Object", &engine).await;
            let (ok, stderr) = stack.kubectl_delete(&tree, false).await;
            assert!(ok, "kubectl delete: {stderr}");
        }
    }
    let all_gone = wait::until_lasting(CONSUMERS_TEARDOWN_TIMEOUT, || async {
        (consumers.left(client).await.is_empty() && tree.left().await.is_empty()).then_some(())
    })
    .await;
    assert!(
        all_gone.is_some(),
        "{what}: left {:?} {:?}\n{}\n{}\n{}",
        consumers.left(client).await,
        tree.left().await,
        consumers.states(client).await,
        consumers.timeline.describe(),
        tree.timeline.describe()
    );
    tree.assert_order(&what);
    consumers.assert_order(&tree, &what);
    let events = local_cluster::audit::read(&audit_log::audit_log(&stack.cp))
        .expect("the API server's audit log");
    let refused = crossplane_refusals(&events, &consumers.objects());
    assert!(
        refused.is_empty(),
        "{what}: Crossplane was refused: {refused:?}"
    );
    assert_crossplane_never_refused(stack, &tree, &what);
    assert!(
        tree.leaked(stack).is_empty(),
        "{what}: {:?}",
        tree.leaked(stack)
    );
    if mode == Mode::Convert {
        for (ns, name) in &consumers.model_deployments {
            assert!(
                consumers.timeline.seen_with_finalizer(
                    "ModelDeployment",
                    name,
                    "foregroundDeletion"
                ),
                "{what}: {name} in {ns} was never converted\n{}",
                consumers.timeline.describe()
            );
        }
    }
    if by_namespace {
        // The namespace controller's own work after the tree: it lists every
        // kind in the namespace and retries with backoff (over 120 s once
        // under a whole run's load, CI-like run at e0c9303).
        let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone());
        if let Err(e) = namespace_finishes(&namespaces, &md_ns).await {
            panic!("{what}: {e}\n{}", consumers.timeline.describe());
        }
    }
    eprintln!(
        "{what}: everything gone, in order, nothing leaked, in {:?}",
        started.elapsed()
    );
}

pub(crate) async fn without_cascade_guard_the_consumers_race_wedges_an_engine_and_leaks_its_load_balancer()
 {
    let (stack, _shared) = shared_stack().await;
    consumers_outcome(stack, Mode::Off, false).await;
}

pub(crate) async fn refuse_refuses_the_consumers_plain_deletes_and_foreground_tears_down_in_order()
{
    let (stack, _shared) = shared_stack().await;
    consumers_outcome(stack, Mode::Refuse, false).await;
}

pub(crate) async fn convert_tears_the_consumers_down_in_order() {
    let (stack, _shared) = shared_stack().await;
    consumers_outcome(stack, Mode::Convert, false).await;
}

/// The ModelDeployment's namespace deleted (the namespace controller's
/// Background delete, which Convert makes a foreground cascade). On the
/// pinned providers a namespaced managed resource in a terminating namespace
/// wedges once its ProviderConfigUsage is deleted (crossplane-runtime#1150):
/// sibling order holds each one until its provider is done, so the engine's
/// Object goes, and the namespace with it.
pub(crate) async fn convert_tears_a_deleted_namespace_down_in_order() {
    let (stack, _shared) = shared_stack().await;
    consumers_outcome(stack, Mode::Convert, true).await;
}
