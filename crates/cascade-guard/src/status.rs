//! `cascade-guard status`: what is protected and where each policy comes from,
//! whether the admission objects in the cluster are the ones the policies
//! compile to, and which protected objects are being deleted right now.
//!
//! One-shot reads, like `cascade-guard uninstall`; everything that can be pure
//! (the comparison, the cascading list, the text) is, and is tested below. It
//! compiles with the settings it is given, which must be the controller's
//! (`--xrd-default-mode` and the garbage-collector users): it cannot see the
//! controller's flags, and says so when a difference looks like a different
//! default mode.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client};
use serde::Serialize;
use serde_json::Value;

use crate::Error;
use crate::controller::convert::served_resource;
use crate::controller::read_once;
use crate::policy::last_good::{LastGood, keep_last_good, recall};
use crate::policy::names::{
    FOREGROUND_CASCADE_FINALIZER, FOREGROUND_DELETION_FINALIZER, MANAGED_BY_LABEL,
    MANAGED_BY_VALUE, MODE_ANNOTATION,
};
use crate::policy::plan::{self, Known, Live, Plan, plan};
use crate::policy::selector::query_string;
use crate::policy::{CompileSettings, Mode, Policy, ProtectedKind, Source, object_name, resolve};

/// What the controller compiles with; status must use the same to compare.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    pub xrd_default_mode: Mode,
    pub compile: CompileSettings,
}

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
    pub differences: Vec<Difference>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Difference {
    pub state: Drift,
    pub kind: &'static str,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Drift {
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

/// Reads the cluster and reports. Fails only when the policies' inputs
/// cannot be read; anything else that cannot be read becomes a problem line.
pub async fn status(client: &Client, settings: &Settings) -> Result<Report, Error> {
    let mut problems = Vec::new();
    let read = read_once(client, settings.xrd_default_mode).await?;
    if !read.cascade_policy_crd {
        problems.push("the CascadePolicy CRD is not installed".to_string());
    }
    if !read.kinds_complete {
        problems.push(
            "some API groups CascadePolicies name could not be discovered; their policies may be missing below"
                .to_string(),
        );
    }
    let managed = ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"));
    let typed_policies = Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .list(&managed)
        .await
        .map_err(list("ValidatingAdmissionPolicies"))?
        .items;
    let live_policies = values(&typed_policies);
    let live_bindings = values(
        &Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .list(&managed)
            .await
            .map_err(list("ValidatingAdmissionPolicyBindings"))?
            .items,
    );
    // As the controller does after a restart: a CascadePolicy that now names
    // an unknown kind keeps what its admission objects say.
    let named = |live: &[Value], name: &str| {
        live.iter()
            .find(|v| v.pointer("/metadata/name").and_then(Value::as_str) == Some(name))
            .cloned()
    };
    let (resolution, kept) = keep_last_good(
        resolve(&read.inputs),
        &mut LastGood::default(),
        read.kinds_complete,
        |name| {
            let object = object_name(&Source::CascadePolicy {
                name: name.to_string(),
            });
            recall(name, &named(&live_policies, &object)?)
        },
    );
    problems.extend(resolution.problems.iter().map(ToString::to_string));
    // What the API server's type check found wrong with the live policies.
    problems.extend(crate::controller::type_check::problems(&typed_policies));
    let plan = plan(&resolution, &settings.compile, kept);
    // What the controller could read completely, read the same way.
    let known = Known {
        xrds: true,
        cascade_policies: read.kinds_complete,
    };
    let admission = admission_sync(
        &plan,
        &Live::from_lists(&live_policies, &live_bindings),
        known,
    );

    let now = Timestamp::now();
    let mut cascading = Vec::new();
    let kinds = distinct_kinds(&resolution.policies);
    for kind in &kinds {
        match deleting(client, kind).await {
            Ok(objects) => cascading.extend(cascading_objects(&kind.to_string(), &objects, now)),
            Err(e) => problems.push(format!("cannot list objects of {kind}: {e}")),
        }
    }
    // Held objects of kinds no policy names (they lost it while the
    // controller was down): the controller finishes them when it starts.
    match crate::controller::held::scan(client, crate::controller::held::Depth::Every).await {
        Ok(scan) => {
            for holding in scan.holding {
                let kind = &holding.kind;
                if kinds.iter().any(|k| k.same_kind(&kind.group, &kind.kind)) {
                    continue;
                }
                problems.push(format!(
                    "{} object(s) of {kind} carry cascade-guard's finalizer, but no policy names the kind: the controller lets them go, or finishes their cascade, when it starts",
                    holding.objects.len()
                ));
                match deleting(client, kind).await {
                    Ok(objects) => {
                        cascading.extend(cascading_objects(&kind.to_string(), &objects, now))
                    }
                    Err(e) => problems.push(format!("cannot list objects of {kind}: {e}")),
                }
            }
            problems.extend(
                scan.unreadable
                    .iter()
                    .map(|u| format!("cannot tell whether cascade-guard holds objects of {u}")),
            );
        }
        Err(e) => problems.push(format!(
            "cannot look for held objects of kinds no policy names: {e}"
        )),
    }
    match stalled_cascades(client).await {
        Ok(stalled) => {
            for c in &mut cascading {
                c.stalled = stalled.get(&c.uid).cloned();
            }
        }
        Err(e) => problems.push(format!(
            "cannot read the controller's CascadeStalled events: {e}"
        )),
    }
    cascading.sort_by(|a, b| {
        b.age_seconds
            .cmp(&a.age_seconds)
            .then_with(|| (&a.kind, &a.namespace, &a.name).cmp(&(&b.kind, &b.namespace, &b.name)))
    });

    Ok(Report {
        xrd_default_mode: settings.xrd_default_mode,
        protected: protected(&plan),
        admission,
        cascading,
        problems,
    })
}

fn list(what: &'static str) -> impl Fn(kube::Error) -> Error {
    move |source| Error::List { what, source }
}

fn values<T: Serialize>(items: &[T]) -> Vec<Value> {
    items
        .iter()
        .filter_map(|i| serde_json::to_value(i).ok())
        .collect()
}

/// The metadata of every object of the kind (the API has no field selector
/// for a deletionTimestamp, so all of them are listed and filtered here).
async fn deleting(client: &Client, kind: &ProtectedKind) -> Result<Vec<ObjectMeta>, kube::Error> {
    let resource = served_resource(client, kind).await?;
    let objects = Api::<DynamicObject>::all_with(client.clone(), &resource)
        .list_metadata(&ListParams::default())
        .await?;
    Ok(objects.items.into_iter().map(|o| o.metadata).collect())
}

/// The objects whose latest stall Event is `CascadeStalled` (not a later
/// `CascadeResumed`), by UID, with what the Event said.
async fn stalled_cascades(
    client: &Client,
) -> Result<std::collections::BTreeMap<String, String>, kube::Error> {
    use k8s_openapi::api::core::v1::Event;
    let events: Api<Event> = Api::all(client.clone());
    let mut latest: std::collections::BTreeMap<String, (Timestamp, bool, String)> =
        Default::default();
    for reason in ["CascadeStalled", "CascadeResumed"] {
        let found = events
            .list(&ListParams::default().fields(&format!("reason={reason}")))
            .await?;
        for e in found.items {
            let Some(uid) = e.involved_object.uid.clone() else {
                continue;
            };
            let at = [
                e.series
                    .as_ref()
                    .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0)),
                e.event_time.as_ref().map(|t| t.0),
                e.last_timestamp.as_ref().map(|t| t.0),
            ]
            .into_iter()
            .flatten()
            .max();
            let Some(at) = at else { continue };
            let stalled = reason == "CascadeStalled";
            let note = e.message.clone().unwrap_or_default();
            let newer = latest.get(&uid).is_none_or(|(seen, _, _)| at >= *seen);
            if newer {
                latest.insert(uid, (at, stalled, note));
            }
        }
    }
    Ok(latest
        .into_iter()
        .filter(|(_, (_, stalled, _))| *stalled)
        .map(|(uid, (_, _, note))| (uid, note))
        .collect())
}

