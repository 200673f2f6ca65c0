//! A local control plane: etcd, kube-apiserver and kube-controller-manager
//! (garbage-collector, namespace and admission-policy status controllers only), on loopback.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ObjectMeta, PostParams, PropagationPolicy};
use kube::config::{
    AuthInfo, Cluster, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};
use kube::{Api, Client, Config};
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::binaries::Binaries;
use crate::etcd;
use crate::pki::{Pair, Pki};
use crate::process::{self, Lifetime, Process};

/// How to start a control plane.
#[derive(Clone, Debug)]
pub struct Options {
    /// Passed to kube-controller-manager. With `true` (kubeadm's default) each
    /// controller acts as its own service account, so the garbage collector is
    /// `system:serviceaccount:kube-system:generic-garbage-collector`; with `false`
    /// every controller is `system:kube-controller-manager`.
    pub use_service_account_credentials: bool,
    /// CRDs installed before the controller manager starts, so that the garbage
    /// collector watches them from the start instead of finding them on its next
    /// 30-second discovery pass.
    pub crds: Vec<CustomResourceDefinition>,
    /// Where state, certificates, logs and etcd's data go. Default: a new
    /// directory under /dev/shm (or the temp dir), removed on stop.
    pub dir: Option<PathBuf>,
    pub lifetime: Lifetime,
    /// The directory the API server loads static ValidatingAdmissionPolicies
    /// from (its AdmissionConfiguration's `staticManifestsDir`); created if
    /// missing. Needs 1.36 or newer; on 1.36 also the feature gate below.
    pub static_manifests_dir: Option<PathBuf>,
    /// `--feature-gates` of kube-apiserver (`Name=true`), if any.
    pub feature_gates: Vec<String>,
    /// Only etcd and kube-apiserver, the API server without its watch cache:
    /// a cluster that stores and serves objects and runs no controller (no
    /// garbage collector, no namespace controller). What the local cloud's
    /// clusters are: places Helm installs into, not what a test observes.
    /// It authorizes every request (AlwaysAllow): its clients are admins.
    /// Less CPU to start and at rest (BENCHMARKS.md, "CI"), and a run of
    /// the real-Crossplane suite makes forty of them.
    pub serve_only: bool,
    /// With `serve_only`: the URL of a [`crate::SharedEtcd`] to keep the
    /// objects in, under the prefix `/<the directory's name>`, instead of an
    /// etcd of its own.
    pub shared_etcd: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            use_service_account_credentials: true,
            crds: Vec::new(),
            dir: None,
            lifetime: Lifetime::Owned,
            static_manifests_dir: None,
            feature_gates: Vec::new(),
            serve_only: false,
            shared_etcd: None,
        }
    }
}

/// What `local-cluster up` records so that `status` and `down` can find the
/// processes again.
#[derive(Debug, Serialize, Deserialize)]
pub struct State {
    pub server: String,
    pub kubeconfig: PathBuf,
    pub use_service_account_credentials: bool,
    pub processes: Vec<ProcessState>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ProcessState {
    pub name: String,
    pub pid: u32,
    pub binary: PathBuf,
    pub log: PathBuf,
}

impl From<&Process> for ProcessState {
    fn from(p: &Process) -> Self {
        Self {
            name: p.name.clone(),
            pid: p.pid,
            binary: p.binary.clone(),
            log: p.log.clone(),
        }
    }
}

pub const GC_SERVICE_ACCOUNT_USER: &str =
    "system:serviceaccount:kube-system:generic-garbage-collector";
pub const CONTROLLER_MANAGER_USER: &str = "system:kube-controller-manager";
pub const NAMESPACE_CONTROLLER_SERVICE_ACCOUNT_USER: &str =
    "system:serviceaccount:kube-system:namespace-controller";

pub struct ControlPlane {
    dir: PathBuf,
    remove_dir_on_stop: bool,
    server: String,
    use_service_account_credentials: bool,
    /// In start order; stopped in reverse.
    processes: Vec<Process>,
}

const START_TIMEOUT: Duration = Duration::from_secs(120);

impl ControlPlane {
    pub async fn start(options: Options) -> Result<Self, Error> {
        let binaries = Binaries::locate()?;
        let (dir, remove_dir_on_stop) = match &options.dir {
            Some(dir) => (dir.clone(), false),
            None => (new_scratch_dir()?, true),
        };
        for sub in ["pki", "logs", "etcd"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(io_error(&dir))?;
        }
        let mut cp = Self {
            dir,
            remove_dir_on_stop,
            server: String::new(),
            use_service_account_credentials: options.use_service_account_credentials,
            processes: Vec::new(),
        };
        if let Err(e) = cp.boot(&binaries, &options).await {
            let logs = cp.log_tails(40);
            // Detached processes are not stopped by drop: stop them here.
            cp.stop();
            return Err(Error::Boot {
                cause: e.to_string(),
                logs,
            });
        }
        Ok(cp)
    }

