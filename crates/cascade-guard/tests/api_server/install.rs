//! The Helm chart, on the real control plane: rendered by the pinned helm
//! (scripts/test.sh installs it from the Go module proxy), applied to the local
//! API server, and `cascade-guard run` run exactly as its Deployment would,
//! under its ServiceAccount's identity with only the chart's RBAC (no
//! system:masters). There is no kubelet, so the Deployment's pods never run;
//! the replicas here are the binary of the chart's image, pulled from a
//! registry on loopback that scripts/image.sh pushed it to, with the same args
//! and identity.

use cascade_guard_testkit::chart;
use cascade_guard_testkit::image;

use std::time::Duration;

use cascade_guard::policy::names::DEFAULT_CROSSPLANE_USER;
use cascade_guard_testkit::tree::{
    Composing, Provider, assert_foreground, config_maps, create_tree, plain, wait_held,
};
use cascade_guard_testkit::*;
use chart::{Replica, cli, find, has_kind, render};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingWebhookConfiguration,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Api, Client, ResourceExt};
use local_cluster::testing::Scope;
use local_cluster::timeline::Timeline;
use local_cluster::{audit, wait};
use serde_json::{Value, json};

const FINALIZER: &str = "cascade-guard.dev/foreground-cascade";
const MANAGED: &str = "app.kubernetes.io/managed-by=cascade-guard";

/// The values the cluster tests install with: the test kinds' group is
/// protected (Convert), and composed resources (ConfigMaps here) are readable.
/// The chart starts in Warn; these tests install it in Refuse, said here.
const VALUES: &str = r#"
xrdDefaultMode: Refuse
protectedGroups: [table.cascade-guard.dev]
composedResources:
  - apiGroups: [""]
    resources: [configmaps]
"#;

/// The cluster tests install, upgrade and uninstall the same release: one at
/// a time.
static CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn background() -> DeleteSpec {
    DeleteSpec::propagation("Background")
}

