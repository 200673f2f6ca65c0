//! The Convert controllers that run, one per kind, started and stopped as
//! policies change; each fed by its kind's watch through the intake, which
//! adds the finalizer to live objects straight from the watch and passes
//! deletions on.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt, future};
use kube::runtime::controller::Controller;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::store::Writer;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::{Semaphore, oneshot};
use tokio::task::JoinHandle;

use super::Meta;
use super::context::{Context, Setting};
use super::intake;
use super::kinds::{ConvertKind, is_served, kind_key};
use super::metrics::ConvertMetrics;
use super::steps::{error_policy, reconcile};
use super::writes::{self, changed_since, is_stale};
use crate::cluster::backoff::WatchBackoff;
use crate::cluster::served_resource;
// Sibling order's index, fed by Convert's watches: still the controller's.
use crate::cluster::watch_tap::Taps;
use crate::policy::ProtectedKind;
use crate::policy::cascade::{Carry, Reach};
use crate::policy::names::{CONVERTED_ANNOTATION, FOREGROUND_CASCADE_FINALIZER};

/// One kind's Convert controller, running.
struct RunningKind {
    kind: ConvertKind,
    context: Arc<Context>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl RunningKind {
    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// Finalizers being added at once, across all kinds: bounds the connections
/// and memory of a start-up that holds thousands of existing objects.
const FINALIZER_ADDS_AT_ONCE: usize = 16;

/// Reconciles of one kind at once. Only deleting objects reach the
/// controller (live ones are held from the watch), and a conversion is one
/// request: 64 keep 100 deletes at once from waiting in line (#46).
const RECONCILES_AT_ONCE: u16 = 64;

/// Objects per page of a Convert kind's list.
const LIST_PAGE_SIZE: u32 = 100;

/// The Convert controllers that run, started and stopped as policies change.
pub struct Converter {
    client: Client,
    recorder: Recorder,
    metrics: Arc<dyn ConvertMetrics>,
    running: BTreeMap<String, RunningKind>,
    finalizer_adds: Arc<Semaphore>,
    carry: Carry,
    stall_after: Duration,
    /// Sibling order's index, fed by each kind's watch.
    feed: Option<Arc<dyn Taps>>,
}

/// How long a cascade may make no progress before it is reported stalled.
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(600);

impl Converter {
    pub fn new(client: Client, recorder: Recorder, metrics: Arc<dyn ConvertMetrics>) -> Self {
        Self {
            client,
            recorder,
            metrics,
            running: BTreeMap::new(),
            finalizer_adds: Arc::new(Semaphore::new(FINALIZER_ADDS_AT_ONCE)),
            carry: Carry::ToTheEnd {
                restart_after: Some(crate::policy::cascade::RESTART_AFTER),
            },
            stall_after: DEFAULT_STALL_AFTER,
            feed: None,
        }
    }

    /// Each kind's watch also feeds sibling order's index.
    pub fn with_feed(mut self, feed: Option<Arc<dyn Taps>>) -> Self {
        self.feed = feed;
        self
    }

    /// Cascades with no progress for this long are reported stalled.
    pub fn with_stall_after(mut self, stall_after: Duration) -> Self {
        self.stall_after = stall_after;
        self
    }

    /// Quiet foreground cascades are restarted after this long (`None`:
    /// never). Uninstall hands cascades over instead, and keeps doing so.
    pub fn with_restarts_after(mut self, after: Option<Duration>) -> Self {
        if let Carry::ToTheEnd { restart_after } = &mut self.carry {
            *restart_after = after;
        }
        self
    }

    /// For `uninstall`: deleting objects are let go once the garbage
    /// collector's foreground cascade holds them.
    pub fn for_uninstall(
        client: Client,
        recorder: Recorder,
        metrics: Arc<dyn ConvertMetrics>,
    ) -> Self {
        Self {
            carry: Carry::ToTheGarbageCollector,
            ..Self::new(client, recorder, metrics)
        }
    }

    /// Runs a controller for every kind in `wanted`, and for every kind that
    /// still has objects held: kinds no policy wants any more (and `found`,
    /// kinds found holding objects with no controller) run with nothing in
    /// reach until what they hold is let go or done. With `complete` false
    /// (some input could not be read) no running kind changes.
    pub async fn update(
        &mut self,
        wanted: BTreeMap<String, ConvertKind>,
        found: &[ProtectedKind],
        complete: bool,
    ) {
        let mut desired = wanted;
        for kind in found {
            desired
                .entry(kind_key(kind))
                .or_insert_with(|| ConvertKind::nothing(kind.clone()));
        }
        let mut gone = HashSet::new();
        for (key, running) in &self.running {
            if running.kind.reaches_nothing()
                && !running.context.drained()
                && !is_served(&self.client, &running.kind.kind).await
            {
                gone.insert(key.clone());
            }
        }
        for (key, running) in &self.running {
            if desired.contains_key(key) {
                continue;
            }
            let done =
                running.kind.reaches_nothing() && (running.context.drained() || gone.contains(key));
            if !complete {
                desired.insert(key.clone(), running.kind.clone());
            } else if !done {
                desired.insert(key.clone(), ConvertKind::nothing(running.kind.kind.clone()));
            }
        }
        // A changed reach restarts the kind's controller: its relist sorts
        // every object afresh (held, let go, or carried through).
        let keys: Vec<String> = self.running.keys().cloned().collect();
        for key in keys {
            if desired.get(&key) == self.running.get(&key).map(|r| &r.kind) {
                continue;
            }
            if let Some(running) = self.running.remove(&key) {
                let label = running.kind.kind.to_string();
                running.stop().await;
                self.metrics.set_protected(&label, 0);
                self.metrics.set_in_progress(&label, 0);
                if !desired.contains_key(&key) {
                    tracing::info!(kind = %label, "nothing held any more; stopped following the kind");
                }
            }
        }
        for (key, kind) in desired {
            if self.running.contains_key(&key) {
                continue;
            }
            match self.start(kind.clone()).await {
                Ok(running) => {
                    self.running.insert(key, running);
                }
                Err(e) => {
                    self.metrics.error("StartConvert");
                    tracing::error!(kind = %kind.kind, error = %e, "cannot start the Convert controller; will retry");
                }
            }
        }
    }

    /// Kinds that run with nothing in reach and still hold objects (or have
    /// not listed yet).
    pub fn draining(&self) -> Vec<String> {
        self.running
            .values()
            .filter(|r| r.kind.reaches_nothing() && !r.context.drained())
            .map(|r| format!("{} ({} held)", r.kind.kind, r.context.held()))
            .collect()
    }

    /// Stops every controller; objects stay as they are.
    pub async fn shutdown(mut self) {
        for (_, running) in std::mem::take(&mut self.running) {
            running.stop().await;
        }
    }

    async fn start(&self, kind: ConvertKind) -> Result<RunningKind, kube::Error> {
        let resource = served_resource(&self.client, &kind.kind).await?;
        let api: Api<Meta> = Api::all_with(self.client.clone(), &resource);
        // Small pages: the start-up list of every kind at once is the peak of
        // the process's memory, and the allocator keeps much of a peak. No
        // label selector: an object relabelled out of reach must stay in sight.
        let config = watcher::Config::default().page_size(LIST_PAGE_SIZE);
        let setting = Setting {
            client: self.client.clone(),
            resource: resource.clone(),
            carry: self.carry,
            stall_after: self.stall_after,
            recorder: self.recorder.clone(),
            metrics: self.metrics.clone(),
        };
        let context = Arc::new(Context::new(setting, &kind));
        let (stop, stopped) = oneshot::channel::<()>();
        // The cache keeps only objects being deleted (see intake), and of them
        // only what the state machine reads (identity, labels,
        // deletionTimestamp, finalizers).
        let writer = Writer::new(resource.clone());
        let store = writer.as_reader();
        let intake_ctx = context.clone();
        let finalizer_adds = self.finalizer_adds.clone();
        // The controller backs off this stream's errors (trigger_backoff
        // below): a backoff here as well would double the wait.
        // One watch of a kind feeds the index: a kind whose composed objects
        // alone are held is fed by its admission-only watch.
        let tap = self
            .feed
            .as_ref()
            .filter(|_| kind.converts() || kind.reaches_nothing())
            .map(|f| f.tap(&kind.kind));
        let objects = watcher(api, config)
            // Before `slim`: sibling order reads owner references and labels.
            .inspect(move |event| {
                if let Some(tap) = &tap {
                    tap.event(event);
                }
            })
            .modify(slim)
            .map_ok(move |event| take_in(intake_ctx.clone(), finalizer_adds.clone(), event))
            // In order, so that the cache sees each object's events as sent.
            .try_buffered(FINALIZER_ADDS_AT_ONCE)
            .try_filter_map(|pass| future::ready(Ok(pass)))
            .reflect(writer)
            .applied_objects();
        let controller = Controller::for_stream_with(objects, store.clone(), resource);
        // Gauges and forgetting gone objects: a pass over the cache every few
        // seconds (per reconcile it would be quadratic at start-up).
        let counting = context.clone();
        let count_store = store.clone();
        let counter = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tick.tick().await;
                counting.count(&count_store);
            }
        });
        let run_context = context.clone();
        let task = tokio::spawn(async move {
            controller
                .with_config(
                    kube::runtime::controller::Config::default().concurrency(RECONCILES_AT_ONCE),
                )
                // kube's default for the watch reached 30 s and more: held
                // objects waited that long after an API server restart.
                .trigger_backoff(WatchBackoff::default())
                .graceful_shutdown_on(async move {
                    let _ = stopped.await;
                })
                .run(reconcile, error_policy, run_context)
                .for_each(|_| async {})
                .await;
            counter.abort();
        });
        match (&kind.reach, &kind.composed) {
            (Reach::Nothing, Reach::Nothing) => {
                tracing::info!(kind = %kind.kind, "no longer Convert: letting go of live objects, finishing the cascades of deleting ones")
            }
            (Reach::Nothing, composed) => {
                tracing::info!(kind = %kind.kind, ?composed, "holding composed objects: Crossplane's own deletes of them become foreground cascades")
            }
            (reach, composed) => {
                tracing::info!(kind = %kind.kind, ?reach, ?composed, "converting deletes to foreground cascades")
            }
        }
        Ok(RunningKind {
            kind,
            context,
            stop,
            task,
        })
    }
}

