//! Rendering admission objects from documents (files, or `kubectl get -o
//! yaml` output) without a cluster.

use std::collections::{BTreeMap, BTreeSet};

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

#[cfg(test)]
mod tests;
