//! What needs what, as read from the objects (pure): the edges, where each
//! was read ([`Provenance`]), and the needs they add up to.
//!
//! # Where edges come from
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
//!   a [`ReadProblem`](super::graph::ReadProblem): cascade-guard does not guess.
//! - A blocking ownerReference that is not the object's parent: the object
//!   needs that owner (the owner waits for it).
//! - The annotation [`NEEDS_ANNOTATION`](super::needs_annotation::NEEDS_ANNOTATION), see
//!   [`super::needs_annotation`].
//!
//! A reference that names nothing among the objects, or cannot be read, is a
//! [`ReadProblem`](super::graph::ReadProblem); nothing is dropped silently.

use std::fmt;

use serde::Serialize;

use super::object::{ObjectRef, join_words};

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
    /// `<field>Ref(s)`, see [`crate::sibling::resolved_references`]).
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
