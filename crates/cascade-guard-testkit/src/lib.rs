//! What cascade-guard's integration tests share (a dev-dependency, never
//! published): one real control plane per test binary, with Crossplane's XRD
//! CRD, cascade-guard's CascadePolicy CRD and the test kinds installed before
//! the garbage collector starts, and the real `cascade-guard run` process
//! against it (here); the platform on real Crossplane (`platform`), trees and
//! their timelines (`tree`), the invariant over every edge (`invariant`), the
//! chart and the image (`chart`, `image`), the API server's audit log checked
//! before it is read (`audit_log`), and a seeded random source whose seed every
//! failure prints (`rng`).

use std::path::PathBuf;
use std::time::Duration;

use cascade_guard::api::CascadePolicy;
use cascade_guard::policy::{DeleteRequest, ObjectState, Propagation};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, PostParams};
use kube::{Api, Client, CustomResourceExt};
use local_cluster::process::{self, Lifetime, Process};
use local_cluster::{ControlPlane, Options, crossplane, wait};
use serde_json::{Value, json};
use tokio::sync::OnceCell;

pub mod audit_log;
pub mod chart;
pub mod image;
pub mod invariant;
pub mod no_cluster;
pub mod picture;
pub mod platform;
pub mod rng;
pub mod tab;
pub mod tree;

/// The `cascade-guard` binary the running test was built with. Cargo builds
/// a package's binaries for its integration tests, beside the directory of
/// the test executables (`target/<profile>/deps/`); the path it compiles
/// into a test (`CARGO_BIN_EXE_cascade-guard`) is not given to a library, so
/// it is found from the test's own path.
pub fn binary() -> PathBuf {
    let test = std::env::current_exe().expect("the running test's path");
    let deps = test.parent().expect("a test executable is in a directory");
    let profile = if deps.ends_with("deps") {
        deps.parent().unwrap_or(deps)
    } else {
        deps
    };
    let binary = profile.join(format!("cascade-guard{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.is_file(),
        "no cascade-guard binary at {} (beside the test {}): run the tests through cargo test -p cascade-guard, which builds it",
        binary.display(),
        test.display()
    );
    binary
}

pub const GROUP: &str = "table.cascade-guard.dev";
/// A finalizer no controller handles: tests remove it to let an object go.
pub const HOLD: &str = "table.cascade-guard.dev/hold";

/// A test XR kind: its XRD (with the deletion-policy annotation, if any).
pub struct TestKind {
    pub kind: &'static str,
    pub plural: &'static str,
    pub annotation: Option<&'static str>,
}

pub const REFUSE: TestKind = TestKind {
    kind: "RefuseComposite",
    plural: "refusecomposites",
    annotation: Some("Refuse"),
};
pub const WARN: TestKind = TestKind {
    kind: "WarnComposite",
    plural: "warncomposites",
    annotation: Some("Warn"),
};
pub const OFF: TestKind = TestKind {
    kind: "OffComposite",
    plural: "offcomposites",
    annotation: Some("Off"),
};
/// No annotation: the controller's default mode (Refuse) applies.
pub const DEFAULTED: TestKind = TestKind {
    kind: "DefaultComposite",
    plural: "defaultcomposites",
    annotation: None,
};
/// An annotation value that tries to break out of generated CEL.
pub const HOSTILE: TestKind = TestKind {
    kind: "HostileComposite",
    plural: "hostilecomposites",
    annotation: Some("Off' || true || '\"\\"),
};
/// Its annotation is changed by a test.
pub const TOGGLED: TestKind = TestKind {
    kind: "ToggledComposite",
    plural: "toggledcomposites",
    annotation: Some("Refuse"),
};

pub const CONVERT: TestKind = TestKind {
    kind: "ConvertComposite",
    plural: "convertcomposites",
    annotation: Some("Convert"),
};
/// Convert, until a test changes its annotation.
pub const CONVERT_TOGGLED: TestKind = TestKind {
    kind: "ConvertToggled",
    plural: "converttoggleds",
    annotation: Some("Convert"),
};

/// Convert; a test deletes its XRD and then its CRD.
pub const DOOMED: TestKind = TestKind {
    kind: "DoomedComposite",
    plural: "doomedcomposites",
    annotation: Some("Convert"),
};
/// Off by its XRD; made Convert for some labels by a test's CascadePolicy.
pub const SELECTED: TestKind = TestKind {
    kind: "SelectedComposite",
    plural: "selectedcomposites",
    annotation: Some("Off"),
};

pub const XR_KINDS: [&TestKind; 10] = [
    &REFUSE,
    &WARN,
    &OFF,
    &DEFAULTED,
    &HOSTILE,
    &TOGGLED,
    &CONVERT,
    &CONVERT_TOGGLED,
    &DOOMED,
    &SELECTED,
];

/// The identity cascade-guard runs as in tests, as its ServiceAccount would.
pub const CONTROLLER_USER: &str = "system:serviceaccount:cascade-guard-system:cascade-guard";

impl TestKind {
    pub fn resource(&self) -> ApiResource {
        ApiResource {
            group: GROUP.into(),
            version: "v1".into(),
            api_version: format!("{GROUP}/v1"),
            kind: self.kind.into(),
            plural: self.plural.into(),
        }
    }

    pub fn xrd_name(&self) -> String {
        format!("{}.{GROUP}", self.plural)
    }

    pub fn xrd(&self) -> Value {
        xrd(self.kind, self.plural, self.annotation)
    }
}

pub fn xrd(kind: &str, plural: &str, annotation: Option<&str>) -> Value {
    let mut xrd = json!({
        "apiVersion": "apiextensions.crossplane.io/v2",
        "kind": "CompositeResourceDefinition",
        "metadata": {"name": format!("{plural}.{GROUP}")},
        "spec": {
            "group": GROUP,
            "names": {"kind": kind, "plural": plural},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "referenceable": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "string"}}}
                }}}
            }]
        }
    });
    if let Some(a) = annotation {
        xrd["metadata"]["annotations"] = json!({"cascade-guard.dev/deletion-policy": a});
    }
    xrd
}

