//! Benchmark of Refuse mode on the real control plane. Prints:
//!
//! 1. DELETE latency through the API server for a kind no policy matches and a
//!    kind cascade-guard protects, interleaved request by request (same
//!    requests, same moment), first with no policies installed, then with
//!    cascade-guard's policies for 50 protected kinds: p50, p99 and ratios.
//! 2. The time from a change of an XRD's annotation to the API server acting
//!    on it (policy applied by the running controller and in effect).
//! 3. Part 1 again with the policies removed (A-B-A).
//!
//! With BENCH_ONLY=scale, instead: what the number of protected kinds costs
//! (BENCH_KINDS, default 10,100,500), beside no policy at all and the seed
//! report's own proposal (one policy for every object labelled
//! `crossplane.io/composite`), in one run; see [`scale`]. With
//! BENCH_ONLY=alternated, the admission cost of an allowed delete with no
//! policy, the seed's and cascade-guard's alternated in cycles
//! ([`scale::run_alternated`]).
//!
//! Run: scripts/bench.sh refuse   (or, after `cargo build --release -p cascade-guard`,
//! cargo run --release -p cascade-guard-bench --bin bench-refuse)

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use local_cluster::{ControlPlane, Options, crossplane};
use serde_json::{Value, json};

const KINDS: usize = 50;
/// Deletes of each kind per round; rounds per phase. The p99 of one round of
/// 1,000 is its tenth-slowest request, which the machine's noise moves by a
/// millisecond or more, so each phase pools several rounds and also reports
/// the median of the rounds' own differences.
const DELETES: usize = 1000;
const ROUNDS: usize = 5;
const CHANGES: usize = 10;
/// The label on cascade-guard's own admission objects.
const MANAGED: &str = "app.kubernetes.io/managed-by=cascade-guard";
const GC_USER: &str = "system:serviceaccount:kube-system:generic-garbage-collector";

