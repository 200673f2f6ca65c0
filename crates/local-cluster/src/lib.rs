//! A real local Kubernetes control plane for cascade-guard's tests and demo:
//! etcd, kube-apiserver and kube-controller-manager of one pinned upstream
//! release, built from the upstream Go modules (`testbed/controlplane/`), run
//! as plain processes on loopback. No containers, no kubelet.
//!
//! - [`ControlPlane::start`] starts one, owned by the calling process (tests).
//! - [`testing`] shares one per test binary and prints the components' logs
//!   when a test fails.
//! - The `local-cluster` binary starts one in the background (`up`) and stops it
//!   (`down`), for the demo and for people.

pub mod audit;
mod binaries;
mod cluster;
pub mod crossplane;
mod error;
mod etcd;
pub mod model;
mod pki;
pub mod process;
pub mod real_crossplane;
pub mod skip;
pub mod testing;
pub mod timeline;
pub mod wait;

pub use binaries::{BIN_DIR_ENV, Binaries, controlplane_dir, testbed_dir};
pub use cluster::{
    CONTROLLER_MANAGER_USER, ControlPlane, GC_SERVICE_ACCOUNT_USER,
    NAMESPACE_CONTROLLER_SERVICE_ACCOUNT_USER, Options, ProcessState, State, new_scratch_dir,
};
pub use error::Error;
pub use etcd::SharedEtcd;
