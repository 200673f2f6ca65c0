//! Reading the trees a look found due: their roots fetched one by one, or,
//! when many of one kind are due (a start, 100,000 new objects), by listing
//! the kind a page at a time: a GET per root made the first read of 100,000
//! trees take five and a half minutes. Each tree is then read from its root
//! (`cluster::tree`) and reconciled.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{DynamicObject, ListParams};

use super::index::DueRoot;
use super::schedule::{CONFIGS_EVERY, FETCHES_PER_LOOK, LIST_FROM, READ_BATCH, READS_AT_ONCE};
use super::{OrderLoop, Watched};
use crate::cluster::kinds::{Served, ServedKinds};
use crate::cluster::tree::{Listed, TreeRead, read_tree};
use crate::policy::sibling::object::ObjectRef;

/// Objects per page when a kind is listed for its roots.
const PAGE: u32 = 500;

/// A root as fetched (None: gone), or why it could not be.
type Fetched = Result<Option<DynamicObject>, String>;

impl OrderLoop {
    /// Reads and reconciles the due trees: the kinds with many due roots by
    /// list, the others a root at a time, at most FETCHES_PER_LOOK of those
    /// (the rest stay due); true when some were left for the next look.
    pub(super) async fn read_and_reconcile(
        &mut self,
        kinds: &ServedKinds,
        watched: &Watched,
        due: Vec<DueRoot>,
    ) -> bool {
        if due.is_empty() {
            return false;
        }
        // The Usages and ProviderConfigs as the look starts: a Usage made
        // after is seen by its watch, which makes its user's tree due again;
        // a ProviderConfig made after, by the tree's next read.
        let kept = self
            .configs
            .as_ref()
            .filter(|(at, _)| at.elapsed() < CONFIGS_EVERY)
            .map(|(_, configs)| configs.clone());
        let listed_now = kept.is_none();
        let listed = Listed::list_with(&self.client, kinds, kept).await;
        if listed_now {
            self.configs = Some((Instant::now(), listed.configs()));
        }
        let mut by_kind: HashMap<_, Vec<DueRoot>> = HashMap::new();
        for d in due {
            by_kind.entry(d.kind.clone()).or_default().push(d);
        }
        let mut one_by_one = Vec::new();
        for (kind, roots) in by_kind {
            match watched.served.get(&kind) {
                Some(served) if roots.len() >= LIST_FROM => {
                    self.read_listed(kinds, served, roots, &listed).await;
                }
                _ => one_by_one.extend(roots),
            }
        }
        // Deleting first, as the look ranked them.
        one_by_one.sort_by_key(|d| d.rank);
        let left: Vec<DueRoot> = one_by_one.split_off(FETCHES_PER_LOOK.min(one_by_one.len()));
        if let Ok(mut index) = self.index.lock() {
            for d in &left {
                index.not_read(&d.uid);
            }
        }
        let mut due = one_by_one.into_iter().peekable();
        while due.peek().is_some() {
            let batch: Vec<DueRoot> = due.by_ref().take(READ_BATCH).collect();
            self.read_fetched(kinds, watched, batch, &listed).await;
        }
        !left.is_empty()
    }

    /// Fetches each root of `batch`, READS_AT_ONCE in flight, reads their
    /// trees, then writes them: a write while reads are in flight stalls
    /// them (a stream's reads make progress only while it is polled:
    /// 31de24a wrote each tree as it came, and under a loaded CI a look at
    /// 22 trees took 216 s).
    async fn read_fetched(
        &mut self,
        kinds: &ServedKinds,
        watched: &Watched,
        batch: Vec<DueRoot>,
        listed: &Listed,
    ) {
        let client = &self.client.clone();
        let roots = futures::stream::iter(batch.into_iter().map(|d| async move {
            let root: Fetched = match watched.served.get(&d.kind) {
                Some(served) => ServedKinds::api(client, served, d.namespace.as_deref())
                    .get_opt(&d.name)
                    .await
                    .map_err(|e| e.to_string()),
                None => Err("its kind is no longer served".to_string()),
            };
            (d, root)
        }))
        .buffered(READS_AT_ONCE)
        .collect::<Vec<_>>()
        .await;
        self.read_trees(kinds, roots, listed).await;
    }

