//! The writes Convert makes to a held kind's objects, each one request with
//! preconditions that keep it to the object as seen: a newer object reusing
//! the name, or a newer version of the same object, is never written.

use json_patch::jsonptr::{Pointer, PointerBuf};
use json_patch::{AddOperation, PatchOperation, RemoveOperation, TestOperation};
use kube::api::{ApiResource, DeleteParams, Patch, PatchParams, Preconditions, PropagationPolicy};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use super::Meta;
use crate::policy::names::FIELD_MANAGER as MANAGER;
use crate::policy::names::{
    CONVERTED_ANNOTATION, FOREGROUND_CASCADE_FINALIZER, FOREGROUND_DELETION_FINALIZER,
};

/// The object's own endpoint: namespaced or cluster-wide as the object is.
pub(super) fn object_api(client: &Client, resource: &ApiResource, object: &Meta) -> Api<Meta> {
    match object.namespace() {
        Some(ns) => Api::namespaced_with(client.clone(), &ns, resource),
        None => Api::all_with(client.clone(), resource),
    }
}

/// Adds the finalizer in cascade-guard's own request (its own field manager,
/// so no applier removes it), only to the object as seen: the patch tests the
/// UID and resourceVersion first. Gone is done.
pub(super) async fn add_finalizer(
    api: &Api<Meta>,
    object: &Meta,
    uid: &str,
) -> Result<(), kube::Error> {
    send_patch(api, &object.name_any(), add_finalizer_patch(object, uid)).await
}

fn add_finalizer_patch(object: &Meta, uid: &str) -> json_patch::Patch {
    let rv = object.resource_version().unwrap_or_default();
    let add = if object.metadata.finalizers.is_some() {
        AddOperation {
            path: Pointer::from_static("/metadata/finalizers/-").to_buf(),
            value: json!(FOREGROUND_CASCADE_FINALIZER),
        }
    } else {
        AddOperation {
            path: Pointer::from_static("/metadata/finalizers").to_buf(),
            value: json!([FOREGROUND_CASCADE_FINALIZER]),
        }
    };
    json_patch::Patch(vec![
        test("/metadata/uid", json!(uid)),
        test("/metadata/resourceVersion", json!(rv)),
        PatchOperation::Add(add),
    ])
}

/// What else a release tests besides the object's UID and cascade-guard's
/// finalizer where it was seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReleaseIf<'a> {
    /// Nothing else.
    Held,
    /// The object is still at this resourceVersion.
    AtVersion(&'a str),
    /// Its finalizers are all as seen: after a restarted cascade, a view from
    /// between the removal of `foregroundDeletion` and its return must not
    /// let go of an object whose cascade runs again.
    FinalizersAsSeen,
}

/// Removes the finalizer, testing that it is still where it was seen (and
/// what `guard` asks). Gone, or not holding the finalizer, is done.
pub(super) async fn release(
    api: &Api<Meta>,
    object: &Meta,
    uid: &str,
    guard: ReleaseIf<'_>,
) -> Result<(), kube::Error> {
    match release_patch(object, uid, guard) {
        Some(patch) => send_patch(api, &object.name_any(), patch).await,
        None => Ok(()),
    }
}

fn release_patch(object: &Meta, uid: &str, guard: ReleaseIf<'_>) -> Option<json_patch::Patch> {
    let at = finalizer_at(object, FOREGROUND_CASCADE_FINALIZER)?;
    let mut ops = vec![test("/metadata/uid", json!(uid))];
    match guard {
        ReleaseIf::Held => {}
        ReleaseIf::AtVersion(rv) => ops.push(test("/metadata/resourceVersion", json!(rv))),
        ReleaseIf::FinalizersAsSeen => {
            ops.push(test("/metadata/finalizers", json!(object.finalizers())));
        }
    }
    ops.push(PatchOperation::Test(TestOperation {
        path: at.clone(),
        value: json!(FOREGROUND_CASCADE_FINALIZER),
    }));
    ops.push(PatchOperation::Remove(RemoveOperation { path: at }));
    Some(json_patch::Patch(ops))
}

