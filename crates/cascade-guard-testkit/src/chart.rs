//! The Helm chart on the real control plane, for cascade-guard's tests/api_server/install.rs: render it
//! with the pinned helm (HELM_BIN, installed by scripts/test.sh), apply what it
//! renders as `helm install` and `helm upgrade` would (server-side apply, then
//! removing what the new render no longer has), delete it as `helm uninstall`
//! would, and run `cascade-guard run` exactly as the chart's Deployment would:
//! the binary of its image ([`crate::image`] takes it out), its args,
//! its environment, its ServiceAccount's identity and nothing more.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{self, Scope};
use kube::{Api, Client};
use local_cluster::ControlPlane;
use local_cluster::process::{self, Lifetime, Process};
use serde_json::Value;

pub const RELEASE: &str = "cascade-guard";
pub const NAMESPACE: &str = "cascade-guard-system";
/// The field manager the applies use, standing in for Helm.
const MANAGER: &str = "helm";

pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/cascade-guard")
}

pub fn manifest_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/cascade-guard.yaml")
}

/// The pinned helm, installed from the Go module proxy by testbed/tools/helm.sh
/// (which scripts/test.sh runs and exports as HELM_BIN; without it, the
/// script is run here, which is instant once cached).
pub fn helm() -> PathBuf {
    pinned_tool("HELM_BIN", "helm.sh")
}

/// A tool that a script under testbed/tools/ builds from the Go module proxy and
/// caches, printing its path on its last line: `env_var` when set (as
/// scripts/test.sh exports it), else the script's answer.
pub fn pinned_tool(env_var: &str, script: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env_var) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "{env_var}={} is not a file; run testbed/tools/{script}",
            path.display()
        );
        return path;
    }
    let script_path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testbed/tools")
        .join(script);
    let output = std::process::Command::new("bash")
        .arg(&script_path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script_path.display()));
    assert!(
        output.status.success(),
        "{} failed: {}",
        script_path.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let path = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    assert!(path.is_file(), "testbed/tools/{script} printed no binary");
    path
}

/// `helm template` of the chart with `values` (a values file's YAML, or
/// empty for the defaults): the raw text, or helm's error output.
pub fn template_text(values: &str) -> Result<String, String> {
    template_text_with(values, &[])
}

/// The same, as if the cluster also served `api_versions` (helm's
/// `--api-versions`, what `.Capabilities.APIVersions.Has` sees).
pub fn template_text_with(values: &str, api_versions: &[&str]) -> Result<String, String> {
    // One file per call: parallel tests may render the same values, and each
    // removes its file when helm is done.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let file = std::env::temp_dir().join(format!(
        "cascade-guard-values-{}-{call}.yaml",
        std::process::id()
    ));
    std::fs::write(&file, values).expect("values file");
    let out = Command::new(helm())
        .args(["template", RELEASE])
        .arg(chart_dir())
        .args(["--namespace", NAMESPACE, "--values"])
        .arg(&file)
        .args(api_versions.iter().flat_map(|v| ["--api-versions", v]))
        .output()
        .expect("helm runs");
    let _ = std::fs::remove_file(&file);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The objects `helm template` renders with `values`.
pub fn render(values: &str) -> Vec<Value> {
    let text = template_text(values).unwrap_or_else(|e| panic!("helm template failed: {e}"));
    documents(&text)
}

/// The YAML documents of a stream, as JSON, without empty ones.
pub fn documents(text: &str) -> Vec<Value> {
    let mut docs = Vec::new();
    for de in serde_yaml::Deserializer::from_str(text) {
        let value: Value = serde::Deserialize::deserialize(de).expect("rendered YAML");
        if !value.is_null() {
            docs.push(value);
        }
    }
    docs
}

/// The rendered object of `kind` (the first).
pub fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("the chart renders no {kind}"))
}

pub fn has_kind(docs: &[Value], kind: &str) -> bool {
    docs.iter().any(|d| d["kind"] == kind)
}

