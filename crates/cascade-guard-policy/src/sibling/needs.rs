//! What each object needs, directly or through go-betweens.
//!
//! ProviderConfigs, ClusterProviderConfigs, Secrets and ConfigMaps are
//! go-betweens: they do nothing of their own while deleted and need what they
//! need only for their readers. So what an object needs ([`Need`]) is
//! followed through go-betweens ("Release r needs Cluster c, through
//! ProviderConfig p and Secret s"), and hazards are named for such needs of
//! objects that are not go-betweens.

use std::collections::{HashMap, VecDeque};

use super::builder::{Builder, RawEdge};
use super::index::NeedIx;

impl Builder<'_> {
    /// What `a` needs, directly or through go-betweens, following the edges
    /// `follow` takes: a shortest path to each.
    pub(super) fn needs_of(
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
