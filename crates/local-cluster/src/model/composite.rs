//! Composite resources (XRs) and the trees Crossplane composes from them.
//!
//! - Crossplane's composite reconciler adds the finalizer
//!   `composite.apiextensions.crossplane.io` to every XR, and when an XR has a
//!   deletionTimestamp it removes that finalizer on its first reconcile and
//!   stops: it deletes no composed resource itself, the cascade is the garbage
//!   collector's (internal/controller/apiextensions/composite/reconciler.go,
//!   ~line 629). [`run_finalizer`] does exactly that, from a watch.
//! - Composed resources carry a controller owner reference to their XR with
//!   `blockOwnerDeletion: true` (crossplane-runtime pkg/meta `AsController`),
//!   the annotation `crossplane.io/composition-resource-name` and the label
//!   `crossplane.io/composite` with the root XR's name (an XR carries its own
//!   name, a nested XR its root's). A v2 XR lists them in
//!   `spec.crossplane.resourceRefs` (apiVersion, kind, name, and namespace when
//!   the XR is cluster-scoped). [`Node`] builds such trees; Crossplane writes
//!   the same objects, in a different order (XR, then composed resources, then
//!   the XR's references), which deletion does not depend on.
//!
//! Not modelled: a live XR re-creating a composed resource someone deleted, and
//! everything else composition does.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ApiResource, DynamicObject, ObjectMeta, PartialObjectMeta, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use super::{ModelError, ResourceRef, add_finalizer, remove_finalizer};

pub const FINALIZER: &str = "composite.apiextensions.crossplane.io";
pub const COMPOSITE_LABEL: &str = "crossplane.io/composite";
pub const RESOURCE_NAME_ANNOTATION: &str = "crossplane.io/composition-resource-name";

/// Holds each XR of `resource` with Crossplane's finalizer while it lives and
/// lets go of it as soon as it is deleted. Runs until aborted.
pub async fn run_finalizer(client: Client, resource: ApiResource) {
    let watch: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(client.clone(), &resource);
    let mut stream = watcher::watcher(watch, watcher::Config::default()).boxed();
    while let Some(event) = stream.next().await {
        let meta = match event {
            Ok(Event::Apply(o)) | Ok(Event::InitApply(o)) => o.metadata,
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!("watch {}: {e}", resource.plural);
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                continue;
            }
        };
        let has = meta
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|x| x == FINALIZER));
        let deleting = meta.deletion_timestamp.is_some();
        // Live and held, or deleted and let go: nothing to do.
        if has != deleting {
            continue;
        }
        let name = meta.name.clone().unwrap_or_default();
        let api: Api<DynamicObject> = match &meta.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        let done = if deleting {
            remove_finalizer(&api, &name, FINALIZER).await
        } else {
            add_finalizer(&api, &name, FINALIZER).await
        };
        if let Err(e) = done {
            tracing::debug!("{} {name}: {e}", resource.kind);
        }
    }
}

/// One object of a composed tree, and what it composes.
#[derive(Clone, Debug)]
pub struct Node {
    pub resource: ApiResource,
    /// None for cluster-scoped kinds.
    pub namespace: Option<String>,
    pub name: String,
    /// Everything but metadata: `spec`, and so on.
    pub body: Value,
    pub labels: BTreeMap<String, String>,
    pub finalizers: Vec<String>,
    /// An XR: it gets Crossplane's finalizer and lists its children in
    /// `spec.crossplane.resourceRefs`.
    pub composite: bool,
    /// The composition's key for this resource among its XR's composed
    /// resources (the annotation `crossplane.io/composition-resource-name`);
    /// default: its kind, lower-cased.
    pub key: Option<String>,
    pub children: Vec<Node>,
}

/// An object the tree created.
#[derive(Clone, Debug)]
pub struct Created {
    pub resource: ApiResource,
    pub namespace: Option<String>,
    pub name: String,
    pub uid: String,
}

impl Node {
    pub fn new(resource: ApiResource, namespace: Option<&str>, name: &str, body: Value) -> Self {
        Self {
            resource,
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
            body,
            labels: BTreeMap::new(),
            finalizers: Vec::new(),
            composite: false,
            key: None,
            children: Vec::new(),
        }
    }

