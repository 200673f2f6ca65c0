//! cascade-guard's own Kubernetes API.

pub mod cascade_policy;

pub use cascade_policy::{ApiSpec, CascadePolicy, CascadePolicyStatus};
