//! The ValidatingAdmissionPolicies and bindings policies compile to: one
//! pair per mode and shape for all XRDs, one pair per CascadePolicy.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::admissionregistration::v1::{
    AuditAnnotation, MatchCondition, MatchResources, NamedRuleWithOperations,
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingAdmissionPolicyBindingSpec, ValidatingAdmissionPolicySpec, Validation,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::cel::{DECISION_AUDIT_KEY, compile_cel, compile_update_cel, inline_variables};
use crate::kind::Shape;
use crate::mode::Mode;
use crate::names::{
    MANAGED_BY_LABEL, MANAGED_BY_VALUE, MODE_ANNOTATION, MODE_FROM_ANNOTATION,
    PROTECTED_KIND_ANNOTATION, PROTECTED_KINDS_ANNOTATION, SOURCE_ANNOTATION,
};
use crate::naming::{PairName, fnv1a_64, is_shared};
use crate::resolve::{Policy, Source};
use crate::settings::CompileSettings;

/// The match condition of Refuse and Convert policies: true for exactly the
/// deletes the policy refuses.
pub const UNSAFE_DELETE_CONDITION: &str = "unsafe-delete";

/// The match condition of every UPDATE policy: true for exactly the updates
/// that take a cascade's finalizer or a composed resource away.
pub const GUARDED_UPDATE_CONDITION: &str = "guarded-change";

/// One ValidatingAdmissionPolicy and its binding (same name).
#[derive(Debug, Clone, PartialEq)]
pub struct Compiled {
    pub policy: ValidatingAdmissionPolicy,
    pub binding: ValidatingAdmissionPolicyBinding,
}

/// The binding's `validationActions` for a mode; None for Off, which
/// generates nothing.
pub fn validation_actions(mode: Mode) -> Option<Vec<String>> {
    let actions: &[&str] = match mode {
        Mode::Refuse | Mode::Convert => &["Deny"],
        Mode::Warn => &["Warn", "Audit"],
        Mode::Off => return None,
    };
    Some(actions.iter().map(|a| a.to_string()).collect())
}

/// What a policy compiles to on its own: the pair that checks DELETEs, then
/// the pair that checks UPDATEs; nothing for mode Off. An XRD's policy gets
/// the objects it would share with the other XRDs of its mode and shape,
/// naming only its own kind (see [`compile_all`]).
#[cfg(test)]
pub(crate) fn compile(policy: &Policy, settings: &CompileSettings) -> Vec<Compiled> {
    compile_all(std::slice::from_ref(policy), settings)
}

/// What a set of policies compiles to, in the order of the policies.
///
/// Every XRD policy of one mode and shape shares one DELETE pair and one
/// UPDATE pair that name all their kinds: the API server matches every
/// request in the cluster against every policy, so the cost of an
/// unprotected request then grows with the number of modes and shapes in use
/// (at most six pairs), not with the number of kinds (BENCHMARKS.md). Their
/// CEL reads nothing of the kind, so sharing changes no verdict. A
/// CascadePolicy keeps its own pair: its selector is its own, and its last
/// good compilation is kept by name (see [`crate::last_good`]).
#[cfg(test)]
pub(crate) fn compile_all(policies: &[Policy], settings: &CompileSettings) -> Vec<Compiled> {
    compile_with_names(policies, settings).0
}

/// What a set of policies compiles to (see `compile_all`, its tests' name
/// for the first half), and for each policy the names of the objects it is
/// put in (empty for Off), from one grouping of the policies.
pub fn compile_with_names(
    policies: &[Policy],
    settings: &CompileSettings,
) -> (Vec<Compiled>, Vec<Vec<String>>) {
    let groups = group(policies, settings.set_name.as_deref());
    let mut out = Vec::new();
    for group in &groups {
        let carriers: Vec<&Policy> = group.members.iter().map(|&i| &policies[i]).collect();
        let Some(first) = carriers.first() else {
            continue;
        };
        let Some(actions) = validation_actions(first.mode) else {
            continue;
        };
        let [delete, update] = group.names.clone();
        out.push(compile_delete(
            delete,
            first,
            &carriers,
            settings,
            actions.clone(),
        ));
        out.push(compile_update(update, first, &carriers, settings, actions));
    }
    (out, names_of_groups(policies, &groups))
}

fn names_of_groups(policies: &[Policy], groups: &[Group]) -> Vec<Vec<String>> {
    let mut out = vec![Vec::new(); policies.len()];
    for group in groups {
        for &i in &group.members {
            if validation_actions(policies[i].mode).is_some() {
                out[i] = group.names.to_vec();
            }
        }
    }
    out
}

/// Policies that share one DELETE and one UPDATE pair.
struct Group {
    names: [String; 2],
    /// Indices into the policies, in their order.
    members: Vec<usize>,
}

