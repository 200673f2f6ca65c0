//! The graph of a live tree (pure): what [`graph`] reads from the objects
//! and what a caller asks of it.

use std::fmt;

use serde::Serialize;
use serde_json::Value;

use super::builder::Builder;
use super::edge::{Edge, Need};
use super::index::{Index, Rel};
use super::lifting::{Cycle, SiblingEdge};
use super::object::ObjectRef;

/// One object given.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    pub object: ObjectRef,
    pub uid: Option<String>,
    /// The root or one of its descendants: deleted by the cascade.
    pub in_tree: bool,
    /// Its parent in the tree; None for the root and outside the tree.
    pub parent: Option<ObjectRef>,
    /// 0 for the root; None outside the tree.
    pub depth: Option<usize>,
    /// When it leaves under ordered teardown; None outside the tree.
    pub wave: Option<usize>,
    /// The [`Cycle`] (an index into [`Graph::cycles`]) it is one of the
    /// siblings of, or lies under: its wave is the fallback.
    pub cycle: Option<usize>,
    /// It has a deletionTimestamp.
    pub deleting: bool,
    /// It carries a finalizer other than the garbage collector's
    /// (`foregroundDeletion`, `orphan`): its controller (a provider, for a
    /// managed resource) still has work to do before it can go.
    pub finalizing: bool,
    /// It carries `foregroundDeletion`: the garbage collector removes it
    /// only once no dependent blocks it.
    pub waiting_for_dependents: bool,
}

