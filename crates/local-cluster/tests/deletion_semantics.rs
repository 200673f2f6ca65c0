//! Characterization tests: what the real API server, admission and garbage
//! collector do with deletes. cascade-guard's design rests on each of these
//! facts (docs/deletion-semantics.md §1-§3); if an upgrade of the
//! pinned Kubernetes release changes one, a test here fails first.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, PropagationPolicy,
};
use kube::{Api, Client};
use local_cluster::testing::{self, Scope};
use local_cluster::timeline::Timeline;
use local_cluster::{ControlPlane, Options, audit, wait};
use serde_json::json;

const GROUP: &str = "examples.local-cluster.dev";
/// A finalizer no controller handles: the test removes it to let an object go.
const HOLD: &str = "examples.local-cluster.dev/hold";
const FOREGROUND: &str = "foregroundDeletion";

fn crd(kind: &str, plural: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{GROUP}")},
        "spec": {
            "group": GROUP,
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                }}}
            }]
        }
    }))
    .expect("valid CRD")
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: "v1".into(),
        api_version: format!("{GROUP}/v1"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn owners() -> ApiResource {
    resource("Owner", "owners")
}

fn dependents() -> ApiResource {
    resource("Dependent", "dependents")
}

fn options() -> Options {
    Options {
        crds: vec![crd("Owner", "owners"), crd("Dependent", "dependents")],
        ..Options::default()
    }
}

async fn control_plane() -> &'static ControlPlane {
    testing::shared(options).await
}

struct Tree {
    owners: Api<DynamicObject>,
    dependents: Api<DynamicObject>,
    timeline: Timeline,
}

impl Tree {
    async fn new(s: &Scope<'_>) -> Self {
        let timeline = Timeline::start(
            &s.client,
            &[
                (owners(), Some(s.namespace.clone())),
                (dependents(), Some(s.namespace.clone())),
            ],
        )
        .await;
        Self {
            owners: Api::namespaced_with(s.client.clone(), &s.namespace, &owners()),
            dependents: Api::namespaced_with(s.client.clone(), &s.namespace, &dependents()),
            timeline,
        }
    }

    async fn owner(&self, name: &str, finalizers: &[&str]) -> DynamicObject {
        let mut o = DynamicObject::new(name, &owners()).data(json!({"spec": {}}));
        o.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
        self.owners
            .create(&PostParams::default(), &o)
            .await
            .expect("create owner")
    }

