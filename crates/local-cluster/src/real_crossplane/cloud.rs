//! The local cloud, the one simulated part of the stack: a managed-resource
//! kind of the project's own, `Cluster` (`cloud.local-cluster.dev`), whose
//! controller starts a real second control plane for each Cluster and writes
//! its kubeconfig into the Cluster's connection Secret. Deleting a Cluster
//! takes a configurable time, as a cloud's does; then the controller stops the
//! control plane and only then drops its finalizer. As with EKS, once it is
//! gone nothing that targets that cluster can reach it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Config};
use serde_json::{Value, json};

use super::cloud_load_balancer::{self, BalancerView, Candidate, CloudClients};
use super::load_balancer;
use super::manifest;
use super::stack::Forwarding;
use super::{Error, api_error, io_error};
use crate::{ControlPlane, Options, SharedEtcd};

pub const GROUP: &str = "cloud.local-cluster.dev";
pub const VERSION: &str = "v1alpha1";
/// The local cloud's finalizer: the cloud cluster still exists.
pub const FINALIZER: &str = "cloud.local-cluster.dev/cluster";
/// The key of the kubeconfig in a Cluster's connection Secret.
pub const KUBECONFIG_KEY: &str = "kubeconfig";

#[derive(Clone, Debug)]
pub struct CloudOptions {
    /// How long deleting a Cluster takes when its spec does not say
    /// (`spec.deletionSeconds`).
    pub deletion_time: Duration,
}

impl Default for CloudOptions {
    fn default() -> Self {
        Self {
            deletion_time: Duration::from_secs(3),
        }
    }
}

pub fn clusters() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: "Cluster".into(),
        plural: "clusters".into(),
    }
}

/// The Cluster CRD: namespaced, with the connection Secret's name and how long
/// deletion takes in its spec, and Crossplane-style conditions in its status
/// (function-patch-and-transform's default readiness check reads `Ready`).
pub fn crd() -> Result<CustomResourceDefinition, Error> {
    managed_crd(
        "Cluster",
        &[("SERVER", ".status.server")],
        json!({
            "deletionSeconds": {"type": "integer", "minimum": 0},
            "writeConnectionSecretToRef": {"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string"},
            }},
        }),
    )
}

/// The CRD of one of the local cloud's managed-resource kinds (`kind`, its
/// plural and singular its lowercase with and without an `s`): namespaced,
/// in category `managed`, with a status subresource that keeps whatever
/// the controller writes, a `READY` column from the `Ready` condition, then
/// `columns` (name, JSON path of a string), and `spec` of `spec_properties`.
pub(super) fn managed_crd(
    kind: &str,
    columns: &[(&str, &str)],
    spec_properties: serde_json::Value,
) -> Result<CustomResourceDefinition, Error> {
    let singular = kind.to_lowercase();
    let plural = format!("{singular}s");
    let mut printer_columns = vec![json!(
        {"name": "READY", "type": "string", "jsonPath": ".status.conditions[?(@.type=='Ready')].status"}
    )];
    printer_columns.extend(
        columns
            .iter()
            .map(|(name, path)| json!({"name": name, "type": "string", "jsonPath": path})),
    );
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{GROUP}")},
        "spec": {
            "group": GROUP,
            "names": {"kind": kind, "plural": plural, "singular": singular, "listKind": format!("{kind}List"), "categories": ["managed"]},
            "scope": "Namespaced",
            "versions": [{
                "name": VERSION, "served": true, "storage": true,
                "subresources": {"status": {}},
                "additionalPrinterColumns": printer_columns,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": spec_properties},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                }}},
            }],
        },
    }))
    .map_err(|e| Error::Io(format!("the {kind} CRD: {e}")))
}

/// What the controller reads from a Cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub deleting: bool,
    pub finalizers: Vec<String>,
    pub resource_version: Option<String>,
    pub secret_name: Option<String>,
    pub deletion_time: Option<Duration>,
}

