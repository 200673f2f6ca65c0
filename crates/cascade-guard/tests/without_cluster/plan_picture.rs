//! `plan -o dot` and `-o mermaid` on the seed's tree, without a cluster:
//! the README's picture is what the code draws today (`UPDATE_README=1`
//! rewrites it), Graphviz's own `dot` reads every dot picture and puts each
//! wave on one rank, and every Mermaid picture keeps to the part of
//! Mermaid's flowchart grammar it uses (the checks of `support/picture.rs`).

use cascade_guard_testkit::picture as picture_check;

use std::collections::BTreeMap;

use cascade_guard::cli::plan::dot::render_dot;
use cascade_guard::cli::plan::mermaid::render_mermaid;
use cascade_guard::cli::plan::picture::Picture;
use cascade_guard::cli::plan::{ModeSource, Plan, teardown_of};
use cascade_guard::policy::Mode;
use cascade_guard::policy::sibling::graph;
use picture_check::{check_mermaid, run_dot};
use serde_json::{Value, json};

const NS: &str = "modelplane-system";

fn owned_by(mut object: Value, owner: &Value) -> Value {
    let reference = json!({
        "apiVersion": owner["apiVersion"], "kind": owner["kind"],
        "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
        "controller": true, "blockOwnerDeletion": true,
    });
    object["metadata"]["ownerReferences"] = json!([reference]);
    object
}

fn object(
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
    name: &str,
    spec: Value,
) -> Value {
    let mut metadata = json!({"name": name, "uid": format!("{kind}/{name}")});
    if let Some(ns) = namespace {
        metadata["namespace"] = json!(ns);
    }
    json!({"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": spec})
}

/// The seed's InferenceCluster `prod` as the demo composes it
/// (testbed/crossplane/modelplane/compositions/, `scripts/demo.sh
/// --no-usage`: Modelplane #212's shape, no Usage written by hand): an
/// EKSCluster (a Cluster writing the connection Secret prod-kubeconfig,
/// which has no owner and so is outside the tree, and the provider-helm and
/// provider-kubernetes ProviderConfigs reading it) and a ServingStack (three
/// Helm Releases and the gateway's Object, on those ProviderConfigs).
fn seed() -> Vec<Value> {
    let ic = object(
        "modelplane.ai/v1alpha1",
        "InferenceCluster",
        None,
        "prod",
        json!({"cluster": {"source": "EKS", "eks": {"region": "us-west-2"}}}),
    );
    let eks = owned_by(
        object(
            "infrastructure.modelplane.ai/v1alpha1",
            "EKSCluster",
            Some(NS),
            "prod",
            json!({"region": "us-west-2"}),
        ),
        &ic,
    );
    let stack = owned_by(
        object(
            "infrastructure.modelplane.ai/v1alpha1",
            "ServingStack",
            Some(NS),
            "prod-serving-stack",
            json!({"secrets": [{"type": "Kubeconfig", "name": "prod-kubeconfig", "key": "kubeconfig"}]}),
        ),
        &ic,
    );
    let cluster = owned_by(
        object(
            "cloud.local-cluster.dev/v1alpha1",
            "Cluster",
            Some(NS),
            "prod",
            json!({"deletionSeconds": 3, "writeConnectionSecretToRef": {"name": "prod-kubeconfig"}}),
        ),
        &eks,
    );
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "prod-kubeconfig", "namespace": NS, "uid": "Secret/prod-kubeconfig"}});
    let credentials = json!({"credentials": {"source": "Secret",
        "secretRef": {"key": "kubeconfig", "name": "prod-kubeconfig", "namespace": NS}}});
    let provider_config = |api_version: &str| {
        owned_by(
            object(
                api_version,
                "ProviderConfig",
                Some(NS),
                "prod-kubeconfig",
                credentials.clone(),
            ),
            &eks,
        )
    };
    let on_the_cluster = |api_version: &str, kind: &str, name: &str| {
        owned_by(
            object(
                api_version,
                kind,
                Some(NS),
                name,
                json!({"providerConfigRef": {"kind": "ProviderConfig", "name": "prod-kubeconfig"}}),
            ),
            &stack,
        )
    };
    let mut objects = vec![
        provider_config("helm.m.crossplane.io/v1beta1"),
        provider_config("kubernetes.m.crossplane.io/v1alpha1"),
        cluster,
        secret,
    ];
    for chart in ["cert-manager", "envoy-gateway", "kube-prometheus-stack"] {
        objects.push(on_the_cluster(
            "helm.m.crossplane.io/v1beta1",
            "Release",
            &format!("prod-serving-stack-{chart}"),
        ));
    }
    objects.push(on_the_cluster(
        "kubernetes.m.crossplane.io/v1alpha1",
        "Object",
        "prod-serving-stack-gateway",
    ));
    objects.extend([ic, eks, stack]);
    objects
}