/// Kinds of one mode and shape beyond which they are spread over
/// [`SPREAD`] pairs: an object's annotations may hold 256 KiB, about 2,000
/// kinds' origins. Each kind's pair is then fixed by a hash of its name, so
/// adding or removing a kind changes one pair only; crossing the threshold
/// writes the new pairs before the first one loses its kinds (see
/// [`crate::plan::diff`]).
pub const SHARED_KINDS_BEFORE_SPREAD: usize = 1000;
pub const SPREAD: u64 = 16;

/// The policies that share objects, in the order their first member appears:
/// the XRD policies of one mode and shape together (spread over [`SPREAD`]
/// pairs when there are very many), each other policy alone.
fn group(policies: &[Policy], set: Option<&str>) -> Vec<Group> {
    let mut per_variant: BTreeMap<(Mode, Shape), usize> = BTreeMap::new();
    for p in policies.iter().filter(|p| is_shared(p)) {
        *per_variant.entry((p.mode, p.kind.shape)).or_default() += 1;
    }
    let mut groups: Vec<Group> = Vec::new();
    let mut index: BTreeMap<[String; 2], usize> = BTreeMap::new();
    for (i, p) in policies.iter().enumerate() {
        let names = if is_shared(p) {
            let spread = per_variant
                .get(&(p.mode, p.kind.shape))
                .is_some_and(|n| *n > SHARED_KINDS_BEFORE_SPREAD);
            let part = if spread {
                fnv1a_64(p.kind.to_string().as_bytes()) % SPREAD
            } else {
                0
            };
            PairName::Shared {
                mode: p.mode,
                shape: p.kind.shape,
                part,
                set: set.map(str::to_string),
            }
            .names()
        } else {
            PairName::of(p).names()
        };
        match index.get(&names) {
            Some(&g) => groups[g].members.push(i),
            None => {
                index.insert(names.clone(), groups.len());
                groups.push(Group {
                    names,
                    members: vec![i],
                });
            }
        }
    }
    groups
}

/// The names of what [`compile`] makes of a policy on its own (empty for Off).
pub fn object_names(policy: &Policy) -> Vec<String> {
    if validation_actions(policy.mode).is_none() {
        return Vec::new();
    }
    PairName::of(policy).names().into()
}

/// One rule per group and scope, naming every plural of the policies' kinds
/// in it (sorted, each once), so that the objects do not change with the
/// order the kinds were read in.
fn rules(carriers: &[&Policy], operation: &str) -> Vec<NamedRuleWithOperations> {
    let mut by_group: BTreeMap<(&str, &str), BTreeSet<&str>> = BTreeMap::new();
    for p in carriers {
        by_group
            .entry((p.kind.group.as_str(), p.kind.scope.admission_scope()))
            .or_default()
            .insert(p.kind.plural.as_str());
    }
    by_group
        .into_iter()
        .map(|((group, scope), plurals)| NamedRuleWithOperations {
            api_groups: Some(vec![group.to_string()]),
            api_versions: Some(vec!["*".to_string()]),
            operations: Some(vec![operation.to_string()]),
            resources: Some(plurals.into_iter().map(str::to_string).collect()),
            scope: Some(scope.to_string()),
            resource_names: None,
        })
        .collect()
}

/// `first` is one of `carriers`: they share its mode and shape.
fn compile_delete(
    name: String,
    first: &Policy,
    carriers: &[&Policy],
    settings: &CompileSettings,
    actions: Vec<String>,
) -> Compiled {
    let mode = first.mode;
    let cel = compile_cel(mode, first.kind.shape, settings);
    // Written out, no `spec.variables` (see `inline_variables`). Warn, with
    // no match condition, evaluates the validation, its message and the
    // audit annotation on every delete, each reading what it needs.
    let with_condition = mode != Mode::Warn;
    let validation = inline_variables(&cel.validation, &cel.variables);
    let message_expression = inline_variables(&cel.message_expression, &cel.variables);
    let decision_expression = inline_variables(&cel.decision_expression, &cel.variables);
    // objectSelector is matched against the stored object's labels on DELETE.
    assemble(
        name,
        carriers,
        rules(carriers, "DELETE"),
        actions,
        ValidatingAdmissionPolicySpec {
            // Refuse and Convert pass safe deletes on this condition alone:
            // the API server then skips the validation and its message (both
            // evaluated on every request otherwise). The validation keeps the
            // full rule, so the verdict does not rest on the condition. Warn
            // evaluates everything, to audit why it allowed.
            match_conditions: with_condition.then(|| {
                vec![MatchCondition {
                    name: UNSAFE_DELETE_CONDITION.to_string(),
                    expression: cel.refusal_condition.clone(),
                }]
            }),
            validations: Some(vec![Validation {
                expression: validation,
                message: Some(cel.message),
                message_expression: Some(message_expression),
                reason: Some(cel.reason.to_string()),
            }]),
            // The API server evaluates audit annotations on every request, so
            // only Warn, whose point is the record, carries why it allowed.
            audit_annotations: (mode == Mode::Warn).then(|| {
                vec![AuditAnnotation {
                    key: DECISION_AUDIT_KEY.to_string(),
                    value_expression: decision_expression,
                }]
            }),
            ..ValidatingAdmissionPolicySpec::default()
        },
    )
}