impl ClusterView {
    pub fn of(object: &DynamicObject) -> Option<Self> {
        Some(Self {
            namespace: object.metadata.namespace.clone()?,
            name: object.metadata.name.clone()?,
            uid: object.metadata.uid.clone()?,
            deleting: object.metadata.deletion_timestamp.is_some(),
            finalizers: object.metadata.finalizers.clone().unwrap_or_default(),
            resource_version: object.metadata.resource_version.clone(),
            secret_name: object
                .data
                .pointer("/spec/writeConnectionSecretToRef/name")
                .and_then(Value::as_str)
                .map(str::to_string),
            deletion_time: object
                .data
                .pointer("/spec/deletionSeconds")
                .and_then(Value::as_u64)
                .map(Duration::from_secs),
        })
    }

    pub fn has_finalizer(&self) -> bool {
        self.finalizers.iter().any(|f| f == FINALIZER)
    }
}

/// What the controller does next for one Cluster, given whether its cloud
/// cluster is running (or starting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    AddFinalizer,
    Create,
    Delete,
    Nothing,
}

pub fn next_step(cluster: &ClusterView, known: bool) -> Step {
    match (cluster.deleting, cluster.has_finalizer(), known) {
        (false, false, _) => Step::AddFinalizer,
        (false, true, false) => Step::Create,
        (true, true, _) => Step::Delete,
        _ => Step::Nothing,
    }
}

/// The controller and the cloud clusters it runs, which keep their objects
/// in one etcd (each under a prefix of its own).
pub struct LocalCloud {
    clusters: Arc<Mutex<BTreeMap<String, Entry>>>,
    etcd: SharedEtcd,
}

enum Entry {
    /// Being created, or deleted (the control plane is owned by that task).
    Busy,
    /// With the task that runs its load balancers.
    Running(Box<ControlPlane>, tokio::task::AbortHandle),
}

impl LocalCloud {
    /// Installs the Cluster CRD and starts the controller on `runtime`.
    pub async fn start(
        cp: &ControlPlane,
        dir: &Path,
        options: CloudOptions,
        forwarding: Forwarding,
        runtime: &tokio::runtime::Handle,
    ) -> Result<Self, Error> {
        std::fs::create_dir_all(dir).map_err(io_error(dir))?;
        let client = cp.admin().await?;
        manifest::apply_crds(&client, &[crd()?, cloud_load_balancer::crd()?]).await?;
        let config = cp.admin_config().await?;
        let etcd = SharedEtcd::start(&dir.join("etcd")).await?;
        let clusters = Arc::new(Mutex::new(BTreeMap::new()));
        let controller = Controller {
            config,
            dir: dir.to_path_buf(),
            etcd: etcd.url().to_string(),
            options,
            forwarding,
            clusters: clusters.clone(),
            clouds: CloudClients::default(),
            log: cp.log_path("local-cloud"),
        };
        runtime.spawn(controller.run());
        Ok(Self { clusters, etcd })
    }

    /// Stops every cloud cluster, then their etcd.
    pub fn stop(self) {
        let running: Vec<Entry> = match self.clusters.lock() {
            Ok(mut map) => std::mem::take(&mut *map).into_values().collect(),
            Err(_) => return,
        };
        for entry in running {
            if let Entry::Running(mut cp, load_balancers) = entry {
                load_balancers.abort();
                cp.stop();
            }
        }
        drop(self.etcd);
    }
}

#[derive(Clone)]
struct Controller {
    config: Config,
    dir: PathBuf,
    /// The URL of the etcd the cloud clusters share.
    etcd: String,
    options: CloudOptions,
    forwarding: Forwarding,
    clusters: Arc<Mutex<BTreeMap<String, Entry>>>,
    /// The running cloud clusters' clients, by `namespace/name`: what the
    /// load balancers are made through, until a cluster stops.
    clouds: CloudClients,
    log: PathBuf,
}

const POLL: Duration = Duration::from_millis(500);
/// How often, and how far apart, a new cloud cluster's Secret and Ready
/// status are tried: a minute in all.
const PUBLISH_ATTEMPTS: u32 = 30;
const PUBLISH_RETRY: Duration = Duration::from_secs(2);