/// A kind that is not an XR, protected through CascadePolicies.
pub fn leaves() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: "v1".into(),
        api_version: format!("{GROUP}/v1"),
        kind: "Leaf".into(),
        plural: "leaves".into(),
    }
}

fn leaf_crd() -> CustomResourceDefinition {
    schemaless_crd("Leaf", "leaves", "leaf")
}

/// A namespaced kind of [`GROUP`] that keeps whatever it is given.
pub fn schemaless_crd(kind: &str, plural: &str, singular: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{GROUP}")},
        "spec": {
            "group": GROUP,
            "names": {"kind": kind, "plural": plural, "singular": singular, "listKind": format!("{kind}List")},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }))
    .expect("CRD")
}

pub fn cascade_policy(name: &str, kind: &str, mode: &str, selector: Option<Value>) -> Value {
    let mut p = json!({
        "apiVersion": "cascade-guard.dev/v1alpha1",
        "kind": "CascadePolicy",
        "metadata": {"name": name},
        "spec": {"group": GROUP, "kind": kind, "mode": mode}
    });
    if let Some(s) = selector {
        p["spec"]["selector"] = s;
    }
    p
}

/// The CascadePolicies every test binary starts with.
fn initial_cascade_policies() -> Vec<Value> {
    vec![
        cascade_policy("leaves", "Leaf", "Refuse", None),
        // Names a kind that does not exist.
        cascade_policy("ghost", "Ghost", "Refuse", None),
        // A second policy for Leaf.
        cascade_policy("leaves-warn", "Leaf", "Warn", None),
        // A label value that tries to break out of CEL (and is not a valid label value).
        cascade_policy(
            "hostile-selector",
            "Leaf",
            "Refuse",
            Some(json!({"matchLabels": {"tier": "x' || true || '"}})),
        ),
    ]
}

/// An XRD with no versions: Crossplane would reject it; cascade-guard must
/// still protect the kind it names.
pub const NO_VERSIONS_XRD: &str = "emptycomposites.table.cascade-guard.dev";

/// The control plane every test binary starts: Crossplane's XRD CRD, the
/// CascadePolicy CRD, the Leaf kind and the XR kinds.
pub fn options() -> Options {
    let mut crds = vec![
        crossplane::crossplane_crd(crossplane::XRD_CRD).expect("Crossplane XRD CRD fixture"),
        leaf_crd(),
    ];
    crds.extend(cascade_guard::api::crds());
    for k in XR_KINDS {
        crds.push(crossplane::xrd_to_crd(&k.xrd()).expect("XRD to CRD"));
    }
    Options {
        crds,
        ..Options::default()
    }
}

