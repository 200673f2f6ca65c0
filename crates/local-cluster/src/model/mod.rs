//! A model of the parts of Crossplane, its providers and Modelplane that decide
//! how a composite's deletion unfolds, so that the seed's failure can be
//! reproduced on the real control plane without Crossplane running.
//!
//! Why it is still needed: real Crossplane (`crate::real_crossplane`) now runs
//! every scenario of the seed (cascade-guard's tests/real_crossplane/seed_real.rs), and those
//! were retired from the model. What remains on it is the large randomized
//! test (cascade-guard's tests/api_server/seed.rs): dozens of trees to depth 4, five kinds
//! of clients and cascade-guard SIGKILLed every few seconds, in about a minute
//! of CI. On real Crossplane a tree takes about 100 s to tear down (a Usage
//! re-checks its user every 30 s, a provider polls every 15 s), so the same
//! volume there is the opt-in soak (scripts/soak.sh), not CI. The model also
//! starts in seconds and needs no network namespaces (no root). Each part
//! copies one upstream behaviour, faithfully and no more, and says which
//! (docs/deletion-semantics.md §5, §6; paths are upstream paths).
//!
//! Its users, each with why real Crossplane cannot serve it yet:
//!
//! - cascade-guard's `tests/api_server/seed.rs` (the randomized test: three rounds of
//!   random platforms to depth 4, five kinds of clients, cascade-guard
//!   SIGKILLed every few seconds) and its harness `cascade-guard-testkit`'s `platform.rs`:
//!   volume in CI time. On real Crossplane one tree takes about 100 s (a
//!   Usage's 30-second re-check, a provider's 15-second poll, the simulated
//!   load balancer); the same dozens of trees would take most of CI's 90
//!   minutes on two cores, so real Crossplane runs them in the opt-in soak
//!   (`scripts/soak.sh`) and in seed_real's few random trees.
//!
//! What it served before and real Crossplane now shows: the InferenceCluster
//! guarded by a ClusterUsage per ModelDeployment, its delete refused (409) and
//! replayed (cascade-guard's `tests/real_crossplane/seed_real/guard.rs`, with the
//! decision each attempt met); deleting the namespace of a namespaced v2 XR
//! (`seed_real/siblings.rs`: kept in order by cascade-guard, its managed
//! resources' ProviderConfigUsages held against the pinned providers'
//! crossplane-runtime#1150). The model's trees still delete namespaces, among
//! their five clients.
//!
//! `local-cluster`'s `tests/real_crossplane/real_crossplane.rs` does not use the model: it
//! characterizes real Crossplane beside what the model claims (its header
//! says where they differ).
//!
//! The parts:
//!
//! - [`composite`]: the composite reconciler's finalizer, added to XRs and
//!   dropped as soon as an XR is deleted; composed resources with a
//!   controller reference, the `crossplane.io/composite` label and the XR's
//!   `spec.crossplane.resourceRefs` ([`composite::Node`] builds such trees).
//! - [`usage`]: the Usage and ClusterUsage controller (in-use label, finalizer,
//!   waiting for `by`, replaying a refused deletion).
//! - [`webhook`]: the `crossplane-no-usages` validating webhook, served on
//!   loopback with TLS, refusing (409) deletes of a used resource and recording
//!   the refused attempt's policy.
//! - [`provider`]: managed resources of provider-helm, provider-kubernetes and
//!   a cloud provider, whose deletion takes a while and needs their target
//!   cluster; without it they wedge.
//! - [`modelplane`]: Modelplane's XRDs (from the fixtures) turned into CRDs,
//!   builders for its trees, and its InferenceCluster's replica guard.
//!
//! [`Model::start`] runs every loop on a thread of its own (with its own tokio
//! runtime), so that one model can serve many tests of a test binary, each on
//! its own runtime, and the webhook never dies with a test.

pub mod composite;
pub mod modelplane;
pub mod provider;
pub mod usage;
pub mod webhook;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Api, Client, Config};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::oneshot;

/// Crossplane core's identity with the default Helm chart (docs/deletion-semantics.md §5).
pub const CROSSPLANE_USER: &str = "system:serviceaccount:crossplane-system:crossplane";
/// The groups every service account of `crossplane-system` carries.
pub const CROSSPLANE_SYSTEM_GROUPS: [&str; 2] = [
    "system:serviceaccounts",
    "system:serviceaccounts:crossplane-system",
];

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("fixture: {0}")]
    Fixture(String),
    #[error("cannot make the webhook's certificate: {0}")]
    Certificate(String),
    #[error("webhook TLS: {0}")]
    Tls(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the model's thread: {0}")]
    Thread(String),
    #[error("{0} did not become ready in time")]
    NotReady(String),
    #[error("{kind} is not served by the API server")]
    UnknownKind { kind: String },
    #[error("invalid object: {0}")]
    Invalid(String),
}

/// A reference to one object, as Usages, resourceRefs and the model's
/// providers write them.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRef {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
}

