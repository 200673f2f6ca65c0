//! Reading a live tree as `plan` and the sibling-order loop need it: the
//! root and what it composes, recursively (Crossplane's `resourceRefs`),
//! what those objects reference ([`references`]: ProviderConfigs,
//! credentials and connection Secrets, Object references, the
//! `cascade-guard.dev/needs` annotation), the Usages that name any of
//! them and the other side of each, the ProviderConfigs outside the tree
//! made on a Secret in it, and the managed resources anywhere that use
//! the tree's ProviderConfigs or those (their ProviderConfigUsages). What
//! cannot be read is said, never guessed.

mod by_kind;
mod fetch;
mod outside_configs;

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

use futures::StreamExt;
use kube::api::{DynamicObject, ListParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::cluster::kinds::{Served, ServedKinds};
use crate::policy::composed_resources;
use crate::policy::sibling::object::ObjectRef;
use crate::policy::sibling::references::{Reference, references};
use fetch::{Fetched, Fetcher, Request};

/// A tree larger than this is cut, and the reader says so: a composition
/// does not reach it, a loop in resourceRefs would.
const MAX_OBJECTS: usize = 5_000;
/// How many ProviderConfigs' usages are listed at once.
const LISTS_AT_ONCE: usize = 16;
/// How many times references are followed from what was found the time
/// before (a Release's ProviderConfig, then its credentials Secret, then
/// that Secret's writer is three).
const REFERENCE_ROUNDS: usize = 4;

/// The objects read, as stored, and what could not be read.
pub struct TreeRead {
    pub objects: Vec<Value>,
    pub unread: Vec<String>,
    /// ProviderConfig kinds the reader may not list (403): a ProviderConfig
    /// of such a kind made outside the tree on one of its Secrets, and what
    /// uses it, are not seen. `plan` counts these as not read; the controller
    /// logs them once (the chart grants list on the groups of
    /// `composedResources`).
    pub unlisted: Vec<String>,
}

/// What every tree read of a look (or of `plan`) needs of the whole
/// cluster, listed once for any number of trees: Crossplane's Usages and
/// ClusterUsages (of both API groups), and every ProviderConfig and
/// ClusterProviderConfig. Listed per tree, a look at many trees listed each
/// of them once for each.
pub struct Listed {
    usages: Vec<(String, ListedKind)>,
    configs: ListedConfigs,
}

/// Every ProviderConfig kind as listed: kept by the controller for a few
/// looks (see [`Listed::list_with`]).
pub type ListedConfigs = std::sync::Arc<[(String, ListedKind)]>;

/// One kind's objects as listed, or why they could not be.
pub(crate) type ListedKind = Result<Vec<DynamicObject>, kube::Error>;

impl Listed {
    /// The Usage kinds served: Usage and ClusterUsage of either API group.
    pub fn usage_kinds(kinds: &ServedKinds) -> Vec<Served> {
        ["protection.crossplane.io", "apiextensions.crossplane.io"]
            .into_iter()
            .flat_map(|g| {
                ["Usage", "ClusterUsage"]
                    .into_iter()
                    .flat_map(move |k| kinds.of_kind(Some(g), k).cloned())
            })
            .collect()
    }

    /// Every provider's ProviderConfigUsage kind served: sibling order
    /// watches them, so that a new user of a tree's ProviderConfig makes
    /// that tree due ([`PROVIDER_CONFIG_LABEL`] names the ProviderConfig).
    pub fn config_usage_kinds(kinds: &ServedKinds) -> Vec<Served> {
        kinds.of_kind(None, USAGE_KIND).cloned().collect()
    }

    /// Every provider's ProviderConfig and ClusterProviderConfig kind served.
    fn config_kinds(kinds: &ServedKinds) -> Vec<Served> {
        ["ProviderConfig", "ClusterProviderConfig"]
            .into_iter()
            .flat_map(|k| kinds.of_kind(None, k).cloned())
            .collect()
    }

    /// Lists each kind, all at once.
    pub async fn list(client: &Client, kinds: &ServedKinds) -> Self {
        Self::list_with(client, kinds, None).await
    }

    /// Lists the Usages, and the ProviderConfigs unless `configs` are
    /// given (listed a moment before).
    pub async fn list_with(
        client: &Client,
        kinds: &ServedKinds,
        configs: Option<ListedConfigs>,
    ) -> Self {
        let list_all = |served: Vec<Served>| {
            futures::future::join_all(served.into_iter().map(|s| async move {
                let list = ServedKinds::api(client, &s, None)
                    .list(&ListParams::default())
                    .await
                    .map(|l| l.items);
                (s.0.kind.clone(), list)
            }))
        };
        let listed_configs = async {
            match configs {
                Some(configs) => configs,
                None => list_all(Self::config_kinds(kinds)).await.into(),
            }
        };
        let (usages, configs) = futures::join!(list_all(Self::usage_kinds(kinds)), listed_configs);
        Self { usages, configs }
    }

    /// The ProviderConfigs as listed, to be given to a later
    /// [`list_with`](Self::list_with).
    pub fn configs(&self) -> ListedConfigs {
        self.configs.clone()
    }
}

/// Reads the tree under `root`, what it references, the Usages naming it
/// and the ProviderConfigs on its Secrets (from `listed`, listed before),
/// and the Usages in `held` (sibling order
/// holds them for this root: one whose user is gone names nothing read any
/// more, and must be let go).
pub async fn read_tree(
    client: &Client,
    kinds: &ServedKinds,
    root: &DynamicObject,
    listed: &Listed,
    held: &BTreeSet<ObjectRef>,
) -> TreeRead {
    let mut reading = Reading::new(client, kinds);
    reading.tree(root);
    reading.expand().await;
    let composed = reading.objects.len();
    let configs = reading.configs_among(0..composed);
    reading.provider_config_users(configs).await;
    for _ in 0..REFERENCE_ROUNDS {
        if !reading.follow_references().await {
            break;
        }
    }
    // ProviderConfigs outside the tree made on a Secret read (one a person
    // made by hand on a cluster's kubeconfig, or another tree's), and the
    // managed resources that use them: they need what writes that Secret.
    let before = reading.objects.len();
    reading.configs_on_secrets_read(&listed.configs);
    let outside = reading.configs_among(before..reading.objects.len());
    if !outside.is_empty() {
        reading.provider_config_users(outside).await;
        reading.follow_references().await;
    }
    reading.usages(held, &listed.usages);
    // The sides of those Usages that are not read yet: the object a
    // standalone Usage of another tree protects.
    reading.follow_references().await;
    TreeRead {
        objects: reading.objects.into_iter().map(|(_, v)| v).collect(),
        unread: reading.unread,
        unlisted: reading.unlisted,
    }
}

/// An object as it is fetched: apiVersion, kind, namespace, name.
type Key = (String, String, Option<String>, String);

/// The objects read so far, each once, and the queue of those whose
/// composed resources are still to be read.
struct Reading<'a> {
    client: &'a Client,
    kinds: &'a ServedKinds,
    fetcher: Fetcher<'a>,
    objects: Vec<(Key, Value)>,
    seen: HashSet<Key>,
    /// Group, kind, namespace and name of every object read: a reference
    /// names no version.
    refs: HashSet<ObjectRef>,
    queue: VecDeque<Key>,
    /// The object that composes each queued one: what an object that may
    /// not be read hangs from.
    composers: HashMap<Key, Value>,
    /// Objects whose references were followed.
    followed: usize,
    unread: Vec<String>,
    unlisted: Vec<String>,
    /// The tree reached [`MAX_OBJECTS`]: nothing more is taken.
    full: bool,
}

