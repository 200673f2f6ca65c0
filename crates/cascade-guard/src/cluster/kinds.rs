//! The kinds a cluster serves, from one aggregated discovery pass: how
//! `trace` and `plan` find the resource a person names (`inferenceclusters`,
//! `InferenceCluster.modelplane.ai`) and the resource behind an apiVersion and
//! kind that an object references.

use std::collections::HashMap;

use kube::Client;
use kube::api::{ApiResource, DynamicObject};
use kube::discovery::{Discovery, Scope};

/// Why a command could not find the object a person named.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("cannot discover the cluster's API: {0}")]
    Discovery(#[source] kube::Error),
    #[error(
        "the cluster serves no resource called {0:?} (try its plural, e.g. inferenceclusters, or plural.group)"
    )]
    UnknownResource(String),
    #[error("{resource} {name} not found{}", namespace.as_deref().map(|n| format!(" in namespace {n}")).unwrap_or_default())]
    NotFound {
        resource: String,
        name: String,
        namespace: Option<String>,
    },
    #[error("cannot read {what}: {source}")]
    Read {
        what: String,
        #[source]
        source: kube::Error,
    },
}

/// The aggregated discovery document (apidiscovery.k8s.io/v2), which lists
/// each resource's short names.
const AGGREGATED_DISCOVERY: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// The group and kind whose short name is `wanted` (lower case), in an
/// aggregated discovery document (pure).
fn short_name(document: &serde_json::Value, wanted: &str) -> Option<(String, String)> {
    use serde_json::Value;
    for group in document.get("items")?.as_array()? {
        for version in group
            .get("versions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            for resource in version
                .get("resources")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let named = resource
                    .get("shortNames")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .any(|s| s.eq_ignore_ascii_case(wanted));
                if !named {
                    continue;
                }
                let kind = resource.pointer("/responseKind/kind")?.as_str()?;
                let group = resource
                    .pointer("/responseKind/group")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                return Some((group.to_string(), kind.to_string()));
            }
        }
    }
    None
}

/// One served resource and whether it is namespaced.
pub type Served = (ApiResource, bool);

pub struct ServedKinds {
    by_gvk: HashMap<(String, String), Served>,
    all: Vec<Served>,
    /// Which of `all` may be listed at all (tokenreviews, bindings and the
    /// like are create-only): by index.
    listable: Vec<bool>,
}

impl ServedKinds {
    pub async fn discover(client: &Client) -> Result<Self, kube::Error> {
        let discovery = Discovery::new(client.clone()).run_aggregated().await?;
        let mut by_gvk = HashMap::new();
        let mut all = Vec::new();
        let mut listable = Vec::new();
        for group in discovery.groups() {
            for (resource, caps) in group.recommended_resources() {
                let namespaced = caps.scope == Scope::Namespaced;
                listable.push(caps.supports_operation(kube::discovery::verbs::LIST));
                by_gvk.insert(
                    (resource.api_version.clone(), resource.kind.clone()),
                    (resource.clone(), namespaced),
                );
                all.push((resource, namespaced));
            }
        }
        Ok(Self {
            by_gvk,
            all,
            listable,
        })
    }

    /// These kinds, all listable: for tests that script the API server.
    #[cfg(test)]
    pub fn of(served: Vec<Served>) -> Self {
        Self {
            by_gvk: served
                .iter()
                .map(|s| ((s.0.api_version.clone(), s.0.kind.clone()), s.clone()))
                .collect(),
            listable: vec![true; served.len()],
            all: served,
        }
    }

    /// `inferenceclusters`, `inferencecluster`, `InferenceCluster` or any of
    /// them with `.group`.
    pub fn find(&self, wanted: &str) -> Option<&Served> {
        let (name, group) = match wanted.split_once('.') {
            Some((n, g)) => (n, Some(g)),
            None => (wanted, None),
        };
        let name = name.to_lowercase();
        self.all.iter().find(|(r, _)| {
            group.is_none_or(|g| r.group == g)
                && (r.plural == name || r.kind.to_lowercase() == name)
        })
    }

    /// As [`ServedKinds::find`], and else by a short name (`cpol`, `xic`) as
    /// the aggregated discovery documents list them, kubectl's way.
    pub async fn lookup(&self, client: &Client, wanted: &str) -> Option<&Served> {
        if let Some(found) = self.find(wanted) {
            return Some(found);
        }
        let wanted = wanted.to_lowercase();
        for path in ["/api", "/apis"] {
            let Ok(request) = http::Request::get(path)
                .header(http::header::ACCEPT, AGGREGATED_DISCOVERY)
                .body(Vec::new())
            else {
                continue;
            };
            let Ok(text) = client.request_text(request).await else {
                continue;
            };
            let Ok(document) = serde_json::from_str::<serde_json::Value>(&text) else {
                continue;
            };
            if let Some((group, kind)) = short_name(&document, &wanted) {
                return self
                    .all
                    .iter()
                    .find(|(r, _)| r.group == group && r.kind == kind);
            }
        }
        None
    }

    /// The resource of an apiVersion and kind, as an object names them.
    pub fn get(&self, api_version: &str, kind: &str) -> Option<&Served> {
        self.by_gvk
            .get(&(api_version.to_string(), kind.to_string()))
    }

    /// Every served resource of `kind` in `group` (any group when None), in
    /// its preferred version.
    pub fn of_kind<'a>(
        &'a self,
        group: Option<&'a str>,
        kind: &'a str,
    ) -> impl Iterator<Item = &'a Served> + 'a {
        self.all
            .iter()
            .filter(move |(r, _)| r.kind == kind && group.is_none_or(|g| r.group == g))
    }

    /// Every served resource.
    pub fn all(&self) -> impl Iterator<Item = &Served> {
        self.all.iter()
    }

    /// Every served resource that can be listed: what a search for labelled
    /// objects goes over (a create-only kind holds nothing to find).
    pub fn listable(&self) -> impl Iterator<Item = &Served> {
        self.all
            .iter()
            .zip(&self.listable)
            .filter(|(_, listable)| **listable)
            .map(|(served, _)| served)
    }

    /// The API of `resource`, in `namespace` when it is namespaced.
    pub fn api(
        client: &Client,
        (resource, namespaced): &Served,
        namespace: Option<&str>,
    ) -> kube::Api<DynamicObject> {
        match (namespace, namespaced) {
            (Some(ns), true) => kube::Api::namespaced_with(client.clone(), ns, resource),
            _ => kube::Api::all_with(client.clone(), resource),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn short_names_come_from_aggregated_discovery() {
        let document = json!({"items": [
            {"metadata": {"name": "cascade-guard.dev"}, "versions": [{"version": "v1alpha1", "resources": [
                {"resource": "cascadepolicies", "shortNames": ["cpol"],
                 "responseKind": {"group": "cascade-guard.dev", "version": "v1alpha1", "kind": "CascadePolicy"}}
            ]}]},
            {"metadata": {"name": ""}, "versions": [{"version": "v1", "resources": [
                {"resource": "pods", "shortNames": ["po"],
                 "responseKind": {"group": "", "version": "v1", "kind": "Pod"}}
            ]}]}
        ]});
        assert_eq!(
            short_name(&document, "cpol"),
            Some(("cascade-guard.dev".into(), "CascadePolicy".into()))
        );
        assert_eq!(
            short_name(&document, "po"),
            Some((String::new(), "Pod".into()))
        );
        assert_eq!(short_name(&document, "nope"), None);
        assert_eq!(short_name(&json!({}), "cpol"), None);
    }
}
