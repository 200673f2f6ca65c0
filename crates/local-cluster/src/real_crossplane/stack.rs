//! The whole stack, started in order against a running control plane.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::task::AbortHandle;

use super::cloud::{self, CloudOptions, LocalCloud};
use super::crossplane_core::{self, CoreLayout};
use super::function;
use super::manifest;
use super::netns::NetNamespace;
use super::provider::{self, ProviderKind};
use super::{CROSSPLANE_USER, CoreVersion, CrossplaneBinaries, Error, io_error};
use crate::pki::{self, Pair};
use crate::process::{Lifetime, Process, Surroundings};
use crate::{ControlPlane, ProcessState};

/// The name of Crossplane core's process, for [`Crossplane::kill`].
pub const CORE_PROCESS: &str = "crossplane";

/// Ports inside core's network namespace. The function SDK takes :8080 for
/// its metrics, so core's go elsewhere.
const CORE_WEBHOOK_PORT: u16 = 9443;
const CORE_HEALTH_PORT: u16 = 8081;
const CORE_METRICS_PORT: u16 = 8082;
const FUNCTION_PORT: u16 = 9444;
/// provider-kubernetes' webhook server, fixed (no flag), inside its namespace.
const PROVIDER_WEBHOOK_PORT: u16 = 9443;

/// What to start besides core and the function.
#[derive(Clone, Debug)]
pub struct CrossplaneOptions {
    /// provider-kubernetes, provider-helm and the local cloud.
    pub providers: bool,
    pub cloud: CloudOptions,
}

impl Default for CrossplaneOptions {
    fn default() -> Self {
        Self {
            providers: true,
            cloud: CloudOptions::default(),
        }
    }
}

/// What `local-cluster up --crossplane` records for `status` and `down`.
#[derive(Debug, Serialize, Deserialize)]
pub struct CrossplaneState {
    pub supervisor_pid: u32,
    pub processes: Vec<ProcessState>,
    pub logs: PathBuf,
}

/// Crossplane core, the function, the providers and the local cloud, running.
/// Everything stops when it is dropped (or with [`Crossplane::stop`]).
pub struct Crossplane {
    /// In start order (the function, core, the providers); stopped in reverse.
    processes: Vec<Process>,
    cloud: Option<LocalCloud>,
    /// Runs the forwarders, the local cloud's controller and served files.
    runtime: Option<tokio::runtime::Runtime>,
    /// The namespaces that must reach loopback ports started later (a local
    /// cloud cluster's API server, a served file).
    forwarding: Forwarding,
    webhook_port: u16,
    version: CoreVersion,
    started_in: Duration,
}

/// Core's and the providers' namespaces, and the loopback ports carried into each.
#[derive(Clone, Default)]
pub struct Forwarding {
    inner: Arc<Mutex<ForwardingInner>>,
}

#[derive(Default)]
struct ForwardingInner {
    namespaces: Vec<NetNamespace>,
    /// Each port carried, with its forwarders (one per namespace).
    ports: BTreeMap<u16, Vec<AbortHandle>>,
    runtime: Option<tokio::runtime::Handle>,
}

impl Forwarding {
    /// Carries loopback `port` into every namespace of the stack, now and later.
    pub fn forward(&self, port: u16) -> Result<(), Error> {
        let mut inner = self
            .inner
            .lock()
            .map_err(|_| Error::Namespace("forwarding lock poisoned".into()))?;
        if inner.ports.contains_key(&port) {
            return Ok(());
        }
        let mut forwarders = Vec::new();
        if let Some(runtime) = inner.runtime.clone() {
            for ns in &inner.namespaces {
                forwarders.push(ns.forward_out(port, &runtime)?);
            }
        }
        inner.ports.insert(port, forwarders);
        Ok(())
    }

    /// Stops carrying `port`: inside the namespaces it is closed again, so a
    /// connection to it is refused, as to a server that is gone.
    pub fn forget(&self, port: u16) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        for forwarder in inner.ports.remove(&port).unwrap_or_default() {
            forwarder.abort();
        }
    }

    fn add_namespace(
        &self,
        ns: NetNamespace,
        runtime: &tokio::runtime::Handle,
    ) -> Result<(), Error> {
        let mut inner = self
            .inner
            .lock()
            .map_err(|_| Error::Namespace("forwarding lock poisoned".into()))?;
        for (port, forwarders) in inner.ports.iter_mut() {
            forwarders.push(ns.forward_out(*port, runtime)?);
        }
        inner.namespaces.push(ns);
        inner.runtime = Some(runtime.clone());
        Ok(())
    }
}

struct Certs {
    /// Crossplane's webhook server and the function and providers' servers.
    server: PathBuf,
    /// Crossplane's client identity towards the function.
    client: PathBuf,
    ca_pem: String,
}