/// Drops the metadata Convert never reads before an object is cached: every
/// annotation but its own mark of a conversion.
fn slim(object: &mut Meta) {
    let meta = &mut object.metadata;
    meta.managed_fields = None;
    meta.annotations = meta
        .annotations
        .take()
        .and_then(|mut a| a.remove_entry(CONVERTED_ANNOTATION))
        .map(|(k, v)| [(k, v)].into());
    // Only the controller's reference: whether Crossplane composed the
    // object decides whether a composed reach holds it.
    meta.owner_references = meta
        .owner_references
        .take()
        .and_then(|refs| refs.into_iter().find(|r| r.controller == Some(true)))
        .map(|r| vec![r]);
    meta.generate_name = None;
}

/// One watch event in: counted, given the finalizer straight away if it is a
/// live object without it, and passed on to the controller's cache if it is
/// a deletion (or an add of the finalizer that failed, for the controller to
/// retry).
async fn take_in(
    ctx: Arc<Context>,
    finalizer_adds: Arc<Semaphore>,
    event: watcher::Event<Meta>,
) -> Result<Option<watcher::Event<Meta>>, watcher::Error> {
    if let Ok(mut census) = ctx.census.lock() {
        census.observe(
            &event,
            |o: &Meta| o.uid(),
            |o: &Meta| {
                o.finalizers()
                    .iter()
                    .any(|f| f == FOREGROUND_CASCADE_FINALIZER)
            },
        );
        // From here every object of the kind is in sight: the end of its
        // start-up (and of each relist after the watch was lost).
        if matches!(event, watcher::Event::InitDone) {
            tracing::info!(kind = %ctx.label, held_when_listed = census.len(), "listed every object of the kind");
        }
    }
    let sorted = intake::sort(event, |o: &Meta| ctx.observe(o));
    let Some(unfinalized) = sorted.needs_finalizer else {
        return Ok(sorted.pass);
    };
    let Some(uid) = unfinalized.object.uid() else {
        return Ok(sorted.pass);
    };
    // A closed semaphore cannot happen (it is never closed); adding the
    // finalizer anyway is the safe side.
    let _permit = finalizer_adds.acquire().await.ok();
    let api = ctx.api(&unfinalized.object);
    match writes::add_finalizer(&api, &unfinalized.object, &uid).await {
        Ok(()) => Ok(sorted.pass),
        // The object changed or went since this event: the watch brings the
        // newer version (or its deletion), which is sorted afresh.
        Err(e) if is_stale(&e) && changed_since(&api, &unfinalized.object).await => {
            tracing::debug!(kind = %ctx.label, name = %unfinalized.object.name_any(), "changed since seen; adding the finalizer to the newer version");
            Ok(sorted.pass)
        }
        // Any other failure goes to the controller, which retries from its
        // cache with backoff.
        Err(e) => {
            ctx.metrics.error("AddFinalizer");
            tracing::warn!(kind = %ctx.label, name = %unfinalized.object.name_any(), error = %e, "cannot add the finalizer; retrying");
            Ok(Some(unfinalized.failed()))
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fake_api_server::{Exchange, OBJECT, against, metadata, object, says};
    use crate::policy::Shape;

    const ADD_FINALIZER: &str =
        "/apis/example.org/v1/namespaces/team-a/xdatabases/db?&fieldManager=cascade-guard";

    fn add_finalizer() -> Exchange {
        Exchange::patch(ADD_FINALIZER).body(json!([
            {"op": "test", "path": "/metadata/uid", "value": "u1"},
            {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
            {"op": "add", "path": "/metadata/finalizers", "value": [FOREGROUND_CASCADE_FINALIZER]},
        ]))
    }

    /// Takes in one watch event of `db`; what goes on to the controller.
    async fn take_in_once(script: Vec<Exchange>, event: watcher::Event<Meta>) -> String {
        let passed = against(script, async |c| {
            let ctx = Arc::new(Context::for_tests(
                c,
                Shape::Other,
                Reach::Every,
                Duration::from_secs(600),
            ));
            take_in(ctx, Arc::new(Semaphore::new(1)), event).await
        })
        .await;
        // watcher::Event has no PartialEq; its Debug form says all.
        format!("{:?}", passed.map_err(|e| e.to_string()))
    }

    #[tokio::test]
    async fn a_live_object_gets_the_finalizer_from_the_watch_and_stays_out_of_the_cache() {
        let live = object("u1", "7", &[], false);
        let held = add_finalizer().ok(metadata("u1", "8", &[FOREGROUND_CASCADE_FINALIZER], false));
        // Refused because the object changed: the watch brings the newer
        // version, which gets it in turn.
        let changed = vec![
            add_finalizer().fails(
                says::INVALID,
                "the server rejected our request due to an error in our request",
            ),
            Exchange::get(OBJECT).ok(metadata("u1", "8", &[], false)),
        ];
        for script in [vec![held], changed] {
            let passed = take_in_once(script, watcher::Event::Apply(live.clone())).await;
            let out_of_the_cache = Ok::<_, String>(Some(watcher::Event::Delete(live.clone())));
            assert_eq!(passed, format!("{out_of_the_cache:?}"));
        }
    }

    #[tokio::test]
    async fn a_finalizer_add_that_fails_otherwise_goes_to_the_controller_to_retry() {
        let live = object("u1", "7", &[], false);
        let script = vec![add_finalizer().fails(says::INTERNAL, "etcdserver: request timed out")];
        let passed = take_in_once(script, watcher::Event::InitApply(live.clone())).await;
        assert_eq!(
            passed,
            format!(
                "{:?}",
                Ok::<_, String>(Some(watcher::Event::InitApply(live)))
            )
        );
    }
}
