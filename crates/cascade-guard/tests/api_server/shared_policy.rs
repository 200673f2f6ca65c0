//! The admission objects every XRD of one mode and shape shares, on the real
//! control plane: one failed write or one deleted object now takes many kinds'
//! protection at once, so each test here is about what keeps that from
//! lasting or going unseen. The restore after someone deletes or edits a
//! shared object, `cascade-guard status` naming every kind a missing one
//! leaves unguarded, and a kind changing mode never being in neither pair.
//!
//! A control plane of this binary's own: the tests delete and edit the shared
//! Refuse pair, which would open a gap in every other test's kinds. They run
//! one at a time.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use cascade_guard_testkit::*;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    WatchEvent, WatchParams,
};
use kube::{Api, Client, ResourceExt};
use local_cluster::testing::Scope;
use local_cluster::wait;
use serde_json::{Value, json};
use tokio::sync::{Mutex, MutexGuard, OnceCell};

const REFUSE_PAIR: &str = "cascade-guard-xrds-refuse-composite";
const CONVERT_PAIR: &str = "cascade-guard-xrds-convert-composite";
const MANAGED: &str = "app.kubernetes.io/managed-by=cascade-guard";

/// Every kind the shared Refuse pair carries at the start: annotated Refuse,
/// defaulted to Refuse, or with an annotation that reads as Refuse.
const REFUSE_KINDS: [&TestKind; 4] = [&REFUSE, &DEFAULTED, &HOSTILE, &TOGGLED];

struct Own {
    env: Env,
    one_at_a_time: Mutex<()>,
}

/// This binary's control plane with cascade-guard running, and the lock
/// each test holds while it runs.
async fn own() -> (&'static Env, MutexGuard<'static, ()>) {
    static OWN: OnceCell<Own> = OnceCell::const_new();
    let own = OWN
        .get_or_init(|| async {
            let env = bare_with(options()).await;
            env.start_controller(&[]);
            let client = env.cp.admin().await.expect("admin client");
            for k in REFUSE_KINDS {
                env.wait_for_protection(&client, &k.resource()).await;
            }
            Own {
                env,
                one_at_a_time: Mutex::new(()),
            }
        })
        .await;
    let guard = own.one_at_a_time.lock().await;
    // A test that failed with the controller stopped leaves none running.
    if !own.env.any_controller_running() {
        own.env.start_controller(&[]);
    }
    (&own.env, guard)
}

/// Whether a dry-run Background delete of an object with something to
/// cascade is refused, for each kind.
async fn refused_each(client: &Client, kinds: &[&TestKind]) -> Vec<bool> {
    let mut out = Vec::new();
    for k in kinds {
        let outcome = delete(
            client,
            &k.resource(),
            "protection-probe",
            &format!("probe-{}", k.plural),
            &DeleteSpec::dry_run_background(),
        )
        .await;
        out.push(outcome.code == 403);
    }
    out
}

async fn all_refused(client: &Client, kinds: &[&TestKind]) -> bool {
    refused_each(client, kinds).await.iter().all(|r| *r)
}