/// The policy that keeps a cascade's finalizers and an XR's composed
/// resources from being taken away by an update. Every mode has the match
/// condition, Warn included: updates are far more frequent than deletes, and
/// an ordinary one must cost no more than that condition. On UPDATE a
/// binding's objectSelector matches when the old or the new labels match, so
/// taking the label off in the same update does not escape it.
fn compile_update(
    name: String,
    first: &Policy,
    carriers: &[&Policy],
    settings: &CompileSettings,
    actions: Vec<String>,
) -> Compiled {
    let cel = compile_update_cel(first.mode, first.kind.shape, settings);
    let written = |e: &str| inline_variables(e, &cel.variables);
    assemble(
        name,
        carriers,
        rules(carriers, "UPDATE"),
        actions,
        ValidatingAdmissionPolicySpec {
            match_conditions: Some(vec![MatchCondition {
                name: GUARDED_UPDATE_CONDITION.to_string(),
                expression: cel.match_condition,
            }]),
            validations: Some(
                cel.validations
                    .into_iter()
                    .map(|v| Validation {
                        expression: written(&v.expression),
                        message: Some(v.message),
                        message_expression: Some(written(&v.message_expression)),
                        reason: Some(cel.reason.to_string()),
                    })
                    .collect(),
            ),
            ..ValidatingAdmissionPolicySpec::default()
        },
    )
}

/// A policy with `spec`'s CEL, matching `rules`, failing closed, and its
/// binding with the policies' selector (shared objects have none).
fn assemble(
    name: String,
    carriers: &[&Policy],
    rules: Vec<NamedRuleWithOperations>,
    actions: Vec<String>,
    spec: ValidatingAdmissionPolicySpec,
) -> Compiled {
    let metadata = metadata(&name, carriers);
    let selector = match carriers {
        [only] => only.selector.clone(),
        _ => None,
    };
    let vap = ValidatingAdmissionPolicy {
        metadata: metadata.clone(),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".to_string()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(rules),
                // Every version is in the rule, and a custom resource has no
                // equivalent in another group, so Equivalent (the default)
                // would only add a second pass to every request's matching.
                match_policy: Some("Exact".to_string()),
                ..MatchResources::default()
            }),
            ..spec
        }),
        status: None,
    };
    let binding = ValidatingAdmissionPolicyBinding {
        metadata,
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: name.clone(),
            validation_actions: actions,
            // No rules of its own: a binding without them matches what its
            // policy does, where rules restated here would make the API
            // server scan every protected request's resource list a second
            // time (BENCHMARKS.md, run 9).
            match_resources: Some(MatchResources {
                object_selector: selector,
                match_policy: Some("Exact".to_string()),
                ..MatchResources::default()
            }),
            param_ref: None,
        },
    };
    Compiled {
        policy: vap,
        binding,
    }
}

/// A shared object says, per kind, where its policy comes from
/// ([`PROTECTED_KINDS_ANNOTATION`]); a CascadePolicy's own object says it in
/// one annotation each.
fn metadata(name: &str, carriers: &[&Policy]) -> ObjectMeta {
    let mut annotations = BTreeMap::new();
    if let Some(first) = carriers.first() {
        annotations.insert(MODE_ANNOTATION.to_string(), first.mode.to_string());
        if is_shared(first) {
            let kinds: BTreeMap<String, BTreeMap<&str, String>> = carriers
                .iter()
                .map(|p| {
                    (
                        p.kind.to_string(),
                        BTreeMap::from([
                            ("source", p.source.to_string()),
                            ("modeFrom", mode_from(&p.source).to_string()),
                        ]),
                    )
                })
                .collect();
            // A map of strings always serialises.
            annotations.insert(
                PROTECTED_KINDS_ANNOTATION.to_string(),
                serde_json::to_string(&kinds).unwrap_or_default(),
            );
        } else {
            annotations.insert(SOURCE_ANNOTATION.to_string(), first.source.to_string());
            annotations.insert(
                PROTECTED_KIND_ANNOTATION.to_string(),
                first.kind.to_string(),
            );
            annotations.insert(
                MODE_FROM_ANNOTATION.to_string(),
                mode_from(&first.source).to_string(),
            );
        }
    }
    ObjectMeta {
        name: Some(name.to_string()),
        labels: Some(BTreeMap::from([(
            MANAGED_BY_LABEL.to_string(),
            MANAGED_BY_VALUE.to_string(),
        )])),
        annotations: Some(annotations),
        ..ObjectMeta::default()
    }
}

/// The value of [`MODE_FROM_ANNOTATION`]: so the objects themselves say
/// whether an XRD's protection is its own or the default's.
pub fn mode_from(source: &Source) -> &'static str {
    match source {
        Source::Xrd {
            annotated: true, ..
        } => "xrd-annotation",
        Source::Xrd {
            annotated: false, ..
        } => "xrd-default-mode",
        Source::CascadePolicy { .. } => "cascadepolicy",
    }
}

#[cfg(test)]
mod tests;
