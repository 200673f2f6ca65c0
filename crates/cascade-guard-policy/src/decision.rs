//! The decision table: which deletes of a guarded object are allowed.
//!
//! This is the specification the generated CEL ([`super::cel`]) must match,
//! cell by cell. Rules are checked in [`AllowReason::ORDER`], and the CEL's
//! audit annotation names the first that matched, in the same order.

use std::fmt;

use serde_json::Value;

use crate::composed::composed_resources;
use crate::kind::Shape;
use crate::mode::Mode;
use crate::names::{
    BREAK_GLASS_ANNOTATION, FOREGROUND_CASCADE_FINALIZER, FOREGROUND_DELETION_FINALIZER,
};
use crate::settings::CompileSettings;

/// `DeleteOptions.propagationPolicy` as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Propagation {
    Foreground,
    Background,
    Orphan,
}

impl Propagation {
    pub fn as_str(self) -> &'static str {
        match self {
            Propagation::Foreground => "Foreground",
            Propagation::Background => "Background",
            Propagation::Orphan => "Orphan",
        }
    }
}

/// The stored object, as far as the decision needs it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ObjectState {
    pub finalizers: Vec<String>,
    /// Entries in `spec.crossplane.resourceRefs` and legacy
    /// `spec.resourceRefs` ([`composed_resources`]); for a claim, 1 when it
    /// names its composite resource (`spec.resourceRef`), else 0; None for
    /// [`Shape::Other`].
    pub composed_count: Option<usize>,
    /// A claim whose `spec.compositeDeletePolicy` is Foreground: Crossplane
    /// deletes its composite resource with foreground cascading.
    pub composite_delete_foreground: bool,
    /// The break-glass annotation is present with a non-empty value.
    pub break_glass: bool,
    /// `metadata.deletionTimestamp` is set: the object is already being
    /// deleted.
    pub deleting: bool,
}

impl ObjectState {
    /// Reads the state from a stored object (as admission's `oldObject` sees it).
    pub fn from_object(object: &Value, shape: Shape) -> ObjectState {
        let finalizers = object
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .map(|fs| {
                fs.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let composed_count = match shape {
            Shape::CompositeResource => Some(composed_resources(object, None).count()),
            Shape::Claim => Some(usize::from(object.pointer("/spec/resourceRef").is_some())),
            Shape::Other => None,
        };
        let composite_delete_foreground = shape == Shape::Claim
            && object
                .pointer("/spec/compositeDeletePolicy")
                .and_then(Value::as_str)
                == Some("Foreground");
        let break_glass = object
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(BREAK_GLASS_ANNOTATION))
            .and_then(Value::as_str)
            .is_some_and(|v| !v.is_empty());
        let deleting = object
            .pointer("/metadata/deletionTimestamp")
            .is_some_and(|t| !t.is_null());
        ObjectState {
            finalizers,
            composed_count,
            composite_delete_foreground,
            break_glass,
            deleting,
        }
    }

    fn has_finalizer(&self, name: &str) -> bool {
        self.finalizers.iter().any(|f| f == name)
    }
}

/// One DELETE, as admission sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteRequest {
    pub propagation: Option<Propagation>,
    /// The legacy `orphanDependents` field, if sent.
    pub orphan_dependents: Option<bool>,
    pub username: String,
    /// The request carries a non-empty `preconditions.uid`.
    pub uid_precondition: bool,
    pub object: ObjectState,
}

