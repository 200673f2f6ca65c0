//! Refuse mode on the real control plane, with the real `cascade-guard run`
//! compiling XRD annotations and CascadePolicies into ValidatingAdmissionPolicies.
//! Every assertion is about what the API server actually answered or did.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use cascade_guard::policy::names::{
    DEFAULT_GC_CONTROLLER_MANAGER_USER, DEFAULT_GC_SERVICE_ACCOUNT_USER,
};
use cascade_guard::policy::{
    CompileSettings, DeleteRequest, Mode, ObjectState, Propagation, Shape, decide,
};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Api, Client, ResourceExt};
use local_cluster::testing::Scope;
use local_cluster::timeline::Timeline;
use local_cluster::wait;
use serde_json::json;
use support::*;

/// Who sends a delete, as admission sees them.
#[derive(Clone, Copy, Debug)]
struct Requester {
    label: &'static str,
    username: &'static str,
    /// Whether this requester sends a UID precondition (the GC always does).
    sends_uid: bool,
}

const REQUESTERS: [Requester; 6] = [
    Requester {
        label: "person",
        username: "alice@example.com",
        sends_uid: false,
    },
    Requester {
        label: "gc (service account)",
        username: DEFAULT_GC_SERVICE_ACCOUNT_USER,
        sends_uid: true,
    },
    Requester {
        label: "gc (controller-manager user)",
        username: DEFAULT_GC_CONTROLLER_MANAGER_USER,
        sends_uid: true,
    },
    Requester {
        label: "namespace controller (service account)",
        username: "system:serviceaccount:kube-system:namespace-controller",
        sends_uid: false,
    },
    Requester {
        label: "namespace controller (controller-manager user)",
        username: DEFAULT_GC_CONTROLLER_MANAGER_USER,
        sends_uid: false,
    },
    Requester {
        label: "crossplane",
        username: "system:serviceaccount:crossplane-system:crossplane",
        sends_uid: false,
    },
];

/// What a client puts in DeleteOptions.
const POLICIES: [(&str, Option<&str>, Option<bool>); 6] = [
    ("none", None, None),
    ("Background", Some("Background"), None),
    ("Foreground", Some("Foreground"), None),
    ("Orphan", Some("Orphan"), None),
    ("orphanDependents=true", None, Some(true)),
    ("orphanDependents=false", None, Some(false)),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum State {
    LiveComposed,
    LiveEmpty,
    TerminatingForeground,
    TerminatingBackground,
}

const STATES: [State; 4] = [
    State::LiveComposed,
    State::LiveEmpty,
    State::TerminatingForeground,
    State::TerminatingBackground,
];

async fn as_user(cp: &local_cluster::ControlPlane, username: &str) -> Client {
    // system:masters so that authorization never answers for admission.
    cp.client_as(username, &["system:masters"])
        .await
        .expect("impersonating client")
}

/// Puts an XR of `resource` into `state` in `ns`; returns it as stored.
async fn prepare(s: &Scope<'_>, resource: &ApiResource, state: State, name: &str) -> DynamicObject {
    let api: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), &s.namespace, resource);
    let composed = state != State::LiveEmpty;
    let mut xr = composite(resource, name, composed);
    if matches!(
        state,
        State::TerminatingForeground | State::TerminatingBackground
    ) {
        xr.metadata.finalizers = Some(vec![HOLD.into()]);
    }
    let xr = api
        .create(&PostParams::default(), &xr)
        .await
        .expect("create XR");
    let uid = xr.uid().expect("uid");
    match state {
        State::LiveComposed | State::LiveEmpty => {}
        State::TerminatingForeground => {
            // A held, blocking dependent keeps foregroundDeletion on the XR.
            let maps: Api<ConfigMap> = Api::namespaced(s.client.clone(), &s.namespace);
            let cm: ConfigMap = serde_json::from_value(json!({
                "metadata": {"name": format!("{name}-composed"), "finalizers": [HOLD],
                    "ownerReferences": [{"apiVersion": resource.api_version, "kind": resource.kind,
                        "name": name, "uid": uid, "controller": true, "blockOwnerDeletion": true}]}
            }))
            .expect("config map");
            maps.create(&PostParams::default(), &cm)
                .await
                .expect("dependent");
            let outcome = delete(
                &s.client,
                resource,
                &s.namespace,
                name,
                &DeleteSpec::propagation("Foreground"),
            )
            .await;
            assert!(outcome.allowed(), "foreground delete refused: {outcome:?}");
            let ready = wait::until(Duration::from_secs(30), || async {
                let cm = maps.get(&format!("{name}-composed")).await.ok()?;
                cm.metadata.deletion_timestamp.map(|_| ())
            })
            .await;
            assert!(
                ready.is_some(),
                "the GC never deleted the dependent of {name}"
            );
        }
        State::TerminatingBackground => {
            // Only the GC may send Background here: do as it does.
            let gc = as_user(s.cp, DEFAULT_GC_SERVICE_ACCOUNT_USER).await;
            let outcome = delete(
                &gc,
                resource,
                &s.namespace,
                name,
                &DeleteSpec {
                    propagation: Some("Background"),
                    uid: Some(uid.clone()),
                    ..DeleteSpec::default()
                },
            )
            .await;
            assert!(outcome.allowed(), "GC-style delete refused: {outcome:?}");
        }
    }
    let stored = api.get(name).await.expect("XR exists");
    let finalizers = stored.finalizers().to_vec();
    let expect_fg = state == State::TerminatingForeground;
    assert_eq!(
        finalizers.iter().any(|f| f == "foregroundDeletion"),
        expect_fg,
        "{name} in {state:?} has finalizers {finalizers:?}"
    );
    assert_eq!(
        stored.metadata.deletion_timestamp.is_some(),
        matches!(
            state,
            State::TerminatingForeground | State::TerminatingBackground
        )
    );
    stored
}