pub struct Env {
    pub cp: ControlPlane,
    controllers: std::sync::Mutex<Vec<Process>>,
}

/// The test binary's control plane with cascade-guard running against it and
/// every initial policy in effect.
pub async fn env() -> &'static Env {
    static ENV: OnceCell<Env> = OnceCell::const_new();
    ENV.get_or_init(|| async {
        let env = bare().await;
        env.start_controller(&[]);
        let client = env.cp.admin().await.expect("admin client");
        env.wait_for_protection(&client, &REFUSE.resource()).await;
        env.wait_for_protection(&client, &leaves()).await;
        env
    })
    .await
}

/// The same, with no cascade-guard running: the test starts and stops it.
/// A test binary uses either this or [`env`], never both.
pub async fn bare_env() -> &'static Env {
    static ENV: OnceCell<Env> = OnceCell::const_new();
    ENV.get_or_init(bare).await
}

async fn bare() -> Env {
    bare_with(options()).await
}

/// A control plane of the caller's own (not shared), with the XR kinds' XRDs
/// (and, when `options` installs their CRD, the initial CascadePolicies), and
/// no cascade-guard running. For tests that restart a component or change what
/// is installed.
pub async fn bare_with(options: Options) -> Env {
    local_cluster::testing::init_tracing();
    let with_policies = options
        .crds
        .iter()
        .any(|c| c.metadata.name == CascadePolicy::crd().metadata.name);
    let cp = ControlPlane::start(options)
        .await
        .unwrap_or_else(|e| panic!("cannot start the control plane: {e}"));
    let client = cp.admin().await.expect("admin client");
    let xrds = xrd_api(&client);
    for k in XR_KINDS {
        create(&xrds, k.xrd()).await;
    }
    let mut empty = xrd("EmptyComposite", "emptycomposites", Some("Refuse"));
    empty["spec"]["versions"] = json!([]);
    create(&xrds, empty).await;
    if with_policies {
        let policies = cascade_policy_api(&client);
        for p in initial_cascade_policies() {
            create(&policies, p).await;
        }
    }
    // As a platform team installs it: the chart's RBAC, the test kinds'
    // group protected, never system:masters.
    let kubeconfig = cp.dir().join("cascade-guard.kubeconfig");
    chart::install_rbac(&cp, &client, &chart_values(), &kubeconfig).await;
    Env {
        cp,
        controllers: std::sync::Mutex::new(Vec::new()),
    }
}

impl Env {
    /// Starts `cascade-guard run` (as [`CONTROLLER_USER`]) with `extra` flags;
    /// returns its index for [`Env::kill_controller`].
    pub fn start_controller(&self, extra: &[&str]) -> usize {
        let binary = binary();
        let mut args = vec!["run".to_string(), "--xrd-default-mode=Refuse".to_string()];
        // Another identity's when the test names one (the static writer's).
        if !extra.iter().any(|a| a.starts_with("--kubeconfig")) {
            args.push(format!(
                "--kubeconfig={}",
                self.cp.dir().join("cascade-guard.kubeconfig").display()
            ));
        }
        // Where the chart's Roles let it keep its Lease and ConfigMaps.
        if !extra
            .iter()
            .any(|a| a.starts_with("--leader-election-namespace"))
        {
            args.push(format!("--leader-election-namespace={CONTROLLER_HOME}"));
        }
        if !extra.iter().any(|a| a.starts_with("--resync-seconds")) {
            args.push("--resync-seconds=20".to_string());
        }
        if !extra.iter().any(|a| a.starts_with("--http-address")) {
            args.push("--http-address=127.0.0.1:0".to_string());
        }
        // The gate that refuses the delete of a root whose tree the
        // controller has not ordered yet (the product's default) is left to
        // the tests that ask for it (`--unordered-deletes=refuse`): the
        // others delete trees they just made, before a look may have read
        // them, to show other things.
        if !extra.iter().any(|a| a.starts_with("--unordered-deletes")) {
            args.push("--unordered-deletes=allow".to_string());
        }
        args.extend(extra.iter().map(|a| a.to_string()));
        let mut controllers = self.controllers.lock().expect("controllers");
        let n = controllers.len();
        let process = process::spawn(
            &format!("cascade-guard-{n}"),
            &binary,
            &args,
            &self.cp.log_path(&format!("cascade-guard-{n}")),
            Lifetime::Owned,
        )
        .unwrap_or_else(|e| panic!("cannot start cascade-guard: {e}"));
        controllers.push(process);
        n
    }

