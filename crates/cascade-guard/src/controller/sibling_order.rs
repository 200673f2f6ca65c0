//! Ordered teardown: keeps the hold label ([`hold`](crate::policy::sibling::hold)) on
//! every object of a live tree of a Refuse or Convert kind that a sibling
//! still needs, so that whatever deletes the tree (a foreground cascade, a
//! namespace deletion) cannot take it before what needs it is gone; and
//! when nothing needs it any more, takes the label away and deletes it if
//! its parent is being deleted.
//!
//! A loop over a metadata watch of each such kind ([`mirror`]): every tick
//! it reads the trees whose root changed, is being deleted, is new or young,
//! or has not been read for a resync period. The tree, what it references
//! and the graph are the ones `cascade-guard plan` shows.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{DeleteParams, DynamicObject, Preconditions, PropagationPolicy};
use kube::core::Selector;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::Value;
use tokio::sync::watch;

use std::sync::Arc;

use super::MANAGER;
use super::telemetry::Metrics;
use crate::cluster::kinds::{Served, ServedKinds};
use crate::cluster::tree::{TreeRead, Usages, read_tree};
use crate::cluster::unhold;
use crate::cluster::unhold::LetGo;
use crate::policy::drift::first_difference;
use crate::policy::holders::IN_USE_LABEL;
use crate::policy::sibling::gate::{GatedKind, TreeOrder};
use crate::policy::sibling::graph as order;
use crate::policy::sibling::hold::{Action, actions};
use crate::policy::sibling::hold_policy::{HOLD_OBJECT_NAME, RECORD_GUARD_NAME};
use crate::policy::sibling::object::ObjectRef;
use crate::policy::sibling::provider_config_usage::{self as usage, tracked_usages};
use crate::policy::sibling::roots::Listed;
use crate::policy::{CompileSettings, Mode, Policy, Shape};

mod entries;
mod gate;
mod holds;
mod mirror;
mod record;
use gate::Gate;
use holds::Holds;
use mirror::{Candidate, Look, Mirror};

/// How often the loop looks.
const TICK: Duration = Duration::from_secs(1);
/// How often it looks while a tree it holds is being deleted: the next wave
/// waits for the hold to be let go, so this is the latency it adds per
/// level of a teardown (Crossplane's Usage adds up to 30 s).
const TEARDOWN_TICK: Duration = Duration::from_millis(200);
/// A tree this young (seconds since its root was created) is read every tick.
const SETTLING_SECS: i64 = 120;
/// Discovery (which kinds exist, in which versions) is read again this often.
const DISCOVERY_EVERY: Duration = Duration::from_secs(30);
/// A look that takes longer than this is logged.
const SLOW_LOOK: Duration = Duration::from_secs(10);
/// How many lists, or trees, are read at once in a tick.
const READS_AT_ONCE: usize = 8;
/// How many trees are read before they are written: the reads overlap, and
/// what is held in memory stays bounded.
const READ_BATCH: usize = 32;

/// A root whose tree is read this tick.
struct Due {
    /// See [`rank`].
    rank: u8,
    uid: String,
    rv: String,
    kind: String,
    served: Served,
    namespace: Option<String>,
    name: String,
}

/// What the loop remembers of a root's last read, as it bears on the next.
#[derive(Clone, Copy)]
struct Last {
    /// Its resourceVersion is not the one read.
    changed: bool,
    /// Being deleted, young, or with labels to write when last read.
    active: bool,
    /// Not read for a resync period.
    resync_due: bool,
}

/// Whether a root's tree is read this look, and how soon: 0 being deleted,
/// 1 never read (those are what a late look costs), 2 changed or active,
/// 3 only its resync due.
fn rank(deleting: bool, last: Option<Last>) -> Option<u8> {
    match last {
        _ if deleting => Some(0),
        None => Some(1),
        Some(l) if l.changed || l.active => Some(2),
        Some(l) if l.resync_due => Some(3),
        Some(_) => None,
    }
}

/// How often the loop looks over every root when nothing changed and no tree
/// is active: what is due then is only resyncs.
const QUIET_LOOK: Duration = Duration::from_secs(10);

/// The most trees one look reads. The rest stay due and are read by the next
/// looks, in rank: a look over 100,000 new roots would otherwise take minutes
/// before a tree being deleted is read again.
const READS_PER_LOOK: usize = 512;
/// The most trees one look reads only because their resync is due: with
/// 100,000 roots, reading each every resync period (300 s) would be 330
/// reads a second at rest; this makes a full resync longer instead.
const RESYNCS_PER_LOOK: usize = 32;

/// Keeps what one look reads of `due`, sorted by rank.
fn take_this_look<T>(due: &mut Vec<T>, rank: impl Fn(&T) -> u8) {
    let mut resyncs = 0;
    due.retain(|d| {
        if rank(d) < 3 {
            return true;
        }
        resyncs += 1;
        resyncs <= RESYNCS_PER_LOOK
    });
    due.truncate(READS_PER_LOOK);
}

/// The kinds whose trees are ordered: Refuse and Convert ones, each with the
/// selectors of its policies (none: every object).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OrderedKinds(Vec<(String, String, Vec<Selector>, Shape)>);

