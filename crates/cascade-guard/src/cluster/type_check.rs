//! What the API server's type check says of an admission policy
//! cascade-guard wrote. A policy whose expressions do not type-check against
//! the schema of the kinds it matches may fail at admission time and then
//! protects nothing (or refuses everything): kube-controller-manager's
//! validatingadmissionpolicy-status-controller records each problem in the
//! policy's `status.typeChecking`. The controller tells people about it (see
//! `controller::sync::type_check`), and so does `cascade-guard status`.

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use kube::ResourceExt;

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
}
