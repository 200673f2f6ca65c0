//! cascade-guard: makes every delete of a protected Kubernetes object a safe,
//! foreground cascade.
//!
//! The domain (what a policy means, what a delete is allowed to do, Convert's
//! state machine) lives in the `cascade-guard-policy` crate, re-exported here
//! as [`policy`], which has no I/O by construction. [`api`] holds
//! cascade-guard's own Kubernetes types, [`controller`] the thin runtime
//! wiring, and [`render`] the offline form of the same compilation.

pub mod api;
pub mod controller;
mod error;
pub mod leader;
pub mod render;
pub mod server_version;
pub mod status;
pub mod telemetry;
pub mod trace;

pub use cascade_guard_policy as policy;
pub use error::Error;
