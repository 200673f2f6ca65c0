//! Needs lifted to siblings (pure), and the cycles they can form.
//!
//! Every object's parent is its controller owner among the objects, else its
//! first owner among them; the tree is the root and its descendants. An edge
//! A needs B inside the tree is lifted to the two children a' and b' of their
//! lowest common ancestor on the paths to A and B: a' must be gone before b'
//! goes ([`SiblingEdge`]). If B is an ancestor of A, the foreground cascade
//! already keeps it; if A is an ancestor of B, the cascade deletes B first and
//! nothing can order it (a conflict).

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fmt;

use serde::Serialize;

use super::builder::Builder;
use super::edge::{Edge, Need};
use super::index::{NeedIx, Rel};
use super::object::ObjectRef;

/// `before` must be gone before `after` goes: two children of `parent`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SiblingEdge {
    pub parent: ObjectRef,
    pub before: ObjectRef,
    pub after: ObjectRef,
    /// The needs lifted to it.
    pub reasons: Vec<Need>,
    /// Part of a [`Cycle`], and so left out of the waves.
    pub in_cycle: bool,
}

impl fmt::Display for SiblingEdge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reasons: Vec<String> = self.reasons.iter().map(ToString::to_string).collect();
        write!(
            f,
            "{} must be gone before {} goes: {}",
            self.before,
            self.after,
            reasons.join("; ")
        )
    }
}

/// Siblings that need each other round in a circle: no order satisfies them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cycle {
    pub parent: ObjectRef,
    pub objects: Vec<ObjectRef>,
    pub edges: Vec<SiblingEdge>,
}

/// Sibling edges by positions: (parent, before, after) to the needs lifted
/// to it.
pub(super) type Lifted = BTreeMap<(usize, usize, usize), Vec<Need>>;

/// The cycles among the sibling edges, by positions.
pub(super) struct Cycles {
    /// The (before, after) of every sibling edge in a cycle.
    pub(super) pairs: HashSet<(usize, usize)>,
    /// Each cycle's parent and siblings.
    pub(super) members: Vec<(usize, Vec<usize>)>,
}

impl Builder<'_> {
    /// Lifts every edge of the tree, and every need that goes through an
    /// object outside it (which no edge of the tree orders), to the two
    /// siblings it orders; with the conflicts among them and among `needs`.
    pub(super) fn lift(&self, needs: &[NeedIx], edges: &[Edge]) -> (Lifted, Vec<Need>) {
        let direct = self.edges.iter().enumerate().map(|(k, e)| NeedIx {
            a: e.object,
            x: e.needs,
            through: Vec::new(),
            edges: vec![k],
        });
        let outside = needs
            .iter()
            .filter(|need| need.through.iter().any(|&t| !self.ix.in_tree[t]))
            .cloned();
        let mut lifted = Lifted::new();
        let mut conflicts: Vec<Need> = Vec::new();
        let mut conflicting = HashSet::new();
        for need in direct.chain(outside) {
            match self.ix.relation(need.a, need.x) {
                Rel::Siblings { parent, a, b } => lifted
                    .entry((parent, a, b))
                    .or_default()
                    .push(self.public_need(&need, edges)),
                Rel::Conflict if conflicting.insert((need.a, need.x)) => {
                    conflicts.push(self.public_need(&need, edges));
                }
                _ => {}
            }
        }
        for need in needs {
            if self.ix.relation(need.a, need.x) == Rel::Conflict
                && conflicting.insert((need.a, need.x))
            {
                conflicts.push(self.public_need(need, edges));
            }
        }
        (lifted, conflicts)
    }

    /// The sibling edges and cycles as the graph shows them.
    pub(super) fn sibling_edges(
        &self,
        lifted: &Lifted,
        cycles: &Cycles,
    ) -> (Vec<SiblingEdge>, Vec<Cycle>) {
        let refs = &self.refs;
        let sibling_edges: Vec<SiblingEdge> = lifted
            .iter()
            .map(|(&(parent, a, b), reasons)| SiblingEdge {
                parent: refs[parent].clone(),
                before: refs[a].clone(),
                after: refs[b].clone(),
                reasons: reasons.clone(),
                in_cycle: cycles.pairs.contains(&(a, b)),
            })
            .collect();
        let public_cycles: Vec<Cycle> = cycles
            .members
            .iter()
            .map(|(parent, members)| Cycle {
                parent: refs[*parent].clone(),
                objects: members.iter().map(|&m| refs[m].clone()).collect(),
                edges: sibling_edges
                    .iter()
                    .zip(lifted.keys())
                    .filter(|(_, (p, a, b))| {
                        p == parent && members.contains(a) && members.contains(b)
                    })
                    .map(|(s, _)| s.clone())
                    .collect(),
            })
            .collect();
        (sibling_edges, public_cycles)
    }

    /// Keeps in the index the sibling edges outside any cycle, which order
    /// the teardown.
    pub(super) fn order_siblings(&mut self, lifted: &Lifted, cycles: &Cycles) {
        for &(_, a, b) in lifted.keys() {
            if !cycles.pairs.contains(&(a, b)) {
                self.ix.sibling_after.entry(a).or_default().push(b);
            }
        }
    }
}