impl<'a> Reading<'a> {
    fn new(client: &'a Client, kinds: &'a ServedKinds) -> Self {
        Self {
            client,
            kinds,
            fetcher: Fetcher::new(client),
            objects: Vec::new(),
            seen: HashSet::new(),
            refs: HashSet::new(),
            queue: VecDeque::new(),
            composers: HashMap::new(),
            followed: 0,
            unread: Vec::new(),
            unlisted: Vec::new(),
            full: false,
        }
    }

    /// Takes in an object read, and queues what it composes.
    fn tree(&mut self, object: &DynamicObject) {
        let Some(key) = key_of(object) else { return };
        if !self.take(key.clone(), object) {
            return;
        }
        let composer = json!({
            "apiVersion": key.0, "kind": key.1, "name": key.3,
            "uid": object.metadata.uid.clone().unwrap_or_default(),
            "controller": true, "blockOwnerDeletion": true,
        });
        for c in composed_resources(&object.data, key.2.as_deref()).resources {
            let child = (c.api_version, c.kind, c.namespace, c.name);
            if !self.seen.contains(&child) {
                self.composers.insert(child.clone(), composer.clone());
                self.queue.push_back(child);
            }
        }
    }

    /// Records an object; false if it was already there or the plan is full.
    fn take(&mut self, key: Key, object: &DynamicObject) -> bool {
        if self.full || self.seen.contains(&key) {
            return false;
        }
        if self.objects.len() >= MAX_OBJECTS {
            self.unread.push(format!(
                "more than {MAX_OBJECTS} objects: the rest of the tree was not read"
            ));
            self.full = true;
            self.queue.clear();
            return false;
        }
        let value = serde_value(object);
        if let Some(r) = ObjectRef::of_object(&value) {
            self.refs.insert(r);
        }
        self.seen.insert(key.clone());
        self.objects.push((key, value));
        true
    }

