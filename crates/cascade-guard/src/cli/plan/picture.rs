//! `plan` as a picture (pure), before any diagram language: the tree's
//! objects grouped by their parent, each with its wave, the edges with where
//! they were read, the sibling order, and how each object and line is drawn
//! (a go-between dimmed, an object outside the tree dashed, a held one
//! outlined, a hazard red). [`dot`](super::dot) and
//! [`mermaid`](super::mermaid) only spell it, so the two pictures of a plan
//! always show the same thing, and both keep the graph's order (sorted), so
//! the same plan always gives the same text. `trace` draws a teardown as it
//! happens in the same model ([`crate::cli::trace::picture`]): its ranks are
//! the looks in which objects left, and its objects are gone, deleting, or
//! what holds the rest (the blocker).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::Plan;
use crate::policy::Mode;
use crate::policy::sibling::graph::{Node, Relation};
use crate::policy::sibling::hazards::Teardown;
use crate::policy::sibling::hold::{self, Action};
use crate::policy::sibling::object::{ObjectRef, is_go_between};

/// The colour of a hazard, in every language: what breaks.
pub const RED: &str = "#c00000";
/// The colour of what cascade-guard keeps: the sibling order, a hold.
pub const BLUE: &str = "#1f5fa8";
/// The colour of what holds a teardown now, and of what waits on it.
pub const ORANGE: &str = "#d35400";
/// The fill of an object being deleted.
pub const DELETING_FILL: &str = "#fff1d6";

/// One object, as drawn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Its label, line by line: each language breaks lines its own way.
    pub lines: Vec<String>,
    /// When it leaves, counted from 0; None outside the tree.
    pub wave: Option<usize>,
    /// A ProviderConfig, Secret or ConfigMap: it matters only for its
    /// readers, so it is drawn dimmed.
    pub go_between: bool,
    /// Not deleted by the cascade: referenced by the tree, or using it.
    pub outside: bool,
    /// cascade-guard holds it until what needs it is gone (ordered teardown).
    pub held: bool,
    /// One end of a need that this plan's teardown breaks.
    pub hazard: bool,
    /// Being deleted (it has a deletionTimestamp).
    pub deleting: bool,
    /// Gone from the API (a trace): drawn faded.
    pub gone: bool,
    /// What holds a teardown now (a trace): it is what to look at.
    pub blocker: bool,
}

/// A rank of the picture: the objects drawn level with its label, which
/// heads the rank on the left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wave {
    pub label: String,
    pub shapes: Vec<usize>,
}

