//! Sibling order's writes to the objects of a tree: a foreground delete of
//! one object in order, letting go of what is no longer held, and the
//! Events on a tree's root. Each request is pinned by a test against the
//! in-process fake API server.

use kube::api::{DeleteParams, DynamicObject, Preconditions, PropagationPolicy};
use kube::runtime::events::EventType;
use kube::{Api, Client, Resource};
use serde_json::Value;

use crate::cluster::events::Teller;
use crate::cluster::kinds::ServedKinds;
use crate::cluster::unhold::{self, Unheld};
use crate::policy::sibling::hold::Action;
use crate::policy::sibling::object::ObjectRef;

/// What a delete in order came to, when it did not fail.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Deleted {
    /// Sent (or gone already, or refused by someone else's webhook: tried
    /// again at the next look while still held).
    Sent,
    /// cascade-guard may not delete it (it could not read it, or the delete
    /// was forbidden): its entry goes, and its deleter's next try deletes it.
    LeftToItsDeleter,
}

/// Deletes `r` (what was read of it: `object`) with a foreground cascade,
/// only if it is still the object read.
pub(super) async fn delete_in_order(
    client: &Client,
    kinds: &ServedKinds,
    r: &ObjectRef,
    object: &Value,
) -> Result<Deleted, kube::Error> {
    let text = |p: &str| object.pointer(p).and_then(Value::as_str).unwrap_or("");
    let Some(served) = kinds.get(text("/apiVersion"), text("/kind")) else {
        return Ok(Deleted::Sent);
    };
    // Known by its name alone: cascade-guard may not read it, so it may not
    // delete it either.
    if text("/metadata/uid").starts_with("unread:") {
        return Ok(Deleted::LeftToItsDeleter);
    }
    let api = ServedKinds::api(client, served, r.namespace.as_deref());
    let uid = Some(text("/metadata/uid").to_string());
    match delete_this_one(&api, &r.name, uid).await {
        Ok(()) => Ok(Deleted::Sent),
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(Deleted::LeftToItsDeleter),
        Err(e) => Err(e),
    }
}