/// Every cell of client policy × requester × object state × mode, as dry-run
/// deletes through the real API server, against the decision table.
#[tokio::test]
async fn the_api_server_agrees_with_the_decision_table_in_every_cell() {
    let env = env().await;
    let s = Scope::new(&env.cp, "decision-table").await;
    let settings = CompileSettings::default();
    let mut clients = Vec::new();
    for r in REQUESTERS {
        clients.push(as_user(&env.cp, r.username).await);
    }
    let mut mismatches = Vec::new();
    let mut cells = 0;
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for (kind, mode) in [
        (&REFUSE, Mode::Refuse),
        (&WARN, Mode::Warn),
        (&OFF, Mode::Off),
    ] {
        let resource = kind.resource();
        for state in STATES {
            let name = format!("{}-{}", kind.plural, format!("{state:?}").to_lowercase());
            let stored = prepare(&s, &resource, state, &name).await;
            let uid = stored.uid().expect("uid");
            let object = serde_json::to_value(&stored).expect("json");
            for (r, client) in REQUESTERS.iter().zip(&clients) {
                for (label, propagation, orphan) in POLICIES {
                    cells += 1;
                    let spec = DeleteSpec {
                        propagation,
                        orphan_dependents: orphan,
                        uid: r.sends_uid.then(|| uid.clone()),
                        dry_run: true,
                    };
                    let got = delete(client, &resource, &s.namespace, &name, &spec).await;
                    let expected = decide(
                        mode,
                        Shape::CompositeResource,
                        &settings,
                        &DeleteRequest {
                            propagation: propagation.map(|p| match p {
                                "Foreground" => Propagation::Foreground,
                                "Background" => Propagation::Background,
                                _ => Propagation::Orphan,
                            }),
                            orphan_dependents: orphan,
                            username: r.username.into(),
                            uid_precondition: r.sends_uid,
                            object: ObjectState::from_object(&object, Shape::CompositeResource),
                        },
                    );
                    let cell = format!("{mode} / {state:?} / {} / {label}", r.label);
                    *counts
                        .entry(if got.allowed() { "allowed" } else { "refused" })
                        .or_default() += 1;
                    if got.allowed() != expected.allowed {
                        mismatches.push(format!(
                            "{cell}: API server {} ({}), table says {:?}",
                            got.code, got.message, expected
                        ));
                        continue;
                    }
                    if !got.allowed() {
                        // The refusal names the object and gives the command that works.
                        let command = format!(
                            "kubectl delete {}.{GROUP} {name} -n {} --cascade=foreground",
                            kind.plural, s.namespace
                        );
                        if got.code != 403 || !got.message.contains(&command) {
                            mismatches.push(format!(
                                "{cell}: refusal {} {:?} lacks {command:?}",
                                got.code, got.message
                            ));
                        }
                    }
                    let warned = got.warnings.iter().any(|w| w.contains("cascade-guard"));
                    if warned != expected.warning.is_some() {
                        mismatches.push(format!(
                            "{cell}: warnings {:?}, table says {:?}",
                            got.warnings, expected.warning
                        ));
                    }
                }
            }
        }
    }
    assert_eq!(cells, 3 * 4 * 6 * 6);
    assert!(
        mismatches.is_empty(),
        "{} of {cells} cells disagree:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    // Both verdicts occur: the table is not trivially one-sided.
    assert!(
        counts.get("refused").copied().unwrap_or(0) > 50,
        "{counts:?}"
    );
    assert!(
        counts.get("allowed").copied().unwrap_or(0) > 50,
        "{counts:?}"
    );
}

/// Real (not dry-run) deletes by a person of a live XR with composed
/// resources: only Foreground goes through, and nothing refused is lost.
#[tokio::test]
async fn real_deletes_of_a_composed_xr_only_foreground_goes_through() {
    let env = env().await;
    let s = Scope::new(&env.cp, "real-deletes").await;
    let resource = REFUSE.resource();
    let api: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), &s.namespace, &resource);
    for (label, propagation, orphan) in POLICIES {
        let name = format!("xr-{}", label.to_lowercase().replace(['=', '_'], "-"));
        api.create(&PostParams::default(), &composite(&resource, &name, true))
            .await
            .expect("create");
        let got = delete(
            &s.client,
            &resource,
            &s.namespace,
            &name,
            &DeleteSpec {
                propagation,
                orphan_dependents: orphan,
                ..DeleteSpec::default()
            },
        )
        .await;
        let exists = api.get_opt(&name).await.expect("get").is_some();
        if label == "Foreground" {
            assert!(got.allowed(), "{label}: {got:?}");
        } else {
            assert_eq!(got.code, 403, "{label}: {got:?}");
            assert!(exists, "{label}: refused, yet gone");
            assert!(
                got.message.contains("--cascade=foreground"),
                "{}",
                got.message
            );
        }
    }
    // A live XR with nothing composed has nothing to cascade: any delete goes.
    api.create(
        &PostParams::default(),
        &composite(&resource, "empty", false),
    )
    .await
    .expect("create");
    let got = delete(
        &s.client,
        &resource,
        &s.namespace,
        "empty",
        &DeleteSpec::propagation("Background"),
    )
    .await;
    assert!(got.allowed(), "{got:?}");
}

