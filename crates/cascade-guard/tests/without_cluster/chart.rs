//! The chart's values, without a cluster: what values.schema.json refuses
//! (by `helm template` and `helm lint`, before anything reaches an API
//! server), what the templates refuse, and what the optional objects
//! (ServiceMonitor, NetworkPolicy) and the overridable security contexts
//! render. The default render is tests/api_server/install.rs's: the committed manifest.

use cascade_guard_testkit::chart;

use std::process::Command;

use chart::{find, has_kind};
use serde_json::{Value, json};

const SERVICE_MONITOR: &str = "monitoring.coreos.com/v1/ServiceMonitor";

/// `helm template` of the chart with `args` (--set and the like), as if the
/// cluster also served `api_versions`: the objects, or helm's error output.
fn template(args: &[&str], api_versions: &[&str]) -> Result<Vec<Value>, String> {
    let out = Command::new(chart::helm())
        .args(["template", chart::RELEASE])
        .arg(chart::chart_dir())
        .args(["--namespace", chart::NAMESPACE])
        .args(args)
        .args(api_versions.iter().flat_map(|v| ["--api-versions", v]))
        .output()
        .expect("helm runs");
    if out.status.success() {
        Ok(chart::documents(&String::from_utf8_lossy(&out.stdout)))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `helm lint --strict` of the chart with `args`: Ok, or its output.
fn lint(args: &[&str]) -> Result<(), String> {
    let out = Command::new(chart::helm())
        .args(["lint", "--strict"])
        .arg(chart::chart_dir())
        .args(args)
        .output()
        .expect("helm runs");
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

enum Expect {
    /// Refused by values.schema.json, so by `helm lint` as well as by
    /// `helm template`, with an error that contains each of these.
    RefusedBySchema(&'static [&'static str]),
    /// Refused by a template's check. Not asserted for `helm lint`, which
    /// reports a template's `fail` as information only.
    RefusedByTemplate(&'static [&'static str]),
    /// Rendered, and the check holds of what is.
    Renders(fn(&[Value])),
}

struct Case {
    name: &'static str,
    args: &'static [&'static str],
    api_versions: &'static [&'static str],
    expect: Expect,
}

