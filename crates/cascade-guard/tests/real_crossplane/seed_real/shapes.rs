//! Random shapes of real-Crossplane trees, torn down by random clients, with
//! the invariant over every edge (`cascade_guard_testkit::invariant`) checked for each.
//!
//! The randomized test above draws one shape (the seed's tree, with or
//! without its Usage) and kills parts of the stack; this one draws the
//! shapes the fixed tests show one at a time, and kills parts of the stack
//! only when asked (CASCADE_GUARD_SHAPE_FAULTS=1, as scripts/soak.sh does:
//! one to three faults per round, those of the randomized test, each round
//! then having the stack to itself; in CI it shares the stack with the
//! other tests):
//!
//! - the seed's InferenceCluster, with or without its Usage;
//! - the InferenceCluster guarded by one to three ClusterUsages (a reason
//!   each, `replayDeletion`, as `guard.rs`), released at random moments
//!   after the delete, which Crossplane's webhook refuses until the last one
//!   is gone and then replays;
//! - a standalone Usage (EKSCluster by ServingStack) or ClusterUsage
//!   (InferenceCluster by InferenceGateway) between two XRs, with or without
//!   `replayDeletion` (without, the used XR is deleted again once its user
//!   and the Usage are gone, as its owner would);
//! - nesting: a cluster-scoped Fleet composing an InferenceCluster and a
//!   ServingStack on its cluster (depth 2), or a Region composing that Fleet
//!   (depth 3);
//! - a legacy claim (namespaced claim, cluster-scoped XR, a ConfigMap);
//! - a namespaced v2 XR composing two namespaced XRs with a ConfigMap each,
//!   which under Convert may go by the deletion of its own namespace. No
//!   provider-kubernetes Object lives in a namespace this test deletes
//!   (`siblings.rs` and the consumers' test delete such namespaces, where
//!   sibling order keeps each Object's ProviderConfigUsage against
//!   crossplane-runtime#1150).
//!
//! Each tree gets a mode (Refuse or Convert, each its own platform copy, or
//! now and then Off), a client and a delay. Under Refuse a refused client
//! follows the refusal's command; `--cascade=orphan` is refused in both
//! modes and then followed the same way; with break-glass (the admin may use
//! it) an orphaning delete is allowed, which breaks the edges to the root on
//! purpose, and the rest is deleted in the order its edges ask (under Refuse,
//! but for the ownership edges to a child the garbage collector deleted in
//! the background, Crossplane having owned it again: counted and printed,
//! as Refuse lets the garbage collector through). Every tree
//! must be gone within a bound, every edge of its snapshot (read just before
//! its delete) kept but those, Crossplane never refused, and no load
//! balancer leaked. Under Off
//! nothing is asserted but Crossplane never refused: the broken edges, what
//! wedged and what leaked are printed (the seed's failure, measured), and the
//! tree is cleaned up. The first line printed names the seed and every
//! tree's shape, client and mode, and each round's faults:
//! CASCADE_GUARD_SEED replays a run, CASCADE_GUARD_REAL_SHAPES sets how many
//! trees per round (6), CASCADE_GUARD_SHAPE_ROUNDS how many rounds (1),
//! CASCADE_GUARD_SHAPE_FIRST_ROUND the first round to run (0): with the seed,
//! a run cut short goes on from the round where it stopped.

use std::collections::BTreeSet;

use super::*;
use scene::{Objects, cloud_log, cluster_usages, open_cluster_xrd, revision};
use siblings::install_fleet;

/// Labels every tree's top object, for a DeleteCollection by label.
const TREE_LABEL: &str = "shapes.cascade-guard.dev/tree";
const BREAK_GLASS: &str = "cascade-guard.dev/break-glass";
/// A teardown may wait for guards released up to 20 s late, Crossplane's
/// replay, two load balancers in turn and Usages' 30-second re-checks.
const SHAPE_TEARDOWN_TIMEOUT: Duration = Duration::from_secs(600);

/// Under Off, how long a teardown is given before what it left is measured
/// as wedged: past the Off platform's 60-second load balancer and the
/// providers' polls.
const OFF_SETTLE: Duration = Duration::from_secs(240);
/// The shared namespace of the claims (each mode has its own claim kind).
const CLAIMS_NAMESPACE: &str = "shapes-claims";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// The seed's InferenceCluster.
    Seed { usage: bool },
    /// The seed's InferenceCluster and `guards` ClusterUsages of it.
    Guarded { guards: usize },
    /// A standalone Usage (or ClusterUsage) between two XRs.
    Between { cluster_usage: bool, replay: bool },
    /// A Fleet (depth 2), or a Region composing one (depth 3).
    Nested { depth: usize },
    /// A legacy claim.
    Claim,
    /// A namespaced v2 XR composing two namespaced XRs.
    Namespaced,
}

impl Shape {
    fn draw(rng: &mut cascade_guard_testkit::rng::Rng) -> Self {
        match rng.below(6) {
            0 => Shape::Seed {
                usage: rng.chance(2),
            },
            1 => Shape::Guarded {
                guards: 1 + rng.below(3) as usize,
            },
            2 => Shape::Between {
                cluster_usage: rng.chance(2),
                replay: rng.chance(2),
            },
            3 => Shape::Nested {
                depth: 2 + rng.below(2) as usize,
            },
            4 => Shape::Claim,
            _ => Shape::Namespaced,
        }
    }
}

/// How a tree's top object is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum How {
    KubectlPlain,
    KubectlForeground,
    ApiBackground,
    ApiNoPolicy,
    /// A DeleteCollection of the top object's kind by [`TREE_LABEL`], no
    /// propagation policy.
    Collection,
    /// `kubectl delete --cascade=orphan`, without break-glass: refused.
    Orphan,
    /// The same after annotating break-glass: allowed.
    OrphanBreakGlass,
    /// The deletion of the tree's namespace.
    Namespace,
}

impl How {
    /// A client that fits `shape` under `mode`: no DeleteCollection of an
    /// object in use (Crossplane's webhook would meet it item by item);
    /// break-glass only where the orphans are all in the snapshot; no claim
    /// orphaned (under Refuse its own policy does not count; under Convert
    /// claims are not guarded); a namespace deletion only of a namespace
    /// without managed resources, under Convert or Off (Refuse refuses the
    /// namespace controller's Background deletes, by design).
    fn draw(rng: &mut cascade_guard_testkit::rng::Rng, shape: Shape, mode: Mode) -> Self {
        let mut clients = vec![
            How::KubectlPlain,
            How::KubectlForeground,
            How::ApiBackground,
            How::ApiNoPolicy,
        ];
        if !matches!(shape, Shape::Guarded { .. }) {
            clients.push(How::Collection);
        }
        if shape != Shape::Claim {
            clients.push(How::Orphan);
        }
        // Under Off nothing refuses an orphaning delete: break-glass changes
        // nothing there.
        if mode != Mode::Off
            && matches!(
                shape,
                Shape::Seed { .. } | Shape::Nested { .. } | Shape::Namespaced
            )
        {
            clients.push(How::OrphanBreakGlass);
        }
        if shape == Shape::Namespaced && mode != Mode::Refuse {
            clients.push(How::Namespace);
        }
        clients[rng.below(clients.len() as u64) as usize]
    }
}

/// One tree's draw.
#[derive(Clone, Debug)]
struct Plan {
    name: String,
    shape: Shape,
    mode: Mode,
    how: How,
    delay: Duration,
    /// For [`Shape::Guarded`]: when each guard is released, after the delete.
    releases: Vec<Duration>,
}

impl Plan {
    /// Tree `i` of round `round` (of `rounds`): its shape, mode, client,
    /// delay and, when guarded, its guards' releases.
    fn draw(
        rng: &mut cascade_guard_testkit::rng::Rng,
        round: usize,
        rounds: usize,
        i: usize,
    ) -> Self {
        let shape = Shape::draw(rng);
        // Off now and then: its broken edges are the seed's failure,
        // measured (and its wedges cost minutes).
        let mode = match rng.below(6) {
            0 => Mode::Off,
            1..=2 => Mode::Refuse,
            _ => Mode::Convert,
        };
        let how = How::draw(rng, shape, mode);
        let delay = rng.millis(0, 10_000);
        let releases = match shape {
            Shape::Guarded { guards } => (0..guards).map(|_| rng.millis(0, 20_000)).collect(),
            _ => Vec::new(),
        };
        let name = if rounds == 1 {
            format!("shp-{i}")
        } else {
            format!("shp-{round}-{i}")
        };
        Plan {
            name,
            shape,
            mode,
            how,
            delay,
            releases,
        }
    }
}

