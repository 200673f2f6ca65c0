//! The chart's PrometheusRule (templates/prometheusrule.yaml): rendered only
//! when asked and only when the cluster serves the kind; its alert expressions
//! pass `promtool test rules` (the pinned promtool, built from the Go module
//! proxy by testbed/tools/promtool.sh) on the rules the chart renders; and the
//! rendered object is accepted by a real API server that serves
//! prometheus-operator's own PrometheusRule CRD, from its module zip. The
//! chart's ServiceMonitor (templates/servicemonitor.yaml; when it renders is
//! tests/without_cluster/chart.rs's) likewise against the operator's ServiceMonitor CRD.

use cascade_guard_testkit::chart;

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, ValidationDirective};
use local_cluster::{ControlPlane, Options};
use serde_json::{Value, json};

const API_VERSION: &str = "monitoring.coreos.com/v1/PrometheusRule";
const SERVICE_MONITOR_API_VERSION: &str = "monitoring.coreos.com/v1/ServiceMonitor";
const ENABLED: &str = "prometheusRule:\n  enabled: true\n";

/// The promtool unit tests of the alerts, in git beside the chart.
fn unit_tests_path() -> PathBuf {
    chart::chart_dir().join("tests/prometheusrule-test.yaml")
}

/// The pinned promtool: PROMTOOL_BIN (scripts/test.sh exports it), else
/// testbed/tools/promtool.sh, which is instant once cached.
fn promtool() -> PathBuf {
    chart::pinned_tool("PROMTOOL_BIN", "promtool.sh")
}

