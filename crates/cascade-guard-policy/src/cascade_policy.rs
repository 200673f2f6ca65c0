//! A CascadePolicy's spec, and the one reading of it into what resolution
//! needs ([`CascadePolicyInput`]): typed, as the controller and `status` get
//! it from the API server (whose schema, generated from [`CascadePolicySpec`],
//! has checked it), or leniently from a document in a file
//! ([`read_document`], for `render`), where whatever can be guarded is.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::mode::Mode;
use crate::resolve::{CascadePolicyInput, Problem, Severity, Subject, reasons};

/// Reason for a CascadePolicy document that cannot be read at all.
pub const INVALID_CASCADE_POLICY: &str = "InvalidCascadePolicy";

/// Guards deletes of one custom resource kind.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CascadePolicySpec {
    /// API group of the protected kind. Only CRD-backed kinds can be guarded,
    /// so the core group ("") is not accepted.
    #[schemars(length(min = 1))]
    pub group: String,
    /// Kind to protect, exactly as its CRD spells it (case-sensitive).
    #[schemars(length(min = 1))]
    pub kind: String,
    /// What to do with a delete that would not cascade in the foreground.
    #[serde(default)]
    pub mode: Mode,
    /// Narrows the policy to objects whose labels match. Absent: every object
    /// of the kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "label_selector_schema")]
    pub selector: Option<LabelSelector>,
}

/// The schema of `spec.selector`, written out here: k8s-openapi's `schemars`
/// feature would implement JsonSchema for every Kubernetes type, which more
/// than doubles the build of that crate (43 s of CPU without, 100 s with, in
/// each of the tests', clippy's and the image's builds) for the one type used
/// here. Nullable, as a derived `Option` is in a CRD; its description is the
/// field's doc comment.
fn label_selector_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "nullable": true,
        "type": "object",
        "properties": {
            "matchExpressions": {
                "description": "Requirements on labels, all of which must hold.",
                "type": "array",
                "items": {
                    "description": "One requirement: the label `key` compared with `values` by `operator`.",
                    "type": "object",
                    "properties": {
                        "key": {
                            "description": "The label's key.",
                            "type": "string"
                        },
                        "operator": {
                            "description": "In, NotIn, Exists or DoesNotExist.",
                            "type": "string"
                        },
                        "values": {
                            "description": "The values In and NotIn compare with; empty for Exists and DoesNotExist.",
                            "type": "array",
                            "items": { "type": "string" }
                        }
                    },
                    "required": ["key", "operator"]
                }
            },
            "matchLabels": {
                "description": "Labels the object must carry with exactly these values, all of them.",
                "type": "object",
                "additionalProperties": { "type": "string" }
            }
        }
    })
}

impl CascadePolicySpec {
    /// What resolution needs of the CascadePolicy `name` with this spec.
    pub fn input(&self, name: &str) -> CascadePolicyInput {
        CascadePolicyInput {
            name: name.to_string(),
            group: self.group.clone(),
            kind: self.kind.clone(),
            mode: self.mode,
            selector: self.selector.clone(),
        }
    }
}

/// Reads a CascadePolicy document (`subject` names it: the CascadePolicy,
/// or the document when it has no name) leniently, like the XRD
/// annotation: whatever can be guarded is guarded. The API server's schema
/// would refuse such a document; here a bad mode reads as Refuse and a bad
/// selector as none, each with a problem. None, with an error, when there is
/// nothing to guard: no name, or no group and kind.
pub fn read_document(
    doc: &Value,
    subject: Subject,
    problems: &mut Vec<Problem>,
) -> Option<CascadePolicyInput> {
    let mut fail = |message: String| {
        problems.push(Problem {
            subject: subject.clone(),
            reason: INVALID_CASCADE_POLICY,
            message,
            severity: Severity::Error,
        });
        None
    };
    let Subject::CascadePolicy { name } = &subject else {
        return fail("the CascadePolicy has no metadata.name; it guards nothing".into());
    };
    let (Some(group), Some(kind)) = (
        doc.pointer("/spec/group").and_then(Value::as_str),
        doc.pointer("/spec/kind").and_then(Value::as_str),
    ) else {
        return fail(
            "spec.group and spec.kind must both be strings; the policy guards nothing".into(),
        );
    };
    let mode = match doc.pointer("/spec/mode") {
        None | Some(Value::Null) => Mode::default(),
        Some(value) => match value.as_str().map(Mode::parse_exact) {
            Some(Ok(mode)) => mode,
            _ => {
                problems.push(Problem {
                    subject: subject.clone(),
                    reason: reasons::UNKNOWN_MODE,
                    message: format!(
                        "spec.mode {value} is not one of Refuse, Convert, Warn or Off (exact spelling); the policy is rendered in Refuse mode"
                    ),
                    severity: Severity::Warning,
                });
                Mode::Refuse
            }
        },
    };
    let selector = match doc.pointer("/spec/selector") {
        None | Some(Value::Null) => None,
        Some(value) => match serde_json::from_value(value.clone()) {
            Ok(sel) => Some(sel),
            Err(e) => {
                problems.push(Problem {
                    subject: subject.clone(),
                    reason: reasons::INVALID_SELECTOR,
                    message: format!(
                        "spec.selector cannot be read ({e}); the policy guards every object of its kind instead, which is wider and so safer"
                    ),
                    severity: Severity::Warning,
                });
                None
            }
        },
    };
    let spec = CascadePolicySpec {
        group: group.to_string(),
        kind: kind.to_string(),
        mode,
        selector,
    };
    Some(spec.input(name))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A well-formed document reads as its typed spec does.
    #[test]
    fn a_document_reads_as_the_typed_spec() {
        let doc = json!({
            "apiVersion": "cascade-guard.dev/v1alpha1",
            "kind": "CascadePolicy",
            "metadata": {"name": "dbs"},
            "spec": {
                "group": "db.example.org",
                "kind": "Database",
                "mode": "Convert",
                "selector": {"matchLabels": {"team": "a"}},
            },
        });
        let typed: CascadePolicySpec =
            serde_json::from_value(doc["spec"].clone()).expect("a valid spec");
        let mut problems = Vec::new();
        let subject = Subject::CascadePolicy { name: "dbs".into() };
        assert_eq!(
            read_document(&doc, subject, &mut problems),
            Some(typed.input("dbs"))
        );
        assert_eq!(problems, vec![]);
    }
}
