//! What `cascade-guard trace` knows of a deletion tree and how it shows it
//! (pure): the nodes as last seen, what holds each, progress, the summary.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::policy::holders::describe_deleting;

/// The state of an object found in the tree and not looked at yet.
const NOT_READ_YET: &str = "not read yet";

/// One object of the tree, by `apiVersion/kind/namespace/name`.
#[derive(Clone, Debug, PartialEq, Eq, Ord, PartialOrd, Hash, Serialize)]
pub struct Key {
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
}

impl Key {
    pub fn label(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{}/{} -n {ns}", self.kind, self.name),
            None => format!("{}/{}", self.kind, self.name),
        }
    }
}

/// Where one object is in its life, as a poll found it (`-o json` calls it
/// its `state`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum Phase {
    /// Not looked at yet, or it could not be read (`reason` says why).
    Unknown {
        reason: String,
    },
    Live,
    Deleting {
        finalizers: Vec<String>,
    },
    Gone,
}

/// What a poll found of one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub state: Phase,
    pub children: Vec<Key>,
    /// Usages that name it as `of`, described ("Usage u: in use by ServingStack s").
    pub used_by: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    pub key: Key,
    pub state: Phase,
    pub children: Vec<Key>,
    pub used_by: Vec<String>,
    /// Seconds from the start of the trace when it was seen to start
    /// deleting (None when it was deleting already at its first read) /
    /// seen gone.
    pub deleting_at: Option<f64>,
    pub gone_at: Option<f64>,
}

/// A change worth a line of output.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Change {
    pub at: f64,
    pub object: String,
    pub what: String,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Trace {
    pub root: Option<Key>,
    pub nodes: BTreeMap<Key, Node>,
}

impl Trace {
    pub fn new(root: Key) -> Self {
        let mut t = Trace {
            root: Some(root.clone()),
            nodes: BTreeMap::new(),
        };
        t.nodes.insert(root.clone(), node(root));
        t
    }

    /// Keys to poll: every node not yet gone, deepest first, so that within
    /// one look a dependent is seen before its owner (the only order in which
    /// a foreground cascade can go).
    pub fn pending(&self) -> Vec<Key> {
        let depths = self.depths();
        let mut keys: Vec<(usize, Key)> = self
            .nodes
            .values()
            .filter(|n| n.state != Phase::Gone)
            .map(|n| (depths.get(&n.key).copied().unwrap_or(0), n.key.clone()))
            .collect();
        keys.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        keys.into_iter().map(|(_, k)| k).collect()
    }

    /// Each node's depth from the root (the shortest path).
    fn depths(&self) -> BTreeMap<Key, usize> {
        let mut depths = BTreeMap::new();
        let Some(root) = &self.root else {
            return depths;
        };
        let mut queue = std::collections::VecDeque::from([(root.clone(), 0usize)]);
        while let Some((key, depth)) = queue.pop_front() {
            if depths.contains_key(&key) {
                continue;
            }
            depths.insert(key.clone(), depth);
            if let Some(n) = self.nodes.get(&key) {
                for c in &n.children {
                    queue.push_back((c.clone(), depth + 1));
                }
            }
        }
        depths
    }

    /// Takes in what a poll found at `at` seconds; returns the changes.
    /// Children are only ever added: once an object is gone its last known
    /// children stay in the tree.
    pub fn observe(&mut self, key: &Key, seen: Seen, at: f64) -> Vec<Change> {
        let mut changes = Vec::new();
        let Some(n) = self.nodes.get_mut(key) else {
            return changes;
        };
        if n.state != seen.state {
            let what = match &seen.state {
                Phase::Live => "live".to_string(),
                Phase::Deleting { finalizers } => {
                    // Only a start trace saw: deleting at its first read, it
                    // started before, at a time trace cannot know.
                    if n.deleting_at.is_none() && n.state == Phase::Live {
                        n.deleting_at = Some(at);
                    }
                    describe_deleting(finalizers)
                }
                Phase::Gone => {
                    n.gone_at = Some(at);
                    "gone".to_string()
                }
                Phase::Unknown { reason } => format!("cannot read: {reason}"),
            };
            changes.push(Change {
                at,
                object: key.label(),
                what,
            });
            n.state = seen.state;
        }
        if n.used_by != seen.used_by && !seen.used_by.is_empty() {
            changes.push(Change {
                at,
                object: key.label(),
                what: seen.used_by.join("; "),
            });
        }
        if !seen.used_by.is_empty() || n.state != Phase::Gone {
            n.used_by = seen.used_by;
        }
        let mut new_children = Vec::new();
        for c in seen.children {
            if !n.children.contains(&c) {
                n.children.push(c.clone());
                new_children.push(c);
            }
        }
        for c in new_children {
            self.nodes.entry(c.clone()).or_insert_with(|| node(c));
        }
        changes
    }

