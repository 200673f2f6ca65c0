//! What `cascade-guard status` reads: the policies' inputs and
//! cascade-guard's admission objects (to compare), the protected objects
//! being deleted, the held ones of kinds no policy names, and the
//! controller's stall Events, and what static manifests writers published
//! against what the API server loaded.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client};
use serde::Serialize;
use serde_json::Value;

use super::report::{
    self, Cascading, Report, SettingsFrom, SiblingHold, SiblingTrees, admission_sync,
    cascading_objects, protected,
};
use crate::Error;
use crate::cluster::inputs::read_once;
use crate::cluster::{held, holds, running, served_resource, static_protection, type_check};
use crate::policy::last_good::LastGood;
use crate::policy::names::MANAGED_BY_SELECTOR;
use crate::policy::plan::{Known, Live};
use crate::policy::shown::Shown;
use crate::policy::sync::{Seen, pass};
use crate::policy::{CompileSettings, Mode, Policy, ProtectedKind, resolve};

/// The controller's flags that change what it compiles: status must be
/// given the same to compare.
#[derive(Clone, Debug, Default)]
pub struct ControllerFlags {
    pub xrd_default_mode: Mode,
    pub compile: CompileSettings,
}

/// Reads the cluster and reports. Fails only when the policies' inputs
/// cannot be read; anything else that cannot be read becomes a problem line.
pub async fn status(
    client: &Client,
    flags: &ControllerFlags,
    lease: &str,
    use_flags: bool,
) -> Result<Report, Error> {
    let mut problems = Vec::new();
    let controller = match running::find(client, lease).await {
        Ok(found) => found.into_iter().next(),
        Err(e) => {
            problems.push(format!(
                "cannot read the controller's Lease {lease:?}, so whether it runs is not known: {e}"
            ));
            None
        }
    };
    let (owned, settings_from) = settings_in_force(controller.as_ref(), flags, use_flags);
    let settings = &owned;
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
    let managed = ListParams::default().labels(MANAGED_BY_SELECTOR);
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
    // The controller's pass, on what it would read. What the controller
    // could read completely, read the same way; as the controller does after
    // a restart, a CascadePolicy that now names an unknown kind keeps what
    // its admission objects say.
    let live = Live::from_lists(&live_policies, &live_bindings);
    let seen = Seen {
        known: Known {
            xrds: true,
            cascade_policies: read.kinds_complete,
        },
        live: &live,
        live_complete: true,
    };
    let pass = pass(
        resolve(&read.inputs),
        &settings.compile,
        seen,
        &mut LastGood::default(),
        |name| live.policies.get(name).cloned(),
    );
    let resolution = &pass.resolution;
    problems.extend(resolution.problems.iter().map(ToString::to_string));
    type_check_problems(client, &typed_policies, &mut problems).await;
    let admission = admission_sync(&pass, &live);

    let (cascading, sibling_trees) = being_deleted(
        client,
        &resolution.policies,
        controller.as_ref(),
        &mut problems,
    )
    .await;

    let mut protected = protected(&pass.plan);
    report::mark_missing_api_objects(&mut protected, &admission);
    let static_protection = match static_protection::records(client).await {
        Ok(records) if records.is_empty() => None,
        Ok(records) => {
            let server = static_protection::read_server_report(client).await.ok();
            report::static_protection(&mut protected, &records, server.as_ref(), &mut problems)
        }
        Err(e) => {
            problems.push(format!(
                "cannot read the static manifests records, so static protection is not shown: {e}"
            ));
            None
        }
    };
    let sibling_holds = sibling_holds(client, controller.as_ref(), &mut problems).await;
    Ok(Report {
        xrd_default_mode: settings.xrd_default_mode,
        protected,
        admission,
        cascading,
        problems,
        static_protection,
        controller,
        settings_from,
        sibling_holds,
        sibling_trees,
    })
}

/// What the API server's type check found wrong with the live policies,
/// sibling order's hold policy and gate included (labelled apart): one
/// that does not type-check holds nothing, or refuses every delete it
/// sees.
async fn type_check_problems(
    client: &Client,
    typed_policies: &[ValidatingAdmissionPolicy],
    problems: &mut Vec<String>,
) {
    problems.extend(type_check::problems(typed_policies));
    let sibling_order = ListParams::default().labels(&format!(
        "{}=true",
        crate::policy::sibling::hold_policy::SIBLING_ORDER_LABEL
    ));
    match Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .list(&sibling_order)
        .await
    {
        Ok(found) => problems.extend(type_check::problems(&found.items)),
        Err(e) => problems.push(format!(
            "cannot read sibling order's admission policies: {e}"
        )),
    }
}

