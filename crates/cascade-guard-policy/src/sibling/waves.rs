//! The waves (pure): when each object of the tree leaves under ordered
//! teardown.
//!
//! Waves say when each object of the tree leaves under ordered teardown, where
//! cascade-guard deletes the children of each parent in the order of the
//! sibling edges and each child with a foreground cascade: an object leaves
//! after its children, and nothing under b' leaves before a' is gone. Wave 0
//! leaves first; a wave is sorted by kind, namespace and name.
//!
//! Sibling edges that form a cycle are reported ([`Cycle`](super::lifting::Cycle)) and left out of
//! the waves: the siblings of a cycle are taken as the foreground cascade
//! takes them, together. Their waves, and those of what lies under them, are
//! that fallback, marked by [`Node::cycle`](super::graph::Node::cycle). Objects outside the tree get no
//! wave: the cascade does not delete them, so edges to them order nothing.

use std::collections::{HashSet, VecDeque};

use super::builder::Builder;
use super::lifting::Lifted;
use super::object::ObjectRef;

impl Builder<'_> {
    /// Each object of the tree leaves after its children, and every leaf
    /// under b' after a' for each sibling edge outside a cycle (so all of b'
    /// after a'). The longest chain before an object is its wave. The
    /// sibling edges left after removing cycles cannot close a cycle here:
    /// one would show as a cycle of sibling edges among the children of its
    /// highest objects' parent.
    pub(super) fn waves(
        &self,
        lifted: &Lifted,
        cyclic_pairs: &HashSet<(usize, usize)>,
    ) -> Vec<Option<usize>> {
        let n = self.refs.len();
        let mut after: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut waiting = vec![0usize; n];
        for &i in &self.euler {
            if let Some(p) = self.ix.parent[i] {
                after[i].push(p);
                waiting[p] += 1;
            }
        }
        let is_leaf = |i: usize| self.ix.tout[i] == self.ix.tin[i] + 1;
        for &(_, a, b) in lifted.keys() {
            if cyclic_pairs.contains(&(a, b)) {
                continue;
            }
            for &leaf in &self.euler[self.ix.tin[b]..self.ix.tout[b]] {
                if is_leaf(leaf) {
                    after[a].push(leaf);
                    waiting[leaf] += 1;
                }
            }
        }
        let mut wave: Vec<Option<usize>> = vec![None; n];
        let mut ready: VecDeque<usize> = self
            .euler
            .iter()
            .copied()
            .filter(|&i| waiting[i] == 0)
            .collect();
        for &i in &ready {
            wave[i] = Some(0);
        }
        let mut level = vec![0usize; n];
        while let Some(u) = ready.pop_front() {
            for &v in &after[u] {
                level[v] = level[v].max(level[u] + 1);
                waiting[v] -= 1;
                if waiting[v] == 0 {
                    wave[v] = Some(level[v]);
                    ready.push_back(v);
                }
            }
        }
        wave
    }

    /// For each object, the cycle (an index into `members`) it is one of the
    /// siblings of, or lies under.
    pub(super) fn cycle_of(&self, members: &[(usize, Vec<usize>)]) -> Vec<Option<usize>> {
        let mut cycle_of: Vec<Option<usize>> = vec![None; self.refs.len()];
        for (c, (_, members)) in members.iter().enumerate() {
            for &m in members {
                for &d in &self.euler[self.ix.tin[m]..self.ix.tout[m]] {
                    cycle_of[d].get_or_insert(c);
                }
            }
        }
        cycle_of
    }

    /// The objects of each wave, wave 0 first.
    pub(super) fn wave_lists(&self, wave: &[Option<usize>]) -> Vec<Vec<ObjectRef>> {
        let mut waves: Vec<Vec<ObjectRef>> = Vec::new();
        for (i, w) in wave.iter().enumerate() {
            if let Some(w) = *w {
                if waves.len() <= w {
                    waves.resize_with(w + 1, Vec::new);
                }
                waves[w].push(self.refs[i].clone());
            }
        }
        waves
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::sibling::graph::{Graph, Relation};
    use crate::sibling::hazards::{HazardKind, Teardown};
    use crate::sibling::needs_annotation::NEEDS_ANNOTATION;
    use crate::sibling::test_objects::*;
    use crate::test_rng::Rng;

    #[test]
    fn the_seed_tree_leaves_serving_before_the_cluster() {
        let g = graph_of(&seed(SeedUsage::ComposedBeside));
        assert!(g.problems.is_empty(), "{:?}", g.problems);
        assert!(g.cycles.is_empty() && g.conflicts.is_empty());
        let waves: Vec<Vec<String>> = g.waves.iter().map(|w| names(w)).collect();
        assert_eq!(
            waves,
            [
                vec![
                    "Object prod-namespace",
                    "Release prod-cert-manager",
                    "Release prod-ingress",
                    "Release prod-vllm",
                    "Usage prod-serving-uses-eks",
                ],
                vec!["ServingStack prod-serving"],
                vec![
                    "ProviderConfig.helm.crossplane.io prod-helm",
                    "ProviderConfig.kubernetes.crossplane.io prod-kubeconfig"
                ],
                vec!["Secret crossplane-system/prod-conn"],
                vec!["Cluster prod"],
                vec!["EKSCluster prod-eks"],
                vec!["InferenceCluster prod"],
            ]
        );
        let sibling: Vec<String> = g
            .sibling_edges
            .iter()
            .map(|s| format!("{} before {}: {}", s.before, s.after, s.reasons.len()))
            .collect();
        assert_eq!(
            sibling,
            [
                "ProviderConfig.helm.crossplane.io prod-helm before Cluster prod: 1",
                "ProviderConfig.kubernetes.crossplane.io prod-kubeconfig before Cluster prod: 1",
                "ServingStack prod-serving before EKSCluster prod-eks: 5",
            ]
        );
        // All of ServingStack's subtree leaves before any of EKSCluster's.
        let subtree_waves = |top: &str| -> Vec<usize> {
            g.nodes
                .iter()
                .filter(|n| {
                    n.object.name == top
                        || matches!(
                            g.relation(
                                &n.object,
                                &g.nodes
                                    .iter()
                                    .find(|m| m.object.name == top)
                                    .expect("top")
                                    .object
                            ),
                            Some(Relation::Satisfied)
                        )
                })
                .filter_map(|n| n.wave)
                .collect()
        };
        let serving = subtree_waves("prod-serving");
        let eks = subtree_waves("prod-eks");
        assert_eq!(serving.len(), 5);
        assert_eq!(eks.len(), 5);
        assert!(serving.iter().max() < eks.iter().min());
    }

    #[test]
    fn a_provider_config_composed_beside_its_users_leaves_after_them() {
        let root = xr("XNet", None, "net");
        let objects = vec![
            root.clone(),
            under(pc("aws.upbound.io/v1beta1", None, "net-pc"), &root),
            under(
                mr(
                    "VPC",
                    None,
                    "vpc",
                    json!({"providerConfigRef": {"name": "net-pc"}}),
                ),
                &root,
            ),
            under(
                mr(
                    "Subnet",
                    None,
                    "subnet",
                    json!({"providerConfigRef": {"name": "net-pc"}}),
                ),
                &root,
            ),
        ];
        let g = graph_of(&objects);
        let wave = |v: &Value| g.wave(&r(v)).expect("wave");
        assert!(wave(&objects[2]) < wave(&objects[1]));
        assert!(wave(&objects[3]) < wave(&objects[1]));
        assert!(wave(&objects[1]) < wave(&root));
        assert_eq!(g.hazards(Teardown::Foreground).len(), 2);
        assert!(g.hazards(Teardown::Ordered).is_empty());
    }

    /// Checks what waves promise: children before parents, and for every
    /// edge of the tree not in a cycle nor a conflict, the needer before
    /// what it needs.
    fn assert_waves_consistent(g: &Graph, what: &str) {
        for n in g.nodes.iter().filter(|n| n.in_tree) {
            let wave = n.wave.expect("every object of the tree has a wave");
            if let Some(p) = &n.parent {
                assert!(
                    wave < g.wave(p).expect("parent wave"),
                    "{what}: {} under {p}",
                    n.object
                );
            }
        }
        for e in &g.edges {
            let ordered = match g.relation(&e.object, &e.needs) {
                Some(Relation::Satisfied) => true,
                Some(Relation::Siblings { before, after, .. }) => g
                    .sibling_edges
                    .iter()
                    .any(|s| s.before == before && s.after == after && !s.in_cycle),
                _ => false,
            };
            if ordered {
                assert!(g.wave(&e.object) < g.wave(&e.needs), "{what}: {e}");
            }
        }
    }

    #[test]
    fn a_tree_of_two_hundred_objects() {
        // Twenty stacks under one root; the resources of each use the
        // ProviderConfig of the stack before.
        let root = xr("XPlatform", None, "platform");
        let mut objects = vec![root.clone()];
        for i in 0..20 {
            let stack = under(xr("XStack", None, &format!("stack-{i}")), &root);
            objects.push(under(
                pc("aws.upbound.io/v1beta1", None, &format!("pc-{i}")),
                &stack,
            ));
            for j in 0..8 {
                let uses = format!("pc-{}", i.max(1) - 1);
                let name = format!("bucket-{i}-{j}");
                let m = mr(
                    "Bucket",
                    None,
                    &name,
                    json!({"providerConfigRef": {"name": uses}}),
                );
                objects.push(under(m, &stack));
            }
            objects.push(stack);
        }
        assert_eq!(objects.len(), 201);
        let started = std::time::Instant::now();
        let g = graph_of(&objects);
        let hazards = g.hazards(Teardown::Foreground);
        eprintln!("201 objects: {:?}", started.elapsed());
        assert!(g.problems.is_empty() && g.cycles.is_empty() && g.conflicts.is_empty());
        // Stacks 1 to 19 use the stack before; stack 0 its own ProviderConfig,
        // composed beside its buckets: all 160 are deleted with what they need.
        assert_eq!(hazards.len(), 20 * 8);
        assert!(g.hazards(Teardown::Ordered).is_empty());
        assert_waves_consistent(&g, "200 objects");
        let first = |i: usize| g.wave(&r(&xr("XStack", None, &format!("stack-{i}"))));
        assert!(first(19) < first(0));
    }

    #[test]
    fn random_trees_keep_needers_before_needed_and_children_before_parents() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for round in 0..60 {
            let in_tree = 2 + rng.below(40);
            let total = in_tree + rng.below(5);
            let name = |i: usize| format!("t{i}");
            let mut objects: Vec<Value> = (0..total)
                .map(|i| {
                    // Some go-betweens, so needs run through them.
                    if i % 7 == 3 {
                        obj("v1", "ConfigMap", None, &name(i))
                    } else {
                        xr("T", None, &name(i))
                    }
                })
                .collect();
            for i in 1..in_tree {
                let parent = objects[rng.below(i)].clone();
                objects[i] = under(objects[i].clone(), &parent);
            }
            for (i, object) in objects.iter_mut().enumerate() {
                let entries: Vec<String> = (0..rng.below(3))
                    .map(|_| rng.below(total))
                    .filter(|&j| j != i)
                    .map(|j| match j % 7 {
                        3 => format!("ConfigMap/{}", name(j)),
                        _ => format!("T.example.org/{}", name(j)),
                    })
                    .collect();
                if !entries.is_empty() {
                    *object = annotate(object.take(), NEEDS_ANNOTATION, &entries.join(","));
                }
            }
            let g = graph_of(&objects);
            let what = format!("round {round}");
            assert!(g.problems.is_empty(), "{what}: {:?}", g.problems);
            assert_waves_consistent(&g, &what);
            for h in g.hazards(Teardown::Ordered) {
                assert!(
                    matches!(h.kind, HazardKind::Conflict | HazardKind::Cycle),
                    "{what}: {h}"
                );
            }
            for c in &g.cycles {
                assert!(c.objects.len() > 1 && !c.edges.is_empty(), "{what}");
            }
        }
    }
}
