//! Whether the API server could type-check the admission policies
//! cascade-guard wrote. A policy whose expressions do not type-check against
//! the schema of the kinds it matches may fail at admission time and then
//! protects nothing (or refuses everything): kube-controller-manager's
//! validatingadmissionpolicy-status-controller records each problem in the
//! policy's `status.typeChecking`, and this module tells people about it as a
//! Warning Event on the XRD or CascadePolicy the policy comes from, a
//! `TypeChecked` condition on CascadePolicies, a metric, and in
//! `cascade-guard status`.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Resource, ResourceExt};

use super::inputs::Watched;
use super::report::truncate;
use crate::api::CascadePolicy;
use crate::policy::Source;
use crate::telemetry::Metrics;

/// The reason of the Warning Event and of the condition when a policy has
/// type-check warnings.
pub const REASON: &str = "TypeCheckWarnings";

/// One expression the API server could not type-check cleanly.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TypeWarning {
    /// The expression's path in the policy, e.g. `spec.validations[0].expression`.
    pub field: String,
    pub warning: String,
}

/// What the API server says about one policy's current spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TypeCheck {
    /// Not type-checked at this generation (yet): the status controller has
    /// not got to it, or the cluster does not run one.
    Pending,
    Clean,
    Warnings(Vec<TypeWarning>),
}

impl TypeCheck {
    /// Reads `status.typeChecking`, counting it only when it is about the
    /// policy's current generation (pure). The status controller sets
    /// `observedGeneration` when it has checked; a clean check may leave
    /// `typeChecking` out altogether (server-side apply drops an empty one
    /// that replaces warnings).
    pub fn of(policy: &ValidatingAdmissionPolicy) -> Self {
        let Some(status) = &policy.status else {
            return Self::Pending;
        };
        let current = policy.metadata.generation.unwrap_or(0);
        if status.observed_generation.unwrap_or(0) < current.max(1) {
            return Self::Pending;
        }
        let mut warnings: Vec<TypeWarning> = status
            .type_checking
            .iter()
            .flat_map(|c| c.expression_warnings.iter().flatten())
            .map(|w| TypeWarning {
                field: w.field_ref.clone(),
                warning: w.warning.clone(),
            })
            .collect();
        if warnings.is_empty() {
            return Self::Clean;
        }
        warnings.sort();
        Self::Warnings(warnings)
    }

    pub fn warnings(&self) -> &[TypeWarning] {
        match self {
            Self::Warnings(w) => w,
            Self::Pending | Self::Clean => &[],
        }
    }
}

/// One line for people: which policy, which expressions, what the API server
/// said (its warnings can span lines; they are joined).
pub fn describe(policy: &str, warnings: &[TypeWarning]) -> String {
    let each: Vec<String> = warnings
        .iter()
        .map(|w| {
            let said = w.warning.split_whitespace().collect::<Vec<_>>().join(" ");
            format!("{}: {said}", w.field)
        })
        .collect();
    format!(
        "ValidatingAdmissionPolicy {policy} does not type-check on this API server ({} warning{}): {}; these expressions may fail at admission time, so check the kinds' schemas and this Kubernetes release's limits in the README",
        warnings.len(),
        if warnings.len() == 1 { "" } else { "s" },
        each.join("; ")
    )
}

/// A line for each live policy with type-check warnings, for
/// `cascade-guard status` (pure).
pub fn problems(policies: &[ValidatingAdmissionPolicy]) -> Vec<String> {
    policies
        .iter()
        .filter_map(|p| match TypeCheck::of(p) {
            TypeCheck::Warnings(w) => Some(describe(&p.name_any(), &w)),
            TypeCheck::Pending | TypeCheck::Clean => None,
        })
        .collect()
}

/// The condition type on a CascadePolicy.
pub const CONDITION: &str = "TypeChecked";

/// The `TypeChecked` condition of a CascadePolicy whose policy compiled (pure).
pub fn condition(policy: &str, check: &TypeCheck, generation: Option<i64>) -> Condition {
    let (status, reason, message) = match check {
        TypeCheck::Pending => (
            "Unknown",
            "Pending",
            format!(
                "the API server has not type-checked ValidatingAdmissionPolicy {policy} yet (kube-controller-manager's validatingadmissionpolicy-status-controller does)"
            ),
        ),
        TypeCheck::Clean => (
            "True",
            "NoWarnings",
            // The API server checks only rules that name their versions; the
            // README says what that means for cascade-guard's.
            format!(
                "the API server's type check of ValidatingAdmissionPolicy {policy} found nothing wrong"
            ),
        ),
        TypeCheck::Warnings(warnings) => (
            "False",
            REASON,
            truncate(&describe(policy, warnings), 32 * 1024),
        ),
    };
    Condition {
        type_: CONDITION.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: Time(Timestamp::now()),
    }
}

/// The type-check state of every compiled policy, by source (pure apart
/// from reading the watch cache). A source compiles to more than one policy
/// (its DELETE and UPDATE guards): the one to tell people about is the one
/// with warnings, else one not checked yet, else any.
pub(crate) fn collect(
    compiled: &BTreeMap<Source, Vec<String>>,
    policies: &Watched<ValidatingAdmissionPolicy>,
) -> BTreeMap<Source, (String, TypeCheck)> {
    let rank = |check: &TypeCheck| match check {
        TypeCheck::Warnings(_) => 0,
        TypeCheck::Pending => 1,
        TypeCheck::Clean => 2,
    };
    compiled
        .iter()
        .filter_map(|(source, names)| {
            let worst = names
                .iter()
                .map(|name| {
                    let check = policies
                        .get(name)
                        .map_or(TypeCheck::Pending, |p| TypeCheck::of(&p));
                    (name.clone(), check)
                })
                .min_by_key(|(_, check)| rank(check))?;
            Some((source.clone(), worst))
        })
        .collect()
}