/// Deleting the shared pair takes every kind in it; the controller puts it
/// back, and all of them are refused again. While the controller is down,
/// `cascade-guard status` names each kind the missing object leaves
/// unguarded.
#[tokio::test]
async fn a_deleted_shared_pair_is_restored_for_every_kind_and_status_names_the_gap() {
    let (env, _one) = own().await;
    let client = env.cp.admin().await.expect("admin");
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let carried = carried_kinds(&policies.get(REFUSE_PAIR).await.expect("shared policy"));
    for k in REFUSE_KINDS {
        assert!(
            carried.contains_key(&kind_key(k)),
            "{}: {carried:?}",
            k.kind
        );
    }

    // With the controller running: deleted, and back within about a second
    // (the API server's admission then takes up to a second more to load it).
    let old_uids = (
        policies.get(REFUSE_PAIR).await.expect("policy").uid(),
        bindings.get(REFUSE_PAIR).await.expect("binding").uid(),
    );
    let started = Instant::now();
    policies
        .delete(REFUSE_PAIR, &DeleteParams::default())
        .await
        .expect("delete policy");
    bindings
        .delete(REFUSE_PAIR, &DeleteParams::default())
        .await
        .expect("delete binding");
    let recreated = wait::until(Duration::from_secs(30), || async {
        let p = policies.get_opt(REFUSE_PAIR).await.ok()??;
        let b = bindings.get_opt(REFUSE_PAIR).await.ok()??;
        (p.uid() != old_uids.0 && b.uid() != old_uids.1).then_some(())
    })
    .await;
    let restored_after = started.elapsed();
    assert!(
        recreated.is_some(),
        "the shared pair was not written again:\n{}",
        env.cp.log_tails(20)
    );
    let back = wait::until(Duration::from_secs(30), || async {
        all_refused(&client, &REFUSE_KINDS).await.then_some(())
    })
    .await;
    assert!(
        back.is_some(),
        "not every kind of the shared pair was refused again:\n{}",
        env.cp.log_tails(20)
    );
    eprintln!(
        "shared Refuse pair deleted: written again after {} ms, all {} kinds refused after {} ms",
        restored_after.as_millis(),
        REFUSE_KINDS.len(),
        started.elapsed().as_millis()
    );

    // With no controller: the gap stays, and status shows all of it.
    let controllers = env.controllers_stop_on_drop();
    env.stop_controller(0);
    bindings
        .delete(REFUSE_PAIR, &DeleteParams::default())
        .await
        .expect("delete binding");
    let gap = wait::until(Duration::from_secs(15), || async {
        refused_each(&client, &REFUSE_KINDS)
            .await
            .iter()
            .all(|r| !r)
            .then_some(())
    })
    .await;
    assert!(
        gap.is_some(),
        "deleting the shared binding left a kind refused"
    );
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cascade-guard"))
        .arg("status")
        .arg(format!(
            "--kubeconfig={}",
            env.cp.kubeconfig_path().display()
        ))
        .args(["--xrd-default-mode=Refuse", "-o", "json"])
        .output()
        .expect("run status");
    let report: Value = serde_json::from_slice(&output.stdout).expect("status JSON");
    assert_eq!(report["admission"]["inSync"], false, "{report:#}");
    let missing: Vec<&Value> = report["admission"]["differences"]
        .as_array()
        .expect("differences")
        .iter()
        .filter(|d| d["name"] == REFUSE_PAIR && d["kind"] == "ValidatingAdmissionPolicyBinding")
        .collect();
    assert_eq!(missing.len(), 1, "{report:#}");
    let detail = missing[0]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.starts_with("unguarded until it is back: "),
        "{detail}"
    );
    for k in REFUSE_KINDS {
        assert!(
            detail.contains(&kind_key(k)),
            "{} not in {detail:?}",
            k.kind
        );
    }
    // Each kind's row still says where its policy comes from.
    let rows = report["protected"].as_array().expect("protected");
    let row = |k: &TestKind| {
        rows.iter()
            .find(|r| r["kind"] == kind_key(k))
            .unwrap_or_else(|| panic!("no row for {}", k.kind))
    };
    assert_eq!(row(&REFUSE)["source"], "XrdAnnotation");
    assert_eq!(row(&DEFAULTED)["source"], "Default");
    assert_eq!(row(&REFUSE)["from"], REFUSE.xrd_name());

    // Started again, it puts the binding back first thing.
    drop(controllers);
    let started = Instant::now();
    env.start_controller(&[]);
    let back = wait::until(Duration::from_secs(60), || async {
        all_refused(&client, &REFUSE_KINDS).await.then_some(())
    })
    .await;
    assert!(back.is_some(), "not restored after a restart");
    eprintln!(
        "controller started with the shared binding missing: all kinds refused after {} ms",
        started.elapsed().as_millis()
    );
}

