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
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kube::core::Selector;
use kube::runtime::events::Recorder;
use kube::{Api, Client};
use tokio::sync::watch;

use super::MANAGER;
use super::telemetry::Metrics;
use crate::cluster::events::Teller;
use crate::cluster::kinds::{Served, ServedKinds};
use crate::cluster::tree::{Listed, ListedConfigs, USAGE_KIND};
use crate::cluster::watch_tap::{Tap, Taps, WatchEvent};
use crate::policy::drift::first_difference;
use crate::policy::sibling::gate::GatedKind;
use crate::policy::{CompileSettings, Mode, Policy, ProtectedKind, Shape};

mod entries;
#[cfg(test)]
mod footprint;
mod gate;
mod holds;
mod index;
mod left_roots;
mod mirror;
mod off;
mod reads;
mod reconcile;
mod record;
mod schedule;
mod uid;
mod writes;
use gate::Gate;
use holds::Holds;
use index::{Index, KindKey, Look, Sync};
use left_roots::{Sight, stays_held};
use mirror::Mirror;
pub use off::let_go_of_everything;
use schedule::{DISCOVERY_EVERY, FIRST_READS_KEEP_HOLDS, SLOW_LOOK, pause};

/// One kind whose trees are ordered.
#[derive(Clone, Debug, PartialEq)]
pub struct OrderedKind {
    pub group: String,
    pub kind: String,
    /// The selectors of its policies (one selecting all: every object).
    pub selectors: Vec<Selector>,
    pub shape: Shape,
    /// Another watch of the controller follows the kind (Convert's, or the
    /// admission-only kinds') and feeds the index: sibling order starts none
    /// of its own.
    pub fed: bool,
}

impl OrderedKind {
    fn key(&self) -> KindKey {
        (self.group.clone(), self.kind.clone())
    }
}

/// The kinds whose trees are ordered: Refuse and Convert ones.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OrderedKinds(Vec<OrderedKind>);

impl OrderedKinds {
    /// The kinds `policies` order; `fed` tells a kind another watch follows.
    pub fn of(policies: &[Policy], fed: impl Fn(&ProtectedKind) -> bool) -> Self {
        let mut kinds: Vec<OrderedKind> = Vec::new();
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
                .find(|k| k.group == p.kind.group && k.kind == p.kind.kind)
            {
                Some(k) => k.selectors.push(selector),
                None => kinds.push(OrderedKind {
                    group: p.kind.group.clone(),
                    kind: p.kind.kind.clone(),
                    selectors: vec![selector],
                    shape: p.kind.shape,
                    fed: fed(&p.kind),
                }),
            }
        }
        Self(kinds)
    }
}

/// Feeds sibling order's index from a watch the controller runs anyway
/// (Convert's, the admission-only kinds'): one watch per kind, where sibling
/// order's own made the API server list and serve every object twice.
#[derive(Clone)]
pub struct Feed(Arc<Mutex<Index>>);

impl Feed {
    pub fn new() -> Self {
        Self(Arc::new(Mutex::new(Index::default())))
    }
}

impl Taps for Feed {
    fn tap(&self, kind: &ProtectedKind) -> Box<dyn Tap> {
        Box::new(IndexTap {
            index: self.0.clone(),
            key: (kind.group.clone(), kind.kind.clone()),
            feeder: index::feeder(),
        })
    }
}

impl Default for Feed {
    fn default() -> Self {
        Self::new()
    }
}

/// One watch's events into the index.
struct IndexTap {
    index: Arc<Mutex<Index>>,
    key: KindKey,
    feeder: index::Feeder,
}

impl Tap for IndexTap {
    fn event(&self, event: &WatchEvent) {
        if let (Some(change), Ok(mut index)) = (tapped(event), self.index.lock()) {
            index.apply(&self.key, self.feeder, change);
        }
    }
}

/// What a tapped watch's event tells the index: an error makes the kind
/// unknown until the watch lists it again (a resumed watch after an API
/// server restart lists again: `recovery` shows a new tree's need held after
/// one).
fn tapped(event: &WatchEvent) -> Option<index::IndexEvent> {
    match event {
        Ok(e) => mirror::event(e),
        Err(e) => Some(index::IndexEvent::Failed(e.to_string())),
    }
}

impl Drop for IndexTap {
    fn drop(&mut self) {
        if let Ok(mut index) = self.index.lock() {
            index.apply(&self.key, self.feeder, index::IndexEvent::Stopped);
        }
    }
}

/// How the loop runs.
pub struct Setup {
    /// The controller's namespace, where its records are.
    pub namespace: String,
    /// Write the gate's policies (`--unordered-deletes=refuse`).
    pub refuse_unordered: bool,
    pub settings: CompileSettings,
    /// How often each tree (not read alone) is read again at the latest.
    pub resync: std::time::Duration,
}

