//! Telling people what a pass made of their input: CascadePolicy status
//! conditions, Events on XRDs and CascadePolicies, and log lines. Each problem
//! is published when it appears or changes, not on every pass.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{EventType, Recorder, Reporter};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use super::apply::Outcome;
use super::limits::condition_message;
use super::type_check;
use crate::api::{CascadePolicy, CascadePolicyStatus};
use crate::cluster::events;
use crate::policy::{Mode, Problem, Severity, Source, Subject};

pub const READY: &str = "Ready";

pub struct Publisher {
    client: Client,
    reporter: Reporter,
    /// What was last published for each subject.
    published: BTreeMap<Subject, BTreeSet<(String, String)>>,
}

impl Publisher {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            reporter,
            client,
            published: BTreeMap::new(),
        }
    }

    pub async fn publish(
        &mut self,
        outcome: &Outcome,
        cascade_policies: &[Arc<CascadePolicy>],
        xrd_refs: &BTreeMap<String, ObjectReference>,
    ) {
        self.events(outcome, cascade_policies, xrd_refs).await;
        if outcome.known.cascade_policies {
            for policy in cascade_policies {
                self.status(policy, outcome).await;
            }
        }
    }

    async fn events(
        &mut self,
        outcome: &Outcome,
        cascade_policies: &[Arc<CascadePolicy>],
        xrd_refs: &BTreeMap<String, ObjectReference>,
    ) {
        let all = problems_of(outcome);
        let mut now: BTreeMap<Subject, BTreeSet<(String, String)>> = BTreeMap::new();
        for p in &all {
            now.entry(p.subject.clone())
                .or_default()
                .insert((p.reason.to_string(), p.message.clone()));
        }
        for (subject, problems) in &now {
            if self.published.get(subject) == Some(problems) {
                continue;
            }
            let reference = match subject {
                Subject::Xrd { name } => xrd_refs.get(name).cloned(),
                Subject::CascadePolicy { name } => cascade_policies
                    .iter()
                    .find(|p| p.name_any() == *name)
                    .map(|p| p.object_ref(&())),
                _ => None,
            };
            // A Recorder of its own for each change: a Recorder counts a
            // repeated reason on the same object as a series of the first
            // event and keeps that event's note, which would go on quoting a
            // value that has since changed (a second typo in a mode).
            let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
            for problem in all.iter().filter(|p| &p.subject == subject) {
                match problem.severity {
                    Severity::Error => {
                        tracing::error!(%subject, reason = problem.reason, "{}", problem.message)
                    }
                    Severity::Warning => {
                        tracing::warn!(%subject, reason = problem.reason, "{}", problem.message)
                    }
                }
                let Some(reference) = &reference else {
                    continue;
                };
                events::publish(
                    &recorder,
                    reference,
                    EventType::Warning,
                    "Compile",
                    problem.reason,
                    &problem.message,
                )
                .await;
            }
        }
        self.published = now;
    }

    async fn status(&self, policy: &CascadePolicy, outcome: &Outcome) {
        let name = policy.name_any();
        let wanted = status_for(policy, outcome);
        let current = policy.status.clone().unwrap_or_default();
        if same_status(&current, &wanted) {
            return;
        }
        let wanted = keep_transition_times(&current, wanted);
        let api: Api<CascadePolicy> = Api::all(self.client.clone());
        let patch = Patch::Merge(json!({ "status": wanted }));
        if let Err(e) = api
            .patch_status(&name, &PatchParams::default(), &patch)
            .await
        {
            tracing::warn!(cascade_policy = %name, error = %e, "cannot update status");
        }
    }
}

/// The status a CascadePolicy should have after a pass (pure).
/// What resolution found, and each XRD whose admission objects could not be
/// written (a CascadePolicy says so in its condition instead). An XRD shares
/// its objects, so one refused write is reported on every XRD it carries.
fn problems_of(outcome: &Outcome) -> Vec<Problem> {
    let mut problems = outcome.resolution.problems.clone();
    for (source, error) in &outcome.failed {
        if let Source::Xrd { .. } = source {
            problems.push(Problem {
                subject: source.subject(),
                reason: APPLY_FAILED,
                message: format!(
                    "cannot write the admission objects that guard this XRD's kind ({error}); the cluster keeps the ones it has, so a kind already guarded stays guarded, and the controller tries again"
                ),
                severity: Severity::Error,
            });
        }
    }
    problems
}

/// The reason of a failed write of admission objects.
pub const APPLY_FAILED: &str = "ApplyFailed";