/// The plan of `objects` (rooted at `root_uid`) in `mode`, with sibling
/// order in force or not.
fn plan_of(objects: &[Value], root_uid: &str, mode: Mode, sibling_order: bool) -> Plan {
    let graph = graph::graph(objects, root_uid).expect("the root is among the objects");
    let teardown = teardown_of(mode, sibling_order);
    Plan {
        root: graph.root.clone(),
        mode,
        mode_source: ModeSource::Policy {
            source: "XRD inferenceclusters.modelplane.ai".to_string(),
        },
        sibling_order,
        not_ordered: if sibling_order || matches!(mode, Mode::Off | Mode::Warn) {
            Vec::new()
        } else {
            vec!["no controller runs".to_string()]
        },
        teardown,
        hazards: graph.hazards(teardown),
        graph,
        unread: Vec::new(),
    }
}

/// The README's picture: the seed's tree under Convert, with sibling order
/// in force (what `scripts/demo.sh --no-usage` plans before its delete).
fn readme_plan() -> Plan {
    plan_of(&seed(), "InferenceCluster/prod", Mode::Convert, true)
}

/// Names no Kubernetes object may have, but a graph takes: each character
/// that means something to Graphviz or Mermaid.
fn awkward() -> Vec<Value> {
    let root = object("example.org/v1", "XR", Some("ns"), "root", json!({}));
    let odd = r#"a"b\c<d>#e;|f`end`&g{h}[i](j)"#;
    let pc = owned_by(
        object(
            "example.org/v1",
            "ProviderConfig",
            Some("ns"),
            odd,
            json!({"credentials": {"secretRef": {"name": "end"}}}),
        ),
        &root,
    );
    let user = owned_by(
        object(
            "example.org/v1",
            "subgraph",
            Some("ns"),
            "graph",
            json!({"providerConfigRef": {"name": odd}}),
        ),
        &root,
    );
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "end", "namespace": "ns", "uid": "s"}});
    vec![root, pc, user, secret]
}

/// Every plan the checks below draw: the seed in each mode, with and
/// without sibling order, and the awkward names.
fn plans() -> Vec<(String, Plan)> {
    let mut plans = Vec::new();
    for mode in [Mode::Off, Mode::Warn, Mode::Refuse, Mode::Convert] {
        for ordered in [false, true] {
            plans.push((
                format!("seed, {mode}, sibling order {ordered}"),
                plan_of(&seed(), "InferenceCluster/prod", mode, ordered),
            ));
        }
    }
    for mode in [Mode::Off, Mode::Convert] {
        plans.push((
            format!("awkward names, {mode}"),
            plan_of(&awkward(), "XR/root", mode, true),
        ));
    }
    plans
}

const BEGIN: &str = "<!-- plan-picture: begin";
const END: &str = "<!-- plan-picture: end -->";