impl OrderedKinds {
    pub fn of(policies: &[Policy]) -> Self {
        let mut kinds: Vec<(String, String, Vec<Selector>, Shape)> = Vec::new();
        for p in policies
            .iter()
            .filter(|p| matches!(p.mode, Mode::Refuse | Mode::Convert))
        {
            let selector = p
                .selector
                .clone()
                .and_then(|s| Selector::try_from(s).ok())
                .unwrap_or_default();
            match kinds
                .iter_mut()
                .find(|(g, k, _, _)| *g == p.kind.group && *k == p.kind.kind)
            {
                Some((_, _, selectors, _)) => selectors.push(selector),
                None => kinds.push((
                    p.kind.group.clone(),
                    p.kind.kind.clone(),
                    vec![selector],
                    p.kind.shape,
                )),
            }
        }
        Self(kinds)
    }
}

/// Starts the loop; the controller sends it the ordered kinds after every
/// complete pass. Until the first arrives the loop does nothing: with no
/// kinds known, every held object would look orphaned, and letting go of them
/// at a restart or a leader's change would let a tree being torn down lose
/// its order (found by the randomized real-Crossplane test).
pub fn start(
    client: Client,
    namespace: String,
    refuse_unordered: bool,
    settings: CompileSettings,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    resync: Duration,
) -> watch::Sender<Option<OrderedKinds>> {
    let (tx, mut rx) = watch::channel(None::<OrderedKinds>);
    let mut order = SiblingOrder {
        gate: Gate::new(
            client.clone(),
            namespace.clone(),
            refuse_unordered,
            settings.clone(),
        ),
        holds: Holds::new(client.clone(), namespace, settings),
        client,
        recorder,
        metrics,
        resync,
        roots: HashMap::new(),
        mirrors: HashMap::new(),
        usage_mirrors: HashMap::new(),
        usage_versions: HashMap::new(),
        members: HashMap::new(),
        held_counts: HashMap::new(),
        kinds: None,
        reported: HashMap::new(),
        warned: BTreeSet::new(),
        swept: None,
        read_every_tree: false,
        last_look: None,
        backlog: false,
        tearing_down: false,
    };
    tokio::spawn(async move {
        while rx.borrow_and_update().is_none() {
            if rx.changed().await.is_err() {
                return;
            }
        }
        loop {
            let kinds = rx.borrow().clone().unwrap_or_default();
            let started = Instant::now();
            order.tick(&kinds).await;
            tokio::time::sleep(pause(order.tearing_down, started.elapsed())).await;
        }
    });
    tx
}

/// The pause after a look. A look reads up to READS_PER_LOOK trees, which
/// takes a while when very many are due at once (100,000 new objects of
/// ordered kinds) or the API server is slow: the pause grows with the look,
/// so that the loop reads for at most half of the time (four fifths while a
/// tree is torn down, where the pause is what each level of the teardown
/// waits), but never past MAX_PAUSE: a new tree waits for the look after
/// the pause, and a pause as long as a 216-s look under a loaded CI kept
/// new trees from their holds for seven minutes.
fn pause(tearing_down: bool, look: Duration) -> Duration {
    if tearing_down {
        TEARDOWN_TICK.max(look / 4).min(MAX_PAUSE / 4)
    } else {
        TICK.max(look).min(MAX_PAUSE)
    }
}

/// The roots of the trees a Usage's users are in, when the Usage is new or
/// changed since `versions` (by uid): each owner that is a root, or the root
/// of the tree an owner was read in (`members`). Unchanged: none.
fn users_roots(
    usage: &mirror::Candidate,
    versions: &HashMap<String, String>,
    is_root: impl Fn(&str) -> bool,
    members: &HashMap<String, String>,
) -> Vec<String> {
    if versions.get(&usage.uid) == Some(&usage.entry.rv) {
        return Vec::new();
    }
    usage
        .entry
        .owners
        .iter()
        .filter_map(|owner| {
            if is_root(owner) {
                Some(owner.clone())
            } else {
                members.get(owner).cloned()
            }
        })
        .collect()
}

/// The longest pause between two looks.
const MAX_PAUSE: Duration = Duration::from_secs(10);

struct SiblingOrder {
    client: Client,
    /// Says, for the admission gate, how each root's tree stands.
    gate: Gate,
    /// A watch of each ordered kind, by group and kind.
    mirrors: HashMap<(String, String), Mirror>,
    /// A watch of each Usage kind served: a Usage made or changed makes the
    /// tree of its user due, also a settled one whose root did not change.
    usage_mirrors: HashMap<(String, String), Mirror>,
    /// Each Usage's resourceVersion at the last look.
    usage_versions: HashMap<String, String>,
    /// The root of each object read in a tree of more than one object, for
    /// a Usage whose user is inside a tree.
    members: HashMap<String, String>,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    /// How many objects each root's tree holds, as last read.
    held_counts: HashMap<String, usize>,
    resync: Duration,
    /// Each root read: its resourceVersion then, when, and whether its tree
    /// is active (then it is read every tick).
    roots: HashMap<String, (String, Instant, bool)>,
    kinds: Option<(ServedKinds, Instant)>,
    /// What it holds, and the hold policy.
    holds: Holds,
    /// The problems last reported per root, so each is an Event once.
    reported: HashMap<String, BTreeSet<String>>,
    /// Warnings already logged, each once.
    warned: BTreeSet<String>,
    /// When every kind was last searched for objects held by a root that is
    /// no longer ordered.
    swept: Option<Instant>,
    /// Every root has been read once since the start (said once, in the log).
    read_every_tree: bool,
    /// When the last whole look was, for which kinds, and the generation of
    /// each kind's mirror then.
    last_look: Option<(Instant, OrderedKinds, Vec<u64>)>,
    /// The last look left trees for the next that are due for more than
    /// their resync.
    backlog: bool,
    /// A tree read in the last tick is being deleted while something in it
    /// is held.
    tearing_down: bool,
}

