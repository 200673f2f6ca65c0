//! A timeline of what the API server did to a set of objects, recorded from
//! watches, to assert order (an owner outlived its dependents) rather than
//! sample state at a few instants.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, PartialObjectMeta};
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
                let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
                while let Some(event) = stream.next().await {
                    let (object, gone) = match event {
                        Ok(Event::Apply(o)) | Ok(Event::InitApply(o)) => (o, false),
                        Ok(Event::Delete(o)) => (o, true),
                        Ok(Event::InitDone) => {
                            if let Some(tx) = ready_tx.take() {
                                let _ = tx.send(());
                            }
                            continue;
                        }
                        Ok(Event::Init) => continue,
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
                    let change = if gone {
                        Change::Gone
                    } else {
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
                            name: meta.name.unwrap_or_default(),
                            uid: meta.uid.unwrap_or_default(),
                            change,
                            revision,
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

    /// Every entry as one line each, for a failing assertion's message.
    pub fn describe(&self) -> String {
        self.entries()
            .iter()
            .map(|e| format!("{:>4} {}/{} {:?}", e.seq, e.kind, e.name, e.change))
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