/// The settings status compiles with: the running controller's, unless
/// told to use the flags (or no controller published its own).
fn settings_in_force(
    controller: Option<&running::Running>,
    flags: &ControllerFlags,
    use_flags: bool,
) -> (ControllerFlags, SettingsFrom) {
    let published = controller
        .filter(|_| !use_flags)
        .and_then(|c| c.settings.clone());
    match published {
        Some(s) => (
            ControllerFlags {
                xrd_default_mode: s.xrd_default_mode,
                compile: s.compile(),
            },
            SettingsFrom::Controller,
        ),
        None => (flags.clone(), SettingsFrom::Flags),
    }
}

/// The protected objects being deleted, longest first: of the kinds the
/// policies name, and held ones of kinds no policy names (they lost it while
/// the controller was down: the controller finishes them when it starts);
/// with the trees sibling order ordered, when it runs.
async fn being_deleted(
    client: &Client,
    policies: &[Policy],
    controller: Option<&running::Running>,
    problems: &mut Vec<String>,
) -> (Vec<Cascading>, Option<SiblingTrees>) {
    let now = Timestamp::now();
    let mut cascading = Vec::new();
    let kinds = distinct_kinds(policies);
    let marks = ordered_trees(client, controller, problems).await;
    let mut sibling_trees = marks.as_ref().map(|_| SiblingTrees::default());
    for kind in &kinds {
        match deleting(client, kind).await {
            Ok(objects) => {
                cascading.extend(cascading_objects(&kind.to_string(), &objects, now));
                if let (Some(trees), Some(marks)) = (sibling_trees.as_mut(), marks.as_ref()) {
                    let roots = ordered_roots(policies, kind, &objects);
                    trees.add(&kind.kind, &roots, marks);
                }
            }
            Err(e) => problems.push(format!("cannot list objects of {kind}: {e}")),
        }
    }
    match held::scan(client, held::Depth::Every).await {
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
    (cascading, sibling_trees)
}

/// What sibling order holds: its ConfigMap, in the controller's namespace.
async fn sibling_holds(
    client: &Client,
    controller: Option<&running::Running>,
    problems: &mut Vec<String>,
) -> Vec<SiblingHold> {
    match controller {
        None => Vec::new(),
        Some(c) => match holds::read(client, &c.namespace).await {
            Ok(held) => held
                .into_iter()
                .map(|(object, entry)| SiblingHold {
                    kind: object.kind,
                    namespace: object.namespace,
                    name: object.name,
                    waits_for: if entry.held_for.is_empty() {
                        "(not said)".to_string()
                    } else {
                        Shown(&entry.held_for).to_string()
                    },
                })
                .collect(),
            Err(e) => {
                problems.push(format!(
                    "cannot read what sibling order holds (ConfigMap {}/{}): {e}",
                    c.namespace,
                    crate::policy::sibling::holds_record::HOLDS
                ));
                Vec::new()
            }
        },
    }
}

/// How sibling order last read each tree (its record, decoded), when a
/// controller ran or runs with sibling order on; what it ordered stays in
/// force while it is down.
async fn ordered_trees(
    client: &Client,
    controller: Option<&running::Running>,
    problems: &mut Vec<String>,
) -> Option<BTreeMap<String, String>> {
    use crate::policy::sibling::gate::{ORDERED_TREES, decode_marks};
    let c = controller.filter(|c| c.settings.as_ref().is_none_or(|s| s.sibling_order))?;
    match Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &c.namespace)
        .get_opt(ORDERED_TREES)
        .await
    {
        Ok(found) => Some(decode_marks(
            &found.and_then(|r| r.data).unwrap_or_default(),
        )),
        Err(e) => {
            problems.push(format!(
                "cannot read which trees sibling order ordered (ConfigMap {}/{ORDERED_TREES}): {e}",
                c.namespace
            ));
            None
        }
    }
}

/// The objects of `kind` that a Refuse or Convert policy selects: the roots
/// among them are what sibling order orders.
fn ordered_roots(
    policies: &[Policy],
    kind: &ProtectedKind,
    objects: &[ObjectMeta],
) -> Vec<ObjectMeta> {
    use kube::core::{Selector, SelectorExt};
    let selectors: Vec<Selector> = policies
        .iter()
        .filter(|p| p.kind.same_kind(&kind.group, &kind.kind))
        .filter(|p| matches!(p.mode, Mode::Refuse | Mode::Convert))
        .map(|p| {
            p.selector
                .clone()
                .and_then(|s| Selector::try_from(s).ok())
                .unwrap_or_default()
        })
        .collect();
    objects
        .iter()
        .filter(|m| {
            let labels = m.labels.clone().unwrap_or_default();
            selectors
                .iter()
                .any(|s| s.selects_all() || s.matches(&labels))
        })
        .cloned()
        .collect()
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
