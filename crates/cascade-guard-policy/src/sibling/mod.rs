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
//! [`graph::graph`] reads, purely from the objects, the edges "A needs B"
//! (B must not go until A is gone, [`edge`]), lifts them to edges between
//! siblings ([`lifting`]), orders the tree in waves ([`graph::Graph::waves`]) and names what
//! each way of deleting it ([`hazards::Teardown`]) would break
//! ([`hazards`]). [`references`] says what a reader of the cluster must fetch
//! beside the tree for the graph to follow its references.
//!
//! cascade-guard keeps that order with holds: [`hold`] says what to hold and
//! let go in a tree, [`holds_record`] is the record of what is held, and
//! [`hold_policy`] the admission policy that refuses the delete of what it
//! names. [`gate`] refuses the delete of a root whose tree has not been
//! ordered, [`roots`] says which objects begin a tree, and
//! [`provider_config_usage`] which usages a provider must keep until it is
//! done.

mod builder;
pub mod edge;
pub mod gate;
pub mod graph;
pub mod hazards;
pub mod hold;
pub mod hold_policy;
pub mod holds_record;
mod index;
pub mod lifting;
mod needs;
pub mod needs_annotation;
pub mod object;
pub mod provider_config_usage;
pub mod references;
pub mod resolved_references;
pub mod roots;
mod rules;
#[cfg(test)]
mod test_objects;
mod waves;
