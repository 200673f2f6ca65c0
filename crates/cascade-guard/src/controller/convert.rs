//! Convert mode at run time: for each Convert kind, a metadata-only controller
//! that holds every object with cascade-guard's finalizer, turns its deletion
//! into a foreground cascade, and lets go when nothing is left to cascade. The
//! decisions are [`crate::policy::cascade::next_step`]; this module only does what it
//! says, with UID preconditions on every write so that a newer object reusing a
//! name is never touched.
//!
//! Each kind's watch covers every object of the kind, whatever its labels: a
//! policy's selector decides which live objects are held ([`Reach`]), but an
//! object that carries the finalizer is never lost sight of. A kind no policy
//! makes Convert any more keeps its controller, with nothing in reach, until
//! every object it held is let go or has finished its cascade.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, future};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PartialObjectMeta, Patch,
    PatchParams, Preconditions, PropagationPolicy,
};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::store::Writer;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, oneshot};
use tokio::task::JoinHandle;

use super::MANAGER;
use super::backoff::{WatchBackoff, step_retry};
use super::intake::{self, Census};
use crate::policy::cascade::{Carry, Dependents, LetGo, Memory, Observed, Reach, Step, next_step};
use crate::policy::holders::{IN_USE_LABEL, describe_dependent};
use crate::policy::names::FOREGROUND_CASCADE_FINALIZER;
use crate::policy::stall::{Clock, Left, Turn, stalled_note};
use crate::policy::{ComposedResource, Mode, Policy, ProtectedKind, Shape, composed_resources};
use crate::telemetry::Metrics;

type Meta = PartialObjectMeta<DynamicObject>;

/// One kind as the Convert controller runs it: which of its live objects
/// are held (every Convert policy for the kind together).
#[derive(Clone, Debug, PartialEq)]
pub struct ConvertKind {
    pub kind: ProtectedKind,
    pub reach: Reach,
}

/// The Convert kinds a pass's policies ask for, by `group/kind`. An object is
/// in reach when any policy's selector matches it; a policy without a
/// selector, or with one that cannot be read, reaches every object (holding
/// more is the safe side).
pub fn convert_kinds(policies: &[Policy]) -> BTreeMap<String, ConvertKind> {
    let mut by_kind: BTreeMap<String, ConvertKind> = BTreeMap::new();
    for p in policies.iter().filter(|p| p.mode == Mode::Convert) {
        let reach = match p.selector.clone().map(kube::core::Selector::try_from) {
            Some(Ok(selector)) if !selector.selects_all() => Reach::Selected(vec![selector]),
            _ => Reach::Every,
        };
        let entry = by_kind
            .entry(kind_key(&p.kind))
            .or_insert_with(|| ConvertKind {
                kind: p.kind.clone(),
                reach: Reach::Selected(Vec::new()),
            });
        entry.reach = match (std::mem::replace(&mut entry.reach, Reach::Nothing), reach) {
            (Reach::Selected(mut all), Reach::Selected(more)) => {
                all.extend(more);
                Reach::Selected(all)
            }
            _ => Reach::Every,
        };
    }
    by_kind
}

pub fn kind_key(kind: &ProtectedKind) -> String {
    format!("{}/{}", kind.group, kind.kind)
}

pub fn api_resource(kind: &ProtectedKind) -> ApiResource {
    // The admission policy matches every version; the controller watches the
    // served one, found by discovery.
    ApiResource {
        group: kind.group.clone(),
        version: String::new(),
        api_version: String::new(),
        kind: kind.kind.clone(),
        plural: kind.plural.clone(),
    }
}

