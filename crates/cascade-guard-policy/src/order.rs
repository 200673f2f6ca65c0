//! Sibling order (pure): which objects of a live Crossplane tree need which,
//! and so in what order the tree can be torn down without wedging.
//!
//! A foreground cascade deletes a parent only after its children are gone,
//! but deletes all children of a parent at once, never one sibling after
//! another. Crossplane trees have siblings that need each other: an EKSCluster
//! XR composes the cloud Cluster that writes a kubeconfig Secret and the
//! ProviderConfigs that read it; a ServingStack XR beside it composes helm
//! Releases that use those ProviderConfigs. If both XRs go at once, the
//! cluster disappears while the Releases uninstall, and they wedge.
//!
//! [`graph`] reads, purely from the objects, the edges "A needs B" (B must not
//! go until A is gone), lifts them to edges between siblings, orders the
//! tree in waves and names what each way of deleting it ([`Teardown`]) would
//! break ([`Graph::hazards`]).
//!
//! # Where edges come from ([`Provenance`])
//!
//! References match by API group (the version is ignored), kind, namespace
//! and name, among the objects given.
//!
//! - `spec.providerConfigRef` {name, kind}: the object needs that
//!   ProviderConfig (kind defaults to ProviderConfig; a ProviderConfig is
//!   looked up in the object's own namespace, none for a cluster-scoped
//!   object; a ClusterProviderConfig without one). The provider's API group is
//!   not on the reference: a ProviderConfig in the object's group or a parent
//!   of it (`aws.upbound.io` for `ec2.aws.upbound.io`) matches, else every
//!   group with such a kind and name.
//! - A ProviderConfig's `spec.credentials.secretRef` {name, namespace}: it
//!   needs that Secret (namespace defaults to its own).
//! - `spec.writeConnectionSecretToRef` {name, namespace} on any object, and a
//!   Secret's controller ownerReference: the Secret needs its writer, so the
//!   writer stays until the Secret, and through it the Secret's readers, are
//!   gone.
//! - A Crossplane Usage or ClusterUsage (groups `protection.crossplane.io`
//!   and `apiextensions.crossplane.io`): `spec.by` needs `spec.of`, each a
//!   `resourceRef` (namespace defaults to a Usage's own). A side given only by
//!   `resourceSelector` is reported unresolvable: Crossplane resolves it into
//!   `resourceRef`, and cascade-guard does not guess.
//! - A provider-kubernetes Object's `spec.references[]`: it needs each
//!   `dependsOn` and `patchesFrom` object.
//! - A reference its provider resolves, Upjet's `<field>Ref(s)` anywhere
//!   under `spec.forProvider` and `spec.initProvider` (a Subnet's
//!   `vpcIdRef`): it needs the object of that name (and namespace: the
//!   reference's, else its own) among the objects of its provider, the
//!   group without its first label (a reference names no kind). Several
//!   such objects, or a `<field>Selector` with no reference beside it, are
//!   a [`Problem`]: cascade-guard does not guess.
//! - A blocking ownerReference that is not the object's parent: the object
//!   needs that owner (the owner waits for it).
//! - The annotation [`NEEDS_ANNOTATION`], see below.
//!
//! A reference that names nothing among the objects, or cannot be read, is a
//! [`Problem`]; nothing is dropped silently.
//!
//! # The `cascade-guard.dev/needs` annotation
//!
//! On any object, a comma-separated list of what it needs; blanks around
//! entries and empty entries are ignored. Each entry is one of:
//!
//! - `name` (no `/`): a composition resource name: the object composed by the
//!   same XR whose annotation `crossplane.io/composition-resource-name` is
//!   `name`. A Composition author can write this, since the final names are
//!   generated.
//! - `Kind.group/name`, or `Kind/name` for the core group: an object in the
//!   annotated object's namespace, else a cluster-scoped one.
//! - `Kind.group/namespace/name` (`Kind/namespace/name`): an object in
//!   another namespace.
//!
//! For example `cascade-guard.dev/needs: cluster, ProviderConfig.helm.crossplane.io/prod-helm`.
//! An entry that cannot be read ([`parse_needs`]) or names nothing is a
//! [`Problem`].
//!
//! # Lifting, waves and cycles
//!
//! Every object's parent is its controller owner among the objects, else its
//! first owner among them; the tree is the root and its descendants. An edge
//! A needs B inside the tree is lifted to the two children a' and b' of their
//! lowest common ancestor on the paths to A and B: a' must be gone before b'
//! goes ([`SiblingEdge`]). If B is an ancestor of A, the foreground cascade
//! already keeps it; if A is an ancestor of B, the cascade deletes B first and
//! nothing can order it (a conflict).
//!
//! ProviderConfigs, ClusterProviderConfigs, Secrets and ConfigMaps are
//! go-betweens: they do nothing of their own while deleted and need what they
//! need only for their readers. So what an object needs ([`Need`]) is
//! followed through go-betweens ("Release r needs Cluster c, through
//! ProviderConfig p and Secret s"), and hazards are named for such needs of
//! objects that are not go-betweens.
//!
//! Waves say when each object of the tree leaves under ordered teardown, where
//! cascade-guard deletes the children of each parent in the order of the
//! sibling edges and each child with a foreground cascade: an object leaves
//! after its children, and nothing under b' leaves before a' is gone. Wave 0
//! leaves first; a wave is sorted by kind, namespace and name.
//!
//! Sibling edges that form a cycle are reported ([`Cycle`]) and left out of
//! the waves: the siblings of a cycle are taken as the foreground cascade
//! takes them, together. Their waves, and those of what lies under them, are
//! that fallback, marked by [`Node::cycle`]. Objects outside the tree get no
//! wave: the cascade does not delete them, so edges to them order nothing.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt;

use serde::Serialize;
use serde_json::Value;

use crate::resolved_references;

/// Annotation by which any object names what it needs (see the module doc).
pub const NEEDS_ANNOTATION: &str = "cascade-guard.dev/needs";

/// Crossplane's annotation on a composed resource: its name in the Composition.
pub const COMPOSITION_RESOURCE_NAME_ANNOTATION: &str = "crossplane.io/composition-resource-name";

/// An object, as references match it: the version is not part of it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// The API group, "" for the core group.
    pub group: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectRef {
    pub fn new(group: &str, kind: &str, namespace: Option<&str>, name: &str) -> Self {
        Self {
            group: group.to_string(),
            kind: kind.to_string(),
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
        }
    }

    /// The identity of a stored object; None without an apiVersion, kind or name.
    pub fn of_object(object: &Value) -> Option<Self> {
        let api_version = str_at(object, "/apiVersion")?;
        let kind = str_at(object, "/kind")?;
        let name = str_at(object, "/metadata/name")?;
        let namespace = str_at(object, "/metadata/namespace");
        Some(Self::new(group_of(api_version), kind, namespace, name))
    }
}

/// Sorted by kind, namespace and name (then group), the order of a wave.
impl Ord for ObjectRef {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (&self.kind, &self.namespace, &self.name, &self.group).cmp(&(
            &other.kind,
            &other.namespace,
            &other.name,
            &other.group,
        ))
    }
}

impl PartialOrd for ObjectRef {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for ObjectRef {
    /// `Kind name`, or `Kind namespace/name`; `Kind.group …` for the kinds
    /// every provider defines, where the name alone says too little (a
    /// helm and a kubernetes ProviderConfig often share one).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.kind)?;
        if PROVIDER_KINDS.contains(&self.kind.as_str()) && !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        match &self.namespace {
            Some(ns) => write!(f, " {ns}/{}", self.name),
            None => write!(f, " {}", self.name),
        }
    }
}

/// The garbage collector's own finalizers, which say nothing of what an
/// object's controller still has to do.
const GC_FINALIZERS: [&str; 2] = [FOREGROUND_FINALIZER, "orphan"];
/// The finalizer of a foreground cascade.
const FOREGROUND_FINALIZER: &str = "foregroundDeletion";

/// Kinds that every Crossplane provider defines in its own group.
const PROVIDER_KINDS: [&str; 3] = [
    "ProviderConfig",
    "ClusterProviderConfig",
    "ProviderConfigUsage",
];

/// Where an edge "A needs B" was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Provenance {
    ProviderConfigRef,
    CredentialsSecretRef,
    WriteConnectionSecretToRef,
    /// A Secret's controller ownerReference.
    SecretController,
    Usage,
    DependsOn,
    PatchesFrom,
    /// A reference its provider resolves (Upjet's `spec.forProvider`
    /// `<field>Ref(s)`, see [`crate::resolved_references`]).
    ResolvedReference,
    Annotation,
    /// A blocking ownerReference other than the parent's.
    OwnerReference,
}

impl fmt::Display for Provenance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Provenance::ProviderConfigRef => "spec.providerConfigRef",
            Provenance::CredentialsSecretRef => "spec.credentials.secretRef",
            Provenance::WriteConnectionSecretToRef => "spec.writeConnectionSecretToRef",
            Provenance::SecretController => "its controller ownerReference",
            Provenance::Usage => "a Crossplane Usage",
            Provenance::DependsOn => "spec.references[].dependsOn",
            Provenance::PatchesFrom => "spec.references[].patchesFrom",
            Provenance::ResolvedReference => "a resolved spec.forProvider reference",
            Provenance::Annotation => "annotation cascade-guard.dev/needs",
            Provenance::OwnerReference => "a blocking ownerReference",
        })
    }
}

/// One edge read from the objects: `object` needs `needs`. Between two
/// objects there is one edge; when several rules find it, the first in the
/// order of [`Provenance`] names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Edge {
    pub object: ObjectRef,
    pub needs: ObjectRef,
    pub provenance: Provenance,
    /// The object whose fields say so: the writer of a connection Secret,
    /// the Usage, else `object` itself.
    pub declared_by: ObjectRef,
}

impl Edge {
    /// Where the edge was read, and from whom when another object said so
    /// (the writer of a connection Secret, the Usage): `plan`'s text and
    /// pictures label an edge with it.
    pub fn reason(&self) -> String {
        match self.provenance {
            _ if self.declared_by == self.object => self.provenance.to_string(),
            Provenance::Usage => self.declared_by.to_string(),
            p => format!("{p} of {}", self.declared_by),
        }
    }
}

impl fmt::Display for Edge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} needs {} ({})",
            self.object,
            self.needs,
            self.reason()
        )
    }
}

/// What an object needs, directly (one edge) or through go-betweens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Need {
    pub object: ObjectRef,
    pub needs: ObjectRef,
    /// The go-betweens in order; empty for a direct need.
    pub through: Vec<ObjectRef>,
    /// The edges followed, from `object` to `needs`.
    pub edges: Vec<Edge>,
}

impl fmt::Display for Need {
    /// `Release r needs Cluster c (through ProviderConfig p and Secret ns/s)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} needs {}", self.object, self.needs)?;
        match (self.through.as_slice(), self.edges.as_slice()) {
            ([], [edge]) => write!(f, " ({})", edge.reason()),
            ([], _) => Ok(()),
            (through, _) => {
                let names: Vec<String> = through.iter().map(ToString::to_string).collect();
                write!(f, " (through {})", join_words(&names))
            }
        }
    }
}

/// `before` must be gone before `after` goes: two children of `parent`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SiblingEdge {
    pub parent: ObjectRef,
    pub before: ObjectRef,
    pub after: ObjectRef,
    /// The needs lifted to it.
    pub reasons: Vec<Need>,
    /// Part of a [`Cycle`], and so left out of the waves.
    pub in_cycle: bool,
}

impl fmt::Display for SiblingEdge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reasons: Vec<String> = self.reasons.iter().map(ToString::to_string).collect();
        write!(
            f,
            "{} must be gone before {} goes: {}",
            self.before,
            self.after,
            reasons.join("; ")
        )
    }
}

/// Siblings that need each other round in a circle: no order satisfies them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cycle {
    pub parent: ObjectRef,
    pub objects: Vec<ObjectRef>,
    pub edges: Vec<SiblingEdge>,
}

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

/// How a tree is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Teardown {
    /// The root leaves at once; the garbage collector then deletes what each
    /// deleted object owned as soon as it is gone, and nothing waits.
    Background,
    /// A parent leaves after its children; the children of a parent are
    /// deleted at once.
    Foreground,
    /// The sibling edges are followed (the waves), with a foreground cascade
    /// for each object deleted.
    Ordered,
}

impl Teardown {
    pub const ALL: [Teardown; 3] = [
        Teardown::Background,
        Teardown::Foreground,
        Teardown::Ordered,
    ];
}

/// Why a teardown breaks a need.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum HazardKind {
    /// The two sides are deleted at the same time, and no Usage holds the
    /// needed side long enough.
    Together,
    /// Background only: the needed object owns the needer, and leaves first.
    OwnerFirst,
    /// The needed object is under the needer: the cascade deletes it first.
    Conflict,
    /// Ordered only: a cycle of sibling edges leaves the two unordered.
    Cycle,
    /// Background and Foreground: the needer is outside the tree, which
    /// the cascade never deletes, and the needed object goes from under it.
    OutsideUser,
}

/// A need that a teardown would break: what is needed could leave while
/// what needs it is still there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Hazard {
    pub teardown: Teardown,
    pub kind: HazardKind,
    pub need: Need,
    /// The sentence [`fmt::Display`] prints.
    pub message: String,
}