    /// Some object found has not been read yet.
    pub fn unread(&self) -> bool {
        self.nodes
            .values()
            .any(|n| matches!(&n.state, Phase::Unknown { reason } if reason == NOT_READ_YET))
    }

    pub fn total(&self) -> usize {
        self.nodes.len()
    }

    pub fn gone(&self) -> usize {
        self.nodes
            .values()
            .filter(|n| n.state == Phase::Gone)
            .count()
    }

    pub fn done(&self) -> bool {
        self.root
            .as_ref()
            .and_then(|r| self.nodes.get(r))
            .is_some_and(|n| n.state == Phase::Gone)
    }

    /// The tree as indented lines, the root first.
    pub fn render(&self, elapsed: Duration) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} of {} gone, {:.1}s elapsed",
            self.gone(),
            self.total(),
            elapsed.as_secs_f64()
        );
        if let Some(root) = &self.root {
            self.render_node(root, 0, &mut out, &mut Vec::new());
        }
        out
    }

    fn render_node(&self, key: &Key, depth: usize, out: &mut String, path: &mut Vec<Key>) {
        let Some(n) = self.nodes.get(key) else { return };
        if path.contains(key) {
            return;
        }
        let indent = "  ".repeat(depth);
        let (mark, state) = match &n.state {
            Phase::Unknown { reason } => ("?", format!("unknown ({reason})")),
            Phase::Live => ("·", "live".to_string()),
            Phase::Deleting { finalizers } => ("~", describe_deleting(finalizers)),
            Phase::Gone => (
                "✓",
                format!("gone at {:.1}s", n.gone_at.unwrap_or_default()),
            ),
        };
        let _ = writeln!(out, "{indent}{mark} {}  {state}", key.label());
        for u in &n.used_by {
            if n.state != Phase::Gone {
                let _ = writeln!(out, "{indent}    in use: {u}");
            }
        }
        path.push(key.clone());
        for c in &n.children {
            self.render_node(c, depth + 1, out, path);
        }
        path.pop();
    }

    /// The end: how long, in what order things went, and anything left.
    pub fn summary(&self, elapsed: Duration) -> Summary {
        let mut order: Vec<Gone> = self
            .nodes
            .values()
            .filter_map(|n| {
                n.gone_at.map(|at| Gone {
                    at,
                    object: n.key.label(),
                })
            })
            .collect();
        order.sort_by(|a, b| a.at.total_cmp(&b.at));
        let left: Vec<String> = self
            .nodes
            .values()
            .filter(|n| n.state != Phase::Gone)
            .map(|n| n.key.label())
            .collect();
        Summary {
            complete: self.done() && left.is_empty(),
            seconds: elapsed.as_secs_f64(),
            gone: self.gone(),
            total: self.total(),
            order,
            left,
        }
    }
}

