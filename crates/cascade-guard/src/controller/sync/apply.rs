//! Bringing the cluster to the plan: the admission objects the policies
//! compile to are applied (server-side apply, forced, so that edits by anyone
//! else are reverted) and the ones no policy wants are removed. What to write
//! is the plan's diff against the watch cache, the same diff `status` shows.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::managed::Managed;
use super::sources::WatchCache;
use super::type_check;
use crate::Error;
use crate::cluster::type_check::TypeCheck;
use crate::controller::MANAGER;
use crate::policy::drift::first_difference;
pub use crate::policy::last_good::LastGood;
use crate::policy::last_good::{keep_last_good, recall};
use crate::policy::names::MANAGED_BY_SELECTOR;
use crate::policy::plan::{Drift, Known, Live, ObjectKind, Plan, diff, may_write, plan};
use crate::policy::{CompileSettings, Resolution, Source, object_name};

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
    let (resolution, kept) =
        keep_last_good(resolution, last_good, known.cascade_policies, read_back);
    let plan = plan(&resolution, settings, kept);
    let (live, complete) = live(&policies, &bindings, managed).await;
    // Nothing is removed on a partial view of what is there.
    let removable_for = if complete { *known } else { Known::default() };
    let mut failed: BTreeMap<Source, String> = BTreeMap::new();
    let mut failed_names = BTreeSet::new();
    for change in diff(&plan, &live, removable_for) {
        if !may_write(&change, !failed_names.is_empty()) {
            tracing::warn!(kind = change.kind.as_str(), name = %change.name, "not taking a kind out of an admission object in this pass, after a failed write");
            continue;
        }
        let result = match &change.drift {
            Drift::Missing | Drift::Differs { .. } if !change.sources.is_empty() => {
                // After a failed write, the rest of its pair waits for the next pass.
                if failed_names.contains(&change.name) {
                    continue;
                }
                if let Err(e) = write(&policies, &bindings, &plan, change.kind, &change.name).await
                {
                    // A shared object's failure leaves every kind it carries
                    // as it was in the cluster; each of their sources says so.
                    tracing::error!(name = %change.name, kinds = change.sources.len(), error = %e, "cannot apply admission objects");
                    failed_names.insert(change.name.clone());
                    for source in &change.sources {
                        failed
                            .entry(source.clone())
                            .or_insert_with(|| e.to_string());
                    }
                }
                continue;
            }
            Drift::Extra { removable: true } => {
                tracing::info!(kind = change.kind.as_str(), name = %change.name, "removing admission object no policy wants");
                match change.kind {
                    ObjectKind::Policy => remove(&policies, change.kind, &change.name).await,
                    ObjectKind::Binding => remove(&bindings, change.kind, &change.name).await,
                }
            }
            _ => continue,
        };
        if let Err(e) = result {
            tracing::error!(error = %e, "cannot remove a stale admission object");
        }
    }
    let compiled = plan.compiled_names();
    let type_checks = type_check::collect(&compiled, &managed.policies);
    Outcome {
        resolution,
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

/// Writes the plan's object of `kind` named `name`.
async fn write(
    policies: &Api<ValidatingAdmissionPolicy>,
    bindings: &Api<ValidatingAdmissionPolicyBinding>,
    plan: &Plan,
    kind: ObjectKind,
    name: &str,
) -> Result<(), Error> {
    let Some((_, compiled)) = plan.compiled(name) else {
        return Ok(());
    };
    match kind {
        ObjectKind::Policy => server_side_apply(policies, kind, &compiled.policy).await,
        ObjectKind::Binding => server_side_apply(bindings, kind, &compiled.binding).await,
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

/// Server-side apply, forced. That takes back every field someone else changed
/// with an apply, but not fields others added with an update (a binding's
/// `objectSelector`) nor elements added to set-typed lists (a binding's
/// `validationActions` would become `[Warn, Deny]`, which is invalid), so when
/// the live object still differs from ours, it is replaced outright.
async fn server_side_apply<K>(api: &Api<K>, kind: ObjectKind, object: &K) -> Result<(), Error>
where
    K: Resource + Serialize + DeserializeOwned + Clone + std::fmt::Debug,
    K::DynamicType: Default,
{
    let name = object.name_any();
    let error = |source| Error::Apply {
        kind: kind.as_str(),
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
    tracing::info!(kind = kind.as_str(), %name, %field, "replacing an admission object someone changed");
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

/// Deletes one of our objects that no policy wants (gone already is fine).
async fn remove<K>(api: &Api<K>, kind: ObjectKind, name: &str) -> Result<(), Error>
where
    K: Resource + DeserializeOwned + Clone + std::fmt::Debug,
    K::DynamicType: Default,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(Error::Delete {
            kind: kind.as_str(),
            name: name.to_string(),
            source,
        }),
    }
}