/// Edits that take one kind out of a shared object, or all of them, are
/// taken back; so are fields someone adds that turn protection off.
#[tokio::test]
async fn edits_of_a_shared_pair_are_taken_back() {
    let (env, _one) = own().await;
    let client = env.cp.admin().await.expect("admin");
    let s = Scope::new(&env.cp, "edits").await;
    let c = &s.client;
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(c.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(c.clone());
    let refused = || async { all_refused(&client, &REFUSE_KINDS).await };
    assert!(refused().await);

    // The binding given rules of its own, every kind but one: that kind is
    // unguarded until the controller takes them away again (its bindings
    // match what their policies do).
    let policy = policies.get(REFUSE_PAIR).await.expect("policy");
    let mut rules = serde_json::to_value(
        policy
            .spec
            .as_ref()
            .and_then(|s| s.match_constraints.as_ref())
            .and_then(|m| m.resource_rules.clone())
            .expect("rules"),
    )
    .expect("rules");
    for rule in rules.as_array_mut().expect("rules") {
        if let Some(resources) = rule["resources"].as_array_mut() {
            resources.retain(|r| r != REFUSE.plural);
        }
    }
    bindings
        .patch(
            REFUSE_PAIR,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"matchResources": {"resourceRules": rules}}})),
        )
        .await
        .expect("take a kind out");
    let back = wait::until(Duration::from_secs(30), || async {
        let b = bindings.get(REFUSE_PAIR).await.ok()?;
        let unnarrowed = b
            .spec
            .match_resources
            .is_none_or(|m| m.resource_rules.is_none_or(|r| r.is_empty()));
        (unnarrowed && refused().await).then_some(())
    })
    .await;
    assert!(
        back.is_some(),
        "a kind taken out of the shared binding was not put back:\n{}",
        env.cp.log_tails(20)
    );

    // Deny turned into Warn: put back.
    bindings
        .patch(
            REFUSE_PAIR,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"validationActions": ["Warn"]}})),
        )
        .await
        .expect("edit binding");
    let back = wait::until(Duration::from_secs(30), || async {
        let b = bindings.get(REFUSE_PAIR).await.ok()?;
        (b.spec.validation_actions == vec!["Deny".to_string()] && refused().await).then_some(())
    })
    .await;
    assert!(back.is_some(), "not restored after an edit");

    // An objectSelector on the binding that selects nothing, a
    // namespaceSelector and an excludeResourceRules on the policy that leave
    // this namespace out (issue #10).
    let nothing = json!({"matchLabels": {"nothing": "here"}});
    bindings
        .patch(
            REFUSE_PAIR,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"matchResources": {"objectSelector": nothing}}})),
        )
        .await
        .expect("add an objectSelector");
    let back = wait::until(Duration::from_secs(30), || async {
        let b = bindings.get(REFUSE_PAIR).await.ok()?;
        let selector = b.spec.match_resources?.object_selector;
        (selector.is_none_or(|s| s.match_labels.is_none()) && refused().await).then_some(())
    })
    .await;
    assert!(
        back.is_some(),
        "an added objectSelector was not taken back:\n{}",
        env.cp.log_tails(20)
    );
    let excluded = json!({"apiGroups": [GROUP], "apiVersions": ["*"], "operations": ["DELETE"],
        "resources": [REFUSE.plural], "scope": "*"});
    policies
        .patch(
            REFUSE_PAIR,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"matchConstraints": {
                "namespaceSelector": nothing,
                "excludeResourceRules": [excluded],
            }}})),
        )
        .await
        .expect("add a namespaceSelector and excludeResourceRules");
    let back = wait::until(Duration::from_secs(30), || async {
        let p = policies.get(REFUSE_PAIR).await.ok()?;
        let m = p.spec?.match_constraints?;
        let selector_gone = m
            .namespace_selector
            .is_none_or(|s| s.match_labels.is_none());
        let excluded_gone = m.exclude_resource_rules.is_none_or(|r| r.is_empty());
        (selector_gone && excluded_gone && refused().await).then_some(())
    })
    .await;
    assert!(
        back.is_some(),
        "added namespaceSelector or excludeResourceRules not taken back:\n{}",
        env.cp.log_tails(20)
    );
}

/// The plurals a DELETE object's rules name (none for an UPDATE object).
fn delete_plurals(rules: Option<Value>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for rule in rules
        .as_ref()
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if rule["operations"][0] != "DELETE" {
            continue;
        }
        for r in rule["resources"].as_array().into_iter().flatten() {
            if let Some(r) = r.as_str() {
                out.insert(r.to_string());
            }
        }
    }
    out
}

/// What a shared DELETE object names: the plurals of its rules, or None
/// for a binding without rules (it matches what its policy does).
type Names = Option<BTreeSet<String>>;

