//! What one kind's controller keeps between steps: per object, what the
//! state machine remembers, its cascade's clock and its failures in a row;
//! for the kind, the census of objects held and the discovered composed kinds.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::ApiResource;
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};

use super::Meta;
use super::dependents::Lookup;
use super::discovery::Discoveries;
use super::events;
use super::intake::Census;
use super::kinds::ConvertKind;
use super::metrics::ConvertMetrics;
use super::writes::object_api;
use crate::policy::Shape;
use crate::policy::cascade::{Carry, Memory, Observed, Reach};
use crate::policy::stall::Clock;

pub(super) struct Context {
    pub client: Client,
    pub resource: ApiResource,
    pub shape: Shape,
    pub reach: Reach,
    /// Composed objects held within this reach too (`--hold-composed`).
    pub composed: Reach,
    pub carry: Carry,
    pub stall_after: Duration,
    pub label: String,
    pub recorder: Recorder,
    pub metrics: Arc<dyn ConvertMetrics>,
    /// Each cascade's progress, by UID.
    pub clocks: Mutex<HashMap<String, Clock>>,
    memory: Mutex<HashMap<String, Memory>>,
    /// Composed-resource kinds resolved through discovery, or when it failed.
    discoveries: Discoveries,
    /// The objects held, for the gauge (the cache has only deletions).
    pub census: Mutex<Census>,
    /// Failed steps in a row, by UID, for the retry backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// A first conversion's Event, published a few at a time beside the
    /// conversions.
    pub telling: tokio::sync::Semaphore,
    /// How long after its conversion a first conversion is told.
    pub tell_after: Duration,
}

/// First conversions told at once, per kind.
pub(super) const TOLD_AT_ONCE: usize = 2;
/// How long after its conversion a first conversion's Event is published:
/// after the burst of conversions a burst of deletes brings.
const TELL_AFTER: Duration = Duration::from_secs(1);

/// What a kind's controller is given to run with.
pub(super) struct Setting {
    pub client: Client,
    pub resource: ApiResource,
    pub carry: Carry,
    pub stall_after: Duration,
    pub recorder: Recorder,
    pub metrics: Arc<dyn ConvertMetrics>,
}

impl Context {
    pub fn new(setting: Setting, kind: &ConvertKind) -> Self {
        Self {
            client: setting.client,
            resource: setting.resource,
            shape: kind.kind.shape,
            reach: kind.reach.clone(),
            composed: kind.composed.clone(),
            carry: setting.carry,
            stall_after: setting.stall_after,
            label: kind.kind.to_string(),
            recorder: setting.recorder,
            metrics: setting.metrics,
            clocks: Mutex::new(HashMap::new()),
            memory: Mutex::new(HashMap::new()),
            discoveries: Discoveries::default(),
            census: Mutex::new(Census::default()),
            failures: Mutex::new(HashMap::new()),
            telling: tokio::sync::Semaphore::new(TOLD_AT_ONCE),
            tell_after: TELL_AFTER,
        }
    }

    /// A context for the test kind (`XDatabase`, namespaced) with its own
    /// recorder and metrics, every object in `reach`.
    #[cfg(test)]
    pub fn for_tests(client: Client, shape: Shape, reach: Reach, stall_after: Duration) -> Self {
        use kube::runtime::events::Reporter;
        let setting = Setting {
            recorder: Recorder::new(
                client.clone(),
                Reporter {
                    controller: "cascade-guard".into(),
                    instance: None,
                },
            ),
            client,
            resource: crate::fake_api_server::resource(),
            carry: Carry::ToTheEnd {
                restart_after: Some(crate::policy::cascade::RESTART_AFTER),
            },
            stall_after,
            metrics: Arc::new(super::metrics::Uncounted),
        };
        let kind = ConvertKind {
            kind: crate::policy::ProtectedKind {
                group: "example.org".into(),
                kind: "XDatabase".into(),
                plural: "xdatabases".into(),
                scope: crate::policy::Scope::Namespaced,
                shape,
            },
            reach,
            composed: Reach::Nothing,
        };
        // Told at once: the scripted requests keep their order.
        Self {
            tell_after: Duration::ZERO,
            ..Self::new(setting, &kind)
        }
    }