impl fmt::Display for Hazard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
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
pub enum ProblemReason {
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
pub struct Problem {
    /// None for an object that could not be identified.
    pub object: Option<ObjectRef>,
    pub reason: ProblemReason,
    pub message: String,
}

impl fmt::Display for Problem {
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

/// One entry of [`NEEDS_ANNOTATION`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NeedsEntry {
    /// A sibling, by its `crossplane.io/composition-resource-name`.
    CompositionResource(String),
    /// An object; without a namespace, the annotated object's (else a
    /// cluster-scoped one).
    Object {
        group: String,
        kind: String,
        namespace: Option<String>,
        name: String,
    },
}

/// An annotation entry that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cascade-guard.dev/needs entry {entry:?} cannot be read: {why}")]
pub struct MalformedNeeds {
    pub entry: String,
    pub why: &'static str,
}

/// Reads [`NEEDS_ANNOTATION`]: each non-empty entry, read or not.
pub fn parse_needs(annotation: &str) -> Vec<Result<NeedsEntry, MalformedNeeds>> {
    annotation
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(parse_needs_entry)
        .collect()
}

fn parse_needs_entry(entry: &str) -> Result<NeedsEntry, MalformedNeeds> {
    let bad = |why| MalformedNeeds {
        entry: entry.to_string(),
        why,
    };
    if entry.chars().any(char::is_whitespace) {
        return Err(bad("it contains blanks"));
    }
    let parts: Vec<&str> = entry.split('/').collect();
    let (kind_group, namespace, name) = match parts.as_slice() {
        [name] => return Ok(NeedsEntry::CompositionResource(name.to_string())),
        [kind_group, name] => (*kind_group, None, *name),
        [kind_group, namespace, name] => (*kind_group, Some(*namespace), *name),
        _ => return Err(bad("it has more than two '/'")),
    };
    if kind_group.is_empty() || name.is_empty() || namespace.is_some_and(str::is_empty) {
        return Err(bad("a part between '/' is empty"));
    }
    let (kind, group) = kind_group.split_once('.').unwrap_or((kind_group, ""));
    if kind_group.contains('.') && group.is_empty() {
        return Err(bad("the group after '.' is empty"));
    }
    if !kind.starts_with(|c: char| c.is_ascii_uppercase()) {
        return Err(bad("a kind starts with a capital letter (Kind.group/name)"));
    }
    Ok(NeedsEntry::Object {
        group: group.to_string(),
        kind: kind.to_string(),
        namespace: namespace.map(str::to_string),
        name: name.to_string(),
    })
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
    pub problems: Vec<Problem>,
    #[serde(skip)]
    ix: Index,
}

/// Reads the graph of the tree under the object whose uid is `root_uid`,
/// from the objects as stored (the tree's and any they reference).
pub fn graph(objects: &[Value], root_uid: &str) -> Result<Graph, RootNotFound> {
    Ok(Builder::read(objects, root_uid)?.finish())
}

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

    /// The needs (of [`Graph::needs`], both ends in the tree) that
    /// `teardown` would break. Of a need through go-betweens and the shorter
    /// needs along it, only the longest broken one is named.
    ///
    /// - Background: every need, unless the needed object is under the
    ///   needer (which leaves before it is even deleted), or a Usage holds
    ///   it: one whose `of` is the needed object or above it, and whose `by`
    ///   is the needer or under it (the Usage lasts until its user is gone,
    ///   and its user leaves at once).
    /// - Foreground: every need lifted to siblings, unless a Usage holds it:
    ///   `of` is the needed object or above it, `by` is the needer or above
    ///   it, and the Usage is not placed on the needer's side (a' or under
    ///   it, by its controller, else its first owner). A Usage composed
    ///   beside them lasts until its user is gone, whatever other owner
    ///   references Crossplane adds; a standalone one that Crossplane gives
    ///   its user as owner is deleted in that side's cascade first, and is
    ///   not counted on. Also every conflict.
    /// - Ordered: conflicts, and needs a cycle leaves unordered.
    pub fn hazards(&self, teardown: Teardown) -> Vec<Hazard> {
        let mut broken: Vec<(usize, HazardKind, Rel)> = Vec::new();
        for (i, need) in self.ix.needs.iter().enumerate() {
            let rel = self.ix.relation(need.a, need.x);
            let kind = match (teardown, rel) {
                (_, Rel::Outside) => None,
                (Teardown::Background, Rel::Satisfied) => {
                    (!self.ix.held_in_background(need)).then_some(HazardKind::OwnerFirst)
                }
                (_, Rel::Satisfied) | (Teardown::Background, Rel::Conflict) => None,
                (_, Rel::Conflict) => Some(HazardKind::Conflict),
                (Teardown::Background, Rel::Siblings { .. }) => {
                    (!self.ix.held_in_background(need)).then_some(HazardKind::Together)
                }
                (Teardown::Foreground, Rel::Siblings { a, .. }) => {
                    (!self.ix.held_in_foreground(need, a)).then_some(HazardKind::Together)
                }
                (Teardown::Ordered, Rel::Siblings { a, b, .. }) => (!self.ix.ordered(a, b)
                    && !self.ix.held_in_foreground(need, a))
                .then_some(HazardKind::Cycle),
            };
            if let Some(kind) = kind {
                broken.push((i, kind, rel));
            }
        }
        // A broken need that a longer broken need of the same object goes
        // through says less than that one.
        let mut through_broken: HashMap<usize, HashSet<usize>> = HashMap::new();
        for &(i, _, _) in &broken {
            let need = &self.ix.needs[i];
            through_broken
                .entry(need.a)
                .or_default()
                .extend(need.through.iter().copied());
        }
        broken
            .into_iter()
            .filter(|&(i, _, _)| {
                let need = &self.ix.needs[i];
                !through_broken
                    .get(&need.a)
                    .is_some_and(|t| t.contains(&need.x))
            })
            .map(|(i, kind, rel)| self.hazard(teardown, kind, rel, &self.needs[i]))
            .chain(
                (teardown != Teardown::Ordered)
                    .then(|| self.outside_users())
                    .into_iter()
                    .flatten()
                    .map(|need| {
                        self.hazard(teardown, HazardKind::OutsideUser, Rel::Outside, &need)
                    }),
            )
            .collect()
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

    fn hazard(&self, teardown: Teardown, kind: HazardKind, rel: Rel, need: &Need) -> Hazard {
        let name = |i: usize| self.nodes[i].object.to_string();
        let why = match (kind, rel) {
            (HazardKind::Together, Rel::Siblings { a, b, .. }) => match teardown {
                Teardown::Background => format!(
                    "a Background delete takes {} without waiting for {}",
                    name(b),
                    name(a)
                ),
                _ => format!("{} and {} are deleted at the same time", name(a), name(b)),
            },
            (HazardKind::OwnerFirst, _) => format!(
                "a Background delete takes {} before what it owns",
                need.needs
            ),
            (HazardKind::Conflict, _) => format!(
                "{} is under {}, so the cascade deletes it first",
                need.needs, need.object
            ),
            (HazardKind::OutsideUser, _) => format!(
                "{} is outside the tree: the cascade does not delete it, and takes {} from under it",
                need.object, need.needs
            ),
            (HazardKind::Cycle, Rel::Siblings { parent, .. }) => format!(
                "a cycle of needs among what {} owns leaves them unordered",
                name(parent)
            ),
            _ => "it is not ordered".to_string(),
        };
        Hazard {
            teardown,
            kind,
            need: need.clone(),
            message: format!("{need}: {why}"),
        }
    }
}

// ---------------------------------------------------------------------------
// The index: positions in `Graph::nodes` and what the tree says of them.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rel {
    Outside,
    Satisfied,
    Conflict,
    Siblings { parent: usize, a: usize, b: usize },
}

/// A Usage whose both sides resolved.
#[derive(Clone, Copy, Debug)]
struct UsageFact {
    usage: usize,
    of: usize,
    by: usize,
    /// Composed by an XR (Crossplane's label [`COMPOSITE_LABEL`]): then
    /// Crossplane itself keeps a deleting Usage until its user is gone.
    composed: bool,
}

/// The label Crossplane puts on every composed resource (its root XR's
/// name). Crossplane's Usage controller keeps a deleting Usage that carries
/// it until the Usage's user is gone, and lets one without it go at once
/// (crossplane `internal/controller/protection/usage/reconciler.go`).
pub const COMPOSITE_LABEL: &str = "crossplane.io/composite";

/// A need by positions; `edges` index `Builder::edges`.
#[derive(Clone, Debug)]
struct NeedIx {
    a: usize,
    x: usize,
    through: Vec<usize>,
    edges: Vec<usize>,
}

#[derive(Clone, Debug, Default)]
struct Index {
    by_ref: HashMap<ObjectRef, usize>,
    in_tree: Vec<bool>,
    parent: Vec<Option<usize>>,
    depth: Vec<usize>,
    /// Position in a depth-first walk of the tree, and the end of the subtree.
    tin: Vec<usize>,
    tout: Vec<usize>,
    usages: Vec<UsageFact>,
    /// Parallel to `Graph::needs`.
    needs: Vec<NeedIx>,
    /// Sibling edges not in a cycle, by `before`.
    sibling_after: HashMap<usize, Vec<usize>>,
}

impl Index {
    /// `ancestor` is `x` or above it, both in the tree.
    fn covers(&self, ancestor: usize, x: usize) -> bool {
        self.in_tree[ancestor]
            && self.in_tree[x]
            && self.tin[ancestor] <= self.tin[x]
            && self.tout[x] <= self.tout[ancestor]
    }

    fn relation(&self, a: usize, b: usize) -> Rel {
        if !self.in_tree[a] || !self.in_tree[b] {
            return Rel::Outside;
        }
        if self.covers(b, a) {
            return Rel::Satisfied;
        }
        if self.covers(a, b) {
            return Rel::Conflict;
        }
        let (mut x, mut y) = (a, b);
        while self.depth[x] > self.depth[y] {
            let Some(p) = self.parent[x] else { break };
            x = p;
        }
        while self.depth[y] > self.depth[x] {
            let Some(p) = self.parent[y] else { break };
            y = p;
        }
        while let (Some(px), Some(py)) = (self.parent[x], self.parent[y]) {
            if px == py {
                return Rel::Siblings {
                    parent: px,
                    a: x,
                    b: y,
                };
            }
            (x, y) = (px, py);
        }
        Rel::Outside
    }

    /// `b` must wait for `a` through sibling edges outside any cycle.
    fn ordered(&self, a: usize, b: usize) -> bool {
        let mut seen = HashSet::from([a]);
        let mut queue = VecDeque::from([a]);
        while let Some(u) = queue.pop_front() {
            for &v in self.sibling_after.get(&u).into_iter().flatten() {
                if v == b {
                    return true;
                }
                if seen.insert(v) {
                    queue.push_back(v);
                }
            }
        }
        false
    }

    fn held_in_background(&self, need: &NeedIx) -> bool {
        self.usages
            .iter()
            .any(|u| self.covers(u.of, need.x) && self.covers(need.a, u.by))
    }

    /// A Usage placed in the tree beside the two sides (its controller, else
    /// its first owner, is not on the needer's side) holds: the cascade
    /// deletes it with the siblings, and Crossplane keeps a deleting Usage
    /// until its user is gone (the seed's tree, on real Crossplane). One
    /// under the needer's side, as a standalone Usage is once Crossplane makes
    /// its user its owner, goes in that side's own cascade first.
    fn held_in_foreground(&self, need: &NeedIx, needer_side: usize) -> bool {
        self.usages.iter().any(|u| {
            self.covers(u.of, need.x)
                && self.covers(u.by, need.a)
                && !self.covers(needer_side, u.usage)
        })
    }
}

// ---------------------------------------------------------------------------
// Reading the objects.

#[derive(Clone, Copy, Debug)]
struct RawEdge {
    object: usize,
    needs: usize,
    provenance: Provenance,
    declared_by: usize,
}

#[derive(Clone, Copy, Debug)]
struct OwnerLink {
    owner: usize,
    controller: bool,
    blocking: bool,
}

struct Builder<'a> {
    values: Vec<&'a Value>,
    refs: Vec<ObjectRef>,
    root: usize,
    /// Kind, namespace and name, any group.
    by_kind_name: HashMap<(String, Option<String>, String), Vec<usize>>,
    /// Owner and composition resource name.
    by_resource_name: HashMap<(usize, String), Vec<usize>>,
    links: Vec<Vec<OwnerLink>>,
    /// Controller owner, else first owner, among the objects.
    owner_parent: Vec<Option<usize>>,
    ix: Index,
    euler: Vec<usize>,
    edges: Vec<RawEdge>,
    problems: Vec<Problem>,
}