impl SiblingOrder {
    async fn tick(&mut self, ordered: &OrderedKinds) {
        if ordered.0.is_empty() && self.roots.is_empty() && self.swept.is_some() {
            return;
        }
        let started = Instant::now();
        let stale = self
            .kinds
            .as_ref()
            .is_none_or(|(_, at)| at.elapsed() > DISCOVERY_EVERY);
        if stale {
            match ServedKinds::discover(&self.client).await {
                Ok(kinds) => self.kinds = Some((kinds, Instant::now())),
                Err(e) => tracing::warn!(error = %e, "sibling order: cannot discover the API"),
            }
        }
        let Some((kinds, discovered)) = self.kinds.take() else {
            return;
        };
        self.holds.prepare(&kinds, self.resync).await;
        let mut seen = BTreeSet::new();
        // A kind that could not be listed hides its roots: nothing is let go
        // as orphaned in such a tick.
        let mut listed_all = true;
        let was_tearing_down = std::mem::take(&mut self.tearing_down);
        // Every kind listed, and every due tree read, several at once: one
        // at a time, a pass over many trees on a loaded API server took
        // minutes, and a tree created meanwhile went that long unordered
        // (seen in CI). The reads only read; the writes below stay in order.
        let client = &self.client.clone();
        // Owned inputs: a closure over borrowed ones is not general enough
        // for the spawned loop.
        let listable: Vec<(String, String, Vec<Selector>, Served)> = ordered
            .0
            .iter()
            .filter_map(|(group, kind, selectors, _)| {
                let served = kinds.of_kind(Some(group), kind).next().cloned()?;
                Some((group.clone(), kind.clone(), selectors.clone(), served))
            })
            .collect();
        // Every ordered kind served is gated, listable or not: a kind the
        // controller cannot read has no tree it ordered.
        let gated: Vec<GatedKind> = ordered
            .0
            .iter()
            .filter_map(|(group, kind, _, shape)| {
                let served = kinds.of_kind(Some(group), kind).next()?;
                Some(GatedKind {
                    group: group.clone(),
                    plural: served.0.plural.clone(),
                    shape: *shape,
                })
            })
            .collect();
        // A watch of each ordered kind served, in the version served; none of
        // the others.
        self.mirrors.retain(|(group, kind), mirror| {
            listable
                .iter()
                .any(|(g, k, _, served)| g == group && k == kind && *served == mirror.served)
        });
        for (group, kind, _, served) in &listable {
            self.mirrors
                .entry((group.clone(), kind.clone()))
                .or_insert_with(|| Mirror::start(client, served));
        }
        let usage_kinds = Usages::kinds(&kinds);
        self.usage_mirrors
            .retain(|_, mirror| usage_kinds.contains(&mirror.served));
        for served in &usage_kinds {
            self.usage_mirrors
                .entry((served.0.group.clone(), served.0.kind.clone()))
                .or_insert_with(|| Mirror::start(client, served));
        }
        // At rest (nothing changed in any ordered kind, no tree active), a
        // look only every QUIET_LOOK: each goes over every root, which at
        // 100,000 roots took a fifth of a core every second.
        let generations: Vec<u64> = listable
            .iter()
            .map(|(g, k, _, _)| {
                self.mirrors
                    .get(&(g.clone(), k.clone()))
                    .map_or(u64::MAX, Mirror::generation)
            })
            .chain(usage_kinds.iter().map(|s| {
                self.usage_mirrors
                    .get(&(s.0.group.clone(), s.0.kind.clone()))
                    .map_or(u64::MAX, Mirror::generation)
            }))
            .collect();
        let unchanged = self.last_look.as_ref().is_some_and(|(at, o, gens)| {
            o == ordered && *gens == generations && at.elapsed() < QUIET_LOOK
        });
        if unchanged
            && !was_tearing_down
            && !self.backlog
            && !self.roots.values().any(|(_, _, active)| *active)
        {
            if self.holds.write(&kinds).await {
                self.gate.write(&gated, self.resync).await;
            }
            self.kinds = Some((kinds, discovered));
            return;
        }
        self.last_look = Some((Instant::now(), ordered.clone(), generations));
        let mut listed = Listed::default();
        let mut listed_kinds = HashSet::new();
        let mut ok = Vec::new();
        for (group, kind, selectors, served) in listable {
            let Some(mirror) = self.mirrors.get(&(group.clone(), kind.clone())) else {
                listed_all = false;
                continue;
            };
            match mirror.look(&selectors) {
                Look::Listed(uids, candidates) => {
                    listed.add_kind(&group, &kind, uids.iter().map(String::as_str));
                    listed_kinds.insert(format!("{kind}.{group}"));
                    ok.push((kind, served, candidates));
                }
                Look::Pending => listed_all = false,
                Look::Failing(e) => {
                    listed_all = false;
                    // Said once per kind: without list (RBAC: the chart's
                    // protectedGroups) the kind's trees are not ordered.
                    if self.warned.insert(format!("list {group}/{kind}")) {
                        tracing::warn!(%kind, %group, error = %e, "sibling order: cannot list this kind; its trees are not ordered (cascade-guard needs get, list, watch, patch and delete on the group: the chart's protectedGroups)");
                    }
                }
            }
        }
        let poked = self.poked_by_usages();
        let mut due = Vec::new();
        for (kind, served, candidates) in ok {
            for c in candidates {
                // Its controller gone too: what an orphan delete of the root
                // left behind, which the garbage collector may delete next.
                if !listed.is_root(&c.entry.controllers) {
                    continue;
                }
                let Candidate {
                    uid,
                    entry:
                        mirror::Entry {
                            rv,
                            namespace,
                            name,
                            deleting,
                            ..
                        },
                } = c;
                seen.insert(uid.clone());
                let last = self.roots.get(&uid).map(|(last_rv, at, active)| Last {
                    changed: *last_rv != rv || poked.contains(&uid),
                    active: *active,
                    resync_due: at.elapsed() > self.resync,
                });
                if let Some(rank) = rank(deleting, last) {
                    due.push(Due {
                        rank,
                        uid,
                        rv,
                        kind: kind.clone(),
                        served: served.clone(),
                        namespace,
                        name,
                    });
                }
            }
        }
        due.sort_by_key(|d| d.rank);
        if !self.read_every_tree && listed_all && !due.iter().any(|d| d.rank == 1) {
            self.read_every_tree = true;
            // Until then a tree's holds are those it had at the start.
            tracing::info!(roots = seen.len(), "sibling order: every tree read once");
        }
        let urgent = |due: &[Due]| due.iter().filter(|d| d.rank < 3).count();
        let urgent_due = urgent(&due);
        take_this_look(&mut due, |d| d.rank);
        // Trees left for the next looks but resyncs: those come every tick,
        // not quiet.
        self.backlog = urgent(&due) < urgent_due;
        let trees_read = due.len();
        let kinds_read = &kinds;
        // Read a batch at a time, READS_AT_ONCE in flight, then written: a
        // write while reads are in flight stalls them (a stream's reads make
        // progress only while it is polled: 31de24a wrote each tree as it
        // came, and under a loaded CI a look at 22 trees took 216 s), and
        // all of a look's trees collected were a GiB at 100,000 young ones.
        let mut due = due.into_iter().peekable();
        while due.peek().is_some() {
            let batch: Vec<Due> = due.by_ref().take(READ_BATCH).collect();
            // The Usages as the batch starts: one that appears after is
            // read at the tree's next look.
            let usages = Usages::list(client, kinds_read).await;
            let usages = &usages;
            let held: HashMap<String, BTreeSet<ObjectRef>> = batch
                .iter()
                .map(|d| (d.uid.clone(), self.holds.held_for(&d.uid)))
                .collect();
            let held = &held;
            let read: Vec<_> = futures::stream::iter(batch.into_iter().map(|d| async move {
                let root = ServedKinds::api(client, &d.served, d.namespace.as_deref())
                    .get_opt(&d.name)
                    .await;
                let tree = match &root {
                    Ok(Some(root)) => {
                        let none = BTreeSet::new();
                        let held = held.get(&d.uid).unwrap_or(&none);
                        Some(read_tree(client, kinds_read, root, usages, held).await)
                    }
                    _ => None,
                };
                (d, root, tree)
            }))
            .buffered(READS_AT_ONCE)
            .collect()
            .await;
            for (d, root, tree) in read {
                match (root, tree) {
                    (Ok(Some(root)), Some(tree)) => {
                        let active = self.reconcile(&kinds, &root, tree).await;
                        self.roots.insert(d.uid, (d.rv, Instant::now(), active));
                    }
                    (Ok(_), _) => {}
                    (Err(e), _) => {
                        tracing::warn!(kind = %d.kind, error = %e, "sibling order: cannot read")
                    }
                }
            }
        }
        // A root that left (gone, relabelled out, its kind no longer
        // ordered) leaves what it held: let go. Told by the root's own kind,
        // so that a kind that cannot be listed keeps only its own roots'
        // holds; and not before a first whole look after the start, so that
        // a start lets go of nothing it has not looked at.
        let lost_root = self.roots.keys().any(|uid| !seen.contains(uid));
        // A root that left while its tree was torn down may leave a held
        // Usage to delete now (its user is gone): look once more quickly.
        self.tearing_down |= was_tearing_down && lost_root;
        let ordered_kinds: HashSet<String> = ordered
            .0
            .iter()
            .map(|(group, kind, _, _)| format!("{kind}.{group}"))
            .collect();
        let left = self.holds.release_roots_but(|root, root_kind| {
            let gone = if root_kind.is_empty() {
                // Taken in from an old label: its kind is not known.
                listed_all
            } else if !ordered_kinds.contains(root_kind) {
                true
            } else {
                listed_kinds.contains(root_kind)
            };
            seen.contains(root) || !gone
        });
        if !left.is_empty() {
            tracing::info!(
                released = left.len(),
                "sibling order: let go of objects whose tree is no longer ordered"
            );
        }
        self.let_go_all(&kinds, &left).await;
        self.swept = Some(Instant::now());
        // Forgotten only when every kind was listed: a root that left is
        // still noticed (and its holds let go) once the listing is whole.
        if listed_all {
            if self.read_every_tree {
                self.gate.forget_others(|uid| seen.contains(uid));
            }
            self.roots.retain(|uid, _| seen.contains(uid));
            self.members.retain(|_, root| seen.contains(root));
            self.reported.retain(|uid, _| seen.contains(uid));
            self.held_counts.retain(|uid, _| seen.contains(uid));
        }
        // What is held first: the gate's record says a tree is ordered
        // only once its holds are written (the API server reads both through
        // one informer, in order).
        if self.holds.write(&kinds).await {
            self.gate.write(&gated, self.resync).await;
        }
        self.metrics.set_sibling_order(
            self.held_counts.values().sum(),
            self.reported.values().map(BTreeSet::len).sum(),
        );
        // A new tree waits for its first read up to a look: say when looks
        // are slow (an overloaded API server, very many young trees).
        if started.elapsed() > SLOW_LOOK {
            tracing::info!(
                seconds = started.elapsed().as_secs(),
                kinds = ordered.0.len(),
                trees_read,
                "sibling order: a slow look; new trees wait this long for their holds"
            );
        }
        // Put back with the time of its discovery, so that it is read again
        // every DISCOVERY_EVERY and a kind served later is found.
        self.kinds = Some((kinds, discovered));
    }

