//! Kinds guarded by admission alone (Refuse and Warn, and no Convert policy):
//! cascade-guard writes nothing to their objects, but watches their metadata
//! for two things somebody must hear about, said as Events on the object:
//! - a foreground cascade that stops making progress (`CascadeStalled`, then
//!   `CascadeResumed`), counted in `cascade_guard_stalled_cascades` like the
//!   cascades Convert holds;
//! - under Refuse, a delete Crossplane replayed for a Usage that is gone and
//!   that the policy refused (`ReplayedDeleteRefused`): Crossplane tries once
//!   and says so only in its own log.
//!
//! Only the objects in one of those states are kept, so memory follows them,
//! not the number of objects of the kind.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::ApiResource;
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;

use super::backoff::{WatchBackoff, delivers, log_watch_error};
use super::convert::dependents::Lookup;
use super::convert::discovery::Discoveries;
use super::convert::events::publish;
use super::convert::{ConvertKind, Meta, kind_key};
use super::telemetry::Metrics;
use crate::cluster::served_resource;
use crate::cluster::watch_tap::{Tap, Taps};
use crate::policy::names::FOREGROUND_DELETION_FINALIZER;
use crate::policy::replay::{REPLAY_GRACE, refused_replay, replay_note};
use crate::policy::stall::{Clock, Turn, stalled_note};
use crate::policy::{Mode, Policy, ProtectedKind, Shape};

/// One kind watched, and whether a refused replay is to be told (Refuse).
#[derive(Clone, Debug, PartialEq)]
pub struct WatchedKind {
    pub kind: ProtectedKind,
    pub refuses: bool,
}

/// The kinds the policies guard by admission alone, by `group/kind`.
pub fn watched_kinds(
    policies: &[Policy],
    convert: &BTreeMap<String, ConvertKind>,
) -> BTreeMap<String, WatchedKind> {
    let mut out: BTreeMap<String, WatchedKind> = BTreeMap::new();
    for p in policies {
        let key = kind_key(&p.kind);
        // Claims' cascades are their XRs', watched there; a Convert kind's
        // cascades are held and watched by Convert (a kind whose composed
        // objects alone are held keeps this watch for the rest).
        if !matches!(p.mode, Mode::Refuse | Mode::Warn)
            || p.kind.shape == Shape::Claim
            || convert.get(&key).is_some_and(ConvertKind::converts)
        {
            continue;
        }
        let entry = out.entry(key).or_insert_with(|| WatchedKind {
            kind: p.kind.clone(),
            refuses: false,
        });
        entry.refuses |= p.mode == Mode::Refuse;
    }
    out
}

/// Runs one watch per watched kind.
pub struct Watches {
    client: Client,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    stall_after: Duration,
    running: BTreeMap<String, (WatchedKind, JoinHandle<()>)>,
    /// Sibling order's index, fed by each kind's watch.
    feed: Option<Arc<dyn Taps>>,
}

impl Watches {
    pub fn new(
        client: Client,
        recorder: Recorder,
        metrics: Arc<Metrics>,
        stall_after: Duration,
    ) -> Self {
        Self {
            client,
            recorder,
            metrics,
            stall_after,
            running: BTreeMap::new(),
            feed: None,
        }
    }

    /// Each kind's watch also feeds sibling order's index.
    pub fn with_feed(mut self, feed: Option<Arc<dyn Taps>>) -> Self {
        self.feed = feed;
        self
    }

    /// Starts the watches of new kinds and stops those of kinds no longer watched.
    pub fn update(&mut self, kinds: BTreeMap<String, WatchedKind>) {
        let gone: Vec<String> = self
            .running
            .iter()
            .filter(|(key, (kind, _))| kinds.get(*key) != Some(kind))
            .map(|(key, _)| key.clone())
            .collect();
        for key in gone {
            if let Some((kind, task)) = self.running.remove(&key) {
                task.abort();
                self.metrics.set_stalled(&kind.kind.to_string(), 0);
            }
        }
        for (key, kind) in kinds {
            if self.running.contains_key(&key) {
                continue;
            }
            let watch = KindWatch {
                client: self.client.clone(),
                recorder: self.recorder.clone(),
                metrics: self.metrics.clone(),
                stall_after: self.stall_after,
                kind: kind.clone(),
                discoveries: Discoveries::default(),
                tap: self.feed.as_ref().map(|f| f.tap(&kind.kind)),
            };
            self.running.insert(key, (kind, tokio::spawn(watch.run())));
        }
    }
}