impl Controller {
    async fn run(self) {
        let client = match Client::try_from(self.config.clone()) {
            Ok(c) => c,
            Err(e) => {
                self.note(&format!("cannot make a client: {e}"));
                return;
            }
        };
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &clusters());
        loop {
            match api.list(&ListParams::default()).await {
                Ok(list) => {
                    for object in &list.items {
                        if let Some(view) = ClusterView::of(object) {
                            self.reconcile(&client, view).await;
                        }
                    }
                    self.reconcile_load_balancers(&client, &list.items).await;
                }
                Err(e) => self.note(&format!("cannot list Clusters: {e}")),
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Each LoadBalancer, its reference resolved among `clusters`.
    async fn reconcile_load_balancers(&self, client: &Client, clusters: &[DynamicObject]) {
        let api: Api<DynamicObject> =
            Api::all_with(client.clone(), &cloud_load_balancer::load_balancers());
        let list = match api.list(&ListParams::default()).await {
            Ok(list) => list,
            Err(e) => return self.note(&format!("cannot list LoadBalancers: {e}")),
        };
        for object in &list.items {
            let Some(view) = BalancerView::of(object) else {
                continue;
            };
            let candidates: Vec<Candidate> = clusters
                .iter()
                .filter(|c| c.metadata.namespace.as_deref() == Some(view.namespace.as_str()))
                .filter_map(Candidate::of)
                .collect();
            let said =
                cloud_load_balancer::reconcile(client, &self.clouds, &view, &candidates).await;
            if let Some(line) = said {
                self.note(&line);
            }
        }
    }

    fn key(view: &ClusterView) -> String {
        format!("{}/{}/{}", view.namespace, view.name, view.uid)
    }

    /// Whether the cluster is known, and if so whether a task is busy with it.
    fn known(&self, key: &str) -> Option<bool> {
        let map = self.clusters.lock().ok()?;
        map.get(key).map(|e| matches!(e, Entry::Busy))
    }

    async fn reconcile(&self, client: &Client, view: ClusterView) {
        let key = Self::key(&view);
        let known = self.known(&key);
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &view.namespace, &clusters());
        match next_step(&view, known.is_some()) {
            Step::AddFinalizer => {
                // Added to whatever else holds it, as of the version read.
                let mut finalizers = view.finalizers.clone();
                finalizers.push(FINALIZER.to_string());
                let patch = json!({"metadata": {
                    "finalizers": finalizers,
                    "resourceVersion": view.resource_version,
                }});
                if let Err(e) = api
                    .patch(&view.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    self.note(&format!("{key}: cannot add the finalizer: {e}"));
                }
            }
            Step::Create => {
                self.set(&key, Entry::Busy);
                let this = self.clone();
                let client = client.clone();
                tokio::spawn(async move { this.create(client, view).await });
            }
            Step::Delete if known != Some(true) => {
                let entry = self.take(&key);
                self.set(&key, Entry::Busy);
                let this = self.clone();
                let client = client.clone();
                tokio::spawn(async move { this.delete(client, view, entry).await });
            }
            Step::Delete | Step::Nothing => {}
        }
    }

    async fn create(self, client: Client, view: ClusterView) {
        let key = Self::key(&view);
        let short_uid: String = view.uid.chars().take(8).collect();
        let dir = self
            .dir
            .join(format!("{}-{}-{short_uid}", view.namespace, view.name));
        let started = ControlPlane::start(Options {
            dir: Some(dir.clone()),
            serve_only: true,
            shared_etcd: Some(self.etcd.clone()),
            ..Options::default()
        })
        .await;
        let cp = match started {
            Ok(cp) => cp,
            Err(e) => {
                self.note(&format!("{key}: the cloud cluster did not start: {e}"));
                self.take(&key);
                return;
            }
        };
        let server = cp.server().to_string();
        let forwarded = super::stack::port_of(&server).and_then(|p| self.forwarding.forward(p));
        if let Err(e) = forwarded {
            self.note(&format!("{key}: {e}"));
        }
        // Published until it sticks: a request lost to a closed connection
        // under load must not leave the Cluster without its Secret for good
        // (the next poll sees it known and does nothing more).
        for attempt in 1..=PUBLISH_ATTEMPTS {
            let outcome = async {
                if let Some(secret) = &view.secret_name {
                    write_connection_secret(&client, &view.namespace, secret, &cp).await?;
                }
                set_ready(&client, &view, &server).await
            }
            .await;
            match outcome {
                Ok(()) => break,
                // The Cluster went meanwhile: its delete takes over.
                Err(Error::Api {
                    source: kube::Error::Api(ref status),
                    ..
                }) if status.code == 404 => break,
                Err(e) => {
                    self.note(&format!("{key}: attempt {attempt}: {e}"));
                    tokio::time::sleep(PUBLISH_RETRY).await;
                }
            }
        }
        self.note(&format!("{key}: cloud cluster up at {server}"));
        let load_balancers = match cp.admin().await {
            Ok(cloud) => {
                if let Ok(mut clouds) = self.clouds.lock() {
                    clouds.insert(format!("{}/{}", view.namespace, view.name), cloud.clone());
                }
                let this = self.clone();
                tokio::spawn(load_balancer::run(cloud, view.name.clone(), move |line| {
                    this.note(line)
                }))
                .abort_handle()
            }
            Err(e) => {
                self.note(&format!("{key}: no load balancers: {e}"));
                tokio::spawn(async {}).abort_handle()
            }
        };
        self.set(&key, Entry::Running(Box::new(cp), load_balancers));
    }

    async fn delete(self, client: Client, view: ClusterView, entry: Option<Entry>) {
        let key = Self::key(&view);
        tokio::time::sleep(view.deletion_time.unwrap_or(self.options.deletion_time)).await;
        if let Ok(mut clouds) = self.clouds.lock() {
            clouds.remove(&format!("{}/{}", view.namespace, view.name));
        }
        if let Some(Entry::Running(mut cp, load_balancers)) = entry {
            load_balancers.abort();
            // What a cloud leaks when a cluster goes before its load balancers.
            let live = match cp.admin().await {
                Ok(cloud) => load_balancer::live(&cloud).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match live {
                Ok(services) => {
                    for service in services {
                        self.note(&format!(
                            "{key}: leaked the load balancer of Service {service}"
                        ));
                    }
                }
                Err(e) => self.note(&format!(
                    "{key}: cannot tell which load balancers leaked: {e}"
                )),
            }
            let port = super::stack::port_of(cp.server());
            let stopped = tokio::task::spawn_blocking(move || cp.stop()).await;
            if let Err(e) = stopped {
                self.note(&format!("{key}: stopping the cloud cluster: {e}"));
            }
            if let Ok(port) = port {
                self.forwarding.forget(port);
            }
        }
        self.note(&format!("{key}: cloud cluster deleted"));
        let api: Api<DynamicObject> = Api::namespaced_with(client, &view.namespace, &clusters());
        let remove = async {
            let current = api.get(&view.name).await?;
            let rest: Vec<String> = current
                .metadata
                .finalizers
                .unwrap_or_default()
                .into_iter()
                .filter(|f| f != FINALIZER)
                .collect();
            let patch = json!({"metadata": {
                "finalizers": rest,
                "resourceVersion": current.metadata.resource_version,
            }});
            api.patch(&view.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
        };
        if let Err(e) = remove.await {
            self.note(&format!("{key}: cannot drop the finalizer: {e}"));
        }
        // Forgotten only now: the next poll sees the Cluster gone (or, had the
        // patch failed, deletes it again).
        self.take(&key);
    }

    fn set(&self, key: &str, entry: Entry) {
        if let Ok(mut map) = self.clusters.lock() {
            map.insert(key.to_string(), entry);
        }
    }

    fn take(&self, key: &str) -> Option<Entry> {
        self.clusters.lock().ok()?.remove(key)
    }

    /// One line in the local cloud's log.
    fn note(&self, line: &str) {
        use std::io::Write;
        if let Ok(mut f) = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&self.log)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}

async fn set_ready(client: &Client, view: &ClusterView, server: &str) -> Result<(), Error> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &view.namespace, &clusters());
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = json!({"status": {
        "server": server,
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "Available", "lastTransitionTime": now},
            {"type": "Synced", "status": "True", "reason": "ReconcileSuccess", "lastTransitionTime": now},
        ],
    }});
    api.patch_status(&view.name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(api_error(format!("setting Cluster {} ready", view.name)))?;
    Ok(())
}

