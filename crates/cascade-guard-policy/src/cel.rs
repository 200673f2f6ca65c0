//! The decision table ([`super::decision`]) compiled to CEL for a
//! ValidatingAdmissionPolicy.
//!
//! What DELETE admission gives the expressions: `request.options` is the
//! DeleteOptions as sent, with unsent fields absent (so every access is
//! guarded with `has()`); `oldObject` is the stored object and `object` is
//! null; `request.name` is "" for the items of a DeleteCollection, so names
//! come from `oldObject.metadata`.
//!
//! Nothing from a policy's source (kind, group, names) is embedded: messages
//! read them from the request at run time. The only configured strings in the
//! CEL are the garbage collector's usernames, embedded with
//! [`cel_string_literal`].

use std::fmt::Write as _;

use crate::decision::AllowReason;
use crate::kind::Shape;
use crate::mode::Mode;
use crate::names::{
    BREAK_GLASS_ANNOTATION, BREAK_GLASS_RESOURCE, BREAK_GLASS_VERB, FOREGROUND_CASCADE_FINALIZER,
    FOREGROUND_DELETION_FINALIZER, GROUP,
};
use crate::refusal::{self, what_it_leaves};
use crate::settings::CompileSettings;

/// The audit annotation key saying which rule allowed a delete, or that it
/// was refused (useful in Warn mode, whose binding audits).
pub const DECISION_AUDIT_KEY: &str = "decision";

/// The `reason` of a refusal (HTTP 403).
pub const REFUSAL_REASON: &str = "Forbidden";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CelVariable {
    pub name: &'static str,
    pub expression: String,
}

/// Everything CEL in one admission policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CelPolicy {
    /// In order: a variable may use those before it.
    pub variables: Vec<CelVariable>,
    /// True when the delete is allowed.
    pub validation: String,
    /// True when the delete is refused: the validation negated, with the
    /// variables written out (match conditions cannot use them).
    pub refusal_condition: String,
    pub message_expression: String,
    /// Used when `message_expression` fails.
    pub message: String,
    pub reason: &'static str,
    /// Value expression of the [`DECISION_AUDIT_KEY`] audit annotation.
    pub decision_expression: String,
}

/// Compiles the rules for one mode and shape. Refuse and Warn share their CEL
/// (only the binding's actions and the wording differ); Convert adds the
/// finalizer rule; only composite resources get the nothing-to-cascade rule.
pub fn compile_cel(mode: Mode, shape: Shape, settings: &CompileSettings) -> CelPolicy {
    let rules = rules(mode, shape);
    let variables = variables(mode, shape, settings);

    // The same rules with the garbage collector's first: it reads only the
    // username, and its deletes are the commonest allowed ones. The API
    // server converts the DeleteOptions (`request.options`) and the stored
    // object (`oldObject`) for the first expression that reads each, tens of
    // µs apiece (BENCHMARKS.md, run 8), so the GC's deletes are decided
    // without either (under the controller-manager's identity it still needs
    // the UID precondition); the rest keep rule order, which reads the
    // options before the object. `||` in CEL is commutative, errors included,
    // so the order changes no verdict, only what is evaluated before the
    // first true rule.
    let validation = garbage_collector_first(&rules)
        .map(|(_, cond)| wrap(cond))
        .collect::<Vec<_>>()
        .join(" || ");
    let refusal_condition = format!("!({})", inline_variables(&validation, &variables));

    // Nested conditionals in rule order, so the annotation names the same
    // rule the decision table reports.
    let mut decision_expression = String::new();
    for (reason, cond) in &rules {
        let _ = write!(
            decision_expression,
            "{} ? 'allowed: {}' : ",
            wrap(cond),
            reason.as_str()
        );
    }
    decision_expression.push_str("'refused: ' + variables.sent");

    let what_it_leaves = what_it_leaves(shape);
    // The fixed message, for when the expression cannot be evaluated.
    let fix = match shape {
        Shape::Claim => "set the claim's spec.compositeDeletePolicy to Foreground, then delete it",
        _ => "use kubectl delete --cascade=foreground",
    };
    let message_expression = refusal::message_expression(mode, shape);
    let message = match mode {
        Mode::Warn => format!(
            "cascade-guard warning: this delete does not cascade in the foreground and can leave {what_it_leaves} to wedge; {fix}"
        ),
        _ => format!(
            "cascade-guard refused this delete: it would not cascade in the foreground and could leave {what_it_leaves} to wedge: {fix}, or set the annotation {BREAK_GLASS_ANNOTATION} to a reason to abandon the object on purpose"
        ),
    };

    CelPolicy {
        variables,
        validation,
        refusal_condition,
        message_expression,
        message,
        reason: REFUSAL_REASON,
        decision_expression,
    }
}