impl<'a> Builder<'a> {
    fn read(objects: &'a [Value], root_uid: &str) -> Result<Self, RootNotFound> {
        let mut problems = Vec::new();
        let mut parsed: Vec<(ObjectRef, &Value)> = Vec::new();
        let mut seen = HashSet::new();
        for (i, value) in objects.iter().enumerate() {
            match ObjectRef::of_object(value) {
                None => problems.push(Problem {
                    object: None,
                    reason: ProblemReason::Unidentified,
                    message: format!(
                        "object {i} has no apiVersion, kind or metadata.name: left out"
                    ),
                }),
                Some(r) if !seen.insert(r.clone()) => problems.push(Problem {
                    object: Some(r),
                    reason: ProblemReason::Duplicate,
                    message: "given more than once: the first is used".to_string(),
                }),
                Some(r) => parsed.push((r, value)),
            }
        }
        parsed.sort_by(|a, b| a.0.cmp(&b.0));
        let (refs, values): (Vec<ObjectRef>, Vec<&Value>) = parsed.into_iter().unzip();
        let n = refs.len();

        let mut by_uid: HashMap<&str, usize> = HashMap::new();
        for (i, v) in values.iter().enumerate() {
            if let Some(uid) = str_at(v, "/metadata/uid") {
                by_uid.entry(uid).or_insert(i);
            }
        }
        let root = *by_uid.get(root_uid).ok_or_else(|| RootNotFound {
            uid: root_uid.to_string(),
        })?;

        let mut links = vec![Vec::new(); n];
        for (i, v) in values.iter().enumerate() {
            let owner_refs = v
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array);
            for o in owner_refs.into_iter().flatten() {
                let Some(&owner) = o
                    .get("uid")
                    .and_then(Value::as_str)
                    .and_then(|u| by_uid.get(u))
                else {
                    continue;
                };
                if owner != i {
                    links[i].push(OwnerLink {
                        owner,
                        controller: o.get("controller").and_then(Value::as_bool) == Some(true),
                        blocking: o.get("blockOwnerDeletion").and_then(Value::as_bool)
                            == Some(true),
                    });
                }
            }
        }
        let owner_parent: Vec<Option<usize>> = links
            .iter()
            .map(|l: &Vec<OwnerLink>| {
                l.iter()
                    .find(|o| o.controller)
                    .or(l.first())
                    .map(|o| o.owner)
            })
            .collect();