/// Publishes type-check warnings when they appear or change.
pub struct Reporting {
    recorder: Recorder,
    metrics: Arc<Metrics>,
    /// Warnings last published, by policy name.
    published: BTreeMap<String, Vec<TypeWarning>>,
}

impl Reporting {
    pub fn new(recorder: Recorder, metrics: Arc<Metrics>) -> Self {
        Self {
            recorder,
            metrics,
            published: BTreeMap::new(),
        }
    }

    pub async fn publish(
        &mut self,
        checks: &BTreeMap<Source, (String, TypeCheck)>,
        cascade_policies: &[Arc<CascadePolicy>],
        xrd_refs: &BTreeMap<String, ObjectReference>,
    ) {
        let mut now = BTreeMap::new();
        for (source, (policy, check)) in checks {
            if *check == TypeCheck::Pending {
                // Keep what was known until the new generation is checked.
                if let Some(old) = self.published.get(policy) {
                    now.insert(policy.clone(), old.clone());
                }
                continue;
            }
            let warnings = check.warnings().to_vec();
            self.metrics.set_type_check_warnings(policy, warnings.len());
            if self
                .published
                .get(policy)
                .is_none_or(|old| *old != warnings)
                && !warnings.is_empty()
            {
                let message = describe(policy, &warnings);
                tracing::warn!(%source, reason = REASON, "{message}");
                let reference = match source {
                    Source::Xrd { name, .. } => xrd_refs.get(name).cloned(),
                    Source::CascadePolicy { name } => cascade_policies
                        .iter()
                        .find(|p| p.name_any() == *name)
                        .map(|p| p.object_ref(&())),
                };
                if let Some(reference) = reference {
                    let event = Event {
                        type_: EventType::Warning,
                        reason: REASON.into(),
                        note: Some(truncate(&message, 1000)),
                        action: "TypeCheck".into(),
                        secondary: None,
                    };
                    if let Err(e) = self.recorder.publish(&event, &reference).await {
                        tracing::warn!(%source, error = %e, "cannot publish event");
                    }
                }
            }
            now.insert(policy.clone(), warnings);
        }
        for gone in self.published.keys().filter(|p| !now.contains_key(*p)) {
            self.metrics.forget_type_check_warnings(gone);
        }
        self.published = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(generation: i64, status: serde_json::Value) -> ValidatingAdmissionPolicy {
        serde_json::from_value(json!({
            "metadata": {"name": "cascade-guard-xrd-x", "generation": generation},
            "spec": {},
            "status": status,
        }))
        .expect("policy")
    }

    #[test]
    fn a_policy_is_pending_until_its_current_generation_is_checked() {
        assert_eq!(TypeCheck::of(&policy(1, json!(null))), TypeCheck::Pending);
        assert_eq!(TypeCheck::of(&policy(1, json!({}))), TypeCheck::Pending);
        assert_eq!(
            TypeCheck::of(&policy(1, json!({"observedGeneration": 1}))),
            TypeCheck::Clean,
            "checked, with no typeChecking left"
        );
        let stale = json!({"observedGeneration": 1, "typeChecking": {"expressionWarnings": [
            {"fieldRef": "spec.validations[0].expression", "warning": "old"}]}});
        assert_eq!(TypeCheck::of(&policy(2, stale)), TypeCheck::Pending);
    }

    #[test]
    fn warnings_are_read_sorted_and_an_empty_check_is_clean() {
        assert_eq!(
            TypeCheck::of(&policy(
                3,
                json!({"observedGeneration": 3, "typeChecking": {}})
            )),
            TypeCheck::Clean
        );
        let status = json!({"observedGeneration": 3, "typeChecking": {"expressionWarnings": [
            {"fieldRef": "spec.variables[5].expression", "warning": "b"},
            {"fieldRef": "spec.matchConditions[0].expression", "warning": "a"}]}});
        let check = TypeCheck::of(&policy(3, status));
        let fields: Vec<&str> = check.warnings().iter().map(|w| w.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.matchConditions[0].expression",
                "spec.variables[5].expression"
            ]
        );
    }

    #[test]
    fn the_description_names_the_policy_and_each_expression_on_one_line() {
        let warnings = [TypeWarning {
            field: "spec.variables[5].expression".into(),
            warning: "apps/v1, Kind=Deployment: ERROR: <input>:1:5: undefined field 'x'\n | has(x)\n | ....^"
                .into(),
        }];
        let line = describe("cascade-guard-xrd-x", &warnings);
        assert!(!line.contains('\n'), "{line}");
        assert!(line.starts_with(
            "ValidatingAdmissionPolicy cascade-guard-xrd-x does not type-check on this API server (1 warning): spec.variables[5].expression: apps/v1, Kind=Deployment: ERROR: <input>:1:5: undefined field 'x' | has(x) | ....^;"
        ), "{line}");
    }

    #[test]
    fn the_condition_says_pending_clean_or_what_is_wrong() {
        let warnings = vec![TypeWarning {
            field: "spec.validations[0].expression".into(),
            warning: "undefined field 'x'".into(),
        }];
        let cases = [
            (TypeCheck::Pending, "Unknown", "Pending"),
            (TypeCheck::Clean, "True", "NoWarnings"),
            (TypeCheck::Warnings(warnings), "False", REASON),
        ];
        for (check, status, reason) in cases {
            let c = condition("cascade-guard-policy-leaves", &check, Some(4));
            assert_eq!(
                (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
                (CONDITION, status, reason)
            );
            assert_eq!(c.observed_generation, Some(4));
            assert!(
                c.message.contains("cascade-guard-policy-leaves"),
                "{}",
                c.message
            );
        }
    }
}
