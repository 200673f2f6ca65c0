//! Rendering admission objects from documents (files, or `kubectl get -o
//! yaml` output) without a cluster.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use serde_json::Value;

use crate::cascade_policy::read_document;
use crate::mode::Mode;
use crate::names::GROUP;
use crate::plan::plan;
use crate::resolve::{
    CascadePolicyInput, CrdInfo, Inputs, Policy, Problem, Severity, Subject, XrdInput,
    read_crd_info, resolve,
};
use crate::settings::CompileSettings;
use crate::xrd::looks_like_xrd;

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rendered {
    /// All ValidatingAdmissionPolicies, then all their bindings, each with
    /// apiVersion and kind set, in policy order.
    pub objects: Vec<Value>,
    pub problems: Vec<Problem>,
    /// What was resolved, Off policies included.
    pub policies: Vec<Policy>,
    /// Documents that are none of the inputs (an XRD, a CascadePolicy, a
    /// CRD): render passes over them, `--strict` does not unless they are
    /// Crossplane package content or skipped on purpose.
    pub ignored: Vec<Ignored>,
}

/// A document render passed over.
#[derive(Debug, Clone, PartialEq)]
pub struct Ignored {
    pub subject: Subject,
    /// `Kind.group` (`Kind` for the core group).
    pub kind: String,
    pub name: Option<String>,
}

/// One document to render and where it was read.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// The file it was read from, as the user named it; none when the
    /// documents came from no file.
    pub file: Option<String>,
    /// Its index within that file, counting from 0 as [`YamlError`] does
    /// (empty documents included), so that a problem points at the right one.
    pub index: usize,
    pub value: Value,
}

/// Reason for a CascadePolicy document that cannot be read at all.
pub use crate::cascade_policy::INVALID_CASCADE_POLICY;
/// Reason for a CRD document that cannot be read.
pub const INVALID_CRD: &str = "InvalidCrd";

/// Reason for a document that is not an input, under `--strict`.
pub const NOT_AN_INPUT: &str = "NotAnInput";
/// Reason for a render that protects nothing: a warning, an error under
/// `--strict`.
pub const NOTHING_PROTECTED: &str = "NothingProtected";

/// Kinds a Crossplane package holds beside its XRDs, by API group: what a
/// package installs or configures, never the definition of a kind anyone
/// deletes a tree of. A package's CI renders its whole `apis/` (or the
/// package root), so these are passed over without `--skip`.
pub const PACKAGE_KINDS: &[(&str, &[&str])] = &[
    (
        "apiextensions.crossplane.io",
        &[
            "Composition",
            "CompositionRevision",
            "EnvironmentConfig",
            "ManagedResourceActivationPolicy",
            "ManagedResourceDefinition",
            // Crossplane 1.x's Usage, before protection.crossplane.io.
            "Usage",
        ],
    ),
    ("protection.crossplane.io", &["Usage", "ClusterUsage"]),
    (
        "pkg.crossplane.io",
        &[
            "Configuration",
            "ConfigurationRevision",
            "DeploymentRuntimeConfig",
            "Function",
            "FunctionRevision",
            "ImageConfig",
            "Provider",
            "ProviderRevision",
        ],
    ),
    // crossplane.yaml, the package's own metadata.
    (
        "meta.pkg.crossplane.io",
        &["Configuration", "Function", "Provider"],
    ),
];

/// Kinds every provider defines in its own API group, so matched in any
/// group: a provider's configuration, shipped beside the XRDs that use it.
pub const PROVIDER_KINDS: &[&str] = &["ProviderConfig", "ClusterProviderConfig"];

/// Whether a `Kind.group` is Crossplane package content ([`PACKAGE_KINDS`],
/// [`PROVIDER_KINDS`]). Exact, as the API server matches kinds.
pub fn is_package_kind(kind: &str) -> bool {
    let Some((bare, group)) = kind.split_once('.') else {
        // The core group holds no Crossplane kind.
        return false;
    };
    PROVIDER_KINDS.contains(&bare)
        || PACKAGE_KINDS
            .iter()
            .any(|(g, kinds)| *g == group && kinds.contains(&bare))
}

/// A `--skip` value that cannot match anything.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SkipError {
    #[error("--skip: an empty kind (give Kind or Kind.group, such as Composition)")]
    Empty,
    #[error(
        "--skip {0:?}: a kind has no spaces or slashes (give Kind or Kind.group, such as Composition)"
    )]
    NotAKind(String),
}

/// The kinds given to `--skip`: each `Kind` or `Kind.group`, matched without
/// regard to case, since a user writes `composition` as often as `Composition`
/// and no two kinds differ only in case.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Skip {
    values: Vec<String>,
}

impl Skip {
    /// Reads the values as given (clap has split comma lists already);
    /// blanks around a value are dropped.
    pub fn new<I, S>(values: I) -> Result<Skip, SkipError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut out = Vec::new();
        for value in values {
            let value = value.as_ref().trim();
            if value.is_empty() {
                return Err(SkipError::Empty);
            }
            if value.contains(|c: char| c.is_whitespace() || c == '/') {
                return Err(SkipError::NotAKind(value.to_string()));
            }
            out.push(value.to_string());
        }
        Ok(Skip { values: out })
    }

    /// Whether `value` names `kind` (`Kind.group`, or `Kind` of the core group).
    fn names(value: &str, kind: &str) -> bool {
        let bare = kind.split_once('.').map_or(kind, |(k, _)| k);
        value.eq_ignore_ascii_case(kind) || value.eq_ignore_ascii_case(bare)
    }
}

/// How render passed over the documents that are not inputs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PassedOver {
    /// Crossplane package content, by `Kind.group`: how many.
    pub package: BTreeMap<String, usize>,
    /// Given to `--skip` (and not package content), by `Kind.group`.
    pub skipped: BTreeMap<String, usize>,
    /// Neither: `--strict` fails on each.
    pub unexpected: Vec<Ignored>,
    /// `--skip` values that name no document, as given.
    pub unused_skips: Vec<String>,
}

