//! Refuse mode on the real control plane, with the real `cascade-guard run`
//! compiling XRD annotations and CascadePolicies into ValidatingAdmissionPolicies.
//! Every assertion is about what the API server actually answered or did.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cascade_guard::policy::decision::Reason;
use cascade_guard::policy::names::{
    DEFAULT_CROSSPLANE_USER, DEFAULT_GC_CONTROLLER_MANAGER_USER, DEFAULT_GC_SERVICE_ACCOUNT_USER,
    FOREGROUND_CASCADE_FINALIZER,
};
use cascade_guard::policy::refusal::{self, Subject};
use cascade_guard::policy::{CompileSettings, Mode, ObjectState, Shape, decide};
use cascade_guard_testkit::tree::{Composing, Provider, assert_foreground, plain, wait_held};
use cascade_guard_testkit::*;
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
    /// Live, composing, with cascade-guard's finalizer (as --hold-composed
    /// holds a composed object).
    LiveHeld,
}

const STATES: [State; 5] = [
    State::LiveComposed,
    State::LiveEmpty,
    State::TerminatingForeground,
    State::TerminatingBackground,
    State::LiveHeld,
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
    if state == State::LiveHeld {
        // Put there as the controller would; nothing here takes it off (no
        // Convert or composed reach names this kind): the object stays for
        // the namespace's deletion to end with the control plane.
        xr.metadata.finalizers = Some(vec![FOREGROUND_CASCADE_FINALIZER.into()]);
    }
    let xr = api
        .create(&PostParams::default(), &xr)
        .await
        .expect("create XR");
    let uid = xr.uid().expect("uid");
    match state {
        State::LiveComposed | State::LiveEmpty | State::LiveHeld => {}
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
                    let request = spec.as_request(
                        r.username,
                        ObjectState::from_object(&object, Shape::CompositeResource),
                    );
                    let expected = decide(mode, Shape::CompositeResource, &settings, &request);
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
                    // The refusal (a warning in Warn) is the decision
                    // table's text to the letter: the object, what was sent,
                    // the command that works (or, mid-cascade, how to follow
                    // it), the `cascade-guard plan` that shows its order, and
                    // break-glass.
                    let refused = !matches!(expected.reason, Reason::Allowed(_));
                    if refused && mode != Mode::Off {
                        let subject = Subject {
                            kind: kind.kind.to_string(),
                            name: name.clone(),
                            resource: kind.plural.to_string(),
                            group: GROUP.to_string(),
                            namespace: Some(s.namespace.clone()),
                        };
                        let want =
                            refusal::text(mode, Shape::CompositeResource, &request, &subject);
                        let said = if mode == Mode::Warn {
                            got.warnings.iter().any(|w| w.contains(&want))
                        } else {
                            got.code == 403 && got.message.contains(&want)
                        };
                        if !said {
                            mismatches.push(format!(
                                "{cell}: {} {:?} (warnings {:?}) is not {want:?}",
                                got.code, got.message, got.warnings
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
    assert_eq!(cells, 3 * 5 * 6 * 6);
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
    .await
    .unwrap_or_else(|e| panic!("{e}"));
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
        // Only the test's finalizer: foregroundDeletion is the garbage
        // collector's to remove (a person's update that drops it is refused).
        release_hold(&leaf_api, &format!("leaf-{i}")).await;
    }
    let root_gone = timeline
        .wait_gone("RefuseComposite", "root", Duration::from_secs(60))
        .await;
    assert!(
        root_gone.is_some(),
        "the cascade stalled:\n{}",
        timeline.describe()
    );
    // By etcd revision: arrival across the kinds' watches is not their order.
    let nested_gone = timeline.revision_of(
        &timeline
            .gone("RefuseComposite", "nested")
            .expect("nested gone"),
    );
    for i in 0..3 {
        let leaf_gone = timeline.revision_of(
            &timeline
                .gone("Leaf", &format!("leaf-{i}"))
                .expect("leaf gone"),
        );
        assert!(
            leaf_gone < nested_gone,
            "out of order:\n{}",
            timeline.describe()
        );
    }
    assert!(
        nested_gone < timeline.revision_of(&root_gone.expect("root")),
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
    // Every XRD in Refuse shares one pair; it says where each kind's policy
    // comes from.
    let vap = Api::<ValidatingAdmissionPolicy>::all(c.clone())
        .get("cascade-guard-xrds-refuse-composite")
        .await
        .expect("the shared Refuse policy");
    assert_eq!(
        vap.annotations()
            .get("cascade-guard.dev/mode")
            .map(String::as_str),
        Some("Refuse")
    );
    let carried = carried_kinds(&vap);
    assert_eq!(
        carried.get(&kind_key(&HOSTILE)),
        Some(
            &json!({"source": format!("CompositeResourceDefinition/{}", HOSTILE.xrd_name()), "modeFrom": "xrd-annotation"})
        ),
        "{carried:?}"
    );
    assert_eq!(
        carried[&kind_key(&DEFAULTED)]["modeFrom"],
        "xrd-default-mode"
    );

    // No annotation at all: the controller's default mode, Refuse.
    env.wait_for_protection(c, &DEFAULTED.resource()).await;

    // An XRD with no versions: still guarded (its kind may be served by an
    // earlier revision), and said so on the XRD.
    let empty = format!("EmptyComposite.{GROUP}");
    assert_eq!(
        carried.get(&empty).map(|k| k["source"].clone()),
        Some(json!(format!(
            "CompositeResourceDefinition/{NO_VERSIONS_XRD}"
        ))),
        "the XRD without versions is in the shared Refuse policy: {carried:?}"
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

/// CascadePolicies naming kinds no policy may protect: each was compiled and
/// in force once (`kubectl delete crd`, `kubectl delete deployment` and
/// `kubectl delete cpol` refused; cascade-guard's finalizer on
/// kube-apiserver's own Lease). Now each gets Ready=False ForbiddenKind,
/// nothing is compiled for it, and those deletes go through.
#[tokio::test]
async fn dangerous_targets_are_refused_with_a_condition_and_guard_nothing() {
    let env = env().await;
    let s = Scope::new(&env.cp, "dangerous").await;
    let c = &s.client;
    let policies = cascade_policy_api(c);
    for (name, group, kind, mode) in [
        (
            "danger-crds",
            "apiextensions.k8s.io",
            "CustomResourceDefinition",
            "Refuse",
        ),
        ("danger-deployments", "apps", "Deployment", "Refuse"),
        ("danger-leases", "coordination.k8s.io", "Lease", "Convert"),
        ("danger-own", "cascade-guard.dev", "CascadePolicy", "Refuse"),
    ] {
        let mut policy = cascade_policy(name, kind, mode, None);
        policy["spec"]["group"] = json!(group);
        create(&policies, policy).await;
        let ready = wait::until(Duration::from_secs(30), || async {
            ready_condition(c, name).await
        })
        .await;
        let (status, reason, message) =
            ready.unwrap_or_else(|| panic!("{name} has no Ready condition"));
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", "ForbiddenKind"),
            "{name}: {message}"
        );
        assert!(message.contains("cannot be protected"), "{name}: {message}");
        let vap = Api::<ValidatingAdmissionPolicy>::all(c.clone())
            .get_opt(&format!("cascade-guard-policy-{name}"))
            .await
            .expect("get");
        assert!(vap.is_none(), "{name} compiles to nothing");
    }
    // A Deployment's plain delete goes through (dry run).
    let deployments: Api<DynamicObject> = Api::namespaced_with(
        c.clone(),
        &s.namespace,
        &ApiResource {
            group: "apps".into(),
            version: "v1".into(),
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            plural: "deployments".into(),
        },
    );
    create(
        &deployments,
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": s.namespace},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}
        }),
    )
    .await;
    deployments
        .delete("web", &DeleteParams::default().dry_run())
        .await
        .expect("a Deployment's plain delete is not refused");
    // No Lease carries cascade-guard's finalizer.
    let leases = Api::<k8s_openapi::api::coordination::v1::Lease>::all(c.clone())
        .list(&ListParams::default())
        .await
        .expect("leases");
    for lease in leases.items {
        assert!(
            !lease
                .finalizers()
                .iter()
                .any(|f| f.starts_with("cascade-guard.dev/")),
            "{:?} holds cascade-guard's finalizer",
            lease.metadata.name
        );
    }
    // The policies themselves delete plainly.
    for name in [
        "danger-crds",
        "danger-deployments",
        "danger-leases",
        "danger-own",
    ] {
        policies
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("delete {name}: {e}"));
    }
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
            .args([
                "render",
                &format!("--xrd-default-mode={default_mode}"),
                "--set-name=modelplane",
            ])
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

    // What each DELETE binding guards (a shared one, several kinds): its
    // policy's rules (a binding has none of its own).
    let delete_bindings = |objects: &[serde_json::Value]| {
        let mut protected = BTreeMap::new();
        for o in objects {
            if o["kind"] != "ValidatingAdmissionPolicyBinding" {
                continue;
            }
            assert!(o["spec"]["matchResources"].get("resourceRules").is_none());
            let policy = objects
                .iter()
                .find(|p| {
                    p["kind"] == "ValidatingAdmissionPolicy"
                        && p["metadata"]["name"] == o["spec"]["policyName"]
                })
                .expect("the binding's policy");
            let rules = policy["spec"]["matchConstraints"]["resourceRules"]
                .as_array()
                .expect("rules");
            for rule in rules.iter().filter(|r| r["operations"][0] == "DELETE") {
                for plural in rule["resources"].as_array().expect("resources") {
                    let plural = plural.as_str().expect("resource").to_string();
                    let before = protected.insert(plural, o["spec"]["validationActions"].clone());
                    assert_eq!(before, None, "a kind in two DELETE bindings");
                }
            }
        }
        protected
    };
    let objects = run("Off");
    let protected = delete_bindings(&objects);
    // The set's name is on every shared object, and its bindings point at it.
    for o in &objects {
        let name = o["metadata"]["name"].as_str().expect("name");
        assert!(name.ends_with("-modelplane"), "{name}");
        if o["kind"] == "ValidatingAdmissionPolicyBinding" {
            assert_eq!(o["spec"]["policyName"], json!(name));
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
    // CEL compilation included, nothing stored), renamed so as not to meet the
    // running controller's own shared objects.
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    for o in &objects {
        let mut o = o.clone();
        let renamed = format!("render-{}", o["metadata"]["name"].as_str().expect("name"));
        o["metadata"]["name"] = json!(renamed);
        if o["kind"] == "ValidatingAdmissionPolicyBinding" {
            o["spec"]["policyName"] = json!(renamed);
        }
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
    let protected = delete_bindings(&objects);
    assert_eq!(protected.len(), all.len() - 1, "{protected:?}");
    // XRDs share: a DELETE and an UPDATE pair per mode in use (Refuse,
    // Convert, Warn), however many kinds.
    let bindings = objects
        .iter()
        .filter(|o| o["kind"] == "ValidatingAdmissionPolicyBinding")
        .count();
    assert_eq!(bindings, 2 * 3);
    let _ = std::fs::remove_dir_all(&out);
}

/// The update path of a protected object (issue #10): a person who may patch
/// it but holds no break-glass cannot take composed resources out of an XR's
/// `resourceRefs` (after which any delete of it would pass as "nothing to
/// cascade") nor take `foregroundDeletion` or cascade-guard's finalizer off it
/// (after which it leaves the API at once, mid-cascade). Crossplane may change
/// the list, the garbage collector and cascade-guard the finalizers; ordinary
/// updates pass. Dry runs through the real API server, then one for real.
#[tokio::test]
async fn updates_that_would_let_an_object_go_early_are_refused_except_for_who_may_make_them() {
    let env = env().await;
    let s = Scope::new(&env.cp, "guarded-updates").await;
    let ns = s.namespace.clone();
    let person = as_user(&env.cp, "alice@example.com").await;
    let crossplane = as_user(&env.cp, DEFAULT_CROSSPLANE_USER).await;
    let gc = as_user(&env.cp, DEFAULT_GC_SERVICE_ACCOUNT_USER).await;
    let kcm = as_user(&env.cp, DEFAULT_GC_CONTROLLER_MANAGER_USER).await;
    let controller = as_user(&env.cp, CONTROLLER_USER).await;
    let users: [(&str, &Client); 5] = [
        ("person", &person),
        ("crossplane", &crossplane),
        ("gc", &gc),
        ("kcm", &kcm),
        ("cascade-guard", &controller),
    ];
    let refuse = REFUSE.resource();
    let ref_to = |n: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": n});
    let refs = |names: &[&str]| json!({"spec": {"crossplane": {"resourceRefs": names.iter().map(|n| ref_to(n)).collect::<Vec<_>>()}}});
    let mut xr = composite(&refuse, "two", true);
    xr.data["spec"] = refs(&["a", "b"])["spec"].clone();
    Api::<DynamicObject>::namespaced_with(s.client.clone(), &ns, &refuse)
        .create(&PostParams::default(), &xr)
        .await
        .expect("create XR");
    let mut broken = composite(&refuse, "broken", true);
    broken.metadata.annotations = Some(BTreeMap::from([(
        "cascade-guard.dev/break-glass".to_string(),
        "cluster already gone".to_string(),
    )]));
    Api::<DynamicObject>::namespaced_with(s.client.clone(), &ns, &refuse)
        .create(&PostParams::default(), &broken)
        .await
        .expect("create break-glass XR");
    env.wait_for_protection(&s.client, &refuse).await;

    let mut mismatches = Vec::new();
    let mut check = |cell: String, got: &DeleteOutcome, allowed: bool, wanted: &[String]| {
        if got.allowed() != allowed {
            mismatches.push(format!("{cell}: {} {}", got.code, got.message));
        } else if !allowed {
            for w in wanted {
                if got.code != 403 || !got.message.contains(w.as_str()) {
                    mismatches.push(format!("{cell}: refusal {:?} lacks {w:?}", got.message));
                }
            }
        }
    };

    // resourceRefs: (what, patch, who may)
    let annotate = format!(
        "kubectl annotate {}.{GROUP} two -n {ns} cascade-guard.dev/break-glass=\"<why>\"",
        REFUSE.plural
    );
    let ref_cases = [
        ("emptied", refs(&[]), &["crossplane"][..]),
        ("one dropped", refs(&["b"]), &["crossplane"]),
        ("one replaced", refs(&["b", "c"]), &["crossplane"]),
        (
            "spec.crossplane removed",
            json!({"spec": {"crossplane": null}}),
            &["crossplane"],
        ),
        (
            "one added",
            refs(&["a", "b", "c"]),
            &["person", "crossplane", "gc", "kcm", "cascade-guard"],
        ),
        (
            "reordered",
            refs(&["b", "a"]),
            &["person", "crossplane", "gc", "kcm", "cascade-guard"],
        ),
        (
            "a label",
            json!({"metadata": {"labels": {"team": "a"}}}),
            &["person", "crossplane", "gc", "kcm", "cascade-guard"],
        ),
    ];
    for (what, patch, may) in &ref_cases {
        for (who, client) in users {
            let got = merge_patch(client, &refuse, &ns, "two", patch, false).await;
            let wanted = [
                "spec.crossplane.resourceRefs".to_string(),
                "only Crossplane".to_string(),
                annotate.clone(),
            ];
            check(
                format!("refs {what} by {who}"),
                &got,
                may.contains(&who),
                &wanted,
            );
        }
        // Break-glass: anyone.
        let got = merge_patch(&person, &refuse, &ns, "broken", patch, false).await;
        check(format!("refs {what} with break-glass"), &got, true, &[]);
    }

    // Finalizers, mid-cascade: the XR is in a foreground cascade, held by a
    // test finalizer and foregroundDeletion.
    let cascading = prepare(&s, &refuse, State::TerminatingForeground, "cascading").await;
    assert_eq!(
        BTreeSet::from_iter(cascading.finalizers().iter().cloned()),
        BTreeSet::from([HOLD.to_string(), "foregroundDeletion".to_string()])
    );
    let finalizers = |f: &[&str]| json!({"metadata": {"finalizers": f}});
    let gc_and_us = &["gc", "kcm", "cascade-guard"][..];
    let everyone = &["person", "crossplane", "gc", "kcm", "cascade-guard"][..];
    let fin_cases = [
        ("foregroundDeletion removed", finalizers(&[HOLD]), gc_and_us),
        (
            "all removed",
            json!({"metadata": {"finalizers": null}}),
            gc_and_us,
        ),
        (
            "the test's own removed",
            finalizers(&["foregroundDeletion"]),
            everyone,
        ),
        (
            "removed with break-glass set in the same patch",
            json!({"metadata": {"finalizers": [HOLD], "annotations": {"cascade-guard.dev/break-glass": "wedged"}}}),
            everyone,
        ),
    ];
    for (what, patch, may) in &fin_cases {
        for (who, client) in users {
            let got = merge_patch(client, &refuse, &ns, "cascading", patch, false).await;
            let wanted = [
                "foregroundDeletion from RefuseComposite cascading".to_string(),
                "only the garbage collector and cascade-guard".to_string(),
            ];
            check(
                format!("finalizers {what} by {who}"),
                &got,
                may.contains(&who),
                &wanted,
            );
        }
    }

    // A kind that is not an XR (CascadePolicy leaves): the same for finalizers.
    let leaf = prepare(&s, &leaves(), State::TerminatingForeground, "leaf").await;
    assert!(leaf.finalizers().iter().any(|f| f == "foregroundDeletion"));
    for (who, client) in users {
        let got = merge_patch(client, &leaves(), &ns, "leaf", &finalizers(&[HOLD]), false).await;
        check(
            format!("leaf finalizers by {who}"),
            &got,
            gc_and_us.contains(&who),
            &[],
        );
    }

    // Convert: cascade-guard's finalizer on a live object is its own to remove.
    let convert = CONVERT.resource();
    Api::<DynamicObject>::namespaced_with(s.client.clone(), &ns, &convert)
        .create(&PostParams::default(), &composite(&convert, "held", true))
        .await
        .expect("create Convert XR");
    let held = wait::until(Duration::from_secs(30), || async {
        let o = Api::<DynamicObject>::namespaced_with(s.client.clone(), &ns, &convert)
            .get("held")
            .await
            .ok()?;
        o.finalizers()
            .iter()
            .any(|f| f == "cascade-guard.dev/foreground-cascade")
            .then_some(())
    })
    .await;
    assert!(held.is_some(), "cascade-guard never held the Convert XR");
    for (who, client) in users {
        let got = merge_patch(client, &convert, &ns, "held", &finalizers(&[]), false).await;
        check(
            format!("Convert finalizer by {who}"),
            &got,
            gc_and_us.contains(&who),
            &["cascade-guard.dev/foreground-cascade".to_string()],
        );
    }

    // Warn: nothing refused, but the client is told.
    let warn = WARN.resource();
    Api::<DynamicObject>::namespaced_with(s.client.clone(), &ns, &warn)
        .create(&PostParams::default(), &composite(&warn, "warned", true))
        .await
        .expect("create Warn XR");
    let got = merge_patch(&person, &warn, &ns, "warned", &refs(&[]), false).await;
    assert!(got.allowed(), "{got:?}");
    assert!(
        got.warnings
            .iter()
            .any(|w| w.contains("cascade-guard warning: removing composed resources")),
        "{got:?}"
    );
    assert!(
        mismatches.is_empty(),
        "{} cells disagree:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );

    // A legacy (LegacyCluster) XR lists its composed resources in
    // spec.resourceRefs: the same rule.
    // A v1 XRD: v1 has no scope field, its XRs are LegacyCluster.
    let mut legacy_xrd = xrd("LegacyComposite", "legacycomposites", Some("Refuse"));
    legacy_xrd["spec"]["scope"] = json!("LegacyCluster");
    let crd = local_cluster::crossplane::xrd_to_crd(&legacy_xrd).expect("legacy CRD");
    legacy_xrd["apiVersion"] = json!("apiextensions.crossplane.io/v1");
    if let Some(spec) = legacy_xrd["spec"].as_object_mut() {
        spec.remove("scope");
    }
    let v1_xrds: Api<DynamicObject> = Api::all_with(
        s.client.clone(),
        &ApiResource {
            version: "v1".into(),
            api_version: "apiextensions.crossplane.io/v1".into(),
            ..local_cluster::crossplane::xrd_resource()
        },
    );
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(s.client.clone());
    if crds
        .get_opt(&crd.name_any())
        .await
        .expect("get CRD")
        .is_none()
    {
        crds.create(&PostParams::default(), &crd)
            .await
            .expect("legacy CRD");
        create(&v1_xrds, legacy_xrd).await;
    }
    let legacy = ApiResource {
        kind: "LegacyComposite".into(),
        plural: "legacycomposites".into(),
        ..refuse.clone()
    };
    let legacy_api: Api<DynamicObject> = Api::all_with(s.client.clone(), &legacy);
    let created = wait::until(Duration::from_secs(30), || async {
        let o = DynamicObject::new("legacy", &legacy)
            .data(json!({"spec": {"resourceRefs": [ref_to("a")]}}));
        match legacy_api.create(&PostParams::default(), &o).await {
            Ok(_) => Some(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Some(()),
            Err(_) => None,
        }
    })
    .await;
    assert!(created.is_some(), "the legacy kind was never served");
    let emptied = json!({"spec": {"resourceRefs": []}});
    let refused = wait::until(Duration::from_secs(30), || async {
        let got = merge_patch(&person, &legacy, "", "legacy", &emptied, false).await;
        (got.code == 403).then_some(got)
    })
    .await
    .expect("emptying a legacy XR's resourceRefs was never refused");
    assert!(
        refused
            .message
            .contains("composed resources from spec.resourceRefs of LegacyComposite legacy"),
        "{refused:?}"
    );
    let got = merge_patch(&crossplane, &legacy, "", "legacy", &emptied, false).await;
    assert!(got.allowed(), "{got:?}");

    // For real: the bypass of the issue, emptying the list and then deleting
    // with Background, fails at the first step, and the XR stays protected.
    let got = merge_patch(&person, &refuse, &ns, "two", &refs(&[]), true).await;
    assert_eq!(got.code, 403, "{got:?}");
    let deleted = delete(
        &person,
        &refuse,
        &ns,
        "two",
        &DeleteSpec::propagation("Background"),
    )
    .await;
    assert_eq!(deleted.code, 403, "{deleted:?}");
    // And a real finalizer strip mid-cascade is refused: the XR stays.
    let got = merge_patch(
        &person,
        &refuse,
        &ns,
        "cascading",
        &finalizers(&[HOLD]),
        true,
    )
    .await;
    assert_eq!(got.code, 403, "{got:?}");
    let api = Api::<DynamicObject>::namespaced_with(s.client.clone(), &ns, &refuse);
    let still = api.get("cascading").await.expect("still there");
    assert!(still.finalizers().iter().any(|f| f == "foregroundDeletion"));
}

/// The comparison behind the controller's repair and `status` (issue #10):
/// every object cascade-guard compiles, as the real API server would store it
/// (a server-side dry run fills in its defaults), compares equal, and the same
/// object with a field someone added or changed compares different, naming
/// the field.
#[tokio::test]
async fn compiled_objects_compare_equal_as_stored_and_anything_added_differs() {
    use cascade_guard::policy::admission::compile_with_names;
    use cascade_guard::policy::drift::first_difference;
    use cascade_guard::policy::{Policy, ProtectedKind, Scope as KindScope, Source};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    let env = env().await;
    let client = env.cp.admin().await.expect("admin");
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let selector = LabelSelector {
        match_labels: Some(BTreeMap::from([("tier".to_string(), "prod".to_string())])),
        match_expressions: None,
    };
    let rule = json!({"apiGroups": ["other.example.org"], "apiVersions": ["*"],
        "operations": ["DELETE"], "resources": ["others"]});
    // (what, where, value, the path first_difference must name)
    let policy_edits = [
        (
            "namespaceSelector",
            "/spec/matchConstraints/namespaceSelector",
            json!({"matchLabels": {"team": "a"}}),
            "spec.matchConstraints.namespaceSelector",
        ),
        (
            "objectSelector",
            "/spec/matchConstraints/objectSelector",
            json!({"matchExpressions": [{"key": "k", "operator": "DoesNotExist"}]}),
            "spec.matchConstraints.objectSelector",
        ),
        (
            "excludeResourceRules",
            "/spec/matchConstraints/excludeResourceRules",
            json!([rule.clone()]),
            "spec.matchConstraints.excludeResourceRules",
        ),
        (
            "failurePolicy",
            "/spec/failurePolicy",
            json!("Ignore"),
            "spec.failurePolicy",
        ),
        (
            "matchPolicy",
            "/spec/matchConstraints/matchPolicy",
            json!("Equivalent"),
            "spec.matchConstraints.matchPolicy",
        ),
        (
            "a match condition",
            "/spec/matchConditions",
            json!([{"name": "never", "expression": "false"}]),
            "spec.matchConditions",
        ),
    ];
    let binding_edits = [
        (
            "objectSelector",
            "/spec/matchResources/objectSelector",
            json!({"matchLabels": {"nothing": "here"}}),
            "spec.matchResources.objectSelector",
        ),
        (
            "namespaceSelector",
            "/spec/matchResources/namespaceSelector",
            json!({"matchLabels": {"team": "a"}}),
            "spec.matchResources.namespaceSelector",
        ),
        (
            "excludeResourceRules",
            "/spec/matchResources/excludeResourceRules",
            json!([rule]),
            "spec.matchResources.excludeResourceRules",
        ),
        (
            "an action",
            "/spec/validationActions",
            json!(["Audit"]),
            "spec.validationActions",
        ),
        (
            "matchPolicy",
            "/spec/matchResources/matchPolicy",
            json!("Equivalent"),
            "spec.matchResources.matchPolicy",
        ),
        (
            "resourceRules",
            "/spec/matchResources/resourceRules",
            json!([rule]),
            "spec.matchResources.resourceRules",
        ),
    ];
    let set = |object: &serde_json::Value, pointer: &str, value: &serde_json::Value| {
        let mut object = object.clone();
        let (parent, key) = pointer.rsplit_once('/').expect("pointer");
        object.pointer_mut(parent).expect("parent")[key] = value.clone();
        object
    };
    let mut checked = 0;
    let mut failures = Vec::new();
    let mut compiled_sets = Vec::new();
    for (i, (mode, shape, scope, selector)) in [
        (
            Mode::Refuse,
            Shape::CompositeResource,
            KindScope::Namespaced,
            None,
        ),
        (
            Mode::Refuse,
            Shape::Other,
            KindScope::Cluster,
            Some(selector.clone()),
        ),
        (
            Mode::Warn,
            Shape::CompositeResource,
            KindScope::Namespaced,
            Some(selector.clone()),
        ),
        (
            Mode::Convert,
            Shape::CompositeResource,
            KindScope::Unknown,
            None,
        ),
        (Mode::Convert, Shape::Other, KindScope::Namespaced, None),
    ]
    .into_iter()
    .enumerate()
    {
        let policy = Policy {
            kind: ProtectedKind {
                group: "oracle.example.org".into(),
                kind: "Oracle".into(),
                plural: "oracles".into(),
                scope,
                shape,
            },
            mode,
            selector,
            source: Source::CascadePolicy {
                name: format!("oracle-{i}"),
            },
        };
        let (compiled, _) = compile_with_names(&[policy], &CompileSettings::default());
        compiled_sets.extend(compiled);
    }
    // The pair XRDs share: several kinds, groups and scopes in one object,
    // renamed so as not to meet the controller's own.
    let xrd_kind = |kind: &str, group: &str, scope| Policy {
        kind: ProtectedKind {
            group: group.into(),
            kind: kind.into(),
            plural: format!("{}s", kind.to_lowercase()),
            scope,
            shape: Shape::CompositeResource,
        },
        mode: Mode::Refuse,
        selector: None,
        source: Source::Xrd {
            name: format!("{}s.{group}", kind.to_lowercase()),
            annotated: true,
            claim: false,
        },
    };
    let shared = [
        xrd_kind("Alpha", "oracle.example.org", KindScope::Cluster),
        xrd_kind("Beta", "oracle.example.org", KindScope::Cluster),
        xrd_kind("Gamma", "other.oracle.example.org", KindScope::Namespaced),
    ];
    for mut c in compile_with_names(&shared, &CompileSettings::default()).0 {
        let name = format!("oracle-{}", c.policy.name_any());
        c.policy.metadata.name = Some(name.clone());
        c.binding.metadata.name = Some(name.clone());
        c.binding.spec.policy_name = name;
        compiled_sets.push(c);
    }
    {
        for compiled in compiled_sets {
            let name = compiled.policy.name_any();
            let desired = serde_json::to_value(&compiled.policy).expect("json");
            let stored = policies
                .create(&dry_run, &compiled.policy)
                .await
                .unwrap_or_else(|e| panic!("{name} refused: {e}"));
            let stored = serde_json::to_value(&stored).expect("json");
            if let Some(path) = first_difference(&desired, &stored) {
                failures.push(format!("{name} as stored differs at {path}:\n{stored:#}"));
            }
            for (what, pointer, value, want) in &policy_edits {
                let edited: ValidatingAdmissionPolicy =
                    serde_json::from_value(set(&desired, pointer, value)).expect("edited");
                let stored = policies
                    .create(&dry_run, &edited)
                    .await
                    .unwrap_or_else(|e| panic!("{name} with {what} refused: {e}"));
                let got = first_difference(&desired, &serde_json::to_value(&stored).expect("json"));
                // A replaced list is named down to its first differing element.
                if !got.as_deref().is_some_and(|p| p.starts_with(want)) {
                    failures.push(format!("{name} with {what}: {got:?}"));
                }
                checked += 1;
            }
            let desired = serde_json::to_value(&compiled.binding).expect("json");
            let stored = bindings
                .create(&dry_run, &compiled.binding)
                .await
                .unwrap_or_else(|e| panic!("binding {name} refused: {e}"));
            let stored = serde_json::to_value(&stored).expect("json");
            if let Some(path) = first_difference(&desired, &stored) {
                failures.push(format!(
                    "binding {name} as stored differs at {path}:\n{stored:#}"
                ));
            }
            for (what, pointer, value, want) in &binding_edits {
                let edited: ValidatingAdmissionPolicyBinding =
                    serde_json::from_value(set(&desired, pointer, value)).expect("edited");
                let stored = bindings
                    .create(&dry_run, &edited)
                    .await
                    .unwrap_or_else(|e| panic!("binding {name} with {what} refused: {e}"));
                let got = first_difference(&desired, &serde_json::to_value(&stored).expect("json"));
                if !got.as_deref().is_some_and(|p| p.starts_with(want)) {
                    failures.push(format!("binding {name} with {what}: {got:?}"));
                }
                checked += 1;
            }
        }
    }
    assert_eq!(checked, (5 * 2 + 2) * (6 + 6));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A second typo in an XRD's mode gets an Event quoting it, not the first
/// typo again (issue #10).
#[tokio::test]
async fn unknown_mode_events_quote_the_current_value() {
    let env = env().await;
    let c = env.cp.admin().await.expect("admin");
    let xrds = xrd_api(&c);
    let name = format!("typos.{GROUP}");
    create(&xrds, xrd("Typo", "typos", Some("Refuze"))).await;
    let quoted = |value: &'static str| {
        let c = c.clone();
        let name = name.clone();
        async move {
            wait::until(Duration::from_secs(30), || async {
                events_about(&c, &name)
                    .await
                    .iter()
                    .any(|(reason, note)| reason == "UnknownMode" && note.contains(value))
                    .then_some(())
            })
            .await
            .is_some()
        }
    };
    assert!(quoted("\"Refuze\"").await, "no event about the first typo");
    xrds.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"annotations": {"cascade-guard.dev/deletion-policy": "Ofv"}}}),
        ),
    )
    .await
    .expect("second typo");
    assert!(
        quoted("\"Ofv\"").await,
        "no event quoting the second typo: {:?}",
        events_about(&c, &name).await
    );
    xrds.delete(&name, &DeleteParams::default())
        .await
        .expect("delete XRD");
}

/// Break-glass is behind RBAC: a user who may delete and annotate the object
/// but may not `use` breakglass.cascade-guard.dev is refused even with the
/// annotation, and told what is missing; with that permission (the chart's
/// break-glass ClusterRole) the same delete goes through.
#[tokio::test]
async fn break_glass_counts_only_for_users_allowed_to_use_it() {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let env = env().await;
    let s = Scope::new(&env.cp, "break-glass-rbac").await;
    let user = format!("oncall-{}", s.namespace);
    let resource = REFUSE.resource();
    let roles: Api<Role> = Api::namespaced(s.client.clone(), &s.namespace);
    roles
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "delete-and-annotate"},
                "rules": [{"apiGroups": [GROUP], "resources": [REFUSE.plural],
                    "verbs": ["get", "list", "patch", "update", "delete"]}]
            }))
            .expect("role"),
        )
        .await
        .expect("create role");
    Api::<RoleBinding>::namespaced(s.client.clone(), &s.namespace)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "delete-and-annotate"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "delete-and-annotate"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
            }))
            .expect("binding"),
        )
        .await
        .expect("create binding");
    let admin_xrs: Api<DynamicObject> =
        Api::namespaced_with(s.client.clone(), &s.namespace, &resource);
    admin_xrs
        .create(&PostParams::default(), &composite(&resource, "glass", true))
        .await
        .expect("create");
    let client = env.cp.client_as(&user, &[]).await.expect("client");
    let xrs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &s.namespace, &resource);
    xrs.patch(
        "glass",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {
            "cascade-guard.dev/break-glass": "cluster already gone"}}})),
    )
    .await
    .expect("the user may annotate");

    let background = DeleteSpec {
        dry_run: true,
        ..DeleteSpec::propagation("Background")
    };
    let refused = delete(&client, &resource, &s.namespace, "glass", &background).await;
    assert_eq!(refused.code, 403, "{refused:?}");
    assert!(
        refused.message.contains("may not use break-glass")
            && refused
                .message
                .contains("use on breakglass.cascade-guard.dev"),
        "{}",
        refused.message
    );

    let name = format!("break-glass-{}", s.namespace);
    Api::<ClusterRole>::all(s.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": name},
                "rules": [{"apiGroups": ["cascade-guard.dev"], "resources": ["breakglass"], "verbs": ["use"]}]
            }))
            .expect("cluster role"),
        )
        .await
        .expect("create cluster role");
    Api::<ClusterRoleBinding>::all(s.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
            }))
            .expect("cluster role binding"),
        )
        .await
        .expect("create cluster role binding");
    let allowed = wait::until(Duration::from_secs(30), || async {
        delete(&client, &resource, &s.namespace, "glass", &background)
            .await
            .allowed()
            .then_some(())
    })
    .await;
    assert!(allowed.is_some(), "still refused with the permission");
}

