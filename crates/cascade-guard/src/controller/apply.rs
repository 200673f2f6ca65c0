//! Applying the compiled admission objects (server-side apply, forced, so that
//! edits by anyone else are reverted) and removing the ones no policy wants.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::inputs::{Known, Watched};
use super::type_check::{self, TypeCheck};
use super::{MANAGER, Managed};
use crate::Error;
use crate::policy::names::{
    CASCADE_POLICY_OBJECT_PREFIX, MANAGED_BY_LABEL, MANAGED_BY_VALUE, XRD_OBJECT_PREFIX,
};
use crate::policy::{CompileSettings, Resolution, Source, compile};

const POLICY: &str = "ValidatingAdmissionPolicy";
const BINDING: &str = "ValidatingAdmissionPolicyBinding";

/// What a pass did, for status, events and logs.
pub struct Outcome {
    pub resolution: Resolution,
    /// The object name each source compiled to (VAP and binding share it).
    pub compiled: BTreeMap<Source, String>,
    /// Sources whose objects could not be applied, with the error.
    pub failed: BTreeMap<Source, String>,
    /// What the API server's type check says of each compiled policy.
    pub type_checks: BTreeMap<Source, (String, TypeCheck)>,
    pub known: Known,
}

pub async fn apply(
    client: &Client,
    settings: &CompileSettings,
    resolution: Resolution,
    known: &Known,
    managed: &Managed,
) -> Outcome {
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let mut compiled = BTreeMap::new();
    let mut failed = BTreeMap::new();
    for policy in &resolution.policies {
        let Some(objects) = compile(policy, settings) else {
            continue;
        };
        let name = objects.policy.name_any();
        // The policy first: a binding to a policy that does not exist yet does
        // nothing, but the other order is the honest one. Only what is missing
        // or differs from the watch cache is written.
        let result = match ensure(&policies, POLICY, &objects.policy, &managed.policies).await {
            Ok(()) => ensure(&bindings, BINDING, &objects.binding, &managed.bindings).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => {
                compiled.insert(policy.source.clone(), name);
            }
            Err(e) => {
                tracing::error!(source = %policy.source, error = %e, "cannot apply admission objects");
                failed.insert(policy.source.clone(), e.to_string());
                // Still wanted: pruning must not remove what is there.
                compiled.insert(policy.source.clone(), name);
            }
        }
    }
    let wanted: BTreeSet<String> = compiled.values().cloned().collect();
    if let Err(e) = prune(&bindings, BINDING, &wanted, known, &managed.bindings).await {
        tracing::error!(error = %e, "cannot remove stale bindings");
    }
    if let Err(e) = prune(&policies, POLICY, &wanted, known, &managed.policies).await {
        tracing::error!(error = %e, "cannot remove stale policies");
    }
    let type_checks = type_check::collect(&compiled, &managed.policies);
    Outcome {
        resolution,
        compiled,
        failed,
        type_checks,
        known: *known,
    }
}

/// Applies `object` unless the watch cache shows the API server already has
/// it as wanted.
async fn ensure<K>(
    api: &Api<K>,
    kind: &'static str,
    object: &K,
    cache: &Watched<K>,
) -> Result<(), Error>
where
    K: Resource + Serialize + DeserializeOwned + Clone + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let name = object.name_any();
    if let Some(live) = cache.get(&name) {
        let desired = serde_json::to_value(object).unwrap_or_default();
        if contains(
            &desired,
            &serde_json::to_value(live.as_ref()).unwrap_or_default(),
        ) {
            return Ok(());
        }
    }
    server_side_apply(api, kind, object).await
}

