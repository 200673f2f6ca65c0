//! What a deletion policy means and what a delete may do, with no I/O: this
//! crate depends on no Kubernetes client, async runtime or network library,
//! so the rules can only be pure functions of their inputs.
//!
//! Flow: [`xrd`] and [`resolve`] turn XRDs, CascadePolicies (their spec and
//! its one reader in [`cascade_policy`]) and CRDs into
//! [`resolve::Policy`]s; [`decision`] says which deletes each allows;
//! [`cel`] states the same rules in CEL and [`admission`] wraps them in
//! ValidatingAdmissionPolicies and bindings (one pair for all the XRDs of a
//! mode and shape, one per CascadePolicy, named by [`naming`]); [`sync`] is
//! one pass of the controller's admission sync (the last good policies
//! kept, [`plan::plan`], [`plan::diff`]), which `status` runs too; [`render`] does all of it
//! for a set of documents. [`cascade`] is Convert's state machine, [`stall`] tells a
//! stalled cascade from a slow one, [`holders`] says what holds an object,
//! and [`composed`] reads what an XR composes. [`order`] reads which objects
//! of a live tree need which, the order its siblings must go in, and what a
//! Background or Foreground delete of it would break, [`roots`] which
//! objects begin such a tree, [`hold`] what sibling order holds and lets
//! go, and [`provider_config_usage`] the usages a provider must keep until
//! it is done. [`static_manifest`]
//! writes the compiled objects as files the API server serves on its own.

pub mod admission;
pub mod cascade;
pub mod cascade_policy;
pub mod cel;
pub mod composed;
pub mod decision;
pub mod drift;
pub mod hold;
pub mod holders;
pub mod kind;
pub mod last_good;
pub mod mode;
pub mod names;
pub mod naming;
pub mod order;
pub mod order_gate;
pub mod plan;
pub mod provider_config_usage;
pub mod refusal;
pub mod render;
pub mod replay;
pub mod resolve;
pub mod resolved_references;
pub mod roots;
pub mod selector;
pub mod settings;
pub mod shown;
pub mod stall;
pub mod static_manifest;
pub mod sync;
#[cfg(test)]
mod target_fuzz;
#[cfg(test)]
mod test_rng;
pub mod xrd;

pub use admission::{Compiled, object_names};
pub use cascade_policy::CascadePolicySpec;
pub use composed::{ComposedResource, ComposedResources, composed_resources};
pub use decision::{DeleteRequest, ObjectState, Propagation, Verdict, decide};
pub use kind::{ProtectedKind, Scope, Shape};
pub use mode::Mode;
pub use naming::{PairName, object_name, update_object_name};
pub use render::{Rendered, render, split_yaml_documents, to_yaml_stream};
pub use resolve::{
    CascadePolicyInput, CrdInfo, Inputs, Policy, Problem, Resolution, Severity, Source, Subject,
    XrdInput, resolve,
};
pub use settings::CompileSettings;
