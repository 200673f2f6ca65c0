//! Letting go of what sibling order held, once its entry is gone: an object
//! whose owner is being deleted or gone is deleted (Foreground, only this
//! object): the garbage collector was refused its delete while it was held
//! and would otherwise try again only after its back-off, which grows to 17
//! minutes. Making a held ProviderConfigUsage stop blocking its managed
//! resource in a foreground cascade. And taking the old hold label off where
//! an older release left it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    DeleteParams, DynamicObject, PartialObjectMeta, Patch, PatchParams, Preconditions,
    PropagationPolicy,
};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::cluster::holds;
use crate::cluster::kinds::ServedKinds;
use crate::policy::names::FIELD_MANAGER;
use crate::policy::sibling::holds_record::{HELD_FOR_ANNOTATION, HOLD_LABEL};
use crate::policy::sibling::object::ObjectRef;

/// What became of an object let go.
#[derive(Debug, PartialEq, Eq)]
pub enum Unheld {
    /// Deleted: an owner of it is leaving.
    Deleted,
    /// Left as it is: nothing wants it gone, it is gone, or being deleted.
    Left,
    /// Its owner is leaving, but cascade-guard may not read or delete it:
    /// whoever deletes it tries again (the garbage collector after its
    /// back-off).
    LeftToItsDeleter,
}

/// Deletes `object` if an owner of it is leaving.
pub async fn let_go(
    client: &Client,
    kinds: &ServedKinds,
    object: &ObjectRef,
) -> Result<Unheld, kube::Error> {
    let Some(api) = api_of(client, kinds, object) else {
        return Ok(Unheld::Left);
    };
    let meta = match api.get_metadata_opt(&object.name).await {
        Ok(Some(meta)) => meta,
        Ok(None) => return Ok(Unheld::Left),
        Err(kube::Error::Api(s)) if s.code == 403 => return Ok(Unheld::LeftToItsDeleter),
        Err(e) => return Err(e),
    };
    if meta.metadata.deletion_timestamp.is_some() || !owner_leaving(client, kinds, &meta).await {
        return Ok(Unheld::Left);
    }
    // Only this object: a newer one of the same name is not touched.
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        preconditions: meta.uid().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&object.name, &params).await {
        Ok(_) => Ok(Unheld::Deleted),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(Unheld::Left),
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(Unheld::LeftToItsDeleter),
        Err(e) => Err(e),
    }
}

/// The API of `object`'s kind, in its namespace; None when the kind is not
/// served.
fn api_of(
    client: &Client,
    kinds: &ServedKinds,
    object: &ObjectRef,
) -> Option<kube::Api<DynamicObject>> {
    let served = kinds
        .of_kind(Some(object.group.as_str()), &object.kind)
        .next()?;
    Some(ServedKinds::api(
        client,
        served,
        object.namespace.as_deref(),
    ))
}