/// The variables the rules of one mode and shape read, in the order they
/// are defined (each may read those before it).
fn variables(mode: Mode, shape: Shape, settings: &CompileSettings) -> Vec<CelVariable> {
    // Optional fields (`a.?b.orValue(x)`, CEL since Kubernetes 1.28) where
    // `has(a.b) ? a.b : x` would resolve the path twice: the match condition
    // reads these on every protected delete (BENCHMARKS.md, run 9).
    let mut variables = vec![
        var(
            "policy",
            "string(request.?options.?propagationPolicy.orValue(''))",
        ),
        var(
            "orphanSent",
            "request.?options.?orphanDependents.hasValue()",
        ),
        var(
            "foregroundAsked",
            "variables.policy == 'Foreground' && !variables.orphanSent",
        ),
        var(
            "noPolicy",
            "variables.policy == '' && !variables.orphanSent",
        ),
        var(
            "inForeground",
            &finalizer_present(FOREGROUND_DELETION_FINALIZER),
        ),
        var("deleting", "has(oldObject.metadata.deletionTimestamp)"),
    ];
    match shape {
        // Modern XRs list composed resources in spec.crossplane.resourceRefs,
        // legacy ones in spec.resourceRefs.
        // Read untyped (`dyn`): each field is missing from one generation's
        // schema, and the API server's type check would warn of it.
        Shape::CompositeResource => variables.push(var(
            "nothingToCascade",
            "!(has(dyn(oldObject).spec) && has(dyn(oldObject).spec.crossplane) && has(dyn(oldObject).spec.crossplane.resourceRefs) && size(dyn(oldObject).spec.crossplane.resourceRefs) > 0) && !(has(dyn(oldObject).spec) && has(dyn(oldObject).spec.resourceRefs) && size(dyn(oldObject).spec.resourceRefs) > 0)",
        )),
        // A claim cascades to the composite resource it is bound to, in the
        // way its compositeDeletePolicy says.
        Shape::Claim => variables.extend([
            var(
                "nothingToCascade",
                "!(has(dyn(oldObject).spec) && has(dyn(oldObject).spec.resourceRef))",
            ),
            var(
                "compositeInForeground",
                "has(oldObject.spec) && has(oldObject.spec.compositeDeletePolicy) && oldObject.spec.compositeDeletePolicy == 'Foreground'",
            ),
        ]),
        Shape::Other => {}
    }
    variables.extend([
        var("username", "request.userInfo.?username.orValue('')"),
        var(
            "uidPrecondition",
            "string(request.?options.?preconditions.?uid.orValue('')) != ''",
        ),
        var(
            "isGarbageCollector",
            &garbage_collector_expression(settings),
        ),
        var("breakGlassAnnotated", &break_glass_annotated("oldObject")),
        var("breakGlass", &break_glass(settings)),
    ]);
    // The client asked to leave what the object owns behind.
    variables.push(var(
        "orphaning",
        "variables.policy == 'Orphan' || (variables.orphanSent && request.options.orphanDependents == true)",
    ));
    if mode == Mode::Convert {
        // An explicit Orphan is a request to leave the composed resources
        // behind: not converted (it would race the garbage collector's
        // orphaning), so it falls to the Refuse rules and break-glass.
        variables.push(var(
            "convertHeld",
            &format!(
                "{} && !variables.orphaning",
                finalizer_present(FOREGROUND_CASCADE_FINALIZER)
            ),
        ));
    }
    if shape != Shape::Claim && matches!(mode, Mode::Refuse | Mode::Warn) {
        // Crossplane's own delete of a composed object the controller holds
        // (`--hold-composed`): the controller makes it a foreground cascade.
        variables.push(var(
            "crossplaneHeld",
            &format!(
                "{} && {} && !variables.orphaning",
                any_user(&[&settings.crossplane_user]),
                finalizer_present(FOREGROUND_CASCADE_FINALIZER)
            ),
        ));
    }
    variables.extend([
        var(
            "sent",
            "variables.orphanSent ? 'orphanDependents=' + string(request.options.orphanDependents) : variables.policy == '' ? 'no propagationPolicy' : 'propagationPolicy ' + variables.policy",
        ),
        var(
            "objectNamespace",
            OBJECT_NAMESPACE,
        ),
        // What to pass kubectl: resource.group name [-n namespace].
        var(
            "target",
            "request.resource.resource + (request.resource.group == '' ? '' : '.' + request.resource.group) + ' ' + oldObject.metadata.name + (variables.objectNamespace == '' ? '' : ' -n ' + variables.objectNamespace)",
        ),
    ]);
    variables
}