/// The committed manifest and CRD file are what the chart and the binary
/// produce now, and the chart says what the issue asks of it.
#[test]
fn the_chart_renders_the_committed_manifest_and_is_locked_down() {
    let crd = std::process::Command::new(env!("CARGO_BIN_EXE_cascade-guard"))
        .arg("crd")
        .output()
        .expect("cascade-guard crd");
    let file = std::fs::read_to_string(chart::chart_dir().join("files/crds.yaml"))
        .expect("the chart's CRD file");
    assert_eq!(
        String::from_utf8_lossy(&crd.stdout),
        file,
        "the chart's CRD differs from `cascade-guard crd`: run scripts/render-manifest.sh"
    );

    let rendered = chart::template_text("").expect("helm template with the defaults");
    let manifest =
        std::fs::read_to_string(chart::manifest_path()).expect("deploy/cascade-guard.yaml");
    assert!(
        manifest.ends_with(&rendered),
        "deploy/cascade-guard.yaml is not the chart's render: run scripts/render-manifest.sh"
    );
    let docs = chart::documents(&manifest);
    assert_eq!(
        find(&docs, "Namespace")["metadata"]["name"],
        chart::NAMESPACE
    );

    let deployment = find(&docs, "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(args[0], "run");
    assert!(args.contains(&"--leader-election-namespace=cascade-guard-system"));
    // A first install breaks nothing: unannotated XRDs start in Warn.
    assert!(args.contains(&"--xrd-default-mode=Warn"));
    // cascade-guard's own user, trusted to remove its finalizer: its ServiceAccount.
    assert!(
        args.contains(
            &"--controller-user=system:serviceaccount:cascade-guard-system:cascade-guard"
        )
    );
    assert!(!args.contains(&"--no-leader-election"));
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert!(container["resources"]["requests"]["memory"].is_string());
    assert_eq!(
        find(&docs, "PodDisruptionBudget")["spec"]["minAvailable"],
        1
    );
    assert_eq!(
        find(&docs, "Service")["spec"]["ports"][0]["targetPort"],
        "http"
    );
    assert_eq!(
        find(&docs, "CustomResourceDefinition")["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    // No chart object carries the label the controller prunes by.
    for d in &docs {
        assert_ne!(
            d["metadata"]["labels"]["app.kubernetes.io/managed-by"], "cascade-guard",
            "{}",
            d["kind"]
        );
    }

    // With the default values: no wildcard verbs, nothing on Secrets, and
    // deletes only of admission policies.
    let role = find(&docs, "ClusterRole");
    for rule in role["rules"].as_array().expect("rules") {
        let verbs = rule["verbs"].as_array().expect("verbs");
        assert!(!verbs.contains(&json!("*")), "{rule}");
        assert!(
            !rule["resources"]
                .as_array()
                .expect("resources")
                .contains(&json!("secrets")),
            "{rule}"
        );
        if verbs.contains(&json!("delete")) {
            assert_eq!(
                rule["apiGroups"],
                json!(["admissionregistration.k8s.io"]),
                "{rule}"
            );
        }
    }

    // One replica: no PodDisruptionBudget (it would block every drain).
    assert!(!has_kind(&render("replicas: 1"), "PodDisruptionBudget"));
    let bad = chart::template_text("xrdDefaultMode: Refused").expect_err("a mode that is not one");
    // values.schema.json refuses it (tests/without_cluster/chart.rs has the other cases).
    assert!(bad.contains("/xrdDefaultMode"), "{bad}");
}

/// The image scripts/image.sh builds is what the chart expects: the chart's
/// values point at it by digest; its entrypoint is a static binary, alone in
/// one layer, naming no host path; it runs as the user of the chart's
/// securityContext; its labels give the version and the source; and the same
/// binary, pushed again, gives the same digest.
#[test]
fn the_image_is_one_static_binary_run_as_the_charts_user() {
    let pushed = image::pushed();
    let reference = pushed.reference();
    let docs = render(&with_image(""));
    assert_eq!(chart::container_image(&docs), reference);
    let pod = &find(&docs, "Deployment")["spec"]["template"]["spec"];

    let config = image::config(&reference);
    assert_eq!(config["os"], "linux");
    assert_eq!(
        config["config"]["User"],
        format!(
            "{}:{}",
            pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]
        )
    );
    assert_eq!(config["config"]["Entrypoint"], json!(["/cascade-guard"]));
    let labels = &config["config"]["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(
        labels["org.opencontainers.image.source"],
        env!("CARGO_PKG_REPOSITORY")
    );

    // One layer, one file: root's, executable by the non-root user, time 0.
    let manifest = image::manifest(&reference);
    let layers = manifest["layers"].as_array().expect("layers");
    assert_eq!(layers.len(), 1, "{manifest}");
    let layer = format!(
        "{}@{}",
        pushed.repository,
        layers[0]["digest"].as_str().expect("the layer's digest")
    );
    let listing = layer_listing(&image::crane_output(&["blob", &layer]));
    let fields: Vec<&str> = listing.split_whitespace().collect();
    assert_eq!(fields.len(), 6, "{listing}");
    assert_eq!(
        [fields[0], fields[1], fields[3], fields[4], fields[5]],
        [
            "-rwxr-xr-x",
            "0/0",
            "1970-01-01",
            "00:00:00",
            "cascade-guard"
        ],
        "{listing}"
    );

    let binary = image::entrypoint_binary(&reference);
    let elf = std::fs::read(&binary).expect("the image's binary");
    assert_eq!(
        image::has_interpreter(&elf),
        Ok(false),
        "the image's binary is not static"
    );
    let checkout = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let checkout = checkout.canonicalize().expect("the checkout");
    let cargo_home = std::env::var("CARGO_HOME")
        .unwrap_or_else(|_| format!("{}/.cargo", std::env::var("HOME").unwrap_or_default()));
    // scripts/test.sh builds outside the checkout (CARGO_TARGET_DIR).
    let target_dir = std::env::var("CARGO_TARGET_DIR")
        .ok()
        .filter(|d| !d.is_empty());
    let host_paths = [checkout.to_string_lossy().into_owned(), cargo_home]
        .into_iter()
        .chain(target_dir);
    for host_path in host_paths {
        assert!(
            !elf.windows(host_path.len())
                .any(|w| w == host_path.as_bytes()),
            "the image's binary names the host path {host_path}"
        );
    }
    let version = std::process::Command::new(&binary)
        .args(["version", "--client"])
        .output()
        .expect("the image's binary runs");
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("cascade-guard {}", env!("CARGO_PKG_VERSION"))
    );

    // Assembled again (a fresh copy of the binary, another time on it, another
    // temporary directory): the same image.
    let again = image::push(&format!("{}:again", pushed.repository));
    assert_eq!(again, reference, "the same binary gave another image");
}

/// `tar -tv` of a gzipped layer, with numeric owners and full UTC times.
fn layer_listing(gzipped_tar: &[u8]) -> String {
    use std::io::Write;
    let mut tar = std::process::Command::new("tar")
        .args(["-tvz", "--numeric-owner", "--full-time", "-f", "-"])
        .env("TZ", "UTC")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("tar runs");
    tar.stdin
        .take()
        .expect("tar's input")
        .write_all(gzipped_tar)
        .expect("the layer to tar");
    let out = tar.wait_with_output().expect("tar's listing");
    assert!(out.status.success(), "the layer is not a gzipped tar");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Installs the chart and starts `replicas` replicas under the chart's
/// ServiceAccount; returns the rendered objects and the replicas.
async fn install(
    env: &Env,
    values: &str,
    replicas: usize,
    name: &str,
) -> (Vec<Value>, Vec<Replica>) {
    let admin = env.cp.admin().await.expect("admin");
    let docs = render(&with_image(values));
    chart::apply(&admin, &docs, &[]).await;
    let kubeconfig = chart::write_service_account_kubeconfig(&env.cp, &docs);
    let binary = image::entrypoint_binary(chart::container_image(&docs));
    let started = (0..replicas)
        .map(|i| Replica::start(&env.cp, &docs, &binary, &kubeconfig, &format!("{name}-{i}")))
        .collect();
    (docs, started)
}

/// Stops the replicas, asserting that none was refused anything by RBAC
/// (its log says "forbidden" for a grant the chart lacks).
fn stop_unrefused(replicas: &mut [Replica]) {
    let log = logs(replicas);
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "a replica was refused something the chart should grant:\n{log}"
    );
    for r in replicas {
        r.stop();
    }
}

/// `values` with the chart's image pointed at this checkout's image, as
/// pushed to the loopback registry (built on first use).
fn with_image(values: &str) -> String {
    format!("{values}\n{}", image::pushed().values())
}

async fn service_account_client(env: &Env, docs: &[Value]) -> Client {
    let (user, groups) = chart::service_account_identity(docs);
    let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
    env.cp
        .client_as(&user, &groups)
        .await
        .expect("service account client")
}

/// The whole log of every replica, for failure messages.
fn logs(replicas: &[Replica]) -> String {
    replicas
        .iter()
        .map(|r| format!("--- {} ---\n{}", r.pod_name, r.log()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn assert_forbidden<T: std::fmt::Debug>(what: &str, result: Result<T, kube::Error>) {
    match result {
        // "cannot": RBAC's words, not an admission policy's refusal.
        Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("cannot") => {}
        other => panic!("{what}: expected RBAC's 403 Forbidden, got {other:?}"),
    }
}

fn ready_condition(object: &DynamicObject) -> Option<(String, String)> {
    let conditions = object.data["status"]["conditions"].as_array()?;
    let ready = conditions.iter().find(|c| c["type"] == "Ready")?;
    Some((
        ready["status"].as_str()?.to_string(),
        ready["reason"].as_str()?.to_string(),
    ))
}

/// The chart's ServiceAccount, with exactly the chart's RBAC, runs both modes
/// (and leader election), and the API server refuses it what the chart does
/// not grant.
#[tokio::test]
async fn cascade_guard_runs_with_exactly_the_charts_rbac() {
    let _one_at_a_time = CLUSTER.lock().await;
    let env = bare_env().await;
    let s = Scope::new(&env.cp, "chart-rbac").await;
    let ns = s.namespace.clone();
    let (docs, mut replicas) = install(env, VALUES, 2, "chart-rbac").await;
    let admin = &s.client;

    // Refuse: the XRD annotation, and the default mode VALUES gives XRDs without one.
    env.wait_for_protection(admin, &REFUSE.resource()).await;
    env.wait_for_protection(admin, &DEFAULTED.resource()).await;
    let refuse = REFUSE.resource();
    let timeline = Timeline::start(
        admin,
        &[
            (refuse.clone(), Some(ns.clone())),
            (CONVERT.resource(), Some(ns.clone())),
            (config_maps(), Some(ns.clone())),
        ],
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let _provider = Provider::start(admin.clone(), ns.clone(), Duration::from_secs(3));
    create_tree(admin, &refuse, &ns, "refused", 2).await;
    wait_ordered(admin, chart::NAMESPACE, &refuse, Some(&ns), "refused").await;
    let got = delete(admin, &refuse, &ns, "refused", &background()).await;
    assert_eq!(got.code, 403, "{got:?}");
    assert!(got.message.contains("cascade-guard refused"), "{got:?}");
    let foreground = DeleteSpec::propagation("Foreground");
    assert!(
        delete(admin, &refuse, &ns, "refused", &foreground)
            .await
            .allowed()
    );

    // Convert: held, converted, cascaded in the foreground.
    let convert = CONVERT.resource();
    create_tree(admin, &convert, &ns, "converted", 2).await;
    wait_held(admin, &convert, &ns, "converted").await;
    wait_ordered(admin, chart::NAMESPACE, &convert, Some(&ns), "converted").await;
    let got = delete(admin, &convert, &ns, "converted", &background()).await;
    assert!(got.allowed(), "{got:?}");
    // Mid-cascade, `cascade-guard status` shows it, held and in the foreground.
    let seen = wait::until(Duration::from_secs(20), || async {
        let report: Value = serde_json::from_str(&cli(&env.cp, &["status", "-o", "json"])).ok()?;
        report["cascading"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == "converted" && c["held"] == true && c["foreground"] == true)
            .cloned()
    })
    .await;
    assert!(
        seen.is_some(),
        "status never showed the cascade\n{}",
        logs(&replicas)
    );
    for (kind, name) in [(&refuse.kind, "refused"), (&convert.kind, "converted")] {
        assert!(
            timeline
                .wait_gone(kind, name, Duration::from_secs(60))
                .await
                .is_some(),
            "{name} never left:\n{}\n{}",
            timeline.describe(),
            logs(&replicas)
        );
        assert_foreground(&timeline, kind, name, 2);
    }

    // The audit log shows who re-issued the delete: the ServiceAccount, with
    // only its service-account groups.
    let (user, _) = chart::service_account_identity(&docs);
    let reissued = audit::read(&env.cp.audit_log_path())
        .expect("the API server's audit log")
        .into_iter()
        .find(|e| {
            e.verb == "delete"
                && e.is_about(&convert.plural, &ns, "converted")
                && e.propagation_policy() == Some("Foreground")
        })
        .expect("the Foreground re-issue is in the audit log");
    assert_eq!(reissued.effective_username(), user);
    let groups = &reissued
        .impersonated_user
        .as_ref()
        .expect("impersonated")
        .groups;
    assert!(!groups.iter().any(|g| g == "system:masters"), "{groups:?}");
    assert_eq!(reissued.response_code(), Some(200));

    // Statuses and events are written under the ServiceAccount too.
    let policies = cascade_policy_api(admin);
    let name = format!("{ns}-leaves");
    create(&policies, cascade_policy(&name, "Leaf", "Refuse", None)).await;
    let ready = wait::until(Duration::from_secs(30), || async {
        ready_condition(&policies.get(&name).await.ok()?).filter(|(s, _)| s == "True")
    })
    .await;
    assert!(
        ready.is_some(),
        "{name} never became Ready\n{}",
        logs(&replicas)
    );
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    let instances: Vec<String> = replicas.iter().map(|r| r.pod_name.clone()).collect();
    let event = wait::until(Duration::from_secs(30), || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("ghost")
                    && e.reason.as_deref() == Some("UnknownKind")
                    && e.reporting_instance
                        .as_ref()
                        .is_some_and(|i| instances.contains(i))
            })
    })
    .await;
    assert!(
        event.is_some(),
        "no UnknownKind event on ghost from this release\n{}",
        logs(&replicas)
    );

    // Leader election on the chart's Lease: one of the replicas holds it.
    let lease = Api::<Lease>::namespaced(admin.clone(), chart::NAMESPACE)
        .get("cascade-guard")
        .await
        .expect("the Lease");
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    assert!(instances.contains(&holder), "Lease held by {holder:?}");

    let report: Value =
        serde_json::from_str(&cli(&env.cp, &["status", "-o", "json"])).expect("status JSON");
    assert_eq!(report["admission"]["inSync"], true, "{report:#}");
    let source_of = |kind: &str| {
        report["protected"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["kind"] == kind))
            .map(|p| (p["mode"].clone(), p["source"].clone()))
    };
    assert_eq!(
        source_of("RefuseComposite.table.cascade-guard.dev"),
        Some((json!("Refuse"), json!("XrdAnnotation")))
    );
    assert_eq!(
        source_of("DefaultComposite.table.cascade-guard.dev"),
        Some((json!("Refuse"), json!("Default")))
    );
    assert_eq!(
        source_of("ConvertComposite.table.cascade-guard.dev"),
        Some((json!("Convert"), json!("XrdAnnotation")))
    );

    let text = cli(&env.cp, &["status"]);
    assert!(text.contains("ADMISSION POLICIES: in sync"), "{text}");
    assert!(
        text.contains("XRD annotation (refusecomposites.table.cascade-guard.dev)"),
        "{text}"
    );
    eprintln!("cascade-guard status:\n{text}");

    // What the API server refuses the ServiceAccount.
    let sa = service_account_client(env, &docs).await;
    let maps: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    maps.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "not-protected"}})).expect("cm"),
    )
    .await
    .expect("a ConfigMap");
    let sa_maps: Api<ConfigMap> = Api::namespaced(sa.clone(), &ns);
    assert!(
        sa_maps.get("not-protected").await.is_ok(),
        "composedResources grants get"
    );
    assert_forbidden(
        "delete a ConfigMap (core group, not protected)",
        sa_maps
            .delete("not-protected", &DeleteParams::default())
            .await,
    );
    assert_forbidden(
        "patch a ConfigMap's finalizers",
        sa_maps
            .patch(
                "not-protected",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": [FINALIZER]}})),
            )
            .await,
    );
    assert_forbidden(
        "list Secrets in its own namespace",
        Api::<Secret>::namespaced(sa.clone(), chart::NAMESPACE)
            .list(&ListParams::default())
            .await,
    );
    assert_forbidden(
        "read a Secret in kube-system",
        Api::<Secret>::namespaced(sa.clone(), "kube-system")
            .get("anything")
            .await,
    );
    let sa_xrds = xrd_api(&sa);
    assert_forbidden(
        "annotate an XRD (read-only input)",
        sa_xrds
            .patch(
                &REFUSE.xrd_name(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"cascade-guard.dev/deletion-policy": "Off"}}})),
            )
            .await,
    );
    assert_forbidden(
        "delete an XRD",
        sa_xrds
            .delete(&REFUSE.xrd_name(), &DeleteParams::default())
            .await,
    );
    let sa_policies = cascade_policy_api(&sa);
    assert_forbidden(
        "change a CascadePolicy's spec (only its status is cascade-guard's)",
        sa_policies
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"mode": "Off"}})),
            )
            .await,
    );
    assert_forbidden(
        "delete a CascadePolicy",
        sa_policies.delete(&name, &DeleteParams::default()).await,
    );
    assert_forbidden(
        "delete a CRD",
        Api::<CustomResourceDefinition>::all(sa.clone())
            .delete(
                "cascadepolicies.cascade-guard.dev",
                &DeleteParams::default(),
            )
            .await,
    );
    let webhook = json!({"metadata": {"name": "not-cascade-guards"}, "webhooks": []});
    assert_forbidden(
        "create a ValidatingWebhookConfiguration",
        Api::<ValidatingWebhookConfiguration>::all(sa.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(webhook.clone()).expect("vwc"),
            )
            .await,
    );
    assert_forbidden(
        "create a MutatingWebhookConfiguration",
        Api::<MutatingWebhookConfiguration>::all(sa.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(webhook).expect("mwc"),
            )
            .await,
    );
    let map = ApiResource {
        group: "admissionregistration.k8s.io".into(),
        version: "v1beta1".into(),
        api_version: "admissionregistration.k8s.io/v1beta1".into(),
        kind: "MutatingAdmissionPolicy".into(),
        plural: "mutatingadmissionpolicies".into(),
    };
    assert_forbidden(
        "create a MutatingAdmissionPolicy",
        Api::<DynamicObject>::all_with(sa.clone(), &map)
            .create(
                &PostParams::default(),
                &DynamicObject::new("not-cascade-guards", &map),
            )
            .await,
    );
    let lease = |name: &str| -> Lease {
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("lease")
    };
    assert_forbidden(
        "create a Lease in kube-system",
        Api::<Lease>::namespaced(sa.clone(), "kube-system")
            .create(&PostParams::default(), &lease("cascade-guard"))
            .await,
    );
    assert_forbidden(
        "read another Lease in its namespace",
        Api::<Lease>::namespaced(sa.clone(), chart::NAMESPACE)
            .get("someone-else")
            .await,
    );
    assert_forbidden(
        "grant itself more (ClusterRoleBinding)",
        Api::<ClusterRoleBinding>::all(sa.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": "cascade-guard-escalates"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                    "subjects": [{"kind": "ServiceAccount", "name": "cascade-guard", "namespace": chart::NAMESPACE}]
                }))
                .expect("crb"),
            )
            .await,
    );
    assert_forbidden(
        "create a Pod",
        Api::<Pod>::namespaced(sa.clone(), chart::NAMESPACE)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}))
                    .expect("pod"),
            )
            .await,
    );
    assert_forbidden(
        "delete a Namespace",
        Api::<Namespace>::all(sa.clone())
            .delete(&ns, &DeleteParams::default())
            .await,
    );
    // The limit of RBAC, stated rather than hidden: it cannot match labels, so
    // the grant on ValidatingAdmissionPolicies covers other controllers' too.
    // The controller itself only ever touches its own (by label and name).
    let vaps: Api<ValidatingAdmissionPolicy> = Api::all(admin.clone());
    let foreign = format!("{ns}-someone-elses");
    vaps.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": foreign},
            "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": ["example.org"], "apiVersions": ["*"],
                "operations": ["DELETE"], "resources": ["things"]}]},
                "validations": [{"expression": "true"}]}
        }))
        .expect("vap"),
    )
    .await
    .expect("a foreign admission policy");
    let dry_run = DeleteParams {
        dry_run: true,
        ..DeleteParams::default()
    };
    assert!(
        Api::<ValidatingAdmissionPolicy>::all(sa.clone())
            .delete(&foreign, &dry_run)
            .await
            .is_ok(),
        "RBAC cannot tell admission policies apart by label; if this changed, update the docs"
    );
    // ...and the controller left it alone.
    let still = vaps
        .get(&foreign)
        .await
        .expect("the foreign policy is still there");
    assert!(still.labels().get("app.kubernetes.io/managed-by").is_none());
    vaps.delete(&foreign, &DeleteParams::default())
        .await
        .expect("clean up");

    // Everything above worked without a single request the API server refused.
    let log = logs(&replicas);
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "a replica was refused something the chart should grant:\n{log}"
    );
    // And it runs as the user the chart tells it its UPDATE policies trust.
    assert!(
        !log.contains("runs as another user") && !log.contains("cannot tell which user"),
        "{log}"
    );
    for r in &mut replicas {
        r.stop();
    }
}

