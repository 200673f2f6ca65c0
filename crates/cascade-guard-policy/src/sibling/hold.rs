//! Ordered teardown (pure): holding back the delete of an object that a
//! sibling still needs, and letting it go when nothing needs it.
//!
//! A foreground cascade deletes all children of a parent at once, so the
//! [`graph`](crate::sibling::graph) graph's sibling edges ("ServingStack must be gone
//! before EKSCluster goes") are not kept by the API. cascade-guard keeps them
//! with one record and one admission policy, and writes nothing to the
//! objects it holds:
//!
//! - every object that must wait for a sibling (the `after` of a sibling
//!   edge) has an entry in the ConfigMap [`HOLDS`](super::holds_record::HOLDS) of the controller's
//!   namespace: its [`hold_key`](super::holds_record::hold_key) (kind, group, namespace and name), and a
//!   [`HoldEntry`](super::holds_record::HoldEntry) (the root's uid, what it waits for in words);
//! - the ValidatingAdmissionPolicy of [`compile_hold`](super::hold_policy::compile_hold) reads that record
//!   as its parameter and refuses every DELETE of an object it names, the
//!   garbage collector's and the namespace controller's included, except
//!   cascade-guard's own, Crossplane's (which cascade-guard never refuses) and
//!   break-glass. A second policy, of [`compile_record_guard`](super::hold_policy::compile_record_guard), refuses every
//!   change or delete of the record (or of the one of [`crate::sibling::gate`])
//!   by anyone but cascade-guard. The object stays
//!   live: no deletionTimestamp, so no provider starts deleting what it
//!   manages. A finalizer could not do that;
//! - when everything it waits for is gone, its entry goes, and cascade-guard
//!   deletes it itself if its parent is being deleted and it may (the
//!   garbage collector's delete was refused; its retry would come only after
//!   its back-off); where it may not, the garbage collector's retry deletes
//!   it ([`actions`]).
//!
//! Holding so needs no permission on the held objects, which may be Secrets
//! and ProviderConfigs of any provider; a label or an entry forged, restored
//! from a backup or left by an older install holds nothing, since only the
//! controller writes the record.
//!
//! Objects in a cycle of sibling edges are not held: the cycle is reported
//! and the tree falls back to the plain foreground cascade.
//!
//! What an object outside the tree needs inside it (another tree's Release
//! installing through this tree's ProviderConfig onto its cloud cluster,
//! [`Graph::outside_users`]) is held too, until that object is gone: the
//! cascade never deletes it.
//!
//! The same record holds each namespaced managed resource's
//! ProviderConfigUsage until its provider is done with it, so that a
//! namespace deletion cannot wedge the managed resource
//! ([`crate::sibling::provider_config_usage`]).

use std::collections::{BTreeMap, BTreeSet};

use crate::sibling::graph::Graph;
use crate::sibling::object::ObjectRef;
use crate::sibling::provider_config_usage::tracked_usages;

/// What cascade-guard does to one object of a tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Hold it (its entry in [`HOLDS`](super::holds_record::HOLDS)): a sibling, or its managed
    /// resource's provider, still needs it.
    Hold { object: ObjectRef, held_for: String },
    /// Its entry goes: nothing needs it any more.
    Release { object: ObjectRef },
    /// Delete it (Foreground): its parent is being deleted, so the garbage
    /// collector tried and was refused while it was held.
    Delete { object: ObjectRef },
    /// Make its owner reference to `owner_uid` stop blocking that owner's
    /// deletion: a held ProviderConfigUsage whose managed resource waits in
    /// a foreground cascade ([`crate::sibling::provider_config_usage`]).
    Unblock {
        object: ObjectRef,
        owner_uid: String,
    },
}

impl Action {
    /// The object it is done to.
    pub fn object(&self) -> &ObjectRef {
        match self {
            Action::Hold { object, .. }
            | Action::Release { object }
            | Action::Delete { object }
            | Action::Unblock { object, .. } => object,
        }
    }
}

/// What is held for a tree now: each object to the words its entry in
/// [`HOLDS`](super::holds_record::HOLDS) says it waits for.
pub type Held = BTreeMap<ObjectRef, String>;

