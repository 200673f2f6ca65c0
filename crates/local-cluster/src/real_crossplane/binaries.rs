//! Where real Crossplane's binaries and data are: built from the upstream Go
//! modules by `testbed/crossplane/build.sh` and cached outside git.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::Error;

/// Overrides the directory `testbed/crossplane/build.sh` prints (the binaries, with
/// the CRDs and webhook configurations in `data/`).
pub const CROSSPLANE_BIN_DIR_ENV: &str = "LOCAL_CLUSTER_CROSSPLANE_BIN_DIR";

#[derive(Clone, Debug)]
pub struct CrossplaneBinaries {
    pub crossplane: PathBuf,
    pub function_patch_and_transform: PathBuf,
    pub provider_kubernetes: PathBuf,
    pub provider_helm: PathBuf,
    /// Crossplane core's CRDs, as shipped (`cluster/crds`).
    pub core_crds: PathBuf,
    /// Crossplane core's webhook configurations (`cluster/webhookconfigurations`).
    pub core_webhook_configurations: PathBuf,
    pub provider_kubernetes_crds: PathBuf,
    pub provider_helm_crds: PathBuf,
}

/// A Crossplane core release, as `crossplane --version` prints it (`v2.4.0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CoreVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl CoreVersion {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    fn parse(text: &str) -> Option<Self> {
        let mut parts = text.trim().strip_prefix('v')?.splitn(3, '.');
        let mut next = || parts.next()?.parse().ok();
        Some(Self::new(next()?, next()?, next()?))
    }
}

impl std::fmt::Display for CoreVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl CrossplaneBinaries {
    /// Core's release: the harness and the characterization tests differ by
    /// it (`testbed/crossplane/build.sh` builds any pinned one).
    pub fn core_version(&self) -> Result<CoreVersion, Error> {
        let output = Command::new(&self.crossplane)
            .arg("--version")
            .output()
            .map_err(|e| Error::Io(format!("{} --version: {e}", self.crossplane.display())))?;
        let text = String::from_utf8_lossy(&output.stdout);
        CoreVersion::parse(&text).ok_or_else(|| {
            Error::Io(format!(
                "{} --version printed {text:?}, not a release",
                self.crossplane.display()
            ))
        })
    }

    pub fn locate() -> Result<Self, Error> {
        let dir = match std::env::var_os(CROSSPLANE_BIN_DIR_ENV) {
            Some(dir) => PathBuf::from(dir),
            None => build()?,
        };
        Self::in_dir(&dir)
    }

    fn in_dir(dir: &Path) -> Result<Self, Error> {
        let data = dir.join("data");
        let found = Self {
            crossplane: dir.join("crossplane"),
            function_patch_and_transform: dir.join("function-patch-and-transform"),
            provider_kubernetes: dir.join("provider-kubernetes"),
            provider_helm: dir.join("provider-helm"),
            core_crds: data.join("core/crds"),
            core_webhook_configurations: data.join("core/webhookconfigurations"),
            provider_kubernetes_crds: data.join("provider-kubernetes/crds"),
            provider_helm_crds: data.join("provider-helm/crds"),
        };
        for binary in [
            &found.crossplane,
            &found.function_patch_and_transform,
            &found.provider_kubernetes,
            &found.provider_helm,
        ] {
            if !binary.is_file() {
                return Err(Error::Missing(binary.clone()));
            }
        }
        for data in [
            &found.core_crds,
            &found.core_webhook_configurations,
            &found.provider_kubernetes_crds,
            &found.provider_helm_crds,
        ] {
            if !data.is_dir() {
                return Err(Error::Missing(data.clone()));
            }
        }
        Ok(found)
    }
}

/// The repository's `testbed/crossplane/` directory.
pub fn crossplane_dir() -> PathBuf {
    crate::testbed_dir().join("crossplane")
}

/// Runs `testbed/crossplane/build.sh` (instant when its cache is warm) and returns the
/// directory it printed last.
fn build() -> Result<PathBuf, Error> {
    run_build_script(&crossplane_dir().join("build.sh"))
}

/// Runs a build script of the repository that prints what it built (or found
/// cached) on its last line, and returns that path.
pub(super) fn run_build_script(script: &Path) -> Result<PathBuf, Error> {
    let failed = |detail: String| Error::Build {
        script: script.to_path_buf(),
        detail,
    };
    let output = Command::new("bash")
        .arg(script)
        .output()
        .map_err(|e| failed(e.to_string()))?;
    if !output.status.success() {
        return Err(failed(String::from_utf8_lossy(&output.stderr).into_owned()));
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .last()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| failed("it printed no path".into()))
}

#[cfg(test)]
mod tests {
    use super::CoreVersion;

    #[test]
    fn a_release_parses_and_orders_by_number() {
        assert_eq!(
            CoreVersion::parse("v2.4.0\n"),
            Some(CoreVersion::new(2, 4, 0))
        );
        assert_eq!(
            CoreVersion::parse("v1.20.0").map(|v| v.to_string()),
            Some("v1.20.0".into())
        );
        assert!(CoreVersion::new(1, 20, 0) < CoreVersion::new(2, 0, 2));
        assert_eq!(CoreVersion::parse(""), None);
        assert_eq!(CoreVersion::parse("2.4.0"), None);
    }
}
