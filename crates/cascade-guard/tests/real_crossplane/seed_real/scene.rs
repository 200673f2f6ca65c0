//! A scenario's objects on real Crossplane, watched from before they exist:
//! applied, waited on, and their order read back by etcd revision. Shared by
//! the sibling-order shapes and the InferenceCluster's guards.

use super::*;
use local_cluster::timeline::Entry;

/// The ClusterUsage kind (cluster-scoped).
pub(crate) fn cluster_usages() -> ApiResource {
    modelplane::resource(
        "protection.crossplane.io",
        "v1beta1",
        "ClusterUsage",
        "clusterusages",
    )
}

/// A cluster-scoped v2 XRD of `kind` in `group` (version v1) whose spec takes
/// anything, carrying `mode` in the policy annotation: a composite that only
/// exists to compose others.
pub(crate) fn open_cluster_xrd(group: &str, kind: &str, plural: &str, mode: Mode) -> Value {
    json!({
        "apiVersion": "apiextensions.crossplane.io/v2",
        "kind": "CompositeResourceDefinition",
        "metadata": {
            "name": format!("{plural}.{group}"),
            "annotations": {POLICY_ANNOTATION: mode.as_str()},
        },
        "spec": {
            "group": group,
            "names": {"kind": kind, "plural": plural},
            "scope": "Cluster",
            "versions": [{
                "name": "v1", "served": true, "referenceable": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object"},
                }}},
            }],
        },
    })
}

pub(crate) type Objects = Vec<(ApiResource, Option<String>, String)>;

/// etcd's revision of a timeline entry, which the order of changes is read
/// from. Every watch event has one (its resourceVersion); only a removal the
/// watch missed, whose list then failed, has none. Its arrival order (`seq`)
/// is no stand-in: across separate watches it is not the API server's order.
pub(crate) fn revision(e: &Entry, what: &str) -> u64 {
    e.revision.unwrap_or_else(|| {
        panic!(
            "{what}: {}/{} (seen #{}) has no etcd revision: its order is not known",
            e.kind, e.name, e.seq
        )
    })
}

/// The local cloud's log, where it notes each cluster's load balancers
/// leaked. Fails naming it when it cannot be read: read as empty it would
/// say that nothing leaked. It is there once a cloud cluster has come up.
pub(crate) fn cloud_log(stack: &Stack) -> String {
    let path = stack.cp.log_path("local-cloud");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read the local cloud's log {}: {e}", path.display()))
}

/// The objects of one scenario, watched from before they exist.
pub(crate) struct Scene {
    pub(crate) what: String,
    pub(crate) client: Client,
    objects: Objects,
    pub(crate) timeline: Timeline,
}

impl Scene {
    pub(crate) async fn watch(stack: &Stack, what: &str, objects: Objects) -> Self {
        let client = stack.cp.admin().await.expect("admin client");
        let mut watched: Vec<(ApiResource, Option<String>)> = Vec::new();
        for (r, ns, _) in &objects {
            if !watched.iter().any(|(w, n)| w == r && n == ns) {
                watched.push((r.clone(), ns.clone()));
            }
        }
        let timeline = Timeline::start(&client, &watched)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        Self {
            what: what.to_string(),
            client,
            objects,
            timeline,
        }
    }

    pub(crate) async fn apply(&self, resource: &ApiResource, object: Value) {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let ns = object["metadata"]["namespace"].as_str();
        api(&self.client, resource, ns)
            .patch(
                name,
                &PatchParams::apply("seed-real").force(),
                &Patch::Apply(&object),
            )
            .await
            .unwrap_or_else(|e| panic!("{}: create {} {name}: {e}", self.what, resource.kind));
    }

    /// Applies `object` and waits until it is Ready.
    pub(crate) async fn apply_ready(&self, resource: &ApiResource, object: Value) {
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let ns = object["metadata"]["namespace"].as_str().map(str::to_string);
        self.apply(resource, object).await;
        self.wait_ready(resource, ns.as_deref(), &name).await;
    }

    pub(crate) async fn wait_ready(&self, resource: &ApiResource, ns: Option<&str>, name: &str) {
        let objects = api(&self.client, resource, ns);
        let ready = wait::until_lasting(BUILD_TIMEOUT, || async {
            is_ready(&objects.get_opt(name).await.ok().flatten()?).then_some(())
        })
        .await;
        assert!(
            ready.is_some(),
            "{}: {} {name} never became Ready\n{}",
            self.what,
            resource.kind,
            self.states().await
        );
    }

    /// Waits until `name` carries `label` (with `value`, if given).
    pub(crate) async fn wait_labelled(
        &self,
        resource: &ApiResource,
        ns: Option<&str>,
        name: &str,
        label: &str,
        value: Option<&str>,
    ) {
        let objects = api(&self.client, resource, ns);
        // A bound for a hold that never comes, as the shapes' (240 s): in
        // CI, about 40 trees on two cores, sibling order's look at a new tree
        // came after more than 90 s.
        let labelled = wait::until_lasting(Duration::from_secs(240), || async {
            let o = objects.get_opt(name).await.ok().flatten()?;
            let v = o.labels().get(label)?;
            value.is_none_or(|want| v == want).then_some(())
        })
        .await;
        assert!(
            labelled.is_some(),
            "{}: {} {name} never carried {label}\n{}",
            self.what,
            resource.kind,
            self.states().await
        );
    }

