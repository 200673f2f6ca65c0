//! Ordered teardown (pure): holding back the delete of an object that a
//! sibling still needs, and letting it go when nothing needs it.
//!
//! A foreground cascade deletes all children of a parent at once, so the
//! [`graph`](crate::sibling::graph) graph's sibling edges ("ServingStack must be gone
//! before EKSCluster goes") are not kept by the API. cascade-guard keeps them
//! with one record and one admission policy, and writes nothing to the
//! objects it holds:
//!
//! - every object that must wait for a sibling (the `after` of a sibling
//!   edge) has an entry in the ConfigMap [`HOLDS`] of the controller's
//!   namespace: its [`hold_key`] (kind, group, namespace and name), and a
//!   [`HoldEntry`] (the root's uid, what it waits for in words);
//! - the ValidatingAdmissionPolicy of [`compile_hold`] reads that record
//!   as its parameter and refuses every DELETE of an object it names, the
//!   garbage collector's and the namespace controller's included, except
//!   cascade-guard's own, Crossplane's (which cascade-guard never refuses) and
//!   break-glass. A second policy, of [`compile_record_guard`], refuses every
//!   change or delete of the record (or of the one of [`crate::sibling::gate`])
//!   by anyone but cascade-guard. The object stays
//!   live: no deletionTimestamp, so no provider starts deleting what it
//!   manages. A finalizer could not do that;
//! - when everything it waits for is gone, its entry goes, and cascade-guard
//!   deletes it itself if its parent is being deleted and it may (the
//!   garbage collector's delete was refused; its retry would come only after
//!   its back-off); where it may not, the garbage collector's retry deletes
//!   it ([`actions`]).
//!
//! Holding so needs no permission on the held objects, which may be Secrets
//! and ProviderConfigs of any provider; a label or an entry forged, restored
//! from a backup or left by an older install holds nothing, since only the
//! controller writes the record.
//!
//! Objects in a cycle of sibling edges are not held: the cycle is reported
//! and the tree falls back to the plain foreground cascade.
//!
//! What an object outside the tree needs inside it (another tree's Release
//! installing through this tree's ProviderConfig onto its cloud cluster,
//! [`Graph::outside_users`]) is held too, until that object is gone: the
//! cascade never deletes it.
//!
//! The same record holds each namespaced managed resource's
//! ProviderConfigUsage until its provider is done with it, so that a
//! namespace deletion cannot wedge the managed resource
//! ([`crate::sibling::provider_config_usage`]).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ParamKind, ParamRef,
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingAdmissionPolicyBindingSpec, ValidatingAdmissionPolicySpec, Validation, Variable,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use crate::admission::Compiled;
use crate::cel::{break_glass_for, cel_string_literal};
use crate::names::{BREAK_GLASS_ANNOTATION, GROUP};
use crate::settings::CompileSettings;
use crate::sibling::gate::ORDERED_TREES;
use crate::sibling::graph::Graph;
use crate::sibling::object::ObjectRef;
use crate::sibling::provider_config_usage::tracked_usages;

/// The label by which cascade-guard held objects before it kept its holds in
/// [`HOLDS`]; it is taken off where seen, and holds nothing now.
pub const HOLD_LABEL: &str = "cascade-guard.dev/hold";
/// What a held object waited for, beside [`HOLD_LABEL`]; taken off with it.
pub const HELD_FOR_ANNOTATION: &str = "cascade-guard.dev/held-for";
/// The ConfigMap, in the controller's namespace, naming every object held.
pub const HOLDS: &str = "cascade-guard-holds";
/// The name of the hold policy and its binding.
pub const HOLD_OBJECT_NAME: &str = "cascade-guard-sibling-order";
/// The name of the policy and binding that keep sibling order's two
/// ConfigMaps cascade-guard's alone.
pub const RECORD_GUARD_NAME: &str = "cascade-guard-sibling-order-records";
/// The label on the hold policy and binding, by which cascade-guard finds
/// them (they are not part of the policies' plan, whose objects carry the
/// managed-by label, so the sync pass leaves them alone).
pub const SIBLING_ORDER_LABEL: &str = "cascade-guard.dev/sibling-order";