impl std::fmt::Display for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {:?}, {:?} after {:?}, {:?}",
            self.name, self.shape, self.how, self.delay, self.mode
        )?;
        if !self.releases.is_empty() {
            write!(f, ", guards released after {:?}", self.releases)?;
        }
        Ok(())
    }
}

/// One object: its kind, namespace and name.
#[derive(Clone, Debug)]
struct Target {
    resource: ApiResource,
    ns: Option<String>,
    name: String,
}

impl Target {
    fn new(resource: ApiResource, ns: Option<&str>, name: &str) -> Self {
        Self {
            resource,
            ns: ns.map(str::to_string),
            name: name.to_string(),
        }
    }

    fn api(&self, client: &Client) -> Api<DynamicObject> {
        api(client, &self.resource, self.ns.as_deref())
    }

    /// The object, as the invariant's edges name it.
    fn object_ref(&self) -> invariant::ObjectId {
        invariant::ObjectId::new(
            &self.resource.group,
            &self.resource.kind,
            self.ns.as_deref(),
            &self.name,
        )
    }

    /// `<plural>.<group> <name> [-n <ns>]`, as kubectl takes it.
    fn kubectl_args(&self) -> Vec<String> {
        let mut args = vec![
            format!("{}.{}", self.resource.plural, self.resource.group),
            self.name.clone(),
        ];
        if let Some(ns) = &self.ns {
            args.extend(["-n".to_string(), ns.clone()]);
        }
        args
    }

    fn entry(&self) -> (ApiResource, Option<String>, String) {
        (self.resource.clone(), self.ns.clone(), self.name.clone())
    }
}

/// A tree built on the stack and watched from before it existed.
struct Built {
    plan: Plan,
    client: Client,
    timeline: Timeline,
    /// Everything of the tree (names Crossplane generated included).
    objects: Objects,
    /// What the client deletes.
    root: Target,
    /// [`Shape::Between`]: the used XR.
    hub: Option<Target>,
    /// [`Shape::Guarded`]: the ClusterUsages, released by the test.
    guards: Vec<String>,
    /// [`Shape::Between`]: the Usage or ClusterUsage.
    usage: Option<Target>,
    /// The cloud clusters (named like their EKSCluster) in the tree.
    clusters: Vec<String>,
    /// The namespace of its own, for [`Shape::Namespaced`].
    namespace: Option<String>,
    /// Removals its timeline missed across an API server restart.
    missed: MissedRemovals,
}

/// Server-side applies `object` (its kind `resource`) as the tests do.
async fn apply(client: &Client, resource: &ApiResource, object: &Value, what: &str) {
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let ns = object["metadata"]["namespace"].as_str();
    api(client, resource, ns)
        .patch(
            name,
            &PatchParams::apply("seed-real").force(),
            &Patch::Apply(object),
        )
        .await
        .unwrap_or_else(|e| panic!("{what}: create {} {name}: {e}", resource.kind));
}

/// `object` labelled with [`TREE_LABEL`] `tree`.
fn labelled(mut object: Value, tree: &str) -> Value {
    object["metadata"]["labels"][TREE_LABEL] = json!(tree);
    object
}

/// The names in an XR's `resourceRefs` (v2 under `spec.crossplane`, legacy
/// under `spec`) of kind `kind`.
fn composed_names(xr: &DynamicObject, kind: &str) -> Vec<String> {
    ["/spec/crossplane/resourceRefs", "/spec/resourceRefs"]
        .iter()
        .filter_map(|p| xr.data.pointer(p).and_then(Value::as_array))
        .flatten()
        .filter(|r| r.get("kind").and_then(Value::as_str) == Some(kind))
        .filter_map(|r| r.get("name").and_then(Value::as_str).map(str::to_string))
        .collect()
}

/// Waits until `target` is Ready; returns it.
async fn wait_ready(client: &Client, target: &Target, what: &str) -> DynamicObject {
    let objects = target.api(client);
    let ready = wait::until_lasting(BUILD_TIMEOUT, || async {
        let o = objects.get_opt(&target.name).await.ok().flatten()?;
        is_ready(&o).then_some(o)
    })
    .await;
    ready.unwrap_or_else(|| {
        panic!(
            "{what}: {} {} never became Ready",
            target.resource.kind, target.name
        )
    })
}

/// Waits until sibling order holds `target` for a sibling that needs it;
/// under Off it holds nothing (the kind is not protected), so no wait.
async fn wait_sibling_hold(client: &Client, target: &Target, mode: Mode, what: &str) {
    if mode != Mode::Off {
        // The bound of a hold that never comes, as the scene's (240 s).
        let held = cascade_guard_testkit::wait_sibling_held(
            client,
            crate::LEASE_NAMESPACE,
            &target.resource,
            target.ns.as_deref(),
            &target.name,
            Duration::from_secs(240),
        )
        .await;
        assert!(
            held,
            "{what}: {} {} was never held",
            target.resource.kind, target.name
        );
    }
}

/// Waits until `target` carries `label` (with `value`, if given).
async fn wait_label(
    client: &Client,
    target: &Target,
    label: &str,
    value: Option<&str>,
    what: &str,
) {
    let objects = target.api(client);
    // A bound for a hold that never comes: a new leader (a replica that lost
    // its Lease under CI's load) first waits out the Lease, then a complete
    // pass of every kind.
    let labelled = wait::until_lasting(Duration::from_secs(240), || async {
        let o = objects.get_opt(&target.name).await.ok().flatten()?;
        let v = o.labels().get(label)?;
        value.is_none_or(|want| v == want).then_some(())
    })
    .await;
    assert!(
        labelled.is_some(),
        "{what}: {} {} never carried {label}",
        target.resource.kind,
        target.name
    );
}

/// The Region XR kind of `mode`'s copy: cluster-scoped, composing a Fleet
/// of its own name (the Fleet kind must be installed).
async fn install_region(client: &Client, mode: Mode, fleets: &ApiResource) -> ApiResource {
    let lower = mode.as_str().to_lowercase();
    let group = fleets.group.clone();
    let regions = modelplane::resource(&group, "v1", "Region", "regions");
    apply_cluster_object(
        client,
        &v2_xrds(),
        open_cluster_xrd(&group, "Region", "regions", mode),
    )
    .await;
    let fleet = json!({
        "name": "fleet",
        "base": {"apiVersion": fleets.api_version, "kind": "Fleet", "spec": {}},
        "patches": [{"type": "FromCompositeFieldPath", "fromFieldPath": "metadata.name", "toFieldPath": "metadata.name"}],
    });
    let mut composition = pt_composition(&group, "Region", vec![fleet]);
    composition["metadata"]["name"] = json!(format!("regions-{lower}"));
    apply_cluster_object(client, &compositions(), composition).await;
    wait_generated_crd(client, &format!("regions.{group}")).await;
    regions
}

/// The namespaced kinds of [`Shape::Namespaced`] under `mode`: (outer,
/// inner). The outer composes inner XRs `a` and `b`, each a ConfigMap.
async fn install_namespaced(client: &Client, mode: Mode) -> (ApiResource, ApiResource) {
    let inner = format!("Shape{}Inner", mode.as_str());
    let outer = format!("Shape{}Outer", mode.as_str());
    for kind in [&inner, &outer] {
        apply_cluster_object(client, &v2_xrds(), dropped_xrd(kind, mode)).await;
    }
    apply_cluster_object(
        client,
        &compositions(),
        pt_composition(DROP_GROUP, &inner, vec![config_map_part()]),
    )
    .await;
    let part = |name: &str| {
        json!({
            "name": name,
            "base": {"apiVersion": format!("{DROP_GROUP}/v1"), "kind": inner, "spec": {"part": name}},
        })
    };
    apply_cluster_object(
        client,
        &compositions(),
        pt_composition(DROP_GROUP, &outer, vec![part("a"), part("b")]),
    )
    .await;
    for kind in [&inner, &outer] {
        wait_generated_crd(client, &format!("{}s.{DROP_GROUP}", kind.to_lowercase())).await;
    }
    let resource = |kind: &str| {
        modelplane::resource(DROP_GROUP, "v1", kind, &format!("{}s", kind.to_lowercase()))
    };
    (resource(&outer), resource(&inner))
}

/// The kinds every tree of a mode may need, installed once per run.
struct Kinds {
    fleets: ApiResource,
    regions: ApiResource,
    xr_claims: (ApiResource, ApiResource),
    namespaced: (ApiResource, ApiResource),
}

impl Kinds {
    async fn install(stack: &Stack, mode: Mode) -> Self {
        let client = stack.cp.admin().await.expect("admin client");
        create_namespace(&client, CLAIMS_NAMESPACE).await;
        let fleets = install_fleet(&client, mode, &mode.platform()).await;
        let regions = install_region(&client, mode, &fleets).await;
        let xr_claims = install_claim_kind(&client, mode, "Shape", CLAIMS_NAMESPACE).await;
        let namespaced = install_namespaced(&client, mode).await;
        Self {
            fleets,
            regions,
            xr_claims,
            namespaced,
        }
    }
}