    /// Waits until sibling order holds the object (an entry in its
    /// ConfigMap), within the bound of [`Scene::wait_labelled`].
    pub(crate) async fn wait_held(&self, resource: &ApiResource, ns: Option<&str>, name: &str) {
        let held = cascade_guard_testkit::wait_sibling_held(
            &self.client,
            LEASE_NAMESPACE,
            resource,
            ns,
            name,
            Duration::from_secs(240),
        )
        .await;
        assert!(
            held,
            "{}: {} {name} was never held\n{}",
            self.what,
            resource.kind,
            self.states().await
        );
    }

    pub(crate) async fn states(&self) -> String {
        states_of(&self.client, &self.objects).await
    }

    pub(crate) async fn left(&self) -> Vec<String> {
        left_of(&self.client, &self.objects).await
    }

    pub(crate) async fn wait_all_gone(&self, timeout: Duration) {
        let gone = wait::until_lasting(timeout, || async {
            self.left().await.is_empty().then_some(())
        })
        .await;
        assert!(
            gone.is_some(),
            "{}: left {:?}\n{}\n{}",
            self.what,
            self.left().await,
            self.states().await,
            self.timeline.describe()
        );
        // The watch behind the timeline can lag the GETs that found
        // everything gone (a loaded run's Usage was gone by GET and not yet
        // by watch when its revision was asked): wait until it has the
        // removal of each object it saw. One still missing after that is
        // said by whatever asks for its revision.
        for (resource, _, name) in &self.objects {
            let seen = self
                .timeline
                .entries()
                .iter()
                .any(|e| e.kind == resource.kind && e.name == *name);
            if seen {
                self.timeline
                    .wait_gone(&resource.kind, name, Duration::from_secs(60))
                    .await;
            }
        }
    }

    /// etcd's revision of `name`'s removal.
    pub(crate) fn gone(&self, kind: &str, name: &str) -> u64 {
        match self.timeline.gone(kind, name) {
            Some(e) => revision(&e, &self.what),
            None => panic!(
                "{}: {kind}/{name} never seen leaving\n{}",
                self.what,
                self.timeline.describe()
            ),
        }
    }

    /// etcd's revision of the first sight of `name` being deleted.
    pub(crate) fn terminating(&self, kind: &str, name: &str) -> u64 {
        match self.timeline.terminating(kind, name) {
            Some(e) => revision(&e, &self.what),
            None => panic!(
                "{}: {kind}/{name} never seen deleting\n{}",
                self.what,
                self.timeline.describe()
            ),
        }
    }

    /// `a` left the API before `b`.
    /// Asserts that the cloud Cluster `name` does not start deleting within
    /// a minute, while `user` still runs on it: a minute is longer than the
    /// whole tree takes to go when nothing holds it.
    pub(crate) async fn assert_cluster_stays(&self, name: &str, user: &str) {
        let early = wait::until_lasting(Duration::from_secs(60), || async {
            self.timeline.terminating("Cluster", name).map(|_| ())
        })
        .await;
        assert!(
            early.is_none(),
            "{}: the cloud cluster was deleted while {user} still ran on it\n{}",
            self.what,
            self.timeline.describe()
        );
    }

    pub(crate) fn assert_before(
        &self,
        (a_kind, a): (&str, &str),
        (b_kind, b): (&str, &str),
        why: &str,
    ) {
        let (x, y) = (self.gone(a_kind, a), self.gone(b_kind, b));
        assert!(
            x < y,
            "{}: {a_kind}/{a} left (#{x}) after {b_kind}/{b} (#{y}): {why}\n{}",
            self.what,
            self.timeline.describe()
        );
    }

    /// No delete of the scene's objects by Crossplane was refused.
    pub(crate) fn assert_crossplane_never_refused(&self, stack: &Stack) {
        let events = local_cluster::audit::read(&audit_log::audit_log(&stack.cp))
            .expect("the API server's audit log");
        let refused = crossplane_refusals(&events, &self.objects);
        assert!(
            refused.is_empty(),
            "{}: Crossplane was refused: {refused:?}",
            self.what
        );
    }

    /// The local cloud logged no load balancer of `cluster` leaked, and
    /// Crossplane was never refused.
    pub(crate) fn assert_nothing_leaked(&self, stack: &Stack, cluster: &str) {
        self.assert_crossplane_never_refused(stack);
        let leaked = modelplane::leaked(&cloud_log(stack), cluster);
        assert!(leaked.is_empty(), "{}: leaked {leaked:?}", self.what);
    }

    /// Takes the providers' finalizer off every Release, Object and cloud
    /// LoadBalancer of the scene that is being deleted (an operator's way
    /// out of a wedge) and waits for everything to go.
    pub(crate) async fn clean_up(&self) {
        for (r, ns, n) in &self.objects {
            if !matches!(r.kind.as_str(), "Release" | "Object" | "LoadBalancer") {
                continue;
            }
            let objects = api(&self.client, r, ns.as_deref());
            let deleting = objects
                .get_opt(n)
                .await
                .ok()
                .flatten()
                .is_some_and(|o| o.metadata.deletion_timestamp.is_some());
            if deleting {
                let _ = objects
                    .patch(
                        n,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                    )
                    .await;
            }
        }
        self.wait_all_gone(Duration::from_secs(180)).await;
    }
}
