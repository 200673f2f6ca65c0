//! Objects and trees for the tests of sibling order.

use serde_json::{Value, json};

use super::graph::{Graph, graph};
use super::object::{ObjectRef, str_at};

/// An object whose uid is its identity, so that owners can name it.
pub(super) fn obj(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> Value {
    let uid = format!("{kind}/{}/{name}", namespace.unwrap_or(""));
    let mut metadata = json!({"name": name, "uid": uid});
    if let Some(ns) = namespace {
        metadata["namespace"] = json!(ns);
    }
    json!({"apiVersion": api_version, "kind": kind, "metadata": metadata})
}

pub(super) fn uid(v: &Value) -> &str {
    str_at(v, "/metadata/uid").expect("uid")
}

pub(super) fn owner_ref(owner: &Value, controller: bool, block: bool) -> Value {
    json!({
        "apiVersion": owner["apiVersion"], "kind": owner["kind"],
        "name": owner["metadata"]["name"], "uid": uid(owner),
        "controller": controller, "blockOwnerDeletion": block,
    })
}

/// Composed by `owner` (its controller).
pub(super) fn under(mut v: Value, owner: &Value) -> Value {
    let refs = &mut v["metadata"]["ownerReferences"];
    if refs.is_null() {
        *refs = json!([]);
    }
    if let Some(list) = refs.as_array_mut() {
        list.push(owner_ref(owner, true, true));
    }
    v
}

/// Also owned by `owner`, not as its controller.
pub(super) fn also_owned(mut v: Value, owner: &Value, block: bool) -> Value {
    let refs = &mut v["metadata"]["ownerReferences"];
    if refs.is_null() {
        *refs = json!([]);
    }
    if let Some(list) = refs.as_array_mut() {
        list.push(owner_ref(owner, false, block));
    }
    v
}

pub(super) fn spec(mut v: Value, spec: Value) -> Value {
    v["spec"] = spec;
    v
}

pub(super) fn annotate(mut v: Value, key: &str, value: &str) -> Value {
    v["metadata"]["annotations"][key] = json!(value);
    v
}

pub(super) fn r(v: &Value) -> ObjectRef {
    ObjectRef::of_object(v).expect("identity")
}

pub(super) fn xr(kind: &str, namespace: Option<&str>, name: &str) -> Value {
    obj("example.org/v1", kind, namespace, name)
}

pub(super) fn pc(api_version: &str, namespace: Option<&str>, name: &str) -> Value {
    obj(api_version, "ProviderConfig", namespace, name)
}

pub(super) fn mr(kind: &str, namespace: Option<&str>, name: &str, spec_: Value) -> Value {
    spec(obj("aws.upbound.io/v1beta1", kind, namespace, name), spec_)
}

pub(super) fn secret(namespace: &str, name: &str) -> Value {
    obj("v1", "Secret", Some(namespace), name)
}

/// The first object is the root.
pub(super) fn graph_of(objects: &[Value]) -> Graph {
    graph(objects, uid(&objects[0])).expect("root")
}

/// Who composes the Usage of EKSCluster by ServingStack, if there is one.
#[derive(Clone, Copy, Debug)]
pub(super) enum SeedUsage {
    None,
    /// Composed by InferenceCluster, the common parent.
    ComposedBeside,
    /// Composed by InferenceCluster, and also owned (not controlled) by
    /// ServingStack, as Crossplane's Usage controller makes it: still
    /// held, as the seed's tree is on real Crossplane.
    OwnedByUser,
    /// Composed by ServingStack itself.
    ComposedByUser,
}

/// The seed report's tree: InferenceCluster prod composes EKSCluster
/// prod-eks (a Cluster writing Secret prod-conn, and ProviderConfigs
/// prod-helm and prod-kubeconfig reading it) and ServingStack
/// prod-serving (three Releases on prod-helm, an Object on
/// prod-kubeconfig).
pub(super) fn seed(usage: SeedUsage) -> Vec<Value> {
    let ic = obj("modelplane.ai/v1alpha1", "InferenceCluster", None, "prod");
    let eks = under(
        obj(
            "infrastructure.modelplane.ai/v1alpha1",
            "EKSCluster",
            None,
            "prod-eks",
        ),
        &ic,
    );
    let serving = under(
        obj(
            "serving.modelplane.ai/v1alpha1",
            "ServingStack",
            None,
            "prod-serving",
        ),
        &ic,
    );
    let cluster = under(
        spec(
            obj("eks.aws.upbound.io/v1beta1", "Cluster", None, "prod"),
            json!({"writeConnectionSecretToRef": {"name": "prod-conn", "namespace": "crossplane-system"}}),
        ),
        &eks,
    );
    let conn = under(secret("crossplane-system", "prod-conn"), &cluster);
    let credentials = json!({"credentials": {"source": "Secret",
        "secretRef": {"name": "prod-conn", "namespace": "crossplane-system", "key": "kubeconfig"}}});
    let helm = under(
        spec(
            pc("helm.crossplane.io/v1beta1", None, "prod-helm"),
            credentials.clone(),
        ),
        &eks,
    );
    let kube = under(
        spec(
            pc("kubernetes.crossplane.io/v1alpha1", None, "prod-kubeconfig"),
            credentials,
        ),
        &eks,
    );
    let release = |name: &str| {
        under(
            spec(
                obj("helm.crossplane.io/v1beta1", "Release", None, name),
                json!({"providerConfigRef": {"name": "prod-helm"}}),
            ),
            &serving,
        )
    };
    let object = under(
        spec(
            obj(
                "kubernetes.crossplane.io/v1alpha2",
                "Object",
                None,
                "prod-namespace",
            ),
            json!({"providerConfigRef": {"name": "prod-kubeconfig"}}),
        ),
        &serving,
    );
    let mut objects = vec![
        ic.clone(),
        eks,
        serving.clone(),
        cluster,
        conn,
        helm,
        kube,
        release("prod-cert-manager"),
        release("prod-ingress"),
        release("prod-vllm"),
        object,
    ];
    let the_usage = spec(
        obj(
            "apiextensions.crossplane.io/v1beta1",
            "Usage",
            None,
            "prod-serving-uses-eks",
        ),
        json!({
            "of": {"apiVersion": "infrastructure.modelplane.ai/v1alpha1", "kind": "EKSCluster",
                   "resourceRef": {"name": "prod-eks"}},
            "by": {"apiVersion": "serving.modelplane.ai/v1alpha1", "kind": "ServingStack",
                   "resourceRef": {"name": "prod-serving"}},
        }),
    );
    match usage {
        SeedUsage::None => {}
        SeedUsage::ComposedBeside => objects.push(under(the_usage, &ic)),
        SeedUsage::OwnedByUser => objects.push(also_owned(under(the_usage, &ic), &serving, false)),
        SeedUsage::ComposedByUser => objects.push(under(the_usage, &serving)),
    }
    objects
}

pub(super) fn names(objects: &[ObjectRef]) -> Vec<String> {
    objects.iter().map(ToString::to_string).collect()
}
