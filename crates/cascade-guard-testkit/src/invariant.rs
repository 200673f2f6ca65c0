//! The teardown invariant, computed from the objects themselves and nowhere
//! else: for every edge "A must be gone before B leaves", read from a
//! snapshot of a tree taken before its delete, A's last removal from the API
//! came before B's first. Independent of cascade-guard's own graph code (its
//! `order` module, `plan`) on purpose: a bug in what cascade-guard infers must
//! not hide itself in the test that checks it.
//!
//! The edges, each read from one object of the snapshot (A → B: A is the
//! needer, gone before B, the needed, leaves):
//!
//! - [`Rule::Owner`]: an ownerReference with `blockOwnerDeletion: true`, the
//!   dependent → its owner (the owner found by UID in the snapshot, else by
//!   the reference, in the dependent's namespace); but a ProviderConfigUsage
//!   → its managed resource: it is the provider's record of that resource's
//!   use, needed by the provider while the resource goes, not the other way,
//!   and sibling order lets it stop blocking a foreground cascade of the
//!   resource (crossplane-runtime deletes the external resource only once
//!   `foregroundDeletion` is gone), so it may outlive the resource a moment.
//! - [`Rule::Usage`]: a Crossplane Usage or ClusterUsage, `spec.by` →
//!   `spec.of` (their `resourceRef`s, in the Usage's namespace unless the
//!   reference names one; a Usage without `by` orders nothing).
//! - [`Rule::ProviderConfig`]: a managed resource's `spec.providerConfigRef`
//!   (and a ProviderConfigUsage's top-level `providerConfigRef`) → that
//!   ProviderConfig: the user's group, kind `ProviderConfig` unless the
//!   reference says otherwise, in the user's namespace (none for a
//!   `ClusterProviderConfig`).
//! - [`Rule::Credentials`]: a ProviderConfig's `spec.credentials.secretRef`
//!   → the Secret (in the ProviderConfig's namespace unless the reference
//!   names one).
//! - [`Rule::ConnectionSecret`]: the need behind the two before it: a
//!   managed resource whose ProviderConfig reads its credentials from a
//!   Secret that an object writes (`spec.writeConnectionSecretToRef`, the
//!   cloud Cluster and its kubeconfig) → that writer. The Secret itself
//!   outlives its writer (nobody deletes it), so "the Secret before its
//!   writer" is no need; what reaches the cluster through it is.
//!
//! An object of the snapshot is followed by its UID ([`uids`], [`fate`]): a
//! provider writes a managed resource's ProviderConfigUsage again while the
//! resource is deleted (the garbage collector takes that one after the
//! resource), and Crossplane can compose a deleted ProviderConfig again
//! while its XR is torn down; those are other objects. Each edge gets a
//! [`Verdict`]: in order, kept because the needed object never left (the
//! kubeconfig Secret, which nobody deletes), broken, or not judged (neither
//! left, or the timeline never saw one end). [`broken`] lists the broken
//! ones, for a run under Off to report.

use std::collections::BTreeMap;
use std::fmt;

use local_cluster::timeline::{Change, Entry};
use serde_json::{Value, json};

/// One object's identity: API group (`""` for the core group), kind,
/// namespace, name. A type of the kit's own, not the policy crate's
/// `ObjectRef`: the invariant shares nothing with what it checks.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectId {
    pub group: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectId {
    pub fn new(group: &str, kind: &str, namespace: Option<&str>, name: &str) -> Self {
        Self {
            group: group.to_string(),
            kind: kind.to_string(),
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
        }
    }

    /// The object's own identity, from its `apiVersion`, `kind` and
    /// `metadata`.
    pub fn of(object: &Value) -> Option<Self> {
        Some(Self {
            group: group_of(object.get("apiVersion")?.as_str()?).to_string(),
            kind: object.get("kind")?.as_str()?.to_string(),
            namespace: str_at(object, "/metadata/namespace").map(str::to_string),
            name: str_at(object, "/metadata/name")?.to_string(),
        })
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind)?;
        if !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        match &self.namespace {
            Some(ns) => write!(f, " {ns}/{}", self.name),
            None => write!(f, " {}", self.name),
        }
    }
}

/// Why an edge exists: which rule of the module's list read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rule {
    Owner,
    Usage,
    ProviderConfig,
    Credentials,
    ConnectionSecret,
}

/// `needer` must be gone before `needed` leaves the API.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Edge {
    pub needer: ObjectId,
    pub needed: ObjectId,
    pub rule: Rule,
    /// What the rule read, in words.
    pub why: String,
}

