//! `cascade-guard plan <resource> <name>`: what a delete of this object
//! would do now, with today's policies, before anyone deletes it. It reads
//! the tree (the object and what it composes, recursively), what the tree's
//! objects reference (ProviderConfigs, their credentials Secrets, connection
//! Secrets, provider-kubernetes Object references, the
//! `cascade-guard.dev/needs` annotation) and the Usages that name them, and
//! hands them to the pure [`order`](crate::policy::order) graph: the waves in
//! which the objects can leave, the edges each wave waits on, and every
//! hazard of the delete that today's mode makes. [`text`] prints it.

pub mod text;

use std::collections::{BTreeSet, HashSet, VecDeque};

use kube::api::{DynamicObject, ListParams};
use kube::core::{Selector, SelectorExt};
use kube::{Client, ResourceExt};
use serde::Serialize;
use serde_json::Value;

use crate::cluster::inputs::read_once;
use crate::cluster::kinds::{Served, ServedKinds};
use crate::policy::order::{self, Graph, Hazard, ObjectRef, Teardown};
use crate::policy::{Mode, Policy, composed_resources, resolve};

/// A tree larger than this is cut, and the plan says so: a composition does
/// not reach it, a loop in resourceRefs would.
const MAX_OBJECTS: usize = 5_000;
/// How many times references are followed from what was found the time
/// before (a Release's ProviderConfig, then its credentials Secret, then
/// that Secret's writer is three).
const REFERENCE_ROUNDS: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("cannot discover the cluster's API: {0}")]
    Discovery(#[source] kube::Error),
    #[error(
        "the cluster serves no resource called {0:?} (try its plural, e.g. inferenceclusters, or plural.group)"
    )]
    UnknownResource(String),
    #[error("{resource} {name} not found{}", namespace.as_deref().map(|n| format!(" in namespace {n}")).unwrap_or_default())]
    NotFound {
        resource: String,
        name: String,
        namespace: Option<String>,
    },
    #[error("cannot read {what}: {source}")]
    Read {
        what: String,
        #[source]
        source: kube::Error,
    },
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
    /// The controller's `--xrd-default-mode`, to resolve today's policies.
    pub xrd_default_mode: Mode,
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
/// and Convert makes every delete one.
pub fn teardown_of(mode: Mode) -> Teardown {
    match mode {
        Mode::Off | Mode::Warn => Teardown::Background,
        Mode::Refuse | Mode::Convert => Teardown::Foreground,
    }
}

pub async fn plan(client: &Client, options: &Options) -> Result<Plan, PlanError> {
    let kinds = ServedKinds::discover(client)
        .await
        .map_err(PlanError::Discovery)?;
    let root_served = kinds
        .find(&options.resource)
        .cloned()
        .ok_or_else(|| PlanError::UnknownResource(options.resource.clone()))?;
    let namespace = root_served.1.then_some(options.namespace.as_str());
    let root = ServedKinds::api(client, &root_served, namespace)
        .get_opt(&options.name)
        .await
        .map_err(|source| PlanError::Read {
            what: format!("{} {}", root_served.0.kind, options.name),
            source,
        })?
        .ok_or_else(|| PlanError::NotFound {
            resource: options.resource.clone(),
            name: options.name.clone(),
            namespace: namespace.map(str::to_string),
        })?;
    let root_uid = root.uid().ok_or(PlanError::NoUid)?;
    let (mode, mode_source) = match options.mode {
        Some(mode) => (mode, ModeSource::Flag),
        None => mode_today(client, &root_served, &root, options.xrd_default_mode).await?,
    };

    let mut reading = Reading::new(client, &kinds);
    reading.tree(&root);
    reading.expand().await;
    for _ in 0..REFERENCE_ROUNDS {
        if !reading.follow_references().await {
            break;
        }
    }
    reading.usages().await;

    let objects: Vec<Value> = reading.objects.into_iter().map(|(_, v)| v).collect();
    let graph = order::graph(&objects, &root_uid).map_err(|_| PlanError::NoUid)?;
    let teardown = teardown_of(mode);
    let hazards = graph.hazards(teardown);
    Ok(Plan {
        root: graph.root.clone(),
        mode,
        mode_source,
        teardown,
        graph,
        hazards,
        unread: reading.unread,
    })
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

/// An object as it is fetched: apiVersion, kind, namespace, name.
type Key = (String, String, Option<String>, String);

/// The objects read so far, each once, and the queue of those whose
/// composed resources are still to be read.
struct Reading<'a> {
    client: &'a Client,
    kinds: &'a ServedKinds,
    objects: Vec<(Key, Value)>,
    seen: HashSet<Key>,
    /// Group, kind, namespace and name of every object read: a reference
    /// names no version.
    refs: HashSet<ObjectRef>,
    queue: VecDeque<Key>,
    /// Objects whose references were followed.
    followed: usize,
    unread: Vec<String>,
    /// The tree reached [`MAX_OBJECTS`]: nothing more is taken.
    full: bool,
}

impl<'a> Reading<'a> {
    fn new(client: &'a Client, kinds: &'a ServedKinds) -> Self {
        Self {
            client,
            kinds,
            objects: Vec::new(),
            seen: HashSet::new(),
            refs: HashSet::new(),
            queue: VecDeque::new(),
            followed: 0,
            unread: Vec::new(),
            full: false,
        }
    }

