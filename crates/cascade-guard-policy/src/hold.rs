//! Ordered teardown (pure): holding back the delete of an object that a
//! sibling still needs, and letting it go when nothing needs it.
//!
//! A foreground cascade deletes all children of a parent at once, so the
//! [`order`](crate::order) graph's sibling edges ("ServingStack must be gone
//! before EKSCluster goes") are not kept by the API. cascade-guard keeps them
//! with a label and one admission policy:
//!
//! - every object that must wait for a sibling (the `after` of a sibling
//!   edge) carries [`HOLD_LABEL`] (its value: the root's uid) and
//!   [`HELD_FOR_ANNOTATION`] (what it waits for, in words);
//! - the ValidatingAdmissionPolicy of [`compile_hold`] refuses every DELETE
//!   of a labelled object, the garbage collector's and the namespace
//!   controller's included, and every UPDATE that takes the label away or
//!   changes it, except by cascade-guard itself or with break-glass (and a
//!   delete by Crossplane, which cascade-guard never refuses). The
//!   object stays live: no deletionTimestamp, so no provider starts deleting
//!   what it manages. A finalizer could not do that;
//! - when everything it waits for is gone, cascade-guard deletes it itself
//!   if its parent is being deleted (the garbage collector's delete was
//!   refused), with a foreground cascade, and then removes the label; if its
//!   parent is not being deleted, it only removes the label ([`actions`]).
//!
//! Objects in a cycle of sibling edges are not held: the cycle is reported
//! and the tree falls back to the plain foreground cascade.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::admissionregistration::v1::{
    MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec, Validation,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};

use crate::admission::Compiled;
use crate::cel::{break_glass_for, cel_string_literal};
use crate::names::BREAK_GLASS_ANNOTATION;
use crate::order::{Graph, ObjectRef};
use crate::settings::CompileSettings;

/// On an object whose delete waits for its siblings; the value is the uid of
/// the root of the tree that holds it.
pub const HOLD_LABEL: &str = "cascade-guard.dev/hold";
/// What a held object waits for, in words: the refusal quotes it.
pub const HELD_FOR_ANNOTATION: &str = "cascade-guard.dev/held-for";
/// The name of the hold policy and its binding.
pub const HOLD_OBJECT_NAME: &str = "cascade-guard-sibling-order";
/// The label on the hold policy and binding, by which cascade-guard finds
/// them (they are not part of the policies' plan, whose objects carry the
/// managed-by label, so the sync pass leaves them alone).
pub const SIBLING_ORDER_LABEL: &str = "cascade-guard.dev/sibling-order";

/// The ValidatingAdmissionPolicy and binding that hold labelled objects.
pub fn compile_hold(settings: &CompileSettings) -> Compiled {
    let controller = cel_string_literal(&settings.controller_user);
    // Crossplane's own deletes go through: a composition that drops a
    // resource, and a Usage's replay, which comes only once the Usage's user
    // is gone. cascade-guard never refuses Crossplane.
    let crossplane = cel_string_literal(&settings.crossplane_user);
    let allowed_delete = format!(
        "request.userInfo.username == {controller} || request.userInfo.username == {crossplane} || ({})",
        break_glass_for(settings, "oldObject")
    );
    let label = |o: &str| {
        format!(
            "(has({o}.metadata.labels) && '{HOLD_LABEL}' in {o}.metadata.labels ? {o}.metadata.labels['{HOLD_LABEL}'] : '')"
        )
    };
    let allowed_update = format!(
        "{new} == {old} || request.userInfo.username == {controller} || ({bg})",
        new = label("object"),
        old = label("oldObject"),
        bg = break_glass_for(settings, "object"),
    );
    let held_for = format!(
        "(has(oldObject.metadata.annotations) && '{HELD_FOR_ANNOTATION}' in oldObject.metadata.annotations ? oldObject.metadata.annotations['{HELD_FOR_ANNOTATION}'] : 'what needs it')"
    );
    let validations = vec![
        Validation {
            expression: format!("request.operation != 'DELETE' || {allowed_delete}"),
            message_expression: Some(format!(
                "'cascade-guard holds ' + oldObject.kind + ' ' + oldObject.metadata.name + ' until ' + {held_for} + ' is gone (sibling order); it deletes it then. To delete it now: annotate it {BREAK_GLASS_ANNOTATION}=<reason>.'"
            )),
            reason: Some("Forbidden".to_string()),
            ..Validation::default()
        },
        Validation {
            expression: format!("request.operation != 'UPDATE' || {allowed_update}"),
            message: Some(format!(
                "only cascade-guard may change or remove the label {HOLD_LABEL}: it holds the object until what needs it is gone"
            )),
            reason: Some("Forbidden".to_string()),
            ..Validation::default()
        },
    ];
    let metadata = sibling_order_metadata(HOLD_OBJECT_NAME);
    let held = LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: HOLD_LABEL.to_string(),
            operator: "Exists".to_string(),
            values: None,
        }]),
        match_labels: None,
    };
    let policy = ValidatingAdmissionPolicy {
        metadata: metadata.clone(),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".to_string()),
            match_constraints: Some(MatchResources {
                // Any kind can be needed; the object selector keeps every
                // request but those of held objects to one label lookup.
                resource_rules: Some(vec![NamedRuleWithOperations {
                    api_groups: Some(vec!["*".to_string()]),
                    api_versions: Some(vec!["*".to_string()]),
                    resources: Some(vec!["*".to_string()]),
                    operations: Some(vec!["DELETE".to_string(), "UPDATE".to_string()]),
                    scope: Some("*".to_string()),
                    resource_names: None,
                }]),
                object_selector: Some(held.clone()),
                match_policy: Some("Exact".to_string()),
                ..MatchResources::default()
            }),
            validations: Some(validations),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    };
    let binding = ValidatingAdmissionPolicyBinding {
        metadata,
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: HOLD_OBJECT_NAME.to_string(),
            validation_actions: vec!["Deny".to_string()],
            match_resources: None,
            param_ref: None,
        },
    };
    Compiled { policy, binding }
}

