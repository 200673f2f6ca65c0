//! One small tree and its plan, for the tests of `plan`'s text and pictures.

use serde_json::{Value, json};

use super::picture::{Group, Line, LineKind, Member, Picture, Shape, Wave};
use super::{ModeSource, Plan, teardown_of};
use crate::policy::Mode;
use crate::policy::sibling::graph;

pub fn obj(api_version: &str, kind: &str, name: &str, owner: Option<&str>, spec: Value) -> Value {
    let mut metadata = json!({"name": name, "namespace": "ns", "uid": name});
    if let Some(owner) = owner {
        metadata["ownerReferences"] = json!([{
            "apiVersion": "example.org/v1", "kind": "XR", "name": owner, "uid": owner,
            "controller": true, "blockOwnerDeletion": true,
        }]);
    }
    json!({"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": spec})
}

/// A root composing a cluster side (a Cluster writing a Secret, a
/// ProviderConfig reading it) and a workload side (a Release using the
/// ProviderConfig), with no Usage between them.
pub fn tree() -> Vec<Value> {
    vec![
        obj("example.org/v1", "XR", "root", None, json!({})),
        obj("example.org/v1", "XR", "cluster", Some("root"), json!({})),
        obj("example.org/v1", "XR", "stack", Some("root"), json!({})),
        obj(
            "cloud.example.org/v1",
            "Cluster",
            "prod",
            Some("cluster"),
            json!({"writeConnectionSecretToRef": {"name": "conn"}}),
        ),
        obj("v1", "Secret", "conn", Some("prod"), json!(null)),
        obj(
            "helm.m.crossplane.io/v1beta1",
            "ProviderConfig",
            "helm",
            Some("cluster"),
            json!({"credentials": {"secretRef": {"name": "conn"}}}),
        ),
        obj(
            "helm.m.crossplane.io/v1beta1",
            "Release",
            "web",
            Some("stack"),
            json!({"providerConfigRef": {"name": "helm"}}),
        ),
    ]
}

/// The plan of [`tree`] in `mode`, sibling order not in force (no
/// controller runs) and one Secret not read.
pub fn plan_for(mode: Mode) -> Plan {
    plan_of(&tree(), mode)
}

pub fn plan_of(objects: &[Value], mode: Mode) -> Plan {
    let graph = graph::graph(objects, "root").expect("the root is in the tree");
    let teardown = teardown_of(mode, false);
    Plan {
        root: graph.root.clone(),
        mode,
        mode_source: ModeSource::Policy {
            source: "XRD xrs.example.org".to_string(),
        },
        sibling_order: false,
        not_ordered: vec!["no controller runs: no Lease named cascade-guard in any namespace (is cascade-guard installed? --leader-election-id)".to_string()],
        teardown,
        hazards: graph.hazards(teardown),
        graph,
        unread: vec!["Secret other: forbidden".to_string()],
    }
}

/// The same plan with sibling order in force and everything read.
pub fn ordered(mut plan: Plan) -> Plan {
    plan.sibling_order = true;
    plan.not_ordered.clear();
    plan.unread.clear();
    plan.teardown = teardown_of(plan.mode, true);
    plan.hazards = plan.graph.hazards(plan.teardown);
    plan
}

/// A box named `name` in wave 1, with no look of its own.
pub fn shape(name: &str) -> Shape {
    Shape {
        lines: vec!["Kind".to_string(), name.to_string()],
        wave: Some(0),
        go_between: false,
        outside: false,
        held: false,
        hazard: false,
        deleting: false,
        gone: false,
        blocker: false,
    }
}

/// A picture with one of everything, for the languages' tests: a root's
/// group holding a held go-between and a hazard named like HTML, an object
/// outside, a red line, a quoted label, an order line and a red one that
/// goes back up the waves.
pub fn sample_picture() -> Picture {
    let line = |from, to, kind, label: &str, hazard, ranks| Line {
        from,
        to,
        kind,
        label: label.to_string(),
        hazard,
        ranks,
    };
    Picture {
        title: vec!["T it's".to_string(), "a \"plain\" delete".to_string()],
        shapes: vec![
            Shape {
                wave: Some(1),
                ..shape("root")
            },
            Shape {
                go_between: true,
                held: true,
                ..shape("pc")
            },
            Shape {
                hazard: true,
                ..shape("<b>")
            },
            Shape {
                outside: true,
                wave: None,
                ..shape("out")
            },
        ],
        top: vec![
            Member::Group(Group {
                parent: 0,
                members: vec![Member::Shape(0), Member::Shape(1), Member::Shape(2)],
            }),
            Member::Shape(3),
        ],
        waves: vec![
            Wave {
                label: "wave 1".to_string(),
                shapes: vec![1, 2],
            },
            Wave {
                label: "wave 2".to_string(),
                shapes: vec![0],
            },
        ],
        lines: vec![
            line(2, 1, LineKind::Need, "spec.providerConfigRef", true, true),
            line(1, 3, LineKind::Need, "a \"quoted\" reason", false, true),
            line(2, 0, LineKind::Order, "gone before", false, true),
            line(
                0,
                2,
                LineKind::Order,
                "gone before (in a cycle)",
                true,
                false,
            ),
        ],
    }
}