    /// Reads every queued composed resource, and what they compose.
    async fn expand(&mut self) {
        while !self.queue.is_empty() {
            // A wave at a time, by kind (`fetch`), taken in the order
            // queued, as one at a time would: the same objects, and the same
            // cut at MAX_OBJECTS.
            let mut wave: Vec<Key> = Vec::new();
            let mut in_wave = HashSet::new();
            for key in self.queue.drain(..) {
                if !self.seen.contains(&key) && in_wave.insert(key.clone()) {
                    wave.push(key);
                }
            }
            let kinds = self.kinds;
            let served: Vec<Option<&Served>> = wave.iter().map(|k| kinds.get(&k.0, &k.1)).collect();
            let requests: Vec<Request> = wave
                .iter()
                .zip(&served)
                .filter_map(|((_, _, namespace, name), served)| {
                    served.map(|served| Request {
                        served,
                        namespace: namespace.clone(),
                        name: name.clone(),
                    })
                })
                .collect();
            let mut fetched = self.fetcher.fetch(&requests).await.into_iter();
            for (key, served) in wave.into_iter().zip(served) {
                let got = served.and_then(|_| fetched.next());
                self.take_fetched(key, got);
            }
        }
    }

    /// Takes in one composed resource as fetched (None: its kind is not
    /// served).
    fn take_fetched(&mut self, key: Key, fetched: Option<Fetched>) {
        let (api_version, kind, _, name) = &key;
        match fetched {
            None => self
                .unread
                .push(format!("{kind} {name}: {api_version} {kind} is not served")),
            Some(Ok(Some(object))) => self.tree(&object),
            Some(Ok(None)) => {}
            Some(Err(e)) if is_forbidden(&e) && is_leaf(api_version, kind) => {
                let owner = self.composers.get(&key).cloned();
                self.stub(key, owner);
            }
            Some(Err(e)) => self.unread.push(format!("{kind} {name}: {e}")),
        }
    }

    /// Reads what the objects read since the last round reference; true if
    /// anything new was found.
    async fn follow_references(&mut self) -> bool {
        let from = self.followed;
        self.followed = self.objects.len();
        let wanted: BTreeSet<Reference> = self.objects[from..]
            .iter()
            .flat_map(|(_, v)| references(v))
            .collect();
        // Every served kind a reference may name, not read yet.
        let kinds = self.kinds;
        let mut gets = Vec::new();
        for r in &wanted {
            for s in kinds.of_kind(r.group.as_deref(), &r.kind) {
                let namespace = if s.1 { r.namespace.clone() } else { None };
                let known = ObjectRef::new(&s.0.group, &r.kind, namespace.as_deref(), &r.name);
                if !self.refs.contains(&known) {
                    gets.push((r.clone(), s, namespace));
                }
            }
        }
        let requests: Vec<Request> = gets
            .iter()
            .map(|(r, served, namespace)| Request {
                served,
                namespace: namespace.clone(),
                name: r.name.clone(),
            })
            .collect();
        let fetched = self.fetcher.fetch(&requests).await;
        let mut found = false;
        for ((r, s, namespace), got) in gets.into_iter().zip(fetched) {
            match got {
                Ok(Some(object)) => {
                    if let Some(key) = key_of(&object) {
                        found |= self.take(key, &object);
                    }
                }
                Ok(None) => {}
                Err(e) if is_forbidden(&e) && is_leaf(&s.0.api_version, &s.0.kind) => {
                    let key = (s.0.api_version.clone(), s.0.kind.clone(), namespace, r.name);
                    found |= self.stub(key, None);
                }
                // A reader without access to it still gets a plan;
                // the graph reports the reference unresolved.
                Err(e) => self.unread.push(format!("{} {}: {e}", r.kind, r.name)),
            }
        }
        found
    }

