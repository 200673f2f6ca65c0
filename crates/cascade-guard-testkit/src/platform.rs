//! A Modelplane platform on the real control plane, for the seed scenarios:
//! Modelplane's real XRDs (and the CRDs Crossplane generates for them),
//! Crossplane's Usage CRDs, the model of Crossplane, its Usage webhook and the
//! providers (local_cluster::model), and the real `cascade-guard run`.
//!
//! The deletion policy of the six XR kinds is cluster-wide (an annotation on
//! each XRD), so tests take a [`Gate`] for the modes they need: tests that need
//! the same modes run together, others wait.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use local_cluster::model::composite::Node;
use local_cluster::model::modelplane::{self, SYSTEM_NAMESPACE};
use local_cluster::model::provider::ProviderKind;
use local_cluster::model::{self, Model, ResourceRef, usage};
use local_cluster::process::{self, Lifetime, Process};
use local_cluster::timeline::Timeline;
use local_cluster::{Binaries, ControlPlane, Options, wait};
use serde_json::json;
use tokio::sync::{Notify, OnceCell};

use crate::{DeleteOutcome, DeleteSpec};

pub const POLICY_ANNOTATION: &str = "cascade-guard.dev/deletion-policy";
pub const HOLD_FINALIZER: &str = "cascade-guard.dev/foreground-cascade";
const PROBES: &str = "mode-probes";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Off,
    Refuse,
    Convert,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Off => "Off",
            Mode::Refuse => "Refuse",
            Mode::Convert => "Convert",
        }
    }
}

/// The mode of each XR kind, in `modelplane::xr_kinds()` order.
pub type Modes = [Mode; 6];

pub struct Platform {
    pub cp: ControlPlane,
    pub kubectl: std::path::PathBuf,
    /// Never dropped: it serves every test of the binary.
    _model: Model,
    controller: StdMutex<Option<Process>>,
    starts: StdMutex<usize>,
    gate: GateState,
}

/// The test binary's platform, started on first use.
pub async fn platform() -> &'static Platform {
    static PLATFORM: OnceCell<Platform> = OnceCell::const_new();
    PLATFORM.get_or_init(start).await
}

async fn start() -> Platform {
    local_cluster::testing::init_tracing();
    let mut crds = modelplane::crds().expect("Modelplane and Crossplane CRDs from the fixtures");
    crds.extend(cascade_guard::api::crds());
    let cp = ControlPlane::start(Options {
        crds,
        ..Options::default()
    })
    .await
    .unwrap_or_else(|e| panic!("cannot start the control plane: {e}"));
    let client = cp.admin().await.expect("admin client");
    for ns in [SYSTEM_NAMESPACE, PROBES] {
        create_namespace(&client, ns).await;
    }
    let xrds = crate::xrd_api(&client);
    for mut xrd in modelplane::xrds().expect("XRD fixtures") {
        xrd["metadata"]["annotations"] = json!({ POLICY_ANNOTATION: "Off" });
        crate::create(&xrds, xrd).await;
    }
    for (i, kind) in modelplane::xr_kinds().iter().enumerate() {
        let mut probe = DynamicObject::new("probe", kind).data(json!({
            "spec": modelplane::minimal_spec(kind, "probe")
        }));
        // Something to cascade, so that Refuse refuses it.
        probe.data["spec"]["crossplane"] = json!({"resourceRefs": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "nothing"}]});
        let api = api(&client, kind, namespace_of(i, PROBES));
        api.create(&PostParams::default(), &probe)
            .await
            .unwrap_or_else(|e| panic!("probe {}: {e}", kind.kind));
    }
    let model = Model::start(
        cp.admin_config().await.expect("admin config"),
        model::Options::modelplane(),
    )
    .await
    .unwrap_or_else(|e| panic!("cannot start the model of Crossplane: {e}"));
    // As a platform team installs it: the chart's RBAC, Modelplane's groups
    // protected, never system:masters.
    crate::chart::install_rbac(
        &cp,
        &client,
        "protectedGroups: [modelplane.ai, infrastructure.modelplane.ai]\ncomposedResources:\n  - apiGroups: [helm.model.cascade-guard.dev, kubernetes.model.cascade-guard.dev, eks.model.cascade-guard.dev]\n    resources: [\"*\"]\n",
        &cp.dir().join("cascade-guard.kubeconfig"),
    )
    .await;
    let kubectl = Binaries::locate().expect("binaries").kubectl;
    let platform = Platform {
        cp,
        kubectl,
        _model: model,
        controller: StdMutex::new(None),
        starts: StdMutex::new(0),
        gate: GateState::default(),
    };
    platform.start_controller();
    platform
}

