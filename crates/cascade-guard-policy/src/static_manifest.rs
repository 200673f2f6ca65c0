//! Static protection: the compiled admission objects written as manifests for
//! the API server's `staticManifestsDir` (manifest-based admission control,
//! KEP-5793: alpha behind a feature gate in 1.36, on by default from 1.37).
//! The API server loads them from files and serves them outside the API, so
//! nobody can delete or edit them through it, cluster-admin included.
//!
//! The loader's rules (k8s.io/apiserver `pkg/admission/plugin/manifest`,
//! `pkg/admission/plugin/policy/manifest/loader`): every name ends in
//! [`STATIC_SUFFIX`], a binding's `policyName` too, and names a policy in the
//! same directory; no `paramKind` or `paramRef`; documents are decoded
//! strictly (no unknown fields) and validated like API objects; one bad
//! document fails the whole directory (at start-up the API server does not
//! start; on a reload it keeps the set it had).

use std::collections::BTreeSet;

use serde_json::Value;

use crate::admission::Compiled;
use crate::names::{PROTECTED_KIND_ANNOTATION, PROTECTED_KINDS_ANNOTATION};

/// The suffix the API server reserves for static admission objects.
pub const STATIC_SUFFIX: &str = ".static.k8s.io";
/// The file cascade-guard writes in the directory (the loader reads
/// `.yaml`, `.yml` and `.json` files in name order).
pub const FILE_NAME: &str = "cascade-guard.yaml";
/// The feature gate of manifest-based admission control.
pub const FEATURE_GATE: &str = "ManifestBasedAdmissionControlConfig";
/// The first minor release with the feature (alpha, gate off by default).
pub const FIRST_MINOR: u32 = 36;
/// The first minor release with the gate on by default (beta).
pub const DEFAULT_ON_MINOR: u32 = 37;
/// An admission object's name is a DNS subdomain.
const NAME_MAX: usize = 253;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StaticError {
    #[error(
        "static admission manifests need Kubernetes 1.{FIRST_MINOR} or newer (1.{FIRST_MINOR} with the feature gate {FEATURE_GATE}=true, on by default from 1.{DEFAULT_ON_MINOR}); the API server is {0}"
    )]
    ReleaseTooOld(String),
    #[error("the Kubernetes release {0:?} cannot be read as 1.MINOR")]
    UnknownRelease(String),
    #[error("{kind} {name}: {field} is not allowed in a static manifest")]
    FieldRefused {
        kind: &'static str,
        name: String,
        field: &'static str,
    },
    #[error(
        "{kind} {name}: with the suffix {STATIC_SUFFIX} the name is longer than {NAME_MAX} characters"
    )]
    NameTooLong { kind: &'static str, name: String },
    #[error("{kind} is not an admission policy or binding: only those go in a static manifest")]
    NotAdmission { kind: String },
    #[error("{kind} without a name")]
    Unnamed { kind: &'static str },
}

/// Whether a release (as `major`, `minor` of the version API, e.g. "1",
/// "36+") can load static manifests. The gate of 1.36 cannot be read from
/// here: `status` reads it from the API server's metrics.
pub fn release_supports(major: &str, minor: &str) -> Result<(), StaticError> {
    let digits: String = minor.chars().take_while(char::is_ascii_digit).collect();
    match (major, digits.parse::<u32>()) {
        ("1", Ok(m)) if m >= FIRST_MINOR => Ok(()),
        ("1", Ok(_)) => Err(StaticError::ReleaseTooOld(format!("1.{minor}"))),
        _ => Err(StaticError::UnknownRelease(format!("{major}.{minor}"))),
    }
}

/// Reads a release given as `1.36`, `v1.36.5` or `1.36+` into (major, minor).
pub fn parse_release(release: &str) -> Result<(String, String), StaticError> {
    let trimmed = release.trim().trim_start_matches('v');
    let mut parts = trimmed.split('.');
    match (parts.next(), parts.next()) {
        (Some(major), Some(minor)) if !major.is_empty() && !minor.is_empty() => {
            Ok((major.to_string(), minor.to_string()))
        }
        _ => Err(StaticError::UnknownRelease(release.to_string())),
    }
}

/// The static name of an API-served object's name.
pub fn static_name(name: &str) -> String {
    format!("{name}{STATIC_SUFFIX}")
}

fn checked_name(kind: &'static str, name: Option<&str>) -> Result<String, StaticError> {
    let name = name.ok_or(StaticError::Unnamed { kind })?;
    let renamed = static_name(name);
    if renamed.len() > NAME_MAX {
        return Err(StaticError::NameTooLong {
            kind,
            name: name.to_string(),
        });
    }
    Ok(renamed)
}

/// The compiled pairs as static documents: policy, then binding, in order.
pub fn to_static(compiled: &[Compiled]) -> Result<Vec<Value>, StaticError> {
    let docs: Vec<Value> = compiled
        .iter()
        // Typed objects always serialise to JSON.
        .flat_map(|pair| {
            [
                serde_json::to_value(&pair.policy).unwrap_or(Value::Null),
                serde_json::to_value(&pair.binding).unwrap_or(Value::Null),
            ]
        })
        .collect();
    to_static_documents(&docs)
}

/// Admission objects (as `render` writes them) as static documents. Only
/// what the loader accepts is kept of the metadata (name, labels,
/// annotations) and `status` goes; a field it refuses, or an object of
/// another kind, is an error, never silently dropped.
pub fn to_static_documents(docs: &[Value]) -> Result<Vec<Value>, StaticError> {
    docs.iter().map(to_static_document).collect()
}

fn to_static_document(doc: &Value) -> Result<Value, StaticError> {
    let (kind, param_field, param_pointer): (&'static str, _, _) =
        match doc.get("kind").and_then(Value::as_str) {
            Some("ValidatingAdmissionPolicy") => (
                "ValidatingAdmissionPolicy",
                "spec.paramKind",
                "/spec/paramKind",
            ),
            Some("ValidatingAdmissionPolicyBinding") => (
                "ValidatingAdmissionPolicyBinding",
                "spec.paramRef",
                "/spec/paramRef",
            ),
            other => {
                return Err(StaticError::NotAdmission {
                    kind: other.unwrap_or("an object without a kind").to_string(),
                });
            }
        };
    let name = checked_name(kind, doc.pointer("/metadata/name").and_then(Value::as_str))?;
    if doc.pointer(param_pointer).is_some_and(|v| !v.is_null()) {
        return Err(StaticError::FieldRefused {
            kind,
            name,
            field: param_field,
        });
    }
    let mut out = doc.clone();
    if let Some(map) = out.as_object_mut() {
        map.remove("status");
        let mut metadata = serde_json::Map::new();
        metadata.insert("name".into(), Value::String(name));
        for key in ["labels", "annotations"] {
            if let Some(v) = doc.pointer(&format!("/metadata/{key}")) {
                metadata.insert(key.into(), v.clone());
            }
        }
        map.insert("metadata".into(), Value::Object(metadata));
    }
    if kind == "ValidatingAdmissionPolicyBinding" {
        let policy = checked_name(
            "ValidatingAdmissionPolicyBinding policyName of",
            doc.pointer("/spec/policyName").and_then(Value::as_str),
        )?;
        if let Some(spec) = out.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("policyName".into(), Value::String(policy));
        }
    }
    Ok(out)
}

/// The file cascade-guard writes: a comment, then every document.
pub fn manifest(compiled: &[Compiled]) -> Result<String, StaticError> {
    Ok(with_header(&to_static(compiled)?))
}

/// Static documents as a file, behind a comment that says what it is. The
/// comment sits inside the first document: a document of comments alone
/// reads as null, which the loader refuses.
pub fn with_header(docs: &[Value]) -> String {
    let stream = crate::yaml_stream::to_yaml_stream(docs);
    let header = "# Written by cascade-guard: the admission objects it compiles, served by the\n\
                  # API server from this directory (staticManifestsDir). Edits are overwritten;\n\
                  # to take static protection away, delete this file.\n";
    match stream.strip_prefix("---\n") {
        Some(rest) => format!("---\n{header}{rest}"),
        // No policy in force: an empty file, which the loader skips.
        None => String::new(),
    }
}

/// The protected kinds a static manifest carries (as `Kind.group`), read
/// from the annotations cascade-guard puts on every policy.
pub fn protected_kinds(docs: &[Value]) -> BTreeSet<String> {
    let mut kinds = BTreeSet::new();
    for doc in docs {
        if doc.get("kind").and_then(Value::as_str) != Some("ValidatingAdmissionPolicy") {
            continue;
        }
        let Some(annotations) = doc.pointer("/metadata/annotations") else {
            continue;
        };
        if let Some(kind) = annotations
            .get(PROTECTED_KIND_ANNOTATION)
            .and_then(Value::as_str)
        {
            kinds.insert(kind.to_string());
        }
        if let Some(Ok(Value::Object(many))) = annotations
            .get(PROTECTED_KINDS_ANNOTATION)
            .and_then(Value::as_str)
            .map(serde_json::from_str::<Value>)
        {
            kinds.extend(many.keys().cloned());
        }
    }
    kinds
}

/// What the API server's metrics say of its static admission policies.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ServerReport {
    /// `kubernetes_feature_enabled` for the gate; None when not reported.
    pub gate_enabled: Option<bool>,
    /// The hash of the directory it last loaded
    /// (`apiserver_manifest_admission_config_controller_last_config_info`).
    pub loaded_hash: Option<String>,
    /// Reloads that failed (the directory did not load; the last good set stays).
    pub failed_reloads: u64,
}

