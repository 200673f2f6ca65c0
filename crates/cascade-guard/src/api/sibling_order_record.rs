//! `SiblingOrderRecord`: sibling order's own state, which its admission
//! policies read as their parameter. Two objects in the controller's
//! namespace, both written only by the controller: what it holds
//! (`cascade-guard-holds`) and which trees it ordered
//! (`cascade-guard-ordered-trees`).
//!
//! Shaped like a ConfigMap (a `data` map of strings at the top), so that a
//! policy reads `params.data[key]`, but a kind of cascade-guard's own: the
//! API server hands a custom resource to CEL as it keeps it, unstructured,
//! where it converts a built-in ConfigMap whole, managed fields included, at
//! every evaluation of a policy that sees every DELETE. And granting `get` on
//! every object of this kind, which the API server asks of whoever writes a
//! policy reading it, shows nothing but cascade-guard's own records.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::policy::hold::{SIBLING_ORDER_LABEL, record_crd_name};
use crate::policy::names::{
    GROUP, MANAGED_BY_LABEL, MANAGED_BY_VALUE, SIBLING_ORDER_RECORD_KIND,
    SIBLING_ORDER_RECORD_PLURAL, SIBLING_ORDER_RECORD_VERSION,
};

/// One record: keys to strings, as the policy reading it expects them.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct SiblingOrderRecord {
    /// Carried so that a record created from this struct names its kind.
    #[serde(rename = "apiVersion", default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<BTreeMap<String, String>>,
}

impl kube::Resource for SiblingOrderRecord {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(SIBLING_ORDER_RECORD_KIND)
    }

    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(GROUP)
    }

    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(SIBLING_ORDER_RECORD_VERSION)
    }

    fn api_version(_: &()) -> Cow<'_, str> {
        Cow::Owned(format!("{GROUP}/{SIBLING_ORDER_RECORD_VERSION}"))
    }

    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(SIBLING_ORDER_RECORD_PLURAL)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl SiblingOrderRecord {
    /// A record to create, of cascade-guard's labels.
    pub fn new(name: &str, what: &str, data: &BTreeMap<String, String>) -> Self {
        let label = |k: &str, v: &str| (k.to_string(), v.to_string());
        Self {
            api_version: format!("{GROUP}/{SIBLING_ORDER_RECORD_VERSION}"),
            kind: SIBLING_ORDER_RECORD_KIND.to_string(),
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: Some(BTreeMap::from([
                    label(SIBLING_ORDER_LABEL, "true"),
                    label(MANAGED_BY_LABEL, MANAGED_BY_VALUE),
                ])),
                annotations: Some(BTreeMap::from([label("cascade-guard.dev/what", what)])),
                ..ObjectMeta::default()
            },
            data: Some(data.clone()),
        }
    }

    /// Its CustomResourceDefinition. Written by hand rather than derived:
    /// the data sits at the top, as in a ConfigMap, not under `spec`.
    pub fn crd() -> CustomResourceDefinition {
        let value = json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": { "name": record_crd_name() },
            "spec": {
                "group": GROUP,
                "names": {
                    "kind": SIBLING_ORDER_RECORD_KIND,
                    "listKind": format!("{SIBLING_ORDER_RECORD_KIND}List"),
                    "plural": SIBLING_ORDER_RECORD_PLURAL,
                    "singular": SIBLING_ORDER_RECORD_KIND.to_lowercase(),
                    "categories": ["cascade-guard"],
                },
                "scope": "Namespaced",
                "versions": [{
                    "name": SIBLING_ORDER_RECORD_VERSION,
                    "served": true,
                    "storage": true,
                    "schema": { "openAPIV3Schema": {
                        "description": "Sibling order's record, written only by the cascade-guard controller and read by its admission policies: cascade-guard-holds names every object held (Kind_group_namespace_name to the root's uid, its Kind.group and what it waits for); cascade-guard-ordered-trees gives each root's uid the generation at which its tree was ordered, or why it is not.",
                        "type": "object",
                        "properties": {
                            "apiVersion": { "type": "string" },
                            "kind": { "type": "string" },
                            "metadata": { "type": "object" },
                            "data": {
                                "description": "Key to value, as in a ConfigMap.",
                                "type": "object",
                                "additionalProperties": { "type": "string" },
                            },
                        },
                    }},
                    "additionalPrinterColumns": [{
                        "name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp",
                    }],
                }],
            },
        });
        // The value above is a constant of this function, fit for the type.
        serde_json::from_value(value).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    #[test]
    fn the_crd_matches_the_kind_the_policies_read() {
        let crd = SiblingOrderRecord::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("siblingorderrecords.cascade-guard.dev")
        );
        assert_eq!(crd.spec.group, "cascade-guard.dev");
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.kind, "SiblingOrderRecord");
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        let schema = serde_json::to_value(&version.schema).expect("schema");
        assert_eq!(
            schema["openAPIV3Schema"]["properties"]["data"]["additionalProperties"],
            json!({"type": "string"})
        );
        assert_eq!(
            SiblingOrderRecord::api_version(&()),
            "cascade-guard.dev/v1alpha1"
        );
        assert_eq!(SiblingOrderRecord::plural(&()), "siblingorderrecords");
    }

    #[test]
    fn a_record_to_create_names_its_kind_and_round_trips() {
        let data = BTreeMap::from([("k".to_string(), "v".to_string())]);
        let record = SiblingOrderRecord::new("cascade-guard-holds", "what", &data);
        let body = serde_json::to_value(&record).expect("serializes");
        assert_eq!(body["apiVersion"], "cascade-guard.dev/v1alpha1");
        assert_eq!(body["kind"], "SiblingOrderRecord");
        assert_eq!(
            body["metadata"]["labels"]["cascade-guard.dev/sibling-order"],
            "true"
        );
        let back: SiblingOrderRecord = serde_json::from_value(body).expect("reads back");
        assert_eq!(back, record);
    }
}
