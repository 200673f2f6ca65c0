//! The API server's type check of cascade-guard's admission policies, as
//! kube-controller-manager's validatingadmissionpolicy-status-controller
//! records it in `status.typeChecking`, on the real control plane: what
//! cascade-guard compiles type-checks cleanly, and a policy that does not is
//! reported (Event, metric, `cascade-guard status`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cascade_guard::cluster::type_check::TypeCheck;
use cascade_guard::controller::sync::type_check;
use cascade_guard::controller::telemetry::Metrics;
use cascade_guard::policy::Source;
use cascade_guard_testkit::*;
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::events::{Recorder, Reporter};
use kube::{Api, Client, ResourceExt};
use local_cluster::wait;
use serde_json::json;

const MANAGED: &str = "app.kubernetes.io/managed-by=cascade-guard";

/// The managed policy whose name contains `part`, once the API server has
/// type-checked its current generation.
async fn checked_policy(client: &Client, part: &str) -> (ValidatingAdmissionPolicy, TypeCheck) {
    let api: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let found = wait::until(Duration::from_secs(60), || async {
        let list = api
            .list(&ListParams::default().labels(MANAGED))
            .await
            .ok()?;
        // A CascadePolicy's by its name; a kind's XRD shares its DELETE
        // policy, found by the plural in its rules.
        let policy = list
            .items
            .into_iter()
            .find(|p| p.name_any().contains(part) || delete_rule_naming(p, part).is_some())?;
        let check = TypeCheck::of(&policy);
        (check != TypeCheck::Pending).then_some((policy, check))
    })
    .await;
    found.unwrap_or_else(|| panic!("no type-checked policy named *{part}* within 60 s"))
}

/// The index of the DELETE rule of `policy` that names `plural`.
fn delete_rule_naming(policy: &ValidatingAdmissionPolicy, plural: &str) -> Option<usize> {
    let rules = policy
        .spec
        .as_ref()?
        .match_constraints
        .as_ref()?
        .resource_rules
        .as_ref()?;
    rules.iter().position(|r| {
        r.operations
            .as_ref()
            .is_some_and(|o| o.iter().any(|o| o == "DELETE"))
            && r.resources
                .as_ref()
                .is_some_and(|rs| rs.iter().any(|x| x == plural))
    })
}

async fn condition(client: &Client, policy: &str, type_: &str) -> Option<(String, String)> {
    let p = cascade_policy_api(client).get(policy).await.ok()?;
    let conditions = p.data["status"]["conditions"].as_array()?.clone();
    let c = conditions.iter().find(|c| c["type"] == type_)?;
    Some((
        c["status"].as_str()?.to_string(),
        c["reason"].as_str()?.to_string(),
    ))
}

fn status_text(env: &Env) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cascade-guard"))
        .arg("status")
        .arg(format!(
            "--kubeconfig={}",
            env.cp.kubeconfig_path().display()
        ))
        .output()
        .expect("run cascade-guard status");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Everything cascade-guard compiles type-checks on this release; a policy
