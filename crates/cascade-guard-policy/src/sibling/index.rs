//! The index of a graph: positions in [`Graph::nodes`](super::graph::Graph::nodes)
//! and what the tree says of them.

use std::collections::{HashMap, HashSet, VecDeque};

use super::object::ObjectRef;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Rel {
    Outside,
    Satisfied,
    Conflict,
    Siblings { parent: usize, a: usize, b: usize },
}

/// A Usage whose both sides resolved.
#[derive(Clone, Copy, Debug)]
pub(super) struct UsageFact {
    pub(super) usage: usize,
    pub(super) of: usize,
    pub(super) by: usize,
    /// Composed by an XR (Crossplane's label [`COMPOSITE_LABEL`]): then
    /// Crossplane itself keeps a deleting Usage until its user is gone.
    pub(super) composed: bool,
}

/// A need by positions; `edges` index `Builder::edges`.
#[derive(Clone, Debug)]
pub(super) struct NeedIx {
    pub(super) a: usize,
    pub(super) x: usize,
    pub(super) through: Vec<usize>,
    pub(super) edges: Vec<usize>,
}

#[derive(Clone, Debug, Default)]
pub(super) struct Index {
    pub(super) by_ref: HashMap<ObjectRef, usize>,
    pub(super) in_tree: Vec<bool>,
    pub(super) parent: Vec<Option<usize>>,
    pub(super) depth: Vec<usize>,
    /// Position in a depth-first walk of the tree, and the end of the subtree.
    pub(super) tin: Vec<usize>,
    pub(super) tout: Vec<usize>,
    pub(super) usages: Vec<UsageFact>,
    /// Parallel to `Graph::needs`.
    pub(super) needs: Vec<NeedIx>,
    /// Sibling edges not in a cycle, by `before`.
    pub(super) sibling_after: HashMap<usize, Vec<usize>>,
}

impl Index {
    /// `ancestor` is `x` or above it, both in the tree.
    pub(super) fn covers(&self, ancestor: usize, x: usize) -> bool {
        self.in_tree[ancestor]
            && self.in_tree[x]
            && self.tin[ancestor] <= self.tin[x]
            && self.tout[x] <= self.tout[ancestor]
    }

    pub(super) fn relation(&self, a: usize, b: usize) -> Rel {
        if !self.in_tree[a] || !self.in_tree[b] {
            return Rel::Outside;
        }
        if self.covers(b, a) {
            return Rel::Satisfied;
        }
        if self.covers(a, b) {
            return Rel::Conflict;
        }
        let (mut x, mut y) = (a, b);
        while self.depth[x] > self.depth[y] {
            let Some(p) = self.parent[x] else { break };
            x = p;
        }
        while self.depth[y] > self.depth[x] {
            let Some(p) = self.parent[y] else { break };
            y = p;
        }
        while let (Some(px), Some(py)) = (self.parent[x], self.parent[y]) {
            if px == py {
                return Rel::Siblings {
                    parent: px,
                    a: x,
                    b: y,
                };
            }
            (x, y) = (px, py);
        }
        Rel::Outside
    }

    /// `b` must wait for `a` through sibling edges outside any cycle.
    pub(super) fn ordered(&self, a: usize, b: usize) -> bool {
        let mut seen = HashSet::from([a]);
        let mut queue = VecDeque::from([a]);
        while let Some(u) = queue.pop_front() {
            for &v in self.sibling_after.get(&u).into_iter().flatten() {
                if v == b {
                    return true;
                }
                if seen.insert(v) {
                    queue.push_back(v);
                }
            }
        }
        false
    }

    pub(super) fn held_in_background(&self, need: &NeedIx) -> bool {
        self.usages
            .iter()
            .any(|u| self.covers(u.of, need.x) && self.covers(need.a, u.by))
    }

    /// A Usage placed in the tree beside the two sides (its controller, else
    /// its first owner, is not on the needer's side) holds: the cascade
    /// deletes it with the siblings, and Crossplane keeps a deleting Usage
    /// until its user is gone (the seed's tree, on real Crossplane). One
    /// under the needer's side, as a standalone Usage is once Crossplane makes
    /// its user its owner, goes in that side's own cascade first.
    pub(super) fn held_in_foreground(&self, need: &NeedIx, needer_side: usize) -> bool {
        self.usages.iter().any(|u| {
            self.covers(u.of, need.x)
                && self.covers(u.by, need.a)
                && !self.covers(needer_side, u.usage)
        })
    }
}
