//! Reading the inputs of a pass from the cluster: XRDs, CascadePolicies, and
//! the kinds CascadePolicies name (from discovery).
//!
//! Each input is either known (read completely) or not. Only what is known may
//! remove protection: an input that cannot be read (no RBAC, API down) leaves
//! the admission objects it produced in place.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ObjectReference;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::discovery::{self, Scope as DiscoveryScope};
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::{Mutex, Notify};

use super::backoff::WatchBackoff;
use crate::api::CascadePolicy;
use crate::policy::Mode;
use crate::policy::kind::Scope;
use crate::policy::names::CROSSPLANE_APIEXTENSIONS_GROUP;
use crate::policy::plan::Known;
use crate::policy::resolve::{CascadePolicyInput, CrdInfo, Inputs, XrdInput};

const XRD_PLURAL: &str = "compositeresourcedefinitions";

pub struct Gathered {
    pub inputs: Inputs,
    pub known: Known,
    /// CascadePolicies as read, for their status.
    pub cascade_policies: Vec<Arc<CascadePolicy>>,
    /// XRDs by name, to attach Events to.
    pub xrd_refs: BTreeMap<String, ObjectReference>,
    /// The CascadePolicy CRD is installed (without it there are no
    /// CascadePolicies, and XRDs are still protected).
    pub cascade_policy_crd: bool,
}

/// A watched collection and whether its first list has completed.
pub(crate) struct Watched<K: kube::Resource + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store: Store<K>,
    ready: Arc<AtomicBool>,
}

impl<K> Watched<K>
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    pub(crate) fn start(
        api: Api<K>,
        config: watcher::Config,
        writer: Writer<K>,
        notify: Arc<Notify>,
        what: &'static str,
    ) -> Self {
        let store = writer.as_reader();
        let ready = Arc::new(AtomicBool::new(false));
        let flag = ready.clone();
        tokio::spawn(async move {
            let mut stream = reflector::reflector(writer, watcher(api, config))
                .backoff(WatchBackoff::default())
                .boxed();
            let mut failing = false;
            while let Some(event) = stream.next().await {
                if event.is_ok() && std::mem::take(&mut failing) {
                    tracing::info!("watching {what} again");
                }
                match event {
                    Ok(watcher::Event::InitDone) => {
                        flag.store(true, Ordering::Release);
                        notify.notify_one();
                    }
                    Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                    Ok(_) => notify.notify_one(),
                    Err(e) => super::log_watch_error(&mut failing, what, &e),
                }
            }
        });
        Self { store, ready }
    }

    /// One object by name, from the cache (cluster-scoped kinds).
    pub(crate) fn get(&self, name: &str) -> Option<Arc<K>>
    where
        K::DynamicType: Default,
    {
        self.store
            .get(&kube::runtime::reflector::ObjectRef::new(name))
    }

    pub(crate) fn snapshot(&self) -> Option<Vec<Arc<K>>> {
        self.ready
            .load(Ordering::Acquire)
            .then(|| self.store.state())
    }
}

enum XrdSource {
    /// Crossplane's XRD API is not served: there are no XRDs.
    NotInstalled,
    Watching(Watched<DynamicObject>, ApiResource),
}

enum PolicySource {
    /// Not known yet whether the CascadePolicy CRD is installed.
    Unknown,
    /// The CRD is not installed: there are no CascadePolicies.
    NotInstalled,
    Watching(Watched<CascadePolicy>),
}

pub struct Sources {
    notify: Arc<Notify>,
    xrds: Mutex<XrdSource>,
    cascade_policies: Mutex<PolicySource>,
}

impl Sources {
    pub async fn start(client: Client, notify: Arc<Notify>) -> Self {
        let sources = Self {
            notify,
            xrds: Mutex::new(XrdSource::NotInstalled),
            cascade_policies: Mutex::new(PolicySource::Unknown),
        };
        sources.ensure_xrd_watch(&client).await;
        sources.ensure_cascade_policy_watch(&client).await;
        sources
    }