/// Deletes `name` with a foreground cascade, only if it is still the object
/// of `uid` (a newer one of the same name is not touched); gone already or
/// refused by someone else's webhook (Crossplane's, 409) is no error.
async fn delete_this_one(
    api: &Api<DynamicObject>,
    name: &str,
    uid: Option<String>,
) -> Result<(), kube::Error> {
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// How many objects are let go of at once.
const LET_GO_AT_ONCE: usize = 8;

/// Lets go of objects no longer held (their entries are gone): each is
/// deleted if an owner of it is leaving. LET_GO_AT_ONCE at a time: a
/// teardown's roots leave together, and one after another under a loaded
/// API server took seconds of a look.
pub(super) async fn let_go_all(client: &Client, kinds: &ServedKinds, objects: &[ObjectRef]) {
    for chunk in objects.chunks(LET_GO_AT_ONCE) {
        futures::future::join_all(chunk.iter().map(|object| let_go(client, kinds, object))).await;
    }
}

async fn let_go(client: &Client, kinds: &ServedKinds, object: &ObjectRef) {
    match unhold::let_go(client, kinds, object).await {
        Ok(Unheld::Deleted) => {
            tracing::info!(%object, "sibling order: deleted what it held, as its owner is leaving");
        }
        Ok(Unheld::Left) => {}
        Ok(Unheld::LeftToItsDeleter) => {
            tracing::info!(%object, "sibling order: let go; cascade-guard may not delete it, so its deleter's next try does");
        }
        Err(e) => tracing::warn!(%object, error = %e, "sibling order: cannot let go"),
    }
}

/// An Event on a tree's root, told to the one publisher (a terminating
/// namespace's refusal expected, anything else logged) without waiting
/// for it: the look goes on.
pub(super) fn event(
    teller: &Teller,
    root: &DynamicObject,
    type_: EventType,
    reason: &'static str,
    note: String,
) {
    let Some(types) = root.types.as_ref() else {
        return;
    };
    let resource = kube::api::ApiResource {
        group: types
            .api_version
            .split_once('/')
            .map_or("", |(g, _)| g)
            .to_string(),
        version: types
            .api_version
            .rsplit_once('/')
            .map_or(types.api_version.as_str(), |(_, v)| v)
            .to_string(),
        api_version: types.api_version.clone(),
        kind: types.kind.clone(),
        plural: String::new(),
    };
    let reference = root.object_ref(&resource);
    teller.tell(reference, type_, "SiblingOrder", reason, note);
}

pub(super) fn describe(action: &Action) -> String {
    match action {
        Action::Hold { object, held_for } => {
            format!("hold {object} until {held_for} is gone")
        }
        Action::Release { object } => format!("release {object}: nothing needs it any more"),
        Action::Unblock { object, .. } => format!(
            "let {object} stop blocking its managed resource's foreground cascade: its provider deletes only once the garbage collector's finalizer is gone, and keeps needing the usage until then"
        ),
        Action::Delete { object } => {
            format!(
                "delete {object} (Foreground): its parent is being deleted, and what needed it is gone"
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fake_api_server::{Exchange, OBJECT, against, resource, says};

    fn kinds() -> ServedKinds {
        ServedKinds::of(vec![(resource(), true)])
    }

    fn held() -> ObjectRef {
        ObjectRef::new("example.org", "XDatabase", Some("team-a"), "db")
    }

    fn read(uid: &str) -> Value {
        json!({
            "apiVersion": "example.org/v1",
            "kind": "XDatabase",
            "metadata": {"name": "db", "namespace": "team-a", "uid": uid},
        })
    }

    /// The one request a delete in order sends: Foreground, only the object
    /// read (its uid a precondition); what each answer comes to.
    #[tokio::test]
    async fn a_delete_in_order_is_one_foreground_delete_of_the_object_read() {
        let ok = || Ok(Deleted::Sent);
        // (the API server's failure, if it fails) -> what it comes to
        type Case = (Option<(u16, &'static str)>, Result<Deleted, u16>);
        let cases: Vec<Case> = vec![
            (None, ok()),
            (Some(says::NOT_FOUND), ok()),
            // Someone else's webhook (Crossplane's Usage): tried again.
            (Some(says::CONFLICT), ok()),
            (Some(says::FORBIDDEN), Ok(Deleted::LeftToItsDeleter)),
            (Some(says::INTERNAL), Err(500)),
        ];
        for (answer, want) in cases {
            let mut exchange = Exchange::delete(&format!("{OBJECT}?")).body_containing(json!({
                "propagationPolicy": "Foreground",
                "preconditions": {"uid": "u1"},
            }));
            exchange = match answer {
                None => exchange.ok(read("u1")),
                Some(status) => exchange.fails(status, "as said"),
            };
            let got = against(vec![exchange], async |c| {
                delete_in_order(&c, &kinds(), &held(), &read("u1")).await
            })
            .await;
            let got = got.map_err(|e| match e {
                kube::Error::Api(s) => s.code,
                _ => 0,
            });
            assert_eq!(got, want, "{answer:?}");
        }
    }

    /// Known by name only, or of a kind not served: no request at all.
    #[tokio::test]
    async fn what_cascade_guard_could_not_read_it_does_not_delete() {
        let got = against(Vec::new(), async |c| {
            let unread = delete_in_order(&c, &kinds(), &held(), &read("unread:db")).await;
            let mut unknown = read("u1");
            unknown["kind"] = json!("XGone");
            let unserved = delete_in_order(&c, &kinds(), &held(), &unknown).await;
            (unread.ok(), unserved.ok())
        })
        .await;
        assert_eq!(got, (Some(Deleted::LeftToItsDeleter), Some(Deleted::Sent)));
    }
}
