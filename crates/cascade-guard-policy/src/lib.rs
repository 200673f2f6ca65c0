//! What a deletion policy means and what a delete may do, with no I/O: this
//! crate depends on no Kubernetes client, async runtime or network library,
//! so the rules can only be pure functions of their inputs.
//!
//! Flow: [`xrd`] and [`mod@resolve`] turn XRDs, CascadePolicies (their spec and
//! its one reader in [`cascade_policy`]) and CRDs into
//! [`resolve::Policy`]s; [`decision`] says which deletes each allows;
//! [`cel`] states the same rules in CEL and [`admission`] wraps them in
//! ValidatingAdmissionPolicies and bindings (one pair for all the XRDs of a
//! mode and shape, one per CascadePolicy, named by [`naming`]); [`sync`] is
//! one pass of the controller's admission sync (the last good policies
//! kept, the admission plan [`plan::plan`], [`plan::diff`]), which `status`
//! runs too; [`mod@render`] does all of it for a set of documents. [`cascade`]
//! is Convert's state machine, [`stall`] tells a stalled cascade from a slow
//! one, [`holders`] says what keeps a deleting object (its finalizers and
//! dependents), and [`composed`] reads what an XR composes. [`sibling`] is
//! sibling order: which objects of a live tree need which, the order its
//! siblings must go in (the teardown plan `plan` shows), what a Background
//! or Foreground delete of it would break, and the holds and the gate that
//! keep that order. [`static_manifest`] writes the compiled objects as files
//! the API server serves on its own.
//!
//! # Glossary
//!
//! - **tree**: an object and everything it owns, down the owner references
//!   (its controller owner, else its first owner): what a cascading delete
//!   of that object takes.
//! - **root**: the object a tree begins at: one with no controller, or
//!   whose controller is gone ([`sibling::roots`]).
//! - **cascade**: the garbage collector deleting what a deleted object owned;
//!   Background (the owner goes at once) or Foreground (the owner waits for
//!   its dependents, but deletes all the children of a parent at once).
//!   Convert turns a delete into a Foreground one ([`cascade`]).
//! - **sibling order**: deleting the children of a parent in the order their
//!   needs ask for, each with a foreground cascade ([`sibling`]).
//! - **need**: "A needs B": B must not go until A is gone, read from a
//!   reference, a Usage, an owner or the `cascade-guard.dev/needs`
//!   annotation ([`sibling::edge`]), directly or through go-betweens.
//! - **go-between**: a ProviderConfig, ClusterProviderConfig, Secret or
//!   ConfigMap: it does nothing of its own while deleted, and needs what it
//!   needs only for whoever reads it ([`sibling::object::is_go_between`]).
//! - **wave**: when an object of a tree leaves under sibling order, wave 0
//!   first ([`sibling::graph::Graph::waves`]).
//! - **hold**: sibling order's entry for an object in its record, by which
//!   its admission policy refuses the object's delete until what needs it is
//!   gone ([`sibling::hold`], [`sibling::holds_record`],
//!   [`sibling::hold_policy`]). Not Convert's finalizer
//!   ([`names::FOREGROUND_CASCADE_FINALIZER`]), which keeps a deleted object until cascade-guard
//!   re-issues its delete as a Foreground one.
//! - **outside user**: an object outside a tree that needs something inside
//!   it: the cascade never deletes it, so what it needs is held until it is
//!   gone ([`sibling::graph::Graph::outside_users`]).

pub mod admission;
pub mod cascade;
pub mod cascade_policy;
pub mod cel;
pub mod composed;
pub mod decision;
pub mod drift;
pub mod holders;
pub mod kind;
pub mod last_good;
pub mod mode;
pub mod names;
pub mod naming;
pub mod plan;
pub mod refusal;
pub mod render;
pub mod replay;
pub mod resolve;
pub mod selector;
pub mod settings;
pub mod shown;
pub mod sibling;
pub mod stall;
pub mod static_manifest;
pub mod sync;
#[cfg(test)]
mod target_fuzz;
#[cfg(test)]
mod test_rng;
pub mod xrd;
pub mod yaml_stream;

pub use admission::{Compiled, object_names};
pub use cascade_policy::CascadePolicySpec;
pub use composed::{ComposedResource, ComposedResources, composed_resources};
pub use decision::{DeleteRequest, ObjectState, Propagation, Verdict, decide};
pub use kind::{ProtectedKind, Scope, Shape};
pub use mode::Mode;
pub use naming::{PairName, object_name, update_object_name};
pub use render::{Rendered, render};
pub use resolve::{
    CascadePolicyInput, CrdInfo, Inputs, Policy, Problem, Resolution, Severity, Source, Subject,
    XrdInput, resolve,
};
pub use settings::CompileSettings;
pub use yaml_stream::{split_yaml_documents, to_yaml_stream};