impl Built {
    /// Builds `plan`'s tree, waits until it is Ready, its mode in effect and
    /// its holds and Usages in place.
    async fn build(stack: &Stack, kinds: &Kinds, plan: Plan) -> Self {
        let client = stack.cp.admin().await.expect("admin client");
        let platform = plan.mode.platform();
        let n = plan.name.as_str();
        let what = plan.to_string();
        let system = Some(SYSTEM_NAMESPACE);
        let started = Instant::now();
        // What the shape creates, in order, and what it must wait for; the
        // objects its timeline follows (names generated later are added
        // below, their kinds are watched from the start).
        let mut objects: Objects = Vec::new();
        let mut clusters = Vec::new();
        let mut watch_only: Vec<(ApiResource, Option<String>)> = Vec::new();
        let mut namespace = None;
        let (root, hub, usage, guards);
        match plan.shape {
            Shape::Seed { .. } | Shape::Guarded { .. } => {
                let with = match plan.shape {
                    Shape::Seed { usage } => usage,
                    _ => true,
                };
                objects = platform.tree(n);
                if !with {
                    objects.retain(|(r, _, _)| r.kind != "Usage");
                }
                let guard_names: Vec<String> = match plan.shape {
                    Shape::Guarded { guards } => {
                        (0..guards).map(|j| format!("{n}-guard-{j}")).collect()
                    }
                    _ => Vec::new(),
                };
                for g in &guard_names {
                    objects.push((cluster_usages(), None, g.clone()));
                }
                clusters.push(n.to_string());
                root = Target::new(platform.inference_clusters(), None, n);
                hub = None;
                usage = None;
                guards = guard_names;
            }
            Shape::Between {
                cluster_usage: false,
                ..
            } => {
                let wheel = format!("{n}-stack");
                objects = platform.eks_cluster_tree(n);
                objects.extend(platform.serving_stack_tree(&wheel));
                let u = format!("{wheel}-uses-cluster");
                objects.push((modelplane::usages(), system.map(str::to_string), u.clone()));
                clusters.push(n.to_string());
                root = Target::new(platform.serving_stacks(), system, &wheel);
                hub = Some(Target::new(platform.eks_clusters(), system, n));
                usage = Some(Target::new(modelplane::usages(), system, &u));
                guards = Vec::new();
            }
            Shape::Between {
                cluster_usage: true,
                ..
            } => {
                let wheel = format!("{n}-gw");
                objects = platform.tree(n);
                objects.extend(
                    platform
                        .inference_gateway_tree(&wheel)
                        .into_iter()
                        .filter(|(r, _, _)| r.kind != "Usage"),
                );
                let u = format!("{wheel}-uses-cluster");
                objects.push((cluster_usages(), None, u.clone()));
                clusters.push(n.to_string());
                root = Target::new(platform.inference_gateways(), None, &wheel);
                hub = Some(Target::new(platform.inference_clusters(), None, n));
                usage = Some(Target::new(cluster_usages(), None, &u));
                guards = Vec::new();
            }
            Shape::Nested { depth } => {
                if depth == 3 {
                    objects.push((kinds.regions.clone(), None, n.to_string()));
                }
                objects.push((kinds.fleets.clone(), None, n.to_string()));
                objects.extend(
                    platform
                        .tree(n)
                        .into_iter()
                        .filter(|(r, _, _)| r.kind != "Usage"),
                );
                objects.extend(platform.serving_stack_tree(&format!("{n}-edge")));
                clusters.push(n.to_string());
                let top = if depth == 3 {
                    &kinds.regions
                } else {
                    &kinds.fleets
                };
                root = Target::new(top.clone(), None, n);
                hub = None;
                usage = None;
                guards = Vec::new();
            }
            Shape::Claim => {
                let (xrs, claims) = &kinds.xr_claims;
                objects.push((
                    claims.clone(),
                    Some(CLAIMS_NAMESPACE.to_string()),
                    n.to_string(),
                ));
                watch_only.push((xrs.clone(), None));
                watch_only.push((
                    ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
                    Some(CLAIMS_NAMESPACE.to_string()),
                ));
                root = Target::new(claims.clone(), Some(CLAIMS_NAMESPACE), n);
                hub = None;
                usage = None;
                guards = Vec::new();
            }
            Shape::Namespaced => {
                let ns = format!("{n}-team");
                create_namespace(&client, &ns).await;
                let (outers, inners) = &kinds.namespaced;
                objects.push((outers.clone(), Some(ns.clone()), n.to_string()));
                watch_only.push((inners.clone(), Some(ns.clone())));
                watch_only.push((
                    ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
                    Some(ns.clone()),
                ));
                root = Target::new(outers.clone(), Some(&ns), n);
                namespace = Some(ns);
                hub = None;
                usage = None;
                guards = Vec::new();
            }
        }
        // Watched: every kind of the tree where it lives; the Secrets a
        // snapshot reads (the kubeconfigs); the ProviderConfigUsages of its
        // managed resources.
        let mut watched: Vec<(ApiResource, Option<String>)> = Vec::new();
        let mut more = watch_only;
        if !clusters.is_empty() {
            more.push((secrets(), Some(SYSTEM_NAMESPACE.to_string())));
        }
        let managed_namespaces: BTreeSet<Option<String>> = objects
            .iter()
            .filter(|(r, _, _)| r.kind == "Release" || r.kind == "Object")
            .map(|(_, ns, _)| ns.clone())
            .collect();
        for ns in managed_namespaces {
            for r in provider_config_usages() {
                more.push((r, ns.clone()));
            }
        }
        for kind in objects
            .iter()
            .map(|(r, ns, _)| (r.clone(), ns.clone()))
            .chain(more)
        {
            if !watched.contains(&kind) {
                watched.push(kind);
            }
        }
        let timeline = Timeline::start(&client, &watched)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));

        // Create, and wait for what the shape needs before its delete.
        match plan.shape {
            Shape::Seed { .. } | Shape::Guarded { .. } => {
                // A guarded cluster is the seed's, with its Usage.
                let with = plan.shape != Shape::Seed { usage: false };
                let ic = if with {
                    platform.inference_cluster(n)
                } else {
                    platform.inference_cluster_without_usage(n)
                };
                apply(&client, &root.resource, &labelled(ic, n), &what).await;
                wait_ready(&client, &root, &what).await;
                stack
                    .wait_in_effect(&root.resource, None, n, plan.mode)
                    .await;
                let eks = Target::new(platform.eks_clusters(), system, n);
                if with {
                    wait_label(&client, &eks, IN_USE_LABEL, Some("true"), &what).await;
                } else {
                    wait_sibling_hold(&client, &eks, plan.mode, &what).await;
                }
                for (g, reason) in guards.iter().zip(1..) {
                    let guard = json!({
                        "apiVersion": cluster_usages().api_version,
                        "kind": "ClusterUsage",
                        "metadata": {"name": g},
                        "spec": {
                            "of": {
                                "apiVersion": root.resource.api_version,
                                "kind": root.resource.kind,
                                "resourceRef": {"name": n},
                            },
                            "reason": format!("ModelDeployment {reason} serves on it"),
                            "replayDeletion": true,
                        },
                    });
                    apply(&client, &cluster_usages(), &guard, &what).await;
                }
                if !guards.is_empty() {
                    wait_label(&client, &root, IN_USE_LABEL, Some("true"), &what).await;
                }
            }
            Shape::Between {
                cluster_usage,
                replay,
            } => {
                let hub = hub.as_ref().expect("a hub");
                let (hub_object, wheel_object) = if cluster_usage {
                    (
                        platform.inference_cluster(n),
                        platform.inference_gateway_without_guard(&root.name, n),
                    )
                } else {
                    (
                        platform.eks_cluster(n),
                        platform.serving_stack(&root.name, n),
                    )
                };
                apply(&client, &hub.resource, &labelled(hub_object, n), &what).await;
                wait_ready(&client, hub, &what).await;
                apply(&client, &root.resource, &labelled(wheel_object, n), &what).await;
                wait_ready(&client, &root, &what).await;
                for t in [hub, &root] {
                    stack
                        .wait_in_effect(&t.resource, t.ns.as_deref(), &t.name, plan.mode)
                        .await;
                }
                let usage = usage.as_ref().expect("a Usage");
                let side = |t: &Target| json!({"apiVersion": t.resource.api_version, "kind": t.resource.kind, "resourceRef": {"name": t.name}});
                let mut metadata = json!({"name": usage.name});
                if let Some(ns) = &usage.ns {
                    metadata["namespace"] = json!(ns);
                }
                let object = json!({
                    "apiVersion": usage.resource.api_version,
                    "kind": usage.resource.kind,
                    "metadata": metadata,
                    "spec": {"of": side(hub), "by": side(&root), "replayDeletion": replay},
                });
                apply(&client, &usage.resource, &object, &what).await;
                wait_label(&client, hub, IN_USE_LABEL, Some("true"), &what).await;
                // Held for its user's tree (sibling order).
                wait_sibling_hold(&client, usage, plan.mode, &what).await;
            }
            Shape::Nested { depth } => {
                let top = json!({
                    "apiVersion": root.resource.api_version,
                    "kind": root.resource.kind,
                    "metadata": {"name": n},
                    "spec": {},
                });
                apply(&client, &root.resource, &labelled(top, n), &what).await;
                wait_ready(&client, &root, &what).await;
                if depth == 3 {
                    wait_ready(&client, &Target::new(kinds.fleets.clone(), None, n), &what).await;
                }
                for r in [&root.resource, &kinds.fleets] {
                    stack.wait_in_effect(r, None, n, plan.mode).await;
                }
                // The InferenceCluster is held for the edge (below): every
                // delete of it is refused until then, so under Convert only
                // cascade-guard's finalizer says its mode is in effect.
                if plan.mode == Mode::Convert {
                    wait_held(&api(&client, &platform.inference_clusters(), None), n).await;
                }
                // Sibling order: the InferenceCluster held for the edge
                // ServingStack, the EKSCluster for its own.
                wait_sibling_hold(
                    &client,
                    &Target::new(platform.inference_clusters(), None, n),
                    plan.mode,
                    &what,
                )
                .await;
                wait_sibling_hold(
                    &client,
                    &Target::new(platform.eks_clusters(), system, n),
                    plan.mode,
                    &what,
                )
                .await;
            }
            Shape::Claim => {
                let (xrs, claims) = &kinds.xr_claims;
                let claim = json!({
                    "apiVersion": claims.api_version,
                    "kind": claims.kind,
                    "metadata": {"name": n, "namespace": CLAIMS_NAMESPACE},
                    "spec": {},
                });
                apply(&client, claims, &labelled(claim, n), &what).await;
                let ready = wait_ready(&client, &root, &what).await;
                let xr_name = ready
                    .data
                    .pointer("/spec/resourceRef/name")
                    .and_then(Value::as_str)
                    .unwrap_or_else(|| panic!("{what}: the claim names no XR"))
                    .to_string();
                let xr_target = Target::new(xrs.clone(), None, &xr_name);
                let xr = wait_ready(&client, &xr_target, &what).await;
                objects.push(xr_target.entry());
                let maps = composed_names(&xr, "ConfigMap");
                assert!(!maps.is_empty(), "{what}: the XR composed nothing");
                for m in maps {
                    objects.push((
                        ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
                        Some(CLAIMS_NAMESPACE.to_string()),
                        m,
                    ));
                }
                // Refuse judges the claim's delete at the claim; Convert
                // holds the XR (claims are never Convert kinds).
                if plan.mode == Mode::Refuse {
                    stack
                        .wait_in_effect(claims, Some(CLAIMS_NAMESPACE), n, plan.mode)
                        .await;
                }
                stack.wait_in_effect(xrs, None, &xr_name, plan.mode).await;
            }
            Shape::Namespaced => {
                let ns = namespace.clone().expect("a namespace");
                let (outers, inners) = &kinds.namespaced;
                let outer = json!({
                    "apiVersion": outers.api_version,
                    "kind": outers.kind,
                    "metadata": {"name": n, "namespace": ns},
                    "spec": {},
                });
                apply(&client, outers, &labelled(outer, n), &what).await;
                let ready = wait_ready(&client, &root, &what).await;
                let inner_names = composed_names(&ready, &inners.kind);
                assert_eq!(inner_names.len(), 2, "{what}: {ready:?}");
                stack.wait_in_effect(outers, Some(&ns), n, plan.mode).await;
                for i in inner_names {
                    let t = Target::new(inners.clone(), Some(&ns), &i);
                    let inner = wait_ready(&client, &t, &what).await;
                    stack.wait_in_effect(inners, Some(&ns), &i, plan.mode).await;
                    objects.push(t.entry());
                    for m in composed_names(&inner, "ConfigMap") {
                        objects.push((
                            ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
                            Some(ns.clone()),
                            m,
                        ));
                    }
                }
            }
        }
        eprintln!("{what}: built in {:?}", started.elapsed());
        Self {
            plan,
            client,
            timeline,
            objects,
            root,
            hub,
            guards,
            usage,
            clusters,
            namespace,
            missed: MissedRemovals::default(),
        }
    }

    fn what(&self) -> String {
        format!("random shape {}", self.plan)
    }

    async fn left(&self) -> Vec<String> {
        left_of(&self.client, &self.objects).await
    }

    async fn states(&self) -> String {
        states_of(&self.client, &self.objects).await
    }

    /// The tree as it is now, for `cascade_guard_testkit::invariant::edges`: every
    /// object, the kubeconfig Secret of each cloud cluster (data left out)
    /// and the ProviderConfigUsages of its managed resources.
    async fn snapshot(&self) -> Vec<Value> {
        let what = self.what();
        let secrets_read = self.clusters.iter().map(|c| {
            (
                secrets(),
                Some(SYSTEM_NAMESPACE.to_string()),
                format!("{c}-kubeconfig"),
            )
        });
        snapshot_of(
            &self.client,
            &what,
            self.objects.iter().cloned().chain(secrets_read),
            self.managed_namespaces(),
        )
        .await
    }

    /// The namespaces of its managed resources (their ProviderConfigUsages
    /// are there).
    fn managed_namespaces(&self) -> BTreeSet<Option<String>> {
        self.objects
            .iter()
            .filter(|(r, _, _)| r.kind == "Release" || r.kind == "Object")
            .map(|(_, ns, _)| ns.clone())
            .collect()
    }

    /// The tree as [`sweep_missed`] looks through it: its objects' kinds,
    /// the kubeconfig Secrets and the ProviderConfigUsages of its managed
    /// resources.
    fn swept(&self) -> Swept<'_> {
        let mut kinds: Vec<(ApiResource, Option<String>)> = Vec::new();
        let objects = self
            .objects
            .iter()
            .map(|(r, ns, _)| (r.clone(), ns.clone()));
        let secrets =
            (!self.clusters.is_empty()).then(|| (secrets(), Some(SYSTEM_NAMESPACE.to_string())));
        let usages = self
            .managed_namespaces()
            .into_iter()
            .flat_map(|ns| provider_config_usages().map(|r| (r, ns.clone())));
        for kind in objects.chain(secrets).chain(usages) {
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        Swept {
            name: &self.plan.name,
            client: &self.client,
            timeline: &self.timeline,
            missed: &self.missed,
            kinds,
        }
    }

    /// Waits until nothing of the tree (and its namespace, if deleted) is
    /// left; whether that came within `timeout`.
    async fn wait_all_gone(&self, timeout: Duration) -> bool {
        let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(self.client.clone());
        wait::until_lasting(timeout, || async {
            let mut done = self.left().await.is_empty();
            if done && self.plan.how == How::Namespace {
                let ns = self.namespace.as_deref().unwrap_or_default();
                done = matches!(namespaces.get_opt(ns).await, Ok(None));
            }
            if !done {
                // A read of every object per pass: not every 50 ms.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            done.then_some(())
        })
        .await
        .is_some()
    }

    /// Every one of `edges` (of `snapshot`) kept by the teardown (as
    /// `Tree::assert_every_edge`, with the removals the watch missed across
    /// an API server restart): fails listing every broken and every unjudged
    /// edge, or when there is none; returns the tally.
    async fn assert_every_edge(&self, snapshot: &[Value], edges: &[invariant::Edge]) -> String {
        let uids = invariant::uids(snapshot);
        let kept = edges_kept(&self.timeline, snapshot, edges, |entries, r| {
            fate_with_missed(entries, &uids, &self.missed, r)
        })
        .await;
        match kept {
            Ok(tally) => tally,
            Err(report) => panic!(
                "{}: {report}\nleft: {:?}\n{}\n{}",
                self.what(),
                self.left().await,
                self.states().await,
                self.timeline.describe()
            ),
        }
    }

    /// Every edge of `snapshot` judged as things stand, without waiting
    /// (Off: what a teardown without cascade-guard did): how many edges,
    /// each broken one with its revisions, and the tally.
    fn measure_edges(&self, snapshot: &[Value]) -> (usize, Vec<String>, String) {
        let edges = &invariant::edges(snapshot);
        let uids = invariant::uids(snapshot);
        let entries = self.timeline.entries();
        let (broken, tally) = invariant::measure(edges, |r| {
            fate_with_missed(&entries, &uids, &self.missed, r)
        });
        (edges.len(), broken, tally)
    }

    /// `edges` of `snapshot` judged as things stand, as `measure_edges`.
    fn measure_these(
        &self,
        snapshot: &[Value],
        edges: &[invariant::Edge],
    ) -> (Vec<String>, String) {
        let uids = invariant::uids(snapshot);
        let entries = self.timeline.entries();
        invariant::measure(edges, |r| {
            fate_with_missed(&entries, &uids, &self.missed, r)
        })
    }

    /// What the local cloud logged as leaked for the tree's clusters (a
    /// tree without one has nothing to leak, and the log may not be there).
    fn leaked(&self, stack: &Stack) -> Vec<String> {
        if self.clusters.is_empty() {
            return Vec::new();
        }
        let log = cloud_log(stack);
        self.clusters
            .iter()
            .flat_map(|c| modelplane::leaked(&log, c))
            .collect()
    }

    /// etcd's revision of `kind/name`'s first sight deleting, or leaving;
    /// for a removal the watch missed, the revisions it lies within.
    fn deleted_at(&self, kind: &str, name: &str) -> Option<(u64, u64)> {
        match self.timeline.terminating(kind, name) {
            Some(e) => {
                let at = revision(&e, &self.what());
                Some((at, at))
            }
            None => gone_within(&self.timeline, &self.missed, kind, name),
        }
    }

    fn gone_at(&self, kind: &str, name: &str) -> (u64, u64) {
        gone_within(&self.timeline, &self.missed, kind, name).unwrap_or_else(|| {
            panic!(
                "{}: {kind}/{name} never seen leaving\n{}",
                self.what(),
                self.timeline.describe()
            )
        })
    }

    /// After an orphaning delete: deletes (foreground) what is left, each
    /// object once nothing outside its subtree that needs something in it
    /// is left (the snapshot's edges, subtrees by its controller
    /// ownerReferences), and only objects whose controller is gone (the
    /// others go with their parent's cascade).
    async fn clean_up_in_order(&self, snapshot: &[Value]) {
        let what = self.what();
        let edges = invariant::edges(snapshot);
        let refs: Vec<(invariant::ObjectId, String, Option<String>)> = snapshot
            .iter()
            .filter_map(|o| {
                let me = invariant::ObjectId::of(o)?;
                let uid = o.pointer("/metadata/uid")?.as_str()?.to_string();
                let parent = o
                    .pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .and_then(|owners| {
                        owners
                            .iter()
                            .find(|r| r.get("controller") == Some(&json!(true)))
                    })
                    .and_then(|r| r.get("uid")?.as_str().map(str::to_string));
                Some((me, uid, parent))
            })
            .collect();
        let subtree = |root_uid: &str| -> BTreeSet<invariant::ObjectId> {
            let mut uids: BTreeSet<String> = [root_uid.to_string()].into();
            loop {
                let before = uids.len();
                for (_, uid, parent) in &refs {
                    if parent.as_ref().is_some_and(|p| uids.contains(p)) {
                        uids.insert(uid.clone());
                    }
                }
                if uids.len() == before {
                    break;
                }
            }
            refs.iter()
                .filter(|(_, uid, _)| uids.contains(uid))
                .map(|(r, _, _)| r.clone())
                .collect()
        };
        let uids = invariant::uids(snapshot);
        let gone = wait::until_lasting(SHAPE_TEARDOWN_TIMEOUT, || async {
            let entries = self.timeline.entries();
            let alive = |r: &invariant::ObjectId| {
                fate_with_missed(&entries, &uids, &self.missed, r).is_some_and(|f| f.still_there)
            };
            for (r, ns, n) in &self.objects {
                let objects = api(&self.client, r, ns.as_deref());
                let Ok(Some(o)) = objects.get_opt(n).await else {
                    continue;
                };
                if o.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                let parent_alive = o
                    .owner_references()
                    .iter()
                    .filter(|o| o.controller == Some(true))
                    .any(|o| refs.iter().any(|(x, uid, _)| uid == &o.uid && alive(x)));
                if parent_alive {
                    continue;
                }
                let Some(uid) = o.metadata.uid.as_deref() else {
                    continue;
                };
                let mine = subtree(uid);
                let blocked = edges.iter().any(|e| {
                    mine.contains(&e.needed) && !mine.contains(&e.needer) && alive(&e.needer)
                });
                if !blocked && read_as_a_root(&self.client, &o).await {
                    // Refused while a hold lets go: the next pass.
                    let _ = objects.delete(n, &DeleteParams::foreground()).await;
                }
            }
            let left = self.left().await;
            if !left.is_empty() {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            left.is_empty().then_some(())
        })
        .await;
        assert!(
            gone.is_some(),
            "{what}: the clean-up after the orphaning delete left {:?}\n{}\n{}",
            self.left().await,
            self.states().await,
            self.timeline.describe()
        );
    }
}

/// Whether cascade-guard has read `o`'s tree as a root, at its generation
/// now, when it is a composite with something to cascade; true for anything
/// else. The product's gate (`--unordered-deletes=refuse`) refuses a root's
/// delete until then; the seed's stack runs with `allow` (stack.rs), so the
/// clean-up waits for it as an operator would with `cascade-guard plan`. An
/// XR orphaned a moment ago is a root new to cascade-guard, and under CI's
/// load a look took 82 s: deleted before its first read, its tree went in no
/// order, the holds its old root made let go when that root left (seed
/// 1796532554310620919, a Fleet deleted 5 s after its Region's orphaning
/// delete: its InferenceCluster went while the Releases that install onto
/// its cluster were still uninstalling).
async fn read_as_a_root(client: &Client, o: &DynamicObject) -> bool {
    let refs = |pointer: &str| {
        o.data
            .pointer(pointer)
            .and_then(Value::as_array)
            .is_some_and(|refs| !refs.is_empty())
    };
    if !refs("/spec/crossplane/resourceRefs") && !refs("/spec/resourceRefs") {
        return true;
    }
    let (Some(uid), generation) = (o.metadata.uid.as_deref(), o.metadata.generation) else {
        return true;
    };
    let records: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let Ok(Some(record)) = records
        .get_opt(cascade_guard::policy::sibling::gate::ORDERED_TREES)
        .await
    else {
        return false;
    };
    let marks =
        cascade_guard::policy::sibling::gate::decode_marks(&record.data.unwrap_or_default());
    marks.get(uid).map(String::as_str) == Some(generation.unwrap_or(0).to_string().as_str())
}

/// What a delete came to.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Allowed,
    /// Refused by Crossplane's Usage webhook: the object is in use.
    InUse,
}