/// One change to an object: its resourceVersion (etcd's revision, one
/// counter for policies and bindings alike), its name, and what it names
/// after the change (None: deleted).
type Change = (u64, String, Option<Names>);

/// Every change to the shared DELETE objects of one type from `rv` on,
/// until `until` resolves.
async fn record<K>(
    api: &Api<K>,
    rv: &str,
    rules: fn(&K) -> Option<Value>,
    until: Duration,
) -> Vec<Change>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let mut out = Vec::new();
    let params = WatchParams::default()
        .labels(MANAGED)
        .timeout(until.as_secs() as u32);
    let mut stream = api.watch(&params, rv).await.expect("watch").boxed();
    let revision = |o: &K| {
        o.meta()
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
            .expect("a numeric resourceVersion")
    };
    while let Ok(Some(event)) = stream.try_next().await {
        match event {
            WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                out.push((revision(&o), o.name_any(), Some(names(rules(&o)))))
            }
            WatchEvent::Deleted(o) => out.push((revision(&o), o.name_any(), None)),
            WatchEvent::Bookmark(_) | WatchEvent::Error(_) => {}
        }
    }
    out
}

fn names(rules: Option<Value>) -> Names {
    rules.map(|r| delete_plurals(Some(r)))
}

/// Whether `plural` is guarded: some policy names it and its binding
/// exists and, if it has rules, names it too.
fn guarded(
    policies: &BTreeMap<String, Names>,
    bindings: &BTreeMap<String, Names>,
    plural: &str,
) -> bool {
    policies.iter().any(|(name, p)| {
        p.as_ref().is_some_and(|p| p.contains(plural))
            && bindings
                .get(name)
                .is_some_and(|b| b.as_ref().is_none_or(|b| b.contains(plural)))
    })
}

/// Replays the policies' and bindings' changes, merged in the order etcd
/// took them, over the objects as they were listed: after each, `plural`
/// must still be guarded.
fn never_in_neither(
    mut policies: BTreeMap<String, Names>,
    mut bindings: BTreeMap<String, Names>,
    policy_changes: &[Change],
    binding_changes: &[Change],
    plural: &str,
) -> Result<(), String> {
    let mut merged: Vec<(u64, bool, &String, &Option<Names>)> = policy_changes
        .iter()
        .map(|(rv, n, c)| (*rv, true, n, c))
        .chain(binding_changes.iter().map(|(rv, n, c)| (*rv, false, n, c)))
        .collect();
    merged.sort_by_key(|(rv, ..)| *rv);
    for (rv, is_policy, name, change) in merged {
        let objects = if is_policy {
            &mut policies
        } else {
            &mut bindings
        };
        match change {
            Some(n) => objects.insert(name.clone(), n.clone()),
            None => objects.remove(name),
        };
        if !guarded(&policies, &bindings, plural) {
            return Err(format!(
                "after revision {rv} ({name}) {plural} is guarded by no DELETE pair: policies {policies:?}, bindings {bindings:?}"
            ));
        }
    }
    Ok(())
}

fn policy_rules(p: &ValidatingAdmissionPolicy) -> Option<Value> {
    serde_json::to_value(
        p.spec
            .as_ref()?
            .match_constraints
            .as_ref()?
            .resource_rules
            .as_ref()?,
    )
    .ok()
}

fn binding_rules(b: &ValidatingAdmissionPolicyBinding) -> Option<Value> {
    serde_json::to_value(b.spec.match_resources.as_ref()?.resource_rules.as_ref()?)
        .ok()
        .filter(|r| r.as_array().is_some_and(|a| !a.is_empty()))
}