/// The longest key a hold takes (the length of a ConfigMap key, where holds
/// were kept first).
const MAX_KEY: usize = 253;

/// An object's key in [`HOLDS`]: `Kind_group_namespace_name`, which the hold
/// policy builds again from a DELETE request alone. None of the four can
/// contain `_` (kinds are alphanumeric, the rest DNS names), so no two
/// objects share a key; `None` when it would be longer than 253 characters
/// (such an object cannot be held).
pub fn hold_key(object: &ObjectRef) -> Option<String> {
    let key = format!(
        "{}_{}_{}_{}",
        object.kind,
        object.group,
        object.namespace.as_deref().unwrap_or(""),
        object.name
    );
    let valid = key
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
    (key.len() <= MAX_KEY && valid).then_some(key)
}

/// The object a [`hold_key`] names.
pub fn parse_hold_key(key: &str) -> Option<ObjectRef> {
    let mut parts = key.splitn(4, '_');
    let (kind, group, namespace, name) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if kind.is_empty() || name.is_empty() {
        return None;
    }
    Some(ObjectRef::new(
        group,
        kind,
        (!namespace.is_empty()).then_some(namespace),
        name,
    ))
}

/// The record's key under which every hold is kept, all in one string: a
/// line `<hold key>\t<entry value>` each, every line ending in `\n` and the
/// whole starting with one. The API server turns the whole ConfigMap into a
/// CEL value at every evaluation of the hold policy, for every DELETE of a
/// kind held, at a cost per map entry (about 0.9 µs on Kubernetes 1.37):
/// one string costs as little as one entry.
pub const HELD_KEY: &str = "held";

/// The record's data for these holds ([`hold_key`] to [`HoldEntry::value`]).
pub fn encode_holds(entries: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut held = String::from("\n");
    for (key, value) in entries {
        held.push_str(key);
        held.push('\t');
        held.push_str(value);
        held.push('\n');
    }
    BTreeMap::from([(HELD_KEY.to_string(), held)])
}

