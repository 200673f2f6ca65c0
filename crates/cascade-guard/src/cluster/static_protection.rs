//! Static protection at the edges: the directory the API server loads
//! (`staticManifestsDir`), what the API server's metrics say it loaded, and
//! the record each writer publishes so that `status` can compare the two
//! without access to the control-plane node. What the file holds is pure
//! ([`crate::policy::static_manifest`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};

use crate::Error;
use crate::policy::names::{FIELD_MANAGER, MANAGED_BY_LABEL, MANAGED_BY_VALUE};
use crate::policy::static_manifest::{FILE_NAME, ServerReport, server_report};

/// The label on each writer's record.
pub const RECORD_LABEL: &str = "cascade-guard.dev/static-manifests";
/// The record's data keys.
pub const RECORD_DIRECTORY: &str = "directory";
pub const RECORD_HASH: &str = "hash";
pub const RECORD_WRITER: &str = "writer";

/// The directory the API server reads, as cascade-guard writes it.
#[derive(Clone, Debug)]
pub struct StaticDirectory {
    dir: PathBuf,
}

impl StaticDirectory {
    /// The directory must exist (the API server refuses to start without
    /// it, too) and be absolute (the AdmissionConfiguration demands it).
    pub fn open(dir: &Path) -> Result<Self, Error> {
        let io = |source| Error::StaticDirectory {
            path: dir.to_path_buf(),
            source,
        };
        if !dir.is_absolute() {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "must be an absolute path, as in the API server's AdmissionConfiguration",
            )));
        }
        let meta = std::fs::metadata(dir).map_err(io)?;
        if !meta.is_dir() {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "is not a directory",
            )));
        }
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub fn file(&self) -> PathBuf {
        self.dir.join(FILE_NAME)
    }

    /// Writes `text` as cascade-guard's file unless it already holds it;
    /// true when it wrote. The new content is written beside it under a name
    /// the loader skips, then renamed over it, so the API server never reads
    /// half a file (a half file fails the whole directory).
    pub fn write(&self, text: &str) -> Result<bool, Error> {
        let file = self.file();
        if std::fs::read_to_string(&file).ok().as_deref() == Some(text) {
            return Ok(false);
        }
        let staging = self.dir.join(format!(".{FILE_NAME}.writing"));
        let io = |source| Error::StaticDirectory {
            path: file.clone(),
            source,
        };
        std::fs::write(&staging, text).map_err(io)?;
        std::fs::rename(&staging, &file).map_err(io)?;
        Ok(true)
    }

    /// The hash the API server reports for the directory once it has loaded
    /// it, computed the way its loader does; None for a directory with no
    /// data (the loader reports no hash then).
    pub fn hash(&self) -> Result<Option<String>, Error> {
        let io = |source| Error::StaticDirectory {
            path: self.dir.clone(),
            source,
        };
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            if entry.file_type().map_err(io)?.is_dir() {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            if !loaded_by_the_api_server(&name) {
                continue;
            }
            files.push((name, std::fs::read(entry.path()).map_err(io)?));
        }
        Ok(directory_hash(files))
    }
}

/// The loader reads `.yaml`, `.yml` and `.json` files (any case).
fn loaded_by_the_api_server(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    [".yaml", ".yml", ".json"]
        .iter()
        .any(|ext| lower.ends_with(ext))
}

/// sha256 over each non-empty file's bytes followed by a zero byte, in name
/// order, as `sha256:<hex>`: the API server's change-detection hash, which
/// its metrics report for the directory it loaded.
pub fn directory_hash(mut files: Vec<(String, Vec<u8>)>) -> Option<String> {
    files.sort_by(|a, b| a.0.cmp(&b.0));
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    let mut any = false;
    for (_, data) in files.iter().filter(|(_, data)| !data.is_empty()) {
        context.update(data);
        context.update(&[0]);
        any = true;
    }
    if !any {
        return None;
    }
    let digest = context.finish();
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    Some(format!("sha256:{hex}"))
}

/// What the API server answering this request says of its static policies
/// (behind a load balancer: one of them).
pub async fn read_server_report(client: &Client) -> Result<ServerReport, Error> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| Error::Serialize {
            what: "the /metrics request".into(),
            message: e.to_string(),
        })?;
    let text = client
        .request_text(request)
        .await
        .map_err(|source| Error::ServerMetrics { source })?;
    Ok(server_report(&text))
}