/// The cloud cluster's admin kubeconfig, certificates inline, in the Secret
/// the Cluster names (key `kubeconfig`), as a cloud provider writes one.
async fn write_connection_secret(
    client: &Client,
    namespace: &str,
    name: &str,
    cp: &ControlPlane,
) -> Result<(), Error> {
    let pki = cp.dir().join("pki");
    let read = |file: &str| -> Result<String, Error> {
        let path = pki.join(file);
        let bytes = std::fs::read(&path).map_err(io_error(&path))?;
        Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
    };
    let kubeconfig = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: local-cloud
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: admin
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: local-cloud
  context:
    cluster: local-cloud
    user: admin
current-context: local-cloud
",
        server = cp.server(),
        ca = read("ca.crt")?,
        cert = read("admin.crt")?,
        key = read("admin.key")?,
    );
    let secret = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "stringData": {KUBECONFIG_KEY: kubeconfig},
    });
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret: Secret =
        serde_json::from_value(secret).map_err(|e| Error::Io(format!("connection Secret: {e}")))?;
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => api
            .replace(name, &PostParams::default(), &secret)
            .await
            .map(|_| ())
            .map_err(api_error(format!("replacing Secret {name}"))),
        Err(e) => Err(Error::Api {
            what: format!("creating Secret {name}"),
            source: e,
        }),
    }
}