/// `kubectl <args> --wait=false`, tried again while it gets no answer (the
/// API server restarting, a webhook down with Crossplane core), as a user
/// would: (succeeded, stdout + stderr).
async fn kubectl_retrying(stack: &Stack, args: &[String]) -> (bool, String) {
    let mut tries = Tries::new(&args.join(" "));
    loop {
        let (ok, said) = kubectl(stack, args).await;
        if ok || !tries.again(kubectl_unreachable(&said), &said).await {
            return (ok, said);
        }
    }
}

/// A client's tries of one request while the API server or a webhook cannot
/// answer, until [`UNREACHABLE_TIMEOUT`].
struct Tries {
    what: String,
    deadline: Instant,
    retried: bool,
}

impl Tries {
    fn new(what: &str) -> Self {
        Self {
            what: what.to_string(),
            deadline: Instant::now() + UNREACHABLE_TIMEOUT,
            retried: false,
        }
    }

    /// Whether to try again after a failure (`transient`: it got no answer),
    /// after a pause.
    async fn again(&mut self, transient: bool, said: &str) -> bool {
        if !transient || Instant::now() > self.deadline {
            return false;
        }
        let last = said.trim().lines().last().unwrap_or_default();
        eprintln!("{}: again: {last}", self.what);
        self.retried = true;
        tokio::time::sleep(Duration::from_secs(1)).await;
        true
    }