impl ResourceRef {
    pub fn new(resource: &ApiResource, namespace: Option<&str>, name: &str) -> Self {
        Self {
            api_version: resource.api_version.clone(),
            kind: resource.kind.clone(),
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
        }
    }

    /// `Kind/namespace/name`, or `Kind/name`.
    pub fn describe(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{}/{ns}/{}", self.kind, self.name),
            None => format!("{}/{}", self.kind, self.name),
        }
    }
}

/// What [`Model::start`] runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// XR kinds whose objects get (and lose) Crossplane's composite finalizer.
    pub composite_kinds: Vec<ApiResource>,
    /// Managed-resource kinds, each with the provider that reconciles it.
    pub providers: Vec<provider::ProviderKind>,
    /// How often the Usage controller re-checks every Usage. Upstream
    /// reconciles on changes to the Usage and re-checks every 30 s while it
    /// waits for `by` to go (internal/controller/protection/usage/reconciler.go,
    /// `waitPollInterval`); tests use a shorter interval, which changes how long
    /// things take but not their order.
    pub usage_poll: Duration,
    /// How long after releasing a Usage Crossplane replays the deletion it
    /// refused: 2 s upstream (the same file).
    pub replay_delay: Duration,
    /// How often a provider reconciles each of its managed resources.
    pub provider_poll: Duration,
    /// Run Modelplane's InferenceCluster replica guard ([`modelplane::Guard`]).
    pub modelplane_guard: bool,
}

impl Options {
    /// Everything the Modelplane scenarios need: the six Modelplane XR kinds,
    /// the three providers, and the replica guard.
    pub fn modelplane() -> Self {
        Self {
            composite_kinds: modelplane::xr_kinds().to_vec(),
            providers: provider::ProviderKind::all(),
            usage_poll: Duration::from_millis(300),
            replay_delay: Duration::from_secs(2),
            provider_poll: Duration::from_millis(100),
            modelplane_guard: true,
        }
    }
}

/// The running model. Dropping it stops every loop and removes the webhook's
/// registration, so that nothing in the cluster calls a server that is gone. A
/// process killed before that leaves the registration behind (`failurePolicy:
/// Fail`, as upstream): deletes of in-use objects then fail until
/// `crossplane-no-usages` is deleted or a new model registers itself.
pub struct Model {
    webhook_url: String,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Model {
    /// Starts every loop and returns once the webhook is registered and the API
    /// server calls it. `config` is an admin's: each part impersonates the
    /// identity its upstream counterpart runs as.
    pub async fn start(config: Config, options: Options) -> Result<Self, ModelError> {
        let (ready_tx, ready_rx) = oneshot::channel::<Result<String, ModelError>>();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("crossplane-model".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("crossplane-model")
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(ModelError::Io(e)));
                        return;
                    }
                };
                runtime.block_on(run(config, options, ready_tx, stop_rx));
            })?;
        let url = ready_rx
            .await
            .map_err(|_| ModelError::Thread("it ended before it was ready".into()))??;
        Ok(Self {
            webhook_url: url,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// Where the API server sends the Usage webhook's AdmissionReviews.
    pub fn webhook_url(&self) -> &str {
        &self.webhook_url
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn run(
    config: Config,
    options: Options,
    ready: oneshot::Sender<Result<String, ModelError>>,
    stop: oneshot::Receiver<()>,
) {
    let started = async {
        let admin = Client::try_from(config.clone())?;
        grant_crossplane_system(&admin).await?;
        let crossplane = client_as(&config, CROSSPLANE_USER, &CROSSPLANE_SYSTEM_GROUPS)?;
        let kinds = Kinds::new(crossplane.clone());
        let server = webhook::Server::start(crossplane.clone()).await?;
        let url = server.url();
        let ca = server.ca_pem().to_string();
        let probed = server.probed();
        let mut tasks = vec![tokio::spawn(server.serve())];
        webhook::register(&admin, &url, &ca).await?;
        webhook::wait_effective(&admin, &probed).await?;
        for kind in &options.composite_kinds {
            tasks.push(tokio::spawn(composite::run_finalizer(
                crossplane.clone(),
                kind.clone(),
            )));
        }
        tasks.push(tokio::spawn(
            usage::Controller {
                client: crossplane.clone(),
                kinds: kinds.clone(),
                poll: options.usage_poll,
                replay_delay: options.replay_delay,
            }
            .run(),
        ));
        for p in &options.providers {
            let client = client_as(&config, &p.user, &CROSSPLANE_SYSTEM_GROUPS)?;
            tasks.push(tokio::spawn(
                provider::Provider {
                    client,
                    kind: p.clone(),
                    kinds: Kinds::new(crossplane.clone()),
                    poll: options.provider_poll,
                }
                .run(),
            ));
        }
        if options.modelplane_guard {
            tasks.push(tokio::spawn(
                modelplane::Guard {
                    client: crossplane.clone(),
                    poll: options.usage_poll,
                }
                .run(),
            ));
        }
        Ok::<_, ModelError>((admin, url, tasks))
    }
    .await;
    let (admin, tasks) = match started {
        Ok((admin, url, tasks)) => {
            let _ = ready.send(Ok(url));
            (admin, tasks)
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = stop.await;
    webhook::deregister(&admin).await;
    for t in tasks {
        t.abort();
    }
}

/// A client that acts as `user` in `groups`, by impersonation.
pub fn client_as(config: &Config, user: &str, groups: &[&str]) -> Result<Client, ModelError> {
    let mut config = config.clone();
    config.auth_info.impersonate = Some(user.to_string());
    config.auth_info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
    Ok(Client::try_from(config)?)
}

/// Crossplane's chart binds its service accounts to broad ClusterRoles; here
/// every service account of `crossplane-system` gets cluster-admin, so that the
/// model acts under the same usernames as Crossplane and its providers.
async fn grant_crossplane_system(admin: &Client) -> Result<(), ModelError> {
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "crossplane-model:crossplane-system"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
            "name": "system:serviceaccounts:crossplane-system"}]
    }))
    .map_err(|e| ModelError::Invalid(e.to_string()))?;
    let api: Api<ClusterRoleBinding> = Api::all(admin.clone());
    api.patch(
        "crossplane-model:crossplane-system",
        &PatchParams::apply("crossplane-model").force(),
        &Patch::Apply(&binding),
    )
    .await?;
    Ok(())
}