impl fmt::Display for Edge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} → {} ({})", self.needer, self.needed, self.why)
    }
}

/// `v1` → `""`, `helm.m.crossplane.io/v1beta1` → `helm.m.crossplane.io`.
fn group_of(api_version: &str) -> &str {
    api_version.split_once('/').map_or("", |(g, _)| g)
}

fn str_at<'a>(object: &'a Value, pointer: &str) -> Option<&'a str> {
    object.pointer(pointer)?.as_str()
}

/// The object a Usage's `spec.by` or `spec.of` names.
fn usage_target(target: &Value, usage: &ObjectId) -> Option<ObjectId> {
    Some(ObjectId {
        group: group_of(target.get("apiVersion")?.as_str()?).to_string(),
        kind: target.get("kind")?.as_str()?.to_string(),
        namespace: str_at(target, "/resourceRef/namespace")
            .map(str::to_string)
            .or_else(|| usage.namespace.clone()),
        name: str_at(target, "/resourceRef/name")?.to_string(),
    })
}

/// The ProviderConfig a `providerConfigRef` of `user` names.
fn provider_config(reference: &Value, user: &ObjectId) -> Option<ObjectId> {
    let kind = reference
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("ProviderConfig");
    Some(ObjectId {
        group: user.group.clone(),
        kind: kind.to_string(),
        namespace: if kind.starts_with("Cluster") {
            None
        } else {
            user.namespace.clone()
        },
        name: reference.get("name")?.as_str()?.to_string(),
    })
}

/// A Secret a reference (`name`, maybe `namespace`) of `from` names.
fn secret(reference: &Value, from: &ObjectId) -> Option<ObjectId> {
    Some(ObjectId {
        group: String::new(),
        kind: "Secret".to_string(),
        namespace: reference
            .get("namespace")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| from.namespace.clone()),
        name: reference.get("name")?.as_str()?.to_string(),
    })
}

fn is_provider_config(object: &ObjectId) -> bool {
    object.kind == "ProviderConfig" || object.kind == "ClusterProviderConfig"
}

/// Every edge the snapshot's objects state (the module's rules), sorted, each
/// once. An edge may name an object that is not in the snapshot (an owner
/// outside it); [`judge`] says so ([`Verdict::Unseen`]).
pub fn edges(snapshot: &[Value]) -> Vec<Edge> {
    let objects: Vec<(ObjectId, &Value)> = snapshot
        .iter()
        .filter_map(|o| Some((ObjectId::of(o)?, o)))
        .collect();
    let by_uid: BTreeMap<&str, &ObjectId> = objects
        .iter()
        .filter_map(|(r, o)| Some((str_at(o, "/metadata/uid")?, r)))
        .collect();
    let mut edges = Vec::new();
    let mut add = |needer: &ObjectId, needed: ObjectId, rule: Rule, why: String| {
        edges.push(Edge {
            needer: needer.clone(),
            needed,
            rule,
            why,
        })
    };
    // Secret → what writes it; ProviderConfig → the Secret it reads.
    let mut writers: BTreeMap<ObjectId, ObjectId> = BTreeMap::new();
    let mut credentials: BTreeMap<ObjectId, ObjectId> = BTreeMap::new();
    for (me, o) in &objects {
        if let Some(s) = o
            .pointer("/spec/writeConnectionSecretToRef")
            .and_then(|r| secret(r, me))
        {
            writers.insert(s, me.clone());
        }
        if let Some(s) = o
            .pointer("/spec/credentials/secretRef")
            .filter(|_| is_provider_config(me))
            .and_then(|r| secret(r, me))
        {
            credentials.insert(me.clone(), s);
        }
    }
    for (me, o) in &objects {
        let owners = o
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .filter(|_| me.kind != "ProviderConfigUsage");
        for owner in owners.into_iter().flatten() {
            if owner.get("blockOwnerDeletion") != Some(&json!(true)) {
                continue;
            }
            let found = owner
                .get("uid")
                .and_then(Value::as_str)
                .and_then(|uid| by_uid.get(uid))
                .map(|r| (*r).clone());
            let named = || {
                Some(ObjectId {
                    group: group_of(owner.get("apiVersion")?.as_str()?).to_string(),
                    kind: owner.get("kind")?.as_str()?.to_string(),
                    namespace: me.namespace.clone(),
                    name: owner.get("name")?.as_str()?.to_string(),
                })
            };
            if let Some(owner) = found.or_else(named) {
                add(me, owner, Rule::Owner, "blockOwnerDeletion".to_string());
            }
        }
        if me.group == "protection.crossplane.io"
            || (me.group == "apiextensions.crossplane.io" && me.kind.ends_with("Usage"))
        {
            let target = |side: &str| usage_target(o.pointer(&format!("/spec/{side}"))?, me);
            if let (Some(by), Some(of)) = (target("by"), target("of")) {
                add(&by, of, Rule::Usage, format!("{} {}", me.kind, me.name));
            }
        }
        if let Some(pc) = o
            .get("providerConfigRef")
            .filter(|_| me.kind == "ProviderConfigUsage")
            .and_then(|r| provider_config(r, me))
        {
            add(
                me,
                pc,
                Rule::ProviderConfig,
                "providerConfigRef".to_string(),
            );
        }
        let Some(pc) = o
            .pointer("/spec/providerConfigRef")
            .and_then(|r| provider_config(r, me))
        else {
            continue;
        };
        add(
            me,
            pc.clone(),
            Rule::ProviderConfig,
            "spec.providerConfigRef".to_string(),
        );
        if let Some((s, writer)) = credentials
            .get(&pc)
            .and_then(|s| Some((s, writers.get(s)?)))
        {
            add(
                me,
                writer.clone(),
                Rule::ConnectionSecret,
                format!(
                    "reaches it through {} {} and Secret {} it writes",
                    pc.kind, pc.name, s.name
                ),
            );
        }
    }
    for (pc, s) in credentials {
        add(
            &pc,
            s,
            Rule::Credentials,
            "spec.credentials.secretRef".to_string(),
        );
    }
    edges.sort();
    edges.dedup_by(|a, b| a.needer == b.needer && a.needed == b.needed && a.rule == b.rule);
    edges
}