pub fn status_for(policy: &CascadePolicy, outcome: &Outcome) -> CascadePolicyStatus {
    let name = policy.name_any();
    let source = Source::CascadePolicy { name: name.clone() };
    let subject = source.subject();
    let problems: Vec<_> = outcome
        .resolution
        .problems
        .iter()
        .filter(|p| p.subject == subject)
        .collect();
    let errors: Vec<String> = problems
        .iter()
        .filter(|p| p.severity == Severity::Error)
        .map(|p| p.message.clone())
        .collect();
    let warnings: Vec<String> = problems
        .iter()
        .filter(|p| p.severity == Severity::Warning)
        .map(|p| p.message.clone())
        .collect();
    let compiled = outcome.compiled.get(&source);
    let (status, reason, mut message) = if let Some(error) = outcome.failed.get(&source) {
        ("False", APPLY_FAILED.to_string(), error.clone())
    } else if let Some(first) = problems.iter().find(|p| p.severity == Severity::Error) {
        ("False", first.reason.to_string(), errors.join("; "))
    } else if let Some(objects) = compiled {
        (
            "True",
            "Compiled".to_string(),
            format!(
                "deletes and updates of {} are checked ({} mode) by the ValidatingAdmissionPolicies and bindings {}",
                policy.spec.kind,
                policy.spec.mode,
                objects.join(", ")
            ),
        )
    } else if policy.spec.mode == Mode::Off {
        (
            "True",
            "Off".to_string(),
            format!("mode Off: deletes of {} are not checked", policy.spec.kind),
        )
    } else {
        (
            "False",
            "NotCompiled".to_string(),
            "the policy produced no admission objects".to_string(),
        )
    };
    if !warnings.is_empty() {
        message = format!("{message}; warnings: {}", warnings.join("; "));
    }
    CascadePolicyStatus {
        observed_generation: policy.meta().generation,
        conditions: std::iter::once(Condition {
            type_: READY.into(),
            status: status.into(),
            reason,
            message: condition_message(&message),
            observed_generation: policy.meta().generation,
            last_transition_time: Time(Timestamp::now()),
        })
        .chain(
            outcome
                .type_checks
                .get(&source)
                .map(|(name, check)| type_check::condition(name, check, policy.meta().generation)),
        )
        .collect(),
        compiled_to: compiled.cloned().unwrap_or_default(),
    }
}

/// Equal but for transition times.
fn same_status(a: &CascadePolicyStatus, b: &CascadePolicyStatus) -> bool {
    let strip = |s: &CascadePolicyStatus| {
        let mut s = s.clone();
        for c in &mut s.conditions {
            c.last_transition_time = Time(Timestamp::UNIX_EPOCH);
        }
        s
    };
    strip(a) == strip(b)
}

/// A condition's transition time changes only when its status does.
fn keep_transition_times(
    current: &CascadePolicyStatus,
    mut wanted: CascadePolicyStatus,
) -> CascadePolicyStatus {
    for c in &mut wanted.conditions {
        if let Some(old) = current
            .conditions
            .iter()
            .find(|o| o.type_ == c.type_ && o.status == c.status)
        {
            c.last_transition_time = old.last_transition_time.clone();
        }
    }
    wanted
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Resolution;
    use crate::policy::plan::Known;

    #[test]
    fn a_failed_shared_write_is_a_problem_of_every_xrd_it_carries() {
        let xrd = |name: &str| Source::Xrd {
            name: name.into(),
            annotated: true,
            claim: false,
        };
        let error = "object too large".to_string();
        let outcome = Outcome {
            resolution: Resolution {
                policies: vec![],
                problems: vec![],
            },
            compiled: BTreeMap::new(),
            failed: BTreeMap::from([
                (xrd("as.example.org"), error.clone()),
                (xrd("bs.example.org"), error.clone()),
                (Source::CascadePolicy { name: "c".into() }, error.clone()),
            ]),
            type_checks: BTreeMap::new(),
            known: Known::default(),
        };
        let problems = problems_of(&outcome);
        let subjects: Vec<String> = problems.iter().map(|p| p.subject.to_string()).collect();
        assert_eq!(
            subjects,
            [
                "CompositeResourceDefinition/as.example.org",
                "CompositeResourceDefinition/bs.example.org"
            ]
        );
        for p in &problems {
            assert_eq!(p.reason, APPLY_FAILED);
            assert_eq!(p.severity, Severity::Error);
            assert!(p.message.contains(&error), "{}", p.message);
        }
    }
}
