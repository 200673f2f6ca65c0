use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot build the control plane's binaries with {script}: {detail}")]
    Build { script: PathBuf, detail: String },
    #[error(
        "missing control-plane binary {0} (run testbed/controlplane/build.sh, or set LOCAL_CLUSTER_BIN_DIR)"
    )]
    MissingBinary(PathBuf),
    #[error("cannot make certificate {what}: {source}")]
    Certificate { what: String, source: rcgen::Error },
    #[error("cannot reserve free loopback ports: {0}")]
    Ports(std::io::Error),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start {component} ({binary}): {source}")]
    Spawn {
        component: String,
        binary: PathBuf,
        source: std::io::Error,
    },
    #[error("{component} was not started by this process and cannot be restarted")]
    NotRestartable { component: String },
    #[error("no component named {0}")]
    NoSuchComponent(String),
    #[error("the process spawner thread is gone")]
    Spawner,
    #[error("{component} exited (its log is below)")]
    Exited { component: String },
    #[error("{component} did not become ready in time: {last}")]
    NotReady { component: String, last: String },
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("cannot write kubeconfig {path}: {source}")]
    KubeconfigWrite {
        path: PathBuf,
        source: serde_yaml::Error,
    },
    #[error("cannot make a client: {0}")]
    Client(kube::Error),
    #[error("cannot install CRD {name}: {source}")]
    Crd { name: String, source: kube::Error },
    #[error("garbage-collector probe failed: {0}")]
    Probe(String),
    #[error("state file {path}: {detail}")]
    State { path: PathBuf, detail: String },
    #[error(
        "the control plane did not start: {cause}\n\nthe ends of the components' logs:\n{logs}"
    )]
    Boot { cause: String, logs: String },
}
