//! Finding every object that carries cascade-guard's finalizer, whatever
//! policy names its kind now. While cascade-guard was down a kind may have
//! stopped being Convert, or lost its XRD or CascadePolicy (even its CRD may be
//! terminating), with objects still held: the controller finishes those at
//! start, and `uninstall` and `status` report them.
//!
//! It reads every custom resource kind the caller may list. Kinds it may not
//! list are skipped: cascade-guard cannot have held objects of a kind it may not
//! patch, and its RBAC grants list wherever it grants patch.

use std::collections::{BTreeMap, BTreeSet};

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, ListParams, PartialObjectMeta};
use kube::discovery::Scope as DiscoveryScope;
use kube::{Api, Client, ResourceExt};

use crate::policy::names::FOREGROUND_CASCADE_FINALIZER;
use crate::policy::{ProtectedKind, Scope, Shape};

/// Objects of one kind that carry the finalizer.
#[derive(Clone, Debug)]
pub struct Holding {
    pub kind: ProtectedKind,
    pub objects: Vec<HeldObject>,
}

#[derive(Clone, Debug)]
pub struct HeldObject {
    pub namespace: Option<String>,
    pub name: String,
    pub deleting: bool,
}

#[derive(Debug, Default)]
pub struct Scan {
    pub holding: Vec<Holding>,
    /// Kinds that could not be read for another reason than permissions
    /// (`plural.group: error`): what they hold is not known.
    pub unreadable: Vec<String>,
}

/// How much of each kind a scan reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Depth {
    /// Every held object (`status` counts them, `uninstall` lets each go).
    Every,
    /// Only whether the kind holds any: the controller's start needs no more,
    /// and a kind that holds thousands is then one small page, not all of them
    /// listed beside the Convert watches that list them anyway.
    Any,
}

/// Kinds listed at once.
const KINDS_AT_ONCE: usize = 4;
/// The first page is small (a kind whose objects are held answers from it);
/// the rest are larger, for kinds that must be read to the end.
const FIRST_PAGE: u32 = 50;
const PAGE: u32 = 500;

pub async fn scan(client: &Client, depth: Depth) -> Result<Scan, kube::Error> {
    let crds = Api::<PartialObjectMeta<CustomResourceDefinition>>::all(client.clone())
        .list_metadata(&ListParams::default())
        .await?;
    let mut plurals_by_group: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for crd in &crds.items {
        if let Some((plural, group)) = crd.name_any().split_once('.') {
            plurals_by_group
                .entry(group.to_string())
                .or_default()
                .insert(plural.to_string());
        }
    }
    let mut scan = Scan::default();
    let mut resources = Vec::new();
    for (group, plurals) in &plurals_by_group {
        match kube::discovery::group(client, group).await {
            Ok(found) => {
                for (resource, caps) in found.recommended_resources() {
                    if plurals.contains(&resource.plural) {
                        resources.push((resource, caps.scope));
                    }
                }
            }
            Err(e) => scan.unreadable.push(format!("{group}: {e}")),
        }
    }
    let results: Vec<_> = futures::stream::iter(resources)
        .map(|(resource, scope)| async move {
            let found = held_objects(client, &resource, depth).await;
            (resource, scope, found)
        })
        .buffer_unordered(KINDS_AT_ONCE)
        .collect()
        .await;
    for (resource, scope, found) in results {
        match found {
            Ok(objects) if objects.is_empty() => {}
            Ok(objects) => scan.holding.push(Holding {
                kind: ProtectedKind {
                    group: resource.group.clone(),
                    kind: resource.kind.clone(),
                    plural: resource.plural.clone(),
                    scope: match scope {
                        DiscoveryScope::Namespaced => Scope::Namespaced,
                        DiscoveryScope::Cluster => Scope::Cluster,
                    },
                    // Not known from here; the confirming round of kinds that
                    // are not XRs is safe for any kind.
                    shape: Shape::Other,
                },
                objects,
            }),
            // Not ours to read, or gone since discovery.
            Err(kube::Error::Api(s)) if s.code == 403 || s.code == 404 => {
                tracing::debug!(resource = %resource.plural, group = %resource.group, code = s.code, "not scanned for held objects");
            }
            Err(e) => scan
                .unreadable
                .push(format!("{}.{}: {e}", resource.plural, resource.group)),
        }
    }
    scan.holding.sort_by(|a, b| a.kind.cmp(&b.kind));
    Ok(scan)
}

async fn held_objects(
    client: &Client,
    resource: &ApiResource,
    depth: Depth,
) -> Result<Vec<HeldObject>, kube::Error> {
    let api: Api<PartialObjectMeta<kube::api::DynamicObject>> =
        Api::all_with(client.clone(), resource);
    let mut held = Vec::new();
    let mut params = ListParams::default().limit(FIRST_PAGE);
    loop {
        let page = api.list_metadata(&params).await?;
        for object in &page.items {
            if object
                .finalizers()
                .iter()
                .any(|f| f == FOREGROUND_CASCADE_FINALIZER)
            {
                held.push(HeldObject {
                    namespace: object.namespace(),
                    name: object.name_any(),
                    deleting: object.metadata.deletion_timestamp.is_some(),
                });
                if depth == Depth::Any {
                    return Ok(held);
                }
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.limit(PAGE).continue_token(&token),
            None => return Ok(held),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::fake_api_server::{Exchange, against, metadata, resource};

    const FIRST: &str = "/apis/example.org/v1/xdatabases?&limit=50";
    const NEXT: &str = "/apis/example.org/v1/xdatabases?&limit=500&continue=next";

    fn page(objects: &[bool], next: &str) -> Value {
        let items: Vec<Value> = objects
            .iter()
            .enumerate()
            .map(|(i, &held)| {
                let finalizers: &[&str] = if held {
                    &[FOREGROUND_CASCADE_FINALIZER]
                } else {
                    &[]
                };
                metadata(&format!("u{i}"), "1", finalizers, false)
            })
            .collect();
        json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadataList",
            "metadata": {"continue": next},
            "items": items,
        })
    }

    /// Any stops at the first held object, on whichever page; Every reads
    /// every page. A request out of script fails the test.
    #[tokio::test]
    async fn a_scan_for_any_stops_at_the_first_held_object() {
        let cases = [
            // (first page, second page, depth, pages read, held found)
            ([false, false], [true, true], Depth::Any, 2, 1),
            ([false, false], [true, true], Depth::Every, 2, 2),
            ([true, false], [true, true], Depth::Any, 1, 1),
            ([true, false], [true, true], Depth::Every, 2, 3),
            ([false, false], [false, false], Depth::Any, 2, 0),
        ];
        for (first, second, depth, pages, found) in cases {
            let mut script = vec![Exchange::get(FIRST).ok(page(&first, "next"))];
            if pages == 2 {
                script.push(Exchange::get(NEXT).ok(page(&second, "")));
            }
            let held = against(script, async |c| {
                held_objects(&c, &resource(), depth).await.map(|h| h.len())
            })
            .await;
            assert_eq!(
                held.map_err(|e| e.to_string()),
                Ok(found),
                "{first:?} then {second:?}, {depth:?}"
            );
        }
    }
}
