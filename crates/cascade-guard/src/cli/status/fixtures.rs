//! The inputs and cluster contents the tests of `status` share.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use serde_json::{Value, json};

use super::report::{AdmissionSync, admission_sync};
use crate::policy::last_good::LastGood;
use crate::policy::names::DELETION_POLICY_ANNOTATION;
use crate::policy::plan::{Known, Live, plan};
use crate::policy::sync::{Seen, pass};
use crate::policy::{
    CascadePolicyInput, CompileSettings, CrdInfo, Inputs, Mode, Resolution, Scope, XrdInput,
    resolve,
};

fn xrd(plural: &str, kind: &str, annotation: Option<&str>) -> XrdInput {
    let mut v = json!({
        "apiVersion": "apiextensions.crossplane.io/v2",
        "kind": "CompositeResourceDefinition",
        "metadata": {"name": format!("{plural}.example.org")},
        "spec": {"group": "example.org", "names": {"kind": kind, "plural": plural},
            "scope": "Namespaced", "versions": [{"name": "v1", "served": true}]}
    });
    if let Some(a) = annotation {
        v["metadata"]["annotations"] = json!({ DELETION_POLICY_ANNOTATION: a });
    }
    XrdInput::from_value(&v)
}

pub(super) fn resolution(default: Mode) -> Resolution {
    resolve(&Inputs {
        xrds: vec![
            xrd("clusters", "Cluster", Some("Convert")),
            xrd("networks", "Network", None),
            xrd("quiet", "Quiet", Some("Off")),
        ],
        cascade_policies: vec![CascadePolicyInput {
            name: "releases".into(),
            group: "helm.example.org".into(),
            kind: "Release".into(),
            mode: Mode::Refuse,
            selector: Some(LabelSelector {
                match_labels: Some([("team".to_string(), "a".to_string())].into()),
                ..LabelSelector::default()
            }),
        }],
        crds: vec![CrdInfo {
            group: "helm.example.org".into(),
            kind: "Release".into(),
            plural: "releases".into(),
            scope: Scope::Cluster,
        }],
        xrd_default_mode: default,
        undiscovered_groups: Default::default(),
    })
}

/// The live objects exactly as the controller would have applied them,
/// with what the API server adds.
pub(super) fn live(resolution: &Resolution) -> (Vec<Value>, Vec<Value>) {
    let settings = CompileSettings::default();
    let mut policies = Vec::new();
    let mut bindings = Vec::new();
    {
        for c in plan(resolution, &settings, BTreeSet::new()).objects {
            let mut vap = serde_json::to_value(&c.policy).unwrap();
            vap["metadata"]["uid"] = json!("u1");
            vap["metadata"]["resourceVersion"] = json!("7");
            // Defaulted by the API server: fields the policy leaves out.
            vap["spec"]["matchConstraints"]["namespaceSelector"] = json!({});
            vap["spec"]["matchConstraints"]["objectSelector"] = json!({});
            vap["status"] = json!({"observedGeneration": 1});
            policies.push(vap);
            bindings.push(serde_json::to_value(&c.binding).unwrap());
        }
    }
    (policies, bindings)
}

/// status's comparison, with every input read.
pub(super) fn sync(r: &Resolution, policies: &[Value], bindings: &[Value]) -> AdmissionSync {
    let live = Live::from_lists(policies, bindings);
    let seen = Seen {
        known: Known {
            xrds: true,
            cascade_policies: true,
        },
        live: &live,
        live_complete: true,
    };
    let pass = pass(
        r.clone(),
        &CompileSettings::default(),
        seen,
        &mut LastGood::default(),
        |name| live.policies.get(name).cloned(),
    );
    admission_sync(&pass, &live)
}

pub(super) fn meta(name: &str, deleting: Option<&str>, finalizers: &[&str]) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some("team-a".into()),
        deletion_timestamp: deleting.map(|t| Time(t.parse().unwrap())),
        finalizers: Some(finalizers.iter().map(|f| f.to_string()).collect()),
        ..ObjectMeta::default()
    }
}
