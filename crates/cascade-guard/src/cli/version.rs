//! `cascade-guard version` and `cascade-guard crd`: a line or a document each.

use super::connect::client;
use super::exit::{CommandError, Outcome, out};
use super::kubeconfig::Selection;

/// The client's version, and the API server's unless `client_only`.
pub async fn version(cluster: &Selection, client_only: bool) -> Outcome {
    out(&format!("cascade-guard {}\n", env!("CARGO_PKG_VERSION")))?;
    if client_only {
        return Ok(0);
    }
    let client = client(cluster).await?;
    let info = client
        .apiserver_version()
        .await
        .map_err(|e| CommandError::from(e).context("cannot reach the API server"))?;
    out(&format!("kubernetes {}\n", info.git_version))?;
    Ok(0)
}

/// The CascadePolicy CustomResourceDefinition, as YAML.
pub fn crd() -> Outcome {
    let crds = crate::api::crds()
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<Vec<_>, _>>()?;
    out(&crate::policy::yaml_stream::to_yaml_stream(&crds))?;
    Ok(0)
}