/// The metadata of an admission object of sibling order's: its name, and
/// the label by which cascade-guard (and `uninstall`) find it.
pub(crate) fn sibling_order_metadata(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        labels: Some(BTreeMap::from([(
            SIBLING_ORDER_LABEL.to_string(),
            "true".to_string(),
        )])),
        ..ObjectMeta::default()
    }
}

/// What cascade-guard does to one object of a tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Label it: a sibling still needs it.
    Hold { object: ObjectRef, held_for: String },
    /// Take the label away: nothing needs it any more.
    Release { object: ObjectRef },
    /// Delete it (Foreground): its parent is being deleted, so the garbage
    /// collector tried and was refused while it was held.
    Delete { object: ObjectRef },
}

/// What to do to the tree of `graph`, given which of the objects read carry
/// the hold label of this tree's root now (`held_now`) and which a
/// Crossplane Usage marks in use (`crossplane.io/in-use`). Objects outside
/// the tree are never held; one held before and now outside (a standalone
/// Usage whose user is gone) is let go. Neither is one already being deleted
/// (its delete went through: holding it now would hold nothing back), nor
/// one in use: Crossplane's webhook refuses its delete and replays it when
/// the Usage lets go, and a hold, which admission checks before any
/// webhook, would keep the webhook from recording the attempt it replays.
/// That Usage, when it is standalone, is itself held until its user is gone
/// ([`Graph::standalone_usages`]), so the replay comes only then.
pub fn actions(
    graph: &Graph,
    held_now: &BTreeSet<ObjectRef>,
    in_use: &BTreeSet<ObjectRef>,
) -> Vec<Action> {
    let mut wanted: BTreeMap<ObjectRef, BTreeSet<String>> = BTreeMap::new();
    for (usage, by) in graph.standalone_usages() {
        if graph.node(&usage).is_some_and(|n| !n.deleting) {
            wanted.entry(usage).or_default().insert(by.to_string());
        }
    }
    for edge in graph.sibling_edges.iter().filter(|e| !e.in_cycle) {
        let deleting = graph.node(&edge.after).is_some_and(|n| n.deleting);
        // A Usage composed beside the two already keeps every need of the
        // edge: Crossplane's webhook refuses the delete and replays it, and
        // a second hold would only refuse that replay.
        let usage_keeps_it = edge.reasons.iter().all(|need| graph.held_by_usage(need));
        if !deleting && !usage_keeps_it && !in_use.contains(&edge.after) {
            wanted
                .entry(edge.after.clone())
                .or_default()
                .insert(edge.before.to_string());
        }
    }
    let mut out = Vec::new();
    for node in &graph.nodes {
        let held = held_now.contains(&node.object);
        if !node.in_tree {
            if held {
                out.push(Action::Release {
                    object: node.object.clone(),
                });
            }
            continue;
        }
        match (wanted.get(&node.object), held) {
            (Some(before), false) => out.push(Action::Hold {
                object: node.object.clone(),
                held_for: before.iter().cloned().collect::<Vec<_>>().join(", "),
            }),
            (None, true) => {
                let parent_deleting = node
                    .parent
                    .as_ref()
                    .and_then(|p| graph.node(p))
                    .is_some_and(|p| p.deleting);
                // Deleted while still labelled, so that a delete refused by
                // someone else (Crossplane's Usage webhook) is simply tried
                // again; the label goes once the delete went through.
                let object = node.object.clone();
                out.push(if parent_deleting && !node.deleting {
                    Action::Delete { object }
                } else {
                    Action::Release { object }
                });
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::order::graph;

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

    fn r(kind: &str, name: &str) -> ObjectRef {
        ObjectRef::new("example.org", kind, Some("ns"), name)
    }

    #[test]
    fn a_needed_sibling_is_held_until_its_needers_are_gone_then_deleted_if_its_parent_is() {
        let cluster = || r("XR", "cluster");
        let held = || BTreeSet::from([cluster()]);
        type Case = (&'static str, Vec<Value>, BTreeSet<ObjectRef>, Vec<Action>);
        let cases: Vec<Case> = vec![
            (
                "live tree, not yet held: hold it",
                tree(false, true, false),
                BTreeSet::new(),
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
                "already deleting (held too late, or break-glass): never held",
                tree(true, true, true),
                BTreeSet::new(),
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
        usage["metadata"]["labels"] = json!({crate::order::COMPOSITE_LABEL: "root"});
        usage["spec"] = json!({
            "of": {"apiVersion": "example.org/v1", "kind": "XR", "resourceRef": {"name": "cluster"}},
            "by": {"apiVersion": "example.org/v1", "kind": "XR", "resourceRef": {"name": "stack"}},
        });
        objects.push(usage);
        let g = graph(&objects, "root").expect("root");
        assert!(!g.sibling_edges.is_empty());
        assert_eq!(actions(&g, &BTreeSet::new(), &BTreeSet::new()), vec![]);
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
        let held = || BTreeSet::from([usage()]);
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
        type Case = (
            &'static str,
            Vec<Value>,
            &'static str,
            BTreeSet<ObjectRef>,
            Vec<Action>,
        );
        let cases: Vec<Case> = vec![
            (
                "siblings, live: hold the Usage, not what it keeps",
                beside(false, true),
                "root",
                BTreeSet::new(),
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
                BTreeSet::new(),
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
            u["metadata"]["labels"] = json!({crate::order::COMPOSITE_LABEL: "root"});
        }
        let g = graph(&composed, "root").expect("root");
        assert_eq!(actions(&g, &BTreeSet::new(), &in_use), vec![]);
        // Already deleting (its delete went through): not held.
        let mut deleting = across(false);
        deleting[2]["metadata"]["deletionTimestamp"] = json!("2026-12-03T00:00:00Z");
        let g = graph(&deleting, "stack").expect("root");
        assert_eq!(actions(&g, &BTreeSet::new(), &BTreeSet::new()), vec![]);
    }

    #[test]
    fn an_object_a_usage_marks_in_use_is_left_to_crossplane() {
        let g = graph(&tree(false, true, false), "root").expect("root");
        let cluster = BTreeSet::from([r("XR", "cluster")]);
        assert_eq!(actions(&g, &BTreeSet::new(), &cluster), vec![]);
        // Held before the Usage took hold of it: let go.
        assert_eq!(
            actions(&g, &cluster, &cluster),
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
        assert_eq!(actions(&g, &BTreeSet::new(), &BTreeSet::new()), vec![]);
    }

    #[test]
    fn the_hold_policy_refuses_deletes_and_label_changes_but_cascade_guards_own() {
        let settings = CompileSettings {
            controller_user: "system:serviceaccount:cg:cascade-guard".to_string(),
            ..CompileSettings::default()
        };
        let compiled = compile_hold(&settings);
        let policy = serde_json::to_value(&compiled.policy).expect("serializes");
        let rules = &policy["spec"]["matchConstraints"];
        assert_eq!(rules["resourceRules"][0]["resources"], json!(["*"]));
        assert_eq!(
            rules["objectSelector"]["matchExpressions"][0]["key"],
            json!(HOLD_LABEL)
        );
        let expressions: Vec<&str> = policy["spec"]["validations"]
            .as_array()
            .expect("validations")
            .iter()
            .filter_map(|v| v["expression"].as_str())
            .collect();
        assert_eq!(expressions.len(), 2);
        for e in &expressions {
            assert!(
                e.contains(
                    r#"request.userInfo.username == "system:serviceaccount:cg:cascade-guard""#
                ),
                "{e}"
            );
            assert!(e.contains("breakglass"), "{e}");
        }
        let binding = serde_json::to_value(&compiled.binding).expect("serializes");
        assert_eq!(binding["spec"]["policyName"], json!(HOLD_OBJECT_NAME));
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    }
}