    async fn boot(&mut self, binaries: &Binaries, options: &Options) -> Result<(), Error> {
        let dir = self.dir.clone();
        let pki = Pki::generate()?;
        let files = write_pki(&dir.join("pki"), &pki)?;
        let [etcd_client, etcd_peer, apiserver_port] = free_ports()?;
        self.server = format!("https://127.0.0.1:{apiserver_port}");

        write_kubeconfig(
            &self.kubeconfig_path(),
            &self.server,
            &files.ca,
            &files.admin_cert,
            &files.admin_key,
            "admin",
        )?;
        write_kubeconfig(
            &dir.join("controller-manager.kubeconfig"),
            &self.server,
            &files.ca,
            &files.kcm_cert,
            &files.kcm_key,
            "controller-manager",
        )?;
        let audit_policy = dir.join("audit-policy.yaml");
        std::fs::write(&audit_policy, AUDIT_POLICY).map_err(io_error(&audit_policy))?;

        let etcd_url = match &options.shared_etcd {
            Some(url) if options.serve_only => url.clone(),
            _ => {
                let args = etcd::args(&dir.join("etcd"), etcd_client, etcd_peer);
                self.spawn("etcd", &binaries.etcd, &args, options.lifetime)?;
                wait_for_tcp(etcd_client, "etcd", &mut self.processes).await?;
                format!("http://127.0.0.1:{etcd_client}")
            }
        };

        let mut apiserver_args = vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".to_string(),
            "--advertise-address=127.0.0.1".to_string(),
            format!("--secure-port={apiserver_port}"),
            format!("--cert-dir={}", dir.join("pki").display()),
            format!("--tls-cert-file={}", files.serving_cert.display()),
            format!("--tls-private-key-file={}", files.serving_key.display()),
            format!("--client-ca-file={}", files.ca.display()),
            // A serve-only cluster's clients are admins (system:masters,
            // which RBAC lets through anyway): no RBAC spares its start the
            // bootstrap roles, about 0.9 s of CPU of 2.0 (BENCHMARKS.md "CI").
            format!(
                "--authorization-mode={}",
                if options.serve_only {
                    "AlwaysAllow"
                } else {
                    "RBAC"
                }
            ),
            "--service-cluster-ip-range=10.0.0.0/24".to_string(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_string(),
            format!(
                "--service-account-key-file={}",
                files.sa_public_key.display()
            ),
            format!(
                "--service-account-signing-key-file={}",
                files.sa_key.display()
            ),
            "--allow-privileged=true".to_string(),
            // No kubelet, no pods: the ServiceAccount plugin would only get in the way.
            "--disable-admission-plugins=ServiceAccount".to_string(),
            // The `kubernetes` Service's endpoints cannot be loopback addresses.
            "--endpoint-reconciler-type=none".to_string(),
            format!("--audit-policy-file={}", audit_policy.display()),
            format!("--audit-log-path={}", self.audit_log_path().display()),
            "--audit-log-format=json".to_string(),
            "--audit-log-maxsize=0".to_string(),
        ];
        if let Some(static_dir) = &options.static_manifests_dir {
            std::fs::create_dir_all(static_dir).map_err(io_error(static_dir))?;
            let config = dir.join("admission-config.yaml");
            std::fs::write(&config, admission_config(static_dir)).map_err(io_error(&config))?;
            apiserver_args.push(format!(
                "--admission-control-config-file={}",
                config.display()
            ));
        }
        if !options.feature_gates.is_empty() {
            apiserver_args.push(format!(
                "--feature-gates={}",
                options.feature_gates.join(",")
            ));
        }
        if options.serve_only {
            // Its few clients read what they wrote: every read from etcd
            // costs less than keeping a cache of every built-in kind.
            apiserver_args.push("--watch-cache=false".to_string());
            if options.shared_etcd.is_some() {
                apiserver_args.push(format!("--etcd-prefix={}", etcd::prefix_of(&dir)));
            }
        }
        self.spawn(
            "kube-apiserver",
            &binaries.kube_apiserver,
            &apiserver_args,
            options.lifetime,
        )?;
        let client = self.wait_for_apiserver().await?;

        install_crds(&client, &options.crds).await?;
        if options.serve_only {
            return Ok(());
        }

        let kcm_kubeconfig = dir.join("controller-manager.kubeconfig");
        let kcm_args = vec![
            format!("--kubeconfig={}", kcm_kubeconfig.display()),
            format!("--authentication-kubeconfig={}", kcm_kubeconfig.display()),
            format!("--authorization-kubeconfig={}", kcm_kubeconfig.display()),
            // The status controller type-checks admission policies and fills in
            // their status.typeChecking, as on a real cluster.
            "--controllers=garbage-collector-controller,namespace-controller,validatingadmissionpolicy-status-controller".to_string(),
            "--leader-elect=false".to_string(),
            format!(
                "--use-service-account-credentials={}",
                options.use_service_account_credentials
            ),
            "--bind-address=127.0.0.1".to_string(),
            // Its health endpoint is not used: readiness is proven by a real cascade.
            "--secure-port=0".to_string(),
        ];
        self.spawn(
            "kube-controller-manager",
            &binaries.kube_controller_manager,
            &kcm_args,
            options.lifetime,
        )?;
        self.wait_for_garbage_collector(&client).await?;
        Ok(())
    }

