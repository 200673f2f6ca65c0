//! The seed's failure (docs/deletion-semantics.md §7) on real
//! Crossplane, and cascade-guard preventing it: Crossplane core,
//! function-patch-and-transform, provider-helm and provider-kubernetes as
//! built by `testbed/crossplane/build.sh`, a local cloud whose clusters are real
//! control planes, Modelplane's real XRDs and the project's Compositions
//! (`testbed/crossplane/modelplane/`, `local_cluster::real_crossplane::modelplane`).
//!
//! The InferenceCluster scenario, in each mode: Off, a plain `kubectl delete`
//! reproduces the failure (the XR gone at once, the cloud cluster deleted while
//! the gateway's load balancer and maybe the releases still uninstall, which
//! then wedge on their provider's finalizer and leak the load balancer);
//! Refuse, the plain delete is refused with its message and
//! `--cascade=foreground` tears down in order; Convert, the plain delete tears
//! down in order.
//!
//! The tests run concurrently on one stack. The mode is an annotation on the
//! XRDs, which applies to every object of a kind, so the platform is installed
//! once per mode, each copy under API groups of its own (`off.modelplane.ai`,
//! `infrastructure.refuse.modelplane.ai`, ...: `modelplane::Platform`), and
//! each test builds its tree on its mode's copy. Copies share the cloud and
//! the providers, so every test names its trees (and so everything in them)
//! differently. Only the randomized test, which kills Crossplane core, the
//! providers and cascade-guard and restarts kube-apiserver, has the stack
//! to itself (see `Stack::fault_window`): it builds its trees beside the
//! others and kills once every other test is done. cargo runs as many tests
//! at once as there are cores unless told otherwise: `--test-threads=16` has
//! most of them at once (scripts/run-test-binaries.sh passes it); all 31 at
//! once loaded two cores so that cascade-guard's replicas lost their Leases
//! again and again.
//!
//! And a legacy XRD with a claim, in each mode (its own XRD per mode, so
//! concurrently): deleting the claim ends with everything gone (in order,
//! except under Off); under Refuse the plain delete is refused at the claim
//! (Crossplane would delete the XR with no propagationPolicy, for the default
//! `compositeDeletePolicy: Background`), with the commands that work, which
//! the test runs. And under Convert, the deletion of a team's namespace
//! holding a claim: everything gone, the composed ConfigMap before the XR.
//!
//! Crossplane's own deletes are never refused: in the trees above (its
//! replayed deletes carry the refused attempt's Foreground), and a nested XR
//! dropped from its parent's Composition under Refuse and Convert (Crossplane
//! deletes it with Foreground and a UID precondition; it goes after its
//! ConfigMap).
//!
//! The seed's scenarios 2 and 3 in each mode: a ModelDeployment (in a team's
//! namespace) and an InferenceGateway running on an InferenceCluster, each
//! with a guard (a Usage of the cluster's EKSCluster by its ModelReplica or
//! its ServingStack), and the InferenceCluster deleted while they go away.
//! Off: the guards let go as soon as the plain deletes remove the
//! ModelReplica, and an engine wedges on a cluster that is gone, its load
//! balancer leaked; Refuse: the plain deletes are refused with their message,
//! foreground ones tear down in order; Convert: the plain deletes tear down
//! in order. The deletion of a namespace holding a ModelDeployment, under
//! Convert, tears down in order too: on the pinned providers its engine
//! would wedge on crossplane-runtime#1150, and sibling order holds the
//! engine's ProviderConfigUsage until its provider is done (see the test).
//!
//! A Background delete that a Usage held, recorded under Warn and replayed by
//! Crossplane under Refuse: refused, nothing stuck, the refusal with the
//! command that works in Crossplane's log.
//!
//! Then a randomized test: eight trees (CASCADE_GUARD_REAL_TREES for more or
//! fewer), each with or without the seed's Usage (then only sibling order
//! keeps its ServingStack before its EKSCluster), one random mode (Off,
//! Refuse or Convert), a random client and delay for each delete, and zero
//! to three faults at random moments (the leader of cascade-guard's two
//! replicas, Crossplane core, provider-kubernetes or provider-helm
//! SIGKILLed, or kube-apiserver restarted), everything started again after
//! each (CASCADE_GUARD_REAL_ROUNDS runs more rounds). Under Refuse and Convert every
//! tree must go in order with nothing wedged or leaked: every edge its
//! objects state just before the deletes (`support::invariant`, read
//! independently of cascade-guard's own graph) kept, and the hand-picked
//! pairs of `Tree::assert_order`; under Off the broken edges are measured
//! and printed, and the wedged trees cleaned up. CASCADE_GUARD_SEED replays a
//! run. The model's randomized test (tests/api_server/seed.rs) keeps the larger run.
//!
//! Timing that real parts impose (tests/real_crossplane/real_crossplane.rs in local-cluster
//! has the findings): a composed Usage re-checks its user every 30 s, a
//! managed resource deleted within 30 s of its create keeps its finalizer until
//! then, and the gateway's load balancer takes 40 s to delete (the
//! Composition's annotation; an engine's 60 s), longer than the Usage can hold
//! the cluster after a background delete. Off needs those times to show the
//! wedge, and the randomized test keeps them; the Refuse and Convert copies
//! have shorter ones ([`SHORT_LOAD_BALANCER_SECONDS`]).

#[path = "../support/audit_log.rs"]
mod audit_log;
#[path = "../support/install.rs"]
#[allow(dead_code)]
mod chart;
#[path = "seed_real/fault_window.rs"]
mod fault_window;
#[path = "seed_real/guard.rs"]
mod guard;
#[path = "seed_real/scene.rs"]
mod scene;
#[path = "seed_real/shapes.rs"]
mod shapes;
#[path = "seed_real/siblings.rs"]
mod siblings;
#[path = "../support/mod.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Mutex as StdMutex;
use std::time::{Duration, Instant};

use fault_window::FaultWindow;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PropagationPolicy};
use kube::{Api, Client, ResourceExt};
use local_cluster::process::{self, Lifetime, Process};
use local_cluster::real_crossplane::modelplane::{self, SYSTEM_NAMESPACE};
use local_cluster::real_crossplane::{Crossplane, CrossplaneOptions};
use local_cluster::timeline::Timeline;
use local_cluster::{Binaries, ControlPlane, Options, wait};
use serde_json::{Value, json};
use support::invariant;
use tokio::sync::OnceCell;

const POLICY_ANNOTATION: &str = "cascade-guard.dev/deletion-policy";
const HOLD_FINALIZER: &str = "cascade-guard.dev/foreground-cascade";
const MANAGED_FINALIZER: &str = "finalizer.managedresource.crossplane.io";
const IN_USE_LABEL: &str = "crossplane.io/in-use";
/// A tree takes a cloud cluster's start and Crossplane's steps to build.
const BUILD_TIMEOUT: Duration = Duration::from_secs(600);
/// A teardown waits for the Usage's 30 s re-check, the load balancer's 40 s
/// and the creation grace period.
const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(300);
/// The load balancers' deletion time on the Refuse and Convert copies of the
/// platform: their tests assert a teardown in order, which does not depend on
/// it, and each of their teardowns waits it out once or twice. Still longer
/// than the 5 to 8 s a background delete leaves the cloud cluster (the Off
/// runs in BENCHMARKS.md), so a delete that failed to cascade would still
/// lose the cluster first.
const SHORT_LOAD_BALANCER_SECONDS: u32 = 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Off,
    Warn,
    Refuse,
    Convert,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Off => "Off",
            Mode::Warn => "Warn",
            Mode::Refuse => "Refuse",
            Mode::Convert => "Convert",
        }
    }

    /// The copy of the platform whose XRDs carry this mode from the install
    /// on (one of [`PLATFORM_MODES`]): the tests of this mode share it, each
    /// with trees of its own names.
    fn platform(self) -> modelplane::Platform {
        let platform = modelplane::Platform::variant(
            &self.as_str().to_lowercase(),
            json!({ POLICY_ANNOTATION: self.as_str() }),
        );
        match self {
            // Off shows the wedge: a load balancer still deleting when the
            // cloud cluster goes, which takes the Compositions' times.
            Mode::Off => platform,
            _ => platform.with_load_balancer_seconds(SHORT_LOAD_BALANCER_SECONDS),
        }
    }
}

/// The modes with a copy of the platform of their own.
const PLATFORM_MODES: [Mode; 3] = [Mode::Off, Mode::Refuse, Mode::Convert];

/// The randomized test's copy of the platform: it puts a random mode on it
/// each round (it has the stack to itself then), and keeps the Compositions'
/// load balancer times.
fn random_platform() -> modelplane::Platform {
    modelplane::Platform::variant("random", json!({ POLICY_ANNOTATION: "Off" }))
}

struct Stack {
    cp: ControlPlane,
    /// Its processes stop when it is dropped; the random test kills core and
    /// the providers.
    crossplane: StdMutex<Crossplane>,
    kubectl: PathBuf,
    /// cascade-guard's replicas, with leader election (the random test kills
    /// the leader).
    controller: StdMutex<Replicas>,
    /// The kube-apiserver the random test started in place of the control
    /// plane's own, once it has restarted it (`ControlPlane::restart` needs
    /// the control plane mutably, which a stack shared by every test is not).
    apiserver: tokio::sync::Mutex<Option<Process>>,
    /// The randomized test SIGKILLs Crossplane core, a provider and
    /// cascade-guard and restarts kube-apiserver, which every test's objects
    /// need (a build, a refusal, a conversion, a teardown in time): it owns
    /// this while it kills, once every other test, which shares it
    /// throughout ([`shared_stack`]), is done.
    fault_window: FaultWindow,
}

/// How long a leader kill waits for a replica to hold the Lease: a
/// failover takes the lease's 15 s.
const LEADER_WAIT: Duration = Duration::from_secs(20);

