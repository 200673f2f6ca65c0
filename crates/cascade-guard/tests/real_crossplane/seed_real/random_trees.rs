//! Random trees, clients and faults: every edge kept under Refuse and
//! Convert, the broken ones measured under Off.

use super::*;

/// How a random tree is deleted.
#[derive(Clone, Copy, Debug)]
pub(crate) enum How {
    KubectlPlain,
    KubectlForeground,
    ApiBackground,
    ApiNoPolicy,
}

/// How long a client keeps trying a delete the API server cannot answer
/// (it restarts under the round's faults).
pub(crate) const UNREACHABLE_TIMEOUT: Duration = Duration::from_secs(180);

/// Whether kubectl's complaint says it never got an answer from a serving
/// API server (one that restarts), rather than a refusal or an error.
pub(crate) fn kubectl_unreachable(stderr: &str) -> bool {
    [
        "The connection to the server",
        "Unable to connect to the server",
        "connection refused",
        "connection reset",
        "EOF",
        "TLS handshake timeout",
        "(ServiceUnavailable)",
        "(InternalError)",
        "(TooManyRequests)",
        "apiserver is shutting down",
        // A restarted API server serves custom resources only once it has
        // read their CRDs again.
        "the server doesn't have a resource type",
        "the server could not find the requested resource",
    ]
    .iter()
    .any(|s| stderr.contains(s))
}

/// Whether the client's error says it never got an answer from a serving
/// API server: no status at all, or one of its own while it starts or stops.
pub(crate) fn api_unreachable(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => {
            matches!(s.code, 429 | 500 | 503 | 504)
                // Its custom resources not served yet (not an object not found).
                || (s.code == 404 && s.message.contains("could not find the requested resource"))
        }
        _ => true,
    }
}

