//! One InferenceCluster's tree, watched from before it exists: building it,
//! deleting it, and what its teardown must show.

use super::*;

/// One InferenceCluster's tree, watched from before it exists.
pub(crate) struct Tree {
    pub(crate) name: String,
    /// The copy of the platform it is built on.
    pub(crate) platform: modelplane::Platform,
    /// Composed with the seed's hand-written Usage of the EKSCluster by the
    /// ServingStack; without it, only sibling order keeps the two in order.
    pub(crate) usage: bool,
    pub(crate) client: Client,
    pub(crate) timeline: Timeline,
    /// Removals the timeline's watches missed across an API server restart.
    pub(crate) missed: MissedRemovals,
}

/// Removals a tree's timeline missed across an API server restart, found by
/// [`sweep_missed`]: by UID, with kind and name.
pub(crate) type MissedRemovals = StdMutex<BTreeMap<String, (String, String, invariant::Missed)>>;

/// What became of a snapshot's object: `entries`' record, with a removal the
/// watch missed.
pub(crate) fn fate_with_missed(
    entries: &[local_cluster::timeline::Entry],
    uids: &BTreeMap<invariant::ObjectId, String>,
    missed: &MissedRemovals,
    r: &invariant::ObjectId,
) -> Option<invariant::Fate> {
    let uid = uids.get(r).map(String::as_str);
    let missed = uid.and_then(|u| {
        let missed = missed.lock().expect("missed");
        missed.get(u).map(|(_, _, m)| *m)
    });
    invariant::fate_with(entries, r, uid, missed)
}

/// When `kind/name` left the API: etcd's revision of its delete (ordered
/// across kinds; arrival order across separate watches is not, for deletes
/// milliseconds apart; a removal without a revision fails); for a removal
/// the watch missed (the timeline's re-list, or [`sweep_missed`]), the
/// revisions it lies within; `None` if never seen leaving.
pub(crate) fn gone_within(
    timeline: &Timeline,
    missed: &MissedRemovals,
    kind: &str,
    name: &str,
) -> Option<(u64, u64)> {
    if let Some(e) = timeline.gone(kind, name) {
        let by = scene::revision(&e, &format!("{kind}/{name} leaving"));
        return Some((e.missed_after.map_or(by, |after| after + 1), by));
    }
    let missed = missed.lock().expect("missed");
    missed
        .values()
        .find(|(k, n, _)| k == kind && n == name)
        .map(|(_, _, m)| (m.after + 1, m.by))
}

/// One tree as [`sweep_missed`] looks through it.
pub(crate) struct Swept<'a> {
    pub(crate) name: &'a str,
    pub(crate) client: &'a Client,
    pub(crate) timeline: &'a Timeline,
    pub(crate) missed: &'a MissedRemovals,
    /// The kinds, each with its namespace, that its snapshot's objects are of.
    pub(crate) kinds: Vec<(ApiResource, Option<String>)>,
}

impl Tree {
    /// Creates InferenceCluster `name` on `platform` and waits until it is
    /// Ready and its Usage guards the EKSCluster.
    pub(crate) async fn build(stack: &Stack, platform: &modelplane::Platform, name: &str) -> Self {
        Self::build_with(stack, platform, name, true).await
    }

    /// The same tree composed without its Usage; waits until it is Ready and,
    /// when `held`, until cascade-guard holds the EKSCluster for the
    /// ServingStack (sibling order).
    pub(crate) async fn build_without_usage(
        stack: &Stack,
        platform: &modelplane::Platform,
        name: &str,
        held: bool,
    ) -> Self {
        let tree = Self::build_with(stack, platform, name, false).await;
        if held {
            tree.wait_sibling_hold().await;
        }
        tree
    }

    /// Waits until cascade-guard holds the EKSCluster for the ServingStack
    /// (sibling order): only once the platform carries Refuse or Convert.
    pub(crate) async fn wait_sibling_hold(&self) {
        let held = cascade_guard_testkit::wait_sibling_held(
            &self.client,
            LEASE_NAMESPACE,
            &self.platform.eks_clusters(),
            Some(SYSTEM_NAMESPACE),
            &self.name,
            Duration::from_secs(60),
        )
        .await;
        assert!(held, "cascade-guard never held EKSCluster {}", self.name);
    }