    /// Whether a retry's failure says an earlier try went through before
    /// its answer was lost: the object, or the namespace's content, already
    /// gone.
    fn went_through(&self, said: &str) -> bool {
        self.retried
            && (said.contains("(NotFound)")
                || said.contains("(404)")
                || said.contains("ensuring all content is removed"))
    }
}

/// `kubectl <args> --wait=false`: (succeeded, stdout + stderr).
async fn kubectl(stack: &Stack, args: &[String]) -> (bool, String) {
    let out = tokio::process::Command::new(&stack.kubectl)
        .args(args)
        .arg("--wait=false")
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

/// A refusal's or a conflict's message from the API.
fn api_message(e: kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("({}) {}", s.code, s.message),
        e => e.to_string(),
    }
}

/// Sends `how`'s delete of `target`, again while it gets no answer (the API
/// server restarting, Crossplane's webhook down): Ok (also when a retry
/// finds that an earlier try went through), or the refusal's message.
async fn send(stack: &Stack, built: &Built, how: How, target: &Target) -> Result<(), String> {
    let mut tries = Tries::new(&format!(
        "{}: {how:?} of {} {}",
        built.plan.name, target.resource.kind, target.name
    ));
    loop {
        match send_once(stack, built, how, target).await {
            Ok(()) => return Ok(()),
            Err((said, transient)) => {
                if tries.again(transient, &said).await {
                    continue;
                }
                if tries.went_through(&said) {
                    return Ok(());
                }
                return Err(said);
            }
        }
    }
}

