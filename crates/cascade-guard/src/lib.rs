//! cascade-guard: makes every delete of a protected Kubernetes object a safe,
//! foreground cascade.
//!
//! The domain (what a policy means, what a delete is allowed to do) lives in
//! [`policy`] and has no I/O. [`api`] holds cascade-guard's own Kubernetes types.

pub mod api;
pub mod policy;