/// A parent's subtree: the parent first, then what it owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub parent: usize,
    pub members: Vec<Member>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Member {
    Shape(usize),
    Group(Group),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineKind {
    /// An edge read from the objects: `from` needs `to`.
    Need,
    /// A sibling edge: `from` must be gone before `to` goes.
    Order,
    /// What holds a teardown up (a trace): `to` waits for `from` to go, as
    /// a foreground cascade waits for a dependent, or a Usage for its user.
    Waits,
}

/// A line from `from` to `to` (indices into [`Picture::shapes`]): either
/// way, `to` stays until `from` is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub from: usize,
    pub to: usize,
    pub kind: LineKind,
    pub label: String,
    /// Part of a need this plan's teardown breaks.
    pub hazard: bool,
    /// Whether a layered layout may rank `to` below `from` for it: not
    /// when `to` leaves in the same wave or earlier (a conflict, a cycle),
    /// where it would fight the waves.
    pub ranks: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Picture {
    /// The heading, line by line: the root and its mode, what a plain
    /// delete does, whether it is safe.
    pub title: Vec<String>,
    /// Every object of the plan, in the graph's order.
    pub shapes: Vec<Shape>,
    /// What is drawn at the top level: the root's subtree, then the objects
    /// outside the tree.
    pub top: Vec<Member>,
    /// The shapes of each wave, wave 0 (the first to leave) first.
    pub waves: Vec<Wave>,
    pub lines: Vec<Line>,
}

impl Picture {
    pub fn of(plan: &Plan) -> Picture {
        let graph = &plan.graph;
        let index: HashMap<&ObjectRef, usize> = graph
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (&n.object, i))
            .collect();
        let at = |o: &ObjectRef| index.get(o).copied();

        // Only ordered teardown holds anything; the hold's own rule says
        // what, with nothing held yet and no Usage known to mark an object
        // in use (a plan reads none).
        let mut held: BTreeMap<ObjectRef, String> = BTreeMap::new();
        if plan.teardown == Teardown::Ordered {
            for action in hold::actions(graph, &hold::Held::new(), &BTreeSet::new()) {
                if let Action::Hold { object, held_for } = action {
                    held.insert(object, held_for);
                }
            }
        }

        // Each broken need marks its two ends, the edges it follows, and the
        // sibling edge it is lifted to (the order that is not kept).
        let mut hazard_shapes = BTreeSet::new();
        let mut hazard_edges = BTreeSet::new();
        let mut hazard_orders = BTreeSet::new();
        for hazard in &plan.hazards {
            let need = &hazard.need;
            hazard_shapes.extend(at(&need.object));
            hazard_shapes.extend(at(&need.needs));
            for edge in &need.edges {
                if let (Some(a), Some(b)) = (at(&edge.object), at(&edge.needs)) {
                    hazard_edges.insert((a, b));
                }
            }
            if let Some(Relation::Siblings { before, after, .. }) =
                graph.relation(&need.object, &need.needs)
                && let (Some(a), Some(b)) = (at(&before), at(&after))
            {
                hazard_orders.insert((a, b));
            }
        }

        let shapes: Vec<Shape> = graph
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| shape_of(node, held.get(&node.object), hazard_shapes.contains(&i)))
            .collect();

        let mut children: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, node) in graph.nodes.iter().enumerate() {
            if let Some(parent) = node.parent.as_ref().and_then(at)
                && node.in_tree
            {
                children.entry(parent).or_default().push(i);
            }
        }
        let top = nest(at(&graph.root), &children, shapes.len());

        let waves: Vec<Wave> = graph
            .waves
            .iter()
            .enumerate()
            .map(|(i, wave)| Wave {
                label: format!("wave {}", i + 1),
                shapes: wave.iter().filter_map(at).collect(),
            })
            .collect();

        let ranks = |from: usize, to: usize| match (shapes[from].wave, shapes[to].wave) {
            (Some(a), Some(b)) => a < b,
            _ => true,
        };
        let mut lines = Vec::new();
        for edge in &graph.edges {
            if let (Some(from), Some(to)) = (at(&edge.object), at(&edge.needs)) {
                lines.push(Line {
                    from,
                    to,
                    kind: LineKind::Need,
                    label: edge.reason(),
                    hazard: hazard_edges.contains(&(from, to)),
                    ranks: ranks(from, to),
                });
            }
        }
        for edge in &graph.sibling_edges {
            if let (Some(from), Some(to)) = (at(&edge.before), at(&edge.after)) {
                lines.push(Line {
                    from,
                    to,
                    kind: LineKind::Order,
                    label: if edge.in_cycle {
                        "gone before (in a cycle)".to_string()
                    } else {
                        "gone before".to_string()
                    },
                    hazard: hazard_orders.contains(&(from, to)),
                    ranks: ranks(from, to),
                });
            }
        }

        Picture {
            title: title(plan),
            shapes,
            top,
            waves,
            lines,
        }
    }
}

/// One object's box: its kind on a line of its own, its name, its wave and
/// state, and what it is held for.
fn shape_of(node: &Node, held_for: Option<&String>, hazard: bool) -> Shape {
    let said = node.object.to_string();
    // `Kind[.group] [namespace/]name`: the kind on a line of its own.
    let (kind, name) = said.split_once(' ').unwrap_or((said.as_str(), ""));
    let mut lines = vec![kind.to_string(), name.to_string()];
    let mut status = match node.wave {
        Some(w) if node.in_tree => format!("wave {}", w + 1),
        _ => "outside the tree".to_string(),
    };
    if node.cycle.is_some() {
        status.push_str(", in a cycle");
    }
    if node.deleting {
        status.push_str(", deleting");
    }
    lines.push(status);
    if let Some(by) = held_for {
        lines.push(format!("held until {by} is gone"));
    }
    Shape {
        lines,
        wave: node.wave.filter(|_| node.in_tree),
        go_between: is_go_between(&node.object),
        outside: !node.in_tree,
        held: held_for.is_some(),
        hazard,
        deleting: node.deleting,
        gone: false,
        blocker: false,
    }
}

/// The top level of a picture of `count` shapes: the root's subtree, each
/// shape grouped with what it owns (`children`), then what no parent placed:
/// the objects outside the tree (and, should a graph ever give an in-tree
/// object a parent it does not know, that object too, rather than nowhere).
pub(crate) fn nest(
    root: Option<usize>,
    children: &BTreeMap<usize, Vec<usize>>,
    count: usize,
) -> Vec<Member> {
    let mut top = Vec::new();
    let mut placed = BTreeSet::new();
    if let Some(root) = root {
        top.push(member(root, children, &mut placed));
    }
    for i in 0..count {
        if !placed.contains(&i) {
            top.push(member(i, children, &mut placed));
        }
    }
    top
}