/// One of prometheus-operator's CRDs (`file`: prometheusrules.yaml,
/// servicemonitors.yaml), which testbed/tools/promtool.sh puts beside promtool from
/// the operator's module zip.
fn operator_crd(file: &str) -> CustomResourceDefinition {
    let bin = promtool();
    let path = bin
        .parent()
        .and_then(Path::parent)
        .expect("promtool's cache dir")
        .join("crd")
        .join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The PrometheusRules the chart renders with `values`, as if the cluster
/// served the kind or not.
fn prometheus_rules(values: &str, served: bool) -> Vec<Value> {
    let api_versions: &[&str] = if served { &[API_VERSION] } else { &[] };
    let text = chart::template_text_with(values, api_versions)
        .unwrap_or_else(|e| panic!("helm template failed: {e}"));
    chart::documents(&text)
        .into_iter()
        .filter(|d| d["kind"] == "PrometheusRule")
        .collect()
}

/// The one PrometheusRule the chart renders when enabled and served.
fn rendered_rule(values: &str) -> Value {
    let mut rules = prometheus_rules(values, true);
    assert_eq!(rules.len(), 1, "one PrometheusRule: {rules:?}");
    rules.remove(0)
}

#[test]
fn the_prometheus_rule_is_rendered_only_when_asked_and_served() {
    assert!(
        prometheus_rules("", true).is_empty(),
        "not asked for (the default): no PrometheusRule"
    );
    assert!(
        prometheus_rules(ENABLED, false).is_empty(),
        "asked for on a cluster without prometheus-operator's CRD: no PrometheusRule"
    );
    let values = r#"
prometheusRule:
  enabled: true
  labels: {release: kube-prometheus-stack}
  extraAlertLabels: {team: platform}
  stalled: {for: 15m, severity: ticket}
  down: {for: 2m, heldWindow: 1d, severity: page}
"#;
    let rule = rendered_rule(values);
    assert_eq!(rule["metadata"]["namespace"], chart::NAMESPACE);
    assert_eq!(
        rule["metadata"]["labels"]["release"], "kube-prometheus-stack",
        "the labels a Prometheus's ruleSelector matches"
    );
    let rules = rule["spec"]["groups"][0]["rules"]
        .as_array()
        .expect("rules");
    let alert = |name: &str| {
        rules
            .iter()
            .find(|r| r["alert"] == name)
            .unwrap_or_else(|| panic!("no alert {name}"))
    };
    let stalled = alert("CascadeGuardCascadeStalled");
    assert_eq!(stalled["for"], "15m");
    assert_eq!(
        stalled["labels"],
        json!({"severity": "ticket", "team": "platform"})
    );
    let down = alert("CascadeGuardDown");
    assert_eq!(down["for"], "2m");
    assert_eq!(
        down["labels"],
        json!({"severity": "page", "team": "platform"})
    );
    let expr = down["expr"].as_str().expect("expr");
    assert!(
        expr.contains("[1d]"),
        "heldWindow in the expression: {expr}"
    );
}

/// promtool reads the chart's rendered spec (not a copy of the rules), with
/// the default values the unit tests are written for.
#[test]
fn the_alerts_pass_promtools_unit_tests() {
    let rule = rendered_rule(ENABLED);
    let dir = std::env::temp_dir().join(format!("cascade-guard-promtool-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let rules_file = dir.join("cascade-guard-rules.yaml");
    let spec = serde_yaml::to_string(&rule["spec"]).expect("spec as YAML");
    std::fs::write(&rules_file, spec).expect("rules file");
    let tests_file = dir.join("prometheusrule-test.yaml");
    std::fs::copy(unit_tests_path(), &tests_file).expect("copy the unit tests");

    let promtool = promtool();
    for args in [&["check", "rules"][..], &["test", "rules"][..]] {
        let file = if args[0] == "check" {
            &rules_file
        } else {
            &tests_file
        };
        let out = Command::new(&promtool)
            .args(args)
            .arg(file)
            .output()
            .expect("promtool runs");
        assert!(
            out.status.success(),
            "promtool {} {} failed:\n{}{}",
            args.join(" "),
            file.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Applies `object` to a real API server that serves prometheus-operator's
/// CRD `crd_file`, with strict field validation (an unknown or misplaced
/// field is an error, not silently pruned): it must be stored as rendered.
/// Then the same object with `malformed` in place must be refused (422), so
/// that the check has teeth.
async fn assert_valid_for_operators_crd(crd_file: &str, object: &Value, malformed: (&str, Value)) {
    local_cluster::testing::init_tracing();
    let cp = ControlPlane::start(Options {
        crds: vec![operator_crd(crd_file)],
        ..Options::default()
    })
    .await
    .unwrap_or_else(|e| panic!("cannot start the control plane: {e}"));
    let admin = cp.admin().await.expect("admin client");

    // The release namespace, as `helm install --create-namespace` makes it.
    chart::apply(&admin, &[], &[]).await;
    let key = chart::key(object);
    let api = chart::api_for(&admin, &key).await;
    let strict = PatchParams::apply("helm")
        .force()
        .validation(ValidationDirective::Strict);
    let stored = api
        .patch(&key.3, &strict, &Patch::Apply(object))
        .await
        .unwrap_or_else(|e| panic!("the API server refuses the rendered {}: {e}", key.1));
    assert_eq!(
        stored.data["spec"], object["spec"],
        "stored as rendered, nothing pruned"
    );

    let (pointer, value) = malformed;
    let mut bad = object.clone();
    *bad.pointer_mut(pointer)
        .unwrap_or_else(|| panic!("{} has no {pointer}", key.1)) = value;
    let refused = api.patch(&key.3, &strict, &Patch::Apply(&bad)).await;
    match refused {
        Err(kube::Error::Api(s)) if s.code == 422 => {}
        other => panic!("a malformed {pointer} must be refused by the CRD's schema: {other:?}"),
    }
}

#[tokio::test]
async fn the_prometheus_rule_is_valid_for_prometheus_operators_crd() {
    assert_valid_for_operators_crd(
        "prometheusrules.yaml",
        &rendered_rule(ENABLED),
        ("/spec/groups/0/rules/0/for", json!("five minutes")),
    )
    .await;
}

/// The ServiceMonitor with every optional field set, so that each is checked
/// against the operator's schema.
const SERVICE_MONITOR_VALUES: &str = r#"
serviceMonitor:
  enabled: true
  labels: {release: kube-prometheus-stack}
  annotations: {team: platform}
  interval: 30s
  scrapeTimeout: 10s
  relabelings:
    - action: replace
      sourceLabels: [__meta_kubernetes_pod_node_name]
      targetLabel: node
  metricRelabelings:
    - action: drop
      sourceLabels: [__name__]
      regex: process_.*
"#;

#[tokio::test]
async fn the_service_monitor_is_valid_for_prometheus_operators_crd() {
    let text = chart::template_text_with(SERVICE_MONITOR_VALUES, &[SERVICE_MONITOR_API_VERSION])
        .unwrap_or_else(|e| panic!("helm template failed: {e}"));
    let docs = chart::documents(&text);
    assert_valid_for_operators_crd(
        "servicemonitors.yaml",
        chart::find(&docs, "ServiceMonitor"),
        ("/spec/endpoints/0/interval", json!("five minutes")),
    )
    .await;
}
