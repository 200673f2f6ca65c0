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
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use serde_json::json;

    fn xrd(name_plural: &str, group: &str, kind: &str, annotation: Option<&str>) -> XrdInput {
        XrdInput::Read(Xrd {
            name: format!("{name_plural}.{group}"),
            api_version: "apiextensions.crossplane.io/v2".into(),
            group: group.into(),
            kind: kind.into(),
            plural: name_plural.into(),
            scope: Scope::Cluster,
            deletion_policy: annotation.map(str::to_string),
            claim_names: None,
        })
    }

    fn cp(name: &str, group: &str, kind: &str, mode: Mode) -> CascadePolicyInput {
        CascadePolicyInput {
            name: name.into(),
            group: group.into(),
            kind: kind.into(),
            mode,
            selector: None,
        }
    }

    fn crd(group: &str, kind: &str, plural: &str) -> CrdInfo {
        CrdInfo {
            group: group.into(),
            kind: kind.into(),
            plural: plural.into(),
            scope: Scope::Namespaced,
        }
    }

    fn inputs(xrds: Vec<XrdInput>, cps: Vec<CascadePolicyInput>, crds: Vec<CrdInfo>) -> Inputs {
        Inputs {
            xrds,
            cascade_policies: cps,
            crds,
            xrd_default_mode: Mode::Warn,
            undiscovered_groups: BTreeSet::new(),
        }
    }

    /// (source, kind, mode) of each policy, for compact assertions.
    fn summary(r: &Resolution) -> Vec<(String, String, Mode)> {
        r.policies
            .iter()
            .map(|p| (p.source.to_string(), p.kind.to_string(), p.mode))
            .collect()
    }

    fn reasons_of(r: &Resolution) -> Vec<(String, &'static str, Severity)> {
        r.problems
            .iter()
            .map(|p| (p.subject.to_string(), p.reason, p.severity))
            .collect()
    }

    #[test]
    fn a_legacy_xrd_guards_its_claims_under_refuse_and_warn() {
        let legacy = |annotation: &str| {
            XrdInput::from_value(&json!({
                "apiVersion": "apiextensions.crossplane.io/v1",
                "kind": "CompositeResourceDefinition",
                "metadata": {"name": "xapps.example.org",
                             "annotations": {"cascade-guard.dev/deletion-policy": annotation}},
                "spec": {"group": "example.org",
                         "names": {"kind": "XApp", "plural": "xapps"},
                         "claimNames": {"kind": "App", "plural": "apps"},
                         "versions": [{"name": "v1"}]}
            }))
        };
        for (mode, claims) in [
            ("Refuse", true),
            ("Warn", true),
            ("Convert", false),
            ("Off", false),
        ] {
            let r = resolve(&inputs(vec![legacy(mode)], vec![], vec![]));
            let kinds: Vec<(String, Shape, Scope)> = r
                .policies
                .iter()
                .map(|p| (p.kind.to_string(), p.kind.shape, p.kind.scope))
                .collect();
            let mut want = vec![(
                "XApp.example.org".to_string(),
                Shape::CompositeResource,
                Scope::Cluster,
            )];
            if claims {
                want.push((
                    "App.example.org".to_string(),
                    Shape::Claim,
                    Scope::Namespaced,
                ));
            }
            assert_eq!(kinds, want, "{mode}");
            if claims {
                let claim = &r.policies[1];
                assert_eq!(
                    claim.source.to_string(),
                    "CompositeResourceDefinition/xapps.example.org (its claims)"
                );
                assert_eq!(
                    crate::admission::object_names(claim),
                    [
                        format!("cascade-guard-xrds-{}-claim", mode.to_lowercase()),
                        format!("cascade-guard-update-xrds-{}-claim", mode.to_lowercase())
                    ]
                );
            }
        }
    }

    #[test]
    fn xrd_modes() {
        // (annotation, mode, problem reason)
        let cases: &[(Option<&str>, Mode, Option<&str>)] = &[
            (None, Mode::Warn, None), // the default mode of these inputs
            (Some("Refuse"), Mode::Refuse, None),
            (Some("Off"), Mode::Off, None),
            (Some(" convert "), Mode::Convert, None),
            (Some("Offf"), Mode::Refuse, Some("UnknownMode")),
            (Some(""), Mode::Refuse, Some("UnknownMode")),
        ];
        for (annotation, mode, reason) in cases {
            let r = resolve(&inputs(
                vec![xrd("widgets", "example.org", "Widget", *annotation)],
                vec![],
                vec![],
            ));
            assert_eq!(r.policies.len(), 1, "{annotation:?}");
            let p = &r.policies[0];
            assert_eq!(p.mode, *mode, "{annotation:?}");
            assert_eq!(p.kind.shape, Shape::CompositeResource);
            assert_eq!(
                p.source,
                Source::Xrd {
                    name: "widgets.example.org".into(),
                    annotated: annotation.is_some(),
                    claim: false,
                }
            );
            assert_eq!(
                r.problems.first().map(|p| p.reason),
                *reason,
                "{annotation:?}"
            );
        }
    }

    #[test]
    fn broken_xrds_stay_guarded_when_possible() {
        let broken = json!({
            "apiVersion": "apiextensions.crossplane.io/v2",
            "kind": "CompositeResourceDefinition",
            "metadata": {"name": "gadgets.example.org",
                         "annotations": {"cascade-guard.dev/deletion-policy": "Off"}},
            "spec": {"group": "example.org", "names": {"kind": "Gadget", "plural": "gadgets"}},
        });
        let nameless = json!({
            "apiVersion": "apiextensions.crossplane.io/v2",
            "kind": "CompositeResourceDefinition",
            "metadata": {"name": "mystery.example.org"},
            "spec": {"group": "example.org", "versions": [{"name": "v1"}]},
        });
        let r = resolve(&inputs(
            vec![
                XrdInput::from_value(&broken),
                XrdInput::from_value(&nameless),
            ],
            vec![],
            vec![],
        ));
        // Off is ignored on a broken XRD: Refuse, never unguarded.
        assert_eq!(
            summary(&r),
            vec![(
                "CompositeResourceDefinition/gadgets.example.org".into(),
                "Gadget.example.org".into(),
                Mode::Refuse
            )]
        );
        assert_eq!(
            reasons_of(&r),
            vec![
                (
                    "CompositeResourceDefinition/gadgets.example.org".into(),
                    "NoVersions",
                    Severity::Error
                ),
                (
                    "CompositeResourceDefinition/mystery.example.org".into(),
                    "MissingKind",
                    Severity::Error
                ),
            ]
        );
        assert!(
            r.problems[0]
                .message
                .contains("still guarded in Refuse mode")
        );
        assert!(r.problems[1].message.contains("guards nothing"));
    }

    /// A group that discovery could not read (the API server busy or
    /// restarting) does not make its kinds "unknown": the policy says the
    /// kind is not known for now, as a warning, and the last good policy stays.
    #[test]
    fn an_undiscovered_group_is_not_an_unknown_kind() {
        let mut i = inputs(
            vec![],
            vec![cp("p", "db.example.org", "Database", Mode::Refuse)],
            vec![],
        );
        i.undiscovered_groups.insert("db.example.org".into());
        let r = resolve(&i);
        assert!(r.policies.is_empty());
        assert_eq!(r.problems.len(), 1, "{:?}", r.problems);
        assert_eq!(r.problems[0].reason, reasons::KIND_NOT_DISCOVERED);
        assert_eq!(r.problems[0].severity, Severity::Warning);
        assert!(
            r.problems[0]
                .message
                .contains("could not be read from discovery")
        );
    }

    /// Each was compiled and in force once: `kubectl delete crd`, `kubectl
    /// delete deployment` and `kubectl delete cpol` refused, cascade-guard's
    /// finalizer on kube-apiserver's own Lease. Discovery serves those kinds,
    /// so the controller's inputs carry them as the CRDs do here.
    #[test]
    fn forbidden_targets_are_refused_whoever_asks() {
        let crds = vec![
            crd(
                "apiextensions.k8s.io",
                "CustomResourceDefinition",
                "customresourcedefinitions",
            ),
            crd("apps", "Deployment", "deployments"),
            crd("coordination.k8s.io", "Lease", "leases"),
            crd("cascade-guard.dev", "CascadePolicy", "cascadepolicies"),
            crd("", "Pod", "pods"),
        ];
        let cps = vec![
            cp(
                "crds",
                "apiextensions.k8s.io",
                "CustomResourceDefinition",
                Mode::Refuse,
            ),
            cp("deployments", "apps", "Deployment", Mode::Refuse),
            cp("leases", "coordination.k8s.io", "Lease", Mode::Convert),
            cp("own", "cascade-guard.dev", "CascadePolicy", Mode::Refuse),
            cp("pods", "", "Pod", Mode::Warn),
        ];
        let xrds = vec![xrd("jobs", "batch.k8s.io", "Job", Some("Refuse"))];
        let r = resolve(&inputs(xrds, cps, crds));
        assert!(r.policies.is_empty(), "{:?}", r.policies);
        let reasons = reasons_of(&r);
        assert_eq!(reasons.len(), 6, "{reasons:?}");
        for (subject, reason, severity) in &reasons {
            assert_eq!(*reason, reasons::FORBIDDEN_KIND, "{subject}");
            assert_eq!(*severity, Severity::Error, "{subject}");
        }
        assert!(
            r.problems
                .iter()
                .any(|p| p.message.contains("cascade-guard's own kinds"))
        );
    }

    #[test]
    fn cascade_policy_kind_lookup() {
        let xrds = vec![xrd("widgets", "example.org", "Widget", None)];
        let crds = vec![
            crd("example.org", "Widget", "widgets"),
            crd("db.example.org", "Database", "databases"),
        ];
        // (group, kind, expected shape or None for UnknownKind)
        let cases: &[(&str, &str, Option<Shape>)] = &[
            ("example.org", "Widget", Some(Shape::CompositeResource)),
            ("db.example.org", "Database", Some(Shape::Other)),
            ("db.example.org", "database", None),
            ("example.org", "Database", None),
            ("nothing.example.org", "Thing", None),
        ];
        for (group, kind, shape) in cases {
            let r = resolve(&inputs(
                xrds.clone(),
                vec![cp("p", group, kind, Mode::Refuse)],
                crds.clone(),
            ));
            let from_cp: Vec<&Policy> = r
                .policies
                .iter()
                .filter(|p| matches!(p.source, Source::CascadePolicy { .. }))
                .collect();
            match shape {
                Some(s) => {
                    assert_eq!(from_cp.len(), 1, "{group}/{kind}");
                    assert_eq!(from_cp[0].kind.shape, *s, "{group}/{kind}");
                }
                None => {
                    assert!(from_cp.is_empty(), "{group}/{kind}");
                    assert_eq!(
                        reasons_of(&r),
                        vec![("CascadePolicy/p".into(), "UnknownKind", Severity::Error)],
                        "{group}/{kind}"
                    );
                }
            }
        }
    }

    #[test]
    fn xrd_kind_counts_as_known_without_its_crd() {
        let r = resolve(&inputs(
            vec![xrd("widgets", "example.org", "Widget", Some("Off"))],
            vec![cp("w", "example.org", "Widget", Mode::Refuse)],
            vec![],
        ));
        assert_eq!(r.policies.len(), 2);
        assert_eq!(r.policies[1].kind.plural, "widgets");
        assert_eq!(r.policies[1].kind.shape, Shape::CompositeResource);
    }

    #[test]
    fn overlaps_warn_on_the_later_source_and_keep_both() {
        let r = resolve(&inputs(
            vec![xrd("widgets", "example.org", "Widget", Some("Refuse"))],
            vec![
                cp("zz-off", "example.org", "Widget", Mode::Off),
                cp("aa-warn", "example.org", "Widget", Mode::Warn),
                cp("other", "db.example.org", "Database", Mode::Refuse),
            ],
            vec![crd("db.example.org", "Database", "databases")],
        ));
        assert_eq!(
            summary(&r),
            vec![
                (
                    "CompositeResourceDefinition/widgets.example.org".into(),
                    "Widget.example.org".into(),
                    Mode::Refuse
                ),
                (
                    "CascadePolicy/aa-warn".into(),
                    "Widget.example.org".into(),
                    Mode::Warn
                ),
                (
                    "CascadePolicy/other".into(),
                    "Database.db.example.org".into(),
                    Mode::Refuse
                ),
                (
                    "CascadePolicy/zz-off".into(),
                    "Widget.example.org".into(),
                    Mode::Off
                ),
            ]
        );
        assert_eq!(
            reasons_of(&r),
            vec![
                ("CascadePolicy/aa-warn".into(), "Overlap", Severity::Warning),
                ("CascadePolicy/zz-off".into(), "Overlap", Severity::Warning),
            ]
        );
        assert!(
            r.problems[0]
                .message
                .contains("CompositeResourceDefinition/widgets.example.org (mode Refuse)")
        );
        assert!(
            r.problems[1]
                .message
                .contains("CascadePolicy/aa-warn (mode Warn)")
        );
        assert!(r.problems[1].message.contains("strictest mode wins"));
    }

    #[test]
    fn invalid_selector_widens_the_policy() {
        let bad = LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "Exists".into(),
                values: Some(vec!["prod".into()]),
            }]),
        };
        let good = LabelSelector {
            match_labels: Some([("tier".to_string(), "prod".to_string())].into()),
            match_expressions: None,
        };
        let cases = [
            (bad, None, Some("InvalidSelector")),
            (good.clone(), Some(good), None),
        ];
        for (given, kept, reason) in cases {
            let mut policy = cp("p", "db.example.org", "Database", Mode::Refuse);
            policy.selector = Some(given);
            let r = resolve(&inputs(
                vec![],
                vec![policy],
                vec![crd("db.example.org", "Database", "databases")],
            ));
            assert_eq!(r.policies.len(), 1);
            assert_eq!(r.policies[0].selector, kept);
            assert_eq!(r.problems.first().map(|p| p.reason), reason);
            if reason.is_some() {
                assert!(r.problems[0].message.contains("wider"));
                assert!(r.problems[0].message.contains("takes no values"));
            }
        }
    }

    #[test]
    fn output_order_does_not_depend_on_input_order() {
        let xrds = vec![
            xrd("b", "example.org", "B", None),
            xrd("a", "example.org", "A", None),
        ];
        let cps = vec![
            cp("y", "db.example.org", "Database", Mode::Refuse),
            cp("x", "db.example.org", "Database", Mode::Warn),
        ];
        let crds = vec![crd("db.example.org", "Database", "databases")];
        let forward = resolve(&inputs(xrds.clone(), cps.clone(), crds.clone()));
        let mut xr = xrds;
        xr.reverse();
        let mut cr = cps;
        cr.reverse();
        let backward = resolve(&inputs(xr, cr, crds));
        assert_eq!(forward, backward);
        assert_eq!(
            summary(&forward)
                .iter()
                .map(|s| s.0.as_str())
                .collect::<Vec<_>>(),
            [
                "CompositeResourceDefinition/a.example.org",
                "CompositeResourceDefinition/b.example.org",
                "CascadePolicy/x",
                "CascadePolicy/y"
            ]
        );
    }

    #[test]
    fn duplicate_names_are_errors() {
        let r = resolve(&inputs(
            vec![
                xrd("a", "example.org", "A", None),
                xrd("a", "example.org", "A", None),
            ],
            vec![],
            vec![],
        ));
        assert!(reasons_of(&r).contains(&(
            "CompositeResourceDefinition/a.example.org".into(),
            "DuplicateName",
            Severity::Error
        )));
    }

    #[test]
    fn crd_reading() {
        let crd_doc = |scope: Value| {
            json!({
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": "databases.db.example.org"},
                "spec": {"group": "db.example.org", "scope": scope,
                         "names": {"kind": "Database", "plural": "databases"}},
            })
        };
        assert_eq!(
            read_crd_info(&crd_doc(json!("Namespaced"))),
            Ok(crd("db.example.org", "Database", "databases"))
        );
        assert_eq!(
            read_crd_info(&crd_doc(json!("Cluster"))).map(|c| c.scope),
            Ok(Scope::Cluster)
        );
        assert!(matches!(
            read_crd_info(&crd_doc(json!("Everywhere"))),
            Err(CrdError::UnknownScope { .. })
        ));
        let mut no_plural = crd_doc(json!("Cluster"));
        no_plural["spec"]["names"] = json!({"kind": "Database"});
        assert_eq!(read_crd_info(&no_plural), Err(CrdError::MissingPlural));
        assert!(matches!(
            read_crd_info(&json!({"kind": "Pod"})),
            Err(CrdError::NotACrd { .. })
        ));

        // Crossplane's own CRDs are readable.
        let dir = crate::xrd::tests::fixtures().join("crossplane-crds");
        let text = std::fs::read_to_string(
            dir.join("apiextensions.crossplane.io_compositeresourcedefinitions.yaml"),
        )
        .unwrap();
        let value: Value = serde_yaml::from_str(&text).unwrap();
        let info = read_crd_info(&value).unwrap();
        assert_eq!(
            (
                info.group.as_str(),
                info.kind.as_str(),
                info.plural.as_str(),
                info.scope
            ),
            (
                "apiextensions.crossplane.io",
                "CompositeResourceDefinition",
                "compositeresourcedefinitions",
                Scope::Cluster
            )
        );
    }
}