/// apiVersion, kind, namespace, name: what Helm tracks an object by.
pub type Key = (String, String, Option<String>, String);

pub fn key(doc: &Value) -> Key {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (
        s(&doc["apiVersion"]),
        s(&doc["kind"]),
        doc["metadata"]["namespace"].as_str().map(str::to_string),
        s(&doc["metadata"]["name"]),
    )
}

/// The API for one rendered object, found by discovery as Helm does.
pub async fn api_for(client: &Client, key: &Key) -> Api<DynamicObject> {
    let (api_version, kind, namespace, _) = key;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, caps): (ApiResource, _) = discovery::pinned_kind(client, &gvk)
        .await
        .unwrap_or_else(|e| panic!("cannot discover {api_version} {kind}: {e}"));
    match (caps.scope, namespace) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
        (Scope::Namespaced, None) => Api::namespaced_with(client.clone(), NAMESPACE, &resource),
        (Scope::Cluster, _) => Api::all_with(client.clone(), &resource),
    }
}

/// `helm install` / `helm upgrade`: applies every rendered object (the
/// namespace is created first, as `--create-namespace` does), then deletes
/// what `previous` had and `docs` no longer has.
pub async fn apply(client: &Client, docs: &[Value], previous: &[Value]) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ns = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}});
    namespaces
        .patch(
            NAMESPACE,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&ns),
        )
        .await
        .expect("create the release namespace");
    for doc in docs {
        let k = key(doc);
        let api = api_for(client, &k).await;
        api.patch(
            &k.3,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(doc),
        )
        .await
        .unwrap_or_else(|e| panic!("cannot apply {} {}: {e}", k.1, k.3));
    }
    let now: BTreeSet<Key> = docs.iter().map(key).collect();
    for doc in previous {
        let k = key(doc);
        if !now.contains(&k) {
            delete_object(client, &k).await;
        }
    }
}

/// `helm uninstall`: deletes every object of the release but those marked
/// `helm.sh/resource-policy: keep` (the CascadePolicy CRD).
pub async fn uninstall(client: &Client, docs: &[Value]) {
    for doc in docs {
        if doc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep" {
            continue;
        }
        delete_object(client, &key(doc)).await;
    }
}

async fn delete_object(client: &Client, k: &Key) {
    let api = api_for(client, k).await;
    match api.delete(&k.3, &DeleteParams::background()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => panic!("cannot delete {} {}: {e}", k.1, k.3),
    }
}

/// The identity a pod of the chart's Deployment has: its ServiceAccount's
/// user and the groups the API server gives every service account token.
pub fn service_account_identity(docs: &[Value]) -> (String, Vec<String>) {
    let deployment = find(docs, "Deployment");
    let sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("the Deployment names a ServiceAccount");
    let account = find(docs, "ServiceAccount");
    assert_eq!(
        account["metadata"]["name"], sa,
        "the chart's ServiceAccount"
    );
    let ns = account["metadata"]["namespace"]
        .as_str()
        .expect("the ServiceAccount's namespace");
    (
        format!("system:serviceaccount:{ns}:{sa}"),
        vec![
            "system:serviceaccounts".to_string(),
            format!("system:serviceaccounts:{ns}"),
            "system:authenticated".to_string(),
        ],
    )
}

/// Writes a kubeconfig that acts as the chart's ServiceAccount (no
/// system:masters: only what the chart's RBAC grants).
pub fn write_service_account_kubeconfig(cp: &ControlPlane, docs: &[Value]) -> PathBuf {
    let (user, groups) = service_account_identity(docs);
    let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
    let path = cp.dir().join("chart-service-account.kubeconfig");
    cp.write_kubeconfig_as(&path, &user, &groups)
        .expect("service account kubeconfig");
    path
}

/// The kinds of the chart's RBAC.
const RBAC_KINDS: [&str; 5] = [
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
];

