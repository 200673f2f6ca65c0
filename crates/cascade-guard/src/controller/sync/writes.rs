//! The writes of an admission sync pass: each change the pass lists made
//! against the API server. A wanted object is written with server-side
//! apply (forced, field manager `cascade-guard`), replaced outright when the
//! API server refuses the merge (422) or the merge still differs from ours;
//! an object no policy wants is deleted (gone already is fine). A failed
//! write is reported against every source its object carries, and the rest
//! of that pair, and every change that takes a kind out of an object, wait
//! for the next pass.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Error;
use crate::controller::MANAGER;
use crate::policy::Source;
use crate::policy::drift::first_difference;
use crate::policy::plan::{AdmissionPlan, Drift, ObjectKind, may_write};
use crate::policy::sync::Pass;

/// Makes the pass's changes, in its order. Returns the sources whose
/// objects could not be written, with the error; a removal that fails is
/// logged and tried again next pass (the object it leaves guards no less).
pub(crate) async fn make(
    policies: &Api<ValidatingAdmissionPolicy>,
    bindings: &Api<ValidatingAdmissionPolicyBinding>,
    pass: &Pass,
) -> BTreeMap<Source, String> {
    let mut failed: BTreeMap<Source, String> = BTreeMap::new();
    let mut failed_names = BTreeSet::new();
    for change in &pass.changes {
        if !may_write(change, !failed_names.is_empty()) {
            tracing::warn!(kind = change.kind.as_str(), name = %change.name, "not taking a kind out of an admission object in this pass, after a failed write");
            continue;
        }
        let result = match &change.drift {
            Drift::Missing | Drift::Differs { .. } if !change.sources.is_empty() => {
                // After a failed write, the rest of its pair waits for the next pass.
                if failed_names.contains(&change.name) {
                    continue;
                }
                if let Err(e) =
                    write(policies, bindings, &pass.plan, change.kind, &change.name).await
                {
                    // A shared object's failure leaves every kind it carries
                    // as it was in the cluster; each of their sources says so.
                    tracing::error!(name = %change.name, kinds = change.sources.len(), error = %e, "cannot apply admission objects");
                    failed_names.insert(change.name.clone());
                    for source in &change.sources {
                        failed
                            .entry(source.clone())
                            .or_insert_with(|| e.to_string());
                    }
                }
                continue;
            }
            Drift::Extra { removable: true } => {
                tracing::info!(kind = change.kind.as_str(), name = %change.name, "removing admission object no policy wants");
                match change.kind {
                    ObjectKind::Policy => remove(policies, change.kind, &change.name).await,
                    ObjectKind::Binding => remove(bindings, change.kind, &change.name).await,
                }
            }
            _ => continue,
        };
        if let Err(e) = result {
            tracing::error!(error = %e, "cannot remove a stale admission object");
        }
    }
    failed
}

/// Writes the plan's object of `kind` named `name`.
async fn write(
    policies: &Api<ValidatingAdmissionPolicy>,
    bindings: &Api<ValidatingAdmissionPolicyBinding>,
    plan: &AdmissionPlan,
    kind: ObjectKind,
    name: &str,
) -> Result<(), Error> {
    let Some((_, compiled)) = plan.compiled(name) else {
        return Ok(());
    };
    match kind {
        ObjectKind::Policy => server_side_apply(policies, kind, &compiled.policy).await,
        ObjectKind::Binding => server_side_apply(bindings, kind, &compiled.binding).await,
    }
}

/// Server-side apply, forced. That takes back every field someone else changed
/// with an apply, but not fields others added with an update (a binding's
/// `objectSelector`) nor elements added to set-typed lists (a binding's
/// `validationActions` would become `[Warn, Deny]`, which is invalid), so when
/// the live object still differs from ours, it is replaced outright.
async fn server_side_apply<K>(api: &Api<K>, kind: ObjectKind, object: &K) -> Result<(), Error>
where
    K: Resource + Serialize + DeserializeOwned + Clone + std::fmt::Debug,
    K::DynamicType: Default,
{
    let name = object.name_any();
    let error = |source| Error::Apply {
        kind: kind.as_str(),
        name: name.clone(),
        source,
    };
    let desired = serde_json::to_value(object).unwrap_or_default();
    let applied = api
        .patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(object),
        )
        .await;
    let live = match applied {
        Ok(live) => live,
        // Invalid after merging with someone else's edit: replace below.
        Err(kube::Error::Api(s)) if s.code == 422 => api.get(&name).await.map_err(error)?,
        Err(e) => return Err(error(e)),
    };
    let difference = first_difference(&desired, &serde_json::to_value(&live).unwrap_or_default());
    let Some(field) = difference else {
        return Ok(());
    };
    tracing::info!(kind = kind.as_str(), %name, %field, "replacing an admission object someone changed");
    let mut replacement = object.clone();
    replacement.meta_mut().resource_version = live.meta().resource_version.clone();
    let params = PostParams {
        field_manager: Some(MANAGER.into()),
        ..PostParams::default()
    };
    api.replace(&name, &params, &replacement)
        .await
        .map(|_| ())
        .map_err(error)
}

