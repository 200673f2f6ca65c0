//! An XR's composed resources that still hold up its foreground cascade:
//! those that exist with a blocking owner reference to it (the ones the
//! garbage collector waits for).

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject};
use kube::{Api, Client, ResourceExt};

use super::Meta;
use super::discovery::Discoveries;
use crate::policy::cascade::Dependents;
use crate::policy::holders::{IN_USE_LABEL, describe_dependent};
use crate::policy::stall::Left;
use crate::policy::{ComposedResource, composed_resources};

/// Composed resources of one XR looked up at once.
const LOOKUPS_AT_ONCE: usize = 8;

/// Where the lookups go: the XR's kind, and its composed kinds' discovery.
pub(crate) struct Lookup<'a> {
    pub client: &'a Client,
    pub resource: &'a ApiResource,
    pub discoveries: &'a Discoveries,
}

impl Lookup<'_> {
    /// The XR's blocking dependents, counted for the decision and described
    /// for the stall clock.
    pub(crate) async fn dependents(&self, object: &Meta, uid: &str) -> (Dependents, Vec<Left>) {
        let namespace = object.namespace();
        let full: Api<DynamicObject> = match &namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, self.resource),
            None => Api::all_with(self.client.clone(), self.resource),
        };
        let xr = match full.get_opt(&object.name_any()).await {
            Ok(Some(xr)) if xr.uid().as_deref() == Some(uid) => xr,
            Ok(_) => return (Dependents::None, Vec::new()),
            // Unknown counts as remaining: converting again is always safe.
            Err(_) => return (Dependents::Remaining(1), Vec::new()),
        };
        let refs = composed_resources(&xr.data, namespace.as_deref()).resources;
        // Looked up side by side: this sits between the garbage collector's
        // last delete and the XR leaving, so its round trips are the teardown's.
        let states: Vec<Dependent> = futures::stream::iter(refs)
            .map(|r| async move { self.dependent(&r, uid).await })
            .buffer_unordered(LOOKUPS_AT_ONCE)
            .collect()
            .await;
        let mut left: Vec<Left> = states
            .iter()
            .filter_map(|s| match s {
                Dependent::Blocking(l) => Some(l.clone()),
                _ => None,
            })
            .collect();
        left.sort();
        if states.contains(&Dependent::Unknowable) {
            return (Dependents::Unknowable, left);
        }
        match left.len() {
            0 => (Dependents::None, left),
            n => (Dependents::Remaining(n), left),
        }
    }

    async fn dependent(&self, r: &ComposedResource, uid: &str) -> Dependent {
        let (api_version, kind, name) = (r.api_version.as_str(), r.kind.as_str(), r.name.as_str());
        let Some((resource, namespaced)) =
            self.discoveries.find(self.client, api_version, kind).await
        else {
            return Dependent::Unknowable;
        };
        let ns = r.namespace.as_deref();
        let api: Api<Meta> = match (ns, namespaced) {
            (Some(ns), true) => Api::namespaced_with(self.client.clone(), ns, &resource),
            _ => Api::all_with(self.client.clone(), &resource),
        };
        let object = match (ns, namespaced) {
            (Some(ns), true) => format!("{kind}/{name} -n {ns}"),
            _ => format!("{kind}/{name}"),
        };
        match api.get_metadata_opt(name).await {
            Ok(Some(dependent)) => {
                let blocking = dependent
                    .owner_references()
                    .iter()
                    .any(|o| o.uid == uid && o.block_owner_deletion == Some(true));
                if !blocking {
                    return Dependent::Clear;
                }
                let deleting = dependent.metadata.deletion_timestamp.is_some();
                let in_use = dependent
                    .labels()
                    .get(IN_USE_LABEL)
                    .is_some_and(|v| v == "true");
                Dependent::Blocking(Left {
                    object,
                    deleting,
                    holder: describe_dependent(deleting, dependent.finalizers(), in_use),
                })
            }
            Ok(None) => Dependent::Clear,
            Err(kube::Error::Api(s)) if s.code == 403 => {
                tracing::warn!(%api_version, %kind, "no permission to read composed resources; relying on the garbage collector's confirmation");
                Dependent::Unknowable
            }
            Err(e) => Dependent::Blocking(Left {
                object,
                deleting: false,
                holder: format!("cannot be read: {e}"),
            }),
        }
    }
}

#[derive(Debug, PartialEq)]
enum Dependent {
    /// Exists with a blocking owner reference to the XR (or cannot be read
    /// for a reason other than permissions: counted, since converting again
    /// is always safe), and what holds it.
    Blocking(Left),
    /// Gone, or no longer blocks the XR.
    Clear,
    /// Its kind cannot be found, or cascade-guard may not read it.
    Unknowable,
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::fake_api_server::{Exchange, OBJECT, against, object, resource, says};