/// Sorts the documents render passed over. A `--skip` value that names a
/// package kind counts as used: it is not a typo, only no longer needed.
pub fn passed_over(rendered: &Rendered, skip: &Skip) -> PassedOver {
    let mut used = vec![false; skip.values.len()];
    let mut out = PassedOver::default();
    for ignored in &rendered.ignored {
        let mut named = false;
        for (value, used) in skip.values.iter().zip(used.iter_mut()) {
            if Skip::names(value, &ignored.kind) {
                *used = true;
                named = true;
            }
        }
        if is_package_kind(&ignored.kind) {
            *out.package.entry(ignored.kind.clone()).or_default() += 1;
        } else if named {
            *out.skipped.entry(ignored.kind.clone()).or_default() += 1;
        } else {
            out.unexpected.push(ignored.clone());
        }
    }
    out.unused_skips = skip
        .values
        .iter()
        .zip(used)
        .filter(|(_, used)| !used)
        .map(|(value, _)| value.clone())
        .collect();
    out
}

/// What render adds to the problems: under `--strict`, every document that is
/// neither an input, package content nor skipped; and a render that protects
/// nothing, a warning (an error under `--strict`: a package's CI must not go
/// green with no kind protected).
pub fn review_problems(rendered: &Rendered, passed: &PassedOver, strict: bool) -> Vec<Problem> {
    let mut problems = Vec::new();
    if strict {
        problems.extend(passed.unexpected.iter().map(|i| {
            let bare = i.kind.split_once('.').map_or(i.kind.as_str(), |(k, _)| k);
            Problem {
                subject: i.subject.clone(),
                reason: NOT_AN_INPUT,
                message: format!(
                    "{} {} is not an XRD, CascadePolicy or CRD, so it protects nothing; pass --skip {bare} if it is here on purpose",
                    i.kind,
                    i.name.as_deref().unwrap_or("(unnamed)"),
                ),
                severity: Severity::Error,
            }
        }));
    }
    if rendered.objects.is_empty() {
        problems.push(Problem {
            subject: Subject::Input,
            reason: NOTHING_PROTECTED,
            message: "nothing is protected: no XRD or CascadePolicy in the input compiles to an admission policy (every one is Off, or there are none)".to_string(),
            severity: if strict {
                Severity::Error
            } else {
                Severity::Warning
            },
        });
    }
    problems
}

/// Whether render fails: on any error, and under `--strict` on any problem.
pub fn fails(problems: &[Problem], strict: bool) -> bool {
    problems
        .iter()
        .any(|p| strict || p.severity == Severity::Error)
}

/// The lines render writes to stderr besides its problems, so that nothing it
/// passes over goes unsaid: what it skipped and why, what it passed over
/// without `--strict`, and `--skip` values that name nothing.
pub fn notes(passed: &PassedOver, strict: bool) -> Vec<String> {
    let mut lines = Vec::new();
    if !passed.package.is_empty() {
        lines.push(format!(
            "skipped {} of Crossplane package kinds: {}",
            documents(passed.package.values().sum()),
            counts(&passed.package)
        ));
    }
    if !passed.skipped.is_empty() {
        lines.push(format!(
            "skipped {} given to --skip: {}",
            documents(passed.skipped.values().sum()),
            counts(&passed.skipped)
        ));
    }
    // Under --strict each is an error already.
    if !strict && !passed.unexpected.is_empty() {
        let mut by_kind = BTreeMap::new();
        for i in &passed.unexpected {
            *by_kind.entry(i.kind.clone()).or_default() += 1;
        }
        let verb = if passed.unexpected.len() == 1 {
            "is"
        } else {
            "are"
        };
        lines.push(format!(
            "passed over {} that {verb} not an XRD, CascadePolicy or CRD: {} (--strict fails on each unless its kind is given to --skip)",
            documents(passed.unexpected.len()),
            counts(&by_kind)
        ));
    }
    for value in &passed.unused_skips {
        lines.push(format!("warning: --skip {value} matches no document"));
    }
    lines
}

fn documents(n: usize) -> String {
    if n == 1 {
        "1 document".to_string()
    } else {
        format!("{n} documents")
    }
}