/// How many replicas of cascade-guard run: the leader and one candidate, as
/// the chart's HA install (`replicaCount: 2`).
const REPLICAS: usize = 2;

/// cascade-guard's replicas, as a Deployment keeps them: each slot runs one
/// process, started again when it exits (a lost Lease ends a leader) unless a
/// fault holds it down.
struct Replicas {
    /// How many processes were started: each gets a name (and a log, and a
    /// leader-election identity) of its own.
    started: usize,
    slots: Vec<Slot>,
}

struct Slot {
    process: Option<Process>,
    /// Killed by a fault and kept down until it ends.
    held_down: bool,
}

async fn stack() -> &'static Stack {
    static STACK: OnceCell<Stack> = OnceCell::const_new();
    static SUPERVISED: std::sync::Once = std::sync::Once::new();
    let stack = STACK.get_or_init(start).await;
    // As the Deployment would: a replica that exits on its own (its Lease
    // lost when a loaded machine delays a renewal) is started again, for
    // every test, not only during the random round. A thread, not a task:
    // each test has a runtime of its own, and the stack outlives them all.
    SUPERVISED.call_once(|| {
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_secs(2));
                let started = stack.start_replicas(false);
                if !started.is_empty() {
                    eprintln!("cascade-guard replicas that exited started again: {started:?}");
                }
            }
        });
    });
    stack
}

/// The stack, and a share of it that keeps the randomized test's kills away
/// until the caller's test ends.
async fn shared_stack() -> (&'static Stack, Shared) {
    let clock = TestClock::start();
    let stack = stack().await;
    let guard = stack.fault_window.share().await;
    (
        stack,
        Shared {
            _guard: guard,
            _clock: clock,
        },
    )
}

/// A test's hold on the shared stack (see [`shared_stack`]), timed.
struct Shared {
    _guard: fault_window::Sharing,
    _clock: TestClock,
}

/// When a test started and ended, in seconds from the binary's first test:
/// appended as `test<TAB>start<TAB>end` to the file named by
/// `SEED_REAL_TIMES`, if set (scripts/run-test-binaries.sh sets it), so that
/// the binary's critical path can be read after a run.
struct TestClock {
    test: String,
    started: Instant,
}

impl TestClock {
    fn epoch() -> Instant {
        static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *EPOCH.get_or_init(Instant::now)
    }

    fn start() -> Self {
        Self::part("")
    }

    /// A part of the test, named after it: `what` is added to its name.
    fn part(what: &str) -> Self {
        Self::epoch();
        Self {
            test: format!("{}{what}", std::thread::current().name().unwrap_or("?")),
            started: Instant::now(),
        }
    }
}

impl Drop for TestClock {
    fn drop(&mut self) {
        let Some(path) = std::env::var_os("SEED_REAL_TIMES") else {
            return;
        };
        let epoch = Self::epoch();
        let line = format!(
            "{}\t{:.0}\t{:.0}{}\n",
            self.test,
            self.started.duration_since(epoch).as_secs_f64(),
            epoch.elapsed().as_secs_f64(),
            if std::thread::panicking() {
                "\tfailed"
            } else {
                ""
            },
        );
        use std::io::Write;
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            eprintln!("cannot record the test's time in {path:?}: {e}");
        }
    }
}

async fn start() -> Stack {
    local_cluster::testing::init_tracing();
    let cp = ControlPlane::start(Options {
        crds: cascade_guard::api::crds(),
        ..Options::default()
    })
    .await
    .unwrap_or_else(|e| panic!("cannot start the control plane: {e}"));
    let crossplane = Crossplane::start(&cp, CrossplaneOptions::default())
        .await
        .unwrap_or_else(|e| panic!("cannot start Crossplane: {e}"));
    eprintln!("real Crossplane started in {:?}", crossplane.started_in());
    let client = cp.admin().await.expect("admin client");
    let platforms: Vec<modelplane::Platform> = PLATFORM_MODES
        .iter()
        .map(|m| m.platform())
        .chain([random_platform()])
        .collect();
    let installs = platforms.iter().enumerate().map(|(i, platform)| {
        let (client, crossplane) = (&client, &crossplane);
        // Each install packs the charts: a directory of its own.
        let scratch = cp.dir().join("charts").join(i.to_string());
        async move {
            modelplane::install(client, crossplane, &scratch, platform)
                .await
                .unwrap_or_else(|e| panic!("cannot install the platform {platform:?}: {e}"))
        }
    });
    futures::future::join_all(installs).await;
    as_installed(&cp, &client).await;
    let slots = (0..REPLICAS)
        .map(|n| Slot {
            process: Some(spawn_controller(&cp, n)),
            held_down: false,
        })
        .collect();
    let kubectl = Binaries::locate().expect("binaries").kubectl;
    Stack {
        cp,
        crossplane: StdMutex::new(crossplane),
        kubectl,
        controller: StdMutex::new(Replicas {
            started: REPLICAS,
            slots,
        }),
        apiserver: tokio::sync::Mutex::new(None),
        fault_window: FaultWindow::default(),
    }
}

/// The values a platform team sets, as the README and values.yaml say:
/// `protectedGroups` the XR groups (here every copy's, and the test kinds'),
/// `composedResources` the providers' groups, read-only.
fn chart_values() -> String {
    let mut groups = Vec::new();
    for variant in ["off", "refuse", "convert", "random"] {
        groups.push(format!("{variant}.modelplane.ai"));
        groups.push(format!("infrastructure.{variant}.modelplane.ai"));
    }
    for mode in ["off", "warn", "refuse", "convert"] {
        groups.push(format!("{mode}.fleet.local-cluster.dev"));
    }
    groups.push(CLAIM_GROUP.to_string());
    groups.push(DROP_GROUP.to_string());
    format!(
        "protectedGroups: [{}]\ncomposedResources:\n  - apiGroups: [helm.m.crossplane.io, kubernetes.m.crossplane.io, cloud.local-cluster.dev, helm.crossplane.io, kubernetes.crossplane.io]\n    resources: [\"*\"]\n",
        groups.join(", ")
    )
}

/// cascade-guard as a platform team installs it: the chart's RBAC, rendered
/// by the pinned Helm with [`chart_values`], applied, and a kubeconfig that
/// acts as its ServiceAccount (with the groups a token gives it; never
/// `system:masters`), which the replicas run with.
async fn as_installed(cp: &ControlPlane, client: &Client) {
    const RBAC: [&str; 5] = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ];
    let docs = chart::render(&chart_values());
    let rbac: Vec<Value> = docs
        .iter()
        .filter(|d| RBAC.iter().any(|k| d["kind"] == *k))
        .cloned()
        .collect();
    chart::apply(client, &rbac, &[]).await;
    let (user, groups) = chart::service_account_identity(&docs);
    assert_eq!(user, support::CONTROLLER_USER, "the chart's ServiceAccount");
    let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
    cp.write_kubeconfig_as(&cp.dir().join("cascade-guard.kubeconfig"), &user, &groups)
        .expect("controller kubeconfig");
}

/// The Lease cascade-guard's replicas contend for: the chart's release
/// namespace, where its Role lets it keep the Lease and sibling order's
/// ConfigMaps.
const LEASE_NAMESPACE: &str = chart::NAMESPACE;
const LEASE_NAME: &str = "cascade-guard";

/// Starts `cascade-guard run` number `n`, a replica with leader election
/// whose identity is its process name (`POD_NAME`, as the chart sets it).
fn spawn_controller(cp: &ControlPlane, n: usize) -> Process {
    let name = format!("cascade-guard-{n}");
    let args = vec![
        "run".to_string(),
        format!(
            "--kubeconfig={}",
            cp.dir().join("cascade-guard.kubeconfig").display()
        ),
        "--xrd-default-mode=Off".to_string(),
        "--resync-seconds=20".to_string(),
        "--http-address=127.0.0.1:0".to_string(),
        format!("--leader-election-namespace={LEASE_NAMESPACE}"),
        format!("--leader-election-id={LEASE_NAME}"),
        // The gate on unordered deletes (the product's default) is shown by
        // tests/api_server/order_gate.rs and the chart's tests: here, under
        // CI's load, a look at 17 new trees once took 220 s, and these tests
        // delete trees a minute or two after making them.
        "--unordered-deletes=allow".to_string(),
    ];
    process::spawn_with(
        &name,
        std::path::Path::new(env!("CARGO_BIN_EXE_cascade-guard")),
        &args,
        &cp.log_path(&name),
        Lifetime::Owned,
        process::Surroundings {
            env: vec![("POD_NAME".into(), name.clone().into())],
            network_namespace: None,
        },
    )
    .unwrap_or_else(|e| panic!("cannot start {name}: {e}"))
}

fn api(client: &Client, resource: &ApiResource, ns: Option<&str>) -> Api<DynamicObject> {
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    }
}

fn condition<'a>(object: &'a DynamicObject, kind: &str) -> Option<&'a Value> {
    object
        .data
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))
}

fn is_ready(object: &DynamicObject) -> bool {
    condition(object, "Ready").and_then(|c| c.get("status")) == Some(&json!("True"))
}

/// The provider's Synced=False message, once it has reported one.
fn sync_failure(object: &DynamicObject) -> Option<String> {
    let c = condition(object, "Synced")?;
    (c.get("status")? == "False").then(|| {
        c.get("message")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    })
}

/// Each object's state, for failure messages.
async fn states_of(client: &Client, objects: &[(ApiResource, Option<String>, String)]) -> String {
    let mut lines = Vec::new();
    for (r, ns, n) in objects {
        let line = match api(client, r, ns.as_deref()).get_opt(n).await {
            Ok(Some(o)) => format!(
                "{}/{n}: ready={} finalizers={:?} deleting={} synced={:?}",
                r.kind,
                is_ready(&o),
                o.finalizers(),
                o.metadata.deletion_timestamp.is_some(),
                sync_failure(&o)
            ),
            Ok(None) => format!("{}/{n}: gone", r.kind),
            Err(e) => format!("{}/{n}: {e}", r.kind),
        };
        lines.push(line);
    }
    lines.join("\n")
}