struct Running {
    kind: ConvertKind,
    context: Arc<Context>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// Finalizers being added at once, across all kinds: bounds the connections
/// and memory of a start-up that holds thousands of existing objects.
const HOLDS_AT_ONCE: usize = 16;

/// Objects per page of a Convert kind's list.
const LIST_PAGE_SIZE: u32 = 100;

/// The Convert controllers that run, started and stopped as policies change.
pub struct Converter {
    client: Client,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    running: BTreeMap<String, Running>,
    holds: Arc<Semaphore>,
    carry: Carry,
    stall_after: Duration,
}

/// How long a cascade may make no progress before it is reported stalled.
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(600);

impl Converter {
    pub fn new(client: Client, recorder: Recorder, metrics: Arc<Metrics>) -> Self {
        Self {
            client,
            recorder,
            metrics,
            running: BTreeMap::new(),
            holds: Arc::new(Semaphore::new(HOLDS_AT_ONCE)),
            carry: Carry::ToTheEnd,
            stall_after: DEFAULT_STALL_AFTER,
        }
    }

    /// Cascades with no progress for this long are reported stalled.
    pub fn with_stall_after(mut self, stall_after: Duration) -> Self {
        self.stall_after = stall_after;
        self
    }

    /// For `uninstall`: deleting objects are let go once the garbage
    /// collector's foreground cascade holds them.
    pub fn for_uninstall(client: Client, recorder: Recorder, metrics: Arc<Metrics>) -> Self {
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
                .or_insert_with(|| ConvertKind {
                    kind: kind.clone(),
                    reach: Reach::Nothing,
                });
        }
        let mut gone = HashSet::new();
        for (key, running) in &self.running {
            if running.kind.reach == Reach::Nothing
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
            let done = running.kind.reach == Reach::Nothing
                && (running.context.drained() || gone.contains(key));
            if !complete {
                desired.insert(key.clone(), running.kind.clone());
            } else if !done {
                desired.insert(
                    key.clone(),
                    ConvertKind {
                        kind: running.kind.kind.clone(),
                        reach: Reach::Nothing,
                    },
                );
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
            .filter(|r| r.kind.reach == Reach::Nothing && !r.context.drained())
            .map(|r| format!("{} ({} held)", r.kind.kind, r.context.held()))
            .collect()
    }

    /// Stops every controller; objects stay as they are.
    pub async fn shutdown(mut self) {
        for (_, running) in std::mem::take(&mut self.running) {
            running.stop().await;
        }
    }

    async fn start(&self, kind: ConvertKind) -> Result<Running, kube::Error> {
        let resource = served_resource(&self.client, &kind.kind).await?;
        let api: Api<Meta> = Api::all_with(self.client.clone(), &resource);
        // Small pages: the start-up list of every kind at once is the peak of
        // the process's memory, and the allocator keeps much of a peak. No
        // label selector: an object relabelled out of reach must stay in sight.
        let config = watcher::Config::default().page_size(LIST_PAGE_SIZE);
        let context = Arc::new(Context {
            client: self.client.clone(),
            resource: resource.clone(),
            shape: kind.kind.shape,
            reach: kind.reach.clone(),
            carry: self.carry,
            stall_after: self.stall_after,
            clocks: Mutex::new(HashMap::new()),
            label: kind.kind.to_string(),
            memory: Mutex::new(HashMap::new()),
            recorder: self.recorder.clone(),
            metrics: self.metrics.clone(),
            discovered: Mutex::new(HashMap::new()),
            census: Mutex::new(Census::default()),
            failures: Mutex::new(HashMap::new()),
        });
        let (stop, stopped) = oneshot::channel::<()>();
        // The cache keeps only objects being deleted (see intake), and of them
        // only what the state machine reads (identity, labels,
        // deletionTimestamp, finalizers).
        let writer = Writer::new(resource.clone());
        let store = writer.as_reader();
        let intake_ctx = context.clone();
        let holds = self.holds.clone();
        // The controller backs off this stream's errors (trigger_backoff
        // below): a backoff here as well would double the wait.
        let objects = watcher(api, config)
            .modify(slim)
            .map_ok(move |event| take_in(intake_ctx.clone(), holds.clone(), event))
            // In order, so that the cache sees each object's events as sent.
            .try_buffered(HOLDS_AT_ONCE)
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
                .with_config(kube::runtime::controller::Config::default().concurrency(16))
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
        match &kind.reach {
            Reach::Nothing => {
                tracing::info!(kind = %kind.kind, "no longer Convert: letting go of live objects, finishing the cascades of deleting ones")
            }
            reach => {
                tracing::info!(kind = %kind.kind, ?reach, "converting deletes to foreground cascades")
            }
        }
        Ok(Running {
            kind,
            context,
            stop,
            task,
        })
    }
}

/// A composed resource's kind as served, and whether it is namespaced.
type Discovered = (ApiResource, bool);

/// Drops the metadata Convert never reads before an object is cached.
fn slim(object: &mut Meta) {
    let meta = &mut object.metadata;
    meta.managed_fields = None;
    meta.annotations = None;
    meta.owner_references = None;
    meta.generate_name = None;
}

struct Context {
    client: Client,
    resource: ApiResource,
    shape: Shape,
    reach: Reach,
    carry: Carry,
    stall_after: Duration,
    /// Each cascade's progress, by UID.
    clocks: Mutex<HashMap<String, Clock>>,
    label: String,
    memory: Mutex<HashMap<String, Memory>>,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    /// Composed-resource kinds resolved through discovery, or when it failed.
    discovered: Mutex<HashMap<(String, String), Discovery>>,
    /// The objects held, for the gauge (the cache has only deletions).
    census: Mutex<Census>,
    /// Failed steps in a row, by UID, for the retry backoff.
    failures: Mutex<HashMap<String, u32>>,
}

impl Context {
    fn observe(&self, object: &Meta) -> Observed {
        Observed::new(
            object.metadata.deletion_timestamp.is_some(),
            object.finalizers(),
            self.reach.covers(object.labels()),
            self.shape,
        )
    }

