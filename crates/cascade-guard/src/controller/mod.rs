//! The controller: keeps the compiled admission objects in step with what the
//! cluster says (XRDs and their annotations, CascadePolicies), puts them back
//! when someone edits or deletes them, and reports problems.
//!
//! [`run`] is the loop. Each change wakes one pass over everything
//! ([`sync`]); [`convert`] runs a controller per Convert kind, holding and
//! finishing cascades; [`watches`] watches the kinds guarded by admission
//! alone for stalled cascades and refused replays; [`sibling_order`] holds
//! what a sibling still needs; [`static_writer`] keeps a static manifests
//! directory in step, in every replica. [`leader`] elects the one
//! replica that runs it, and [`telemetry`] serves its metrics and probes.

use crate::cluster::{backoff, convert};
pub mod leader;
pub mod memory;
pub mod process;
pub mod sibling_order;
pub mod static_writer;
pub mod sync;
pub mod telemetry;
pub(crate) mod watches;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;
use kube::runtime::events::{Recorder, Reporter};

use crate::cluster::watch_tap::Taps;
use tokio::sync::Notify;

use crate::cluster::held;
use crate::policy::{CompileSettings, Mode, ProtectedKind};
use sync::managed::Managed;
use sync::sources::{Sources, watch_crds};
use sync::{apply, publish, type_check};
use telemetry::{Health, Metrics};

pub use apply::own_username;

/// The field manager (server-side apply) and event reporter name.
pub const MANAGER: &str = crate::policy::names::FIELD_MANAGER;

#[derive(Clone, Debug)]
pub struct Settings {
    /// The mode of XRDs without the deletion-policy annotation.
    pub xrd_default_mode: Mode,
    pub compile: CompileSettings,
    /// A full pass with no event, to pick up what no watch reports (a kind a
    /// CascadePolicy names coming into discovery) and to repair anything missed.
    pub resync: Duration,
    /// Changes within this window are handled in one pass.
    pub debounce: Duration,
    /// A cascade cascade-guard holds with no progress for this long gets a
    /// `CascadeStalled` Warning Event and counts in the stalled gauge.
    pub stall_after: Duration,
    /// A foreground cascade cascade-guard holds that shows nothing it can see
    /// left for this long is restarted (`Step::RestartCascade`); `None`:
    /// never.
    pub restart_quiet_cascades_after: Option<Duration>,
    /// Order the siblings of the trees of Refuse and Convert kinds
    /// ([`sibling_order`]).
    pub sibling_order: bool,
    /// The controller's own namespace (its Lease's): where sibling order
    /// keeps the ConfigMap its admission gate reads.
    pub home_namespace: String,
    /// With sibling order: refuse the delete of a root whose tree it has not
    /// ordered (its admission gate), rather than let it go in no order.
    pub refuse_unordered_deletes: bool,
    /// Hold the composed objects of Refuse and Warn kinds, so that
    /// Crossplane's own delete of one (v2.0 and v2.1 send no propagation
    /// policy) is let through and made a foreground cascade.
    pub hold_composed: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            xrd_default_mode: Mode::Refuse,
            compile: CompileSettings::default(),
            resync: Duration::from_secs(300),
            debounce: Duration::from_millis(100),
            stall_after: convert::DEFAULT_STALL_AFTER,
            restart_quiet_cascades_after: Some(crate::policy::cascade::RESTART_AFTER),
            sibling_order: true,
            home_namespace: "default".to_string(),
            refuse_unordered_deletes: true,
            hold_composed: false,
        }
    }
}

/// Where `run` tells sibling order the ordered kinds, after each complete pass.
type KindsSender = tokio::sync::watch::Sender<Option<sibling_order::OrderedKinds>>;

/// Sibling order's loop and the feed the other watches give it (one watch
/// per kind: Convert's and the admission-only kinds' watches feed its
/// index); with `--sibling-order off`, neither, and every hold let go.
fn start_sibling_order(
    client: &Client,
    settings: &Settings,
    recorder: &Recorder,
    metrics: &Arc<Metrics>,
) -> (Option<sibling_order::Feed>, Option<KindsSender>) {
    let feed = settings.sibling_order.then(sibling_order::Feed::new);
    let ordering = feed.clone().map(|feed| {
        sibling_order::start(
            client.clone(),
            sibling_order::Setup {
                namespace: settings.home_namespace.clone(),
                refuse_unordered: settings.refuse_unordered_deletes,
                settings: settings.compile.clone(),
                resync: settings.resync,
            },
            recorder.clone(),
            metrics.clone(),
            feed,
        )
    });
    if !settings.sibling_order {
        // Off: nothing may stay held, and no delete may wait on a gate that
        // nothing keeps.
        tokio::spawn(sibling_order::let_go_of_everything(
            client.clone(),
            settings.home_namespace.clone(),
        ));
    }
    (feed, ordering)
}