/// One validation of an UPDATE policy: true when the update is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CelValidation {
    pub expression: String,
    pub message_expression: String,
    /// Used when `message_expression` fails.
    pub message: String,
}

/// The CEL of the policy that guards UPDATEs of a protected kind: nobody but
/// the garbage collector and cascade-guard takes `foregroundDeletion` or
/// cascade-guard's finalizer off an object, and nobody but Crossplane takes
/// composed resources out of an XR's `resourceRefs`, unless the object carries
/// break-glass. Either would let the object go before what it composed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CelUpdatePolicy {
    /// True only for an update that takes one of those away, sent by someone
    /// not trusted with it; every other update (nearly all of them) stops
    /// here. Written without variables (match conditions cannot use them),
    /// and not through [`inline_variables`], so no username is rewritten.
    pub match_condition: String,
    pub variables: Vec<CelVariable>,
    pub validations: Vec<CelValidation>,
    pub reason: &'static str,
}

/// Compiles the UPDATE rules for one mode and shape. The rules are the same
/// in every mode; Warn only words them as a warning.
pub fn compile_update_cel(mode: Mode, shape: Shape, settings: &CompileSettings) -> CelUpdatePolicy {
    let removed = |f: &str| {
        format!(
            "(has(oldObject.metadata.finalizers) && '{f}' in oldObject.metadata.finalizers && !(has(object.metadata.finalizers) && '{f}' in object.metadata.finalizers))"
        )
    };
    // The list comparison first: for an ordinary update the finalizers are
    // unchanged and nothing else is evaluated.
    let finalizers_changed = "has(oldObject.metadata.finalizers) && (!has(object.metadata.finalizers) || object.metadata.finalizers != oldObject.metadata.finalizers)";
    let finalizer_removed = format!(
        "{finalizers_changed} && ({} || {})",
        removed(FOREGROUND_DELETION_FINALIZER),
        removed(FOREGROUND_CASCADE_FINALIZER)
    );
    // Who may: checked in the match condition before anything costly, so
    // that the garbage collector's and Crossplane's own updates never reach
    // the list comparisons below (their cost grows with the square of the
    // list's length).
    let may_remove_finalizers = any_user(&[
        &settings.gc_service_account_user,
        &settings.gc_controller_manager_user,
        &settings.controller_user,
    ]);
    let is_crossplane = any_user(&[&settings.crossplane_user]);
    let mut match_condition = format!("(!({may_remove_finalizers}) && {finalizer_removed})");
    let mut variables = vec![
        var("foregroundRemoved", &removed(FOREGROUND_DELETION_FINALIZER)),
        var("holdRemoved", &removed(FOREGROUND_CASCADE_FINALIZER)),
    ];
    if shape == Shape::CompositeResource {
        // Untyped, as nothingToCascade: each list is missing from one
        // generation's schema.
        let modern = refs_lost(
            "has(dyn(oldObject).spec) && has(dyn(oldObject).spec.crossplane) && has(dyn(oldObject).spec.crossplane.resourceRefs)",
            "dyn(oldObject).spec.crossplane.resourceRefs",
            "has(dyn(object).spec) && has(dyn(object).spec.crossplane) && has(dyn(object).spec.crossplane.resourceRefs)",
            "dyn(object).spec.crossplane.resourceRefs",
        );
        let legacy = refs_lost(
            "has(dyn(oldObject).spec) && has(dyn(oldObject).spec.resourceRefs)",
            "dyn(oldObject).spec.resourceRefs",
            "has(dyn(object).spec) && has(dyn(object).spec.resourceRefs)",
            "dyn(object).spec.resourceRefs",
        );
        let _ = write!(
            match_condition,
            " || (!({is_crossplane}) && (({modern}) || ({legacy})))"
        );
        variables.push(var("modernRefsLost", &modern));
        variables.push(var("legacyRefsLost", &legacy));
    }
    variables.extend([
        var("mayRemoveFinalizers", &may_remove_finalizers),
        var("isCrossplane", &is_crossplane),
        var("breakGlassAnnotated", &break_glass_annotated("object")),
        var("breakGlass", &break_glass_for(settings, "object")),
        var(
            "objectNamespace",
            OBJECT_NAMESPACE,
        ),
        var(
            "target",
            "request.resource.resource + (request.resource.group == '' ? '' : '.' + request.resource.group) + ' ' + object.metadata.name + (variables.objectNamespace == '' ? '' : ' -n ' + variables.objectNamespace)",
        ),
    ]);

    let lead = match mode {
        Mode::Warn => "cascade-guard warning: ",
        _ => "cascade-guard refused ",
    };
    let verb = |warn: &str, refuse: &str| -> String {
        if mode == Mode::Warn { warn } else { refuse }.to_string()
    };
    let abandon = format!(
        "To abandon it on purpose, first: kubectl annotate ' + variables.target + ' {BREAK_GLASS_ANNOTATION}=\\\"<why>\\\"'"
    );
    let what_it_leaves = what_it_leaves(shape);
    let mut validations = vec![CelValidation {
        expression: "!(variables.foregroundRemoved || variables.holdRemoved) || variables.mayRemoveFinalizers || variables.breakGlass".to_string(),
        message_expression: format!(
            "'{lead}{action} ' + (variables.foregroundRemoved && variables.holdRemoved ? '{FOREGROUND_DELETION_FINALIZER} and {FOREGROUND_CASCADE_FINALIZER}' : variables.foregroundRemoved ? '{FOREGROUND_DELETION_FINALIZER}' : '{FOREGROUND_CASCADE_FINALIZER}') + ' from ' + request.kind.kind + ' ' + object.metadata.name + ': only the garbage collector and cascade-guard remove these finalizers, when nothing is left to cascade; without them the object can leave the API before {what_it_leaves} are gone. {abandon}",
            action = verb("removing", "to remove"),
        ),
        message: format!(
            "{lead}{} the finalizer {FOREGROUND_DELETION_FINALIZER} or {FOREGROUND_CASCADE_FINALIZER}: only the garbage collector and cascade-guard remove them. Set the annotation {BREAK_GLASS_ANNOTATION} to a reason to abandon the object on purpose",
            verb("removing", "to remove"),
        ),
    }];
    if shape == Shape::CompositeResource {
        validations.push(CelValidation {
            expression: "!(variables.modernRefsLost || variables.legacyRefsLost) || variables.isCrossplane || variables.breakGlass".to_string(),
            message_expression: format!(
                "'{lead}{action} composed resources from ' + (variables.modernRefsLost ? 'spec.crossplane.resourceRefs' : 'spec.resourceRefs') + ' of ' + request.kind.kind + ' ' + object.metadata.name + ': only Crossplane changes that list (change the composition instead); an XR that lists nothing is deleted without waiting for what it composed. {abandon}",
                action = verb("removing", "to remove"),
            ),
            message: format!(
                "{lead}{} composed resources from an XR's resourceRefs: only Crossplane changes that list. Set the annotation {BREAK_GLASS_ANNOTATION} to a reason to abandon the object on purpose",
                verb("removing", "to remove"),
            ),
        });
    }
    CelUpdatePolicy {
        match_condition,
        variables,
        validations,
        reason: REFUSAL_REASON,
    }
}