#[test]
fn the_readme_shows_the_picture_the_code_draws() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let readme = std::fs::read_to_string(&path).expect("README.md");
    let fresh = format!("```mermaid\n{}```\n", render_mermaid(&readme_plan()));
    let begin = readme.find(BEGIN).expect("the README's begin marker");
    let body = begin + readme[begin..].find('\n').expect("a line after the marker") + 1;
    let end = body + readme[body..].find(END).expect("the README's end marker");
    if readme[body..end] == fresh {
        return;
    }
    if std::env::var_os("UPDATE_README").is_some_and(|v| v == "1") {
        let updated = format!("{}{fresh}{}", &readme[..body], &readme[end..]);
        std::fs::write(&path, updated).expect("README.md written");
        eprintln!("README.md: the plan picture rewritten");
        return;
    }
    panic!(
        "README.md's plan picture (between {BEGIN} and {END}) is not what the code draws; \
         UPDATE_README=1 cargo test -p cascade-guard --test plan_picture rewrites it. Today's:\n{fresh}"
    );
}

#[test]
fn graphviz_reads_every_dot_picture_and_ranks_each_wave_together() {
    for (what, plan) in plans() {
        let text = render_dot(&plan);
        // `plain` gives each node's centre: y grows upwards.
        let laid = run_dot("plain", &text);
        let mut y: BTreeMap<String, f64> = BTreeMap::new();
        for line in laid.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            if let ["node", id, _x, at, ..] = words.as_slice() {
                y.insert(id.to_string(), at.parse().expect("a number"));
            }
        }
        let picture = Picture::of(&plan);
        let mut previous: Option<f64> = None;
        for (i, wave) in picture.waves.iter().enumerate() {
            let label = y[&format!("w{i}")];
            for shape in &wave.shapes {
                assert_eq!(
                    y[&format!("n{shape}")],
                    label,
                    "{what}: n{shape} off wave {}\n{text}",
                    i + 1
                );
            }
            if let Some(above) = previous {
                assert!(
                    label < above,
                    "{what}: wave {} not below wave {i}\n{text}",
                    i + 1
                );
            }
            previous = Some(label);
        }
        assert_eq!(
            y.len(),
            picture.shapes.len() + picture.waves.len(),
            "{what}: every object drawn once\n{text}"
        );
    }
}

#[test]
fn every_mermaid_picture_keeps_to_the_flowchart_grammar() {
    for (what, plan) in plans() {
        let text = render_mermaid(&plan);
        if let Err(why) = check_mermaid(&text) {
            panic!("{what}: {why}\n{text}");
        }
        let picture = Picture::of(&plan);
        assert_eq!(
            text.lines()
                .filter(|l| l.trim_start().starts_with('n') && l.contains("[\""))
                .count(),
            picture.shapes.len(),
            "{what}: every object drawn once\n{text}"
        );
    }
}

#[test]
fn the_checker_refuses_what_mermaid_would_misread() {
    let good = "---\ntitle: 'T'\n---\nflowchart TB\n  n0[\"a\"]\n  n1[\"b\"]\n  n0 -->|\"x\"| n1\n";
    assert_eq!(check_mermaid(good), Ok(()));
    let cases = [
        ("  n2[\"a \"quoted\" word\"]\n", "quote"),
        ("  end[\"a\"]\n", "keyword id"),
        ("  n2[\"a #quot b\"]\n", "bare #"),
        ("  n2[\"<b>bold</b>\"]\n", "HTML"),
        ("  n0 -->|\"x\"| n9\n", "undeclared box"),
        ("  n0 -->|\"a|b\"| n1\n", "pipe in a line's text"),
        ("  subgraph t0 [\" \"]\n", "no end"),
        ("  end\n", "end without subgraph"),
        ("  linkStyle 1 stroke:#000\n", "no such line"),
        ("  class n0 nothing\n", "undefined class"),
        ("  n0[\"a\"]\n", "an id twice"),
    ];
    for (extra, what) in cases {
        assert!(
            check_mermaid(&format!("{good}{extra}")).is_err(),
            "{what} let through"
        );
    }
}
