//! Reading a Crossplane CompositeResourceDefinition (XRD).
//!
//! Only the few fields cascade-guard needs are read, from plain JSON, so any
//! XRD version and any extra fields are accepted.

use serde_json::Value;

use crate::kind::{ProtectedKind, Scope, Shape};
use crate::names::{CROSSPLANE_APIEXTENSIONS_GROUP, DELETION_POLICY_ANNOTATION, XRD_KIND};

/// The parts of an XRD that decide what is protected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Xrd {
    pub name: String,
    /// `apiextensions.crossplane.io/v1` or `/v2`.
    pub api_version: String,
    pub group: String,
    pub kind: String,
    pub plural: String,
    pub scope: Scope,
    /// The raw `cascade-guard.dev/deletion-policy` annotation, if set.
    pub deletion_policy: Option<String>,
    /// `spec.claimNames` (kind, plural) of a legacy XRD that offers a claim.
    pub claim_names: Option<(String, String)>,
}

impl Xrd {
    /// The claim kind it defines, if any: namespaced, in the XRD's group.
    pub fn claim_kind(&self) -> Option<ProtectedKind> {
        let (kind, plural) = self.claim_names.clone()?;
        Some(ProtectedKind {
            group: self.group.clone(),
            kind,
            plural,
            scope: Scope::Namespaced,
            shape: Shape::Claim,
        })
    }

    pub fn protected_kind(&self) -> ProtectedKind {
        ProtectedKind {
            group: self.group.clone(),
            kind: self.kind.clone(),
            plural: self.plural.clone(),
            scope: self.scope,
            shape: Shape::CompositeResource,
        }
    }
}

/// Why an XRD could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum XrdError {
    #[error(
        "not a Crossplane XRD: apiVersion {api_version:?}, kind {kind:?} (expected apiVersion apiextensions.crossplane.io/v1 or /v2, kind CompositeResourceDefinition)"
    )]
    NotAnXrd { api_version: String, kind: String },
    #[error("the XRD has no metadata.name")]
    MissingName,
    #[error("spec.group is missing or empty, so the XRD defines no API group")]
    MissingGroup,
    #[error("spec.names.kind is missing or empty, so the XRD defines no kind")]
    MissingKind,
    #[error("spec.names.plural is missing or empty, so the XRD defines no resource")]
    MissingPlural,
    #[error("spec.versions is missing or empty, so the XRD serves no version of its kind")]
    NoVersions,
    #[error("spec.scope {value} is not one of Namespaced, Cluster or LegacyCluster")]
    UnknownScope { value: String },
}

impl XrdError {
    /// CamelCase reason for status conditions and problem lists.
    pub fn reason(&self) -> &'static str {
        match self {
            XrdError::NotAnXrd { .. } => "NotAnXrd",
            XrdError::MissingName => "MissingName",
            XrdError::MissingGroup => "MissingGroup",
            XrdError::MissingKind => "MissingKind",
            XrdError::MissingPlural => "MissingPlural",
            XrdError::NoVersions => "NoVersions",
            XrdError::UnknownScope { .. } => "UnknownScope",
        }
    }
}

/// What could be read from an XRD that failed [`read_xrd`], so its kind can
/// still be protected when enough is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SalvagedXrd {
    pub name: Option<String>,
    pub group: Option<String>,
    pub kind: Option<String>,
    pub plural: Option<String>,
    pub scope: Scope,
    pub deletion_policy: Option<String>,
}

impl SalvagedXrd {
    /// The kind, if group, kind and plural were all readable.
    pub fn protected_kind(&self) -> Option<ProtectedKind> {
        Some(ProtectedKind {
            group: self.group.clone()?,
            kind: self.kind.clone()?,
            plural: self.plural.clone()?,
            scope: self.scope,
            shape: Shape::CompositeResource,
        })
    }
}