/// Cycles: siblings that reach each other through sibling edges.
pub(super) fn find_cycles(lifted: &Lifted) -> Cycles {
    let mut by_parent: BTreeMap<usize, Vec<(usize, usize)>> = BTreeMap::new();
    for &(parent, a, b) in lifted.keys() {
        by_parent.entry(parent).or_default().push((a, b));
    }
    let mut cycles = Cycles {
        pairs: HashSet::new(),
        members: Vec::new(),
    };
    for (&parent, pairs) in &by_parent {
        let mut after: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for &(a, b) in pairs {
            after.entry(a).or_default().push(b);
            after.entry(b).or_default();
        }
        let reach: BTreeMap<usize, HashSet<usize>> =
            after.keys().map(|&s| (s, reachable(&after, s))).collect();
        let mut placed = HashSet::new();
        for &s in after.keys() {
            if placed.contains(&s) {
                continue;
            }
            let members: Vec<usize> = after
                .keys()
                .copied()
                .filter(|&t| t == s || (reach[&s].contains(&t) && reach[&t].contains(&s)))
                .collect();
            placed.extend(members.iter().copied());
            if members.len() > 1 {
                for &(a, b) in pairs {
                    if members.contains(&a) && members.contains(&b) {
                        cycles.pairs.insert((a, b));
                    }
                }
                cycles.members.push((parent, members));
            }
        }
    }
    cycles
}