/// What to do to the tree of `graph`, given what is held for this tree's
/// root now (`held_now`) and which objects a Crossplane Usage marks in use
/// (`crossplane.io/in-use`). Besides the sibling edges' `after` objects,
/// what an outside user needs in the tree (and the go-betweens on the way)
/// is held until that user is gone, and the ProviderConfigUsage of each
/// namespaced managed resource while its provider needs it
/// ([`crate::sibling::provider_config_usage`]). Objects outside
/// the tree are never held; one held before and now outside (a standalone
/// Usage whose user is gone) is let go. Neither is one already being deleted
/// (its delete went through: holding it now would hold nothing back), nor
/// one in use: Crossplane's webhook refuses its delete and replays it when
/// the Usage lets go, and a hold, which admission checks before any
/// webhook, would keep the webhook from recording the attempt it replays.
/// That Usage, when it is standalone, is itself held until its user is gone
/// ([`Graph::standalone_usages`]), so the replay comes only then.
///
/// A hold keeps its word: held "until ServingStack X is gone", an object
/// stays held while X is being deleted, though what in X's tree needed it
/// (X's Releases) may be gone first and its sibling edge with them.
pub fn actions(graph: &Graph, held_now: &Held, in_use: &BTreeSet<ObjectRef>) -> Vec<Action> {
    let mut wanted: BTreeMap<ObjectRef, BTreeSet<String>> = BTreeMap::new();
    for (usage, by) in graph.standalone_usages() {
        if graph.node(&usage).is_some_and(|n| !n.deleting) {
            wanted.entry(usage).or_default().insert(by.to_string());
        }
    }
    for edge in graph.sibling_edges.iter().filter(|e| !e.in_cycle) {
        let deleting = graph.node(&edge.after).is_some_and(|n| n.deleting);
        // A Usage composed beside the two already keeps every need of the
        // edge: Crossplane's webhook refuses the delete and replays it, and
        // a second hold would only refuse that replay.
        let usage_keeps_it = edge.reasons.iter().all(|need| graph.held_by_usage(need));
        if !deleting && !usage_keeps_it && !in_use.contains(&edge.after) {
            wanted
                .entry(edge.after.clone())
                .or_default()
                .insert(edge.before.to_string());
        }
    }
    // What an object outside the tree needs (a managed resource of another
    // tree using this one's ProviderConfig): the needed object and every
    // go-between of the tree on the way, until that user is gone.
    for need in graph.outside_users() {
        let on_the_way = need.through.iter().chain([&need.needs]);
        for object in on_the_way {
            let keep = graph
                .node(object)
                .is_some_and(|n| n.in_tree && !n.deleting && !in_use.contains(object));
            if keep {
                wanted
                    .entry(object.clone())
                    .or_default()
                    .insert(need.object.to_string());
            }
        }
    }
    let mut out = Vec::new();
    // Each namespaced managed resource's ProviderConfigUsage, held while its
    // provider needs it (crossplane-runtime#1150, see
    // [`provider_config_usage`]), whether or not it was read: a hold by key
    // is in force before the provider first writes it. Let go once the
    // provider is done; the controller then deletes it as its owner leaves.
    let tracked = tracked_usages(graph);
    for t in &tracked {
        match (t.needed, held_now.contains_key(&t.usage)) {
            (true, false) => out.push(Action::Hold {
                object: t.usage.clone(),
                held_for: t.managed.to_string(),
            }),
            (false, true) => out.push(Action::Release {
                object: t.usage.clone(),
            }),
            _ => {}
        }
        if t.unblock {
            out.push(Action::Unblock {
                object: t.usage.clone(),
                owner_uid: t.managed_uid.clone(),
            });
        }
    }
    for node in &graph.nodes {
        if tracked.iter().any(|t| t.usage == node.object) {
            continue;
        }
        let held = held_now.contains_key(&node.object);
        if !node.in_tree {
            if held {
                out.push(Action::Release {
                    object: node.object.clone(),
                });
            }
            continue;
        }
        match (wanted.get(&node.object), held) {
            (Some(before), false) => out.push(Action::Hold {
                object: node.object.clone(),
                held_for: before.iter().cloned().collect::<Vec<_>>().join(", "),
            }),
            (Some(before), true) => {
                let words = held_now.get(&node.object).map_or("", String::as_str);
                if let Some(held_for) = words_grown(graph, words, before) {
                    out.push(Action::Hold {
                        object: node.object.clone(),
                        held_for,
                    });
                }
            }
            (None, true)
                if !node.deleting
                    && held_now
                        .get(&node.object)
                        .is_some_and(|words| still_going(graph, words)) => {}
            (None, true) => {
                let parent_deleting = node
                    .parent
                    .as_ref()
                    .and_then(|p| graph.node(p))
                    .is_some_and(|p| p.deleting);
                // Deleted while still labelled, so that a delete refused by
                // someone else (Crossplane's Usage webhook) is simply tried
                // again; the label goes once the delete went through.
                let object = node.object.clone();
                out.push(if parent_deleting && !node.deleting {
                    Action::Delete { object }
                } else {
                    Action::Release { object }
                });
            }
            _ => {}
        }
    }
    out
}

/// What a hold's words name: each object as [`ObjectRef`] writes itself,
/// joined by `, ` (no name, kind or group holds one).
fn named(words: &str) -> BTreeSet<&str> {
    words.split(", ").filter(|w| !w.is_empty()).collect()
}

/// The words of a hold that now waits for `before` too, when they do not
/// name all of it yet: what they named and is still in the graph, and
/// `before`. So a second sibling that comes to need an object is named,
/// and keeps the hold while it goes as the first does ([`still_going`]);
/// nothing is written while the words already say it all.
fn words_grown(graph: &Graph, words: &str, before: &BTreeSet<String>) -> Option<String> {
    let named = named(words);
    if before.iter().all(|b| named.contains(b.as_str())) {
        return None;
    }
    let present: BTreeSet<String> = graph.nodes.iter().map(|n| n.object.to_string()).collect();
    let mut all: BTreeSet<String> = named
        .into_iter()
        .filter(|w| present.contains(*w))
        .map(str::to_string)
        .collect();
    all.extend(before.iter().cloned());
    Some(all.into_iter().collect::<Vec<_>>().join(", "))
}

/// Whether an object the hold's `words` name (`Kind namespace/name`, as
/// [`ObjectRef`] writes itself, joined by `, `) is in `graph` and being
/// deleted: gone from the API, it is no longer in the graph.
fn still_going(graph: &Graph, words: &str) -> bool {
    let named = named(words);
    graph
        .nodes
        .iter()
        .any(|n| n.deleting && named.contains(n.object.to_string().as_str()))
}

#[cfg(test)]
mod tests;