impl Crossplane {
    /// Starts the stack on `cp`. Logs go to the control plane's logs
    /// directory (so a failing test prints them); state to `<dir>/crossplane`.
    pub async fn start(cp: &ControlPlane, options: CrossplaneOptions) -> Result<Self, Error> {
        let started = Instant::now();
        let binaries = tokio::task::spawn_blocking(CrossplaneBinaries::locate)
            .await
            .map_err(|e| Error::Io(format!("locating the binaries: {e}")))??;
        let version = binaries.core_version()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("local-crossplane")
            .enable_all()
            .build()
            .map_err(|e| Error::Io(format!("cannot start the stack's runtime: {e}")))?;
        let mut stack = Self {
            processes: Vec::new(),
            cloud: None,
            runtime: Some(runtime),
            forwarding: Forwarding::default(),
            webhook_port: 0,
            version,
            started_in: Duration::ZERO,
        };
        if let Err(e) = stack.boot(cp, &binaries, &options).await {
            let logs = cp.log_tails(40);
            stack.stop();
            return Err(Error::Boot {
                cause: e.to_string(),
                logs,
            });
        }
        stack.started_in = started.elapsed();
        Ok(stack)
    }

    async fn boot(
        &mut self,
        cp: &ControlPlane,
        binaries: &CrossplaneBinaries,
        options: &CrossplaneOptions,
    ) -> Result<(), Error> {
        let runtime = self.runtime_handle()?;
        let dir = cp.dir().join("crossplane");
        std::fs::create_dir_all(&dir).map_err(io_error(&dir))?;
        let certs = write_certs(&dir)?;
        let kubeconfig = dir.join("crossplane.kubeconfig");
        cp.write_kubeconfig_as(&kubeconfig, CROSSPLANE_USER, &["system:masters"])?;
        let client = cp.admin().await?;
        let api_port = port_of(cp.server())?;

        // Core and the function share a namespace: the function SDK binds
        // :8080 on every interface, and core reaches it on the inside. Ports
        // inside are fixed (nothing else is there); the forwarded ones outside
        // are whatever the system hands out.
        let ns = NetNamespace::create()?;
        ns.forward_out(api_port, &runtime)?;
        // Core pulls packages too, from a registry on loopback (see package.rs).
        self.forwarding.add_namespace(ns.clone(), &runtime)?;
        let (webhook_outside, _) = ns.forward_in(CORE_WEBHOOK_PORT, &runtime)?;
        let (health_outside, _) = ns.forward_in(CORE_HEALTH_PORT, &runtime)?;
        self.webhook_port = webhook_outside;
        let layout = CoreLayout {
            kubeconfig,
            server_certs: certs.server.clone(),
            client_certs: certs.client.clone(),
            cache: dir.join("cache"),
            webhook_port: CORE_WEBHOOK_PORT,
            webhook_url: format!("https://127.0.0.1:{webhook_outside}"),
            metrics_port: CORE_METRICS_PORT,
            health_port: CORE_HEALTH_PORT,
            ca_pem: certs.ca_pem.clone(),
        };

        crossplane_core::ensure_namespace(&client).await?;
        crossplane_core::init(binaries, &layout, &cp.log_path("crossplane-init")).await?;
        crossplane_core::webhooks_on_loopback(&client, binaries, &layout).await?;

        let inside = Surroundings {
            network_namespace: Some(ns.handle()),
            ..Surroundings::default()
        };
        let mut function = function::start(
            binaries,
            FUNCTION_PORT,
            &certs.server,
            &cp.log_path(function::FUNCTION_NAME),
            Lifetime::Owned,
            inside.clone(),
        )?;
        function::wait_listening(&ns, FUNCTION_PORT, &mut function).await?;
        self.processes.push(function);
        let mut core = crossplane_core::start(
            binaries,
            &layout,
            &cp.log_path("crossplane"),
            Lifetime::Owned,
            inside,
        )?;
        crossplane_core::wait_ready(health_outside, &mut core).await?;
        self.processes.push(core);
        function::register(&client, FUNCTION_PORT, self.version).await?;

        if options.providers {
            self.start_providers(cp, binaries, &certs, &dir, api_port, &runtime)
                .await?;
            let cloud = LocalCloud::start(
                cp,
                &dir.join("cloud"),
                options.cloud.clone(),
                self.forwarding.clone(),
                &runtime,
            )
            .await?;
            self.cloud = Some(cloud);
        }
        Ok(())
    }

    async fn start_providers(
        &mut self,
        cp: &ControlPlane,
        binaries: &CrossplaneBinaries,
        certs: &Certs,
        dir: &Path,
        api_port: u16,
        runtime: &tokio::runtime::Handle,
    ) -> Result<(), Error> {
        let client = cp.admin().await?;
        for kind in [ProviderKind::Kubernetes, ProviderKind::Helm] {
            let ns = NetNamespace::create()?;
            ns.forward_out(api_port, runtime)?;
            // provider-kubernetes serves the conversion webhook of its legacy
            // (cluster-scoped) Object on :9443 in its namespace.
            let (webhook_port, _) = ns.forward_in(PROVIDER_WEBHOOK_PORT, runtime)?;
            let mut crds = manifest::read_crds(kind.crds(binaries))?;
            let url = format!("https://127.0.0.1:{webhook_port}/convert");
            for crd in &mut crds {
                manifest::convert_on_loopback(crd, &url, &certs.ca_pem);
            }
            manifest::apply_crds(&client, &crds).await?;
            let kubeconfig = dir.join(format!("{}.kubeconfig", kind.name()));
            cp.write_kubeconfig_as(&kubeconfig, kind.user(), &["system:masters"])?;
            self.forwarding.add_namespace(ns.clone(), runtime)?;
            let running = provider::start(
                kind,
                binaries,
                &ns,
                &kubeconfig,
                &certs.server,
                &cp.log_path(kind.name()),
                Lifetime::Owned,
            )?;
            self.processes.push(running);
        }
        Ok(())
    }