    /// Reattaches to a control plane started by `local-cluster up`.
    pub fn adopt(dir: &Path, state: State) -> Self {
        Self {
            dir: dir.to_path_buf(),
            remove_dir_on_stop: false,
            server: state.server,
            use_service_account_credentials: state.use_service_account_credentials,
            processes: state
                .processes
                .into_iter()
                .map(|p| Process::adopt(p.name, p.pid, p.binary, p.log))
                .collect(),
        }
    }

    pub fn state(&self) -> State {
        State {
            server: self.server.clone(),
            kubeconfig: self.kubeconfig_path(),
            use_service_account_credentials: self.use_service_account_credentials,
            processes: self.processes.iter().map(ProcessState::from).collect(),
        }
    }

    fn spawn(
        &mut self,
        name: &str,
        binary: &Path,
        args: &[String],
        lifetime: Lifetime,
    ) -> Result<(), Error> {
        let log = self.dir.join("logs").join(format!("{name}.log"));
        let process = process::spawn(name, binary, args, &log, lifetime)?;
        self.processes.push(process);
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    /// The admin's kubeconfig (client certificate, `system:masters`).
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// The API server's audit log: one JSON event per line, for every DELETE
    /// and DELETECOLLECTION, with the DeleteOptions sent.
    pub fn audit_log_path(&self) -> PathBuf {
        self.dir.join("logs").join("audit.log")
    }

    pub fn use_service_account_credentials(&self) -> bool {
        self.use_service_account_credentials
    }

    /// The username the garbage collector's requests carry.
    pub fn garbage_collector_username(&self) -> &'static str {
        if self.use_service_account_credentials {
            GC_SERVICE_ACCOUNT_USER
        } else {
            CONTROLLER_MANAGER_USER
        }
    }