        let mut by_kind_name: HashMap<_, Vec<usize>> = HashMap::new();
        let mut by_resource_name: HashMap<_, Vec<usize>> = HashMap::new();
        for (i, r) in refs.iter().enumerate() {
            by_kind_name
                .entry((r.kind.clone(), r.namespace.clone(), r.name.clone()))
                .or_default()
                .push(i);
            let resource_name = values[i]
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(COMPOSITION_RESOURCE_NAME_ANNOTATION))
                .and_then(Value::as_str);
            if let (Some(owner), Some(name)) = (owner_parent[i], resource_name) {
                by_resource_name
                    .entry((owner, name.to_string()))
                    .or_default()
                    .push(i);
            }
        }

        let ix = Index {
            by_ref: refs.iter().cloned().zip(0..).collect(),
            in_tree: vec![false; n],
            parent: vec![None; n],
            depth: vec![0; n],
            tin: vec![0; n],
            tout: vec![0; n],
            ..Index::default()
        };
        let mut builder = Self {
            values,
            refs,
            root,
            by_kind_name,
            by_resource_name,
            links,
            owner_parent,
            ix,
            euler: Vec::new(),
            edges: Vec::new(),
            problems,
        };
        builder.walk_tree();
        Ok(builder)
    }

    /// Depth-first from the root over the owner parents.
    fn walk_tree(&mut self) {
        let n = self.refs.len();
        let mut children = vec![Vec::new(); n];
        for (i, p) in self.owner_parent.iter().enumerate() {
            if let Some(p) = p {
                children[*p].push(i);
            }
        }
        let ix = &mut self.ix;
        ix.in_tree[self.root] = true;
        self.euler.push(self.root);
        let mut stack = vec![(self.root, 0usize)];
        while let Some(top) = stack.last_mut() {
            let (node, next) = *top;
            match children[node].get(next) {
                Some(&child) => {
                    top.1 += 1;
                    if ix.in_tree[child] {
                        continue;
                    }
                    ix.in_tree[child] = true;
                    ix.parent[child] = Some(node);
                    ix.depth[child] = ix.depth[node] + 1;
                    ix.tin[child] = self.euler.len();
                    self.euler.push(child);
                    stack.push((child, 0));
                }
                None => {
                    ix.tout[node] = self.euler.len();
                    stack.pop();
                }
            }
        }
    }

    fn problem(&mut self, i: usize, reason: ProblemReason, message: String) {
        self.problems.push(Problem {
            object: Some(self.refs[i].clone()),
            reason,
            message,
        });
    }

    fn edge(&mut self, object: usize, needs: usize, provenance: Provenance, declared_by: usize) {
        if object != needs {
            self.edges.push(RawEdge {
                object,
                needs,
                provenance,
                declared_by,
            });
        }
    }

    fn exact(&self, group: &str, kind: &str, namespace: Option<&str>, name: &str) -> Option<usize> {
        self.ix
            .by_ref
            .get(&ObjectRef::new(group, kind, namespace, name))
            .copied()
    }

    /// In `namespace` if given; else in `default`, then cluster-scoped.
    fn find(
        &self,
        (group, kind, name): (&str, &str, &str),
        namespace: Option<&str>,
        default: Option<&str>,
    ) -> Option<usize> {
        match namespace {
            Some(ns) => self.exact(group, kind, Some(ns), name),
            None => default
                .and_then(|ns| self.exact(group, kind, Some(ns), name))
                .or_else(|| self.exact(group, kind, None, name)),
        }
    }

    fn infer_edges(&mut self) {
        // A resolved reference names no kind: it is matched by name among
        // the objects of the referrer's provider.
        let mut by_name: HashMap<(Option<String>, String), Vec<usize>> = HashMap::new();
        for (j, r) in self.refs.iter().enumerate() {
            by_name
                .entry((r.namespace.clone(), r.name.clone()))
                .or_default()
                .push(j);
        }
        for i in 0..self.refs.len() {
            self.resolved_references(i, &by_name);
            let (group, kind) = (self.refs[i].group.as_str(), self.refs[i].kind.as_str());
            let is_provider_config = matches!(kind, "ProviderConfig" | "ClusterProviderConfig");
            let is_secret = group.is_empty() && kind == "Secret";
            let is_usage = matches!(kind, "Usage" | "ClusterUsage")
                && matches!(
                    group,
                    "protection.crossplane.io" | "apiextensions.crossplane.io"
                );
            let is_kubernetes_object = kind == "Object"
                && matches!(
                    group,
                    "kubernetes.crossplane.io" | "kubernetes.m.crossplane.io"
                );
            self.provider_config_ref(i);
            if is_provider_config {
                self.credentials(i);
            }
            self.connection_secret(i);
            if is_secret {
                self.secret_controller(i);
            }
            if is_usage {
                self.usage(i);
            }
            if is_kubernetes_object {
                self.object_references(i);
            }
            self.annotation(i);
            self.blocking_owners(i);
        }
        self.edges
            .sort_by_key(|e| (e.object, e.needs, e.provenance, e.declared_by));
        self.edges.dedup_by_key(|e| (e.object, e.needs));
    }

    fn provider_config_ref(&mut self, i: usize) {
        let Some(r) = self.values[i].pointer("/spec/providerConfigRef") else {
            return;
        };
        let Some(name) = str_at(r, "/name") else {
            let m = "spec.providerConfigRef names no ProviderConfig".to_string();
            return self.problem(i, ProblemReason::Malformed, m);
        };
        let kind = str_at(r, "/kind").unwrap_or("ProviderConfig");
        let namespace = match kind {
            "ClusterProviderConfig" => None,
            _ => self.refs[i].namespace.clone(),
        };
        let key = (kind.to_string(), namespace, name.to_string());
        match self.by_kind_name.get(&key).cloned() {
            Some(found) => {
                // A provider's ProviderConfig is in its managed resources'
                // group or a parent of it (helm.m.crossplane.io for a
                // Release, aws.upbound.io for ec2.aws.upbound.io): when one
                // is, the same name in another provider's group is not this.
                let group = self.refs[i].group.as_str();
                let own: Vec<usize> = found
                    .iter()
                    .copied()
                    .filter(|&pc| group_family(group, &self.refs[pc].group))
                    .collect();
                let found = if own.is_empty() { found } else { own };
                for pc in found {
                    self.edge(i, pc, Provenance::ProviderConfigRef, i);
                }
            }
            None => {
                let m = format!(
                    "spec.providerConfigRef names {kind} {name}, which is not among the objects"
                );
                self.problem(i, ProblemReason::Unresolved, m);
            }
        }
    }

    /// A reference to a Secret: its name and namespace (defaulting to the
    /// object's own), or the problem.
    fn secret_ref(&mut self, i: usize, field: &str, pointer: &str) -> Option<usize> {
        let r = self.values[i].pointer(pointer)?;
        let Some(name) = str_at(r, "/name") else {
            let m = format!("{field} names no Secret");
            self.problem(i, ProblemReason::Malformed, m);
            return None;
        };
        let namespace = str_at(r, "/namespace").or(self.refs[i].namespace.as_deref());
        let Some(namespace) = namespace else {
            let m = format!("{field} names Secret {name} without a namespace");
            self.problem(i, ProblemReason::Unresolved, m);
            return None;
        };
        let found = self.exact("", "Secret", Some(namespace), name);
        if found.is_none() {
            let m =
                format!("{field} names Secret {namespace}/{name}, which is not among the objects");
            self.problem(i, ProblemReason::Unresolved, m);
        }
        found
    }

    fn credentials(&mut self, i: usize) {
        let field = "spec.credentials.secretRef";
        if let Some(secret) = self.secret_ref(i, field, "/spec/credentials/secretRef") {
            self.edge(i, secret, Provenance::CredentialsSecretRef, i);
        }
    }

    fn connection_secret(&mut self, i: usize) {
        let field = "spec.writeConnectionSecretToRef";
        if let Some(secret) = self.secret_ref(i, field, "/spec/writeConnectionSecretToRef") {
            self.edge(secret, i, Provenance::WriteConnectionSecretToRef, i);
        }
    }

    fn secret_controller(&mut self, i: usize) {
        let controllers: Vec<usize> = self.links[i]
            .iter()
            .filter(|o| o.controller)
            .map(|o| o.owner)
            .collect();
        for owner in controllers {
            self.edge(i, owner, Provenance::SecretController, i);
        }
    }

    fn blocking_owners(&mut self, i: usize) {
        let blocking: Vec<usize> = self.links[i]
            .iter()
            .filter(|o| o.blocking && Some(o.owner) != self.owner_parent[i])
            .map(|o| o.owner)
            .collect();
        for owner in blocking {
            self.edge(i, owner, Provenance::OwnerReference, i);
        }
    }

    fn usage(&mut self, i: usize) {
        let default = match self.refs[i].kind.as_str() {
            "ClusterUsage" => None,
            _ => self.refs[i].namespace.clone(),
        };
        if self.values[i].pointer("/spec/of").is_none() {
            let m = "spec.of is missing".to_string();
            return self.problem(i, ProblemReason::Malformed, m);
        }
        let of = self.usage_side(i, "of", default.as_deref());
        let by = self.usage_side(i, "by", default.as_deref());
        if let (Some(of), Some(by)) = (of, by) {
            self.edge(by, of, Provenance::Usage, i);
            let composed = self.values[i]
                .pointer("/metadata/labels")
                .and_then(|l| l.get(COMPOSITE_LABEL))
                .and_then(Value::as_str)
                .is_some_and(|v| !v.is_empty());
            self.ix.usages.push(UsageFact {
                usage: i,
                of,
                by,
                composed,
            });
        }
    }

    fn usage_side(&mut self, i: usize, side: &str, default: Option<&str>) -> Option<usize> {
        let s = self.values[i].pointer(&format!("/spec/{side}"))?;
        let (Some(api_version), Some(kind)) = (str_at(s, "/apiVersion"), str_at(s, "/kind")) else {
            let m = format!("spec.{side} has no apiVersion or kind");
            self.problem(i, ProblemReason::Malformed, m);
            return None;
        };
        let Some(r) = s.get("resourceRef") else {
            let (reason, m) = if s.get("resourceSelector").is_some() {
                let m = format!(
                    "spec.{side} has only a resourceSelector, which Crossplane resolves into resourceRef: not guessed"
                );
                (ProblemReason::Unresolvable, m)
            } else {
                let m = format!("spec.{side} has no resourceRef");
                (ProblemReason::Malformed, m)
            };
            self.problem(i, reason, m);
            return None;
        };
        let Some(name) = str_at(r, "/name") else {
            let m = format!("spec.{side}.resourceRef has no name");
            self.problem(i, ProblemReason::Malformed, m);
            return None;
        };
        let what = (group_of(api_version), kind, name);
        let found = self.find(what, str_at(r, "/namespace"), default);
        if found.is_none() {
            let m = format!("spec.{side} names {kind} {name}, which is not among the objects");
            self.problem(i, ProblemReason::Unresolved, m);
        }
        found
    }

    fn resolved_references(
        &mut self,
        i: usize,
        by_name: &HashMap<(Option<String>, String), Vec<usize>>,
    ) {
        let read = resolved_references::read(self.values[i]);
        for field in read.unresolved_selectors {
            let m = format!("{field} is not resolved yet (no reference beside it)");
            self.problem(i, ProblemReason::Unresolvable, m);
        }
        for field in read.malformed {
            let m = format!("{field} names nothing");
            self.problem(i, ProblemReason::Malformed, m);
        }
        let Some(provider) =
            resolved_references::provider_of(&self.refs[i].group).map(str::to_string)
        else {
            return;
        };
        for reference in read.references {
            let namespace = reference
                .namespace
                .clone()
                .or_else(|| self.refs[i].namespace.clone());
            let found: Vec<usize> = by_name
                .get(&(namespace, reference.name.clone()))
                .into_iter()
                .flatten()
                .copied()
                .filter(|&j| {
                    j != i
                        && resolved_references::provider_of(&self.refs[j].group)
                            == Some(provider.as_str())
                        && !is_go_between(&self.refs[j])
                })
                .collect();
            match found.as_slice() {
                [one] => self.edge(i, *one, Provenance::ResolvedReference, i),
                [] => {
                    let m = format!(
                        "{} names {}, which is not among the objects of its provider read (a resolved reference names no kind: cascade-guard follows it only into what it read)",
                        reference.field, reference.name
                    );
                    self.problem(i, ProblemReason::Unresolved, m);
                }
                many => {
                    let names: Vec<String> =
                        many.iter().map(|&j| self.refs[j].to_string()).collect();
                    let m = format!(
                        "{} names {}, which several objects of its provider are ({}); it is not followed",
                        reference.field,
                        reference.name,
                        join_words(&names)
                    );
                    self.problem(i, ProblemReason::Unresolvable, m);
                }
            }
        }
    }

    fn object_references(&mut self, i: usize) {
        let references = self.values[i]
            .pointer("/spec/references")
            .and_then(Value::as_array);
        let mut targets = Vec::new();
        for reference in references.into_iter().flatten() {
            for (field, provenance) in [
                ("dependsOn", Provenance::DependsOn),
                ("patchesFrom", Provenance::PatchesFrom),
            ] {
                if let Some(t) = reference.get(field) {
                    targets.push((field, provenance, t));
                }
            }
        }
        let own_namespace = self.refs[i].namespace.clone();
        for (field, provenance, t) in targets {
            let (Some(api_version), Some(kind), Some(name)) = (
                str_at(t, "/apiVersion"),
                str_at(t, "/kind"),
                str_at(t, "/name"),
            ) else {
                let m = format!("a spec.references[].{field} has no apiVersion, kind or name");
                self.problem(i, ProblemReason::Malformed, m);
                continue;
            };
            let what = (group_of(api_version), kind, name);
            match self.find(what, str_at(t, "/namespace"), own_namespace.as_deref()) {
                Some(target) => self.edge(i, target, provenance, i),
                None => {
                    let m = format!(
                        "spec.references[].{field} names {kind} {name}, which is not among the objects"
                    );
                    self.problem(i, ProblemReason::Unresolved, m);
                }
            }
        }
    }

    fn annotation(&mut self, i: usize) {
        let Some(text) = self.values[i]
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(NEEDS_ANNOTATION))
            .and_then(Value::as_str)
        else {
            return;
        };
        for entry in parse_needs(text) {
            let found = match entry {
                Err(e) => {
                    self.problem(i, ProblemReason::Malformed, e.to_string());
                    continue;
                }
                Ok(NeedsEntry::CompositionResource(name)) => {
                    let Some(owner) = self.owner_parent[i] else {
                        let m = format!(
                            "{NEEDS_ANNOTATION} names composition resource {name:?}, but nothing among the objects composes this object"
                        );
                        self.problem(i, ProblemReason::Unresolved, m);
                        continue;
                    };
                    let found: Vec<usize> = self
                        .by_resource_name
                        .get(&(owner, name.clone()))
                        .into_iter()
                        .flatten()
                        .copied()
                        .filter(|&s| s != i)
                        .collect();
                    if found.is_empty() {
                        let m = format!(
                            "{NEEDS_ANNOTATION} names composition resource {name:?}, which {} does not compose among the objects",
                            self.refs[owner]
                        );
                        self.problem(i, ProblemReason::Unresolved, m);
                    }
                    found
                }
                Ok(NeedsEntry::Object {
                    group,
                    kind,
                    namespace,
                    name,
                }) => {
                    let default = self.refs[i].namespace.clone();
                    let what = (group.as_str(), kind.as_str(), name.as_str());
                    let found = self.find(what, namespace.as_deref(), default.as_deref());
                    match found {
                        Some(f) if f == i => {
                            let m = format!("{NEEDS_ANNOTATION} names the object itself");
                            self.problem(i, ProblemReason::Malformed, m);
                            continue;
                        }
                        Some(f) => vec![f],
                        None => {
                            let target = ObjectRef::new(&group, &kind, namespace.as_deref(), &name);
                            let m = format!(
                                "{NEEDS_ANNOTATION} names {target}, which is not among the objects"
                            );
                            self.problem(i, ProblemReason::Unresolved, m);
                            continue;
                        }
                    }
                }
            };
            for f in found {
                self.edge(i, f, Provenance::Annotation, i);
            }
        }
    }

    fn finish(mut self) -> Graph {
        self.infer_edges();
        let n = self.refs.len();
        let refs = &self.refs;
        let public_edge = |e: &RawEdge| Edge {
            object: refs[e.object].clone(),
            needs: refs[e.needs].clone(),
            provenance: e.provenance,
            declared_by: refs[e.declared_by].clone(),
        };
        let edges: Vec<Edge> = self.edges.iter().map(public_edge).collect();
        let mut out_edges: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (k, e) in self.edges.iter().enumerate() {
            out_edges[e.object].push(k);
        }
        let go_between: Vec<bool> = refs.iter().map(is_go_between).collect();

        // What each object of the tree needs, through go-betweens.
        let mut needs: Vec<NeedIx> = Vec::new();
        for a in (0..n).filter(|&a| self.ix.in_tree[a] && !go_between[a]) {
            needs.extend(self.needs_of(a, &out_edges, &go_between, |_| true));
        }
        needs.sort_by_key(|need| (need.a, need.x));
        // What objects outside the tree need inside it: the cascade never
        // deletes them. A Crossplane Usage's own edge is left out: its
        // webhook keeps what it protects, and a hold would refuse its
        // replay.
        let mut outside_needs: Vec<NeedIx> = Vec::new();
        for a in (0..n).filter(|&a| !self.ix.in_tree[a] && !go_between[a]) {
            outside_needs.extend(
                self.needs_of(a, &out_edges, &go_between, |e| {
                    e.provenance != Provenance::Usage
                })
                .into_iter()
                .filter(|need| self.ix.in_tree[need.x]),
            );
        }
        outside_needs.sort_by_key(|need| (need.a, need.x));
        let public_need = |need: &NeedIx| Need {
            object: refs[need.a].clone(),
            needs: refs[need.x].clone(),
            through: need.through.iter().map(|&t| refs[t].clone()).collect(),
            edges: need.edges.iter().map(|&k| edges[k].clone()).collect(),
        };

        // Lift every edge of the tree, and every need that goes through an
        // object outside it (which no edge of the tree orders).
        let direct = self.edges.iter().enumerate().map(|(k, e)| NeedIx {
            a: e.object,
            x: e.needs,
            through: Vec::new(),
            edges: vec![k],
        });
        let outside = needs
            .iter()
            .filter(|need| need.through.iter().any(|&t| !self.ix.in_tree[t]))
            .cloned();
        let mut lifted: BTreeMap<(usize, usize, usize), Vec<Need>> = BTreeMap::new();
        let mut conflicts: Vec<Need> = Vec::new();
        let mut conflicting = HashSet::new();
        for need in direct.chain(outside) {
            match self.ix.relation(need.a, need.x) {
                Rel::Siblings { parent, a, b } => lifted
                    .entry((parent, a, b))
                    .or_default()
                    .push(public_need(&need)),
                Rel::Conflict if conflicting.insert((need.a, need.x)) => {
                    conflicts.push(public_need(&need));
                }
                _ => {}
            }
        }
        for need in &needs {
            if self.ix.relation(need.a, need.x) == Rel::Conflict
                && conflicting.insert((need.a, need.x))
            {
                conflicts.push(public_need(need));
            }
        }

        // Cycles: siblings that reach each other through sibling edges.
        let mut by_parent: BTreeMap<usize, Vec<(usize, usize)>> = BTreeMap::new();
        for &(parent, a, b) in lifted.keys() {
            by_parent.entry(parent).or_default().push((a, b));
        }
        let mut cyclic_pairs: HashSet<(usize, usize)> = HashSet::new();
        let mut cycle_members: Vec<(usize, Vec<usize>)> = Vec::new();
        for (&parent, pairs) in &by_parent {
            let mut after: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
            for &(a, b) in pairs {
                after.entry(a).or_default().push(b);
                after.entry(b).or_default();
            }
            let reach: BTreeMap<usize, HashSet<usize>> =
                after.keys().map(|&s| (s, reachable(&after, s))).collect();
            let mut placed = HashSet::new();
            for &s in after.keys() {
                if placed.contains(&s) {
                    continue;
                }
                let members: Vec<usize> = after
                    .keys()
                    .copied()
                    .filter(|&t| t == s || (reach[&s].contains(&t) && reach[&t].contains(&s)))
                    .collect();
                placed.extend(members.iter().copied());
                if members.len() > 1 {
                    for &(a, b) in pairs {
                        if members.contains(&a) && members.contains(&b) {
                            cyclic_pairs.insert((a, b));
                        }
                    }
                    cycle_members.push((parent, members));
                }
            }
        }

        let sibling_edges: Vec<SiblingEdge> = lifted
            .iter()
            .map(|(&(parent, a, b), reasons)| SiblingEdge {
                parent: refs[parent].clone(),
                before: refs[a].clone(),
                after: refs[b].clone(),
                reasons: reasons.clone(),
                in_cycle: cyclic_pairs.contains(&(a, b)),
            })
            .collect();
        let cycles: Vec<Cycle> = cycle_members
            .iter()
            .map(|(parent, members)| Cycle {
                parent: refs[*parent].clone(),
                objects: members.iter().map(|&m| refs[m].clone()).collect(),
                edges: sibling_edges
                    .iter()
                    .zip(lifted.keys())
                    .filter(|(_, (p, a, b))| {
                        p == parent && members.contains(a) && members.contains(b)
                    })
                    .map(|(s, _)| s.clone())
                    .collect(),
            })
            .collect();
        for &(_, a, b) in lifted.keys() {
            if !cyclic_pairs.contains(&(a, b)) {
                self.ix.sibling_after.entry(a).or_default().push(b);
            }
        }

        let wave = self.waves(&lifted, &cyclic_pairs);
        let mut cycle_of: Vec<Option<usize>> = vec![None; n];
        for (c, (_, members)) in cycle_members.iter().enumerate() {
            for &m in members {
                for &d in &self.euler[self.ix.tin[m]..self.ix.tout[m]] {
                    cycle_of[d].get_or_insert(c);
                }
            }
        }
        let mut waves: Vec<Vec<ObjectRef>> = Vec::new();
        for (i, w) in wave.iter().enumerate() {
            if let Some(w) = *w {
                if waves.len() <= w {
                    waves.resize_with(w + 1, Vec::new);
                }
                waves[w].push(refs[i].clone());
            }
        }

        let nodes = (0..n)
            .map(|i| Node {
                object: refs[i].clone(),
                uid: str_at(self.values[i], "/metadata/uid").map(str::to_string),
                in_tree: self.ix.in_tree[i],
                parent: self.ix.parent[i].map(|p| refs[p].clone()),
                depth: self.ix.in_tree[i].then_some(self.ix.depth[i]),
                wave: wave[i],
                cycle: cycle_of[i],
                deleting: self.values[i]
                    .pointer("/metadata/deletionTimestamp")
                    .is_some_and(|t| !t.is_null()),
                finalizing: self.values[i]
                    .pointer("/metadata/finalizers")
                    .and_then(Value::as_array)
                    .is_some_and(|f| {
                        f.iter()
                            .filter_map(Value::as_str)
                            .any(|f| !GC_FINALIZERS.contains(&f))
                    }),
                waiting_for_dependents: self.values[i]
                    .pointer("/metadata/finalizers")
                    .and_then(Value::as_array)
                    .is_some_and(|f| f.iter().any(|f| f == FOREGROUND_FINALIZER)),
            })
            .collect();
        let public_needs = needs.iter().map(public_need).collect();
        let outside_needs = outside_needs.iter().map(public_need).collect();
        self.ix.needs = needs;
        Graph {
            root: refs[self.root].clone(),
            nodes,
            edges,
            needs: public_needs,
            outside_needs,
            sibling_edges,
            waves,
            cycles,
            conflicts,
            problems: self.problems,
            ix: self.ix,
        }
    }

    /// What `a` needs, directly or through go-betweens, following the edges
    /// `follow` takes: a shortest path to each.
    fn needs_of(
        &self,
        a: usize,
        out_edges: &[Vec<usize>],
        go_between: &[bool],
        follow: impl Fn(&RawEdge) -> bool,
    ) -> Vec<NeedIx> {
        let mut out = Vec::new();
        let mut via: HashMap<usize, usize> = HashMap::new();
        let mut queue = VecDeque::from([a]);
        while let Some(u) = queue.pop_front() {
            for &k in &out_edges[u] {
                let x = self.edges[k].needs;
                if x == a || via.contains_key(&x) || !follow(&self.edges[k]) {
                    continue;
                }
                via.insert(x, k);
                let mut path = vec![k];
                let mut at = self.edges[k].object;
                while at != a {
                    let Some(&back) = via.get(&at) else { break };
                    path.push(back);
                    at = self.edges[back].object;
                }
                path.reverse();
                let through = path[1..].iter().map(|&k| self.edges[k].object).collect();
                out.push(NeedIx {
                    a,
                    x,
                    through,
                    edges: path,
                });
                if go_between[x] {
                    queue.push_back(x);
                }
            }
        }
        out
    }

    /// Each object of the tree leaves after its children, and every leaf
    /// under b' after a' for each sibling edge outside a cycle (so all of b'
    /// after a'). The longest chain before an object is its wave. The
    /// sibling edges left after removing cycles cannot close a cycle here:
    /// one would show as a cycle of sibling edges among the children of its
    /// highest objects' parent.
    fn waves(
        &self,
        lifted: &BTreeMap<(usize, usize, usize), Vec<Need>>,
        cyclic_pairs: &HashSet<(usize, usize)>,
    ) -> Vec<Option<usize>> {
        let n = self.refs.len();
        let mut after: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut waiting = vec![0usize; n];
        for &i in &self.euler {
            if let Some(p) = self.ix.parent[i] {
                after[i].push(p);
                waiting[p] += 1;
            }
        }
        let is_leaf = |i: usize| self.ix.tout[i] == self.ix.tin[i] + 1;
        for &(_, a, b) in lifted.keys() {
            if cyclic_pairs.contains(&(a, b)) {
                continue;
            }
            for &leaf in &self.euler[self.ix.tin[b]..self.ix.tout[b]] {
                if is_leaf(leaf) {
                    after[a].push(leaf);
                    waiting[leaf] += 1;
                }
            }
        }
        let mut wave: Vec<Option<usize>> = vec![None; n];
        let mut ready: VecDeque<usize> = self
            .euler
            .iter()
            .copied()
            .filter(|&i| waiting[i] == 0)
            .collect();
        for &i in &ready {
            wave[i] = Some(0);
        }
        let mut level = vec![0usize; n];
        while let Some(u) = ready.pop_front() {
            for &v in &after[u] {
                level[v] = level[v].max(level[u] + 1);
                waiting[v] -= 1;
                if waiting[v] == 0 {
                    wave[v] = Some(level[v]);
                    ready.push_back(v);
                }
            }
        }
        wave
    }
}