/// Where the probe of kind `i` lives: cluster-scoped kinds have none.
fn namespace_of(i: usize, ns: &str) -> Option<&str> {
    match modelplane::xr_kinds()[i].kind.as_str() {
        "InferenceCluster" | "InferenceGateway" => None,
        _ => Some(ns),
    }
}

pub fn api(client: &Client, resource: &ApiResource, ns: Option<&str>) -> Api<DynamicObject> {
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    }
}

pub async fn create_namespace(client: &Client, name: &str) {
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace");
    let _ = Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await;
}

impl Platform {
    /// Starts `cascade-guard run` (a single replica, as CONTROLLER_USER).
    pub fn start_controller(&self) {
        let mut starts = self.starts.lock().expect("starts");
        let n = *starts;
        *starts += 1;
        let args = vec![
            "run".to_string(),
            format!(
                "--kubeconfig={}",
                self.cp.dir().join("cascade-guard.kubeconfig").display()
            ),
            "--xrd-default-mode=Off".to_string(),
            "--resync-seconds=20".to_string(),
            "--http-address=127.0.0.1:0".to_string(),
            "--no-leader-election".to_string(),
            format!("--leader-election-namespace={}", crate::CONTROLLER_HOME),
            // The gate on unordered deletes is the product's default, shown
            // by its own tests; these show the teardowns themselves.
            "--unordered-deletes=allow".to_string(),
        ];
        let process = process::spawn(
            &format!("cascade-guard-{n}"),
            &crate::binary(),
            &args,
            &self.cp.log_path(&format!("cascade-guard-{n}")),
            Lifetime::Owned,
        )
        .unwrap_or_else(|e| panic!("cannot start cascade-guard: {e}"));
        *self.controller.lock().expect("controller") = Some(process);
    }

    /// SIGTERM: a clean shutdown.
    pub fn stop_controller(&self) {
        if let Some(mut p) = self.controller.lock().expect("controller").take() {
            p.stop(Duration::from_secs(10));
        }
    }

    /// SIGKILL, as the OOM killer or a node failure would.
    pub fn kill_controller(&self) {
        if let Some(mut p) = self.controller.lock().expect("controller").take() {
            p.kill();
        }
    }

    pub fn controller_running(&self) -> bool {
        self.controller
            .lock()
            .expect("controller")
            .as_mut()
            .is_some_and(|p| p.is_running())
    }

    pub async fn admin(&self) -> Client {
        self.cp.admin().await.expect("admin client")
    }

    /// Waits for every test running under other modes to finish, then sets
    /// `modes` (if they are not already in effect) and waits until the API
    /// server and cascade-guard act on them.
    pub async fn enter(&'static self, modes: Modes) -> GateGuard {
        loop {
            let notified = self.gate.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let switch = {
                let mut st = self.gate.state.lock().expect("gate");
                if st.active > 0 && st.modes == Some(modes) && st.ready {
                    st.active += 1;
                    return GateGuard(self);
                }
                if st.active == 0 {
                    st.active = 1;
                    let switch = st.modes != Some(modes);
                    st.modes = Some(modes);
                    st.ready = false;
                    Some(switch)
                } else {
                    None
                }
            };
            if let Some(switch) = switch {
                if !self.controller_running() {
                    self.start_controller();
                }
                if switch {
                    self.apply(modes).await;
                }
                if modes == [Mode::Off; 6] {
                    // Without cascade-guard: no policies, and no controller.
                    self.wait_no_policies().await;
                    self.stop_controller();
                }
                self.gate.state.lock().expect("gate").ready = true;
                self.gate.changed.notify_waiters();
                return GateGuard(self);
            }
            notified.await;
        }
    }