/// Deletes one of our objects that no policy wants (gone already is fine).
async fn remove<K>(api: &Api<K>, kind: ObjectKind, name: &str) -> Result<(), Error>
where
    K: Resource + DeserializeOwned + Clone + std::fmt::Debug,
    K::DynamicType: Default,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(Error::Delete {
            kind: kind.as_str(),
            name: name.to_string(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use kube::Client;
    use serde_json::{Value, json};

    use super::*;
    use crate::fake_api_server::{BINDINGS, Exchange, POLICIES, against, says};
    use crate::policy::last_good::LastGood;
    use crate::policy::plan::{Known, Live, plan};
    use crate::policy::sync::{Seen, pass};
    use crate::policy::{CompileSettings, Mode, Policy, ProtectedKind, Resolution, Scope, Shape};

    /// CascadePolicy `buckets`: a DELETE and an UPDATE pair of its own.
    const DELETE_PAIR: &str = "cascade-guard-policy-buckets";
    const UPDATE_PAIR: &str = "cascade-guard-update-policy-buckets";
    /// What the XRDs of Refuse mode share.
    const SHARED_DELETE_PAIR: &str = "cascade-guard-xrds-refuse-composite";
    const SHARED_UPDATE_PAIR: &str = "cascade-guard-update-xrds-refuse-composite";

    /// A namespaced kind of group example.org.
    fn kind(kind: &str, shape: Shape) -> ProtectedKind {
        let plural = format!("{}s", kind.to_lowercase());
        ProtectedKind {
            group: "example.org".into(),
            kind: kind.into(),
            plural,
            scope: Scope::Namespaced,
            shape,
        }
    }

    fn cascade_policy(name: &str, of: &str) -> Policy {
        Policy {
            kind: kind(of, Shape::Other),
            mode: Mode::Refuse,
            selector: None,
            source: Source::CascadePolicy { name: name.into() },
        }
    }

    fn buckets() -> Policy {
        cascade_policy("buckets", "Bucket")
    }

    fn xrd(name: &str, of: &str) -> Policy {
        Policy {
            kind: kind(of, Shape::CompositeResource),
            mode: Mode::Refuse,
            selector: None,
            source: Source::Xrd {
                name: name.into(),
                annotated: true,
                claim: false,
            },
        }
    }

    fn resolved(policies: Vec<Policy>) -> Resolution {
        Resolution {
            policies,
            problems: vec![],
        }
    }

    /// Each object `policies` compile to, as JSON by kind and name.
    fn compiled(policies: Vec<Policy>) -> BTreeMap<(ObjectKind, String), Value> {
        let plan = plan(
            &resolved(policies),
            &CompileSettings::default(),
            BTreeSet::new(),
        );
        let mut out = BTreeMap::new();
        for c in plan.objects {
            let name = c.policy.metadata.name.clone().unwrap_or_default();
            let (policy, binding) = (json(&c.policy), json(&c.binding));
            out.insert((ObjectKind::Policy, name.clone()), policy);
            out.insert((ObjectKind::Binding, name), binding);
        }
        out
    }

    fn json(object: &impl serde::Serialize) -> Value {
        serde_json::to_value(object).expect("compiled objects serialise")
    }

    /// The cluster holding `objects`, at resourceVersion 7.
    fn holding(objects: &BTreeMap<(ObjectKind, String), Value>) -> Live {
        let mut live = Live::default();
        for ((kind, name), object) in objects {
            let mut object = object.clone();
            object["metadata"]["resourceVersion"] = json!("7");
            match kind {
                ObjectKind::Policy => live.policies.insert(name.clone(), object),
                ObjectKind::Binding => live.bindings.insert(name.clone(), object),
            };
        }
        live
    }

    fn path(kind: ObjectKind, name: &str) -> String {
        match kind {
            ObjectKind::Policy => format!("{POLICIES}/{name}"),
            ObjectKind::Binding => format!("{BINDINGS}/{name}"),
        }
    }

    /// The object of `kind` and `name` that `policies` want.
    fn wanted(policies: Vec<Policy>, kind: ObjectKind, name: &str) -> Value {
        compiled(policies)
            .remove(&(kind, name.to_string()))
            .expect("the object is compiled")
    }

    /// A server-side apply of `object`, forced, as field manager cascade-guard.
    fn apply(kind: ObjectKind, object: &Value) -> Exchange {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        Exchange::apply(&path(kind, name), object)
    }

    /// A replace of `object` at the resourceVersion read, 7.
    fn replace(kind: ObjectKind, object: &Value) -> Exchange {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let mut at_seven = object.clone();
        at_seven["metadata"]["resourceVersion"] = json!("7");
        Exchange::put(&format!("{}?&fieldManager=cascade-guard", path(kind, name))).body(at_seven)
    }

    fn delete(kind: ObjectKind, name: &str) -> Exchange {
        Exchange::delete(&format!("{}?", path(kind, name))).body(json!({}))
    }

    /// `object` as someone left it: narrowed to objects labelled team=a.
    fn narrowed(kind: ObjectKind, object: &Value) -> Value {
        let mut object = object.clone();
        object["metadata"]["resourceVersion"] = json!("7");
        let selector = json!({"matchLabels": {"team": "a"}});
        match kind {
            ObjectKind::Policy => object["spec"]["matchConstraints"]["objectSelector"] = selector,
            ObjectKind::Binding => object["spec"]["matchResources"]["objectSelector"] = selector,
        }
        object
    }

    const ALL_KNOWN: Known = Known {
        xrds: true,
        cascade_policies: true,
    };

    /// Runs the pass for `policies` against `live` and makes its changes
    /// against `script`: what failed, by source.
    async fn sync(
        policies: Vec<Policy>,
        live: &Live,
        live_complete: bool,
        script: Vec<Exchange>,
    ) -> BTreeMap<Source, String> {
        let seen = Seen {
            known: ALL_KNOWN,
            live,
            live_complete,
        };
        let pass = pass(
            resolved(policies),
            &CompileSettings::default(),
            seen,
            &mut LastGood::default(),
            |name| live.policies.get(name).cloned(),
        );
        against(script, async |client: Client| {
            let policies = Api::all(client.clone());
            let bindings = Api::all(client);
            make(&policies, &bindings, &pass).await
        })
        .await
    }

    struct Case {
        what: &'static str,
        policies: Vec<Policy>,
        live: Live,
        live_complete: bool,
        script: Vec<Exchange>,
        /// What failed: each source, with the start of what it reports and
        /// words the API server said.
        failed: Vec<(Source, String, &'static str)>,
    }

    fn cases() -> Vec<Case> {
        use ObjectKind::{Binding, Policy as Vap};
        let want = |kind, name| wanted(vec![buckets()], kind, name);
        let shared = |kind, name| wanted(vec![xrd("a", "A"), xrd("b", "B")], kind, name);
        let in_sync = holding(&compiled(vec![buckets()]));
        let mut edited = in_sync.clone();
        // Someone added Warn to Deny: a merge with that is invalid.
        edited.bindings.insert(DELETE_PAIR.into(), {
            let mut b = want(Binding, DELETE_PAIR);
            b["metadata"]["resourceVersion"] = json!("7");
            b["spec"]["validationActions"] = json!(["Deny", "Warn"]);
            b
        });
        // A pair of a CascadePolicy deleted.
        let mut stale = holding(&compiled(vec![cascade_policy("old", "Old")]));
        stale
            .policies
            .retain(|name, _| name == "cascade-guard-policy-old");
        stale
            .bindings
            .retain(|name, _| name == "cascade-guard-policy-old");
        let forbidden = "validatingadmissionpolicies.admissionregistration.k8s.io is forbidden: User \"system:serviceaccount:cascade-guard:cascade-guard\" cannot patch resource \"validatingadmissionpolicies\"";
        let apply_failed = |kind: &str, name: &str| format!("cannot apply {kind} {name}: ");
        // Applied, and answered with someone's selector still in place.
        let left_narrowed =
            || apply(Vap, &want(Vap, DELETE_PAIR)).ok(narrowed(Vap, &want(Vap, DELETE_PAIR)));
        // The UPDATE pair, applied as wanted.
        let with_update_pair = |mut script: Vec<Exchange>| {
            script.push(apply(Vap, &want(Vap, UPDATE_PAIR)).echoes());
            script.push(apply(Binding, &want(Binding, UPDATE_PAIR)).echoes());
            script
        };
        vec![
            Case {
                what: "a missing pair is applied, each policy before its binding",
                policies: vec![buckets()],
                live: Live::default(),
                live_complete: true,
                script: vec![
                    apply(Vap, &want(Vap, DELETE_PAIR)).echoes(),
                    apply(Binding, &want(Binding, DELETE_PAIR)).echoes(),
                    apply(Vap, &want(Vap, UPDATE_PAIR)).echoes(),
                    apply(Binding, &want(Binding, UPDATE_PAIR)).echoes(),
                ],
                failed: vec![],
            },
            Case {
                what: "what is there as wanted is not written",
                policies: vec![buckets()],
                live: in_sync.clone(),
                live_complete: true,
                script: vec![],
                failed: vec![],
            },
            Case {
                what: "an apply refused as invalid (422) is read back and replaced",
                policies: vec![buckets()],
                live: edited.clone(),
                live_complete: true,
                script: vec![
                    apply(Binding, &want(Binding, DELETE_PAIR)).fails(
                        says::INVALID,
                        "ValidatingAdmissionPolicyBinding.admissionregistration.k8s.io \"cascade-guard-policy-buckets\" is invalid: spec.validationActions: Invalid value: [\"Deny\",\"Warn\"]: must not contain both Deny and Warn",
                    ),
                    Exchange::get(&path(Binding, DELETE_PAIR))
                        .ok(edited.bindings[DELETE_PAIR].clone()),
                    replace(Binding, &want(Binding, DELETE_PAIR)).echoes(),
                ],
                failed: vec![],
            },
            Case {
                what: "an apply that leaves someone's selector in place is replaced",
                policies: vec![buckets()],
                live: Live::default(),
                live_complete: true,
                script: with_update_pair(vec![
                    left_narrowed(),
                    replace(Vap, &want(Vap, DELETE_PAIR)).echoes(),
                    apply(Binding, &want(Binding, DELETE_PAIR)).echoes(),
                ]),
                failed: vec![],
            },
            Case {
                what: "a replace in conflict (409) fails its source; the rest of its pair waits",
                policies: vec![buckets()],
                live: Live::default(),
                live_complete: true,
                script: with_update_pair(vec![
                    left_narrowed(),
                    replace(Vap, &want(Vap, DELETE_PAIR)).fails(
                        says::CONFLICT,
                        "Operation cannot be fulfilled on validatingadmissionpolicies.admissionregistration.k8s.io \"cascade-guard-policy-buckets\": the object has been modified; please apply your changes to the latest version and try again",
                    ),
                ]),
                failed: vec![(
                    buckets().source,
                    apply_failed("ValidatingAdmissionPolicy", DELETE_PAIR),
                    "the object has been modified",
                )],
            },
            Case {
                what: "without RBAC (403) a shared pair fails every XRD it carries, and nothing is removed after",
                policies: vec![xrd("a", "A"), xrd("b", "B")],
                live: stale.clone(),
                live_complete: true,
                script: vec![
                    apply(Vap, &shared(Vap, SHARED_DELETE_PAIR))
                        .fails(says::FORBIDDEN, forbidden),
                    apply(Vap, &shared(Vap, SHARED_UPDATE_PAIR))
                        .fails(says::FORBIDDEN, forbidden),
                ],
                failed: vec![
                    (
                        xrd("a", "A").source,
                        apply_failed("ValidatingAdmissionPolicy", SHARED_DELETE_PAIR),
                        "cannot patch resource",
                    ),
                    (
                        xrd("b", "B").source,
                        apply_failed("ValidatingAdmissionPolicy", SHARED_DELETE_PAIR),
                        "cannot patch resource",
                    ),
                ],
            },
            Case {
                what: "what no policy wants is deleted, bindings first; gone already (404) is fine",
                policies: vec![],
                live: in_sync.clone(),
                live_complete: true,
                script: vec![
                    delete(Binding, DELETE_PAIR).ok(json!({})),
                    delete(Binding, UPDATE_PAIR).fails(says::NOT_FOUND, "not found"),
                    delete(Vap, DELETE_PAIR).fails(says::NOT_FOUND, "not found"),
                    delete(Vap, UPDATE_PAIR).ok(json!({})),
                ],
                failed: vec![],
            },
            Case {
                what: "a delete refused (403) is logged, fails no source, and the next goes ahead",
                policies: vec![],
                live: in_sync.clone(),
                live_complete: true,
                script: vec![
                    delete(Binding, DELETE_PAIR).fails(says::FORBIDDEN, "forbidden"),
                    delete(Binding, UPDATE_PAIR).ok(json!({})),
                    delete(Vap, DELETE_PAIR).ok(json!({})),
                    delete(Vap, UPDATE_PAIR).ok(json!({})),
                ],
                failed: vec![],
            },
            Case {
                what: "on a partial view of the cluster nothing is deleted",
                policies: vec![],
                live: in_sync,
                live_complete: false,
                script: vec![],
                failed: vec![],
            },
        ]
    }

    #[tokio::test]
    async fn each_change_of_a_pass_is_one_pinned_request() {
        for case in cases() {
            let failed = sync(case.policies, &case.live, case.live_complete, case.script).await;
            let sources: Vec<&Source> = failed.keys().collect();
            let want: Vec<&Source> = case.failed.iter().map(|(s, _, _)| s).collect();
            assert_eq!(sources, want, "{}", case.what);
            for (source, starts, says) in &case.failed {
                let message = &failed[source];
                assert!(
                    message.starts_with(starts.as_str()) && message.contains(says),
                    "{}: {source}: {message}",
                    case.what
                );
            }
        }
    }
}
