//! etcd as the control planes start it, and one etcd that several serve-only
//! control planes share, each under a prefix of its own: the local cloud's
//! clusters. An etcd of its own per cloud cluster cost about a quarter of a
//! CPU second a minute each at rest, beside what it served (43 cloud clusters
//! in a run of the real-Crossplane suite, up to fifteen at once).

use std::path::Path;

use crate::Error;
use crate::binaries::Binaries;
use crate::process::{self, Lifetime, Process};

/// etcd's flags: one member on loopback, its data in `data_dir`.
pub(crate) fn args(data_dir: &Path, client_port: u16, peer_port: u16) -> Vec<String> {
    let client_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    vec![
        "--name=local".to_string(),
        format!("--data-dir={}", data_dir.display()),
        format!("--listen-client-urls={client_url}"),
        format!("--advertise-client-urls={client_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=local={peer_url}"),
        // Test data: durability across power loss is not worth the fsyncs.
        "--unsafe-no-fsync".to_string(),
        "--log-level=warn".to_string(),
    ]
}

/// The etcd key prefix of a control plane kept in a [`SharedEtcd`]: its
/// directory's name, which the local cloud makes unique per cluster.
pub(crate) fn prefix_of(dir: &Path) -> String {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("/{name}")
}

/// An etcd for several control planes ([`crate::Options::shared_etcd`]);
/// stopped when dropped.
pub struct SharedEtcd {
    url: String,
    _process: Process,
}

impl SharedEtcd {
    /// Starts it, its data and log in `dir`, and waits until it listens.
    pub async fn start(dir: &Path) -> Result<Self, Error> {
        let binaries = Binaries::locate()?;
        std::fs::create_dir_all(dir).map_err(crate::cluster::io_error(dir))?;
        let [client, peer] = crate::cluster::free_ports()?;
        let process = process::spawn(
            "etcd",
            &binaries.etcd,
            &args(&dir.join("data"), client, peer),
            &dir.join("etcd.log"),
            Lifetime::Owned,
        )?;
        let mut processes = [process];
        crate::cluster::wait_for_tcp(client, "etcd", &mut processes).await?;
        let [process] = processes;
        Ok(Self {
            url: format!("http://127.0.0.1:{client}"),
            _process: process,
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_control_plane_in_a_shared_etcd_has_its_directorys_name_for_prefix() {
        assert_eq!(
            prefix_of(Path::new("/dev/shm/cloud/team-a-prod-1a2b3c4d")),
            "/team-a-prod-1a2b3c4d"
        );
    }
}