/// True when the old list had entries and the new one lacks one of them. The
/// lists are compared whole first, so an update that leaves the list alone
/// costs one comparison.
fn refs_lost(old_has: &str, old: &str, new_has: &str, new: &str) -> String {
    format!(
        "{old_has} && size({old}) > 0 && (!({new_has}) || ({new} != {old} && {old}.exists(r, !(r in {new}))))"
    )
}

/// The requester is one of `users` (empty ones left out, so they never
/// match), with each name embedded by [`cel_string_literal`].
fn any_user(users: &[&String]) -> String {
    let literals: Vec<String> = users
        .iter()
        .filter(|u| !u.is_empty())
        .map(|u| cel_string_literal(u))
        .collect();
    if literals.is_empty() {
        "false".to_string()
    } else {
        format!(
            "request.userInfo.?username.orValue('') in [{}]",
            literals.join(", ")
        )
    }
}

/// The allow rules of a variant, in [`AllowReason::ORDER`], as CEL over the
/// variables.
fn rules(mode: Mode, shape: Shape) -> Vec<(AllowReason, &'static str)> {
    let claim = shape == Shape::Claim;
    AllowReason::ORDER
        .into_iter()
        .filter_map(|r| {
            let cond = match r {
                AllowReason::ForegroundAsked if !claim => "variables.foregroundAsked",
                AllowReason::AlreadyInForeground if !claim => {
                    "variables.noPolicy && variables.inForeground"
                }
                AllowReason::AlreadyDeleting => "variables.noPolicy && variables.deleting",
                AllowReason::NothingToCascade if shape != Shape::Other => {
                    "variables.nothingToCascade"
                }
                AllowReason::CompositeDeletedInForeground if claim => {
                    "variables.compositeInForeground"
                }
                AllowReason::GarbageCollector => "variables.isGarbageCollector",
                AllowReason::BreakGlass => "variables.breakGlass",
                AllowReason::ConvertHeld if mode == Mode::Convert => "variables.convertHeld",
                AllowReason::CrossplaneHeld
                    if !claim && matches!(mode, Mode::Refuse | Mode::Warn) =>
                {
                    "variables.crossplaneHeld"
                }
                _ => return None,
            };
            Some((r, cond))
        })
        .collect()
}