    /// An XR with its spec.
    pub fn xr(resource: ApiResource, namespace: Option<&str>, name: &str, spec: Value) -> Self {
        let mut node = Self::new(resource, namespace, name, json!({ "spec": spec }));
        node.composite = true;
        // Crossplane's reconciler adds its finalizer before it composes
        // anything, so an XR with composed resources always carries it.
        node.finalizers.push(FINALIZER.to_string());
        node
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_string(), value.to_string());
        self
    }

    pub fn key(mut self, key: &str) -> Self {
        self.key = Some(key.to_string());
        self
    }

    pub fn compose(mut self, child: Node) -> Self {
        self.children.push(child);
        self
    }

    pub fn reference(&self) -> ResourceRef {
        ResourceRef::new(&self.resource, self.namespace.as_deref(), &self.name)
    }

    /// This node and every node below it, parents first.
    pub fn walk(&self) -> Vec<&Node> {
        let mut out = vec![self];
        for c in &self.children {
            out.extend(c.walk());
        }
        out
    }

    /// How deep the tree is (a leaf is 1).
    pub fn depth(&self) -> usize {
        1 + self.children.iter().map(Node::depth).max().unwrap_or(0)
    }

    /// Creates the tree: this node as a root XR, then what it composes, each
    /// with a controller reference to its parent.
    pub async fn create(&self, client: &Client) -> Result<Vec<Created>, ModelError> {
        let mut created = Vec::new();
        let root = self.name.clone();
        let mut stack: Vec<(&Node, Option<OwnerReference>)> = vec![(self, None)];
        while let Some((node, owner)) = stack.pop() {
            let made = node.create_one(client, &root, owner).await?;
            let owner = OwnerReference {
                api_version: node.resource.api_version.clone(),
                kind: node.resource.kind.clone(),
                name: node.name.clone(),
                uid: made.uid.clone(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            };
            created.push(made);
            for child in node.children.iter().rev() {
                stack.push((child, Some(owner.clone())));
            }
        }
        Ok(created)
    }

    /// Creates only this node, as a resource composed by `owner` in the tree
    /// whose root XR is `root`.
    pub async fn create_composed(
        &self,
        client: &Client,
        root: &str,
        owner: OwnerReference,
    ) -> Result<Created, ModelError> {
        self.create_one(client, root, Some(owner)).await
    }

    async fn create_one(
        &self,
        client: &Client,
        root: &str,
        owner: Option<OwnerReference>,
    ) -> Result<Created, ModelError> {
        let mut labels = self.labels.clone();
        labels.insert(COMPOSITE_LABEL.to_string(), root.to_string());
        let mut object = DynamicObject::new(&self.name, &self.resource);
        object.data = self.body.clone();
        object.metadata = ObjectMeta {
            name: Some(self.name.clone()),
            namespace: self.namespace.clone(),
            labels: Some(labels),
            finalizers: (!self.finalizers.is_empty()).then(|| self.finalizers.clone()),
            annotations: owner.as_ref().map(|_| {
                BTreeMap::from([(RESOURCE_NAME_ANNOTATION.to_string(), self.resource_name())])
            }),
            owner_references: owner.map(|o| vec![o]),
            ..ObjectMeta::default()
        };
        if self.composite {
            let cluster_scoped = self.namespace.is_none();
            let refs: Vec<Value> = self
                .children
                .iter()
                .map(|c| {
                    let mut r = json!({"apiVersion": c.resource.api_version,
                        "kind": c.resource.kind, "name": c.name});
                    if let (true, Some(ns)) = (cluster_scoped, &c.namespace) {
                        r["namespace"] = json!(ns);
                    }
                    r
                })
                .collect();
            let spec = object
                .data
                .as_object_mut()
                .ok_or_else(|| ModelError::Invalid(format!("{} has no body", self.name)))?
                .entry("spec")
                .or_insert_with(|| json!({}));
            spec["crossplane"]["resourceRefs"] = json!(refs);
        }
        let api: Api<DynamicObject> = match &self.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &self.resource),
            None => Api::all_with(client.clone(), &self.resource),
        };
        let made = api.create(&PostParams::default(), &object).await?;
        Ok(Created {
            resource: self.resource.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            uid: made.uid().unwrap_or_default(),
        })
    }

    fn resource_name(&self) -> String {
        self.key
            .clone()
            .unwrap_or_else(|| self.resource.kind.to_lowercase())
    }
}