/// A kind whose XRD changes mode moves from one shared pair to the other; it
/// joins the new one before it leaves the old, so that at no point (in the
/// order etcd took the writes) is it in neither.
#[tokio::test]
async fn a_kind_changing_mode_is_never_in_neither_shared_pair() {
    let (env, _one) = own().await;
    let client = env.cp.admin().await.expect("admin");
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let xrds = xrd_api(&client);
    let annotate = |value: &str| json!({"metadata": {"annotations": {"cascade-guard.dev/deletion-policy": value}}});
    for (from, to, joins) in [
        ("Refuse", "Convert", CONVERT_PAIR),
        ("Convert", "Refuse", REFUSE_PAIR),
    ] {
        let listed_policies = policies
            .list(&ListParams::default().labels(MANAGED))
            .await
            .expect("list policies");
        let listed_bindings = bindings
            .list(&ListParams::default().labels(MANAGED))
            .await
            .expect("list bindings");
        let policy_start: BTreeMap<String, Names> = listed_policies
            .items
            .iter()
            .map(|p| (p.name_any(), names(policy_rules(p))))
            .collect();
        let binding_start: BTreeMap<String, Names> = listed_bindings
            .items
            .iter()
            .map(|b| (b.name_any(), names(binding_rules(b))))
            .collect();
        assert!(
            guarded(&policy_start, &binding_start, TOGGLED.plural),
            "{from}: {policy_start:?} {binding_start:?}"
        );
        let policy_rv = listed_policies.metadata.resource_version.expect("rv");
        let binding_rv = listed_bindings.metadata.resource_version.expect("rv");
        let watch = Duration::from_secs(10);
        let recording = tokio::join!(
            record(&policies, &policy_rv, policy_rules, watch),
            record(&bindings, &binding_rv, binding_rules, watch),
            async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                xrds.patch(
                    &TOGGLED.xrd_name(),
                    &PatchParams::default(),
                    &Patch::Merge(annotate(to)),
                )
                .await
                .expect("change the mode");
            }
        );
        let (policy_changes, binding_changes, ()) = recording;
        // The kind did move, to a pair whose binding has no rules of its
        // own (it matches what its policy does), as every binding.
        let joined = policy_changes.iter().any(|(_, n, p)| {
            n == joins
                && p.as_ref()
                    .is_some_and(|p| p.as_ref().is_some_and(|p| p.contains(TOGGLED.plural)))
        });
        assert!(joined, "{from} -> {to}: {policy_changes:?}");
        assert!(
            binding_start
                .values()
                .chain(binding_changes.iter().filter_map(|(_, _, b)| b.as_ref()))
                .all(Option::is_none),
            "{from} -> {to}: a binding with rules: {binding_start:?} {binding_changes:?}"
        );
        never_in_neither(
            policy_start,
            binding_start,
            &policy_changes,
            &binding_changes,
            TOGGLED.plural,
        )
        .unwrap_or_else(|e| panic!("{from} -> {to}: {e}"));
    }
    // Back in Refuse, as the other tests expect.
    env.wait_for_protection(&client, &TOGGLED.resource()).await;
}

/// The shared objects follow the XRD annotation: a kind turned Off leaves
/// the pair (which stays for the others), comes back with Refuse, and says
/// so when its mode comes from the default.
#[tokio::test]
async fn a_kind_leaves_and_rejoins_the_shared_pair_with_its_xrd() {
    let (env, _one) = own().await;
    let s = Scope::new(&env.cp, "sync").await;
    let c = &s.client;
    let resource: ApiResource = TOGGLED.resource();
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(c.clone());
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
    let others = [&REFUSE, &DEFAULTED, &HOSTILE];
    env.wait_for_protection(c, &resource).await;
    let carried = || async {
        let p = policies.get(REFUSE_PAIR).await.ok()?;
        Some(carried_kinds(&p))
    };

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
        let kinds = carried().await?;
        (!kinds.contains_key(&kind_key(&TOGGLED)) && !refused().await).then_some(())
    })
    .await;
    assert!(off.is_some(), "Off did not take effect");
    assert!(
        all_refused(c, &others).await,
        "the other kinds of the shared pair lost their protection"
    );

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
    // The controller has seen the change once the shared policy says the
    // kind's mode now comes from the default; only then does "still
    // refused" show anything.
    let seen = wait::until(Duration::from_secs(30), || async {
        let kinds = carried().await?;
        (kinds.get(&kind_key(&TOGGLED))?["modeFrom"] == "xrd-default-mode").then_some(())
    })
    .await;
    assert!(
        seen.is_some(),
        "the controller never took the annotation's removal in:\n{}",
        env.cp.log_tails(20)
    );
    assert!(refused().await, "removing the annotation lifted protection");
    xrds.patch(
        &TOGGLED.xrd_name(),
        &PatchParams::default(),
        &Patch::Merge(annotate(Some("Refuse"))),
    )
    .await
    .expect("annotate Refuse again");
}
