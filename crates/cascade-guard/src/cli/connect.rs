//! A client for the cluster a command names, checked to answer before the
//! command reads anything.

use std::time::Duration;

use super::exit::CommandError;
use super::kubeconfig::{self, Selection};

/// How long a command waits for the API server's first answer.
const REACH_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
#[error("cannot reach the API server at {server}: {cause}")]
pub struct Unreachable {
    server: String,
    cause: String,
}

/// A client for the kubeconfig and context (or the environment, as kubectl
/// reads it), its context's namespace and the server it talks to; nothing is
/// sent yet.
pub async fn configure(
    cluster: &Selection,
) -> Result<(kube::Client, String, String), CommandError> {
    let config = kubeconfig::config(cluster).await?;
    let namespace = config.default_namespace.clone();
    let server = config.cluster_url.to_string();
    let client = kube::Client::try_from(config)
        .map_err(|e| CommandError::from(e).context("cannot make a Kubernetes client"))?;
    Ok((client, namespace, server))
}

/// A client, and the namespace of the kubeconfig's context (`default` when
/// it names none), which commands use as kubectl does when `-n` is not given.
pub async fn connect(cluster: &Selection) -> Result<(kube::Client, String), CommandError> {
    let (client, namespace, server) = configure(cluster).await?;
    // One request that must answer, so that an unreachable cluster is said
    // once, naming the server, instead of as the first read's error.
    match tokio::time::timeout(REACH_TIMEOUT, client.apiserver_version()).await {
        // It answered, even if to say no (403 on /version).
        Ok(Ok(_)) | Ok(Err(kube::Error::Api(_))) => Ok((client, namespace)),
        Ok(Err(e)) => Err(Unreachable {
            server,
            cause: e.to_string(),
        }
        .into()),
        Err(_) => Err(Unreachable {
            server,
            cause: format!("no answer within {}s", REACH_TIMEOUT.as_secs()),
        }
        .into()),
    }
}

pub async fn client(cluster: &Selection) -> Result<kube::Client, CommandError> {
    Ok(connect(cluster).await?.0)
}
