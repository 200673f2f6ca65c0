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
//! A reference the provider resolves (Upjet's `<field>Ref`), in each mode: the
//! local cloud's LoadBalancer selects its Cluster, nothing else ties them;
//! Off leaks the load balancer, Refuse and Convert keep the Cluster until it
//! is gone (seed_real/references.rs).
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
//! objects state just before the deletes (`cascade_guard_testkit::invariant`, read
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

use cascade_guard_testkit::audit_log;
use cascade_guard_testkit::chart;
#[path = "seed_real/claims.rs"]
mod claims;
#[path = "seed_real/consumers.rs"]
mod consumers;
#[path = "seed_real/dropped.rs"]
mod dropped;
#[path = "seed_real/fault_window.rs"]
mod fault_window;
#[path = "seed_real/guard.rs"]
mod guard;
#[path = "seed_real/outside_config.rs"]
mod outside_config;
#[path = "seed_real/random_trees.rs"]
mod random_trees;
#[path = "seed_real/references.rs"]
mod references;
#[path = "seed_real/replayed.rs"]
mod replayed;
#[path = "seed_real/scene.rs"]
mod scene;
#[path = "seed_real/seed_tree.rs"]
mod seed_tree;
#[path = "seed_real/shapes.rs"]
mod shapes;
#[path = "seed_real/siblings.rs"]
mod siblings;
#[path = "seed_real/stack.rs"]
mod stack;
#[path = "seed_real/tree.rs"]
mod tree;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Mutex as StdMutex;
use std::time::{Duration, Instant};

use cascade_guard_testkit::invariant;
use claims::*;
use dropped::*;
use fault_window::FaultWindow;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PropagationPolicy};
use kube::{Api, Client, ResourceExt};
use local_cluster::process::{self, Lifetime, Process};
use local_cluster::real_crossplane::modelplane::{self, SYSTEM_NAMESPACE};
use local_cluster::real_crossplane::{Crossplane, CrossplaneOptions};
use local_cluster::timeline::Timeline;
use local_cluster::{Binaries, ControlPlane, Options, wait};
use random_trees::*;
use seed_tree::*;
use serde_json::{Value, json};
use stack::*;
use tokio::sync::OnceCell;
use tree::*;

const POLICY_ANNOTATION: &str = "cascade-guard.dev/deletion-policy";
const HOLD_FINALIZER: &str = "cascade-guard.dev/foreground-cascade";
const MANAGED_FINALIZER: &str = "finalizer.managedresource.crossplane.io";
const IN_USE_LABEL: &str = "crossplane.io/in-use";
/// A tree takes a cloud cluster's start and Crossplane's steps to build.
const BUILD_TIMEOUT: Duration = Duration::from_secs(600);
/// A teardown waits for the Usage's 30 s re-check, the load balancer's 40 s
/// and the creation grace period, and for sibling order's looks, each of
/// which lets go of one wave: under CI's load (compat.sh's control planes
/// beside these 16 tests) a look took 82 s, and four teardowns in order
/// passed 300 s (CI at cf339f3). A bound on waiting, not a goal: a teardown
/// that wedges never ends.
const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(480);
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

// The tests, named here so that their names stay those scripts/compat.sh
// runs; each is its scenario's module's function of the same name.

// The seed's tree in each mode (seed_real/seed_tree.rs).
#[tokio::test]
async fn without_its_usage_the_seed_tree_still_tears_down_in_order_under_convert() {
    seed_tree::without_its_usage_the_seed_tree_still_tears_down_in_order_under_convert().await;
}

#[tokio::test]
async fn without_its_usage_a_foreground_delete_under_refuse_keeps_the_order() {
    seed_tree::without_its_usage_a_foreground_delete_under_refuse_keeps_the_order().await;
}

#[tokio::test]
async fn without_its_usage_a_foreground_cascade_alone_wedges_the_gateway() {
    seed_tree::without_its_usage_a_foreground_cascade_alone_wedges_the_gateway().await;
}

#[tokio::test]
async fn without_cascade_guard_a_plain_delete_wedges_the_serving_stack_and_leaks_its_load_balancer()
{
    seed_tree::without_cascade_guard_a_plain_delete_wedges_the_serving_stack_and_leaks_its_load_balancer().await;
}

#[tokio::test]
async fn refuse_refuses_the_plain_delete_and_a_foreground_delete_tears_down_in_order() {
    seed_tree::refuse_refuses_the_plain_delete_and_a_foreground_delete_tears_down_in_order().await;
}

#[tokio::test]
async fn convert_tears_a_plain_delete_down_in_order() {
    seed_tree::convert_tears_a_plain_delete_down_in_order().await;
}

// A legacy claim in each mode (seed_real/claims.rs).
#[tokio::test]
async fn deleting_a_legacy_claim_ends_gone_in_order_or_says_which_command_works() {
    claims::deleting_a_legacy_claim_ends_gone_in_order_or_says_which_command_works().await;
}

#[tokio::test]
async fn convert_tears_a_deleted_namespace_holding_a_claim_down_in_order() {
    claims::convert_tears_a_deleted_namespace_holding_a_claim_down_in_order().await;
}

// Random trees, clients and faults (seed_real/random_trees.rs).
#[tokio::test]
async fn random_trees_clients_and_kills_never_lose_a_cluster_first() {
    random_trees::random_trees_clients_and_kills_never_lose_a_cluster_first().await;
}

// A nested XR dropped from its Composition (seed_real/dropped.rs).
#[tokio::test]
async fn crossplane_deleting_a_dropped_composite_is_never_refused() {
    dropped::crossplane_deleting_a_dropped_composite_is_never_refused().await;
}

// The consumers of an InferenceCluster (seed_real/consumers.rs).
#[tokio::test]
async fn without_cascade_guard_the_consumers_race_wedges_an_engine_and_leaks_its_load_balancer() {
    consumers::without_cascade_guard_the_consumers_race_wedges_an_engine_and_leaks_its_load_balancer().await;
}

#[tokio::test]
async fn refuse_refuses_the_consumers_plain_deletes_and_foreground_tears_down_in_order() {
    consumers::refuse_refuses_the_consumers_plain_deletes_and_foreground_tears_down_in_order()
        .await;
}

#[tokio::test]
async fn convert_tears_the_consumers_down_in_order() {
    consumers::convert_tears_the_consumers_down_in_order().await;
}

#[tokio::test]
async fn convert_tears_a_deleted_namespace_down_in_order() {
    consumers::convert_tears_a_deleted_namespace_down_in_order().await;
}

// A replayed Background delete (seed_real/replayed.rs).
#[tokio::test]
async fn a_replayed_background_delete_under_refuse_leaves_nothing_stuck_and_says_why() {
    replayed::a_replayed_background_delete_under_refuse_leaves_nothing_stuck_and_says_why().await;
}
