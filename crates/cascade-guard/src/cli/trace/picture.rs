//! `trace -o dot` and `-o mermaid` (pure): a teardown as it stands, in
//! plan's picture model ([`Picture`]), so that both are drawn by the same
//! [`dot`](crate::cli::plan::dot) and [`mermaid`](crate::cli::plan::mermaid)
//! and look alike. The tree's objects are grouped by parent; each says its
//! state (present, deleting with what holds it, gone and when); what was
//! seen gone in the same look shares a rank, in the order they left; what
//! holds the teardown now is outlined (the blocker), with a line to each
//! object that waits on it.

use std::collections::{BTreeMap, BTreeSet};

use super::view::{Key, Node, Phase, Trace};
use crate::cli::plan::picture::{self, Line, LineKind, Picture, Shape, Wave};
use crate::policy::holders::describe_finalizer;
use crate::policy::names::{FOREGROUND_CASCADE_FINALIZER, FOREGROUND_DELETION_FINALIZER};
use crate::policy::sibling::holds_record::HoldEntry;
use crate::policy::sibling::object::ObjectRef;

/// What sibling order holds now, as its record says.
pub type Holds = [(ObjectRef, HoldEntry)];

/// The API group of an `apiVersion` ("" for the core group's `v1`).
fn group_of(api_version: &str) -> &str {
    api_version.split_once('/').map_or("", |(group, _)| group)
}

fn held_for<'a>(key: &Key, holds: &'a Holds) -> Option<&'a str> {
    let group = group_of(&key.api_version);
    holds
        .iter()
        .find(|(o, _)| {
            o.group == group
                && o.kind == key.kind
                && o.namespace == key.namespace
                && o.name == key.name
        })
        .map(|(_, entry)| entry.held_for.as_str())
}

/// A deleting object that waits for its dependents: the API server's
/// foreground cascade, or cascade-guard's hold until nothing is left.
fn waits_for_dependents(node: &Node) -> bool {
    matches!(&node.state, Phase::Deleting { finalizers } if finalizers
        .iter()
        .any(|f| f == FOREGROUND_DELETION_FINALIZER || f == FOREGROUND_CASCADE_FINALIZER))
}

fn seconds(at: f64) -> String {
    format!("{at:.1}s")
}

/// The picture of `trace` after `elapsed` seconds, with `holds`.
pub fn of(trace: &Trace, elapsed: f64, holds: &Holds) -> Picture {
    let keys: Vec<&Key> = trace.nodes.keys().collect();
    let at: BTreeMap<&Key, usize> = keys.iter().enumerate().map(|(i, k)| (*k, i)).collect();
    let present = |k: &Key| trace.nodes.get(k).is_some_and(|n| n.state != Phase::Gone);

    // Each object's first parent (the tree as trace first read it).
    let mut parent: BTreeMap<usize, usize> = BTreeMap::new();
    let mut children: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, key) in keys.iter().enumerate() {
        for child in &trace.nodes[*key].children {
            if let Some(&c) = at.get(child)
                && c != i
                && !parent.contains_key(&c)
                && Some(child) != trace.root.as_ref()
            {
                parent.insert(c, i);
                children.entry(i).or_default().push(c);
            }
        }
    }
    // Being deleted, or under something that is: part of the teardown now.
    let in_teardown = |mut i: usize| {
        let mut seen = BTreeSet::new();
        loop {
            if matches!(trace.nodes[keys[i]].state, Phase::Deleting { .. }) {
                return true;
            }
            match parent.get(&i) {
                Some(&p) if seen.insert(p) => i = p,
                _ => return false,
            }
        }
    };
    // What holds the teardown: present, part of it, and waiting on nothing
    // of the tree that is still there (a finalizer of its own, a Usage, a
    // sibling-order hold, or not deleted yet).
    let blocker = |i: usize| {
        let node = &trace.nodes[keys[i]];
        node.state != Phase::Gone
            && in_teardown(i)
            && !node
                .children
                .iter()
                .any(|c| present(c) && at.contains_key(c))
    };

    // Ranks: the looks in which objects were seen gone, in order.
    let mut looks: Vec<f64> = trace.nodes.values().filter_map(|n| n.gone_at).collect();
    looks.sort_by(f64::total_cmp);
    looks.dedup();
    let rank_of = |node: &Node| {
        node.gone_at
            .and_then(|t| looks.iter().position(|l| *l == t))
    };
    let waves: Vec<Wave> = looks
        .iter()
        .enumerate()
        .map(|(r, look)| Wave {
            label: format!("left at {}", seconds(*look)),
            shapes: (0..keys.len())
                .filter(|&i| rank_of(&trace.nodes[keys[i]]) == Some(r))
                .collect(),
        })
        .collect();

    let shapes: Vec<Shape> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| {
            let node = &trace.nodes[*key];
            let held = held_for(key, holds).filter(|_| node.state != Phase::Gone);
            Shape {
                lines: lines(node, held),
                wave: rank_of(node),
                go_between: crate::policy::sibling::object::is_go_between(&ObjectRef::new(
                    group_of(&key.api_version),
                    &key.kind,
                    key.namespace.as_deref(),
                    &key.name,
                )),
                outside: false,
                held: held.is_some(),
                hazard: false,
                deleting: matches!(node.state, Phase::Deleting { .. }),
                gone: node.state == Phase::Gone,
                blocker: blocker(i),
            }
        })
        .collect();

    // A line from each present dependent to the deleting owner that waits
    // for it: the chain from the root down to what holds it.
    let mut lines = Vec::new();
    for (&child, &owner) in &parent {
        if present(keys[child]) && waits_for_dependents(&trace.nodes[keys[owner]]) {
            lines.push(Line {
                from: child,
                to: owner,
                kind: LineKind::Waits,
                label: "its owner waits for it".to_string(),
                hazard: false,
                ranks: false,
            });
        }
    }

    let root = trace.root.as_ref().and_then(|r| at.get(r).copied());
    Picture {
        title: title(trace, elapsed, shapes.iter().filter(|s| s.blocker).count()),
        top: picture::nest(root, &children, shapes.len()),
        shapes,
        waves,
        lines,
    }
}