/// Runs until the process is stopped. Only the leader may call this: it writes.
pub async fn run(client: Client, settings: Settings, metrics: Arc<Metrics>, health: Health) {
    let notify = Arc::new(Notify::new());
    let sources = Sources::start(client.clone(), notify.clone()).await;
    let managed = Managed::start(client.clone(), notify.clone());
    watch_crds(client.clone(), notify.clone());
    let reporter = Reporter {
        controller: MANAGER.into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let recorder = Recorder::new(client.clone(), reporter.clone());
    let mut publisher = publish::Publisher::new(client.clone(), reporter);
    let mut type_checks = type_check::Reporting::new(recorder.clone(), metrics.clone());
    let (feed, ordering) = start_sibling_order(&client, &settings, &recorder, &metrics);
    let mut converter = convert::Converter::new(client.clone(), recorder.clone(), metrics.clone())
        .with_stall_after(settings.stall_after)
        .with_restarts_after(settings.restart_quiet_cascades_after)
        .with_feed(feed.clone().map(|f| Arc::new(f) as Arc<dyn Taps>));
    let mut kind_watches = watches::Watches::new(
        client.clone(),
        recorder,
        metrics.clone(),
        settings.stall_after,
    )
    .with_feed(feed.map(|f| Arc::new(f) as Arc<dyn Taps>));
    // Objects held of kinds no policy names (found once, after the first
    // complete pass): handed to the converter to finish.
    let found: Arc<Mutex<Option<Vec<ProtectedKind>>>> = Arc::new(Mutex::new(None));
    let mut scanned = false;
    let mut last_good = apply::LastGood::default();
    apply::check_own_username(&client, &settings.compile).await;
    tracing::info!(
        xrd_default_mode = %settings.xrd_default_mode,
        "cascade-guard controller started"
    );
    loop {
        tokio::select! {
            _ = notify.notified() => {}
            _ = tokio::time::sleep(settings.resync) => {}
        }
        tokio::time::sleep(settings.debounce).await;
        metrics.sync_pass_started();
        let gathered = sources.gather(&client, settings.xrd_default_mode).await;
        metrics.set_input_available("CascadePolicy", gathered.cascade_policy_crd);
        let resolution = crate::policy::resolve(&gathered.inputs);
        let outcome = apply::apply(
            &client,
            &settings.compile,
            resolution,
            &gathered.known,
            &managed,
            &mut last_good,
        )
        .await;
        publisher
            .publish(&outcome, &gathered.cascade_policies, &gathered.xrd_refs)
            .await;
        type_checks
            .publish(
                &outcome.type_checks,
                &gathered.cascade_policies,
                &gathered.xrd_refs,
            )
            .await;
        let complete = outcome.known.xrds && outcome.known.cascade_policies;
        if complete && !scanned {
            scanned = true;
            scan_for_held(client.clone(), found.clone(), notify.clone());
        }
        let policies = &outcome.resolution.policies;
        let found_kinds: Vec<ProtectedKind> = found
            .lock()
            .ok()
            .and_then(|mut f| f.take())
            .unwrap_or_default()
            .into_iter()
            // What the policies know of a kind (an XR's shape) beats the scan's.
            .map(|k| {
                match policies
                    .iter()
                    .find(|p| p.kind.same_kind(&k.group, &k.kind))
                {
                    Some(p) => p.kind.clone(),
                    None => k,
                }
            })
            .collect();
        // Only a complete pass says which kinds are ordered: one that could
        // not read the XRDs or CascadePolicies would make their trees' holds
        // look orphaned.
        let convert_kinds = convert::convert_kinds(policies, settings.hold_composed);
        let watched_kinds = watches::watched_kinds(policies, &convert_kinds);
        if let Some(ordering) = ordering.as_ref().filter(|_| complete) {
            let fed = |k: &ProtectedKind| {
                let key = convert::kind_key(k);
                convert_kinds.contains_key(&key) || watched_kinds.contains_key(&key)
            };
            ordering.send_if_modified(|kinds| {
                let now = Some(sibling_order::OrderedKinds::of(policies, fed));
                let changed = *kinds != now;
                *kinds = now;
                changed
            });
        }
        kind_watches.update(watched_kinds);
        converter
            .update(convert_kinds, &found_kinds, complete)
            .await;
        metrics.set_policies(outcome.compiled.len());
        if complete {
            health.set_ready(true);
        }
        metrics.sync_pass_completed();
    }
}

/// Looks, once, for objects cascade-guard holds of kinds no Convert policy
/// names (they lost it while cascade-guard was down), and wakes the loop.
fn scan_for_held(
    client: Client,
    found: Arc<Mutex<Option<Vec<ProtectedKind>>>>,
    notify: Arc<Notify>,
) {
    tokio::spawn(async move {
        let scan = match held::scan(&client, held::Depth::Any).await {
            Ok(scan) => scan,
            Err(e) => {
                tracing::warn!(error = %e, "cannot look for held objects of kinds no policy names; only Convert kinds are followed");
                return;
            }
        };
        for unreadable in &scan.unreadable {
            tracing::warn!(%unreadable, "cannot tell whether cascade-guard holds objects of this kind");
        }
        let kinds: Vec<ProtectedKind> = scan.holding.into_iter().map(|h| h.kind).collect();
        tracing::info!(kinds = kinds.len(), "looked for held objects of every kind");
        if let Ok(mut f) = found.lock() {
            *f = Some(kinds);
        }
        notify.notify_one();
    });
}
