//! The seed's failure (docs/deletion-semantics.md §7) on a
//! model of Crossplane, its Usage webhook and its providers
//! (local_cluster::model) over the real control plane: the randomized test
//! only.
//!
//! Why this still runs on the model: every scenario of the seed now runs on
//! real Crossplane (tests/real_crossplane/seed_real.rs: the InferenceCluster, the
//! ModelDeployment and InferenceGateway races, namespace deletion, Crossplane's
//! own deletes and replays, five random trees with cascade-guard and
//! Crossplane SIGKILLed) and was retired here. What real Crossplane cannot give
//! CI is volume: its Usages re-check their user every 30 s and its providers
//! poll every 15 s, so one real tree takes about 100 s to tear down, while the
//! model releases at once. This test tears down three rounds of random
//! platforms (InferenceClusters with 0 to 2 ModelDeployments of nested
//! replicas, to depth 4, and InferenceGateways), deleted concurrently by five
//! kinds of clients (kubectl plain and foreground, no policy, Helm through
//! Flux, Argo CD) with cascade-guard SIGKILLed every few seconds: dozens of
//! trees and of kills per CI run in a minute or two, where real Crossplane
//! takes about 100 s per tree (its soak, scripts/soak.sh, is opt-in).
//!
//! Order is asserted from a watch: no cluster leaves the API while anything
//! that needs it still exists. CASCADE_GUARD_SEED replays a run;
//! CASCADE_GUARD_SEED_ROUNDS runs more rounds.

use cascade_guard_testkit::platform;

use std::time::{Duration, Instant};

use cascade_guard_testkit::DeleteSpec;
use cascade_guard_testkit::rng::Rng;
use kube::api::ApiResource;
use local_cluster::model::composite::Node;
use local_cluster::model::modelplane::{
    self, GUARD_KEY, InferenceCluster, InferenceGateway, ModelDeployment, Replica, SYSTEM_NAMESPACE,
};
use local_cluster::model::usage;
use platform::*;

fn arg(r: &ApiResource) -> String {
    format!("{}.{}", r.plural, r.group)
}

