//! Turning what the cluster (or a set of files) says into policies.
//!
//! The one rule above all others: a mistake in the inputs may make the guard
//! stricter or report a problem, but must never leave a kind unguarded that
//! someone asked to guard.

use std::collections::BTreeSet;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use crate::kind::{Forbidden, ProtectedKind, Scope, Shape, forbidden};
use crate::mode::{Mode, read_mode_annotation};
use crate::names::{CASCADE_POLICY_KIND, XRD_KIND};
use crate::selector::validate_label_selector;
use crate::shown::Shown;
use crate::xrd::{SalvagedXrd, Xrd, XrdError, read_xrd, salvage_xrd};

/// One XRD as resolution sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum XrdInput {
    Read(Xrd),
    /// An XRD that could not be read; `salvaged` holds whatever names could.
    Broken {
        name: String,
        error: XrdError,
        salvaged: SalvagedXrd,
    },
}

impl XrdInput {
    pub fn from_value(value: &Value) -> XrdInput {
        match read_xrd(value) {
            Ok(xrd) => XrdInput::Read(xrd),
            Err(error) => {
                let salvaged = salvage_xrd(value);
                // Crossplane requires an XRD to be named plural.group, so that
                // is the best stand-in for a missing name.
                let name = salvaged
                    .name
                    .clone()
                    .or_else(|| salvaged.protected_kind().map(|k| k.resource()))
                    .unwrap_or_else(|| "(unnamed)".to_string());
                XrdInput::Broken {
                    name,
                    error,
                    salvaged,
                }
            }
        }
    }

    pub fn name(&self) -> &str {
        match self {
            XrdInput::Read(x) => &x.name,
            XrdInput::Broken { name, .. } => name,
        }
    }

    /// The kind this XRD defines, when known (even for a broken one).
    fn protected_kind(&self) -> Option<ProtectedKind> {
        match self {
            XrdInput::Read(x) => Some(x.protected_kind()),
            XrdInput::Broken { salvaged, .. } => salvaged.protected_kind(),
        }
    }
}

/// The parts of a CascadePolicy that resolution needs.
#[derive(Debug, Clone, PartialEq)]
pub struct CascadePolicyInput {
    pub name: String,
    pub group: String,
    pub kind: String,
    pub mode: Mode,
    pub selector: Option<LabelSelector>,
}

/// What a CustomResourceDefinition says about its kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrdInfo {
    pub group: String,
    pub kind: String,
    pub plural: String,
    pub scope: Scope,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CrdError {
    #[error("not a CustomResourceDefinition: apiVersion {api_version:?}, kind {kind:?}")]
    NotACrd { api_version: String, kind: String },
    #[error("spec.group is missing or empty")]
    MissingGroup,
    #[error("spec.names.kind is missing or empty")]
    MissingKind,
    #[error("spec.names.plural is missing or empty")]
    MissingPlural,
    #[error("spec.scope {value} is not Namespaced or Cluster")]
    UnknownScope { value: String },
}

/// Reads an `apiextensions.k8s.io/v1` CustomResourceDefinition.
pub fn read_crd_info(value: &Value) -> Result<CrdInfo, CrdError> {
    let text = |p: &str| {
        value
            .pointer(p)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let api_version = text("/apiVersion").unwrap_or_default();
    let kind = text("/kind").unwrap_or_default();
    if api_version != "apiextensions.k8s.io/v1" || kind != "CustomResourceDefinition" {
        return Err(CrdError::NotACrd {
            api_version: api_version.into(),
            kind: kind.into(),
        });
    }
    let group = text("/spec/group").ok_or(CrdError::MissingGroup)?;
    let crd_kind = text("/spec/names/kind").ok_or(CrdError::MissingKind)?;
    let plural = text("/spec/names/plural").ok_or(CrdError::MissingPlural)?;
    let scope = match value.pointer("/spec/scope") {
        Some(Value::String(s)) if s == "Namespaced" => Scope::Namespaced,
        Some(Value::String(s)) if s == "Cluster" => Scope::Cluster,
        other => {
            return Err(CrdError::UnknownScope {
                value: other.map_or_else(|| "(absent)".to_string(), Value::to_string),
            });
        }
    };
    Ok(CrdInfo {
        group: group.into(),
        kind: crd_kind.into(),
        plural: plural.into(),
        scope,
    })
}

/// Everything resolution looks at.
#[derive(Debug, Clone, PartialEq)]
pub struct Inputs {
    pub xrds: Vec<XrdInput>,
    pub cascade_policies: Vec<CascadePolicyInput>,
    pub crds: Vec<CrdInfo>,
    /// Mode for XRDs without the deletion-policy annotation.
    pub xrd_default_mode: Mode,
    /// API groups CascadePolicies name whose kinds could not be read from
    /// discovery (API unavailable, not absent): a kind missing from `crds` in
    /// one of these is not known to be absent.
    pub undiscovered_groups: BTreeSet<String>,
}

/// What asked for a policy.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// An XRD: for its composite resource kind, or (`claim`) for the claim
    /// kind a legacy XRD offers.
    Xrd {
        name: String,
        annotated: bool,
        claim: bool,
    },
    CascadePolicy {
        name: String,
    },
}