/// One writer's record: which directory, what it wrote, the hash the API
/// server should report once it has loaded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub writer: String,
    pub directory: String,
    pub hash: Option<String>,
    pub manifest: String,
}

/// The record's name for a writer (a node name or host name).
fn record_name(writer: &str) -> String {
    let safe: String = writer
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let mut name = format!("cascade-guard-static-{safe}");
    name.truncate(253);
    name
}

/// Publishes the record (server-side apply of a ConfigMap in `namespace`).
pub async fn publish(client: &Client, namespace: &str, record: &Record) -> Result<(), Error> {
    let name = record_name(&record.writer);
    let mut data = BTreeMap::from([
        (RECORD_WRITER.to_string(), record.writer.clone()),
        (RECORD_DIRECTORY.to_string(), record.directory.clone()),
        (FILE_NAME.to_string(), record.manifest.clone()),
    ]);
    if let Some(hash) = &record.hash {
        data.insert(RECORD_HASH.to_string(), hash.clone());
    }
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([
                (MANAGED_BY_LABEL.to_string(), MANAGED_BY_VALUE.to_string()),
                (RECORD_LABEL.to_string(), "true".to_string()),
            ])),
            ..ObjectMeta::default()
        },
        data: Some(data),
        ..ConfigMap::default()
    };
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&config_map),
    )
    .await
    .map_err(|source| Error::Apply {
        kind: "ConfigMap",
        name,
        source,
    })?;
    Ok(())
}

/// Every writer's record, in any namespace.
pub async fn records(client: &Client) -> Result<Vec<Record>, Error> {
    let api: Api<ConfigMap> = Api::all(client.clone());
    let list = api
        .list(&ListParams::default().labels(&format!("{RECORD_LABEL}=true")))
        .await
        .map_err(|source| Error::List {
            what: "static-manifest records (ConfigMaps)",
            source,
        })?;
    Ok(list
        .items
        .into_iter()
        .map(|cm| {
            let data = cm.data.unwrap_or_default();
            let get = |k: &str| data.get(k).cloned().unwrap_or_default();
            Record {
                writer: get(RECORD_WRITER),
                directory: get(RECORD_DIRECTORY),
                hash: data.get(RECORD_HASH).cloned(),
                manifest: get(FILE_NAME),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_the_loaders_name_ordered_zero_separated_sha256() {
        // sha256("a\0b\0"), the order of the names, not of the list.
        let hash = directory_hash(vec![
            ("2.yaml".into(), b"b".to_vec()),
            ("1.yaml".into(), b"a".to_vec()),
            ("3.yaml".into(), Vec::new()),
        ]);
        assert_eq!(
            hash.as_deref(),
            Some("sha256:8fb20ef63ced4145fc2e983ffe597d1dcff39154c3bf21f0fa9dde6a0c50fdc9")
        );
        let same = directory_hash(vec![
            ("1.yaml".into(), b"a".to_vec()),
            ("2.yaml".into(), b"b".to_vec()),
        ]);
        assert_eq!(hash, same, "empty files and list order do not count");
        assert_ne!(
            hash,
            directory_hash(vec![("1.yaml".into(), b"ab".to_vec())]),
            "the separator counts"
        );
        assert_eq!(directory_hash(vec![("1.yaml".into(), Vec::new())]), None);
    }

    #[test]
    fn only_the_files_the_loader_reads_count() {
        assert!(loaded_by_the_api_server("cascade-guard.yaml"));
        assert!(loaded_by_the_api_server("x.JSON"));
        assert!(loaded_by_the_api_server("x.yml"));
        assert!(!loaded_by_the_api_server(".cascade-guard.yaml.writing"));
        assert!(!loaded_by_the_api_server("README"));
    }

    #[test]
    fn writes_are_whole_and_only_when_the_content_changes() {
        let dir = std::env::temp_dir().join(format!("cg-static-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let d = StaticDirectory::open(&dir).unwrap();
        assert!(d.write("---\na: 1\n").unwrap());
        assert!(!d.write("---\na: 1\n").unwrap());
        assert!(d.write("---\na: 2\n").unwrap());
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, [FILE_NAME]);
        assert!(d.hash().unwrap().is_some());
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(StaticDirectory::open(Path::new("relative")).is_err());
        assert!(StaticDirectory::open(&dir).is_err(), "gone");
    }

    #[test]
    fn record_names_are_valid_object_names() {
        assert_eq!(
            record_name("Node_1.example"),
            "cascade-guard-static-node-1.example"
        );
    }
}
