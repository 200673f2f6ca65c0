//! The inputs of a pass, watched: XRDs, CascadePolicies, and the kinds
//! CascadePolicies name (from discovery); a CRD coming or going wakes a pass.
//!
//! Each input is either known (read completely) or not. Only what is known may
//! remove protection: an input that cannot be read (no RBAC, API down) leaves
//! the admission objects it produced in place.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, PartialObjectMeta};
use kube::discovery;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::{Mutex, Notify};

use crate::api::CascadePolicy;
use crate::cluster::backoff::{WatchBackoff, delivers, log_watch_error};
use crate::cluster::inputs::{discover_kinds, is_not_found, xrd_resource};
use crate::policy::Mode;
use crate::policy::plan::Known;
use crate::policy::resolve::{CascadePolicyInput, Inputs, XrdInput};

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
pub(crate) struct WatchCache<K: kube::Resource + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store: Store<K>,
    ready: Arc<AtomicBool>,
}

impl<K> WatchCache<K>
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
                if event.as_ref().is_ok_and(delivers) && std::mem::take(&mut failing) {
                    tracing::info!("watching {what} again");
                }
                match event {
                    Ok(watcher::Event::InitDone) => {
                        flag.store(true, Ordering::Release);
                        notify.notify_one();
                    }
                    Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                    Ok(_) => notify.notify_one(),
                    Err(e) => log_watch_error(&mut failing, what, &e),
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
    Watching(WatchCache<DynamicObject>, ApiResource),
}

enum PolicySource {
    /// Not known yet whether the CascadePolicy CRD is installed.
    Unknown,
    /// The CRD is not installed: there are no CascadePolicies.
    NotInstalled,
    Watching(WatchCache<CascadePolicy>),
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
            *source = PolicySource::Watching(WatchCache::start(
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
                    WatchCache::start(
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

/// Wakes a pass when a kind (or Crossplane) appears or goes: metadata is
/// enough to notice.
pub(crate) fn watch_crds(client: Client, notify: Arc<Notify>) {
    trigger(
        Api::<PartialObjectMeta<CustomResourceDefinition>>::all(client),
        watcher::Config::default(),
        notify,
        "CustomResourceDefinitions",
    );
}

fn trigger<K>(api: Api<K>, config: watcher::Config, notify: Arc<Notify>, what: &'static str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    tokio::spawn(async move {
        let mut stream = watcher(api, config)
            .backoff(WatchBackoff::default())
            .boxed();
        let mut failing = false;
        while let Some(event) = stream.next().await {
            match event {
                // Init comes before every (re)list, failing or not: a pass
                // for it would retry the whole sync as often as the watch.
                Ok(event) if !delivers(&event) => {}
                Ok(_) => {
                    if std::mem::take(&mut failing) {
                        tracing::info!("watching {what} again");
                    }
                    notify.notify_one()
                }
                Err(e) => log_watch_error(&mut failing, what, &e),
            }
        }
    });
}
