//! A timeline of what the API server did to a set of objects, recorded from
//! watches, to assert order (an owner outlived its dependents) rather than
//! sample state at a few instants.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, ListParams, PartialObjectMeta};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::task::JoinHandle;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Listed, added or modified.
    Seen {
        terminating: bool,
        finalizers: Vec<String>,
    },
    /// Removed from the API.
    Gone,
}

#[derive(Clone, Debug)]
pub struct Entry {
    /// Order of arrival across every watched resource.
    pub seq: u64,
    pub at: Instant,
    /// The watched resource's API group (`""` for the core group): two
    /// kinds of one name (provider-helm's and provider-kubernetes'
    /// `ProviderConfig`) differ only by it.
    pub group: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    pub uid: String,
    pub change: Change,
    /// The object's resourceVersion in this event, as a number: etcd's
    /// revision, ordered across kinds (a deletion's is the revision of the
    /// delete). Arrival order (`seq`) across separate watches is not the
    /// API server's order for changes milliseconds apart.
    pub revision: Option<u64>,
    /// A removal the watch never reported, found by its re-list (after an
    /// expired revision or an API server restart, a watch lists again, and a
    /// list reports no removals): the object left after this revision (the
    /// last seen of it) and no later than `revision` (a list's after the
    /// re-list).
    pub missed_after: Option<u64>,
}

/// Records a removal the watch missed for each of `missed` (uids its re-list
/// no longer showed), bounded by a list's revision read now.
async fn record_missed(
    log: &Mutex<Log>,
    lister: &Api<PartialObjectMeta<DynamicObject>>,
    group: &str,
    kind: &str,
    present: &mut HashMap<String, (String, Option<String>, Option<u64>)>,
    missed: Vec<String>,
) {
    let by = lister
        .list_metadata(&ListParams::default().limit(1))
        .await
        .ok()
        .and_then(|l| l.metadata.resource_version)
        .and_then(|rv| rv.parse().ok());
    let Ok(mut log) = log.lock() else {
        return;
    };
    for uid in missed {
        let Some((name, namespace, last)) = present.remove(&uid) else {
            continue;
        };
        let seq = log.next;
        log.next += 1;
        log.entries.push(Entry {
            seq,
            at: Instant::now(),
            group: group.to_string(),
            kind: kind.to_string(),
            namespace,
            name,
            uid,
            change: Change::Gone,
            revision: by,
            missed_after: Some(last.unwrap_or(0)),
        });
    }
}

#[derive(Default)]
struct Log {
    next: u64,
    entries: Vec<Entry>,
}

pub struct Timeline {
    log: Arc<Mutex<Log>>,
    tasks: Vec<JoinHandle<()>>,
}

/// How long [`Timeline::start`] waits for every watch's initial list.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

