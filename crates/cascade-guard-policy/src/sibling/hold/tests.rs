use serde_json::{Value, json};

use super::*;
use crate::sibling::graph::graph;

fn obj(kind: &str, name: &str, owner: Option<&str>, deleting: bool) -> Value {
    let mut metadata = json!({"name": name, "namespace": "ns", "uid": name});
    if let Some(owner) = owner {
        metadata["ownerReferences"] = json!([{
            "apiVersion": "example.org/v1", "kind": "XR", "name": owner, "uid": owner,
            "controller": true, "blockOwnerDeletion": true,
        }]);
    }
    if deleting {
        metadata["deletionTimestamp"] = json!("2026-12-03T00:00:00Z");
    }
    json!({"apiVersion": "example.org/v1", "kind": kind, "metadata": metadata})
}

/// root composes `stack` and `cluster`; stack's `app` needs `cluster`
/// (the annotation), so stack must be gone before cluster goes.
fn tree(root_deleting: bool, stack: bool, cluster_deleting: bool) -> Vec<Value> {
    let mut objects = vec![
        obj("XR", "root", None, root_deleting),
        obj("XR", "cluster", Some("root"), cluster_deleting),
    ];
    if stack {
        let mut app = obj("App", "app", Some("stack"), false);
        app["metadata"]["annotations"] =
            json!({"cascade-guard.dev/needs": "XR.example.org/cluster"});
        objects.push(obj("XR", "stack", Some("root"), root_deleting));
        objects.push(app);
    }
    objects
}

/// Held, each for `words`.
fn held_as<const N: usize>(words: &str, objects: [ObjectRef; N]) -> Held {
    objects
        .into_iter()
        .map(|o| (o, words.to_string()))
        .collect()
}

fn r(kind: &str, name: &str) -> ObjectRef {
    ObjectRef::new("example.org", kind, Some("ns"), name)
}

#[test]
fn a_needed_sibling_is_held_until_its_needers_are_gone_then_deleted_if_its_parent_is() {
    let cluster = || r("XR", "cluster");
    let held = || Held::from([(cluster(), "XR ns/stack".to_string())]);
    // The stack still there, its App (the needer) gone before it.
    let needer_gone = |root_deleting: bool, cluster_deleting: bool| -> Vec<Value> {
        let mut objects = tree(root_deleting, true, cluster_deleting);
        objects.retain(|o| o["kind"] != "App");
        objects
    };
    type Case = (&'static str, Vec<Value>, Held, Vec<Action>);
    let cases: Vec<Case> = vec![
        (
            "live tree, not yet held: hold it",
            tree(false, true, false),
            Held::new(),
            vec![Action::Hold {
                object: cluster(),
                held_for: "XR ns/stack".to_string(),
            }],
        ),
        (
            "live tree, held: nothing",
            tree(false, true, false),
            held(),
            vec![],
        ),
        (
            "live tree, held for another that is still there: its words grow",
            tree(false, true, false),
            Held::from([(cluster(), "XR ns/root".to_string())]),
            vec![Action::Hold {
                object: cluster(),
                held_for: "XR ns/root, XR ns/stack".to_string(),
            }],
        ),
        (
            "live tree, held for one that is gone: its words name what waits now",
            tree(false, true, false),
            Held::from([(cluster(), "XR ns/gone".to_string())]),
            vec![Action::Hold {
                object: cluster(),
                held_for: "XR ns/stack".to_string(),
            }],
        ),
        (
            "root deleting, the needer still there: keep holding",
            tree(true, true, false),
            held(),
            vec![],
        ),
        (
            "root deleting, the needer gone: delete it, still labelled",
            tree(true, false, false),
            held(),
            vec![Action::Delete { object: cluster() }],
        ),
        (
            "live root, the needer gone: release only",
            tree(false, false, false),
            held(),
            vec![Action::Release { object: cluster() }],
        ),
        (
            "root deleting, the needer gone, the stack it was held for still going: keep holding",
            needer_gone(true, false),
            held(),
            vec![],
        ),
        (
            "the same, held for words that name something else: delete it",
            needer_gone(true, false),
            Held::from([(cluster(), "XR ns/other, Release ns/stack".to_string())]),
            vec![Action::Delete { object: cluster() }],
        ),
        (
            "live root, the needer gone, the stack live: release only",
            needer_gone(false, false),
            held(),
            vec![Action::Release { object: cluster() }],
        ),
        (
            "the stack going, but it was deleted anyway (break-glass): released",
            needer_gone(true, true),
            held(),
            vec![Action::Release { object: cluster() }],
        ),
        (
            "already deleting (held too late, or break-glass): never held",
            tree(true, true, true),
            Held::new(),
            vec![],
        ),
        (
            "deleting and still labelled: released, not deleted again (the next look after a delete)",
            tree(true, false, true),
            held(),
            vec![Action::Release { object: cluster() }],
        ),
    ];
    for (what, objects, held_now, want) in cases {
        let g = graph(&objects, "root").expect("root");
        assert_eq!(actions(&g, &held_now, &BTreeSet::new()), want, "{what}");
    }
}

#[test]
fn a_usage_composed_beside_the_siblings_needs_no_hold() {
    let mut objects = tree(false, true, false);
    let mut usage = obj("Usage", "uses", Some("root"), false);
    usage["apiVersion"] = json!("protection.crossplane.io/v1beta1");
    usage["metadata"]["labels"] = json!({crate::sibling::graph::COMPOSITE_LABEL: "root"});
    usage["spec"] = json!({
        "of": {"apiVersion": "example.org/v1", "kind": "XR", "resourceRef": {"name": "cluster"}},
        "by": {"apiVersion": "example.org/v1", "kind": "XR", "resourceRef": {"name": "stack"}},
    });
    objects.push(usage);
    let g = graph(&objects, "root").expect("root");
    assert!(!g.sibling_edges.is_empty());
    assert_eq!(actions(&g, &Held::new(), &BTreeSet::new()), vec![]);
}

/// A standalone Usage of `of` by `by`, owned by its user as Crossplane's
/// Usage controller makes it (no controller, no blockOwnerDeletion).
fn standalone_usage(of: &str, by: &str, owner_present: bool) -> Value {
    let mut usage = obj("Usage", "uses", None, false);
    usage["apiVersion"] = json!("protection.crossplane.io/v1beta1");
    if owner_present {
        usage["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "example.org/v1", "kind": "XR", "name": by, "uid": by,
        }]);
    }
    usage["spec"] = json!({
        "of": {"apiVersion": "example.org/v1", "kind": "XR", "resourceRef": {"name": of}},
        "by": {"apiVersion": "example.org/v1", "kind": "XR", "resourceRef": {"name": by}},
        "replayDeletion": true,
    });
    usage
}