    /// Starts watching CascadePolicies once their CRD is installed (the CRD
    /// watch wakes a pass when it is). Without it the controller protects
    /// XRDs, is ready, and says once that CascadePolicies cannot be used.
    async fn ensure_cascade_policy_watch(&self, client: &Client) {
        let mut source = self.cascade_policies.lock().await;
        if let PolicySource::Watching(_) = *source {
            return;
        }
        let group = CascadePolicy::group(&());
        let installed = match discovery::group(client, &group).await {
            Ok(found) => found
                .recommended_resources()
                .iter()
                .any(|(r, _)| r.plural == CascadePolicy::plural(&())),
            Err(e) if is_not_found(&e) => false,
            Err(e) => {
                tracing::warn!(error = %e, "cannot discover the CascadePolicy API");
                return;
            }
        };
        if installed {
            tracing::info!("watching CascadePolicies");
            *source = PolicySource::Watching(Watched::start(
                Api::<CascadePolicy>::all(client.clone()),
                watcher::Config::default(),
                Writer::default(),
                self.notify.clone(),
                "CascadePolicies",
            ));
        } else if !matches!(*source, PolicySource::NotInstalled) {
            tracing::warn!(
                "the CascadePolicy CRD is not installed: XRDs are protected, CascadePolicies cannot be used (install it: cascade-guard crd | kubectl apply -f -)"
            );
            *source = PolicySource::NotInstalled;
        }
    }

    /// Starts watching XRDs once Crossplane's API is served (it may be
    /// installed after cascade-guard).
    async fn ensure_xrd_watch(&self, client: &Client) -> bool {
        let mut source = self.xrds.lock().await;
        if let XrdSource::Watching(..) = *source {
            return true;
        }
        match xrd_resource(client).await {
            Ok(Some(resource)) => {
                tracing::info!(version = %resource.version, "watching Crossplane XRDs");
                let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
                *source = XrdSource::Watching(
                    Watched::start(
                        api,
                        watcher::Config::default(),
                        Writer::new(resource.clone()),
                        self.notify.clone(),
                        "CompositeResourceDefinitions",
                    ),
                    resource,
                );
                true
            }
            Ok(None) => true,
            Err(e) => {
                tracing::warn!(error = %e, "cannot discover Crossplane's XRD API");
                false
            }
        }
    }

    pub async fn gather(&self, client: &Client, xrd_default_mode: Mode) -> Gathered {
        let discovered = self.ensure_xrd_watch(client).await;
        let mut xrd_refs = BTreeMap::new();
        let xrds = match &*self.xrds.lock().await {
            XrdSource::NotInstalled => discovered.then(Vec::new),
            XrdSource::Watching(w, resource) => w.snapshot().map(|xrds| {
                let mut inputs: Vec<XrdInput> = Vec::with_capacity(xrds.len());
                for xrd in &xrds {
                    xrd_refs.insert(xrd.name_any(), xrd.object_ref(resource));
                    if let Ok(value) = serde_json::to_value(xrd.as_ref()) {
                        inputs.push(XrdInput::from_value(&value));
                    }
                }
                inputs.sort_by(|a, b| a.name().cmp(b.name()));
                inputs
            }),
        };
        self.ensure_cascade_policy_watch(client).await;
        let (policies, cascade_policy_crd) = match &*self.cascade_policies.lock().await {
            PolicySource::Unknown => (None, true),
            PolicySource::NotInstalled => (Some(Vec::new()), false),
            PolicySource::Watching(w) => (w.snapshot(), true),
        };
        let (crds, undiscovered_groups) = match &policies {
            Some(policies) => discover_kinds(client, policies).await,
            None => (Vec::new(), BTreeSet::new()),
        };
        let known = Known {
            xrds: xrds.is_some(),
            cascade_policies: policies.is_some() && undiscovered_groups.is_empty(),
        };
        let cascade_policies = policies.unwrap_or_default();
        let mut policy_inputs: Vec<CascadePolicyInput> = cascade_policies
            .iter()
            .filter_map(|p| p.resolution_input())
            .collect();
        policy_inputs.sort_by(|a, b| a.name.cmp(&b.name));
        Gathered {
            inputs: Inputs {
                xrds: xrds.unwrap_or_default(),
                cascade_policies: policy_inputs,
                crds,
                xrd_default_mode,
                undiscovered_groups,
            },
            known,
            cascade_policies,
            xrd_refs,
            cascade_policy_crd,
        }
    }
}