#[tokio::test]
async fn delete_collection_removes_only_what_is_safe_and_reports_the_rest() {
    let env = env().await;
    let s = Scope::new(&env.cp, "delete-collection").await;
    let resource = REFUSE.resource();
    let api: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), &s.namespace, &resource);
    for (name, composed) in [("composed-a", true), ("composed-b", true), ("empty", false)] {
        api.create(
            &PostParams::default(),
            &composite(&resource, name, composed),
        )
        .await
        .expect("create");
    }
    let dry = delete_collection(
        &s.client,
        &resource,
        &s.namespace,
        &DeleteSpec::dry_run_background(),
    )
    .await;
    assert_eq!(dry.code, 403, "dry-run collection delete: {dry:?}");
    assert_eq!(
        api.list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        3
    );

    let got = delete_collection(
        &s.client,
        &resource,
        &s.namespace,
        &DeleteSpec::propagation("Background"),
    )
    .await;
    assert_eq!(got.code, 403, "{got:?}");
    assert!(
        got.message.contains("--cascade=foreground"),
        "{}",
        got.message
    );
    let left: Vec<String> = api
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .iter()
        .map(|o| o.name_any())
        .collect();
    assert!(
        left.contains(&"composed-a".to_string()) || left.contains(&"composed-b".to_string()),
        "{left:?}"
    );
    assert!(
        !left.contains(&"empty".to_string()) || left.len() == 3,
        "{left:?}"
    );

    // Foreground as a collection goes through.
    let got = delete_collection(
        &s.client,
        &resource,
        &s.namespace,
        &DeleteSpec::propagation("Foreground"),
    )
    .await;
    assert!(got.allowed(), "{got:?}");
}