fn xrd_in_mode(i: usize, mode: &str) -> Value {
    json!({
        "apiVersion": "apiextensions.crossplane.io/v2",
        "kind": "CompositeResourceDefinition",
        "metadata": {"name": format!("bench{i}s.{GROUP}"),
            "annotations": {"cascade-guard.dev/deletion-policy": mode}},
        "spec": {"group": GROUP, "names": {"kind": format!("Bench{i}"), "plural": format!("bench{i}s")},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "referenceable": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object"}}}}}]}
    })
}

use cascade_guard_bench::{GROUP, Rounds, percentile, report, resource, start_controller};

#[tokio::main]
async fn main() -> Result<()> {
    match std::env::var("BENCH_ONLY").as_deref() {
        Ok("scale") => return scale::run().await,
        Ok("alternated") => return scale::run_alternated().await,
        _ => {}
    }
    // KINDS kinds under Refuse (the controller, not yet started, compiles
    // them) and the unprotected kind, an XR kind with no XRD.
    let scale::World {
        cp,
        admin,
        gc,
        xrds,
        plain,
        other: _,
        protected,
        last: _,
    } = scale::World::start(KINDS, "Refuse").await?;
    let ns = scale::NS;

    println!("\n1. DELETE latency, {ROUNDS} rounds of {DELETES} deletes of each kind, interleaved");
    println!(
        "   request: DELETE as the garbage collector, propagationPolicy Background, UID precondition,"
    );
    println!(
        "   of an XR with one composed resource (the longest path through the policy that still allows)"
    );
    let before = measure(&admin, &gc, ns, &plain, &protected, "before", BACKGROUND).await?;
    report("no policies installed", &before);

    let controller = start_controller(&cp)?;
    let vaps: Api<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy> =
        Api::all(admin.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = bench_kinds_carried(&vaps.list(&Default::default()).await?.items);
        if n == KINDS && refused(&admin, ns, &protected).await? {
            break;
        }
        if Instant::now() > deadline {
            bail!("cascade-guard did not install {KINDS} policies in time ({n} so far)");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = measure(&admin, &gc, ns, &plain, &protected, "after", BACKGROUND).await?;
    report(
        &format!("cascade-guard policies for {KINDS} kinds installed"),
        &after,
    );
    let pooled = after.pooled();
    let p99_added = percentile(&pooled.1, 99.0) - percentile(&pooled.0, 99.0);
    let p50_added = percentile(&pooled.1, 50.0) - percentile(&pooled.0, 50.0);
    println!(
        "   added by the policy (protected minus unprotected, same rounds, pooled): p50 {:+.3} ms, p99 {:+.3} ms",
        p50_added, p99_added
    );
    let baseline = before.pooled();
    println!(
        "   the same difference with no policies (the noise floor): p50 {:+.3} ms, p99 {:+.3} ms",
        percentile(&baseline.1, 50.0) - percentile(&baseline.0, 50.0),
        percentile(&baseline.1, 99.0) - percentile(&baseline.0, 99.0)
    );

    println!(
        "\n2. XRD annotation change to effect ({CHANGES} changes, alternating Off and Refuse)"
    );
    let mut times = Vec::new();
    for n in 0..CHANGES {
        let (value, want_refused) = if n % 2 == 0 {
            ("Off", false)
        } else {
            ("Refuse", true)
        };
        let start = Instant::now();
        xrds.patch(
            &format!("bench0s.{GROUP}"),
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"cascade-guard.dev/deletion-policy": value}}}),
            ),
        )
        .await?;
        loop {
            if refused(&admin, ns, &protected).await? == want_refused {
                break;
            }
            if start.elapsed() > Duration::from_secs(60) {
                bail!("annotation {value} did not take effect");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        times.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "   p50 {:.0} ms, max {:.0} ms (controller debounce 100 ms; includes the API server's policy reload)",
        percentile(&times, 50.0),
        times.last().copied().unwrap_or_default()
    );

    // A-B-A: without the policies again, to tell what they cost from what
    // the machine drifted by over the run (a fuller etcd, say).
    let mut controller = controller;
    controller.stop(Duration::from_secs(10));
    let bindings: Api<
        k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding,
    > = Api::all(admin.clone());
    let ours = kube::api::ListParams::default().labels(MANAGED);
    bindings
        .delete_collection(&Default::default(), &ours)
        .await?;
    vaps.delete_collection(&Default::default(), &ours).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while refused(&admin, ns, &protected).await? {
        if Instant::now() > deadline {
            bail!("the policies were still in force a minute after their removal");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("\n3. The same with the policies removed again (A-B-A)");
    let again = measure(&admin, &gc, ns, &plain, &protected, "again", BACKGROUND).await?;
    report("policies removed", &again);
    let p = |r: &Rounds, q| {
        let (plain, protected) = r.pooled();
        (percentile(&plain, q), percentile(&protected, q))
    };
    for q in [50.0, 99.0] {
        let (a0, b0) = p(&before, q);
        let (a1, b1) = p(&after, q);
        let (a2, b2) = p(&again, q);
        println!(
            "   p{q:.0}: protected kind {b0:.3} / {b1:.3} / {b2:.3} ms (without / with / without): with minus the mean without {:+.3} ms; unprotected kind {a0:.3} / {a1:.3} / {a2:.3} ms: {:+.3} ms",
            b1 - (b0 + b2) / 2.0,
            a1 - (a0 + a2) / 2.0
        );
    }
    Ok(())
}

/// How the measured deletes are sent.
#[derive(Clone, Copy)]
struct Request {
    propagation: &'static str,
    /// Label the protected kind's objects `crossplane.io/composite`, as
    /// Crossplane labels XRs (the seed's policy selects on it).
    composite_label: bool,
}

/// The garbage collector's Background delete: the longest path through
/// cascade-guard's policy that still allows.
const BACKGROUND: Request = Request {
    propagation: "Background",
    composite_label: false,
};

/// ROUNDS rounds of interleaved deletes of the two kinds.
async fn measure(
    admin: &Client,
    gc: &Client,
    ns: &str,
    plain: &ApiResource,
    protected: &ApiResource,
    phase: &str,
    how: Request,
) -> Result<Rounds> {
    let mut rounds = Vec::new();
    for round in 0..ROUNDS {
        let tag = format!("{phase}-{round}");
        let mut objects = Vec::new();
        for i in 0..DELETES {
            // Alternate which kind goes first: the first of a pair is slower.
            let pair = if i % 2 == 0 {
                [plain, protected]
            } else {
                [protected, plain]
            };
            for r in pair {
                let label = how.composite_label && r.kind != plain.kind;
                let (name, uid) = create_xr(admin, ns, r, &format!("{tag}-{i}"), label).await?;
                objects.push((r.clone(), name, uid));
            }
        }
        let mut plain_ms = Vec::new();
        let mut protected_ms = Vec::new();
        for (r, name, uid) in objects {
            let ms = delete_as_gc(gc, ns, &r, &name, &uid, how, false).await?;
            if r.kind == plain.kind {
                plain_ms.push(ms);
            } else {
                protected_ms.push(ms);
            }
        }
        plain_ms.sort_by(f64::total_cmp);
        protected_ms.sort_by(f64::total_cmp);
        rounds.push((plain_ms, protected_ms));
    }
    Ok(Rounds(rounds))
}

/// An XR of `r` with one composed resource, labelled as Crossplane labels XRs
/// when `label`: its name and UID.
async fn create_xr(
    admin: &Client,
    ns: &str,
    r: &ApiResource,
    name: &str,
    label: bool,
) -> Result<(String, String)> {
    let api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), ns, r);
    let mut o = DynamicObject::new(name, r).data(json!({"spec": {
        "crossplane": {"resourceRefs": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x"}]}}}));
    if label {
        o.labels_mut()
            .insert("crossplane.io/composite".into(), name.to_string());
    }
    let o = api.create(&PostParams::default(), &o).await?;
    Ok((o.name_any(), o.uid().context("uid")?))
}

/// The delete as `gc` sends it (with a UID precondition): milliseconds.
async fn delete_as_gc(
    gc: &Client,
    ns: &str,
    r: &ApiResource,
    name: &str,
    uid: &str,
    how: Request,
    dry_run: bool,
) -> Result<f64> {
    let mut options = json!({"kind": "DeleteOptions", "apiVersion": "v1",
        "propagationPolicy": how.propagation, "preconditions": {"uid": uid}});
    if dry_run {
        options["dryRun"] = json!(["All"]);
    }
    let body = serde_json::to_vec(&options)?;
    let request = http::Request::delete(format!(
        "/apis/{}/namespaces/{ns}/{}/{name}",
        r.api_version, r.plural
    ))
    .header("Content-Type", "application/json")
    .body(body)?;
    let start = Instant::now();
    gc.request_text(request)
        .await
        .with_context(|| format!("delete {name}"))?;
    Ok(start.elapsed().as_secs_f64() * 1000.0)
}

async fn refused(admin: &Client, ns: &str, r: &ApiResource) -> Result<bool> {
    let api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), ns, r);
    if api.get_opt("probe").await?.is_none() {
        let o = DynamicObject::new("probe", r).data(json!({"spec": {
            "crossplane": {"resourceRefs": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x"}]}}}));
        api.create(&PostParams::default(), &o).await?;
    }
    let dp = kube::api::DeleteParams {
        dry_run: true,
        propagation_policy: Some(kube::api::PropagationPolicy::Background),
        ..Default::default()
    };
    match api.delete("probe", &dp).await {
        Ok(_) => Ok(false),
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(true),
        // A policy whose validation gives reason Invalid (the seed's) denies
        // with 422.
        Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains("denied request") => {
            Ok(true)
        }
        Err(e) => Err(e.into()),
    }
}

/// What the number of protected kinds costs. One control plane with
/// `max(BENCH_KINDS)` XRD kinds (all Off at first) and one kind nothing
/// protects; then, measured like part 1 but with Foreground deletes (which
/// every variant allows) of labelled objects, one phase each for:
/// - no policy at all;
/// - the seed report's proposal: one ValidatingAdmissionPolicy matching DELETE
///   of every resource, bound to objects labelled `crossplane.io/composite`,
///   refusing what is not Foreground;
/// - cascade-guard with the first N kinds under Refuse, for each N (the
///   controller stopped while measuring, its policies in place);
/// - no policy again (the machine's drift over the run).
///
/// An unprotected request's added cost is the unprotected kind's figure in a
/// phase minus the first phase's; a protected allowed delete's is the
/// protected kind's minus the unprotected kind's in the same rounds.
mod scale {
    use super::*;
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };

    const FOREGROUND: Request = Request {
        propagation: "Foreground",
        composite_label: true,
    };
    const SEED_POLICY: &str = "bench-seed-forceforeground";
    /// The group of an unprotected kind beside the protected kinds' own.
    const OTHER_GROUP: &str = "other.bench.cascade-guard.dev";

    struct Phase {
        name: String,
        policies: usize,
        rounds: Rounds,
        plugin: Plugin,
    }

    /// Deletes of one kind alone per sample of the admission plugin's time.
    const PLUGIN_DELETES: usize = 1000;
    const PLUGIN_METRIC: &str = "apiserver_admission_controller_admission_duration_seconds_";

    /// The ValidatingAdmissionPolicy plugin's own mean time per allowed
    /// DELETE, from the API server's admission histogram (stable): only the
    /// plugin's work (matching the request against every policy, then CEL),
    /// so the drift of the rest of the request path is not in it.
    struct Plugin {
        unprotected_us: f64,
        /// An unprotected kind of another API group: nearly every request in
        /// a cluster (the rules' group is checked before their resources).
        other_group_us: f64,
        protected_us: f64,
        /// The same deletes as dry runs, from the garbage collector and from
        /// a person (kubectl delete --cascade=foreground).
        protected_dry_run_us: f64,
        protected_by_user_us: f64,
    }

    /// The plugin's (seconds, requests) so far for allowed requests of
    /// `operation` (DELETE, UPDATE).
    async fn plugin_so_far(admin: &Client, operation: &str) -> Result<(f64, f64)> {
        let operation = format!(r#"operation="{operation}""#);
        let metrics = admin
            .request_text(http::Request::get("/metrics").body(Vec::new())?)
            .await?;
        let (mut seconds, mut requests) = (0.0, 0.0);
        for line in metrics.lines() {
            let Some(series) = line.strip_prefix(PLUGIN_METRIC) else {
                continue;
            };
            let ours = [
                r#"name="ValidatingAdmissionPolicy""#,
                &operation,
                r#"rejected="false""#,
                r#"type="validate""#,
            ]
            .iter()
            .all(|label| series.contains(label));
            if !ours {
                continue;
            }
            let value = || -> Result<f64> {
                let v = line.rsplit(' ').next().unwrap_or_default();
                v.parse()
                    .with_context(|| format!("{PLUGIN_METRIC}: {line}"))
            };
            if series.starts_with("sum{") {
                seconds += value()?;
            } else if series.starts_with("count{") {
                requests += value()?;
            }
        }
        Ok((seconds, requests))
    }

    /// The plugin's mean microseconds per delete over PLUGIN_DELETES deletes
    /// of `r` alone: the garbage collector's, real and as dry runs, and a
    /// person's (`admin`) as dry runs.
    async fn plugin_mean(
        admin: &Client,
        gc: &Client,
        ns: &str,
        r: &ApiResource,
        label: bool,
        tag: &str,
    ) -> Result<PluginMeans> {
        let mut objects = Vec::new();
        for i in 0..PLUGIN_DELETES {
            objects.push(create_xr(admin, ns, r, &format!("{tag}-{i}"), label).await?);
        }
        let mut means = [0.0; 3];
        // Dry runs first: the same admission, with nothing stored, so no
        // garbage collector work (and its UPDATE, checked by the UPDATE
        // policy) competes with the next DELETE; then the real deletes.
        for (mean, (client, dry_run)) in
            means
                .iter_mut()
                .zip([(admin, true), (gc, true), (gc, false)])
        {
            let (s0, n0) = plugin_so_far(admin, "DELETE").await?;
            for (name, uid) in &objects {
                delete_as_gc(client, ns, r, name, uid, FOREGROUND, dry_run).await?;
            }
            let (s1, n1) = plugin_so_far(admin, "DELETE").await?;
            if n1 - n0 < PLUGIN_DELETES as f64 {
                bail!(
                    "{PLUGIN_METRIC}: {} allowed DELETEs counted for {PLUGIN_DELETES} sent",
                    n1 - n0
                );
            }
            *mean = (s1 - s0) / (n1 - n0) * 1e6;
        }
        let [by_user_us, dry_run_us, real_us] = means;
        println!(
            "   admission plugin's own mean per allowed DELETE of {}: the garbage collector's {real_us:.1} µs, as dry runs {dry_run_us:.1} µs; a person's, as dry runs, {by_user_us:.1} µs",
            r.plural
        );
        Ok(PluginMeans {
            real_us,
            dry_run_us,
            by_user_us,
        })
    }

    struct PluginMeans {
        real_us: f64,
        dry_run_us: f64,
        by_user_us: f64,
    }

    /// What every phase sends: the clients, the namespace and the two kinds.
    struct Bench<'a> {
        admin: &'a Client,
        gc: &'a Client,
        ns: &'a str,
        plain: &'a ApiResource,
        other_group: &'a ApiResource,
        protected: &'a ApiResource,
    }

    impl Bench<'_> {
        /// One phase: the interleaved rounds (reported under `heading`), then
        /// the plugin's own time for the unprotected kind and the protected one.
        async fn phase(
            &self,
            tag: &str,
            heading: &str,
            name: String,
            policies: usize,
        ) -> Result<Phase> {
            let (admin, gc, ns) = (self.admin, self.gc, self.ns);
            let rounds =
                measure(admin, gc, ns, self.plain, self.protected, tag, FOREGROUND).await?;
            report(heading, &rounds);
            let unprotected =
                plugin_mean(admin, gc, ns, self.plain, false, &format!("{tag}-pu")).await?;
            let other_group =
                plugin_mean(admin, gc, ns, self.other_group, false, &format!("{tag}-po")).await?;
            let protected =
                plugin_mean(admin, gc, ns, self.protected, true, &format!("{tag}-pp")).await?;
            println!(
                "   admission plugin's own mean per allowed DELETE ({PLUGIN_DELETES} of each kind alone): unprotected {:.1} µs (another group {:.1}), protected {:.1} µs",
                unprotected.real_us, other_group.real_us, protected.real_us
            );
            Ok(Phase {
                name,
                policies,
                rounds,
                plugin: Plugin {
                    unprotected_us: unprotected.real_us,
                    other_group_us: other_group.real_us,
                    protected_us: protected.real_us,
                    protected_dry_run_us: protected.dry_run_us,
                    protected_by_user_us: protected.by_user_us,
                },
            })
        }
    }

    pub const NS: &str = "bench";

    /// A control plane with `kinds` XRD kinds in `mode`, the kind nothing
    /// names in their group and one of another group, and the namespace
    /// [`NS`].
    pub struct World {
        pub cp: ControlPlane,
        pub admin: Client,
        pub gc: Client,
        pub xrds: Api<DynamicObject>,
        pub plain: ApiResource,
        pub other: ApiResource,
        pub protected: ApiResource,
        /// The protected kind whose plural sorts last: the API server scans
        /// the shared rule's resource list in order, so this one's delete is
        /// the dearest to match (`protected` sorts first).
        pub last: ApiResource,
    }

    impl World {
        pub async fn start(kinds: usize, mode: &str) -> Result<World> {
            let mut crds =
                vec![crossplane::crossplane_crd(crossplane::XRD_CRD).map_err(anyhow::Error::msg)?];
            for i in 0..kinds {
                crds.push(
                    crossplane::xrd_to_crd(&xrd_in_mode(i, "Off")).map_err(anyhow::Error::msg)?,
                );
            }
            let mut plain = xrd_in_mode(0, "Off");
            plain["spec"]["names"] = json!({"kind": "Plain", "plural": "plains"});
            crds.push(crossplane::xrd_to_crd(&plain).map_err(anyhow::Error::msg)?);
            let mut other = plain.clone();
            other["metadata"]["name"] = json!(format!("others.{OTHER_GROUP}"));
            other["spec"]["group"] = json!(OTHER_GROUP);
            other["spec"]["names"] = json!({"kind": "Other", "plural": "others"});
            crds.push(crossplane::xrd_to_crd(&other).map_err(anyhow::Error::msg)?);
            crds.extend(cascade_guard::api::crds());

            let started = Instant::now();
            let cp = ControlPlane::start(Options {
                crds,
                ..Options::default()
            })
            .await?;
            println!(
                "control plane with {} kinds up in {:.1}s",
                kinds + 2,
                started.elapsed().as_secs_f64()
            );
            let admin = cp.admin().await?;
            let gc = cp.client_as(GC_USER, &["system:masters"]).await?;
            let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
            namespaces
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({"metadata": {"name": NS}}))?,
                )
                .await?;
            let xrds: Api<DynamicObject> =
                Api::all_with(admin.clone(), &local_cluster::crossplane::xrd_resource());
            for i in 0..kinds {
                xrds.create(
                    &PostParams::default(),
                    &serde_json::from_value(xrd_in_mode(i, mode))?,
                )
                .await?;
            }
            Ok(World {
                cp,
                admin,
                gc,
                xrds,
                plain: resource("Plain", "plains"),
                other: ApiResource {
                    group: OTHER_GROUP.into(),
                    version: "v1".into(),
                    api_version: format!("{OTHER_GROUP}/v1"),
                    kind: "Other".into(),
                    plural: "others".into(),
                },
                protected: resource("Bench0", "bench0s"),
                last: {
                    let i = (0..kinds).max_by_key(|i| format!("bench{i}s")).unwrap_or(0);
                    resource(&format!("Bench{i}"), &format!("bench{i}s"))
                },
            })
        }
    }

    fn scales() -> Result<Vec<usize>> {
        let raw = std::env::var("BENCH_KINDS").unwrap_or_else(|_| "10,100,500".into());
        let mut scales = raw
            .split(',')
            .map(|n| n.trim().parse::<usize>())
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("BENCH_KINDS={raw}: want numbers such as 10,100,500"))?;
        scales.sort_unstable();
        scales.dedup();
        if scales.first() == Some(&0) || scales.is_empty() {
            bail!("BENCH_KINDS={raw}: want kinds counts of 1 or more");
        }
        Ok(scales)
    }

    pub async fn run() -> Result<()> {
        let scales = scales()?;
        let max = scales.last().copied().unwrap_or(1);
        let World {
            cp,
            admin,
            gc,
            xrds,
            plain,
            other: other_group,
            protected,
            last: _,
        } = World::start(max, "Off").await?;
        let ns = NS;
        println!(
            "\n4. DELETE latency against the number of protected kinds, {ROUNDS} rounds of {DELETES} deletes of each kind, interleaved"
        );
        println!(
            "   request: DELETE as the garbage collector, propagationPolicy Foreground (allowed by every variant), UID precondition,"
        );
        println!(
            "   of an XR labelled crossplane.io/composite with one composed resource, and of an unlabelled object of a kind no policy names"
        );
        let bench = Bench {
            admin: &admin,
            gc: &gc,
            ns,
            plain: &plain,
            other_group: &other_group,
            protected: &protected,
        };
        let mut phases = Vec::new();
        phases.push(
            bench
                .phase("none", "no policy", "no policy".into(), 0)
                .await?,
        );

        install_seed_policy(&admin).await?;
        wait_refused(&admin, ns, &protected, true, "the seed's policy").await?;
        phases.push(
            bench
                .phase(
                    "seed",
                    "the seed report's policy (1 policy, objectSelector)",
                    "the seed's policy".into(),
                    1,
                )
                .await?,
        );
        remove_seed_policy(&admin).await?;
        wait_refused(&admin, ns, &protected, false, "the seed's policy removed").await?;

        let mut controller = start_controller(&cp)?;
        let vaps: Api<ValidatingAdmissionPolicy> = Api::all(admin.clone());
        let mut protected_so_far = 0;
        for &n in &scales {
            let since = Instant::now();
            for i in protected_so_far..n {
                xrds.patch(
                    &format!("bench{i}s.{GROUP}"),
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"metadata": {"annotations": {"cascade-guard.dev/deletion-policy": "Refuse"}}}),
                    ),
                )
                .await?;
            }
            protected_so_far = n;
            let newest = resource(&format!("Bench{}", n - 1), &format!("bench{}s", n - 1));
            let deadline = Instant::now() + Duration::from_secs(300);
            let installed = loop {
                let ours = vaps
                    .list(&kube::api::ListParams::default().labels(MANAGED))
                    .await?
                    .items;
                let deletes = bench_kinds_carried(&ours);
                let ours = ours.len();
                if deletes == n && refused(&admin, ns, &newest).await? {
                    break ours;
                }
                if Instant::now() > deadline {
                    bail!(
                        "cascade-guard did not install {n} kinds' policies in time ({deletes} so far)"
                    );
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            println!(
                "   {n} kinds protected: {installed} policies (and as many bindings) in force {:.1}s after the annotations",
                since.elapsed().as_secs_f64()
            );
            // Measured with the controller stopped (its policies stay): on
            // two shared cores its own work (the start-up scan of every kind,
            // watching the protected kinds' deletes) would be counted as the
            // API server's.
            controller.stop(Duration::from_secs(10));
            phases.push(
                bench
                    .phase(
                        &format!("k{n}"),
                        &format!("cascade-guard, {n} kinds protected"),
                        format!("cascade-guard, {n} kinds"),
                        installed,
                    )
                    .await?,
            );
            controller = start_controller(&cp)?;
        }
        controller.stop(Duration::from_secs(10));
        let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(admin.clone());
        let per_kind = per_kind_pairs(&vaps, &bindings).await?;
        remove_ours(&admin, ns, &protected).await?;

        // The earlier releases' design, side by side in the same run: the
        // same policies and bindings, one pair per kind.
        for (policy, its_bindings) in &per_kind {
            vaps.create(&PostParams::default(), policy).await?;
            for b in its_bindings {
                bindings.create(&PostParams::default(), b).await?;
            }
        }
        let newest = resource(
            &format!("Bench{}", protected_so_far - 1),
            &format!("bench{}s", protected_so_far - 1),
        );
        wait_refused(&admin, ns, &newest, true, "the per-kind pairs").await?;
        wait_refused(&admin, ns, &protected, true, "the per-kind pairs").await?;
        let name = format!(
            "a policy pair per kind, as earlier releases compiled (by hand, {protected_so_far} kinds)"
        );
        phases.push(
            bench
                .phase("per-kind", &name, name.clone(), per_kind.len())
                .await?,
        );
        for (policy, its_bindings) in &per_kind {
            for b in its_bindings {
                bindings.delete(&b.name_any(), &Default::default()).await?;
            }
            vaps.delete(&policy.name_any(), &Default::default()).await?;
        }
        wait_refused(&admin, ns, &protected, false, "the per-kind pairs removed").await?;
        phases.push(
            bench
                .phase("again", "no policy again", "no policy again".into(), 0)
                .await?,
        );
        table(&phases);
        Ok(())
    }

    /// The earlier releases' design, made by hand from what cascade-guard
    /// compiled: for each kind in the shared policies (DELETE and UPDATE),
    /// a copy of the policy and its binding whose rules name that kind alone,
    /// renamed and unlabelled (the controller's are deleted, not these).
    async fn per_kind_pairs(
        vaps: &Api<ValidatingAdmissionPolicy>,
        bindings: &Api<ValidatingAdmissionPolicyBinding>,
    ) -> Result<
        Vec<(
            ValidatingAdmissionPolicy,
            Vec<ValidatingAdmissionPolicyBinding>,
        )>,
    > {
        let ours = kube::api::ListParams::default().labels(MANAGED);
        // The rules of an object narrowed to one of the resources they name.
        let narrowed = |rules: &Value, group: &str, resource: &str| -> Value {
            let scope = rules
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| {
                    r["apiGroups"][0] == group
                        && r["resources"]
                            .as_array()
                            .is_some_and(|rs| rs.contains(&json!(resource)))
                })
                .map(|r| r["scope"].clone())
                .unwrap_or(json!("*"));
            let operations = rules[0]["operations"].clone();
            json!([{"apiGroups": [group], "apiVersions": ["*"], "operations": operations,
                "resources": [resource], "scope": scope}])
        };
        let all_bindings = bindings.list(&ours).await?.items;
        let mut out = Vec::new();
        for policy in vaps.list(&ours).await?.items {
            let name = policy.name_any();
            if !name.contains("-xrds-") {
                continue;
            }
            let p = serde_json::to_value(&policy)?;
            let rules = p["spec"]["matchConstraints"]["resourceRules"].clone();
            let its: Vec<Value> = all_bindings
                .iter()
                .filter(|b| b.spec.policy_name == name)
                .map(serde_json::to_value)
                .collect::<Result<_, _>>()?;
            for rule in rules.as_array().into_iter().flatten() {
                let group = rule["apiGroups"][0].as_str().unwrap_or_default();
                for resource in rule["resources"].as_array().into_iter().flatten() {
                    let resource = resource.as_str().unwrap_or_default();
                    let own = format!("bench-per-kind-{name}-{resource}");
                    let mut p = p.clone();
                    p["metadata"] = json!({"name": own});
                    p["spec"]["matchConstraints"]["resourceRules"] =
                        narrowed(&rules, group, resource);
                    let mut pair_bindings = Vec::new();
                    for b in &its {
                        let mut b = b.clone();
                        b["metadata"] = json!({"name": own});
                        b["spec"]["policyName"] = json!(own);
                        b["spec"]["matchResources"]["resourceRules"] =
                            narrowed(&rules, group, resource);
                        pair_bindings.push(serde_json::from_value(b)?);
                    }
                    out.push((serde_json::from_value(p)?, pair_bindings));
                }
            }
        }
        if out.is_empty() {
            bail!("no shared policy of cascade-guard's to split per kind");
        }
        Ok(out)
    }

    /// The series `alternated` samples: what is deleted, and by whom.
    const SERIES: [&str; 6] = [
        "unprotected, same group (GC)",
        "unprotected, another group (GC)",
        "protected (the GC's)",
        "protected (a person's)",
        "protected, last in the rule (GC)",
        "UPDATE, unprotected, another group (a person's)",
    ];
    const VARIANTS: [&str; 6] = [
        "no policy",
        "the seed's policy",
        "cascade-guard",
        "the hold policy",
        "the gate",
        "cascade-guard and the hold policy",
    ];
    /// The variants whose difference is the hold policy's own cost in an
    /// installed cascade-guard: (with it, without it).
    const HOLD_BESIDE_OURS: (usize, usize) = (5, 2);
    /// Entries in the holds ConfigMap while the hold policy is measured
    /// (BENCH_HOLD_ENTRIES): by default a platform with 1,000 trees holding
    /// a few objects each.
    fn hold_entries() -> usize {
        std::env::var("BENCH_HOLD_ENTRIES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3000)
    }
    /// The label on sibling order's admission objects (the hold policy and
    /// the gate), which the controller leaves when it stops.
    const SIBLING_ORDER: &str = "cascade-guard.dev/sibling-order=true";
    /// One cycle's samples: [variant][series] = (plugin µs, request p50 ms).
    type Cycle = Vec<[(f64, f64); SERIES.len()]>;

    /// BENCH_ONLY=alternated: the admission cost of a protected allowed
    /// delete with the variants alternated (no policy, the seed's, then
    /// cascade-guard's shared pairs for max(BENCH_KINDS) kinds, BENCH_CYCLES
    /// times), so that the machine's drift over minutes falls on every
    /// variant alike; the phases of `run` are minutes apart. Every delete is
    /// a dry run of the same object (the same admission, nothing stored, no
    /// garbage collector follow-up), so each figure is the admission's own.
    pub async fn run_alternated() -> Result<()> {
        let kinds = scales()?.last().copied().unwrap_or(1);
        let cycles: usize = std::env::var("BENCH_CYCLES")
            .unwrap_or_else(|_| "5".into())
            .parse()
            .context("BENCH_CYCLES: want a number")?;
        let World {
            cp,
            admin,
            gc,
            xrds: _,
            plain,
            other,
            protected,
            last,
        } = World::start(kinds, "Refuse").await?;
        let ns = NS;

        // cascade-guard compiles the kinds once; its objects are kept, the
        // controller stopped, and put back by hand in each cycle.
        let controller = start_controller(&cp)?;
        let vaps: Api<ValidatingAdmissionPolicy> = Api::all(admin.clone());
        let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(admin.clone());
        let managed = kube::api::ListParams::default().labels(MANAGED);
        let deadline = Instant::now() + Duration::from_secs(600);
        while bench_kinds_carried(&vaps.list(&managed).await?.items) < kinds {
            if Instant::now() > deadline {
                bail!("cascade-guard did not protect {kinds} kinds within ten minutes");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let mut controller = controller;
        controller.stop(Duration::from_secs(10));
        // Sibling order's hold policy and gate, which the controller wrote:
        // out of the other variants, the hold policy measured as one of its
        // own (it sees every DELETE in the cluster).
        let sibling = kube::api::ListParams::default().labels(SIBLING_ORDER);
        bindings
            .delete_collection(&Default::default(), &sibling)
            .await?;
        vaps.delete_collection(&Default::default(), &sibling)
            .await?;
        // The kinds it names: the held ConfigMaps', and the first series'
        // (an unheld object of a held kind, which pays for reading the
        // record); the DELETEs of the other series' kinds do not reach it.
        let hold = cascade_guard::policy::sibling::hold_policy::compile_hold(
            &cascade_guard::policy::CompileSettings::default(),
            "default",
            &std::collections::BTreeSet::from([
                (String::new(), "configmaps".to_string()),
                (plain.group.clone(), plain.plural.clone()),
            ]),
        );
        let holds: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(admin.clone(), "default");
        let entries = cascade_guard::policy::sibling::holds_record::encode_holds(
            &(0..hold_entries().max(1))
                .map(|i| {
                    (
                        format!("ConfigMap__bench-{}_held-{i}", i % 100),
                        format!(
                            "00000000-0000-4000-8000-{i:012} Root.bench.dev ConfigMap bench/needer-{i}"
                        ),
                    )
                })
                .collect(),
        );
        holds
            .patch(
                cascade_guard::policy::sibling::holds_record::HOLDS,
                &PatchParams::apply("bench").force(),
                &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": cascade_guard::policy::sibling::holds_record::HOLDS},
                    "data": entries})),
            )
            .await?;
        let bare = |v: Value| -> Value {
            json!({"metadata": {"name": v["metadata"]["name"], "labels": v["metadata"]["labels"],
                "annotations": v["metadata"]["annotations"]}, "spec": v["spec"]})
        };
        let our_policies: Vec<ValidatingAdmissionPolicy> = vaps
            .list(&managed)
            .await?
            .items
            .into_iter()
            .map(|p| Ok(serde_json::from_value(bare(serde_json::to_value(p)?))?))
            .collect::<Result<_>>()?;
        let our_bindings: Vec<ValidatingAdmissionPolicyBinding> = bindings
            .list(&managed)
            .await?
            .items
            .into_iter()
            .map(|b| Ok(serde_json::from_value(bare(serde_json::to_value(b)?))?))
            .collect::<Result<_>>()?;
        remove_ours(&admin, ns, &protected).await?;

        let other_object = create_xr(&admin, ns, &other, "alt", false).await?;
        let targets = [
            (
                &gc,
                &plain,
                create_xr(&admin, ns, &plain, "alt", false).await?,
                Op::Delete,
            ),
            (&gc, &other, other_object.clone(), Op::Delete),
            (
                &gc,
                &protected,
                create_xr(&admin, ns, &protected, "alt-gc", true).await?,
                Op::Delete,
            ),
            (
                &admin,
                &protected,
                create_xr(&admin, ns, &protected, "alt-person", true).await?,
                Op::Delete,
            ),
            (
                &gc,
                &last,
                create_xr(&admin, ns, &last, "alt-last", true).await?,
                Op::Delete,
            ),
            (&admin, &other, other_object, Op::Update),
        ];
        // The gate on the protected kinds, reading BENCH_HOLD_ENTRIES trees
        // marked ordered, the targets among them (so their deletes are let
        // through and measured whole); a probe XR it has not ordered tells
        // when it is in effect.
        let gate = cascade_guard::policy::sibling::gate::compile_gate(
            &[&protected, &last].map(|r| cascade_guard::policy::sibling::gate::GatedKind {
                group: r.group.clone(),
                plural: r.plural.clone(),
                shape: cascade_guard::policy::Shape::CompositeResource,
            }),
            &cascade_guard::policy::CompileSettings::default(),
            "default",
        );
        let gate_probe = create_xr(&admin, ns, &protected, "gate-probe", true).await?;
        let mut marks: std::collections::BTreeMap<String, String> = (0..hold_entries().max(1))
            .map(|i| (format!("00000000-0000-4000-9000-{i:012}"), "1".to_string()))
            .collect();
        for (_, _, (_, uid), _) in &targets[2..5] {
            marks.insert(uid.clone(), "1".to_string());
        }
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(admin.clone(), "default")
            .patch(
                cascade_guard::policy::sibling::gate::ORDERED_TREES,
                &PatchParams::apply("bench").force(),
                &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": cascade_guard::policy::sibling::gate::ORDERED_TREES},
                    "data": cascade_guard::policy::sibling::gate::encode_marks(&marks)})),
            )
            .await?;

        println!(
            "\n5. Admission cost alternated: {} policies' variants, {cycles} cycles, {PLUGIN_DELETES} dry-run Foreground DELETEs (UID precondition) per series; the plugin's µs: the median of {PLUGIN_BATCH}-request means",
            VARIANTS.len()
        );
        println!(
            "   cascade-guard: {kinds} kinds, {} policies; protected kinds {} (first in the rule) and {} (last)",
            our_policies.len(),
            protected.plural,
            last.plural
        );
        let mut samples: Vec<Cycle> =
            vec![vec![[(0.0, 0.0); SERIES.len()]; VARIANTS.len()]; cycles];
        for (cycle, per_variant) in samples.iter_mut().enumerate() {
            for (v, per_series) in per_variant.iter_mut().enumerate() {
                match v {
                    1 => {
                        install_seed_policy(&admin).await?;
                        wait_refused(&admin, ns, &protected, true, "the seed's policy").await?;
                    }
                    2 | 5 => {
                        for p in &our_policies {
                            vaps.create(&PostParams::default(), p).await?;
                        }
                        for b in &our_bindings {
                            bindings.create(&PostParams::default(), b).await?;
                        }
                        wait_refused(&admin, ns, &protected, true, "cascade-guard's").await?;
                    }
                    _ => {}
                }
                match v {
                    3 | 5 => {
                        vaps.create(&PostParams::default(), &hold.policy).await?;
                        bindings
                            .create(&PostParams::default(), &hold.binding)
                            .await?;
                        wait_holding(&admin).await?;
                    }
                    4 => {
                        for c in &gate {
                            vaps.create(&PostParams::default(), &c.policy).await?;
                            bindings.create(&PostParams::default(), &c.binding).await?;
                        }
                        gate_refuses(&admin, ns, &protected, &gate_probe.0, true).await?;
                    }
                    _ => {}
                }
                for (sample, (client, r, (name, uid), op)) in per_series.iter_mut().zip(&targets) {
                    *sample = dry_run_sample(&admin, client, (ns, r), (name, uid), *op).await?;
                }
                println!(
                    "   cycle {cycle} {:<18} {}",
                    VARIANTS[v],
                    per_series
                        .iter()
                        .map(|(us, ms)| format!("{us:7.1} µs {ms:.3} ms"))
                        .collect::<Vec<_>>()
                        .join(" | ")
                );
                match v {
                    1 => {
                        remove_seed_policy(&admin).await?;
                        wait_refused(&admin, ns, &protected, false, "the seed's removed").await?;
                    }
                    3..=5 => {
                        bindings
                            .delete_collection(&Default::default(), &sibling)
                            .await?;
                        vaps.delete_collection(&Default::default(), &sibling)
                            .await?;
                        if v == 4 {
                            gate_refuses(&admin, ns, &protected, &gate_probe.0, false).await?;
                        } else {
                            wait_holding_gone(&admin).await?;
                        }
                    }
                    _ => {}
                }
                if v == 2 || v == 5 {
                    remove_ours(&admin, ns, &protected).await?;
                }
            }
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            percentile(&v, 50.0)
        };
        println!(
            "\n   | variant | series | plugin µs | plugin added over no policy µs | request p50 ms | request p50 added ms |"
        );
        println!("   |---|---|---|---|---|---|");
        for (v, variant) in VARIANTS.iter().enumerate() {
            for (i, series) in SERIES.iter().enumerate() {
                let of = |f: &dyn Fn(&Cycle) -> f64| median(samples.iter().map(f).collect());
                println!(
                    "   | {variant} | {series} | {:.1} | {:+.1} | {:.3} | {:+.3} |",
                    of(&|c| c[v][i].0),
                    of(&|c| c[v][i].0 - c[0][i].0),
                    of(&|c| c[v][i].1),
                    of(&|c| c[v][i].1 - c[0][i].1),
                );
            }
        }
        println!(
            "   (medians over the cycles; the added columns are the median of each cycle's own difference)"
        );
        // The hold policy as installed: beside cascade-guard's own policies,
        // which every install has (what any policy object costs a request
        // is in theirs already).
        let (with, without) = HOLD_BESIDE_OURS;
        println!(
            "\n   the hold policy beside cascade-guard's policies: {} minus {}",
            VARIANTS[with], VARIANTS[without]
        );
        println!("   | series | plugin added µs | request p50 added ms |");
        println!("   |---|---|---|");
        for (i, series) in SERIES.iter().enumerate() {
            let of = |f: &dyn Fn(&Cycle) -> f64| median(samples.iter().map(f).collect());
            println!(
                "   | {series} | {:+.1} | {:+.3} |",
                of(&|c| c[with][i].0 - c[without][i].0),
                of(&|c| c[with][i].1 - c[without][i].1),
            );
        }
        Ok(())
    }

    /// A ConfigMap the holds name (`bench-0/held-0`), made once: the hold
    /// policy is in effect when its dry-run delete is refused.
    async fn wait_holding(admin: &Client) -> Result<()> {
        held_probe(admin, true).await
    }

    /// Waits until a dry-run delete of the probe XR, which the gate has not
    /// ordered, is refused (`refused`) or let through.
    async fn gate_refuses(
        admin: &Client,
        ns: &str,
        r: &ApiResource,
        probe: &str,
        refused: bool,
    ) -> Result<()> {
        let api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), ns, r);
        let dry_run = kube::api::DeleteParams {
            dry_run: true,
            ..Default::default()
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while api.delete(probe, &dry_run).await.is_ok() == refused {
            if Instant::now() > deadline {
                bail!("the gate's refusal never became {refused}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    async fn wait_holding_gone(admin: &Client) -> Result<()> {
        held_probe(admin, false).await
    }

    async fn held_probe(admin: &Client, refused: bool) -> Result<()> {
        use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
        let _ = Api::<Namespace>::all(admin.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "bench-0"}}))?,
            )
            .await;
        let maps: Api<ConfigMap> = Api::namespaced(admin.clone(), "bench-0");
        let _ = maps
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "held-0"}}))?,
            )
            .await;
        let dry_run = kube::api::DeleteParams {
            dry_run: true,
            ..Default::default()
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while maps.delete("held-0", &dry_run).await.is_ok() == refused {
            if Instant::now() > deadline {
                bail!("the hold policy's refusal never became {refused}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// Deletes cascade-guard's admission objects (the controller stopped)
    /// and waits until the API server no longer refuses.
    async fn remove_ours(admin: &Client, ns: &str, protected: &ApiResource) -> Result<()> {
        let managed = kube::api::ListParams::default().labels(MANAGED);
        Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone())
            .delete_collection(&Default::default(), &managed)
            .await?;
        Api::<ValidatingAdmissionPolicy>::all(admin.clone())
            .delete_collection(&Default::default(), &managed)
            .await?;
        wait_refused(
            admin,
            ns,
            protected,
            false,
            "cascade-guard's policies removed",
        )
        .await
    }

    /// What a series sends, always as a dry run.
    #[derive(Clone, Copy)]
    enum Op {
        /// A Foreground DELETE with a UID precondition.
        Delete,
        /// A merge patch of a label (an UPDATE to admission), each a new value.
        Update,
    }

    impl Op {
        fn operation(self) -> &'static str {
            match self {
                Op::Delete => "DELETE",
                Op::Update => "UPDATE",
            }
        }
    }

    /// Requests between two reads of the plugin's histogram in
    /// [`dry_run_sample`]: its figure is the median of these batches' means.
    const PLUGIN_BATCH: usize = 50;

    /// PLUGIN_DELETES dry-run requests (`op`) on one object by `client`: the
    /// plugin's µs per request and the request's p50 ms.
    ///
    /// The plugin's figure is the median of the means of batches of
    /// PLUGIN_BATCH requests, not the mean of all: the histogram gives only
    /// sums, and on two cores one request in a thousand descheduled for a
    /// millisecond inside the plugin adds a whole µs to a mean, more than the
    /// difference between two variants; a median of batches leaves out the
    /// batches such a pause falls in.
    async fn dry_run_sample(
        admin: &Client,
        client: &Client,
        (ns, r): (&str, &ApiResource),
        (name, uid): (&str, &str),
        op: Op,
    ) -> Result<(f64, f64)> {
        let operation = op.operation();
        let mut ms = Vec::with_capacity(PLUGIN_DELETES);
        let mut batch_us = Vec::with_capacity(PLUGIN_DELETES / PLUGIN_BATCH);
        let (mut s0, mut n0) = plugin_so_far(admin, operation).await?;
        for batch in 0..PLUGIN_DELETES / PLUGIN_BATCH {
            for j in 0..PLUGIN_BATCH {
                let i = batch * PLUGIN_BATCH + j;
                ms.push(match op {
                    Op::Delete => delete_as_gc(client, ns, r, name, uid, FOREGROUND, true).await?,
                    Op::Update => relabel_dry_run(client, ns, r, name, i).await?,
                });
            }
            let (s1, n1) = plugin_so_far(admin, operation).await?;
            if n1 - n0 < PLUGIN_BATCH as f64 {
                bail!(
                    "{PLUGIN_METRIC}: {} allowed {operation}s counted for {PLUGIN_BATCH} sent",
                    n1 - n0
                );
            }
            batch_us.push((s1 - s0) / (n1 - n0) * 1e6);
            (s0, n0) = (s1, n1);
        }
        ms.sort_by(f64::total_cmp);
        batch_us.sort_by(f64::total_cmp);
        Ok((percentile(&batch_us, 50.0), percentile(&ms, 50.0)))
    }

    /// One dry-run merge patch of a label on `name`: the request's ms.
    async fn relabel_dry_run(
        client: &Client,
        ns: &str,
        r: &ApiResource,
        name: &str,
        round: usize,
    ) -> Result<f64> {
        let body = serde_json::to_vec(
            &json!({"metadata": {"labels": {"bench-round": round.to_string()}}}),
        )?;
        let request = http::Request::patch(format!(
            "/apis/{}/namespaces/{ns}/{}/{name}?dryRun=All",
            r.api_version, r.plural
        ))
        .header("Content-Type", "application/merge-patch+json")
        .body(body)?;
        let start = Instant::now();
        client
            .request_text(request)
            .await
            .with_context(|| format!("relabel {name}"))?;
        Ok(start.elapsed().as_secs_f64() * 1000.0)
    }

    fn table(phases: &[Phase]) {
        let Some(first) = phases.first() else { return };
        let (floor, _) = first.rounds.pooled();
        println!(
            "\n   | phase | policies | unprotected p50 / p99 ms | unprotected added p50 / p99 ms | protected p50 / p99 ms | protected minus unprotected p50 / p99 ms (median over rounds) | admission plugin per DELETE, unprotected / protected µs | plugin, unprotected added µs |"
        );
        println!("   |---|---|---|---|---|---|---|---|");
        for phase in phases {
            let (unprotected, protected) = phase.rounds.pooled();
            let q = |v: &[f64], q| percentile(v, q);
            println!(
                "   | {} | {} | {:.3} / {:.3} | {:+.3} / {:+.3} | {:.3} / {:.3} | {:+.3} / {:+.3} | {:.1} / {:.1} | {:+.1} |",
                phase.name,
                phase.policies,
                q(&unprotected, 50.0),
                q(&unprotected, 99.0),
                q(&unprotected, 50.0) - q(&floor, 50.0),
                q(&unprotected, 99.0) - q(&floor, 99.0),
                q(&protected, 50.0),
                q(&protected, 99.0),
                phase.rounds.median_difference(50.0),
                phase.rounds.median_difference(99.0),
                phase.plugin.unprotected_us,
                phase.plugin.protected_us,
                phase.plugin.unprotected_us - first.plugin.unprotected_us,
            );
        }
        println!(
            "\n   | phase | plugin per unprotected DELETE: same group / another group µs | added over the first phase µs | plugin per protected DELETE: GC real / GC dry run / a person's dry run µs | added over the first phase µs |"
        );
        println!("   |---|---|---|---|---|");
        for phase in phases {
            let (p, f) = (&phase.plugin, &first.plugin);
            println!(
                "   | {} | {:.1} / {:.1} | {:+.1} / {:+.1} | {:.1} / {:.1} / {:.1} | {:+.1} / {:+.1} / {:+.1} |",
                phase.name,
                p.unprotected_us,
                p.other_group_us,
                p.unprotected_us - f.unprotected_us,
                p.other_group_us - f.other_group_us,
                p.protected_us,
                p.protected_dry_run_us,
                p.protected_by_user_us,
                p.protected_us - f.protected_us,
                p.protected_dry_run_us - f.protected_dry_run_us,
                p.protected_by_user_us - f.protected_by_user_us,
            );
        }
    }

    /// The seed report's sketch, widened as the issue describes it: every
    /// resource, selected by Crossplane's composite label.
    async fn install_seed_policy(admin: &Client) -> Result<()> {
        let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
            "metadata": {"name": SEED_POLICY},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": ["*"], "apiVersions": ["*"],
                    "operations": ["DELETE"], "resources": ["*"],
                }]},
                "validations": [{
                    "expression": "has(request.options.propagationPolicy) && request.options.propagationPolicy == 'Foreground'",
                    "reason": "Invalid",
                }],
            },
        }))?;
        let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
            "metadata": {"name": SEED_POLICY},
            "spec": {
                "policyName": SEED_POLICY,
                "matchResources": {"objectSelector": {"matchExpressions": [
                    {"key": "crossplane.io/composite", "operator": "Exists"},
                ]}},
                "validationActions": ["Deny"],
            },
        }))?;
        Api::<ValidatingAdmissionPolicy>::all(admin.clone())
            .create(&PostParams::default(), &policy)
            .await?;
        Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone())
            .create(&PostParams::default(), &binding)
            .await?;
        Ok(())
    }

    async fn remove_seed_policy(admin: &Client) -> Result<()> {
        Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone())
            .delete(SEED_POLICY, &Default::default())
            .await?;
        Api::<ValidatingAdmissionPolicy>::all(admin.clone())
            .delete(SEED_POLICY, &Default::default())
            .await?;
        Ok(())
    }

    /// Waits until a dry-run Background delete of a labelled probe is (or is
    /// no longer) refused.
    async fn wait_refused(
        admin: &Client,
        ns: &str,
        r: &ApiResource,
        want: bool,
        what: &str,
    ) -> Result<()> {
        let api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), ns, r);
        let label = json!({"metadata": {"labels": {"crossplane.io/composite": "probe"}}});
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if refused(admin, ns, r).await? {
                if want {
                    return Ok(());
                }
            } else if !want {
                return Ok(());
            }
            // The probe carries the label the seed's policy selects on.
            api.patch("probe", &PatchParams::default(), &Patch::Merge(&label))
                .await?;
            if Instant::now() > deadline {
                bail!("{what}: not in effect after a minute");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// How many bench kinds cascade-guard's DELETE policies carry (every XRD of
/// one mode shares one; it lists its kinds in an annotation).
fn bench_kinds_carried(
    policies: &[k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy],
) -> usize {
    policies
        .iter()
        .filter(|p| {
            p.name_any()
                .starts_with(cascade_guard::policy::names::XRDS_OBJECT_PREFIX)
        })
        .filter_map(|p| {
            p.annotations()
                .get(cascade_guard::policy::names::PROTECTED_KINDS_ANNOTATION)
        })
        .filter_map(|a| {
            serde_json::from_str::<std::collections::BTreeMap<String, serde_json::Value>>(a).ok()
        })
        .map(|kinds| kinds.keys().filter(|k| k.starts_with("Bench")).count())
        .sum()
}