/// The holds a record's data holds: what [`encode_holds`] was given.
pub fn decode_holds(data: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    data.get(HELD_KEY)
        .map(String::as_str)
        .unwrap_or_default()
        .split('\n')
        .filter_map(|line| line.split_once('\t'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// What [`HOLDS`] says of one held object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HoldEntry {
    /// The uid of the root of the tree that holds it.
    pub root: String,
    /// The root's `Kind.group`: whether the root left can be told from its
    /// kind's listing alone, whatever other kind cannot be listed.
    pub root_kind: String,
    /// What it waits for, in words: the refusal quotes it.
    pub held_for: String,
}

impl HoldEntry {
    /// `<root uid> <Kind.group> <held for>`: neither of the first two has a
    /// space, and none has a tab or a line break (the record's separators).
    pub fn value(&self) -> String {
        let flat = |s: &str| s.replace(['\t', '\n', '\r'], " ");
        format!(
            "{} {} {}",
            flat(&self.root),
            flat(&self.root_kind),
            flat(&self.held_for)
        )
    }

    pub fn parse(value: &str) -> Self {
        let mut parts = value.splitn(3, ' ');
        Self {
            root: parts.next().unwrap_or_default().to_string(),
            root_kind: parts.next().unwrap_or_default().to_string(),
            held_for: parts.next().unwrap_or_default().to_string(),
        }
    }
}

/// A kind whose DELETEs the hold policy sees: `(group, plural)`.
pub type HeldKind = (String, String);

/// The ValidatingAdmissionPolicy and binding that hold what [`HOLDS`], in
/// `namespace`, names, for objects of `held_kinds`.
///
/// Its rules name the kinds held, not every kind: the API server makes the
/// record a CEL value at every evaluation of the policy, before any match
/// condition, whether or not the request is for a held object (about 0.2 ms
/// on Kubernetes 1.37), so the DELETEs of every other kind must not reach
/// it. Names cannot narrow the rules further: a DeleteCollection's items
/// (the namespace controller's way) come with no name, and would not match.
pub fn compile_hold(
    settings: &CompileSettings,
    namespace: &str,
    held_kinds: &BTreeSet<HeldKind>,
) -> Compiled {
    let controller = cel_string_literal(&settings.controller_user);
    // Crossplane's own deletes go through: a composition that drops a
    // resource, and a Usage's replay, which comes only once the Usage's user
    // is gone. cascade-guard never refuses Crossplane.
    let crossplane = cel_string_literal(&settings.crossplane_user);
    let variables = vec![
        // A DeleteCollection's items come with no request.name: only they
        // read the stored object, whose conversion is what a policy's
        // evaluation costs most. A cluster-scoped object's request has no
        // namespace at all: every field read is optional, since an error
        // here would refuse every delete in the cluster (and `namespace` is
        // a word CEL reserves).
        variable(
            "name",
            "request.?name.orValue('') != '' ? request.name : oldObject.metadata.name",
        ),
        variable("objectNamespace", "request.?namespace.orValue('')"),
        variable(
            "key",
            "request.kind.kind + '_' + request.kind.group + '_' + variables.objectNamespace + '_' + variables.name",
        ),
        variable(
            "holds",
            &format!(
                "request.operation == 'DELETE' && has(params.data) && '{HELD_KEY}' in params.data ? params.data['{HELD_KEY}'] : ''"
            ),
        ),
        // contains, not indexOf, to tell: indexOf turns the whole string
        // into code points at each call (cel-go), and this is every DELETE
        // of a held kind; where the line starts is read only to refuse.
        variable(
            "held",
            "variables.holds.contains('\\n' + variables.key + '\\t')",
        ),
        variable(
            "at",
            "variables.held ? variables.holds.indexOf('\\n' + variables.key + '\\t') : -1",
        ),
        // The line's value: `<root uid> <Kind.group> <held for>`.
        variable(
            "entry",
            "variables.held ? variables.holds.substring(variables.at + size(variables.key) + 2, variables.holds.indexOf('\\n', variables.at + 1)) : ''",
        ),
        // The entry's third field: what it waits for.
        variable(
            "heldFor",
            "variables.held ? variables.entry.substring(variables.entry.indexOf(' ', variables.entry.indexOf(' ') + 1) + 1) : ''",
        ),
    ];
    let validations = vec![Validation {
        expression: format!(
            "!variables.held || request.userInfo.username == {crossplane} || ({})",
            break_glass_for(settings, "oldObject")
        ),
        message_expression: Some(format!(
            "'cascade-guard holds ' + request.kind.kind + ' ' + variables.name + ' until ' + variables.heldFor + ' is gone (sibling order); it lets it go then. To delete it now: annotate it {BREAK_GLASS_ANNOTATION}=<reason>.'"
        )),
        message: Some(format!(
            "cascade-guard holds this object until what needs it is gone (sibling order); to delete it now, annotate it {BREAK_GLASS_ANNOTATION}=<reason>"
        )),
        reason: Some("Forbidden".to_string()),
    }];
    let metadata = sibling_order_metadata(HOLD_OBJECT_NAME);
    let policy = ValidatingAdmissionPolicy {
        metadata: metadata.clone(),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".to_string()),
            param_kind: Some(record_param()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(hold_rules(held_kinds)),
                match_policy: Some("Equivalent".to_string()),
                ..MatchResources::default()
            }),
            match_conditions: Some(vec![MatchCondition {
                name: "not-cascade-guard".to_string(),
                expression: format!("request.userInfo.?username.orValue('') != {controller}"),
            }]),
            variables: Some(variables),
            validations: Some(validations),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    };
    // Deny would refuse every delete in the cluster while the record is
    // missing; without it nothing is held, and the controller writes it
    // again at its next look.
    let binding = reading_record(metadata, HOLD_OBJECT_NAME, HOLDS, namespace, "Allow");
    Compiled { policy, binding }
}

/// The policy and binding that refuse a change or delete of sibling order's
/// two ConfigMaps in `namespace` by anyone but cascade-guard: a forged entry
/// would hold or order what cascade-guard did not. It reads no parameter
/// and sees only the ConfigMap requests of that namespace (its binding's
/// namespace selector), so it costs the rest of the cluster nothing.
pub fn compile_record_guard(settings: &CompileSettings, namespace: &str) -> Compiled {
    let controller = cel_string_literal(&settings.controller_user);
    let holds = cel_string_literal(HOLDS);
    let ordered = cel_string_literal(ORDERED_TREES);
    let metadata = sibling_order_metadata(RECORD_GUARD_NAME);
    let policy = ValidatingAdmissionPolicy {
        metadata: metadata.clone(),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".to_string()),
            param_kind: None,
            match_constraints: Some(MatchResources {
                resource_rules: Some(vec![NamedRuleWithOperations {
                    api_groups: Some(vec![String::new()]),
                    api_versions: Some(vec!["v1".to_string()]),
                    resources: Some(vec!["configmaps".to_string()]),
                    // Any name: a DeleteCollection's items have none.
                    operations: Some(vec!["UPDATE".to_string(), "DELETE".to_string()]),
                    scope: Some("Namespaced".to_string()),
                    resource_names: None,
                }]),
                match_policy: Some("Equivalent".to_string()),
                ..MatchResources::default()
            }),
            match_conditions: Some(vec![MatchCondition {
                name: "not-cascade-guard".to_string(),
                expression: format!("request.userInfo.?username.orValue('') != {controller}"),
            }]),
            variables: Some(vec![variable(
                "name",
                "request.?name.orValue('') != '' ? request.name : oldObject.metadata.name",
            )]),
            validations: Some(vec![Validation {
                expression: format!("!(variables.name in [{holds}, {ordered}])"),
                message_expression: Some(
                    "'only cascade-guard changes or deletes ConfigMap ' + variables.name + ': it says what cascade-guard holds and which trees it ordered, and its policies read it. To let go of everything: cascade-guard uninstall, or run the controller with --sibling-order off'".to_string(),
                ),
                message: Some(
                    "only cascade-guard changes or deletes sibling order's ConfigMaps: they say what sibling order holds".to_string(),
                ),
                reason: Some("Forbidden".to_string()),
            }]),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    };
    let binding = ValidatingAdmissionPolicyBinding {
        metadata,
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: RECORD_GUARD_NAME.to_string(),
            validation_actions: vec!["Deny".to_string()],
            match_resources: Some(MatchResources {
                namespace_selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([(
                        "kubernetes.io/metadata.name".to_string(),
                        namespace.to_string(),
                    )])),
                    ..LabelSelector::default()
                }),
                ..MatchResources::default()
            }),
            param_ref: None,
        },
    };
    Compiled { policy, binding }
}