    /// The roots whose trees a Usage made or changed since the last look
    /// names as its user (Crossplane makes the user the Usage's owner): the
    /// root itself, or the root of the tree it was read in.
    fn poked_by_usages(&mut self) -> HashSet<String> {
        let mut poked = HashSet::new();
        let mut listed_all = true;
        let mut now = HashMap::new();
        for mirror in self.usage_mirrors.values() {
            let usages = match mirror.look(&[Selector::default()]) {
                Look::Listed(_, usages) => usages,
                Look::Pending => {
                    listed_all = false;
                    continue;
                }
                Look::Failing(e) => {
                    listed_all = false;
                    let kind = &mirror.served.0.kind;
                    if self.warned.insert(format!("watch {kind}")) {
                        tracing::warn!(%kind, error = %e, "sibling order: cannot watch this kind; a new one is seen at its tree's next read, within the resync period (cascade-guard needs watch on Usages and ClusterUsages)");
                    }
                    continue;
                }
            };
            for usage in usages {
                poked.extend(users_roots(
                    &usage,
                    &self.usage_versions,
                    |uid| self.roots.contains_key(uid),
                    &self.members,
                ));
                now.insert(usage.uid, usage.entry.rv);
            }
        }
        if listed_all {
            self.usage_versions = now;
        } else {
            self.usage_versions.extend(now);
        }
        poked
    }

