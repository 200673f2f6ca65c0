//! The CRDs that ship in the Crossplane module zips, read and applied as they
//! are, except for where the API server must reach a conversion webhook: a
//! Service cannot be reached here (no kube-proxy), so it gets a loopback URL.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, WebhookClientConfig,
};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use super::{Error, api_error};

pub const FIELD_MANAGER: &str = "local-cluster";

/// Every CRD in the YAML files of `dir` (one document each, as shipped).
pub fn read_crds(dir: &Path) -> Result<Vec<CustomResourceDefinition>, Error> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| Error::Manifest {
            path: dir.to_path_buf(),
            detail: e.to_string(),
        })?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path).map_err(|e| Error::Manifest {
                path: path.clone(),
                detail: e.to_string(),
            })?;
            serde_yaml::from_str(&text).map_err(|e| Error::Manifest {
                path: path.clone(),
                detail: format!("not a CRD: {e}"),
            })
        })
        .collect()
}

/// Points a CRD's conversion webhook, if it has one, at `url` on loopback.
pub fn convert_on_loopback(crd: &mut CustomResourceDefinition, url: &str, ca_pem: &str) {
    let Some(webhook) = crd
        .spec
        .conversion
        .as_mut()
        .filter(|c| c.strategy == "Webhook")
        .and_then(|c| c.webhook.as_mut())
    else {
        return;
    };
    webhook.client_config = Some(WebhookClientConfig {
        url: Some(url.to_string()),
        ca_bundle: Some(ByteString(ca_pem.as_bytes().to_vec())),
        service: None,
    });
}

/// Whether a CRD converts through a webhook.
pub fn has_conversion_webhook(crd: &CustomResourceDefinition) -> bool {
    crd.spec
        .conversion
        .as_ref()
        .is_some_and(|c| c.strategy == "Webhook")
}

/// Applies the CRDs (server-side, as [`FIELD_MANAGER`]) and waits until each
/// is established.
pub async fn apply_crds(client: &Client, crds: &[CustomResourceDefinition]) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let mut crd = crd.clone();
        crd.metadata.managed_fields = None;
        crd.status = None;
        api.patch(&name, &params, &Patch::Apply(&crd))
            .await
            .map_err(api_error(format!("applying CRD {name}")))?;
    }
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        crate::wait::crd_established(client, &name, Duration::from_secs(60))
            .await
            .map_err(api_error(format!("waiting for CRD {name}")))?;
    }
    Ok(())
}
