//! `cascade-guard render`: the admission objects for a set of files, without a
//! cluster, for GitOps users who apply them themselves. The compilation is the
//! same as the controller's ([`crate::policy::render`]); this module only reads
//! files and writes YAML.

pub mod command;

use std::path::{Path, PathBuf};

use crate::Error;
use crate::policy::render::{Document, render_documents};
use crate::policy::yaml_stream::split_yaml_stream;
use crate::policy::{CompileSettings, Mode, Rendered};

/// Reads every `.yaml`, `.yml` and `.json` file under `paths` (directories are
/// walked in name order, so output is stable) and renders them. Each document
/// keeps its file and its index in it, for the problems that name it.
pub fn render_paths(
    paths: &[PathBuf],
    xrd_default_mode: Mode,
    settings: &CompileSettings,
) -> Result<Rendered, Error> {
    let mut files = Vec::new();
    for path in paths {
        collect(path, &mut files)?;
    }
    let mut docs = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).map_err(|source| Error::Read {
            path: file.clone(),
            source,
        })?;
        let parsed = split_yaml_stream(&text).map_err(|e| Error::Parse {
            path: file.clone(),
            message: e.to_string(),
        })?;
        let name = file.display().to_string();
        docs.extend(parsed.into_iter().map(|(index, value)| Document {
            file: Some(name.clone()),
            index,
            value,
        }));
    }
    Ok(render_documents(docs, xrd_default_mode, settings))
}

fn collect(path: &Path, files: &mut Vec<PathBuf>) -> Result<(), Error> {
    let read_error = |source| Error::Read {
        path: path.to_path_buf(),
        source,
    };
    if path.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(read_error)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for entry in entries {
            if entry.is_dir() || is_manifest(&entry) {
                collect(&entry, files)?;
            }
        }
        Ok(())
    } else if path.exists() {
        files.push(path.to_path_buf());
        Ok(())
    } else {
        Err(read_error(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no such file or directory",
        )))
    }
}

fn is_manifest(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json")
    )
}