    async fn apply(&self, modes: Modes) {
        let client = self.admin().await;
        let xrds = crate::xrd_api(&client);
        for (kind, mode) in modelplane::xr_kinds().iter().zip(modes) {
            let name = format!("{}.{}", kind.plural, kind.group);
            xrds.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {POLICY_ANNOTATION: mode.as_str()}}}),
                ),
            )
            .await
            .unwrap_or_else(|e| panic!("annotate {name}: {e}"));
        }
        for (i, (kind, mode)) in modelplane::xr_kinds().iter().zip(modes).enumerate() {
            let ns = namespace_of(i, PROBES);
            let probes = api(&client, kind, ns);
            let effective = wait::until(Duration::from_secs(60), || async {
                let probe = probes.get("probe").await.ok()?;
                let held = probe.finalizers().iter().any(|f| f == HOLD_FINALIZER);
                let got = delete(
                    &client,
                    kind,
                    ns,
                    "probe",
                    &DeleteSpec::dry_run_background(),
                )
                .await;
                let ok = match mode {
                    Mode::Off => got.allowed() && !held,
                    Mode::Refuse => got.code == 403,
                    Mode::Convert => got.allowed() && held,
                };
                ok.then_some(())
            })
            .await;
            assert!(
                effective.is_some(),
                "{} never became {}; logs:\n{}",
                kind.kind,
                mode.as_str(),
                self.cp.log_tails(40)
            );
        }
    }

    /// Waits until cascade-guard has removed every admission policy it made.
    async fn wait_no_policies(&self) {
        use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
        let client = self.admin().await;
        let policies: Api<ValidatingAdmissionPolicy> = Api::all(client);
        let selector =
            kube::api::ListParams::default().labels("app.kubernetes.io/managed-by=cascade-guard");
        let none = wait::until(Duration::from_secs(30), || async {
            policies
                .list(&selector)
                .await
                .ok()
                .filter(|l| l.items.is_empty())
                .map(|_| ())
        })
        .await;
        assert!(none.is_some(), "cascade-guard's policies are still there");
    }

    /// Runs the built kubectl as the admin.
    pub async fn kubectl(&self, args: &[&str]) -> std::process::Output {
        tokio::process::Command::new(&self.kubectl)
            .args(args)
            .env("KUBECONFIG", self.cp.kubeconfig_path())
            .output()
            .await
            .expect("kubectl runs")
    }
}

#[derive(Default)]
struct GateState {
    state: StdMutex<Gate>,
    changed: Notify,
}

#[derive(Default)]
struct Gate {
    modes: Option<Modes>,
    active: usize,
    ready: bool,
}