    fn runtime_handle(&self) -> Result<tokio::runtime::Handle, Error> {
        self.runtime
            .as_ref()
            .map(|r| r.handle().clone())
            .ok_or_else(|| Error::Io("the stack is stopped".into()))
    }

    /// How long [`Crossplane::start`] took.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// Crossplane core's release.
    pub fn version(&self) -> CoreVersion {
        self.version
    }

    /// The loopback port Crossplane's webhooks are served on.
    pub fn webhook_port(&self) -> u16 {
        self.webhook_port
    }

    /// Serves `body` over plain HTTP on loopback, reachable from the
    /// providers as well; returns its URL (any path answers it).
    pub fn serve(&self, name: &str, body: Vec<u8>) -> Result<String, Error> {
        let runtime = self.runtime_handle()?;
        let port = cloud::serve_bytes(body, &runtime)?;
        self.forwarding.forward(port)?;
        Ok(format!("http://127.0.0.1:{port}/{name}"))
    }

    /// Carries a server on loopback `port` (a package registry, say) into
    /// every network namespace of the stack, core's and the providers', at
    /// the same port.
    pub fn reach(&self, port: u16) -> Result<(), Error> {
        self.forwarding.forward(port)
    }

    /// Each process, in start order.
    pub fn processes(&self) -> Vec<ProcessState> {
        self.processes.iter().map(ProcessState::from).collect()
    }

    /// SIGKILLs the process named `name` (`crossplane` for core, a
    /// provider's or the function's name), as the OOM killer or a lost node
    /// would: no chance to clean up (nothing if it is not running). Start it
    /// with [`Crossplane::start_again`].
    pub fn kill(&mut self, name: &str) -> Result<(), Error> {
        let process = self.process(name)?;
        // Once killed its id is free: never signal it twice.
        if process.is_running() {
            process.kill();
        }
        Ok(())
    }

    /// Starts the process named `name` again if it is not running, in its
    /// network namespace, with the same arguments and log.
    pub fn start_again(&mut self, name: &str) -> Result<(), Error> {
        Ok(self.process(name)?.start_again()?)
    }

    /// Starts again every process of the stack that is not running (killed,
    /// or exited on its own while the API server was away); returns their
    /// names.
    pub fn start_all_again(&mut self) -> Result<Vec<String>, Error> {
        let mut started = Vec::new();
        for p in &mut self.processes {
            if !p.is_running() {
                p.start_again()?;
                started.push(p.name.clone());
            }
        }
        Ok(started)
    }

    fn process(&mut self, name: &str) -> Result<&mut Process, Error> {
        self.processes
            .iter_mut()
            .find(|p| p.name == name)
            .ok_or_else(|| Error::Io(format!("no process named {name} in the stack")))
    }

    /// Whether every process still runs.
    pub fn is_running(&mut self) -> bool {
        self.processes.iter_mut().all(|p| p.is_running())
    }

    /// Stops the providers, core, the function and every local cloud cluster.
    pub fn stop(&mut self) {
        while let Some(mut p) = self.processes.pop() {
            p.stop(Duration::from_secs(10));
        }
        if let Some(cloud) = self.cloud.take() {
            cloud.stop();
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Crossplane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A process's resident memory in kB, from /proc.
pub fn resident_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The port of a loopback URL such as `https://127.0.0.1:6443`.
pub(super) fn port_of(server: &str) -> Result<u16, Error> {
    server
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .ok_or_else(|| Error::Io(format!("cannot read a port from {server}")))
}

/// One CA for the mutual TLS between core and the function, which also signs
/// the webhook servers' certificate (the API server trusts it as caBundle).
fn write_certs(dir: &Path) -> Result<Certs, Error> {
    let (ca, server, client) = pki::loopback_mutual(
        "local-cluster crossplane CA",
        "crossplane-webhooks",
        "crossplane",
    )?;
    let write_dir = |name: &str, pair: &Pair| -> Result<PathBuf, Error> {
        let path = dir.join(name);
        std::fs::create_dir_all(&path).map_err(io_error(&path))?;
        for (file, text) in [
            ("tls.crt", &pair.cert_pem),
            ("tls.key", &pair.key_pem),
            ("ca.crt", &ca.cert_pem),
        ] {
            let file = path.join(file);
            std::fs::write(&file, text).map_err(io_error(&file))?;
        }
        Ok(path)
    };
    Ok(Certs {
        server: write_dir("tls-server", &server)?,
        client: write_dir("tls-client", &client)?,
        ca_pem: ca.cert_pem.clone(),
    })
}
