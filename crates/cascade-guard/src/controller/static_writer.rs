//! Keeps the static manifests directory (`run --static-manifests-dir`) in step
//! with the policies, in every replica, leader or not: each control-plane
//! node's API server reads its own directory, so each node's replica writes
//! its own. It compiles what the sync pass compiles (plus the sibling-order
//! hold policy) and writes nothing else: the API-served objects stay the
//! leader's, and stay in force beside the static ones (the API server asks
//! static policies first, so a refusal quotes the static one).
//!
//! A file is written only from a complete view of the inputs: one written
//! while XRDs could not be listed would drop their protection.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::Client;
use tokio::sync::Notify;

use super::Settings;
use super::sync::sources::{Sources, watch_crds};
use super::telemetry::Metrics;
use crate::cluster::static_protection::{self, Record, StaticDirectory};
use crate::policy::plan::plan;
use crate::policy::static_manifest::manifest;

/// Where to write and how to say so.
#[derive(Clone, Debug)]
pub struct Target {
    pub directory: StaticDirectory,
    /// Who writes (the node name, else the host name): names the record.
    pub writer: String,
    /// Where the record goes: the controller's home namespace
    /// (`--leader-election-namespace`, else the pod's), where the chart's
    /// Role lets the writer keep it.
    pub namespace: String,
}

/// How long to look for the API server to report the new file before saying
/// it has not (it reloads on a file event, or within a minute).
const CONFIRM_WITHIN: Duration = Duration::from_secs(150);
const CONFIRM_EVERY: Duration = Duration::from_secs(5);
/// How often the file is compared with what it should hold even when no
/// input changed: one edited or deleted on the node comes back within this.
const REWRITE_EVERY: Duration = Duration::from_secs(10);

pub async fn run(client: Client, settings: Settings, target: Target, metrics: Arc<Metrics>) {
    let notify = Arc::new(Notify::new());
    let sources = Sources::start(client.clone(), notify.clone()).await;
    watch_crds(client.clone(), notify.clone());
    let mut published: Option<Record> = None;
    let mut unconfirmed: Option<(String, Instant)> = None;
    tracing::info!(directory = %target.directory.path().display(), "writing static admission manifests");
    loop {
        let wait = if unconfirmed.is_some() {
            CONFIRM_EVERY
        } else {
            REWRITE_EVERY.min(settings.resync)
        };
        tokio::select! {
            _ = notify.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
        tokio::time::sleep(settings.debounce).await;
        let gathered = sources.gather(&client, settings.xrd_default_mode).await;
        if !(gathered.known.xrds && gathered.known.cascade_policies) {
            tracing::warn!(
                "not writing static manifests: the inputs were not all read; the file stays as it was"
            );
            continue;
        }
        let resolution = crate::policy::resolve(&gathered.inputs);
        // Not sibling order's hold or gate: they read a ConfigMap as their
        // parameter, which a static manifest cannot have.
        let objects = plan(&resolution, &settings.compile, BTreeSet::new()).objects;
        let text = match manifest(&objects) {
            Ok(text) => text,
            Err(e) => {
                tracing::error!(error = %e, "cannot write static manifests; the file stays as it was");
                continue;
            }
        };
        let policies = objects.len();
        match target.directory.write(&text) {
            Ok(true) => {
                tracing::info!(policies, file = %target.directory.file().display(), "wrote static admission manifests");
            }
            Ok(false) => {}
            Err(e) => {
                tracing::error!(error = %e, "cannot write static manifests");
                continue;
            }
        }
        let hash = match target.directory.hash() {
            Ok(hash) => hash,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the static manifests directory back");
                continue;
            }
        };
        let record = Record {
            writer: target.writer.clone(),
            directory: target.directory.path().display().to_string(),
            hash: hash.clone(),
            manifest: text,
        };
        if published.as_ref() != Some(&record) {
            match static_protection::publish(&client, &target.namespace, &record).await {
                Ok(()) => published = Some(record),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot publish the static manifests record; `cascade-guard status` will not see this directory")
                }
            }
            if let Some(hash) = &hash
                && unconfirmed.as_ref().map(|(h, _)| h) != Some(hash)
            {
                unconfirmed = Some((hash.clone(), Instant::now()));
            }
        }
        if let Some((hash, since)) = unconfirmed.clone() {
            match static_protection::read_server_report(&client).await {
                Ok(report) if report.loaded_hash.as_deref() == Some(hash.as_str()) => {
                    tracing::info!(%hash, "the API server loaded the static manifests");
                    metrics.set_static(policies, true);
                    unconfirmed = None;
                }
                Ok(report) if since.elapsed() > CONFIRM_WITHIN => {
                    tracing::warn!(
                        %hash,
                        loaded = report.loaded_hash.as_deref().unwrap_or("none"),
                        failed_reloads = report.failed_reloads,
                        gate = ?report.gate_enabled,
                        "the API server has not loaded the static manifests as written: is this directory its AdmissionConfiguration's staticManifestsDir, and the feature gate on? (behind a load balancer, another API server may have answered)"
                    );
                    metrics.set_static(policies, false);
                    unconfirmed = None;
                }
                Ok(_) => metrics.set_static(policies, false),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot tell whether the API server loaded the static manifests");
                    metrics.set_static(policies, false);
                    unconfirmed = None;
                }
            }
        }
    }
}