/// A point in the API server's history: etcd's revision when the watch
/// event carried one, and the timeline's arrival order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    pub revision: Option<u64>,
    pub seq: u64,
}

impl Mark {
    /// Revisions when both have one (ordered across kinds), else arrival.
    pub fn before(self, other: Mark) -> bool {
        match (self.revision, other.revision) {
            (Some(a), Some(b)) => a < b,
            _ => self.seq < other.seq,
        }
    }

    fn show(self) -> String {
        match self.revision {
            Some(r) => format!("rev {r}"),
            None => format!("seq {}", self.seq),
        }
    }
}

/// What became of one object, as a timeline saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fate {
    /// Its first removal from the API, if any.
    pub first_gone: Option<Mark>,
    /// Its last: an object of that name leaves again if it is made again
    /// (only when it is followed by name, not by UID).
    pub last_gone: Option<Mark>,
    /// Whether the last thing seen of it was an object, not its removal.
    pub still_there: bool,
    /// Another object of the same name (another UID) was seen after it
    /// left: a provider makes a managed resource's ProviderConfigUsage
    /// again while the resource is deleted, and the garbage collector takes
    /// that one only after the resource is gone.
    pub made_again: bool,
    /// Its removal was missed by the watch and found by a list
    /// ([`Missed`]): it left after this revision, no later than
    /// `first_gone`'s.
    pub missed_after: Option<u64>,
}

/// A removal the timeline's watch never reported: across an API server
/// restart the watch lists again (its old revision is older than the new
/// server's watch cache), and a list reports no deletes. A list found the
/// object gone: it left after revision `after` (the last the timeline saw
/// of it) and no later than `by` (the list's revision).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Missed {
    pub after: u64,
    pub by: u64,
}

/// The UID of each object of a snapshot, so that [`fate`] follows that
/// object and not a later one of the same name.
pub fn uids(snapshot: &[Value]) -> BTreeMap<ObjectId, String> {
    snapshot
        .iter()
        .filter_map(|o| Some((ObjectId::of(o)?, str_at(o, "/metadata/uid")?.to_string())))
        .collect()
}