/// Where `finalizer` is in the object's finalizers, as a JSON pointer.
fn finalizer_at(object: &Meta, finalizer: &str) -> Option<PointerBuf> {
    let index = object.finalizers().iter().position(|f| f == finalizer)?;
    let mut at = PointerBuf::from_tokens(["metadata", "finalizers"]);
    at.push_back(index);
    Some(at)
}

/// What removing `foregroundDeletion` to restart a cascade came to.
#[derive(Debug, PartialEq)]
pub(super) enum Strip {
    Stripped,
    /// Not where it was seen (the garbage collector cleared it, say), or the
    /// object is gone or replaced: nothing to restart; decide again.
    NotAsSeen,
}

/// Removes `foregroundDeletion` from the object as seen (its UID, the
/// finalizer where it was seen), the first half of a restart
/// ([`crate::policy::cascade::Step::RestartCascade`]). The caller holds the
/// object with cascade-guard's finalizer, so it cannot go in between.
pub(super) async fn strip_foreground(
    api: &Api<Meta>,
    object: &Meta,
    uid: &str,
) -> Result<Strip, kube::Error> {
    let Some(at) = finalizer_at(object, FOREGROUND_DELETION_FINALIZER) else {
        return Ok(Strip::NotAsSeen);
    };
    let patch = json_patch::Patch(vec![
        test("/metadata/uid", json!(uid)),
        PatchOperation::Test(TestOperation {
            path: at.clone(),
            value: json!(FOREGROUND_DELETION_FINALIZER),
        }),
        PatchOperation::Remove(RemoveOperation { path: at }),
    ]);
    let params = own_field_manager();
    match api
        .patch(&object.name_any(), &params, &Patch::<()>::Json(patch))
        .await
    {
        Ok(_) => Ok(Strip::Stripped),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Strip::NotAsSeen),
        Err(e) if is_stale(&e) => Ok(Strip::NotAsSeen),
        Err(e) => Err(e),
    }
}

/// cascade-guard's own field manager, for every patch it sends.
fn own_field_manager() -> PatchParams {
    PatchParams {
        field_manager: Some(MANAGER.into()),
        ..PatchParams::default()
    }
}

fn test(path: &'static str, value: Value) -> PatchOperation {
    PatchOperation::Test(TestOperation {
        path: Pointer::from_static(path).to_buf(),
        value,
    })
}