/// The DELETEs of the kinds held, by group; with none held, one rule that
/// matches nothing (a policy must have one).
fn hold_rules(held_kinds: &BTreeSet<HeldKind>) -> Vec<NamedRuleWithOperations> {
    let mut by_group: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (group, plural) in held_kinds {
        by_group.entry(group).or_default().push(plural.clone());
    }
    if by_group.is_empty() {
        by_group.insert(GROUP, vec!["nothing-held".to_string()]);
    }
    by_group
        .into_iter()
        .map(|(group, resources)| delete_rule(group, resources))
        .collect()
}

/// A rule matching the DELETEs of `resources` of `group`, any version and
/// scope.
pub(crate) fn delete_rule(group: &str, resources: Vec<String>) -> NamedRuleWithOperations {
    NamedRuleWithOperations {
        api_groups: Some(vec![group.to_string()]),
        api_versions: Some(vec!["*".to_string()]),
        resources: Some(resources),
        operations: Some(vec!["DELETE".to_string()]),
        scope: Some("*".to_string()),
        resource_names: None,
    }
}

/// The parameter of sibling order's policies: a ConfigMap. Not a custom
/// resource: the API server hands a custom resource to CEL by a JSON round
/// trip of the whole object, and a ConfigMap by a conversion whose cost
/// follows the number of its entries, not their size (measured on 1.37:
/// BENCHMARKS.md).
pub(crate) fn record_param() -> ParamKind {
    ParamKind {
        api_version: Some("v1".to_string()),
        kind: Some("ConfigMap".to_string()),
    }
}