/// A legacy XRD's claims, under Refuse: a claim's own propagation does not
/// reach its composite resource (Crossplane deletes that as
/// `spec.compositeDeletePolicy` says, Background unless it says Foreground), so
/// the claim's delete is judged on that. The API server agrees with the
/// decision table for each claim state, propagation and requester, a refusal
/// gives the commands that work, and they do.
#[tokio::test]
async fn a_claim_is_refused_unless_it_deletes_its_composite_in_the_foreground() {
    let env = env().await;
    let s = Scope::new(&env.cp, "claims").await;
    let c = &s.client;
    let mut legacy = xrd("XClaimedApp", "xclaimedapps", Some("Refuse"));
    legacy["apiVersion"] = json!("apiextensions.crossplane.io/v1");
    legacy["spec"]["scope"] = json!("LegacyCluster");
    legacy["spec"]["claimNames"] = json!({"kind": "ClaimedApp", "plural": "claimedapps"});
    let v1_xrds: Api<DynamicObject> = Api::all_with(
        c.clone(),
        &ApiResource {
            group: "apiextensions.crossplane.io".into(),
            version: "v1".into(),
            api_version: "apiextensions.crossplane.io/v1".into(),
            kind: "CompositeResourceDefinition".into(),
            plural: "compositeresourcedefinitions".into(),
        },
    );
    create(&v1_xrds, legacy).await;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(c.clone());
    let _ = crds
        .create(
            &PostParams::default(),
            &schemaless_crd("ClaimedApp", "claimedapps", "claimedapp"),
        )
        .await;
    let resource = ApiResource {
        group: GROUP.into(),
        version: "v1".into(),
        api_version: format!("{GROUP}/v1"),
        kind: "ClaimedApp".into(),
        plural: "claimedapps".into(),
    };
    let claims: Api<DynamicObject> = Api::namespaced_with(c.clone(), &s.namespace, &resource);
    let bound =
        json!({"apiVersion": format!("{GROUP}/v1"), "kind": "XClaimedApp", "name": "bound-x"});
    // (name, spec): unbound, bound in the default way, bound and Foreground.
    let states = [
        ("unbound", json!({})),
        ("background", json!({"resourceRef": bound})),
        (
            "foreground",
            json!({"resourceRef": bound, "compositeDeletePolicy": "Foreground"}),
        ),
    ];
    let stored = wait::until(Duration::from_secs(60), || async {
        let mut stored = Vec::new();
        for (name, spec) in &states {
            let object = json!({"apiVersion": format!("{GROUP}/v1"), "kind": "ClaimedApp",
                "metadata": {"name": name}, "spec": spec});
            let o = claims
                .patch(
                    name,
                    &PatchParams::apply("test").force(),
                    &Patch::Apply(&object),
                )
                .await
                .ok()?;
            stored.push(o);
        }
        Some(stored)
    })
    .await
    .expect("the claim CRD never served");
    // The controller compiled the claim policy once a bound claim's plain
    // delete is refused.
    let protected = wait::until(Duration::from_secs(60), || async {
        let got = delete(
            c,
            &resource,
            &s.namespace,
            "background",
            &DeleteSpec::dry_run_background(),
        )
        .await;
        (got.code == 403).then_some(())
    })
    .await;
    assert!(
        protected.is_some(),
        "claims never protected:\n{}",
        env.cp.log_tails(30)
    );

    let settings = CompileSettings::default();
    let mut mismatches = Vec::new();
    let mut cells = 0;
    for r in REQUESTERS {
        let client = as_user(&env.cp, r.username).await;
        for object in &stored {
            let name = object.name_any();
            let value = serde_json::to_value(object).expect("json");
            for (label, propagation, orphan) in POLICIES {
                cells += 1;
                let spec = DeleteSpec {
                    propagation,
                    orphan_dependents: orphan,
                    uid: r.sends_uid.then(|| object.uid().unwrap_or_default()),
                    dry_run: true,
                };
                let got = delete(&client, &resource, &s.namespace, &name, &spec).await;
                let expected = decide(
                    Mode::Refuse,
                    Shape::Claim,
                    &settings,
                    &spec.as_request(r.username, ObjectState::from_object(&value, Shape::Claim)),
                );
                let cell = format!("{name} / {} / {label}", r.label);
                if got.allowed() != expected.allowed {
                    mismatches.push(format!(
                        "{cell}: API server {} ({}), table says {expected:?}",
                        got.code, got.message
                    ));
                }
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {cells} cells disagree:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );

    // Even a foreground delete of the claim is refused, saying what works.
    let refused = delete(
        c,
        &resource,
        &s.namespace,
        "background",
        &DeleteSpec::propagation("Foreground"),
    )
    .await;
    let target = format!("claimedapps.{GROUP} background -n {}", s.namespace);
    let patch = format!(
        "kubectl patch {target} --type merge -p '{{\"spec\":{{\"compositeDeletePolicy\":\"Foreground\"}}}}' && kubectl delete {target}"
    );
    assert_eq!(refused.code, 403, "{}", refused.message);
    assert!(refused.message.contains(&patch), "{}", refused.message);
    // And the commands work: the claim patched, its plain delete goes through.
    claims
        .patch(
            "background",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"compositeDeletePolicy": "Foreground"}})),
        )
        .await
        .expect("patch the claim");
    let plain = delete(
        c,
        &resource,
        &s.namespace,
        "background",
        &DeleteSpec::default(),
    )
    .await;
    assert!(plain.allowed(), "{} {}", plain.code, plain.message);
}