/// edited into one that does not is reported by `cascade-guard status` and by
/// the controller's reporting (a Warning Event on its XRD and a metric).
#[tokio::test]
async fn type_check_warnings_are_reported() {
    let env = bare_env().await;
    let _stop = env.controllers_stop_on_drop();
    let client = env.cp.admin().await.expect("admin client");
    let controller = env.start_controller(&[]);

    // What cascade-guard compiles, for an XR kind and a CascadePolicy kind.
    for part in [REFUSE.plural, "leaves"] {
        let (policy, check) = checked_policy(&client, part).await;
        assert_eq!(
            check,
            TypeCheck::Clean,
            "{} does not type-check: {:?}",
            policy.name_any(),
            policy.status
        );
    }
    // The controller placed the release among the proven ones.
    let log = std::fs::read_to_string(env.cp.log_path(&format!("cascade-guard-{controller}")))
        .expect("controller log");
    assert!(
        log.contains("API server: a release cascade-guard is proven on"),
        "{log}"
    );
    let clean = wait::until(Duration::from_secs(30), || async {
        let c = condition(&client, "leaves", type_check::CONDITION).await?;
        (c.0 == "True").then_some(c)
    })
    .await;
    assert_eq!(
        clean,
        Some(("True".into(), "NoWarnings".into())),
        "the CascadePolicy's TypeChecked condition"
    );

    // The API server type-checks a policy only against the kinds of the rules
    // that name their versions; cascade-guard's match every version ("*"), so
    // the check above passes without looking. With the controller stopped (it
    // would put the policy right at once), the rule is narrowed to v1: what
    // cascade-guard compiles still type-checks against the kind's schema...
    env.stop_controller(controller);
    let (policy, _) = checked_policy(&client, REFUSE.plural).await;
    let name = policy.name_any();
    let spec = serde_json::to_value(policy.spec.as_ref().expect("spec")).expect("spec");
    let mut rules = spec["matchConstraints"]["resourceRules"].clone();
    let i = delete_rule_naming(&policy, REFUSE.plural).expect("the kind's rule");
    rules[i]["apiVersions"] = json!(["v1"]);
    rules[i]["resources"] = json!([REFUSE.plural]);
    let api: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"matchConstraints": {"resourceRules": rules}}})),
    )
    .await
    .expect("narrow the policy to v1");
    let (narrowed, check) = checked_policy(&client, REFUSE.plural).await;
    assert_eq!(
        check,
        TypeCheck::Clean,
        "cascade-guard's CEL against the kind's schema: {:?}",
        narrowed.status
    );

    // ... and an expression naming a field the kind's schema does not have
    // does not.
    let mut validations = spec["validations"].clone();
    validations[0]["messageExpression"] = json!("'no ' + string(oldObject.spec.noSuchField)");
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"validations": validations}})),
    )
    .await
    .expect("edit the policy");
    let warned = wait::until(Duration::from_secs(60), || async {
        let p = api.get(&name).await.ok()?;
        match TypeCheck::of(&p) {
            TypeCheck::Warnings(w) => Some((p, w)),
            _ => None,
        }
    })
    .await;
    let Some((policy, warnings)) = warned else {
        let p = api.get(&name).await.expect("policy");
        panic!(
            "the API server did not type-check the edited policy: {}\nlogs:\n{}",
            serde_json::to_string_pretty(&p).unwrap_or_default(),
            env.cp.log_tails(40)
        );
    };
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].field, "spec.validations[0].messageExpression");
    assert!(
        warnings[0].warning.contains("noSuchField"),
        "{}",
        warnings[0].warning
    );

    // `cascade-guard status` says so.
    let text = status_text(env);
    assert!(
        text.contains(&format!(
            "ValidatingAdmissionPolicy {name} does not type-check on this API server (1 warning): spec.validations[0].messageExpression:"
        )),
        "{text}"
    );

    // The controller's reporting: a Warning Event on the XRD, and the metric.
    let xrd = xrd_api(&client).get(&REFUSE.xrd_name()).await.expect("XRD");
    let reference = ObjectReference {
        api_version: Some("apiextensions.crossplane.io/v2".into()),
        kind: Some("CompositeResourceDefinition".into()),
        name: Some(xrd.name_any()),
        uid: xrd.metadata.uid.clone(),
        ..Default::default()
    };
    let source = Source::Xrd {
        name: REFUSE.xrd_name(),
        annotated: true,
        claim: false,
    };
    let metrics = Arc::new(Metrics::new());
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "cascade-guard".into(),
            instance: None,
        },
    );
    let mut reporting = type_check::Reporting::new(recorder, metrics.clone());
    reporting
        .publish(
            &BTreeMap::from([(source, (name.clone(), TypeCheck::of(&policy)))]),
            &[],
            &BTreeMap::from([(REFUSE.xrd_name(), reference)]),
        )
        .await;
    assert!(
        metrics.encode().lines().any(|l| l
            == format!(
                r#"cascade_guard_admission_policy_type_check_warnings{{policy="{name}"}} 1"#
            )),
        "{}",
        metrics.encode()
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    let event = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .find(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(&REFUSE.xrd_name())
                && e.reason.as_deref() == Some(type_check::REASON)
        })
        .expect("a TypeCheckWarnings event on the XRD");
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(
        event.note.as_deref().unwrap_or_default().contains(&name),
        "{:?}",
        event.note
    );

    // The controller puts the policy right, and the API server agrees.
    env.start_controller(&[]);
    let fixed = wait::until(Duration::from_secs(60), || async {
        let p = api.get(&name).await.ok()?;
        (TypeCheck::of(&p) == TypeCheck::Clean).then_some(())
    })
    .await;
    if fixed.is_none() {
        let p = api.get(&name).await.expect("policy");
        panic!(
            "the policy was not put right: {:?} {:?}\nlogs:\n{}",
            p.metadata.generation,
            p.status,
            env.cp.log_tails(30)
        );
    }
    assert!(!status_text(env).contains("does not type-check"));
}