/// Reads an XRD of apiextensions.crossplane.io v1 or v2.
pub fn read_xrd(value: &Value) -> Result<Xrd, XrdError> {
    let api_version = str_at(value, "/apiVersion").unwrap_or_default();
    let kind = str_at(value, "/kind").unwrap_or_default();
    let version = xrd_version(api_version);
    if kind != XRD_KIND || version.is_none() {
        return Err(XrdError::NotAnXrd {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
        });
    }
    let name = str_at(value, "/metadata/name").ok_or(XrdError::MissingName)?;
    let group = str_at(value, "/spec/group").ok_or(XrdError::MissingGroup)?;
    let xr_kind = str_at(value, "/spec/names/kind").ok_or(XrdError::MissingKind)?;
    let plural = str_at(value, "/spec/names/plural").ok_or(XrdError::MissingPlural)?;
    let has_versions = value
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .is_some_and(|v| !v.is_empty());
    if !has_versions {
        return Err(XrdError::NoVersions);
    }
    let scope = read_scope(value, version)?;
    Ok(Xrd {
        name: name.to_string(),
        api_version: api_version.to_string(),
        group: group.to_string(),
        kind: xr_kind.to_string(),
        plural: plural.to_string(),
        scope,
        deletion_policy: deletion_policy_annotation(value),
        claim_names: str_at(value, "/spec/claimNames/kind")
            .zip(str_at(value, "/spec/claimNames/plural"))
            .map(|(k, p)| (k.to_string(), p.to_string())),
    })
}

/// Best-effort reading of a broken XRD's names.
pub fn salvage_xrd(value: &Value) -> SalvagedXrd {
    let owned = |p: &str| str_at(value, p).map(str::to_string);
    let version = str_at(value, "/apiVersion").and_then(xrd_version);
    SalvagedXrd {
        name: owned("/metadata/name"),
        group: owned("/spec/group"),
        kind: owned("/spec/names/kind"),
        plural: owned("/spec/names/plural"),
        scope: read_scope(value, version).unwrap_or(Scope::Unknown),
        deletion_policy: deletion_policy_annotation(value),
    }
}