/// What `entries` saw of `object` (of that UID, when given: the object the
/// snapshot read); `None` if nothing (not watched, or never there).
pub fn fate(entries: &[Entry], object: &ObjectId, uid: Option<&str>) -> Option<Fate> {
    let named = entries.iter().filter(|e| {
        e.group == object.group
            && e.kind == object.kind
            && e.namespace == object.namespace
            && e.name == object.name
    });
    let mark = |e: &Entry| Mark {
        revision: e.revision,
        seq: e.seq,
    };
    let mut fate: Option<Fate> = None;
    for e in named {
        if uid.is_some_and(|u| u != e.uid) {
            if let Some(f) = fate.as_mut().filter(|f| f.first_gone.is_some()) {
                f.made_again = true;
            }
            continue;
        }
        let f = fate.get_or_insert(Fate {
            first_gone: None,
            last_gone: None,
            still_there: true,
            made_again: false,
            missed_after: None,
        });
        f.still_there = e.change != Change::Gone;
        if e.change == Change::Gone {
            // A removal the watch missed (its re-list found it gone) is
            // known within revisions only; without a list's revision, no
            // later bound at all.
            let m = match e.missed_after {
                Some(after) => {
                    f.missed_after.get_or_insert(after);
                    Mark {
                        revision: Some(e.revision.unwrap_or(u64::MAX)),
                        seq: e.seq,
                    }
                }
                None => mark(e),
            };
            f.first_gone.get_or_insert(m);
            f.last_gone = Some(m);
        }
    }
    fate
}

/// [`fate`], with a removal the watch missed ([`Missed`]) for an object it
/// last saw still there: the watch's own record wins when it has one.
pub fn fate_with(
    entries: &[Entry],
    object: &ObjectId,
    uid: Option<&str>,
    missed: Option<Missed>,
) -> Option<Fate> {
    let mut fate = fate(entries, object, uid)?;
    if let Some(m) = missed.filter(|_| fate.still_there) {
        let mark = Mark {
            revision: Some(m.by),
            seq: u64::MAX,
        };
        fate.first_gone.get_or_insert(mark);
        fate.last_gone = Some(mark);
        fate.still_there = false;
        fate.missed_after = Some(m.after);
    }
    Some(fate)
}

/// The revisions within which an object left: one for a removal the watch
/// saw, a range for one it missed; `None` without a revision.
fn gone_within(mark: Mark, missed_after: Option<u64>) -> Option<(u64, u64)> {
    let by = mark.revision?;
    Some((missed_after.map_or(by, |a| a + 1), by))
}

/// An edge's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Both left, the needer first: checked and kept.
    InOrder { needer: Mark, needed: Mark },
    /// The needer left and the needed never did (the kubeconfig Secret,
    /// which nobody deletes): kept, nothing to compare.
    NeededStayed { needer: Mark },
    /// Neither left: the teardown did not reach them; nothing checked.
    NeitherLeft,
    /// The needed left while the needer was still there: broken.
    Broken { needer: Option<Mark>, needed: Mark },
    /// The timeline never saw one of them: nothing checked.
    Unseen(ObjectId),
    /// Both left, and the watch missed when one of them did ([`Missed`]):
    /// the revisions within which each left overlap, so the order is not
    /// known. Nothing checked.
    Unsure {
        needer: (u64, u64),
        needed: (u64, u64),
    },
}

impl Verdict {
    fn is_broken(&self) -> bool {
        matches!(self, Verdict::Broken { .. })
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::InOrder { needer, needed } => {
                write!(f, "in order: {} < {}", needer.show(), needed.show())
            }
            Verdict::NeededStayed { needer } => {
                write!(
                    f,
                    "kept: needer gone at {}, needed never left",
                    needer.show()
                )
            }
            Verdict::NeitherLeft => write!(f, "neither left"),
            Verdict::Broken {
                needer: Some(a),
                needed,
            } => write!(
                f,
                "BROKEN: needed left at {}, needer only at {}",
                needed.show(),
                a.show()
            ),
            Verdict::Broken {
                needer: None,
                needed,
            } => write!(
                f,
                "BROKEN: needed left at {}, needer still there",
                needed.show()
            ),
            Verdict::Unseen(r) => write!(f, "unseen: the timeline never saw {r}"),
            Verdict::Unsure { needer, needed } => write!(
                f,
                "unsure (a removal the watch missed): needer gone within revs {}..={}, needed within {}..={}",
                needer.0, needer.1, needed.0, needed.1
            ),
        }
    }
}