fn counts(by_kind: &BTreeMap<String, usize>) -> String {
    by_kind
        .iter()
        .map(|(kind, n)| format!("{kind} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Kinds named per mode in the summary; past this, "and N more", to keep it
/// one readable line for a platform of hundreds of kinds.
pub const SUMMARY_KINDS_PER_MODE: usize = 8;

/// One line: which kinds got which mode (Off included, since an Off kind is
/// the one a reader most needs to see), such as `3 kinds: Refuse 2
/// (InferenceCluster.modelplane.ai, ModelDeployment.modelplane.ai), Off 1
/// (ServingStack.infrastructure.modelplane.ai)`. A kind under two policies
/// (an XRD and a CascadePolicy) is counted under each of their modes, once in
/// the total.
pub fn summary(policies: &[Policy]) -> String {
    let mut by_mode: BTreeMap<Mode, BTreeSet<String>> = BTreeMap::new();
    for p in policies {
        by_mode
            .entry(p.mode)
            .or_default()
            .insert(p.kind.to_string());
    }
    let total: BTreeSet<&String> = by_mode.values().flatten().collect();
    let mut line = match total.len() {
        0 => return "0 kinds: the input has no XRD or CascadePolicy that resolves".to_string(),
        1 => "1 kind:".to_string(),
        n => format!("{n} kinds:"),
    };
    // Mode's order: Refuse, Convert, Warn, Off.
    let parts: Vec<String> = by_mode
        .iter()
        .map(|(mode, kinds)| {
            let names: Vec<&str> = kinds
                .iter()
                .take(SUMMARY_KINDS_PER_MODE)
                .map(String::as_str)
                .collect();
            let more = kinds.len().saturating_sub(SUMMARY_KINDS_PER_MODE);
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            format!("{mode} {} ({}{more})", kinds.len(), names.join(", "))
        })
        .collect();
    line.push(' ');
    line.push_str(&parts.join(", "));
    line
}

/// Documents may hold XRDs, CascadePolicies, CRDs (which make kinds known to
/// CascadePolicies), `*List` objects of those, and anything else, which is
/// ignored. Documents read from no file are numbered in order.
pub fn render(docs: Vec<Value>, xrd_default_mode: Mode, settings: &CompileSettings) -> Rendered {
    let docs = docs
        .into_iter()
        .enumerate()
        .map(|(index, value)| Document {
            file: None,
            index,
            value,
        })
        .collect();
    render_documents(docs, xrd_default_mode, settings)
}

/// [`render`] of documents that know where they were read, so that every
/// problem about a document names its file and its place in it.
pub fn render_documents(
    docs: Vec<Document>,
    xrd_default_mode: Mode,
    settings: &CompileSettings,
) -> Rendered {
    let mut xrds = Vec::new();
    let mut cascade_policies = Vec::new();
    let mut crds = Vec::new();
    let mut problems = Vec::new();
    let mut ignored = Vec::new();
    for doc in &docs {
        let at = || Subject::Document {
            file: doc.file.clone(),
            index: doc.index,
        };
        for item in list_items(&doc.value) {
            let input = classify(
                item,
                &at,
                &mut xrds,
                &mut cascade_policies,
                &mut crds,
                &mut problems,
            );
            if !input {
                ignored.push(Ignored {
                    subject: at(),
                    kind: document_kind(item),
                    name: item
                        .pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                });
            }
        }
    }
    let resolution = resolve(&Inputs {
        xrds,
        cascade_policies,
        crds,
        xrd_default_mode,
        undiscovered_groups: Default::default(),
    });
    problems.extend(resolution.problems.iter().cloned());

    // Offline there is no last good compilation to keep.
    let plan = plan(&resolution, settings, BTreeSet::new());
    let mut policies = Vec::new();
    let mut bindings = Vec::new();
    for compiled in &plan.objects {
        // Serialising these generated types cannot fail; if it ever did,
        // say so rather than drop a guard silently.
        match (
            serde_json::to_value(&compiled.policy),
            serde_json::to_value(&compiled.binding),
        ) {
            (Ok(vap), Ok(binding)) => {
                policies.push(vap);
                bindings.push(binding);
            }
            (Err(e), _) | (_, Err(e)) => {
                let name = compiled.policy.metadata.name.as_deref().unwrap_or_default();
                problems.extend(plan.carried_by(name).map(|p| Problem {
                    subject: p.source.subject(),
                    reason: "InternalError",
                    message: format!("could not serialise the admission objects: {e}"),
                    severity: Severity::Error,
                }))
            }
        }
    }
    policies.extend(bindings);
    Rendered {
        objects: policies,
        problems,
        policies: resolution.policies,
        ignored,
    }
}

/// `Kind.group` of a document (`Kind` for the core group), or what it lacks.
fn document_kind(doc: &Value) -> String {
    let kind = doc
        .get("kind")
        .and_then(Value::as_str)
        .filter(|k| !k.is_empty())
        .unwrap_or("document without a kind");
    let group = doc
        .get("apiVersion")
        .and_then(Value::as_str)
        .and_then(|v| v.split_once('/'))
        .map_or("", |(g, _)| g);
    if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    }
}

/// Longest name a rendered set may have, so that every shared object's name
/// stays a valid object name with room to spare.
pub const MAX_SET_NAME: usize = 40;

/// A set name (`render --set-name`) must be a DNS label short enough that
/// every shared pair's name stays valid with it appended.
pub fn validate_set_name(set: &str) -> Result<(), String> {
    let label =
        set.len() <= MAX_SET_NAME && crate::selector::is_dns_subdomain(set) && !set.contains('.');
    if label {
        Ok(())
    } else {
        Err(format!(
            "set name {set:?} is not a DNS label (lowercase letters, digits and '-', at most {MAX_SET_NAME} characters)"
        ))
    }
}

/// A `*List` (as `kubectl get -o yaml` prints) stands for its items.
fn list_items(doc: &Value) -> Vec<&Value> {
    let is_list = doc
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|k| k.ends_with("List"));
    match doc.get("items").and_then(Value::as_array) {
        Some(items) if is_list => items.iter().collect(),
        _ => vec![doc],
    }
}

fn classify(
    doc: &Value,
    at: &dyn Fn() -> Subject,
    xrds: &mut Vec<XrdInput>,
    cascade_policies: &mut Vec<CascadePolicyInput>,
    crds: &mut Vec<CrdInfo>,
    problems: &mut Vec<Problem>,
) -> bool {
    let api_version = doc
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let group = api_version.split_once('/').map_or("", |(g, _)| g);
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
    if looks_like_xrd(doc) {
        xrds.push(XrdInput::from_value(doc));
    } else if group == GROUP && kind == "CascadePolicy" {
        if let Some(cp) = read_cascade_policy(doc, at, problems) {
            cascade_policies.push(cp);
        }
    } else if group == "apiextensions.k8s.io" && kind == "CustomResourceDefinition" {
        match read_crd_info(doc) {
            Ok(info) => crds.push(info),
            Err(e) => problems.push(Problem {
                subject: doc_subject(doc, at, |name| Subject::Crd { name }),
                reason: INVALID_CRD,
                message: format!("{e}; CascadePolicies cannot use the kind it defines"),
                severity: Severity::Warning,
            }),
        }
    } else {
        return false;
    }
    true
}

/// An object by its name; one without a name by where it was read.
fn doc_subject(
    doc: &Value,
    at: &dyn Fn() -> Subject,
    named: impl Fn(String) -> Subject,
) -> Subject {
    match doc.pointer("/metadata/name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => named(n.to_string()),
        _ => at(),
    }
}

/// Reads a CascadePolicy from a file leniently ([`read_document`]).
fn read_cascade_policy(
    doc: &Value,
    at: &dyn Fn() -> Subject,
    problems: &mut Vec<Problem>,
) -> Option<CascadePolicyInput> {
    let subject = doc_subject(doc, at, |name| Subject::CascadePolicy { name });
    read_document(doc, subject, problems)
}

#[derive(Debug, thiserror::Error)]
pub enum YamlError {
    #[error("YAML document {index} (counting from 0) cannot be parsed: {source}")]
    Parse {
        index: usize,
        #[source]
        source: serde_yaml::Error,
    },
    #[error(
        "YAML document {index} (counting from 0) is a {found}, not a mapping; every document must be one Kubernetes object"
    )]
    NotAMapping { index: usize, found: &'static str },
}