fn reachable(after: &BTreeMap<usize, Vec<usize>>, from: usize) -> HashSet<usize> {
    let mut seen = HashSet::new();
    let mut queue = VecDeque::from([from]);
    while let Some(u) = queue.pop_front() {
        for &v in after.get(&u).into_iter().flatten() {
            if seen.insert(v) {
                queue.push_back(v);
            }
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::sibling::graph::Relation;
    use crate::sibling::hazards::{HazardKind, Teardown};
    use crate::sibling::needs_annotation::NEEDS_ANNOTATION;
    use crate::sibling::test_objects::*;

    /// R owns X and Y; X owns X1 (which owns X11) and X2; Y owns Y1 (which
    /// owns Y11). All of kind T.
    fn lifting_tree(needer: &str, needed: &str) -> Vec<Value> {
        let t = |name: &str| {
            let o = xr("T", None, name);
            if name == needer {
                annotate(o, NEEDS_ANNOTATION, &format!("T.example.org/{needed}"))
            } else {
                o
            }
        };
        let root = t("r");
        let (x, y) = (under(t("x"), &root), under(t("y"), &root));
        let (x1, x2, y1) = (under(t("x1"), &x), under(t("x2"), &x), under(t("y1"), &y));
        let (x11, y11) = (under(t("x11"), &x1), under(t("y11"), &y1));
        vec![root, x, y, x1, x2, y1, x11, y11]
    }

    #[test]
    fn edges_lift_to_the_children_of_the_lowest_common_ancestor() {
        let t = |name: &str| ObjectRef::new("example.org", "T", None, name);
        let siblings = |p: &str, a: &str, b: &str| Relation::Siblings {
            parent: t(p),
            before: t(a),
            after: t(b),
        };
        let cases = [
            ("depth 1", "x", "y", siblings("r", "x", "y")),
            ("depth 2", "x1", "y1", siblings("r", "x", "y")),
            ("depth 3", "x11", "y11", siblings("r", "x", "y")),
            (
                "needed two levels down in a sibling XR",
                "x",
                "y11",
                siblings("r", "x", "y"),
            ),
            ("inside one XR", "x11", "x2", siblings("x", "x1", "x2")),
            ("an ancestor: already kept", "x11", "x", Relation::Satisfied),
            ("a descendant: conflict", "x", "x11", Relation::Conflict),
        ];
        for (what, needer, needed, want) in cases {
            let g = graph_of(&lifting_tree(needer, needed));
            assert!(g.problems.is_empty(), "{what}: {:?}", g.problems);
            assert_eq!(
                g.relation(&t(needer), &t(needed)),
                Some(want.clone()),
                "{what}"
            );
            let lifted: Vec<_> = g
                .sibling_edges
                .iter()
                .map(|s| (s.before.name.as_str(), s.after.name.as_str()))
                .collect();
            match want {
                Relation::Siblings { before, after, .. } => {
                    assert_eq!(
                        lifted,
                        [(before.name.as_str(), after.name.as_str())],
                        "{what}"
                    );
                    let reasons = &g.sibling_edges[0].reasons;
                    assert_eq!(reasons.len(), 1, "{what}");
                    assert_eq!(reasons[0].object, t(needer), "{what}");
                    assert!(g.conflicts.is_empty(), "{what}");
                }
                Relation::Conflict => {
                    assert!(lifted.is_empty(), "{what}");
                    assert_eq!(g.conflicts.len(), 1, "{what}");
                    let hazards = g.hazards(Teardown::Ordered);
                    assert_eq!(hazards.len(), 1, "{what}");
                    assert_eq!(hazards[0].kind, HazardKind::Conflict, "{what}");
                    assert!(g.hazards(Teardown::Background).is_empty(), "{what}");
                }
                _ => {
                    assert!(lifted.is_empty(), "{what}");
                    assert!(g.conflicts.is_empty(), "{what}");
                    assert!(g.hazards(Teardown::Foreground).is_empty(), "{what}");
                    assert_eq!(g.hazards(Teardown::Background).len(), 1, "{what}");
                }
            }
        }
    }

    #[test]
    fn cycles_of_two_and_three_siblings_are_reported_not_ordered() {
        // Each sibling needs the next, round the circle.
        let cases: [&[&str]; 2] = [&["a", "b"], &["a", "b", "c"]];
        for circle in cases {
            let root = xr("T", None, "r");
            let mut objects = vec![root.clone()];
            for (k, name) in circle.iter().enumerate() {
                let next = circle[(k + 1) % circle.len()];
                let o = annotate(
                    xr("T", None, name),
                    NEEDS_ANNOTATION,
                    &format!("T.example.org/{next}"),
                );
                objects.push(under(o, &root));
            }
            let leaf = under(xr("T", None, "a-child"), &objects[1]);
            let bystander = under(xr("T", None, "z"), &root);
            objects.extend([leaf, bystander]);
            let g = graph_of(&objects);
            assert_eq!(g.cycles.len(), 1, "{circle:?}");
            let cycle = &g.cycles[0];
            let names: Vec<&str> = cycle.objects.iter().map(|o| o.name.as_str()).collect();
            assert_eq!(names, circle, "{circle:?}");
            assert_eq!(cycle.edges.len(), circle.len(), "{circle:?}");
            assert!(cycle.edges.iter().all(|e| e.in_cycle));
            let node = |name: &str| {
                g.node(&ObjectRef::new("example.org", "T", None, name))
                    .expect("node")
            };
            for name in circle.iter().chain(&["a-child"]) {
                assert_eq!(node(name).cycle, Some(0), "{name}");
            }
            assert_eq!(node("z").cycle, None);
            // The fallback still puts every child before its parent.
            assert!(node("a-child").wave < node("a").wave);
            assert!(circle.iter().all(|n| node(n).wave < node("r").wave));
            let ordered = g.hazards(Teardown::Ordered);
            assert_eq!(ordered.len(), circle.len(), "{circle:?}");
            assert!(ordered.iter().all(|h| h.kind == HazardKind::Cycle));
            assert!(
                ordered[0]
                    .message
                    .contains("a cycle of needs among what T r owns"),
                "{}",
                ordered[0]
            );
        }
    }
}