/// Whether a document claims to be an XRD (of any version), which decides
/// whether a broken one is reported as a broken XRD.
pub fn looks_like_xrd(value: &Value) -> bool {
    let group = str_at(value, "/apiVersion")
        .and_then(|v| v.split_once('/'))
        .map(|(g, _)| g);
    group == Some(CROSSPLANE_APIEXTENSIONS_GROUP) && str_at(value, "/kind") == Some(XRD_KIND)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum XrdVersion {
    V1,
    V2,
}

fn xrd_version(api_version: &str) -> Option<XrdVersion> {
    match api_version.split_once('/') {
        Some((CROSSPLANE_APIEXTENSIONS_GROUP, "v1")) => Some(XrdVersion::V1),
        Some((CROSSPLANE_APIEXTENSIONS_GROUP, "v2")) => Some(XrdVersion::V2),
        _ => None,
    }
}

/// v2 defaults to Namespaced; v1 defaults to LegacyCluster. v1's schema also
/// accepts an explicit scope (a v2 XRD read through v1 shows its real one), so
/// an explicit value is honoured for both.
fn read_scope(value: &Value, version: Option<XrdVersion>) -> Result<Scope, XrdError> {
    match value.pointer("/spec/scope") {
        None | Some(Value::Null) => match version {
            Some(XrdVersion::V2) => Ok(Scope::Namespaced),
            Some(XrdVersion::V1) => Ok(Scope::Cluster),
            None => Err(XrdError::UnknownScope {
                value: "(absent, and the apiVersion does not say the default)".to_string(),
            }),
        },
        Some(Value::String(s)) => match s.as_str() {
            "Namespaced" => Ok(Scope::Namespaced),
            "Cluster" | "LegacyCluster" => Ok(Scope::Cluster),
            _ => Err(XrdError::UnknownScope {
                value: format!("{s:?}"),
            }),
        },
        Some(other) => Err(XrdError::UnknownScope {
            value: other.to_string(),
        }),
    }
}

/// A non-string value (say YAML `true`) is kept as its JSON text so it is
/// reported as an unknown mode rather than silently ignored.
fn deletion_policy_annotation(value: &Value) -> Option<String> {
    let raw = value
        .pointer("/metadata/annotations")?
        .get(DELETION_POLICY_ANNOTATION)?;
    Some(match raw {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    })
}

/// A non-empty string at a JSON pointer.
fn str_at<'a>(value: &'a Value, pointer: &str) -> Option<&'a str> {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;
    use std::path::PathBuf;

    /// The repository's `testdata/` (Crossplane's CRDs, Modelplane's XRDs).
    pub(crate) fn fixtures() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
    }

    pub(crate) fn fixture_dir() -> PathBuf {
        fixtures().join("modelplane/apis")
    }

    /// Every Modelplane XRD fixture, parsed, sorted by directory name.
    pub(crate) fn modelplane_xrds() -> Vec<(String, Value)> {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(fixture_dir())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.join("definition.yaml").is_file())
            .collect();
        dirs.sort();
        dirs.into_iter()
            .map(|d| {
                let text = std::fs::read_to_string(d.join("definition.yaml")).unwrap();
                let name = d.file_name().unwrap().to_string_lossy().into_owned();
                (name, serde_yaml::from_str(&text).unwrap())
            })
            .collect()
    }

    #[test]
    fn reads_every_modelplane_fixture() {
        // (directory, group, kind, plural, scope): written out by hand from the
        // fixtures so a reading bug cannot agree with itself.
        let want = [
            (
                "aksclusters",
                "infrastructure.modelplane.ai",
                "AKSCluster",
                Scope::Namespaced,
            ),
            (
                "eksclusters",
                "infrastructure.modelplane.ai",
                "EKSCluster",
                Scope::Namespaced,
            ),
            (
                "gkeclusters",
                "infrastructure.modelplane.ai",
                "GKECluster",
                Scope::Namespaced,
            ),
            (
                "inferenceclasses",
                "modelplane.ai",
                "InferenceClass",
                Scope::Cluster,
            ),
            (
                "inferenceclusters",
                "modelplane.ai",
                "InferenceCluster",
                Scope::Cluster,
            ),
            (
                "inferencegateways",
                "modelplane.ai",
                "InferenceGateway",
                Scope::Cluster,
            ),
            (
                "modelcaches",
                "modelplane.ai",
                "ModelCache",
                Scope::Namespaced,
            ),
            (
                "modeldeployments",
                "modelplane.ai",
                "ModelDeployment",
                Scope::Namespaced,
            ),
            (
                "modelendpoints",
                "modelplane.ai",
                "ModelEndpoint",
                Scope::Namespaced,
            ),
            (
                "modelreplicas",
                "modelplane.ai",
                "ModelReplica",
                Scope::Namespaced,
            ),
            (
                "modelservices",
                "modelplane.ai",
                "ModelService",
                Scope::Namespaced,
            ),
            (
                "nebiusclusters",
                "infrastructure.modelplane.ai",
                "NebiusCluster",
                Scope::Namespaced,
            ),
            (
                "servingstacks",
                "infrastructure.modelplane.ai",
                "ServingStack",
                Scope::Namespaced,
            ),
            (
                "vultrclusters",
                "infrastructure.modelplane.ai",
                "VultrCluster",
                Scope::Namespaced,
            ),
        ];
        let fixtures = modelplane_xrds();
        assert_eq!(fixtures.len(), want.len(), "fixture set changed");
        for ((dir, value), (want_dir, group, kind, scope)) in fixtures.iter().zip(want) {
            assert_eq!(dir, want_dir);
            let xrd = read_xrd(value).unwrap_or_else(|e| panic!("{dir}: {e}"));
            assert_eq!(xrd.name, format!("{dir}.{group}"));
            assert_eq!(xrd.group, group, "{dir}");
            assert_eq!(xrd.kind, kind, "{dir}");
            assert_eq!(xrd.plural, *dir, "{dir}");
            assert_eq!(xrd.scope, scope, "{dir}");
            assert_eq!(xrd.api_version, "apiextensions.crossplane.io/v2");
            assert_eq!(xrd.deletion_policy, None);
            assert!(looks_like_xrd(value));
        }
    }

    fn xrd(api_version: &str, spec: Value) -> Value {
        json!({
            "apiVersion": api_version,
            "kind": "CompositeResourceDefinition",
            "metadata": {"name": "widgets.example.org"},
            "spec": spec,
        })
    }

    fn good_spec() -> Value {
        json!({
            "group": "example.org",
            "names": {"kind": "Widget", "plural": "widgets"},
            "versions": [{"name": "v1", "served": true, "referenceable": true}],
        })
    }

    fn with(mut spec: Value, pointer: &str, new: Option<Value>) -> Value {
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        let obj = spec.pointer_mut(parent).unwrap().as_object_mut().unwrap();
        match new {
            Some(v) => obj.insert(key.to_string(), v),
            None => obj.remove(key),
        };
        spec
    }

    #[test]
    fn scope_rules() {
        let v1 = "apiextensions.crossplane.io/v1";
        let v2 = "apiextensions.crossplane.io/v2";
        let cases: &[(&str, Option<Value>, Result<Scope, &str>)] = &[
            (v2, None, Ok(Scope::Namespaced)),
            (v2, Some(json!("Namespaced")), Ok(Scope::Namespaced)),
            (v2, Some(json!("Cluster")), Ok(Scope::Cluster)),
            (v2, Some(json!("LegacyCluster")), Ok(Scope::Cluster)),
            (v1, None, Ok(Scope::Cluster)),
            (v1, Some(json!("LegacyCluster")), Ok(Scope::Cluster)),
            (v1, Some(json!("Namespaced")), Ok(Scope::Namespaced)),
            (v2, Some(json!("namespaced")), Err("UnknownScope")),
            (v2, Some(json!("Galaxy")), Err("UnknownScope")),
            (v2, Some(json!(3)), Err("UnknownScope")),
        ];
        for (api_version, scope, want) in cases {
            let spec = with(good_spec(), "/scope", scope.clone());
            let got = read_xrd(&xrd(api_version, spec))
                .map(|x| x.scope)
                .map_err(|e| e.reason());
            assert_eq!(got, *want, "{api_version} {scope:?}");
        }
    }

    #[test]
    fn broken_xrds_are_refused_with_a_reason() {
        let v2 = "apiextensions.crossplane.io/v2";
        let cases: Vec<(&str, Value, &str)> = vec![
            (
                "no versions",
                xrd(v2, with(good_spec(), "/versions", None)),
                "NoVersions",
            ),
            (
                "empty versions",
                xrd(v2, with(good_spec(), "/versions", Some(json!([])))),
                "NoVersions",
            ),
            (
                "versions not a list",
                xrd(v2, with(good_spec(), "/versions", Some(json!("v1")))),
                "NoVersions",
            ),
            (
                "no group",
                xrd(v2, with(good_spec(), "/group", None)),
                "MissingGroup",
            ),
            (
                "empty group",
                xrd(v2, with(good_spec(), "/group", Some(json!("")))),
                "MissingGroup",
            ),
            (
                "no kind",
                xrd(v2, with(good_spec(), "/names/kind", None)),
                "MissingKind",
            ),
            (
                "kind not a string",
                xrd(v2, with(good_spec(), "/names/kind", Some(json!(["X"])))),
                "MissingKind",
            ),
            (
                "no plural",
                xrd(v2, with(good_spec(), "/names/plural", None)),
                "MissingPlural",
            ),
            (
                "no names",
                xrd(v2, with(good_spec(), "/names", None)),
                "MissingKind",
            ),
            (
                "no spec",
                json!({"apiVersion": v2, "kind": "CompositeResourceDefinition", "metadata": {"name": "x"}}),
                "MissingGroup",
            ),
            ("spec is a string", xrd(v2, json!("oops")), "MissingGroup"),
            (
                "no name",
                json!({"apiVersion": v2, "kind": "CompositeResourceDefinition", "spec": good_spec()}),
                "MissingName",
            ),
            (
                "old version",
                xrd("apiextensions.crossplane.io/v1beta1", good_spec()),
                "NotAnXrd",
            ),
            (
                "wrong kind",
                json!({"apiVersion": v2, "kind": "Composition", "spec": good_spec()}),
                "NotAnXrd",
            ),
            ("not an object", json!(["a"]), "NotAnXrd"),
            ("null", Value::Null, "NotAnXrd"),
        ];
        for (what, value, reason) in cases {
            let err = read_xrd(&value).expect_err(what);
            assert_eq!(err.reason(), reason, "{what}: {err}");
            assert!(!err.to_string().is_empty());
        }
    }

    #[test]
    fn salvage_keeps_what_it_can() {
        let v2 = "apiextensions.crossplane.io/v2";
        let broken = xrd(v2, with(good_spec(), "/versions", None));
        let s = salvage_xrd(&broken);
        let k = s.protected_kind().unwrap();
        assert_eq!(k.to_string(), "Widget.example.org");
        assert_eq!(k.scope, Scope::Namespaced);
        assert_eq!(s.name.as_deref(), Some("widgets.example.org"));

        let bad_scope = xrd(v2, with(good_spec(), "/scope", Some(json!("Galaxy"))));
        assert_eq!(salvage_xrd(&bad_scope).scope, Scope::Unknown);

        let no_plural = xrd(v2, with(good_spec(), "/names/plural", None));
        assert_eq!(salvage_xrd(&no_plural).protected_kind(), None);
    }

    #[test]
    fn annotation_values() {
        let cases: &[(Option<Value>, Option<&str>)] = &[
            (None, None),
            (Some(json!("Warn")), Some("Warn")),
            (Some(json!("")), Some("")),
            (Some(Value::Null), Some("")),
            (Some(json!(true)), Some("true")),
        ];
        for (annotation, want) in cases {
            let mut v = xrd("apiextensions.crossplane.io/v2", good_spec());
            if let Some(a) = annotation {
                v["metadata"]["annotations"] = json!({ DELETION_POLICY_ANNOTATION: a });
            }
            assert_eq!(read_xrd(&v).unwrap().deletion_policy.as_deref(), *want);
        }
    }
}
