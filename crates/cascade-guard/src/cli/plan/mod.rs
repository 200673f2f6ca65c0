//! `cascade-guard plan <resource> <name>`: what a delete of this object
//! would do now, with today's policies, before anyone deletes it. It reads
//! the tree (the object and what it composes, recursively), what the tree's
//! objects reference (ProviderConfigs, their credentials Secrets, connection
//! Secrets, provider-kubernetes Object references, the
//! `cascade-guard.dev/needs` annotation) and the Usages that name them, and
//! hands them to the pure [`graph`](crate::policy::sibling::graph) graph: the waves in
//! which the objects can leave, the edges each wave waits on, and every
//! hazard of the delete that today's mode makes. [`text`] prints it;
//! [`dot`] and [`mermaid`] draw it (Graphviz, Mermaid) from the one
//! language-free [`picture`] of it.

pub mod command;
pub mod dot;
pub mod mermaid;
pub mod picture;
#[cfg(test)]
mod test_tree;
pub mod text;

use kube::api::DynamicObject;
use kube::core::{Selector, SelectorExt};
use kube::{Client, ResourceExt};
use serde::Serialize;

use crate::cluster::inputs::read_once;
use crate::cluster::kinds::{LookupError, Served, ServedKinds};
use crate::cluster::tree::{Listed, read_tree};
use crate::policy::sibling::graph::{self, Graph};
use crate::policy::sibling::hazards::{Hazard, Teardown};
use crate::policy::sibling::object::ObjectRef;
use crate::policy::{Mode, Policy, resolve};

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Lookup(#[from] LookupError),
    #[error("cannot read the policies to find {kind}'s mode ({source}); name the mode with --mode")]
    Policies {
        kind: String,
        #[source]
        source: crate::Error,
    },
    #[error("the object has no uid; it cannot be the root of a plan")]
    NoUid,
}

pub struct Options {
    /// The root's resource: plural, singular or kind, optionally `.group`.
    pub resource: String,
    pub name: String,
    /// The namespace of a namespaced root (the kubeconfig context's, else
    /// `default`, as kubectl does: resolved by the caller).
    pub namespace: String,
    /// Plan for this mode instead of the one today's policies give.
    pub mode: Option<Mode>,
    /// The controller's `--xrd-default-mode`, to resolve today's policies;
    /// None: the one the running controller publishes (the chart runs it in
    /// Warn unless told otherwise), else the controller's own default.
    pub xrd_default_mode: Option<Mode>,
    /// The controller's Lease (its `--leader-election-id`), looked for in
    /// every namespace: whether it runs, and where its ConfigMap is.
    pub leader_election_id: String,
}

/// Where the mode a plan assumes comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "from")]
pub enum ModeSource {
    /// `--mode`.
    Flag,
    /// A policy of today's (its source: `XRD x`, `CascadePolicy y`).
    Policy { source: String },
    /// No policy protects the kind, or its selector leaves the object out.
    Unprotected,
}

/// Everything `plan` found, as `-o json` prints it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub root: ObjectRef,
    pub mode: Mode,
    pub mode_source: ModeSource,
    /// Whether cascade-guard keeps this tree's siblings in order now: a
    /// controller runs with sibling order, its hold policy is in place, and
    /// it read this tree whole since its last change and holds what the order
    /// needs ([`not_ordered`](Self::not_ordered) empty).
    pub sibling_order: bool,
    /// Why it does not, each checked (Refuse and Convert only).
    pub not_ordered: Vec<String>,
    /// What a plain delete (kubectl's default) of the root does in that mode.
    pub teardown: Teardown,
    pub graph: Graph,
    /// What that teardown would break.
    pub hazards: Vec<Hazard>,
    /// What could not be read: objects the tree names that are gone or
    /// forbidden, a tree cut at its size limit.
    pub unread: Vec<String>,
}

/// What a plain delete does to a tree in each mode: Off and Warn let a
/// Background delete through; Refuse lets only a foreground cascade through,
/// and Convert makes every delete one; with sibling order enforced (the hold
/// policy in place), both keep the siblings' order too.
pub fn teardown_of(mode: Mode, sibling_order: bool) -> Teardown {
    match mode {
        Mode::Off | Mode::Warn => Teardown::Background,
        Mode::Refuse | Mode::Convert if sibling_order => Teardown::Ordered,
        Mode::Refuse | Mode::Convert => Teardown::Foreground,
    }
}