    /// SIGKILL, no clean-up.
    pub fn kill_controller(&self, n: usize) {
        if let Some(p) = self.controllers.lock().expect("controllers").get_mut(n) {
            p.kill();
        }
    }

    /// SIGTERM: a clean shutdown.
    pub fn stop_controller(&self, n: usize) {
        if let Some(p) = self.controllers.lock().expect("controllers").get_mut(n) {
            p.stop(Duration::from_secs(10));
        }
    }

    /// Stops every controller when dropped, however the test ends, so that a
    /// failed test leaves none running into the next.
    pub fn controllers_stop_on_drop(&self) -> StopControllers<'_> {
        StopControllers(self)
    }

    /// The process id of controller `n`, while it runs.
    pub fn controller_pid(&self, n: usize) -> Option<u32> {
        let mut controllers = self.controllers.lock().expect("controllers");
        let p = controllers.get_mut(n)?;
        p.is_running().then_some(p.pid)
    }

    pub fn any_controller_running(&self) -> bool {
        self.controllers
            .lock()
            .expect("controllers")
            .iter_mut()
            .any(|p| p.is_running())
    }

    pub fn controller_running(&self, n: usize) -> bool {
        self.controllers
            .lock()
            .expect("controllers")
            .get_mut(n)
            .is_some_and(|p| p.is_running())
    }

    /// Waits until a Background delete of an object of `resource` with
    /// something to cascade is refused (dry run, in a scratch namespace).
    pub async fn wait_for_protection(&self, client: &Client, resource: &ApiResource) {
        let ns = "protection-probe";
        let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace"),
            )
            .await;
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, resource);
        let name = format!("probe-{}", resource.plural);
        let _ = api
            .create(&PostParams::default(), &composite(resource, &name, true))
            .await;
        let refused = wait::until(Duration::from_secs(60), || async {
            let outcome = delete(
                client,
                resource,
                ns,
                &name,
                &DeleteSpec::dry_run_background(),
            )
            .await;
            (outcome.code == 403).then_some(())
        })
        .await;
        assert!(
            refused.is_some(),
            "{} never became protected; logs:\n{}",
            resource.plural,
            self.cp.log_tails(40)
        );
    }
}

pub struct StopControllers<'a>(&'a Env);

impl Drop for StopControllers<'_> {
    fn drop(&mut self) {
        if let Ok(mut controllers) = self.0.controllers.lock() {
            for p in controllers.iter_mut() {
                p.kill();
            }
        }
    }
}

/// The kinds a shared admission object says it carries (`Kind.group` to
/// where its policy comes from: `source`, `modeFrom`).
pub fn carried_kinds<K: kube::ResourceExt>(
    object: &K,
) -> std::collections::BTreeMap<String, Value> {
    object
        .annotations()
        .get(cascade_guard::policy::names::PROTECTED_KINDS_ANNOTATION)
        .and_then(|a| serde_json::from_str(a).ok())
        .unwrap_or_default()
}

/// `Kind.group` of a test kind, as admission objects name it.
pub fn kind_key(kind: &TestKind) -> String {
    format!("{}.{GROUP}", kind.kind)
}

/// How many Foreground DELETEs of one object `user` sent, from the API
/// server's audit log.
pub fn foreground_deletes(
    cp: &ControlPlane,
    plural: &str,
    namespace: &str,
    name: &str,
    user: &str,
) -> usize {
    local_cluster::audit::read(&cp.audit_log_path())
        .expect("the API server's audit log")
        .iter()
        .filter(|e| {
            e.verb == "delete"
                && e.is_about(plural, namespace, name)
                && e.effective_username() == user
                && e.propagation_policy() == Some("Foreground")
        })
        .count()
}

pub fn xrd_api(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &local_cluster::crossplane::xrd_resource())
}

pub fn cascade_policy_api(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &ApiResource::erase::<CascadePolicy>(&()))
}