    /// Brings one tree's labels to what its graph says; true while anything
    /// in it is being deleted or was just changed, or the tree is young (it
    /// is then read every tick).
    async fn reconcile(
        &mut self,
        kinds: &ServedKinds,
        root: &DynamicObject,
        read: TreeRead,
    ) -> bool {
        let Some(root_uid) = root.uid() else {
            return false;
        };
        let graph = match order::graph(&read.objects, &root_uid) {
            Ok(graph) => graph,
            Err(e) => {
                tracing::warn!(error = %e, "sibling order: the root vanished from its own tree");
                return false;
            }
        };
        // Held for this tree: an object it only references may be held for
        // another.
        let held_now = self.holds.held_for(&root_uid);
        let mut in_use = BTreeSet::new();
        let mut by_ref: HashMap<ObjectRef, &Value> = HashMap::new();
        for v in &read.objects {
            let Some(r) = ObjectRef::of_object(v) else {
                continue;
            };
            let labels = v.pointer("/metadata/labels");
            if labels
                .and_then(|l| l.get(IN_USE_LABEL))
                .and_then(Value::as_str)
                == Some("true")
            {
                in_use.insert(r.clone());
            }
            by_ref.insert(r, v);
        }
        self.report(root, &graph, &read.unread).await;
        // The ProviderConfigUsages of the tree's managed resources: held by
        // key, never read.
        let tracked: BTreeSet<ObjectRef> = tracked_usages(&graph)
            .into_iter()
            .map(|t| t.usage)
            .collect();
        // Held for this root, and not in its tree as read (gone, or held by
        // an older release for a tree that changed): nothing explains the
        // hold any more.
        let unexplained: Vec<ObjectRef> = held_now
            .iter()
            .filter(|r| !by_ref.contains_key(*r) && !tracked.contains(*r))
            .cloned()
            .collect();
        for object in &unexplained {
            self.holds.release(object);
        }
        self.let_go_all(kinds, &unexplained).await;
        let mut todo = actions(&graph, &held_now, &in_use);
        // A provider whose ProviderConfigUsage kind is not served tracks no
        // usage: nothing to hold, and a hold of an unserved kind would never
        // be in force, so one held before its kind went (the provider
        // uninstalled) is let go: kept, the tree would stay unordered and its
        // root's delete refused for ever.
        let unserved_usage = |object: &ObjectRef| {
            object.kind == usage::KIND
                && kinds
                    .of_kind(Some(object.group.as_str()), usage::KIND)
                    .next()
                    .is_none()
        };
        todo.retain(|a| !matches!(a, Action::Hold { object, .. } if unserved_usage(object)));
        for object in held_now.iter().filter(|o| unserved_usage(o)) {
            if !unexplained.contains(object)
                && !todo
                    .iter()
                    .any(|a| matches!(a, Action::Release { object: o } if o == object))
            {
                todo.push(Action::Release {
                    object: object.clone(),
                });
            }
        }
        let holding = (held_now.len() - unexplained.len())
            + todo
                .iter()
                .filter(|a| matches!(a, Action::Hold { .. }))
                .count()
            - todo
                .iter()
                .filter(|a| matches!(a, Action::Release { .. }))
                .count();
        self.held_counts.insert(root_uid.clone(), holding);
        // Why the tree is not ordered, if it is not: the gate refuses the
        // root's delete with it, and `plan` shows it.
        let mut unordered: Vec<String> = read
            .unread
            .iter()
            .map(|u| format!("not read: {u}"))
            .collect();
        if !self.holds.in_place() {
            unordered.push("the hold policy is not in place".to_string());
        }
        let root_kind = root
            .types
            .as_ref()
            .map(|t| {
                let group = t.api_version.rsplit_once('/').map_or("", |(g, _)| g);
                format!("{}.{group}", t.kind)
            })
            .unwrap_or_default();
        for action in &todo {
            let object = action.object();
            // A hold and a release need only the object's key; a delete
            // needs what was read of it.
            let value = by_ref.get(object).copied();
            if value.is_none() && matches!(action, Action::Delete { .. }) {
                continue;
            }
            match self.act(kinds, &root_uid, &root_kind, action, value).await {
                Err(e) => {
                    let note = format!("cannot {}: {e}", describe(action));
                    if matches!(action, Action::Hold { .. }) {
                        unordered.push(note.clone());
                    }
                    tracing::warn!(root = %root.name_any(), %note, "sibling order");
                    self.event(root, EventType::Warning, "SiblingOrderFailed", &note)
                        .await;
                }
                Ok(Done::LeftToItsDeleter(object)) => {
                    let note = format!(
                        "let go of {object}: nothing needs it any more, and as cascade-guard may not delete it, its deleter's next try does (the garbage collector's comes after its back-off)"
                    );
                    tracing::info!(root = %root.name_any(), %note, "sibling order");
                    self.event(root, EventType::Normal, "ReleasedForOrder", &note)
                        .await;
                }
                Ok(Done::Nothing) => {}
                Ok(Done::AsSaid) => {
                    tracing::info!(root = %root.name_any(), action = %describe(action), "sibling order");
                    let reason = match action {
                        Action::Hold { .. } => "HeldForOrder",
                        Action::Release { .. } => "ReleasedForOrder",
                        Action::Delete { .. } => "DeletedInOrder",
                        Action::Unblock { .. } => "UnblockedForProvider",
                    };
                    self.event(root, EventType::Normal, reason, &describe(action))
                        .await;
                }
            }
        }
        // A hold is in force once the hold policy names its kind and the API
        // server has had the time to load it: until then the tree is not
        // ordered, and read again every tick.
        let mut holding_now: BTreeSet<ObjectRef> = held_now
            .iter()
            .filter(|r| !unexplained.contains(r))
            .cloned()
            .collect();
        for action in &todo {
            match action {
                Action::Hold { object, .. } => {
                    holding_now.insert(object.clone());
                }
                Action::Release { object } => {
                    holding_now.remove(object);
                }
                Action::Delete { .. } | Action::Unblock { .. } => {}
            }
        }
        let waiting = holding_now
            .iter()
            .find_map(|object| {
                self.holds
                    .in_force(object, kinds)
                    .err()
                    .map(|why| format!("cannot hold {object} yet: {why}"))
            })
            .inspect(|why| unordered.push(why.clone()))
            .is_some();
        let deleting = graph.nodes.iter().any(|n| n.in_tree && n.deleting);
        self.tearing_down |= deleting && holding > 0;
        // A young tree is still being composed (its Usages taking hold, its
        // references filled in) without its root always changing: it is read
        // every tick until it settles, then when its root changes. Not a root
        // alone (nothing composed, referenced or using it yet): what it will
        // compose or reference first changes the root itself (Crossplane
        // writes `resourceRefs`), which makes it due; read every tick, 100,000
        // new objects of an ordered kind kept the loop reading for minutes.
        let alone = read.objects.len() <= 1;
        let order = match unordered.len() {
            0 => TreeOrder::Ordered {
                generation: root.metadata.generation.unwrap_or(0),
            },
            1 => TreeOrder::Unordered {
                reason: unordered.remove(0),
            },
            n => TreeOrder::Unordered {
                reason: format!("{} (and {} more)", unordered.remove(0), n - 1),
            },
        };
        self.gate.mark(&root_uid, order.value(), alone);
        if !alone {
            for uid in read
                .objects
                .iter()
                .filter_map(|v| v.pointer("/metadata/uid").and_then(Value::as_str))
                .filter(|uid| *uid != root_uid)
            {
                self.members.insert(uid.to_string(), root_uid.clone());
            }
        }
        let settling = !alone
            && root.creation_timestamp().is_some_and(|t| {
                k8s_openapi::jiff::Timestamp::now()
                    .duration_since(t.0)
                    .as_secs()
                    < SETTLING_SECS
            });
        deleting || settling || waiting || !todo.is_empty()
    }

