//! What `cascade-guard status` makes of what it read (pure): which kinds are
//! protected and by what, how the admission objects in the cluster differ
//! from what the policies compile to, and which protected objects are being
//! deleted.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use serde_json::Value;

use crate::cluster::running::Running;
use crate::cluster::static_protection::Record;
use crate::policy::names::{
    FOREGROUND_CASCADE_FINALIZER, FOREGROUND_DELETION_FINALIZER, MODE_ANNOTATION,
    PROTECTED_KINDS_ANNOTATION,
};
use crate::policy::plan::{self, AdmissionPlan, Live};
use crate::policy::selector::query_string;
use crate::policy::split_yaml_documents;
use crate::policy::static_manifest::{FEATURE_GATE, ServerReport, protected_kinds};
use crate::policy::sync::Pass;
use crate::policy::{Mode, Source};

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The default mode this report assumed for XRDs without the annotation.
    pub xrd_default_mode: Mode,
    pub protected: Vec<Protected>,
    pub admission: AdmissionSync,
    /// Protected objects with a deletionTimestamp, oldest deletion first.
    pub cascading: Vec<Cascading>,
    /// What the policies' inputs say is wrong, and what could not be read.
    pub problems: Vec<String>,
    /// Static protection, when some replica writes a static manifests
    /// directory (`run --static-manifests-dir`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub static_protection: Option<StaticProtection>,
    /// The controller's Lease as read: who leads, whether it is live.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller: Option<Running>,
    /// Whose settings the comparison compiled with.
    pub settings_from: SettingsFrom,
    /// What sibling order holds now (its record `cascade-guard-holds`).
    pub sibling_holds: Vec<SiblingHold>,
    /// How the trees of Refuse and Convert kinds stand for sibling order
    /// (its record `cascade-guard-ordered-trees`); None without a controller
    /// running sibling order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sibling_trees: Option<SiblingTrees>,
}

/// The roots of Refuse and Convert kinds, and whether each tree is ordered:
/// the gate refuses the delete of one that is not.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SiblingTrees {
    pub ordered: usize,
    /// Those not ordered, with why.
    pub not_ordered: Vec<UnorderedTree>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnorderedTree {
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    pub why: String,
}

impl SiblingTrees {
    /// Adds the roots among `objects` (of `kind`): no controller owner, not
    /// being deleted (the gate lets those go), each as its record's mark
    /// (`marks`: a root's uid to its value) says.
    pub fn add(&mut self, kind: &str, objects: &[ObjectMeta], marks: &BTreeMap<String, String>) {
        use crate::policy::sibling::gate::GateState;
        for m in objects {
            let controlled = m
                .owner_references
                .as_deref()
                .unwrap_or_default()
                .iter()
                .any(|r| r.controller == Some(true));
            if controlled || m.deletion_timestamp.is_some() {
                continue;
            }
            let uid = m.uid.as_deref().unwrap_or_default();
            match GateState::of(
                marks.get(uid).map(String::as_str),
                m.generation.unwrap_or(0),
            ) {
                GateState::Ordered => self.ordered += 1,
                state => self.not_ordered.push(UnorderedTree {
                    kind: kind.to_string(),
                    namespace: m.namespace.clone(),
                    name: m.name.clone().unwrap_or_default(),
                    why: state.to_string(),
                }),
            }
        }
    }
}

/// One object sibling order holds until what needs it is gone.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SiblingHold {
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    /// What it waits for, as the controller wrote it.
    pub waits_for: String,
}

/// Whose settings `status` compiled with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum SettingsFrom {
    /// The ones the running controller published on its Lease.
    Controller,
    /// `status`'s own flags (no controller published any, or `--use-flags`).
    Flags,
}

/// Exit status of `status` when a protected kind is unguarded or its
/// admission objects differ from what its policy compiles to.
pub const UNGUARDED_EXIT: i32 = 3;
/// Exit status of `status` when no controller runs (no live Lease).
pub const NO_CONTROLLER_EXIT: i32 = 4;

impl Report {
    /// 0 when every protected kind is guarded as compiled and a controller
    /// runs; [`UNGUARDED_EXIT`] first, as the graver, then
    /// [`NO_CONTROLLER_EXIT`].
    pub fn exit_code(&self) -> i32 {
        let unguarded = !self.admission.in_sync
            || self
                .protected
                .iter()
                .any(|p| p.served == Some(ServedFrom::Unguarded));
        if unguarded {
            UNGUARDED_EXIT
        } else if !self.controller.as_ref().is_some_and(|c| c.live) {
            NO_CONTROLLER_EXIT
        } else {
            0
        }
    }
}

