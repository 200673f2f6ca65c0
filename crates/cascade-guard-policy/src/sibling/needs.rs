//! What each object needs, directly or through go-betweens.
//!
//! ProviderConfigs, ClusterProviderConfigs, Secrets and ConfigMaps are
//! go-betweens: they do nothing of their own while deleted and need what they
//! need only for their readers. So what an object needs ([`Need`](super::edge::Need)) is
//! followed through go-betweens ("Release r needs Cluster c, through
//! ProviderConfig p and Secret s"), and hazards are named for such needs of
//! objects that are not go-betweens.

use std::collections::{HashMap, VecDeque};

use super::builder::{Builder, RawEdge};
use super::edge::{Edge, Need, Provenance};
use super::index::NeedIx;
use super::object::is_go_between;

impl Builder<'_> {
    /// What each object of the tree that is not a go-between needs, through
    /// go-betweens; and what objects outside the tree need inside it (the
    /// cascade never deletes them), but for a Crossplane Usage's own edge:
    /// its webhook keeps what it protects, and a hold would refuse its
    /// replay. Each sorted by needer, then needed.
    pub(super) fn needs(&self) -> (Vec<NeedIx>, Vec<NeedIx>) {
        let n = self.refs.len();
        let mut out_edges: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (k, e) in self.edges.iter().enumerate() {
            out_edges[e.object].push(k);
        }
        let go_between: Vec<bool> = self.refs.iter().map(is_go_between).collect();
        let mut needs: Vec<NeedIx> = Vec::new();
        for a in (0..n).filter(|&a| self.ix.in_tree[a] && !go_between[a]) {
            needs.extend(self.needs_of(a, &out_edges, &go_between, |_| true));
        }
        needs.sort_by_key(|need| (need.a, need.x));
        let mut outside_needs: Vec<NeedIx> = Vec::new();
        for a in (0..n).filter(|&a| !self.ix.in_tree[a] && !go_between[a]) {
            outside_needs.extend(
                self.needs_of(a, &out_edges, &go_between, |e| {
                    e.provenance != Provenance::Usage
                })
                .into_iter()
                .filter(|need| self.ix.in_tree[need.x]),
            );
        }
        outside_needs.sort_by_key(|need| (need.a, need.x));
        (needs, outside_needs)
    }

    /// A need as the graph shows it; `edges` are the graph's.
    pub(super) fn public_need(&self, need: &NeedIx, edges: &[Edge]) -> Need {
        let refs = &self.refs;
        Need {
            object: refs[need.a].clone(),
            needs: refs[need.x].clone(),
            through: need.through.iter().map(|&t| refs[t].clone()).collect(),
            edges: need.edges.iter().map(|&k| edges[k].clone()).collect(),
        }
    }

    /// What `a` needs, directly or through go-betweens, following the edges
    /// `follow` takes: a shortest path to each.
    fn needs_of(
        &self,
        a: usize,
        out_edges: &[Vec<usize>],
        go_between: &[bool],
        follow: impl Fn(&RawEdge) -> bool,
    ) -> Vec<NeedIx> {
        let mut out = Vec::new();
        let mut via: HashMap<usize, usize> = HashMap::new();
        let mut queue = VecDeque::from([a]);
        while let Some(u) = queue.pop_front() {
            for &k in &out_edges[u] {
                let x = self.edges[k].needs;
                if x == a || via.contains_key(&x) || !follow(&self.edges[k]) {
                    continue;
                }
                via.insert(x, k);
                let mut path = vec![k];
                let mut at = self.edges[k].object;
                while at != a {
                    let Some(&back) = via.get(&at) else { break };
                    path.push(back);
                    at = self.edges[back].object;
                }
                path.reverse();
                let through = path[1..].iter().map(|&k| self.edges[k].object).collect();
                out.push(NeedIx {
                    a,
                    x,
                    through,
                    edges: path,
                });
                if go_between[x] {
                    queue.push_back(x);
                }
            }
        }
        out
    }
}