    /// A dependent with a controller reference to `owner` that blocks the
    /// owner's foreground deletion, as Crossplane sets on composed resources.
    async fn dependent(&self, name: &str, owner: &DynamicObject, finalizers: &[&str]) {
        let mut d = DynamicObject::new(name, &dependents()).data(json!({"spec": {}}));
        d.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
        d.metadata.owner_references = Some(vec![OwnerReference {
            api_version: owners().api_version,
            kind: "Owner".into(),
            name: owner.metadata.name.clone().expect("owner name"),
            uid: owner.metadata.uid.clone().expect("owner uid"),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        self.dependents
            .create(&PostParams::default(), &d)
            .await
            .expect("create dependent");
    }

    async fn release(&self, api: &Api<DynamicObject>, name: &str) {
        let current = api.get(name).await.expect("get before release");
        let rest: Vec<String> = current
            .metadata
            .finalizers
            .unwrap_or_default()
            .into_iter()
            .filter(|f| f != HOLD)
            .collect();
        api.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": rest}})),
        )
        .await
        .expect("remove hold finalizer");
    }

    async fn finalizers(&self, name: &str) -> Vec<String> {
        self.owners
            .get(name)
            .await
            .expect("owner exists")
            .metadata
            .finalizers
            .unwrap_or_default()
    }

    async fn wait_terminating(&self, kind: &str, name: &str) {
        let found = wait::until(Duration::from_secs(30), || async {
            self.timeline.terminating(kind, name)
        })
        .await;
        assert!(
            found.is_some(),
            "{kind}/{name} was never deleted; timeline:\n{}",
            self.timeline.describe()
        );
    }

    async fn wait_gone(&self, kind: &str, name: &str) -> u64 {
        match self
            .timeline
            .wait_gone(kind, name, Duration::from_secs(30))
            .await
        {
            Some(e) => e.seq,
            None => panic!(
                "{kind}/{name} never left the API; timeline:\n{}",
                self.timeline.describe()
            ),
        }
    }
}

fn delete_with(policy: Option<PropagationPolicy>) -> DeleteParams {
    DeleteParams {
        propagation_policy: policy,
        ..DeleteParams::default()
    }
}

#[tokio::test]
async fn validating_admission_policy_refuses_deletes_that_are_not_foreground() {
    let cp = control_plane().await;
    let s = Scope::new(cp, "vap-refuses").await;
    let tree = Tree::new(&s).await;
    let name = format!("require-foreground-{}", s.namespace);
    install_policy(
        &s.client,
        &name,
        "owners",
        json!([{
            "expression": "has(request.options.propagationPolicy) && request.options.propagationPolicy == 'Foreground'",
            "messageExpression": "'delete ' + oldObject.metadata.name + ' with --cascade=foreground'",
            "reason": "Forbidden"
        }]),
        json!([]),
        &s.namespace,
    )
    .await;
    tree.owner("probe", &[]).await;
    wait_for_refusal(&tree.owners, "probe").await;

    for (policy, label) in [
        (None, "none"),
        (Some(PropagationPolicy::Background), "background"),
        (Some(PropagationPolicy::Orphan), "orphan"),
    ] {
        let obj = format!("refused-{label}");
        tree.owner(&obj, &[]).await;
        match tree.owners.delete(&obj, &delete_with(policy)).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 403, "{label}: {status:?}");
                assert!(
                    status
                        .message
                        .contains(&format!("delete {obj} with --cascade=foreground")),
                    "{label}: message {:?}",
                    status.message
                );
            }
            other => panic!("{label}: expected a refusal, got {other:?}"),
        }
        assert!(
            tree.owners.get_opt(&obj).await.expect("get").is_some(),
            "{label}: refused, yet the object is gone"
        );
    }

    tree.owner("allowed", &[]).await;
    tree.owners
        .delete("allowed", &delete_with(Some(PropagationPolicy::Foreground)))
        .await
        .expect("a Foreground delete is allowed");
    tree.wait_gone("Owner", "allowed").await;
    remove_policy(&s.client, &name).await;
}

#[tokio::test]
async fn foreground_deletion_keeps_the_owner_until_every_blocking_dependent_is_gone() {
    let cp = control_plane().await;
    let s = Scope::new(cp, "foreground").await;
    let tree = Tree::new(&s).await;
    let owner = tree.owner("tree", &[]).await;
    tree.dependent("leaf-a", &owner, &[HOLD]).await;
    tree.dependent("leaf-b", &owner, &[HOLD]).await;

    tree.owners
        .delete("tree", &delete_with(Some(PropagationPolicy::Foreground)))
        .await
        .expect("foreground delete");
    // The garbage collector deletes the dependents (they stay, held)...
    tree.wait_terminating("Dependent", "leaf-a").await;
    tree.wait_terminating("Dependent", "leaf-b").await;
    // ...and the owner waits for them, marked foregroundDeletion.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        tree.finalizers("tree")
            .await
            .contains(&FOREGROUND.to_string())
    );

    tree.release(&tree.dependents, "leaf-a").await;
    let a = tree.wait_gone("Dependent", "leaf-a").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        tree.owners.get_opt("tree").await.expect("get").is_some(),
        "the owner left while leaf-b still blocked it"
    );
    tree.release(&tree.dependents, "leaf-b").await;
    let b = tree.wait_gone("Dependent", "leaf-b").await;
    let o = tree.wait_gone("Owner", "tree").await;
    assert!(
        o > a && o > b,
        "the owner left before its dependents:\n{}",
        tree.timeline.describe()
    );
}

#[tokio::test]
async fn background_deletion_removes_the_owner_at_once_and_the_dependents_afterwards() {
    let cp = control_plane().await;
    let s = Scope::new(cp, "background").await;
    let tree = Tree::new(&s).await;
    let owner = tree.owner("tree", &[]).await;
    tree.dependent("leaf-a", &owner, &[HOLD]).await;
    tree.dependent("leaf-b", &owner, &[HOLD]).await;

    tree.owners
        .delete("tree", &delete_with(Some(PropagationPolicy::Background)))
        .await
        .expect("background delete");
    let gone = tree.wait_gone("Owner", "tree").await;
    tree.wait_terminating("Dependent", "leaf-a").await;
    tree.wait_terminating("Dependent", "leaf-b").await;
    for leaf in ["leaf-a", "leaf-b"] {
        let deleted = tree
            .timeline
            .terminating("Dependent", leaf)
            .expect("seen terminating")
            .seq;
        assert!(
            deleted > gone,
            "{leaf} was deleted before its owner left:\n{}",
            tree.timeline.describe()
        );
        tree.release(&tree.dependents, leaf).await;
        tree.wait_gone("Dependent", leaf).await;
    }
}