/// XR → nested XR → protected leaves with finalizers: a foreground delete of
/// the root completes with the policies installed, in order.
#[tokio::test]
async fn a_foreground_cascade_through_three_levels_of_protected_kinds_completes() {
    let env = env().await;
    let s = Scope::new(&env.cp, "three-levels").await;
    let xr = REFUSE.resource();
    let xrs: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), &s.namespace, &xr);
    let leaf_api: Api<DynamicObject> =
        Api::namespaced_with(s.client.clone(), &s.namespace, &leaves());
    let timeline = Timeline::start(
        &s.client,
        &[
            (xr.clone(), Some(s.namespace.clone())),
            (leaves(), Some(s.namespace.clone())),
        ],
    )
    .await;
    let owner_ref = |o: &DynamicObject, r: &ApiResource| OwnerReference {
        api_version: r.api_version.clone(),
        kind: r.kind.clone(),
        name: o.name_any(),
        uid: o.uid().expect("uid"),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let root = xrs
        .create(&PostParams::default(), &composite(&xr, "root", true))
        .await
        .expect("root");
    let mut nested = composite(&xr, "nested", true);
    nested.metadata.owner_references = Some(vec![owner_ref(&root, &xr)]);
    let nested = xrs
        .create(&PostParams::default(), &nested)
        .await
        .expect("nested");
    for i in 0..3 {
        let mut leaf =
            DynamicObject::new(&format!("leaf-{i}"), &leaves()).data(json!({"spec": {}}));
        leaf.metadata.finalizers = Some(vec![HOLD.into()]);
        leaf.metadata.owner_references = Some(vec![owner_ref(&nested, &xr)]);
        leaf_api
            .create(&PostParams::default(), &leaf)
            .await
            .expect("leaf");
    }
    // The leaves are protected too: a person's Background delete is refused.
    let refused = delete(
        &s.client,
        &leaves(),
        &s.namespace,
        "leaf-0",
        &DeleteSpec::dry_run_background(),
    )
    .await;
    assert_eq!(refused.code, 403, "{refused:?}");

    let got = delete(
        &s.client,
        &xr,
        &s.namespace,
        "root",
        &DeleteSpec::propagation("Foreground"),
    )
    .await;
    assert!(got.allowed(), "{got:?}");
    // The GC's own deletes (Foreground of the nested XR, Background of the
    // leaves) go through: every leaf gets deleted, held by its finalizer.
    for i in 0..3 {
        let deleted = wait::until(Duration::from_secs(30), || async {
            timeline.terminating("Leaf", &format!("leaf-{i}"))
        })
        .await;
        assert!(
            deleted.is_some(),
            "leaf-{i} was never deleted:\n{}\n{}",
            timeline.describe(),
            env.cp.log_tails(20)
        );
    }
    for i in 0..3 {
        leaf_api
            .patch(
                &format!("leaf-{i}"),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await
            .expect("release leaf");
    }
    let root_gone = timeline
        .wait_gone("RefuseComposite", "root", Duration::from_secs(60))
        .await;
    assert!(
        root_gone.is_some(),
        "the cascade stalled:\n{}",
        timeline.describe()
    );
    let nested_gone = timeline
        .gone("RefuseComposite", "nested")
        .expect("nested gone")
        .seq;
    for i in 0..3 {
        let leaf_gone = timeline
            .gone("Leaf", &format!("leaf-{i}"))
            .expect("leaf gone")
            .seq;
        assert!(
            leaf_gone < nested_gone,
            "out of order:\n{}",
            timeline.describe()
        );
    }
    assert!(
        nested_gone < root_gone.expect("root").seq,
        "out of order:\n{}",
        timeline.describe()
    );
}

/// The namespace controller deletes with Background: it is refused, and the
/// refusal shows in the namespace's status. A foreground delete of the XR then
/// lets the namespace finish.
#[tokio::test]
async fn a_namespace_deletion_shows_the_refusal_in_the_namespace_status() {
    let env = env().await;
    let s = Scope::new(&env.cp, "namespace-deletion").await;
    let resource = REFUSE.resource();
    let api: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), &s.namespace, &resource);
    api.create(&PostParams::default(), &composite(&resource, "stuck", true))
        .await
        .expect("create");
    let namespaces: Api<Namespace> = Api::all(s.client.clone());
    namespaces
        .delete(&s.namespace, &DeleteParams::default())
        .await
        .expect("delete namespace");
    let condition = wait::until(Duration::from_secs(60), || async {
        let ns = namespaces.get(&s.namespace).await.ok()?;
        ns.status?.conditions?.into_iter().find(|c| {
            c.status == "True"
                && c.message
                    .as_deref()
                    .is_some_and(|m| m.contains("cascade-guard"))
        })
    })
    .await;
    let condition = condition.unwrap_or_else(|| {
        panic!(
            "no refusal in the namespace status:\n{}",
            env.cp.log_tails(20)
        )
    });
    assert!(
        condition
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("--cascade=foreground"),
        "{condition:?}"
    );
    assert_eq!(condition.type_, "NamespaceDeletionContentFailure");
    assert!(api.get_opt("stuck").await.expect("get").is_some());

    let got = delete(
        &s.client,
        &resource,
        &s.namespace,
        "stuck",
        &DeleteSpec::propagation("Foreground"),
    )
    .await;
    assert!(got.allowed(), "{got:?}");
    let gone = wait::until(Duration::from_secs(60), || async {
        namespaces
            .get_opt(&s.namespace)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    assert!(gone.is_some(), "the namespace did not finish");
}

async fn events_about(client: &Client, name: &str) -> Vec<(String, String)> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

async fn ready_condition(client: &Client, policy: &str) -> Option<(String, String, String)> {
    let p = cascade_policy_api(client).get(policy).await.ok()?;
    let conditions = p.data["status"]["conditions"].as_array()?.clone();
    let ready = conditions.iter().find(|c| c["type"] == "Ready")?;
    Some((
        ready["status"].as_str()?.to_string(),
        ready["reason"].as_str()?.to_string(),
        ready["message"].as_str()?.to_string(),
    ))
}

/// Bad input gets a clear Event or status condition and a safe default; the
/// controller keeps running and no kind is left unprotected by accident.
#[tokio::test]
async fn hostile_and_broken_input_is_reported_and_fails_safe() {
    let env = env().await;
    let s = Scope::new(&env.cp, "hostile").await;
    let c = &s.client;

    // An annotation value that tries to break out of CEL reads as Refuse.
    env.wait_for_protection(c, &HOSTILE.resource()).await;
    let events = wait::until(Duration::from_secs(30), || async {
        let e = events_about(c, &HOSTILE.xrd_name()).await;
        e.iter().any(|(r, _)| r == "UnknownMode").then_some(e)
    })
    .await;
    assert!(events.is_some(), "no UnknownMode event on the XRD");
    let vap = Api::<ValidatingAdmissionPolicy>::all(c.clone())
        .get(&format!("cascade-guard-xrd-{}", HOSTILE.xrd_name()))
        .await
        .expect("policy for the hostile kind");
    assert_eq!(
        vap.annotations()
            .get("cascade-guard.dev/mode")
            .map(String::as_str),
        Some("Refuse")
    );

    // No annotation at all: the controller's default mode, Refuse.
    env.wait_for_protection(c, &DEFAULTED.resource()).await;

    // An XRD with no versions: still guarded (its kind may be served by an
    // earlier revision), and said so on the XRD.
    let empty = Api::<ValidatingAdmissionPolicy>::all(c.clone())
        .get(&format!("cascade-guard-xrd-{NO_VERSIONS_XRD}"))
        .await
        .expect("policy for the XRD without versions");
    assert_eq!(
        empty
            .annotations()
            .get("cascade-guard.dev/mode")
            .map(String::as_str),
        Some("Refuse")
    );
    let events = wait::until(Duration::from_secs(30), || async {
        let e = events_about(c, NO_VERSIONS_XRD).await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert!(events.is_some(), "no event on the XRD without versions");

    // A CascadePolicy for a kind that does not exist.
    let ghost = wait::until(Duration::from_secs(30), || async {
        ready_condition(c, "ghost").await
    })
    .await;
    let (status, reason, message) = ghost.expect("ghost has a Ready condition");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "UnknownKind"),
        "{message}"
    );
    assert!(message.contains("Ghost"), "{message}");

    // A second policy for the same kind: both apply, the overlap is reported.
    let second = wait::until(Duration::from_secs(30), || async {
        ready_condition(c, "leaves-warn").await
    })
    .await;
    let (status, _, message) = second.expect("leaves-warn has a Ready condition");
    assert_eq!(status, "True");
    assert!(message.contains("also guarded"), "{message}");

    // A selector that is not a valid label selector: compiled without it
    // (wider is safer), and said so.
    let hostile = wait::until(Duration::from_secs(30), || async {
        ready_condition(c, "hostile-selector").await
    })
    .await;
    let (status, _, message) = hostile.expect("hostile-selector has a Ready condition");
    assert_eq!(status, "True", "{message}");
    assert!(message.contains("selector"), "{message}");
    let binding = Api::<ValidatingAdmissionPolicyBinding>::all(c.clone())
        .get("cascade-guard-policy-hostile-selector")
        .await
        .expect("binding");
    let match_resources = binding.spec.match_resources.expect("matchResources");
    assert!(
        match_resources
            .object_selector
            .is_none_or(|s| s.match_labels.is_none() && s.match_expressions.is_none())
    );
}

/// The compiled objects follow the XRD annotation, and are put back when
/// someone deletes or edits them. Uses its own kind: it changes global state.
#[tokio::test]
async fn policies_follow_xrd_changes_and_are_restored_after_edits() {
    let env = env().await;
    let s = Scope::new(&env.cp, "sync").await;
    let c = &s.client;
    let resource = TOGGLED.resource();
    let name = format!("cascade-guard-xrd-{}", TOGGLED.xrd_name());
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(c.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(c.clone());
    let api: Api<DynamicObject> = Api::namespaced_with(c.clone(), &s.namespace, &resource);
    api.create(&PostParams::default(), &composite(&resource, "xr", true))
        .await
        .expect("create");
    let refused = || async {
        delete(
            c,
            &resource,
            &s.namespace,
            "xr",
            &DeleteSpec::dry_run_background(),
        )
        .await
        .code
            == 403
    };
    env.wait_for_protection(c, &resource).await;

    // Deleted by someone: put back.
    policies
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete policy");
    bindings
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete binding");
    let back = wait::until(Duration::from_secs(30), || async {
        policies.get_opt(&name).await.ok()??;
        bindings.get_opt(&name).await.ok()??;
        refused().await.then_some(())
    })
    .await;
    assert!(
        back.is_some(),
        "not restored after deletion:\n{}",
        env.cp.log_tails(20)
    );

    // Edited by someone (Deny turned into Warn): put back.
    bindings
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"validationActions": ["Warn"]}})),
        )
        .await
        .expect("edit binding");
    let back = wait::until(Duration::from_secs(30), || async {
        let b = bindings.get(&name).await.ok()?;
        (b.spec.validation_actions == vec!["Deny".to_string()]).then_some(())
    })
    .await;
    assert!(back.is_some(), "not restored after an edit");

    // The package author turns protection off: the objects go, deletes pass.
    let xrds = xrd_api(c);
    let annotate = |value: Option<&str>| json!({"metadata": {"annotations": {"cascade-guard.dev/deletion-policy": value}}});
    xrds.patch(
        &TOGGLED.xrd_name(),
        &PatchParams::default(),
        &Patch::Merge(annotate(Some("Off"))),
    )
    .await
    .expect("annotate Off");
    let off = wait::until(Duration::from_secs(30), || async {
        (policies.get_opt(&name).await.ok()?.is_none() && !refused().await).then_some(())
    })
    .await;
    assert!(off.is_some(), "Off did not take effect");

    // And on again.
    xrds.patch(
        &TOGGLED.xrd_name(),
        &PatchParams::default(),
        &Patch::Merge(annotate(Some("Refuse"))),
    )
    .await
    .expect("annotate Refuse");
    let on = wait::until(Duration::from_secs(30), || async {
        refused().await.then_some(())
    })
    .await;
    assert!(on.is_some(), "Refuse did not take effect again");

    // Annotation removed: the default mode (Refuse) keeps it protected.
    xrds.patch(
        &TOGGLED.xrd_name(),
        &PatchParams::default(),
        &Patch::Merge(annotate(None)),
    )
    .await
    .expect("remove annotation");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(refused().await, "removing the annotation lifted protection");
}

