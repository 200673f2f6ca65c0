//! Benchmark of sibling order (#24) on the real control plane. Prints:
//!
//! 1. `cascade-guard plan` on a tree of 200 objects (BENCH_PLAN_LAYERS=100:
//!    4,904) (a Convert root XR, XRs
//!    nested three deep, ConfigMaps, Secrets, managed resources reading
//!    ProviderConfigs whose credentials Secrets a Cluster writes, and
//!    `cascade-guard.dev/needs` annotations between siblings): the release
//!    binary's wall time end to end (`-o json`, several runs), with the
//!    controller running (it re-reads this tree every tick while young) and
//!    stopped; the same call in-process, reading the tree alone, and the pure
//!    `graph::graph` + `hazards` on the objects read (many iterations).
//! 2. The controller at rest with 1,000 small live trees (a root XR of a
//!    Convert or Refuse kind, 3 ConfigMaps, one needs edge) with
//!    `--sibling-order off`, then `enforce` once every needed ConfigMap is
//!    labelled and every tree is past its settling time: RSS, CPU seconds
//!    over a fixed window, and the API server's requests over the same
//!    window (apiserver_request_total, by verb and resource) with its and
//!    etcd's CPU: what the every-tick list and the re-reads cost.
//!
//! Run: scripts/bench.sh plan. BENCH_PLAN_RUNS (default 10), BENCH_TREES
//! (default 1000), BENCH_REST_SECONDS (default 60) change the sizes.
//! `BENCH_ONLY=plan` or `BENCH_ONLY=rest` runs one part.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cascade_guard::cli::plan::{self as plan_cli, Options as PlanOptions};
use cascade_guard::cluster::kinds::ServedKinds;
use cascade_guard::cluster::tree::{Listed, read_tree};
use cascade_guard::policy::Mode;
use cascade_guard::policy::sibling::graph;
use cascade_guard::policy::sibling::hold;
use cascade_guard::policy::sibling::needs_annotation::{
    COMPOSITION_RESOURCE_NAME_ANNOTATION, NEEDS_ANNOTATION,
};
use cascade_guard::policy::sibling::object::ObjectRef;
use cascade_guard::policy::sibling::provider_config_usage;
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{ApiResource, DynamicObject, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use local_cluster::ControlPlane;
use local_cluster::process::{self, Lifetime, Process};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use cascade_guard_bench::{GROUP, controller_binary, percentile, resource};

/// A kind of the benchmark: kind, plural, and the deletion policy its XRD
/// object carries (None: no XRD object, nothing protects it).
type Kind = (&'static str, &'static str, Option<&'static str>);

const PLAN_ROOT: Kind = ("PlanRoot", "planroots", Some("Convert"));
const LAYER: Kind = ("PlanLayer", "planlayers", None);
const PART: Kind = ("PlanPart", "planparts", None);
/// Stand-ins for a provider's kinds: a cluster that writes its kubeconfig
/// Secret, the ProviderConfig that reads it, and what uses that config.
const CLUSTER: Kind = ("Cluster", "clusters", None);
const PROVIDER_CONFIG: Kind = ("ProviderConfig", "providerconfigs", None);
const WORKLOAD: Kind = ("Workload", "workloads", None);
const REST_CONVERT: Kind = ("RestConvert", "restconverts", Some("Convert"));
const REST_REFUSE: Kind = ("RestRefuse", "restrefuses", Some("Refuse"));

const PLAN_NS: &str = "plan";
const REST_NS: &str = "rest";
const ROOT: &str = "stack";
const CONVERT_FINALIZER: &str = "cascade-guard.dev/foreground-cascade";
/// Creates in flight at once: fast, without swamping two cores.
const CREATES_AT_ONCE: usize = 16;
/// The pure graph is timed at least this often and this long.
const GRAPH_ITERATIONS: usize = 200;
const GRAPH_MIN_TIME: Duration = Duration::from_secs(3);

fn res((kind, plural, _): Kind) -> ApiResource {
    resource(kind, plural)
}

fn env_number(name: &str, default: u64) -> Result<u64> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .with_context(|| format!("{name}={v} is not a number")),
        Err(_) => Ok(default),
    }
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

#[tokio::main]
async fn main() -> Result<()> {
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    if only.is_empty() || only == "plan" {
        plan_part().await?;
    }
    if only.is_empty() || only == "rest" {
        rest_part().await?;
    }
    Ok(())
}

/// A control plane serving `kinds` (every one as an XR kind whose spec keeps
/// any field), an XRD object for the protected ones, and namespace `ns`.
async fn start_plane(kinds: &[Kind], ns: &str) -> Result<(ControlPlane, Client)> {
    let xrds: Vec<Value> = kinds
        .iter()
        .map(|(kind, plural, mode)| {
            json!({
                "apiVersion": "apiextensions.crossplane.io/v2",
                "kind": "CompositeResourceDefinition",
                "metadata": {"name": format!("{plural}.{GROUP}"),
                    "annotations": mode.map(|m| json!({"cascade-guard.dev/deletion-policy": m}))},
                "spec": {"group": GROUP, "names": {"kind": kind, "plural": plural}, "scope": "Namespaced",
                    "versions": [{"name": "v1", "served": true, "referenceable": true,
                        "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {
                            "type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}
            })
        })
        .collect();
    cascade_guard_bench::start_plane(&xrds, &[ns]).await
}

/// `cascade-guard run` as the admin, with `--sibling-order` as given
/// (cascade_guard_bench::start_controller takes no extra flags).
fn start_controller(cp: &ControlPlane, sibling_order: &str) -> Result<Process> {
    let args = [
        "run".to_string(),
        format!("--kubeconfig={}", cp.kubeconfig_path().display()),
        "--no-leader-election".into(),
        "--http-address=127.0.0.1:0".into(),
        "--controller-user=admin".into(),
        format!("--sibling-order={sibling_order}"),
    ];
    let name = format!("cascade-guard-{sibling_order}");
    Ok(process::spawn(
        &name,
        &controller_binary()?,
        &args,
        &cp.log_path(&name),
        Lifetime::Owned,
    )?)
}

/// An object to create: its kind, name, spec (Null for none), annotations,
/// and what it composes (listed in its resourceRefs, each owned by it).
struct Obj {
    resource: ApiResource,
    name: String,
    spec: Value,
    annotations: BTreeMap<&'static str, String>,
    children: Vec<Obj>,
}

impl Obj {
    fn new(resource: ApiResource, name: impl Into<String>) -> Self {
        Self {
            resource,
            name: name.into(),
            spec: Value::Null,
            annotations: BTreeMap::new(),
            children: Vec::new(),
        }
    }

    fn spec(mut self, spec: Value) -> Self {
        self.spec = spec;
        self
    }

    fn annotate(mut self, key: &'static str, value: impl Into<String>) -> Self {
        self.annotations.insert(key, value.into());
        self
    }

    fn compose(mut self, children: impl IntoIterator<Item = Obj>) -> Self {
        self.children.extend(children);
        self
    }

    fn count(&self) -> usize {
        1 + self.children.iter().map(Obj::count).sum::<usize>()
    }
}

/// Creates `obj` owned by `owner` (an ownerReference), then what it
/// composes, owned by it; at most `limit`'s permits of creates in flight.
/// Boxed: it recurses.
fn create<'a>(
    client: &'a Client,
    ns: &'a str,
    obj: &'a Obj,
    owner: Option<Value>,
    limit: &'a Semaphore,
) -> BoxFuture<'a, Result<()>> {
    async move {
        let r = &obj.resource;
        let mut body = json!({"apiVersion": r.api_version, "kind": r.kind,
            "metadata": {"name": obj.name, "annotations": obj.annotations}});
        if let Some(owner) = owner {
            body["metadata"]["ownerReferences"] = json!([owner]);
        }
        let mut spec = obj.spec.clone();
        if !obj.children.is_empty() {
            let refs: Vec<Value> = obj
                .children
                .iter()
                .map(|c| json!({"apiVersion": c.resource.api_version, "kind": c.resource.kind, "name": c.name}))
                .collect();
            spec["crossplane"] = json!({"resourceRefs": refs});
        }
        if !spec.is_null() {
            body["spec"] = spec;
        }
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, r);
        let created = {
            let _permit = limit.acquire().await?;
            api.create(&PostParams::default(), &serde_json::from_value(body)?)
                .await
                .with_context(|| format!("creating {} {}", r.kind, obj.name))?
        };
        let me = json!({"apiVersion": r.api_version, "kind": r.kind, "name": obj.name,
            "uid": created.uid().context("a created object has no uid")?,
            "controller": true, "blockOwnerDeletion": true});
        futures::future::try_join_all(
            obj.children
                .iter()
                .map(|c| create(client, ns, c, Some(me.clone()), limit)),
        )
        .await?;
        Ok(())
    }
    .boxed()
}

async fn create_all(client: &Client, ns: &str, roots: &[Obj]) -> Result<Duration> {
    let started = Instant::now();
    let limit = Semaphore::new(CREATES_AT_ONCE);
    futures::future::try_join_all(roots.iter().map(|o| create(client, ns, o, None, &limit)))
        .await?;
    Ok(started.elapsed())
}

/// The plan tree, 200 objects with 4 layers (49 objects a layer;
/// BENCH_PLAN_LAYERS, 100 for 4,904): root `stack` (Convert) composes 3
/// ConfigMaps and the layers; each layer composes an infra part (a Cluster writing the
/// kubeconfig Secret its ProviderConfig reads, and ConfigMaps) and 3 app
/// parts (Workloads using that ProviderConfig, one the layer before's,
/// Secrets, and ConfigMaps needing them by composition resource name or by
/// name; a Workload of each app part after the first needs a ConfigMap of
/// the part before). So edges are lifted at every level: between leaves of
/// a part, between parts, and between layers.
fn plan_tree(layers_wanted: usize) -> Obj {
    let cm = || ApiResource::erase::<ConfigMap>(&());
    let secret = || ApiResource::erase::<Secret>(&());
    let pc = |layer: usize| format!("l{layer}-pc");
    let mut layers = Vec::new();
    for l in 0..layers_wanted {
        let kubeconfig = format!("l{l}-kubeconfig");
        let mut infra = vec![
            Obj::new(res(CLUSTER), format!("l{l}-cluster"))
                .spec(json!({"writeConnectionSecretToRef": {"name": kubeconfig}})),
            Obj::new(secret(), kubeconfig.clone()),
            Obj::new(res(PROVIDER_CONFIG), pc(l)).spec(json!({"credentials": {
                "source": "Secret", "secretRef": {"name": kubeconfig, "key": "kubeconfig"}}})),
        ];
        infra.extend((0..8).map(|k| Obj::new(cm(), format!("l{l}-p0-cm{k}"))));
        let mut parts = vec![Obj::new(res(PART), format!("l{l}-p0")).compose(infra)];
        for p in 1..4 {
            let part = format!("l{l}-p{p}");
            let mut leaves = Vec::new();
            for w in 0..4 {
                let config = if w == 3 && l > 0 { pc(l - 1) } else { pc(l) };
                let o = Obj::new(res(WORKLOAD), format!("{part}-w{w}"))
                    .spec(json!({"providerConfigRef": {"name": config, "kind": "ProviderConfig"}}));
                leaves.push(match w {
                    0 if p > 1 => {
                        o.annotate(NEEDS_ANNOTATION, format!("ConfigMap/l{l}-p{}-cm0", p - 1))
                    }
                    2 => o.annotate(NEEDS_ANNOTATION, "secret-0"),
                    _ => o,
                });
            }
            for s in 0..3 {
                leaves.push(
                    Obj::new(secret(), format!("{part}-s{s}"))
                        .annotate(COMPOSITION_RESOURCE_NAME_ANNOTATION, format!("secret-{s}")),
                );
            }
            for c in 0..4 {
                let o = Obj::new(cm(), format!("{part}-cm{c}"));
                leaves.push(match c {
                    0 | 1 => o.annotate(NEEDS_ANNOTATION, format!("secret-{c}")),
                    2 => o.annotate(NEEDS_ANNOTATION, format!("Secret/{part}-s2")),
                    _ => o,
                });
            }
            parts.push(Obj::new(res(PART), part).compose(leaves));
        }
        layers.push(Obj::new(res(LAYER), format!("l{l}")).compose(parts));
    }
    Obj::new(res(PLAN_ROOT), ROOT)
        .compose((0..3).map(|k| Obj::new(cm(), format!("{ROOT}-cm{k}"))))
        .compose(layers)
}

/// Objects of `kinds` in `ns` that sibling order holds (its ConfigMap, in
/// `default`: the controller runs outside a pod).
async fn labelled(client: &Client, ns: &str, kinds: &[ApiResource]) -> Result<usize> {
    let held = cascade_guard::cluster::holds::read(client, "default").await?;
    Ok(held
        .iter()
        .filter(|(o, _)| {
            o.namespace.as_deref() == Some(ns)
                && kinds.iter().any(|k| k.kind == o.kind && k.group == o.group)
        })
        .count())
}

/// Polls `count` until it reaches `want`, or fails after `within`.
async fn wait_for<F, Fut>(what: &str, want: usize, within: Duration, mut count: F) -> Result<f64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<usize>>,
{
    let started = Instant::now();
    loop {
        let n = count().await?;
        if n >= want {
            return Ok(started.elapsed().as_secs_f64());
        }
        if started.elapsed() > within {
            bail!("{what}: {n} of {want} after {} s", within.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Wall times (ms, sorted) of `runs` runs of the plan binary, after one
/// unmeasured run (it warms the page cache); and the last run's output.
async fn time_plan_binary(cp: &ControlPlane, runs: u64) -> Result<(Vec<f64>, Value)> {
    let binary = controller_binary()?;
    let kubeconfig = cp.kubeconfig_path();
    let (resource, ns) = (format!("{}.{GROUP}", PLAN_ROOT.1), PLAN_NS);
    let mut times = Vec::new();
    let mut last = Value::Null;
    for run in 0..=runs {
        let started = Instant::now();
        let out = tokio::process::Command::new(&binary)
            .arg("plan")
            .args([resource.as_str(), ROOT, "-n", ns, "-o", "json"])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .output()
            .await
            .context("running cascade-guard plan")?;
        let took = started.elapsed().as_secs_f64() * 1000.0;
        // 3: the plan names hazards; the JSON is still printed.
        if !matches!(out.status.code(), Some(0 | 3)) {
            bail!(
                "cascade-guard plan failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        if run > 0 {
            times.push(took);
        }
        last = serde_json::from_slice(&out.stdout).context("plan -o json is not JSON")?;
    }
    times.sort_by(f64::total_cmp);
    Ok((times, last))
}

fn min_median_max(sorted_ms: &[f64]) -> String {
    format!(
        "min {:.0} ms, median {:.0} ms, max {:.0} ms",
        sorted_ms.first().copied().unwrap_or_default(),
        percentile(sorted_ms, 50.0),
        sorted_ms.last().copied().unwrap_or_default()
    )
}

fn len_at(v: &Value, pointer: &str) -> usize {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
}

async fn plan_part() -> Result<()> {
    let runs = env_number("BENCH_PLAN_RUNS", 10)?;
    let kinds = [PLAN_ROOT, LAYER, PART, CLUSTER, PROVIDER_CONFIG, WORKLOAD];
    let (cp, admin) = start_plane(&kinds, PLAN_NS).await?;
    let layers = usize::try_from(env_number("BENCH_PLAN_LAYERS", 4)?)?;
    let tree = plan_tree(layers);
    let took = create_all(&admin, PLAN_NS, std::slice::from_ref(&tree)).await?;
    println!(
        "1. plan on a tree of {} objects (created in {:.1} s)",
        tree.count(),
        took.as_secs_f64()
    );

    // The objects as plan reads them, for the expected holds and the pure
    // graph.
    let served = ServedKinds::discover(&admin).await?;
    let root = Api::<DynamicObject>::namespaced_with(admin.clone(), PLAN_NS, &res(PLAN_ROOT))
        .get(ROOT)
        .await?;
    let root_uid = root.uid().context("the root has no uid")?;
    let listed = Listed::list(&admin, &served).await;
    let read = read_tree(&admin, &served, &root, &listed, &Default::default()).await;
    if !read.unread.is_empty() {
        bail!("the tree was not read whole: {:?}", read.unread);
    }
    let graph = graph::graph(&read.objects, &root_uid)?;
    // As the controller decides: a managed resource's ProviderConfigUsage
    // whose kind is not served (none is here: 1,200 of the 2,699 at 100
    // layers) is never held, and was waited for in vain.
    let unserved_usage = |o: &ObjectRef| {
        o.kind == provider_config_usage::KIND
            && served.of_kind(Some(&o.group), &o.kind).next().is_none()
    };
    let holds = hold::actions(&graph, &hold::Held::new(), &BTreeSet::new())
        .iter()
        .filter(|a| matches!(a, hold::Action::Hold { object, .. } if !unserved_usage(object)))
        .count();
    println!(
        "   graph: {} objects in the tree, {} edges, {} needs, {} sibling edges, {} waves, {} cycles, {} problems; {holds} objects to hold",
        graph.nodes.iter().filter(|n| n.in_tree).count(),
        graph.edges.len(),
        graph.needs.len(),
        graph.sibling_edges.len(),
        graph.waves.len(),
        graph.cycles.len(),
        graph.problems.len()
    );

    let mut controller = start_controller(&cp, "enforce")?;
    let mut all_kinds: Vec<ApiResource> = kinds.iter().map(|k| res(*k)).collect();
    all_kinds.push(ApiResource::erase::<ConfigMap>(&()));
    all_kinds.push(ApiResource::erase::<Secret>(&()));
    match wait_for("labelled", holds, Duration::from_secs(120), || {
        labelled(&admin, PLAN_NS, &all_kinds)
    })
    .await
    {
        Ok(secs) => println!("   the controller (enforce) labelled the {holds} in {secs:.1} s"),
        // Plan is measured all the same (it then says the tree is not
        // ordered).
        Err(e) => println!("   the controller (enforce) did not hold them all: {e}"),
    }
    // Its loop re-reads this tree every tick while it is young (two
    // minutes): measure plan beside that, then alone.
    tokio::time::sleep(Duration::from_secs(5)).await;
    println!("   load {}", load());
    let (busy, out) = time_plan_binary(&cp, runs).await?;
    println!(
        "   cascade-guard plan -o json, wall time, {runs} runs, controller running (enforce): {}",
        min_median_max(&busy)
    );
    controller.stop(Duration::from_secs(10));
    let (alone, _) = time_plan_binary(&cp, runs).await?;
    println!(
        "   the same, controller stopped (hold policy and labels left): {}",
        min_median_max(&alone)
    );
    println!(
        "   its output: sibling order {}, teardown {}, {} nodes, {} sibling edges, {} waves, {} hazards, {} unread",
        out["siblingOrder"],
        out["teardown"],
        len_at(&out, "/graph/nodes"),
        len_at(&out, "/graph/siblingEdges"),
        len_at(&out, "/graph/waves"),
        len_at(&out, "/hazards"),
        len_at(&out, "/unread")
    );

    // In-process, without the process start, kubeconfig and TLS set-up.
    let options = PlanOptions {
        resource: format!("{}.{GROUP}", PLAN_ROOT.1),
        name: ROOT.into(),
        namespace: PLAN_NS.into(),
        mode: None,
        xrd_default_mode: Some(Mode::Refuse),
        leader_election_id: "cascade-guard".into(),
    };
    let mut in_process = Vec::new();
    let mut reads = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        plan_cli::plan(&admin, &options).await?;
        in_process.push(started.elapsed().as_secs_f64() * 1000.0);
        let started = Instant::now();
        let listed = Listed::list(&admin, &served).await;
        read_tree(&admin, &served, &root, &listed, &Default::default()).await;
        reads.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    in_process.sort_by(f64::total_cmp);
    reads.sort_by(f64::total_cmp);
    println!(
        "   in-process plan::plan (discovery, policies, tree, graph): {}",
        min_median_max(&in_process)
    );
    println!(
        "   in-process read_tree alone:                                 {}",
        min_median_max(&reads)
    );

    let teardown = plan_cli::teardown_of(Mode::Convert, true);
    let mut per_call = Vec::new();
    let started = Instant::now();
    while per_call.len() < GRAPH_ITERATIONS || started.elapsed() < GRAPH_MIN_TIME {
        let call = Instant::now();
        let g = graph::graph(&read.objects, &root_uid)?;
        std::hint::black_box(g.hazards(teardown));
        per_call.push(call.elapsed().as_secs_f64() * 1e6);
    }
    per_call.sort_by(f64::total_cmp);
    println!(
        "   pure graph::graph + hazards({teardown:?}) on the {} objects read, {} calls: median {:.0} µs, p99 {:.0} µs, min {:.0} µs",
        read.objects.len(),
        per_call.len(),
        percentile(&per_call, 50.0),
        percentile(&per_call, 99.0),
        per_call.first().copied().unwrap_or_default()
    );
    Ok(())
}

/// Tree `t-<i>`: a root of a Convert (even i) or Refuse kind composing
/// ConfigMaps `t-<i>-0..2`; `-0` needs `-1`.
fn small_tree(i: u64) -> Obj {
    let kind = if i.is_multiple_of(2) {
        REST_CONVERT
    } else {
        REST_REFUSE
    };
    let name = format!("t-{i}");
    let cm = ApiResource::erase::<ConfigMap>(&());
    let maps = (0..3).map(|c| {
        let o = Obj::new(cm.clone(), format!("{name}-{c}"));
        if c == 0 {
            o.annotate(NEEDS_ANNOTATION, format!("ConfigMap/{name}-1"))
        } else {
            o
        }
    });
    Obj::new(res(kind), name.clone()).compose(maps)
}

/// sibling_order.rs's SETTLING_SECS: a tree younger than this is read every
/// tick, an older one at rest only when its root changes and every resync.
/// The enforce window starts once every tree is older, plus a round of reads.
const SETTLING: Duration = Duration::from_secs(120);

/// USER_HZ: the unit of /proc/PID/stat's CPU times.
const TICKS_PER_SECOND: f64 = 100.0;

/// (VmRSS in KiB, utime + stime in seconds) of `pid`, from /proc.
fn usage(pid: u32) -> Result<(u64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS")?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // After the command name (which may hold spaces), utime and stime are
    // the 12th and 13th fields.
    let fields: Vec<u64> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or_default()
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse().ok())
        .collect();
    Ok((rss, fields.iter().sum::<u64>() as f64 / TICKS_PER_SECOND))
}

/// apiserver_request_total summed by "VERB resource".
async fn request_totals(client: &Client) -> Result<BTreeMap<String, f64>> {
    let text = client
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    let mut totals = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|l| l.strip_prefix(&format!("{name}=\"")))
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or("")
                .to_string()
        };
        let count: f64 = value.trim().parse().unwrap_or(0.0);
        *totals
            .entry(match label("resource") {
                r if r.is_empty() => format!("{} (non-resource)", label("verb")),
                r => format!("{} {r}", label("verb")),
            })
            .or_insert(0.0) += count;
    }
    Ok(totals)
}

/// One mode's figures at rest.
struct Rest {
    rss_kib: u64,
    cpu_seconds: f64,
    /// The CPU seconds of kube-apiserver and etcd over the window: what the
    /// controller's requests cost on the other side.
    server_cpu_seconds: (f64, f64),
    requests: BTreeMap<String, f64>,
}

/// The CPU seconds so far of the control plane's process `name`.
fn component_cpu(cp: &ControlPlane, name: &str) -> Result<f64> {
    let pid = cp
        .state()
        .processes
        .iter()
        .find(|p| p.name == name)
        .map(|p| p.pid)
        .with_context(|| format!("no {name} in the control plane"))?;
    Ok(usage(pid)?.1)
}

/// Lets the controller settle (its last writes and events; for enforce,
/// every tree past [`SETTLING`] and read once more), then measures it over
/// `window` and stops it; with the load average before the window.
async fn settle_and_measure(
    cp: &ControlPlane,
    admin: &Client,
    mut controller: Process,
    not_before: Instant,
    window: Duration,
) -> Result<(String, Rest)> {
    tokio::time::sleep(Duration::from_secs(10)).await;
    tokio::time::sleep_until(not_before.into()).await;
    let load = load();
    let rest = measure_rest(cp, admin, controller.pid, window).await;
    controller.stop(Duration::from_secs(10));
    Ok((load, rest?))
}

async fn measure_rest(
    cp: &ControlPlane,
    admin: &Client,
    pid: u32,
    window: Duration,
) -> Result<Rest> {
    let server = || -> Result<(f64, f64)> {
        Ok((
            component_cpu(cp, "kube-apiserver")?,
            component_cpu(cp, "etcd")?,
        ))
    };
    let before = request_totals(admin).await?;
    let (_, cpu_before) = usage(pid)?;
    let server_before = server()?;
    tokio::time::sleep(window).await;
    let (rss_kib, cpu_after) = usage(pid)?;
    let server_after = server()?;
    let after = request_totals(admin).await?;
    let requests = after
        .into_iter()
        .map(|(k, v)| {
            let d = v - before.get(&k).copied().unwrap_or(0.0);
            (k, d)
        })
        .filter(|(_, d)| *d > 0.0)
        .collect();
    Ok(Rest {
        rss_kib,
        cpu_seconds: cpu_after - cpu_before,
        server_cpu_seconds: (
            server_after.0 - server_before.0,
            server_after.1 - server_before.1,
        ),
        requests,
    })
}

fn print_rest(mode: &str, rest: &Rest, window: Duration) {
    let secs = window.as_secs_f64();
    let total: f64 = rest.requests.values().sum();
    println!(
        "   --sibling-order {mode:<7}  RSS {:.1} MiB, CPU {:.2} s over {secs:.0} s ({:.1}% of a core), API server {:.1} requests/s",
        rest.rss_kib as f64 / 1024.0,
        rest.cpu_seconds,
        rest.cpu_seconds / secs * 100.0,
        total / secs
    );
    let mut by_rate: Vec<(&String, &f64)> = rest.requests.iter().collect();
    by_rate.sort_by(|a, b| b.1.total_cmp(a.1));
    let top: Vec<String> = by_rate
        .iter()
        .take(6)
        .map(|(k, v)| format!("{k} {:.1}/s", *v / secs))
        .collect();
    println!("      most requested: {}", top.join(", "));
    let (apiserver, etcd) = rest.server_cpu_seconds;
    println!(
        "      kube-apiserver CPU {apiserver:.2} s ({:.1}% of a core), etcd {etcd:.2} s ({:.1}%)",
        apiserver / secs * 100.0,
        etcd / secs * 100.0
    );
}

async fn rest_part() -> Result<()> {
    let trees = env_number("BENCH_TREES", 1000)?;
    let window = Duration::from_secs(env_number("BENCH_REST_SECONDS", 60)?);
    let (cp, admin) = start_plane(&[REST_CONVERT, REST_REFUSE], REST_NS).await?;
    let roots: Vec<Obj> = (0..trees).map(small_tree).collect();
    let objects: usize = roots.iter().map(Obj::count).sum();
    let took = create_all(&admin, REST_NS, &roots).await?;
    let settled = Instant::now() + SETTLING + Duration::from_secs(20);
    println!(
        "\n2. The controller at rest with {trees} trees ({objects} objects, half Convert, half Refuse, one needs edge each; created in {:.0} s)",
        took.as_secs_f64()
    );

    // Off first: nothing labelled yet. Settled when every Convert root
    // carries the finalizer.
    let converts =
        Api::<DynamicObject>::namespaced_with(admin.clone(), REST_NS, &res(REST_CONVERT));
    let off = start_controller(&cp, "off")?;
    let want = trees.div_ceil(2) as usize;
    let secs = wait_for("held", want, Duration::from_secs(600), || async {
        Ok(converts
            .list_metadata(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|o| o.finalizers().iter().any(|f| f == CONVERT_FINALIZER))
            .count())
    })
    .await?;
    println!("   off: every Convert root held after {secs:.1} s");
    let (load_off, rest_off) = settle_and_measure(&cp, &admin, off, Instant::now(), window).await?;

    let enforce = start_controller(&cp, "enforce")?;
    let maps = [ApiResource::erase::<ConfigMap>(&())];
    let secs = wait_for("labelled", trees as usize, Duration::from_secs(600), || {
        labelled(&admin, REST_NS, &maps)
    })
    .await?;
    println!(
        "   enforce: every needed ConfigMap labelled after {secs:.1} s; measured once every tree is older than {} s",
        SETTLING.as_secs()
    );
    let (load_enforce, rest_enforce) =
        settle_and_measure(&cp, &admin, enforce, settled, window).await?;

    print_rest("off", &rest_off, window);
    println!("      load before the window: {load_off}");
    print_rest("enforce", &rest_enforce, window);
    println!("      load before the window: {load_enforce}");
    Ok(())
}