impl Source {
    pub fn subject(&self) -> Subject {
        match self {
            Source::Xrd { name, .. } => Subject::Xrd { name: name.clone() },
            Source::CascadePolicy { name } => Subject::CascadePolicy { name: name.clone() },
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.subject().fmt(f)?;
        match self {
            Source::Xrd { claim: true, .. } => f.write_str(" (its claims)"),
            _ => Ok(()),
        }
    }
}

/// What a problem is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Subject {
    Xrd {
        name: String,
    },
    CascadePolicy {
        name: String,
    },
    Crd {
        name: String,
    },
    /// A document of a rendered file set that is none of the above: its file
    /// (none when the documents came from no file) and its 0-based index
    /// within that file, so that a reader can find it.
    Document {
        file: Option<String>,
        index: usize,
    },
    /// The rendered input as a whole (it protects nothing, say).
    Input,
}

impl fmt::Display for Subject {
    /// `Kind/name`, as kubectl prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Xrd { name } => write!(f, "{XRD_KIND}/{name}"),
            Subject::CascadePolicy { name } => write!(f, "{CASCADE_POLICY_KIND}/{name}"),
            Subject::Crd { name } => write!(f, "CustomResourceDefinition/{name}"),
            Subject::Document {
                file: Some(file),
                index,
            } => write!(f, "{file}, document {index}"),
            Subject::Document { file: None, index } => write!(f, "document {index}"),
            Subject::Input => f.write_str("the input"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Severity {
    /// Guarding works, perhaps not quite as written.
    Warning,
    /// Something asked for could not be done as asked.
    Error,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub subject: Subject,
    /// CamelCase, for condition reasons and for matching in tests.
    pub reason: &'static str,
    pub message: String,
    pub severity: Severity,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sev = match self.severity {
            Severity::Warning => "warning",
            Severity::Error => "error",
        };
        write!(
            f,
            "{sev}: {}: {} ({})",
            self.subject, self.message, self.reason
        )
    }
}

/// Problem reasons that are not an [`XrdError`] reason.
pub mod reasons {
    pub const UNKNOWN_MODE: &str = "UnknownMode";
    pub const UNKNOWN_KIND: &str = "UnknownKind";
    /// The kind's API group could not be read from discovery just now.
    pub const KIND_NOT_DISCOVERED: &str = "KindNotDiscovered";
    pub const INVALID_SELECTOR: &str = "InvalidSelector";
    pub const OVERLAP: &str = "Overlap";
    pub const DUPLICATE_NAME: &str = "DuplicateName";
    /// A kind no policy may protect ([`crate::kind::forbidden`]).
    pub const FORBIDDEN_KIND: &str = "ForbiddenKind";
}

/// One kind to guard, and how.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub kind: ProtectedKind,
    pub mode: Mode,
    /// Only objects whose labels match are guarded.
    pub selector: Option<LabelSelector>,
    pub source: Source,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Resolution {
    /// XRD policies by XRD name, then CascadePolicy ones by name.
    pub policies: Vec<Policy>,
    pub problems: Vec<Problem>,
}

pub fn resolve(inputs: &Inputs) -> Resolution {
    let mut out = Resolution::default();

    let mut xrds: Vec<&XrdInput> = inputs.xrds.iter().collect();
    xrds.sort_by(|a, b| a.name().cmp(b.name()));
    let mut cps: Vec<&CascadePolicyInput> = inputs.cascade_policies.iter().collect();
    cps.sort_by(|a, b| a.name.cmp(&b.name));

    report_duplicates(
        xrds.iter().map(|x| x.name()),
        |name| Subject::Xrd { name },
        &mut out,
    );
    report_duplicates(
        cps.iter().map(|c| c.name.as_str()),
        |name| Subject::CascadePolicy { name },
        &mut out,
    );

    for xrd in &xrds {
        resolve_xrd(xrd, inputs.xrd_default_mode, &mut out);
    }
    for cp in &cps {
        resolve_cascade_policy(cp, &xrds, inputs, &mut out);
    }
    report_overlaps(&mut out);
    out
}

/// Nothing is guarded for a source that names a forbidden kind: said as an
/// error (a CascadePolicy's Ready=False, an Event, `status`, `render`).
fn forbidden_problem(subject: Subject, group: &str, kind: &str, why: Forbidden) -> Problem {
    Problem {
        subject,
        reason: reasons::FORBIDDEN_KIND,
        message: format!(
            "kind {} of API group {} cannot be protected: {why}; nothing is guarded for it",
            Shown(kind),
            Shown(group)
        ),
        severity: Severity::Error,
    }
}

fn resolve_xrd(xrd: &XrdInput, default_mode: Mode, out: &mut Resolution) {
    let subject = Subject::Xrd {
        name: xrd.name().to_string(),
    };
    if let Some(kind) = xrd.protected_kind()
        && let Some(why) = forbidden(&kind.group)
    {
        out.problems
            .push(forbidden_problem(subject, &kind.group, &kind.kind, why));
        return;
    }
    match xrd {
        XrdInput::Read(x) => {
            let mode = match &x.deletion_policy {
                None => default_mode,
                Some(value) => {
                    let (mode, problem) = read_mode_annotation(value);
                    if let Some(p) = problem {
                        out.problems.push(Problem {
                            subject,
                            reason: reasons::UNKNOWN_MODE,
                            message: format!(
                                "annotation {}: {p}; deletes of {} are guarded in Refuse mode until it is fixed",
                                super::names::DELETION_POLICY_ANNOTATION,
                                x.protected_kind()
                            ),
                            severity: Severity::Warning,
                        });
                    }
                    mode
                }
            };
            out.policies.push(Policy {
                kind: x.protected_kind(),
                mode,
                selector: None,
                source: Source::Xrd {
                    name: x.name.clone(),
                    annotated: x.deletion_policy.is_some(),
                    claim: false,
                },
            });
            // Under Refuse and Warn, Crossplane's Background delete of the
            // XR that a claim's delete sets off would be refused after the
            // claim is already terminating; so the claim's delete is judged
            // at the claim, where the user can still choose. Under Convert
            // that delete is converted like any other, and Off guards nothing.
            if let (Some(claim), Mode::Refuse | Mode::Warn) = (x.claim_kind(), mode) {
                out.policies.push(Policy {
                    kind: claim,
                    mode,
                    selector: None,
                    source: Source::Xrd {
                        name: x.name.clone(),
                        annotated: x.deletion_policy.is_some(),
                        claim: true,
                    },
                });
            }
        }
        XrdInput::Broken {
            name,
            error,
            salvaged,
        } => {
            let kind = salvaged.protected_kind();
            let consequence = match &kind {
                Some(k) => format!(
                    "deletes of {k} are still guarded in Refuse mode until the XRD is fixed"
                ),
                None => {
                    "cascade-guard cannot tell which kind it defines, so it guards nothing for it"
                        .to_string()
                }
            };
            out.problems.push(Problem {
                subject,
                reason: error.reason(),
                message: format!("{error}; {consequence}"),
                severity: Severity::Error,
            });
            if let Some(kind) = kind {
                out.policies.push(Policy {
                    kind,
                    mode: Mode::Refuse,
                    selector: None,
                    source: Source::Xrd {
                        name: name.clone(),
                        annotated: salvaged.deletion_policy.is_some(),
                        claim: false,
                    },
                });
            }
        }
    }
}

fn resolve_cascade_policy(
    cp: &CascadePolicyInput,
    xrds: &[&XrdInput],
    inputs: &Inputs,
    out: &mut Resolution,
) {
    let crds = &inputs.crds;
    let subject = Subject::CascadePolicy {
        name: cp.name.clone(),
    };
    if let Some(why) = forbidden(&cp.group) {
        out.problems
            .push(forbidden_problem(subject, &cp.group, &cp.kind, why));
        return;
    }
    // An XRD-defined kind is a composite resource whether or not its CRD
    // has been listed yet.
    let from_xrd = xrds
        .iter()
        .filter_map(|x| x.protected_kind())
        .find(|k| k.same_kind(&cp.group, &cp.kind));
    let kind = from_xrd.or_else(|| {
        crds.iter()
            .find(|c| c.group == cp.group && c.kind == cp.kind)
            .map(|c| ProtectedKind {
                group: c.group.clone(),
                kind: c.kind.clone(),
                plural: c.plural.clone(),
                scope: c.scope,
                shape: Shape::Other,
            })
    });
    let Some(kind) = kind else {
        if inputs.undiscovered_groups.contains(&cp.group) {
            out.problems.push(Problem {
                subject,
                reason: reasons::KIND_NOT_DISCOVERED,
                message: format!(
                    "API group {} could not be read from discovery just now, so kind {} is not known for this pass",
                    Shown(&cp.group),
                    Shown(&cp.kind)
                ),
                severity: Severity::Warning,
            });
            return;
        }
        let message = if cp.group.is_empty() {
            format!(
                "spec.group is empty: CascadePolicy guards custom resources only, so name the API group of kind {}; nothing is guarded for this policy",
                Shown(&cp.kind)
            )
        } else {
            format!(
                "no CustomResourceDefinition defines kind {} in group {} (kinds are case-sensitive); nothing is guarded for this policy until one does",
                Shown(&cp.kind),
                Shown(&cp.group)
            )
        };
        out.problems.push(Problem {
            subject,
            reason: reasons::UNKNOWN_KIND,
            message,
            severity: Severity::Error,
        });
        return;
    };
    let selector = match &cp.selector {
        None => None,
        Some(sel) => match validate_label_selector(sel) {
            Ok(()) => Some(sel.clone()),
            Err(why) => {
                out.problems.push(Problem {
                    subject,
                    reason: reasons::INVALID_SELECTOR,
                    message: format!(
                        "spec.selector is invalid ({why}); the policy guards every {kind} object instead, which is wider and so safer, until the selector is fixed"
                    ),
                    severity: Severity::Warning,
                });
                None
            }
        },
    };
    out.policies.push(Policy {
        kind,
        mode: cp.mode,
        selector,
        source: Source::CascadePolicy {
            name: cp.name.clone(),
        },
    });
}

/// Both policies stay in force (each becomes its own admission policy, and a
/// refusal from either refuses), so this is only a warning, on the later one.
fn report_overlaps(out: &mut Resolution) {
    for (i, later) in out.policies.iter().enumerate() {
        let earlier: Vec<String> = out.policies[..i]
            .iter()
            .filter(|p| p.kind.same_kind(&later.kind.group, &later.kind.kind))
            .map(|p| format!("{} (mode {})", p.source, p.mode))
            .collect();
        if earlier.is_empty() {
            continue;
        }
        out.problems.push(Problem {
            subject: later.source.subject(),
            reason: reasons::OVERLAP,
            message: format!(
                "{} is also guarded by {}; all of them apply and a refusal from any refuses the delete, so the strictest mode wins and this one's mode ({}) cannot relax another's",
                later.kind,
                earlier.join(", "),
                later.mode
            ),
            severity: Severity::Warning,
        });
    }
}

/// Only possible with files; in a cluster names are unique. Generated
/// objects are named after their source, so duplicates would overwrite each
/// other when applied.
fn report_duplicates<'a>(
    sorted_names: impl Iterator<Item = &'a str>,
    subject: impl Fn(String) -> Subject,
    out: &mut Resolution,
) {
    let mut previous: Option<&str> = None;
    for name in sorted_names {
        if previous == Some(name) {
            out.problems.push(Problem {
                subject: subject(name.to_string()),
                reason: reasons::DUPLICATE_NAME,
                message: "another object of the same kind has this name; their admission objects would share a name and one would replace the other".to_string(),
                severity: Severity::Error,
            });
        }
        previous = Some(name);
    }
}

#[cfg(test)]
mod tests;