/// One edge's verdict, from what `fate` says of its two ends.
pub fn judge(edge: &Edge, fate: impl Fn(&ObjectId) -> Option<Fate>) -> Verdict {
    let Some(needer) = fate(&edge.needer) else {
        return Verdict::Unseen(edge.needer.clone());
    };
    let Some(needed) = fate(&edge.needed) else {
        return Verdict::Unseen(edge.needed.clone());
    };
    let left = needer.last_gone.filter(|_| !needer.still_there);
    // A missed removal is known within revisions only: in order when the
    // needer surely left first, broken when the needed surely did.
    if needer.missed_after.is_some() || needed.missed_after.is_some() {
        let within = left.and_then(|a| gone_within(a, needer.missed_after)).zip(
            needed
                .first_gone
                .and_then(|b| gone_within(b, needed.missed_after)),
        );
        if let (Some((a, b)), Some((x, y))) = (left.zip(needed.first_gone), within) {
            return if x.1 < y.0 {
                Verdict::InOrder {
                    needer: a,
                    needed: b,
                }
            } else if y.1 < x.0 {
                Verdict::Broken {
                    needer: Some(a),
                    needed: b,
                }
            } else {
                Verdict::Unsure {
                    needer: x,
                    needed: y,
                }
            };
        }
    }
    match (left, needed.first_gone) {
        (Some(a), Some(b)) if a.before(b) => Verdict::InOrder {
            needer: a,
            needed: b,
        },
        (a, Some(b)) => Verdict::Broken {
            needer: a,
            needed: b,
        },
        (Some(a), None) => Verdict::NeededStayed { needer: a },
        (None, None) => Verdict::NeitherLeft,
    }
}

/// Every edge with its verdict.
fn judge_all(edges: &[Edge], fate: impl Fn(&ObjectId) -> Option<Fate>) -> Vec<(&Edge, Verdict)> {
    edges.iter().map(|e| (e, judge(e, &fate))).collect()
}

/// The broken edges only: what a run under Off would list (and one under
/// Refuse or Convert must not have).
pub fn broken(edges: &[Edge], fate: impl Fn(&ObjectId) -> Option<Fate>) -> Vec<(&Edge, Verdict)> {
    judge_all(edges, fate)
        .into_iter()
        .filter(|(_, v)| v.is_broken())
        .collect()
}