/// Reads the API server's `/metrics` (Prometheus text) for its static
/// ValidatingAdmissionPolicies.
pub fn server_report(metrics: &str) -> ServerReport {
    let mut report = ServerReport::default();
    for line in metrics.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        let label = |key: &str| label_value(labels, key);
        match name {
            "kubernetes_feature_enabled" if label("name").as_deref() == Some(FEATURE_GATE) => {
                report.gate_enabled = Some(value.trim() == "1");
            }
            "apiserver_manifest_admission_config_controller_last_config_info"
                if label("plugin").as_deref() == Some("ValidatingAdmissionPolicy") =>
            {
                report.loaded_hash = label("hash").filter(|h| !h.is_empty());
            }
            "apiserver_manifest_admission_config_controller_automatic_reloads_total"
                if label("plugin").as_deref() == Some("ValidatingAdmissionPolicy")
                    && label("status").as_deref() == Some("failure") =>
            {
                report.failed_reloads += value.trim().parse::<f64>().unwrap_or(0.0) as u64;
            }
            _ => {}
        }
    }
    report
}

/// One label's value of a Prometheus series (`a="x",b="y"`); values are
/// plain here (names, hashes), so escapes are not undone.
fn label_value(labels: &str, key: &str) -> Option<String> {
    let mut rest = labels;
    while !rest.is_empty() {
        let (k, after) = rest.split_once("=\"")?;
        let end = after.find('"')?;
        if k.trim_start_matches(',').trim() == key {
            return Some(after[..end].to_string());
        }
        rest = after[end + 1..].trim_start_matches(',');
    }
    None
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
        ValidatingAdmissionPolicyBindingSpec,
    };

    use super::*;

    #[test]
    fn releases_before_1_36_are_refused_with_the_minimum_named() {
        for (major, minor, ok) in [
            ("1", "30", false),
            ("1", "35", false),
            ("1", "35+", false),
            ("1", "36", true),
            ("1", "37", true),
            ("1", "40+", true),
        ] {
            let result = release_supports(major, minor);
            assert_eq!(result.is_ok(), ok, "{major}.{minor}");
            if let Err(e) = result {
                let message = e.to_string();
                assert!(message.contains("1.36 or newer"), "{message}");
                assert!(message.contains(FEATURE_GATE), "{message}");
            }
        }
        assert!(matches!(
            release_supports("2", "0"),
            Err(StaticError::UnknownRelease(_))
        ));
        assert_eq!(parse_release("v1.36.5").unwrap(), ("1".into(), "36".into()));
        assert_eq!(parse_release("1.37").unwrap(), ("1".into(), "37".into()));
        assert!(parse_release("137").is_err());
    }

    /// A policy and binding with no parameter, labelled, as the compiled
    /// ones are.
    fn sample() -> Compiled {
        let metadata =
            crate::sibling::hold_policy::sibling_order_metadata("cascade-guard-sibling-order");
        Compiled {
            policy: ValidatingAdmissionPolicy {
                metadata: metadata.clone(),
                spec: Some(Default::default()),
                status: None,
            },
            binding: ValidatingAdmissionPolicyBinding {
                metadata,
                spec: ValidatingAdmissionPolicyBindingSpec {
                    policy_name: "cascade-guard-sibling-order".into(),
                    validation_actions: vec!["Deny".into()],
                    match_resources: None,
                    param_ref: None,
                },
            },
        }
    }

    #[test]
    fn names_and_policy_names_carry_the_suffix_and_nothing_the_loader_refuses() {
        let mut hold = sample();
        hold.policy.metadata.resource_version = Some("12".into());
        hold.policy.metadata.uid = Some("u".into());
        let docs = to_static(&[hold]).unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(
            docs[0].pointer("/metadata/name").and_then(Value::as_str),
            Some("cascade-guard-sibling-order.static.k8s.io")
        );
        assert_eq!(docs[0]["kind"], "ValidatingAdmissionPolicy");
        assert_eq!(
            docs[0]["apiVersion"], "admissionregistration.k8s.io/v1",
            "the loader decodes admissionregistration.k8s.io/v1 only"
        );
        assert!(docs[0].pointer("/metadata/resourceVersion").is_none());
        assert!(docs[0].pointer("/metadata/uid").is_none());
        assert!(docs[0].get("status").is_none());
        assert!(docs[0].pointer("/metadata/labels").is_some());
        assert_eq!(docs[1]["kind"], "ValidatingAdmissionPolicyBinding");
        assert_eq!(
            docs[1].pointer("/spec/policyName").and_then(Value::as_str),
            Some("cascade-guard-sibling-order.static.k8s.io")
        );
    }

    #[test]
    fn a_param_kind_or_an_overlong_name_is_an_error_not_a_silent_drop() {
        let mut with_param = sample();
        if let Some(spec) = with_param.policy.spec.as_mut() {
            spec.param_kind = Some(Default::default());
        }
        assert!(matches!(
            to_static(&[with_param]),
            Err(StaticError::FieldRefused {
                field: "spec.paramKind",
                ..
            })
        ));
        let mut long = sample();
        long.policy.metadata.name = Some("a".repeat(NAME_MAX - STATIC_SUFFIX.len() + 1));
        assert!(matches!(
            to_static(&[long]),
            Err(StaticError::NameTooLong { .. })
        ));
        let crd =
            serde_json::json!({"kind": "CustomResourceDefinition", "metadata": {"name": "x"}});
        assert!(matches!(
            to_static_documents(&[crd]),
            Err(StaticError::NotAdmission { .. })
        ));
    }

    #[test]
    fn the_manifest_starts_with_a_document_not_a_lone_comment() {
        let text = manifest(&[sample()]).unwrap();
        assert!(text.starts_with("---\n# Written by cascade-guard"));
        let docs = crate::yaml_stream::split_yaml_documents(&text).unwrap();
        assert_eq!(docs.len(), 2);
        assert!(docs.iter().all(|d| d.is_object()));
        assert_eq!(manifest(&[]).unwrap(), "");
    }

    #[test]
    fn the_server_report_reads_the_gate_the_loaded_hash_and_failures() {
        let metrics = r#"# HELP kubernetes_feature_enabled [BETA] This metric records the data about the stage and enablement of a k8s feature.
# TYPE kubernetes_feature_enabled gauge
kubernetes_feature_enabled{name="ListFromCacheSnapshot",stage="BETA"} 1
kubernetes_feature_enabled{name="ManifestBasedAdmissionControlConfig",stage="BETA"} 1
apiserver_manifest_admission_config_controller_automatic_reloads_total{apiserver_id_hash="sha256:a",plugin="ValidatingAdmissionPolicy",status="failure"} 2
apiserver_manifest_admission_config_controller_automatic_reloads_total{apiserver_id_hash="sha256:a",plugin="ValidatingAdmissionPolicy",status="success"} 3
apiserver_manifest_admission_config_controller_automatic_reloads_total{apiserver_id_hash="sha256:a",plugin="ValidatingAdmissionWebhook",status="failure"} 7
apiserver_manifest_admission_config_controller_last_config_info{apiserver_id_hash="sha256:a",hash="sha256:feed",plugin="ValidatingAdmissionPolicy"} 1
apiserver_manifest_admission_config_controller_last_config_info{apiserver_id_hash="sha256:a",hash="sha256:beef",plugin="MutatingAdmissionPolicy"} 1
"#;
        assert_eq!(
            server_report(metrics),
            ServerReport {
                gate_enabled: Some(true),
                loaded_hash: Some("sha256:feed".into()),
                failed_reloads: 2,
            }
        );
        let off = "kubernetes_feature_enabled{name=\"ManifestBasedAdmissionControlConfig\",stage=\"ALPHA\"} 0\n";
        assert_eq!(server_report(off).gate_enabled, Some(false));
        assert_eq!(server_report("").gate_enabled, None);
    }

    #[test]
    fn the_kinds_a_manifest_protects_come_from_its_annotations() {
        let docs = vec![
            serde_json::json!({"kind": "ValidatingAdmissionPolicy", "metadata": {"annotations": {
                PROTECTED_KINDS_ANNOTATION: "{\"A.x.io\":{\"source\":\"s\"},\"B.x.io\":{}}"}}}),
            serde_json::json!({"kind": "ValidatingAdmissionPolicy", "metadata": {"annotations": {
                PROTECTED_KIND_ANNOTATION: "C.y.io"}}}),
            serde_json::json!({"kind": "ValidatingAdmissionPolicyBinding", "metadata": {"annotations": {
                PROTECTED_KIND_ANNOTATION: "D.y.io"}}}),
        ];
        let kinds: Vec<String> = protected_kinds(&docs).into_iter().collect();
        assert_eq!(kinds, ["A.x.io", "B.x.io", "C.y.io"]);
    }
}
