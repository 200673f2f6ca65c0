//! One tree read: what its graph asks to hold, release, delete and unblock,
//! decided ([`decide`], pure), then done; and how the tree stands for the
//! gate and for its next read.

use std::collections::{BTreeSet, HashMap};

use kube::ResourceExt;
use kube::api::DynamicObject;
use kube::runtime::events::EventType;
use serde_json::Value;

use super::OrderLoop;
use super::index::TreeState;
use super::schedule::SETTLING_SECS;
use super::writes::{self, Deleted, describe};
use crate::cluster::kinds::ServedKinds;
use crate::cluster::tree::TreeRead;
use crate::cluster::unhold;
use crate::policy::holders::IN_USE_LABEL;
use crate::policy::sibling::gate::TreeOrder;
use crate::policy::sibling::graph::{self, Graph};
use crate::policy::sibling::hold::{Action, Held, actions};
use crate::policy::sibling::object::ObjectRef;
use crate::policy::sibling::provider_config_usage::{self as usage, tracked_usages};

/// What one read tree asks for.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Decision {
    /// Held for this root and not in its tree as read (gone, or held by an
    /// older release for a tree that changed): nothing explains the hold any
    /// more.
    pub unexplained: Vec<ObjectRef>,
    /// The actions, in order.
    pub todo: Vec<Action>,
    /// What stays held once they are done.
    pub holding: BTreeSet<ObjectRef>,
}

/// What a tree, as read (`read`: its objects by reference; `in_use`: those
/// a Crossplane Usage holds), asks for, given what is held for it now
/// (`held_now`); `unserved_usage` tells a ProviderConfigUsage whose kind is
/// not served.
pub(super) fn decide(
    graph: &Graph,
    read: &HashMap<ObjectRef, &Value>,
    in_use: &BTreeSet<ObjectRef>,
    held_now: &Held,
    unserved_usage: impl Fn(&ObjectRef) -> bool,
) -> Decision {
    // The ProviderConfigUsages of the tree's managed resources: held by
    // key, never read.
    let tracked: BTreeSet<ObjectRef> = tracked_usages(graph).into_iter().map(|t| t.usage).collect();
    let unexplained: Vec<ObjectRef> = held_now
        .keys()
        .filter(|r| !read.contains_key(*r) && !tracked.contains(*r))
        .cloned()
        .collect();
    let mut todo = actions(graph, held_now, in_use);
    // A provider whose ProviderConfigUsage kind is not served tracks no
    // usage: nothing to hold, and a hold of an unserved kind would never be
    // in force, so one held before its kind went (the provider uninstalled)
    // is let go: kept, the tree would stay unordered and its root's delete
    // refused for ever.
    todo.retain(|a| !matches!(a, Action::Hold { object, .. } if unserved_usage(object)));
    for object in held_now.keys().filter(|o| unserved_usage(o)) {
        let released = todo
            .iter()
            .any(|a| matches!(a, Action::Release { object: o } if o == object));
        if !unexplained.contains(object) && !released {
            todo.push(Action::Release {
                object: object.clone(),
            });
        }
    }
    let mut holding: BTreeSet<ObjectRef> = held_now
        .keys()
        .filter(|r| !unexplained.contains(r))
        .cloned()
        .collect();
    for action in &todo {
        match action {
            Action::Hold { object, .. } => {
                holding.insert(object.clone());
            }
            Action::Release { object } => {
                holding.remove(object);
            }
            Action::Delete { .. } | Action::Unblock { .. } => {}
        }
    }
    Decision {
        unexplained,
        todo,
        holding,
    }
}

/// How many unblocks of one tree are sent at once.
const UNBLOCKS_AT_ONCE: usize = 8;

/// What an action came to, when it did not fail.
enum Done {
    AsSaid,
    /// Nothing to change (an unblock already done).
    Nothing,
    /// Its entry gone; cascade-guard may not delete it, so its deleter's
    /// retry does.
    LeftToItsDeleter(ObjectRef),
}