/// `kubectl delete` of the tree's InferenceCluster, tried again while the
/// API server cannot answer, as a user would: (succeeded, stderr).
pub(crate) async fn kubectl_delete_retrying(
    stack: &Stack,
    tree: &Tree,
    foreground: bool,
) -> (bool, String) {
    let deadline = Instant::now() + UNREACHABLE_TIMEOUT;
    loop {
        let (ok, stderr) = stack.kubectl_delete(tree, foreground).await;
        if ok || !kubectl_unreachable(&stderr) || Instant::now() > deadline {
            return (ok, stderr);
        }
        let last = stderr.trim().lines().last().unwrap_or_default();
        eprintln!("{}: kubectl delete, again: {last}", tree.name);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

pub(crate) async fn random_delete(stack: &Stack, tree: &Tree, how: How, mode: Mode) {
    let ics = api(&tree.client, &tree.platform.inference_clusters(), None);
    let refused = match how {
        How::KubectlPlain | How::KubectlForeground => {
            let (ok, stderr) =
                kubectl_delete_retrying(stack, tree, matches!(how, How::KubectlForeground)).await;
            (!ok).then_some(stderr)
        }
        How::ApiBackground | How::ApiNoPolicy => {
            let params = DeleteParams {
                propagation_policy: matches!(how, How::ApiBackground)
                    .then_some(PropagationPolicy::Background),
                ..DeleteParams::default()
            };
            let deadline = Instant::now() + UNREACHABLE_TIMEOUT;
            loop {
                match ics.delete(&tree.name, &params).await {
                    Ok(_) => break None,
                    Err(e) if api_unreachable(&e) && Instant::now() < deadline => {
                        eprintln!("{}: {how:?}, again: {e}", tree.name);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(e) => break Some(e.to_string()),
                }
            }
        }
    };
    let foreground = matches!(how, How::KubectlForeground);
    match (mode, refused) {
        (_, None) => assert!(
            matches!(mode, Mode::Off | Mode::Convert) || foreground,
            "{}: {how:?} was allowed under {mode:?}",
            tree.name
        ),
        (Mode::Refuse, Some(message)) if !foreground => {
            assert!(
                message.contains("cascade-guard refused")
                    && message.contains("--cascade=foreground"),
                "{}: {message}",
                tree.name
            );
            // As the message says.
            let (ok, stderr) = kubectl_delete_retrying(stack, tree, true).await;
            assert!(
                ok,
                "{}: kubectl delete --cascade=foreground: {stderr}",
                tree.name
            );
        }
        (_, Some(message)) => panic!("{}: {how:?} under {mode:?}: {message}", tree.name),
    }
}

/// Random trees, deleting clients and delays, one random mode, and faults
/// at random moments (the leader of cascade-guard's two replicas, Crossplane
/// core or a provider SIGKILLed, kube-apiserver restarted): under Refuse
/// and Convert no cloud cluster ever leaves before what runs on it, no edge
/// breaks, nothing wedges, nothing leaks; under Off the broken edges are
/// measured and printed (the seed's failure), and the wedged trees cleaned
/// up. Eight trees in CI: each takes a real cloud cluster and real
/// Crossplane's 30-second timers (CASCADE_GUARD_REAL_TREES runs more, or
/// fewer).
pub(crate) async fn random_trees_clients_and_kills_never_lose_a_cluster_first() {
    // No read guard: each round takes the stack for writing (random_round).
    let _clock = TestClock::start();
    let stack = stack().await;
    let mut rng = cascade_guard_testkit::rng::Rng::from_env("seed_real random");
    let trees: usize = std::env::var("CASCADE_GUARD_REAL_TREES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(8);
    // More rounds, for a longer run (scripts/soak.sh runs the random
    // shapes).
    let rounds: usize = std::env::var("CASCADE_GUARD_REAL_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    for round in 0..rounds {
        random_round(stack, &mut rng, round, trees).await;
    }
}

/// What a fault does to the stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FaultKind {
    /// SIGKILL of the replica of cascade-guard that leads.
    Leader,
    /// SIGKILL of Crossplane core.
    Crossplane,
    /// SIGKILL of provider-kubernetes.
    ProviderKubernetes,
    /// SIGKILL of provider-helm.
    ProviderHelm,
    /// kube-apiserver stopped (SIGTERM) and started again.
    ApiServer,
}

/// One fault of a round: what, when after the round's start, and for how
/// long it stays down.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fault {
    pub(crate) kind: FaultKind,
    pub(crate) at: Duration,
    pub(crate) down: Duration,
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.kind {
            FaultKind::Leader => "SIGKILL cascade-guard's leader",
            FaultKind::Crossplane => "SIGKILL Crossplane core",
            FaultKind::ProviderKubernetes => "SIGKILL provider-kubernetes",
            FaultKind::ProviderHelm => "SIGKILL provider-helm",
            FaultKind::ApiServer => "restart kube-apiserver",
        };
        write!(f, "{what} at {:?}, down {:?}", self.at, self.down)
    }
}

/// `least` to three faults, each of a random kind at a random moment of
/// the deletes' first minute, with a downtime of its kind's range.
pub(crate) fn draw_faults(rng: &mut cascade_guard_testkit::rng::Rng, least: u64) -> Vec<Fault> {
    let mut faults: Vec<Fault> = (0..least + rng.below(4 - least))
        .map(|_| {
            let (kind, longest) = match rng.below(5) {
                0 => (FaultKind::Leader, 10_000),
                1 => (FaultKind::Crossplane, 15_000),
                2 => (FaultKind::ProviderKubernetes, 15_000),
                3 => (FaultKind::ProviderHelm, 15_000),
                _ => (FaultKind::ApiServer, 10_000),
            };
            let at = rng.millis(0, 60_000);
            Fault {
                kind,
                at,
                down: rng.millis(0, longest),
            }
        })
        .collect();
    faults.sort_by_key(|f| f.at);
    faults
}

/// The faults of a round, in words.
pub(crate) fn faults_said(faults: &[Fault]) -> String {
    format!("[{}]", joined(faults))
}

/// Each of `items` in words, `; ` between them.
pub(crate) fn joined<T: std::fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(T::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Runs `fault` at its moment after `started`, then brings back what it
/// stopped (and whatever exited meanwhile: a replica whose Lease lapsed,
/// Crossplane while the API server was away).
pub(crate) async fn run_fault(stack: &Stack, fault: Fault, started: Instant) {
    tokio::time::sleep_until((started + fault.at).into()).await;
    let what = match fault.kind {
        FaultKind::Leader => {
            let killed = stack.kill_leader().await;
            tokio::time::sleep(fault.down).await;
            format!("killed {killed}")
        }
        FaultKind::Crossplane | FaultKind::ProviderKubernetes | FaultKind::ProviderHelm => {
            let name = match fault.kind {
                FaultKind::Crossplane => local_cluster::real_crossplane::CORE_PROCESS,
                FaultKind::ProviderKubernetes => {
                    local_cluster::real_crossplane::PROVIDER_KUBERNETES_PROCESS
                }
                _ => local_cluster::real_crossplane::PROVIDER_HELM_PROCESS,
            };
            stack.kill_crossplane(name);
            tokio::time::sleep(fault.down).await;
            format!("killed {name}")
        }
        FaultKind::ApiServer => {
            stack.restart_apiserver(fault.down).await;
            "restarted kube-apiserver".to_string()
        }
    };
    let replicas = stack.restart_controller();
    let crossplane = stack.restart_crossplane();
    eprintln!(
        "fault {fault}: {what}; back after {:?}: cascade-guard {replicas:?}, Crossplane {crossplane:?}",
        started.elapsed()
    );
}

/// Finds the removals the trees' timelines missed: across an API server
/// restart a watch lists again, and a list reports no deletes. Each kind a
/// snapshot holds is listed (a consistent list, at the current revision);
/// an object of a snapshot absent from it, which its timeline last saw
/// still there, left after the last revision the timeline saw of it and no
/// later than the list's ([`invariant::Missed`]). Run every few seconds
/// while the API server restarts and after, so that the range is narrow.
pub(crate) async fn sweep_missed(trees: &[Swept<'_>], snapshots: &[Vec<Value>]) {
    let Some(client) = trees.first().map(|t| t.client.clone()) else {
        return;
    };
    let mut kinds: Vec<(ApiResource, Option<String>)> = Vec::new();
    for kind in trees.iter().flat_map(|t| t.kinds.iter()) {
        if !kinds.contains(kind) {
            kinds.push(kind.clone());
        }
    }
    for (r, ns) in &kinds {
        let listed = match ns {
            Some(ns) => Api::<DynamicObject>::namespaced_with(client.clone(), ns, r),
            None => Api::<DynamicObject>::all_with(client.clone(), r),
        }
        .list_metadata(&Default::default())
        .await;
        // The API server still away: the next sweep.
        let Ok(list) = listed else { continue };
        let Some(by) = list
            .metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
        else {
            continue;
        };
        let present: BTreeSet<String> = list.items.iter().filter_map(|o| o.uid()).collect();
        for (tree, snapshot) in trees.iter().zip(snapshots) {
            let entries = tree.timeline.entries();
            for o in snapshot {
                let (Some(me), Some(uid)) = (
                    invariant::ObjectId::of(o),
                    o.pointer("/metadata/uid").and_then(Value::as_str),
                ) else {
                    continue;
                };
                if me.group != r.group || me.kind != r.kind || present.contains(uid) {
                    continue;
                }
                let last = entries.iter().rev().find(|e| e.uid == uid);
                let Some(last) = last.filter(|e| e.change != local_cluster::timeline::Change::Gone)
                else {
                    continue;
                };
                let after = last.revision.unwrap_or(0);
                let mut missed = tree.missed.lock().expect("missed");
                missed.entry(uid.to_string()).or_insert_with(|| {
                    eprintln!(
                        "{}: the watch missed {} {} leaving: after rev {after}, by rev {by}",
                        tree.name, me.kind, me.name
                    );
                    (
                        me.kind.clone(),
                        me.name.clone(),
                        invariant::Missed { after, by },
                    )
                });
            }
        }
    }
}

pub(crate) async fn random_round(
    stack: &'static Stack,
    rng: &mut cascade_guard_testkit::rng::Rng,
    round: usize,
    trees: usize,
) {
    let mode = match rng.below(3) {
        0 => Mode::Off,
        1 => Mode::Refuse,
        _ => Mode::Convert,
    };
    let names: Vec<String> = (0..trees).map(|i| format!("rnd-{round}-{i}")).collect();
    let platform = &random_platform();
    // Each tree with the seed's Usage or without it: then only sibling
    // order keeps its ServingStack before its EKSCluster, once the mode is
    // on (below).
    let usages: Vec<bool> = names.iter().map(|_| rng.chance(2)).collect();
    let built =
        futures::future::join_all(names.iter().zip(&usages).map(|(n, &usage)| async move {
            if usage {
                Tree::build(stack, platform, n).await
            } else {
                Tree::build_without_usage(stack, platform, n, false).await
            }
        }))
        .await;
    // The faults below reach every test: the round waits until no other
    // test runs, and has the stack to itself until its trees are gone. Only
    // once they are built, so that the builds overlap the other tests.
    let waited = TestClock::part(" (waiting for the other tests)");
    let _owner = stack.fault_window.own().await;
    drop(waited);
    stack.put_mode(platform, mode).await;
    stack.enter(mode, &built[0]).await;
    // Convert holds every InferenceCluster before any delete is sent.
    if mode == Mode::Convert {
        for tree in &built {
            let ics = api(&tree.client, &tree.platform.inference_clusters(), None);
            wait_held(&ics, &tree.name).await;
        }
    }
    if mode != Mode::Off {
        for tree in built.iter().filter(|t| !t.usage) {
            tree.wait_sibling_hold().await;
        }
    }
    // Each tree's objects just before the deletes: every edge they state
    // (cascade_guard_testkit::invariant) is checked after its teardown.
    let snapshots: Vec<Vec<Value>> =
        futures::future::join_all(built.iter().map(|t| t.snapshot())).await;
    let plan: Vec<(How, Duration)> = built
        .iter()
        .map(|_| {
            let how = match rng.below(4) {
                0 => How::KubectlPlain,
                1 => How::KubectlForeground,
                2 => How::ApiBackground,
                _ => How::ApiNoPolicy,
            };
            (how, rng.millis(0, 20_000))
        })
        .collect();
    let faults = draw_faults(rng, 0);
    let faults_said = faults_said(&faults);
    eprintln!("random round {round}: mode {mode:?}, {trees} trees, faults {faults_said}");
    for ((tree, (how, after)), snapshot) in built.iter().zip(&plan).zip(&snapshots) {
        eprintln!(
            "random round {round}: {}: {}, {how:?} after {after:?}, mode {mode:?}, faults {faults_said}, {} edges",
            tree.name,
            tree.shape(),
            invariant::edges(snapshot).len()
        );
    }
    let started = Instant::now();
    let chaos = futures::future::join_all(faults.iter().map(|f| run_fault(stack, *f, started)));
    let deletes = futures::future::join_all(built.iter().zip(&plan).zip(&snapshots).map(
        |((tree, (how, after)), snapshot)| async move {
            tokio::time::sleep(*after).await;
            random_delete(stack, tree, *how, mode).await;
            let what = format!("random {} ({}, {how:?}, {mode:?})", tree.name, tree.shape());
            if mode == Mode::Off {
                return off_outcome(stack, tree, snapshot, &what).await;
            }
            // Every edge first: it lists all that broke, where the
            // hand-picked pairs below stop at the first.
            tree.wait_all_gone(TEARDOWN_TIMEOUT).await;
            let tally = tree.assert_every_edge(snapshot, &what).await;
            eprintln!("{what}: every edge kept: {tally}");
            assert_torn_down_in_order(stack, tree, &what, started).await;
            0
        },
    ));
    // A replica whose Lease lapsed (the API server away longer than its
    // lease) exits, and its Deployment starts it again: so here. And with
    // the API server restarting, the removals the timelines miss.
    let restarts = faults.iter().any(|f| f.kind == FaultKind::ApiServer);
    let done = std::sync::atomic::AtomicBool::new(false);
    let kubelet = async {
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_secs(2)).await;
            for name in stack.start_replicas(false) {
                eprintln!(
                    "random round {round}: a replica had exited; started {name} after {:?}",
                    started.elapsed()
                );
            }
            if restarts {
                let swept: Vec<Swept<'_>> = built.iter().map(Tree::swept).collect();
                sweep_missed(&swept, &snapshots).await;
            }
        }
    };
    let work = async {
        let (_, broken) = tokio::join!(chaos, deletes);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        broken
    };
    let (_, broken) = tokio::join!(kubelet, work);
    let replicas = stack.restart_controller();
    let crossplane = stack.restart_crossplane();
    let outcome = if mode == Mode::Off {
        format!(
            "{} edges broken in all (measured under Off), the trees cleaned up",
            broken.iter().sum::<usize>()
        )
    } else {
        format!("{trees} trees in order")
    };
    eprintln!(
        "soak: round {round}: mode {mode:?}: {outcome} in {:?}; faults {faults_said}; started again at the end: cascade-guard {replicas:?}, Crossplane {crossplane:?}",
        started.elapsed(),
    );
}

/// Under Off the invariant is measured, not asserted: once the teardown has
/// done all it will, every broken edge of the tree is printed (the seed's
/// failure, measured), with what wedged and what the local cloud leaked;
/// then the tree is cleaned up completely, so that no later round or test
/// sees it. Returns how many edges broke.
pub(crate) async fn off_outcome(
    stack: &Stack,
    tree: &Tree,
    snapshot: &[Value],
    what: &str,
) -> usize {
    let settled = tree.wait_settled().await;
    let (total, broken, tally) = tree.measure_edges(snapshot);
    let left = tree.left().await;
    eprintln!(
        "{what}: {}",
        off_report(total, &broken, &tally, settled, &left, &tree.leaked(stack))
    );
    tree.clean_up_completely().await;
    broken.len()
}

/// Every one of `edges` (of `snapshot`) kept, as `timeline` saw its teardown
/// through `fate_in` (each object followed by the UID the snapshot read),
/// after a minute at most for every needer to be seen leaving (watch events
/// trail the API a little): the tally, or the report of every broken and
/// unjudged edge. No edge at all is a failure too: every tree here has some,
/// and "every edge kept" of none would check nothing.
pub(crate) async fn edges_kept(
    timeline: &Timeline,
    snapshot: &[Value],
    edges: &[invariant::Edge],
    fate_in: impl Fn(&[local_cluster::timeline::Entry], &invariant::ObjectId) -> Option<invariant::Fate>,
) -> Result<String, String> {
    if edges.is_empty() {
        return Err(format!(
            "no edge to check among the snapshot's {} objects",
            snapshot.len()
        ));
    }
    let _ = wait::until_lasting(Duration::from_secs(60), || async {
        let entries = timeline.entries();
        edges
            .iter()
            .all(|e| fate_in(&entries, &e.needer).is_none_or(|f| !f.still_there))
            .then_some(())
    })
    .await;
    let entries = timeline.entries();
    let fate = |r: &invariant::ObjectId| fate_in(&entries, r);
    let mut tally = invariant::all_kept(edges, fate)?;
    // Said, not failed: what came back under a snapshotted name (a
    // ProviderConfigUsage its provider wrote again) is not the object the
    // snapshot read.
    let again: BTreeSet<String> = invariant::uids(snapshot)
        .keys()
        .filter(|r| fate(r).is_some_and(|f| f.made_again))
        .map(|r| r.to_string())
        .collect();
    if !again.is_empty() {
        tally.push_str(&format!(
            "; made again under a name after it left: {again:?}"
        ));
    }
    Ok(tally)
}

/// What a teardown under Off did, in one message: how many edges broke of
/// how many (each broken one on a line), the tally, whether it settled, what
/// it left and what the local cloud leaked.
pub(crate) fn off_report(
    total: usize,
    broken: &[String],
    tally: &str,
    settled: bool,
    left: &[String],
    leaked: &[String],
) -> String {
    format!(
        "{} of {total} edges broken{}{}\n  ({tally}; {}; left {left:?}; leaked {leaked:?})",
        broken.len(),
        if broken.is_empty() { "" } else { ":\n  " },
        broken.join("\n  "),
        if settled {
            "settled"
        } else {
            "not settled within the bound"
        },
    )
}

/// Leaves nothing of `objects`, whatever a teardown left, as an operator
/// does with a wedged tree: first the providers' finalizers of the managed
/// resources stuck on a cluster that is gone, then (after a minute, for what
/// those held) every finalizer of whatever is still terminating, and a
/// delete of whatever nobody deleted.
pub(crate) async fn clean_up_completely(
    client: &Client,
    what: &str,
    objects: &[(ApiResource, Option<String>, String)],
) {
    let started = Instant::now();
    let gone = wait::until_lasting(Duration::from_secs(240), || async {
        let escalate = started.elapsed() > Duration::from_secs(60);
        let mut left = false;
        for (r, ns, n) in objects {
            let objects = api(client, r, ns.as_deref());
            let o = match objects.get_opt(n).await {
                Ok(Some(o)) => o,
                Ok(None) => continue,
                Err(_) => {
                    left = true;
                    continue;
                }
            };
            left = true;
            let managed = r.kind == "Release" || r.kind == "Object";
            if o.metadata.deletion_timestamp.is_none() {
                if escalate {
                    let _ = objects.delete(n, &DeleteParams::background()).await;
                }
            } else if !o.finalizers().is_empty() && (managed || escalate) {
                let _ = objects
                    .patch(
                        n,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                    )
                    .await;
            }
        }
        if left {
            // Each pass writes: give what it did time to act.
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        (!left).then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "{what}: clean-up left {:?}\n{}",
        left_of(client, objects).await,
        states_of(client, objects).await
    );
}