/// Serves `body` to any GET on a new loopback port, on `runtime`; returns
/// the port.
pub fn serve_bytes(body: Vec<u8>, runtime: &tokio::runtime::Handle) -> Result<u16, Error> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.set_nonblocking(true).map(|_| l))
        .map_err(|e| Error::Io(format!("cannot listen on loopback: {e}")))?;
    let port = listener
        .local_addr()
        .map_err(|e| Error::Io(e.to_string()))?
        .port();
    let _guard = runtime.enter();
    let listener = tokio::net::TcpListener::from_std(listener)
        .map_err(|e| Error::Io(format!("cannot listen on loopback: {e}")))?;
    let body = Arc::new(body);
    runtime.spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let body = body.clone();
            tokio::spawn(async move {
                // The request is read up to its blank line and not looked at.
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(&body).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    Ok(port)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(deleting: bool, has_finalizer: bool) -> ClusterView {
        ClusterView {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u".into(),
            deleting,
            finalizers: if has_finalizer {
                vec!["other".into(), FINALIZER.into()]
            } else {
                vec!["other".into()]
            },
            resource_version: None,
            secret_name: None,
            deletion_time: None,
        }
    }

    #[test]
    fn a_new_cluster_gets_the_finalizer_then_its_control_plane() {
        assert_eq!(next_step(&view(false, false), false), Step::AddFinalizer);
        assert_eq!(next_step(&view(false, true), false), Step::Create);
        assert_eq!(next_step(&view(false, true), true), Step::Nothing);
    }

    #[test]
    fn a_deleting_cluster_is_deleted_once_and_only_while_it_has_the_finalizer() {
        assert_eq!(next_step(&view(true, true), true), Step::Delete);
        assert_eq!(next_step(&view(true, true), false), Step::Delete);
        assert_eq!(next_step(&view(true, false), false), Step::Nothing);
    }
}