    pub(crate) async fn build_with(
        stack: &Stack,
        platform: &modelplane::Platform,
        name: &str,
        usage: bool,
    ) -> Self {
        let client = stack.cp.admin().await.expect("admin client");
        let mut watched: Vec<(ApiResource, Option<String>)> = Vec::new();
        for (r, ns, _) in platform.tree(name) {
            if !watched.iter().any(|(w, _)| w == &r) {
                watched.push((r, ns));
            }
        }
        // What else a snapshot reads (Tree::snapshot), so that its edges
        // can be judged.
        for r in std::iter::once(secrets()).chain(provider_config_usages()) {
            watched.push((r, Some(SYSTEM_NAMESPACE.to_string())));
        }
        let timeline = Timeline::start(&client, &watched)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let ics = api(&client, &platform.inference_clusters(), None);
        ics.patch(
            name,
            &PatchParams::apply("seed-real").force(),
            &Patch::Apply(if usage {
                platform.inference_cluster(name)
            } else {
                platform.inference_cluster_without_usage(name)
            }),
        )
        .await
        .unwrap_or_else(|e| panic!("create InferenceCluster {name}: {e}"));
        let started = Instant::now();
        let tree = Self {
            name: name.to_string(),
            platform: platform.clone(),
            usage,
            client,
            timeline,
            missed: StdMutex::new(BTreeMap::new()),
        };
        let ready = wait::until_lasting(BUILD_TIMEOUT, || async {
            is_ready(&ics.get_opt(name).await.ok().flatten()?).then_some(())
        })
        .await;
        assert!(
            ready.is_some(),
            "InferenceCluster {name} never became Ready: {}\n{}",
            tree.states().await,
            stack.cp.log_tails(20)
        );
        let eks = api(
            &tree.client,
            &platform.eks_clusters(),
            Some(SYSTEM_NAMESPACE),
        );
        let in_use = wait::until_lasting(Duration::from_secs(60), || async {
            let o = eks.get_opt(name).await.ok().flatten()?;
            (!usage || o.labels().get(IN_USE_LABEL).map(String::as_str) == Some("true"))
                .then_some(())
        })
        .await;
        assert!(in_use.is_some(), "EKSCluster {name} never became in use");
        eprintln!("{name}: the tree was ready in {:?}", started.elapsed());
        tree
    }

    pub(crate) fn objects(&self) -> Vec<(ApiResource, Option<String>, String)> {
        let mut objects = self.platform.tree(&self.name);
        if !self.usage {
            objects.retain(|(r, _, _)| r.kind != "Usage");
        }
        objects
    }