/// `--hold-composed` under faults. With the controller down, Crossplane's
/// delete of a held composed object is let through and nothing goes early:
/// the object waits on cascade-guard's finalizer, its dependent untouched,
/// until a controller is back and makes it a foreground cascade. A
/// controller started without `--hold-composed` lets go of the composed
/// objects held before (no finalizer is left behind), and Crossplane's plain
/// delete of one is then refused again, as Refuse refuses it.
#[tokio::test]
async fn with_hold_composed_a_delete_while_the_controller_is_down_waits_and_turning_it_off_lets_go()
{
    let env = bare_with(options()).await;
    let _stop = env.controllers_stop_on_drop();
    let first = env.start_controller(&["--hold-composed"]);
    let admin = env.cp.admin().await.expect("admin client");
    let resource = REFUSE.resource();
    env.wait_for_protection(&admin, &resource).await;
    let s = Scope::new(&env.cp, "hold-composed-faults").await;
    let ns = s.namespace.clone();
    let scene = Composing::new(&s, &resource).await;
    let (timeline, maps, xrs) = (&scene.timeline, &scene.maps, &scene.xrs);
    for name in ["down", "kept"] {
        scene.composed(&s, &resource, name).await;
        wait_held(&s.client, &resource, &ns, name).await;
    }

    env.kill_controller(first);
    let crossplane = as_user(&env.cp, DEFAULT_CROSSPLANE_USER).await;
    let deleted = delete(&crossplane, &resource, &ns, "down", &plain(false)).await;
    assert!(
        deleted.allowed(),
        "Crossplane's delete of a held object: {deleted:?}"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let waiting = xrs.get("down").await.expect("still there");
    assert!(
        waiting.metadata.deletion_timestamp.is_some()
            && !waiting
                .finalizers()
                .iter()
                .any(|f| f == "foregroundDeletion"),
        "with no controller the delete is not converted: {:?}",
        waiting.finalizers()
    );
    let dependent = maps.get("down-0").await.expect("the dependent");
    assert!(
        dependent.metadata.deletion_timestamp.is_none(),
        "the dependent went while nothing cascaded"
    );

    let _provider = Provider::start(s.client.clone(), ns.clone(), Duration::from_secs(2));
    let second = env.start_controller(&["--hold-composed"]);
    timeline
        .wait_gone(&resource.kind, "down", Duration::from_secs(90))
        .await;
    assert_foreground(timeline, &resource.kind, "down", 1);

    env.stop_controller(second);
    env.start_controller(&[]);
    let let_go = wait::until(Duration::from_secs(90), || async {
        let kept = xrs.get("kept").await.ok()?;
        (!kept
            .finalizers()
            .iter()
            .any(|f| f == FOREGROUND_CASCADE_FINALIZER))
        .then_some(())
    })
    .await;
    assert!(
        let_go.is_some(),
        "a controller without --hold-composed kept the composed object held"
    );
    let refused = delete(&crossplane, &resource, &ns, "kept", &plain(true)).await;
    assert!(
        !refused.allowed(),
        "Crossplane's plain delete of an object no longer held: {refused:?}"
    );
}