fn reachable(after: &BTreeMap<usize, Vec<usize>>, from: usize) -> HashSet<usize> {
    let mut seen = HashSet::new();
    let mut queue = VecDeque::from([from]);
    while let Some(u) = queue.pop_front() {
        for &v in after.get(&u).into_iter().flatten() {
            if seen.insert(v) {
                queue.push_back(v);
            }
        }
    }
    seen
}

/// Objects that do nothing of their own while deleted: they need what they
/// need only for whoever reads them (`plan`'s pictures dim them).
pub fn is_go_between(r: &ObjectRef) -> bool {
    matches!(r.kind.as_str(), "ProviderConfig" | "ClusterProviderConfig")
        || (r.group.is_empty() && matches!(r.kind.as_str(), "Secret" | "ConfigMap"))
}

fn str_at<'v>(value: &'v Value, pointer: &str) -> Option<&'v str> {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// `provider` is `group` or a parent domain of it.
fn group_family(group: &str, provider: &str) -> bool {
    group == provider
        || (!provider.is_empty()
            && group
                .strip_suffix(provider)
                .is_some_and(|head| head.ends_with('.')))
}

/// The group of an apiVersion: "" for the core group's `v1`.
fn group_of(api_version: &str) -> &str {
    api_version.split_once('/').map_or("", |(group, _)| group)
}