impl Drop for Watches {
    fn drop(&mut self) {
        for (_, task) in self.running.values() {
            task.abort();
        }
    }
}

struct KindWatch {
    client: Client,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    stall_after: Duration,
    kind: WatchedKind,
    discoveries: Discoveries,
    /// Into sibling order's index; dropped with the watch.
    tap: Option<Box<dyn Tap>>,
}

/// An object in one of the states worth watching.
enum Tracked {
    /// In a foreground cascade; its clock once looked at.
    Cascade(Meta, Option<Clock>),
    /// Looks like a refused replay since then; told about this version.
    Replay(Meta, Instant, Option<String>),
}

/// Objects per page of the start-up list.
const LIST_PAGE_SIZE: u32 = 500;

/// How long a served kind is looked for again after discovery failed.
const REDISCOVER: Duration = Duration::from_secs(30);

impl KindWatch {
    async fn run(mut self) {
        let label = self.kind.kind.to_string();
        let resource = loop {
            match served_resource(&self.client, &self.kind.kind).await {
                Ok(r) => break r,
                Err(e) => {
                    tracing::debug!(kind = %label, error = %e, "kind not served yet; cannot watch its cascades");
                    tokio::time::sleep(REDISCOVER).await;
                }
            }
        };
        let api: Api<Meta> = Api::all_with(self.client.clone(), &resource);
        // Small pages: the start-up list is this watch's peak of memory.
        let config = watcher::Config::default().page_size(LIST_PAGE_SIZE);
        let tap = self.tap.take();
        let mut events = watcher(api, config)
            .inspect(move |event| {
                if let Some(tap) = &tap {
                    tap.event(event);
                }
            })
            .backoff(WatchBackoff::default())
            .boxed();
        let mut tracked: HashMap<String, Tracked> = HashMap::new();
        // Often enough to tell a stall within a third of the stall time.
        let every = (self.stall_after / 3).clamp(Duration::from_secs(1), Duration::from_secs(30));
        let mut tick = tokio::time::interval(every.min(REPLAY_GRACE / 2));
        // What a failing watch costs is silence about its stalls: say so once
        // (a missing list or watch permission, say), not every retry.
        let what = format!("{label} (for its stalled cascades)");
        let mut failing = false;
        loop {
            tokio::select! {
                event = events.next() => match event {
                    Some(Ok(event)) => {
                        if delivers(&event) && std::mem::take(&mut failing) {
                            tracing::info!("watching {what} again");
                        }
                        self.see(event, &mut tracked)
                    }
                    Some(Err(e)) => log_watch_error(&mut failing, &what, &e),
                    None => return,
                },
                _ = tick.tick() => self.look(&resource, &mut tracked).await,
            }
        }
    }