/// Server-side apply, forced. That takes back every field someone else changed,
/// but not elements others added to set-typed lists (a binding's
/// `validationActions` would become `[Warn, Deny]`, which is invalid), so when
/// the live object still differs from ours, it is replaced outright.
async fn server_side_apply<K>(api: &Api<K>, kind: &'static str, object: &K) -> Result<(), Error>
where
    K: Resource + Serialize + DeserializeOwned + Clone + std::fmt::Debug,
    K::DynamicType: Default,
{
    let name = object.name_any();
    let error = |source| Error::Apply {
        kind,
        name: name.clone(),
        source,
    };
    let desired = serde_json::to_value(object).unwrap_or_default();
    let applied = api
        .patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(object),
        )
        .await;
    let live = match applied {
        Ok(live) => live,
        // Invalid after merging with someone else's edit: replace below.
        Err(kube::Error::Api(s)) if s.code == 422 => api.get(&name).await.map_err(error)?,
        Err(e) => return Err(error(e)),
    };
    if contains(&desired, &serde_json::to_value(&live).unwrap_or_default()) {
        return Ok(());
    }
    tracing::info!(kind, %name, "replacing an admission object someone changed");
    let mut replacement = object.clone();
    replacement.meta_mut().resource_version = live.meta().resource_version.clone();
    let params = PostParams {
        field_manager: Some(MANAGER.into()),
        ..PostParams::default()
    };
    api.replace(&name, &params, &replacement)
        .await
        .map(|_| ())
        .map_err(error)
}

/// Whether `live` has every field of `desired` with the same value (lists
/// exactly, element by element). Fields only in `live` (server defaults,
/// status, metadata) do not count.
fn contains(desired: &Value, live: &Value) -> bool {
    match (desired, live) {
        (Value::Object(d), Value::Object(l)) => d
            .iter()
            .all(|(k, v)| l.get(k).is_some_and(|lv| contains(v, lv))),
        (Value::Array(d), Value::Array(l)) => {
            d.len() == l.len() && d.iter().zip(l).all(|(dv, lv)| contains(dv, lv))
        }
        (d, l) => d == l,
    }
}

/// Deletes our objects that no policy wants, but only those whose source was
/// read completely: an input we could not read must not lift protection.
async fn prune<K>(
    api: &Api<K>,
    kind: &'static str,
    wanted: &BTreeSet<String>,
    known: &Known,
    cache: &Watched<K>,
) -> Result<(), Error>
where
    K: Resource + DeserializeOwned + Clone + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let names: Vec<String> = match cache.snapshot() {
        Some(objects) => objects.iter().map(|o| o.name_any()).collect(),
        None => {
            let selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}");
            api.list_metadata(&ListParams::default().labels(&selector))
                .await
                .map_err(|source| Error::List { what: kind, source })?
                .items
                .iter()
                .map(|o| o.name_any())
                .collect()
        }
    };
    for name in names {
        if wanted.contains(&name) || !prunable(&name, known) {
            continue;
        }
        tracing::info!(kind, %name, "removing admission object no policy wants");
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => {
                return Err(Error::Delete { kind, name, source });
            }
        }
    }
    Ok(())
}

fn prunable(name: &str, known: &Known) -> bool {
    if name.starts_with(XRD_OBJECT_PREFIX) {
        known.xrds
    } else if name.starts_with(CASCADE_POLICY_OBJECT_PREFIX) {
        known.cascade_policies
    } else {
        known.xrds && known.cascade_policies
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn contains_ignores_extra_live_fields_but_not_changed_lists() {
        let desired = json!({"spec": {"validationActions": ["Deny"], "policyName": "p"}});
        let cases = [
            (
                json!({"spec": {"validationActions": ["Deny"], "policyName": "p", "matchResources": {}}}),
                true,
            ),
            (
                json!({"spec": {"validationActions": ["Warn", "Deny"], "policyName": "p"}}),
                false,
            ),
            (
                json!({"spec": {"validationActions": ["Warn"], "policyName": "p"}}),
                false,
            ),
            (
                json!({"spec": {"validationActions": ["Deny"], "policyName": "q"}}),
                false,
            ),
            (json!({"spec": {"policyName": "p"}}), false),
        ];
        for (live, expected) in cases {
            assert_eq!(contains(&desired, &live), expected, "{live}");
        }
    }
}
