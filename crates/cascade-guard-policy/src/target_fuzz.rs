//! Generated inputs through the function the controller, `render` and
//! `status` all resolve with: XRDs with random groups and annotation values,
//! CascadePolicies with random groups, kinds, modes and selectors, and
//! discovery that serves every kind named (as the controller's does, built-in
//! kinds included). Nothing may panic, and no compiled admission object may
//! match a kind of a group no policy may protect.
//!
//! The seed is printed; `TARGET_FUZZ_SEED=N` replays one. A unit test (not
//! under tests/) to share the crate's seeded generator.

use std::collections::BTreeSet;

use crate::kind::forbidden;
use crate::plan::plan;
use crate::test_rng::Rng;
use crate::{CascadePolicyInput, CompileSettings, CrdInfo, Inputs, Mode, Scope, XrdInput, resolve};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use serde_json::{Value, json};

impl Rng {
    /// Random bytes as text: control characters, quotes, CEL and YAML syntax.
    fn garbage(&mut self) -> String {
        const PIECES: [&str; 14] = [
            "'", "\"", "\\", "||", "true", "\n", "{", "}", " ", "é", "\u{0}", "Refuse", "${x}", "a",
        ];
        (0..self.below(12)).map(|_| self.pick(&PIECES)).collect()
    }
}

const GROUPS: [&str; 20] = [
    "",
    "apps",
    "batch",
    "policy",
    "extensions",
    "autoscaling",
    "apiextensions.k8s.io",
    "coordination.k8s.io",
    "admissionregistration.k8s.io",
    "rbac.authorization.k8s.io",
    "k8s.io",
    "APPS",
    "Coordination.K8S.IO",
    "cascade-guard.dev",
    "table.cascade-guard.dev",
    "modelplane.ai",
    "infrastructure.modelplane.ai",
    "apiextensions.crossplane.io",
    "k8s.io.example.com",
    "x",
];

const KINDS: [&str; 8] = [
    "Deployment",
    "CustomResourceDefinition",
    "Lease",
    "CascadePolicy",
    "InferenceCluster",
    "Pod",
    "",
    "Ünïcode",
];

const MODES: [&str; 9] = [
    "Refuse",
    "Convert",
    "Warn",
    "Off",
    "refuse",
    "CONVERT",
    "",
    "Foreground",
    "off ",
];

fn group(rng: &mut Rng) -> String {
    if rng.below(10) == 0 {
        rng.garbage()
    } else {
        rng.pick(&GROUPS).to_string()
    }
}

fn xrd(rng: &mut Rng, i: usize) -> Value {
    let group = group(rng);
    let kind = rng.pick(&KINDS).to_string();
    let plural = format!("{}s{i}", kind.to_ascii_lowercase());
    let mut xrd = json!({
        "apiVersion": if rng.below(2) == 0 { "apiextensions.crossplane.io/v2" } else { "apiextensions.crossplane.io/v1" },
        "kind": "CompositeResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {
            "group": group,
            "names": {"kind": kind, "plural": plural},
            "scope": if rng.below(2) == 0 { "Namespaced" } else { "Cluster" },
            "versions": [{"name": "v1", "served": true, "referenceable": true}],
        }
    });
    match rng.below(4) {
        0 => {}
        1 => {
            xrd["metadata"]["annotations"] =
                json!({"cascade-guard.dev/deletion-policy": rng.pick(&MODES)})
        }
        2 => {
            xrd["metadata"]["annotations"] =
                json!({"cascade-guard.dev/deletion-policy": rng.garbage()})
        }
        _ => {
            // Broken: a field of the wrong type.
            xrd["spec"]["names"] = json!(rng.garbage());
        }
    }
    if rng.below(5) == 0 {
        xrd["spec"]["claimNames"] =
            json!({"kind": format!("{kind}Claim"), "plural": format!("{plural}claims")});
    }
    xrd
}

fn cascade_policy(rng: &mut Rng, i: usize) -> CascadePolicyInput {
    let mode = match rng.below(4) {
        0 => Mode::Refuse,
        1 => Mode::Convert,
        2 => Mode::Warn,
        _ => Mode::Off,
    };
    let selector = match rng.below(3) {
        0 => None,
        1 => Some(LabelSelector {
            match_labels: Some([(rng.garbage(), rng.garbage())].into_iter().collect()),
            ..Default::default()
        }),
        _ => Some(LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: rng.garbage(),
                operator: rng
                    .pick(&["In", "NotIn", "Exists", "DoesNotExist", "Bogus"])
                    .into(),
                values: Some(vec![rng.garbage()]),
            }]),
            ..Default::default()
        }),
    };
    CascadePolicyInput {
        name: format!("p{i}-{}", rng.garbage()),
        group: group(rng),
        kind: rng.pick(&KINDS).to_string(),
        mode,
        selector,
    }
}

#[test]
fn no_generated_input_panics_or_protects_a_forbidden_kind() {
    let seed: u64 = std::env::var("TARGET_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5EED_CA5C_ADE0_0001);
    eprintln!("target fuzz seed: {seed} (TARGET_FUZZ_SEED={seed} replays it)");
    let mut rng = Rng(seed);
    let (mut specs, mut annotations, mut policies) = (0, 0, 0);
    for round in 0..300 {
        let xrds: Vec<Value> = (0..rng.below(5)).map(|i| xrd(&mut rng, i)).collect();
        annotations += xrds.len();
        let cps: Vec<CascadePolicyInput> = (0..1 + rng.below(6))
            .map(|i| cascade_policy(&mut rng, i))
            .collect();
        specs += cps.len();
        // Discovery serves every kind named, built-in ones included.
        let crds: Vec<CrdInfo> = cps
            .iter()
            .map(|cp| CrdInfo {
                group: cp.group.clone(),
                kind: cp.kind.clone(),
                plural: format!("{}s", cp.kind.to_ascii_lowercase()),
                scope: if rng.below(2) == 0 {
                    Scope::Namespaced
                } else {
                    Scope::Cluster
                },
            })
            .collect();
        let inputs = Inputs {
            xrds: xrds.iter().map(XrdInput::from_value).collect(),
            cascade_policies: cps,
            crds,
            xrd_default_mode: if rng.below(2) == 0 {
                Mode::Refuse
            } else {
                Mode::Convert
            },
            undiscovered_groups: BTreeSet::new(),
        };
        let resolution = resolve(&inputs);
        for p in &resolution.policies {
            assert!(
                forbidden(&p.kind.group).is_none(),
                "round {round} (seed {seed}): a policy for {} from {}",
                p.kind,
                p.source
            );
        }
        policies += resolution.policies.len();
        let compiled = plan(&resolution, &CompileSettings::default(), BTreeSet::new());
        for pair in &compiled.objects {
            let rules = pair
                .policy
                .spec
                .as_ref()
                .and_then(|s| s.match_constraints.as_ref())
                .and_then(|m| m.resource_rules.clone())
                .unwrap_or_default();
            for rule in rules {
                for group in rule.api_groups.unwrap_or_default() {
                    assert!(
                        forbidden(&group).is_none() && group != "*",
                        "round {round} (seed {seed}): {:?} matches group {group:?}",
                        pair.policy.metadata.name
                    );
                }
            }
        }
    }
    eprintln!(
        "target fuzz: {specs} CascadePolicy specs, {annotations} XRDs, {policies} policies resolved"
    );
    assert!(specs >= 1000, "at least 1,000 specs: {specs}");
}