/// Every edge kept and judged (what Refuse and Convert must show): the
/// tally, or what was broken and what could not be judged, listed.
pub fn all_kept(
    edges: &[Edge],
    fate: impl Fn(&ObjectId) -> Option<Fate>,
) -> Result<String, String> {
    let verdicts = judge_all(edges, &fate);
    let broken: Vec<_> = verdicts.iter().filter(|(_, v)| v.is_broken()).collect();
    let unjudged: Vec<_> = verdicts
        .iter()
        .filter(|(_, v)| {
            matches!(
                v,
                Verdict::NeitherLeft | Verdict::Unseen(_) | Verdict::Unsure { .. }
            )
        })
        .collect();
    if broken.is_empty() && unjudged.is_empty() {
        return Ok(tally(&verdicts));
    }
    let list = |v: &[&(&Edge, Verdict)]| {
        v.iter()
            .map(|(e, v)| format!("  {e}: {v}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    Err(format!(
        "of {} edges, {} broken:\n{}\nand {} not judged:\n{}",
        edges.len(),
        broken.len(),
        list(&broken),
        unjudged.len(),
        list(&unjudged)
    ))
}

/// How many verdicts of each sort, e.g. `in order 24, kept 2`.
/// Every edge judged as things stand (Off: what a teardown without
/// cascade-guard did): each broken one with its verdict, and the tally.
pub fn measure(edges: &[Edge], fate: impl Fn(&ObjectId) -> Option<Fate>) -> (Vec<String>, String) {
    let verdicts = judge_all(edges, fate);
    let broken = verdicts
        .iter()
        .filter(|(_, v)| v.is_broken())
        .map(|(e, v)| format!("{e}: {v}"))
        .collect();
    (broken, tally(&verdicts))
}

pub fn tally(verdicts: &[(&Edge, Verdict)]) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, v) in verdicts {
        let sort = match v {
            Verdict::InOrder { .. } => "in order",
            Verdict::NeededStayed { .. } => "kept (needed stayed)",
            Verdict::NeitherLeft => "neither left",
            Verdict::Broken { .. } => "BROKEN",
            Verdict::Unseen(_) => "unseen",
            Verdict::Unsure { .. } => "unsure (a removal the watch missed)",
        };
        *counts.entry(sort).or_default() += 1;
    }
    counts
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The rules and the checker on a small InferenceCluster-shaped snapshot.
/// A unit test of the testkit: it touches nothing but memory.
#[test]
fn invariant_edges_and_verdicts_table() {
    let ns = Some("mp");
    let meta = |name: &str, uid: &str, owner: Option<(&str, &str, &str, &str, bool)>| {
        let mut m = json!({"name": name, "namespace": "mp", "uid": uid});
        if let Some((api_version, kind, name, uid, block)) = owner {
            m["ownerReferences"] = json!([{"apiVersion": api_version, "kind": kind,
                "name": name, "uid": uid, "controller": true, "blockOwnerDeletion": block}]);
        }
        m
    };
    let ic = json!({"apiVersion": "x.io/v1", "kind": "Top",
        "metadata": {"name": "t", "uid": "u-top"}});
    let top = Some(("x.io/v1", "Top", "t", "u-top", true));
    let eks = json!({"apiVersion": "x.io/v1", "kind": "EKS", "metadata": meta("t", "u-eks", top)});
    let stack =
        json!({"apiVersion": "x.io/v1", "kind": "Stack", "metadata": meta("s", "u-stack", top)});
    let by_eks = Some(("x.io/v1", "EKS", "t", "u-eks", true));
    let cluster = json!({"apiVersion": "cloud.io/v1", "kind": "Cluster",
        "metadata": meta("t", "u-cluster", by_eks),
        "spec": {"writeConnectionSecretToRef": {"name": "t-kubeconfig"}}});
    let pc = |group: &str| {
        json!({"apiVersion": format!("{group}/v1"), "kind": "ProviderConfig",
            "metadata": meta("t-kubeconfig", &format!("u-pc-{group}"), by_eks),
            "spec": {"credentials": {"source": "Secret",
                "secretRef": {"name": "t-kubeconfig", "namespace": "mp", "key": "kubeconfig"}}}})
    };
    let by_stack = Some(("x.io/v1", "Stack", "s", "u-stack", true));
    let release = json!({"apiVersion": "helm.io/v1", "kind": "Release",
        "metadata": meta("s-chart", "u-release", by_stack),
        "spec": {"providerConfigRef": {"kind": "ProviderConfig", "name": "t-kubeconfig"}}});
    // No kind: ProviderConfig; and one on a ClusterProviderConfig.
    let object = json!({"apiVersion": "k8s.io/v1", "kind": "Object",
        "metadata": meta("s-gateway", "u-object", Some(("x.io/v1", "Stack", "s", "u-stack", false))),
        "spec": {"providerConfigRef": {"name": "t-kubeconfig"}}});
    let clustered = json!({"apiVersion": "k8s.io/v1", "kind": "Object",
        "metadata": meta("other", "u-other", None),
        "spec": {"providerConfigRef": {"kind": "ClusterProviderConfig", "name": "shared"}}});
    let pcu = json!({"apiVersion": "helm.io/v1", "kind": "ProviderConfigUsage",
        "metadata": meta("u-release", "u-pcu", Some(("helm.io/v1", "Release", "s-chart", "u-release", true))),
        "providerConfigRef": {"kind": "ProviderConfig", "name": "t-kubeconfig"},
        "resourceRef": {"apiVersion": "helm.io/v1", "kind": "Release", "name": "s-chart"}});
    let usage = json!({"apiVersion": "protection.crossplane.io/v1beta1", "kind": "Usage",
        "metadata": meta("t-usage", "u-usage", top),
        "spec": {"of": {"apiVersion": "x.io/v1", "kind": "EKS", "resourceRef": {"name": "t"}},
                 "by": {"apiVersion": "x.io/v1", "kind": "Stack", "resourceRef": {"name": "s"}}}});
    // A Usage without a user orders nothing.
    let reason = json!({"apiVersion": "protection.crossplane.io/v1beta1", "kind": "Usage",
        "metadata": meta("t-reason", "u-reason", None),
        "spec": {"of": {"apiVersion": "x.io/v1", "kind": "EKS", "resourceRef": {"name": "t"}},
                 "reason": "production"}});
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "t-kubeconfig", "namespace": "mp", "uid": "u-secret"}});
    let snapshot = [
        ic,
        eks,
        stack,
        cluster,
        pc("helm.io"),
        pc("k8s.io"),
        release,
        object,
        clustered,
        pcu,
        usage,
        reason,
        secret,
    ];
    let o = |group: &str, kind: &str, name: &str| ObjectId::new(group, kind, ns, name);
    let top = ObjectId::new("x.io", "Top", None, "t");
    let (eks, stack) = (o("x.io", "EKS", "t"), o("x.io", "Stack", "s"));
    let cluster = o("cloud.io", "Cluster", "t");
    let (helm_pc, k8s_pc) = (
        o("helm.io", "ProviderConfig", "t-kubeconfig"),
        o("k8s.io", "ProviderConfig", "t-kubeconfig"),
    );
    let (release, object) = (
        o("helm.io", "Release", "s-chart"),
        o("k8s.io", "Object", "s-gateway"),
    );
    let secret = o("", "Secret", "t-kubeconfig");
    let got: Vec<(ObjectId, ObjectId, Rule)> = edges(&snapshot)
        .into_iter()
        .map(|e| (e.needer, e.needed, e.rule))
        .collect();
    let mut want = vec![
        (eks.clone(), top.clone(), Rule::Owner),
        (stack.clone(), top.clone(), Rule::Owner),
        (
            o("protection.crossplane.io", "Usage", "t-usage"),
            top.clone(),
            Rule::Owner,
        ),
        (cluster.clone(), eks.clone(), Rule::Owner),
        (helm_pc.clone(), eks.clone(), Rule::Owner),
        (k8s_pc.clone(), eks.clone(), Rule::Owner),
        // The Object's ownerReference does not block: no edge. Nor does the
        // ProviderConfigUsage's to its Release count: the provider needs
        // the usage, not the other way.
        (release.clone(), stack.clone(), Rule::Owner),
        (stack.clone(), eks.clone(), Rule::Usage),
        (release.clone(), helm_pc.clone(), Rule::ProviderConfig),
        (object.clone(), k8s_pc.clone(), Rule::ProviderConfig),
        (
            o("k8s.io", "Object", "other"),
            ObjectId::new("k8s.io", "ClusterProviderConfig", None, "shared"),
            Rule::ProviderConfig,
        ),
        (
            o("helm.io", "ProviderConfigUsage", "u-release"),
            helm_pc.clone(),
            Rule::ProviderConfig,
        ),
        (helm_pc.clone(), secret.clone(), Rule::Credentials),
        (k8s_pc.clone(), secret.clone(), Rule::Credentials),
        (release.clone(), cluster.clone(), Rule::ConnectionSecret),
        (object.clone(), cluster.clone(), Rule::ConnectionSecret),
    ];
    let mut got_sorted = got.clone();
    got_sorted.sort();
    want.sort();
    assert_eq!(got_sorted, want);

    let uids = uids(&snapshot);
    assert_eq!(uids.get(&release).map(String::as_str), Some("u-release"));
    assert_eq!(uids.len(), snapshot.len());

    // Verdicts, from timeline entries: the Release leaves before the
    // Cluster (by revision, though it arrived later), the Object after it,
    // the Secret never; the ProviderConfigUsage u-pcu leaves, and another
    // of its name (u-pcu-2) is made and leaves after the Release (followed
    // by name, the last removal counts); the Stack is never seen.
    let entry = |seq: u64, group: &str, kind: &str, name: &str, gone: bool, revision: u64| Entry {
        seq,
        at: std::time::Instant::now(),
        group: group.to_string(),
        kind: kind.to_string(),
        namespace: Some("mp".to_string()),
        name: name.to_string(),
        uid: match seq {
            6 | 10 => "u-pcu-2",
            4 | 5 => "u-pcu",
            _ => "",
        }
        .to_string(),
        change: if gone {
            Change::Gone
        } else {
            Change::Seen {
                terminating: false,
                finalizers: Vec::new(),
            }
        },
        revision: Some(revision),
        missed_after: None,
    };
    let entries = vec![
        entry(0, "cloud.io", "Cluster", "t", false, 1),
        entry(1, "helm.io", "Release", "s-chart", false, 2),
        entry(2, "k8s.io", "Object", "s-gateway", false, 3),
        entry(3, "", "Secret", "t-kubeconfig", false, 4),
        entry(4, "helm.io", "ProviderConfigUsage", "u-release", false, 5),
        entry(5, "helm.io", "ProviderConfigUsage", "u-release", true, 6),
        entry(6, "helm.io", "ProviderConfigUsage", "u-release", false, 7),
        entry(7, "cloud.io", "Cluster", "t", true, 11),
        entry(8, "helm.io", "Release", "s-chart", true, 10),
        entry(9, "helm.io", "ProviderConfig", "t-kubeconfig", false, 8),
        entry(10, "helm.io", "ProviderConfigUsage", "u-release", true, 12),
        entry(11, "helm.io", "ProviderConfig", "t-kubeconfig", true, 13),
    ];
    let fate_of = |r: &ObjectId| fate(&entries, r, None);
    let edge = |needer: &ObjectId, needed: &ObjectId| Edge {
        needer: needer.clone(),
        needed: needed.clone(),
        rule: Rule::Owner,
        why: String::new(),
    };
    let mark = |seq, revision| Mark {
        revision: Some(revision),
        seq,
    };
    let pcu = o("helm.io", "ProviderConfigUsage", "u-release");
    assert_eq!(
        judge(&edge(&release, &cluster), fate_of),
        Verdict::InOrder {
            needer: mark(8, 10),
            needed: mark(7, 11)
        }
    );
    assert_eq!(
        judge(&edge(&object, &cluster), fate_of),
        Verdict::Broken {
            needer: None,
            needed: mark(7, 11)
        }
    );
    assert_eq!(
        judge(&edge(&pcu, &release), fate_of),
        Verdict::Broken {
            needer: Some(mark(10, 12)),
            needed: mark(8, 10)
        }
    );
    assert_eq!(
        judge(&edge(&pcu, &helm_pc), fate_of),
        Verdict::InOrder {
            needer: mark(10, 12),
            needed: mark(11, 13)
        }
    );
    // Followed by UID, the snapshot's ProviderConfigUsage left first.
    let by_uid = |r: &ObjectId| fate(&entries, r, (r == &pcu).then_some("u-pcu"));
    assert_eq!(
        judge(&edge(&pcu, &release), by_uid),
        Verdict::InOrder {
            needer: mark(5, 6),
            needed: mark(8, 10)
        }
    );
    assert!(by_uid(&pcu).is_some_and(|f| f.made_again));
    assert!(fate_of(&pcu).is_some_and(|f| !f.made_again));
    assert_eq!(
        judge(&edge(&release, &secret), fate_of),
        Verdict::NeededStayed {
            needer: mark(8, 10)
        }
    );
    assert_eq!(
        judge(&edge(&object, &secret), fate_of),
        Verdict::NeitherLeft
    );
    assert_eq!(
        judge(&edge(&stack, &eks), fate_of),
        Verdict::Unseen(stack.clone())
    );
    // The kubernetes ProviderConfig of the same name is another object.
    assert_eq!(fate(&entries, &k8s_pc, None), None);
    // Arrival order only when a revision is missing.
    let (a, b) = (
        Mark {
            revision: None,
            seq: 1,
        },
        Mark {
            revision: Some(0),
            seq: 2,
        },
    );
    assert!(a.before(b) && !b.before(a));
    // A removal the watch missed (it listed again across an API server
    // restart): the Object, last seen at rev 3, found gone by a list at rev
    // 9, surely before the Cluster (rev 11); found only at rev 12, unsure;
    // and surely after the Release (rev 10) had it been seen at rev 10.
    let (entries_ref, object_ref) = (&entries, &object);
    let missed = |after, by| {
        move |r: &ObjectId| {
            fate_with(
                entries_ref,
                r,
                None,
                (r == object_ref).then_some(Missed { after, by }),
            )
        }
    };
    let found = Mark {
        revision: Some(9),
        seq: u64::MAX,
    };
    assert_eq!(
        judge(&edge(&object, &cluster), missed(3, 9)),
        Verdict::InOrder {
            needer: found,
            needed: mark(7, 11)
        }
    );
    assert_eq!(
        judge(&edge(&object, &cluster), missed(3, 12)),
        Verdict::Unsure {
            needer: (4, 12),
            needed: (11, 11)
        }
    );
    assert!(judge(&edge(&object, &release), missed(10, 12)).is_broken());
    // The watch's own record wins over a list's.
    assert_eq!(
        fate_with(&entries, &release, None, Some(Missed { after: 2, by: 20 })),
        fate_of(&release)
    );
    // The same found by the timeline's own re-list (an entry marked
    // missed): a range as above; without a list's revision, no upper bound.
    let relisted = |by: Option<u64>| {
        let mut more = entries.clone();
        more.push(Entry {
            seq: 12,
            change: Change::Gone,
            revision: by,
            missed_after: Some(3),
            ..entries[2].clone()
        });
        more
    };
    let (at_9, unknown) = (relisted(Some(9)), relisted(None));
    assert!(matches!(
        judge(&edge(&object, &cluster), |r: &ObjectId| fate(
            &at_9, r, None
        )),
        Verdict::InOrder { .. }
    ));
    assert!(matches!(
        judge(&edge(&object, &cluster), |r: &ObjectId| fate(
            &unknown, r, None
        )),
        Verdict::Unsure { .. }
    ));
    let all = [edge(&release, &cluster), edge(&object, &cluster)];
    let broken = broken(&all, fate_of);
    assert_eq!(broken.len(), 1);
    assert_eq!(broken[0].0.needer, object);
}