/// One try of [`send`]: Ok, or what it said and whether it got no answer.
async fn send_once(
    stack: &Stack,
    built: &Built,
    how: How,
    target: &Target,
) -> Result<(), (String, bool)> {
    let objects = target.api(&built.client);
    let from_kubectl = |(ok, said): (bool, String)| {
        if ok {
            Ok(())
        } else {
            let transient = kubectl_unreachable(&said);
            Err((said, transient))
        }
    };
    let failed = |e: kube::Error| {
        let transient = api_unreachable(&e);
        (api_message(e), transient)
    };
    let mut delete = vec!["delete".to_string()];
    delete.extend(target.kubectl_args());
    match how {
        How::KubectlPlain => from_kubectl(kubectl(stack, &delete).await),
        How::KubectlForeground => {
            delete.push("--cascade=foreground".to_string());
            from_kubectl(kubectl(stack, &delete).await)
        }
        How::Orphan | How::OrphanBreakGlass => {
            delete.push("--cascade=orphan".to_string());
            from_kubectl(kubectl(stack, &delete).await)
        }
        How::ApiBackground => objects
            .delete(&target.name, &DeleteParams::background())
            .await
            .map(|_| ())
            .map_err(failed),
        How::ApiNoPolicy => objects
            .delete(&target.name, &DeleteParams::default())
            .await
            .map(|_| ())
            .map_err(failed),
        How::Collection => {
            let by_label = kube::api::ListParams::default()
                .labels(&format!("{TREE_LABEL}={}", built.plan.name));
            objects
                .delete_collection(&DeleteParams::default(), &by_label)
                .await
                .map(|_| ())
                .map_err(failed)
        }
        How::Namespace => {
            let ns = built.namespace.as_deref().expect("a namespace of its own");
            Api::<k8s_openapi::api::core::v1::Namespace>::all(built.client.clone())
                .delete(ns, &DeleteParams::default())
                .await
                .map(|_| ())
                .map_err(failed)
        }
    }
}

/// The command a refusal says works (`kubectl delete ... --cascade=foreground`,
/// or for a claim the patch and the delete).
fn command_in(refusal: &str) -> Option<String> {
    let command = if let Some(rest) = refusal
        .split("Have the claim delete it in the foreground, then delete the claim: ")
        .nth(1)
    {
        rest.split(". To abandon").next()?.trim().to_string()
    } else {
        let rest = refusal
            .split("Delete it with foreground cascading: ")
            .nth(1)?;
        let command = rest.split(" --cascade=foreground").next()?.trim();
        format!("{command} --cascade=foreground")
    };
    Some(command)
}

/// Runs what a refusal says works, as a user would paste it, again while it
/// gets no answer (the API server restarting): Ok also when a retry finds
/// that an earlier try went through.
pub(super) async fn follow(stack: &Stack, command: &str) -> Result<(), String> {
    let mut tries = Tries::new(command);
    loop {
        match follow_once(stack, command).await {
            Ok(()) => return Ok(()),
            Err(said) => {
                if tries.again(kubectl_unreachable(&said), &said).await {
                    continue;
                }
                if tries.went_through(&said) {
                    return Ok(());
                }
                return Err(said);
            }
        }
    }
}