/// Under the chart's RBAC, which grants nothing on Secrets, sibling order
/// holds a composed Secret that a sibling needs (by its name: it may not even
/// read it), and a plain delete under Convert takes the tree down in order,
/// by etcd revision: the Secret goes only once what needs it is gone, deleted
/// by the garbage collector's next try (cascade-guard may not delete it).
/// The shape of Modelplane #212, where the composed kubeconfig Secret went
/// first and the releases that needed it wedged.
#[tokio::test]
async fn under_the_charts_rbac_a_needed_secret_is_held_with_no_grant_on_secrets() {
    let _one_at_a_time = CLUSTER.lock().await;
    let env = bare_env().await;
    let s = Scope::new(&env.cp, "chart-secret").await;
    let ns = s.namespace.clone();
    let (docs, mut replicas) = install(env, VALUES, 1, "chart-secret").await;
    let admin = &s.client;
    let sa = service_account_client(env, &docs).await;
    assert_forbidden(
        "read a Secret in the tree's namespace",
        Api::<Secret>::namespaced(sa.clone(), &ns)
            .get("vault-kubeconfig")
            .await,
    );
    let convert = CONVERT.resource();
    let secrets = ApiResource::erase::<Secret>(&());
    let timeline = Timeline::start(
        admin,
        &[
            (convert.clone(), Some(ns.clone())),
            (config_maps(), Some(ns.clone())),
            (secrets.clone(), Some(ns.clone())),
        ],
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let _provider = Provider::start(admin.clone(), ns.clone(), Duration::from_secs(3));
    // XR vault composes ConfigMap vault-0, which needs (the annotation) the
    // Secret vault-kubeconfig it also composes.
    let xrs: Api<DynamicObject> = Api::namespaced_with(admin.clone(), &ns, &convert);
    let mut xr = composite(&convert, "vault", false);
    xr.data["spec"] = json!({"crossplane": {"resourceRefs": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "vault-0"},
        {"apiVersion": "v1", "kind": "Secret", "name": "vault-kubeconfig"},
    ]}});
    let xr = xrs
        .create(&Default::default(), &xr)
        .await
        .expect("create the XR");
    let owner = json!([{"apiVersion": convert.api_version, "kind": convert.kind, "name": "vault",
        "uid": xr.metadata.uid, "controller": true, "blockOwnerDeletion": true}]);
    Api::<ConfigMap>::namespaced(admin.clone(), &ns)
        .create(
            &Default::default(),
            &serde_json::from_value(json!({"metadata": {
                "name": "vault-0", "finalizers": [HOLD], "ownerReferences": owner,
                "annotations": {"cascade-guard.dev/needs": "Secret/vault-kubeconfig"}}}))
            .expect("a ConfigMap"),
        )
        .await
        .expect("create the needer");
    Api::<Secret>::namespaced(admin.clone(), &ns)
        .create(
            &Default::default(),
            &serde_json::from_value(json!({"metadata": {
                "name": "vault-kubeconfig", "ownerReferences": owner},
                "stringData": {"kubeconfig": "not a real one"}}))
            .expect("a Secret"),
        )
        .await
        .expect("create the Secret");
    wait_held(admin, &convert, &ns, "vault").await;
    let held = wait_sibling_held(
        admin,
        chart::NAMESPACE,
        &secrets,
        Some(&ns),
        "vault-kubeconfig",
        Duration::from_secs(60),
    )
    .await;
    assert!(held, "the Secret was never held:\n{}", logs(&replicas));
    wait_ordered(admin, chart::NAMESPACE, &convert, Some(&ns), "vault").await;
    // Held: its delete is refused, the admin's too.
    let refused = Api::<Secret>::namespaced(admin.clone(), &ns)
        .delete(
            "vault-kubeconfig",
            &DeleteParams {
                dry_run: true,
                ..DeleteParams::default()
            },
        )
        .await
        .expect_err("a held Secret's delete");
    assert!(
        refused
            .to_string()
            .contains("cascade-guard holds Secret vault-kubeconfig until ConfigMap"),
        "{refused}"
    );
    let got = delete(admin, &convert, &ns, "vault", &background()).await;
    assert!(got.allowed(), "{got:?}");
    let gone = timeline
        .wait_gone(&convert.kind, "vault", Duration::from_secs(180))
        .await;
    assert!(
        gone.is_some(),
        "the tree never left:\n{}\n{}",
        timeline.describe(),
        logs(&replicas)
    );
    let needer = timeline.gone("ConfigMap", "vault-0").expect("vault-0 gone");
    let secret = timeline
        .gone("Secret", "vault-kubeconfig")
        .expect("the Secret gone");
    let (Some(needer_at), Some(secret_at)) = (needer.revision, secret.revision) else {
        panic!("no etcd revision:\n{}", timeline.describe());
    };
    assert!(
        secret_at > needer_at,
        "the Secret went (revision {secret_at}) before what needed it (revision {needer_at})\n{}",
        timeline.describe()
    );
    eprintln!(
        "the Secret went {:.1} s after what needed it, deleted by the garbage collector's next try",
        secret.at.duration_since(needer.at).as_secs_f64()
    );
    stop_unrefused(&mut replicas);
}

