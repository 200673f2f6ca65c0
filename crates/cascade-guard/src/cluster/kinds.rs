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

/// One served resource and whether it is namespaced.
pub type Served = (ApiResource, bool);

pub struct ServedKinds {
    by_gvk: HashMap<(String, String), Served>,
    all: Vec<Served>,
}

impl ServedKinds {
    pub async fn discover(client: &Client) -> Result<Self, kube::Error> {
        let discovery = Discovery::new(client.clone()).run_aggregated().await?;
        let mut by_gvk = HashMap::new();
        let mut all = Vec::new();
        for group in discovery.groups() {
            for (resource, caps) in group.recommended_resources() {
                let namespaced = caps.scope == Scope::Namespaced;
                by_gvk.insert(
                    (resource.api_version.clone(), resource.kind.clone()),
                    (resource.clone(), namespaced),
                );
                all.push((resource, namespaced));
            }
        }
        Ok(Self { by_gvk, all })
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
