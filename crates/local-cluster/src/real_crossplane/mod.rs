//! Real Crossplane on the local control plane: Crossplane core, the
//! function-patch-and-transform composition function and the providers
//! provider-kubernetes and provider-helm, each built from its upstream Go module
//! (`testbed/crossplane/build.sh`) and run as a plain process, plus a *local cloud*:
//! the one simulated part, a `Cluster` kind whose controller starts a real
//! second control plane for every Cluster and stops it when the Cluster is
//! deleted, and a `LoadBalancer` kind made in a Cluster it references as
//! Upjet's resources reference theirs.
//!
//! [`Crossplane::start`] brings the stack up against a running
//! [`ControlPlane`](crate::ControlPlane). Its in-process parts (the port
//! forwarders of the processes that run in network namespaces of their own,
//! the local cloud's controller, the chart server) run on a runtime of their
//! own, so that the stack can be shared by every test of a test binary.

mod binaries;
pub mod cloud;
pub mod cloud_load_balancer;
mod crossplane_core;
mod function;
pub mod load_balancer;
mod manifest;
pub mod modelplane;
mod netns;
pub mod package;
mod provider;
mod stack;

use std::path::PathBuf;

pub use binaries::{CROSSPLANE_BIN_DIR_ENV, CoreVersion, CrossplaneBinaries, crossplane_dir};
pub use function::FUNCTION_NAME;
pub use provider::{
    PROVIDER_HELM_PROCESS, PROVIDER_HELM_USER, PROVIDER_KUBERNETES_PROCESS,
    PROVIDER_KUBERNETES_USER,
};
pub use stack::{CORE_PROCESS, Crossplane, CrossplaneOptions, CrossplaneState, resident_kb};

/// The user Crossplane core acts as, as with the default Helm chart.
pub const CROSSPLANE_USER: &str = "system:serviceaccount:crossplane-system:crossplane";
/// Where Crossplane and the providers keep their Secrets.
pub const CROSSPLANE_NAMESPACE: &str = "crossplane-system";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot build with {script}: {detail}")]
    Build { script: PathBuf, detail: String },
    #[error(
        "missing Crossplane binary or data {0} (run testbed/crossplane/build.sh, or set LOCAL_CLUSTER_CROSSPLANE_BIN_DIR)"
    )]
    Missing(PathBuf),
    #[error("{0}")]
    ControlPlane(#[from] crate::Error),
    #[error("{path}: {detail}")]
    Manifest { path: PathBuf, detail: String },
    #[error("{what}: {source}")]
    Api { what: String, source: kube::Error },
    #[error("`crossplane core init` failed {attempts} times; the last time: {detail}")]
    Init { attempts: u32, detail: String },
    #[error("{component} did not become ready in time: {last}")]
    NotReady { component: String, last: String },
    #[error("{component} exited (see its log, {log})")]
    Exited { component: String, log: PathBuf },
    #[error("network namespace: {0}")]
    Namespace(String),
    #[error("cannot forward loopback port {port}: {detail}")]
    Forward { port: u16, detail: String },
    #[error("{0}")]
    Io(String),
    #[error("package: {0}")]
    Package(String),
    #[error("Crossplane did not start: {cause}\n\nthe ends of the logs:\n{logs}")]
    Boot { cause: String, logs: String },
}

/// Polls `probe` until it is ready (`Ok`), for two minutes at most, and
/// fails at once if `process` exits.
async fn wait_for<F, Fut>(process: &mut crate::process::Process, mut probe: F) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let last = match probe().await {
            Ok(()) => return Ok(()),
            Err(last) => last,
        };
        if !process.is_running() {
            return Err(Error::Exited {
                component: process.name.clone(),
                log: process.log.clone(),
            });
        }
        if std::time::Instant::now() > deadline {
            return Err(Error::NotReady {
                component: process.name.clone(),
                last,
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Api { what, source }
}

fn io_error(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::Io(format!("{}: {e}", path.display()))
}