/// Starts the loop; the controller sends it the ordered kinds after every
/// complete pass. Until the first arrives the loop does nothing: with no
/// kinds known, every held object would look orphaned, and letting go of them
/// at a restart or a leader's change would let a tree being torn down lose
/// its order (found by the randomized real-Crossplane test).
pub fn start(
    client: Client,
    setup: Setup,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    feed: Feed,
) -> watch::Sender<Option<OrderedKinds>> {
    let Setup {
        namespace,
        refuse_unordered,
        settings,
        resync,
    } = setup;
    let (tx, mut rx) = watch::channel(None::<OrderedKinds>);
    let mut order = OrderLoop {
        gate: Gate::new(
            client.clone(),
            namespace.clone(),
            refuse_unordered,
            settings.clone(),
        ),
        holds: Holds::new(client.clone(), namespace, settings),
        client,
        teller: Teller::start(recorder),
        metrics,
        resync,
        index: feed.0,
        mirrors: HashMap::new(),
        held_counts: HashMap::new(),
        kinds: None,
        reported: HashMap::new(),
        warned: BTreeSet::new(),
        swept: None,
        read_every_tree: false,
        started: Instant::now(),
        kept_for_first_reads: false,
        tearing_down: false,
        released: None,
        backlog: false,
        configs: None,
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
            let hurry = order.tearing_down || order.backlog;
            let pause = pause(hurry, started.elapsed()).max(order.holds.loading());
            tokio::time::sleep(pause).await;
        }
    });
    tx
}

/// The loop's state, kept across looks.
struct OrderLoop {
    client: Client,
    /// Says, for the admission gate, how each root's tree stands.
    gate: Gate,
    /// Every object of the ordered kinds and every Usage, fed by the
    /// watches; which trees are due.
    index: Arc<Mutex<Index>>,
    /// A watch of each ordered kind and each Usage kind served, by group and
    /// kind.
    mirrors: HashMap<KindKey, Mirror>,
    /// Tells the Events on roots, aside from the look.
    teller: Teller,
    metrics: Arc<Metrics>,
    /// How many objects each root's tree holds, as last read (only trees
    /// that hold any).
    held_counts: HashMap<String, usize>,
    resync: std::time::Duration,
    kinds: Option<(ServedKinds, Instant)>,
    /// What it holds, and the hold policy.
    holds: Holds,
    /// The problems last reported per root, so each is an Event once.
    reported: HashMap<String, BTreeSet<String>>,
    /// Warnings already logged, each once.
    warned: BTreeSet<String>,
    /// When the first look was made.
    swept: Option<Instant>,
    /// Every root has been read once since the start (said once, in the log).
    read_every_tree: bool,
    /// When the loop started.
    started: Instant,
    /// Holds of roots that left were kept for the first reads (said once
    /// when that ends).
    kept_for_first_reads: bool,
    /// A tree read in the last look is being deleted while something in it
    /// is held.
    tearing_down: bool,
    /// The last look left trees due for the next.
    backlog: bool,
    /// The ProviderConfigs as last listed for the reads, and when.
    configs: Option<(Instant, ListedConfigs)>,
    /// When what is held was last looked over for roots that left, and the
    /// ordered and listed kinds then.
    released: Option<(Instant, Vec<String>)>,
}

/// The ordered kinds served, as one look sees them.
struct Watched {
    /// Each ordered kind served, by key.
    served: HashMap<KindKey, Served>,
    /// Every ordered kind served is gated, listable or not: a kind the
    /// controller cannot read has no tree it ordered.
    gated: Vec<GatedKind>,
}