impl Timeline {
    /// Starts watching each resource (in `namespace`, or cluster-wide for
    /// `None`) and returns once every watch has listed what exists; an error
    /// naming the watches that had not, and their last error, if that takes
    /// longer than [`READY_TIMEOUT`].
    pub async fn start(
        client: &Client,
        resources: &[(ApiResource, Option<String>)],
    ) -> Result<Self, crate::Error> {
        let log = Arc::new(Mutex::new(Log::default()));
        let mut tasks = Vec::new();
        let mut ready = Vec::new();
        for (resource, namespace) in resources {
            // Metadata-only watches: the timeline needs nothing else.
            let api: Api<PartialObjectMeta<DynamicObject>> = match namespace {
                Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
                None => Api::all_with(client.clone(), resource),
            };
            let kind = resource.kind.clone();
            let group = resource.group.clone();
            let log = log.clone();
            let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
            let last_error = Arc::new(Mutex::new(None::<String>));
            let watch = match namespace {
                Some(ns) => format!("{} in namespace {ns}", resource.plural),
                None => resource.plural.clone(),
            };
            ready.push((watch, ready_rx, last_error.clone()));
            tasks.push(tokio::spawn(async move {
                let mut ready_tx = Some(ready_tx);
                let lister = api.clone();
                let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
                // What is there as last seen (uid: name, namespace, revision),
                // and, during a re-list, what the list has shown so far.
                let mut present: HashMap<String, (String, Option<String>, Option<u64>)> =
                    HashMap::new();
                let mut relisted: Option<HashSet<String>> = None;
                while let Some(event) = stream.next().await {
                    let (object, gone) = match event {
                        Ok(Event::Apply(o)) => (o, false),
                        Ok(Event::InitApply(o)) => {
                            if let (Some(seen), Some(uid)) =
                                (relisted.as_mut(), o.metadata.uid.as_ref())
                            {
                                seen.insert(uid.clone());
                            }
                            (o, false)
                        }
                        Ok(Event::Delete(o)) => (o, true),
                        // The watch lists again after an error (its revision
                        // expired, the API server restarted); a list reports
                        // no removals.
                        Ok(Event::Init) => {
                            if ready_tx.is_none() {
                                relisted = Some(HashSet::new());
                            }
                            continue;
                        }
                        Ok(Event::InitDone) => {
                            if let Some(tx) = ready_tx.take() {
                                let _ = tx.send(());
                            }
                            if let Some(seen) = relisted.take() {
                                let missed: Vec<String> = present
                                    .keys()
                                    .filter(|uid| !seen.contains(*uid))
                                    .cloned()
                                    .collect();
                                if !missed.is_empty() {
                                    record_missed(
                                        &log,
                                        &lister,
                                        &group,
                                        &kind,
                                        &mut present,
                                        missed,
                                    )
                                    .await;
                                }
                            }
                            continue;
                        }
                        Err(e) => {
                            if let Ok(mut last) = last_error.lock() {
                                *last = Some(e.to_string());
                            }
                            continue;
                        }
                    };
                    let meta = object.metadata;
                    let revision = meta
                        .resource_version
                        .as_deref()
                        .and_then(|rv| rv.parse().ok());
                    let uid = meta.uid.unwrap_or_default();
                    let name = meta.name.unwrap_or_default();
                    let change = if gone {
                        present.remove(&uid);
                        Change::Gone
                    } else {
                        present.insert(
                            uid.clone(),
                            (name.clone(), meta.namespace.clone(), revision),
                        );
                        Change::Seen {
                            terminating: meta.deletion_timestamp.is_some(),
                            finalizers: meta.finalizers.unwrap_or_default(),
                        }
                    };
                    if let Ok(mut log) = log.lock() {
                        let seq = log.next;
                        log.next += 1;
                        log.entries.push(Entry {
                            seq,
                            at: Instant::now(),
                            group: group.clone(),
                            kind: kind.clone(),
                            namespace: meta.namespace,
                            name,
                            uid,
                            change,
                            revision,
                            missed_after: None,
                        });
                    }
                }
            }));
        }
        let timeline = Self { log, tasks };
        // One deadline for every watch: they list at the same time.
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        let mut not_ready = Vec::new();
        for (watch, rx, last_error) in ready {
            if let Ok(Ok(())) = tokio::time::timeout_at(deadline, rx).await {
                continue;
            }
            let last = last_error.lock().ok().and_then(|l| l.clone());
            not_ready.push(match last {
                Some(e) => format!("{watch} (last error: {e})"),
                None => watch,
            });
        }
        if not_ready.is_empty() {
            Ok(timeline)
        } else {
            // Dropping the timeline stops every watch.
            Err(crate::Error::NotReady {
                component: format!("the timeline's watches of {}", not_ready.join("; ")),
                last: format!("not listed after {READY_TIMEOUT:?}"),
            })
        }
    }

    pub fn entries(&self) -> Vec<Entry> {
        self.log
            .lock()
            .map(|l| l.entries.clone())
            .unwrap_or_default()
    }

    /// When `kind`/`name` left the API, if it has.
    pub fn gone(&self, kind: &str, name: &str) -> Option<Entry> {
        self.entries()
            .into_iter()
            .find(|e| e.kind == kind && e.name == name && e.change == Change::Gone)
    }

    pub async fn wait_gone(&self, kind: &str, name: &str, timeout: Duration) -> Option<Entry> {
        crate::wait::until(timeout, || async { self.gone(kind, name) }).await
    }

    /// Whether `kind`/`name` was ever seen terminating with `finalizer`.
    pub fn seen_with_finalizer(&self, kind: &str, name: &str, finalizer: &str) -> bool {
        self.entries().iter().any(|e| {
            e.kind == kind
                && e.name == name
                && matches!(&e.change, Change::Seen { finalizers, .. } if finalizers.iter().any(|f| f == finalizer))
        })
    }

    /// The first time `kind`/`name` was seen terminating.
    pub fn terminating(&self, kind: &str, name: &str) -> Option<Entry> {
        self.entries().into_iter().find(|e| {
            e.kind == kind
                && e.name == name
                && matches!(
                    e.change,
                    Change::Seen {
                        terminating: true,
                        ..
                    }
                )
        })
    }

    /// `entry`'s etcd revision, to order it against an entry of another
    /// watch: arrival order across two watches is not the API server's (a
    /// loaded API server delivered an owner's removal after its dependents'
    /// deletions, CI-like run at `9b813b6`). Every watch event carries one,
    /// so a missing one fails the caller, with the timeline.
    pub fn revision_of(&self, entry: &Entry) -> u64 {
        entry.revision.unwrap_or_else(|| {
            panic!(
                "{}/{} has no revision in the timeline:\n{}",
                entry.kind,
                entry.name,
                self.describe()
            )
        })
    }

    /// Every entry as one line each, for a failing assertion's message.
    pub fn describe(&self) -> String {
        self.entries()
            .iter()
            .map(|e| {
                let revision = e.revision.map_or("?".to_string(), |r| r.to_string());
                format!(
                    "{:>4} r{revision} {}/{} {:?}",
                    e.seq, e.kind, e.name, e.change
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}