#[tokio::test]
async fn a_foreground_delete_of_a_terminating_custom_resource_starts_the_cascade_and_background_strips_it()
 {
    let cp = control_plane().await;
    let s = Scope::new(cp, "second-delete").await;
    let tree = Tree::new(&s).await;
    let owner = tree.owner("tree", &[HOLD]).await;
    tree.dependent("leaf", &owner, &[HOLD]).await;

    // First delete with no policy: the owner is terminating, held by HOLD. A
    // custom resource's default is Background, which adds no GC finalizer, and
    // the GC leaves the dependents of an owner that still exists alone.
    tree.owners
        .delete("tree", &delete_with(None))
        .await
        .expect("first delete");
    tree.wait_terminating("Owner", "tree").await;
    assert_eq!(tree.finalizers("tree").await, vec![HOLD.to_string()]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        tree.timeline.terminating("Dependent", "leaf").is_none(),
        "the GC deleted a dependent of an owner that still exists"
    );

    // A second delete, Foreground: the API server adds foregroundDeletion to the
    // terminating object and the GC starts the foreground cascade.
    tree.owners
        .delete("tree", &delete_with(Some(PropagationPolicy::Foreground)))
        .await
        .expect("second delete, foreground");
    assert!(
        tree.finalizers("tree")
            .await
            .contains(&FOREGROUND.to_string())
    );
    tree.wait_terminating("Dependent", "leaf").await;

    // An explicit Background delete strips foregroundDeletion again.
    tree.owners
        .delete("tree", &delete_with(Some(PropagationPolicy::Background)))
        .await
        .expect("third delete, background");
    let finalizers = tree.finalizers("tree").await;
    assert!(
        !finalizers.contains(&FOREGROUND.to_string()),
        "Background left foregroundDeletion: {finalizers:?}"
    );

    tree.release(&tree.dependents, "leaf").await;
    tree.release(&tree.owners, "tree").await;
    tree.wait_gone("Owner", "tree").await;
}

#[tokio::test]
async fn garbage_collector_username_with_service_account_credentials() {
    let cp = control_plane().await;
    assert!(cp.use_service_account_credentials());
    garbage_collector_and_namespace_controller_usernames(cp, "gc-identity-sa").await;
}

#[tokio::test]
async fn garbage_collector_username_without_service_account_credentials() {
    let cp = ControlPlane::start(Options {
        use_service_account_credentials: false,
        ..options()
    })
    .await
    .unwrap_or_else(|e| panic!("second control plane: {e}"));
    garbage_collector_and_namespace_controller_usernames(&cp, "gc-identity-kcm").await;
}