/// Resolves `apiVersion` and `kind` to the API resource that serves them, as
/// Crossplane's unstructured clients do through the REST mapper.
#[derive(Clone)]
pub struct Kinds {
    client: Client,
    /// (apiVersion, kind) to (resource, namespaced).
    cache: Arc<Mutex<KindCache>>,
}

type KindCache = HashMap<(String, String), (ApiResource, bool)>;

impl Kinds {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            cache: Arc::default(),
        }
    }

    /// The resource and whether it is namespaced.
    pub async fn resolve(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Result<(ApiResource, bool), ModelError> {
        let key = (api_version.to_string(), kind.to_string());
        if let Some(hit) = self.cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
            return Ok(hit);
        }
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, caps) = kube::discovery::pinned_kind(&self.client, &gvk)
            .await
            .map_err(|_| ModelError::UnknownKind {
                kind: format!("{api_version} {kind}"),
            })?;
        let namespaced = caps.scope == kube::discovery::Scope::Namespaced;
        if let Ok(mut cache) = self.cache.lock() {
            cache.insert(key, (resource.clone(), namespaced));
        }
        Ok((resource, namespaced))
    }

    /// The API of the object `r` names; a namespaced kind without a namespace
    /// gets `default_namespace`.
    pub async fn api_for(
        &self,
        r: &ResourceRef,
        default_namespace: Option<&str>,
    ) -> Result<Api<DynamicObject>, ModelError> {
        let (resource, namespaced) = self.resolve(&r.api_version, &r.kind).await?;
        Ok(if namespaced {
            let ns = r
                .namespace
                .as_deref()
                .or(default_namespace)
                .unwrap_or("default");
            Api::namespaced_with(self.client.clone(), ns, &resource)
        } else {
            Api::all_with(self.client.clone(), &resource)
        })
    }
}

/// Changes an object's finalizers with optimistic concurrency (the patch
/// carries the resourceVersion it was computed from), as Crossplane's and
/// controller-runtime's finalizer helpers do with an Update. Returns whether it
/// wrote. A finalizer is never added to an object that is being deleted (the
/// API server would refuse it).
pub async fn edit_finalizers(
    api: &Api<DynamicObject>,
    name: &str,
    edit: impl Fn(&mut Vec<String>),
) -> Result<bool, kube::Error> {
    for _ in 0..10 {
        let Some(object) = api.get_opt(name).await? else {
            return Ok(false);
        };
        let before = object.metadata.finalizers.clone().unwrap_or_default();
        let mut after = before.clone();
        edit(&mut after);
        if after == before
            || (object.metadata.deletion_timestamp.is_some() && after.len() > before.len())
        {
            return Ok(false);
        }
        let patch = json!({"metadata": {
            "finalizers": after,
            "resourceVersion": object.metadata.resource_version,
        }});
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

/// Removes `finalizer`; see [`edit_finalizers`].
pub async fn remove_finalizer(
    api: &Api<DynamicObject>,
    name: &str,
    finalizer: &str,
) -> Result<bool, kube::Error> {
    edit_finalizers(api, name, |f| f.retain(|x| x != finalizer)).await
}

/// Adds `finalizer` unless present; see [`edit_finalizers`].
pub async fn add_finalizer(
    api: &Api<DynamicObject>,
    name: &str,
    finalizer: &str,
) -> Result<bool, kube::Error> {
    edit_finalizers(api, name, |f| {
        if !f.iter().any(|x| x == finalizer) {
            f.push(finalizer.to_string());
        }
    })
    .await
}

/// A string at `pointer` in `value`.
pub(crate) fn text<'a>(value: &'a Value, pointer: &str) -> Option<&'a str> {
    value.pointer(pointer).and_then(Value::as_str)
}