/// Why sibling order does not keep this root's tree in order now; empty
/// when it does. Each is checked, none assumed: a controller runs (its Lease
/// is live) with sibling order on, its hold policy is in the cluster, and its
/// record says the tree was ordered at the root's present generation.
async fn not_ordered(client: &Client, root: &DynamicObject, lease_id: &str) -> Vec<String> {
    use crate::policy::sibling::gate::{GateState, ORDERED_TREES, decode_marks};
    use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;

    let mut why = Vec::new();
    let leases = match crate::cluster::running::find(client, lease_id).await {
        Ok(leases) => leases,
        Err(e) => {
            why.push(format!(
                "cannot tell whether a controller runs: cannot list the Leases named {lease_id}: {e}"
            ));
            Vec::new()
        }
    };
    let live = leases.iter().find(|r| r.live);
    match live {
        None if !leases.is_empty() => why.push(format!(
            "no controller runs: the Lease {}/{lease_id} is not renewed (last {}s ago); deletes of trees it has not ordered are refused, and what it holds waits for it",
            leases[0].namespace, leases[0].renewed_seconds_ago
        )),
        None if why.is_empty() => why.push(format!(
            "no controller runs: no Lease named {lease_id} in any namespace (is cascade-guard installed? --leader-election-id)"
        )),
        Some(r) if r.settings.as_ref().is_some_and(|s| !s.sibling_order) => why.push(format!(
            "the {} runs with --sibling-order off",
            r.describe()
        )),
        _ => {}
    }
    match kube::Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .get_opt(crate::policy::sibling::hold_policy::HOLD_OBJECT_NAME)
        .await
    {
        Ok(Some(_)) => {}
        Ok(None) => why.push(format!(
            "the hold policy {} is not in the cluster",
            crate::policy::sibling::hold_policy::HOLD_OBJECT_NAME
        )),
        Err(e) => why.push(format!(
            "cannot read the hold policy {}: {e}",
            crate::policy::sibling::hold_policy::HOLD_OBJECT_NAME
        )),
    }
    // The controller's namespace: the live Lease's, else the last one's.
    let Some(namespace) = live.or(leases.first()).map(|r| r.namespace.clone()) else {
        return why;
    };
    let uid = root.uid().unwrap_or_default();
    let generation = root.metadata.generation.unwrap_or(0);
    match kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &namespace)
        .get_opt(ORDERED_TREES)
        .await
    {
        Ok(found) => {
            let marks = decode_marks(&found.and_then(|c| c.data).unwrap_or_default());
            let state = GateState::of(marks.get(&uid).map(String::as_str), generation);
            if state != GateState::Ordered {
                why.push(state.to_string());
            }
        }
        Err(e) => why.push(format!(
            "cannot tell whether the controller read this tree: cannot read the ConfigMap {namespace}/{ORDERED_TREES}: {e}"
        )),
    }
    why
}

pub async fn plan(client: &Client, options: &Options) -> Result<Plan, PlanError> {
    let kinds = ServedKinds::discover(client)
        .await
        .map_err(LookupError::Discovery)?;
    let root_served = kinds
        .lookup(client, &options.resource)
        .await
        .cloned()
        .ok_or_else(|| LookupError::UnknownResource(options.resource.clone()))?;
    let namespace = root_served.1.then_some(options.namespace.as_str());
    let root = ServedKinds::api(client, &root_served, namespace)
        .get_opt(&options.name)
        .await
        .map_err(|source| LookupError::Read {
            what: format!("{} {}", root_served.0.kind, options.name),
            source,
        })?
        .ok_or_else(|| LookupError::NotFound {
            resource: options.resource.clone(),
            name: options.name.clone(),
            namespace: namespace.map(str::to_string),
        })?;
    let root_uid = root.uid().ok_or(PlanError::NoUid)?;
    let mode = async {
        match options.mode {
            Some(mode) => Ok((mode, ModeSource::Flag)),
            None => {
                let xrd_default_mode = match options.xrd_default_mode {
                    Some(mode) => mode,
                    None => running_xrd_default_mode(client, &options.leader_election_id).await,
                };
                mode_today(client, &root_served, &root, xrd_default_mode).await
            }
        }
    };
    let read = async {
        let listed = Listed::list(client, &kinds).await;
        read_tree(client, &kinds, &root, &listed, &Default::default()).await
    };
    // All three at once: each waits on the API server. Whether sibling
    // order is in force is asked before the mode is known, and used only
    // in Refuse and Convert.
    let (mode, read, why_not) = tokio::join!(
        mode,
        read,
        not_ordered(client, &root, &options.leader_election_id)
    );
    let (mode, mode_source) = mode?;
    let graph = graph::graph(&read.objects, &root_uid).map_err(|_| PlanError::NoUid)?;
    let not_ordered = match mode {
        Mode::Refuse | Mode::Convert => why_not,
        Mode::Off | Mode::Warn => Vec::new(),
    };
    let sibling_order = not_ordered.is_empty();
    let teardown = teardown_of(mode, sibling_order);
    let hazards = graph.hazards(teardown);
    Ok(Plan {
        root: graph.root.clone(),
        mode,
        mode_source,
        sibling_order,
        not_ordered,
        teardown,
        graph,
        hazards,
        // Not seen for want of a grant: for a person, as good as not read.
        unread: read.unread.into_iter().chain(read.unlisted).collect(),
    })
}

