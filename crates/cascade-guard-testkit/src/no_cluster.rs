//! A kubeconfig whose one context names a cluster on a loopback port that
//! nothing listens on: what a command does when no cluster answers.
//! Included by `#[path]` where used.

use std::path::{Path, PathBuf};

/// Writes the kubeconfig into `dir` and returns its path.
pub fn kubeconfig(dir: &Path) -> PathBuf {
    let path = dir.join("closed.kubeconfig");
    std::fs::write(
        &path,
        "apiVersion: v1
kind: Config
current-context: closed
clusters: [{name: closed, cluster: {server: 'https://127.0.0.1:1'}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: closed, context: {cluster: closed, user: u}}]
",
    )
    .expect("write the kubeconfig");
    path
}