/// The tree's objects by reference, and those a Crossplane Usage holds.
fn by_reference(objects: &[Value]) -> (HashMap<ObjectRef, &Value>, BTreeSet<ObjectRef>) {
    let mut in_use = BTreeSet::new();
    let mut by_ref = HashMap::new();
    for v in objects {
        let Some(r) = ObjectRef::of_object(v) else {
            continue;
        };
        let label = v
            .pointer("/metadata/labels")
            .and_then(|l| l.get(IN_USE_LABEL))
            .and_then(Value::as_str);
        if label == Some("true") {
            in_use.insert(r.clone());
        }
        by_ref.insert(r, v);
    }
    (by_ref, in_use)
}

/// `Kind.group` of an object read.
fn kind_of(root: &DynamicObject) -> String {
    root.types
        .as_ref()
        .map(|t| {
            let group = t.api_version.rsplit_once('/').map_or("", |(g, _)| g);
            format!("{}.{group}", t.kind)
        })
        .unwrap_or_default()
}

/// Why a tree is not ordered, in one line (none: it is).
fn order_of(root: &DynamicObject, mut unordered: Vec<String>) -> TreeOrder {
    match unordered.len() {
        0 => TreeOrder::Ordered {
            generation: root.metadata.generation.unwrap_or(0),
        },
        1 => TreeOrder::Unordered {
            reason: unordered.remove(0),
        },
        n => TreeOrder::Unordered {
            reason: format!("{} (and {} more)", unordered.remove(0), n - 1),
        },
    }
}

/// Sends one unblock (any other action: nothing).
async fn unblock<'a>(
    client: &kube::Client,
    kinds: &ServedKinds,
    action: &'a Action,
) -> (&'a Action, Result<Done, String>) {
    let result = match action {
        Action::Unblock { object, owner_uid } => {
            match unhold::unblock(client, kinds, object, owner_uid).await {
                Ok(true) => Ok(Done::AsSaid),
                Ok(false) => Ok(Done::Nothing),
                Err(e) => Err(e.to_string()),
            }
        }
        _ => Ok(Done::Nothing),
    };
    (action, result)
}

/// What a read found in the tree and around it, as the index keeps it
/// (nothing for a root alone); the rest of [`TreeState`] left default.
fn around(graph: &Graph, root_uid: &str, alone: bool) -> TreeState {
    if alone {
        return TreeState {
            alone,
            ..TreeState::default()
        };
    }
    let uids = |in_tree: bool| -> Vec<String> {
        graph
            .nodes
            .iter()
            .filter(|n| n.in_tree == in_tree)
            .filter_map(|n| n.uid.clone())
            .filter(|uid| uid != root_uid)
            .collect()
    };
    // A ProviderConfig in the tree, or one outside it on the tree's own
    // objects (one made by hand on its kubeconfig Secret): their new users
    // need the tree. Not one the tree only uses (a shared ProviderConfig).
    let needs_the_tree = |object: &ObjectRef| {
        graph
            .edges
            .iter()
            .any(|e| e.object == *object && graph.node(&e.needs).is_some_and(|n| n.in_tree))
    };
    let configs = graph
        .nodes
        .iter()
        .filter(|n| {
            matches!(
                n.object.kind.as_str(),
                "ProviderConfig" | "ClusterProviderConfig"
            ) && (n.in_tree || needs_the_tree(&n.object))
        })
        .map(|n| {
            let o = &n.object;
            let name = (
                o.group.as_str().into(),
                o.namespace.as_deref().map(Into::into),
                o.name.as_str().into(),
            );
            (name, n.in_tree)
        })
        .collect();
    TreeState {
        members: uids(true),
        outside: uids(false),
        needed_outside: graph
            .needed_outside()
            .into_iter()
            .filter_map(|n| n.uid.clone())
            .collect(),
        configs,
        ..TreeState::default()
    }
}