/// `rules` with the garbage collector's first, the others in rule order.
fn garbage_collector_first<'a>(
    rules: &'a [(AllowReason, &'static str)],
) -> impl Iterator<Item = &'a (AllowReason, &'static str)> {
    let gc = |r: &AllowReason| *r == AllowReason::GarbageCollector;
    rules
        .iter()
        .filter(move |(r, _)| gc(r))
        .chain(rules.iter().filter(move |(r, _)| !gc(r)))
}

/// `expression` with every `variables.NAME` replaced by NAME's expression
/// (itself written out), in parentheses. String literals are copied as they
/// are: a username or annotation value may well contain `variables.`.
///
/// Every admission object cascade-guard writes is written out this way and
/// declares no `spec.variables`. On Kubernetes 1.30 to 1.35 the API server
/// keeps one table of variable types for every policy in the cluster: a
/// policy compiled (created or changed) while another's evaluation reads a
/// variable can crash kube-apiserver ("concurrent map read and map write",
/// kubernetes/kubernetes#135757, fixed in 1.36). A policy without variables
/// neither writes that table nor reads it. The named pieces stay here, in
/// the compiler, where they keep the rules readable and testable.
pub fn inline_variables(expression: &str, variables: &[CelVariable]) -> String {
    let mut written: Vec<(&str, String)> = Vec::new();
    for v in variables {
        let out = substitute(&v.expression, &written);
        written.push((v.name, out));
    }
    substitute(expression, &written)
}

/// The object's namespace, from the request: the API server's type check on
/// Kubernetes 1.30 knows no `metadata.namespace` in a custom resource's
/// schema. A Namespace's own request names itself, so it is left out.
const OBJECT_NAMESPACE: &str = "request.resource.group == '' && request.resource.resource == 'namespaces' ? '' : request.?namespace.orValue('')";