/// Where two objects stand in the tree, for an edge between them.
// Returned one at a time, never stored in bulk: boxing would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Relation {
    /// One of them is outside the tree: the edge orders nothing.
    Outside,
    /// What is needed is the needer or one of its ancestors: the foreground
    /// cascade keeps it until the needer is gone.
    Satisfied,
    /// What is needed is under the needer: the cascade deletes it first.
    Conflict,
    /// Lifted: `before` must be gone before `after` goes.
    Siblings {
        parent: ObjectRef,
        before: ObjectRef,
        after: ObjectRef,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum ReadProblemReason {
    /// An object without apiVersion, kind or name: left out.
    Unidentified,
    /// An object given twice: the first is used.
    Duplicate,
    /// A reference that names nothing among the objects.
    Unresolved,
    /// A reference only Crossplane can resolve (a Usage's resourceSelector).
    Unresolvable,
    /// A reference or annotation entry that cannot be read.
    Malformed,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadProblem {
    /// None for an object that could not be identified.
    pub object: Option<ObjectRef>,
    pub reason: ReadProblemReason,
    pub message: String,
}

impl fmt::Display for ReadProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.object {
            Some(o) => write!(f, "{o}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// The root named is not among the objects given (or has no identity).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the root (uid {uid}) is not among the objects given")]
pub struct RootNotFound {
    pub uid: String,
}

/// Everything [`graph`] works out about a tree and the objects it references.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Graph {
    pub root: ObjectRef,
    /// Every object given, sorted by kind, namespace and name.
    pub nodes: Vec<Node>,
    /// Every edge read, sorted by needer then needed.
    pub edges: Vec<Edge>,
    /// What each object of the tree that is not a go-between needs, directly
    /// or through go-betweens, inside the tree or not.
    pub needs: Vec<Need>,
    pub sibling_edges: Vec<SiblingEdge>,
    /// The objects of the tree in the order they leave: wave 0 first.
    pub waves: Vec<Vec<ObjectRef>>,
    pub cycles: Vec<Cycle>,
    /// Edges and needs whose needed object is under the needer.
    pub conflicts: Vec<Need>,
    /// What objects outside the tree need inside it, directly or through
    /// go-betweens (a Crossplane Usage's own edge left to Crossplane): the
    /// cascade never deletes them, so each must be gone before what it
    /// needs goes.
    pub outside_needs: Vec<Need>,
    pub problems: Vec<ReadProblem>,
    #[serde(skip)]
    pub(super) ix: Index,
}

/// Reads the graph of the tree under the object whose uid is `root_uid`,
/// from the objects as stored (the tree's and any they reference).
pub fn graph(objects: &[Value], root_uid: &str) -> Result<Graph, RootNotFound> {
    Ok(Builder::read(objects, root_uid)?.finish())
}

/// The label Crossplane puts on every composed resource (its root XR's
/// name). Crossplane's Usage controller keeps a deleting Usage that carries
/// it until the Usage's user is gone, and lets one without it go at once
/// (crossplane `internal/controller/protection/usage/reconciler.go`).
pub const COMPOSITE_LABEL: &str = "crossplane.io/composite";

impl Graph {
    pub fn node(&self, object: &ObjectRef) -> Option<&Node> {
        self.ix.by_ref.get(object).map(|&i| &self.nodes[i])
    }

    pub fn wave(&self, object: &ObjectRef) -> Option<usize> {
        self.node(object).and_then(|n| n.wave)
    }

    /// Where an edge from `object` to `needs` stands; None if either is not
    /// among the objects.
    pub fn relation(&self, object: &ObjectRef, needs: &ObjectRef) -> Option<Relation> {
        let a = *self.ix.by_ref.get(object)?;
        let b = *self.ix.by_ref.get(needs)?;
        let name = |i: usize| self.nodes[i].object.clone();
        Some(match self.ix.relation(a, b) {
            Rel::Outside => Relation::Outside,
            Rel::Satisfied => Relation::Satisfied,
            Rel::Conflict => Relation::Conflict,
            Rel::Siblings { parent, a, b } => Relation::Siblings {
                parent: name(parent),
                before: name(a),
                after: name(b),
            },
        })
    }

    /// Whether a Crossplane Usage already keeps `need` through a foreground
    /// cascade (see [`Graph::hazards`]): then nothing more has to hold it.
    pub fn held_by_usage(&self, need: &Need) -> bool {
        let (Some(&a), Some(&x)) = (
            self.ix.by_ref.get(&need.object),
            self.ix.by_ref.get(&need.needs),
        ) else {
            return false;
        };
        let Some(ix) = self.ix.needs.iter().find(|n| n.a == a && n.x == x) else {
            return false;
        };
        match self.ix.relation(a, x) {
            Rel::Siblings { a: side, .. } => self.ix.held_in_foreground(ix, side),
            _ => false,
        }
    }

    /// The standalone Usages (not composed) in the tree whose user (`by`) is
    /// in the tree too, with that user: (Usage, user). Crossplane makes a
    /// Usage's user its owner, without `blockOwnerDeletion`, so a cascade
    /// through the user deletes such a Usage in its first wave, and
    /// Crossplane, which waits for the user only for a composed Usage, lets
    /// it go at once and replays the delete of what it protected while the
    /// user's own resources are still going. Sibling order holds these until
    /// their user is gone.
    pub fn standalone_usages(&self) -> Vec<(ObjectRef, ObjectRef)> {
        self.ix
            .usages
            .iter()
            .filter(|u| !u.composed && self.ix.in_tree[u.usage] && self.ix.in_tree[u.by])
            .map(|u| {
                (
                    self.nodes[u.usage].object.clone(),
                    self.nodes[u.by].object.clone(),
                )
            })
            .collect()
    }

    /// The objects outside the tree that something in it needs, directly or
    /// through go-betweens (another tree's ProviderConfig a Release of this
    /// one installs through): that other tree holds what it keeps for this
    /// one only once it reads it as its outside user, so it is due to be
    /// read again. Each once, in the order of [`Graph::nodes`].
    pub fn needed_outside(&self) -> Vec<&Node> {
        let mut needed = vec![false; self.nodes.len()];
        for need in self.needs.iter().filter(|n| self.is_in_tree(&n.object)) {
            for object in need.through.iter().chain([&need.needs]) {
                if let Some(&i) = self.ix.by_ref.get(object) {
                    needed[i] = !self.nodes[i].in_tree;
                }
            }
        }
        self.nodes
            .iter()
            .zip(needed)
            .filter_map(|(node, needed)| needed.then_some(node))
            .collect()
    }

    fn is_in_tree(&self, object: &ObjectRef) -> bool {
        self.node(object).is_some_and(|n| n.in_tree)
    }

    /// What objects outside the tree need inside it ([`Graph::outside_needs`]),
    /// each the longest: a need that a longer one of the same object goes
    /// through says less.
    pub fn outside_users(&self) -> Vec<Need> {
        self.outside_needs
            .iter()
            .filter(|need| {
                !self.outside_needs.iter().any(|longer| {
                    longer.object == need.object && longer.through.contains(&need.needs)
                })
            })
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::sibling::hazards::Teardown;
    use crate::sibling::test_objects::*;

    #[test]
    fn the_root_must_be_among_the_objects() {
        let objects = vec![xr("T", None, "a"), json!({"kind": "NoName"})];
        assert_eq!(
            graph(&objects, "nope").map(|_| ()),
            Err(RootNotFound { uid: "nope".into() })
        );
        let g = graph(&objects, uid(&objects[0])).expect("root");
        assert_eq!(g.problems.len(), 1);
        assert_eq!(g.problems[0].reason, ReadProblemReason::Unidentified);
    }

    #[test]
    fn the_graph_serializes_with_stable_field_names() {
        let g = graph_of(&seed(SeedUsage::None));
        let v = serde_json::to_value(&g).expect("json");
        for field in [
            "root",
            "nodes",
            "edges",
            "needs",
            "siblingEdges",
            "waves",
            "cycles",
            "conflicts",
            "problems",
        ] {
            assert!(v.get(field).is_some(), "{field}");
        }
        assert_eq!(v["edges"][0]["provenance"], json!("ProviderConfigRef"));
        assert!(v["nodes"][0].get("inTree").is_some());
        let h = serde_json::to_value(g.hazards(Teardown::Foreground)).expect("json");
        assert_eq!(h[0]["teardown"], json!("Foreground"));
        assert_eq!(h[0]["kind"], json!("Together"));
    }
}