    /// The ProviderConfigs and ClusterProviderConfigs among the objects
    /// read at `at`.
    fn configs_among(&self, at: std::ops::Range<usize>) -> Vec<ObjectRef> {
        self.objects[at]
            .iter()
            .filter_map(|(_, v)| ObjectRef::of_object(v))
            .filter(|r| matches!(r.kind.as_str(), "ProviderConfig" | "ClusterProviderConfig"))
            .collect()
    }

    /// Takes in every ProviderConfig listed (`configs`) whose credentials
    /// are a Secret read ([`outside_configs`]).
    fn configs_on_secrets_read(&mut self, configs: &[(String, ListedKind)]) {
        let found = outside_configs::on_secrets(configs, &self.refs);
        self.unread.extend(found.unread);
        self.unlisted.extend(found.unlisted);
        for config in found.configs {
            if let Some(key) = key_of(config) {
                self.take(key, config);
            }
        }
    }

    /// The managed resources that use one of `configs` (ProviderConfigs or
    /// ClusterProviderConfigs read), wherever they are: a provider records each use in a
    /// ProviderConfigUsage of its group, labelled with the ProviderConfig's
    /// name and naming the managed resource. One outside the tree (another
    /// tree's Release installing onto this tree's cluster) needs what the
    /// ProviderConfig leads to, and the graph holds that until it is gone.
    async fn provider_config_users(&mut self, configs: Vec<ObjectRef>) {
        // Each config's usages listed, LISTS_AT_ONCE at once; then what they
        // name, fetched together, taken in the order one config after
        // another would have taken them.
        let (client, kinds) = (self.client, self.kinds);
        let lists: Vec<_> = futures::stream::iter(configs.into_iter().map(|config| async move {
            let listed = usages_of(client, kinds, &config).await;
            (config, listed)
        }))
        .buffered(LISTS_AT_ONCE)
        .collect()
        .await;
        let mut steps = Vec::new();
        for (config, listed) in lists {
            match listed {
                None => {}
                Some(Err(e)) => {
                    steps.push(Err(format!("the ProviderConfigUsages of {config}: {e}")))
                }
                Some(Ok(usages)) => steps.extend(
                    usages
                        .iter()
                        .filter_map(|u| self.user_of(&config, u))
                        .filter(|user| !self.refs.contains(&user.known))
                        .map(Ok),
                ),
            }
        }
        let requests: Vec<Request> = steps
            .iter()
            .flatten()
            .map(|user| Request {
                served: user.served,
                namespace: user.namespace.clone(),
                name: user.name.clone(),
            })
            .collect();
        let mut fetched = self.fetcher.fetch(&requests).await.into_iter();
        for step in steps {
            let user = match step {
                Err(unread) => {
                    self.unread.push(unread);
                    continue;
                }
                Ok(user) => user,
            };
            let Some(got) = fetched.next() else { break };
            // Taken by an earlier usage naming it too.
            if self.refs.contains(&user.known) {
                continue;
            }
            match got {
                Ok(Some(object)) => {
                    if let Some(key) = key_of(&object) {
                        self.take(key, &object);
                    }
                }
                Ok(None) => {}
                Err(e) => self
                    .unread
                    .push(format!("{} {}: {e}", user.served.0.kind, user.name)),
            }
        }
    }