/// A tree that composes what the chart's RBAC does not let the controller
/// read (a Service: neither in `protectedGroups` nor in `composedResources`)
/// is read only in part, so it is not ordered: its root's delete is refused
/// with that reason, `plan` names it and exits 3, and granting nothing more
/// leaves it so (break-glass deletes it, in no order). The degraded state
/// "the controller may not hold what the order needs" under a least-privilege
/// install.
#[tokio::test]
async fn a_tree_the_charts_rbac_lets_the_controller_read_only_in_part_is_refused_with_why() {
    use k8s_openapi::api::core::v1::Service;
    let _one_at_a_time = CLUSTER.lock().await;
    let env = bare_env().await;
    let s = Scope::new(&env.cp, "chart-partial").await;
    let ns = s.namespace.clone();
    let (_docs, mut replicas) = install(env, VALUES, 1, "chart-partial").await;
    let admin = &s.client;
    let refuse = REFUSE.resource();
    let xrs: Api<DynamicObject> = Api::namespaced_with(admin.clone(), &ns, &refuse);
    let mut xr = composite(&refuse, "partial", false);
    xr.data["spec"] = json!({"crossplane": {"resourceRefs": [
        {"apiVersion": "v1", "kind": "Service", "name": "partial-svc"},
    ]}});
    let xr = xrs
        .create(&Default::default(), &xr)
        .await
        .expect("create the XR");
    let service: Service = serde_json::from_value(json!({"metadata": {
        "name": "partial-svc",
        "ownerReferences": [{"apiVersion": refuse.api_version, "kind": refuse.kind,
            "name": "partial", "uid": xr.metadata.uid, "controller": true,
            "blockOwnerDeletion": true}]},
        "spec": {"ports": [{"port": 80}]}}))
    .expect("a Service");
    Api::<Service>::namespaced(admin.clone(), &ns)
        .create(&Default::default(), &service)
        .await
        .expect("create the Service");
    // The controller reads the tree and says why it is not ordered.
    let refusal = wait::until(Duration::from_secs(60), || async {
        let got = delete(
            admin,
            &refuse,
            &ns,
            "partial",
            &DeleteSpec {
                dry_run: true,
                ..DeleteSpec::propagation("Foreground")
            },
        )
        .await;
        (got.code == 403 && got.message.contains("cannot order its tree")).then_some(got.message)
    })
    .await
    .unwrap_or_else(|| panic!("the gate never named why:\n{}", logs(&replicas)));
    assert!(
        refusal.contains("not read: Service partial-svc") && refusal.contains("forbidden"),
        "{refusal}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cascade-guard"))
        .args(["plan", &refuse.plural, "partial", "-n", &ns, "--kubeconfig"])
        .arg(env.cp.kubeconfig_path())
        .output()
        .expect("plan");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(
        text.contains("the controller cannot order this tree: not read: Service partial-svc"),
        "{text}"
    );
    for r in &mut replicas {
        r.stop();
    }
}