/// Takes [`HOLD`] off the object and nothing else (a merge patch of the
/// finalizers as read, guarded by the resourceVersion; retried on conflict).
pub async fn release_hold(api: &Api<DynamicObject>, name: &str) {
    for _ in 0..20 {
        let object = api.get(name).await.expect("get");
        let rest: Vec<&String> = object
            .metadata
            .finalizers
            .iter()
            .flatten()
            .filter(|f| *f != HOLD)
            .collect();
        let patch = json!({"metadata": {"finalizers": rest,
            "resourceVersion": object.metadata.resource_version}});
        match api
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => panic!("cannot release {name}: {e}"),
        }
    }
    panic!("cannot release {name}: conflicts");
}

/// A CascadePolicy's Ready condition: (status, reason, message).
pub async fn ready_condition(client: &Client, policy: &str) -> Option<(String, String, String)> {
    let p = cascade_policy_api(client).get(policy).await.ok()?;
    let conditions = p.data["status"]["conditions"].as_array()?.clone();
    let ready = conditions.iter().find(|c| c["type"] == "Ready")?;
    Some((
        ready["status"].as_str()?.to_string(),
        ready["reason"].as_str()?.to_string(),
        ready["message"].as_str()?.to_string(),
    ))
}

pub async fn create(api: &Api<DynamicObject>, value: Value) -> DynamicObject {
    let object: DynamicObject = serde_json::from_value(value).expect("object");
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("cannot create {:?}: {e}", object.metadata.name))
}

/// An object of `resource`; XR-shaped kinds get one composed resource in
/// `spec.crossplane.resourceRefs` when `composed`.
pub fn composite(resource: &ApiResource, name: &str, composed: bool) -> DynamicObject {
    let spec = if composed {
        json!({"crossplane": {"resourceRefs": [{"apiVersion": "v1", "kind": "ConfigMap", "name": format!("{name}-composed")}]}})
    } else {
        json!({})
    };
    DynamicObject::new(name, resource).data(json!({ "spec": spec }))
}

/// The DeleteOptions of one request, as sent on the wire.
#[derive(Clone, Debug, Default)]
pub struct DeleteSpec {
    pub propagation: Option<&'static str>,
    pub orphan_dependents: Option<bool>,
    pub uid: Option<String>,
    pub dry_run: bool,
}

impl DeleteSpec {
    /// Only a propagationPolicy.
    pub fn propagation(policy: &'static str) -> Self {
        Self {
            propagation: Some(policy),
            ..Self::default()
        }
    }

    pub fn dry_run_background() -> Self {
        Self {
            dry_run: true,
            ..Self::propagation("Background")
        }
    }

    /// The same delete as the decision table sees it, sent by `username`
    /// for an object in `object`'s state.
    pub fn as_request(&self, username: &str, object: ObjectState) -> DeleteRequest {
        DeleteRequest {
            propagation: self.propagation.map(|p| match p {
                "Foreground" => Propagation::Foreground,
                "Background" => Propagation::Background,
                _ => Propagation::Orphan,
            }),
            orphan_dependents: self.orphan_dependents,
            username: username.to_string(),
            uid_precondition: self.uid.as_deref().is_some_and(|u| !u.is_empty()),
            object,
        }
    }

    pub fn body(&self) -> Value {
        let mut body = json!({"kind": "DeleteOptions", "apiVersion": "v1"});
        if let Some(p) = self.propagation {
            body["propagationPolicy"] = json!(p);
        }
        if let Some(o) = self.orphan_dependents {
            body["orphanDependents"] = json!(o);
        }
        if let Some(uid) = &self.uid {
            body["preconditions"] = json!({ "uid": uid });
        }
        if self.dry_run {
            body["dryRun"] = json!(["All"]);
        }
        body
    }
}

/// What the API server answered.
#[derive(Clone, Debug)]
pub struct DeleteOutcome {
    pub code: u16,
    pub message: String,
    /// `Warning` response headers (what kubectl prints as "Warning: ...").
    pub warnings: Vec<String>,
}

impl DeleteOutcome {
    pub fn allowed(&self) -> bool {
        (200..300).contains(&self.code)
    }
}

