//! One admission sync pass against the cluster: cascade-guard's admission
//! objects read (from the watch caches, or listed while a cache has not
//! synced), the pure pass run on them ([`crate::policy::sync::pass`]: last
//! good, plan, diff, the same `status` runs), and its changes made
//! ([`super::writes`]).

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::managed::Managed;
use super::sources::WatchCache;
use super::{type_check, writes};
use crate::cluster::type_check::TypeCheck;
pub use crate::policy::last_good::LastGood;
use crate::policy::names::MANAGED_BY_SELECTOR;
use crate::policy::plan::{Known, Live};
use crate::policy::sync::{Seen, pass};
use crate::policy::{CompileSettings, Resolution, Source};

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

/// One pass: the admission objects read, the pure pass run on them with
/// what earlier passes remember (`last_good`), its changes made.
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
    let (live, live_complete) = live(&policies, &bindings, managed).await;
    let seen = Seen {
        known: *known,
        live: &live,
        live_complete,
    };
    // After a restart: what a CascadePolicy's objects in the cluster say.
    let recorded = |name: &str| serde_json::to_value(managed.policies.get(name)?.as_ref()).ok();
    let pass = pass(resolution, settings, seen, last_good, recorded);
    let failed = writes::make(&policies, &bindings, &pass).await;
    let compiled = pass.plan.compiled_names();
    let type_checks = type_check::collect(&compiled, &managed.policies);
    Outcome {
        resolution: pass.resolution,
        compiled,
        failed,
        type_checks,
        known: *known,
    }
}

/// cascade-guard's admission objects in the cluster, from the watch caches,
/// or listed while a cache has not synced yet; false when neither could be
/// read (then every wanted object is written, and nothing removed).
async fn live(
    policies: &Api<ValidatingAdmissionPolicy>,
    bindings: &Api<ValidatingAdmissionPolicyBinding>,
    managed: &Managed,
) -> (Live, bool) {
    let (policy_values, policies_read) = values(policies, &managed.policies).await;
    let (binding_values, bindings_read) = values(bindings, &managed.bindings).await;
    (
        Live::from_lists(&policy_values, &binding_values),
        policies_read && bindings_read,
    )
}

async fn values<K>(api: &Api<K>, cache: &WatchCache<K>) -> (Vec<Value>, bool)
where
    K: Resource + Serialize + DeserializeOwned + Clone + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let to_values = |objects: Vec<&K>| -> Vec<Value> {
        objects
            .into_iter()
            .filter_map(|o| serde_json::to_value(o).ok())
            .collect()
    };
    if let Some(objects) = cache.snapshot() {
        return (to_values(objects.iter().map(AsRef::as_ref).collect()), true);
    }
    match api
        .list(&ListParams::default().labels(MANAGED_BY_SELECTOR))
        .await
    {
        Ok(list) => (to_values(list.items.iter().collect()), true),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list cascade-guard's admission objects; writing every one");
            (Vec::new(), false)
        }
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