    /// Whether it was composed with the seed's Usage, in words.
    pub(crate) fn shape(&self) -> &'static str {
        if self.usage {
            "with Usage"
        } else {
            "without Usage"
        }
    }

    pub(crate) fn stack_name(&self) -> String {
        format!("{}-serving-stack", self.name)
    }

    /// The managed resources that need the cloud cluster: the releases and
    /// the gateway's Object.
    pub(crate) fn on_the_cluster(&self) -> Vec<(ApiResource, String)> {
        self.objects()
            .into_iter()
            .filter(|(r, _, _)| r.kind == "Release" || r.kind == "Object")
            .map(|(r, _, n)| (r, n))
            .collect()
    }

    /// Each object's state, for failure messages.
    pub(crate) async fn states(&self) -> String {
        states_of(&self.client, &self.objects()).await
    }

    pub(crate) async fn left(&self) -> Vec<String> {
        left_of(&self.client, &self.objects()).await
    }

    pub(crate) async fn wait_all_gone(&self, timeout: Duration) -> bool {
        wait::until_lasting(timeout, || async {
            self.left().await.is_empty().then_some(())
        })
        .await
        .is_some()
    }

    /// When it left the API ([`gone_within`]).
    pub(crate) fn gone_within(&self, kind: &str, name: &str) -> (u64, u64) {
        gone_within(&self.timeline, &self.missed, kind, name).unwrap_or_else(|| {
            panic!(
                "{kind}/{name} never seen leaving the API\n{}",
                self.timeline.describe()
            )
        })
    }

    /// The tree as [`sweep_missed`] looks through it: its objects' kinds,
    /// the cloud cluster's kubeconfig Secret and the ProviderConfigUsages.
    pub(crate) fn swept(&self) -> Swept<'_> {
        let mut kinds: Vec<(ApiResource, Option<String>)> = Vec::new();
        let objects = self.objects().into_iter().map(|(r, ns, _)| (r, ns));
        let more = std::iter::once(secrets())
            .chain(provider_config_usages())
            .map(|r| (r, Some(SYSTEM_NAMESPACE.to_string())));
        for kind in objects.chain(more) {
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        Swept {
            name: &self.name,
            client: &self.client,
            timeline: &self.timeline,
            missed: &self.missed,
            kinds,
        }
    }

    /// The order that prevents the seed's failure: everything on the cloud
    /// cluster left before it, the ServingStack before the EKSCluster the
    /// Usage guards, and the InferenceCluster last (a foreground cascade).
    /// Each "before" is sure: a removal known only within revisions must lie
    /// wholly before the other.
    pub(crate) fn assert_order(&self, what: &str) {
        let before = |a: (u64, u64), b: (u64, u64)| a.1 < b.0;
        let cluster = self.gone_within("Cluster", &self.name);
        for (r, n) in self.on_the_cluster() {
            let needer = self.gone_within(&r.kind, &n);
            assert!(
                before(needer, cluster),
                "{what}: Cluster/{} left (#{cluster:?}) before {}/{n} (#{needer:?})\n{}",
                self.name,
                r.kind,
                self.timeline.describe()
            );
        }
        let eks = self.gone_within("EKSCluster", &self.name);
        let stack = self.gone_within("ServingStack", &self.stack_name());
        let ic = self.gone_within("InferenceCluster", &self.name);
        assert!(
            before(stack, eks) && before(cluster, eks) && before(eks, ic),
            "{what}: ServingStack #{stack:?}, Cluster #{cluster:?}, EKSCluster #{eks:?}, InferenceCluster #{ic:?}\n{}",
            self.timeline.describe()
        );
    }

    /// What became of a snapshot's object: the timeline's record, with a
    /// removal its watch missed ([`Tree::missed`]).
    pub(crate) fn fate_of(
        &self,
        entries: &[local_cluster::timeline::Entry],
        uids: &BTreeMap<invariant::ObjectId, String>,
        r: &invariant::ObjectId,
    ) -> Option<invariant::Fate> {
        fate_with_missed(entries, uids, &self.missed, r)
    }

    /// The tree as it is now, for `cascade_guard_testkit::invariant::edges`: every object
    /// of it, the kubeconfig Secret its cloud Cluster writes (its data left
    /// out) and the ProviderConfigUsages of its managed resources.
    pub(crate) async fn snapshot(&self) -> Vec<Value> {
        let secret = (
            secrets(),
            Some(SYSTEM_NAMESPACE.to_string()),
            format!("{}-kubeconfig", self.name),
        );
        snapshot_of(
            &self.client,
            &self.name,
            self.objects().into_iter().chain([secret]),
            [Some(SYSTEM_NAMESPACE.to_string())],
        )
        .await
    }

    /// Every edge of the tree's snapshot (`cascade_guard_testkit::invariant::edges`) kept
    /// by its teardown, each object followed by the UID the snapshot read
    /// (after a minute at most for every needer to leave): fails listing
    /// every broken edge and every edge it could not judge, each with its
    /// revisions; returns how many of each verdict.
    pub(crate) async fn assert_every_edge(&self, snapshot: &[Value], what: &str) -> String {
        let uids = invariant::uids(snapshot);
        let edges = invariant::edges(snapshot);
        let kept = edges_kept(&self.timeline, snapshot, &edges, |entries, r| {
            self.fate_of(entries, &uids, r)
        })
        .await;
        match kept {
            Ok(tally) => tally,
            Err(report) => panic!(
                "{what}: {report}\nleft: {:?}\n{}\n{}",
                self.left().await,
                self.states().await,
                self.timeline.describe()
            ),
        }
    }

    /// Every edge of the tree's snapshot judged as things stand, without
    /// waiting (Off: what a teardown without cascade-guard did): how many
    /// edges, each broken one with its revisions, and the tally.
    pub(crate) fn measure_edges(&self, snapshot: &[Value]) -> (usize, Vec<String>, String) {
        let edges = &invariant::edges(snapshot);
        let uids = invariant::uids(snapshot);
        let entries = self.timeline.entries();
        let (broken, tally) = invariant::measure(edges, |r| self.fate_of(&entries, &uids, r));
        (edges.len(), broken, tally)
    }

    /// Under Off: waits until the teardown has done all it will do,
    /// everything gone, or the cloud cluster gone and whatever is left
    /// terminating, each managed resource left wedged (held by its
    /// provider's finalizer, which reports why). What is left then stays.
    /// Whether it settled within [`TEARDOWN_TIMEOUT`].
    pub(crate) async fn wait_settled(&self) -> bool {
        let settled = || async {
            self.timeline.gone("Cluster", &self.name)?;
            for (r, ns, n) in self.objects() {
                let Some(o) = api(&self.client, &r, ns.as_deref())
                    .get_opt(&n)
                    .await
                    .ok()?
                else {
                    continue;
                };
                o.metadata.deletion_timestamp.as_ref()?;
                if r.kind == "Release" || r.kind == "Object" {
                    sync_failure(&o)?;
                }
            }
            Some(())
        };
        wait::until_lasting(TEARDOWN_TIMEOUT, || async {
            let done = settled().await;
            if done.is_none() {
                // A read of every object per pass: not every 50 ms.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            done
        })
        .await
        .is_some()
    }

    /// Leaves nothing of the tree, whatever its teardown left
    /// ([`clean_up_completely`]).
    pub(crate) async fn clean_up_completely(&self) {
        clean_up_completely(&self.client, &self.name, &self.objects()).await;
    }

    /// Waits for the cloud cluster to leave the API.
    pub(crate) async fn wait_cluster_gone(&self, what: &str, started: Instant) {
        let cluster = self
            .timeline
            .wait_gone("Cluster", &self.name, TEARDOWN_TIMEOUT)
            .await;
        assert!(
            cluster.is_some(),
            "{what}: the cloud cluster never went\n{}\n{}",
            self.states().await,
            self.timeline.describe()
        );
        eprintln!(
            "{what}: the cloud cluster was gone after {:?}",
            started.elapsed()
        );
    }

    /// What the local cloud logged as leaked for this tree's cluster.
    pub(crate) fn leaked(&self, stack: &Stack) -> Vec<String> {
        modelplane::leaked(&scene::cloud_log(stack), &self.name)
    }

    /// Removes the providers' finalizer from whatever is left, as an operator
    /// does with a wedged resource, and waits for the tree to go.
    pub(crate) async fn clean_up(&self) {
        for (r, n) in self.on_the_cluster() {
            let api = api(&self.client, &r, Some(SYSTEM_NAMESPACE));
            let _ = api
                .patch(
                    &n,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                )
                .await;
        }
        assert!(
            self.wait_all_gone(Duration::from_secs(120)).await,
            "clean-up left {:?}",
            self.left().await
        );
    }
}