/// A DELETE with exactly these options (kube's DeleteParams cannot send
/// orphanDependents), keeping the status, message and warnings.
pub async fn delete(
    client: &Client,
    resource: &ApiResource,
    namespace: &str,
    name: &str,
    spec: &DeleteSpec,
) -> DeleteOutcome {
    let path = format!(
        "/apis/{}/namespaces/{namespace}/{}/{name}",
        resource.api_version, resource.plural
    );
    send_delete(client, &path, spec).await
}

/// A DeleteCollection of `resource` in `namespace` with these options.
pub async fn delete_collection(
    client: &Client,
    resource: &ApiResource,
    namespace: &str,
    spec: &DeleteSpec,
) -> DeleteOutcome {
    let path = format!(
        "/apis/{}/namespaces/{namespace}/{}",
        resource.api_version, resource.plural
    );
    send_delete(client, &path, spec).await
}

async fn send_delete(client: &Client, path: &str, spec: &DeleteSpec) -> DeleteOutcome {
    let body = serde_json::to_vec(&spec.body()).expect("body");
    let request = http::Request::delete(path)
        .header("Content-Type", "application/json")
        .body(kube::client::Body::from(body))
        .expect("request");
    send(client, request).await
}

/// A JSON merge patch of an object of `resource` (cluster-scoped when
/// `namespace` is empty), a dry run unless `real`, keeping the status,
/// message and warnings (as for deletes).
pub async fn merge_patch(
    client: &Client,
    resource: &ApiResource,
    namespace: &str,
    name: &str,
    patch: &Value,
    real: bool,
) -> DeleteOutcome {
    // An empty namespace: a cluster-scoped object.
    let mut path = if namespace.is_empty() {
        format!("/apis/{}/{}/{name}", resource.api_version, resource.plural)
    } else {
        format!(
            "/apis/{}/namespaces/{namespace}/{}/{name}",
            resource.api_version, resource.plural
        )
    };
    if !real {
        path.push_str("?dryRun=All");
    }
    let request = http::Request::patch(path)
        .header("Content-Type", "application/merge-patch+json")
        .body(kube::client::Body::from(
            serde_json::to_vec(patch).expect("patch"),
        ))
        .expect("request");
    send(client, request).await
}

/// Sends `request` (a delete or a patch): the API server's answer.
pub(crate) async fn send(
    client: &Client,
    request: http::Request<kube::client::Body>,
) -> DeleteOutcome {
    let response = client.send(request).await.expect("the API server answered");
    let code = response.status().as_u16();
    let warnings = response
        .headers()
        .get_all("warning")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect();
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let message = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or_default();
    DeleteOutcome {
        code,
        message,
        warnings,
    }
}

/// A loopback port free right now (for a controller's --http-address).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// The status code and body of a plain HTTP GET on loopback (blocking, and
/// short: the controller's own server answers at once).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())?;
    Some((code, body))
}

/// The controller's /metrics (empty when it does not answer).
pub fn metrics(port: u16) -> String {
    http_get(port, "/metrics")
        .map(|(_, body)| body)
        .unwrap_or_default()
}

/// The value of the counter `name` (without `_total`) in the /metrics of
/// the controller on `port`, when it answers.
fn counter(port: u16, name: &str) -> Option<u64> {
    let line = format!("{name}_total ");
    metrics(port)
        .lines()
        .find_map(|l| l.strip_prefix(line.as_str())?.trim().parse().ok())
}

/// Waits until the controller serving /metrics on `port` has completed a
/// sync pass that started after this call: one that read the cluster as it
/// is now. `client` wakes the controller (a label on an XRD it watches, which
/// changes no policy), so that the pass runs now rather than at the next
/// resync. A check that something did not happen runs after this.
pub async fn wait_for_sync_pass(client: &Client, port: u16) {
    let started = counter(port, "cascade_guard_sync_passes_started")
        .unwrap_or_else(|| panic!("no sync pass counter on port {port}:\n{}", metrics(port)));
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    xrd_api(client)
        .patch(
            NO_VERSIONS_XRD,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {
                "test.cascade-guard.dev/wake": stamp.to_string()}}})),
        )
        .await
        .unwrap_or_else(|e| panic!("cannot wake the controller: {e}"));
    let done = wait::until(Duration::from_secs(60), || async {
        counter(port, "cascade_guard_sync_passes")
            .filter(|&completed| completed > started)
            .map(|_| ())
    })
    .await;
    assert!(
        done.is_some(),
        "no sync pass started after pass {started} completed within 60 s:\n{}",
        metrics(port)
    );
}