#[test]
fn a_standalone_usage_is_held_until_its_user_is_gone() {
    let usage = || ObjectRef::new("protection.crossplane.io", "Usage", Some("ns"), "uses");
    let in_use = BTreeSet::from([r("XR", "cluster")]);
    let held = || held_as("XR ns/stack", [usage()]);
    let hold = || {
        vec![Action::Hold {
            object: usage(),
            held_for: "XR ns/stack".to_string(),
        }]
    };
    // Between two siblings of one tree: root composes stack and
    // cluster; the Usage of cluster by stack was written by hand.
    let beside = |root_deleting: bool, stack: bool| {
        let mut objects = tree(root_deleting, stack, false);
        objects.push(standalone_usage("cluster", "stack", stack));
        objects
    };
    // Between two roots: the tree of `stack` alone, `cluster` outside.
    let across = |stack_deleting: bool| {
        vec![
            obj("XR", "stack", None, stack_deleting),
            obj("XR", "cluster", None, false),
            standalone_usage("cluster", "stack", true),
        ]
    };
    type Case = (&'static str, Vec<Value>, &'static str, Held, Vec<Action>);
    let cases: Vec<Case> = vec![
        (
            "siblings, live: hold the Usage, not what it keeps",
            beside(false, true),
            "root",
            Held::new(),
            hold(),
        ),
        (
            "siblings, held: nothing",
            beside(false, true),
            "root",
            held(),
            vec![],
        ),
        (
            "siblings, the root deleting, the user still there: keep holding",
            beside(true, true),
            "root",
            held(),
            vec![],
        ),
        (
            "siblings, the user gone: let the Usage go (Crossplane then replays)",
            beside(true, false),
            "root",
            held(),
            vec![Action::Release { object: usage() }],
        ),
        (
            "two roots, live: hold the Usage",
            across(false),
            "stack",
            Held::new(),
            hold(),
        ),
        (
            "two roots, the user deleting: keep holding",
            across(true),
            "stack",
            held(),
            vec![],
        ),
    ];
    for (what, objects, root, held_now, want) in cases {
        let g = graph(&objects, root).expect("root");
        assert_eq!(actions(&g, &held_now, &in_use), want, "{what}");
    }
    // Composed (Crossplane's label): Crossplane keeps it itself.
    let mut composed = beside(false, true);
    if let Some(u) = composed.last_mut() {
        u["metadata"]["labels"] = json!({crate::sibling::graph::COMPOSITE_LABEL: "root"});
    }
    let g = graph(&composed, "root").expect("root");
    assert_eq!(actions(&g, &Held::new(), &in_use), vec![]);
    // Already deleting (its delete went through): not held.
    let mut deleting = across(false);
    deleting[2]["metadata"]["deletionTimestamp"] = json!("2026-12-03T00:00:00Z");
    let g = graph(&deleting, "stack").expect("root");
    assert_eq!(actions(&g, &Held::new(), &BTreeSet::new()), vec![]);
}