    fn xr(uid: &str) -> Value {
        json!({
            "apiVersion": "example.org/v1",
            "kind": "XDatabase",
            "metadata": {"name": "db", "namespace": "team-a", "uid": uid},
            "spec": {"resourceRefs": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "db-settings"},
                {"apiVersion": "v1", "kind": "Secret", "name": "db-password", "namespace": "vault"},
            ]},
        })
    }

    fn core_v1() -> Exchange {
        let resource = |name: &str, kind: &str| json!({"name": name, "namespaced": true, "kind": kind, "verbs": ["get"]});
        Exchange::get("/api/v1").ok(json!({
            "kind": "APIResourceList",
            "groupVersion": "v1",
            "resources": [resource("configmaps", "ConfigMap"), resource("secrets", "Secret")],
        }))
    }

    fn owned(name: &str, block: bool, deleting: bool) -> Value {
        let mut meta = json!({
            "name": name,
            "uid": format!("{name}-uid"),
            "ownerReferences": [{
                "apiVersion": "example.org/v1", "kind": "XDatabase", "name": "db",
                "uid": "u1", "blockOwnerDeletion": block,
            }],
        });
        if deleting {
            meta["deletionTimestamp"] = json!("2026-01-01T00:00:01Z");
            meta["finalizers"] = json!(["kubernetes"]);
        }
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": meta})
    }

    const SETTINGS: &str = "/api/v1/namespaces/team-a/configmaps/db-settings";
    const PASSWORD: &str = "/api/v1/namespaces/vault/secrets/db-password";

    async fn look_up(script: Vec<Exchange>, times: usize) -> Vec<(Dependents, Vec<String>)> {
        let seen = object("u1", "9", &[], true);
        against(script, async |client| {
            let discoveries = Discoveries::default();
            let resource = resource();
            let lookup = Lookup {
                client: &client,
                resource: &resource,
                discoveries: &discoveries,
            };
            let mut found = Vec::new();
            for _ in 0..times {
                let (dependents, left) = lookup.dependents(&seen, "u1").await;
                found.push((dependents, left.into_iter().map(|l| l.object).collect()));
            }
            found
        })
        .await
    }

    #[tokio::test]
    async fn blocking_dependents_count_and_others_do_not() {
        let script = vec![
            Exchange::get(OBJECT).ok(xr("u1")),
            core_v1(),
            core_v1(),
            Exchange::get(SETTINGS).ok(owned("db-settings", true, true)),
            Exchange::get(PASSWORD).ok(owned("db-password", false, false)),
        ];
        let found = look_up(script, 1).await;
        assert_eq!(
            found,
            [(
                Dependents::Remaining(1),
                vec!["ConfigMap/db-settings -n team-a".to_string()]
            )]
        );
    }

    #[tokio::test]
    async fn gone_dependents_leave_none_and_kinds_are_discovered_once() {
        let gone = |path| Exchange::get(path).fails(says::NOT_FOUND, "not found");
        let script = vec![
            Exchange::get(OBJECT).ok(xr("u1")),
            core_v1(),
            core_v1(),
            gone(SETTINGS),
            gone(PASSWORD),
            Exchange::get(OBJECT).ok(xr("u1")),
            gone(SETTINGS),
            gone(PASSWORD),
        ];
        let found = look_up(script, 2).await;
        assert_eq!(
            found,
            [(Dependents::None, vec![]), (Dependents::None, vec![])]
        );
    }

    #[tokio::test]
    async fn the_xr_gone_or_replaced_has_none_and_unreadable_counts_as_one() {
        let script = vec![
            Exchange::get(OBJECT).fails(says::NOT_FOUND, "not found"),
            Exchange::get(OBJECT).ok(xr("u2")),
            Exchange::get(OBJECT).fails(says::INTERNAL, "etcd is down"),
        ];
        let found = look_up(script, 3).await;
        assert_eq!(
            found,
            [
                (Dependents::None, vec![]),
                (Dependents::None, vec![]),
                (Dependents::Remaining(1), vec![]),
            ]
        );
    }

    #[tokio::test]
    async fn a_dependent_it_may_not_read_is_unknowable() {
        let script = vec![
            Exchange::get(OBJECT).ok(xr("u1")),
            core_v1(),
            core_v1(),
            Exchange::get(SETTINGS).fails(says::FORBIDDEN, "configmaps is forbidden"),
            Exchange::get(PASSWORD).fails(says::NOT_FOUND, "not found"),
        ];
        let found = look_up(script, 1).await;
        assert_eq!(found, [(Dependents::Unknowable, vec![])]);
    }

    #[tokio::test]
    async fn kinds_discovery_cannot_find_are_unknowable_and_not_asked_again_at_once() {
        let not_served = || {
            Exchange::get("/api/v1").fails(
                says::NOT_FOUND,
                "the server could not find the requested resource",
            )
        };
        let script = vec![
            Exchange::get(OBJECT).ok(xr("u1")),
            not_served(),
            not_served(),
            Exchange::get(OBJECT).ok(xr("u1")),
        ];
        let found = look_up(script, 2).await;
        assert_eq!(
            found,
            [
                (Dependents::Unknowable, vec![]),
                (Dependents::Unknowable, vec![])
            ]
        );
    }
}
