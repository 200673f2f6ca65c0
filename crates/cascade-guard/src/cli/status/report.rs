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
use crate::policy::plan::{self, Live, Plan};
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
                .any(|p| p.served == Some(Served::Unguarded));
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
pub enum Served {
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

impl Served {
    pub fn as_str(self) -> &'static str {
        match self {
            Served::Api => "API",
            Served::Unguarded => "nothing (its API objects are missing)",
            Served::Static => "static (its API objects are missing)",
            Served::StaticAndApi => "static + API",
            Served::NotInStaticFile => "API (missing from the static file)",
            Served::StaticStale => "API (static file not loaded)",
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
    pub served: Option<Served>,
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
pub(super) fn protected(plan: &Plan) -> Vec<Protected> {
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
                served: (p.mode != Mode::Off).then_some(Served::Api),
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
            row.served = Some(Served::Unguarded);
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
        let api = row.served == Some(Served::Api);
        row.served = Some(if !missing.is_empty() {
            problems.push(format!(
                "{} is not in the static file of {}: only its API objects protect it (is that writer running and reading the same policies?)",
                row.kind,
                missing.join(", ")
            ));
            if api {
                Served::NotInStaticFile
            } else {
                Served::Unguarded
            }
        } else if any_loaded {
            if api {
                Served::StaticAndApi
            } else {
                Served::Static
            }
        } else if api {
            Served::StaticStale
        } else {
            Served::Unguarded
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
fn guards(plan: &Plan, name: &str) -> Option<String> {
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
fn other_mode_detail(plan: &Plan, live: &Value) -> Option<String> {
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
mod tests {
    use std::collections::BTreeSet;

    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    use super::super::fixtures::{live, meta, resolution, sync};
    use super::*;
    use crate::policy::CompileSettings;
    use crate::policy::names::{FOREGROUND_CASCADE_FINALIZER, FOREGROUND_DELETION_FINALIZER};
    use crate::policy::plan::plan;

    #[test]
    fn each_root_of_an_ordered_kind_is_ordered_or_says_why() {
        let object = |name: &str, generation: i64, controlled: bool, deleting: bool| {
            let mut m = json!({"name": name, "namespace": "team", "uid": format!("{name}-uid"),
                               "generation": generation});
            if controlled {
                m["ownerReferences"] = json!([{"apiVersion": "x/v1", "kind": "X", "name": "p",
                                               "uid": "p", "controller": true}]);
            }
            if deleting {
                m["deletionTimestamp"] = json!("2026-12-05T00:00:00Z");
            }
            serde_json::from_value::<ObjectMeta>(m).expect("metadata")
        };
        let objects = [
            object("ordered", 2, false, false),
            object("changed", 3, false, false),
            object("unread", 1, false, false),
            object("cannot", 1, false, false),
            object("composed", 1, true, false),
            object("going", 1, false, true),
        ];
        let marks = BTreeMap::from([
            ("ordered-uid".to_string(), "2".to_string()),
            ("changed-uid".to_string(), "2".to_string()),
            (
                "cannot-uid".to_string(),
                "not read: Secret team/kubeconfig".to_string(),
            ),
            ("composed-uid".to_string(), "7".to_string()),
        ]);
        let mut trees = SiblingTrees::default();
        trees.add("Stack", &objects, &marks);
        assert_eq!(trees.ordered, 1);
        let why: Vec<(&str, &str)> = trees
            .not_ordered
            .iter()
            .map(|t| (t.name.as_str(), t.why.as_str()))
            .collect();
        assert_eq!(
            why,
            [
                (
                    "changed",
                    "the tree changed since the controller last read it"
                ),
                (
                    "unread",
                    "the controller has not read this tree (it is down, new, or still reading)"
                ),
                (
                    "cannot",
                    "the controller cannot order this tree: not read: Secret team/kubeconfig"
                ),
            ]
        );
        assert!(
            trees
                .not_ordered
                .iter()
                .all(|t| t.kind == "Stack" && t.namespace.as_deref() == Some("team"))
        );
    }

    #[test]
    fn protected_says_where_each_policy_comes_from() {
        let rows = protected(&plan(
            &resolution(Mode::Refuse),
            &CompileSettings::default(),
            BTreeSet::new(),
        ));
        let got: Vec<Protected> = rows;
        let row = |kind: &str,
                   mode,
                   source,
                   from: &str,
                   selector: Option<&str>,
                   objects: Option<&str>| {
            Protected {
                kind: kind.into(),
                resource: String::new(),
                mode,
                source,
                from: from.into(),
                selector: selector.map(str::to_string),
                admission_objects: objects.map(str::to_string),
                served: (mode != Mode::Off).then_some(Served::Api),
            }
        };
        let want = [
            row(
                "Cluster.example.org",
                Mode::Convert,
                SourceKind::XrdAnnotation,
                "clusters.example.org",
                None,
                Some(
                    "cascade-guard-xrds-convert-composite, cascade-guard-update-xrds-convert-composite",
                ),
            ),
            row(
                "Network.example.org",
                Mode::Refuse,
                SourceKind::Default,
                "networks.example.org",
                None,
                Some(
                    "cascade-guard-xrds-refuse-composite, cascade-guard-update-xrds-refuse-composite",
                ),
            ),
            row(
                "Quiet.example.org",
                Mode::Off,
                SourceKind::XrdAnnotation,
                "quiet.example.org",
                None,
                None,
            ),
            row(
                "Release.helm.example.org",
                Mode::Refuse,
                SourceKind::CascadePolicy,
                "releases",
                Some("team=a"),
                Some("cascade-guard-policy-releases, cascade-guard-update-policy-releases"),
            ),
        ];
        let resources: Vec<&str> = got.iter().map(|p| p.resource.as_str()).collect();
        assert_eq!(
            resources,
            [
                "clusters.example.org",
                "networks.example.org",
                "quiet.example.org",
                "releases.helm.example.org"
            ]
        );
        let got: Vec<Protected> = got
            .into_iter()
            .map(|p| Protected {
                resource: String::new(),
                ..p
            })
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn in_sync_when_the_cluster_has_what_the_policies_compile_to() {
        let r = resolution(Mode::Refuse);
        let (policies, bindings) = live(&r);
        let sync = sync(&r, &policies, &bindings);
        assert!(sync.in_sync, "{sync:?}");
        // Three policies compile (Off does not), to a DELETE and an UPDATE
        // pair of a policy and a binding each.
        assert_eq!(sync.wanted, 12);
    }

    #[test]
    fn missing_differs_and_extra() {
        let r = resolution(Mode::Refuse);
        let (mut policies, mut bindings) = live(&r);
        // A binding deleted, a policy's validation edited, and a leftover of
        // an XRD that is gone.
        bindings.retain(|b| b["metadata"]["name"] != "cascade-guard-xrds-convert-composite");
        let releases = policies
            .iter()
            .position(|p| p["metadata"]["name"] == "cascade-guard-policy-releases")
            .unwrap();
        policies[releases]["spec"]["validations"][0]["expression"] = json!("true");
        let mut stale = policies[0].clone();
        stale["metadata"]["name"] = json!("cascade-guard-xrd-gone.example.org");
        policies.push(stale);
        let sync = sync(&r, &policies, &bindings);
        let got: Vec<(Mismatch, &str, &str, Option<&str>)> = sync
            .differences
            .iter()
            .map(|d| (d.state, d.kind, d.name.as_str(), d.detail.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    Mismatch::Missing,
                    "ValidatingAdmissionPolicyBinding",
                    "cascade-guard-xrds-convert-composite",
                    Some("unguarded until it is back: Cluster.example.org")
                ),
                (
                    Mismatch::Differs,
                    "ValidatingAdmissionPolicy",
                    "cascade-guard-policy-releases",
                    Some("spec.validations[0].expression differs")
                ),
                (
                    Mismatch::Extra,
                    "ValidatingAdmissionPolicy",
                    "cascade-guard-xrd-gone.example.org",
                    Some("no policy compiles to it")
                ),
            ]
        );
        assert!(!sync.in_sync);
    }

    #[test]
    fn another_default_mode_is_named_as_the_likely_cause() {
        // The controller runs with Warn; status assumed Refuse.
        let (policies, bindings) = live(&resolution(Mode::Warn));
        let sync = sync(&resolution(Mode::Refuse), &policies, &bindings);
        // The XRD without the annotation is in the Warn objects, which
        // status does not want, and missing from the Refuse ones it does.
        let got: Vec<(Mismatch, &str, Option<&str>)> = sync
            .differences
            .iter()
            .map(|d| (d.state, d.name.as_str(), d.detail.as_deref()))
            .collect();
        let missing = Some("unguarded until it is back: Network.example.org");
        let hint = Some(
            "compiled for mode Warn for Network.example.org, the policy says Refuse; if the controller runs with --xrd-default-mode=Warn, pass the same to status",
        );
        assert_eq!(
            got,
            [
                (
                    Mismatch::Missing,
                    "cascade-guard-xrds-refuse-composite",
                    missing
                ),
                (
                    Mismatch::Missing,
                    "cascade-guard-xrds-refuse-composite",
                    missing
                ),
                (
                    Mismatch::Missing,
                    "cascade-guard-update-xrds-refuse-composite",
                    missing
                ),
                (
                    Mismatch::Missing,
                    "cascade-guard-update-xrds-refuse-composite",
                    missing
                ),
                (
                    Mismatch::Extra,
                    "cascade-guard-update-xrds-warn-composite",
                    hint
                ),
                (Mismatch::Extra, "cascade-guard-xrds-warn-composite", hint),
                (
                    Mismatch::Extra,
                    "cascade-guard-update-xrds-warn-composite",
                    hint
                ),
                (Mismatch::Extra, "cascade-guard-xrds-warn-composite", hint),
            ],
            "{sync:?}"
        );
    }

    #[test]
    fn cascading_lists_only_deleted_objects_with_what_holds_them() {
        let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let objects = [
            meta("live", None, &[FOREGROUND_CASCADE_FINALIZER]),
            meta(
                "converting",
                Some("2026-01-01T11:59:50Z"),
                &[FOREGROUND_CASCADE_FINALIZER],
            ),
            meta(
                "cascading",
                Some("2026-01-01T11:55:00Z"),
                &[FOREGROUND_DELETION_FINALIZER, FOREGROUND_CASCADE_FINALIZER],
            ),
            meta(
                "refuse-mode",
                Some("2026-01-01T10:00:00Z"),
                &[FOREGROUND_DELETION_FINALIZER],
            ),
            meta(
                "wedged",
                Some("2025-12-30T12:00:00Z"),
                &["example.org/cleanup"],
            ),
        ];
        let got = cascading_objects("Cluster.example.org", &objects, now);
        let rows: Vec<(&str, u64, bool, bool, &str)> = got
            .iter()
            .map(|c| {
                (
                    c.name.as_str(),
                    c.age_seconds,
                    c.held,
                    c.foreground,
                    c.state(),
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                (
                    "converting",
                    10,
                    true,
                    false,
                    "held by cascade-guard, waiting for it to re-issue the delete"
                ),
                (
                    "cascading",
                    300,
                    true,
                    true,
                    "foreground cascade, held by cascade-guard"
                ),
                ("refuse-mode", 7200, false, true, "foreground cascade"),
                (
                    "wedged",
                    172_800,
                    false,
                    false,
                    "terminating, waiting on its finalizers"
                ),
            ]
        );
        assert_eq!(got[0].deleting_since, "2026-01-01T11:59:50Z");
        assert_eq!(got[3].finalizers, ["example.org/cleanup"]);
    }

    #[test]
    fn static_protection_marks_each_kind_and_says_what_is_wrong() {
        use crate::cluster::static_protection::Record;
        use crate::policy::static_manifest::{ServerReport, manifest};
        let r = resolution(Mode::Refuse);
        let p = plan(&r, &CompileSettings::default(), BTreeSet::new());
        let full = manifest(&p.objects).unwrap();
        // Another writer's file carries only the first pair.
        let partial = manifest(&p.objects[..1]).unwrap();
        let record = |writer: &str, hash: &str, text: &str| Record {
            writer: writer.into(),
            directory: "/etc/kubernetes/cascade-guard".into(),
            hash: Some(hash.into()),
            manifest: text.into(),
        };
        let server = ServerReport {
            gate_enabled: Some(true),
            loaded_hash: Some("sha256:a".into()),
            failed_reloads: 0,
        };

        // Not in use: nothing changes.
        let mut rows = protected(&p);
        let mut problems = Vec::new();
        assert_eq!(
            static_protection(&mut rows, &[], Some(&server), &mut problems),
            None
        );
        assert!(problems.is_empty());

        // One writer, loaded: every protected kind is static + API; Off has none.
        let mut rows = protected(&p);
        let st = static_protection(
            &mut rows,
            &[record("cp-1", "sha256:a", &full)],
            Some(&server),
            &mut problems,
        )
        .unwrap();
        assert!(st.writers[0].loaded);
        for row in &rows {
            let want = (row.mode != Mode::Off).then_some(Served::StaticAndApi);
            assert_eq!(row.served, want, "{}", row.kind);
        }
        assert!(problems.is_empty(), "{problems:?}");

        // Its API objects gone: static alone.
        let mut rows = protected(&p);
        for row in rows.iter_mut().filter(|r| r.served.is_some()) {
            row.served = Some(Served::Unguarded);
        }
        static_protection(
            &mut rows,
            &[record("cp-1", "sha256:a", &full)],
            Some(&server),
            &mut problems,
        );
        assert!(
            rows.iter()
                .filter(|r| r.mode != Mode::Off)
                .all(|r| r.served == Some(Served::Static))
        );

        // A second writer whose file lacks kinds: those kinds say so.
        let mut rows = protected(&p);
        static_protection(
            &mut rows,
            &[
                record("cp-1", "sha256:a", &full),
                record("cp-2", "sha256:b", &partial),
            ],
            Some(&server),
            &mut problems,
        );
        assert!(
            rows.iter()
                .any(|r| r.served == Some(Served::NotInStaticFile))
        );
        assert!(
            problems
                .iter()
                .any(|p| p.contains("not in the static file of cp-2")),
            "{problems:?}"
        );

        // Written but not loaded: stale, and the gate named when it is off.
        let mut rows = protected(&p);
        let mut problems = Vec::new();
        let off = ServerReport {
            gate_enabled: Some(false),
            loaded_hash: None,
            failed_reloads: 2,
        };
        static_protection(
            &mut rows,
            &[record("cp-1", "sha256:a", &full)],
            Some(&off),
            &mut problems,
        );
        assert!(
            rows.iter()
                .filter(|r| r.mode != Mode::Off)
                .all(|r| r.served == Some(Served::StaticStale))
        );
        assert!(problems[0].contains("has not loaded"), "{problems:?}");
        assert!(problems[0].contains("2 failed"), "{problems:?}");
        assert!(problems[0].contains("feature gate"), "{problems:?}");
    }

    #[test]
    fn the_exit_code_says_unguarded_before_no_controller() {
        use crate::cluster::running::Running;
        let r = resolution(Mode::Refuse);
        let p = plan(&r, &CompileSettings::default(), BTreeSet::new());
        let running = |live: bool| Running {
            namespace: "cascade-guard-system".into(),
            lease: "cascade-guard".into(),
            holder: "pod-a".into(),
            renewed_seconds_ago: if live { 1 } else { 600 },
            live,
            leader_election: true,
            settings: None,
        };
        let report = |in_sync: bool, controller: Option<Running>| Report {
            xrd_default_mode: Mode::Refuse,
            protected: protected(&p),
            admission: AdmissionSync {
                in_sync,
                wanted: 4,
                differences: Vec::new(),
            },
            cascading: Vec::new(),
            problems: Vec::new(),
            static_protection: None,
            controller,
            settings_from: SettingsFrom::Flags,
            sibling_holds: Vec::new(),
            sibling_trees: None,
        };
        assert_eq!(report(true, Some(running(true))).exit_code(), 0);
        assert_eq!(
            report(false, Some(running(true))).exit_code(),
            UNGUARDED_EXIT
        );
        assert_eq!(
            report(true, Some(running(false))).exit_code(),
            NO_CONTROLLER_EXIT
        );
        assert_eq!(report(true, None).exit_code(), NO_CONTROLLER_EXIT);
        assert_eq!(report(false, None).exit_code(), UNGUARDED_EXIT);
        let mut unguarded = report(true, Some(running(true)));
        unguarded.protected[0].served = Some(Served::Unguarded);
        assert_eq!(unguarded.exit_code(), UNGUARDED_EXIT);
    }
}