    /// Takes in an object read, and queues what it composes.
    fn tree(&mut self, object: &DynamicObject) {
        let Some(key) = key_of(object) else { return };
        if !self.take(key.clone(), object) {
            return;
        }
        for c in composed_resources(&object.data, key.2.as_deref()).resources {
            let child = (c.api_version, c.kind, c.namespace, c.name);
            if !self.seen.contains(&child) {
                self.queue.push_back(child);
            }
        }
    }

    /// Records an object; false if it was already there or the plan is full.
    fn take(&mut self, key: Key, object: &DynamicObject) -> bool {
        if self.full || self.seen.contains(&key) {
            return false;
        }
        if self.objects.len() >= MAX_OBJECTS {
            self.unread.push(format!(
                "more than {MAX_OBJECTS} objects: the rest of the tree was not read"
            ));
            self.full = true;
            self.queue.clear();
            return false;
        }
        let value = serde_value(object);
        if let Some(r) = ObjectRef::of_object(&value) {
            self.refs.insert(r);
        }
        self.seen.insert(key.clone());
        self.objects.push((key, value));
        true
    }

    /// Reads every queued composed resource, and what they compose.
    async fn expand(&mut self) {
        while let Some(key) = self.queue.pop_front() {
            if self.seen.contains(&key) {
                continue;
            }
            let (api_version, kind, namespace, name) = &key;
            let Some(served) = self.kinds.get(api_version, kind).cloned() else {
                self.unread
                    .push(format!("{kind} {name}: {api_version} {kind} is not served"));
                continue;
            };
            match ServedKinds::api(self.client, &served, namespace.as_deref())
                .get_opt(name)
                .await
            {
                Ok(Some(object)) => self.tree(&object),
                Ok(None) => {}
                Err(e) => self.unread.push(format!("{kind} {name}: {e}")),
            }
        }
    }

    /// Reads what the objects read since the last round reference; true if
    /// anything new was found.
    async fn follow_references(&mut self) -> bool {
        let from = self.followed;
        self.followed = self.objects.len();
        let wanted: BTreeSet<order::Reference> = self.objects[from..]
            .iter()
            .flat_map(|(_, v)| order::references(v))
            .collect();
        let mut found = false;
        for r in wanted {
            let served: Vec<Served> = self
                .kinds
                .of_kind(r.group.as_deref(), &r.kind)
                .cloned()
                .collect();
            for s in served {
                let namespace = if s.1 { r.namespace.as_deref() } else { None };
                let known = ObjectRef::new(&s.0.group, &r.kind, namespace, &r.name);
                if self.refs.contains(&known) {
                    continue;
                }
                match ServedKinds::api(self.client, &s, namespace)
                    .get_opt(&r.name)
                    .await
                {
                    Ok(Some(object)) => {
                        if let Some(key) = key_of(&object) {
                            found |= self.take(key, &object);
                        }
                    }
                    Ok(None) => {}
                    // A reader without access to Secrets still gets a
                    // plan; the graph reports the reference unresolved.
                    Err(e) => self.unread.push(format!("{} {}: {e}", r.kind, r.name)),
                }
            }
        }
        found
    }

    /// Crossplane's Usages and ClusterUsages that name an object read.
    async fn usages(&mut self) {
        let kinds = self.kinds;
        let served: Vec<Served> = ["protection.crossplane.io", "apiextensions.crossplane.io"]
            .into_iter()
            .flat_map(|g| {
                ["Usage", "ClusterUsage"]
                    .into_iter()
                    .flat_map(move |k| kinds.of_kind(Some(g), k).cloned())
            })
            .collect();
        let names: HashSet<(String, String)> = self
            .refs
            .iter()
            .map(|r| (r.kind.clone(), r.name.clone()))
            .collect();
        for s in served {
            let list = match ServedKinds::api(self.client, &s, None)
                .list(&ListParams::default())
                .await
            {
                Ok(list) => list.items,
                Err(e) => {
                    self.unread.push(format!("{}s: {e}", s.0.kind));
                    continue;
                }
            };
            for usage in list {
                let value = serde_value(&usage);
                let names_one = ["/spec/of", "/spec/by"].iter().any(|side| {
                    let kind = value
                        .pointer(&format!("{side}/kind"))
                        .and_then(Value::as_str);
                    let name = value
                        .pointer(&format!("{side}/resourceRef/name"))
                        .and_then(Value::as_str);
                    kind.zip(name)
                        .is_some_and(|(k, n)| names.contains(&(k.to_string(), n.to_string())))
                });
                if names_one && let Some(key) = key_of(&usage) {
                    self.take(key, &usage);
                }
            }
        }
    }
}

fn key_of(object: &DynamicObject) -> Option<Key> {
    let types = object.types.as_ref()?;
    Some((
        types.api_version.clone(),
        types.kind.clone(),
        object.namespace(),
        object.metadata.name.clone()?,
    ))
}

/// The object as stored: apiVersion, kind, metadata and the rest.
fn serde_value(object: &DynamicObject) -> Value {
    serde_json::to_value(object).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_delete_is_background_where_it_is_let_through_and_foreground_elsewhere() {
        let cases = [
            (Mode::Off, Teardown::Background),
            (Mode::Warn, Teardown::Background),
            (Mode::Refuse, Teardown::Foreground),
            (Mode::Convert, Teardown::Foreground),
        ];
        for (mode, want) in cases {
            assert_eq!(teardown_of(mode), want, "{mode}");
        }
    }
}