/// What the static manifests writers published, against what the API server
/// reports it loaded.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StaticProtection {
    pub writers: Vec<StaticWriter>,
    /// The hash of the directory the answering API server loaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loaded_hash: Option<String>,
    /// The feature gate, as the API server reports it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gate_enabled: Option<bool>,
    pub failed_reloads: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StaticWriter {
    pub writer: String,
    pub directory: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
    /// Its directory, as written, is what the API server reports loaded.
    pub loaded: bool,
    /// The protected kinds its file carries.
    pub kinds: Vec<String>,
}

/// Where a kind's protection is served from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ServedFrom {
    /// ValidatingAdmissionPolicies in the API (the controller keeps them).
    Api,
    /// Its API objects are missing, and no static file carries it.
    Unguarded,
    /// From the static directory alone (its API objects are missing).
    Static,
    /// From the static directory and the API: cannot be switched off through the API.
    StaticAndApi,
    /// A static writer runs, but its file does not carry the kind.
    NotInStaticFile,
    /// The file carries it, but the API server has not loaded the file as written.
    StaticStale,
}

impl ServedFrom {
    pub fn as_str(self) -> &'static str {
        match self {
            ServedFrom::Api => "API",
            ServedFrom::Unguarded => "nothing (its API objects are missing)",
            ServedFrom::Static => "static (its API objects are missing)",
            ServedFrom::StaticAndApi => "static + API",
            ServedFrom::NotInStaticFile => "API (missing from the static file)",
            ServedFrom::StaticStale => "API (static file not loaded)",
        }
    }
}

/// One policy: a kind, its mode, and what asked for it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Protected {
    /// `Kind.group`.
    pub kind: String,
    /// `plural.group`, as kubectl takes it.
    pub resource: String,
    pub mode: Mode,
    pub source: SourceKind,
    /// The XRD or CascadePolicy the policy comes from.
    pub from: String,
    /// `key=value,...` when only matching objects are protected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The ValidatingAdmissionPolicy and binding it compiles to (None for Off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admission_objects: Option<String>,
    /// Where its protection is served from (None for Off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub served: Option<ServedFrom>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum SourceKind {
    /// The XRD's `cascade-guard.dev/deletion-policy` annotation.
    XrdAnnotation,
    /// An XRD without the annotation: `--xrd-default-mode`.
    Default,
    CascadePolicy,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionSync {
    pub in_sync: bool,
    /// How many admission objects the policies compile to.
    pub wanted: usize,
    pub differences: Vec<MismatchedObject>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MismatchedObject {
    pub state: Mismatch,
    pub kind: &'static str,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Mismatch {
    /// Wanted, not in the cluster.
    Missing,
    /// In the cluster with other content than wanted.
    Differs,
    /// In the cluster, labelled as cascade-guard's, but no policy wants it.
    Extra,
}

/// A protected object that is being deleted.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cascading {
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    /// Its deletionTimestamp (RFC 3339).
    pub deleting_since: String,
    pub age_seconds: u64,
    /// cascade-guard's finalizer is on it (Convert mode).
    pub held: bool,
    /// `foregroundDeletion` is on it: the garbage collector is deleting what
    /// it owns first.
    pub foreground: bool,
    /// Every finalizer still on it: what its deletion waits for.
    pub finalizers: Vec<String>,
    /// The controller reported its cascade stalled (its last such Event
    /// says so, not a later `CascadeResumed`): what the Event said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stalled: Option<String>,
    #[serde(skip)]
    pub uid: String,
}

impl Cascading {
    /// What the object is waiting for, in words.
    pub fn state(&self) -> &'static str {
        match (self.held, self.foreground) {
            (true, true) => "foreground cascade, held by cascade-guard",
            (true, false) => "held by cascade-guard, waiting for it to re-issue the delete",
            (false, true) => "foreground cascade",
            (false, false) => "terminating, waiting on its finalizers",
        }
    }
}

/// One row per policy.
pub(super) fn protected(plan: &AdmissionPlan) -> Vec<Protected> {
    plan.planned
        .iter()
        .map(|planned| {
            let p = &planned.policy;
            let (source, from) = match &p.source {
                Source::Xrd {
                    name, annotated, ..
                } => (
                    if *annotated {
                        SourceKind::XrdAnnotation
                    } else {
                        SourceKind::Default
                    },
                    name.clone(),
                ),
                Source::CascadePolicy { name } => (SourceKind::CascadePolicy, name.clone()),
            };
            Protected {
                kind: p.kind.to_string(),
                resource: p.kind.resource(),
                mode: p.mode,
                source,
                from,
                selector: p
                    .selector
                    .as_ref()
                    .map(|s| query_string(s).unwrap_or_else(|e| format!("(invalid: {e})"))),
                admission_objects: Some(planned.names().join(", ")).filter(|n| !n.is_empty()),
                served: (p.mode != Mode::Off).then_some(ServedFrom::Api),
            }
        })
        .collect()
}