/// Crossplane's own deletes in the tree were never refused by cascade-guard,
/// and the EKSCluster's delete, refused by the Usage webhook while the
/// ServingStack lived, went through as Foreground afterwards (Crossplane
/// replays the refused attempt's policy, the garbage collector's Foreground).
pub(crate) fn assert_crossplane_never_refused(stack: &Stack, tree: &Tree, what: &str) {
    let events = local_cluster::audit::read(&audit_log::audit_log(&stack.cp))
        .expect("the API server's audit log");
    let refused = crossplane_refusals(&events, &tree.objects());
    assert!(
        refused.is_empty(),
        "{what}: Crossplane was refused: {refused:?}"
    );
    // Writes too: no update or patch by Crossplane, a provider or the
    // garbage collector (anyone but the test's own admin) was ever refused
    // by cascade-guard, on any object of the stack.
    let writes = local_cluster::audit::read_writes(&audit_log::audit_log(&stack.cp))
        .expect("the API server's audit log");
    let refused_writes: Vec<String> = writes
        .iter()
        .filter(|e| e.refused_by_cascade_guard() && e.effective_username() != "admin")
        .map(|e| format!("{} {} {:?}", e.effective_username(), e.verb, e.object_ref))
        .collect();
    assert!(
        refused_writes.is_empty(),
        "{what}: writes refused by cascade-guard: {refused_writes:?}"
    );
    assert!(
        writes
            .iter()
            .any(|e| e.effective_username() == local_cluster::real_crossplane::CROSSPLANE_USER),
        "{what}: the audit log records Crossplane's writes ({} writes in all)",
        writes.len()
    );
    // Whichever comes first once the Usage lets go: Crossplane's replay or
    // the garbage collector's retry; without a Usage, cascade-guard, once the
    // ServingStack it held the EKSCluster for is gone.
    let deleters: Vec<&str> = if tree.usage {
        vec![
            local_cluster::real_crossplane::CROSSPLANE_USER,
            stack.cp.garbage_collector_username(),
        ]
    } else {
        vec![cascade_guard_testkit::CONTROLLER_USER]
    };
    let deleted = events.iter().find(|e| {
        e.verb == "delete"
            && !e.dry_run()
            && e.is_about("eksclusters", SYSTEM_NAMESPACE, &tree.name)
            && e.response_code() == Some(200)
    });
    assert!(
        deleted.is_some_and(|e| deleters.contains(&e.effective_username())
            && e.propagation_policy() == Some("Foreground")),
        "{what}: EKSCluster {} was not deleted by Crossplane's replay or the garbage collector with Foreground: {:?}",
        tree.name,
        deleted.map(|e| (e.effective_username().to_string(), e.propagation_policy()))
    );
}