/// A binding of `policy` that refuses (Deny) with the record `record` of
/// `namespace` as its parameter, `not_found` when it is missing.
pub(crate) fn reading_record(
    metadata: ObjectMeta,
    policy: &str,
    record: &str,
    namespace: &str,
    not_found: &str,
) -> ValidatingAdmissionPolicyBinding {
    ValidatingAdmissionPolicyBinding {
        metadata,
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: policy.to_string(),
            validation_actions: vec!["Deny".to_string()],
            match_resources: None,
            param_ref: Some(ParamRef {
                name: Some(record.to_string()),
                namespace: Some(namespace.to_string()),
                parameter_not_found_action: Some(not_found.to_string()),
                selector: None,
            }),
        },
    }
}

fn variable(name: &str, expression: &str) -> Variable {
    Variable {
        name: name.to_string(),
        expression: expression.to_string(),
    }
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
    /// Hold it (its entry in [`HOLDS`]): a sibling, or its managed
    /// resource's provider, still needs it.
    Hold { object: ObjectRef, held_for: String },
    /// Its entry goes: nothing needs it any more.
    Release { object: ObjectRef },
    /// Delete it (Foreground): its parent is being deleted, so the garbage
    /// collector tried and was refused while it was held.
    Delete { object: ObjectRef },
    /// Make its owner reference to `owner_uid` stop blocking that owner's
    /// deletion: a held ProviderConfigUsage whose managed resource waits in
    /// a foreground cascade ([`crate::sibling::provider_config_usage`]).
    Unblock {
        object: ObjectRef,
        owner_uid: String,
    },
}

impl Action {
    /// The object it is done to.
    pub fn object(&self) -> &ObjectRef {
        match self {
            Action::Hold { object, .. }
            | Action::Release { object }
            | Action::Delete { object }
            | Action::Unblock { object, .. } => object,
        }
    }
}