/// Why a delete was allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AllowReason {
    /// `propagationPolicy: Foreground` and no `orphanDependents`.
    ForegroundAsked,
    /// No policy sent at all, and the object is already in a foreground
    /// cascade: the API server keeps `foregroundDeletion` in that case only.
    AlreadyInForeground,
    /// No policy sent at all, and the object is already being deleted: the
    /// API server then leaves its deletion as it is (no finalizer added or
    /// taken away), so the delete changes nothing. Crossplane sends such
    /// deletes again and again while a claim or an owner is terminating.
    AlreadyDeleting,
    /// A composite resource that lists no composed resources, or a claim
    /// bound to no composite resource.
    NothingToCascade,
    /// A claim that makes Crossplane delete its composite resource with
    /// foreground cascading (`spec.compositeDeletePolicy: Foreground`).
    CompositeDeletedInForeground,
    /// The Kubernetes garbage collector, which must be free to finish cascades.
    GarbageCollector,
    /// An operator set the break-glass annotation.
    BreakGlass,
    /// Convert mode, and cascade-guard's finalizer is on the object.
    ConvertHeld,
    /// Refuse or Warn, Crossplane itself deletes, and cascade-guard's
    /// finalizer is on the object: a composed object the controller holds
    /// (`--hold-composed`), whose delete it turns into a foreground cascade.
    /// Crossplane v2.0 and v2.1 delete a composed resource dropped from the
    /// desired state without a propagation policy.
    CrossplaneHeld,
    /// Mode Off.
    ModeOff,
}

impl AllowReason {
    /// The order rules are checked in, here and in the CEL.
    pub const ORDER: [AllowReason; 9] = [
        AllowReason::ForegroundAsked,
        AllowReason::AlreadyInForeground,
        AllowReason::AlreadyDeleting,
        AllowReason::NothingToCascade,
        AllowReason::CompositeDeletedInForeground,
        AllowReason::GarbageCollector,
        AllowReason::BreakGlass,
        AllowReason::ConvertHeld,
        AllowReason::CrossplaneHeld,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AllowReason::ForegroundAsked => "ForegroundAsked",
            AllowReason::AlreadyInForeground => "AlreadyInForeground",
            AllowReason::AlreadyDeleting => "AlreadyDeleting",
            AllowReason::NothingToCascade => "NothingToCascade",
            AllowReason::CompositeDeletedInForeground => "CompositeDeletedInForeground",
            AllowReason::GarbageCollector => "GarbageCollector",
            AllowReason::BreakGlass => "BreakGlass",
            AllowReason::ConvertHeld => "ConvertHeld",
            AllowReason::CrossplaneHeld => "CrossplaneHeld",
            AllowReason::ModeOff => "ModeOff",
        }
    }
}

/// Why a delete was (or, in Warn mode, would have been) refused: what the
/// client sent instead of a foreground cascade.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefuseReason {
    /// Neither `propagationPolicy` nor `orphanDependents`, on an object not
    /// already in a foreground cascade (custom resources default to Background).
    NoPropagationPolicy,
    Background,
    Orphan,
    /// Foreground, on a claim: it does not reach the composite resource.
    Foreground,
    /// The legacy field, whatever its value (and whatever else was sent).
    OrphanDependents(bool),
}

