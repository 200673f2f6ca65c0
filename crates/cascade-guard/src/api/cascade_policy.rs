//! `CascadePolicy`: guards deletes of any CRD-backed kind, for kinds whose
//! definition cascade-guard cannot annotate (not an XRD, or an XRD from a
//! package someone else owns).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::policy;
use crate::policy::CascadePolicyInput;

/// Guards deletes of one custom resource kind.
// Each printcolumn(...) repeats `type_ = "string"`, which clippy takes for a
// duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[kube(
    group = "cascade-guard.dev",
    version = "v1alpha1",
    kind = "CascadePolicy",
    shortname = "cpol",
    status = "CascadePolicyStatus",
    derive = "PartialEq",
    doc = "Makes deletes of one custom resource kind cascade in the foreground.",
    printcolumn(name = "Kind", type_ = "string", json_path = ".spec.kind"),
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.mode"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    )
)]
// The spec is the policy crate's (`render` reads files into it too), wrapped
// so that kube's derive can build the resource and its CRD around it.
#[serde(transparent)]
pub struct ApiSpec(pub policy::CascadePolicySpec);

impl std::ops::Deref for ApiSpec {
    type Target = policy::CascadePolicySpec;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// What cascade-guard made of a CascadePolicy.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CascadePolicyStatus {
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Names of the admission objects generated for this policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compiled_to: Vec<String>,
}

/// The schema of `status.conditions`, written out here rather than derived:
/// k8s-openapi's `schemars` feature would implement JsonSchema for every
/// Kubernetes type, more than doubling that crate's build, for this one list
/// (see the policy crate's `spec.selector`).
fn conditions_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "The policy's conditions: Ready, and why not when it is not.",
        "type": "array",
        "items": {
            "description": "One condition, as Kubernetes conditions are written.",
            "type": "object",
            "properties": {
                "lastTransitionTime": {
                    "description": "When the status last changed.",
                    "type": "string",
                    "format": "date-time"
                },
                "message": {
                    "description": "What the reason means for this policy, for people.",
                    "type": "string"
                },
                "observedGeneration": {
                    "description": "The metadata.generation the condition was written for.",
                    "type": "integer",
                    "format": "int64"
                },
                "reason": {
                    "description": "Why, in one CamelCase word.",
                    "type": "string"
                },
                "status": {
                    "description": "True, False or Unknown.",
                    "type": "string"
                },
                "type": {
                    "description": "The condition's type, such as Ready.",
                    "type": "string"
                }
            },
            "required": ["lastTransitionTime", "message", "reason", "status", "type"]
        }
    })
}

impl CascadePolicy {
    /// What policy resolution needs of this object; None for an unnamed one,
    /// which the API server never returns.
    pub fn resolution_input(&self) -> Option<CascadePolicyInput> {
        let name = self.metadata.name.as_deref().filter(|n| !n.is_empty())?;
        Some(self.spec.input(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Mode;
    use kube::CustomResourceExt;

    #[test]
    fn resolution_input_takes_what_resolution_needs() {
        let spec = ApiSpec(policy::CascadePolicySpec {
            group: "db.example.org".into(),
            kind: "Database".into(),
            mode: Mode::Convert,
            selector: None,
        });
        let mut policy = CascadePolicy::new("p", spec);
        assert_eq!(
            policy.resolution_input(),
            Some(CascadePolicyInput {
                name: "p".into(),
                group: "db.example.org".into(),
                kind: "Database".into(),
                mode: Mode::Convert,
                selector: None,
            })
        );
        policy.metadata.name = None;
        assert_eq!(policy.resolution_input(), None);
    }

    #[test]
    fn crd_serialises_to_yaml() {
        let crd = CascadePolicy::crd();
        let yaml = serde_yaml::to_string(&crd).unwrap();
        assert!(yaml.contains("name: cascadepolicies.cascade-guard.dev"));
        let json = serde_json::to_value(&crd).unwrap();
        let version = &json["spec"]["versions"][0];
        assert_eq!(json["spec"]["scope"], "Cluster");
        assert_eq!(
            json["spec"]["names"]["shortNames"],
            serde_json::json!(["cpol"])
        );
        assert_eq!(version["name"], "v1alpha1");
        let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(
            spec["properties"]["mode"]["enum"],
            serde_json::json!(["Refuse", "Convert", "Warn", "Off"])
        );
        assert_eq!(spec["properties"]["mode"]["default"], "Refuse");
        assert_eq!(spec["required"], serde_json::json!(["group", "kind"]));
        let columns: Vec<&str> = version["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(columns, ["Kind", "Mode", "Ready"]);
        assert!(version["subresources"]["status"].is_object());
    }
}