/// Marks the kinds whose API objects are missing (their delete policy or
/// binding is not in the cluster) as unguarded by the API.
pub(super) fn mark_missing_api_objects(protected: &mut [Protected], admission: &AdmissionSync) {
    let missing: Vec<&str> = admission
        .differences
        .iter()
        .filter(|d| d.state == Mismatch::Missing)
        .map(|d| d.name.as_str())
        .collect();
    for row in protected.iter_mut() {
        let names = row.admission_objects.as_deref().unwrap_or_default();
        if row.served.is_some() && names.split(", ").any(|n| missing.contains(&n)) {
            row.served = Some(ServedFrom::Unguarded);
        }
    }
}

/// Compares what the static writers published with what the API server
/// reports it loaded, marks each protected kind with where it is served from,
/// and says what is wrong. None when no writer publishes (static protection
/// is not in use). Behind a load balancer `report` is one API server's.
pub(super) fn static_protection(
    protected: &mut [Protected],
    records: &[Record],
    report: Option<&ServerReport>,
    problems: &mut Vec<String>,
) -> Option<StaticProtection> {
    if records.is_empty() {
        return None;
    }
    if report.is_none() {
        problems.push(
            "cannot read the API server's /metrics, which says what static manifests it loaded: static protection is shown as not loaded".to_string(),
        );
    }
    let loaded_hash = report.and_then(|r| r.loaded_hash.clone());
    let writers: Vec<StaticWriter> = records
        .iter()
        .map(|r| {
            let docs = split_yaml_documents(&r.manifest).unwrap_or_default();
            StaticWriter {
                writer: r.writer.clone(),
                directory: r.directory.clone(),
                hash: r.hash.clone(),
                loaded: r.hash.is_some() && r.hash == loaded_hash,
                kinds: protected_kinds(&docs).into_iter().collect(),
            }
        })
        .collect();
    let any_loaded = writers.iter().any(|w| w.loaded);
    if !any_loaded && report.is_some() {
        problems.push(format!(
            "the API server has not loaded the static manifests as written (it reports {}, {} failed reload(s)): is the directory its AdmissionConfiguration's staticManifestsDir{}?",
            loaded_hash.as_deref().unwrap_or("no static policies"),
            report.map_or(0, |r| r.failed_reloads),
            match report.and_then(|r| r.gate_enabled) {
                Some(false) => format!(", and the feature gate {FEATURE_GATE} is off"),
                _ => String::new(),
            }
        ));
    }
    for row in protected.iter_mut() {
        if row.served.is_none() {
            continue;
        }
        let missing: Vec<&str> = writers
            .iter()
            .filter(|w| !w.kinds.contains(&row.kind))
            .map(|w| w.writer.as_str())
            .collect();
        let api = row.served == Some(ServedFrom::Api);
        row.served = Some(if !missing.is_empty() {
            problems.push(format!(
                "{} is not in the static file of {}: only its API objects protect it (is that writer running and reading the same policies?)",
                row.kind,
                missing.join(", ")
            ));
            if api {
                ServedFrom::NotInStaticFile
            } else {
                ServedFrom::Unguarded
            }
        } else if any_loaded {
            if api {
                ServedFrom::StaticAndApi
            } else {
                ServedFrom::Static
            }
        } else if api {
            ServedFrom::StaticStale
        } else {
            ServedFrom::Unguarded
        });
    }
    Some(StaticProtection {
        writers,
        loaded_hash,
        gate_enabled: report.and_then(|r| r.gate_enabled),
        failed_reloads: report.map_or(0, |r| r.failed_reloads),
    })
}

/// A sync pass's changes, for people: the same pass the controller writes
/// from, run on `live`, the managed admission objects in the cluster.
pub(super) fn admission_sync(pass: &Pass, live: &Live) -> AdmissionSync {
    let plan = &pass.plan;
    let differences: Vec<MismatchedObject> = pass
        .changes
        .iter()
        .cloned()
        .map(|d| {
            let kind = d.kind.as_str();
            let (state, detail) = match d.drift {
                plan::Drift::Missing => (Mismatch::Missing, guards(plan, &d.name)),
                plan::Drift::Differs { path } => {
                    let policy = plan.compiled(&d.name).map(|(p, _)| p);
                    let live = match d.kind {
                        plan::ObjectKind::Policy => live.policies.get(&d.name),
                        plan::ObjectKind::Binding => live.bindings.get(&d.name),
                    };
                    // A shared object may carry XRDs with and without the annotation.
                    let defaulted = plan.carried_by(&d.name).any(|p| {
                        matches!(
                            p.source,
                            Source::Xrd {
                                annotated: false,
                                ..
                            }
                        )
                    });
                    let detail = match (policy, live) {
                        (Some(policy), Some(live)) => {
                            differs_detail(policy.mode, defaulted, &path, live)
                        }
                        _ => format!("{path} differs"),
                    };
                    (Mismatch::Differs, Some(detail))
                }
                plan::Drift::Extra { removable: true } => {
                    let live = match d.kind {
                        plan::ObjectKind::Policy => live.policies.get(&d.name),
                        plan::ObjectKind::Binding => live.bindings.get(&d.name),
                    };
                    let detail = live
                        .and_then(|l| other_mode_detail(plan, l))
                        .unwrap_or_else(|| "no policy compiles to it".to_string());
                    (Mismatch::Extra, Some(detail))
                }
                plan::Drift::Extra { removable: false } => (
                    Mismatch::Extra,
                    Some(
                        "no policy compiles to it; the controller keeps it while the input it came from cannot be read completely"
                            .to_string(),
                    ),
                ),
            };
            MismatchedObject {
                state,
                kind,
                name: d.name,
                detail,
            }
        })
        .collect();
    AdmissionSync {
        in_sync: differences.is_empty(),
        wanted: plan.object_count(),
        differences,
    }
}