impl fmt::Display for RefuseReason {
    /// The same words the CEL message uses for what was sent.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RefuseReason::NoPropagationPolicy => f.write_str("no propagationPolicy"),
            RefuseReason::Background => f.write_str("propagationPolicy Background"),
            RefuseReason::Orphan => f.write_str("propagationPolicy Orphan"),
            RefuseReason::Foreground => f.write_str("propagationPolicy Foreground"),
            RefuseReason::OrphanDependents(v) => write!(f, "orphanDependents={v}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    Allowed(AllowReason),
    Refused(RefuseReason),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    /// In Warn mode a refusal lets the delete through but keeps its reason.
    pub reason: Reason,
    /// Warn mode only: what the client is told.
    pub warning: Option<String>,
}

/// Decides one DELETE of an object guarded with `mode`.
pub fn decide(
    mode: Mode,
    shape: Shape,
    settings: &CompileSettings,
    req: &DeleteRequest,
) -> Verdict {
    if mode == Mode::Off {
        return Verdict {
            allowed: true,
            reason: Reason::Allowed(AllowReason::ModeOff),
            warning: None,
        };
    }
    let reason = match AllowReason::ORDER
        .into_iter()
        .find(|r| rule_holds(*r, mode, shape, settings, req))
    {
        Some(r) => Reason::Allowed(r),
        None => Reason::Refused(what_was_sent(req)),
    };
    match (reason, mode) {
        (Reason::Allowed(_), _) => Verdict {
            allowed: true,
            reason,
            warning: None,
        },
        (Reason::Refused(r), Mode::Warn) => Verdict {
            allowed: true,
            reason,
            warning: Some(match shape {
                Shape::Claim => "cascade-guard would refuse this delete in Refuse mode: the claim's spec.compositeDeletePolicy is not Foreground, so Crossplane would delete its composite resource in the background".to_string(),
                _ => format!(
                    "cascade-guard would refuse this delete in Refuse mode: it was sent with {r}, not as a foreground cascade"
                ),
            }),
        },
        (Reason::Refused(_), _) => Verdict {
            allowed: false,
            reason,
            warning: None,
        },
    }
}

fn rule_holds(
    rule: AllowReason,
    mode: Mode,
    shape: Shape,
    settings: &CompileSettings,
    req: &DeleteRequest,
) -> bool {
    let no_policy = req.propagation.is_none() && req.orphan_dependents.is_none();
    // What a claim's own delete asks for does not reach its composite
    // resource: Crossplane deletes that as the claim's spec says.
    let claim = shape == Shape::Claim;
    match rule {
        AllowReason::ForegroundAsked => {
            !claim
                && req.propagation == Some(Propagation::Foreground)
                && req.orphan_dependents.is_none()
        }
        AllowReason::AlreadyInForeground => {
            !claim && no_policy && req.object.has_finalizer(FOREGROUND_DELETION_FINALIZER)
        }
        AllowReason::AlreadyDeleting => no_policy && req.object.deleting,
        AllowReason::NothingToCascade => {
            shape != Shape::Other && req.object.composed_count == Some(0)
        }
        AllowReason::CompositeDeletedInForeground => {
            claim && req.object.composite_delete_foreground
        }
        AllowReason::GarbageCollector => is_garbage_collector(settings, req),
        AllowReason::BreakGlass => req.object.break_glass,
        AllowReason::ConvertHeld => {
            mode == Mode::Convert
                && req.object.has_finalizer(FOREGROUND_CASCADE_FINALIZER)
                && !orphan_asked(req)
        }
        AllowReason::CrossplaneHeld => {
            // Crossplane composes no claim: none is held.
            !claim
                && matches!(mode, Mode::Refuse | Mode::Warn)
                && !settings.crossplane_user.is_empty()
                && req.username == settings.crossplane_user
                && req.object.has_finalizer(FOREGROUND_CASCADE_FINALIZER)
                && !orphan_asked(req)
        }
        AllowReason::ModeOff => false,
    }
}

/// The client asked to leave what the object owns behind: never converted
/// (it would race the garbage collector's orphaning).
fn orphan_asked(req: &DeleteRequest) -> bool {
    req.propagation == Some(Propagation::Orphan) || req.orphan_dependents == Some(true)
}

/// An empty configured identity means "not trusted", never "matches everyone".
fn is_garbage_collector(settings: &CompileSettings, req: &DeleteRequest) -> bool {
    let sa = &settings.gc_service_account_user;
    let kcm = &settings.gc_controller_manager_user;
    (!sa.is_empty() && req.username == *sa)
        // The namespace controller shares the controller-manager identity but
        // never sends a UID precondition; the GC always does.
        || (!kcm.is_empty() && req.username == *kcm && req.uid_precondition)
}

pub(crate) fn what_was_sent(req: &DeleteRequest) -> RefuseReason {
    match (req.orphan_dependents, req.propagation) {
        (Some(v), _) => RefuseReason::OrphanDependents(v),
        (None, Some(Propagation::Background)) => RefuseReason::Background,
        (None, Some(Propagation::Orphan)) => RefuseReason::Orphan,
        // Refused only for a claim, where it does not reach the composite.
        (None, Some(Propagation::Foreground)) => RefuseReason::Foreground,
        (None, None) => RefuseReason::NoPropagationPolicy,
    }
}

#[cfg(test)]
pub(crate) mod tests;