async fn follow_once(stack: &Stack, command: &str) -> Result<(), String> {
    let kubectl_dir = stack
        .kubectl
        .parent()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    let out = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{command} --wait=false"))
        .env("KUBECONFIG", stack.cp.kubeconfig_path())
        .env(
            "PATH",
            format!(
                "{kubectl_dir}:{}",
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .output()
        .await
        .expect("sh runs");
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Deletes `target` with `how` under the tree's mode, asserting what the
/// mode answers: refused (with the command that works, which is then run)
/// for every client Refuse refuses and for an orphaning delete without
/// break-glass, allowed otherwise; Crossplane's webhook may then refuse an
/// object in use.
async fn deliver(stack: &Stack, built: &Built, how: How, target: &Target) -> Outcome {
    let what = built.what();
    let mode = built.plan.mode;
    let claim = built.plan.shape == Shape::Claim;
    if how == How::OrphanBreakGlass {
        let mut tries = Tries::new(&format!("{what}: annotate break-glass"));
        let annotation = json!({"metadata": {"annotations": {BREAK_GLASS: "random shapes: orphaned on purpose"}}});
        loop {
            let patched = target
                .api(&built.client)
                .patch(
                    &target.name,
                    &PatchParams::default(),
                    &Patch::Merge(&annotation),
                )
                .await;
            match patched {
                Ok(_) => break,
                Err(e) => {
                    let said = e.to_string();
                    if !tries.again(api_unreachable(&e), &said).await {
                        panic!("{what}: annotate break-glass: {said}");
                    }
                }
            }
        }
    }
    let refused = match how {
        How::Namespace | How::OrphanBreakGlass => false,
        How::Orphan => mode != Mode::Off,
        // A claim's own propagation counts for nothing under Refuse.
        How::KubectlForeground => claim && mode == Mode::Refuse,
        _ => mode == Mode::Refuse,
    };
    let in_use = |said: &str| said.contains("in-use");
    match send(stack, built, how, target).await {
        Ok(()) => {
            assert!(!refused, "{what}: {how:?} was allowed under {mode:?}");
            Outcome::Allowed
        }
        Err(said) if !refused && in_use(&said) => Outcome::InUse,
        Err(said) => {
            assert!(
                refused && said.contains("cascade-guard refused"),
                "{what}: {how:?} of {} {}: {said}",
                target.resource.kind,
                target.name
            );
            let expected = if claim {
                "compositeDeletePolicy"
            } else if how == How::Orphan {
                "orphaned"
            } else {
                "--cascade=foreground"
            };
            assert!(said.contains(expected), "{what}: the refusal: {said}");
            let command = command_in(&said)
                .unwrap_or_else(|| panic!("{what}: no command in the refusal: {said}"));
            eprintln!("{what}: refused as expected; runs `{command}`");
            match follow(stack, &command).await {
                Ok(()) => Outcome::Allowed,
                Err(said) if in_use(&said) => Outcome::InUse,
                Err(said) => panic!("{what}: `{command}` failed: {said}"),
            }
        }
    }
}

/// Deletes the tree with its plan's client at its delay, waits for it to
/// go, and asserts every edge, nothing wedged or leaked, Crossplane never
/// refused; returns what it saw.
async fn tear_down(stack: &Stack, built: &Built, snapshot: &[Value]) -> String {
    let what = built.what();
    let plan = &built.plan;
    tokio::time::sleep(plan.delay).await;
    let started = Instant::now();
    match plan.shape {
        Shape::Guarded { .. } => {
            let outcome = deliver(stack, built, plan.how, &built.root).await;
            assert_eq!(
                outcome,
                Outcome::InUse,
                "{what}: the guarded cluster's delete"
            );
            let guards = api(&built.client, &cluster_usages(), None);
            futures::future::join_all(built.guards.iter().zip(&plan.releases).map(|(g, after)| {
                let guards = &guards;
                let what = &what;
                async move {
                    tokio::time::sleep(*after).await;
                    let mut tries = Tries::new(&format!("{what}: release {g}"));
                    loop {
                        let Err(e) = guards.delete(g, &DeleteParams::default()).await else {
                            break;
                        };
                        let transient = api_unreachable(&e);
                        let said = api_message(e);
                        if tries.again(transient, &said).await {
                            continue;
                        }
                        assert!(tries.went_through(&said), "{what}: release {g}: {said}");
                        break;
                    }
                }
            }))
            .await;
        }
        Shape::Between { replay, .. } => {
            let hub = built.hub.as_ref().expect("a hub");
            // A new user's attempt on the used XR first: Crossplane's
            // webhook refuses it (and, with replayDeletion, records it).
            let mut delete = vec!["delete".to_string()];
            delete.extend(hub.kubectl_args());
            if plan.mode == Mode::Refuse {
                delete.push("--cascade=foreground".to_string());
            }
            let (ok, said) = kubectl_retrying(stack, &delete).await;
            assert!(
                !ok && said.contains("in-use"),
                "{what}: Crossplane's webhook should refuse the used XR's delete: {said}"
            );
            let outcome = deliver(stack, built, plan.how, &built.root).await;
            assert_eq!(outcome, Outcome::Allowed, "{what}: the user's delete");
            // Nothing replays: its owner deletes it again once it is free
            // (under Off, if its user went at all: a wedge is measured below).
            let mut free = !replay;
            if !replay {
                let usage = built.usage.as_ref().expect("a Usage");
                for (kind, name) in [
                    (&built.root.resource.kind, &built.root.name),
                    (&usage.resource.kind, &usage.name),
                ] {
                    let gone = built
                        .timeline
                        .wait_gone(kind, name, teardown_bound(plan.mode))
                        .await;
                    if gone.is_none() && plan.mode == Mode::Off {
                        free = false;
                        break;
                    }
                    assert!(
                        gone.is_some(),
                        "{what}: {kind}/{name} never left\n{}\n{}",
                        built.states().await,
                        built.timeline.describe()
                    );
                }
            }
            if free {
                let hubs = hub.api(&built.client);
                // Crossplane may be down for a while, then its Usage
                // re-checks its user every 30 s.
                let free = wait::until_lasting(Duration::from_secs(180), || async {
                    let o = hubs.get_opt(&hub.name).await.ok().flatten()?;
                    (!o.labels().contains_key(IN_USE_LABEL)).then_some(())
                })
                .await;
                assert!(free.is_some(), "{what}: {} stayed in use", hub.name);
                let outcome = deliver(stack, built, plan.how, hub).await;
                assert_eq!(outcome, Outcome::Allowed, "{what}: the used XR's delete");
            }
        }
        _ => {
            let outcome = deliver(stack, built, plan.how, &built.root).await;
            assert_eq!(outcome, Outcome::Allowed, "{what}");
        }
    }
    if plan.mode == Mode::Off {
        return off_outcome(stack, built, snapshot, started).await;
    }
    let tally = if plan.how == How::OrphanBreakGlass {
        let root = built
            .timeline
            .wait_gone(
                &built.root.resource.kind,
                &built.root.name,
                SHAPE_TEARDOWN_TIMEOUT,
            )
            .await;
        assert!(
            root.is_some(),
            "{what}: the orphaning delete left the root\n{}",
            built.states().await
        );
        built.clean_up_in_order(snapshot).await;
        // The orphaning delete breaks the edges to the root on purpose (its
        // children stay); every other edge is the clean-up's order within
        // and between the orphaned subtrees, and cascade-guard's within
        // each: kept.
        let root = built.root.object_ref();
        let (to_root, rest): (Vec<_>, Vec<_>) = invariant::edges(snapshot)
            .into_iter()
            .partition(|e| e.needed == root);
        // Real Crossplane can put an orphaned child's owner reference back
        // while it still reconciles the root (BENCHMARKS, "The wedge of run
        // 3"); the garbage collector then deletes that child in the
        // background as the dependent of a gone owner, and its composed
        // resources go after it. Convert makes that delete a cascade; Refuse
        // and Warn let the garbage collector's deletes through by design
        // (README, "What Refuse leaves to the garbage collector"). Only those
        // ownership edges are set apart, only outside Convert, and only for
        // a delete the audit log shows; every other edge must hold.
        let collected = if plan.mode == Mode::Convert {
            BTreeSet::new()
        } else {
            collected_in_background(stack, built)
        };
        let (by_collector, rest): (Vec<_>, Vec<_>) = rest
            .into_iter()
            .partition(|e| e.rule == invariant::Rule::Owner && collected.contains(&e.needed));
        let tally = built.assert_every_edge(snapshot, &rest).await;
        let collected_said = if by_collector.is_empty() {
            String::new()
        } else {
            let (broken, measured) = built.measure_these(snapshot, &by_collector);
            eprintln!(
                "{what}: the garbage collector deleted {collected:?} in the background after the orphaning (Crossplane had put the owner reference back); under {:?} its composed resources went after it: {}",
                plan.mode,
                broken.join("; ")
            );
            format!(
                "; {} edges to what the garbage collector deleted in the background after the orphaning ({measured}), which {:?} lets through by design",
                by_collector.len(),
                plan.mode
            )
        };
        format!(
            "orphaned with break-glass: {} edges to the root broken on purpose{collected_said}; every other edge kept ({} edges: {tally}) by the clean-up in order",
            to_root.len(),
            rest.len()
        )
    } else {
        assert!(
            built.wait_all_gone(SHAPE_TEARDOWN_TIMEOUT).await,
            "{what}: not gone within {SHAPE_TEARDOWN_TIMEOUT:?}: left {:?}\n{}\n{}",
            built.left().await,
            built.states().await,
            built.timeline.describe()
        );
        let edges = invariant::edges(snapshot);
        let tally = built.assert_every_edge(snapshot, &edges).await;
        format!("every edge kept ({} edges: {tally})", edges.len())
    };
    match plan.shape {
        // Crossplane's replay came only after the last guard was deleted.
        // Not after it was gone: Crossplane replays 2 s after it begins to
        // let the last Usage go, and removes the Usage's finalizer after
        // starting that timer (again on a conflict), so under load the
        // finalizer can outlast the replay (seen: seed 1796311242691679263,
        // 12 trees).
        Shape::Guarded { .. } => {
            let last = built
                .guards
                .iter()
                .map(|g| {
                    built
                        .deleted_at("ClusterUsage", g)
                        .expect("a guard was deleted")
                })
                .max_by_key(|r| r.1)
                .expect("a guard");
            let deleted = built
                .deleted_at(&built.root.resource.kind, &built.root.name)
                .expect("the cluster was deleted");
            // Sure: a removal known only within revisions lies wholly before.
            assert!(
                last.1 < deleted.0,
                "{what}: the cluster was deleted (#{deleted:?}) before its last guard was (#{last:?})\n{}",
                built.timeline.describe()
            );
        }
        // The used XR deleted only once its user was gone.
        Shape::Between { .. } => {
            let hub = built.hub.as_ref().expect("a hub");
            let user = built.gone_at(&built.root.resource.kind, &built.root.name);
            let deleted = built
                .deleted_at(&hub.resource.kind, &hub.name)
                .expect("the used XR was deleted");
            assert!(
                user.1 < deleted.0,
                "{what}: {} {} deleted (#{deleted:?}) before its user was gone (#{user:?})\n{}",
                hub.resource.kind,
                hub.name,
                built.timeline.describe()
            );
        }
        _ => {}
    }
    assert_crossplane_never_refused(stack, built);
    let leaked = built.leaked(stack);
    assert!(leaked.is_empty(), "{what}: leaked {leaked:?}");
    format!(
        "{what}: gone in {:?}; {tally}; Crossplane never refused, nothing leaked",
        started.elapsed()
    )
}

/// How long a tree's teardown may take: under Off, how long one is given
/// to do all it will before what it left is measured as wedged.
fn teardown_bound(mode: Mode) -> Duration {
    if mode == Mode::Off {
        OFF_SETTLE
    } else {
        SHAPE_TEARDOWN_TIMEOUT
    }
}

/// Under Off the invariant is measured, not asserted (as the random round's
/// Off trees): once the teardown has done all it will (everything gone, or
/// nothing changed for 45 s, within [`OFF_SETTLE`]; after an orphaning
/// delete, the root gone), every
/// broken edge is printed with what was left and leaked, and the tree is
/// cleaned up completely, so that nothing of it stays for the other tests.
async fn off_outcome(stack: &Stack, built: &Built, snapshot: &[Value], started: Instant) -> String {
    let what = built.what();
    let settled = if built.plan.how == How::Orphan {
        built
            .timeline
            .wait_gone(&built.root.resource.kind, &built.root.name, OFF_SETTLE)
            .await
            .is_some()
    } else {
        // Gone, or still: nothing of the tree has changed for a while (a
        // wedge: what is left waits on finalizers that cannot finish).
        let quiet = Duration::from_secs(45);
        wait::until_lasting(OFF_SETTLE, || async {
            let last_change = built.timeline.entries().iter().map(|e| e.at).max();
            let still = last_change.is_some_and(|at| at.elapsed() > quiet);
            let done = still || built.left().await.is_empty();
            if !done {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            done.then_some(())
        })
        .await
        .is_some()
    };
    let (total, broken, tally) = built.measure_edges(snapshot);
    let left = built.left().await;
    let leaked = built.leaked(stack);
    clean_up_completely(&built.client, &what, &built.objects).await;
    assert_crossplane_never_refused(stack, built);
    format!(
        "{what}: measured under Off after {:?}: {}; cleaned up",
        started.elapsed(),
        off_report(total, &broken, &tally, settled, &left, &leaked)
    )
}

/// The tree's objects the garbage collector deleted with
/// `propagationPolicy: Background`, as the audit log says (its own user, or
/// kube-controller-manager's with the UID precondition it always sends).
fn collected_in_background(stack: &Stack, built: &Built) -> BTreeSet<invariant::ObjectId> {
    let events = local_cluster::audit::read(&audit_log::audit_log(&stack.cp))
        .expect("the API server's audit log");
    let by_collector = |e: &local_cluster::audit::Event| {
        let user = e.effective_username();
        user == local_cluster::GC_SERVICE_ACCOUNT_USER
            || (user == local_cluster::CONTROLLER_MANAGER_USER
                && e.request_object
                    .as_ref()
                    .and_then(|o| o.pointer("/preconditions/uid"))
                    .is_some())
    };
    let mut collected = BTreeSet::new();
    for e in events.iter().filter(|e| {
        e.verb == "delete"
            && !e.dry_run()
            && matches!(e.response_code(), Some(200 | 202))
            && e.propagation_policy() == Some("Background")
            && by_collector(e)
    }) {
        for (r, ns, n) in &built.objects {
            // The group too: helm's and kubernetes' ProviderConfigs share a
            // plural and, in a tree, a name.
            let in_group = e
                .object_ref
                .as_ref()
                .is_some_and(|o| o.api_group == r.group);
            if in_group && e.is_about(&r.plural, ns.as_deref().unwrap_or_default(), n) {
                collected.insert(invariant::ObjectId::new(
                    &r.group,
                    &r.kind,
                    ns.as_deref(),
                    n,
                ));
            }
        }
    }
    collected
}

/// Crossplane (core, a provider) was never refused a write to the tree.
fn assert_crossplane_never_refused(stack: &Stack, built: &Built) {
    let events = local_cluster::audit::read(&audit_log::audit_log(&stack.cp))
        .expect("the API server's audit log");
    let refused = crossplane_refusals(&events, &built.objects);
    assert!(
        refused.is_empty(),
        "{}: Crossplane was refused: {refused:?}\nwhat the logs say of the tree:\n{}\n{}",
        built.what(),
        stack.cp.log_lines_naming(&built.plan.name),
        built.timeline.describe()
    );
}

#[tokio::test]
async fn random_shapes_keep_every_edge() {
    let _clock = TestClock::start();
    let stack = stack().await;
    let mut rng = cascade_guard_testkit::rng::Rng::from_env("seed_real random shapes");
    let seed = rng.0;
    let trees: usize = env_number("CASCADE_GUARD_REAL_SHAPES").unwrap_or(6);
    // scripts/soak.sh runs many rounds, each with faults.
    let rounds: usize = env_number("CASCADE_GUARD_SHAPE_ROUNDS").unwrap_or(1);
    let faulting = std::env::var("CASCADE_GUARD_SHAPE_FAULTS").is_ok_and(|v| v == "1");
    let first_round: usize = env_number("CASCADE_GUARD_SHAPE_FIRST_ROUND").unwrap_or(0);
    // Every draw before anything runs, so that a seed replays the run (and
    // the rounds before the first to run are drawn all the same).
    let draws: Vec<(Vec<Plan>, Vec<Fault>)> = (0..rounds)
        .map(|round| {
            let plans = (0..trees)
                .map(|i| Plan::draw(&mut rng, round, rounds, i))
                .collect();
            // One to three: several faults per tree.
            let faults = if faulting {
                draw_faults(&mut rng, 1)
            } else {
                Vec::new()
            };
            (plans, faults)
        })
        .collect();
    eprintln!("random shapes: CASCADE_GUARD_SEED={seed}; {rounds} round(s) of {trees} trees");
    for (round, (plans, faults)) in draws.iter().enumerate() {
        eprintln!(
            "random shapes: round {round}: {}; faults {}",
            joined(plans),
            faults_said(faults)
        );
    }
    let started = Instant::now();
    // Without faults the test shares the stack with the others (its share
    // keeps the randomized round's kills away); with them, each round
    // builds beside the others, then has the stack to itself.
    let shared = stack.fault_window.share().await;
    let modes: Vec<Mode> = [Mode::Off, Mode::Refuse, Mode::Convert]
        .into_iter()
        .filter(|m| {
            draws
                .iter()
                .skip(first_round)
                .flat_map(|(p, _)| p)
                .any(|p| p.mode == *m)
        })
        .collect();
    let installed =
        futures::future::join_all(modes.iter().map(|m| Kinds::install(stack, *m))).await;
    let kinds = |mode: Mode| {
        let at = modes.iter().position(|m| *m == mode).expect("installed");
        &installed[at]
    };
    let mut shared = Some(shared);
    for (round, (plans, faults)) in draws.iter().enumerate().skip(first_round) {
        if shared.is_none() {
            shared = Some(stack.fault_window.share().await);
        }
        let built = futures::future::join_all(
            plans
                .iter()
                .map(|p| Built::build(stack, kinds(p.mode), p.clone())),
        )
        .await;
        eprintln!(
            "random shapes: round {round}: {trees} trees built in {:?}",
            started.elapsed()
        );
        let owner = if faulting {
            drop(shared.take());
            let waited = TestClock::part(" (waiting for the other tests)");
            let owner = stack.fault_window.own().await;
            drop(waited);
            Some(owner)
        } else {
            None
        };
        // Each tree's objects before the first delete and the first fault:
        // every edge they state (cascade_guard_testkit::invariant) is checked after its
        // teardown.
        let snapshots: Vec<Vec<Value>> =
            futures::future::join_all(built.iter().map(Built::snapshot)).await;
        let said = shapes_round(stack, &built, &snapshots, faults).await;
        for line in &said {
            eprintln!("{line}");
        }
        drop(owner);
        eprintln!(
            "random shapes: round {round}: {trees} trees, faults {}: done at {:?}",
            faults_said(faults),
            started.elapsed()
        );
    }
    // No write by Crossplane, a provider or the garbage collector (anyone
    // but the test's admin) was ever refused by cascade-guard.
    let writes = local_cluster::audit::read_writes(&audit_log::audit_log(&stack.cp))
        .expect("the API server's audit log");
    let refused_writes: Vec<String> = writes
        .iter()
        .filter(|e| e.refused_by_cascade_guard() && e.effective_username() != "admin")
        .map(|e| format!("{} {} {:?}", e.effective_username(), e.verb, e.object_ref))
        .collect();
    assert!(
        refused_writes.is_empty(),
        "random shapes: writes refused by cascade-guard: {refused_writes:?}"
    );
    let ran = rounds.saturating_sub(first_round);
    eprintln!(
        "random shapes: {} trees in {ran} round(s) (from round {first_round}) in {:?}",
        ran * trees,
        started.elapsed()
    );
}

/// A number from the environment, if it is set and one.
fn env_number(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|n| n.parse().ok())
}

/// One round's teardowns, with its faults at their moments: what each tree
/// came to. With an API server restart among the faults, the removals the
/// timelines miss are swept for every 2 seconds until the last tree is done.
async fn shapes_round(
    stack: &Stack,
    built: &[Built],
    snapshots: &[Vec<Value>],
    faults: &[Fault],
) -> Vec<String> {
    let started = Instant::now();
    let chaos = futures::future::join_all(faults.iter().map(|f| run_fault(stack, *f, started)));
    let teardowns = futures::future::join_all(
        built
            .iter()
            .zip(snapshots)
            .map(|(b, snapshot)| tear_down(stack, b, snapshot)),
    );
    let restarts = faults.iter().any(|f| f.kind == FaultKind::ApiServer);
    let done = std::sync::atomic::AtomicBool::new(false);
    let sweeper = async {
        while restarts && !done.load(std::sync::atomic::Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let swept: Vec<Swept<'_>> = built.iter().map(Built::swept).collect();
            sweep_missed(&swept, snapshots).await;
        }
    };
    let work = async {
        let (_, said) = tokio::join!(chaos, teardowns);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        said
    };
    let (_, said) = tokio::join!(sweeper, work);
    if !faults.is_empty() {
        let replicas = stack.restart_controller();
        let crossplane = stack.restart_crossplane();
        eprintln!(
            "random shapes: after the faults, started again: cascade-guard {replicas:?}, Crossplane {crossplane:?}"
        );
    }
    said
}
