//! `cascade-guard uninstall`: removes everything cascade-guard put into the
//! cluster, so that nothing is left refused or stuck: its admission objects
//! first (deletes are no longer checked), then its finalizer from every object
//! of every kind a policy names.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::api::{DeleteParams, DynamicObject, ListParams};
use kube::{Api, Client, ResourceExt};

use super::convert::{ConvertKind, release_outside, served_resource};
use super::inputs::read_once;
use crate::Error;
use crate::policy::names::{FOREGROUND_CASCADE_FINALIZER, MANAGED_BY_LABEL, MANAGED_BY_VALUE};
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
    // The API server enforces admission policies from a cache that follows
    // their deletion a moment later; until then the UPDATE policies refuse
    // the finalizer's removal. So release again, a few times, while any
    // object still holds it.
    let kinds: Vec<ConvertKind> = kinds
        .into_values()
        .map(|kind| ConvertKind {
            kind,
            selector: None,
        })
        .collect();
    summary.kinds_released = kinds.len();
    for attempt in 0..RELEASE_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        let mut held = 0;
        for kind in &kinds {
            if still_held(client, kind).await > 0 {
                release_outside(client, kind, None).await;
                held += still_held(client, kind).await;
            }
        }
        if held == 0 {
            break;
        }
    }
    Ok(summary)
}

const RELEASE_ATTEMPTS: usize = 10;

/// How many objects of the kind still carry cascade-guard's finalizer (0
/// when the kind is not served or cannot be listed: nothing to retry).
async fn still_held(client: &Client, kind: &ConvertKind) -> usize {
    let Ok(resource) = served_resource(client, &kind.kind).await else {
        return 0;
    };
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    match api.list_metadata(&ListParams::default()).await {
        Ok(list) => list
            .items
            .iter()
            .filter(|o| {
                o.finalizers()
                    .iter()
                    .any(|f| f == FOREGROUND_CASCADE_FINALIZER)
            })
            .count(),
        Err(_) => 0,
    }
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
