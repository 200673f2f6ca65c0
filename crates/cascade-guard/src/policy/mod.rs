//! What a deletion policy means, with no I/O.
//!
//! Flow: [`xrd`] and [`resolve`] turn XRDs, CascadePolicies and CRDs into
//! [`resolve::Policy`]s; [`decision`] says which deletes each allows;
//! [`cel`] states the same rules in CEL and [`admission`] wraps them in a
//! ValidatingAdmissionPolicy and binding; [`render`] does all of it for a set
//! of documents.

pub mod admission;
pub mod cel;
pub mod decision;
pub mod drift;
pub mod kind;
pub mod last_good;
pub mod mode;
pub mod names;
pub mod render;
pub mod resolve;
pub mod selector;
pub mod xrd;

pub use admission::{
    CompileSettings, Compiled, compile, object_name, object_names, update_object_name,
};
pub use decision::{DeleteRequest, ObjectState, Propagation, Verdict, decide};
pub use kind::{ProtectedKind, Scope, Shape};
pub use mode::Mode;
pub use render::{Rendered, render, split_yaml_documents, to_yaml_stream};
pub use resolve::{
    CascadePolicyInput, CrdInfo, Inputs, Policy, Problem, Resolution, Severity, Source, Subject,
    XrdInput, resolve,
};