fn substitute(expression: &str, written: &[(&str, String)]) -> String {
    const PREFIX: &str = "variables.";
    let mut out = String::with_capacity(expression.len());
    let mut rest = expression;
    while !rest.is_empty() {
        // Copied as they are: literals, and identifiers that merely end in
        // `variables` (`myvariables.x`).
        if let Some(len) = literal_len(rest) {
            out.push_str(&rest[..len]);
            rest = &rest[len..];
            continue;
        }
        let ident_before = out
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
        if !ident_before && rest.starts_with(PREFIX) {
            let after = &rest[PREFIX.len()..];
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            let name = &after[..end];
            match written.iter().find(|(n, _)| *n == name) {
                Some((_, e)) => {
                    out.push('(');
                    out.push_str(e);
                    out.push(')');
                }
                // Not one of ours (cannot happen): left as it was, so the API
                // server rejects the policy loudly rather than it meaning less.
                None => {
                    out.push_str(PREFIX);
                    out.push_str(name);
                }
            }
            rest = &after[end..];
            continue;
        }
        let c = rest.chars().next().map_or(1, char::len_utf8);
        out.push_str(&rest[..c]);
        rest = &rest[c..];
    }
    out
}

/// The length in bytes of the CEL string literal `text` starts with (quoted
/// with ' or ", escapes skipped; an unterminated one runs to the end), or
/// None when it does not start with one.
fn literal_len(text: &str) -> Option<usize> {
    let quote = text.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let mut chars = text.char_indices().skip(1);
    while let Some((i, c)) = chars.next() {
        if c == '\\' {
            chars.next();
        } else if c == quote {
            return Some(i + c.len_utf8());
        }
    }
    Some(text.len())
}

/// The break-glass annotation is on `object` (`oldObject` for a DELETE).
fn break_glass_annotated(object: &str) -> String {
    format!(
        "has({object}.metadata.annotations) && '{a}' in {object}.metadata.annotations && {object}.metadata.annotations['{a}'] != ''",
        a = BREAK_GLASS_ANNOTATION
    )
}

/// Break-glass counts for this request: the annotation is on the object and,
/// unless the settings say anyone who can annotate may, the user may `use`
/// `breakglass.cascade-guard.dev` (the API server's authorizer, asked only
/// when the annotation is there).
fn break_glass(settings: &CompileSettings) -> String {
    break_glass_for(settings, "oldObject")
}

pub(crate) fn break_glass_for(settings: &CompileSettings, object: &str) -> String {
    let annotated = break_glass_annotated(object);
    if settings.break_glass_needs_permission {
        format!(
            "{annotated} && authorizer.group('{GROUP}').resource('{BREAK_GLASS_RESOURCE}').check('{BREAK_GLASS_VERB}').allowed()"
        )
    } else {
        annotated
    }
}

pub(crate) fn var(name: &'static str, expression: &str) -> CelVariable {
    CelVariable {
        name,
        expression: expression.to_string(),
    }
}

fn wrap(cond: &str) -> String {
    if cond.contains(' ') {
        format!("({cond})")
    } else {
        cond.to_string()
    }
}

/// Our own finalizer names only; they contain no quote or backslash.
fn finalizer_present(finalizer: &str) -> String {
    format!("has(oldObject.metadata.finalizers) && '{finalizer}' in oldObject.metadata.finalizers")
}

/// The GC's own identity always counts; the controller-manager identity only
/// with a UID precondition, because the namespace controller shares it and
/// never sends one. An empty identity is left out rather than matching "".
fn garbage_collector_expression(settings: &CompileSettings) -> String {
    let mut alternatives = Vec::new();
    if !settings.gc_service_account_user.is_empty() {
        alternatives.push(format!(
            "variables.username == {}",
            cel_string_literal(&settings.gc_service_account_user)
        ));
    }
    if !settings.gc_controller_manager_user.is_empty() {
        alternatives.push(format!(
            "(variables.username == {} && variables.uidPrecondition)",
            cel_string_literal(&settings.gc_controller_manager_user)
        ));
    }
    if alternatives.is_empty() {
        "false".to_string()
    } else {
        alternatives.join(" || ")
    }
}

/// A double-quoted CEL string literal denoting exactly `s`.
///
/// The output is plain printable ASCII: backslash and both quotes are
/// escaped, control characters and everything beyond ASCII become `\u`/`\U`
/// escapes, so nothing in `s` can end the literal or start an expression.
pub fn cel_string_literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\'' => out.push_str("\\'"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            ' '..='~' => out.push(c),
            c if (c as u32) <= 0xFFFF => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\U{:08x}", c as u32);
            }
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests;