/// Makes `object`'s owner reference to `owner_uid` stop blocking that
/// owner's deletion (a held ProviderConfigUsage whose managed resource waits
/// in a foreground cascade: see `policy::sibling::provider_config_usage`). True when
/// it changed something; missing, already not blocking, or changed meanwhile
/// is no error (the next look sees it again).
pub async fn unblock(
    client: &Client,
    kinds: &ServedKinds,
    object: &ObjectRef,
    owner_uid: &str,
) -> Result<bool, kube::Error> {
    let Some(api) = api_of(client, kinds, object) else {
        return Ok(false);
    };
    let Some(meta) = api.get_metadata_opt(&object.name).await? else {
        return Ok(false);
    };
    let Some(patch) = unblock_patch(meta.owner_references(), owner_uid) else {
        return Ok(false);
    };
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    match api
        .patch(&object.name, &params, &Patch::Json::<()>(patch))
        .await
    {
        Ok(_) => Ok(true),
        // Gone, or its owner references changed since read (the test op).
        Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409 | 422) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The JSON patch that turns `blockOwnerDeletion` off on the owner reference
/// to `owner_uid`, guarded by a test of that reference's uid at its index;
/// None when no such reference blocks.
fn unblock_patch(owners: &[OwnerReference], owner_uid: &str) -> Option<json_patch::Patch> {
    let at = owners
        .iter()
        .position(|o| o.uid == owner_uid && o.block_owner_deletion == Some(true))?;
    serde_json::from_value(json!([
        {"op": "test", "path": format!("/metadata/ownerReferences/{at}/uid"), "value": owner_uid},
        {"op": "replace", "path": format!("/metadata/ownerReferences/{at}/blockOwnerDeletion"), "value": false},
    ]))
    .ok()
}

/// Takes the old hold label (and its annotation) off every object that
/// carries it, whatever its value: it holds nothing since the holds are kept
/// in a ConfigMap. Returns how many; what cannot be listed or written is said
/// through `progress` and left (a label alone is harmless); an object gone
/// since it was listed, or another of its name (its uid), is no error.
pub async fn strip_old_labels(
    client: &Client,
    kinds: &ServedKinds,
    progress: impl Fn(&str),
) -> usize {
    let mut count = 0;
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    let found = holds::labelled(client, kinds).await;
    for kind in &found.unreadable {
        progress(&format!(
            "cannot list {kind} to take the old hold label off: left as it is"
        ));
    }
    for (served, object) in found.objects {
        let api = ServedKinds::api(client, served, object.namespace().as_deref());
        let patch = json!({"metadata": {
            "uid": object.uid(),
            "labels": {HOLD_LABEL: null},
            "annotations": {HELD_FOR_ANNOTATION: null},
        }});
        match api
            .patch(&object.name_any(), &params, &Patch::Merge(patch))
            .await
        {
            Ok(_) => count += 1,
            // The uid in the patch is a precondition: 409 when it changed.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => progress(&format!(
                "cannot take the old hold label off {} {}: {e}",
                served.0.kind,
                object.name_any()
            )),
        }
    }
    count
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_api_server::{Exchange, OBJECT, against, resource, says};
    use serde_json::Value;

    const OWNER: &str = "/apis/example.org/v1/namespaces/team-a/xdatabases/owner";
    /// What a list of metadata only asks for.
    const METADATA_LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";

    fn kinds() -> ServedKinds {
        ServedKinds::of(vec![(resource(), true)])
    }

    fn held() -> ObjectRef {
        ObjectRef::new("example.org", "XDatabase", Some("team-a"), "db")
    }

    /// `db` as its metadata reads, owned by `owner` (uid o1), blocking.
    fn owned_db() -> Value {
        json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": {
                "name": "db", "namespace": "team-a", "uid": "u1", "resourceVersion": "3",
                "ownerReferences": [{
                    "apiVersion": "example.org/v1", "kind": "XDatabase", "name": "owner",
                    "uid": "o1", "controller": true, "blockOwnerDeletion": true,
                }],
            },
        })
    }

    fn owner_object(deleting: bool) -> Value {
        let mut o = json!({
            "apiVersion": "example.org/v1", "kind": "XDatabase",
            "metadata": {"name": "owner", "namespace": "team-a", "uid": "o1"},
        });
        if deleting {
            o["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        o
    }

    /// Let go: read, its owner read, and deleted (Foreground, only this
    /// object) only when the owner is leaving.
    #[tokio::test]
    async fn letting_go_deletes_only_what_a_leaving_owner_was_refused() {
        let delete = || {
            Exchange::delete(&format!("{OBJECT}?")).body_containing(json!({
                "propagationPolicy": "Foreground",
                "preconditions": {"uid": "u1"},
            }))
        };
        let cases: Vec<(&str, Vec<Exchange>, Unheld)> = vec![
            (
                "owner deleting",
                vec![
                    Exchange::get(OBJECT).ok(owned_db()),
                    Exchange::get(OWNER).ok(owner_object(true)),
                    delete().ok(owned_db()),
                ],
                Unheld::Deleted,
            ),
            (
                "owner staying",
                vec![
                    Exchange::get(OBJECT).ok(owned_db()),
                    Exchange::get(OWNER).ok(owner_object(false)),
                ],
                Unheld::Left,
            ),
            (
                "owner gone, the delete refused by a webhook",
                vec![
                    Exchange::get(OBJECT).ok(owned_db()),
                    Exchange::get(OWNER).fails(says::NOT_FOUND, "gone"),
                    delete().fails(says::CONFLICT, "in use"),
                ],
                Unheld::Left,
            ),
            (
                "gone already",
                vec![Exchange::get(OBJECT).fails(says::NOT_FOUND, "gone")],
                Unheld::Left,
            ),
            (
                "not readable",
                vec![Exchange::get(OBJECT).fails(says::FORBIDDEN, "no")],
                Unheld::LeftToItsDeleter,
            ),
            (
                "not deletable",
                vec![
                    Exchange::get(OBJECT).ok(owned_db()),
                    Exchange::get(OWNER).ok(owner_object(true)),
                    delete().fails(says::FORBIDDEN, "no"),
                ],
                Unheld::LeftToItsDeleter,
            ),
        ];
        for (what, script, want) in cases {
            let got = against(script, async |c| let_go(&c, &kinds(), &held()).await).await;
            assert_eq!(got.map_err(|e| e.to_string()), Ok(want), "{what}");
        }
    }

    /// Unblock: one JSON patch, guarded by the uid at its index; a changed
    /// or missing object is no error.
    #[tokio::test]
    async fn unblocking_is_one_guarded_json_patch() {
        let patch = || {
            Exchange::patch(&format!("{OBJECT}?&fieldManager=cascade-guard"))
                .header("content-type", "application/json-patch+json")
                .body(json!([
                    {"op": "test", "path": "/metadata/ownerReferences/0/uid", "value": "o1"},
                    {"op": "replace", "path": "/metadata/ownerReferences/0/blockOwnerDeletion", "value": false},
                ]))
        };
        let cases: Vec<(&str, Vec<Exchange>, bool)> = vec![
            (
                "blocking",
                vec![Exchange::get(OBJECT).ok(owned_db()), patch().ok(owned_db())],
                true,
            ),
            (
                "changed since read",
                vec![
                    Exchange::get(OBJECT).ok(owned_db()),
                    patch().fails(says::INVALID, "test failed"),
                ],
                false,
            ),
            (
                "gone",
                vec![Exchange::get(OBJECT).fails(says::NOT_FOUND, "gone")],
                false,
            ),
        ];
        for (what, script, want) in cases {
            let got = against(script, async |c| unblock(&c, &kinds(), &held(), "o1").await).await;
            assert_eq!(got.map_err(|e| e.to_string()), Ok(want), "{what}");
        }
        // Already not blocking: read, nothing sent.
        let mut not_blocking = owned_db();
        not_blocking["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] = json!(false);
        let got = against(vec![Exchange::get(OBJECT).ok(not_blocking)], async |c| {
            unblock(&c, &kinds(), &held(), "o1").await
        })
        .await;
        assert_eq!(got.map_err(|e| e.to_string()), Ok(false));
    }

    /// A cluster-scoped kind beside the test's namespaced one.
    fn network() -> kube::api::ApiResource {
        kube::api::ApiResource {
            kind: "XNetwork".into(),
            plural: "xnetworks".into(),
            ..resource()
        }
    }

    /// `name` (uid `uid`) in team-a, as a list of metadata gives it.
    fn labelled_db(name: &str, uid: &str) -> Value {
        json!({
            "metadata": {
                "name": name, "namespace": "team-a", "uid": uid,
                "labels": {HOLD_LABEL: "root-uid"},
                "annotations": {HELD_FOR_ANNOTATION: "its user"},
            },
        })
    }

    /// Stripping: every listable kind listed across namespaces by the old
    /// label (whatever its value), metadata only; each object found sent
    /// one merge patch that nulls the label and its annotation, its uid a
    /// precondition; only what was patched counts, and only a refusal is
    /// said (a kind that cannot be listed too), not an object gone or
    /// replaced since.
    #[tokio::test]
    async fn stripping_lists_by_the_old_label_and_patches_each_object_found() {
        let list = |path: &str| {
            Exchange::get(&format!("{path}?&labelSelector=cascade-guard.dev%2Fhold"))
                .header("accept", METADATA_LIST)
        };
        let patch = |name: &str, uid: &str| {
            Exchange::patch(&format!(
                "/apis/example.org/v1/namespaces/team-a/xdatabases/{name}?&fieldManager=cascade-guard"
            ))
            .header("content-type", "application/merge-patch+json")
            .body(json!({"metadata": {
                "uid": uid,
                "labels": {"cascade-guard.dev/hold": null},
                "annotations": {"cascade-guard.dev/held-for": null},
            }}))
        };
        let script = vec![
            list("/apis/example.org/v1/xdatabases").ok(json!({
                "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
                "metadata": {},
                "items": [
                    labelled_db("a", "ua"), labelled_db("b", "ub"),
                    labelled_db("c", "uc"), labelled_db("d", "ud"),
                ],
            })),
            list("/apis/example.org/v1/xnetworks").fails(says::FORBIDDEN, "no list"),
            patch("a", "ua").ok(labelled_db("a", "ua")),
            patch("b", "ub").fails(says::NOT_FOUND, "gone"),
            patch("c", "uc").fails(says::CONFLICT, "Precondition failed: UID in precondition"),
            patch("d", "ud").fails(says::FORBIDDEN, "no patch"),
        ];
        let kinds = ServedKinds::of(vec![(resource(), true), (network(), false)]);
        let said = std::sync::Mutex::new(Vec::new());
        let stripped = against(script, async |c| {
            strip_old_labels(&c, &kinds, |line| {
                said.lock().expect("not poisoned").push(line.to_string())
            })
            .await
        })
        .await;
        assert_eq!(stripped, 1);
        let said = said.into_inner().expect("not poisoned");
        assert_eq!(said.len(), 2, "{said:?}");
        assert!(
            said[0].starts_with("cannot list xnetworks.example.org"),
            "{said:?}"
        );
        assert!(
            said[1].starts_with("cannot take the old hold label off XDatabase d"),
            "{said:?}"
        );
    }

    /// Nothing labelled: the lists only, nothing counted or said.
    #[tokio::test]
    async fn stripping_with_nothing_labelled_sends_only_the_list() {
        let empty = json!({"apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadataList", "metadata": {}, "items": []});
        let script = vec![
            Exchange::get(
                "/apis/example.org/v1/xdatabases?&labelSelector=cascade-guard.dev%2Fhold",
            )
            .ok(empty),
        ];
        let stripped = against(script, async |c| {
            strip_old_labels(&c, &kinds(), |line| panic!("said {line}")).await
        })
        .await;
        assert_eq!(stripped, 0);
    }

    fn owner(uid: &str, block: Option<bool>) -> OwnerReference {
        OwnerReference {
            api_version: "helm.m.crossplane.io/v1beta1".to_string(),
            kind: "Release".to_string(),
            name: "app".to_string(),
            uid: uid.to_string(),
            controller: Some(true),
            block_owner_deletion: block,
        }
    }

    #[test]
    fn only_a_blocking_reference_to_the_owner_is_unblocked_at_its_index() {
        let patch = |owners: &[OwnerReference]| {
            unblock_patch(owners, "mr").map(|p| serde_json::to_value(p).expect("patch"))
        };
        assert_eq!(
            patch(&[owner("other", Some(true)), owner("mr", Some(true))]),
            Some(json!([
                {"op": "test", "path": "/metadata/ownerReferences/1/uid", "value": "mr"},
                {"op": "replace", "path": "/metadata/ownerReferences/1/blockOwnerDeletion", "value": false},
            ]))
        );
        assert_eq!(patch(&[owner("mr", Some(false))]), None);
        assert_eq!(patch(&[owner("mr", None)]), None);
        assert_eq!(patch(&[owner("other", Some(true))]), None);
        assert_eq!(patch(&[]), None);
    }
}
