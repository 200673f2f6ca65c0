//! Crossplane packages the way a platform team ships them: a Configuration
//! package built with crank (`crossplane xpkg build`), pushed with it
//! (`xpkg push`) to an OCI registry on loopback (crane's, in memory), and
//! installed by Crossplane's own package manager from a `Configuration`
//! object, which creates the package's XRDs and Compositions.
//!
//! Crossplane v2 needs nothing special to pull from that registry: it refuses
//! `--registry` (every package names its registry in full) and fetches with
//! go-containerregistry, which speaks plain HTTP to a registry on a loopback
//! address (`127.0.0.1:<port>`) by itself, so no CA bundle and no ImageConfig
//! are needed. Core runs in a network namespace of its own; the registry's port
//! is carried into it ([`Crossplane::reach`]).
//!
//! A Configuration without dependencies installs without the dependency
//! resolver fetching anything; its Compositions call the function the stack
//! already runs (registered by name, `function-patch-and-transform`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::binaries::run_build_script;
use super::manifest::FIELD_MANAGER;
use super::modelplane;
use super::{Crossplane, Error, api_error, io_error};
use crate::process::{self, Lifetime, Process};

/// Overrides where crank is (else `testbed/tools/crank.sh` builds or finds it).
pub const CRANK_BIN_ENV: &str = "LOCAL_CLUSTER_CRANK_BIN";
/// Overrides where crane is (else `testbed/tools/crane.sh` builds or finds it).
pub const CRANE_BIN_ENV: &str = "CRANE_BIN";
/// What crane logs once it listens, before the port.
const SERVING_ON: &str = "serving on port ";

/// crank, to build and push packages, and crane, to serve the registry.
#[derive(Clone, Debug)]
pub struct PackageTools {
    pub crank: PathBuf,
    pub crane: PathBuf,
}

impl PackageTools {
    /// Each tool from its environment variable, else from its build script
    /// (instant once cached).
    pub fn locate() -> Result<Self, Error> {
        let tool = |env: &str, script: PathBuf| -> Result<PathBuf, Error> {
            let path = match std::env::var_os(env) {
                Some(path) => PathBuf::from(path),
                None => run_build_script(&script)?,
            };
            if path.is_file() {
                Ok(path)
            } else {
                Err(Error::Missing(path))
            }
        };
        Ok(Self {
            crank: tool(CRANK_BIN_ENV, crate::testbed_dir().join("tools/crank.sh"))?,
            crane: tool(CRANE_BIN_ENV, crate::testbed_dir().join("tools/crane.sh"))?,
        })
    }
}

/// A Configuration package's content: its name (the package metadata's) and
/// the objects it carries (XRDs, Compositions).
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigurationPackage {
    pub name: String,
    pub objects: Vec<Value>,
}

impl ConfigurationPackage {
    /// The package root's files, as `xpkg build` reads them: `crossplane.yaml`
    /// (the metadata, with no dependencies) and one YAML file per object.
    pub fn files(&self) -> Result<Vec<(String, String)>, Error> {
        let meta = json!({
            "apiVersion": "meta.pkg.crossplane.io/v1",
            "kind": "Configuration",
            "metadata": {"name": self.name},
        });
        let mut files = vec![("crossplane.yaml".to_string(), to_yaml(&meta)?)];
        for (i, object) in self.objects.iter().enumerate() {
            let part = |pointer: &str| {
                object
                    .pointer(pointer)
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| Error::Package(format!("object {i} has no {pointer}")))
            };
            let file = format!(
                "{i:02}-{}-{}.yaml",
                part("/kind")?.to_lowercase(),
                part("/metadata/name")?
            );
            files.push((file, to_yaml(object)?));
        }
        Ok(files)
    }

    /// Writes the package root into `root` (which must not hold other YAML:
    /// `xpkg build` takes every file in it) and builds the package file
    /// `<root>.xpkg` with crank.
    pub async fn build(&self, tools: &PackageTools, root: &Path) -> Result<PathBuf, Error> {
        std::fs::create_dir_all(root).map_err(io_error(root))?;
        for (name, text) in self.files()? {
            let path = root.join(name);
            std::fs::write(&path, text).map_err(io_error(&path))?;
        }
        let file = root.with_extension("xpkg");
        run(
            &tools.crank,
            &[
                "xpkg".into(),
                "build".into(),
                format!("--package-root={}", root.display()),
                // No examples: a directory that does not exist.
                format!("--examples-root={}", root.join("examples").display()),
                format!("--package-file={}", file.display()),
            ],
        )
        .await?;
        Ok(file)
    }
}