/// root composes ProviderConfig `pc` and a Release using it, whose
/// finalizers are `finalizers`.
fn managed_tree(finalizers: &[&str], deleting: bool) -> Vec<Value> {
    let mut pc = obj("ProviderConfig", "pc", Some("root"), false);
    pc["apiVersion"] = json!("helm.m.crossplane.io/v1beta1");
    let mut release = obj("Release", "app", Some("root"), deleting);
    release["apiVersion"] = json!("helm.m.crossplane.io/v1beta1");
    release["metadata"]["finalizers"] = json!(finalizers);
    release["spec"] = json!({"providerConfigRef": {"name": "pc", "kind": "ProviderConfig"}});
    vec![obj("XR", "root", None, deleting), pc, release]
}

#[test]
fn a_managed_resources_provider_config_usage_is_held_until_its_provider_is_done() {
    // Named by the Release's uid ("app" here), in its namespace and the
    // ProviderConfig's group.
    let usage = || {
        ObjectRef::new(
            "helm.m.crossplane.io",
            crate::sibling::provider_config_usage::KIND,
            Some("ns"),
            "app",
        )
    };
    let provider = "finalizer.managedresource.crossplane.io";
    type Case = (&'static str, Vec<Value>, Held, Vec<Action>);
    let cases: Vec<Case> = vec![
        (
            "live, not held: hold it, though it was never read",
            managed_tree(&[provider], false),
            Held::new(),
            vec![Action::Hold {
                object: usage(),
                held_for: "Release ns/app".to_string(),
            }],
        ),
        (
            "live, held: nothing",
            managed_tree(&[provider], false),
            held_as("Release ns/app", [usage()]),
            vec![],
        ),
        (
            "deleting, its provider still at work: keep holding",
            managed_tree(&[provider], true),
            held_as("Release ns/app", [usage()]),
            vec![],
        ),
        (
            "in a foreground cascade, its provider waiting for it: keep holding, unblock",
            managed_tree(&["foregroundDeletion", provider], true),
            held_as("Release ns/app", [usage()]),
            vec![Action::Unblock {
                object: usage(),
                owner_uid: "app".to_string(),
            }],
        ),
        (
            "deleting, its provider done: let go (the controller deletes it)",
            managed_tree(&["foregroundDeletion"], true),
            held_as("Release ns/app", [usage()]),
            vec![Action::Release { object: usage() }],
        ),
        (
            "deleting, its provider done, never held: nothing",
            managed_tree(&["foregroundDeletion"], true),
            Held::new(),
            vec![],
        ),
    ];
    // The ProviderConfig beside the Release is held by its sibling edge
    // (the tests above); here only what concerns the usage.
    let of_usage = |a: &Action| a.object().kind == crate::sibling::provider_config_usage::KIND;
    for (what, objects, held_now, want) in cases {
        let g = graph(&objects, "root").expect("root");
        let got: Vec<Action> = actions(&g, &held_now, &BTreeSet::new())
            .into_iter()
            .filter(of_usage)
            .collect();
        assert_eq!(got, want, "{what}");
    }
}

#[test]
fn what_another_trees_managed_resource_needs_is_held_until_it_is_gone() {
    // root composes a cloud Cluster writing Secret `kc` and the
    // ProviderConfig `pc` reading it; a Release of another tree (no owner
    // here) installs through `pc`.
    let provider_config = || {
        let mut pc = obj("ProviderConfig", "pc", Some("root"), false);
        pc["apiVersion"] = json!("helm.m.crossplane.io/v1beta1");
        pc["spec"] = json!({"credentials": {"secretRef": {"name": "kc", "namespace": "ns"}}});
        pc
    };
    let cluster = || {
        let mut c = obj("Cluster", "c", Some("root"), false);
        c["spec"] = json!({"writeConnectionSecretToRef": {"name": "kc", "namespace": "ns"}});
        c
    };
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
                        "metadata": {"name": "kc", "namespace": "ns", "uid": "kc"}});
    let user = |deleting: bool| {
        let mut r = obj("Release", "app", None, deleting);
        r["apiVersion"] = json!("helm.m.crossplane.io/v1beta1");
        r["metadata"]["finalizers"] = json!(["finalizer.managedresource.crossplane.io"]);
        r["spec"] = json!({"providerConfigRef": {"name": "pc", "kind": "ProviderConfig"}});
        r
    };
    let objects = |with_user: Option<bool>| {
        let mut o = vec![
            obj("XR", "root", None, false),
            provider_config(),
            cluster(),
            secret.clone(),
        ];
        o.extend(with_user.map(user));
        o
    };
    let pc_ref = || ObjectRef::new("helm.m.crossplane.io", "ProviderConfig", Some("ns"), "pc");
    let cluster_ref = || r("Cluster", "c");
    let g = graph(&objects(Some(false)), "root").expect("root");
    let users: Vec<String> = g.outside_users().iter().map(ToString::to_string).collect();
    assert_eq!(
        users,
        vec![
            "Release ns/app needs Cluster ns/c (through ProviderConfig.helm.m.crossplane.io ns/pc and Secret ns/kc)"
        ]
    );
    // Held: the ProviderConfig and the Cluster, not the Secret outside
    // the tree (the cascade does not delete it).
    let held_for = "Release ns/app".to_string();
    assert_eq!(
        actions(&g, &Held::new(), &BTreeSet::new()),
        vec![
            Action::Hold {
                object: cluster_ref(),
                held_for: held_for.clone()
            },
            Action::Hold {
                object: pc_ref(),
                held_for
            },
        ]
    );
    // Its user deleting: still held. Gone: let go.
    let held = held_as("Release ns/app", [pc_ref(), cluster_ref()]);
    let g = graph(&objects(Some(true)), "root").expect("root");
    assert_eq!(actions(&g, &held, &BTreeSet::new()), vec![]);
    let g = graph(&objects(None), "root").expect("root");
    assert_eq!(
        actions(&g, &held, &BTreeSet::new()),
        vec![
            Action::Release {
                object: cluster_ref()
            },
            Action::Release { object: pc_ref() },
        ]
    );
    // A foreground or background delete of the tree takes them from
    // under it: a hazard; ordered, none.
    let g = graph(&objects(Some(false)), "root").expect("root");
    for (teardown, want) in [
        (crate::sibling::hazards::Teardown::Background, 1),
        (crate::sibling::hazards::Teardown::Foreground, 1),
        (crate::sibling::hazards::Teardown::Ordered, 0),
    ] {
        let outside = g
            .hazards(teardown)
            .into_iter()
            .filter(|h| h.kind == crate::sibling::hazards::HazardKind::OutsideUser)
            .count();
        assert_eq!(outside, want, "{teardown:?}");
    }
}

#[test]
fn an_object_a_usage_marks_in_use_is_left_to_crossplane() {
    let g = graph(&tree(false, true, false), "root").expect("root");
    let cluster = BTreeSet::from([r("XR", "cluster")]);
    assert_eq!(actions(&g, &Held::new(), &cluster), vec![]);
    // Held before the Usage took hold of it: let go.
    assert_eq!(
        actions(&g, &held_as("XR ns/stack", [r("XR", "cluster")]), &cluster),
        vec![Action::Release {
            object: r("XR", "cluster")
        }]
    );
}

#[test]
fn siblings_in_a_cycle_are_not_held() {
    let mut objects = tree(false, true, false);
    objects[1]["metadata"]["annotations"] =
        json!({"cascade-guard.dev/needs": "XR.example.org/stack"});
    let g = graph(&objects, "root").expect("root");
    assert!(!g.cycles.is_empty(), "{:?}", g.sibling_edges);
    assert_eq!(actions(&g, &Held::new(), &BTreeSet::new()), vec![]);
}