    /// Lists `served` a page at a time and reads the trees of the roots in
    /// `due` as their page comes; a root the list did not bring is due again
    /// (gone: its watch says so).
    async fn read_listed(
        &mut self,
        kinds: &ServedKinds,
        served: &Served,
        due: Vec<DueRoot>,
        listed: &Listed,
    ) {
        let api = kube::Api::<DynamicObject>::all_with(self.client.clone(), &served.0);
        tracing::info!(kind = %served.0.kind, trees = due.len(), "sibling order: reading trees by listing their kind");
        let mut wanted: HashMap<String, DueRoot> =
            due.into_iter().map(|d| (d.uid.clone(), d)).collect();
        let mut params = ListParams::default().limit(PAGE);
        while !wanted.is_empty() {
            let page = match api.list(&params).await {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(kind = %served.0.kind, error = %e, "sibling order: cannot list the kind to read its trees");
                    break;
                }
            };
            let roots: Vec<(DueRoot, Fetched)> = page
                .items
                .into_iter()
                .filter_map(|o| {
                    let d = wanted.remove(&o.uid()?)?;
                    Some((d, Ok(Some(o))))
                })
                .collect();
            for chunk in chunks(roots, READ_BATCH) {
                self.read_trees(kinds, chunk, listed).await;
            }
            match page.metadata.continue_ {
                Some(next) if !next.is_empty() => params = params.continue_token(&next),
                _ => break,
            }
        }
        if let Ok(mut index) = self.index.lock() {
            for uid in wanted.keys() {
                index.not_read(uid);
            }
        }
    }

    /// Reads the trees of fetched roots, READS_AT_ONCE in flight, then
    /// reconciles each.
    async fn read_trees(
        &mut self,
        kinds: &ServedKinds,
        roots: Vec<(DueRoot, Fetched)>,
        listed: &Listed,
    ) {
        let client = &self.client.clone();
        let held: &HashMap<String, BTreeSet<ObjectRef>> = &roots
            .iter()
            .map(|(d, _)| {
                (
                    d.uid.clone(),
                    self.holds.held_for(&d.uid).into_keys().collect(),
                )
            })
            .collect();
        let read: Vec<_> = futures::stream::iter(roots.into_iter().map(|(d, root)| async move {
            let tree = match &root {
                Ok(Some(root)) => {
                    let none = BTreeSet::new();
                    let held = held.get(&d.uid).unwrap_or(&none);
                    Some(read_tree(client, kinds, root, listed, held).await)
                }
                _ => None,
            };
            (d, root, tree)
        }))
        .buffered(READS_AT_ONCE)
        .collect()
        .await;
        for (d, root, tree) in read {
            self.reconcile_read(kinds, d, root, tree).await;
        }
    }

    async fn reconcile_read(
        &mut self,
        kinds: &ServedKinds,
        due: DueRoot,
        root: Fetched,
        tree: Option<TreeRead>,
    ) {
        match (root, tree) {
            (Ok(Some(root)), Some(tree)) => {
                for unlisted in &tree.unlisted {
                    // Said once: every tree with a Secret meets it.
                    if self.warned.insert(format!("unlisted {unlisted}")) {
                        tracing::warn!(%unlisted, "sibling order: cannot list these ProviderConfigs; one made outside a tree on a Secret of the tree, and what uses it, are not seen (cascade-guard needs list on them: the chart's composedResources)");
                    }
                }
                let state = self.reconcile(kinds, &root, tree).await;
                if let Ok(mut index) = self.index.lock() {
                    index.read(&due.uid, due.rv, Instant::now(), state);
                }
            }
            // Gone since the watch told of it: the watch tells that too.
            (Ok(_), _) => {}
            (Err(e), _) => {
                tracing::warn!(kind = %due.kind.1, error = %e, "sibling order: cannot read");
                // Due again at the next look.
                if let Ok(mut index) = self.index.lock() {
                    index.not_read(&due.uid);
                }
            }
        }
    }
}

/// `items` in chunks of at most `size`, in order.
fn chunks<T>(items: Vec<T>, size: usize) -> Vec<Vec<T>> {
    let mut out = Vec::new();
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() {
        out.push(items.by_ref().take(size).collect());
    }
    out
}