fn node(key: Key) -> Node {
    Node {
        key,
        state: Phase::Unknown {
            reason: NOT_READ_YET.into(),
        },
        children: Vec::new(),
        used_by: Vec::new(),
        deleting_at: None,
        gone_at: None,
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Gone {
    /// Seconds from the start of the trace.
    pub at: f64,
    pub object: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub complete: bool,
    pub seconds: f64,
    pub gone: usize,
    pub total: usize,
    /// In the order they were seen gone. Objects seen gone in the same look
    /// share a time: their order among themselves is not known.
    pub order: Vec<Gone>,
    /// Labels still there.
    pub left: Vec<String>,
}

impl Summary {
    pub fn render(&self) -> String {
        let mut out = String::new();
        if self.complete {
            let _ = writeln!(
                out,
                "teardown complete: {} objects gone in {:.1}s",
                self.total, self.seconds
            );
        } else {
            let _ = writeln!(
                out,
                "teardown not complete after {:.1}s: {} of {} gone; still there:",
                self.seconds, self.gone, self.total
            );
            for l in &self.left {
                let _ = writeln!(out, "  {l}");
            }
        }
        if !self.order.is_empty() {
            let _ = writeln!(out, "order they left the API (as often as trace looked):");
            let mut previous = None;
            for g in &self.order {
                let same = previous == Some(g.at);
                let _ = writeln!(
                    out,
                    "  {:>6.1}s {}{}",
                    g.at,
                    g.object,
                    if same { "  (same look)" } else { "" }
                );
                previous = Some(g.at);
            }
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn key(kind: &str, name: &str) -> Key {
        Key {
            api_version: "example.org/v1".into(),
            kind: kind.into(),
            namespace: None,
            name: name.into(),
        }
    }

    pub(crate) fn seen(state: Phase, children: Vec<Key>) -> Seen {
        Seen {
            state,
            children,
            used_by: Vec::new(),
        }
    }

    #[test]
    fn a_teardown_from_start_to_end() {
        let root = key("InferenceCluster", "prod");
        let cluster = key("EKSCluster", "prod-eks");
        let stack = key("ServingStack", "prod-stack");
        let mut t = Trace::new(root.clone());
        let c = t.observe(
            &root,
            seen(Phase::Live, vec![cluster.clone(), stack.clone()]),
            0.0,
        );
        assert_eq!(c.len(), 1);
        assert_eq!(t.total(), 3);
        assert_eq!(t.pending().len(), 3);
        t.observe(&cluster, seen(Phase::Live, vec![]), 0.0);
        let c = t.observe(
            &stack,
            Seen {
                state: Phase::Live,
                children: vec![],
                used_by: vec![],
            },
            0.0,
        );
        assert_eq!(c[0].what, "live");
        let c = t.observe(
            &root,
            seen(
                Phase::Deleting {
                    finalizers: vec!["foregroundDeletion".into()],
                },
                vec![],
            ),
            1.0,
        );
        assert!(c[0].what.contains("foreground cascade"), "{c:?}");
        let c = t.observe(
            &cluster,
            Seen {
                state: Phase::Live,
                children: vec![],
                used_by: vec!["Usage u: in use by ServingStack prod-stack".into()],
            },
            1.5,
        );
        assert_eq!(c.len(), 1);
        assert!(t.render(Duration::from_secs(2)).contains("in use: Usage u"));
        t.observe(&stack, seen(Phase::Gone, vec![]), 3.0);
        t.observe(&cluster, seen(Phase::Gone, vec![]), 4.0);
        assert!(!t.done());
        t.observe(&root, seen(Phase::Gone, vec![]), 4.5);
        assert!(t.done());
        let s = t.summary(Duration::from_secs_f64(4.5));
        assert!(s.complete);
        let order: Vec<&str> = s.order.iter().map(|g| g.object.as_str()).collect();
        assert_eq!(
            order,
            vec![
                "ServingStack/prod-stack",
                "EKSCluster/prod-eks",
                "InferenceCluster/prod"
            ]
        );
        let text = s.render();
        assert!(text.contains("3 objects gone in 4.5s"), "{text}");
    }

    #[test]
    fn children_stay_after_their_parent_is_gone_and_cycles_do_not_loop() {
        let a = key("A", "a");
        let b = key("B", "b");
        let mut t = Trace::new(a.clone());
        t.observe(&a, seen(Phase::Live, vec![b.clone()]), 0.0);
        // a cycle (b claims a as a child) must not loop the renderer
        t.observe(&b, seen(Phase::Live, vec![a.clone()]), 0.0);
        t.observe(&a, seen(Phase::Gone, vec![]), 1.0);
        assert_eq!(t.nodes[&a].children, vec![b.clone()]);
        let text = t.render(Duration::from_secs(1));
        assert_eq!(text.lines().count(), 3, "{text}");
        let s = t.summary(Duration::from_secs(1));
        assert!(!s.complete);
        assert_eq!(s.left, vec!["B/b"]);
        assert!(s.render().contains("still there"));
    }

    #[test]
    fn the_deepest_objects_are_looked_at_first() {
        let (a, b, c) = (key("A", "a"), key("B", "b"), key("C", "c"));
        let mut t = Trace::new(a.clone());
        t.observe(&a, seen(Phase::Live, vec![b.clone()]), 0.0);
        t.observe(&b, seen(Phase::Live, vec![c.clone()]), 0.0);
        assert_eq!(t.pending(), vec![c.clone(), b.clone(), a.clone()]);
        // Seen gone in one look: same time, and the summary says so.
        for k in [&c, &b, &a] {
            t.observe(k, seen(Phase::Gone, vec![]), 2.0);
        }
        let text = t.summary(Duration::from_secs(2)).render();
        assert_eq!(text.matches("(same look)").count(), 2, "{text}");
    }
}
