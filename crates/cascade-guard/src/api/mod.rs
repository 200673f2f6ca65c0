//! cascade-guard's own Kubernetes API.

pub mod cascade_policy;

pub use cascade_policy::{ApiSpec, CascadePolicy, CascadePolicyStatus};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// Every CustomResourceDefinition cascade-guard needs, as `cascade-guard crd`
/// prints them and the chart installs them.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![CascadePolicy::crd()]
}
