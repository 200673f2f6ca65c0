//! The seed's tree torn down in order without its hand-written Usage, against
//! the same tree with it, side by side (#24's ratio, BENCHMARKS.md "Sibling
//! order").
//!
//! On the local control plane with real Crossplane, its providers, the local
//! cloud and the seed's platform in Convert mode, each pair is two
//! InferenceClusters built at the same time: `pair-<i>-usage` (the seed's
//! Composition, whose Usage of the EKSCluster by the ServingStack Crossplane
//! re-checks every 30 s) and `pair-<i>-bare` (without the Usage: sibling order
//! holds the EKSCluster). Both are deleted in the same instant with a plain
//! `kubectl delete` (here: a delete with no propagation policy, as kubectl
//! sends it); each teardown is the time from its delete to the last object of
//! its tree gone, polled every 250 ms. Prints every pair, the medians and
//! their ratio (the goal: bare / usage ≤ 0.7).
//!
//!   BENCH_PAIRS=3 (default)       how many pairs, one after the other
//!   BENCH_LOAD_BALANCER_SECONDS   the gateway's load balancer (default: the
//!                                 Composition's 40 s)

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cascade_guard_bench::{percentile, start_controller};
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use local_cluster::real_crossplane::modelplane::{self, Platform};
use local_cluster::real_crossplane::{Crossplane, CrossplaneOptions};
use local_cluster::{ControlPlane, Options};
use serde_json::{Value, json};

const POLICY_ANNOTATION: &str = "cascade-guard.dev/deletion-policy";
const HOLD_FINALIZER: &str = "cascade-guard.dev/foreground-cascade";
const POLL: Duration = Duration::from_millis(250);
const BUILD_TIMEOUT: Duration = Duration::from_secs(600);
const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(400);

#[tokio::main]
async fn main() -> Result<()> {
    let pairs: usize = std::env::var("BENCH_PAIRS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3);
    let cp = ControlPlane::start(Options {
        crds: cascade_guard::api::crds(),
        ..Options::default()
    })
    .await?;
    let crossplane = Crossplane::start(&cp, CrossplaneOptions::default()).await?;
    println!(
        "real Crossplane {} started in {:?}",
        crossplane.version(),
        crossplane.started_in()
    );
    let client = cp.admin().await?;
    let mut platform = Platform::modelplane(json!({ POLICY_ANNOTATION: "Convert" }));
    if let Some(seconds) = std::env::var("BENCH_LOAD_BALANCER_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        platform = platform.with_load_balancer_seconds(seconds);
    }
    modelplane::install(&client, &crossplane, &cp.dir().join("charts"), &platform).await?;
    let _controller = start_controller(&cp)?;
    println!(
        "teardown of the seed's tree, Convert, plain delete; {pairs} pairs, side by side; seconds"
    );
    println!(
        "{:>5}  {:>10}  {:>10}  {:>6}",
        "pair", "usage", "bare", "ratio"
    );
    let (mut usage, mut bare) = (Vec::new(), Vec::new());
    for i in 0..pairs {
        let (with, without) = (format!("pair-{i}-usage"), format!("pair-{i}-bare"));
        let (a, b) = tokio::try_join!(
            build(&client, &platform, &with, true),
            build(&client, &platform, &without, false)
        )?;
        let (a, b) = tokio::try_join!(
            teardown(&client, &platform, a),
            teardown(&client, &platform, b)
        )?;
        println!("{i:>5}  {a:>10.1}  {b:>10.1}  {:>6.2}", b / a);
        usage.push(a);
        bare.push(b);
    }
    usage.sort_by(f64::total_cmp);
    bare.sort_by(f64::total_cmp);
    let (u, b) = (percentile(&usage, 50.0), percentile(&bare, 50.0));
    println!(
        "median: with the Usage {u:.1} s, without (sibling order) {b:.1} s: ratio {:.2}",
        b / u
    );
    Ok(())
}

fn api(client: &Client, r: &ApiResource, ns: Option<&str>) -> Api<DynamicObject> {
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, r),
        None => Api::all_with(client.clone(), r),
    }
}

fn ready(o: &DynamicObject) -> bool {
    o.data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// `local_cluster::wait::until`, looking every [`POLL`] (a look here is a
/// GET of every object of a tree), with `what` as the error on timeout.
async fn until<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let mut last: Option<Instant> = None;
    let found = local_cluster::wait::until(timeout, || {
        let due = last.is_none_or(|at| at.elapsed() >= POLL);
        if due {
            last = Some(Instant::now());
        }
        let check = due.then(&mut f);
        async move {
            match check {
                Some(check) => check.await,
                None => None,
            }
        }
    })
    .await;
    found.with_context(|| format!("timed out after {timeout:?}: {what}"))
}

/// Builds InferenceCluster `name` (with or without its Usage) and waits
/// until it is Ready, converted (cascade-guard's finalizer) and, without the
/// Usage, until sibling order holds its EKSCluster; with it, until the Usage
/// has taken hold.
async fn build(
    client: &Client,
    platform: &Platform,
    name: &str,
    with_usage: bool,
) -> Result<String> {
    let ics = api(client, &platform.inference_clusters(), None);
    let object = if with_usage {
        platform.inference_cluster(name)
    } else {
        platform.inference_cluster_without_usage(name)
    };
    ics.patch(
        name,
        &PatchParams::apply("bench-teardown").force(),
        &Patch::Apply(object),
    )
    .await
    .with_context(|| format!("create {name}"))?;
    until(
        BUILD_TIMEOUT,
        &format!("{name} Ready and converted"),
        || async {
            let o = ics.get_opt(name).await.ok().flatten()?;
            (ready(&o)
                && o.metadata
                    .finalizers
                    .iter()
                    .flatten()
                    .any(|f| f == HOLD_FINALIZER))
            .then_some(())
        },
    )
    .await?;
    let resource = platform.eks_clusters();
    let eks = api(client, &resource, Some(modelplane::SYSTEM_NAMESPACE));
    // With its Usage, Crossplane marks it in use; without, sibling order
    // holds it (its ConfigMap, in `default`: the controller runs outside a
    // pod).
    let what = if with_usage { "in use" } else { "held" };
    until(
        Duration::from_secs(120),
        &format!("EKSCluster {name} {what}"),
        || async {
            if with_usage {
                let o = eks.get_opt(name).await.ok().flatten()?;
                return o
                    .metadata
                    .labels
                    .as_ref()?
                    .contains_key("crossplane.io/in-use")
                    .then_some(());
            }
            let held = cascade_guard::cluster::holds::read(client, "default")
                .await
                .ok()?;
            held.iter()
                .any(|(o, _)| o.kind == resource.kind && o.name == name)
                .then_some(())
        },
    )
    .await?;
    Ok(name.to_string())
}

/// Deletes InferenceCluster `name` as kubectl does (no propagation policy)
/// and returns the seconds until every object of its tree is gone.
async fn teardown(client: &Client, platform: &Platform, name: String) -> Result<f64> {
    let ics = api(client, &platform.inference_clusters(), None);
    let started = Instant::now();
    ics.delete(&name, &DeleteParams::default())
        .await
        .with_context(|| format!("delete {name}"))?;
    let objects = platform.tree(&name);
    until(TEARDOWN_TIMEOUT, &format!("{name} torn down"), || async {
        for (r, ns, n) in &objects {
            match api(client, r, ns.as_deref()).get_opt(n).await {
                Ok(None) => {}
                _ => return None,
            }
        }
        Some(())
    })
    .await?;
    Ok(started.elapsed().as_secs_f64())
}