/// Which of `objects` still exist.
async fn left_of(
    client: &Client,
    objects: &[(ApiResource, Option<String>, String)],
) -> Vec<String> {
    let mut left = Vec::new();
    for (r, ns, n) in objects {
        match api(client, r, ns.as_deref()).get_opt(n).await {
            Ok(None) => {}
            Ok(Some(_)) => left.push(format!("{}/{n}", r.kind)),
            // Not known to be gone (the API server restarting, say).
            Err(e) => left.push(format!("{}/{n} (cannot tell: {e})", r.kind)),
        }
    }
    left
}

/// One InferenceCluster's tree, watched from before it exists.
struct Tree {
    name: String,
    /// The copy of the platform it is built on.
    platform: modelplane::Platform,
    /// Composed with the seed's hand-written Usage of the EKSCluster by the
    /// ServingStack; without it, only sibling order keeps the two in order.
    usage: bool,
    client: Client,
    timeline: Timeline,
    /// Removals the timeline's watches missed across an API server restart.
    missed: MissedRemovals,
}

/// Removals a tree's timeline missed across an API server restart, found by
/// [`sweep_missed`]: by UID, with kind and name.
type MissedRemovals = StdMutex<BTreeMap<String, (String, String, invariant::Missed)>>;

/// What became of a snapshot's object: `entries`' record, with a removal the
/// watch missed.
fn fate_with_missed(
    entries: &[local_cluster::timeline::Entry],
    uids: &BTreeMap<invariant::ObjectRef, String>,
    missed: &MissedRemovals,
    r: &invariant::ObjectRef,
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
fn gone_within(
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
struct Swept<'a> {
    name: &'a str,
    client: &'a Client,
    timeline: &'a Timeline,
    missed: &'a MissedRemovals,
    /// The kinds, each with its namespace, that its snapshot's objects are of.
    kinds: Vec<(ApiResource, Option<String>)>,
}

impl Tree {
    /// Creates InferenceCluster `name` on `platform` and waits until it is
    /// Ready and its Usage guards the EKSCluster.
    async fn build(stack: &Stack, platform: &modelplane::Platform, name: &str) -> Self {
        Self::build_with(stack, platform, name, true).await
    }

    /// The same tree composed without its Usage; waits until it is Ready and,
    /// when `held`, until cascade-guard holds the EKSCluster for the
    /// ServingStack (sibling order).
    async fn build_without_usage(
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
    async fn wait_sibling_hold(&self) {
        let held = support::wait_sibling_held(
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

    async fn build_with(
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
        let ready = wait::until(BUILD_TIMEOUT, || async {
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
        let in_use = wait::until(Duration::from_secs(60), || async {
            let o = eks.get_opt(name).await.ok().flatten()?;
            (!usage || o.labels().get(IN_USE_LABEL).map(String::as_str) == Some("true"))
                .then_some(())
        })
        .await;
        assert!(in_use.is_some(), "EKSCluster {name} never became in use");
        eprintln!("{name}: the tree was ready in {:?}", started.elapsed());
        tree
    }

    fn objects(&self) -> Vec<(ApiResource, Option<String>, String)> {
        let mut objects = self.platform.tree(&self.name);
        if !self.usage {
            objects.retain(|(r, _, _)| r.kind != "Usage");
        }
        objects
    }

    /// Whether it was composed with the seed's Usage, in words.
    fn shape(&self) -> &'static str {
        if self.usage {
            "with Usage"
        } else {
            "without Usage"
        }
    }

    fn stack_name(&self) -> String {
        format!("{}-serving-stack", self.name)
    }

    /// The managed resources that need the cloud cluster: the releases and
    /// the gateway's Object.
    fn on_the_cluster(&self) -> Vec<(ApiResource, String)> {
        self.objects()
            .into_iter()
            .filter(|(r, _, _)| r.kind == "Release" || r.kind == "Object")
            .map(|(r, _, n)| (r, n))
            .collect()
    }

    /// Each object's state, for failure messages.
    async fn states(&self) -> String {
        states_of(&self.client, &self.objects()).await
    }

    async fn left(&self) -> Vec<String> {
        left_of(&self.client, &self.objects()).await
    }

    async fn wait_all_gone(&self, timeout: Duration) -> bool {
        wait::until(timeout, || async {
            self.left().await.is_empty().then_some(())
        })
        .await
        .is_some()
    }

    /// When it left the API ([`gone_within`]).
    fn gone_within(&self, kind: &str, name: &str) -> (u64, u64) {
        gone_within(&self.timeline, &self.missed, kind, name).unwrap_or_else(|| {
            panic!(
                "{kind}/{name} never seen leaving the API\n{}",
                self.timeline.describe()
            )
        })
    }

    /// The tree as [`sweep_missed`] looks through it: its objects' kinds,
    /// the cloud cluster's kubeconfig Secret and the ProviderConfigUsages.
    fn swept(&self) -> Swept<'_> {
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
    fn assert_order(&self, what: &str) {
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
    fn fate_of(
        &self,
        entries: &[local_cluster::timeline::Entry],
        uids: &BTreeMap<invariant::ObjectRef, String>,
        r: &invariant::ObjectRef,
    ) -> Option<invariant::Fate> {
        fate_with_missed(entries, uids, &self.missed, r)
    }

    /// The tree as it is now, for `support::invariant::edges`: every object
    /// of it, the kubeconfig Secret its cloud Cluster writes (its data left
    /// out) and the ProviderConfigUsages of its managed resources.
    async fn snapshot(&self) -> Vec<Value> {
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

    /// Every edge of the tree's snapshot (`support::invariant::edges`) kept
    /// by its teardown, each object followed by the UID the snapshot read
    /// (after a minute at most for every needer to leave): fails listing
    /// every broken edge and every edge it could not judge, each with its
    /// revisions; returns how many of each verdict.
    async fn assert_every_edge(&self, snapshot: &[Value], what: &str) -> String {
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
    fn measure_edges(&self, snapshot: &[Value]) -> (usize, Vec<String>, String) {
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
    async fn wait_settled(&self) -> bool {
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
        wait::until(TEARDOWN_TIMEOUT, || async {
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
    async fn clean_up_completely(&self) {
        clean_up_completely(&self.client, &self.name, &self.objects()).await;
    }

    /// Waits for the cloud cluster to leave the API.
    async fn wait_cluster_gone(&self, what: &str, started: Instant) {
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
    fn leaked(&self, stack: &Stack) -> Vec<String> {
        modelplane::leaked(&scene::cloud_log(stack), &self.name)
    }

    /// Removes the providers' finalizer from whatever is left, as an operator
    /// does with a wedged resource, and waits for the tree to go.
    async fn clean_up(&self) {
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

impl Stack {
    /// SIGKILLs the replica of cascade-guard that holds the Lease, as the
    /// OOM killer or a node failure would, and keeps it down until
    /// [`Stack::restart_controller`]; returns which it killed. Mid-failover
    /// (the Lease held by a replica that is gone, or by nobody) it waits up
    /// to [`LEADER_WAIT`] for a leader, then kills any running replica.
    async fn kill_leader(&self) -> String {
        let client = self.cp.admin().await.expect("admin client");
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(client, LEASE_NAMESPACE);
        let deadline = Instant::now() + LEADER_WAIT;
        loop {
            let holder = leases
                .get_opt(LEASE_NAME)
                .await
                .ok()
                .flatten()
                .and_then(|l| l.spec?.holder_identity)
                .unwrap_or_default();
            let late = Instant::now() > deadline;
            {
                let mut replicas = self.controller.lock().expect("controller");
                // Only a running one: an exited process's id may be reused.
                let running: Vec<Option<String>> = replicas
                    .slots
                    .iter_mut()
                    .map(|slot| {
                        let p = slot.process.as_mut()?;
                        p.is_running().then(|| p.name.clone())
                    })
                    .collect();
                let leader = running
                    .iter()
                    .position(|n| n.as_deref() == Some(holder.as_str()));
                let any = running.iter().position(Option::is_some);
                let chosen = leader.or(if late { any } else { None });
                if let Some(i) = chosen {
                    let slot = &mut replicas.slots[i];
                    slot.held_down = true;
                    let mut p = slot.process.take().expect("a replica");
                    p.kill();
                    return if leader.is_some() {
                        format!("leader {}", p.name)
                    } else {
                        format!(
                            "{} (no leader after {LEADER_WAIT:?}: Lease held by {holder:?})",
                            p.name
                        )
                    };
                }
                if late {
                    return format!("none running (Lease held by {holder:?})");
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Starts every replica of cascade-guard that is not running (killed,
    /// or exited on a lost Lease) again, as a Deployment would; returns the
    /// names started.
    fn restart_controller(&self) -> Vec<String> {
        self.start_replicas(true)
    }

    /// Starts the replicas that exited on their own (`all`: and those a
    /// fault holds down) again.
    fn start_replicas(&self, all: bool) -> Vec<String> {
        let mut replicas = self.controller.lock().expect("controller");
        let mut started = Vec::new();
        let mut next = replicas.started;
        for slot in replicas.slots.iter_mut() {
            if slot.held_down && !all {
                continue;
            }
            let running = slot.process.as_mut().is_some_and(|p| p.is_running());
            if !running {
                // Reaped before its slot gets a new one.
                drop(slot.process.take());
                let p = spawn_controller(&self.cp, next);
                next += 1;
                started.push(p.name.clone());
                slot.process = Some(p);
            }
            slot.held_down = false;
        }
        replicas.started = next;
        started
    }

    /// SIGKILLs process `name` of the Crossplane stack (core, a provider).
    fn kill_crossplane(&self, name: &str) {
        let mut crossplane = self.crossplane.lock().expect("crossplane");
        crossplane
            .kill(name)
            .unwrap_or_else(|e| panic!("cannot kill {name}: {e}"));
    }

    /// Starts every process of the Crossplane stack that is not running
    /// again; returns their names.
    fn restart_crossplane(&self) -> Vec<String> {
        let mut crossplane = self.crossplane.lock().expect("crossplane");
        crossplane
            .start_all_again()
            .unwrap_or_else(|e| panic!("cannot start Crossplane again: {e}"))
    }

    /// Restarts kube-apiserver as a rolling update or a crashed node would:
    /// SIGTERM (its graceful shutdown), `downtime` stopped, then the same
    /// command line again, until it serves. Stopping and starting run off the
    /// test's runtime, which keeps the round's clocks and watches going.
    async fn restart_apiserver(&self, downtime: Duration) {
        let mut replacement = self.apiserver.lock().await;
        let running = match replacement.take() {
            Some(p) => p,
            // The control plane's own, adopted by its process id: its
            // command line is the one to start again.
            None => {
                let state = self
                    .cp
                    .state()
                    .processes
                    .into_iter()
                    .find(|p| p.name == "kube-apiserver")
                    .expect("the control plane runs a kube-apiserver");
                Process::adopt(state.name, state.pid, state.binary, state.log)
            }
        };
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", running.pid))
            .unwrap_or_else(|e| panic!("the command line of kube-apiserver: {e}"));
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .skip(1)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let (binary, log) = (running.binary.clone(), running.log.clone());
        let stopped = tokio::task::spawn_blocking(move || {
            let mut running = running;
            running.stop(Duration::from_secs(30));
            running
        })
        .await
        .expect("stopping kube-apiserver");
        drop(stopped);
        tokio::time::sleep(downtime).await;
        let started = tokio::task::spawn_blocking(move || {
            process::spawn("kube-apiserver", &binary, &args, &log, Lifetime::Owned)
        })
        .await
        .expect("starting kube-apiserver")
        .unwrap_or_else(|e| panic!("cannot start kube-apiserver again: {e}"));
        *replacement = Some(started);
        let ready = wait::until(Duration::from_secs(120), || async {
            let client = self.cp.admin().await.ok()?;
            let request = http::Request::get("/readyz").body(Vec::new()).ok()?;
            let body = client.request_text(request).await.ok()?;
            (body.trim() == "ok").then_some(())
        })
        .await;
        assert!(
            ready.is_some(),
            "kube-apiserver not ready again after its restart\n{}",
            self.cp.log_tails(30)
        );
    }

    /// Puts `mode` on `platform`'s XRDs. The mode applies to every object of
    /// those kinds: only for a platform no other test uses (the randomized
    /// test's).
    async fn put_mode(&self, platform: &modelplane::Platform, mode: Mode) {
        let client = self.cp.admin().await.expect("admin client");
        let xrds = api(&client, &v2_xrds(), None);
        for r in platform.xr_kinds() {
            let xrd = format!("{}.{}", r.plural, r.group);
            xrds.patch(
                &xrd,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {POLICY_ANNOTATION: mode.as_str()}}}),
                ),
            )
            .await
            .unwrap_or_else(|e| panic!("annotate {xrd}: {e}"));
        }
    }

    /// Waits until `mode`, which `tree`'s platform carries, is in effect for
    /// its InferenceCluster.
    async fn enter(&self, mode: Mode, tree: &Tree) {
        self.wait_in_effect(&tree.platform.inference_clusters(), None, &tree.name, mode)
            .await;
    }

    /// Waits until `mode` is in effect for object `name` of `resource`: held
    /// by cascade-guard (Convert), a Background delete refused (Refuse), or
    /// neither (Off, Warn).
    async fn wait_in_effect(
        &self,
        resource: &ApiResource,
        ns: Option<&str>,
        name: &str,
        mode: Mode,
    ) {
        let client = self.cp.admin().await.expect("admin client");
        let objects = api(&client, resource, ns);
        let dry_run = DeleteParams {
            dry_run: true,
            propagation_policy: Some(PropagationPolicy::Background),
            ..DeleteParams::default()
        };
        let effective = wait::until(Duration::from_secs(60), || async {
            let o = objects.get_opt(name).await.ok().flatten()?;
            let held = o.finalizers().iter().any(|f| f == HOLD_FINALIZER);
            let refused = matches!(
                objects.delete(name, &dry_run).await,
                Err(kube::Error::Api(ref s)) if s.code == 403
            );
            let ok = match mode {
                Mode::Off | Mode::Warn => !held && !refused,
                Mode::Refuse => refused,
                Mode::Convert => held && !refused,
            };
            ok.then_some(())
        })
        .await;
        assert!(
            effective.is_some(),
            "{} never in effect for {} {name}; logs:\n{}",
            mode.as_str(),
            resource.kind,
            self.cp.log_tails(30)
        );
    }

    /// `kubectl delete inferencecluster <tree>`: (succeeded, stderr).
    async fn kubectl_delete(&self, tree: &Tree, foreground: bool) -> (bool, String) {
        self.kubectl_delete_of(
            &tree.platform.inference_clusters(),
            None,
            &tree.name,
            foreground,
        )
        .await
    }

    /// `kubectl delete <resource> <name> [-n <ns>]`: (succeeded, stderr).
    async fn kubectl_delete_of(
        &self,
        resource: &ApiResource,
        ns: Option<&str>,
        name: &str,
        foreground: bool,
    ) -> (bool, String) {
        let target = format!("{}.{}", resource.plural, resource.group);
        let mut args = vec!["delete", target.as_str(), name, "--wait=false"];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        if foreground {
            args.push("--cascade=foreground");
        }
        let out = tokio::process::Command::new(&self.kubectl)
            .args(&args)
            .env("KUBECONFIG", self.cp.kubeconfig_path())
            .output()
            .await
            .expect("kubectl runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// Crossplane's own deletes in the tree were never refused by cascade-guard,
/// and the EKSCluster's delete, refused by the Usage webhook while the
/// ServingStack lived, went through as Foreground afterwards (Crossplane
/// replays the refused attempt's policy, the garbage collector's Foreground).
fn assert_crossplane_never_refused(stack: &Stack, tree: &Tree, what: &str) {
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
        vec![support::CONTROLLER_USER]
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
fn plan(stack: &Stack, platform: &modelplane::Platform, name: &str) -> (Option<i32>, String) {
    plan_of(stack, &platform.inference_clusters(), name)
}

/// `cascade-guard plan <resource> <name>`: its exit code and what it said.
fn plan_of(stack: &Stack, resource: &ApiResource, name: &str) -> (Option<i32>, String) {
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

/// `plan` of `name` once it exits with `code`, tried for two minutes, else
/// its last answer: sibling order is in force for a tree only a look of the
/// controller after its holds are (a kind newly held counts a moment after
/// the hold policy names it), and until then `plan` says so and exits 3.
async fn plan_once_it_exits(
    stack: &Stack,
    resource: &ApiResource,
    name: &str,
    code: i32,
) -> (Option<i32>, String) {
    let planned = wait::until(Duration::from_secs(120), || async {
        let (got, said) = plan_of(stack, resource, name);
        (got == Some(code)).then_some((got, said))
    })
    .await;
    planned.unwrap_or_else(|| plan_of(stack, resource, name))
}

/// The seed's tree without its hand-written Usage (Modelplane #212's
/// shape), under Convert: `plan` shows the order beforehand, and a plain
/// delete tears it down in that order, nothing wedged, nothing leaked.
#[tokio::test]
async fn without_its_usage_the_seed_tree_still_tears_down_in_order_under_convert() {
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
#[tokio::test]
async fn without_its_usage_a_foreground_delete_under_refuse_keeps_the_order() {
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
#[tokio::test]
async fn without_its_usage_a_foreground_cascade_alone_wedges_the_gateway() {
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
fn secrets() -> ApiResource {
    modelplane::resource("", "v1", "Secret", "secrets")
}

/// provider-helm's and provider-kubernetes' ProviderConfigUsages.
/// Waits until sibling order holds the ProviderConfigUsage of the managed
/// resource `name` (of `resource`, in `ns`; the usage is named by its uid):
/// what keeps it from wedging on crossplane-runtime#1150 when its namespace
/// is deleted.
async fn wait_usage_held(
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
    let held = support::wait_sibling_held(
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

fn provider_config_usages() -> [ApiResource; 2] {
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
fn platform_objects(tree: &Tree) -> ApiResource {
    tree.on_the_cluster()
        .into_iter()
        .map(|(r, _)| r)
        .find(|r| r.kind == "Object")
        .expect("the tree has an Object")
}

/// `objects` as they are now, for `support::invariant::edges` (a Secret's
/// data left out), and the ProviderConfigUsages in `usage_namespaces` that
/// any of them owns. `what` names the scenario in a failure.
async fn snapshot_of(
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
const CUTS_A_RUNNING_CASCADE_SHORT: &str = "it is already being deleted with foreground cascading, and this delete would cut that cascade short";

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
fn crossplane_refusals(
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
async fn assert_torn_down_in_order(stack: &Stack, tree: &Tree, what: &str, started: Instant) {
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

#[tokio::test]
async fn without_cascade_guard_a_plain_delete_wedges_the_serving_stack_and_leaks_its_load_balancer()
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
    let retried = wait::until(Duration::from_secs(150), || async {
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

#[tokio::test]
async fn refuse_refuses_the_plain_delete_and_a_foreground_delete_tears_down_in_order() {
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

#[tokio::test]
async fn convert_tears_a_plain_delete_down_in_order() {
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
async fn wait_wedged(
    objects: &Api<DynamicObject>,
    name: &str,
    timeout: Duration,
) -> Option<String> {
    wait::until(timeout, || async {
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
async fn provider_warnings(client: &Client, name: &str) -> i32 {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::all(client.clone());
    let selector = format!("involvedObject.kind=Object,involvedObject.name={name},type=Warning");
    events
        .list(&kube::api::ListParams::default().fields(&selector))
        .await
        .map(|l| l.items.iter().map(|e| e.count.unwrap_or(1)).sum())
        .unwrap_or(0)
}

/// Waits until cascade-guard holds `name` with its finalizer (Convert).
async fn wait_held(objects: &Api<DynamicObject>, name: &str) {
    let held = wait::until(Duration::from_secs(60), || async {
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
async fn when_ready(objects: &Api<DynamicObject>, name: &str, pointer: &str) -> Option<String> {
    wait::until(BUILD_TIMEOUT, || async {
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
async fn wait_generated_crd(client: &Client, name: &str) {
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    let found = wait::until(BUILD_TIMEOUT, || async {
        crds.get_opt(name).await.ok().flatten()
    })
    .await;
    assert!(found.is_some(), "Crossplane never created the CRD {name}");
    wait::crd_established(client, name, BUILD_TIMEOUT)
        .await
        .expect("CRD established");
}

async fn create_namespace(client: &Client, name: &str) {
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(
            &kube::api::PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace"),
        )
        .await;
}

const CLAIM_GROUP: &str = "claims.seed.local-cluster.dev";
const CLAIM_NAMESPACE: &str = "seed-claims";

/// A legacy (`apiextensions.crossplane.io/v1`) XRD `X<prefix><Mode>App` with
/// claim `<prefix><Mode>App`, annotated with `mode`, and a Composition of one
/// ConfigMap in `namespace`.
async fn install_claim_kind(
    client: &Client,
    mode: Mode,
    prefix: &str,
    namespace: &str,
) -> (ApiResource, ApiResource) {
    let kind = format!("{prefix}{}App", mode.as_str());
    let plural = kind.to_lowercase() + "s";
    let xrd = json!({
        "apiVersion": "apiextensions.crossplane.io/v1",
        "kind": "CompositeResourceDefinition",
        "metadata": {
            "name": format!("x{plural}.{CLAIM_GROUP}"),
            "annotations": {POLICY_ANNOTATION: mode.as_str()},
        },
        "spec": {
            "group": CLAIM_GROUP,
            "names": {"kind": format!("X{kind}"), "plural": format!("x{plural}")},
            "claimNames": {"kind": kind, "plural": plural},
            "versions": [{
                "name": "v1", "served": true, "referenceable": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"note": {"type": "string"}}},
                }}},
            }],
        },
    });
    let xrds = modelplane::resource(
        "apiextensions.crossplane.io",
        "v1",
        "CompositeResourceDefinition",
        "compositeresourcedefinitions",
    );
    apply_cluster_object(client, &xrds, xrd).await;
    let config_map = json!({
        "name": "config",
        "base": {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"namespace": namespace}, "data": {"part": "config"}},
        "readinessChecks": [{"type": "None"}],
    });
    apply_cluster_object(
        client,
        &compositions(),
        pt_composition(CLAIM_GROUP, &format!("X{kind}"), vec![config_map]),
    )
    .await;
    for crd in [
        format!("x{plural}.{CLAIM_GROUP}"),
        format!("{plural}.{CLAIM_GROUP}"),
    ] {
        wait_generated_crd(client, &crd).await;
    }
    (
        modelplane::resource(
            CLAIM_GROUP,
            "v1",
            &format!("X{kind}"),
            &format!("x{plural}"),
        ),
        modelplane::resource(CLAIM_GROUP, "v1", &kind, &plural),
    )
}

/// How a claim's tree is deleted.
#[derive(Clone, Copy, PartialEq)]
enum ClaimDelete {
    /// `kubectl delete <claim>`, in the shared claims' namespace.
    Claim,
    /// `kubectl delete namespace <ns>`, of a namespace of its own holding the
    /// claim and the composed ConfigMap: the namespace controller deletes
    /// both with Background propagation.
    Namespace(&'static str),
}

/// Deletes a claim with a plain `kubectl delete` under `mode` (or its
/// namespace): Ok(what was said) when the claim, its XR and the composed
/// ConfigMap end up gone, the ConfigMap before the XR (after it, under Off:
/// the seed's failure). Under Refuse the plain delete is refused at the claim,
/// with the commands that work (set compositeDeletePolicy: Foreground, then
/// delete), which are run.
async fn claim_outcome(stack: &Stack, mode: Mode, how: ClaimDelete) -> Result<String, String> {
    let client = stack.cp.admin().await.expect("admin client");
    let (namespace, prefix) = match how {
        ClaimDelete::Claim => (CLAIM_NAMESPACE, ""),
        ClaimDelete::Namespace(ns) => (ns, "Ns"),
    };
    create_namespace(&client, namespace).await;
    let (xrs, claims) = install_claim_kind(&client, mode, prefix, namespace).await;
    let name = "app";
    let claim = json!({
        "apiVersion": format!("{CLAIM_GROUP}/v1"),
        "kind": claims.kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {},
    });
    let claim_api = api(&client, &claims, Some(namespace));
    claim_api
        .patch(
            name,
            &PatchParams::apply("seed-real").force(),
            &Patch::Apply(&claim),
        )
        .await
        .unwrap_or_else(|e| panic!("create the claim: {e}"));
    let xr_name = when_ready(&claim_api, name, "/spec/resourceRef/name")
        .await
        .ok_or_else(|| format!("{} never became Ready", claims.kind))?;
    let xr_api = api(&client, &xrs, None);
    let xr = xr_api.get(&xr_name).await.expect("the XR");
    let composed: Vec<String> = xr
        .data
        .pointer("/spec/resourceRefs")
        .and_then(Value::as_array)
        .map(|refs| {
            refs.iter()
                .filter_map(|r| r.get("name").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let timeline = Timeline::start(
        &client,
        &[
            (claims.clone(), Some(namespace.to_string())),
            (xrs.clone(), None),
            (
                ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
                Some(namespace.to_string()),
            ),
        ],
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    // Protection in effect for the XR kind (Convert holds the XR).
    if mode == Mode::Convert {
        wait_held(&xr_api, &xr_name).await;
    }
    let claim_target = format!("{}.{CLAIM_GROUP}", claims.plural);
    let target: Vec<&str> = match how {
        ClaimDelete::Claim => vec!["delete", &claim_target, name, "-n", namespace],
        ClaimDelete::Namespace(ns) => vec!["delete", "namespace", ns],
    };
    let out = tokio::process::Command::new(&stack.kubectl)
        .args(target)
        .arg("--wait=false")
        .env("KUBECONFIG", stack.cp.kubeconfig_path())
        .output()
        .await
        .expect("kubectl runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let said = match (mode, out.status.success()) {
        (Mode::Refuse, true) => {
            return Err(format!("the claim's plain delete went through: {said}"));
        }
        // Refused at the claim, with the commands that work: run them.
        (Mode::Refuse, false) => {
            let command = said
                .split("Have the claim delete it in the foreground, then delete the claim: ")
                .nth(1)
                .and_then(|rest| rest.split(". To abandon").next())
                .map(str::trim)
                .ok_or_else(|| format!("no command in the refusal: {said}"))?;
            shapes::follow(stack, command)
                .await
                .map_err(|e| format!("the claim's commands `{command}` failed: {e}"))?;
            format!("refused: {}; ran: {command}", said.trim())
        }
        (_, false) => return Err(format!("the claim's delete was refused: {said}")),
        (_, true) => format!("kubectl said: {}", said.trim()),
    };
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    // The namespace controller deletes the claim only on a retry, which
    // backs off (under CI's load its retry came minutes late): the bound is
    // for a wedge, not for speed. The namespace itself: below.
    let limit = match how {
        ClaimDelete::Namespace(_) => Duration::from_secs(300),
        _ => Duration::from_secs(120),
    };
    let gone = wait::until(limit, || async {
        timeline.gone(&claims.kind, name)?;
        let xr = timeline.gone(&xrs.kind, &xr_name)?;
        let maps: Option<Vec<_>> = composed
            .iter()
            .map(|m| timeline.gone("ConfigMap", m))
            .collect();
        Some((xr, maps?))
    })
    .await;
    let Some((xr, maps)) = gone else {
        let claim = claim_api.get_opt(name).await.ok().flatten();
        return Err(format!(
            "not all gone after {limit:?}; the claim: {:?}\n{}",
            claim.map(|c| (c.finalizers().to_vec(), c.data.pointer("/status").cloned())),
            timeline.describe()
        ));
    };
    if let ClaimDelete::Namespace(ns) = how {
        namespace_finishes(&namespaces, ns).await?;
    }
    let in_order = maps.iter().all(|m| m.seq < xr.seq);
    // Off is the seed's failure: the XR goes first and leaves its resources
    // to the garbage collector.
    if in_order == (mode != Mode::Off) {
        Ok(said)
    } else {
        Err(format!(
            "the XR left {} its composed ConfigMap\n{}",
            if in_order { "after" } else { "before" },
            timeline.describe()
        ))
    }
}

/// Waits for the namespace `ns`, whose content is gone, to finish. The
/// namespace controller retries a namespace whose discovery failed (this
/// stack's tests make and delete CRDs all the time) with a back-off that
/// grows to 1,000 s; seen in CI with everything in the namespace gone for
/// minutes. So after a minute a write to the namespace queues it at once (its
/// conditions said first), as an operator would look at it; it must then
/// finish.
async fn namespace_finishes(
    namespaces: &Api<k8s_openapi::api::core::v1::Namespace>,
    ns: &str,
) -> Result<(), String> {
    let gone = || async { namespaces.get_opt(ns).await.ok()?.is_none().then_some(()) };
    if wait::until(Duration::from_secs(60), gone).await.is_some() {
        return Ok(());
    }
    let conditions = |n: Option<k8s_openapi::api::core::v1::Namespace>| {
        n.and_then(|n| n.status?.conditions).map(|c| {
            c.iter()
                .map(|c| {
                    format!(
                        "{}={} ({})",
                        c.type_,
                        c.status,
                        c.message.clone().unwrap_or_default()
                    )
                })
                .collect::<Vec<_>>()
        })
    };
    let before = conditions(namespaces.get_opt(ns).await.ok().flatten());
    eprintln!(
        "namespace {ns}: its content gone, not finished after 60 s; its conditions: {before:?}; queued again by a write"
    );
    let _ = namespaces
        .patch(
            ns,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"seed-real/nudged": "its content is gone"}}}),
            ),
        )
        .await;
    if wait::until(Duration::from_secs(120), gone).await.is_some() {
        return Ok(());
    }
    let after = conditions(namespaces.get_opt(ns).await.ok().flatten());
    Err(format!(
        "namespace {ns} did not finish with its content gone; its conditions before the write: {before:?}, after: {after:?}"
    ))
}

#[tokio::test]
async fn deleting_a_legacy_claim_ends_gone_in_order_or_says_which_command_works() {
    let (stack, _shared) = shared_stack().await;
    let (off, refuse, convert) = tokio::join!(
        claim_outcome(stack, Mode::Off, ClaimDelete::Claim),
        claim_outcome(stack, Mode::Refuse, ClaimDelete::Claim),
        claim_outcome(stack, Mode::Convert, ClaimDelete::Claim)
    );
    for (mode, outcome) in [("Off", &off), ("Refuse", &refuse), ("Convert", &convert)] {
        eprintln!("claim under {mode}: {outcome:?}");
    }
    for (mode, outcome) in [("Off", off), ("Refuse", refuse), ("Convert", convert)] {
        if let Err(why) = outcome {
            panic!("claim under {mode}: {why}");
        }
    }
}

/// The deletion of a team's namespace holding a claim, under Convert: the
/// namespace controller deletes the claim (and everything else) with
/// Background propagation, Crossplane deletes the claim's cluster-scoped XR
/// with none, and cascade-guard makes that a foreground cascade, so the
/// composed ConfigMap goes before the XR and the namespace finishes. (The
/// namespaced tree of a ModelDeployment is the ignored test above: its
/// managed resources can wedge in a terminating namespace upstream.)
#[tokio::test]
async fn convert_tears_a_deleted_namespace_holding_a_claim_down_in_order() {
    let (stack, _shared) = shared_stack().await;
    let outcome = claim_outcome(
        stack,
        Mode::Convert,
        ClaimDelete::Namespace("seed-claims-team"),
    )
    .await;
    eprintln!("namespace holding a claim under Convert: {outcome:?}");
    if let Err(why) = outcome {
        panic!("namespace holding a claim under Convert: {why}");
    }
}

/// How a random tree is deleted.
#[derive(Clone, Copy, Debug)]
enum How {
    KubectlPlain,
    KubectlForeground,
    ApiBackground,
    ApiNoPolicy,
}

/// How long a client keeps trying a delete the API server cannot answer
/// (it restarts under the round's faults).
const UNREACHABLE_TIMEOUT: Duration = Duration::from_secs(180);

/// Whether kubectl's complaint says it never got an answer from a serving
/// API server (one that restarts), rather than a refusal or an error.
fn kubectl_unreachable(stderr: &str) -> bool {
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
fn api_unreachable(e: &kube::Error) -> bool {
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
async fn kubectl_delete_retrying(stack: &Stack, tree: &Tree, foreground: bool) -> (bool, String) {
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

async fn random_delete(stack: &Stack, tree: &Tree, how: How, mode: Mode) {
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
#[tokio::test]
async fn random_trees_clients_and_kills_never_lose_a_cluster_first() {
    // No read guard: each round takes the stack for writing (random_round).
    let _clock = TestClock::start();
    let stack = stack().await;
    let mut rng = support::rng::Rng::from_env("seed_real random");
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
enum FaultKind {
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
struct Fault {
    kind: FaultKind,
    at: Duration,
    down: Duration,
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
fn draw_faults(rng: &mut support::rng::Rng, least: u64) -> Vec<Fault> {
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
fn faults_said(faults: &[Fault]) -> String {
    format!("[{}]", joined(faults))
}

/// Each of `items` in words, `; ` between them.
fn joined<T: std::fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(T::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Runs `fault` at its moment after `started`, then brings back what it
/// stopped (and whatever exited meanwhile: a replica whose Lease lapsed,
/// Crossplane while the API server was away).
async fn run_fault(stack: &Stack, fault: Fault, started: Instant) {
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
async fn sweep_missed(trees: &[Swept<'_>], snapshots: &[Vec<Value>]) {
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
                    invariant::ObjectRef::of(o),
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

async fn random_round(
    stack: &'static Stack,
    rng: &mut support::rng::Rng,
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
    // (support::invariant) is checked after its teardown.
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
async fn off_outcome(stack: &Stack, tree: &Tree, snapshot: &[Value], what: &str) -> usize {
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
async fn edges_kept(
    timeline: &Timeline,
    snapshot: &[Value],
    edges: &[invariant::Edge],
    fate_in: impl Fn(
        &[local_cluster::timeline::Entry],
        &invariant::ObjectRef,
    ) -> Option<invariant::Fate>,
) -> Result<String, String> {
    if edges.is_empty() {
        return Err(format!(
            "no edge to check among the snapshot's {} objects",
            snapshot.len()
        ));
    }
    let _ = wait::until(Duration::from_secs(60), || async {
        let entries = timeline.entries();
        edges
            .iter()
            .all(|e| fate_in(&entries, &e.needer).is_none_or(|f| !f.still_there))
            .then_some(())
    })
    .await;
    let entries = timeline.entries();
    let fate = |r: &invariant::ObjectRef| fate_in(&entries, r);
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
fn off_report(
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
async fn clean_up_completely(
    client: &Client,
    what: &str,
    objects: &[(ApiResource, Option<String>, String)],
) {
    let started = Instant::now();
    let gone = wait::until(Duration::from_secs(240), || async {
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

const DROP_GROUP: &str = "dropped.seed.local-cluster.dev";

/// v2 CompositeResourceDefinitions.
fn v2_xrds() -> ApiResource {
    modelplane::resource(
        "apiextensions.crossplane.io",
        "v2",
        "CompositeResourceDefinition",
        "compositeresourcedefinitions",
    )
}

/// A function-patch-and-transform resource: one ConfigMap, ready at once.
fn config_map_part() -> Value {
    json!({
        "name": "config",
        "base": {"apiVersion": "v1", "kind": "ConfigMap", "data": {"part": "config"}},
        "readinessChecks": [{"type": "None"}],
    })
}

fn compositions() -> ApiResource {
    modelplane::resource(
        "apiextensions.crossplane.io",
        "v1",
        "Composition",
        "compositions",
    )
}

/// Applies a cluster-scoped object (an XRD or a Composition).
async fn apply_cluster_object(client: &Client, resource: &ApiResource, object: Value) {
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    api(client, resource, None)
        .patch(
            &name,
            &PatchParams::apply("seed-real").force(),
            &Patch::Apply(&object),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {} {name}: {e}", resource.kind));
}

/// A v2 XRD for kind `kind`, namespaced, annotated with `mode`.
fn dropped_xrd(kind: &str, mode: Mode) -> Value {
    let plural = format!("{}s", kind.to_lowercase());
    json!({
        "apiVersion": "apiextensions.crossplane.io/v2",
        "kind": "CompositeResourceDefinition",
        "metadata": {
            "name": format!("{plural}.{DROP_GROUP}"),
            "annotations": {POLICY_ANNOTATION: mode.as_str()},
        },
        "spec": {
            "group": DROP_GROUP,
            "names": {"kind": kind, "plural": plural},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "referenceable": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"part": {"type": "string"}}},
                }}},
            }],
        },
    })
}

/// A Composition (named like the kind) for `group`'s `kind`, composing
/// `resources` through function-patch-and-transform.
fn pt_composition(group: &str, kind: &str, resources: Vec<Value>) -> Value {
    json!({
        "apiVersion": "apiextensions.crossplane.io/v1",
        "kind": "Composition",
        "metadata": {"name": kind.to_lowercase()},
        "spec": {
            "compositeTypeRef": {"apiVersion": format!("{group}/v1"), "kind": kind},
            "mode": "Pipeline",
            "pipeline": [{
                "step": "patch-and-transform",
                "functionRef": {"name": local_cluster::real_crossplane::FUNCTION_NAME},
                "input": {
                    "apiVersion": "pt.fn.crossplane.io/v1beta1",
                    "kind": "Resources",
                    "resources": resources,
                },
            }],
        },
    })
}

/// Watches `xrs` and ConfigMaps in namespace `ns` (an XR kind composing
/// ConfigMaps).
async fn xrs_and_config_maps(client: &Client, xrs: &ApiResource, ns: &str) -> Timeline {
    Timeline::start(
        client,
        &[
            (xrs.clone(), Some(ns.to_string())),
            (
                ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
                Some(ns.to_string()),
            ),
        ],
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Creates XR `name` of `kind` (in DROP_GROUP) in namespace `ns`.
async fn create_drop_xr(xrs: &Api<DynamicObject>, kind: &str, ns: &str, name: &str) {
    xrs.patch(
        name,
        &PatchParams::apply("seed-real").force(),
        &Patch::Apply(json!({
            "apiVersion": format!("{DROP_GROUP}/v1"), "kind": kind,
            "metadata": {"name": name, "namespace": ns}, "spec": {},
        })),
    )
    .await
    .unwrap_or_else(|e| panic!("create {kind} {name}: {e}"));
}

/// Crossplane deletes a nested XR dropped from its parent's Composition
/// (Foreground, with a UID precondition): under `mode` it must go through, in
/// order, and never be refused.
async fn dropped_outcome(stack: &Stack, mode: Mode) {
    let client = stack.cp.admin().await.expect("admin client");
    let inner = format!("{}Inner", mode.as_str());
    let outer = format!("{}Outer", mode.as_str());
    let xrds = v2_xrds();
    let compositions = compositions();
    for kind in [&inner, &outer] {
        apply_cluster_object(&client, &xrds, dropped_xrd(kind, mode)).await;
    }
    let config_map = config_map_part();
    apply_cluster_object(
        &client,
        &compositions,
        pt_composition(DROP_GROUP, &inner, vec![config_map]),
    )
    .await;
    let part = |name: &str| {
        json!({
            "name": name,
            "base": {"apiVersion": format!("{DROP_GROUP}/v1"), "kind": inner, "spec": {"part": name}},
        })
    };
    apply_cluster_object(
        &client,
        &compositions,
        pt_composition(DROP_GROUP, &outer, vec![part("kept"), part("dropped")]),
    )
    .await;
    for kind in [&inner, &outer] {
        wait_generated_crd(&client, &format!("{}s.{DROP_GROUP}", kind.to_lowercase())).await;
    }
    let ns = format!("seed-dropped-{}", mode.as_str().to_lowercase());
    create_namespace(&client, &ns).await;
    let inners = modelplane::resource(
        DROP_GROUP,
        "v1",
        &inner,
        &format!("{}s", inner.to_lowercase()),
    );
    let outers = modelplane::resource(
        DROP_GROUP,
        "v1",
        &outer,
        &format!("{}s", outer.to_lowercase()),
    );
    let timeline = xrs_and_config_maps(&client, &inners, &ns).await;
    let outer_api = api(&client, &outers, Some(&ns));
    create_drop_xr(&outer_api, &outer, &ns, "app").await;
    let inner_api = api(&client, &inners, Some(&ns));
    // Both inner XRs Ready, each with its ConfigMap.
    let dropped = wait::until(BUILD_TIMEOUT, || async {
        let list = inner_api.list(&Default::default()).await.ok()?;
        if list.items.len() != 2 || !list.items.iter().all(is_ready) {
            return None;
        }
        list.items
            .into_iter()
            .find(|x| x.data.pointer("/spec/part") == Some(&json!("dropped")))
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "{mode:?}: the inner XRs never became Ready\n{}",
            timeline.describe()
        )
    });
    let dropped_name = dropped.name_any();
    let dropped_map = dropped
        .data
        .pointer("/spec/crossplane/resourceRefs/0/name")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| panic!("{dropped_name} composed nothing"));
    if mode == Mode::Convert {
        wait_held(&inner_api, &dropped_name).await;
    } else {
        // Refuse is in effect: a plain delete of it would be refused.
        let dry_run = DeleteParams {
            dry_run: true,
            propagation_policy: Some(PropagationPolicy::Background),
            ..DeleteParams::default()
        };
        let refused = wait::until(Duration::from_secs(60), || async {
            matches!(inner_api.delete(&dropped_name, &dry_run).await,
                Err(kube::Error::Api(ref s)) if s.code == 403)
            .then_some(())
        })
        .await;
        assert!(refused.is_some(), "Refuse never in effect for {inner}");
    }

    apply_cluster_object(
        &client,
        &compositions,
        pt_composition(DROP_GROUP, &outer, vec![part("kept")]),
    )
    .await;
    let gone = timeline
        .wait_gone(&inner, &dropped_name, TEARDOWN_TIMEOUT)
        .await;
    let map_gone = timeline.gone("ConfigMap", &dropped_map);
    assert!(
        gone.is_some() && map_gone.is_some_and(|m| gone.as_ref().is_some_and(|g| m.seq < g.seq)),
        "{mode:?}: the dropped {inner} did not go after its ConfigMap\n{}",
        timeline.describe()
    );
    let events = local_cluster::audit::read(&audit_log::audit_log(&stack.cp))
        .expect("the API server's audit log");
    let by_crossplane: Vec<Option<i64>> = events
        .iter()
        .filter(|e| {
            e.verb == "delete"
                && !e.dry_run()
                && e.is_about(&inners.plural, &ns, &dropped_name)
                && e.effective_username() == local_cluster::real_crossplane::CROSSPLANE_USER
        })
        .map(|e| e.response_code())
        .collect();
    assert!(
        by_crossplane.contains(&Some(200)) && !by_crossplane.contains(&Some(403)),
        "{mode:?}: Crossplane's deletes of {dropped_name}: {by_crossplane:?}"
    );
    eprintln!(
        "dropped under {mode:?}: gone in order; Crossplane's deletes answered {by_crossplane:?}"
    );
    let _ = outer_api.delete("app", &DeleteParams::foreground()).await;
}

#[tokio::test]
async fn crossplane_deleting_a_dropped_composite_is_never_refused() {
    let (stack, _shared) = shared_stack().await;
    tokio::join!(
        dropped_outcome(stack, Mode::Refuse),
        dropped_outcome(stack, Mode::Convert)
    );
}

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
const CONSUMERS_TEARDOWN_TIMEOUT: Duration = Duration::from_secs(480);

/// ModelDeployments (namespace, name) and an InferenceGateway on one
/// InferenceCluster, watched from before they exist.
struct Consumers {
    /// Their InferenceCluster's copy of the platform.
    platform: modelplane::Platform,
    model_deployments: Vec<(String, String)>,
    gateway: String,
    timeline: Timeline,
}

impl Consumers {
    /// Creates them on `tree`'s cluster and waits until they are Ready and
    /// their guards are in place.
    async fn create(tree: &Tree, model_deployments: Vec<(String, String)>) -> Self {
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
        let ready = wait::until(BUILD_TIMEOUT, || async {
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

    fn objects(&self) -> Vec<(ApiResource, Option<String>, String)> {
        let mut objects = Vec::new();
        for (ns, name) in &self.model_deployments {
            objects.extend(self.platform.model_deployment_tree(ns, name));
        }
        objects.extend(self.platform.inference_gateway_tree(&self.gateway));
        objects
    }

    /// The top XRs and the guards.
    fn tops_and_guards(&self) -> Vec<(ApiResource, Option<String>, String)> {
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
    fn on_the_cluster(&self) -> Vec<(ApiResource, Option<String>, String)> {
        self.objects()
            .into_iter()
            .filter(|(r, _, _)| r.kind == "Release" || r.kind == "Object")
            .collect()
    }

    async fn states(&self, client: &Client) -> String {
        states_of(client, &self.objects()).await
    }

    async fn left(&self, client: &Client) -> Vec<String> {
        left_of(client, &self.objects()).await
    }

    /// etcd's revision of its delete, from either timeline.
    fn gone_seq(&self, tree: &Tree, kind: &str, name: &str) -> u64 {
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
    fn assert_order(&self, tree: &Tree, what: &str) {
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
    async fn clean_up(&self, client: &Client) {
        for (r, ns, n) in self.on_the_cluster() {
            let _ = api(client, &r, ns.as_deref())
                .patch(
                    &n,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                )
                .await;
        }
        let gone = wait::until(Duration::from_secs(180), || async {
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
/// timeline.
async fn wait_terminating(consumers: &Consumers, kind: &str, name: &str) {
    let seen = wait::until(Duration::from_secs(60), || async {
        consumers.timeline.terminating(kind, name).map(|_| ())
    })
    .await;
    assert!(
        seen.is_some(),
        "{kind}/{name} never terminating\n{}",
        consumers.timeline.describe()
    );
}

fn assert_refused(outcome: &(bool, String), kind: &str, name: &str) {
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
async fn consumers_outcome(stack: &Stack, mode: Mode, by_namespace: bool) {
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
    let all_gone = wait::until(CONSUMERS_TEARDOWN_TIMEOUT, || async {
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
        let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone());
        let ns_gone = wait::until(Duration::from_secs(120), || async {
            namespaces
                .get_opt(&md_ns)
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await;
        assert!(ns_gone.is_some(), "{what}: namespace {md_ns} never went");
    }
    eprintln!(
        "{what}: everything gone, in order, nothing leaked, in {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn without_cascade_guard_the_consumers_race_wedges_an_engine_and_leaks_its_load_balancer() {
    let (stack, _shared) = shared_stack().await;
    consumers_outcome(stack, Mode::Off, false).await;
}

#[tokio::test]
async fn refuse_refuses_the_consumers_plain_deletes_and_foreground_tears_down_in_order() {
    let (stack, _shared) = shared_stack().await;
    consumers_outcome(stack, Mode::Refuse, false).await;
}

#[tokio::test]
async fn convert_tears_the_consumers_down_in_order() {
    let (stack, _shared) = shared_stack().await;
    consumers_outcome(stack, Mode::Convert, false).await;
}

/// The ModelDeployment's namespace deleted (the namespace controller's
/// Background delete, which Convert makes a foreground cascade). On the
/// pinned providers a namespaced managed resource in a terminating namespace
/// wedges once its ProviderConfigUsage is deleted (crossplane-runtime#1150):
/// sibling order holds each one until its provider is done, so the engine's
/// Object goes, and the namespace with it.
#[tokio::test]
async fn convert_tears_a_deleted_namespace_down_in_order() {
    let (stack, _shared) = shared_stack().await;
    consumers_outcome(stack, Mode::Convert, true).await;
}

// ---------------------------------------------------------------------------
// A replayed Background delete under Refuse. Crossplane's Usage webhook
// records the policy of a delete it refuses (the annotation below), and when
// the Usage goes it replays that delete once, 2 s later, as its own service
// account (crossplane v2.3.4, internal/controller/protection/usage/
// reconciler.go). Under Refuse a user's Background delete of a protected XR
// never reaches the Usage webhook (admission policies run before webhooks), so
// a Background attempt is recorded only while the kind was not yet under
// Refuse: here under Warn, the gentle roll-out before Refuse. Crossplane's
// replay is then refused like anyone's, and Crossplane does not try again.

const DELETION_ATTEMPT_ANNOTATION: &str = "usage.crossplane.io/deletion-attempt-with-policy";

/// `kubectl delete <target> -n <ns> [extra]`: (succeeded, stdout + stderr).
async fn kubectl_delete_args(
    stack: &Stack,
    target: &str,
    ns: &str,
    extra: &[&str],
) -> (bool, String) {
    let out = tokio::process::Command::new(&stack.kubectl)
        .args(["delete", target, "-n", ns, "--wait=false"])
        .args(extra)
        .env("KUBECONFIG", stack.cp.kubeconfig_path())
        .output()
        .await
        .expect("kubectl runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A Background attempt recorded under Warn and replayed by Crossplane under
/// Refuse: refused, and then nothing is stuck (the XR and what it composed
/// are intact and not terminating), and what happened is on record where a
/// user looks: the XR keeps Crossplane's annotation with the recorded policy
/// and gets cascade-guard's `ReplayedDeleteRefused` Event, and Crossplane's
/// log has cascade-guard's refusal with the command that works, which then
/// tears it down in order.
#[tokio::test]
async fn a_replayed_background_delete_under_refuse_leaves_nothing_stuck_and_says_why() {
    let (stack, _shared) = shared_stack().await;
    let client = stack.cp.admin().await.expect("admin client");
    let kind = "ReplayApp";
    let xrds = v2_xrds();
    apply_cluster_object(&client, &xrds, dropped_xrd(kind, Mode::Warn)).await;
    let config_map = config_map_part();
    apply_cluster_object(
        &client,
        &compositions(),
        pt_composition(DROP_GROUP, kind, vec![config_map]),
    )
    .await;
    let target = format!("replayapps.{DROP_GROUP}");
    wait_generated_crd(&client, &target).await;
    let ns = "seed-replay";
    create_namespace(&client, ns).await;
    let apps = modelplane::resource(DROP_GROUP, "v1", kind, "replayapps");
    let app_api = api(&client, &apps, Some(ns));
    let timeline = xrs_and_config_maps(&client, &apps, ns).await;
    create_drop_xr(&app_api, kind, ns, "app").await;
    let composed = when_ready(&app_api, "app", "/spec/crossplane/resourceRefs/0/name")
        .await
        .unwrap_or_else(|| panic!("{kind} app never became Ready\n{}", timeline.describe()));
    // Warn in effect (a server-side dry run warns; nothing is recorded yet).
    let warned = wait::until(Duration::from_secs(60), || async {
        let (_, said) = kubectl_delete_args(stack, &target, ns, &["app", "--dry-run=server"]).await;
        said.contains("cascade-guard warning").then_some(())
    })
    .await;
    assert!(warned.is_some(), "Warn never in effect for {kind}");

    // An operator holds the XR for a maintenance window: a reason-only Usage
    // that replays the deletes it refuses.
    let usages = api(&client, &modelplane::usages(), Some(ns));
    usages
        .patch(
            "maintenance",
            &PatchParams::apply("seed-real").force(),
            &Patch::Apply(json!({
                "apiVersion": "protection.crossplane.io/v1beta1", "kind": "Usage",
                "metadata": {"name": "maintenance", "namespace": ns},
                "spec": {
                    "of": {"apiVersion": format!("{DROP_GROUP}/v1"), "kind": kind,
                        "resourceRef": {"name": "app"}},
                    "reason": "maintenance window",
                    "replayDeletion": true,
                },
            })),
        )
        .await
        .unwrap_or_else(|e| panic!("create the Usage: {e}"));
    let in_use = wait::until(Duration::from_secs(60), || async {
        let o = app_api.get_opt("app").await.ok().flatten()?;
        (o.labels().get(IN_USE_LABEL).map(String::as_str) == Some("true")).then_some(())
    })
    .await;
    assert!(in_use.is_some(), "{kind} app never became in use");

    // The user's plain delete: cascade-guard warns, the Usage refuses and
    // records the policy.
    let (ok, said) = kubectl_delete_args(stack, &target, ns, &["app"]).await;
    assert!(!ok, "the delete of an XR in use went through: {said}");
    assert!(
        said.contains("cascade-guard warning")
            && said.contains("nousages.protection.crossplane.io")
            && said.contains("maintenance window"),
        "unexpected answer: {said}"
    );
    eprintln!("replay: the user's delete under Warn: {}", said.trim());
    let app = app_api.get("app").await.expect("the XR");
    assert_eq!(
        app.annotations()
            .get(DELETION_ATTEMPT_ANNOTATION)
            .map(String::as_str),
        Some("Background"),
        "the Usage webhook did not record the attempt"
    );

    // The roll-out moves on to Refuse.
    let xrd = format!("replayapps.{DROP_GROUP}");
    api(&client, &xrds, None)
        .patch(
            &xrd,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {POLICY_ANNOTATION: "Refuse"}}})),
        )
        .await
        .unwrap_or_else(|e| panic!("annotate {xrd}: {e}"));
    let dry_run = DeleteParams {
        dry_run: true,
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    let refusing = wait::until(Duration::from_secs(60), || async {
        matches!(app_api.delete("app", &dry_run).await,
            Err(kube::Error::Api(ref s)) if s.code == 403)
        .then_some(())
    })
    .await;
    assert!(refusing.is_some(), "Refuse never in effect for {kind}");

    // The maintenance window ends: Crossplane lets go and replays the
    // Background delete, which cascade-guard refuses.
    usages
        .delete("maintenance", &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete the Usage: {e}"));
    let replayed = wait::until(Duration::from_secs(90), || async {
        local_cluster::audit::read(&audit_log::audit_log(&stack.cp))
            .expect("the API server's audit log")
            .into_iter()
            .find(|e| {
                e.verb == "delete"
                    && !e.dry_run()
                    && e.is_about(&apps.plural, ns, "app")
                    && e.effective_username() == local_cluster::real_crossplane::CROSSPLANE_USER
            })
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "Crossplane never replayed the delete\n{}",
            stack.cp.log_tails(20)
        )
    });
    assert_eq!(
        (replayed.response_code(), replayed.propagation_policy()),
        (Some(403), Some("Background")),
        "Crossplane's replay"
    );
    // Nothing stuck once both have done all they do about the replay:
    // Crossplane has let the Usage go (it replays once, as it does), and
    // cascade-guard has told the XR's owner, on the XR, with both ways out.
    let usage_gone = wait::until(Duration::from_secs(60), || async {
        usages
            .get_opt("maintenance")
            .await
            .ok()
            .and_then(|u| u.is_none().then_some(()))
    })
    .await;
    assert!(usage_gone.is_some(), "Crossplane never let the Usage go");
    let command = format!("kubectl delete {target} app -n {ns} --cascade=foreground");
    let told = wait::until(Duration::from_secs(60), || async {
        support::events_about(&client, "app")
            .await
            .into_iter()
            .find(|(reason, note)| reason == "ReplayedDeleteRefused" && note.contains(&command))
    })
    .await;
    let (_, note) =
        told.unwrap_or_else(|| panic!("no ReplayedDeleteRefused Event with {command:?}"));
    assert!(
        note.contains(&format!(
            "kubectl annotate {target} app -n {ns} {DELETION_ATTEMPT_ANNOTATION}-"
        )),
        "{note}"
    );
    eprintln!("replay: the XR's Event: {note}");
    // The XR and its ConfigMap are there, not terminating, and no longer in
    // use; the recorded policy stays.
    let app = app_api.get("app").await.expect("the XR is still there");
    assert!(
        app.metadata.deletion_timestamp.is_none() && is_ready(&app),
        "the XR after the refused replay: {:?}",
        app.metadata
    );
    assert!(!app.labels().contains_key(IN_USE_LABEL));
    assert_eq!(
        app.annotations()
            .get(DELETION_ATTEMPT_ANNOTATION)
            .map(String::as_str),
        Some("Background")
    );
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), ns);
    let map = maps
        .get(&composed)
        .await
        .expect("the composed ConfigMap is still there");
    assert!(map.metadata.deletion_timestamp.is_none());
    // What an operator reads in Crossplane's log: the replay, refused by
    // cascade-guard, with the command that works.
    let log = std::fs::read_to_string(stack.cp.log_path("crossplane")).unwrap_or_default();
    let line = log
        .lines()
        .find(|l| {
            l.contains("Error when replaying deletion of the used resource")
                && l.contains(&format!("cascade-guard refused to delete {kind} app"))
        })
        .unwrap_or_else(|| panic!("no refused replay in Crossplane's log"));
    assert!(line.contains("--cascade=foreground"), "{line}");
    eprintln!("replay: Crossplane logged: {line}");

    let (ok, said) =
        kubectl_delete_args(stack, &target, ns, &["app", "--cascade=foreground"]).await;
    assert!(ok, "kubectl delete --cascade=foreground: {said}");
    let gone = timeline.wait_gone(kind, "app", TEARDOWN_TIMEOUT).await;
    let map_gone = timeline.gone("ConfigMap", &composed);
    let what = "the replay";
    assert!(
        gone.as_ref()
            .zip(map_gone.as_ref())
            .is_some_and(|(xr, map)| scene::revision(map, what) < scene::revision(xr, what)),
        "the XR did not go after its ConfigMap\n{}",
        timeline.describe()
    );
}