impl Plan {
    /// The mode the plan assumes and where it comes from, as the text and
    /// the pictures head it: `Convert (XRD x)`, `Off (--mode)`.
    pub fn mode_said(&self) -> String {
        match &self.mode_source {
            ModeSource::Flag => format!("{} (--mode)", self.mode),
            ModeSource::Policy { source } => format!("{} ({source})", self.mode),
            ModeSource::Unprotected => "not protected".to_string(),
        }
    }

    /// A delete now is not shown safe: a hazard, a tree read only in part
    /// (what was not read may need an order), or, in Refuse and Convert,
    /// sibling order not in force for this tree.
    pub fn unsafe_now(&self) -> bool {
        !self.hazards.is_empty() || !self.unread.is_empty() || !self.not_ordered.is_empty()
    }
}

/// The `--xrd-default-mode` of the controller that runs (its Lease's
/// settings: the live one's, else the last one's); Refuse, the controller's
/// own default, when none has published any.
async fn running_xrd_default_mode(client: &Client, lease_id: &str) -> Mode {
    crate::cluster::running::find(client, lease_id)
        .await
        .unwrap_or_default()
        .into_iter()
        .find_map(|r| r.settings)
        .map_or(Mode::Refuse, |s| s.xrd_default_mode)
}

/// The mode today's policies give the root: the policy of its kind whose
/// selector (if any) matches its labels; Off when none does.
async fn mode_today(
    client: &Client,
    (resource, _): &Served,
    root: &DynamicObject,
    xrd_default_mode: Mode,
) -> Result<(Mode, ModeSource), PlanError> {
    let read = read_once(client, xrd_default_mode)
        .await
        .map_err(|source| PlanError::Policies {
            kind: resource.kind.clone(),
            source,
        })?;
    let policies = resolve(&read.inputs).policies;
    let applies = |p: &&Policy| {
        p.kind.group == resource.group
            && p.kind.kind == resource.kind
            && p.selector.as_ref().is_none_or(|s| {
                Selector::try_from(s.clone()).is_ok_and(|s| s.matches(root.labels()))
            })
    };
    Ok(match policies.iter().find(applies) {
        Some(p) => (
            p.mode,
            ModeSource::Policy {
                source: p.source.to_string(),
            },
        ),
        None => (Mode::Off, ModeSource::Unprotected),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_delete_is_background_where_it_is_let_through_foreground_or_ordered_elsewhere() {
        let cases = [
            (Mode::Off, false, Teardown::Background),
            (Mode::Warn, false, Teardown::Background),
            (Mode::Refuse, false, Teardown::Foreground),
            (Mode::Convert, false, Teardown::Foreground),
            (Mode::Off, true, Teardown::Background),
            (Mode::Warn, true, Teardown::Background),
            (Mode::Refuse, true, Teardown::Ordered),
            (Mode::Convert, true, Teardown::Ordered),
        ];
        for (mode, ordered, want) in cases {
            assert_eq!(teardown_of(mode, ordered), want, "{mode} {ordered}");
        }
    }
}
