//! Letting go of what sibling order holds, outside a tree's own reconcile:
//! objects whose root is no longer ordered (its kind lost its policy, the
//! root is gone) and, at uninstall, every one. The label comes off, and an
//! object whose owner is being deleted or gone is deleted (Foreground): the
//! garbage collector was refused its delete and would otherwise try again
//! only after its back-off, which grows to 17 minutes.

use kube::api::{
    DeleteParams, DynamicObject, PartialObjectMeta, Patch, PatchParams, Preconditions,
    PropagationPolicy,
};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::cluster::holds;
use crate::cluster::kinds::{Served, ServedKinds};
use crate::policy::hold::{HELD_FOR_ANNOTATION, HOLD_LABEL};
use crate::policy::names::FIELD_MANAGER;

/// Lets go of every held object of every kind whose root (the label's value)
/// `keep` does not name; returns how many. What cannot be listed or written
/// is said through `progress` and left.
pub async fn sweep(
    client: &Client,
    kinds: &ServedKinds,
    keep: impl Fn(&str) -> bool,
    progress: impl Fn(&str),
) -> usize {
    let mut count = 0;
    for (served, object) in holds::list(client, kinds).await.held {
        let root = object.labels().get(HOLD_LABEL).cloned().unwrap_or_default();
        if keep(&root) {
            continue;
        }
        match let_go(client, kinds, served, &object).await {
            Ok(()) => count += 1,
            Err(e) => progress(&format!(
                "cannot let go of {} {}: {e}",
                served.0.kind,
                object.name_any()
            )),
        }
    }
    count
}

/// Takes the label off `object` and deletes it if an owner is leaving.
pub async fn let_go(
    client: &Client,
    kinds: &ServedKinds,
    served: &Served,
    object: &PartialObjectMeta<DynamicObject>,
) -> Result<(), kube::Error> {
    let api = ServedKinds::api(client, served, object.namespace().as_deref());
    let patch = json!({"metadata": {
        "uid": object.uid(),
        "labels": {HOLD_LABEL: null},
        "annotations": {HELD_FOR_ANNOTATION: null},
    }});
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    api.patch(&object.name_any(), &params, &Patch::Merge(patch))
        .await?;
    if object.metadata.deletion_timestamp.is_none() && owner_leaving(client, kinds, object).await {
        // Only this object: a newer one of the same name is not touched.
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Foreground),
            preconditions: object.uid().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&object.name_any(), &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The garbage collector wants `object` gone: some blocking owner is being
/// deleted or gone, or every owner is gone (a standalone Crossplane Usage's
/// one owner, its user, does not block, and the Usage must stay until that
/// user is gone, not merely deleting).
pub async fn owner_leaving(
    client: &Client,
    kinds: &ServedKinds,
    object: &PartialObjectMeta<DynamicObject>,
) -> bool {
    let owners = object.owner_references();
    let mut gone = 0;
    for owner in owners {
        let Some(served) = kinds.get(&owner.api_version, &owner.kind) else {
            continue;
        };
        let api = ServedKinds::api(client, served, object.namespace().as_deref());
        let (absent, deleting) = match api.get_opt(&owner.name).await {
            Ok(None) => (true, false),
            Ok(Some(o)) if o.uid().as_deref() != Some(owner.uid.as_str()) => (true, false),
            Ok(Some(o)) => (false, o.metadata.deletion_timestamp.is_some()),
            Err(_) => (false, false),
        };
        if (absent || deleting) && owner.block_owner_deletion == Some(true) {
            return true;
        }
        gone += usize::from(absent);
    }
    !owners.is_empty() && gone == owners.len()
}
