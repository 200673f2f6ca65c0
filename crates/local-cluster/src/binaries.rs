//! Where the control plane's binaries are: built from the upstream Go modules
//! by `testbed/controlplane/build.sh` and cached outside git.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Error;

/// Overrides the directory holding etcd, kube-apiserver, kube-controller-manager
/// and kubectl (otherwise `testbed/controlplane/build.sh` builds or finds them).
pub const BIN_DIR_ENV: &str = "LOCAL_CLUSTER_BIN_DIR";

#[derive(Clone, Debug)]
pub struct Binaries {
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kube_controller_manager: PathBuf,
    pub kubectl: PathBuf,
}

impl Binaries {
    pub fn locate() -> Result<Self, Error> {
        let dir = match std::env::var_os(BIN_DIR_ENV) {
            Some(dir) => PathBuf::from(dir),
            None => build()?,
        };
        let binaries = Self {
            etcd: dir.join("etcd"),
            kube_apiserver: dir.join("kube-apiserver"),
            kube_controller_manager: dir.join("kube-controller-manager"),
            kubectl: dir.join("kubectl"),
        };
        for path in [
            &binaries.etcd,
            &binaries.kube_apiserver,
            &binaries.kube_controller_manager,
            &binaries.kubectl,
        ] {
            if !path.is_file() {
                return Err(Error::MissingBinary(path.clone()));
            }
        }
        Ok(binaries)
    }
}

/// The repository's `testbed/` directory: the pinned upstream builds and tools
/// the tests run on, apart from what ships.
pub fn testbed_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testbed")
}

/// The repository's `testbed/controlplane/` directory.
pub fn controlplane_dir() -> PathBuf {
    testbed_dir().join("controlplane")
}

/// Runs `testbed/controlplane/build.sh`, which is instant when the cache is warm, and
/// returns the directory it printed last.
fn build() -> Result<PathBuf, Error> {
    let script = controlplane_dir().join("build.sh");
    let output = Command::new("bash")
        .arg(&script)
        .output()
        .map_err(|source| Error::Build {
            script: script.clone(),
            detail: source.to_string(),
        })?;
    if !output.status.success() {
        return Err(Error::Build {
            script,
            detail: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    match stdout.lines().last() {
        Some(line) if !line.trim().is_empty() => Ok(PathBuf::from(line.trim())),
        _ => Err(Error::Build {
            script,
            detail: "it printed no directory".into(),
        }),
    }
}