/// Splits a multi-document YAML stream into objects. Empty documents are
/// skipped; a document that is not a mapping is an error naming its index,
/// since silently skipping it could skip a policy.
pub fn split_yaml_documents(text: &str) -> Result<Vec<Value>, YamlError> {
    Ok(split_yaml_stream(text)?
        .into_iter()
        .map(|(_, doc)| doc)
        .collect())
}

/// [`split_yaml_documents`], each object with its index in the stream
/// (counting from 0, empty documents included), as an editor finds it.
pub fn split_yaml_stream(text: &str) -> Result<Vec<(usize, Value)>, YamlError> {
    let mut docs = Vec::new();
    for (index, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = serde_yaml::Value::deserialize(de)
            .map_err(|source| YamlError::Parse { index, source })?;
        let found = match &value {
            serde_yaml::Value::Null => continue,
            serde_yaml::Value::Mapping(_) => None,
            serde_yaml::Value::Bool(_) => Some("boolean"),
            serde_yaml::Value::Number(_) => Some("number"),
            serde_yaml::Value::String(_) => Some("string"),
            serde_yaml::Value::Sequence(_) => Some("list"),
            serde_yaml::Value::Tagged(_) => Some("tagged value"),
        };
        if let Some(found) = found {
            return Err(YamlError::NotAMapping { index, found });
        }
        let json = serde_json::to_value(value).map_err(|e| YamlError::Parse {
            index,
            source: serde::de::Error::custom(e),
        })?;
        docs.push((index, json));
    }
    Ok(docs)
}

/// Writes objects as a YAML stream that every YAML reader reads back the
/// same. Needed because serde_yaml writes YAML 1.2, where `Off` is a plain
/// string, but kubectl's reader is YAML 1.1 and takes an unquoted `Off` (the
/// mode, and the CRD's enum) for the boolean false. Every string value is
/// therefore double-quoted, and keys are quoted unless plainly safe.
pub fn to_yaml_stream(docs: &[Value]) -> String {
    let mut out = String::new();
    for doc in docs {
        out.push_str("---\n");
        match doc {
            Value::Object(map) if !map.is_empty() => write_mapping(map, 0, &mut out),
            Value::Array(items) if !items.is_empty() => write_sequence(items, 0, &mut out),
            scalar => {
                out.push_str(&yaml_scalar(scalar));
                out.push('\n');
            }
        }
    }
    out
}

fn write_mapping(map: &serde_json::Map<String, Value>, indent: usize, out: &mut String) {
    for (key, value) in map {
        out.push_str(&" ".repeat(indent));
        out.push_str(&yaml_key(key));
        out.push(':');
        match value {
            Value::Object(m) if !m.is_empty() => {
                out.push('\n');
                write_mapping(m, indent + 2, out);
            }
            Value::Array(items) if !items.is_empty() => {
                out.push('\n');
                write_sequence(items, indent, out);
            }
            scalar => {
                out.push(' ');
                out.push_str(&yaml_scalar(scalar));
                out.push('\n');
            }
        }
    }
}

fn write_sequence(items: &[Value], indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    for item in items {
        match item {
            Value::Object(m) if !m.is_empty() => {
                // Write the mapping two deeper, then put the dash in the
                // first line's indentation.
                let mut nested = String::new();
                write_mapping(m, indent + 2, &mut nested);
                out.push_str(&pad);
                out.push_str("- ");
                out.push_str(&nested[indent + 2..]);
            }
            Value::Array(inner) if !inner.is_empty() => {
                out.push_str(&pad);
                out.push_str("-\n");
                write_sequence(inner, indent + 2, out);
            }
            scalar => {
                out.push_str(&pad);
                out.push_str("- ");
                out.push_str(&yaml_scalar(scalar));
                out.push('\n');
            }
        }
    }
}

fn yaml_scalar(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => yaml_quoted(s),
        Value::Array(_) => "[]".to_string(),
        Value::Object(_) => "{}".to_string(),
    }
}

/// Plain only when no YAML version could read the key as anything but this
/// string.
fn yaml_key(key: &str) -> String {
    const SPECIAL: [&str; 11] = [
        "y", "n", "yes", "no", "on", "off", "true", "false", "null", "~", "<<",
    ];
    let plain = key.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
        && !SPECIAL.iter().any(|w| w.eq_ignore_ascii_case(key));
    if plain {
        key.to_string()
    } else {
        yaml_quoted(key)
    }
}