const fn case(name: &'static str, args: &'static [&'static str], expect: Expect) -> Case {
    Case {
        name,
        args,
        api_versions: &[],
        expect,
    }
}

fn container(docs: &[Value]) -> &Value {
    &find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
}

fn pod_security_context(docs: &[Value]) -> &Value {
    &find(docs, "Deployment")["spec"]["template"]["spec"]["securityContext"]
}

fn mode_arg(docs: &[Value]) -> &str {
    container(docs)["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .find(|a| a.starts_with("--xrd-default-mode="))
        .expect("a --xrd-default-mode arg")
}

/// The controller's ClusterRole (the chart has a break-glass one too).
fn controller_role(docs: &[Value]) -> &Value {
    docs.iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == chart::RELEASE)
        .expect("the controller's ClusterRole")
}

fn network_policy(docs: &[Value]) -> &Value {
    find(docs, "NetworkPolicy")
}

const CASES: &[Case] = &[
    // A typo used to be ignored: two replicas, not three.
    case(
        "an unknown value",
        &["--set", "replica=3"],
        Expect::RefusedBySchema(&["additional properties 'replica' not allowed"]),
    ),
    case(
        "an unknown value in one of the chart's objects",
        &["--set", "serviceMonitor.intervall=30s"],
        Expect::RefusedBySchema(&["/serviceMonitor", "'intervall' not allowed"]),
    ),
    // A string where a list belongs used to render `apiGroups: modelplane.ai`,
    // which only the API server refused.
    case(
        "protectedGroups as a string",
        &["--set", "protectedGroups=modelplane.ai"],
        Expect::RefusedBySchema(&["/protectedGroups", "want array"]),
    ),
    case(
        "protectedGroups as a list",
        &[
            "--set",
            "protectedGroups={modelplane.ai,platform.example.org}",
        ],
        Expect::Renders(|docs| {
            let rules = controller_role(docs)["rules"].as_array().expect("rules");
            assert!(
                rules
                    .iter()
                    .any(|r| r["apiGroups"] == json!(["modelplane.ai", "platform.example.org"])),
                "{rules:?}"
            );
        }),
    ),
    case(
        "a protected group that is not an API group name",
        &["--set", "protectedGroups={Modelplane_AI}"],
        Expect::RefusedBySchema(&["/protectedGroups/0", "does not match pattern"]),
    ),
    // A CRD's group has a dot; the core group ("") would grant delete on
    // every core object.
    case(
        "a protected group without a dot",
        &["--set", "protectedGroups={apps}"],
        Expect::RefusedBySchema(&["/protectedGroups/0"]),
    ),
    case(
        "composed resources: the core group's every resource (Secrets)",
        &[
            "--set-json",
            r#"composedResources=[{"apiGroups":[""],"resources":["configmaps","*"]}]"#,
        ],
        Expect::RefusedBySchema(&["/composedResources/0/resources/1"]),
    ),
    case(
        "composed resources: core ConfigMaps and a group's everything",
        &[
            "--set-json",
            r#"composedResources=[{"apiGroups":[""],"resources":["configmaps"]},{"apiGroups":["ec2.aws.upbound.io"],"resources":["*"]}]"#,
        ],
        Expect::Renders(|docs| {
            let rules = controller_role(docs)["rules"].as_array().expect("rules");
            let gets: Vec<&Value> = rules
                .iter()
                .filter(|r| r["verbs"] == json!(["get"]))
                .collect();
            // The two asked for, and the chart's own get on ConfigMaps (the
            // API server's check on a policy with a ConfigMap parameter).
            assert_eq!(gets.len(), 3, "{rules:?}");
            // Sibling order's hold of ProviderConfigUsages: get, list,
            // watch, patch and delete on those alone, in the providers'
            // groups, not the core group.
            let usages: Vec<&Value> = rules
                .iter()
                .filter(|r| r["resources"] == json!(["providerconfigusages"]))
                .collect();
            assert_eq!(
                usages,
                vec![&json!({
                    "apiGroups": ["ec2.aws.upbound.io"],
                    "resources": ["providerconfigusages"],
                    "verbs": ["get", "list", "watch", "patch", "delete"],
                })],
                "{rules:?}"
            );
            // And the listing of their ProviderConfigs, read-only.
            let configs: Vec<&Value> = rules
                .iter()
                .filter(|r| r["resources"] == json!(["providerconfigs", "clusterproviderconfigs"]))
                .collect();
            assert_eq!(
                configs,
                vec![&json!({
                    "apiGroups": ["ec2.aws.upbound.io"],
                    "resources": ["providerconfigs", "clusterproviderconfigs"],
                    "verbs": ["get", "list"],
                })],
                "{rules:?}"
            );
        }),
    ),
    // A first install breaks nothing: XRDs without the annotation in Warn.
    case(
        "no mode given",
        &[],
        Expect::Renders(|docs| assert_eq!(mode_arg(docs), "--xrd-default-mode=Warn")),
    ),
    // The mode in any case, as the binary and the XRD annotation read it;
    // the Deployment's flag always canonical.
    case(
        "a lower-case mode",
        &["--set", "xrdDefaultMode=convert"],
        Expect::Renders(|docs| assert_eq!(mode_arg(docs), "--xrd-default-mode=Convert")),
    ),
    case(
        "an upper-case mode",
        &["--set", "xrdDefaultMode=OFF"],
        Expect::Renders(|docs| assert_eq!(mode_arg(docs), "--xrd-default-mode=Off")),
    ),
    case(
        "a mode that is not one",
        &["--set", "xrdDefaultMode=sometimes"],
        Expect::RefusedBySchema(&["/xrdDefaultMode", "'sometimes'"]),
    ),
    // The template's own check, for whoever skips the schema.
    case(
        "a mode that is not one, without the schema",
        &[
            "--skip-schema-validation",
            "--set",
            "xrdDefaultMode=sometimes",
        ],
        Expect::RefusedByTemplate(&[
            r#"xrdDefaultMode "sometimes" is not one of Refuse, Convert, Warn, Off"#,
        ]),
    ),
    case(
        "a numeric image tag (helm --set reads 2 as a number)",
        &["--set", "image.tag=2"],
        Expect::RefusedBySchema(&["/image/tag", "want string"]),
    ),
    case(
        "a port out of range",
        &["--set", "httpPort=0"],
        Expect::RefusedBySchema(&["/httpPort"]),
    ),
    case(
        "a stall time the binary cannot read",
        &["--set", "stallAfter=10 minutes"],
        Expect::RefusedBySchema(&["/stallAfter"]),
    ),
    case(
        "an annotation that is not a string",
        &["--set", "podAnnotations.sidecar\\.istio\\.io/inject=false"],
        Expect::RefusedBySchema(&["/podAnnotations/sidecar.istio.io~1inject", "want string"]),
    ),
    // The ServiceMonitor: only when asked for and served, and then it
    // selects the chart's metrics Service by its port's name.
    case(
        "no ServiceMonitor by default",
        &[],
        Expect::Renders(|docs| assert!(!has_kind(docs, "ServiceMonitor"))),
    ),
    case(
        "a ServiceMonitor asked for where the kind is not served",
        &["--set", "serviceMonitor.enabled=true"],
        Expect::Renders(|docs| assert!(!has_kind(docs, "ServiceMonitor"))),
    ),
    Case {
        name: "a ServiceMonitor asked for and served",
        args: &[
            "--set",
            "serviceMonitor.enabled=true",
            "--set",
            "serviceMonitor.interval=30s",
            "--set",
            "serviceMonitor.labels.release=kube-prometheus-stack",
            "--set-json",
            r#"serviceMonitor.metricRelabelings=[{"action":"drop","sourceLabels":["__name__"],"regex":"process_.*"}]"#,
        ],
        api_versions: &[SERVICE_MONITOR],
        expect: Expect::Renders(|docs| {
            let monitor = find(docs, "ServiceMonitor");
            let service = find(docs, "Service");
            assert_eq!(monitor["metadata"]["namespace"], chart::NAMESPACE);
            assert_eq!(
                monitor["metadata"]["labels"]["release"],
                "kube-prometheus-stack"
            );
            let selector = monitor["spec"]["selector"]["matchLabels"]
                .as_object()
                .expect("matchLabels");
            for (k, v) in selector {
                assert_eq!(
                    &service["metadata"]["labels"][k], v,
                    "selects the Service by {k}"
                );
            }
            assert_eq!(
                monitor["spec"]["namespaceSelector"]["matchNames"],
                json!([service["metadata"]["namespace"]])
            );
            let endpoint = &monitor["spec"]["endpoints"][0];
            assert_eq!(endpoint["port"], service["spec"]["ports"][0]["name"]);
            assert_eq!(endpoint["path"], "/metrics");
            assert_eq!(endpoint["interval"], "30s");
            assert!(
                endpoint["scrapeTimeout"].is_null(),
                "none given: Prometheus's"
            );
            assert_eq!(endpoint["metricRelabelings"][0]["action"], "drop");
        }),
    },
    Case {
        name: "a ServiceMonitor without the Service it scrapes",
        args: &[
            "--set",
            "serviceMonitor.enabled=true",
            "--set",
            "service.enabled=false",
        ],
        api_versions: &[SERVICE_MONITOR],
        expect: Expect::RefusedByTemplate(&["serviceMonitor.enabled needs service.enabled"]),
    },
    case(
        "a scrape interval that is not a Prometheus duration",
        &["--set", "serviceMonitor.interval=5min"],
        Expect::RefusedBySchema(&["/serviceMonitor/interval"]),
    ),
    // The NetworkPolicy.
    case(
        "no NetworkPolicy by default",
        &[],
        Expect::Renders(|docs| assert!(!has_kind(docs, "NetworkPolicy"))),
    ),
    case(
        "a NetworkPolicy with the defaults",
        &["--set", "networkPolicy.enabled=true"],
        Expect::Renders(|docs| {
            let policy = network_policy(docs);
            let pod_labels = &find(docs, "Deployment")["spec"]["template"]["metadata"]["labels"];
            let selector = policy["spec"]["podSelector"]["matchLabels"]
                .as_object()
                .expect("matchLabels");
            for (k, v) in selector {
                assert_eq!(&pod_labels[k], v, "selects the pods by {k}");
            }
            assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
            let ingress = &policy["spec"]["ingress"];
            assert_eq!(ingress.as_array().map(Vec::len), Some(1));
            assert_eq!(
                ingress[0]["ports"],
                json!([{"port": 8080, "protocol": "TCP"}]),
                "the container's port only"
            );
            assert!(
                ingress[0]["from"].is_null(),
                "no peers given: from anywhere"
            );
            assert_eq!(
                policy["spec"]["egress"],
                json!([
                    {"ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]},
                    {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
                ]),
                "the API server and DNS, anywhere"
            );
        }),
    ),
    case(
        "a NetworkPolicy with peers",
        &[
            "--set",
            "networkPolicy.enabled=true",
            "--set",
            "httpPort=9090",
            "--set-json",
            r#"networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]"#,
            "--set",
            "networkPolicy.apiServerPorts={6443}",
            "--set-json",
            r#"networkPolicy.apiServerTo=[{"ipBlock":{"cidr":"10.0.0.10/32"}}]"#,
        ],
        Expect::Renders(|docs| {
            let spec = &network_policy(docs)["spec"];
            assert_eq!(spec["ingress"][0]["ports"][0]["port"], 9090);
            assert_eq!(
                spec["ingress"][0]["from"],
                json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}])
            );
            assert_eq!(
                spec["egress"][0]["ports"],
                json!([{"port": 6443, "protocol": "TCP"}])
            );
            assert_eq!(
                spec["egress"][0]["to"],
                json!([{"ipBlock": {"cidr": "10.0.0.10/32"}}])
            );
            assert!(spec["egress"][1]["to"].is_null(), "DNS anywhere");
        }),
    ),
    case(
        "a NetworkPolicy peer with a misspelt field",
        &[
            "--set",
            "networkPolicy.enabled=true",
            "--set-json",
            r#"networkPolicy.metricsFrom=[{"podSelectors":{}}]"#,
        ],
        Expect::RefusedBySchema(&["/networkPolicy/metricsFrom/0", "'podSelectors' not allowed"]),
    ),
    // Security contexts: OpenShift's restricted SCC assigns the UID.
    case(
        "OpenShift: no fixed user or group",
        &[
            "--set",
            "podSecurityContext.runAsUser=null",
            "--set",
            "podSecurityContext.runAsGroup=null",
        ],
        Expect::Renders(|docs| {
            assert_eq!(
                pod_security_context(docs),
                &json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}})
            );
            assert!(container(docs)["securityContext"]["runAsUser"].is_null());
        }),
    ),
    case(
        "security contexts: other fields pass through, defaults stay",
        &[
            "--set",
            "podSecurityContext.fsGroup=1000680000",
            "--set",
            "containerSecurityContext.capabilities.add={NET_BIND_SERVICE}",
        ],
        Expect::Renders(|docs| {
            let pod = pod_security_context(docs);
            assert_eq!(pod["fsGroup"], 1_000_680_000_u64);
            assert_eq!(pod["runAsUser"], 65532);
            assert_eq!(
                container(docs)["securityContext"],
                json!({
                    "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true,
                    "runAsNonRoot": true,
                    "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
                })
            );
        }),
    ),
    case(
        "a user that is not a number",
        &["--set", "podSecurityContext.runAsUser=nobody"],
        Expect::RefusedBySchema(&["/podSecurityContext/runAsUser"]),
    ),
    case(
        "static protection off by default",
        &[],
        Expect::Renders(|docs| assert!(!has_kind(docs, "DaemonSet"))),
    ),
    // The writer must compile exactly what the controller compiles: every
    // policy flag of the Deployment, the same values.
    case(
        "static protection on",
        &[
            "--set",
            "staticManifests.enabled=true",
            "--set",
            "xrdDefaultMode=convert",
            "--set",
            "breakGlass.requirePermission=false",
        ],
        Expect::Renders(|docs| {
            let ds = find(docs, "DaemonSet");
            let pod = &ds["spec"]["template"]["spec"];
            let args: Vec<&str> = pod["containers"][0]["args"]
                .as_array()
                .expect("args")
                .iter()
                .filter_map(Value::as_str)
                .collect();
            assert!(args.contains(&"--static-only"), "{args:?}");
            assert!(args.contains(&"--static-manifests-dir=/static-manifests"));
            let policy_flag = |a: &&str| {
                [
                    "--xrd-default-mode=",
                    "--gc-",
                    "--crossplane-user=",
                    "--controller-user=",
                    "--sibling-order=",
                    "--break-glass",
                ]
                .iter()
                .any(|p| a.starts_with(p))
            };
            let controller: Vec<&str> = container(docs)["args"]
                .as_array()
                .expect("args")
                .iter()
                .filter_map(Value::as_str)
                .filter(policy_flag)
                .collect();
            let writer: Vec<&str> = args.iter().copied().filter(policy_flag).collect();
            assert_eq!(writer, controller);
            assert_eq!(
                pod["volumes"][0]["hostPath"],
                json!({"path": "/etc/kubernetes/admission/cascade-guard", "type": "DirectoryOrCreate"})
            );
            assert_eq!(
                pod["nodeSelector"],
                json!({"node-role.kubernetes.io/control-plane": ""})
            );
            // Not selected by the Deployment's Service or PDB.
            let deployment_selector = &find(docs, "Deployment")["spec"]["selector"]["matchLabels"];
            let labels = &pod["containers"][0]["name"];
            assert_eq!(labels, "static-manifests");
            assert_ne!(
                ds["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"],
                deployment_selector["app.kubernetes.io/name"]
            );
            assert_eq!(
                pod["containers"][0]["securityContext"]["capabilities"],
                json!({"drop": ["ALL"]})
            );
        }),
    ),
    case(
        "a relative static manifests path",
        &[
            "--set",
            "staticManifests.enabled=true",
            "--set",
            "staticManifests.hostPath=etc/static",
        ],
        Expect::RefusedBySchema(&["/staticManifests/hostPath"]),
    ),
];