/// The usernames admission sees on the garbage collector's and the namespace
/// controller's deletes, read from a policy's audit annotation, and what they
/// send.
async fn garbage_collector_and_namespace_controller_usernames(cp: &ControlPlane, test: &str) {
    let s = Scope::new(cp, test).await;
    let tree = Tree::new(&s).await;
    let name = format!("who-deletes-{}", s.namespace);
    install_policy(
        &s.client,
        &name,
        "dependents",
        json!([{"expression": "!has(oldObject.metadata.labels) || !('probe' in oldObject.metadata.labels)"}]),
        json!([{"key": "deleter", "valueExpression": "request.userInfo.username"}]),
        &s.namespace,
    )
    .await;
    let mut probe = DynamicObject::new("probe", &dependents()).data(json!({"spec": {}}));
    probe.metadata.labels = Some([("probe".to_string(), "yes".to_string())].into());
    tree.dependents
        .create(&PostParams::default(), &probe)
        .await
        .expect("probe");
    wait_for_refusal(&tree.dependents, "probe").await;

    let owner = tree.owner("tree", &[]).await;
    tree.dependent("leaf", &owner, &[]).await;
    tree.owners
        .delete("tree", &delete_with(Some(PropagationPolicy::Background)))
        .await
        .expect("background delete");
    tree.wait_gone("Dependent", "leaf").await;

    let annotation = format!("{name}/deleter");
    let gc = wait_for_audit(cp, |e| {
        e.verb == "delete" && e.is_about("dependents", &s.namespace, "leaf")
    })
    .await;
    assert_eq!(gc.effective_username(), cp.garbage_collector_username());
    assert_eq!(
        gc.annotations.get(&annotation).map(String::as_str),
        Some(cp.garbage_collector_username()),
        "admission saw another user: {gc:?}"
    );
    let options = gc.request_object.clone().unwrap_or_default();
    assert_eq!(gc.propagation_policy(), Some("Background"), "{options}");
    assert!(
        options["preconditions"]["uid"].is_string(),
        "the GC's delete carries no UID precondition: {options}"
    );

    // The namespace controller: everything left in a deleted namespace. An
    // object with no owner, so that only the namespace controller deletes it
    // (with service-account credentials off, it and the garbage collector are
    // the same user).
    let loner = DynamicObject::new("loner", &dependents()).data(json!({"spec": {}}));
    tree.dependents
        .create(&PostParams::default(), &loner)
        .await
        .expect("loner");
    let namespaces: Api<Namespace> = Api::all(s.client.clone());
    namespaces
        .delete(&s.namespace, &DeleteParams::default())
        .await
        .expect("delete namespace");
    // The probe's policy refuses the namespace controller too; remove it so
    // the namespace can finish, once the controller has tried.
    let ns_event = wait_for_audit(cp, |e| {
        e.effective_username() == cp.namespace_controller_username()
            && e.object_ref.as_ref().is_some_and(|r| {
                r.resource == "dependents"
                    && r.namespace == s.namespace
                    && (e.verb == "deletecollection" || r.name == "loner")
            })
    })
    .await;
    assert_eq!(
        ns_event.annotations.get(&annotation).map(String::as_str),
        Some(cp.namespace_controller_username())
    );
    assert_eq!(ns_event.propagation_policy(), Some("Background"));
    // What tells it apart from the garbage collector when both are
    // system:kube-controller-manager: it never sends a UID precondition.
    let ns_options = ns_event.request_object.clone().unwrap_or_default();
    assert!(
        ns_options["preconditions"]["uid"].is_null(),
        "the namespace controller sent a UID precondition: {ns_options}"
    );
    remove_policy(&s.client, &name).await;
    let gone = wait::until(Duration::from_secs(60), || async {
        namespaces
            .get_opt(&s.namespace)
            .await
            .ok()
            .and_then(|n| n.is_none().then_some(()))
    })
    .await;
    assert!(gone.is_some(), "namespace {} did not finish", s.namespace);
}

async fn wait_for_audit(
    cp: &ControlPlane,
    matches: impl Fn(&audit::Event) -> bool,
) -> audit::Event {
    let path = cp.audit_log_path();
    let found = wait::until(Duration::from_secs(30), || async {
        audit::read(&path).into_iter().find(|e| matches(e))
    })
    .await;
    found.unwrap_or_else(|| panic!("no such event in the audit log {}", path.display()))
}

/// A ValidatingAdmissionPolicy on DELETE of `resource`, bound (Deny) in one
/// namespace only, so that tests running at the same time are not affected.
async fn install_policy(
    client: &Client,
    name: &str,
    resource: &str,
    validations: serde_json::Value,
    audit_annotations: serde_json::Value,
    namespace: &str,
) {
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [GROUP], "apiVersions": ["*"], "operations": ["DELETE"], "resources": [resource]
            }]},
            "validations": validations,
            "auditAnnotations": audit_annotations,
        }
    }))
    .expect("valid policy");
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}
        }
    }))
    .expect("valid binding");
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .expect("create policy");
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("create binding");
}

async fn remove_policy(client: &Client, name: &str) {
    let _ = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await;
    let _ = Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await;
}

/// Policies take effect a moment after they are created: dry-run deletes of a
/// probe object until one is refused.
async fn wait_for_refusal(api: &Api<DynamicObject>, probe: &str) {
    let dry_run = DeleteParams {
        dry_run: true,
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    let refused = wait::until(Duration::from_secs(30), || async {
        match api.delete(probe, &dry_run).await {
            Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => Some(()),
            _ => None,
        }
    })
    .await;
    assert!(refused.is_some(), "the policy never took effect");
}