/// `a`, `a and b`, `a, b and c`.
fn join_words(words: &[String]) -> String {
    match words {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// An object that another one names, as a reader of the cluster must fetch
/// it for [`graph`] to follow the reference. A providerConfigRef names no API
/// group: `group` is None, any group serving `kind` may hold it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reference {
    pub group: Option<String>,
    pub kind: String,
    /// The namespace to look in when `kind` is namespaced (the referrer's own
    /// unless the reference names one); ignored for a cluster-scoped kind.
    pub namespace: Option<String>,
    pub name: String,
}

/// What `object` names that [`graph`] would follow, other than its owners
/// and the resources it composes: its ProviderConfig, a ProviderConfig's
/// credentials Secret, the Secret it writes its connection details to, a
/// provider-kubernetes Object's references, and the objects its
/// [`NEEDS_ANNOTATION`] names (composition resource names are its siblings,
/// already in the tree). Malformed references are left out here; [`graph`]
/// reports them.
pub fn references(object: &Value) -> Vec<Reference> {
    let Some(own) = ObjectRef::of_object(object) else {
        return Vec::new();
    };
    let own_ns = own.namespace.as_deref();
    let mut out = Vec::new();
    let mut push = |group: Option<&str>, kind: &str, namespace: Option<&str>, name: &str| {
        out.push(Reference {
            group: group.map(str::to_string),
            kind: kind.to_string(),
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
        });
    };
    if let Some(r) = object.pointer("/spec/providerConfigRef")
        && let Some(name) = str_at(r, "/name")
    {
        let kind = str_at(r, "/kind").unwrap_or("ProviderConfig");
        let namespace = (kind != "ClusterProviderConfig")
            .then_some(own_ns)
            .flatten();
        push(None, kind, namespace, name);
    }
    let mut secret = |pointer: &str| {
        if let Some(r) = object.pointer(pointer)
            && let Some(name) = str_at(r, "/name")
        {
            let namespace = str_at(r, "/namespace").or(own_ns);
            push(Some(""), "Secret", namespace, name);
        }
    };
    if matches!(
        own.kind.as_str(),
        "ProviderConfig" | "ClusterProviderConfig"
    ) {
        secret("/spec/credentials/secretRef");
    }
    secret("/spec/writeConnectionSecretToRef");
    let kubernetes_object = own.kind == "Object"
        && matches!(
            own.group.as_str(),
            "kubernetes.crossplane.io" | "kubernetes.m.crossplane.io"
        );
    if kubernetes_object {
        let entries = object.pointer("/spec/references").and_then(Value::as_array);
        for entry in entries.into_iter().flatten() {
            for target in ["dependsOn", "patchesFrom"].map(|f| entry.get(f)) {
                if let Some(t) = target
                    && let (Some(api_version), Some(kind), Some(name)) = (
                        str_at(t, "/apiVersion"),
                        str_at(t, "/kind"),
                        str_at(t, "/name"),
                    )
                {
                    let namespace = str_at(t, "/namespace").or(own_ns);
                    push(Some(group_of(api_version)), kind, namespace, name);
                }
            }
        }
    }
    // A Usage's two sides: the one outside the tree is read so that the
    // Usage resolves (the user of a standalone Usage is held for, the used
    // object it protects).
    let usage = matches!(own.kind.as_str(), "Usage" | "ClusterUsage")
        && matches!(
            own.group.as_str(),
            "protection.crossplane.io" | "apiextensions.crossplane.io"
        );
    if usage {
        let default = (own.kind == "Usage").then_some(own_ns).flatten();
        for side in ["/spec/of", "/spec/by"] {
            if let Some(s) = object.pointer(side)
                && let (Some(api_version), Some(kind), Some(name)) = (
                    str_at(s, "/apiVersion"),
                    str_at(s, "/kind"),
                    str_at(s, "/resourceRef/name"),
                )
            {
                let namespace = str_at(s, "/resourceRef/namespace").or(default);
                push(Some(group_of(api_version)), kind, namespace, name);
            }
        }
    }
    let annotation = object
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(NEEDS_ANNOTATION))
        .and_then(Value::as_str);
    for entry in annotation.map(parse_needs).into_iter().flatten().flatten() {
        if let NeedsEntry::Object {
            group,
            kind,
            namespace,
            name,
        } = entry
        {
            push(Some(&group), &kind, namespace.as_deref().or(own_ns), &name);
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An object whose uid is its identity, so that owners can name it.
    fn obj(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> Value {
        let uid = format!("{kind}/{}/{name}", namespace.unwrap_or(""));
        let mut metadata = json!({"name": name, "uid": uid});
        if let Some(ns) = namespace {
            metadata["namespace"] = json!(ns);
        }
        json!({"apiVersion": api_version, "kind": kind, "metadata": metadata})
    }

    fn uid(v: &Value) -> &str {
        str_at(v, "/metadata/uid").expect("uid")
    }

    fn owner_ref(owner: &Value, controller: bool, block: bool) -> Value {
        json!({
            "apiVersion": owner["apiVersion"], "kind": owner["kind"],
            "name": owner["metadata"]["name"], "uid": uid(owner),
            "controller": controller, "blockOwnerDeletion": block,
        })
    }

    /// Composed by `owner` (its controller).
    fn under(mut v: Value, owner: &Value) -> Value {
        let refs = &mut v["metadata"]["ownerReferences"];
        if refs.is_null() {
            *refs = json!([]);
        }
        if let Some(list) = refs.as_array_mut() {
            list.push(owner_ref(owner, true, true));
        }
        v
    }

    /// Also owned by `owner`, not as its controller.
    fn also_owned(mut v: Value, owner: &Value, block: bool) -> Value {
        let refs = &mut v["metadata"]["ownerReferences"];
        if refs.is_null() {
            *refs = json!([]);
        }
        if let Some(list) = refs.as_array_mut() {
            list.push(owner_ref(owner, false, block));
        }
        v
    }

    fn spec(mut v: Value, spec: Value) -> Value {
        v["spec"] = spec;
        v
    }

    fn annotate(mut v: Value, key: &str, value: &str) -> Value {
        v["metadata"]["annotations"][key] = json!(value);
        v
    }

    fn r(v: &Value) -> ObjectRef {
        ObjectRef::of_object(v).expect("identity")
    }

    fn xr(kind: &str, namespace: Option<&str>, name: &str) -> Value {
        obj("example.org/v1", kind, namespace, name)
    }

    fn pc(api_version: &str, namespace: Option<&str>, name: &str) -> Value {
        obj(api_version, "ProviderConfig", namespace, name)
    }

    fn mr(kind: &str, namespace: Option<&str>, name: &str, spec_: Value) -> Value {
        spec(obj("aws.upbound.io/v1beta1", kind, namespace, name), spec_)
    }

    fn secret(namespace: &str, name: &str) -> Value {
        obj("v1", "Secret", Some(namespace), name)
    }

    /// The first object is the root.
    fn graph_of(objects: &[Value]) -> Graph {
        graph(objects, uid(&objects[0])).expect("root")
    }

    fn edge_names(g: &Graph) -> Vec<(String, String, Provenance)> {
        let mut got: Vec<_> = g
            .edges
            .iter()
            .map(|e| (e.object.name.clone(), e.needs.name.clone(), e.provenance))
            .collect();
        got.sort();
        got
    }

    /// What, the objects (the first is the root), the edges by name, the problems.
    type RuleCase = (
        &'static str,
        Vec<Value>,
        Vec<(&'static str, &'static str, Provenance)>,
        Vec<ProblemReason>,
    );

    fn rule_cases() -> Vec<RuleCase> {
        use ProblemReason::*;
        use Provenance::*;
        let root = xr("XNet", None, "root");
        let team_root = xr("XNet", Some("team"), "root");
        let usage_spec = |of_ns: Option<&str>, by_ns: Option<&str>| {
            let side = |kind: &str, name: &str, ns: Option<&str>| {
                let mut s = json!({"apiVersion": "example.org/v1", "kind": kind,
                                   "resourceRef": {"name": name}});
                if let Some(ns) = ns {
                    s["resourceRef"]["namespace"] = json!(ns);
                }
                s
            };
            json!({"of": side("XDb", "db", of_ns), "by": side("XApp", "app", by_ns)})
        };
        let ec2 = |kind: &str, name: &str, for_provider: Value| {
            spec(
                obj("ec2.aws.upbound.io/v1beta1", kind, None, name),
                json!({"forProvider": for_provider}),
            )
        };
        vec![
            (
                "a resolved reference: a Subnet's vpcIdRef, by name among its provider's objects",
                vec![
                    root.clone(),
                    under(ec2("VPC", "net", json!({})), &root),
                    under(
                        ec2("Subnet", "sub", json!({"vpcIdRef": {"name": "net"}})),
                        &root,
                    ),
                    // Another provider's object of that name is not it.
                    under(obj("v1", "ConfigMap", None, "net"), &root),
                ],
                vec![("sub", "net", ResolvedReference)],
                vec![],
            ),
            (
                "resolved references: two of that name, none, a selector alone",
                vec![
                    root.clone(),
                    under(ec2("VPC", "net", json!({})), &root),
                    under(ec2("InternetGateway", "net", json!({})), &root),
                    under(
                        ec2(
                            "Subnet",
                            "sub",
                            json!({
                                "vpcIdRef": {"name": "net"},
                                "zoneRef": {"name": "gone"},
                                "clusterNameSelector": {"matchControllerRef": true},
                            }),
                        ),
                        &root,
                    ),
                ],
                vec![],
                vec![Unresolvable, Unresolvable, Unresolved],
            ),
            (
                "providerConfigRef: kind defaults to ProviderConfig, cluster-scoped",
                vec![
                    root.clone(),
                    under(pc("aws.upbound.io/v1beta1", None, "default"), &root),
                    under(
                        mr(
                            "VPC",
                            None,
                            "vpc",
                            json!({"providerConfigRef": {"name": "default"}}),
                        ),
                        &root,
                    ),
                ],
                vec![("vpc", "default", ProviderConfigRef)],
                vec![],
            ),
            (
                "providerConfigRef: a ClusterProviderConfig from a namespaced resource",
                vec![
                    team_root.clone(),
                    obj(
                        "aws.m.upbound.io/v1beta1",
                        "ClusterProviderConfig",
                        None,
                        "shared",
                    ),
                    under(
                        mr(
                            "VPC",
                            Some("team"),
                            "vpc",
                            json!({"providerConfigRef": {"name": "shared", "kind": "ClusterProviderConfig"}}),
                        ),
                        &team_root,
                    ),
                ],
                vec![("vpc", "shared", ProviderConfigRef)],
                vec![],
            ),
            (
                "providerConfigRef: a namespaced ProviderConfig in the resource's namespace",
                vec![
                    team_root.clone(),
                    pc("aws.m.upbound.io/v1beta1", Some("team"), "p"),
                    pc("aws.m.upbound.io/v1beta1", Some("other"), "p"),
                    under(
                        mr(
                            "VPC",
                            Some("team"),
                            "vpc",
                            json!({"providerConfigRef": {"name": "p", "kind": "ProviderConfig"}}),
                        ),
                        &team_root,
                    ),
                ],
                vec![("vpc", "p", ProviderConfigRef)],
                vec![],
            ),
            (
                "providerConfigRef: every API group with that kind and name",
                vec![
                    root.clone(),
                    pc("helm.crossplane.io/v1beta1", None, "prod"),
                    pc("kubernetes.crossplane.io/v1alpha1", None, "prod"),
                    under(
                        mr(
                            "VPC",
                            None,
                            "vpc",
                            json!({"providerConfigRef": {"name": "prod"}}),
                        ),
                        &root,
                    ),
                ],
                vec![
                    ("vpc", "prod", ProviderConfigRef),
                    ("vpc", "prod", ProviderConfigRef),
                ],
                vec![],
            ),
            (
                "providerConfigRef: naming nothing is a problem",
                vec![
                    root.clone(),
                    under(
                        mr(
                            "VPC",
                            None,
                            "vpc",
                            json!({"providerConfigRef": {"name": "missing"}}),
                        ),
                        &root,
                    ),
                ],
                vec![],
                vec![Unresolved],
            ),
            (
                "credentials.secretRef with a namespace",
                vec![
                    root.clone(),
                    under(
                        spec(
                            pc("helm.crossplane.io/v1beta1", None, "helm"),
                            json!({"credentials": {"source": "Secret",
                                   "secretRef": {"name": "kc", "namespace": "crossplane-system", "key": "k"}}}),
                        ),
                        &root,
                    ),
                    secret("crossplane-system", "kc"),
                ],
                vec![("helm", "kc", CredentialsSecretRef)],
                vec![],
            ),
            (
                "credentials.secretRef in the ProviderConfig's own namespace",
                vec![
                    team_root.clone(),
                    under(
                        spec(
                            pc("helm.m.crossplane.io/v1beta1", Some("team"), "helm"),
                            json!({"credentials": {"secretRef": {"name": "kc"}}}),
                        ),
                        &team_root,
                    ),
                    secret("team", "kc"),
                ],
                vec![("helm", "kc", CredentialsSecretRef)],
                vec![],
            ),
            (
                "writeConnectionSecretToRef with a namespace: the Secret needs its writer",
                vec![
                    root.clone(),
                    under(
                        mr(
                            "Cluster",
                            None,
                            "prod",
                            json!({"writeConnectionSecretToRef": {"name": "conn", "namespace": "crossplane-system"}}),
                        ),
                        &root,
                    ),
                    secret("crossplane-system", "conn"),
                ],
                vec![("conn", "prod", WriteConnectionSecretToRef)],
                vec![],
            ),
            (
                "writeConnectionSecretToRef in the writer's namespace",
                vec![
                    team_root.clone(),
                    under(
                        mr(
                            "Cluster",
                            Some("team"),
                            "prod",
                            json!({"writeConnectionSecretToRef": {"name": "conn"}}),
                        ),
                        &team_root,
                    ),
                    secret("team", "conn"),
                    secret("other", "conn"),
                ],
                vec![("conn", "prod", WriteConnectionSecretToRef)],
                vec![],
            ),
            (
                "a Secret needs its controller owner",
                vec![
                    root.clone(),
                    under(mr("Cluster", None, "prod", json!({})), &root),
                    under(
                        secret("crossplane-system", "conn"),
                        &mr("Cluster", None, "prod", json!({})),
                    ),
                ],
                vec![("conn", "prod", SecretController)],
                vec![],
            ),
            (
                "Usage (protection.crossplane.io, namespaced): by needs of",
                vec![
                    team_root.clone(),
                    under(xr("XApp", Some("team"), "app"), &team_root),
                    under(xr("XDb", Some("team"), "db"), &team_root),
                    under(
                        spec(
                            obj(
                                "protection.crossplane.io/v1beta1",
                                "Usage",
                                Some("team"),
                                "u",
                            ),
                            usage_spec(None, None),
                        ),
                        &team_root,
                    ),
                ],
                vec![("app", "db", Usage)],
                vec![],
            ),
            (
                "ClusterUsage",
                vec![
                    root.clone(),
                    under(xr("XApp", None, "app"), &root),
                    under(xr("XDb", None, "db"), &root),
                    spec(
                        obj(
                            "protection.crossplane.io/v1beta1",
                            "ClusterUsage",
                            None,
                            "u",
                        ),
                        usage_spec(None, None),
                    ),
                ],
                vec![("app", "db", Usage)],
                vec![],
            ),
            (
                "legacy Usage (apiextensions.crossplane.io, cluster-scoped)",
                vec![
                    root.clone(),
                    under(xr("XApp", None, "app"), &root),
                    under(xr("XDb", None, "db"), &root),
                    spec(
                        obj("apiextensions.crossplane.io/v1beta1", "Usage", None, "u"),
                        usage_spec(None, None),
                    ),
                ],
                vec![("app", "db", Usage)],
                vec![],
            ),
            (
                "Usage with only a resourceSelector: unresolvable, not guessed",
                vec![
                    root.clone(),
                    under(xr("XApp", None, "app"), &root),
                    under(xr("XDb", None, "db"), &root),
                    spec(
                        obj("apiextensions.crossplane.io/v1beta1", "Usage", None, "u"),
                        json!({
                            "of": {"apiVersion": "example.org/v1", "kind": "XDb",
                                   "resourceSelector": {"matchLabels": {"a": "b"}}},
                            "by": {"apiVersion": "example.org/v1", "kind": "XApp",
                                   "resourceRef": {"name": "app"}},
                        }),
                    ),
                ],
                vec![],
                vec![Unresolvable],
            ),
            (
                "provider-kubernetes Object: dependsOn and patchesFrom",
                vec![
                    root.clone(),
                    under(
                        spec(
                            obj("kubernetes.crossplane.io/v1alpha2", "Object", None, "o"),
                            json!({"references": [
                                {"dependsOn": {"apiVersion": "v1", "kind": "Namespace", "name": "apps"}},
                                {"patchesFrom": {"apiVersion": "v1", "kind": "ConfigMap",
                                                 "name": "cfg", "namespace": "team",
                                                 "fieldPath": "data.x"}},
                            ]}),
                        ),
                        &root,
                    ),
                    obj("v1", "Namespace", None, "apps"),
                    obj("v1", "ConfigMap", Some("team"), "cfg"),
                ],
                vec![("o", "apps", DependsOn), ("o", "cfg", PatchesFrom)],
                vec![],
            ),
            (
                "annotation: a composition resource name is a sibling",
                vec![
                    root.clone(),
                    under(
                        annotate(
                            xr("XCluster", None, "gen-x7k2"),
                            COMPOSITION_RESOURCE_NAME_ANNOTATION,
                            "cluster",
                        ),
                        &root,
                    ),
                    under(
                        annotate(xr("XApps", None, "gen-p9q1"), NEEDS_ANNOTATION, "cluster"),
                        &root,
                    ),
                ],
                vec![("gen-p9q1", "gen-x7k2", Annotation)],
                vec![],
            ),
            (
                "annotation: Kind.group/name and Kind/name in the object's namespace",
                vec![
                    team_root.clone(),
                    under(xr("XDb", Some("team"), "db"), &team_root),
                    secret("team", "s"),
                    under(
                        annotate(
                            xr("XApp", Some("team"), "app"),
                            NEEDS_ANNOTATION,
                            " XDb.example.org/db , Secret/s,",
                        ),
                        &team_root,
                    ),
                ],
                vec![("app", "db", Annotation), ("app", "s", Annotation)],
                vec![],
            ),
            (
                "annotation: Kind/namespace/name in another namespace",
                vec![
                    team_root.clone(),
                    secret("other", "s"),
                    under(
                        annotate(
                            xr("XApp", Some("team"), "app"),
                            NEEDS_ANNOTATION,
                            "Secret/other/s",
                        ),
                        &team_root,
                    ),
                ],
                vec![("app", "s", Annotation)],
                vec![],
            ),
            (
                "annotation: malformed entries and names of nothing are problems",
                vec![
                    root.clone(),
                    under(
                        annotate(
                            xr("XApp", None, "app"),
                            NEEDS_ANNOTATION,
                            "secret/x, A/b/c/d, no-such-resource, XDb.example.org/gone",
                        ),
                        &root,
                    ),
                ],
                vec![],
                vec![Malformed, Malformed, Unresolved, Unresolved],
            ),
            (
                "a blocking ownerReference other than the parent",
                vec![
                    root.clone(),
                    under(xr("XDb", None, "db"), &root),
                    also_owned(
                        under(xr("XApp", None, "app"), &root),
                        &xr("XDb", None, "db"),
                        true,
                    ),
                    also_owned(
                        under(xr("XLog", None, "log"), &root),
                        &xr("XDb", None, "db"),
                        false,
                    ),
                ],
                vec![("app", "db", OwnerReference)],
                vec![],
            ),
        ]
    }

    #[test]
    fn each_rule_reads_its_edges() {
        for (what, objects, want, problems) in rule_cases() {
            let g = graph_of(&objects);
            let mut want: Vec<_> = want
                .into_iter()
                .map(|(a, b, p)| (a.to_string(), b.to_string(), p))
                .collect();
            want.sort();
            assert_eq!(edge_names(&g), want, "{what}");
            let got: Vec<ProblemReason> = g.problems.iter().map(|p| p.reason).collect();
            assert_eq!(got, problems, "{what}: {:?}", g.problems);
        }
    }

    #[test]
    fn the_needs_annotation_syntax() {
        let object = |group: &str, kind: &str, namespace: Option<&str>, name: &str| {
            Ok(NeedsEntry::Object {
                group: group.into(),
                kind: kind.into(),
                namespace: namespace.map(str::to_string),
                name: name.into(),
            })
        };
        let bad = |entry: &str, why| {
            Err(MalformedNeeds {
                entry: entry.into(),
                why,
            })
        };
        let cases = [
            ("", vec![]),
            (" , ,", vec![]),
            (
                "cluster",
                vec![Ok(NeedsEntry::CompositionResource("cluster".into()))],
            ),
            (
                "Cluster.eks.aws.upbound.io/prod",
                vec![object("eks.aws.upbound.io", "Cluster", None, "prod")],
            ),
            ("Secret/s", vec![object("", "Secret", None, "s")]),
            (
                "Secret/ns/s, cluster",
                vec![
                    object("", "Secret", Some("ns"), "s"),
                    Ok(NeedsEntry::CompositionResource("cluster".into())),
                ],
            ),
            ("a b", vec![bad("a b", "it contains blanks")]),
            ("A/b/c/d", vec![bad("A/b/c/d", "it has more than two '/'")]),
            ("A//c", vec![bad("A//c", "a part between '/' is empty")]),
            ("/c", vec![bad("/c", "a part between '/' is empty")]),
            ("A./c", vec![bad("A./c", "the group after '.' is empty")]),
            (
                "secret/s",
                vec![bad(
                    "secret/s",
                    "a kind starts with a capital letter (Kind.group/name)",
                )],
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse_needs(text), want, "{text:?}");
        }
    }

    /// R owns X and Y; X owns X1 (which owns X11) and X2; Y owns Y1 (which
    /// owns Y11). All of kind T.
    fn lifting_tree(needer: &str, needed: &str) -> Vec<Value> {
        let t = |name: &str| {
            let o = xr("T", None, name);
            if name == needer {
                annotate(o, NEEDS_ANNOTATION, &format!("T.example.org/{needed}"))
            } else {
                o
            }
        };
        let root = t("r");
        let (x, y) = (under(t("x"), &root), under(t("y"), &root));
        let (x1, x2, y1) = (under(t("x1"), &x), under(t("x2"), &x), under(t("y1"), &y));
        let (x11, y11) = (under(t("x11"), &x1), under(t("y11"), &y1));
        vec![root, x, y, x1, x2, y1, x11, y11]
    }

    #[test]
    fn edges_lift_to_the_children_of_the_lowest_common_ancestor() {
        let t = |name: &str| ObjectRef::new("example.org", "T", None, name);
        let siblings = |p: &str, a: &str, b: &str| Relation::Siblings {
            parent: t(p),
            before: t(a),
            after: t(b),
        };
        let cases = [
            ("depth 1", "x", "y", siblings("r", "x", "y")),
            ("depth 2", "x1", "y1", siblings("r", "x", "y")),
            ("depth 3", "x11", "y11", siblings("r", "x", "y")),
            (
                "needed two levels down in a sibling XR",
                "x",
                "y11",
                siblings("r", "x", "y"),
            ),
            ("inside one XR", "x11", "x2", siblings("x", "x1", "x2")),
            ("an ancestor: already kept", "x11", "x", Relation::Satisfied),
            ("a descendant: conflict", "x", "x11", Relation::Conflict),
        ];
        for (what, needer, needed, want) in cases {
            let g = graph_of(&lifting_tree(needer, needed));
            assert!(g.problems.is_empty(), "{what}: {:?}", g.problems);
            assert_eq!(
                g.relation(&t(needer), &t(needed)),
                Some(want.clone()),
                "{what}"
            );
            let lifted: Vec<_> = g
                .sibling_edges
                .iter()
                .map(|s| (s.before.name.as_str(), s.after.name.as_str()))
                .collect();
            match want {
                Relation::Siblings { before, after, .. } => {
                    assert_eq!(
                        lifted,
                        [(before.name.as_str(), after.name.as_str())],
                        "{what}"
                    );
                    let reasons = &g.sibling_edges[0].reasons;
                    assert_eq!(reasons.len(), 1, "{what}");
                    assert_eq!(reasons[0].object, t(needer), "{what}");
                    assert!(g.conflicts.is_empty(), "{what}");
                }
                Relation::Conflict => {
                    assert!(lifted.is_empty(), "{what}");
                    assert_eq!(g.conflicts.len(), 1, "{what}");
                    let hazards = g.hazards(Teardown::Ordered);
                    assert_eq!(hazards.len(), 1, "{what}");
                    assert_eq!(hazards[0].kind, HazardKind::Conflict, "{what}");
                    assert!(g.hazards(Teardown::Background).is_empty(), "{what}");
                }
                _ => {
                    assert!(lifted.is_empty(), "{what}");
                    assert!(g.conflicts.is_empty(), "{what}");
                    assert!(g.hazards(Teardown::Foreground).is_empty(), "{what}");
                    assert_eq!(g.hazards(Teardown::Background).len(), 1, "{what}");
                }
            }
        }
    }

    #[test]
    fn cycles_of_two_and_three_siblings_are_reported_not_ordered() {
        // Each sibling needs the next, round the circle.
        let cases: [&[&str]; 2] = [&["a", "b"], &["a", "b", "c"]];
        for circle in cases {
            let root = xr("T", None, "r");
            let mut objects = vec![root.clone()];
            for (k, name) in circle.iter().enumerate() {
                let next = circle[(k + 1) % circle.len()];
                let o = annotate(
                    xr("T", None, name),
                    NEEDS_ANNOTATION,
                    &format!("T.example.org/{next}"),
                );
                objects.push(under(o, &root));
            }
            let leaf = under(xr("T", None, "a-child"), &objects[1]);
            let bystander = under(xr("T", None, "z"), &root);
            objects.extend([leaf, bystander]);
            let g = graph_of(&objects);
            assert_eq!(g.cycles.len(), 1, "{circle:?}");
            let cycle = &g.cycles[0];
            let names: Vec<&str> = cycle.objects.iter().map(|o| o.name.as_str()).collect();
            assert_eq!(names, circle, "{circle:?}");
            assert_eq!(cycle.edges.len(), circle.len(), "{circle:?}");
            assert!(cycle.edges.iter().all(|e| e.in_cycle));
            let node = |name: &str| {
                g.node(&ObjectRef::new("example.org", "T", None, name))
                    .expect("node")
            };
            for name in circle.iter().chain(&["a-child"]) {
                assert_eq!(node(name).cycle, Some(0), "{name}");
            }
            assert_eq!(node("z").cycle, None);
            // The fallback still puts every child before its parent.
            assert!(node("a-child").wave < node("a").wave);
            assert!(circle.iter().all(|n| node(n).wave < node("r").wave));
            let ordered = g.hazards(Teardown::Ordered);
            assert_eq!(ordered.len(), circle.len(), "{circle:?}");
            assert!(ordered.iter().all(|h| h.kind == HazardKind::Cycle));
            assert!(
                ordered[0]
                    .message
                    .contains("a cycle of needs among what T r owns"),
                "{}",
                ordered[0]
            );
        }
    }

    /// Who composes the Usage of EKSCluster by ServingStack, if there is one.
    #[derive(Clone, Copy, Debug)]
    enum SeedUsage {
        None,
        /// Composed by InferenceCluster, the common parent.
        ComposedBeside,
        /// Composed by InferenceCluster, and also owned (not controlled) by
        /// ServingStack, as Crossplane's Usage controller makes it: still
        /// held, as the seed's tree is on real Crossplane.
        OwnedByUser,
        /// Composed by ServingStack itself.
        ComposedByUser,
    }

    /// The seed report's tree: InferenceCluster prod composes EKSCluster
    /// prod-eks (a Cluster writing Secret prod-conn, and ProviderConfigs
    /// prod-helm and prod-kubeconfig reading it) and ServingStack
    /// prod-serving (three Releases on prod-helm, an Object on
    /// prod-kubeconfig).
    fn seed(usage: SeedUsage) -> Vec<Value> {
        let ic = obj("modelplane.ai/v1alpha1", "InferenceCluster", None, "prod");
        let eks = under(
            obj(
                "infrastructure.modelplane.ai/v1alpha1",
                "EKSCluster",
                None,
                "prod-eks",
            ),
            &ic,
        );
        let serving = under(
            obj(
                "serving.modelplane.ai/v1alpha1",
                "ServingStack",
                None,
                "prod-serving",
            ),
            &ic,
        );
        let cluster = under(
            spec(
                obj("eks.aws.upbound.io/v1beta1", "Cluster", None, "prod"),
                json!({"writeConnectionSecretToRef": {"name": "prod-conn", "namespace": "crossplane-system"}}),
            ),
            &eks,
        );
        let conn = under(secret("crossplane-system", "prod-conn"), &cluster);
        let credentials = json!({"credentials": {"source": "Secret",
            "secretRef": {"name": "prod-conn", "namespace": "crossplane-system", "key": "kubeconfig"}}});
        let helm = under(
            spec(
                pc("helm.crossplane.io/v1beta1", None, "prod-helm"),
                credentials.clone(),
            ),
            &eks,
        );
        let kube = under(
            spec(
                pc("kubernetes.crossplane.io/v1alpha1", None, "prod-kubeconfig"),
                credentials,
            ),
            &eks,
        );
        let release = |name: &str| {
            under(
                spec(
                    obj("helm.crossplane.io/v1beta1", "Release", None, name),
                    json!({"providerConfigRef": {"name": "prod-helm"}}),
                ),
                &serving,
            )
        };
        let object = under(
            spec(
                obj(
                    "kubernetes.crossplane.io/v1alpha2",
                    "Object",
                    None,
                    "prod-namespace",
                ),
                json!({"providerConfigRef": {"name": "prod-kubeconfig"}}),
            ),
            &serving,
        );
        let mut objects = vec![
            ic.clone(),
            eks,
            serving.clone(),
            cluster,
            conn,
            helm,
            kube,
            release("prod-cert-manager"),
            release("prod-ingress"),
            release("prod-vllm"),
            object,
        ];
        let the_usage = spec(
            obj(
                "apiextensions.crossplane.io/v1beta1",
                "Usage",
                None,
                "prod-serving-uses-eks",
            ),
            json!({
                "of": {"apiVersion": "infrastructure.modelplane.ai/v1alpha1", "kind": "EKSCluster",
                       "resourceRef": {"name": "prod-eks"}},
                "by": {"apiVersion": "serving.modelplane.ai/v1alpha1", "kind": "ServingStack",
                       "resourceRef": {"name": "prod-serving"}},
            }),
        );
        match usage {
            SeedUsage::None => {}
            SeedUsage::ComposedBeside => objects.push(under(the_usage, &ic)),
            SeedUsage::OwnedByUser => {
                objects.push(also_owned(under(the_usage, &ic), &serving, false))
            }
            SeedUsage::ComposedByUser => objects.push(under(the_usage, &serving)),
        }
        objects
    }

    fn names(objects: &[ObjectRef]) -> Vec<String> {
        objects.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn the_seed_tree_leaves_serving_before_the_cluster() {
        let g = graph_of(&seed(SeedUsage::ComposedBeside));
        assert!(g.problems.is_empty(), "{:?}", g.problems);
        assert!(g.cycles.is_empty() && g.conflicts.is_empty());
        let waves: Vec<Vec<String>> = g.waves.iter().map(|w| names(w)).collect();
        assert_eq!(
            waves,
            [
                vec![
                    "Object prod-namespace",
                    "Release prod-cert-manager",
                    "Release prod-ingress",
                    "Release prod-vllm",
                    "Usage prod-serving-uses-eks",
                ],
                vec!["ServingStack prod-serving"],
                vec![
                    "ProviderConfig.helm.crossplane.io prod-helm",
                    "ProviderConfig.kubernetes.crossplane.io prod-kubeconfig"
                ],
                vec!["Secret crossplane-system/prod-conn"],
                vec!["Cluster prod"],
                vec!["EKSCluster prod-eks"],
                vec!["InferenceCluster prod"],
            ]
        );
        let sibling: Vec<String> = g
            .sibling_edges
            .iter()
            .map(|s| format!("{} before {}: {}", s.before, s.after, s.reasons.len()))
            .collect();
        assert_eq!(
            sibling,
            [
                "ProviderConfig.helm.crossplane.io prod-helm before Cluster prod: 1",
                "ProviderConfig.kubernetes.crossplane.io prod-kubeconfig before Cluster prod: 1",
                "ServingStack prod-serving before EKSCluster prod-eks: 5",
            ]
        );
        // All of ServingStack's subtree leaves before any of EKSCluster's.
        let subtree_waves = |top: &str| -> Vec<usize> {
            g.nodes
                .iter()
                .filter(|n| {
                    n.object.name == top
                        || matches!(
                            g.relation(
                                &n.object,
                                &g.nodes
                                    .iter()
                                    .find(|m| m.object.name == top)
                                    .expect("top")
                                    .object
                            ),
                            Some(Relation::Satisfied)
                        )
                })
                .filter_map(|n| n.wave)
                .collect()
        };
        let serving = subtree_waves("prod-serving");
        let eks = subtree_waves("prod-eks");
        assert_eq!(serving.len(), 5);
        assert_eq!(eks.len(), 5);
        assert!(serving.iter().max() < eks.iter().min());
    }

    #[test]
    fn the_seed_trees_hazards_by_teardown_and_usage() {
        use SeedUsage::*;
        use Teardown::*;
        let four = vec![
            "prod-cert-manager",
            "prod-ingress",
            "prod-namespace",
            "prod-vllm",
        ];
        let five = vec![
            "prod-cert-manager",
            "prod-ingress",
            "prod-namespace",
            "prod-serving",
            "prod-vllm",
        ];
        let cases = [
            (None, Foreground, four.clone()),
            (ComposedBeside, Foreground, vec![]),
            (OwnedByUser, Foreground, vec![]),
            (ComposedByUser, Foreground, five),
            (None, Background, four.clone()),
            (ComposedBeside, Background, four.clone()),
            (OwnedByUser, Background, four),
            (None, Ordered, vec![]),
            (ComposedBeside, Ordered, vec![]),
            (OwnedByUser, Ordered, vec![]),
        ];
        for (usage, teardown, want) in cases {
            let g = graph_of(&seed(usage));
            let hazards = g.hazards(teardown);
            let mut got: Vec<&str> = hazards
                .iter()
                .map(|h| h.need.object.name.as_str())
                .collect();
            got.sort();
            assert_eq!(got, want, "{usage:?} {teardown:?}: {hazards:#?}");
            assert!(hazards.iter().all(|h| h.teardown == teardown));
        }
        let g = graph_of(&seed(None));
        let sentences: Vec<String> = g
            .hazards(Foreground)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(sentences.contains(&"Release prod-cert-manager needs Cluster prod (through ProviderConfig.helm.crossplane.io prod-helm and Secret crossplane-system/prod-conn): ServingStack prod-serving and EKSCluster prod-eks are deleted at the same time".to_string()), "{sentences:#?}");
        assert!(sentences.contains(&"Object prod-namespace needs Cluster prod (through ProviderConfig.kubernetes.crossplane.io prod-kubeconfig and Secret crossplane-system/prod-conn): ServingStack prod-serving and EKSCluster prod-eks are deleted at the same time".to_string()), "{sentences:#?}");
        let background: Vec<String> = g
            .hazards(Background)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(background.contains(&"Release prod-vllm needs Cluster prod (through ProviderConfig.helm.crossplane.io prod-helm and Secret crossplane-system/prod-conn): a Background delete takes EKSCluster prod-eks without waiting for ServingStack prod-serving".to_string()), "{background:#?}");
    }

    #[test]
    fn a_provider_config_composed_beside_its_users_leaves_after_them() {
        let root = xr("XNet", None, "net");
        let objects = vec![
            root.clone(),
            under(pc("aws.upbound.io/v1beta1", None, "net-pc"), &root),
            under(
                mr(
                    "VPC",
                    None,
                    "vpc",
                    json!({"providerConfigRef": {"name": "net-pc"}}),
                ),
                &root,
            ),
            under(
                mr(
                    "Subnet",
                    None,
                    "subnet",
                    json!({"providerConfigRef": {"name": "net-pc"}}),
                ),
                &root,
            ),
        ];
        let g = graph_of(&objects);
        let wave = |v: &Value| g.wave(&r(v)).expect("wave");
        assert!(wave(&objects[2]) < wave(&objects[1]));
        assert!(wave(&objects[3]) < wave(&objects[1]));
        assert!(wave(&objects[1]) < wave(&root));
        assert_eq!(g.hazards(Teardown::Foreground).len(), 2);
        assert!(g.hazards(Teardown::Ordered).is_empty());
    }

    #[test]
    fn objects_outside_the_tree_order_nothing_and_one_needing_it_is_its_outside_user() {
        let root = xr("XNet", None, "net");
        let outside_pc = spec(
            pc("aws.upbound.io/v1beta1", None, "shared"),
            json!({"credentials": {"secretRef": {"name": "creds", "namespace": "crossplane-system"}}}),
        );
        let inside_pc = under(pc("helm.crossplane.io/v1beta1", None, "inside"), &root);
        let objects = vec![
            root.clone(),
            under(
                mr(
                    "VPC",
                    None,
                    "vpc",
                    json!({"providerConfigRef": {"name": "shared"}}),
                ),
                &root,
            ),
            inside_pc,
            outside_pc.clone(),
            secret("crossplane-system", "creds"),
            // An object outside the tree that needs one inside it.
            spec(
                obj("helm.crossplane.io/v1beta1", "Release", None, "elsewhere"),
                json!({"providerConfigRef": {"name": "inside"}}),
            ),
        ];
        let g = graph_of(&objects);
        assert!(g.problems.is_empty(), "{:?}", g.problems);
        assert_eq!(g.edges.len(), 3);
        // The Release outside needs the ProviderConfig inside: the cascade
        // never deletes it, so a Background or Foreground delete takes the
        // ProviderConfig from under it; ordered teardown holds it.
        let users: Vec<String> = g.outside_users().iter().map(ToString::to_string).collect();
        assert_eq!(
            users,
            vec![
                "Release elsewhere needs ProviderConfig.helm.crossplane.io inside (spec.providerConfigRef)"
            ]
        );
        for teardown in Teardown::ALL {
            let kinds: Vec<HazardKind> = g.hazards(teardown).iter().map(|h| h.kind).collect();
            let want = match teardown {
                Teardown::Ordered => vec![],
                _ => vec![HazardKind::OutsideUser],
            };
            assert_eq!(kinds, want, "{teardown:?}");
        }
        assert!(g.sibling_edges.is_empty());
        let node = g.node(&r(&outside_pc)).expect("shown");
        assert!(!node.in_tree && node.wave.is_none() && node.depth.is_none());
        assert_eq!(g.waves.iter().map(Vec::len).sum::<usize>(), 3);
    }

    /// Checks what waves promise: children before parents, and for every
    /// edge of the tree not in a cycle nor a conflict, the needer before
    /// what it needs.
    fn assert_waves_consistent(g: &Graph, what: &str) {
        for n in g.nodes.iter().filter(|n| n.in_tree) {
            let wave = n.wave.expect("every object of the tree has a wave");
            if let Some(p) = &n.parent {
                assert!(
                    wave < g.wave(p).expect("parent wave"),
                    "{what}: {} under {p}",
                    n.object
                );
            }
        }
        for e in &g.edges {
            let ordered = match g.relation(&e.object, &e.needs) {
                Some(Relation::Satisfied) => true,
                Some(Relation::Siblings { before, after, .. }) => g
                    .sibling_edges
                    .iter()
                    .any(|s| s.before == before && s.after == after && !s.in_cycle),
                _ => false,
            };
            if ordered {
                assert!(g.wave(&e.object) < g.wave(&e.needs), "{what}: {e}");
            }
        }
    }

    #[test]
    fn a_tree_of_two_hundred_objects() {
        // Twenty stacks under one root; the resources of each use the
        // ProviderConfig of the stack before.
        let root = xr("XPlatform", None, "platform");
        let mut objects = vec![root.clone()];
        for i in 0..20 {
            let stack = under(xr("XStack", None, &format!("stack-{i}")), &root);
            objects.push(under(
                pc("aws.upbound.io/v1beta1", None, &format!("pc-{i}")),
                &stack,
            ));
            for j in 0..8 {
                let uses = format!("pc-{}", i.max(1) - 1);
                let name = format!("bucket-{i}-{j}");
                let m = mr(
                    "Bucket",
                    None,
                    &name,
                    json!({"providerConfigRef": {"name": uses}}),
                );
                objects.push(under(m, &stack));
            }
            objects.push(stack);
        }
        assert_eq!(objects.len(), 201);
        let started = std::time::Instant::now();
        let g = graph_of(&objects);
        let hazards = g.hazards(Teardown::Foreground);
        eprintln!("201 objects: {:?}", started.elapsed());
        assert!(g.problems.is_empty() && g.cycles.is_empty() && g.conflicts.is_empty());
        // Stacks 1 to 19 use the stack before; stack 0 its own ProviderConfig,
        // composed beside its buckets: all 160 are deleted with what they need.
        assert_eq!(hazards.len(), 20 * 8);
        assert!(g.hazards(Teardown::Ordered).is_empty());
        assert_waves_consistent(&g, "200 objects");
        let first = |i: usize| g.wave(&r(&xr("XStack", None, &format!("stack-{i}"))));
        assert!(first(19) < first(0));
    }

    use crate::test_rng::Rng;

    #[test]
    fn random_trees_keep_needers_before_needed_and_children_before_parents() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for round in 0..60 {
            let in_tree = 2 + rng.below(40);
            let total = in_tree + rng.below(5);
            let name = |i: usize| format!("t{i}");
            let mut objects: Vec<Value> = (0..total)
                .map(|i| {
                    // Some go-betweens, so needs run through them.
                    if i % 7 == 3 {
                        obj("v1", "ConfigMap", None, &name(i))
                    } else {
                        xr("T", None, &name(i))
                    }
                })
                .collect();
            for i in 1..in_tree {
                let parent = objects[rng.below(i)].clone();
                objects[i] = under(objects[i].clone(), &parent);
            }
            for (i, object) in objects.iter_mut().enumerate() {
                let entries: Vec<String> = (0..rng.below(3))
                    .map(|_| rng.below(total))
                    .filter(|&j| j != i)
                    .map(|j| match j % 7 {
                        3 => format!("ConfigMap/{}", name(j)),
                        _ => format!("T.example.org/{}", name(j)),
                    })
                    .collect();
                if !entries.is_empty() {
                    *object = annotate(object.take(), NEEDS_ANNOTATION, &entries.join(","));
                }
            }
            let g = graph_of(&objects);
            let what = format!("round {round}");
            assert!(g.problems.is_empty(), "{what}: {:?}", g.problems);
            assert_waves_consistent(&g, &what);
            for h in g.hazards(Teardown::Ordered) {
                assert!(
                    matches!(h.kind, HazardKind::Conflict | HazardKind::Cycle),
                    "{what}: {h}"
                );
            }
            for c in &g.cycles {
                assert!(c.objects.len() > 1 && !c.edges.is_empty(), "{what}");
            }
        }
    }

    #[test]
    fn the_root_must_be_among_the_objects() {
        let objects = vec![xr("T", None, "a"), json!({"kind": "NoName"})];
        assert_eq!(
            graph(&objects, "nope").map(|_| ()),
            Err(RootNotFound { uid: "nope".into() })
        );
        let g = graph(&objects, uid(&objects[0])).expect("root");
        assert_eq!(g.problems.len(), 1);
        assert_eq!(g.problems[0].reason, ProblemReason::Unidentified);
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

    #[test]
    fn references_name_what_a_reader_must_fetch() {
        let r = |group: Option<&str>, kind: &str, ns: Option<&str>, name: &str| Reference {
            group: group.map(str::to_string),
            kind: kind.to_string(),
            namespace: ns.map(str::to_string),
            name: name.to_string(),
        };
        let mut release = obj(
            "helm.m.crossplane.io/v1beta1",
            "Release",
            Some("apps"),
            "web",
        );
        release["spec"] = json!({"providerConfigRef": {"name": "helm"}});
        let mut cluster_pc = obj("helm.crossplane.io/v1beta1", "Release", None, "legacy");
        cluster_pc["spec"] =
            json!({"providerConfigRef": {"name": "all", "kind": "ClusterProviderConfig"}});
        let mut pc = obj(
            "helm.m.crossplane.io/v1beta1",
            "ProviderConfig",
            Some("apps"),
            "helm",
        );
        pc["spec"] = json!({"credentials": {"secretRef": {"name": "kubeconfig", "key": "k"}}});
        let mut writer = obj("cloud.example.org/v1", "Cluster", Some("apps"), "prod");
        writer["spec"] =
            json!({"writeConnectionSecretToRef": {"name": "conn", "namespace": "sys"}});
        let mut object = obj(
            "kubernetes.m.crossplane.io/v1alpha1",
            "Object",
            Some("apps"),
            "o",
        );
        object["spec"] = json!({"references": [
            {"dependsOn": {"apiVersion": "v1", "kind": "Namespace", "name": "team"},
             "patchesFrom": {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "namespace": "x"}},
            {"dependsOn": {"kind": "Broken"}},
        ]});
        let mut annotated = obj("example.org/v1", "Thing", Some("apps"), "t");
        annotated["metadata"]["annotations"] = json!({NEEDS_ANNOTATION:
            "sibling, Database.db.example.org/main, Secret/other/creds, not valid"});
        let mut usage = obj(
            "protection.crossplane.io/v1beta1",
            "Usage",
            Some("apps"),
            "u",
        );
        usage["spec"] = json!({
            "of": {"apiVersion": "infra.example.org/v1", "kind": "Hub", "resourceRef": {"name": "hub"}},
            "by": {"apiVersion": "infra.example.org/v1", "kind": "Wheel", "resourceRef": {"name": "wheel", "namespace": "other"}},
        });
        let mut cluster_usage = obj(
            "protection.crossplane.io/v1beta1",
            "ClusterUsage",
            None,
            "cu",
        );
        cluster_usage["spec"] = json!({
            "of": {"apiVersion": "example.org/v1", "kind": "Hub", "resourceRef": {"name": "hub"}},
            "by": {"apiVersion": "example.org/v1", "kind": "Wheel", "resourceSelector": {"matchLabels": {"a": "b"}}},
        });
        let cases: Vec<(&str, &Value, Vec<Reference>)> = vec![
            (
                "a Usage's two sides, in its namespace unless they name one",
                &usage,
                vec![
                    r(Some("infra.example.org"), "Hub", Some("apps"), "hub"),
                    r(Some("infra.example.org"), "Wheel", Some("other"), "wheel"),
                ],
            ),
            (
                "a ClusterUsage's sides are cluster-scoped; a selector is not followed",
                &cluster_usage,
                vec![r(Some("example.org"), "Hub", None, "hub")],
            ),
            (
                "providerConfigRef in the object's namespace",
                &release,
                vec![r(None, "ProviderConfig", Some("apps"), "helm")],
            ),
            (
                "ClusterProviderConfig has no namespace",
                &cluster_pc,
                vec![r(None, "ClusterProviderConfig", None, "all")],
            ),
            (
                "a ProviderConfig's credentials",
                &pc,
                vec![r(Some(""), "Secret", Some("apps"), "kubeconfig")],
            ),
            (
                "the connection Secret it writes",
                &writer,
                vec![r(Some(""), "Secret", Some("sys"), "conn")],
            ),
            (
                "an Object's dependsOn and patchesFrom, the broken one left out",
                &object,
                vec![
                    r(Some(""), "ConfigMap", Some("x"), "cm"),
                    r(Some(""), "Namespace", Some("apps"), "team"),
                ],
            ),
            (
                "the annotation's objects, not its siblings or malformed entries",
                &annotated,
                vec![
                    r(Some("db.example.org"), "Database", Some("apps"), "main"),
                    r(Some(""), "Secret", Some("other"), "creds"),
                ],
            ),
        ];
        for (what, object, want) in cases {
            let mut want = want;
            want.sort();
            assert_eq!(references(object), want, "{what}");
        }
        assert!(references(&json!({"kind": "NoName"})).is_empty());
    }

    #[test]
    fn a_provider_config_ref_prefers_its_providers_group() {
        let cases = [
            ("helm.m.crossplane.io", "helm.m.crossplane.io", true),
            ("ec2.aws.upbound.io", "aws.upbound.io", true),
            ("helm.m.crossplane.io", "kubernetes.m.crossplane.io", false),
            ("xaws.upbound.io", "aws.upbound.io", false),
            ("helm.crossplane.io", "", false),
        ];
        for (group, provider, want) in cases {
            assert_eq!(group_family(group, provider), want, "{group} {provider}");
        }
        let root = obj("example.org/v1", "XR", Some("ns"), "root");
        let mut release = under(
            obj("helm.m.crossplane.io/v1beta1", "Release", Some("ns"), "web"),
            &root,
        );
        release["spec"] = json!({"providerConfigRef": {"name": "conn"}});
        let helm = under(
            obj(
                "helm.m.crossplane.io/v1beta1",
                "ProviderConfig",
                Some("ns"),
                "conn",
            ),
            &root,
        );
        let kubernetes = under(
            obj(
                "kubernetes.m.crossplane.io/v1alpha1",
                "ProviderConfig",
                Some("ns"),
                "conn",
            ),
            &root,
        );
        let g = graph_of(&[root, release, helm, kubernetes]);
        let needed: Vec<&str> = g
            .edges
            .iter()
            .filter(|e| e.object.name == "web")
            .map(|e| e.needs.group.as_str())
            .collect();
        assert_eq!(needed, ["helm.m.crossplane.io"]);
    }
}
