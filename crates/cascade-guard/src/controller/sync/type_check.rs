//! Telling people when the API server could not type-check the admission
//! policies cascade-guard wrote ([`crate::cluster::type_check`]): a Warning
//! Event on the XRD or CascadePolicy the policy comes from, a `TypeChecked`
//! condition on CascadePolicies, and a metric.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::{EventType, Recorder};
use kube::{Resource, ResourceExt};

use super::limits::condition_message;
use super::sources::WatchCache;
use crate::api::CascadePolicy;
use crate::cluster::events;
use crate::cluster::type_check::{TypeCheck, TypeWarning, describe};
use crate::controller::telemetry::Metrics;
use crate::policy::Source;

/// The reason of the Warning Event and of the condition when a policy has
/// type-check warnings.
pub const REASON: &str = "TypeCheckWarnings";

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
            condition_message(&describe(policy, warnings)),
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
    policies: &WatchCache<ValidatingAdmissionPolicy>,
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
                    events::publish(
                        &self.recorder,
                        &reference,
                        EventType::Warning,
                        "TypeCheck",
                        REASON,
                        &message,
                    )
                    .await;
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