    /// Listed, and nothing held.
    fn drained(&self) -> bool {
        self.census.lock().map(|c| c.is_empty()).unwrap_or(false)
    }

    fn held(&self) -> usize {
        self.census.lock().map(|c| c.len()).unwrap_or(0)
    }

    fn memory(&self, uid: &str) -> Memory {
        self.memory
            .lock()
            .ok()
            .and_then(|m| m.get(uid).copied())
            .unwrap_or_default()
    }

    fn remember(&self, uid: &str, update: impl FnOnce(&mut Memory)) {
        if let Ok(mut m) = self.memory.lock() {
            update(m.entry(uid.to_string()).or_default());
        }
    }

    fn forget(&self, uid: &str) {
        if let Ok(mut m) = self.memory.lock() {
            m.remove(uid);
        }
        if let Ok(mut c) = self.clocks.lock() {
            c.remove(uid);
        }
    }

    /// How often a cascade is looked at: often enough to tell a stall
    /// within a third of the stall time, and to catch a missed event.
    fn look_interval(&self) -> Duration {
        (self.stall_after / 3).clamp(Duration::from_secs(1), Duration::from_secs(30))
    }

    /// Moves the cascade's clock on with what it waits for now; says so in
    /// an Event when it stalls and when it moves again.
    async fn watch_progress(&self, object: &Meta, uid: &str, left: Vec<Left>) {
        let now = Instant::now();
        let turn = match self.clocks.lock() {
            Ok(mut clocks) => match clocks.get_mut(uid) {
                Some(clock) => {
                    let turn = clock.look(left, now, self.stall_after);
                    Some((turn, clock.still_for(now), clock.left().to_vec()))
                }
                None => {
                    clocks.insert(uid.to_string(), Clock::start(left, now));
                    None
                }
            },
            Err(_) => None,
        };
        let shows = self.shape == Shape::CompositeResource;
        match turn {
            Some((Turn::Stalled, still_for, left)) => {
                let note = stalled_note(still_for, &left, shows);
                tracing::warn!(kind = %self.label, name = %object.name_any(), %note, "cascade stalled");
                publish(self, object, EventType::Warning, "CascadeStalled", &note).await;
            }
            Some((Turn::Resumed, _, left)) => {
                let note = format!("progress again; {} left", left.len());
                tracing::info!(kind = %self.label, name = %object.name_any(), "cascade moving again");
                publish(self, object, EventType::Normal, "CascadeResumed", &note).await;
            }
            _ => {}
        }
    }