    pub fn observe(&self, object: &Meta) -> Observed {
        Observed::new(
            object.metadata.deletion_timestamp.is_some(),
            object.finalizers(),
            self.reach.covers(object.labels())
                || (is_composed(object) && self.composed.covers(object.labels())),
            self.shape,
        )
    }

    pub fn api(&self, object: &Meta) -> Api<Meta> {
        object_api(&self.client, &self.resource, object)
    }

    pub fn lookup(&self) -> Lookup<'_> {
        Lookup {
            client: &self.client,
            resource: &self.resource,
            discoveries: &self.discoveries,
        }
    }

    pub async fn publish(&self, object: &Meta, type_: EventType, reason: &str, note: &str) {
        events::publish(&self.recorder, &self.resource, object, type_, reason, note).await;
    }

    /// Listed, and nothing held.
    pub fn drained(&self) -> bool {
        self.census.lock().map(|c| c.is_empty()).unwrap_or(false)
    }

    pub fn held(&self) -> usize {
        self.census.lock().map(|c| c.len()).unwrap_or(0)
    }

    pub fn memory(&self, uid: &str) -> Memory {
        self.memory
            .lock()
            .ok()
            .and_then(|m| m.get(uid).copied())
            .unwrap_or_default()
    }

    pub fn remember(&self, uid: &str, update: impl FnOnce(&mut Memory)) {
        if let Ok(mut m) = self.memory.lock() {
            update(m.entry(uid.to_string()).or_default());
        }
    }

    pub fn forget(&self, uid: &str) {
        if let Ok(mut m) = self.memory.lock() {
            m.remove(uid);
        }
        if let Ok(mut c) = self.clocks.lock() {
            c.remove(uid);
        }
    }

    /// Counts one more failed step in a row for `uid`.
    pub fn failed_again(&self, uid: Option<String>) -> u32 {
        match (uid, self.failures.lock()) {
            (Some(uid), Ok(mut f)) => {
                let n = f.entry(uid).or_insert(0);
                *n = n.saturating_add(1);
                *n
            }
            _ => 1,
        }
    }

    pub fn succeeded(&self, uid: &str) {
        if let Ok(mut f) = self.failures.lock() {
            f.remove(uid);
        }
    }

    /// How often a cascade is looked at: often enough to tell a stall
    /// within a third of the stall time, and to catch a missed event.
    pub fn look_interval(&self) -> Duration {
        (self.stall_after / 3).clamp(Duration::from_secs(1), Duration::from_secs(30))
    }

    /// Protected objects and cascades in progress, for the metrics; forgets
    /// objects that are gone.
    pub fn count(&self, store: &Store<Meta>) {
        let objects = store.state();
        let cached: HashSet<String> = objects.iter().filter_map(|o| o.uid()).collect();
        let deleting = objects
            .iter()
            .filter(|o| o.metadata.deletion_timestamp.is_some())
            .count();
        if let Ok(mut m) = self.memory.lock() {
            m.retain(|uid, _| cached.contains(uid));
        }
        if let Ok(mut f) = self.failures.lock() {
            f.retain(|uid, _| cached.contains(uid));
        }
        if let Ok(mut c) = self.clocks.lock() {
            c.retain(|uid, _| cached.contains(uid));
            let stalled = c.values().filter(|clock| clock.is_stalled()).count();
            self.metrics.set_stalled(&self.label, stalled);
        }
        if let Ok(census) = self.census.lock() {
            self.metrics.set_protected(&self.label, census.len());
        }
        self.metrics.set_in_progress(&self.label, deleting);
    }
}

/// Crossplane composed it: a controller owner reference (the one
/// [`super::runner`] keeps of an object's references).
fn is_composed(object: &Meta) -> bool {
    object
        .metadata
        .owner_references
        .as_ref()
        .is_some_and(|refs| refs.iter().any(|r| r.controller == Some(true)))
}