    /// The managed resource a ProviderConfigUsage of `config` names, where
    /// its kind is served; None for a usage of another kind of config.
    fn user_of(&self, config: &ObjectRef, usage: &DynamicObject) -> Option<ConfigUser<'a>> {
        let value = serde_value(usage);
        let kind_named = value
            .pointer("/providerConfigRef/kind")
            .and_then(Value::as_str)
            .unwrap_or("ProviderConfig");
        let text = |p: &str| value.pointer(p).and_then(Value::as_str);
        let (Some(api_version), Some(kind), Some(name)) = (
            text("/resourceRef/apiVersion"),
            text("/resourceRef/kind"),
            text("/resourceRef/name"),
        ) else {
            return None;
        };
        if kind_named != config.kind {
            return None;
        }
        let served = self.kinds.get(api_version, kind)?;
        let namespace = usage.namespace().filter(|_| served.1);
        Some(ConfigUser {
            served,
            known: ObjectRef::new(&served.0.group, kind, namespace.as_deref(), name),
            namespace,
            name: name.to_string(),
        })
    }

    /// An object of a kind that references nothing (a Secret, a ConfigMap)
    /// that the reader may not get: taken by its name alone, hanging from the
    /// object that composes it (if any). Sibling order holds it by name, so
    /// its content is never needed; true if it is new.
    fn stub(&mut self, key: Key, composer: Option<Value>) -> bool {
        let (api_version, kind, namespace, name) = &key;
        let mut metadata = json!({
            "name": name,
            "uid": format!("unread:{kind}/{}/{name}", namespace.as_deref().unwrap_or("")),
            "annotations": {UNREAD_ANNOTATION: "forbidden: known by name only"},
        });
        if let Some(ns) = namespace {
            metadata["namespace"] = json!(ns);
        }
        if let Some(owner) = composer {
            metadata["ownerReferences"] = json!([owner]);
        }
        let value = json!({"apiVersion": api_version, "kind": kind, "metadata": metadata});
        match serde_json::from_value::<DynamicObject>(value) {
            Ok(object) => self.take(key, &object),
            Err(_) => false,
        }
    }

    /// Crossplane's Usages and ClusterUsages that name an object read, and
    /// those sibling order holds for this root (`held`: one whose user is
    /// gone names nothing read any more, and must be let go).
    fn usages(&mut self, held: &BTreeSet<ObjectRef>, usages: &[(String, ListedKind)]) {
        let names: HashSet<(String, String)> = self
            .refs
            .iter()
            .map(|r| (r.kind.clone(), r.name.clone()))
            .collect();
        for (kind, list) in usages {
            let list = match list {
                Ok(list) => list,
                Err(e) => {
                    self.unread.push(format!("{kind}s: {e}"));
                    continue;
                }
            };
            for usage in list {
                let value = serde_value(usage);
                let names_one = ["/spec/of", "/spec/by"].iter().any(|side| {
                    let kind = value
                        .pointer(&format!("{side}/kind"))
                        .and_then(Value::as_str);
                    let name = value
                        .pointer(&format!("{side}/resourceRef/name"))
                        .and_then(Value::as_str);
                    kind.zip(name)
                        .is_some_and(|(k, n)| names.contains(&(k.to_string(), n.to_string())))
                });
                let held_here = ObjectRef::of_object(&value).is_some_and(|r| held.contains(&r));
                if (names_one || held_here)
                    && let Some(key) = key_of(usage)
                {
                    self.take(key, usage);
                }
            }
        }
    }
}

/// A managed resource that a ProviderConfigUsage names: its kind, where it
/// is, and how the reading knows it.
struct ConfigUser<'k> {
    served: &'k Served,
    namespace: Option<String>,
    name: String,
    known: ObjectRef,
}

/// The ProviderConfigUsages of `config` (by its label), in its namespace
/// for a ProviderConfig, anywhere for a ClusterProviderConfig; None where
/// its group serves no ProviderConfigUsage.
async fn usages_of(
    client: &Client,
    kinds: &ServedKinds,
    config: &ObjectRef,
) -> Option<Result<Vec<DynamicObject>, kube::Error>> {
    let served = kinds
        .of_kind(Some(config.group.as_str()), USAGE_KIND)
        .next()?;
    let namespace = match (served.1, config.kind.as_str()) {
        (true, "ProviderConfig") => config.namespace.as_deref(),
        _ => None,
    };
    let selector = format!("{PROVIDER_CONFIG_LABEL}={}", config.name);
    Some(
        ServedKinds::api(client, served, namespace)
            .list(&ListParams::default().labels(&selector))
            .await
            .map(|list| list.items),
    )
}

/// A provider's record of a managed resource's use of a ProviderConfig.
pub const USAGE_KIND: &str = "ProviderConfigUsage";
/// The label on it naming the ProviderConfig (crossplane-runtime's).
pub const PROVIDER_CONFIG_LABEL: &str = "crossplane.io/provider-config";

/// On an object the reader took by name alone: what it could not read.
pub const UNREAD_ANNOTATION: &str = "cascade-guard.dev/unread";

pub(crate) fn is_forbidden(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 403)
}

/// Kinds whose objects reference nothing the graph follows: one that may
/// not be read loses no edge.
fn is_leaf(api_version: &str, kind: &str) -> bool {
    api_version == "v1" && matches!(kind, "Secret" | "ConfigMap")
}

fn key_of(object: &DynamicObject) -> Option<Key> {
    let types = object.types.as_ref()?;
    Some((
        types.api_version.clone(),
        types.kind.clone(),
        object.namespace(),
        object.metadata.name.clone()?,
    ))
}

/// The object as stored: apiVersion, kind, metadata and the rest.
pub(crate) fn serde_value(object: &DynamicObject) -> Value {
    serde_json::to_value(object).unwrap_or(Value::Null)
}
