//! What each way of deleting a tree ([`Teardown`]) would break (pure): the
//! needs it leaves unkept, each a [`Hazard`].

use std::collections::{HashMap, HashSet};
use std::fmt;

use serde::Serialize;

use super::edge::Need;
use super::graph::Graph;
use super::index::Rel;

/// How a tree is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Teardown {
    /// The root leaves at once; the garbage collector then deletes what each
    /// deleted object owned as soon as it is gone, and nothing waits.
    Background,
    /// A parent leaves after its children; the children of a parent are
    /// deleted at once.
    Foreground,
    /// The sibling edges are followed (the waves), with a foreground cascade
    /// for each object deleted.
    Ordered,
}

impl Teardown {
    pub const ALL: [Teardown; 3] = [
        Teardown::Background,
        Teardown::Foreground,
        Teardown::Ordered,
    ];
}

/// Why a teardown breaks a need.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum HazardKind {
    /// The two sides are deleted at the same time, and no Usage holds the
    /// needed side long enough.
    Together,
    /// Background only: the needed object owns the needer, and leaves first.
    OwnerFirst,
    /// The needed object is under the needer: the cascade deletes it first.
    Conflict,
    /// Ordered only: a cycle of sibling edges leaves the two unordered.
    Cycle,
    /// Background and Foreground: the needer is outside the tree, which
    /// the cascade never deletes, and the needed object goes from under it.
    OutsideUser,
}

/// A need that a teardown would break: what is needed could leave while
/// what needs it is still there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Hazard {
    pub teardown: Teardown,
    pub kind: HazardKind,
    pub need: Need,
    /// The sentence [`fmt::Display`] prints.
    pub message: String,
}

impl fmt::Display for Hazard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Graph {
    /// The needs (of [`Graph::needs`], both ends in the tree) that
    /// `teardown` would break. Of a need through go-betweens and the shorter
    /// needs along it, only the longest broken one is named.
    ///
    /// - Background: every need, unless the needed object is under the
    ///   needer (which leaves before it is even deleted), or a Usage holds
    ///   it: one whose `of` is the needed object or above it, and whose `by`
    ///   is the needer or under it (the Usage lasts until its user is gone,
    ///   and its user leaves at once).
    /// - Foreground: every need lifted to siblings, unless a Usage holds it:
    ///   `of` is the needed object or above it, `by` is the needer or above
    ///   it, and the Usage is not placed on the needer's side (a' or under
    ///   it, by its controller, else its first owner). A Usage composed
    ///   beside them lasts until its user is gone, whatever other owner
    ///   references Crossplane adds; a standalone one that Crossplane gives
    ///   its user as owner is deleted in that side's cascade first, and is
    ///   not counted on. Also every conflict.
    /// - Ordered: conflicts, and needs a cycle leaves unordered.
    pub fn hazards(&self, teardown: Teardown) -> Vec<Hazard> {
        let mut broken: Vec<(usize, HazardKind, Rel)> = Vec::new();
        for (i, need) in self.ix.needs.iter().enumerate() {
            let rel = self.ix.relation(need.a, need.x);
            let kind = match (teardown, rel) {
                (_, Rel::Outside) => None,
                (Teardown::Background, Rel::Satisfied) => {
                    (!self.ix.held_in_background(need)).then_some(HazardKind::OwnerFirst)
                }
                (_, Rel::Satisfied) | (Teardown::Background, Rel::Conflict) => None,
                (_, Rel::Conflict) => Some(HazardKind::Conflict),
                (Teardown::Background, Rel::Siblings { .. }) => {
                    (!self.ix.held_in_background(need)).then_some(HazardKind::Together)
                }
                (Teardown::Foreground, Rel::Siblings { a, .. }) => {
                    (!self.ix.held_in_foreground(need, a)).then_some(HazardKind::Together)
                }
                (Teardown::Ordered, Rel::Siblings { a, b, .. }) => (!self.ix.ordered(a, b)
                    && !self.ix.held_in_foreground(need, a))
                .then_some(HazardKind::Cycle),
            };
            if let Some(kind) = kind {
                broken.push((i, kind, rel));
            }
        }
        // A broken need that a longer broken need of the same object goes
        // through says less than that one.
        let mut through_broken: HashMap<usize, HashSet<usize>> = HashMap::new();
        for &(i, _, _) in &broken {
            let need = &self.ix.needs[i];
            through_broken
                .entry(need.a)
                .or_default()
                .extend(need.through.iter().copied());
        }
        broken
            .into_iter()
            .filter(|&(i, _, _)| {
                let need = &self.ix.needs[i];
                !through_broken
                    .get(&need.a)
                    .is_some_and(|t| t.contains(&need.x))
            })
            .map(|(i, kind, rel)| self.hazard(teardown, kind, rel, &self.needs[i]))
            .chain(
                (teardown != Teardown::Ordered)
                    .then(|| self.outside_users())
                    .into_iter()
                    .flatten()
                    .map(|need| {
                        self.hazard(teardown, HazardKind::OutsideUser, Rel::Outside, &need)
                    }),
            )
            .collect()
    }