async fn send_patch(
    api: &Api<Meta>,
    name: &str,
    patch: json_patch::Patch,
) -> Result<(), kube::Error> {
    let params = own_field_manager();
    match api.patch(name, &params, &Patch::<()>::Json(patch)).await {
        Ok(_) => Ok(()),
        // Gone: no finalizer to add or remove.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// What deleting again in the foreground came to.
#[derive(Debug, PartialEq)]
pub(super) enum Reissue {
    /// The delete now runs as a foreground cascade.
    Converted,
    /// Gone, or a newer object has the name (the UID precondition failed):
    /// nothing to convert.
    Gone,
}

/// Deletes the object again with propagationPolicy Foreground, only if it is
/// still the object with `uid`.
pub(super) async fn convert(
    api: &Api<Meta>,
    name: &str,
    uid: &str,
) -> Result<Reissue, kube::Error> {
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        preconditions: Some(Preconditions {
            uid: Some(uid.into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(Reissue::Converted),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(Reissue::Gone),
        Err(e) => Err(e),
    }
}

/// Marks the object converted ([`CONVERTED_ANNOTATION`]), on the object of
/// `uid` only (a merge patch's uid is a precondition). Gone is done.
pub(super) async fn mark_converted(
    api: &Api<Meta>,
    name: &str,
    uid: &str,
) -> Result<(), kube::Error> {
    let params = own_field_manager();
    let patch = json!({"metadata": {"uid": uid, "annotations": {CONVERTED_ANNOTATION: "true"}}});
    match api.patch(name, &params, &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// A refusal that may mean the object is not as seen: a failed JSON patch
/// test (422) or a conflict (409). [`changed_since`] tells for sure.
pub(super) fn is_stale(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409 || s.code == 422)
}

/// Whether the object is gone, replaced or at another resourceVersion than
/// `seen`. When that cannot be read, no: the caller retries instead.
pub(super) async fn changed_since(api: &Api<Meta>, seen: &Meta) -> bool {
    match api.get_metadata_opt(&seen.name_any()).await {
        Ok(None) => true,
        Ok(Some(now)) => {
            now.metadata.uid != seen.metadata.uid
                || now.metadata.resource_version != seen.metadata.resource_version
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fake_api_server::{Exchange, OBJECT, against, metadata, object, resource, says};

    const HELD: &str = FOREGROUND_CASCADE_FINALIZER;
    const PATCHED: &str =
        "/apis/example.org/v1/namespaces/team-a/xdatabases/db?&fieldManager=cascade-guard";
    const JSON_PATCH: (&str, &str) = ("content-type", "application/json-patch+json");
    const AS_METADATA: (&str, &str) = (
        "accept",
        "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
    );

    fn api(client: &Client, seen: &Meta) -> Api<Meta> {
        object_api(client, &resource(), seen)
    }

    fn add_finalizer_request(ops: serde_json::Value) -> Exchange {
        Exchange::patch(PATCHED)
            .header(JSON_PATCH.0, JSON_PATCH.1)
            .body(ops)
    }

    /// The finalizer added to `db` at resourceVersion 7, with no finalizers yet.
    fn add_to_unfinalized() -> Exchange {
        add_finalizer_request(json!([
            {"op": "test", "path": "/metadata/uid", "value": "u1"},
            {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
            {"op": "add", "path": "/metadata/finalizers", "value": [HELD]},
        ]))
    }

    #[tokio::test]
    async fn adding_the_finalizer_tests_uid_and_resource_version_first() {
        let seen = object("u1", "7", &[], false);
        let script = vec![add_to_unfinalized().ok(metadata("u1", "8", &[HELD], false))];
        let out = against(script, async |c| {
            add_finalizer(&api(&c, &seen), &seen, "u1").await
        })
        .await;
        assert!(out.is_ok(), "{out:?}");
    }

    #[tokio::test]
    async fn the_finalizer_is_appended_to_those_already_there() {
        let seen = object("u1", "7", &["other.io/keep"], false);
        let script = vec![
            add_finalizer_request(json!([
                {"op": "test", "path": "/metadata/uid", "value": "u1"},
                {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "add", "path": "/metadata/finalizers/-", "value": HELD},
            ]))
            .ok(metadata("u1", "8", &["other.io/keep", HELD], false)),
        ];
        let out = against(script, async |c| {
            add_finalizer(&api(&c, &seen), &seen, "u1").await
        })
        .await;
        assert!(out.is_ok(), "{out:?}");
    }

    #[tokio::test]
    async fn adding_the_finalizer_to_an_object_that_is_gone_is_done() {
        let seen = object("u1", "7", &[], false);
        let script = vec![
            add_to_unfinalized().fails(says::NOT_FOUND, "xdatabases.example.org \"db\" not found"),
        ];
        let out = against(script, async |c| {
            add_finalizer(&api(&c, &seen), &seen, "u1").await
        })
        .await;
        assert!(out.is_ok(), "{out:?}");
    }

    #[tokio::test]
    async fn a_refused_test_or_conflict_is_stale_and_a_look_tells_if_it_changed() {
        let refusals = [
            (
                says::INVALID,
                "the server rejected our request due to an error in our request",
                "9",
            ),
            (
                says::CONFLICT,
                "Operation cannot be fulfilled on xdatabases.example.org \"db\": the object has been modified",
                "7",
            ),
        ];
        let seen = object("u1", "7", &[], false);
        let script = refusals
            .iter()
            .flat_map(|(says, message, now_at)| {
                [
                    add_to_unfinalized().fails(*says, message),
                    Exchange::get(OBJECT)
                        .header(AS_METADATA.0, AS_METADATA.1)
                        .ok(metadata("u1", now_at, &[], false)),
                ]
            })
            .collect();
        let changed = against(script, async |c| {
            let api = api(&c, &seen);
            let mut changed = Vec::new();
            for _ in refusals {
                let refused = add_finalizer(&api, &seen, "u1").await;
                assert!(refused.as_ref().is_err_and(is_stale), "{refused:?}");
                changed.push(changed_since(&api, &seen).await);
            }
            changed
        })
        .await;
        // At another version: changed. At the version seen: not (retried).
        assert_eq!(changed, [true, false]);
    }

    #[tokio::test]
    async fn gone_or_replaced_is_a_change_and_unreadable_is_not() {
        let seen = object("u1", "7", &[], false);
        let script = vec![
            Exchange::get(OBJECT).fails(says::NOT_FOUND, "not found"),
            Exchange::get(OBJECT).ok(metadata("u2", "7", &[], false)),
            Exchange::get(OBJECT).fails(says::INTERNAL, "etcd is down"),
        ];
        let changes = against(script, async |c| {
            let api = api(&c, &seen);
            let mut changes = Vec::new();
            for _ in 0..3 {
                changes.push(changed_since(&api, &seen).await);
            }
            changes
        })
        .await;
        assert_eq!(changes, [true, true, false]);
    }

    #[tokio::test]
    async fn other_refusals_of_a_finalizer_add_are_not_stale() {
        let seen = object("u1", "7", &[], false);
        let script = vec![
            add_to_unfinalized().fails(says::FORBIDDEN, "admission webhook denied the request"),
        ];
        let out = against(script, async |c| {
            add_finalizer(&api(&c, &seen), &seen, "u1").await
        })
        .await;
        assert!(out.as_ref().is_err_and(|e| !is_stale(e)), "{out:?}");
    }

    #[tokio::test]
    async fn release_tests_the_finalizer_where_seen_and_removes_it() {
        let seen = object("u1", "7", &["other.io/keep", HELD], true);
        let script = vec![
            add_finalizer_request(json!([
                {"op": "test", "path": "/metadata/uid", "value": "u1"},
                {"op": "test", "path": "/metadata/finalizers/1", "value": HELD},
                {"op": "remove", "path": "/metadata/finalizers/1"},
            ]))
            .ok(metadata("u1", "8", &["other.io/keep"], true)),
            add_finalizer_request(json!([
                {"op": "test", "path": "/metadata/uid", "value": "u1"},
                {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "test", "path": "/metadata/finalizers/1", "value": HELD},
                {"op": "remove", "path": "/metadata/finalizers/1"},
            ]))
            .fails(says::NOT_FOUND, "not found"),
        ];
        let (any_version, as_seen) = against(script, async |c| {
            let api = api(&c, &seen);
            (
                release(&api, &seen, "u1", ReleaseIf::Held).await,
                release(&api, &seen, "u1", ReleaseIf::AtVersion("7")).await,
            )
        })
        .await;
        assert!(any_version.is_ok(), "{any_version:?}");
        // Gone: nothing to release.
        assert!(as_seen.is_ok(), "{as_seen:?}");
    }

    #[tokio::test]
    async fn a_release_after_a_restart_tests_every_finalizer_as_seen() {
        let seen = object("u1", "9", &["other.io/keep", HELD], true);
        let script =
            vec![
            add_finalizer_request(json!([
                {"op": "test", "path": "/metadata/uid", "value": "u1"},
                {"op": "test", "path": "/metadata/finalizers", "value": ["other.io/keep", HELD]},
                {"op": "test", "path": "/metadata/finalizers/1", "value": HELD},
                {"op": "remove", "path": "/metadata/finalizers/1"},
            ]))
            .fails(says::INVALID, "the server rejected our request due to an error in our request"),
        ];
        let out = against(script, async |c| {
            release(&api(&c, &seen), &seen, "u1", ReleaseIf::FinalizersAsSeen).await
        })
        .await;
        // foregroundDeletion is back on the real object: refused, and stale.
        assert!(out.as_ref().is_err_and(is_stale), "{out:?}");
    }

    #[tokio::test]
    async fn stripping_foreground_deletion_tests_it_where_seen_and_takes_refusals_as_changes() {
        let seen = object("u1", "9", &[HELD, "foregroundDeletion"], true);
        let strip = || {
            add_finalizer_request(json!([
                {"op": "test", "path": "/metadata/uid", "value": "u1"},
                {"op": "test", "path": "/metadata/finalizers/1", "value": "foregroundDeletion"},
                {"op": "remove", "path": "/metadata/finalizers/1"},
            ]))
        };
        let script = vec![
            strip().ok(metadata("u1", "10", &[HELD], true)),
            strip().fails(
                says::INVALID,
                "the server rejected our request due to an error in our request",
            ),
            strip().fails(says::NOT_FOUND, "not found"),
            strip().fails(says::FORBIDDEN, "forbidden"),
        ];
        let outs = against(script, async |c| {
            let api = api(&c, &seen);
            let mut outs = Vec::new();
            for _ in 0..4 {
                outs.push(
                    strip_foreground(&api, &seen, "u1")
                        .await
                        .map_err(|e| e.to_string()),
                );
            }
            outs
        })
        .await;
        assert_eq!(outs[0], Ok(Strip::Stripped));
        assert_eq!(outs[1], Ok(Strip::NotAsSeen));
        assert_eq!(outs[2], Ok(Strip::NotAsSeen));
        assert!(outs[3].is_err(), "{:?}", outs[3]);
        // Not seen with foregroundDeletion: nothing sent.
        let cleared = object("u1", "9", &[HELD], true);
        let out = against(Vec::new(), async |c| {
            strip_foreground(&api(&c, &cleared), &cleared, "u1").await
        })
        .await;
        assert_eq!(out.ok(), Some(Strip::NotAsSeen));
    }

    #[tokio::test]
    async fn releasing_an_object_not_held_sends_nothing() {
        let seen = object("u1", "7", &["other.io/keep"], true);
        let out = against(Vec::new(), async |c| {
            release(&api(&c, &seen), &seen, "u1", ReleaseIf::Held).await
        })
        .await;
        assert!(out.is_ok(), "{out:?}");
    }

    fn convert_request() -> Exchange {
        Exchange::delete("/apis/example.org/v1/namespaces/team-a/xdatabases/db?").body(json!({
            "propagationPolicy": "Foreground",
            "preconditions": {"uid": "u1"},
        }))
    }

    #[tokio::test]
    async fn convert_deletes_again_in_the_foreground_for_the_uid_seen() {
        let deleting = metadata("u1", "8", &["foregroundDeletion", HELD], true);
        let script = vec![
            convert_request().ok(deleting),
            convert_request().fails(says::NOT_FOUND, "not found"),
            convert_request().fails(
                says::CONFLICT,
                "Precondition failed: UID in precondition: u1, UID in object meta: u2",
            ),
            convert_request().fails(says::INTERNAL, "etcd is down"),
        ];
        let outs = against(script, async |c| {
            let api: Api<Meta> = Api::namespaced_with(c, "team-a", &resource());
            let mut outs = Vec::new();
            for _ in 0..4 {
                outs.push(convert(&api, "db", "u1").await.map_err(|e| e.to_string()));
            }
            outs
        })
        .await;
        assert_eq!(
            outs[..3],
            [Ok(Reissue::Converted), Ok(Reissue::Gone), Ok(Reissue::Gone)]
        );
        assert!(outs[3].is_err(), "{:?}", outs[3]);
    }
}
