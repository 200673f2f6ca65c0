//! Reading the objects into a [`Graph`]: who each object is, its owners, the
//! tree under the root, and then every step of [`Builder::finish`].

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use super::edge::{Edge, Provenance};
use super::graph::{Graph, Node, ReadProblem, ReadProblemReason, RootNotFound};
use super::index::Index;
use super::lifting::find_cycles;
use super::needs_annotation::COMPOSITION_RESOURCE_NAME_ANNOTATION;
use super::object::{ObjectRef, str_at};

/// The garbage collector's own finalizers, which say nothing of what an
/// object's controller still has to do.
const GC_FINALIZERS: [&str; 2] = [FOREGROUND_FINALIZER, "orphan"];

/// The finalizer of a foreground cascade.
const FOREGROUND_FINALIZER: &str = "foregroundDeletion";

#[derive(Clone, Copy, Debug)]
pub(super) struct RawEdge {
    pub(super) object: usize,
    pub(super) needs: usize,
    pub(super) provenance: Provenance,
    pub(super) declared_by: usize,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct OwnerLink {
    pub(super) owner: usize,
    pub(super) controller: bool,
    pub(super) blocking: bool,
}

pub(super) struct Builder<'a> {
    pub(super) values: Vec<&'a Value>,
    pub(super) refs: Vec<ObjectRef>,
    pub(super) root: usize,
    /// Kind, namespace and name, any group.
    pub(super) by_kind_name: HashMap<(String, Option<String>, String), Vec<usize>>,
    /// Owner and composition resource name.
    pub(super) by_resource_name: HashMap<(usize, String), Vec<usize>>,
    pub(super) links: Vec<Vec<OwnerLink>>,
    /// Controller owner, else first owner, among the objects.
    pub(super) owner_parent: Vec<Option<usize>>,
    pub(super) ix: Index,
    pub(super) euler: Vec<usize>,
    pub(super) edges: Vec<RawEdge>,
    pub(super) problems: Vec<ReadProblem>,
}

impl<'a> Builder<'a> {
    pub(super) fn read(objects: &'a [Value], root_uid: &str) -> Result<Self, RootNotFound> {
        let mut problems = Vec::new();
        let mut parsed: Vec<(ObjectRef, &Value)> = Vec::new();
        let mut seen = HashSet::new();
        for (i, value) in objects.iter().enumerate() {
            match ObjectRef::of_object(value) {
                None => problems.push(ReadProblem {
                    object: None,
                    reason: ReadProblemReason::Unidentified,
                    message: format!(
                        "object {i} has no apiVersion, kind or metadata.name: left out"
                    ),
                }),
                Some(r) if !seen.insert(r.clone()) => problems.push(ReadProblem {
                    object: Some(r),
                    reason: ReadProblemReason::Duplicate,
                    message: "given more than once: the first is used".to_string(),
                }),
                Some(r) => parsed.push((r, value)),
            }
        }
        parsed.sort_by(|a, b| a.0.cmp(&b.0));
        let (refs, values): (Vec<ObjectRef>, Vec<&Value>) = parsed.into_iter().unzip();
        let n = refs.len();

        let mut by_uid: HashMap<&str, usize> = HashMap::new();
        for (i, v) in values.iter().enumerate() {
            if let Some(uid) = str_at(v, "/metadata/uid") {
                by_uid.entry(uid).or_insert(i);
            }
        }
        let root = *by_uid.get(root_uid).ok_or_else(|| RootNotFound {
            uid: root_uid.to_string(),
        })?;

        let mut links = vec![Vec::new(); n];
        for (i, v) in values.iter().enumerate() {
            let owner_refs = v
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array);
            for o in owner_refs.into_iter().flatten() {
                let Some(&owner) = o
                    .get("uid")
                    .and_then(Value::as_str)
                    .and_then(|u| by_uid.get(u))
                else {
                    continue;
                };
                if owner != i {
                    links[i].push(OwnerLink {
                        owner,
                        controller: o.get("controller").and_then(Value::as_bool) == Some(true),
                        blocking: o.get("blockOwnerDeletion").and_then(Value::as_bool)
                            == Some(true),
                    });
                }
            }
        }
        let owner_parent: Vec<Option<usize>> = links
            .iter()
            .map(|l: &Vec<OwnerLink>| {
                l.iter()
                    .find(|o| o.controller)
                    .or(l.first())
                    .map(|o| o.owner)
            })
            .collect();