/// Pushes the package file to `reference` (`registry/repository:tag`).
pub async fn push(tools: &PackageTools, file: &Path, reference: &str) -> Result<(), Error> {
    run(
        &tools.crank,
        &[
            "xpkg".into(),
            "push".into(),
            format!("--package-files={}", file.display()),
            reference.to_string(),
        ],
    )
    .await
}

/// Runs a tool to its end; its output is the error when it fails.
async fn run(binary: &Path, args: &[String]) -> Result<(), Error> {
    let output = tokio::process::Command::new(binary)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| Error::Package(format!("cannot run {}: {e}", binary.display())))?;
    if output.status.success() {
        return Ok(());
    }
    Err(Error::Package(format!(
        "{} {} failed ({}): {}{}",
        binary.display(),
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout),
    )))
}

fn to_yaml(value: &Value) -> Result<String, Error> {
    serde_yaml::to_string(value).map_err(|e| Error::Package(format!("cannot write YAML: {e}")))
}

/// An OCI registry on loopback, in memory (`crane registry serve`), reachable
/// from Crossplane core at the same address. Stops when dropped.
pub struct Registry {
    /// Owned: it stops when dropped.
    _process: Process,
    port: u16,
}

impl Registry {
    /// Starts the registry on a port the system picks and carries it into the
    /// stack's namespaces. `log` takes crane's log (every request it serves).
    pub async fn start(
        tools: &PackageTools,
        crossplane: &Crossplane,
        log: &Path,
    ) -> Result<Self, Error> {
        let args = [
            "registry".to_string(),
            "serve".to_string(),
            "--address=127.0.0.1:0".to_string(),
        ];
        let mut process = process::spawn(
            "package-registry",
            &tools.crane,
            &args,
            log,
            Lifetime::Owned,
        )?;
        let mut port = None;
        super::wait_for(&mut process, || {
            let found = std::fs::read_to_string(log)
                .ok()
                .and_then(|text| serving_port(&text));
            port = found;
            async move {
                found
                    .map(|_| ())
                    .ok_or_else(|| format!("no `{SERVING_ON}...` in its log yet"))
            }
        })
        .await?;
        let port = port.ok_or_else(|| Error::Package("the registry named no port".into()))?;
        crossplane.reach(port)?;
        Ok(Self {
            _process: process,
            port,
        })
    }

    /// A package's full reference in this registry.
    pub fn reference(&self, repository: &str, tag: &str) -> String {
        format!("127.0.0.1:{}/{repository}:{tag}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

/// The port crane's registry logs it listens on (`... serving on port N`).
fn serving_port(log: &str) -> Option<u16> {
    log.lines()
        .find_map(|line| line.split_once(SERVING_ON))
        .and_then(|(_, port)| port.trim().parse().ok())
}

pub fn configurations() -> ApiResource {
    modelplane::resource("pkg.crossplane.io", "v1", "Configuration", "configurations")
}

/// Creates the Configuration `name` for the package `reference`, or points
/// it at a new one (an upgrade: Crossplane makes a new revision, activates it
/// and updates the objects the package carries).
pub async fn install(client: &Client, name: &str, reference: &str) -> Result<(), Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &configurations());
    let configuration = json!({
        "apiVersion": "pkg.crossplane.io/v1",
        "kind": "Configuration",
        "metadata": {"name": name},
        "spec": {"package": reference},
    });
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&configuration),
    )
    .await
    .map_err(api_error(format!("applying Configuration {name}")))?;
    Ok(())
}