    /// Protected objects and cascades in progress, for the metrics; forgets
    /// objects that are gone.
    fn count(&self, store: &kube::runtime::reflector::Store<Meta>) {
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

/// One watch event in: counted, held straight away if it is a live object
/// without the finalizer, and passed on to the controller's cache if it is a
/// deletion (or a hold that failed, for the controller to retry).
async fn take_in(
    ctx: Arc<Context>,
    holds: Arc<Semaphore>,
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
    }
    let sorted = intake::sort(event, |o: &Meta| ctx.observe(o));
    let Some(hold_it) = sorted.hold else {
        return Ok(sorted.pass);
    };
    let Some(uid) = hold_it.object.uid() else {
        return Ok(sorted.pass);
    };
    // A closed semaphore cannot happen (it is never closed); holding anyway
    // is the safe side.
    let _permit = holds.acquire().await.ok();
    let api = object_api(&ctx, &hold_it.object);
    match hold(&api, &hold_it.object, &uid).await {
        Ok(()) => Ok(sorted.pass),
        // The object changed or went since this event: the watch brings the
        // newer version (or its deletion), which is sorted afresh.
        Err(e) if is_stale(&e) && changed_since(&api, &hold_it.object).await => {
            tracing::debug!(kind = %ctx.label, name = %hold_it.object.name_any(), "changed since seen; holding the newer version");
            Ok(sorted.pass)
        }
        // Any other failure goes to the controller, which retries from its
        // cache with backoff.
        Err(e) => {
            ctx.metrics.error("AddFinalizer");
            tracing::warn!(kind = %ctx.label, name = %hold_it.object.name_any(), error = %e, "cannot add the finalizer; retrying");
            Ok(Some(hold_it.failed()))
        }
    }
}

/// A refusal that may mean the object is not as seen: a failed JSON patch
/// test (422) or a conflict (409). [`changed_since`] tells for sure.
fn is_stale(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409 || s.code == 422)
}

/// Whether the object is gone, replaced or at another resourceVersion than
/// `seen`. When that cannot be read, no: the caller retries instead.
async fn changed_since(api: &Api<Meta>, seen: &Meta) -> bool {
    match api.get_metadata_opt(&seen.name_any()).await {
        Ok(None) => true,
        Ok(Some(now)) => {
            now.metadata.uid != seen.metadata.uid
                || now.metadata.resource_version != seen.metadata.resource_version
        }
        Err(_) => false,
    }
}

/// A failed write of `step` on object `name`.
fn failed(step: &'static str, name: &str) -> impl FnOnce(kube::Error) -> StepError {
    let name = name.to_string();
    move |source| StepError::Api { step, name, source }
}

#[derive(Debug, thiserror::Error)]
enum StepError {
    #[error("{step} {name}: {source}")]
    Api {
        step: &'static str,
        name: String,
        source: kube::Error,
    },
}

async fn reconcile(object: Arc<Meta>, ctx: Arc<Context>) -> Result<Action, StepError> {
    let result = step(object.clone(), ctx.clone()).await;
    if result.is_ok()
        && let (Some(uid), Ok(mut f)) = (object.uid(), ctx.failures.lock())
    {
        f.remove(&uid);
    }
    result
}

async fn step(object: Arc<Meta>, ctx: Arc<Context>) -> Result<Action, StepError> {
    let Some(uid) = object.uid() else {
        return Ok(Action::await_change());
    };
    let observed = ctx.observe(&object);
    let now = Instant::now();
    let decide = |dependents| next_step(observed, ctx.memory(&uid), dependents, now, ctx.carry);
    let mut step = decide(Dependents::NotLookedUp);
    // A cascade cascade-guard holds: what it waits for, for the stall clock
    // (and for the decision, when that needs it).
    let in_cascade = observed.deleting && observed.held && !observed.orphaning;
    if step == Step::LookUpDependents || (in_cascade && ctx.shape == Shape::CompositeResource) {
        let (dependents, left) = look_up_dependents(&ctx, &object, &uid).await;
        if step == Step::LookUpDependents {
            step = decide(dependents);
        }
        if in_cascade && !matches!(step, Step::Release | Step::LetGo(_)) {
            ctx.watch_progress(&object, &uid, left).await;
        }
    } else if in_cascade {
        ctx.watch_progress(&object, &uid, Vec::new()).await;
    }
    let name = object.name_any();
    let api = object_api(&ctx, &object);
    match step {
        Step::Wait | Step::LookUpDependents => Ok(if in_cascade {
            // A cascade is running: look at its progress now and then (and
            // catch an event that was missed).
            Action::requeue(ctx.look_interval())
        } else {
            Action::await_change()
        }),
        Step::Hold => {
            hold(&api, &object, &uid)
                .await
                .map_err(failed("hold", &name))?;
            Ok(Action::await_change())
        }
        Step::Convert => {
            let first = ctx.memory(&uid).conversions == 0;
            let params = DeleteParams {
                propagation_policy: Some(PropagationPolicy::Foreground),
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &params).await {
                Ok(_) => {}
                // Gone, or a newer object with the same name: nothing to convert.
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
                    ctx.forget(&uid);
                    return Ok(Action::await_change());
                }
                Err(source) => return Err(failed("convert", &name)(source)),
            }
            ctx.remember(&uid, |m| {
                m.conversions += 1;
                m.last_conversion = Some(Instant::now());
            });
            if first {
                ctx.metrics.conversion(&ctx.label);
                ctx.metrics.cascade_started(&ctx.label);
                publish(
                    &ctx,
                    &object,
                    EventType::Normal,
                    "ForegroundCascade",
                    "converted the delete into a foreground cascade: it stays until everything it owns is gone",
                )
                .await;
                tracing::info!(kind = %ctx.label, %name, namespace = ?object.namespace(), "converted a delete into a foreground cascade");
            } else {
                tracing::info!(kind = %ctx.label, %name, "foregroundDeletion was cleared with dependents left, or needs confirming: converting again");
            }
            Ok(Action::requeue(Duration::from_secs(30)))
        }
        Step::Backoff(wait) => {
            tracing::debug!(kind = %ctx.label, %name, wait_ms = wait.as_millis(), "the cascade keeps being cut short; converting again after a pause");
            Ok(Action::requeue(wait))
        }
        Step::LetGo(why) => {
            let (reason, note) = match why {
                LetGo::OutOfReach => (
                    "Released",
                    "no Convert policy covers it any more (its labels, or its kind's mode, changed): released cascade-guard's hold",
                ),
                LetGo::Orphaning => (
                    "OrphanLeftAlone",
                    "deleted with propagationPolicy Orphan: its dependents stay, so there is no cascade to hold it for; released",
                ),
                LetGo::HandedOver => (
                    "Released",
                    "cascade-guard is being uninstalled: the garbage collector's foreground cascade holds it until its dependents are gone",
                ),
            };
            // A live object is released as seen: if it started deleting since,
            // the newer version is decided afresh. An orphaning one is let go
            // whatever else changed (the garbage collector dropping `orphan`),
            // and remembered as such until it is gone.
            let rv = match why {
                LetGo::OutOfReach => object.resource_version(),
                LetGo::Orphaning => {
                    ctx.remember(&uid, |m| m.orphaned = true);
                    None
                }
                LetGo::HandedOver => None,
            };
            release(&api, &object, &uid, rv.as_deref())
                .await
                .map_err(failed("release", &name))?;
            if why != LetGo::Orphaning {
                ctx.forget(&uid);
            }
            publish(&ctx, &object, EventType::Normal, reason, note).await;
            tracing::info!(kind = %ctx.label, %name, ?why, "released without a cascade");
            Ok(Action::await_change())
        }
        Step::Release => {
            release(&api, &object, &uid, None)
                .await
                .map_err(failed("release", &name))?;
            ctx.forget(&uid);
            let took = object
                .metadata
                .deletion_timestamp
                .as_ref()
                .map(|t| {
                    let now = k8s_openapi::jiff::Timestamp::now();
                    Duration::from_secs_f64(now.duration_since(t.0).as_secs_f64().max(0.0))
                })
                .unwrap_or_default();
            ctx.metrics.cascade_finished(&ctx.label, took);
            publish(
                &ctx,
                &object,
                EventType::Normal,
                "CascadeComplete",
                &format!(
                    "foreground cascade complete in {:.1}s: nothing left to cascade; released",
                    took.as_secs_f64()
                ),
            )
            .await;
            tracing::info!(kind = %ctx.label, %name, seconds = took.as_secs_f64(), "cascade complete; released");
            Ok(Action::await_change())
        }
    }
}

fn error_policy(object: Arc<Meta>, error: &StepError, ctx: Arc<Context>) -> Action {
    let StepError::Api { step, .. } = error;
    ctx.metrics.error(match *step {
        "hold" => "AddFinalizer",
        "convert" => "Reissue",
        _ => "RemoveFinalizer",
    });
    let failures = match (object.uid(), ctx.failures.lock()) {
        (Some(uid), Ok(mut f)) => {
            let n = f.entry(uid).or_insert(0);
            *n = n.saturating_add(1);
            *n
        }
        _ => 1,
    };
    let wait = step_retry(failures);
    tracing::warn!(kind = %ctx.label, error = %error, failures, retry_in_seconds = wait.as_secs(), "retrying");
    Action::requeue(wait)
}

fn object_api(ctx: &Context, object: &Meta) -> Api<Meta> {
    match object.namespace() {
        Some(ns) => Api::namespaced_with(ctx.client.clone(), &ns, &ctx.resource),
        None => Api::all_with(ctx.client.clone(), &ctx.resource),
    }
}

/// Adds the finalizer in cascade-guard's own request (its own field manager,
/// so no applier removes it), only to the object as seen: the patch tests the
/// UID and resourceVersion first.
async fn hold(api: &Api<Meta>, object: &Meta, uid: &str) -> Result<(), kube::Error> {
    let rv = object.resource_version().unwrap_or_default();
    let add = if object.metadata.finalizers.is_some() {
        json!({"op": "add", "path": "/metadata/finalizers/-", "value": FOREGROUND_CASCADE_FINALIZER})
    } else {
        json!({"op": "add", "path": "/metadata/finalizers", "value": [FOREGROUND_CASCADE_FINALIZER]})
    };
    let patch = json!([
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        add,
    ]);
    json_patch(api, &object.name_any(), patch).await
}

/// Removes the finalizer, testing that it is still where it was seen (and,
/// given one, that the object is still at `resource_version`).
async fn release(
    api: &Api<Meta>,
    object: &Meta,
    uid: &str,
    resource_version: Option<&str>,
) -> Result<(), kube::Error> {
    let Some(index) = object
        .finalizers()
        .iter()
        .position(|f| f == FOREGROUND_CASCADE_FINALIZER)
    else {
        return Ok(());
    };
    let mut ops = vec![json!({"op": "test", "path": "/metadata/uid", "value": uid})];
    if let Some(rv) = resource_version {
        ops.push(json!({"op": "test", "path": "/metadata/resourceVersion", "value": rv}));
    }
    ops.push(json!({"op": "test", "path": format!("/metadata/finalizers/{index}"), "value": FOREGROUND_CASCADE_FINALIZER}));
    ops.push(json!({"op": "remove", "path": format!("/metadata/finalizers/{index}")}));
    let patch = Value::Array(ops);
    json_patch(api, &object.name_any(), patch).await
}

async fn json_patch(api: &Api<Meta>, name: &str, patch: Value) -> Result<(), kube::Error> {
    let patch: json_patch::Patch =
        serde_json::from_value(patch).map_err(kube::Error::SerdeError)?;
    let params = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..PatchParams::default()
    };
    match api.patch(name, &params, &Patch::<()>::Json(patch)).await {
        Ok(_) => Ok(()),
        // Gone: nothing to hold or release.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// The XR's composed resources that still exist with a blocking owner
/// reference to it (the ones the garbage collector waits for), counted for
/// the decision and described for the stall clock.
async fn look_up_dependents(ctx: &Context, object: &Meta, uid: &str) -> (Dependents, Vec<Left>) {
    let namespace = object.namespace();
    let full: Api<DynamicObject> = match &namespace {
        Some(ns) => Api::namespaced_with(ctx.client.clone(), ns, &ctx.resource),
        None => Api::all_with(ctx.client.clone(), &ctx.resource),
    };
    let xr = match full.get_opt(&object.name_any()).await {
        Ok(Some(xr)) if xr.uid().as_deref() == Some(uid) => xr,
        Ok(_) => return (Dependents::None, Vec::new()),
        // Unknown counts as remaining: converting again is always safe.
        Err(_) => return (Dependents::Remaining(1), Vec::new()),
    };
    let refs = composed_resources(&xr.data, namespace.as_deref()).resources;
    // Looked up side by side: this sits between the garbage collector's last
    // delete and the XR leaving, so its round trips are the teardown's.
    let states: Vec<Dependent> = futures::stream::iter(refs)
        .map(|r| async move { dependent(ctx, &r, uid).await })
        .buffer_unordered(LOOKUPS_AT_ONCE)
        .collect()
        .await;
    let mut left: Vec<Left> = states
        .iter()
        .filter_map(|s| match s {
            Dependent::Blocking(l) => Some(l.clone()),
            _ => None,
        })
        .collect();
    left.sort();
    if states.contains(&Dependent::Unknowable) {
        return (Dependents::Unknowable, left);
    }
    match left.len() {
        0 => (Dependents::None, left),
        n => (Dependents::Remaining(n), left),
    }
}

/// Composed resources of one XR looked up at once.
const LOOKUPS_AT_ONCE: usize = 8;

#[derive(Debug, PartialEq)]
enum Dependent {
    /// Exists with a blocking owner reference to the XR (or cannot be read
    /// for a reason other than permissions: counted, since converting again
    /// is always safe), and what holds it.
    Blocking(Left),
    /// Gone, or no longer blocks the XR.
    Clear,
    /// Its kind cannot be found, or cascade-guard may not read it.
    Unknowable,
}

async fn dependent(ctx: &Context, r: &ComposedResource, uid: &str) -> Dependent {
    let (api_version, kind, name) = (r.api_version.as_str(), r.kind.as_str(), r.name.as_str());
    let Some((resource, namespaced)) = discover(ctx, api_version, kind).await else {
        return Dependent::Unknowable;
    };
    let ns = r.namespace.as_deref();
    let api: Api<Meta> = match (ns, namespaced) {
        (Some(ns), true) => Api::namespaced_with(ctx.client.clone(), ns, &resource),
        _ => Api::all_with(ctx.client.clone(), &resource),
    };
    let object = match (ns, namespaced) {
        (Some(ns), true) => format!("{kind}/{name} -n {ns}"),
        _ => format!("{kind}/{name}"),
    };
    match api.get_metadata_opt(name).await {
        Ok(Some(dependent)) => {
            let blocking = dependent
                .owner_references()
                .iter()
                .any(|o| o.uid == uid && o.block_owner_deletion == Some(true));
            if !blocking {
                return Dependent::Clear;
            }
            let deleting = dependent.metadata.deletion_timestamp.is_some();
            let in_use = dependent
                .labels()
                .get(IN_USE_LABEL)
                .is_some_and(|v| v == "true");
            Dependent::Blocking(Left {
                object,
                deleting,
                holder: describe_dependent(deleting, dependent.finalizers(), in_use),
            })
        }
        Ok(None) => Dependent::Clear,
        Err(kube::Error::Api(s)) if s.code == 403 => {
            tracing::warn!(%api_version, %kind, "no permission to read composed resources; relying on the garbage collector's confirmation");
            Dependent::Unknowable
        }
        Err(e) => Dependent::Blocking(Left {
            object,
            deleting: false,
            holder: format!("cannot be read: {e}"),
        }),
    }
}

/// What discovery said of a composed resource's kind.
#[derive(Clone)]
enum Discovery {
    Found(Discovered),
    /// Not found, or discovery failed: looked up again after
    /// [`REDISCOVER_AFTER`], and warned about once.
    Failed(Instant),
}

/// How long a failed discovery of a composed kind stands before the next try.
const REDISCOVER_AFTER: Duration = Duration::from_secs(60);

async fn discover(ctx: &Context, api_version: &str, kind: &str) -> Option<Discovered> {
    let key = (api_version.to_string(), kind.to_string());
    let known = ctx
        .discovered
        .lock()
        .ok()
        .and_then(|d| d.get(&key).cloned());
    match &known {
        Some(Discovery::Found(found)) => return Some(found.clone()),
        Some(Discovery::Failed(at)) if at.elapsed() < REDISCOVER_AFTER => return None,
        _ => {}
    }
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let result = match kube::discovery::pinned_kind(&ctx.client, &gvk).await {
        Ok((resource, caps)) => {
            Discovery::Found((resource, caps.scope == kube::discovery::Scope::Namespaced))
        }
        Err(e) => {
            if known.is_none() {
                tracing::warn!(%api_version, %kind, error = %e, "cannot discover a composed resource's kind; relying on the garbage collector's confirmation, and trying again in a minute");
            } else {
                tracing::debug!(%api_version, %kind, error = %e, "still cannot discover a composed resource's kind");
            }
            Discovery::Failed(Instant::now())
        }
    };
    if let Ok(mut d) = ctx.discovered.lock() {
        d.insert(key, result.clone());
    }
    match result {
        Discovery::Found(found) => Some(found),
        Discovery::Failed(_) => None,
    }
}

async fn publish(ctx: &Context, object: &Meta, type_: EventType, reason: &str, note: &str) {
    let reference = object.object_ref(&ctx.resource);
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note.into()),
        action: "Cascade".into(),
        secondary: None,
    };
    match ctx.recorder.publish(&event, &reference).await {
        Ok(()) => {}
        // No new objects, Events included, in a namespace being deleted.
        Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("being terminated") => {
            tracing::debug!("no event: the namespace is being deleted");
        }
        Err(e) => tracing::warn!(error = %e, "cannot publish event"),
    }
}

/// Whether the kind is still served: false only when discovery says for sure
/// that it is not (its CRD is gone, and its objects with it).
async fn is_served(client: &Client, kind: &ProtectedKind) -> bool {
    match served_resource(client, kind).await {
        Ok(_) => true,
        Err(kube::Error::Api(s)) => s.code != 404,
        Err(kube::Error::Discovery(
            kube::error::DiscoveryError::MissingResource(_)
            | kube::error::DiscoveryError::MissingApiGroup(_),
        )) => false,
        Err(_) => true,
    }
}

/// The version of a kind the API server serves (its preferred one).
pub async fn served_resource(
    client: &Client,
    kind: &ProtectedKind,
) -> Result<ApiResource, kube::Error> {
    let group = kube::discovery::group(client, &kind.group).await?;
    group
        .recommended_resources()
        .into_iter()
        .map(|(r, _)| r)
        .find(|r| r.plural == kind.plural)
        .ok_or_else(|| {
            kube::Error::Discovery(kube::error::DiscoveryError::MissingResource(format!(
                "{}.{}",
                kind.plural, kind.group
            )))
        })
}