        let mut by_kind_name: HashMap<_, Vec<usize>> = HashMap::new();
        let mut by_resource_name: HashMap<_, Vec<usize>> = HashMap::new();
        for (i, r) in refs.iter().enumerate() {
            by_kind_name
                .entry((r.kind.clone(), r.namespace.clone(), r.name.clone()))
                .or_default()
                .push(i);
            let resource_name = values[i]
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(COMPOSITION_RESOURCE_NAME_ANNOTATION))
                .and_then(Value::as_str);
            if let (Some(owner), Some(name)) = (owner_parent[i], resource_name) {
                by_resource_name
                    .entry((owner, name.to_string()))
                    .or_default()
                    .push(i);
            }
        }

        let ix = Index {
            by_ref: refs.iter().cloned().zip(0..).collect(),
            in_tree: vec![false; n],
            parent: vec![None; n],
            depth: vec![0; n],
            tin: vec![0; n],
            tout: vec![0; n],
            ..Index::default()
        };
        let mut builder = Self {
            values,
            refs,
            root,
            by_kind_name,
            by_resource_name,
            links,
            owner_parent,
            ix,
            euler: Vec::new(),
            edges: Vec::new(),
            problems,
        };
        builder.walk_tree();
        Ok(builder)
    }

    /// Depth-first from the root over the owner parents.
    pub(super) fn walk_tree(&mut self) {
        let n = self.refs.len();
        let mut children = vec![Vec::new(); n];
        for (i, p) in self.owner_parent.iter().enumerate() {
            if let Some(p) = p {
                children[*p].push(i);
            }
        }
        let ix = &mut self.ix;
        ix.in_tree[self.root] = true;
        self.euler.push(self.root);
        let mut stack = vec![(self.root, 0usize)];
        while let Some(top) = stack.last_mut() {
            let (node, next) = *top;
            match children[node].get(next) {
                Some(&child) => {
                    top.1 += 1;
                    if ix.in_tree[child] {
                        continue;
                    }
                    ix.in_tree[child] = true;
                    ix.parent[child] = Some(node);
                    ix.depth[child] = ix.depth[node] + 1;
                    ix.tin[child] = self.euler.len();
                    self.euler.push(child);
                    stack.push((child, 0));
                }
                None => {
                    ix.tout[node] = self.euler.len();
                    stack.pop();
                }
            }
        }
    }

    pub(super) fn problem(&mut self, i: usize, reason: ReadProblemReason, message: String) {
        self.problems.push(ReadProblem {
            object: Some(self.refs[i].clone()),
            reason,
            message,
        });
    }

    pub(super) fn edge(
        &mut self,
        object: usize,
        needs: usize,
        provenance: Provenance,
        declared_by: usize,
    ) {
        if object != needs {
            self.edges.push(RawEdge {
                object,
                needs,
                provenance,
                declared_by,
            });
        }
    }

    pub(super) fn exact(
        &self,
        group: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<usize> {
        self.ix
            .by_ref
            .get(&ObjectRef::new(group, kind, namespace, name))
            .copied()
    }

    /// In `namespace` if given; else in `default`, then cluster-scoped.
    pub(super) fn find(
        &self,
        (group, kind, name): (&str, &str, &str),
        namespace: Option<&str>,
        default: Option<&str>,
    ) -> Option<usize> {
        match namespace {
            Some(ns) => self.exact(group, kind, Some(ns), name),
            None => default
                .and_then(|ns| self.exact(group, kind, Some(ns), name))
                .or_else(|| self.exact(group, kind, None, name)),
        }
    }

    /// Reads the edges, and from them the needs, the sibling edges, their
    /// cycles and the waves: the graph.
    pub(super) fn finish(mut self) -> Graph {
        self.infer_edges();
        let edges: Vec<Edge> = self.edges.iter().map(|e| self.public_edge(e)).collect();
        let (needs, outside_needs) = self.needs();
        let (lifted, conflicts) = self.lift(&needs, &edges);
        let cycles = find_cycles(&lifted);
        let (sibling_edges, public_cycles) = self.sibling_edges(&lifted, &cycles);
        self.order_siblings(&lifted, &cycles);
        let wave = self.waves(&lifted, &cycles.pairs);
        let cycle_of = self.cycle_of(&cycles.members);
        let nodes = self.nodes(&wave, &cycle_of);
        let public_needs = needs.iter().map(|n| self.public_need(n, &edges)).collect();
        let outside_needs = outside_needs
            .iter()
            .map(|n| self.public_need(n, &edges))
            .collect();
        self.ix.needs = needs;
        Graph {
            root: self.refs[self.root].clone(),
            nodes,
            edges,
            needs: public_needs,
            outside_needs,
            sibling_edges,
            waves: self.wave_lists(&wave),
            cycles: public_cycles,
            conflicts,
            problems: self.problems,
            ix: self.ix,
        }
    }

    fn public_edge(&self, e: &RawEdge) -> Edge {
        let refs = &self.refs;
        Edge {
            object: refs[e.object].clone(),
            needs: refs[e.needs].clone(),
            provenance: e.provenance,
            declared_by: refs[e.declared_by].clone(),
        }
    }

    /// Every object given, as the graph shows it.
    fn nodes(&self, wave: &[Option<usize>], cycle_of: &[Option<usize>]) -> Vec<Node> {
        let refs = &self.refs;
        (0..refs.len())
            .map(|i| Node {
                object: refs[i].clone(),
                uid: str_at(self.values[i], "/metadata/uid").map(str::to_string),
                in_tree: self.ix.in_tree[i],
                parent: self.ix.parent[i].map(|p| refs[p].clone()),
                depth: self.ix.in_tree[i].then_some(self.ix.depth[i]),
                wave: wave[i],
                cycle: cycle_of[i],
                deleting: self.values[i]
                    .pointer("/metadata/deletionTimestamp")
                    .is_some_and(|t| !t.is_null()),
                finalizing: self.values[i]
                    .pointer("/metadata/finalizers")
                    .and_then(Value::as_array)
                    .is_some_and(|f| {
                        f.iter()
                            .filter_map(Value::as_str)
                            .any(|f| !GC_FINALIZERS.contains(&f))
                    }),
                waiting_for_dependents: self.values[i]
                    .pointer("/metadata/finalizers")
                    .and_then(Value::as_array)
                    .is_some_and(|f| f.iter().any(|f| f == FOREGROUND_FINALIZER)),
            })
            .collect()
    }
}
