//! cascade-guard: makes every delete of a protected Kubernetes object a safe,
//! foreground cascade.
//!
//! The domain (what a policy means, what a delete is allowed to do, Convert's
//! state machine) lives in the `cascade-guard-policy` crate, re-exported here
//! as [`policy`], which has no I/O by construction. This crate is laid out by
//! who each part serves:
//!
//! - [`cli`]: the commands people run (`status`, `render`, `trace`,
//!   `uninstall`);
//! - [`controller`]: the control loop (`run`), its passes and watches,
//!   leader election and telemetry;
//! - [`cluster`]: what both read from a cluster, read one way;
//! - [`api`]: cascade-guard's own Kubernetes types.

pub mod api;
pub mod cli;
pub mod cluster;
pub mod controller;
mod error;
#[cfg(test)]
mod fake_api_server;

pub use cascade_guard_policy as policy;
pub use error::Error;