impl OrderLoop {
    /// Brings one tree's holds to what its graph says, and tells the gate
    /// how it stands; its state for the next read (active while anything in
    /// it is being deleted or was just changed, or the tree is young).
    pub(super) async fn reconcile(
        &mut self,
        kinds: &ServedKinds,
        root: &DynamicObject,
        read: TreeRead,
    ) -> TreeState {
        let Some(root_uid) = root.uid() else {
            return TreeState::default();
        };
        let graph = match graph::graph(&read.objects, &root_uid) {
            Ok(graph) => graph,
            Err(e) => {
                tracing::warn!(error = %e, "sibling order: the root vanished from its own tree");
                return TreeState::default();
            }
        };
        self.report(root, &graph, &read.unread);
        // Held for this tree: an object it only references may be held for
        // another.
        let held_now = self.holds.held_for(&root_uid);
        let (by_ref, in_use) = by_reference(&read.objects);
        let unserved_usage = |object: &ObjectRef| {
            object.kind == usage::KIND
                && kinds
                    .of_kind(Some(object.group.as_str()), usage::KIND)
                    .next()
                    .is_none()
        };
        let decision = decide(&graph, &by_ref, &in_use, &held_now, unserved_usage);
        for object in &decision.unexplained {
            self.holds.release(object);
        }
        writes::let_go_all(&self.client, kinds, &decision.unexplained).await;
        if decision.holding.is_empty() {
            self.held_counts.remove(&root_uid);
        } else {
            self.held_counts
                .insert(root_uid.clone(), decision.holding.len());
        }
        // Why the tree is not ordered, if it is not: the gate refuses the
        // root's delete with it, and `plan` shows it.
        let mut unordered: Vec<String> = read
            .unread
            .iter()
            .map(|u| format!("not read: {u}"))
            .collect();
        if !self.holds.in_place() {
            unordered.push("the hold policy is not in place".to_string());
        }
        let failed = self
            .act_all(kinds, root, &root_uid, &decision.todo, &by_ref)
            .await;
        unordered.extend(failed);
        // A hold is in force once the hold policy names its kind and the API
        // server has had the time to load it: until then the tree is not
        // ordered, and read again as active.
        let waiting = decision.holding.iter().find_map(|object| {
            self.holds
                .in_force(object, kinds)
                .err()
                .map(|why| format!("cannot hold {object} yet: {why}"))
        });
        let waiting = waiting.inspect(|why| unordered.push(why.clone())).is_some();
        let deleting = graph.nodes.iter().any(|n| n.in_tree && n.deleting);
        self.tearing_down |= deleting && !decision.holding.is_empty();
        // A young tree is still being composed (its Usages taking hold, its
        // references filled in) without its root always changing: it is read
        // every look until it settles, then when its root changes. Not a root
        // alone (nothing composed, referenced or using it yet): what it will
        // compose or reference first changes the root itself (Crossplane
        // writes `resourceRefs`), which makes it due; read every look,
        // 100,000 new objects of an ordered kind kept the loop reading for
        // minutes.
        let alone = read.objects.len() <= 1;
        self.gate
            .mark(&root_uid, order_of(root, unordered).value(), alone);
        let settling = !alone
            && root.creation_timestamp().is_some_and(|t| {
                k8s_openapi::jiff::Timestamp::now()
                    .duration_since(t.0)
                    .as_secs()
                    < SETTLING_SECS
            });
        TreeState {
            active: deleting || waiting || !decision.todo.is_empty(),
            settling,
            ..around(&graph, &root_uid, alone)
        }
    }

    /// Does each action, each said as an Event on the root; why a hold
    /// could not be made, for each that could not.
    async fn act_all(
        &mut self,
        kinds: &ServedKinds,
        root: &DynamicObject,
        root_uid: &str,
        todo: &[Action],
        by_ref: &HashMap<ObjectRef, &Value>,
    ) -> Vec<String> {
        let root_kind = kind_of(root);
        // Unblocks (a GET and a PATCH each) touch nothing the others do:
        // sent together, UNBLOCKS_AT_ONCE at a time, after the others.
        let (unblocks, others): (Vec<&Action>, Vec<&Action>) = todo
            .iter()
            .partition(|a| matches!(a, Action::Unblock { .. }));
        let mut done = Vec::new();
        for action in others {
            // A hold and a release need only the object's key; a delete
            // needs what was read of it.
            let value = by_ref.get(action.object()).copied();
            if value.is_none() && matches!(action, Action::Delete { .. }) {
                continue;
            }
            let result = self.act(kinds, root_uid, &root_kind, action, value).await;
            done.push((action, result));
        }
        let client = &self.client;
        for chunk in unblocks.chunks(UNBLOCKS_AT_ONCE) {
            let sends = chunk.iter().map(|action| unblock(client, kinds, action));
            done.extend(futures::future::join_all(sends).await);
        }
        let mut failed = Vec::new();
        for (action, result) in done {
            let (type_, reason, note) = match result {
                Err(e) => {
                    let note = format!("cannot {}: {e}", describe(action));
                    if matches!(action, Action::Hold { .. }) {
                        failed.push(note.clone());
                    }
                    tracing::warn!(root = %root.name_any(), %note, "sibling order");
                    (EventType::Warning, "SiblingOrderFailed", note)
                }
                Ok(Done::LeftToItsDeleter(object)) => {
                    let note = format!(
                        "let go of {object}: nothing needs it any more, and as cascade-guard may not delete it, its deleter's next try does (the garbage collector's comes after its back-off)"
                    );
                    tracing::info!(root = %root.name_any(), %note, "sibling order");
                    (EventType::Normal, "ReleasedForOrder", note)
                }
                Ok(Done::Nothing) => continue,
                Ok(Done::AsSaid) => {
                    tracing::info!(root = %root.name_any(), action = %describe(action), "sibling order");
                    let reason = match action {
                        Action::Hold { .. } => "HeldForOrder",
                        Action::Release { .. } => "ReleasedForOrder",
                        Action::Delete { .. } => "DeletedInOrder",
                        Action::Unblock { .. } => "UnblockedForProvider",
                    };
                    (EventType::Normal, reason, describe(action))
                }
            };
            writes::event(&self.teller, root, type_, reason, note);
        }
        failed
    }