impl OrderLoop {
    /// One look: the kinds watched, the due trees read and reconciled, the
    /// roots that left let go of, the records written.
    async fn tick(&mut self, ordered: &OrderedKinds) {
        if ordered.0.is_empty() && self.mirrors.is_empty() && self.swept.is_some() {
            return;
        }
        let started = Instant::now();
        let Some((kinds, discovered)) = self.discovered().await else {
            return;
        };
        let discovering = started.elapsed();
        self.holds.prepare(&kinds, self.resync).await;
        let preparing = started.elapsed() - discovering;
        let was_tearing_down = std::mem::take(&mut self.tearing_down);
        let watched = self.watch(ordered, &kinds);
        let look = self.look();
        let trees_read = look.due.len();
        let reading = Instant::now();
        let left_due = self.read_and_reconcile(&kinds, &watched, look.due).await;
        let read_for = reading.elapsed();
        if trees_read >= schedule::FETCHES_PER_LOOK {
            // A long look's reads are freed now; glibc would keep them.
            super::memory::give_back();
        }
        self.backlog = look.backlog || left_due;
        let letting_go = Instant::now();
        self.let_go_of_left(
            ordered,
            &kinds,
            look.listed_all,
            &look.left,
            was_tearing_down,
        )
        .await;
        let let_go_for = letting_go.elapsed();
        self.swept = Some(Instant::now());
        // What is held first: the gate's record says a tree is ordered
        // only once its holds are written (the API server reads both through
        // one informer, in order).
        let writing = Instant::now();
        if self.holds.write(&kinds).await {
            self.gate.write(&watched.gated, self.resync).await;
        }
        self.holds.name_held_kinds(&kinds).await;
        let written_for = writing.elapsed();
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
                discovering_ms = discovering.as_millis(),
                checking_holds_ms = preparing.as_millis(),
                reading_trees_ms = read_for.as_millis(),
                letting_go_ms = let_go_for.as_millis(),
                writing_records_ms = written_for.as_millis(),
                "sibling order: a slow look; new trees wait this long for their holds"
            );
        }
        // Put back with the time of its discovery, so that it is read again
        // every DISCOVERY_EVERY and a kind served later is found.
        self.kinds = Some((kinds, discovered));
    }

    /// The kinds served, discovered again every DISCOVERY_EVERY.
    async fn discovered(&mut self) -> Option<(ServedKinds, Instant)> {
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
        self.kinds.take()
    }

    /// A watch of each Usage kind served and of each ordered kind no other
    /// watch follows, in the version served; none of the others. The index
    /// told which kinds and selectors count.
    fn watch(&mut self, ordered: &OrderedKinds, kinds: &ServedKinds) -> Watched {
        let mut served = HashMap::new();
        let mut gated = Vec::new();
        let mut selectors = Vec::new();
        let mut own = HashMap::new();
        for k in &ordered.0 {
            let Some(s) = kinds.of_kind(Some(&k.group), &k.kind).next().cloned() else {
                continue;
            };
            gated.push(GatedKind {
                group: k.group.clone(),
                plural: s.0.plural.clone(),
                shape: k.shape,
            });
            selectors.push((k.key(), k.selectors.clone()));
            if !k.fed {
                own.insert(k.key(), s.clone());
            }
            served.insert(k.key(), s);
        }
        // Crossplane's Usages, and each provider's ProviderConfigUsages.
        let usage_kinds: HashMap<KindKey, Served> = Listed::usage_kinds(kinds)
            .into_iter()
            .chain(Listed::config_usage_kinds(kinds))
            .map(|s| ((s.0.group.clone(), s.0.kind.clone()), s))
            .collect();
        let usage_keys: Vec<KindKey> = usage_kinds.keys().cloned().collect();
        if let Ok(mut index) = self.index.lock() {
            index.set_kinds(&selectors, &usage_keys);
        }
        let wanted: HashMap<&KindKey, &Served> = own.iter().chain(usage_kinds.iter()).collect();
        self.mirrors
            .retain(|key, mirror| wanted.get(key).is_some_and(|s| **s == mirror.served));
        for (key, s) in wanted {
            if !self.mirrors.contains_key(key) {
                let mirror = Mirror::start(&self.client, s, self.index.clone());
                self.mirrors.insert(key.clone(), mirror);
            }
        }
        Watched { served, gated }
    }

    /// What the index says is due, with a warning, once per kind, for a kind
    /// that cannot be watched.
    fn look(&mut self) -> Look {
        let Ok(mut index) = self.index.lock() else {
            return Look::default();
        };
        let failing: Vec<(KindKey, String)> = index
            .kinds()
            .chain(index.usage_kinds())
            .filter_map(|(key, sync)| match sync {
                Sync::Failing(e) => Some((key.clone(), e.clone())),
                _ => None,
            })
            .collect();
        for ((group, kind), e) in failing {
            // Said once per kind: without list (RBAC: the chart's
            // protectedGroups) the kind's trees are not ordered.
            if !self.warned.insert(format!("watch {group}/{kind}")) {
                continue;
            }
            if kind == USAGE_KIND {
                tracing::warn!(%kind, %group, error = %e, "sibling order: cannot watch this kind; a new user of a tree's ProviderConfig is seen only at that tree's next read (cascade-guard needs list and watch on it: the chart grants them in the groups of composedResources)");
            } else {
                tracing::warn!(%kind, %group, error = %e, "sibling order: cannot watch this kind; its trees are not ordered, and a Usage of it is seen only at its tree's next read (cascade-guard needs get, list and watch on the group: the chart's protectedGroups)");
            }
        }
        // Before the look takes them: a root taken is read only after it.
        let unread = index.unread_roots();
        let look = index.look(Instant::now(), self.resync);
        if !self.read_every_tree && look.listed_all && unread == 0 {
            self.read_every_tree = true;
            // Until then a tree's holds are those it had at the start, and
            // the gate keeps what a controller before it wrote.
            tracing::info!(
                roots = index.roots_read(),
                "sibling order: every tree read once"
            );
            self.gate.forget_others(|uid| index.begins_tree(uid));
            // The first read's lists were the process's peak: give back what
            // it no longer uses.
            super::memory::give_back();
        }
        look
    }

    /// A root that left (gone, relabelled out, its kind no longer ordered)
    /// leaves what it held: let go. Told by the root's own kind, so that a
    /// kind that cannot be listed keeps only its own roots' holds; and not
    /// before every tree was read once after the start, so that a start lets
    /// go of nothing it has not looked at (see [`left_roots`]).
    async fn let_go_of_left(
        &mut self,
        ordered: &OrderedKinds,
        kinds: &ServedKinds,
        listed_all: bool,
        left: &[String],
        was_tearing_down: bool,
    ) {
        // A root that left while its tree was torn down may leave a held
        // Usage to delete now (its user is gone): look once more quickly.
        self.tearing_down |= was_tearing_down && !left.is_empty();
        let ordered_kinds: HashSet<String> = ordered
            .0
            .iter()
            .map(|k| format!("{}.{}", k.kind, k.group))
            .collect();
        let listed_kinds = match self.index.lock() {
            Ok(index) => index.listed_kinds(),
            Err(_) => return,
        };
        // Looked over again when a root left or the kinds changed, else
        // every quiet look's time: a root held for may leave unread (taken
        // in from the record at a start).
        let mut kinds_now: Vec<String> =
            ordered_kinds.iter().chain(&listed_kinds).cloned().collect();
        kinds_now.sort();
        let quiet = self.released.as_ref().is_some_and(|(at, before)| {
            *before == kinds_now && at.elapsed() < schedule::QUIET_LOOK
        });
        // Kept through the first reads, looked over again each look.
        let first_reads = left_roots::first_reads(self.read_every_tree, self.started.elapsed());
        if first_reads {
            self.kept_for_first_reads = true;
        } else if std::mem::take(&mut self.kept_for_first_reads) && !self.read_every_tree {
            tracing::warn!(
                minutes = FIRST_READS_KEEP_HOLDS.as_secs() / 60,
                "sibling order: not every tree was read since the start; letting go of what roots that left held anyway"
            );
        }
        if left.is_empty() && quiet {
            return;
        }
        if !first_reads {
            self.released = Some((Instant::now(), kinds_now));
        }
        let is_root: HashSet<String> = match self.index.lock() {
            Ok(index) => self
                .holds
                .roots()
                .filter(|r| index.is_root(r))
                .map(str::to_string)
                .collect(),
            Err(_) => return,
        };
        let sight = Sight {
            ordered: &ordered_kinds,
            listed: &listed_kinds,
            listed_all,
            first_reads,
        };
        let released = self.holds.release_roots_but(|root, root_kind| {
            stays_held(&sight, is_root.contains(root), root_kind)
        });
        if !released.is_empty() {
            tracing::info!(
                released = released.len(),
                "sibling order: let go of objects whose tree is no longer ordered"
            );
        }
        writes::let_go_all(&self.client, kinds, &released).await;
        for uid in left {
            self.gate.forget(uid);
            self.reported.remove(uid);
            self.held_counts.remove(uid);
        }
    }
}
/// The live hold object is missing, unreadable or not what `desired` is once
/// stored.
/// Whether a policy or its binding (both named `name`) differs from what
/// is wanted; both read at once.
async fn drifted_pair<P, B>(policy: (&Api<P>, &P), binding: (&Api<B>, &B), name: &str) -> bool
where
    P: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    B: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let (p, b) = futures::join!(
        drifted(policy.0, name, policy.1),
        drifted(binding.0, name, binding.1)
    );
    p || b
}

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

#[cfg(test)]
mod tests {
    use kube::runtime::watcher;

    use super::*;

    /// Any error of a tapped watch makes its kind unknown until it lists
    /// again; an object event is taken in.
    #[test]
    fn a_tapped_watch_error_makes_its_kind_unknown() {
        let refused = || {
            kube::Error::Api(Box::new(kube::core::Status::failure(
                "refused",
                "ServiceUnavailable",
            )))
        };
        let errors = [
            watcher::Error::InitialListFailed(refused()),
            watcher::Error::WatchStartFailed(refused()),
            watcher::Error::WatchFailed(refused()),
            watcher::Error::NoResourceVersion,
        ];
        for e in errors {
            let got = tapped(&Err(e));
            assert!(matches!(got, Some(index::IndexEvent::Failed(_))), "{got:?}");
        }
        assert_eq!(
            tapped(&Ok(watcher::Event::Init)),
            Some(index::IndexEvent::Listing)
        );
    }
}
