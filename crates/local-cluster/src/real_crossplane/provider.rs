//! The providers, each as a process in a network namespace of its own: they
//! bind `:8080` (metrics) and, provider-kubernetes, `:9443` (webhooks) on
//! every interface, with no flag to move them, so two of them (or either and
//! anything else) could not otherwise run at once.

use std::ffi::OsString;
use std::path::Path;

use super::netns::NetNamespace;
use super::{CrossplaneBinaries, Error};
use crate::process::{self, Lifetime, Process, Surroundings};

pub const PROVIDER_KUBERNETES_USER: &str =
    "system:serviceaccount:crossplane-system:provider-kubernetes";
pub const PROVIDER_HELM_USER: &str = "system:serviceaccount:crossplane-system:provider-helm";
/// provider-kubernetes' process, for [`super::Crossplane::kill`].
pub const PROVIDER_KUBERNETES_PROCESS: &str = "provider-kubernetes";
/// provider-helm's process, for [`super::Crossplane::kill`].
pub const PROVIDER_HELM_PROCESS: &str = "provider-helm";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderKind {
    Kubernetes,
    Helm,
}

impl ProviderKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Kubernetes => PROVIDER_KUBERNETES_PROCESS,
            Self::Helm => PROVIDER_HELM_PROCESS,
        }
    }

    pub fn user(self) -> &'static str {
        match self {
            Self::Kubernetes => PROVIDER_KUBERNETES_USER,
            Self::Helm => PROVIDER_HELM_USER,
        }
    }

    pub fn binary(self, binaries: &CrossplaneBinaries) -> &Path {
        match self {
            Self::Kubernetes => &binaries.provider_kubernetes,
            Self::Helm => &binaries.provider_helm,
        }
    }

    pub fn crds(self, binaries: &CrossplaneBinaries) -> &Path {
        match self {
            Self::Kubernetes => &binaries.provider_kubernetes_crds,
            Self::Helm => &binaries.provider_helm_crds,
        }
    }
}

/// Starts a provider in `namespace`, acting through `kubeconfig`, with
/// `certs` (tls.crt, tls.key, ca.crt) for its webhook server.
pub fn start(
    kind: ProviderKind,
    binaries: &CrossplaneBinaries,
    namespace: &NetNamespace,
    kubeconfig: &Path,
    certs: &Path,
    log: &Path,
    lifetime: Lifetime,
) -> Result<Process, Error> {
    // A short poll, so that a reconcile (and a wedge) shows within seconds.
    let args = vec!["--poll=15s".to_string(), "--debug".to_string()];
    let surroundings = Surroundings {
        env: vec![
            (
                OsString::from("KUBECONFIG"),
                kubeconfig.as_os_str().to_owned(),
            ),
            (
                OsString::from("TLS_SERVER_CERTS_DIR"),
                certs.as_os_str().to_owned(),
            ),
        ],
        network_namespace: Some(namespace.handle()),
    };
    Ok(process::spawn_with(
        kind.name(),
        kind.binary(binaries),
        &args,
        log,
        lifetime,
        surroundings,
    )?)
}