    async fn act(
        &mut self,
        kinds: &ServedKinds,
        root_uid: &str,
        root_kind: &str,
        action: &Action,
        object: Option<&Value>,
    ) -> Result<Done, String> {
        match action {
            Action::Hold { object, held_for } => self
                .holds
                .hold(object, root_uid, root_kind, held_for)
                .map(|()| Done::AsSaid),
            // Its entry gone, and deleted at once if its owner is leaving (a
            // standalone Usage whose user is gone: the garbage collector's
            // retry after the refusals would come only after its back-off,
            // and Crossplane replays what the Usage protected once it is
            // gone).
            Action::Release { object } => {
                self.holds.release(object);
                self.let_go_all(kinds, std::slice::from_ref(object)).await;
                Ok(Done::AsSaid)
            }
            // Deleted while still held, so that a delete refused by someone
            // else (Crossplane's Usage webhook) is simply tried again; the
            // entry goes once the delete went through. cascade-guard may not
            // delete every kind it holds (a Secret): then the entry goes now,
            // and the garbage collector's next try deletes it.
            Action::Unblock { object, owner_uid } => {
                match unhold::unblock(&self.client, kinds, object, owner_uid).await {
                    Ok(true) => Ok(Done::AsSaid),
                    Ok(false) => Ok(Done::Nothing),
                    Err(e) => Err(e.to_string()),
                }
            }
            Action::Delete { object: r } => {
                let text = |p: &str| {
                    object
                        .and_then(|o| o.pointer(p))
                        .and_then(Value::as_str)
                        .unwrap_or("")
                };
                let Some(served) = kinds.get(text("/apiVersion"), text("/kind")) else {
                    return Ok(Done::AsSaid);
                };
                // Known by its name alone: cascade-guard may not read it, so
                // it may not delete it either.
                if text("/metadata/uid").starts_with("unread:") {
                    self.holds.release(r);
                    return Ok(Done::LeftToItsDeleter(r.clone()));
                }
                let api = ServedKinds::api(&self.client, served, r.namespace.as_deref());
                let uid = Some(text("/metadata/uid").to_string());
                match delete_this_one(&api, &r.name, uid).await {
                    Ok(()) => Ok(Done::AsSaid),
                    Err(kube::Error::Api(s)) if s.code == 403 => {
                        self.holds.release(r);
                        Ok(Done::LeftToItsDeleter(r.clone()))
                    }
                    Err(e) => Err(e.to_string()),
                }
            }
        }
    }