/// The reason and note of every Event (events.k8s.io) regarding an object named `name`.
pub async fn events_about(client: &Client, name: &str) -> Vec<(String, String)> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    // A connection the API server closed under load (hyper's
    // IncompleteMessage, seen in CI's recovery test) is asked again; an
    // error that lasts fails the test rather than read as no Events.
    let mut tries = 0;
    let listed = loop {
        match events.list(&kube::api::ListParams::default()).await {
            Ok(listed) => break listed,
            Err(e) if tries < 5 => {
                tries += 1;
                eprintln!("events: {e}; asking again ({tries} of 5)");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(e) => panic!("events: {e}"),
        }
    };
    listed
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// Where a controller these tests start keeps its Lease and sibling order's
/// ConfigMaps: the chart's release namespace, where its Roles let it.
pub const CONTROLLER_HOME: &str = chart::NAMESPACE;

/// The chart's values for the test kinds: their group protected.
pub fn chart_values() -> String {
    format!("protectedGroups: [{GROUP}]\n")
}

/// Whether sibling order holds the object of `resource` named `name` (in
/// `ns`) now: an entry in its record in `home`.
pub async fn sibling_held(
    client: &Client,
    home: &str,
    resource: &ApiResource,
    ns: Option<&str>,
    name: &str,
) -> bool {
    use cascade_guard::policy::sibling::holds_record::{HOLDS, decode_holds, hold_key};
    use cascade_guard::policy::sibling::object::ObjectRef;
    let Some(key) = hold_key(&ObjectRef::new(&resource.group, &resource.kind, ns, name)) else {
        return false;
    };
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), home)
        .get_opt(HOLDS)
        .await
        .ok()
        .flatten()
        .and_then(|c| c.data)
        .is_some_and(|d| decode_holds(&d).contains_key(&key))
}

/// Waits (up to `within`) until sibling order holds the object and the
/// hold is in force: its entry written, and a dry-run delete of it refused
/// by the hold policy (whose rules name a kind only once it is held, and
/// which the API server loads a moment after it is written); false if it
/// never is.
pub async fn wait_sibling_held(
    client: &Client,
    home: &str,
    resource: &ApiResource,
    ns: Option<&str>,
    name: &str,
    within: Duration,
) -> bool {
    let objects: Api<DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    };
    // Foreground, so that a Refuse kind's own policy, which refuses a
    // plain delete and speaks first, lets it reach the hold policy.
    let dry_run = kube::api::DeleteParams {
        dry_run: true,
        propagation_policy: Some(kube::api::PropagationPolicy::Foreground),
        ..kube::api::DeleteParams::default()
    };
    wait::until(within, || async {
        if !sibling_held(client, home, resource, ns, name).await {
            return None;
        }
        match objects.delete(name, &dry_run).await {
            Err(e) if e.to_string().contains("cascade-guard holds") => Some(()),
            _ => None,
        }
    })
    .await
    .is_some()
}

/// Waits (up to a minute) until the controller whose records are in
/// `home` has ordered the tree of the root `name`: its delete is then not
/// refused by the gate on unordered deletes (the product's default), which
/// refuses a tree the controller has not read yet.
pub async fn wait_ordered(
    client: &Client,
    home: &str,
    resource: &ApiResource,
    ns: Option<&str>,
    name: &str,
) {
    use cascade_guard::policy::sibling::gate::{GateState, ORDERED_TREES, decode_marks};
    let roots: Api<DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    };
    let records: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), home);
    let ordered = wait::until(Duration::from_secs(60), || async {
        let root = roots.get(name).await.ok()?;
        let uid = root.metadata.uid?;
        let data = decode_marks(&records.get_opt(ORDERED_TREES).await.ok()??.data?);
        let state = GateState::of(
            data.get(&uid).map(String::as_str),
            root.metadata.generation.unwrap_or(0),
        );
        (state == GateState::Ordered).then_some(())
    })
    .await;
    assert!(
        ordered.is_some(),
        "the controller never ordered the tree of {} {name}",
        resource.kind
    );
}