/// An upgrade changes what it should and leaves the held objects held; an
/// uninstall as documented (stop, `cascade-guard uninstall`, delete the
/// chart's objects) leaves no admission policy, no finalizer, nothing stuck.
#[tokio::test]
async fn upgrade_and_uninstall_leave_nothing_stuck() {
    let _one_at_a_time = CLUSTER.lock().await;
    let env = bare_env().await;
    let s = Scope::new(&env.cp, "chart-upgrade").await;
    let ns = s.namespace.clone();
    let admin = &s.client;
    let (v1, mut replicas) = install(env, VALUES, 1, "chart-v1").await;
    env.wait_for_protection(admin, &DEFAULTED.resource()).await;
    let convert = CONVERT.resource();
    create_tree(admin, &convert, &ns, "idle", 1).await;
    wait_held(admin, &convert, &ns, "idle").await;

    // Upgrade: another default mode, one more replica, no PDB, one more group.
    let v2_values = format!("{VALUES}\nreplicas: 3\npodDisruptionBudget:\n  enabled: false\n")
        .replace("xrdDefaultMode: Refuse", "xrdDefaultMode: Warn")
        .replace(
            "protectedGroups: [table.cascade-guard.dev]",
            "protectedGroups: [table.cascade-guard.dev, extra.example.org]",
        );
    let v2 = render(&with_image(&v2_values));
    chart::apply(admin, &v2, &v1).await;
    // A rolling update: the old replica stops, a new one starts.
    for r in &mut replicas {
        r.stop();
    }
    let kubeconfig = chart::write_service_account_kubeconfig(&env.cp, &v2);
    let binary = image::entrypoint_binary(chart::container_image(&v2));
    replicas = vec![Replica::start(
        &env.cp,
        &v2,
        &binary,
        &kubeconfig,
        "chart-v2-0",
    )];

    let deployments: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        chart::NAMESPACE,
        &ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&()),
    );
    let deployment = deployments.get(chart::RELEASE).await.expect("Deployment");
    assert_eq!(deployment.data["spec"]["replicas"], 3);
    let args = deployment.data["spec"]["template"]["spec"]["containers"][0]["args"].clone();
    assert!(
        args.as_array()
            .expect("args")
            .contains(&json!("--xrd-default-mode=Warn")),
        "{args}"
    );
    let pdbs: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(admin.clone(), chart::NAMESPACE);
    assert!(
        pdbs.get_opt(chart::RELEASE)
            .await
            .expect("get PDB")
            .is_none(),
        "the upgrade did not remove the PodDisruptionBudget"
    );
    let role = Api::<ClusterRole>::all(admin.clone())
        .get(chart::RELEASE)
        .await
        .expect("ClusterRole");
    assert!(
        role.rules.unwrap_or_default().iter().any(|r| r
            .api_groups
            .as_ref()
            .is_some_and(|g| g.contains(&"extra.example.org".to_string()))),
        "the upgrade did not extend the ClusterRole"
    );

    // The new replica compiles the new default mode...
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(admin.clone());
    // (the XRD without the annotation moves into the shared Warn pair).
    let warned = wait::until(Duration::from_secs(30), || async {
        let b = bindings
            .get("cascade-guard-xrds-warn-composite")
            .await
            .ok()?;
        (b.spec.validation_actions == ["Warn", "Audit"]
            && carried_kinds(&b).contains_key(&kind_key(&DEFAULTED)))
        .then_some(())
    })
    .await;
    assert!(
        warned.is_some(),
        "the default mode never became Warn\n{}",
        logs(&replicas)
    );
    // The API server's admission picks the change up within a second or so.
    let probe = wait::until(Duration::from_secs(15), || async {
        let got = delete(
            admin,
            &DEFAULTED.resource(),
            "protection-probe",
            &format!("probe-{}", DEFAULTED.plural),
            &DeleteSpec::dry_run_background(),
        )
        .await;
        (got.allowed() && !got.warnings.is_empty()).then_some(got)
    })
    .await;
    assert!(
        probe.is_some(),
        "a Background delete of a DefaultComposite is not just warned about"
    );
    let report: Value = serde_json::from_str(&cli(
        &env.cp,
        &["status", "--xrd-default-mode=Warn", "-o", "json"],
    ))
    .expect("status JSON");
    assert_eq!(report["admission"]["inSync"], true, "{report:#}");
    // ...and what was held stays held, not terminating.
    let xrs: Api<DynamicObject> = Api::namespaced_with(admin.clone(), &ns, &convert);
    let idle = xrs.get("idle").await.expect("idle");
    assert!(idle.finalizers().iter().any(|f| f == FINALIZER));
    assert!(idle.metadata.deletion_timestamp.is_none());

    // A cascade in progress when the uninstall starts: its dependents wait on
    // a provider that is not running yet.
    let timeline = Timeline::start(
        admin,
        &[
            (convert.clone(), Some(ns.clone())),
            (config_maps(), Some(ns.clone())),
        ],
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    create_tree(admin, &convert, &ns, "busy", 2).await;
    wait_held(admin, &convert, &ns, "busy").await;
    wait_ordered(admin, chart::NAMESPACE, &convert, Some(&ns), "busy").await;
    assert!(
        delete(admin, &convert, &ns, "busy", &background())
            .await
            .allowed()
    );
    let converted = wait::until(Duration::from_secs(30), || async {
        let xr = xrs.get("busy").await.ok()?;
        xr.finalizers()
            .iter()
            .any(|f| f == "foregroundDeletion")
            .then_some(())
    })
    .await;
    assert!(
        converted.is_some(),
        "busy was never converted\n{}",
        logs(&replicas)
    );

    // Uninstall, as README.md says: scale to zero, `cascade-guard uninstall`,
    // then delete the chart's objects.
    for r in &mut replicas {
        r.stop();
    }
    let said = cli(&env.cp, &["uninstall"]);
    assert!(said.starts_with("removed "), "{said}");
    chart::uninstall(admin, &v2).await;

    let vaps: Api<ValidatingAdmissionPolicy> = Api::all(admin.clone());
    let managed = ListParams::default().labels(MANAGED);
    assert!(vaps.list(&managed).await.expect("list").items.is_empty());
    assert!(
        bindings
            .list(&managed)
            .await
            .expect("list")
            .items
            .is_empty()
    );
    let mut resources: Vec<ApiResource> = XR_KINDS.iter().map(|k| k.resource()).collect();
    resources.push(leaves());
    for r in &resources {
        let all: Api<DynamicObject> = Api::all_with(admin.clone(), r);
        for o in all.list(&ListParams::default()).await.expect("list").items {
            assert!(
                !o.finalizers().iter().any(|f| f == FINALIZER),
                "{} {} still holds cascade-guard's finalizer",
                r.kind,
                o.name_any()
            );
        }
    }
    // The chart's objects are gone, but the CRD (and every CascadePolicy).
    for doc in &v2 {
        let k = chart::key(doc);
        let found = chart::api_for(admin, &k)
            .await
            .get_opt(&k.3)
            .await
            .expect("get");
        if k.1 == "CustomResourceDefinition" {
            assert!(found.is_some(), "helm.sh/resource-policy: keep");
        } else {
            assert!(found.is_none(), "{} {} is still there", k.1, k.3);
        }
    }
    assert!(
        cascade_policy_api(admin)
            .get_opt("leaves")
            .await
            .expect("get")
            .is_some()
    );

    // Nothing is stuck: the cascade in progress finishes once its provider
    // does its work, and the idle XR deletes like any object now.
    let _provider = Provider::start(admin.clone(), ns.clone(), Duration::from_millis(200));
    assert!(
        timeline
            .wait_gone(&convert.kind, "busy", Duration::from_secs(60))
            .await
            .is_some(),
        "busy never left:\n{}",
        timeline.describe()
    );
    assert_foreground(&timeline, &convert.kind, "busy", 2);
    // The API server's admission stops enforcing a deleted policy within a
    // second or so (it works from a cache): until then, the delete is refused.
    let last = std::cell::RefCell::new(None);
    let deleted = wait::until(Duration::from_secs(15), || async {
        let got = delete(admin, &convert, &ns, "idle", &background()).await;
        let allowed = got.allowed();
        *last.borrow_mut() = Some(got);
        allowed.then_some(())
    })
    .await;
    assert!(
        deleted.is_some(),
        "idle cannot be deleted: {:?}",
        last.borrow()
    );
    assert!(
        timeline
            .wait_gone(&convert.kind, "idle", Duration::from_secs(30))
            .await
            .is_some(),
        "idle never left:\n{}",
        timeline.describe()
    );
    let terminating = wait::until(Duration::from_secs(60), || async {
        for r in resources.iter().chain([&config_maps()]) {
            let all: Api<DynamicObject> = Api::all_with(admin.clone(), r);
            let items = all.list(&ListParams::default()).await.ok()?.items;
            if items
                .iter()
                .any(|o| o.metadata.deletion_timestamp.is_some())
            {
                return None;
            }
        }
        Some(())
    })
    .await;
    assert!(
        terminating.is_some(),
        "objects left terminating after the uninstall"
    );
    // The namespace (with the Lease the replicas made) goes too.
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    namespaces
        .delete(chart::NAMESPACE, &DeleteParams::default())
        .await
        .expect("delete the release namespace");
    let gone = wait::until(Duration::from_secs(60), || async {
        namespaces
            .get_opt(chart::NAMESPACE)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    assert!(gone.is_some(), "{} stuck terminating", chart::NAMESPACE);
}

/// `holdComposed: true` (`--hold-composed`, for Crossplane v2.0 and v2.1),
/// installed as a platform installs it, under the chart's RBAC: a composed
/// object of a Refuse kind (one with a controller owner reference, as
/// Crossplane composes a nested XR) is held; Crossplane's own delete of it
/// with no propagation policy (what v2.0 and v2.1 send for a resource dropped
/// from its Composition) goes through and ends as a foreground cascade, its
/// dependent gone first. A person's plain delete of it is still refused, and
/// an object nobody composed is neither held nor let through.
#[tokio::test]
async fn under_the_charts_rbac_hold_composed_makes_crossplanes_plain_delete_a_foreground_cascade() {
    let _one_at_a_time = CLUSTER.lock().await;
    let env = bare_env().await;
    let s = Scope::new(&env.cp, "chart-hold-composed").await;
    let ns = s.namespace.clone();
    let values = format!("{VALUES}holdComposed: true\n");
    let (docs, mut replicas) = install(env, &values, 1, "chart-hold-composed").await;
    let args = find(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(args.contains(&json!("--hold-composed")), "{args:?}");
    let admin = &s.client;
    let resource = REFUSE.resource();
    env.wait_for_protection(admin, &resource).await;
    let scene = Composing::new(&s, &resource).await;
    scene.composed(&s, &resource, "composed").await;
    create_tree(admin, &resource, &ns, "loose", 1).await;
    wait_held(admin, &resource, &ns, "composed").await;
    let loose = scene.xrs.get("loose").await.expect("loose");
    assert!(
        !loose.finalizers().iter().any(|f| f == FINALIZER),
        "an object nobody composed was held: {:?}",
        loose.finalizers()
    );

    let person = env
        .cp
        .client_as("alice@example.com", &["system:masters"])
        .await
        .expect("client");
    let crossplane = env
        .cp
        .client_as(DEFAULT_CROSSPLANE_USER, &["system:masters"])
        .await
        .expect("client");
    let by_person = delete(&person, &resource, &ns, "composed", &plain(true)).await;
    assert!(
        !by_person.allowed(),
        "a person's plain delete: {by_person:?}"
    );
    let of_loose = delete(&crossplane, &resource, &ns, "loose", &plain(true)).await;
    assert!(
        !of_loose.allowed(),
        "Crossplane's plain delete of an object not held: {of_loose:?}"
    );

    let _provider = Provider::start(admin.clone(), ns.clone(), Duration::from_secs(2));
    let by_crossplane = delete(&crossplane, &resource, &ns, "composed", &plain(false)).await;
    assert!(
        by_crossplane.allowed(),
        "Crossplane's plain delete of a held composed object: {by_crossplane:?}"
    );
    assert!(
        scene
            .timeline
            .wait_gone(&resource.kind, "composed", Duration::from_secs(60))
            .await
            .is_some(),
        "composed never left:\n{}\n{}",
        scene.timeline.describe(),
        logs(&replicas)
    );
    assert_foreground(&scene.timeline, &resource.kind, "composed", 1);
    stop_unrefused(&mut replicas);
}