/// Held while a test runs under its modes.
pub struct GateGuard(&'static Platform);

impl Drop for GateGuard {
    fn drop(&mut self) {
        if let Ok(mut st) = self.0.gate.state.lock() {
            st.active = st.active.saturating_sub(1);
        }
        self.0.gate.changed.notify_waiters();
    }
}

/// A DELETE with exactly these options, of a namespaced (`ns`) or
/// cluster-scoped object.
pub async fn delete(
    client: &Client,
    resource: &ApiResource,
    ns: Option<&str>,
    name: &str,
    spec: &DeleteSpec,
) -> DeleteOutcome {
    let path = match ns {
        Some(ns) => format!(
            "/apis/{}/namespaces/{ns}/{}/{name}",
            resource.api_version, resource.plural
        ),
        None => format!("/apis/{}/{}/{name}", resource.api_version, resource.plural),
    };
    let body = serde_json::to_vec(&spec.body()).expect("body");
    let request = http::Request::delete(path)
        .header("Content-Type", "application/json")
        .body(kube::client::Body::from(body))
        .expect("request");
    crate::send(client, request).await
}

/// Every kind the scenarios' trees are made of.
fn watched_kinds() -> Vec<ApiResource> {
    let mut kinds = modelplane::xr_kinds().to_vec();
    kinds.extend([usage::usages(), usage::cluster_usages()]);
    kinds.extend(ProviderKind::all().into_iter().map(|p| p.resource));
    kinds
}

/// A timeline of every object of those kinds, everywhere.
pub async fn timeline(client: &Client) -> Timeline {
    let resources: Vec<(ApiResource, Option<String>)> =
        watched_kinds().into_iter().map(|k| (k, None)).collect();
    Timeline::start(client, &resources)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// What a run created and what needs what.
#[derive(Default)]
pub struct Run {
    /// (kind, namespace, name) of every object of the run's trees.
    pub objects: BTreeSet<(String, Option<String>, String)>,
    /// (needer kind, needer name) needs (target kind, target name).
    pub needs: Vec<((String, String), (String, String))>,
    pub resources: BTreeMap<String, ApiResource>,
}

impl Run {
    pub fn add(&mut self, tree: &Node) {
        for node in tree.walk() {
            self.objects.insert((
                node.resource.kind.clone(),
                node.namespace.clone(),
                node.name.clone(),
            ));
            self.resources
                .insert(node.resource.kind.clone(), node.resource.clone());
            if let Some(target) = node
                .body
                .pointer("/spec/model/target")
                .and_then(|t| serde_json::from_value::<ResourceRef>(t.clone()).ok())
            {
                self.needs.push((
                    (node.resource.kind.clone(), node.name.clone()),
                    (target.kind, target.name),
                ));
            }
        }
    }

    /// Also watch for an object composed later (the replica guard's ClusterUsage).
    pub fn add_object(&mut self, resource: &ApiResource, ns: Option<&str>, name: &str) {
        self.objects.insert((
            resource.kind.clone(),
            ns.map(str::to_string),
            name.to_string(),
        ));
        self.resources
            .insert(resource.kind.clone(), resource.clone());
    }

    /// The timeline's lines about this run's objects.
    pub fn describe(&self, timeline: &Timeline) -> String {
        let names: BTreeSet<(&str, &str)> = self
            .objects
            .iter()
            .map(|(k, _, n)| (k.as_str(), n.as_str()))
            .collect();
        timeline
            .entries()
            .iter()
            .filter(|e| names.contains(&(e.kind.as_str(), e.name.as_str())))
            .map(|e| format!("{:>5} {}/{} {:?}", e.seq, e.kind, e.name, e.change))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Objects of the run not yet gone.
    pub fn left(&self, timeline: &Timeline) -> Vec<String> {
        self.objects
            .iter()
            .filter(|(k, _, n)| timeline.gone(k, n).is_none())
            .map(|(k, _, n)| format!("{k}/{n}"))
            .collect()
    }

    /// Waits until every object of the run has left the API.
    pub async fn wait_all_gone(&self, timeline: &Timeline, timeout: Duration) -> bool {
        wait::until(timeout, || async {
            self.left(timeline).is_empty().then_some(())
        })
        .await
        .is_some()
    }

    /// The invariant: no cluster left the API while anything that needs it
    /// still existed. Every needer must be gone, before its target.
    pub fn assert_order(&self, timeline: &Timeline, context: &str) {
        for ((nk, nn), (tk, tn)) in &self.needs {
            let needer = timeline.gone(nk, nn).unwrap_or_else(|| {
                panic!(
                    "{context}: {nk}/{nn} never left the API\n{}",
                    self.describe(timeline)
                )
            });
            let target = timeline.gone(tk, tn).unwrap_or_else(|| {
                panic!(
                    "{context}: {tk}/{tn} never left the API\n{}",
                    self.describe(timeline)
                )
            });
            assert!(
                needer.seq < target.seq,
                "{context}: {tk}/{tn} left the API (#{}) while {nk}/{nn}, which needs it, still existed (gone #{})\n{}",
                target.seq,
                needer.seq,
                self.describe(timeline)
            );
        }
    }
}

/// Waits until `of` carries the in-use label: the Usage controller has seen
/// its Usage, and the webhook guards its deletes.
pub async fn wait_in_use(client: &Client, resource: &ApiResource, ns: Option<&str>, name: &str) {
    let objects = api(client, resource, ns);
    let labelled = wait::until(Duration::from_secs(30), || async {
        let o = objects.get(name).await.ok()?;
        (o.labels().get(usage::IN_USE_LABEL).map(String::as_str) == Some("true")).then_some(())
    })
    .await;
    assert!(
        labelled.is_some(),
        "{} {name} never became in use",
        resource.kind
    );
}