    fn hazard(&self, teardown: Teardown, kind: HazardKind, rel: Rel, need: &Need) -> Hazard {
        let name = |i: usize| self.nodes[i].object.to_string();
        let why = match (kind, rel) {
            (HazardKind::Together, Rel::Siblings { a, b, .. }) => match teardown {
                Teardown::Background => format!(
                    "a Background delete takes {} without waiting for {}",
                    name(b),
                    name(a)
                ),
                _ => format!("{} and {} are deleted at the same time", name(a), name(b)),
            },
            (HazardKind::OwnerFirst, _) => format!(
                "a Background delete takes {} before what it owns",
                need.needs
            ),
            (HazardKind::Conflict, _) => format!(
                "{} is under {}, so the cascade deletes it first",
                need.needs, need.object
            ),
            (HazardKind::OutsideUser, _) => format!(
                "{} is outside the tree: the cascade does not delete it, and takes {} from under it",
                need.object, need.needs
            ),
            (HazardKind::Cycle, Rel::Siblings { parent, .. }) => format!(
                "a cycle of needs among what {} owns leaves them unordered",
                name(parent)
            ),
            _ => "it is not ordered".to_string(),
        };
        Hazard {
            teardown,
            kind,
            need: need.clone(),
            message: format!("{need}: {why}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::sibling::test_objects::*;

    #[test]
    fn the_seed_trees_hazards_by_teardown_and_usage() {
        use SeedUsage::*;
        use Teardown::*;
        let four = vec![
            "prod-cert-manager",
            "prod-ingress",
            "prod-namespace",
            "prod-vllm",
        ];
        let five = vec![
            "prod-cert-manager",
            "prod-ingress",
            "prod-namespace",
            "prod-serving",
            "prod-vllm",
        ];
        let cases = [
            (None, Foreground, four.clone()),
            (ComposedBeside, Foreground, vec![]),
            (OwnedByUser, Foreground, vec![]),
            (ComposedByUser, Foreground, five),
            (None, Background, four.clone()),
            (ComposedBeside, Background, four.clone()),
            (OwnedByUser, Background, four),
            (None, Ordered, vec![]),
            (ComposedBeside, Ordered, vec![]),
            (OwnedByUser, Ordered, vec![]),
        ];
        for (usage, teardown, want) in cases {
            let g = graph_of(&seed(usage));
            let hazards = g.hazards(teardown);
            let mut got: Vec<&str> = hazards
                .iter()
                .map(|h| h.need.object.name.as_str())
                .collect();
            got.sort();
            assert_eq!(got, want, "{usage:?} {teardown:?}: {hazards:#?}");
            assert!(hazards.iter().all(|h| h.teardown == teardown));
        }
        let g = graph_of(&seed(None));
        let sentences: Vec<String> = g
            .hazards(Foreground)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(sentences.contains(&"Release prod-cert-manager needs Cluster prod (through ProviderConfig.helm.crossplane.io prod-helm and Secret crossplane-system/prod-conn): ServingStack prod-serving and EKSCluster prod-eks are deleted at the same time".to_string()), "{sentences:#?}");
        assert!(sentences.contains(&"Object prod-namespace needs Cluster prod (through ProviderConfig.kubernetes.crossplane.io prod-kubeconfig and Secret crossplane-system/prod-conn): ServingStack prod-serving and EKSCluster prod-eks are deleted at the same time".to_string()), "{sentences:#?}");
        let background: Vec<String> = g
            .hazards(Background)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(background.contains(&"Release prod-vllm needs Cluster prod (through ProviderConfig.helm.crossplane.io prod-helm and Secret crossplane-system/prod-conn): a Background delete takes EKSCluster prod-eks without waiting for ServingStack prod-serving".to_string()), "{background:#?}");
    }

    #[test]
    fn objects_outside_the_tree_order_nothing_and_one_needing_it_is_its_outside_user() {
        let root = xr("XNet", None, "net");
        let outside_pc = spec(
            pc("aws.upbound.io/v1beta1", None, "shared"),
            json!({"credentials": {"secretRef": {"name": "creds", "namespace": "crossplane-system"}}}),
        );
        let inside_pc = under(pc("helm.crossplane.io/v1beta1", None, "inside"), &root);
        let objects = vec![
            root.clone(),
            under(
                mr(
                    "VPC",
                    None,
                    "vpc",
                    json!({"providerConfigRef": {"name": "shared"}}),
                ),
                &root,
            ),
            inside_pc,
            outside_pc.clone(),
            secret("crossplane-system", "creds"),
            // An object outside the tree that needs one inside it.
            spec(
                obj("helm.crossplane.io/v1beta1", "Release", None, "elsewhere"),
                json!({"providerConfigRef": {"name": "inside"}}),
            ),
        ];
        let g = graph_of(&objects);
        assert!(g.problems.is_empty(), "{:?}", g.problems);
        assert_eq!(g.edges.len(), 3);
        // The Release outside needs the ProviderConfig inside: the cascade
        // never deletes it, so a Background or Foreground delete takes the
        // ProviderConfig from under it; ordered teardown holds it.
        let users: Vec<String> = g.outside_users().iter().map(ToString::to_string).collect();
        assert_eq!(
            users,
            vec![
                "Release elsewhere needs ProviderConfig.helm.crossplane.io inside (spec.providerConfigRef)"
            ]
        );
        for teardown in Teardown::ALL {
            let kinds: Vec<HazardKind> = g.hazards(teardown).iter().map(|h| h.kind).collect();
            let want = match teardown {
                Teardown::Ordered => vec![],
                _ => vec![HazardKind::OutsideUser],
            };
            assert_eq!(kinds, want, "{teardown:?}");
        }
        assert!(g.sibling_edges.is_empty());
        let node = g.node(&r(&outside_pc)).expect("shown");
        assert!(!node.in_tree && node.wave.is_none() && node.depth.is_none());
        // What the tree needs outside it: the shared ProviderConfig (and the
        // Secret behind it), not the Release that needs the tree.
        let needed: Vec<String> = g
            .needed_outside()
            .iter()
            .map(|n| n.object.to_string())
            .collect();
        assert_eq!(
            needed,
            vec![
                "ProviderConfig.aws.upbound.io shared",
                "Secret crossplane-system/creds"
            ]
        );
        assert_eq!(g.waves.iter().map(Vec::len).sum::<usize>(), 3);
    }
}