/// An object's label: its kind, its name, and its state with what holds it.
fn lines(node: &Node, held_for: Option<&str>) -> Vec<String> {
    let key = &node.key;
    let name = match &key.namespace {
        Some(ns) => format!("{ns}/{}", key.name),
        None => key.name.clone(),
    };
    let mut lines = vec![key.kind.clone(), name];
    match &node.state {
        Phase::Unknown { reason } => lines.push(format!("cannot read: {reason}")),
        Phase::Live => lines.push("present".to_string()),
        Phase::Deleting { finalizers } => {
            lines.push(match node.deleting_at {
                Some(at) => format!("deleting since {}", seconds(at)),
                None => "deleting (before trace looked)".to_string(),
            });
            lines.extend(finalizers.iter().map(|f| describe_finalizer(f)));
        }
        Phase::Gone => lines.push(format!(
            "gone at {}",
            seconds(node.gone_at.unwrap_or_default())
        )),
    }
    if node.state != Phase::Gone {
        lines.extend(node.used_by.iter().map(|u| format!("in use: {u}")));
    }
    if let Some(by) = held_for {
        lines.push(format!("held by sibling order until {by} is gone"));
    }
    lines
}

fn title(trace: &Trace, elapsed: f64, blockers: usize) -> Vec<String> {
    let root = trace
        .root
        .as_ref()
        .map_or_else(|| "the tree".to_string(), Key::label);
    let (gone, total) = (trace.gone(), trace.total());
    let state = if trace.done() {
        format!(
            "teardown complete: {total} objects gone in {}",
            seconds(elapsed)
        )
    } else if blockers == 0 {
        format!(
            "{gone} of {total} gone after {}; nothing is being deleted",
            seconds(elapsed)
        )
    } else {
        format!(
            "{gone} of {total} gone after {}; outlined in orange: what holds the rest ({blockers})",
            seconds(elapsed)
        )
    };
    vec![format!("trace of {root}"), state]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::plan::{dot, mermaid};
    use crate::cli::trace::view::tests::{key, seen};

    fn deleting(finalizers: &[&str]) -> Phase {
        Phase::Deleting {
            finalizers: finalizers.iter().map(|f| f.to_string()).collect(),
        }
    }

    /// An XR in a foreground cascade: one dependent gone, one held by a
    /// provider's finalizer, one not deleted yet under a held composite.
    fn wedged() -> (Trace, [Key; 5]) {
        let root = key("XR", "root");
        let gone = key("ConfigMap", "gone");
        let held = key("Release", "held");
        let stack = key("Stack", "stack");
        let cluster = key("Cluster", "prod");
        let mut t = Trace::new(root.clone());
        let children = vec![gone.clone(), held.clone(), stack.clone()];
        t.observe(&root, seen(Phase::Live, children), 0.0);
        t.observe(&stack, seen(Phase::Live, vec![cluster.clone()]), 0.0);
        for k in [&gone, &held, &cluster] {
            t.observe(k, seen(Phase::Live, vec![]), 0.0);
        }
        let foreground = || deleting(&[FOREGROUND_DELETION_FINALIZER]);
        t.observe(&root, seen(foreground(), vec![]), 1.0);
        t.observe(&gone, seen(Phase::Gone, vec![]), 1.5);
        let provider = deleting(&["finalizer.managedresource.crossplane.io"]);
        t.observe(&held, seen(provider, vec![]), 1.5);
        t.observe(&stack, seen(foreground(), vec![]), 1.5);
        (t, [root, gone, held, stack, cluster])
    }

    fn at(picture: &Picture, name: &str) -> usize {
        picture
            .shapes
            .iter()
            .position(|s| s.lines[1] == name)
            .expect(name)
    }

    #[test]
    fn what_holds_a_wedged_teardown_is_outlined_with_the_chain_that_waits_on_it() {
        let (trace, _) = wedged();
        let holds = [(
            ObjectRef::new("example.org", "Cluster", None, "prod"),
            HoldEntry {
                root: "uid".into(),
                root_kind: "XR.example.org".into(),
                held_for: "Stack ns/other".into(),
            },
        )];
        let p = of(&trace, 2.0, &holds);
        let blockers: Vec<&str> = p
            .shapes
            .iter()
            .filter(|s| s.blocker)
            .map(|s| s.lines[1].as_str())
            .collect();
        assert_eq!(blockers, ["prod", "held"]);
        let gone = &p.shapes[at(&p, "gone")];
        assert!(gone.gone && !gone.blocker && gone.wave == Some(0));
        assert_eq!(gone.lines[2], "gone at 1.5s");
        let held = &p.shapes[at(&p, "held")];
        assert!(held.deleting);
        assert_eq!(
            held.lines[2..],
            [
                "deleting since 1.5s",
                "provider finalizer finalizer.managedresource.crossplane.io (the provider is deleting the external resource)"
            ]
        );
        let cluster = &p.shapes[at(&p, "prod")];
        assert!(cluster.held);
        assert_eq!(
            cluster.lines[2..],
            [
                "present",
                "held by sibling order until Stack ns/other is gone"
            ]
        );
        let waits: Vec<String> = p
            .lines
            .iter()
            .map(|l| {
                format!(
                    "{} -> {}",
                    p.shapes[l.from].lines[1], p.shapes[l.to].lines[1]
                )
            })
            .collect();
        assert_eq!(waits, ["prod -> stack", "held -> root", "stack -> root"]);
        assert_eq!(
            p.waves,
            [Wave {
                label: "left at 1.5s".into(),
                shapes: vec![at(&p, "gone")]
            }]
        );
        assert_eq!(
            p.title,
            [
                "trace of XR/root",
                "1 of 5 gone after 2.0s; outlined in orange: what holds the rest (2)"
            ]
        );
        // Grouped by parent: the root's group holds the stack's.
        let text = mermaid::mermaid(&p);
        assert!(text.contains("subgraph t"), "{text}");
        assert!(text.contains("classDef blocker"), "{text}");
        let drawn = dot::dot(&p);
        assert!(drawn.contains("penwidth=3"), "{drawn}");
    }

    #[test]
    fn a_finished_teardown_ranks_what_left_by_the_look_that_saw_it_gone() {
        let (mut trace, [root, _, held, stack, cluster]) = wedged();
        trace.observe(&held, seen(Phase::Gone, vec![]), 3.0);
        trace.observe(&cluster, seen(Phase::Gone, vec![]), 4.0);
        trace.observe(&stack, seen(Phase::Gone, vec![]), 4.0);
        trace.observe(&root, seen(Phase::Gone, vec![]), 5.0);
        let p = of(&trace, 5.0, &[]);
        let ranks: Vec<(String, Vec<String>)> = p
            .waves
            .iter()
            .map(|w| {
                (
                    w.label.clone(),
                    w.shapes
                        .iter()
                        .map(|&s| p.shapes[s].lines[1].clone())
                        .collect(),
                )
            })
            .collect();
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            ranks,
            [
                ("left at 1.5s".to_string(), names(&["gone"])),
                ("left at 3.0s".to_string(), names(&["held"])),
                ("left at 4.0s".to_string(), names(&["prod", "stack"])),
                ("left at 5.0s".to_string(), names(&["root"])),
            ]
        );
        assert!(p.shapes.iter().all(|s| s.gone && !s.blocker && !s.deleting));
        assert!(p.lines.is_empty());
        assert_eq!(p.title[1], "teardown complete: 5 objects gone in 5.0s");
    }

    #[test]
    fn a_tree_not_being_deleted_has_no_blocker() {
        let root = key("XR", "root");
        let child = key("ConfigMap", "c");
        let mut t = Trace::new(root.clone());
        t.observe(&root, seen(Phase::Live, vec![child.clone()]), 0.0);
        t.observe(&child, seen(Phase::Live, vec![]), 0.0);
        let p = of(&t, 0.0, &[]);
        assert!(p.shapes.iter().all(|s| !s.blocker && !s.gone));
        assert!(p.waves.is_empty() && p.lines.is_empty());
        assert_eq!(
            p.title[1],
            "0 of 2 gone after 0.0s; nothing is being deleted"
        );
    }
}