    /// Lets go of objects no longer held (their entries are gone): each is
    /// deleted if an owner of it is leaving.
    async fn let_go_all(&mut self, kinds: &ServedKinds, objects: &[ObjectRef]) {
        for object in objects {
            match unhold::let_go(&self.client, kinds, object).await {
                Ok(LetGo::Deleted) => {
                    tracing::info!(%object, "sibling order: deleted what it held, as its owner is leaving");
                }
                Ok(LetGo::Left) => {}
                Ok(LetGo::LeftToItsDeleter) => {
                    tracing::info!(%object, "sibling order: let go; cascade-guard may not delete it, so its deleter's next try does");
                }
                Err(e) => tracing::warn!(%object, error = %e, "sibling order: cannot let go"),
            }
        }
    }

    /// Cycles, conflicts and what could not be read, as Warning Events on the
    /// root, each once: where they are, the tree falls back to the plain
    /// foreground cascade for those objects.
    async fn report(&mut self, root: &DynamicObject, graph: &order::Graph, unread: &[String]) {
        let Some(uid) = root.uid() else { return };
        let mut now = BTreeSet::new();
        for cycle in &graph.cycles {
            let names: Vec<String> = cycle.objects.iter().map(ToString::to_string).collect();
            now.insert(format!(
                "a cycle of needs under {}: {} are not ordered, and are deleted together",
                cycle.parent,
                names.join(", ")
            ));
        }
        for conflict in &graph.conflicts {
            now.insert(format!(
                "{conflict}: it is under what needs it, and cannot wait"
            ));
        }
        for problem in &graph.problems {
            now.insert(problem.to_string());
        }
        for u in unread {
            now.insert(format!("not read: {u}"));
        }
        let before = self.reported.entry(uid).or_default().clone();
        for note in now.difference(&before) {
            self.event(root, EventType::Warning, "SiblingOrderProblem", note)
                .await;
        }
        self.reported.insert(root.uid().unwrap_or_default(), now);
    }

    async fn event(&self, root: &DynamicObject, type_: EventType, reason: &str, note: &str) {
        let Some(types) = root.types.as_ref() else {
            return;
        };
        let resource = kube::api::ApiResource {
            group: types
                .api_version
                .split_once('/')
                .map_or("", |(g, _)| g)
                .to_string(),
            version: types
                .api_version
                .rsplit_once('/')
                .map_or(types.api_version.as_str(), |(_, v)| v)
                .to_string(),
            api_version: types.api_version.clone(),
            kind: types.kind.clone(),
            plural: String::new(),
        };
        let reference = root.object_ref(&resource);
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(crate::controller::sync::limits::event_note(note)),
            action: "SiblingOrder".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &reference).await {
            tracing::debug!(error = %e, "sibling order: cannot publish event");
        }
    }
}

/// What an action came to, when it did not fail.
enum Done {
    AsSaid,
    /// Nothing to change (an unblock already done).
    Nothing,
    /// Its entry gone; cascade-guard may not delete it, so its deleter's
    /// retry does.
    LeftToItsDeleter(ObjectRef),
}

/// `--sibling-order off`: the gate, the hold policy and every hold removed,
/// and what an owner being deleted had been refused deleted, so that nothing
/// a controller once held stays held by one that no longer orders.
pub async fn let_go_of_everything(client: Client, namespace: String) {
    // The hold policy and the records' guard first: the guard refuses a
    // change of the records by anyone but a running controller.
    gate::remove(&client, HOLD_OBJECT_NAME).await;
    gate::remove(&client, RECORD_GUARD_NAME).await;
    let held = crate::cluster::holds::read(&client, &namespace)
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "sibling order is off, and what it held cannot be read");
            Vec::new()
        });
    gate::remove_all(&client, &namespace).await;
    match ServedKinds::discover(&client).await {
        Ok(kinds) => {
            for (object, _) in &held {
                if let Err(e) = unhold::let_go(&client, &kinds, object).await {
                    tracing::warn!(%object, error = %e, "sibling order is off, and cannot let go");
                }
            }
            let stripped = unhold::strip_old_labels(&client, &kinds, |line| {
                tracing::warn!("sibling order is off: {line}")
            })
            .await;
            if !held.is_empty() || stripped > 0 {
                tracing::info!(
                    released = held.len(),
                    stripped,
                    "sibling order is off: let go of every object it held"
                );
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "sibling order is off, and what it held cannot be let go: cannot discover the API")
        }
    }
}