/// A YAML double-quoted scalar. Besides the usual escapes, the characters
/// YAML 1.1 treats as line breaks (NEL, U+2028, U+2029) and the byte-order
/// mark are escaped, so no reader folds or drops them.
fn yaml_quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20
                || c == '\u{7f}'
                || c == '\u{85}'
                || c == '\u{2028}'
                || c == '\u{2029}'
                || c == '\u{feff}' =>
            {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::DELETION_POLICY_ANNOTATION;
    use crate::xrd::tests::modelplane_xrds;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn annotate(doc: &mut Value, value: &str) {
        doc["metadata"]["annotations"] = json!({ DELETION_POLICY_ANNOTATION: value });
    }

    /// Protected resources by binding: resource -> (mode annotation, actions).
    /// A binding shared by XRDs names many resources.
    fn bindings(r: &Rendered) -> BTreeMap<String, (String, Vec<String>)> {
        let mut out = BTreeMap::new();
        for b in r
            .objects
            .iter()
            .filter(|o| o["kind"] == "ValidatingAdmissionPolicyBinding")
        {
            let mode = b["metadata"]["annotations"]["cascade-guard.dev/mode"]
                .as_str()
                .unwrap()
                .to_string();
            let actions: Vec<String> =
                serde_json::from_value(b["spec"]["validationActions"].clone()).unwrap();
            // A binding matches what its policy does.
            let policy = r
                .objects
                .iter()
                .find(|p| {
                    p["kind"] == "ValidatingAdmissionPolicy"
                        && p["metadata"]["name"] == b["spec"]["policyName"]
                })
                .unwrap();
            for rule in policy["spec"]["matchConstraints"]["resourceRules"]
                .as_array()
                .unwrap()
            {
                if rule["operations"][0] != "DELETE" {
                    continue;
                }
                let group = rule["apiGroups"][0].as_str().unwrap();
                for resource in rule["resources"].as_array().unwrap() {
                    let resource = format!("{}.{group}", resource.as_str().unwrap());
                    let before = out.insert(resource.clone(), (mode.clone(), actions.clone()));
                    assert_eq!(before, None, "{resource} in two DELETE bindings");
                }
            }
        }
        out
    }

    #[test]
    fn modelplane_with_annotations() {
        let mut docs: Vec<Value> = modelplane_xrds().into_iter().map(|(_, v)| v).collect();
        let mut annotated = BTreeMap::new();
        for doc in &mut docs {
            let name = doc["metadata"]["name"].as_str().unwrap().to_string();
            let mode = match name.as_str() {
                "inferenceclusters.modelplane.ai" => "Refuse",
                "modeldeployments.modelplane.ai" => "warn",
                "servingstacks.infrastructure.modelplane.ai" => "Off",
                "inferencegateways.modelplane.ai" => "Convert",
                _ => continue,
            };
            annotate(doc, mode);
            annotated.insert(name, mode);
        }
        // Non-policy documents are ignored.
        docs.push(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}));
        let docs_len = docs.len();

        for default_mode in [Mode::Off, Mode::Refuse] {
            let r = render(docs.clone(), default_mode, &CompileSettings::default());
            assert_eq!(r.problems, vec![], "{default_mode}");
            assert_eq!(r.policies.len(), docs_len - 1);
            let got = bindings(&r);
            let mut want = BTreeMap::new();
            for p in &r.policies {
                let name = p.kind.resource();
                let mode = match annotated.get(&name) {
                    Some(m) => crate::mode::read_mode_annotation(m).0,
                    None => default_mode,
                };
                let actions = match mode {
                    Mode::Off => continue,
                    Mode::Warn => vec!["Warn".to_string(), "Audit".to_string()],
                    _ => vec!["Deny".to_string()],
                };
                want.insert(name, (mode.to_string(), actions));
            }
            assert_eq!(got, want, "{default_mode}");
            // Exactly the annotated (non-Off) kinds, plus the rest when the default guards.
            let expected_count = match default_mode {
                Mode::Off => 3,
                _ => docs_len - 1 - 1,
            };
            assert_eq!(got.len(), expected_count, "{default_mode}");
            assert!(got.contains_key("inferenceclusters.modelplane.ai"));
            assert!(!got.contains_key("servingstacks.infrastructure.modelplane.ai"));
            // VAPs first, then bindings, pairwise by name.
            let half = r.objects.len() / 2;
            for i in 0..half {
                assert_eq!(r.objects[i]["kind"], "ValidatingAdmissionPolicy");
                assert_eq!(
                    r.objects[half + i]["kind"],
                    "ValidatingAdmissionPolicyBinding"
                );
                assert_eq!(
                    r.objects[i]["metadata"]["name"],
                    r.objects[half + i]["metadata"]["name"]
                );
                assert_eq!(
                    r.objects[i]["apiVersion"],
                    "admissionregistration.k8s.io/v1"
                );
            }
        }
    }

    #[test]
    fn cascade_policies_from_documents() {
        let crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "databases.db.example.org"},
            "spec": {"group": "db.example.org", "scope": "Namespaced",
                     "names": {"kind": "Database", "plural": "databases"}},
        });
        let cp = |name: &str, spec: Value| {
            json!({
                "apiVersion": "cascade-guard.dev/v1alpha1", "kind": "CascadePolicy",
                "metadata": {"name": name}, "spec": spec,
            })
        };
        let xrd = modelplane_xrds()
            .into_iter()
            .find(|(d, _)| d == "modelcaches")
            .unwrap()
            .1;
        let docs = vec![
            cp("db", json!({"group": "db.example.org", "kind": "Database"})),
            cp(
                "db-lower-off",
                json!({"group": "db.example.org", "kind": "Database", "mode": "off",
                                      "selector": {"matchLabels": "nope"}}),
            ),
            cp(
                "cache",
                json!({"group": "modelplane.ai", "kind": "ModelCache", "mode": "Warn"}),
            ),
            cp(
                "unknown",
                json!({"group": "db.example.org", "kind": "Table"}),
            ),
            json!({"apiVersion": "cascade-guard.dev/v1alpha1", "kind": "CascadePolicy", "spec": {}}),
            json!({"apiVersion": "v1", "kind": "List", "items": [crd, xrd]}),
        ];
        let r = render(docs, Mode::Off, &CompileSettings::default());
        let summary: Vec<(String, Mode)> = r
            .policies
            .iter()
            .map(|p| (p.source.to_string(), p.mode))
            .collect();
        assert_eq!(
            summary,
            vec![
                (
                    "CompositeResourceDefinition/modelcaches.modelplane.ai".to_string(),
                    Mode::Off
                ),
                ("CascadePolicy/cache".to_string(), Mode::Warn),
                ("CascadePolicy/db".to_string(), Mode::Refuse),
                ("CascadePolicy/db-lower-off".to_string(), Mode::Refuse),
            ]
        );
        let problems: Vec<(String, &str)> = r
            .problems
            .iter()
            .map(|p| (p.subject.to_string(), p.reason))
            .collect();
        assert_eq!(
            problems,
            vec![
                ("CascadePolicy/db-lower-off".to_string(), "UnknownMode"),
                ("CascadePolicy/db-lower-off".to_string(), "InvalidSelector"),
                ("document 4".to_string(), "InvalidCascadePolicy"),
                ("CascadePolicy/unknown".to_string(), "UnknownKind"),
                ("CascadePolicy/cache".to_string(), "Overlap"),
                ("CascadePolicy/db-lower-off".to_string(), "Overlap"),
            ]
        );
        // The XRD's Off does not stop the CascadePolicy guarding ModelCache.
        // Three policies, each a DELETE and an UPDATE pair.
        assert_eq!(r.objects.len(), 12);
    }

    #[test]
    fn yaml_splitting() {
        let ok = "---\napiVersion: v1\nkind: A\n---\n\n---\n# just a comment\n---\napiVersion: v1\nkind: B\n";
        let docs = split_yaml_documents(ok).unwrap();
        assert_eq!(
            docs.iter()
                .map(|d| d["kind"].as_str().unwrap())
                .collect::<Vec<_>>(),
            ["A", "B"]
        );

        // Off stays a string (YAML 1.2), as annotations need.
        let off = split_yaml_documents("metadata:\n  annotations:\n    x: Off\n").unwrap();
        assert_eq!(off[0]["metadata"]["annotations"]["x"], "Off");

        let cases: &[(&str, &str)] = &[
            (
                "kind: A\n---\n- a\n- b\n",
                "document 1 (counting from 0) is a list",
            ),
            (
                "just a string\n",
                "document 0 (counting from 0) is a string",
            ),
            (
                "kind: A\n---\nkind: [unclosed\n",
                "document 1 (counting from 0) cannot be parsed",
            ),
            (
                "? [a, b]\n: list as key\n",
                "document 0 (counting from 0) cannot be parsed",
            ),
        ];
        for (text, want) in cases {
            let err = split_yaml_documents(text).unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }
    #[test]
    fn yaml_stream_round_trips_and_quotes_every_string() {
        // As a CRD states an enum of modes.
        let crd = json!({"enum": ["Refuse", "Convert", "Warn", "Off"]});
        let mut docs: Vec<Value> = modelplane_xrds().into_iter().map(|(_, v)| v).collect();
        let rendered = render(docs.clone(), Mode::Warn, &CompileSettings::default());
        docs.extend(rendered.objects);
        docs.push(crd);
        docs.push(json!({
            "odd keys": {"on": "Off", "1": "yes", "y": "~", "<<": "*ref", "": ""},
            "strings": ["Off", "1:20", "0777", "null", "", " lead", "trail ", "a: b", "- x", "# c",
                        "quote\" back\\ nl\n tab\t nul\u{0} nel\u{85} ls\u{2028} bom\u{feff} é🦀"],
            "scalars": [null, true, false, 0, -1, 1.5, 1e300],
            "empty": {"map": {}, "list": []},
            "nested": [[1, [2]], [{"a": [{"b": {}}]}]],
        }));
        let text = to_yaml_stream(&docs);
        let back: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
            .map(|d| Value::deserialize(d).unwrap())
            .collect();
        assert_eq!(back, docs);
        // The mode enum, and every other string, is quoted.
        assert!(text.contains("- \"Off\"\n"));
        assert!(!text.contains(": Off\n") && !text.contains("- Off\n"));
        assert!(text.contains("\"on\": \"Off\""));
    }

    #[test]
    fn a_named_set_names_only_the_shared_objects() {
        let mut docs: Vec<Value> = modelplane_xrds().into_iter().map(|(_, v)| v).collect();
        annotate(&mut docs[0], "Refuse");
        docs.push(json!({"apiVersion": "cascade-guard.dev/v1alpha1", "kind": "CascadePolicy",
            "metadata": {"name": "dbs"}, "spec": {"kind": "Database", "group": "db.example.org", "mode": "Refuse"}}));
        docs.push(
            json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "databases.db.example.org"},
            "spec": {"group": "db.example.org", "scope": "Namespaced",
                "names": {"kind": "Database", "plural": "databases"}}}),
        );
        let settings = CompileSettings {
            set_name: Some("team-a".into()),
            ..CompileSettings::default()
        };
        let r = render(docs, Mode::Off, &settings);
        assert_eq!(r.problems, vec![]);
        let names: Vec<(&str, &str)> = r
            .objects
            .iter()
            .map(|o| {
                (
                    o["metadata"]["name"].as_str().unwrap(),
                    o["spec"]["policyName"].as_str().unwrap_or(""),
                )
            })
            .collect();
        assert!(
            names.contains(&("cascade-guard-xrds-refuse-composite-team-a", "")),
            "{names:?}"
        );
        assert!(names.contains(&(
            "cascade-guard-update-xrds-refuse-composite-team-a",
            "cascade-guard-update-xrds-refuse-composite-team-a"
        )));
        assert!(names.contains(&("cascade-guard-policy-dbs", "cascade-guard-policy-dbs")));
        for bad in ["Team", "a.b", "", &"x".repeat(41)] {
            assert!(validate_set_name(bad).is_err(), "{bad:?}");
        }
        assert!(validate_set_name("team-a").is_ok());
    }

    fn xrd(name: &str, kind: &str, mode: Option<&str>) -> Value {
        let (plural, group) = name.split_once('.').unwrap();
        let mut doc = json!({
            "apiVersion": "apiextensions.crossplane.io/v2", "kind": "CompositeResourceDefinition",
            "metadata": {"name": name},
            "spec": {"group": group, "names": {"kind": kind, "plural": plural}, "scope": "Namespaced",
                     "versions": [{"name": "v1", "served": true, "referenceable": true}]}
        });
        if let Some(mode) = mode {
            annotate(&mut doc, mode);
        }
        doc
    }

    fn object(api_version: &str, kind: &str, name: &str) -> Value {
        json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name}})
    }

    #[test]
    fn strict_refuses_what_protects_nothing_unless_skipped_on_purpose() {
        let composition = object("apiextensions.crossplane.io/v1", "Composition", "c");
        let deployment = object("apps/v1", "Deployment", "web");
        let settings = CompileSettings::default();
        let reasons = |r: &Rendered, skip: &[&str], strict: bool| -> Vec<&'static str> {
            let passed = passed_over(r, &Skip::new(skip).unwrap());
            review_problems(r, &passed, strict)
                .iter()
                .map(|p| p.reason)
                .collect()
        };

        // Nothing at all: an empty directory protects nothing, a warning
        // without --strict and an error with it.
        let empty = render(vec![], Mode::Refuse, &settings);
        let problems = review_problems(&empty, &PassedOver::default(), false);
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].reason, NOTHING_PROTECTED);
        assert_eq!(problems[0].severity, Severity::Warning);
        assert!(!fails(&problems, false));
        assert!(fails(&problems, true));
        assert_eq!(
            problems[0].to_string(),
            "warning: the input: nothing is protected: no XRD or CascadePolicy in the input compiles to an admission policy (every one is Off, or there are none) (NothingProtected)"
        );
        let strict = review_problems(&empty, &PassedOver::default(), true);
        assert_eq!(strict[0].severity, Severity::Error);

        // A Composition (package content) and a Deployment: the Deployment
        // is named, and nothing is protected.
        let other = render(
            vec![composition.clone(), deployment.clone()],
            Mode::Refuse,
            &settings,
        );
        assert!(other.problems.is_empty(), "not a problem without --strict");
        assert_eq!(reasons(&other, &[], false), [NOTHING_PROTECTED]);
        let passed = passed_over(&other, &Skip::default());
        let strict = review_problems(&other, &passed, true);
        assert_eq!(strict.len(), 2, "{strict:?}");
        assert_eq!(
            strict[0].to_string(),
            "error: document 1: Deployment.apps web is not an XRD, CascadePolicy or CRD, so it protects nothing; pass --skip Deployment if it is here on purpose (NotAnInput)"
        );

        // An XRD beside them: only the Deployment is left to say, unless
        // skipped, in any case and as Kind or Kind.group.
        let package = render(
            vec![xrd("xs.example.org", "X", None), composition, deployment],
            Mode::Refuse,
            &settings,
        );
        assert_eq!(reasons(&package, &[], true), [NOT_AN_INPUT]);
        for skip in [
            "Deployment",
            "deployment",
            "DEPLOYMENT.APPS",
            "Deployment.apps",
        ] {
            assert_eq!(reasons(&package, &[skip], true), [] as [&str; 0], "{skip}");
        }
        assert_eq!(
            reasons(&package, &["Deployment.batch"], true),
            [NOT_AN_INPUT]
        );
    }

    #[test]
    fn crossplane_package_kinds_are_skipped_by_default() {
        // (apiVersion, kind, package content?)
        let cases: &[(&str, &str, bool)] = &[
            ("apiextensions.crossplane.io/v1", "Composition", true),
            (
                "apiextensions.crossplane.io/v1",
                "CompositionRevision",
                true,
            ),
            (
                "apiextensions.crossplane.io/v1beta1",
                "EnvironmentConfig",
                true,
            ),
            (
                "apiextensions.crossplane.io/v1alpha1",
                "ManagedResourceDefinition",
                true,
            ),
            (
                "apiextensions.crossplane.io/v1alpha1",
                "ManagedResourceActivationPolicy",
                true,
            ),
            ("apiextensions.crossplane.io/v1beta1", "Usage", true),
            ("protection.crossplane.io/v1beta1", "Usage", true),
            ("protection.crossplane.io/v1beta1", "ClusterUsage", true),
            ("pkg.crossplane.io/v1", "Provider", true),
            ("pkg.crossplane.io/v1", "Function", true),
            ("pkg.crossplane.io/v1", "Configuration", true),
            ("pkg.crossplane.io/v1beta1", "DeploymentRuntimeConfig", true),
            ("pkg.crossplane.io/v1beta1", "ImageConfig", true),
            ("meta.pkg.crossplane.io/v1", "Configuration", true),
            ("kubernetes.crossplane.io/v1alpha1", "ProviderConfig", true),
            ("aws.m.upbound.io/v1beta1", "ClusterProviderConfig", true),
            // Not package content: a user's kind, or a Crossplane kind of the
            // wrong group, or a ProviderConfig without a group.
            ("apps/v1", "Deployment", false),
            ("v1", "ConfigMap", false),
            ("v1", "ProviderConfig", false),
            ("example.org/v1", "Composition", false),
            ("apiextensions.crossplane.io/v1", "composition", false),
            ("pkg.crossplane.io/v1", "Lock", false),
            (
                "kubernetes.crossplane.io/v1alpha1",
                "ProviderConfigUsage",
                false,
            ),
        ];
        for (api_version, kind, want) in cases {
            let doc = object(api_version, kind, "n");
            assert_eq!(
                is_package_kind(&document_kind(&doc)),
                *want,
                "{api_version} {kind}"
            );
        }
    }

    /// Documents render passes over: package content, and kinds of a user's.
    fn not_inputs() -> Vec<Value> {
        vec![
            object("apiextensions.crossplane.io/v1", "Composition", "a"),
            object("apiextensions.crossplane.io/v1", "Composition", "b"),
            object("pkg.crossplane.io/v1", "Function", "f"),
            object("apps/v1", "Deployment", "web"),
            object("v1", "ConfigMap", "cm"),
        ]
    }

    #[test]
    fn skip_values_match_without_case_and_say_when_they_match_nothing() {
        let mut docs = not_inputs();
        docs.insert(0, xrd("xs.example.org", "X", Some("Refuse")));
        let r = render(docs, Mode::Off, &CompileSettings::default());
        // (--skip values, skipped on purpose, left unexpected, unused values)
        type Case = (
            &'static [&'static str],
            &'static [(&'static str, usize)],
            &'static [&'static str],
            &'static [&'static str],
        );
        let cases: &[Case] = &[
            (&[], &[], &["Deployment.apps", "ConfigMap"], &[]),
            (
                &["deployment", "CONFIGMAP"],
                &[("ConfigMap", 1), ("Deployment.apps", 1)],
                &[],
                &[],
            ),
            // A package kind given anyway counts as used, not as a typo.
            (
                &["composition"],
                &[],
                &["Deployment.apps", "ConfigMap"],
                &[],
            ),
            (
                &["Compositon", "Deployment.batch", "configmap"],
                &[("ConfigMap", 1)],
                &["Deployment.apps"],
                &["Compositon", "Deployment.batch"],
            ),
        ];
        for (skip, skipped, unexpected, unused) in cases {
            let passed = passed_over(&r, &Skip::new(*skip).unwrap());
            let package: Vec<(&str, usize)> = passed
                .package
                .iter()
                .map(|(k, n)| (k.as_str(), *n))
                .collect();
            assert_eq!(
                package,
                [
                    ("Composition.apiextensions.crossplane.io", 2),
                    ("Function.pkg.crossplane.io", 1)
                ],
                "{skip:?}"
            );
            let got: Vec<(&str, usize)> = passed
                .skipped
                .iter()
                .map(|(k, n)| (k.as_str(), *n))
                .collect();
            assert_eq!(got, *skipped, "{skip:?}");
            let got: Vec<&str> = passed.unexpected.iter().map(|i| i.kind.as_str()).collect();
            assert_eq!(got, *unexpected, "{skip:?}");
            assert_eq!(passed.unused_skips, *unused, "{skip:?}");
        }

        for (values, want) in [
            (&[""][..], Some(SkipError::Empty)),
            (&["Composition", " "], Some(SkipError::Empty)),
            (
                &["apps/Deployment"],
                Some(SkipError::NotAKind("apps/Deployment".into())),
            ),
            (
                &["Deployment apps"],
                Some(SkipError::NotAKind("Deployment apps".into())),
            ),
            (&[" Composition "], None),
        ] {
            assert_eq!(Skip::new(values).err(), want, "{values:?}");
        }
    }

    #[test]
    fn notes_say_what_was_passed_over() {
        let mut docs = not_inputs();
        docs.push(object("v1", "ConfigMap", "cm2"));
        let r = render(docs, Mode::Off, &CompileSettings::default());
        let package = "skipped 3 documents of Crossplane package kinds: Composition.apiextensions.crossplane.io 2, Function.pkg.crossplane.io 1";
        // (--skip values, --strict, the notes)
        let cases: &[(&[&str], bool, &[&str])] = &[
            (
                &[],
                false,
                &[
                    package,
                    "passed over 3 documents that are not an XRD, CascadePolicy or CRD: ConfigMap 2, Deployment.apps 1 (--strict fails on each unless its kind is given to --skip)",
                ],
            ),
            // Under --strict each is an error instead.
            (&[], true, &[package]),
            (
                &["Deployment", "nope"],
                true,
                &[
                    package,
                    "skipped 1 document given to --skip: Deployment.apps 1",
                    "warning: --skip nope matches no document",
                ],
            ),
        ];
        for (skip, strict, want) in cases {
            let passed = passed_over(&r, &Skip::new(*skip).unwrap());
            assert_eq!(notes(&passed, *strict), *want, "{skip:?} {strict}");
        }
        // Nothing passed over, nothing to say.
        assert_eq!(notes(&PassedOver::default(), false), [] as [String; 0]);
    }

    #[test]
    fn the_summary_says_which_kinds_got_which_mode() {
        let many: Vec<Value> = (0..10)
            .map(|i| xrd(&format!("k{i}s.many.org"), &format!("K{i}"), Some("Warn")))
            .collect();
        // (XRDs, default mode, the summary)
        let cases: Vec<(Vec<Value>, Mode, &str)> = vec![
            (
                vec![],
                Mode::Refuse,
                "0 kinds: the input has no XRD or CascadePolicy that resolves",
            ),
            (
                vec![xrd("xs.example.org", "X", None)],
                Mode::Off,
                "1 kind: Off 1 (X.example.org)",
            ),
            (
                vec![
                    xrd("inferenceclusters.modelplane.ai", "InferenceCluster", None),
                    xrd(
                        "modeldeployments.modelplane.ai",
                        "ModelDeployment",
                        Some("Refuse"),
                    ),
                    xrd(
                        "servingstacks.infrastructure.modelplane.ai",
                        "ServingStack",
                        Some("Off"),
                    ),
                    xrd("gateways.modelplane.ai", "Gateway", Some("Convert")),
                ],
                Mode::Refuse,
                "4 kinds: Refuse 2 (InferenceCluster.modelplane.ai, ModelDeployment.modelplane.ai), Convert 1 (Gateway.modelplane.ai), Off 1 (ServingStack.infrastructure.modelplane.ai)",
            ),
            (
                many,
                Mode::Off,
                "10 kinds: Warn 10 (K0.many.org, K1.many.org, K2.many.org, K3.many.org, K4.many.org, K5.many.org, K6.many.org, K7.many.org and 2 more)",
            ),
        ];
        for (docs, mode, want) in cases {
            let r = render(docs, mode, &CompileSettings::default());
            assert_eq!(summary(&r.policies), want);
        }
    }

    #[test]
    fn problems_name_the_file_and_the_document_in_it() {
        let unnamed_cp = json!({"apiVersion": "cascade-guard.dev/v1alpha1", "kind": "CascadePolicy", "spec": {}});
        let docs = vec![
            Document {
                file: Some("platform/apis/a.yaml".into()),
                index: 0,
                value: xrd("xs.example.org", "X", Some("Refuse")),
            },
            Document {
                file: Some("platform/apis/b.yaml".into()),
                index: 2,
                value: unnamed_cp,
            },
            Document {
                file: Some("platform/apis/b.yaml".into()),
                index: 3,
                value: object("apps/v1", "Deployment", "web"),
            },
        ];
        let r = render_documents(docs, Mode::Off, &CompileSettings::default());
        let subjects: Vec<String> = r.problems.iter().map(|p| p.subject.to_string()).collect();
        assert_eq!(subjects, ["platform/apis/b.yaml, document 2"]);
        let passed = passed_over(&r, &Skip::default());
        let strict = review_problems(&r, &passed, true);
        assert_eq!(strict.len(), 1);
        assert!(
            strict[0]
                .to_string()
                .starts_with("error: platform/apis/b.yaml, document 3: Deployment.apps web"),
            "{}",
            strict[0]
        );

        // The index is the document's place in the stream, empty ones
        // included, as a YAML parse error counts.
        let stream = split_yaml_stream("---\n---\nkind: A\n---\n# c\n---\nkind: B\n").unwrap();
        let indexes: Vec<usize> = stream.iter().map(|(i, _)| *i).collect();
        assert_eq!(indexes, [1, 3]);
    }
}
