//! The controller: keeps the compiled admission objects in step with what the
//! cluster says (XRDs and their annotations, CascadePolicies), puts them back
//! when someone edits or deletes them, and reports problems.
//!
//! Every change anywhere triggers one pass over everything (`sync`): with tens
//! of protected kinds a full pass is cheap, and it keeps the logic a pure
//! function of the inputs (policy::resolve, policy::admission) plus an apply.

mod apply;
mod backoff;
pub mod convert;
pub mod held;
mod inputs;
mod report;
pub mod type_check;
mod uninstall;
pub mod watched;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PartialObjectMeta;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};

use backoff::WatchBackoff;
use kube::{Api, Client};
use tokio::sync::Notify;

use crate::policy::CompileSettings;
use crate::policy::names::{MANAGED_BY_LABEL, MANAGED_BY_VALUE};
use crate::policy::{Mode, ProtectedKind};
use crate::telemetry::{Health, Metrics};

pub use apply::own_username;
pub use inputs::Sources;
use inputs::Watched;
// For `cascade-guard status`, which reads the same inputs once.
pub(crate) use inputs::read_once;
pub use uninstall::{Options as UninstallOptions, Summary as UninstallSummary, uninstall};

/// The field manager (server-side apply) and event reporter name.
pub const MANAGER: &str = "cascade-guard";

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
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            xrd_default_mode: Mode::Refuse,
            compile: CompileSettings::default(),
            resync: Duration::from_secs(300),
            debounce: Duration::from_millis(100),
            stall_after: convert::DEFAULT_STALL_AFTER,
        }
    }
}

/// Runs until the process is stopped. Only the leader may call this: it writes.
pub async fn run(client: Client, settings: Settings, metrics: Arc<Metrics>, health: Health) {
    let notify = Arc::new(Notify::new());
    let sources = Sources::start(client.clone(), notify.clone()).await;
    let managed = watch_for_changes(client.clone(), notify.clone());
    let reporter = Reporter {
        controller: MANAGER.into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let recorder = Recorder::new(client.clone(), reporter.clone());
    let mut report = report::Reporting::new(client.clone(), reporter);
    let mut type_checks = type_check::Reporting::new(recorder.clone(), metrics.clone());
    let mut converter = convert::Converter::new(client.clone(), recorder.clone(), metrics.clone())
        .with_stall_after(settings.stall_after);
    let mut watcher = watched::Watcher::new(
        client.clone(),
        recorder,
        metrics.clone(),
        settings.stall_after,
    );
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
        report
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
        let convert_kinds = convert::convert_kinds(policies);
        watcher.update(watched::watched_kinds(policies, &convert_kinds));
        converter
            .update(convert_kinds, &found_kinds, complete)
            .await;
        metrics.set_policies(outcome.compiled.len());
        if complete {
            health.set_ready(true);
        }
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

/// cascade-guard's own admission objects, as the API server has them: a pass
/// applies only what is missing or differs, and an edit or delete by anyone
/// else triggers a pass that puts it back.
pub(crate) struct Managed {
    pub policies: Watched<ValidatingAdmissionPolicy>,
    pub bindings: Watched<ValidatingAdmissionPolicyBinding>,
}

fn watch_for_changes(client: Client, notify: Arc<Notify>) -> Managed {
    let managed =
        watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"));
    let policies = Watched::start(
        Api::<ValidatingAdmissionPolicy>::all(client.clone()),
        managed.clone(),
        Default::default(),
        notify.clone(),
        "ValidatingAdmissionPolicies",
    );
    let bindings = Watched::start(
        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone()),
        managed,
        Default::default(),
        notify.clone(),
        "ValidatingAdmissionPolicyBindings",
    );
    // A kind (or Crossplane) appearing: metadata is enough to notice.
    trigger(
        Api::<PartialObjectMeta<CustomResourceDefinition>>::all(client),
        watcher::Config::default(),
        notify,
        "CustomResourceDefinitions",
    );
    Managed { policies, bindings }
}

fn trigger<K>(api: Api<K>, config: watcher::Config, notify: Arc<Notify>, what: &'static str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    use futures::StreamExt;
    tokio::spawn(async move {
        let mut stream = watcher(api, config)
            .backoff(WatchBackoff::default())
            .boxed();
        let mut failing = false;
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => {
                    if std::mem::take(&mut failing) {
                        tracing::info!("watching {what} again");
                    }
                    notify.notify_one()
                }
                Err(e) => log_watch_error(&mut failing, what, &e),
            }
        }
    });
}

/// The first failure of a watch in a row is a warning; the retries that
/// follow (every few seconds) are debug lines, so a lasting failure is one
/// line in the log, not one a second.
pub(crate) fn log_watch_error(failing: &mut bool, what: &str, e: &watcher::Error) {
    if std::mem::replace(failing, true) {
        tracing::debug!(error = %e, "still cannot watch {what}; retrying");
    } else {
        tracing::warn!(error = %e, "cannot watch {what}; retrying every few seconds");
    }
}