/// A shape, or the group of its subtree when it owns anything. `placed`
/// keeps a shape from being drawn twice, whatever the parents say.
fn member(
    i: usize,
    children: &BTreeMap<usize, Vec<usize>>,
    placed: &mut BTreeSet<usize>,
) -> Member {
    placed.insert(i);
    let owned: Vec<usize> = children
        .get(&i)
        .map(|c| c.iter().copied().filter(|c| !placed.contains(c)).collect())
        .unwrap_or_default();
    if owned.is_empty() {
        return Member::Shape(i);
    }
    let mut members = vec![Member::Shape(i)];
    for child in owned {
        if !placed.contains(&child) {
            members.push(member(child, children, placed));
        }
    }
    Member::Group(Group { parent: i, members })
}

fn title(plan: &Plan) -> Vec<String> {
    let delete = match (plan.mode, plan.teardown) {
        (Mode::Off | Mode::Warn, _) | (_, Teardown::Background) => "Background, everything at once",
        (Mode::Refuse, Teardown::Ordered) => "refused; a foreground one leaves in the waves shown",
        (Mode::Refuse, _) => "refused; a foreground one takes siblings at once",
        (_, Teardown::Ordered) => "ordered, in the waves shown",
        (_, Teardown::Foreground) => "a foreground cascade, siblings at once",
    };
    let safe = match plan.hazards.len() {
        0 if plan.unsafe_now() => {
            "no hazard in what was read, but not shown safe (see the text of plan)".to_string()
        }
        0 => "no hazard".to_string(),
        1 => "1 hazard, in red".to_string(),
        n => format!("{n} hazards, in red"),
    };
    vec![
        format!("{}: {}", plan.root, plan.mode_said()),
        format!("a plain delete: {delete}; {safe}"),
    ]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cli::plan::test_tree::{obj, ordered, plan_of, tree};
    use crate::policy::sibling::needs_annotation::NEEDS_ANNOTATION;

    /// The test tree, and a ConfigMap outside it that the Release needs.
    fn objects() -> Vec<serde_json::Value> {
        let mut objects = tree();
        objects[6]["metadata"]["annotations"] = json!({NEEDS_ANNOTATION: "ConfigMap/settings"});
        objects.push(obj("v1", "ConfigMap", "settings", None, json!(null)));
        objects
    }

    fn names(picture: &Picture, has: fn(&Shape) -> bool) -> Vec<String> {
        picture
            .shapes
            .iter()
            .filter(|s| has(s))
            .map(|s| s.lines[..2].join(" "))
            .collect()
    }

    #[test]
    fn each_teardown_marks_what_it_holds_and_breaks() {
        let broken = ["Cluster ns/prod", "Release ns/web"];
        // The mode, whether sibling order is in force; what is held, what
        // is at either end of a broken need, how many lines are red.
        type Case<'a> = (Mode, bool, &'a [&'a str], &'a [&'a str], usize);
        let cases: [Case; 5] = [
            (Mode::Off, false, &[], &broken, 4),
            (Mode::Refuse, false, &[], &broken, 4),
            (Mode::Convert, false, &[], &broken, 4),
            (
                Mode::Refuse,
                true,
                &["Cluster ns/prod", "XR ns/cluster"],
                &[],
                0,
            ),
            (
                Mode::Convert,
                true,
                &["Cluster ns/prod", "XR ns/cluster"],
                &[],
                0,
            ),
        ];
        for (mode, in_force, held, hazard, red_lines) in cases {
            let plan = plan_of(&objects(), mode);
            let plan = if in_force { ordered(plan) } else { plan };
            let picture = Picture::of(&plan);
            let what = format!("{mode}, sibling order {in_force}");
            assert_eq!(names(&picture, |s| s.held), held, "{what}");
            assert_eq!(names(&picture, |s| s.hazard), hazard, "{what}");
            assert_eq!(
                picture.lines.iter().filter(|l| l.hazard).count(),
                red_lines,
                "{what}: {:#?}",
                picture.lines
            );
            // Whatever the teardown: the go-betweens, the one object outside.
            assert_eq!(
                names(&picture, |s| s.go_between),
                [
                    "ConfigMap ns/settings",
                    "ProviderConfig.helm.m.crossplane.io ns/helm",
                    "Secret ns/conn"
                ],
                "{what}"
            );
            assert_eq!(
                names(&picture, |s| s.outside),
                ["ConfigMap ns/settings"],
                "{what}"
            );
        }
    }

    #[test]
    fn the_tree_nests_by_parent_and_lines_keep_the_graphs_order() {
        let plan = ordered(plan_of(&objects(), Mode::Convert));
        let picture = Picture::of(&plan);
        let at = |name: &str| {
            picture
                .shapes
                .iter()
                .position(|s| s.lines[1] == name)
                .expect(name)
        };
        let shape = |name: &str| Member::Shape(at(name));
        let want = vec![
            Member::Group(Group {
                parent: at("ns/root"),
                members: vec![
                    shape("ns/root"),
                    Member::Group(Group {
                        parent: at("ns/cluster"),
                        members: vec![
                            shape("ns/cluster"),
                            Member::Group(Group {
                                parent: at("ns/prod"),
                                members: vec![shape("ns/prod"), shape("ns/conn")],
                            }),
                            shape("ns/helm"),
                        ],
                    }),
                    Member::Group(Group {
                        parent: at("ns/stack"),
                        members: vec![shape("ns/stack"), shape("ns/web")],
                    }),
                ],
            }),
            shape("ns/settings"),
        ];
        assert_eq!(picture.top, want);
        let settings = &picture.shapes[at("ns/settings")];
        assert_eq!(settings.lines[2], "outside the tree");
        assert_eq!(settings.wave, None);
        assert_eq!(picture.shapes[at("ns/web")].lines[2], "wave 1");
        assert_eq!(
            picture.shapes[at("ns/cluster")].lines[3],
            "held until XR ns/stack is gone"
        );
        let lines: Vec<String> = picture
            .lines
            .iter()
            .map(|l| {
                format!(
                    "{} -> {}: {} {:?} ranks {}",
                    picture.shapes[l.from].lines[1],
                    picture.shapes[l.to].lines[1],
                    l.label,
                    l.kind,
                    l.ranks
                )
            })
            .collect();
        assert_eq!(
            lines,
            [
                "ns/helm -> ns/conn: spec.credentials.secretRef Need ranks true",
                "ns/web -> ns/settings: annotation cascade-guard.dev/needs Need ranks true",
                "ns/web -> ns/helm: spec.providerConfigRef Need ranks true",
                "ns/conn -> ns/prod: spec.writeConnectionSecretToRef of Cluster ns/prod Need ranks true",
                "ns/helm -> ns/prod: gone before Order ranks true",
                "ns/stack -> ns/cluster: gone before Order ranks true",
            ]
        );
        assert_eq!(
            picture.title,
            [
                "XR ns/root: Convert (XRD xrs.example.org)",
                "a plain delete: ordered, in the waves shown; no hazard",
            ]
        );
        assert_eq!(
            Picture::of(&plan),
            picture,
            "the same plan, the same picture"
        );
    }

    #[test]
    fn the_title_says_what_a_plain_delete_does_and_whether_it_is_safe() {
        let cases = [
            (
                Mode::Off,
                false,
                "a plain delete: Background, everything at once; 1 hazard, in red",
            ),
            (
                Mode::Warn,
                false,
                "a plain delete: Background, everything at once; 1 hazard, in red",
            ),
            (
                Mode::Refuse,
                false,
                "a plain delete: refused; a foreground one takes siblings at once; 1 hazard, in red",
            ),
            (
                Mode::Refuse,
                true,
                "a plain delete: refused; a foreground one leaves in the waves shown; no hazard",
            ),
            (
                Mode::Convert,
                false,
                "a plain delete: a foreground cascade, siblings at once; 1 hazard, in red",
            ),
            (
                Mode::Convert,
                true,
                "a plain delete: ordered, in the waves shown; no hazard",
            ),
        ];
        for (mode, in_force, want) in cases {
            let plan = plan_of(&tree(), mode);
            let plan = if in_force { ordered(plan) } else { plan };
            assert_eq!(Picture::of(&plan).title[1], want, "{mode} {in_force}");
        }
        // Read in part: no hazard, and still not shown safe.
        let mut partial = ordered(plan_of(&tree(), Mode::Convert));
        partial.unread.push("Secret other: forbidden".to_string());
        assert!(
            Picture::of(&partial).title[1]
                .ends_with("no hazard in what was read, but not shown safe (see the text of plan)"),
            "{:?}",
            Picture::of(&partial).title
        );
    }
}