/// kubectl's outcome: (succeeded, stderr).
async fn kubectl_delete(
    p: &Platform,
    resource: &ApiResource,
    ns: Option<&str>,
    name: &str,
    foreground: bool,
) -> (bool, String) {
    let target = arg(resource);
    let mut args = vec!["delete", target.as_str(), name, "--wait=false"];
    if let Some(ns) = ns {
        args.extend(["-n", ns]);
    }
    if foreground {
        args.push("--cascade=foreground");
    }
    let out = p.kubectl(&args).await;
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

// ---------------------------------------------------------------------------
// Randomized.

/// Who deletes a root, and how (docs/deletion-semantics.md §4).
#[derive(Clone, Copy, Debug)]
enum Client {
    /// The built kubectl: Background.
    Kubectl,
    KubectlForeground,
    /// client-go with no option: no policy.
    NoPolicy,
    /// Helm uninstall through Flux's helm-controller: Background.
    Helm,
    /// Argo CD: Foreground.
    Argo,
}

const CLIENTS: [Client; 5] = [
    Client::Kubectl,
    Client::KubectlForeground,
    Client::NoPolicy,
    Client::Helm,
    Client::Argo,
];

/// What a delete came to.
#[derive(Debug, PartialEq)]
enum Outcome {
    Deleted,
    /// cascade-guard refused it (and said to use foreground).
    Refused,
    /// The Usage webhook refused it; Crossplane replays it later.
    InUse,
    NotFound,
}

async fn delete_once(
    p: &Platform,
    client: Client,
    foreground: bool,
    resource: &ApiResource,
    ns: Option<&str>,
    name: &str,
) -> Result<Outcome, String> {
    let (ok, code, message) = match client {
        Client::Kubectl | Client::KubectlForeground => {
            let fg = foreground || matches!(client, Client::KubectlForeground);
            let (ok, stderr) = kubectl_delete(p, resource, ns, name, fg).await;
            let code = if ok {
                200
            } else if stderr.contains("(Forbidden)") {
                403
            } else if stderr.contains("nousages.protection.crossplane.io") {
                409
            } else if stderr.contains("(NotFound)") {
                404
            } else {
                0
            };
            (ok, code, stderr)
        }
        _ => {
            let (user, policy) = match client {
                Client::Helm => (
                    "system:serviceaccount:flux-system:helm-controller",
                    Some("Background"),
                ),
                Client::Argo => (
                    "system:serviceaccount:argocd:argocd-application-controller",
                    Some("Foreground"),
                ),
                _ => ("alice@example.com", None),
            };
            let c =
                p.cp.client_as(user, &["system:masters"])
                    .await
                    .map_err(|e| e.to_string())?;
            let spec = DeleteSpec {
                propagation: if foreground {
                    Some("Foreground")
                } else {
                    policy
                },
                ..DeleteSpec::default()
            };
            let got = delete(&c, resource, ns, name, &spec).await;
            (got.allowed(), got.code, got.message)
        }
    };
    match code {
        _ if ok => Ok(Outcome::Deleted),
        403 if message.contains("cascade-guard refused") => Ok(Outcome::Refused),
        409 if message.contains("in-use") => Ok(Outcome::InUse),
        404 => Ok(Outcome::NotFound),
        _ => Err(format!(
            "{client:?} delete of {} {name}: {code} {message}",
            resource.kind
        )),
    }
}

/// Deletes a root as `client` would, following a refusal's advice once:
/// the outcomes of each attempt.
async fn delete_root(
    p: &Platform,
    client: Client,
    resource: &ApiResource,
    ns: Option<&str>,
    name: &str,
) -> Result<Vec<Outcome>, String> {
    match delete_once(p, client, false, resource, ns, name).await? {
        Outcome::Refused => Ok(vec![
            Outcome::Refused,
            delete_once(p, client, true, resource, ns, name).await?,
        ]),
        other => Ok(vec![other]),
    }
}

struct Root {
    resource: ApiResource,
    ns: Option<String>,
    name: String,
}

fn root_of(node: &Node) -> Root {
    Root {
        resource: node.resource.clone(),
        ns: node.namespace.clone(),
        name: node.name.clone(),
    }
}

/// Random platforms: InferenceClusters with random releases and delays, and
/// on each, 0-2 ModelDeployments (1-2 replicas of 1-2 Objects, sometimes with
/// an extra XR level: depth 4) and maybe an InferenceGateway.
fn random_platforms(
    rng: &mut Rng,
    round: usize,
    ns: &str,
    count: usize,
) -> (Vec<Node>, Vec<Node>, Vec<(String, bool)>) {
    let nested_kinds = [
        modelplane::serving_stacks(),
        modelplane::model_replicas(),
        modelplane::eks_clusters(),
    ];
    let mut clusters = Vec::new();
    let mut consumers = Vec::new();
    let mut ics = Vec::new();
    for k in 0..count {
        let name = format!("r{round}-ic{k}");
        let releases = (0..1 + rng.below(3) as usize)
            .map(|i| {
                (
                    modelplane::SERVING_CHARTS[i].to_string(),
                    rng.millis(300, 2500),
                )
            })
            .collect();
        let ic = InferenceCluster {
            name: name.clone(),
            cluster_delete: rng.millis(300, 1500),
            releases,
        };
        clusters.push(ic.tree());
        let mut used = false;
        for m in 0..rng.below(3) {
            let replicas = (0..1 + rng.below(2))
                .map(|_| Replica {
                    objects: (0..1 + rng.below(2))
                        .map(|_| rng.millis(300, 2500))
                        .collect(),
                    nested: rng
                        .chance(3)
                        .then(|| nested_kinds[rng.below(3) as usize].clone()),
                })
                .collect();
            let md = ModelDeployment {
                namespace: ns.to_string(),
                name: format!("{name}-md{m}"),
                cluster: name.clone(),
                replicas,
            };
            consumers.push(md.tree());
            used = true;
        }
        if rng.chance(2) {
            let ig = InferenceGateway {
                name: format!("{name}-gw"),
                cluster: name.clone(),
                release_uninstall: rng.millis(300, 2500),
                objects_delete: rng.millis(300, 2500),
            };
            consumers.push(ig.tree());
            used = true;
        }
        ics.push((name, used));
    }
    (clusters, consumers, ics)
}

#[tokio::test]
async fn randomized_platforms_clients_modes_and_restarts_never_lose_a_cluster_first() {
    let p = platform().await;
    let mut rng = Rng::from_env("randomized");
    let seed = rng.0;
    let rounds: usize = std::env::var("CASCADE_GUARD_SEED_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let client = p.admin().await;
    let mut trees = 0;
    let mut deepest = 0;
    let mut kills = 0;
    let start = Instant::now();
    for round in 0..rounds {
        let mut modes = [Mode::Refuse; 6];
        for m in modes.iter_mut() {
            if rng.chance(2) {
                *m = Mode::Convert;
            }
        }
        let context =
            format!("seed {seed} (CASCADE_GUARD_SEED={seed}), round {round}, modes {modes:?}");
        eprintln!("randomized: {context}");
        let _gate = p.enter(modes).await;
        let ns = format!("randomized-{round}");
        create_namespace(&client, &ns).await;
        let (clusters, consumers, ics) = random_platforms(&mut rng, round, &ns, 3);
        let mut run = Run::default();
        for t in clusters.iter().chain(&consumers) {
            run.add(t);
            trees += 1;
            deepest = deepest.max(t.depth());
        }
        for (ic, used) in &ics {
            if *used {
                run.add_object(&usage::cluster_usages(), None, &format!("{ic}-{GUARD_KEY}"));
            }
        }
        let tl = timeline(&client).await;
        for t in clusters.iter().chain(&consumers) {
            t.create(&client)
                .await
                .unwrap_or_else(|e| panic!("{context}: create: {e}"));
        }
        for (ic, used) in &ics {
            wait_in_use(
                &client,
                &modelplane::eks_clusters(),
                Some(SYSTEM_NAMESPACE),
                ic,
            )
            .await;
            if *used {
                wait_in_use(&client, &modelplane::inference_clusters(), None, ic).await;
            }
        }
        // Every root, deleted by a random client after a random delay, all at once.
        let mut plan = Vec::new();
        for t in clusters.iter().chain(&consumers) {
            let who = CLIENTS[rng.below(CLIENTS.len() as u64) as usize];
            plan.push((root_of(t), who, rng.millis(0, 1500)));
        }
        let deletes = futures::future::join_all(plan.iter().map(|(root, who, after)| async move {
            tokio::time::sleep(*after).await;
            let got = delete_root(p, *who, &root.resource, root.ns.as_deref(), &root.name).await;
            (root.name.clone(), *who, got)
        }));
        let stop = std::sync::atomic::AtomicBool::new(false);
        let mut chaos_rng = Rng(rng.next_u64() | 1);
        let chaos = async {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                tokio::time::sleep(chaos_rng.millis(700, 3000)).await;
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                p.kill_controller();
                n += 1;
                tokio::time::sleep(chaos_rng.millis(0, 1200)).await;
                p.start_controller();
            }
            n
        };
        let work = async {
            let outcomes = deletes.await;
            for (name, who, got) in &outcomes {
                if let Err(e) = got {
                    panic!("{context}: {name} by {who:?}: {e}");
                }
            }
            let done = run.wait_all_gone(&tl, Duration::from_secs(120)).await;
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
            (outcomes, done)
        };
        let ((outcomes, done), n) = tokio::join!(work, chaos);
        kills += n;
        if !p.controller_running() {
            p.start_controller();
        }
        assert!(
            done,
            "{context}: left {:?}\n{}\n{}",
            run.left(&tl),
            run.describe(&tl),
            p.cp.log_tails(30)
        );
        run.assert_order(&tl, &context);
        eprintln!(
            "randomized round {round}: {} roots ({:?}), cascade-guard killed {n} times, all gone in order",
            outcomes.len(),
            outcomes
                .iter()
                .map(|(name, who, got)| format!("{name}:{who:?}:{:?}", got.as_ref().ok()))
                .collect::<Vec<_>>()
        );
    }
    eprintln!(
        "randomized: {trees} trees (deepest {deepest}), {kills} kills, {rounds} rounds in {:?}",
        start.elapsed()
    );
}