/// cascade-guard's identity as a platform team installs it: the chart's
/// RBAC, rendered by the pinned Helm with `values` and applied, and a
/// kubeconfig at `kubeconfig` that acts as its ServiceAccount (with the
/// groups a token gives it; never `system:masters`). Returns what the chart
/// rendered.
pub async fn install_rbac(
    cp: &ControlPlane,
    client: &Client,
    values: &str,
    kubeconfig: &Path,
) -> Vec<Value> {
    let docs = render(values);
    let rbac: Vec<Value> = docs
        .iter()
        .filter(|d| RBAC_KINDS.iter().any(|k| d["kind"] == *k))
        .cloned()
        .collect();
    apply(client, &rbac, &[]).await;
    let (user, groups) = service_account_identity(&docs);
    assert_eq!(user, crate::CONTROLLER_USER, "the chart's ServiceAccount");
    let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
    cp.write_kubeconfig_as(kubeconfig, &user, &groups)
        .expect("controller kubeconfig");
    docs
}

/// The image of the chart's Deployment's container.
pub fn container_image(docs: &[Value]) -> &str {
    find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .expect("the container names an image")
}

/// One replica of the chart's Deployment, as a process: `binary` (the
/// container image's entrypoint) with the container's args (but
/// --http-address, on a free loopback port), its environment, and the
/// ServiceAccount kubeconfig standing in for the in-cluster token.
pub struct Replica {
    process: Process,
    pub pod_name: String,
}

impl Replica {
    pub fn start(
        cp: &ControlPlane,
        docs: &[Value],
        binary: &Path,
        kubeconfig: &Path,
        pod_name: &str,
    ) -> Self {
        let deployment = find(docs, "Deployment");
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        let mut env = vec![
            format!("POD_NAME={pod_name}"),
            format!(
                "POD_NAMESPACE={}",
                deployment["metadata"]["namespace"]
                    .as_str()
                    .expect("namespace")
            ),
        ];
        for e in container["env"].as_array().into_iter().flatten() {
            if let (Some(name), Some(value)) = (e["name"].as_str(), e["value"].as_str()) {
                env.push(format!("{name}={value}"));
            }
        }
        let mut args = env;
        args.push(binary.display().to_string());
        // No `command` in the container: the runtime runs the image's
        // entrypoint with these args.
        assert!(container["command"].is_null(), "the chart sets a command");
        for a in container["args"].as_array().expect("args") {
            let a = a.as_str().expect("string arg");
            if a.starts_with("--http-address=") {
                args.push("--http-address=127.0.0.1:0".to_string());
            } else {
                args.push(a.to_string());
            }
        }
        args.push(format!("--kubeconfig={}", kubeconfig.display()));
        // Through env(1), which execs the binary in the same process: the
        // environment of the pod, and local-cluster's process handling (it
        // dies with the test process, its log joins the failure output).
        let process = process::spawn(
            pod_name,
            Path::new("/usr/bin/env"),
            &args,
            &cp.log_path(pod_name),
            Lifetime::Owned,
        )
        .unwrap_or_else(|e| panic!("cannot start {pod_name}: {e}"));
        Replica {
            process,
            pod_name: pod_name.to_string(),
        }
    }

    /// SIGTERM, as the kubelet stops a pod: the leader hands the Lease over.
    pub fn stop(&mut self) {
        self.process.stop(Duration::from_secs(10));
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.process.log).unwrap_or_default()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs the cascade-guard CLI as the admin (`status`, `uninstall`), as an
/// operator would from their workstation.
pub fn cli(cp: &ControlPlane, args: &[&str]) -> String {
    let out = Command::new(crate::binary())
        .args(args)
        .arg(format!("--kubeconfig={}", cp.kubeconfig_path().display()))
        .output()
        .expect("cascade-guard runs");
    // `status` reports through its exit code too (3: a kind unguarded or
    // drifted, 4: no controller running); what it printed is still the report.
    let reported = args.first() == Some(&"status") && matches!(out.status.code(), Some(3 | 4));
    assert!(
        out.status.success() || reported,
        "cascade-guard {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