/// Waits until Configuration `name` runs `reference`, installed and healthy;
/// returns it. The error names the last state seen.
pub async fn wait_installed(
    client: &Client,
    name: &str,
    reference: &str,
    timeout: Duration,
) -> Result<Value, Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &configurations());
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let last = match api.get_opt(name).await {
            Ok(Some(object)) => {
                let value = serde_json::to_value(&object)
                    .map_err(|e| Error::Package(format!("Configuration {name}: {e}")))?;
                match installed(&value, reference) {
                    Ok(()) => return Ok(value),
                    Err(last) => last,
                }
            }
            Ok(None) => "not found".to_string(),
            Err(e) => e.to_string(),
        };
        if std::time::Instant::now() > deadline {
            return Err(Error::NotReady {
                component: format!("Configuration {name} ({reference})"),
                last,
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Whether a Configuration runs `reference` and is Installed and Healthy;
/// otherwise what it says instead.
fn installed(configuration: &Value, reference: &str) -> Result<(), String> {
    let status = &configuration["status"];
    let current = status["currentIdentifier"].as_str().unwrap_or("");
    if current != reference {
        return Err(format!("runs {current:?}, not {reference:?}"));
    }
    for kind in ["Installed", "Healthy"] {
        let condition = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == kind);
        match condition {
            Some(c) if c["status"] == "True" => {}
            Some(c) => {
                return Err(format!(
                    "{kind}={}: {} {}",
                    c["status"].as_str().unwrap_or("?"),
                    c["reason"].as_str().unwrap_or(""),
                    c["message"].as_str().unwrap_or("")
                ));
            }
            None => return Err(format!("no {kind} condition yet")),
        }
    }
    Ok(())
}

/// The seed's platform as one Configuration package: Modelplane's real XRDs
/// (`modelplane::XRD_DIRS`, from the fixtures), each with the annotations
/// `annotations` gives for its directory, and the project's Compositions with
/// the charts' `urls` ([`modelplane::serve_charts`]).
pub fn modelplane_platform(
    name: &str,
    urls: &[(&str, String)],
    annotations: impl Fn(&str) -> Value,
) -> Result<ConfigurationPackage, Error> {
    let mut objects = Vec::new();
    for dir in modelplane::XRD_DIRS {
        let mut xrd = modelplane::definition(dir)?;
        let wanted = annotations(dir);
        if wanted.as_object().is_some_and(|a| !a.is_empty()) {
            xrd["metadata"]["annotations"] = wanted;
        }
        objects.push(xrd);
    }
    objects.extend(modelplane::compositions_with(urls)?);
    Ok(ConfigurationPackage {
        name: name.to_string(),
        objects,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_port_is_read_from_cranes_log() {
        let log = "2026/12/01 07:11:43 serving on port 45349\n2026/12/01 07:11:46 GET /v2/\n";
        assert_eq!(serving_port(log), Some(45349));
        assert_eq!(
            serving_port("2026/12/01 listen tcp: address in use\n"),
            None
        );
        assert_eq!(serving_port("serving on port many\n"), None);
    }

    #[test]
    fn files_are_the_metadata_and_one_per_object() {
        let package = ConfigurationPackage {
            name: "platform".into(),
            objects: vec![
                json!({"kind": "CompositeResourceDefinition", "metadata": {"name": "xs.example.org"}}),
                json!({"kind": "Composition", "metadata": {"name": "xs"}}),
            ],
        };
        let files = package.files().expect("files");
        let names: Vec<_> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "crossplane.yaml",
                "00-compositeresourcedefinition-xs.example.org.yaml",
                "01-composition-xs.yaml"
            ]
        );
        let meta: Value = serde_yaml::from_str(&files[0].1).expect("YAML");
        assert_eq!(meta["apiVersion"], "meta.pkg.crossplane.io/v1");
        assert_eq!(meta["metadata"]["name"], "platform");
        assert!(meta.get("spec").is_none(), "no dependencies: {meta}");
    }

    #[test]
    fn an_object_without_a_name_is_an_error_not_a_file() {
        let package = ConfigurationPackage {
            name: "platform".into(),
            objects: vec![json!({"kind": "Composition", "metadata": {}})],
        };
        let err = package.files().expect_err("no name");
        assert!(err.to_string().contains("/metadata/name"), "{err}");
    }

    #[test]
    fn installed_means_the_reference_installed_and_healthy() {
        let reference = "127.0.0.1:5000/p:v2";
        let configuration = |current: &str, healthy: &str| {
            json!({"status": {
                "currentIdentifier": current,
                "conditions": [
                    {"type": "Installed", "status": "True", "reason": "ActivePackageRevision"},
                    {"type": "Healthy", "status": healthy, "reason": "UnhealthyPackageRevision",
                     "message": "cannot establish control"},
                ],
            }})
        };
        assert_eq!(
            installed(&configuration(reference, "True"), reference),
            Ok(())
        );
        let old = installed(&configuration("127.0.0.1:5000/p:v1", "True"), reference);
        assert!(old.is_err_and(|e| e.contains("p:v1")));
        let unhealthy = installed(&configuration(reference, "False"), reference);
        assert!(unhealthy.is_err_and(|e| e.contains("cannot establish control")));
        assert!(installed(&json!({}), reference).is_err());
    }
}