/// `cascade-guard render` on Modelplane's real XRDs (annotated copies): the
/// API server accepts every object, and they protect exactly the annotated kinds.
#[tokio::test]
async fn render_of_the_modelplane_xrds_is_accepted_and_protects_exactly_the_annotated_kinds() {
    let env = env().await;
    let s = Scope::new(&env.cp, "render").await;
    let apis = local_cluster::crossplane::fixtures_dir().join("modelplane/apis");
    let out = std::env::temp_dir().join(format!("cascade-guard-render-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).expect("temp dir");
    let annotated = [
        ("inferenceclusters", "Refuse"),
        ("modeldeployments", "Convert"),
        ("inferencegateways", "Warn"),
        ("eksclusters", "Off"),
    ];
    let mut all = Vec::new();
    for entry in std::fs::read_dir(&apis).expect("fixtures") {
        let dir = entry.expect("entry").path();
        let definition = dir.join("definition.yaml");
        if !definition.exists() {
            continue;
        }
        let mut xrd = local_cluster::crossplane::read_yaml(&definition).expect("fixture XRD");
        let plural = xrd["spec"]["names"]["plural"]
            .as_str()
            .expect("plural")
            .to_string();
        all.push(plural.clone());
        if let Some((_, mode)) = annotated.iter().find(|(p, _)| *p == plural) {
            xrd["metadata"]["annotations"] = json!({"cascade-guard.dev/deletion-policy": mode});
        }
        std::fs::write(
            out.join(format!("{plural}.yaml")),
            serde_yaml::to_string(&xrd).expect("yaml"),
        )
        .expect("write copy");
    }
    assert!(all.len() >= 10, "fixtures: {all:?}");

    let run = |default_mode: &str| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_cascade-guard"))
            .args(["render", &format!("--xrd-default-mode={default_mode}")])
            .arg(&out)
            .output()
            .expect("run render");
        assert!(
            output.status.success(),
            "render failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let text = String::from_utf8(output.stdout).expect("utf-8");
        cascade_guard::policy::split_yaml_documents(&text).expect("render prints YAML")
    };

    let objects = run("Off");
    let mut protected = BTreeMap::new();
    for o in &objects {
        if o["kind"] == "ValidatingAdmissionPolicyBinding" {
            let plural = o["spec"]["matchResources"]["resourceRules"][0]["resources"][0]
                .as_str()
                .expect("resource");
            protected.insert(plural.to_string(), o["spec"]["validationActions"].clone());
        }
    }
    let expected: BTreeMap<String, serde_json::Value> = [
        ("inferenceclusters", json!(["Deny"])),
        ("modeldeployments", json!(["Deny"])),
        ("inferencegateways", json!(["Warn", "Audit"])),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(protected, expected);

    // The API server accepts each object (server-side dry run: full validation,
    // CEL compilation included, nothing stored).
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    for o in &objects {
        match o["kind"].as_str() {
            Some("ValidatingAdmissionPolicy") => {
                let p: ValidatingAdmissionPolicy =
                    serde_json::from_value(o.clone()).expect("policy");
                Api::<ValidatingAdmissionPolicy>::all(s.client.clone())
                    .create(&dry_run, &p)
                    .await
                    .unwrap_or_else(|e| panic!("policy {} refused: {e}", p.name_any()));
            }
            Some("ValidatingAdmissionPolicyBinding") => {
                let b: ValidatingAdmissionPolicyBinding =
                    serde_json::from_value(o.clone()).expect("binding");
                Api::<ValidatingAdmissionPolicyBinding>::all(s.client.clone())
                    .create(&dry_run, &b)
                    .await
                    .unwrap_or_else(|e| panic!("binding {} refused: {e}", b.name_any()));
            }
            other => panic!("unexpected object kind {other:?}"),
        }
    }

    // With the default mode (Refuse), every kind but the one annotated Off.
    let objects = run("Refuse");
    let bindings = objects
        .iter()
        .filter(|o| o["kind"] == "ValidatingAdmissionPolicyBinding")
        .count();
    assert_eq!(bindings, all.len() - 1);
    let _ = std::fs::remove_dir_all(&out);
}