/// What to do to the tree of `graph`, given what is held for this tree's
/// root now (`held_now`) and which objects a Crossplane Usage marks in use
/// (`crossplane.io/in-use`). Besides the sibling edges' `after` objects,
/// what an outside user needs in the tree (and the go-betweens on the way)
/// is held until that user is gone, and the ProviderConfigUsage of each
/// namespaced managed resource while its provider needs it
/// ([`crate::sibling::provider_config_usage`]). Objects outside
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
    // What an object outside the tree needs (a managed resource of another
    // tree using this one's ProviderConfig): the needed object and every
    // go-between of the tree on the way, until that user is gone.
    for need in graph.outside_users() {
        let on_the_way = need.through.iter().chain([&need.needs]);
        for object in on_the_way {
            let keep = graph
                .node(object)
                .is_some_and(|n| n.in_tree && !n.deleting && !in_use.contains(object));
            if keep {
                wanted
                    .entry(object.clone())
                    .or_default()
                    .insert(need.object.to_string());
            }
        }
    }
    let mut out = Vec::new();
    // Each namespaced managed resource's ProviderConfigUsage, held while its
    // provider needs it (crossplane-runtime#1150, see
    // [`provider_config_usage`]), whether or not it was read: a hold by key
    // is in force before the provider first writes it. Let go once the
    // provider is done; the controller then deletes it as its owner leaves.
    let tracked = tracked_usages(graph);
    for t in &tracked {
        match (t.needed, held_now.contains(&t.usage)) {
            (true, false) => out.push(Action::Hold {
                object: t.usage.clone(),
                held_for: t.managed.to_string(),
            }),
            (false, true) => out.push(Action::Release {
                object: t.usage.clone(),
            }),
            _ => {}
        }
        if t.unblock {
            out.push(Action::Unblock {
                object: t.usage.clone(),
                owner_uid: t.managed_uid.clone(),
            });
        }
    }
    for node in &graph.nodes {
        if tracked.iter().any(|t| t.usage == node.object) {
            continue;
        }
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
        usage["metadata"]["labels"] = json!({crate::sibling::graph::COMPOSITE_LABEL: "root"});
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
            u["metadata"]["labels"] = json!({crate::sibling::graph::COMPOSITE_LABEL: "root"});
        }
        let g = graph(&composed, "root").expect("root");
        assert_eq!(actions(&g, &BTreeSet::new(), &in_use), vec![]);
        // Already deleting (its delete went through): not held.
        let mut deleting = across(false);
        deleting[2]["metadata"]["deletionTimestamp"] = json!("2026-12-03T00:00:00Z");
        let g = graph(&deleting, "stack").expect("root");
        assert_eq!(actions(&g, &BTreeSet::new(), &BTreeSet::new()), vec![]);
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
        type Case = (&'static str, Vec<Value>, BTreeSet<ObjectRef>, Vec<Action>);
        let cases: Vec<Case> = vec![
            (
                "live, not held: hold it, though it was never read",
                managed_tree(&[provider], false),
                BTreeSet::new(),
                vec![Action::Hold {
                    object: usage(),
                    held_for: "Release ns/app".to_string(),
                }],
            ),
            (
                "live, held: nothing",
                managed_tree(&[provider], false),
                BTreeSet::from([usage()]),
                vec![],
            ),
            (
                "deleting, its provider still at work: keep holding",
                managed_tree(&[provider], true),
                BTreeSet::from([usage()]),
                vec![],
            ),
            (
                "in a foreground cascade, its provider waiting for it: keep holding, unblock",
                managed_tree(&["foregroundDeletion", provider], true),
                BTreeSet::from([usage()]),
                vec![Action::Unblock {
                    object: usage(),
                    owner_uid: "app".to_string(),
                }],
            ),
            (
                "deleting, its provider done: let go (the controller deletes it)",
                managed_tree(&["foregroundDeletion"], true),
                BTreeSet::from([usage()]),
                vec![Action::Release { object: usage() }],
            ),
            (
                "deleting, its provider done, never held: nothing",
                managed_tree(&["foregroundDeletion"], true),
                BTreeSet::new(),
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
            actions(&g, &BTreeSet::new(), &BTreeSet::new()),
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
        let held = BTreeSet::from([pc_ref(), cluster_ref()]);
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
    fn a_hold_key_is_built_from_what_a_delete_request_says() {
        let cases = [
            (
                ObjectRef::new("", "Secret", Some("apps"), "kubeconfig"),
                Some("Secret__apps_kubeconfig"),
            ),
            (
                ObjectRef::new(
                    "helm.m.crossplane.io",
                    "ProviderConfig",
                    Some("ns"),
                    "prod.helm",
                ),
                Some("ProviderConfig_helm.m.crossplane.io_ns_prod.helm"),
            ),
            (
                ObjectRef::new("helm.crossplane.io", "ProviderConfig", None, "default"),
                Some("ProviderConfig_helm.crossplane.io__default"),
            ),
            (
                ObjectRef::new("", "Secret", Some("ns"), &"a".repeat(250)),
                None,
            ),
            (ObjectRef::new("", "Secret", Some("ns"), "no/slash"), None),
        ];
        for (object, want) in cases {
            assert_eq!(hold_key(&object).as_deref(), want, "{object}");
            if let Some(key) = want {
                assert_eq!(parse_hold_key(key), Some(object), "{key}");
            }
        }
        assert_eq!(parse_hold_key("Secret__ns"), None);
        assert_eq!(parse_hold_key("_g_ns_name"), None);
    }

    #[test]
    fn holds_round_trip_through_the_records_encoding() {
        let entries = BTreeMap::from([
            (
                "Secret__team_kubeconfig".to_string(),
                HoldEntry {
                    root: "r-1".into(),
                    root_kind: "Cluster.example.org".into(),
                    held_for: "Release team/app\tand\nmore".into(),
                }
                .value(),
            ),
            (
                "XR_example.org__c".to_string(),
                "r-2 XR.example.org XR /s".to_string(),
            ),
        ]);
        let data = encode_holds(&entries);
        assert_eq!(
            data["held"],
            "\nSecret__team_kubeconfig\tr-1 Cluster.example.org Release team/app and more\nXR_example.org__c\tr-2 XR.example.org XR /s\n"
        );
        assert_eq!(decode_holds(&data), entries);
        assert_eq!(encode_holds(&BTreeMap::new())["held"], "\n");
        assert!(decode_holds(&BTreeMap::new()).is_empty());
        // What the policy asks of the string: the whole key, between a line
        // break and a tab.
        assert!(data["held"].contains("\nSecret__team_kubeconfig\t"));
        assert!(!data["held"].contains("\nSecret__team_kube\t"));
    }

    #[test]
    fn a_hold_entry_round_trips() {
        let entry = HoldEntry {
            root: "6f1c2e9a-0000-4000-8000-000000000001".into(),
            root_kind: "InferenceCluster.modelplane.ai".into(),
            held_for: "ServingStack ns/stack, XR ns/other".into(),
        };
        assert_eq!(
            entry.value(),
            "6f1c2e9a-0000-4000-8000-000000000001 InferenceCluster.modelplane.ai ServingStack ns/stack, XR ns/other"
        );
        assert_eq!(HoldEntry::parse(&entry.value()), entry);
        assert_eq!(
            HoldEntry::parse("bare"),
            HoldEntry {
                root: "bare".into(),
                root_kind: String::new(),
                held_for: String::new()
            }
        );
    }

    #[test]
    fn the_hold_policy_is_pinned_whole() {
        let settings = CompileSettings {
            controller_user: "system:serviceaccount:cg:cascade-guard".to_string(),
            crossplane_user: "system:serviceaccount:crossplane-system:crossplane".to_string(),
            ..CompileSettings::default()
        };
        let held = BTreeSet::from([
            ("".to_string(), "secrets".to_string()),
            (
                "helm.m.crossplane.io".to_string(),
                "providerconfigs".to_string(),
            ),
            ("helm.m.crossplane.io".to_string(), "releases".to_string()),
        ]);
        let compiled = compile_hold(&settings, "cg", &held);
        let policy = serde_json::to_value(&compiled.policy).expect("serializes");
        let spec = &policy["spec"];
        assert_eq!(
            policy["metadata"],
            json!({"name": HOLD_OBJECT_NAME, "labels": {SIBLING_ORDER_LABEL: "true"}})
        );
        assert_eq!(spec["failurePolicy"], "Fail");
        assert_eq!(
            spec["paramKind"],
            json!({"apiVersion": "v1", "kind": "ConfigMap"})
        );
        assert_eq!(
            spec["matchConstraints"],
            json!({"matchPolicy": "Equivalent", "resourceRules": [
                {"apiGroups": [""], "apiVersions": ["*"], "resources": ["secrets"],
                 "operations": ["DELETE"], "scope": "*"},
                {"apiGroups": ["helm.m.crossplane.io"], "apiVersions": ["*"],
                 "resources": ["providerconfigs", "releases"],
                 "operations": ["DELETE"], "scope": "*"},
            ]})
        );
        assert_eq!(
            spec["matchConditions"],
            json!([{"name": "not-cascade-guard",
                    "expression": "request.userInfo.?username.orValue('') != \"system:serviceaccount:cg:cascade-guard\""}])
        );
        let names: Vec<&str> = spec["variables"]
            .as_array()
            .expect("variables")
            .iter()
            .filter_map(|v| v["name"].as_str())
            .collect();
        assert_eq!(
            names,
            [
                "name",
                "objectNamespace",
                "key",
                "holds",
                "held",
                "at",
                "entry",
                "heldFor"
            ]
        );

        // Every request field read is optional but the kind (always there):
        // an error would refuse every delete in the cluster, and a
        // cluster-scoped object's request has no namespace.
        for v in spec["variables"].as_array().expect("variables") {
            let e = v["expression"].as_str().unwrap_or_default();
            assert!(!e.contains("request.namespace"), "{e}");
        }
        assert_eq!(
            spec["variables"][0]["expression"],
            "request.?name.orValue('') != '' ? request.name : oldObject.metadata.name"
        );
        let validations = spec["validations"].as_array().expect("validations");
        assert_eq!(validations.len(), 1);
        let delete = validations[0]["expression"].as_str().unwrap_or_default();
        assert!(
            delete.starts_with("!variables.held || request.userInfo.username == \"system:serviceaccount:crossplane-system:crossplane\" || (")
                && delete.contains("authorizer.group('cascade-guard.dev')"),
            "{delete}"
        );
        for v in validations {
            assert_eq!(v["reason"], "Forbidden");
        }
        let binding = serde_json::to_value(&compiled.binding).expect("serializes");
        assert_eq!(
            binding["spec"],
            json!({"policyName": HOLD_OBJECT_NAME, "validationActions": ["Deny"],
                   "paramRef": {"name": "cascade-guard-holds", "namespace": "cg",
                                "parameterNotFoundAction": "Allow"}})
        );
        // Nothing held: a rule that matches nothing, never every DELETE.
        let none = serde_json::to_value(&compile_hold(&settings, "cg", &BTreeSet::new()).policy)
            .expect("serializes");
        assert_eq!(
            none["spec"]["matchConstraints"]["resourceRules"],
            json!([{"apiGroups": ["cascade-guard.dev"], "apiVersions": ["*"],
                    "resources": ["nothing-held"], "operations": ["DELETE"], "scope": "*"}])
        );
    }

    #[test]
    fn the_record_guard_is_pinned_whole() {
        let settings = CompileSettings {
            controller_user: "system:serviceaccount:cg:cascade-guard".to_string(),
            ..CompileSettings::default()
        };
        let compiled = compile_record_guard(&settings, "cg");
        assert_eq!(
            serde_json::to_value(&compiled.policy).expect("serializes"),
            json!({
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": RECORD_GUARD_NAME, "labels": {SIBLING_ORDER_LABEL: "true"}},
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {"matchPolicy": "Equivalent", "resourceRules": [
                        {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                         "operations": ["UPDATE", "DELETE"], "scope": "Namespaced"}]},
                    "matchConditions": [{"name": "not-cascade-guard",
                        "expression": "request.userInfo.?username.orValue('') != \"system:serviceaccount:cg:cascade-guard\""}],
                    "variables": [{"name": "name",
                        "expression": "request.?name.orValue('') != '' ? request.name : oldObject.metadata.name"}],
                    "validations": [{
                        "expression": "!(variables.name in [\"cascade-guard-holds\", \"cascade-guard-ordered-trees\"])",
                        "messageExpression": "'only cascade-guard changes or deletes ConfigMap ' + variables.name + ': it says what cascade-guard holds and which trees it ordered, and its policies read it. To let go of everything: cascade-guard uninstall, or run the controller with --sibling-order off'",
                        "message": "only cascade-guard changes or deletes sibling order's ConfigMaps: they say what sibling order holds",
                        "reason": "Forbidden"}]
                }
            })
        );
        assert_eq!(
            serde_json::to_value(&compiled.binding).expect("serializes")["spec"],
            json!({"policyName": RECORD_GUARD_NAME, "validationActions": ["Deny"],
                   "matchResources": {"namespaceSelector": {"matchLabels": {
                       "kubernetes.io/metadata.name": "cg"}}}})
        );
    }
}