    async fn act(
        &mut self,
        kinds: &ServedKinds,
        root_uid: &str,
        root_kind: &str,
        action: &Action,
        object: Option<&Value>,
    ) -> Result<Done, String> {
        match action {
            Action::Hold { object, held_for } => self
                .holds
                .hold(object, root_uid, root_kind, held_for)
                .map(|()| Done::AsSaid),
            // Its entry gone, and deleted at once if its owner is leaving (a
            // standalone Usage whose user is gone: the garbage collector's
            // retry after the refusals would come only after its back-off,
            // and Crossplane replays what the Usage protected once it is
            // gone).
            Action::Release { object } => {
                self.holds.release(object);
                writes::let_go_all(&self.client, kinds, std::slice::from_ref(object)).await;
                Ok(Done::AsSaid)
            }
            // Sent together by `act_all`.
            Action::Unblock { .. } => Ok(Done::Nothing),
            // Deleted while still held, so that a delete refused by someone
            // else (Crossplane's Usage webhook) is simply tried again; the
            // entry goes once the delete went through. cascade-guard may not
            // delete every kind it holds (a Secret): then the entry goes now,
            // and the garbage collector's next try deletes it.
            Action::Delete { object: r } => {
                let Some(value) = object else {
                    return Ok(Done::Nothing);
                };
                match writes::delete_in_order(&self.client, kinds, r, value).await {
                    Ok(Deleted::Sent) => Ok(Done::AsSaid),
                    Ok(Deleted::LeftToItsDeleter) => {
                        self.holds.release(r);
                        Ok(Done::LeftToItsDeleter(r.clone()))
                    }
                    Err(e) => Err(e.to_string()),
                }
            }
        }
    }