/// `cascade-guard plan` of InferenceCluster `name` on `platform`: its exit
/// code and output.
pub(crate) fn plan(
    stack: &Stack,
    platform: &modelplane::Platform,
    name: &str,
) -> (Option<i32>, String) {
    plan_of(stack, &platform.inference_clusters(), name)
}

/// `cascade-guard plan <resource> <name>`: its exit code and what it said.
pub(crate) fn plan_of(stack: &Stack, resource: &ApiResource, name: &str) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cascade-guard"))
        .args([
            "plan",
            &format!("{}.{}", resource.plural, resource.group),
            name,
            "--kubeconfig",
        ])
        .arg(stack.cp.kubeconfig_path())
        .output()
        .expect("cascade-guard plan runs");
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `plan` of `name` once it exits with `code`, tried for five minutes, else
/// its last answer: sibling order is in force for a tree only a look of the
/// controller after its holds are (a kind newly held counts a moment after
/// the hold policy names it), and until then `plan` says so and exits 3.
/// Under a whole run's load a look takes up to a minute or two, and a kind
/// newly held takes two of them (CI once saw a tree still "cannot hold
/// Cluster yet" two minutes after its hold was recorded).
pub(crate) async fn plan_once_it_exits(
    stack: &Stack,
    resource: &ApiResource,
    name: &str,
    code: i32,
) -> (Option<i32>, String) {
    let planned = wait::until_lasting(Duration::from_secs(300), || async {
        let (got, said) = plan_of(stack, resource, name);
        (got == Some(code)).then_some((got, said))
    })
    .await;
    planned.unwrap_or_else(|| plan_of(stack, resource, name))
}
