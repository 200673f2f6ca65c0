//! One ordered kind as sibling order's look sees it, kept by a metadata
//! watch: of each object only what tells whether it begins a tree and
//! whether its tree is due. The look used to list every ordered kind each
//! tick, which at 100,000 objects was the API server serving hundreds of MiB
//! a second and the controller holding a GiB.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DynamicObject, PartialObjectMeta};
use kube::core::{Selector, SelectorExt};
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;

use crate::cluster::kinds::Served;

/// Objects per page of the watch's lists.
const PAGE: u32 = 500;
/// The first wait after the watch failed; doubled up to `MAX_RETRY`.
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(30);

/// What the look keeps of one object (not its managed fields and the rest).
#[derive(Clone, Debug)]
pub(super) struct Entry {
    pub rv: String,
    pub namespace: Option<String>,
    pub name: String,
    pub deleting: bool,
    pub labels: BTreeMap<String, String>,
    /// Its controller references: they decide whether it begins a tree.
    pub controllers: Vec<OwnerReference>,
    /// The uids of all its owners (a Usage's user is one, not its
    /// controller).
    pub owners: Vec<String>,
}

/// One selected object of the kind, for the look.
pub(super) struct Candidate {
    pub uid: String,
    pub entry: Entry,
}

/// The kind as the look reads it now.
pub(super) enum Look {
    /// Not listed in full yet (just started, or listing again after a
    /// failure): as a failed list, its roots are unknown this tick.
    Pending,
    /// The watch fails (no list or watch permission, the kind gone).
    Failing(String),
    /// Every object's uid (selected or not), and the selected objects.
    Listed(Vec<String>, Vec<Candidate>),
}

#[derive(Default)]
struct State {
    objects: HashMap<String, Entry>,
    /// Filled while the watch lists; swapped in when the list is done.
    listing: Option<HashMap<String, Entry>>,
    synced: bool,
    failing: Option<String>,
    /// Counts the changes the look can see: objects, sync and failure.
    generation: u64,
}

/// A watch of one kind, stopped when dropped.
pub(super) struct Mirror {
    pub served: Served,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

impl Drop for Mirror {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Mirror {
    pub fn start(client: &Client, served: &Served) -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(client.clone(), &served.0);
        let task = tokio::spawn(watch(api, state.clone()));
        Self {
            served: served.clone(),
            state,
            task,
        }
    }

    /// Changes when anything [`Mirror::look`] returns may have changed.
    pub fn generation(&self) -> u64 {
        self.state.lock().map_or(u64::MAX, |s| s.generation)
    }

    pub fn look(&self, selectors: &[Selector]) -> Look {
        let Ok(state) = self.state.lock() else {
            return Look::Pending;
        };
        if let Some(e) = &state.failing {
            return Look::Failing(e.clone());
        }
        if !state.synced {
            return Look::Pending;
        }
        let uids = state.objects.keys().cloned().collect();
        let candidates = state
            .objects
            .iter()
            .filter(|(_, e)| {
                selectors
                    .iter()
                    .any(|s| s.selects_all() || s.matches(&e.labels))
            })
            .map(|(uid, e)| Candidate {
                uid: uid.clone(),
                entry: e.clone(),
            })
            .collect();
        Look::Listed(uids, candidates)
    }
}

fn entry(meta: &PartialObjectMeta<DynamicObject>) -> Option<(String, Entry)> {
    let uid = meta.metadata.uid.clone()?;
    let rv = meta.resource_version()?;
    Some((
        uid,
        Entry {
            rv,
            namespace: meta.namespace(),
            name: meta.name_any(),
            deleting: meta.metadata.deletion_timestamp.is_some(),
            labels: meta.labels().clone(),
            controllers: meta
                .owner_references()
                .iter()
                .filter(|o| o.controller == Some(true))
                .cloned()
                .collect(),
            owners: meta
                .owner_references()
                .iter()
                .map(|o| o.uid.clone())
                .collect(),
        },
    ))
}

/// Watches until aborted. After a failure it lists again from the start (the
/// kind stays pending or failing meanwhile): what the mirror held may have
/// missed changes.
async fn watch(api: Api<PartialObjectMeta<DynamicObject>>, state: Arc<Mutex<State>>) {
    let mut retry = FIRST_RETRY;
    loop {
        let mut events = watcher(api.clone(), watcher::Config::default().page_size(PAGE)).boxed();
        while let Some(event) = events.next().await {
            let Ok(mut st) = state.lock() else { return };
            if !matches!(event, Ok(Event::Init | Event::InitApply(_))) {
                st.generation += 1;
            }
            match event {
                Ok(Event::Init) => st.listing = Some(HashMap::new()),
                Ok(Event::InitApply(meta)) => {
                    if let (Some(listing), Some((uid, e))) = (st.listing.as_mut(), entry(&meta)) {
                        listing.insert(uid, e);
                    }
                }
                Ok(Event::InitDone) => {
                    if let Some(listing) = st.listing.take() {
                        st.objects = listing;
                    }
                    st.synced = true;
                    st.failing = None;
                    retry = FIRST_RETRY;
                }
                Ok(Event::Apply(meta)) => {
                    if let Some((uid, e)) = entry(&meta) {
                        st.objects.insert(uid, e);
                    }
                }
                Ok(Event::Delete(meta)) => {
                    if let Some(uid) = meta.uid() {
                        st.objects.remove(&uid);
                    }
                }
                Err(e) => {
                    st.synced = false;
                    st.listing = None;
                    st.failing = Some(e.to_string());
                    break;
                }
            }
        }
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(MAX_RETRY);
        // Listing again: pending, not failing, until it fails again.
        if let Ok(mut st) = state.lock() {
            st.failing = None;
            st.generation += 1;
        }
    }
}
