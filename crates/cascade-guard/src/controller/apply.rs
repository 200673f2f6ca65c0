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

use super::inputs::{Known, Watched};
use super::type_check::{self, TypeCheck};
use super::{MANAGER, Managed};
use crate::Error;
use crate::policy::drift::first_difference;
pub use crate::policy::last_good::LastGood;
use crate::policy::last_good::{keep_last_good, recall};
use crate::policy::names::{
    CASCADE_POLICY_OBJECT_PREFIX, MANAGED_BY_LABEL, MANAGED_BY_VALUE,
    UPDATE_CASCADE_POLICY_OBJECT_PREFIX, UPDATE_XRD_OBJECT_PREFIX, XRD_OBJECT_PREFIX,
};
use crate::policy::{CompileSettings, Resolution, Source, compile, object_name};

const POLICY: &str = "ValidatingAdmissionPolicy";
const BINDING: &str = "ValidatingAdmissionPolicyBinding";

/// What a pass did, for status, events and logs.
pub struct Outcome {
    /// The policies in force: those resolved, plus the last good compilation
    /// of each CascadePolicy that names a kind no CRD defines.
    pub resolution: Resolution,
    /// The object names each source compiled to (each VAP and its binding
    /// share a name).
    pub compiled: BTreeMap<Source, Vec<String>>,
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
    last_good: &mut LastGood,
) -> Outcome {
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    // After a restart: what a CascadePolicy's objects in the cluster say.
    let read_back = |name: &str| {
        let object = object_name(&Source::CascadePolicy {
            name: name.to_string(),
        });
        let vap = serde_json::to_value(managed.policies.get(&object)?.as_ref()).ok()?;
        recall(name, &vap)
    };
    let (resolution, untouched) =
        keep_last_good(resolution, last_good, known.cascade_policies, read_back);
    let mut compiled = BTreeMap::new();
    let mut failed = BTreeMap::new();
    for policy in &resolution.policies {
        let mut names = Vec::new();
        let mut error = None;
        for objects in compile(policy, settings) {
            let name = objects.policy.name_any();
            names.push(name);
            if error.is_some() {
                continue;
            }
            // The policy first: a binding to a policy that does not exist yet
            // does nothing, but the other order is the honest one. Only what is
            // missing or differs from the watch cache is written.
            let result = match ensure(&policies, POLICY, &objects.policy, &managed.policies).await {
                Ok(()) => ensure(&bindings, BINDING, &objects.binding, &managed.bindings).await,
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                tracing::error!(source = %policy.source, error = %e, "cannot apply admission objects");
                error = Some(e.to_string());
            }
        }
        if names.is_empty() {
            continue;
        }
        if let Some(e) = error {
            failed.insert(policy.source.clone(), e);
        }
        // Wanted even when applying failed: pruning must not remove what is there.
        compiled.insert(policy.source.clone(), names);
    }
    let mut wanted: BTreeSet<String> = compiled.values().flatten().cloned().collect();
    wanted.extend(untouched);
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

/// The username the API server knows this client by (a SelfSubjectReview,
/// which every authenticated user may create).
pub async fn own_username(client: &Client) -> Result<String, kube::Error> {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    Ok(review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .unwrap_or_default())
}

/// Says so, loudly, when cascade-guard runs as someone other than the user
/// its UPDATE policies trust with its finalizer: the API server would refuse
/// every release, and held objects would wait until that is fixed.
pub async fn check_own_username(client: &Client, settings: &CompileSettings) {
    match own_username(client).await {
        Ok(me) if me == settings.controller_user => {}
        Ok(me) => tracing::error!(
            runs_as = %me,
            controller_user = %settings.controller_user,
            "cascade-guard runs as another user than --controller-user: the API server will refuse it to remove its own finalizer; set --controller-user to the user it runs as"
        ),
        Err(e) => tracing::warn!(error = %e, "cannot tell which user cascade-guard runs as"),
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
        let live = serde_json::to_value(live.as_ref()).unwrap_or_default();
        if first_difference(&desired, &live).is_none() {
            return Ok(());
        }
    }
    server_side_apply(api, kind, object).await
}

/// Server-side apply, forced. That takes back every field someone else changed
/// with an apply, but not fields others added with an update (a binding's
/// `objectSelector`) nor elements added to set-typed lists (a binding's
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
    let difference = first_difference(&desired, &serde_json::to_value(&live).unwrap_or_default());
    let Some(field) = difference else {
        return Ok(());
    };
    tracing::info!(kind, %name, %field, "replacing an admission object someone changed");
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
    if name.starts_with(XRD_OBJECT_PREFIX) || name.starts_with(UPDATE_XRD_OBJECT_PREFIX) {
        known.xrds
    } else if name.starts_with(CASCADE_POLICY_OBJECT_PREFIX)
        || name.starts_with(UPDATE_CASCADE_POLICY_OBJECT_PREFIX)
    {
        known.cascade_policies
    } else {
        known.xrds && known.cascade_policies
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn update_objects_are_pruned_with_their_source() {
        let cases = [
            ("cascade-guard-update-xrd-x.example.org", true, false, true),
            ("cascade-guard-update-xrd-x.example.org", false, true, false),
            ("cascade-guard-update-policy-x", false, true, true),
            ("cascade-guard-update-policy-x", true, false, false),
            ("cascade-guard-xrd-x.example.org", true, false, true),
            ("cascade-guard-policy-x", true, false, false),
            ("cascade-guard-other", true, false, false),
        ];
        for (name, xrds, cascade_policies, want) in cases {
            let known = Known {
                xrds,
                cascade_policies,
            };
            assert_eq!(prunable(name, &known), want, "{name}");
        }
    }
}