/// The kinds a wanted object guards, so that a missing shared object shows
/// the whole gap (None for an object of one CascadePolicy, named by itself).
fn guards(plan: &AdmissionPlan, name: &str) -> Option<String> {
    let kinds: Vec<String> = plan
        .carried_by(name)
        .filter(|p| matches!(p.source, Source::Xrd { .. }))
        .map(|p| p.kind.to_string())
        .collect();
    const SHOWN: usize = 5;
    let shown = kinds
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    match kinds.len() {
        0 => None,
        n if n <= SHOWN => Some(format!("unguarded until it is back: {shown}")),
        n => Some(format!(
            "unguarded until it is back: {shown} and {} more",
            n - SHOWN
        )),
    }
}

/// An extra shared object of another mode that carries kinds the plan has
/// from XRDs without the annotation: the controller probably runs with
/// another default mode than status was given.
fn other_mode_detail(plan: &AdmissionPlan, live: &Value) -> Option<String> {
    let annotations = live.pointer("/metadata/annotations")?;
    let live_mode = annotations.get(MODE_ANNOTATION)?.as_str()?;
    let carried: BTreeMap<String, Value> =
        serde_json::from_str(annotations.get(PROTECTED_KINDS_ANNOTATION)?.as_str()?).ok()?;
    let defaulted: Vec<String> = plan
        .planned
        .iter()
        .filter(|p| {
            matches!(
                p.policy.source,
                Source::Xrd {
                    annotated: false,
                    ..
                }
            ) && p.policy.mode.as_str() != live_mode
                && carried.contains_key(&p.policy.kind.to_string())
        })
        .map(|p| p.policy.kind.to_string())
        .collect();
    let first = defaulted.first()?;
    let more = match defaulted.len() {
        1 => String::new(),
        n => format!(" and {} more", n - 1),
    };
    Some(format!(
        "compiled for mode {live_mode} for {first}{more}, the policy says {}; if the controller runs with --xrd-default-mode={live_mode}, pass the same to status",
        plan.planned
            .iter()
            .find(|p| p.policy.kind.to_string() == *first)
            .map_or(Mode::Off, |p| p.policy.mode)
    ))
}

/// Says which field differs, and when it is the mode of an XRD without the
/// annotation, that the controller probably runs with another default mode.
fn differs_detail(mode: Mode, defaulted: bool, path: &str, live: &Value) -> String {
    let live_mode = live
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(MODE_ANNOTATION))
        .and_then(Value::as_str);
    match live_mode {
        Some(m) if m != mode.as_str() => {
            let hint = if defaulted {
                format!(
                    "; if the controller runs with --xrd-default-mode={m}, pass the same to status"
                )
            } else {
                String::new()
            };
            format!("compiled for mode {m}, the policy says {mode}{hint}")
        }
        _ => format!("{path} differs"),
    }
}

/// The objects among `objects` (all of one kind) that are being deleted.
pub(super) fn cascading_objects(
    kind: &str,
    objects: &[ObjectMeta],
    now: Timestamp,
) -> Vec<Cascading> {
    objects
        .iter()
        .filter_map(|m| {
            let since = m.deletion_timestamp.as_ref()?.0;
            let finalizers = m.finalizers.clone().unwrap_or_default();
            let has = |f: &str| finalizers.iter().any(|x| x == f);
            Some(Cascading {
                kind: kind.to_string(),
                namespace: m.namespace.clone(),
                name: m.name.clone().unwrap_or_default(),
                deleting_since: since.to_string(),
                age_seconds: u64::try_from(now.duration_since(since).as_secs()).unwrap_or(0),
                held: has(FOREGROUND_CASCADE_FINALIZER),
                foreground: has(FOREGROUND_DELETION_FINALIZER),
                finalizers,
                stalled: None,
                uid: m.uid.clone().unwrap_or_default(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
