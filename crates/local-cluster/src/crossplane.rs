//! The parts of Crossplane that tests need without Crossplane running: its
//! real CRDs (from the repository's `testdata/`) and the CRD Crossplane generates for an
//! XRD (crossplane-runtime pkg/xcrd), faithfully enough for admission and the
//! garbage collector, and no more.

use std::path::{Path, PathBuf};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

/// The repository's `testdata/`: Crossplane's CRDs and Modelplane's XRDs,
/// with their licences and origin (`testdata/README.md`).
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

/// Reads one YAML document from the fixtures, e.g.
/// `crossplane-crds/apiextensions.crossplane.io_compositeresourcedefinitions.yaml`.
pub fn fixture(relative: &str) -> Result<Value, String> {
    read_yaml(&fixtures_dir().join(relative))
}

pub fn read_yaml(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_yaml::from_str(&text).map_err(|e| format!("cannot parse {}: {e}", path.display()))
}

/// One of Crossplane's own CRDs from the fixtures (XRD, Composition, Usage,
/// ClusterUsage), by file name under `crossplane-crds/`.
pub fn crossplane_crd(file: &str) -> Result<CustomResourceDefinition, String> {
    let value = fixture(&format!("crossplane-crds/{file}"))?;
    serde_json::from_value(value).map_err(|e| format!("{file} is not a CRD: {e}"))
}

pub const XRD_CRD: &str = "apiextensions.crossplane.io_compositeresourcedefinitions.yaml";
pub const USAGE_CRD: &str = "protection.crossplane.io_usages.yaml";
pub const CLUSTER_USAGE_CRD: &str = "protection.crossplane.io_clusterusages.yaml";

/// The CRD Crossplane would generate for a v2 XRD: each version's schema,
/// plus `spec.crossplane` (composition selection and `resourceRefs`, the list
/// of composed resources) and `status.conditions`/`status.crossplane`.
/// LegacyCluster XRDs get `spec.resourceRefs` instead, as legacy XRs do.
pub fn xrd_to_crd(xrd: &Value) -> Result<CustomResourceDefinition, String> {
    let text = |p: &str| {
        xrd.pointer(p)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("XRD has no {p}"))
    };
    let group = text("/spec/group")?;
    let kind = text("/spec/names/kind")?;
    let plural = text("/spec/names/plural")?;
    let scope = xrd
        .pointer("/spec/scope")
        .and_then(Value::as_str)
        .unwrap_or("Namespaced");
    let legacy = scope == "LegacyCluster";
    let versions = xrd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .filter(|v| !v.is_empty())
        .ok_or("XRD has no versions")?;
    let storage = versions
        .iter()
        .find(|v| v["referenceable"] == json!(true))
        .or(versions.first())
        .and_then(|v| v["name"].as_str())
        .unwrap_or_default()
        .to_string();
    let refs = json!({
        "type": "array",
        "x-kubernetes-list-type": "atomic",
        "items": {"type": "object", "required": ["apiVersion", "kind"], "properties": {
            "apiVersion": {"type": "string"}, "kind": {"type": "string"},
            "name": {"type": "string"}, "namespace": {"type": "string"}
        }}
    });
    let mut crd_versions = Vec::new();
    for v in versions {
        let name = v["name"].as_str().ok_or("XRD version without a name")?;
        let mut schema = v
            .pointer("/schema/openAPIV3Schema")
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"}));
        let props = schema
            .as_object_mut()
            .ok_or("schema is not an object")?
            .entry("properties")
            .or_insert_with(|| json!({}));
        let spec = props
            .as_object_mut()
            .ok_or("schema properties is not an object")?
            .entry("spec")
            .or_insert_with(|| json!({"type": "object"}));
        let spec_props = spec
            .as_object_mut()
            .ok_or("spec schema is not an object")?
            .entry("properties")
            .or_insert_with(|| json!({}));
        let spec_props = spec_props
            .as_object_mut()
            .ok_or("spec properties is not an object")?;
        if legacy {
            spec_props.insert("resourceRefs".into(), refs.clone());
        } else {
            spec_props.insert(
                "crossplane".into(),
                json!({"type": "object", "properties": {
                    "compositionRef": {"type": "object", "properties": {"name": {"type": "string"}}},
                    "compositionSelector": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "compositionRevisionRef": {"type": "object", "properties": {"name": {"type": "string"}}},
                    "compositionRevisionSelector": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "compositionUpdatePolicy": {"type": "string"},
                    "resourceRefs": refs,
                }}),
            );
        }
        let props = props.as_object_mut().ok_or("schema properties")?;
        let status = props
            .entry("status")
            .or_insert_with(|| json!({"type": "object"}));
        let status_props = status
            .as_object_mut()
            .ok_or("status schema is not an object")?
            .entry("properties")
            .or_insert_with(|| json!({}));
        if let Some(status_props) = status_props.as_object_mut() {
            status_props.insert(
                "conditions".into(),
                json!({"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}),
            );
            status_props.insert(
                "crossplane".into(),
                json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
            );
        }
        crd_versions.push(json!({
            "name": name,
            "served": v["served"].as_bool().unwrap_or(true),
            "storage": name == storage,
            "schema": {"openAPIV3Schema": schema},
            "subresources": {"status": {}},
            "additionalPrinterColumns": v.get("additionalPrinterColumns").cloned().unwrap_or(json!([])),
        }));
    }
    let mut names = json!({
        "kind": kind,
        "plural": plural,
        "singular": kind.to_lowercase(),
        "listKind": format!("{kind}List"),
    });
    for key in ["categories", "shortNames"] {
        if let Some(v) = xrd.pointer(&format!("/spec/names/{key}")) {
            names[key] = v.clone();
        }
    }
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {
            "group": group,
            "names": names,
            "scope": if scope == "Namespaced" { "Namespaced" } else { "Cluster" },
            "versions": crd_versions,
        }
    });
    serde_json::from_value(crd).map_err(|e| format!("generated CRD for {kind} is invalid: {e}"))
}

/// Crossplane's CompositeResourceDefinition, as v2 serves it.
pub fn xrd_resource() -> kube::api::ApiResource {
    kube::api::ApiResource {
        group: "apiextensions.crossplane.io".into(),
        version: "v2".into(),
        api_version: "apiextensions.crossplane.io/v2".into(),
        kind: "CompositeResourceDefinition".into(),
        plural: "compositeresourcedefinitions".into(),
    }
}
