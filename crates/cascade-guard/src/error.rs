//! What can go wrong at cascade-guard's edges (the Kubernetes API, files, the
//! metrics listener).

use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot list {what}: {source}")]
    List {
        what: &'static str,
        source: kube::Error,
    },
    #[error("cannot apply {kind} {name}: {source}")]
    Apply {
        kind: &'static str,
        name: String,
        source: kube::Error,
    },
    #[error("cannot delete {kind} {name}: {source}")]
    Delete {
        kind: &'static str,
        name: String,
        source: kube::Error,
    },
    #[error("cannot update the status of CascadePolicy {name}: {source}")]
    Status { name: String, source: kube::Error },
    #[error("cannot discover API group {group}: {source}")]
    Discovery { group: String, source: kube::Error },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error(
        "{holder} is running: it would put back what uninstall removes. Stop it first (kubectl -n <namespace> scale deployment cascade-guard --replicas=0), or pass --force"
    )]
    ControllerRunning { holder: String },
    #[error(
        "the API server serves cascade-guard's static manifests ({files}): nothing removed through the API takes them away. Stop their writer (helm upgrade --set staticManifests.enabled=false), delete each file on its node, check with cascade-guard status that the API server no longer loads them, then uninstall (or pass --force)"
    )]
    StaticProtectionInForce { files: String },
    #[error("cannot serialize {what}: {message}")]
    Serialize { what: String, message: String },
    #[error("invalid lease settings: {0}")]
    LeaseSettings(String),
    #[error("cannot {action} Lease {namespace}/{name}: {source}")]
    Lease {
        action: &'static str,
        namespace: String,
        name: String,
        // Boxed: kube::Error is large and this sits in every Result.
        source: Box<kube::Error>,
    },
    #[error("static manifests directory {path}: {source}")]
    StaticDirectory {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    StaticManifest(#[from] crate::policy::static_manifest::StaticError),
    #[error(
        "cannot read the API server's /metrics (it says what static policies it loaded; reading it needs get on the non-resource URL /metrics): {source}"
    )]
    ServerMetrics { source: kube::Error },
    #[error("cannot serve metrics and health on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}
