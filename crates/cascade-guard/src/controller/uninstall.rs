//! `cascade-guard uninstall`: removes everything cascade-guard put into the
//! cluster, so that nothing is left refused or stuck: its admission objects
//! first (deletes are no longer checked), then its finalizer from every object
//! of every kind a policy names.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client, ResourceExt};

use super::convert::{ConvertKind, release_outside};
use super::inputs::read_once;
use crate::Error;
use crate::policy::names::{MANAGED_BY_LABEL, MANAGED_BY_VALUE};
use crate::policy::{Mode, resolve};

#[derive(Debug, Default)]
pub struct Summary {
    pub admission_objects: usize,
    pub kinds_released: usize,
}

pub async fn uninstall(client: &Client) -> Result<Summary, Error> {
    let mut summary = Summary::default();
    let selector = ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"));
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    for b in bindings
        .list_metadata(&selector)
        .await
        .map_err(list("bindings"))?
    {
        delete(&bindings, &b.name_any(), "ValidatingAdmissionPolicyBinding").await?;
        summary.admission_objects += 1;
    }
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    for p in policies
        .list_metadata(&selector)
        .await
        .map_err(list("policies"))?
    {
        delete(&policies, &p.name_any(), "ValidatingAdmissionPolicy").await?;
        summary.admission_objects += 1;
    }

    // Every kind any policy names, whatever its mode now: an object may still
    // hold the finalizer from when its kind was in Convert mode.
    let read = read_once(client, Mode::Refuse).await?;
    let resolution = resolve(&read.inputs);
    let mut kinds = BTreeMap::new();
    for p in resolution.policies {
        kinds.insert(format!("{}/{}", p.kind.group, p.kind.kind), p.kind);
    }
    for kind in kinds.into_values() {
        release_outside(
            client,
            &ConvertKind {
                kind,
                selector: None,
            },
            None,
        )
        .await;
        summary.kinds_released += 1;
    }
    Ok(summary)
}

fn list(what: &'static str) -> impl Fn(kube::Error) -> Error {
    move |source| Error::List { what, source }
}

async fn delete<K>(api: &Api<K>, name: &str, kind: &'static str) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(Error::Delete {
            kind,
            name: name.to_string(),
            source,
        }),
    }
}