    /// Cycles, conflicts and what could not be read, as Warning Events on the
    /// root, each once: where they are, the tree falls back to the plain
    /// foreground cascade for those objects.
    fn report(&mut self, root: &DynamicObject, graph: &Graph, unread: &[String]) {
        let Some(uid) = root.uid() else { return };
        let mut now = BTreeSet::new();
        for cycle in &graph.cycles {
            let names: Vec<String> = cycle.objects.iter().map(ToString::to_string).collect();
            now.insert(format!(
                "a cycle of needs under {}: {} are not ordered, and are deleted together",
                cycle.parent,
                names.join(", ")
            ));
        }
        for conflict in &graph.conflicts {
            now.insert(format!(
                "{conflict}: it is under what needs it, and cannot wait"
            ));
        }
        for problem in &graph.problems {
            now.insert(problem.to_string());
        }
        for u in unread {
            now.insert(format!("not read: {u}"));
        }
        let before = self.reported.get(&uid).cloned().unwrap_or_default();
        for note in now.difference(&before) {
            writes::event(
                &self.teller,
                root,
                EventType::Warning,
                "SiblingOrderProblem",
                note.clone(),
            );
        }
        if now.is_empty() {
            self.reported.remove(&uid);
        } else {
            self.reported.insert(uid, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn obj(kind: &str, name: &str, owner: Option<&str>) -> Value {
        let mut metadata = json!({"name": name, "namespace": "ns", "uid": name});
        if let Some(owner) = owner {
            metadata["ownerReferences"] = json!([{
                "apiVersion": "example.org/v1", "kind": "XR", "name": owner, "uid": owner,
                "controller": true, "blockOwnerDeletion": true,
            }]);
        }
        json!({"apiVersion": "example.org/v1", "kind": kind, "metadata": metadata})
    }

    /// root composes `stack` and `cluster`; stack's `app` needs `cluster`.
    fn tree() -> Vec<Value> {
        let mut app = obj("App", "app", Some("stack"));
        app["metadata"]["annotations"] =
            json!({"cascade-guard.dev/needs": "XR.example.org/cluster"});
        vec![
            obj("XR", "root", None),
            obj("XR", "cluster", Some("root")),
            obj("XR", "stack", Some("root")),
            app,
        ]
    }

    fn r(name: &str) -> ObjectRef {
        ObjectRef::new("example.org", "XR", Some("ns"), name)
    }

    /// What a read tree asks for, given what is held: what is held and no
    /// longer in the tree is unexplained (let go), a new need is held, and
    /// what stays held is what the gate counts.
    #[test]
    fn a_read_tree_decides_its_holds() {
        let objects = tree();
        let graph = graph::graph(&objects, "root").expect("root");
        let (read, in_use) = by_reference(&objects);
        let hold = || Action::Hold {
            object: r("cluster"),
            held_for: "XR ns/stack".to_string(),
        };
        type Case = (&'static str, Held, Decision);
        let words = |o: ObjectRef| (o, "XR ns/stack".to_string());
        let cases: Vec<Case> = vec![
            (
                "nothing held: hold the need",
                Held::new(),
                Decision {
                    unexplained: vec![],
                    todo: vec![hold()],
                    holding: BTreeSet::from([r("cluster")]),
                },
            ),
            (
                "held, and an object gone from the tree",
                Held::from([words(r("cluster")), words(r("gone"))]),
                Decision {
                    unexplained: vec![r("gone")],
                    todo: vec![],
                    holding: BTreeSet::from([r("cluster")]),
                },
            ),
        ];
        for (what, held_now, want) in cases {
            assert_eq!(
                decide(&graph, &read, &in_use, &held_now, |_| false),
                want,
                "{what}"
            );
        }
    }

    /// What the index is told of a read: the tree's own objects, what it
    /// read outside, what it needs outside, and the ProviderConfigs whose
    /// new users need it (its own, and one made outside on its Secret), not
    /// one it only uses.
    #[test]
    fn a_read_tells_the_index_what_is_in_and_around_the_tree() {
        let pc = |name: &str, owner: Option<&str>, secret: Option<&str>| {
            let mut v = obj("ProviderConfig", name, owner);
            v["apiVersion"] = json!("helm.m.crossplane.io/v1beta1");
            if let Some(secret) = secret {
                v["spec"] = json!({"credentials": {"secretRef": {"name": secret, "key": "k"}}});
            }
            v
        };
        let mut secret = obj("Secret", "kubeconfig", Some("root"));
        secret["apiVersion"] = json!("v1");
        let mut release = obj("Release", "release", Some("root"));
        release["apiVersion"] = json!("helm.m.crossplane.io/v1beta1");
        release["spec"] = json!({"providerConfigRef": {"name": "shared"}});
        let objects = vec![
            obj("XR", "root", None),
            pc("own", Some("root"), None),
            secret,
            release,
            pc("by-hand", None, Some("kubeconfig")),
            pc("shared", None, None),
        ];
        let graph = graph::graph(&objects, "root").expect("root");
        let state = around(&graph, "root", false);
        let sorted = |mut v: Vec<String>| {
            v.sort();
            v
        };
        assert_eq!(sorted(state.members), ["kubeconfig", "own", "release"]);
        assert_eq!(sorted(state.outside), ["by-hand", "shared"]);
        assert_eq!(state.needed_outside, ["shared"]);
        let configs: Vec<(&str, bool)> = state
            .configs
            .iter()
            .map(|((_, _, name), in_tree)| (&**name, *in_tree))
            .collect();
        assert_eq!(configs, [("by-hand", false), ("own", true)]);
        assert!(around(&graph, "root", true).members.is_empty());
    }
}