    fn see(&self, event: watcher::Event<Meta>, tracked: &mut HashMap<String, Tracked>) {
        match event {
            watcher::Event::Apply(object) | watcher::Event::InitApply(object) => {
                let Some(uid) = object.uid() else { return };
                let deleting = object.metadata.deletion_timestamp.is_some();
                let in_foreground = deleting
                    && object
                        .finalizers()
                        .iter()
                        .any(|f| f == FOREGROUND_DELETION_FINALIZER);
                let replay = self.kind.refuses
                    && refused_replay(object.annotations(), object.labels(), deleting).is_some();
                let next = match (in_foreground, replay, tracked.remove(&uid)) {
                    (true, _, Some(Tracked::Cascade(_, clock))) => Tracked::Cascade(object, clock),
                    (true, _, _) => Tracked::Cascade(object, None),
                    (false, true, Some(Tracked::Replay(_, since, told))) => {
                        Tracked::Replay(object, since, told)
                    }
                    (false, true, _) => Tracked::Replay(object, Instant::now(), None),
                    (false, false, Some(Tracked::Cascade(..))) => {
                        self.count(tracked);
                        return;
                    }
                    (false, false, _) => return,
                };
                tracked.insert(uid, next);
            }
            watcher::Event::Delete(object) => {
                if let Some(uid) = object.uid() {
                    tracked.remove(&uid);
                    self.count(tracked);
                }
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }

    /// Moves each cascade's clock on, and tells of refused replays.
    async fn look(&self, resource: &ApiResource, tracked: &mut HashMap<String, Tracked>) {
        let now = Instant::now();
        let lookup = Lookup {
            client: &self.client,
            resource,
            discoveries: &self.discoveries,
        };
        let shows = self.kind.kind.shape == Shape::CompositeResource;
        for (uid, entry) in tracked.iter_mut() {
            match entry {
                Tracked::Cascade(object, clock) => {
                    let left = if shows {
                        lookup.dependents(object, uid).await.1
                    } else {
                        Vec::new()
                    };
                    let Some(clock) = clock else {
                        *clock = Some(Clock::start(left, now));
                        continue;
                    };
                    match clock.look(left, now, self.stall_after) {
                        Turn::Stalled => {
                            let note = stalled_note(clock.still_for(now), clock.left(), shows);
                            tracing::warn!(kind = %self.kind.kind, name = %object.name_any(), %note, "cascade stalled");
                            self.tell(
                                resource,
                                object,
                                EventType::Warning,
                                "CascadeStalled",
                                &note,
                            )
                            .await;
                        }
                        Turn::Resumed => {
                            let note = format!("progress again; {} left", clock.left().len());
                            self.tell(resource, object, EventType::Normal, "CascadeResumed", &note)
                                .await;
                        }
                        _ => {}
                    }
                }
                Tracked::Replay(object, since, told) => {
                    let version = object.resource_version();
                    if now.duration_since(*since) < REPLAY_GRACE || *told == version {
                        continue;
                    }
                    let policy =
                        refused_replay(object.annotations(), object.labels(), false).unwrap_or("");
                    let note = replay_note(policy, &target(&self.kind.kind, object));
                    tracing::warn!(kind = %self.kind.kind, name = %object.name_any(), "Crossplane's replayed delete was refused");
                    self.tell(
                        resource,
                        object,
                        EventType::Warning,
                        "ReplayedDeleteRefused",
                        &note,
                    )
                    .await;
                    *told = version;
                }
            }
        }
        self.count(tracked);
    }

    fn count(&self, tracked: &HashMap<String, Tracked>) {
        let stalled = tracked
            .values()
            .filter(|t| matches!(t, Tracked::Cascade(_, Some(c)) if c.is_stalled()))
            .count();
        self.metrics
            .set_stalled(&self.kind.kind.to_string(), stalled);
    }

    async fn tell(
        &self,
        resource: &ApiResource,
        object: &Meta,
        type_: EventType,
        reason: &str,
        note: &str,
    ) {
        publish(&self.recorder, resource, object, type_, reason, note).await;
    }
}

/// What to pass kubectl: `plural.group name [-n namespace]`.
fn target(kind: &ProtectedKind, object: &Meta) -> String {
    match object.namespace() {
        Some(ns) => format!("{} {} -n {ns}", kind.resource(), object.name_any()),
        None => format!("{} {}", kind.resource(), object.name_any()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::cascade::Reach;

    fn policy(kind: &str, mode: Mode, shape: Shape) -> Policy {
        crate::cluster::convert::test_policy(kind, mode, shape, None)
    }

    #[test]
    fn kinds_guarded_by_admission_alone_are_watched() {
        let policies = [
            policy("Refused", Mode::Refuse, Shape::CompositeResource),
            policy("Warned", Mode::Warn, Shape::Other),
            policy("Both", Mode::Warn, Shape::CompositeResource),
            policy("Both", Mode::Refuse, Shape::CompositeResource),
            policy("Converted", Mode::Convert, Shape::CompositeResource),
            policy("Converted", Mode::Refuse, Shape::CompositeResource),
            policy("Off", Mode::Off, Shape::CompositeResource),
            policy("Claimed", Mode::Refuse, Shape::Claim),
        ];
        let convert = BTreeMap::from([
            (
                "example.org/Converted".to_string(),
                ConvertKind {
                    kind: policies[4].kind.clone(),
                    reach: Reach::Every,
                    composed: Reach::Nothing,
                },
            ),
            // Only its composed objects held (--hold-composed): still watched.
            (
                "example.org/Refused".to_string(),
                ConvertKind {
                    kind: policies[0].kind.clone(),
                    reach: Reach::Nothing,
                    composed: Reach::Every,
                },
            ),
        ]);
        let got: Vec<(String, bool)> = watched_kinds(&policies, &convert)
            .into_iter()
            .map(|(k, w)| (k, w.refuses))
            .collect();
        assert_eq!(
            got,
            [
                ("example.org/Both".to_string(), true),
                ("example.org/Refused".to_string(), true),
                ("example.org/Warned".to_string(), false),
            ]
        );
    }
}