/// Each kind once: several policies may name the same kind.
fn distinct_kinds(policies: &[Policy]) -> Vec<ProtectedKind> {
    let mut kinds = BTreeMap::new();
    for p in policies {
        kinds
            .entry((p.kind.group.clone(), p.kind.kind.clone()))
            .or_insert_with(|| p.kind.clone());
    }
    kinds.into_values().collect()
}

/// One row per policy.
pub fn protected(plan: &Plan) -> Vec<Protected> {
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
            }
        })
        .collect()
}

/// The plan's diff against the managed admission objects in the cluster,
/// for people: the same diff the controller writes from.
pub fn admission_sync(plan: &Plan, live: &Live, known: Known) -> AdmissionSync {
    let differences: Vec<Difference> = plan::diff(plan, live, known)
        .into_iter()
        .map(|d| {
            let kind = d.kind.as_str();
            let (state, detail) = match d.drift {
                plan::Drift::Missing => (Drift::Missing, guards(plan, &d.name)),
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
                    (Drift::Differs, Some(detail))
                }
                plan::Drift::Extra { removable: true } => {
                    let live = match d.kind {
                        plan::ObjectKind::Policy => live.policies.get(&d.name),
                        plan::ObjectKind::Binding => live.bindings.get(&d.name),
                    };
                    let detail = live
                        .and_then(|l| other_mode_detail(plan, l))
                        .unwrap_or_else(|| "no policy compiles to it".to_string());
                    (Drift::Extra, Some(detail))
                }
                plan::Drift::Extra { removable: false } => (
                    Drift::Extra,
                    Some(
                        "no policy compiles to it; the controller keeps it while the input it came from cannot be read completely"
                            .to_string(),
                    ),
                ),
            };
            Difference {
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
    let carried: BTreeMap<String, Value> = serde_json::from_str(
        annotations
            .get(crate::policy::names::PROTECTED_KINDS_ANNOTATION)?
            .as_str()?,
    )
    .ok()?;
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
pub fn cascading_objects(kind: &str, objects: &[ObjectMeta], now: Timestamp) -> Vec<Cascading> {
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

/// `45s`, `3m12s`, `2h5m`, `3d4h`, as kubectl prints ages.
pub fn age(seconds: u64) -> String {
    let (d, h, m, s) = (
        seconds / 86_400,
        seconds / 3_600 % 24,
        seconds / 60 % 60,
        seconds % 60,
    );
    if d > 0 {
        format!("{d}d{h}h")
    } else if h > 0 {
        format!("{h}h{m}m")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// The report for people.
pub fn render_text(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "PROTECTED ({})", report.protected.len());
    if report.protected.is_empty() {
        let _ = writeln!(out, "  nothing: no XRDs and no CascadePolicies");
    } else {
        let mut rows = vec![vec![
            "KIND".to_string(),
            "MODE".to_string(),
            "SOURCE".to_string(),
        ]];
        for p in &report.protected {
            let source = match p.source {
                SourceKind::XrdAnnotation => format!("XRD annotation ({})", p.from),
                SourceKind::Default => format!(
                    "default, --xrd-default-mode={} ({})",
                    report.xrd_default_mode, p.from
                ),
                SourceKind::CascadePolicy => format!("CascadePolicy {}", p.from),
            };
            let kind = match &p.selector {
                Some(s) => format!("{} [{s}]", p.kind),
                None => p.kind.clone(),
            };
            rows.push(vec![kind, p.mode.to_string(), source]);
        }
        table(&mut out, &rows);
    }

    let sync = &report.admission;
    if sync.in_sync {
        let _ = writeln!(
            out,
            "\nADMISSION POLICIES: in sync ({} objects)",
            sync.wanted
        );
    } else {
        let _ = writeln!(
            out,
            "\nADMISSION POLICIES: out of sync ({} of {} wanted objects missing or different, {} extra)",
            sync.differences
                .iter()
                .filter(|d| d.state != Drift::Extra)
                .count(),
            sync.wanted,
            sync.differences
                .iter()
                .filter(|d| d.state == Drift::Extra)
                .count(),
        );
        let mut rows = vec![vec![
            "STATE".to_string(),
            "KIND".to_string(),
            "NAME".to_string(),
            "DETAIL".to_string(),
        ]];
        for d in &sync.differences {
            rows.push(vec![
                format!("{:?}", d.state).to_lowercase(),
                d.kind.to_string(),
                d.name.clone(),
                d.detail.clone().unwrap_or_default(),
            ]);
        }
        table(&mut out, &rows);
        let _ = writeln!(
            out,
            "  The controller (its leader) puts them right within a second; if it does not, check that it runs and its log."
        );
    }

    if report.cascading.is_empty() {
        let _ = writeln!(out, "\nCASCADING: no protected object is being deleted");
    } else {
        let _ = writeln!(out, "\nCASCADING ({})", report.cascading.len());
        let mut rows = vec![vec![
            "KIND".to_string(),
            "OBJECT".to_string(),
            "AGE".to_string(),
            "STATE".to_string(),
            "FINALIZERS".to_string(),
        ]];
        for c in &report.cascading {
            let object = match &c.namespace {
                Some(ns) => format!("{ns}/{}", c.name),
                None => c.name.clone(),
            };
            let state = match &c.stalled {
                Some(_) => format!("STALLED: {}", c.state()),
                None => c.state().to_string(),
            };
            rows.push(vec![
                c.kind.clone(),
                object,
                age(c.age_seconds),
                state,
                c.finalizers.join(","),
            ]);
        }
        table(&mut out, &rows);
        for c in &report.cascading {
            if let Some(note) = &c.stalled {
                let _ = writeln!(out, "  {} {} stalled: {note}", c.kind, c.name);
            }
        }
    }

    if !report.problems.is_empty() {
        let _ = writeln!(out, "\nPROBLEMS ({})", report.problems.len());
        for p in &report.problems {
            let _ = writeln!(out, "  {p}");
        }
    }
    out
}

/// Left-aligned columns, two spaces apart, indented by two.
fn table(out: &mut String, rows: &[Vec<String>]) {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let mut line = String::from(" ");
        for (c, cell) in row.iter().enumerate() {
            let pad = widths[c].saturating_sub(cell.chars().count());
            let _ = write!(line, " {cell}{}", " ".repeat(pad));
            line.push(' ');
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    use crate::policy::Resolution;
    use crate::policy::names::DELETION_POLICY_ANNOTATION;
    use crate::policy::{CascadePolicyInput, Inputs, XrdInput};
    use crate::policy::{CrdInfo, Scope};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn xrd(plural: &str, kind: &str, annotation: Option<&str>) -> XrdInput {
        let mut v = json!({
            "apiVersion": "apiextensions.crossplane.io/v2",
            "kind": "CompositeResourceDefinition",
            "metadata": {"name": format!("{plural}.example.org")},
            "spec": {"group": "example.org", "names": {"kind": kind, "plural": plural},
                "scope": "Namespaced", "versions": [{"name": "v1", "served": true}]}
        });
        if let Some(a) = annotation {
            v["metadata"]["annotations"] = json!({ DELETION_POLICY_ANNOTATION: a });
        }
        XrdInput::from_value(&v)
    }

    fn resolution(default: Mode) -> Resolution {
        resolve(&Inputs {
            xrds: vec![
                xrd("clusters", "Cluster", Some("Convert")),
                xrd("networks", "Network", None),
                xrd("quiet", "Quiet", Some("Off")),
            ],
            cascade_policies: vec![CascadePolicyInput {
                name: "releases".into(),
                group: "helm.example.org".into(),
                kind: "Release".into(),
                mode: Mode::Refuse,
                selector: Some(LabelSelector {
                    match_labels: Some([("team".to_string(), "a".to_string())].into()),
                    ..LabelSelector::default()
                }),
            }],
            crds: vec![CrdInfo {
                group: "helm.example.org".into(),
                kind: "Release".into(),
                plural: "releases".into(),
                scope: Scope::Cluster,
            }],
            xrd_default_mode: default,
            undiscovered_groups: Default::default(),
        })
    }

    /// The live objects exactly as the controller would have applied them,
    /// with what the API server adds.
    fn live(resolution: &Resolution) -> (Vec<Value>, Vec<Value>) {
        let settings = CompileSettings::default();
        let mut policies = Vec::new();
        let mut bindings = Vec::new();
        {
            for c in crate::policy::admission::compile_all(&resolution.policies, &settings) {
                let mut vap = serde_json::to_value(&c.policy).unwrap();
                vap["metadata"]["uid"] = json!("u1");
                vap["metadata"]["resourceVersion"] = json!("7");
                // Defaulted by the API server: fields the policy leaves out.
                vap["spec"]["matchConstraints"]["namespaceSelector"] = json!({});
                vap["spec"]["matchConstraints"]["objectSelector"] = json!({});
                vap["status"] = json!({"observedGeneration": 1});
                policies.push(vap);
                bindings.push(serde_json::to_value(&c.binding).unwrap());
            }
        }
        (policies, bindings)
    }

    /// status's comparison, with every input read.
    fn sync(r: &Resolution, policies: &[Value], bindings: &[Value]) -> AdmissionSync {
        let plan = plan(r, &CompileSettings::default(), BTreeSet::new());
        let known = Known {
            xrds: true,
            cascade_policies: true,
        };
        admission_sync(&plan, &Live::from_lists(policies, bindings), known)
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
        let got: Vec<(Drift, &str, &str, Option<&str>)> = sync
            .differences
            .iter()
            .map(|d| (d.state, d.kind, d.name.as_str(), d.detail.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    Drift::Missing,
                    "ValidatingAdmissionPolicyBinding",
                    "cascade-guard-xrds-convert-composite",
                    Some("unguarded until it is back: Cluster.example.org")
                ),
                (
                    Drift::Differs,
                    "ValidatingAdmissionPolicy",
                    "cascade-guard-policy-releases",
                    Some("spec.validations[0].expression differs")
                ),
                (
                    Drift::Extra,
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
        let got: Vec<(Drift, &str, Option<&str>)> = sync
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
                    Drift::Missing,
                    "cascade-guard-xrds-refuse-composite",
                    missing
                ),
                (
                    Drift::Missing,
                    "cascade-guard-xrds-refuse-composite",
                    missing
                ),
                (
                    Drift::Missing,
                    "cascade-guard-update-xrds-refuse-composite",
                    missing
                ),
                (
                    Drift::Missing,
                    "cascade-guard-update-xrds-refuse-composite",
                    missing
                ),
                (
                    Drift::Extra,
                    "cascade-guard-update-xrds-warn-composite",
                    hint
                ),
                (Drift::Extra, "cascade-guard-xrds-warn-composite", hint),
                (
                    Drift::Extra,
                    "cascade-guard-update-xrds-warn-composite",
                    hint
                ),
                (Drift::Extra, "cascade-guard-xrds-warn-composite", hint),
            ],
            "{sync:?}"
        );
    }

    fn meta(name: &str, deleting: Option<&str>, finalizers: &[&str]) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some("team-a".into()),
            deletion_timestamp: deleting.map(|t| Time(t.parse().unwrap())),
            finalizers: Some(finalizers.iter().map(|f| f.to_string()).collect()),
            ..ObjectMeta::default()
        }
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
    fn ages_read_like_kubectl() {
        let cases = [
            (0, "0s"),
            (45, "45s"),
            (192, "3m12s"),
            (7_500, "2h5m"),
            (273_600, "3d4h"),
        ];
        for (secs, want) in cases {
            assert_eq!(age(secs), want);
        }
    }

    #[test]
    fn text_report() {
        let r = resolution(Mode::Refuse);
        let (policies, bindings) = live(&r);
        let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let report = Report {
            xrd_default_mode: Mode::Refuse,
            protected: protected(&plan(&r, &CompileSettings::default(), BTreeSet::new())),
            admission: sync(&r, &policies, &bindings[1..]),
            cascading: cascading_objects(
                "Cluster.example.org",
                &[meta(
                    "prod",
                    Some("2026-01-01T11:58:00Z"),
                    &[FOREGROUND_DELETION_FINALIZER, FOREGROUND_CASCADE_FINALIZER],
                )],
                now,
            ),
            problems: vec!["warning: something".into()],
        };
        let text = render_text(&report);
        let expected = "\
PROTECTED (4)
  KIND                               MODE     SOURCE
  Cluster.example.org                Convert  XRD annotation (clusters.example.org)
  Network.example.org                Refuse   default, --xrd-default-mode=Refuse (networks.example.org)
  Quiet.example.org                  Off      XRD annotation (quiet.example.org)
  Release.helm.example.org [team=a]  Refuse   CascadePolicy releases

ADMISSION POLICIES: out of sync (1 of 12 wanted objects missing or different, 0 extra)
  STATE    KIND                              NAME                                  DETAIL
  missing  ValidatingAdmissionPolicyBinding  cascade-guard-xrds-convert-composite  unguarded until it is back: Cluster.example.org
  The controller (its leader) puts them right within a second; if it does not, check that it runs and its log.

CASCADING (1)
  KIND                 OBJECT       AGE   STATE                                      FINALIZERS
  Cluster.example.org  team-a/prod  2m0s  foreground cascade, held by cascade-guard  foregroundDeletion,cascade-guard.dev/foreground-cascade

PROBLEMS (1)
  warning: something
";
        assert_eq!(text, expected, "\n{text}");
        // And as JSON, for scripts.
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["admission"]["inSync"], false);
        assert_eq!(json["protected"][1]["source"], "Default");
        assert_eq!(json["cascading"][0]["held"], true);
        assert_eq!(json["cascading"][0]["ageSeconds"], 120);
    }
}