    /// The username the namespace controller's requests carry.
    pub fn namespace_controller_username(&self) -> &'static str {
        if self.use_service_account_credentials {
            NAMESPACE_CONTROLLER_SERVICE_ACCOUNT_USER
        } else {
            CONTROLLER_MANAGER_USER
        }
    }

    /// Writes a kubeconfig at `path` that acts as `user` in `groups` (by
    /// impersonation from the admin certificate), for a process a test starts
    /// under its own identity, as a controller in a cluster would run.
    pub fn write_kubeconfig_as(
        &self,
        path: &Path,
        user: &str,
        groups: &[&str],
    ) -> Result<(), Error> {
        let admin = self.kubeconfig_path();
        let mut kubeconfig = Kubeconfig::read_from(&admin).map_err(|source| Error::Kubeconfig {
            path: admin.clone(),
            source,
        })?;
        for named in &mut kubeconfig.auth_infos {
            if let Some(auth) = named.auth_info.as_mut() {
                auth.impersonate = Some(user.into());
                auth.impersonate_groups =
                    (!groups.is_empty()).then(|| groups.iter().map(|g| g.to_string()).collect());
            }
        }
        save_kubeconfig(path, &kubeconfig)
    }

    /// A new client configuration for the admin. Clients are bound to the tokio
    /// runtime they are made in, so each test makes its own.
    pub async fn admin_config(&self) -> Result<Config, Error> {
        let path = self.kubeconfig_path();
        let kubeconfig = Kubeconfig::read_from(&path).map_err(|source| Error::Kubeconfig {
            path: path.clone(),
            source,
        })?;
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|source| Error::Kubeconfig { path, source })
    }

    pub async fn admin(&self) -> Result<Client, Error> {
        Client::try_from(self.admin_config().await?).map_err(Error::Client)
    }

    /// A client that acts as `user` in `groups`, by impersonation from the admin.
    /// Admission sees exactly `user` and `groups` (plus `system:authenticated`).
    pub async fn client_as(&self, user: &str, groups: &[&str]) -> Result<Client, Error> {
        let mut config = self.admin_config().await?;
        config.auth_info.impersonate = Some(user.to_string());
        if !groups.is_empty() {
            config.auth_info.impersonate_groups =
                Some(groups.iter().map(|g| g.to_string()).collect());
        }
        Client::try_from(config).map_err(Error::Client)
    }

    /// The last `lines` lines of each log in the logs directory (the
    /// components', and any a test added there, such as a controller's), for a
    /// failing test. The audit log is left out: it is data, not a story.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for log in self.story_logs() {
            out.push_str(&format!(
                "----- {} -----\n{}\n",
                log.display(),
                process::log_tail(&log, lines)
            ));
        }
        out
    }

    /// Every line of each log in the logs directory (the audit log aside)
    /// that contains `what` (an object's name, say), by log: what the
    /// components said of it, for a failing test.
    pub fn log_lines_naming(&self, what: &str) -> String {
        let mut out = String::new();
        for log in self.story_logs() {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().filter(|l| l.contains(what)).collect();
            if !lines.is_empty() {
                out.push_str(&format!(
                    "----- {} -----\n{}\n",
                    log.display(),
                    lines.join("\n")
                ));
            }
        }
        out
    }

    /// The logs in the logs directory but the audit log, by name.
    fn story_logs(&self) -> Vec<PathBuf> {
        let mut logs: Vec<PathBuf> = std::fs::read_dir(self.dir.join("logs"))
            .map(|entries| entries.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        logs.retain(|p| p.file_name().is_some_and(|n| n != "audit.log"));
        logs.sort();
        logs
    }

    /// Restarts one component (`kube-apiserver`, `kube-controller-manager`,
    /// `etcd`) with the same flags after `downtime` stopped, and waits until
    /// it serves again. For tests of what survives a component's restart.
    pub async fn restart(&mut self, component: &str, downtime: Duration) -> Result<(), Error> {
        let process = self
            .processes
            .iter_mut()
            .find(|p| p.name == component)
            .ok_or_else(|| Error::NoSuchComponent(component.to_string()))?;
        process.restart(downtime)?;
        if component == "kube-apiserver" {
            self.wait_for_apiserver().await?;
        }
        Ok(())
    }

    /// Where a test should write the log of a process it starts, so that
    /// failures print it with the components' logs.
    pub fn log_path(&self, name: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{name}.log"))
    }

    /// Whether every component is still running.
    pub fn is_running(&mut self) -> bool {
        !self.processes.is_empty() && self.processes.iter_mut().all(|p| p.is_running())
    }

    /// Stops every component (controller manager first, etcd last).
    pub fn stop(&mut self) {
        while let Some(mut p) = self.processes.pop() {
            p.stop(Duration::from_secs(10));
        }
        if self.remove_dir_on_stop {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    async fn wait_for_apiserver(&mut self) -> Result<Client, Error> {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut last = String::from("not reachable yet");
        loop {
            if let Ok(client) = self.admin().await {
                let request = http::Request::get("/readyz").body(Vec::new());
                if let Ok(request) = request {
                    match client.request_text(request).await {
                        Ok(body) if body.trim() == "ok" => return Ok(client),
                        Ok(body) => last = body,
                        Err(e) => last = e.to_string(),
                    }
                }
            }
            self.ensure_running()?;
            if Instant::now() > deadline {
                return Err(Error::NotReady {
                    component: "kube-apiserver".into(),
                    last,
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Proves the garbage collector runs: a foreground delete of an owner only
    /// completes once the collector has deleted its dependent and released it.
    async fn wait_for_garbage_collector(&mut self, client: &Client) -> Result<(), Error> {
        let ns = "local-cluster-probe";
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let probe_ns = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match namespaces.create(&PostParams::default(), &probe_ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(Error::Probe(e.to_string())),
        }
        let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let deadline = Instant::now() + START_TIMEOUT;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let owner_name = format!("owner-{attempt}");
            let owner = maps
                .create(&PostParams::default(), &config_map(&owner_name, None))
                .await
                .map_err(|e| Error::Probe(e.to_string()))?;
            let reference = OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: owner_name.clone(),
                uid: owner.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            };
            maps.create(
                &PostParams::default(),
                &config_map(&format!("dependent-{attempt}"), Some(reference)),
            )
            .await
            .map_err(|e| Error::Probe(e.to_string()))?;
            let foreground = DeleteParams {
                propagation_policy: Some(PropagationPolicy::Foreground),
                ..Default::default()
            };
            maps.delete(&owner_name, &foreground)
                .await
                .map_err(|e| Error::Probe(e.to_string()))?;
            let round = Instant::now() + Duration::from_secs(10);
            while Instant::now() < round {
                match maps.get_opt(&owner_name).await {
                    Ok(None) => return Ok(()),
                    Ok(Some(_)) => {}
                    Err(e) => return Err(Error::Probe(e.to_string())),
                }
                self.ensure_running()?;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if Instant::now() > deadline {
                return Err(Error::NotReady {
                    component: "kube-controller-manager".into(),
                    last: format!(
                        "the garbage collector did not finish probe cascade {owner_name}"
                    ),
                });
            }
        }
    }

    fn ensure_running(&mut self) -> Result<(), Error> {
        for p in &mut self.processes {
            if !p.is_running() {
                return Err(Error::Exited {
                    component: p.name.clone(),
                });
            }
        }
        Ok(())
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // A test that panics drops its control plane as it unwinds, and its
        // directory goes with it: what the components said, and whether each
        // still ran, is the only record of why (CI at e237696 kept one line, a
        // connection the API server closed, and nothing of the server).
        if std::thread::panicking() {
            let running: Vec<String> = self
                .processes
                .iter_mut()
                .map(|p| {
                    let state = if p.is_running() { "running" } else { "EXITED" };
                    format!("{} {state}", p.name)
                })
                .collect();
            let crashes: String = self
                .story_logs()
                .iter()
                .filter_map(|log| {
                    process::log_crash(log, 12)
                        .map(|c| format!("----- {} CRASHED -----\n{c}\n", log.display()))
                })
                .collect();
            eprintln!(
                "----- the control plane as the test failed: {} -----\n{crashes}{}",
                running.join(", "),
                self.log_tails(30)
            );
        }
        // Owned processes stop when dropped; adopted (detached) ones are left to
        // `local-cluster down`.
        self.processes.clear();
        if self.remove_dir_on_stop {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn config_map(name: &str, owner: Option<OwnerReference>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        ..Default::default()
    }
}

async fn install_crds(client: &Client, crds: &[CustomResourceDefinition]) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), crd)
            .await
            .map_err(|source| Error::Crd {
                name: name.clone(),
                source,
            })?;
    }
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        crate::wait::crd_established(client, &name, Duration::from_secs(30))
            .await
            .map_err(|source| Error::Crd { name, source })?;
    }
    Ok(())
}

pub(crate) async fn wait_for_tcp(
    port: u16,
    component: &str,
    processes: &mut [Process],
) -> Result<(), Error> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        for p in processes.iter_mut() {
            if !p.is_running() {
                return Err(Error::Exited {
                    component: p.name.clone(),
                });
            }
        }
        if Instant::now() > deadline {
            return Err(Error::NotReady {
                component: component.into(),
                last: format!("nothing listens on 127.0.0.1:{port}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `N` distinct free loopback ports. The OS could hand one out again before the
/// component binds it; the components then fail loudly at start.
pub(crate) fn free_ports<const N: usize>() -> Result<[u16; N], Error> {
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0u16; N];
    for port in ports.iter_mut() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(Error::Ports)?;
        *port = listener.local_addr().map_err(Error::Ports)?.port();
        listeners.push(listener);
    }
    Ok(ports)
}

/// A new scratch directory under /dev/shm (or the temp dir), named after this
/// process: whatever the process leaves there is removed by a later start once
/// the process is gone, so a test that never drops what it keeps there leaks
/// nothing past its process.
pub fn new_scratch_dir() -> Result<PathBuf, Error> {
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    remove_stale_scratch_dirs(&base);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let dir = base.join(format!("local-cluster-{}-{nanos:x}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(io_error(&dir))?;
    Ok(dir)
}

/// A test binary's control plane lives in a static and is never dropped, so its
/// scratch directory is removed by the next start, once its process is gone.
fn remove_stale_scratch_dirs(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("local-cluster-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

struct PkiFiles {
    ca: PathBuf,
    serving_cert: PathBuf,
    serving_key: PathBuf,
    admin_cert: PathBuf,
    admin_key: PathBuf,
    kcm_cert: PathBuf,
    kcm_key: PathBuf,
    sa_key: PathBuf,
    sa_public_key: PathBuf,
}

fn write_pki(dir: &Path, pki: &Pki) -> Result<PkiFiles, Error> {
    let write = |name: &str, pem: &str| -> Result<PathBuf, Error> {
        let path = dir.join(name);
        std::fs::write(&path, pem).map_err(io_error(&path))?;
        Ok(path)
    };
    let pair = |name: &str, pair: &Pair| -> Result<(PathBuf, PathBuf), Error> {
        Ok((
            write(&format!("{name}.crt"), &pair.cert_pem)?,
            write(&format!("{name}.key"), &pair.key_pem)?,
        ))
    };
    let ca = write("ca.crt", &pki.ca.cert_pem)?;
    let (serving_cert, serving_key) = pair("apiserver", &pki.serving)?;
    let (admin_cert, admin_key) = pair("admin", &pki.admin)?;
    let (kcm_cert, kcm_key) = pair("controller-manager", &pki.controller_manager)?;
    let sa_key = write("service-account.key", &pki.service_account_key_pem)?;
    let sa_public_key = write("service-account.pub", &pki.service_account_public_key_pem)?;
    Ok(PkiFiles {
        ca,
        serving_cert,
        serving_key,
        admin_cert,
        admin_key,
        kcm_cert,
        kcm_key,
        sa_key,
        sa_public_key,
    })
}

fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    cert: &Path,
    key: &Path,
    user: &str,
) -> Result<(), Error> {
    let kubeconfig = Kubeconfig {
        clusters: vec![NamedCluster {
            name: CLUSTER_NAME.into(),
            cluster: Some(Cluster {
                server: Some(server.into()),
                certificate_authority: Some(ca.display().to_string()),
                ..Cluster::default()
            }),
            ..NamedCluster::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: user.into(),
            auth_info: Some(AuthInfo {
                client_certificate: Some(cert.display().to_string()),
                client_key: Some(key.display().to_string()),
                ..AuthInfo::default()
            }),
            ..NamedAuthInfo::default()
        }],
        contexts: vec![NamedContext {
            name: CLUSTER_NAME.into(),
            context: Some(kube::config::Context {
                cluster: CLUSTER_NAME.into(),
                user: Some(user.into()),
                ..kube::config::Context::default()
            }),
            ..NamedContext::default()
        }],
        current_context: Some(CLUSTER_NAME.into()),
        kind: Some("Config".into()),
        api_version: Some("v1".into()),
        ..Kubeconfig::default()
    };
    save_kubeconfig(path, &kubeconfig)
}

/// The name of the cluster and of the context in every kubeconfig written.
const CLUSTER_NAME: &str = "local-cluster";

fn save_kubeconfig(path: &Path, kubeconfig: &Kubeconfig) -> Result<(), Error> {
    let text = serde_yaml::to_string(kubeconfig).map_err(|source| Error::KubeconfigWrite {
        path: path.to_path_buf(),
        source,
    })?;
    std::fs::write(path, text).map_err(io_error(path))
}

pub(crate) fn io_error(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Deletes are recorded with the DeleteOptions the client sent (the request
/// body); nothing else is recorded.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Request
  verbs: [delete, deletecollection]
- level: None
  resources:
  - group: coordination.k8s.io
    resources: [leases]
  - group: \"\"
    resources: [events]
  - group: events.k8s.io
    resources: [events]
- level: Metadata
  verbs: [update, patch]
- level: None
";

/// An AdmissionConfiguration that loads static ValidatingAdmissionPolicies
/// from `dir` (manifest-based admission control, KEP-5793).
fn admission_config(dir: &Path) -> String {
    format!(
        "apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: ValidatingAdmissionPolicy
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: ValidatingAdmissionPolicyConfiguration
    staticManifestsDir: {}
",
        serde_json::to_string(&dir.display().to_string()).unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_kubeconfig_reads_back_as_written() -> Result<(), Box<dyn std::error::Error>> {
        let dir =
            std::env::temp_dir().join(format!("local-cluster-kubeconfig-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("kubeconfig");
        let (ca, cert, key) = (dir.join("ca.crt"), dir.join("a.crt"), dir.join("a.key"));
        write_kubeconfig(&path, "https://127.0.0.1:6443", &ca, &cert, &key, "admin")?;
        let read = Kubeconfig::read_from(&path)?;
        std::fs::remove_dir_all(&dir)?;
        assert_eq!(read.current_context.as_deref(), Some(CLUSTER_NAME));
        let cluster = read
            .clusters
            .first()
            .and_then(|c| c.cluster.clone())
            .unwrap_or_default();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert_eq!(
            cluster.certificate_authority,
            Some(ca.display().to_string())
        );
        let user = read.auth_infos.first().ok_or("no user")?;
        assert_eq!(user.name, "admin");
        let auth = user.auth_info.clone().unwrap_or_default();
        assert_eq!(auth.client_certificate, Some(cert.display().to_string()));
        assert_eq!(auth.client_key, Some(key.display().to_string()));
        let context = read
            .contexts
            .first()
            .and_then(|c| c.context.clone())
            .unwrap_or_default();
        assert_eq!(
            (context.cluster.as_str(), context.user.as_deref()),
            (CLUSTER_NAME, Some("admin"))
        );
        Ok(())
    }
}
