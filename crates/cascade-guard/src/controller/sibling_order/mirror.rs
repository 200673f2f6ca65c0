//! Sibling order's own watches that feed the [`Index`]: a metadata watch of
//! each Usage kind, and of each ordered kind no other watch of the
//! controller follows (a claim kind under Refuse), each pushing its events in
//! as they come. The look used to list every ordered kind each tick, which
//! at 100,000 objects was the API server serving hundreds of MiB a second and
//! the controller holding a GiB.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{DynamicObject, PartialObjectMeta};
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;

use super::index::{Feeder, Index, IndexEvent, KindKey, Meta, feeder};
use crate::cluster::kinds::Served;

/// Objects per page of the watch's lists.
const PAGE: u32 = 500;
/// The first wait after the watch failed; doubled up to `MAX_RETRY`.
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(30);

/// A watch of one kind, stopped when dropped.
pub(super) struct Mirror {
    pub served: Served,
    task: JoinHandle<()>,
    index: Arc<Mutex<Index>>,
    feeder: Feeder,
}

impl Drop for Mirror {
    fn drop(&mut self) {
        self.task.abort();
        let key = (self.served.0.group.clone(), self.served.0.kind.clone());
        if let Ok(mut index) = self.index.lock() {
            index.apply(&key, self.feeder, IndexEvent::Stopped);
        }
    }
}

impl Mirror {
    pub fn start(client: &Client, served: &Served, index: Arc<Mutex<Index>>) -> Self {
        let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(client.clone(), &served.0);
        let key = (served.0.group.clone(), served.0.kind.clone());
        let id = feeder();
        let task = tokio::spawn(watch(api, key, id, index.clone()));
        Self {
            served: served.clone(),
            task,
            index,
            feeder: id,
        }
    }
}

/// What the index keeps of an object.
pub(super) fn meta(object: &PartialObjectMeta<DynamicObject>) -> Option<Meta> {
    let uid = object.metadata.uid.clone()?;
    let rv = object.resource_version()?;
    Some(Meta {
        uid,
        rv,
        namespace: object.namespace(),
        name: object.name_any(),
        deleting: object.metadata.deletion_timestamp.is_some(),
        labels: object.labels().clone(),
        controllers: object
            .owner_references()
            .iter()
            .filter(|o| o.controller == Some(true))
            .map(|o| {
                let group = o.api_version.rsplit_once('/').map_or("", |(g, _)| g);
                ((group.to_string(), o.kind.clone()), o.uid.clone())
            })
            .collect(),
        owners: object
            .owner_references()
            .iter()
            .map(|o| o.uid.clone())
            .collect(),
    })
}

/// The index's event for a watcher's, if any.
pub(super) fn event(event: &Event<PartialObjectMeta<DynamicObject>>) -> Option<IndexEvent> {
    Some(match event {
        Event::Init => IndexEvent::Listing,
        Event::InitApply(object) => IndexEvent::Listed(meta(object)?),
        Event::InitDone => IndexEvent::ListDone,
        Event::Apply(object) => IndexEvent::Applied(meta(object)?),
        Event::Delete(object) => IndexEvent::Deleted(object.uid()?),
    })
}

/// Watches until aborted. After a failure it lists again from the start (the
/// kind stays failing meanwhile): what the index held may have missed
/// changes.
async fn watch(
    api: Api<PartialObjectMeta<DynamicObject>>,
    key: KindKey,
    id: Feeder,
    index: Arc<Mutex<Index>>,
) {
    let mut retry = FIRST_RETRY;
    // Said once, at the first list: which kinds sibling order follows on
    // its own (an operator's check that the chart's grants reach them).
    let mut told = false;
    let mut objects = 0usize;
    loop {
        let mut events = watcher(api.clone(), watcher::Config::default().page_size(PAGE)).boxed();
        while let Some(next) = events.next().await {
            let listed = matches!(next, Ok(Event::InitDone));
            // What the list that ends first brought, not a failed one before.
            match next {
                Ok(Event::Init) => objects = 0,
                Ok(Event::InitApply(_)) => objects += 1,
                _ => {}
            }
            if listed && !std::mem::replace(&mut told, true) {
                let (group, kind) = &key;
                tracing::info!(%kind, %group, objects, "sibling order: watching the kind");
            }
            let change = match next {
                Ok(e) => event(&e),
                Err(e) => Some(IndexEvent::Failed(e.to_string())),
            };
            let failed = matches!(change, Some(IndexEvent::Failed(_)));
            if let Some(change) = change {
                let Ok(mut index) = index.lock() else { return };
                index.apply(&key, id, change);
            }
            if listed {
                retry = FIRST_RETRY;
            }
            if failed {
                break;
            }
        }
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(MAX_RETRY);
    }
}
