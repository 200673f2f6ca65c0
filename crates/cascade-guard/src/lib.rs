//! cascade-guard: makes every delete of a protected Kubernetes object a safe,
//! foreground cascade.
//!
//! The domain (what a policy means, what a delete is allowed to do) lives in
//! [`policy`] and has no I/O. [`api`] holds cascade-guard's own Kubernetes
//! types, [`controller`] the thin runtime wiring, and [`render`] the offline
//! form of the same compilation.

pub mod api;
pub mod cascade;
pub mod controller;
mod error;
pub mod holders;
pub mod leader;
pub mod policy;
pub mod render;
pub mod server_version;
pub mod stall;
pub mod status;
pub mod telemetry;
pub mod trace;

pub use error::Error;