/// Every case, all run before any assertion, so that one failure lists
/// every case that fails.
#[test]
fn the_chart_refuses_bad_values_and_renders_good_ones() {
    let mut failures = Vec::new();
    for case in CASES {
        let rendered = template(case.args, case.api_versions);
        let outcome = std::panic::catch_unwind(|| match (&case.expect, &rendered) {
            (Expect::Renders(check), Ok(docs)) => check(docs),
            (Expect::Renders(_), Err(e)) => panic!("refused: {e}"),
            (Expect::RefusedBySchema(words) | Expect::RefusedByTemplate(words), Ok(_)) => {
                panic!("rendered; expected an error with {words:?}")
            }
            (Expect::RefusedBySchema(words) | Expect::RefusedByTemplate(words), Err(e)) => {
                for w in *words {
                    assert!(e.contains(w), "the error does not say {w:?}: {e}");
                }
            }
        });
        if let Err(panic) = outcome {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("{}: {message}", case.name));
            continue;
        }
        // The schema is what helm lint checks values against; a template's
        // check it reports as information only.
        let linted = lint(case.args);
        match (&case.expect, linted) {
            (Expect::RefusedBySchema(_), Ok(())) => {
                failures.push(format!("{}: helm lint accepts it", case.name));
            }
            (Expect::Renders(_), Err(e)) => {
                failures.push(format!("{}: helm lint refuses it: {e}", case.name));
            }
            _ => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The OpenShift override as values.yaml and README.md show it, in a values
/// file (null there, as with --set, removes the default).
#[test]
fn the_chart_takes_the_openshift_override_from_a_values_file() {
    let docs = chart::render("podSecurityContext:\n  runAsUser: null\n  runAsGroup: null\n");
    let pod = pod_security_context(&docs);
    assert!(pod["runAsUser"].is_null(), "{pod}");
    assert!(pod["runAsGroup"].is_null(), "{pod}");
    assert_eq!(pod["runAsNonRoot"], true);
}

/// The chart as shipped lints clean, strictly (warnings fail).
#[test]
fn the_chart_lints_clean() {
    lint(&[]).unwrap_or_else(|e| panic!("helm lint --strict: {e}"));
}