/// Deletes `name` with a foreground cascade, only if it is still the object
/// of `uid` (a newer one of the same name is not touched); gone already or
/// refused by someone else's webhook (Crossplane's, 409) is no error.
async fn delete_this_one(
    api: &Api<DynamicObject>,
    name: &str,
    uid: Option<String>,
) -> Result<(), kube::Error> {
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// The live hold object is missing, unreadable or not what `desired` is once
/// stored.
async fn drifted<K>(api: &Api<K>, name: &str, desired: &K) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let (Ok(Some(live)), Ok(desired)) = (api.get_opt(name).await, serde_json::to_value(desired))
    else {
        return true;
    };
    serde_json::to_value(&live)
        .map(|live| first_difference(&desired, &live).is_some())
        .unwrap_or(true)
}

fn describe(action: &Action) -> String {
    match action {
        Action::Hold { object, held_for } => {
            format!("hold {object} until {held_for} is gone")
        }
        Action::Release { object } => format!("release {object}: nothing needs it any more"),
        Action::Unblock { object, .. } => format!(
            "let {object} stop blocking its managed resource's foreground cascade: its provider deletes only once the garbage collector's finalizer is gone, and keeps needing the usage until then"
        ),
        Action::Delete { object } => {
            format!(
                "delete {object} (Foreground): its parent is being deleted, and what needed it is gone"
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_trees_a_look_reads_first() {
        let last = |changed, active, resync_due| {
            Some(Last {
                changed,
                active,
                resync_due,
            })
        };
        let cases = [
            (true, None, Some(0)),
            (true, last(false, false, false), Some(0)),
            (false, None, Some(1)),
            (false, last(true, false, false), Some(2)),
            (false, last(false, true, false), Some(2)),
            (false, last(true, true, true), Some(2)),
            (false, last(false, false, true), Some(3)),
            (false, last(false, false, false), None),
        ];
        for (deleting, last, want) in cases {
            assert_eq!(rank(deleting, last), want);
        }
    }

    #[test]
    fn a_new_or_changed_usage_makes_its_users_tree_due() {
        let usage = |rv: &str, owners: &[&str]| mirror::Candidate {
            uid: "u1".into(),
            entry: mirror::Entry {
                rv: rv.into(),
                namespace: None,
                name: "uses".into(),
                deleting: false,
                labels: Default::default(),
                controllers: Vec::new(),
                owners: owners.iter().map(|o| o.to_string()).collect(),
            },
        };
        let versions: HashMap<String, String> = [("u1".to_string(), "5".to_string())].into();
        let members: HashMap<String, String> =
            [("stack".to_string(), "cluster-root".to_string())].into();
        let is_root = |uid: &str| uid == "gateway-root" || uid == "cluster-root";
        // (its version, its owners) -> the roots made due
        let cases: [(&str, &[&str], &[&str]); 6] = [
            ("5", &["gateway-root"], &[]),
            ("6", &["gateway-root"], &["gateway-root"]),
            ("6", &["stack"], &["cluster-root"]),
            ("6", &["unknown"], &[]),
            ("6", &[], &[]),
            (
                "6",
                &["gateway-root", "stack"],
                &["gateway-root", "cluster-root"],
            ),
        ];
        for (rv, owners, want) in cases {
            assert_eq!(
                users_roots(&usage(rv, owners), &versions, is_root, &members),
                want,
                "{rv} {owners:?}"
            );
        }
        // Never seen: new.
        assert_eq!(
            users_roots(
                &usage("5", &["gateway-root"]),
                &HashMap::new(),
                is_root,
                &members
            ),
            ["gateway-root"]
        );
    }

    #[test]
    fn the_pause_grows_with_the_look_up_to_a_bound() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // (tearing down, look) -> pause
        let cases = [
            (false, ms(50), s(1)),
            (false, s(4), s(4)),
            (false, s(216), s(10)),
            (true, ms(50), ms(200)),
            (true, s(4), s(1)),
            (true, s(216), ms(2500)),
        ];
        for (tearing_down, look, want) in cases {
            assert_eq!(pause(tearing_down, look), want, "{tearing_down} {look:?}");
        }
    }

    #[test]
    fn a_look_reads_a_bounded_number_of_trees_and_few_resyncs() {
        // Sorted by rank, as the look sorts them.
        let mut due: Vec<u8> = [vec![0; 3], vec![1; 10], vec![2; 5], vec![3; 100]].concat();
        take_this_look(&mut due, |r| *r);
        assert_eq!(due.len(), 3 + 10 + 5 + RESYNCS_PER_LOOK);
        let mut many: Vec<u8> = [vec![1; 2 * READS_PER_LOOK], vec![3; 10]].concat();
        take_this_look(&mut many, |r| *r);
        assert_eq!(many.len(), READS_PER_LOOK);
        assert!(many.iter().all(|r| *r == 1));
    }
}