/// The served version of Crossplane's XRD resource, or None when Crossplane is
/// not installed.
pub(crate) async fn xrd_resource(client: &Client) -> Result<Option<ApiResource>, kube::Error> {
    let group = match discovery::group(client, CROSSPLANE_APIEXTENSIONS_GROUP).await {
        Ok(group) => group,
        Err(e) if is_not_found(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(group
        .recommended_resources()
        .into_iter()
        .find(|(r, _)| r.plural == XRD_PLURAL)
        .map(|(r, _)| r))
}

/// The kinds of the groups CascadePolicies name, from discovery, and the
/// groups that could not be read for any reason but their absence.
pub(crate) async fn discover_kinds(
    client: &Client,
    policies: &[Arc<CascadePolicy>],
) -> (Vec<CrdInfo>, BTreeSet<String>) {
    let groups: BTreeSet<&str> = policies.iter().map(|p| p.spec.group.as_str()).collect();
    let mut kinds = Vec::new();
    let mut undiscovered = BTreeSet::new();
    for group in groups {
        if group.is_empty() {
            continue;
        }
        match discovery::group(client, group).await {
            Ok(found) => {
                for (resource, caps) in found.recommended_resources() {
                    kinds.push(CrdInfo {
                        group: resource.group.clone(),
                        kind: resource.kind.clone(),
                        plural: resource.plural.clone(),
                        scope: match caps.scope {
                            DiscoveryScope::Cluster => Scope::Cluster,
                            DiscoveryScope::Namespaced => Scope::Namespaced,
                        },
                    });
                }
            }
            Err(e) if is_not_found(&e) => {}
            Err(e) => {
                tracing::warn!(%group, error = %e, "cannot discover API group");
                undiscovered.insert(group.to_string());
            }
        }
    }
    (kinds, undiscovered)
}

fn is_not_found(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => status.code == 404,
        // How kube's discovery reports a group that is not served.
        kube::Error::Discovery(kube::error::DiscoveryError::MissingApiGroup(_)) => true,
        _ => false,
    }
}

/// Everything a pass reads, read once (for `status` and `uninstall`, which run
/// without watches).
pub(crate) struct ReadOnce {
    pub inputs: Inputs,
    /// Every API group the CascadePolicies name could be discovered.
    pub kinds_complete: bool,
    /// The CascadePolicy CRD is installed.
    pub cascade_policy_crd: bool,
}

pub(crate) async fn read_once(
    client: &Client,
    xrd_default_mode: Mode,
) -> Result<ReadOnce, crate::Error> {
    let list = |what: &'static str| move |source| crate::Error::List { what, source };
    let xrds = match xrd_resource(client).await.map_err(list("the XRD API"))? {
        Some(resource) => Api::<DynamicObject>::all_with(client.clone(), &resource)
            .list(&ListParams::default())
            .await
            .map_err(list("XRDs"))?
            .items
            .iter()
            .filter_map(|x| serde_json::to_value(x).ok())
            .map(|v| XrdInput::from_value(&v))
            .collect(),
        None => Vec::new(),
    };
    let (cascade_policies, cascade_policy_crd): (Vec<Arc<CascadePolicy>>, bool) =
        match Api::<CascadePolicy>::all(client.clone())
            .list(&ListParams::default())
            .await
        {
            Ok(l) => (l.items.into_iter().map(Arc::new).collect(), true),
            Err(kube::Error::Api(s)) if s.code == 404 => (Vec::new(), false),
            Err(e) => return Err(list("CascadePolicies")(e)),
        };
    let (crds, undiscovered_groups) = discover_kinds(client, &cascade_policies).await;
    let kinds_complete = undiscovered_groups.is_empty();
    let inputs = Inputs {
        xrds,
        cascade_policies: cascade_policies
            .iter()
            .filter_map(|p| p.resolution_input())
            .collect(),
        crds,
        xrd_default_mode,
        undiscovered_groups,
    };
    Ok(ReadOnce {
        inputs,
        kinds_complete,
        cascade_policy_crd,
    })
}
