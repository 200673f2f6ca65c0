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
        Shape::CompositeResource => variables.push(var(
            "nothingToCascade",
            "!(has(oldObject.spec) && has(oldObject.spec.crossplane) && has(oldObject.spec.crossplane.resourceRefs) && size(oldObject.spec.crossplane.resourceRefs) > 0) && !(has(oldObject.spec) && has(oldObject.spec.resourceRefs) && size(oldObject.spec.resourceRefs) > 0)",
        )),
        // A claim cascades to the composite resource it is bound to, in the
        // way its compositeDeletePolicy says.
        Shape::Claim => variables.extend([
            var(
                "nothingToCascade",
                "!(has(oldObject.spec) && has(oldObject.spec.resourceRef))",
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
        let modern = refs_lost(
            "has(oldObject.spec) && has(oldObject.spec.crossplane) && has(oldObject.spec.crossplane.resourceRefs)",
            "oldObject.spec.crossplane.resourceRefs",
            "has(object.spec) && has(object.spec.crossplane) && has(object.spec.crossplane.resourceRefs)",
            "object.spec.crossplane.resourceRefs",
        );
        let legacy = refs_lost(
            "has(oldObject.spec) && has(oldObject.spec.resourceRefs)",
            "oldObject.spec.resourceRefs",
            "has(object.spec) && has(object.spec.resourceRefs)",
            "object.spec.resourceRefs",
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

/// The variables that stay variables when a policy's others are written out
/// ([`written_out`]): they read fields a kind's schema may lack (a modern XR
/// has no `spec.resourceRefs`, a legacy one no `spec.crossplane`). The API
/// server's type check reports such a field in an expression, not in a
/// variable.
pub const SCHEMA_DEPENDENT_VARIABLES: [&str; 3] =
    ["nothingToCascade", "modernRefsLost", "legacyRefsLost"];

/// A policy's variables written out, for when a match condition stops every
/// request but the few it refuses: the API server builds the map of a
/// policy's variables for every evaluation, its match condition's included.
/// The [`SCHEMA_DEPENDENT_VARIABLES`] stay variables.
pub struct WrittenOut {
    inlined: Vec<CelVariable>,
    /// The variables the policy keeps, themselves written out.
    pub kept: Vec<CelVariable>,
}

impl WrittenOut {
    pub fn new(variables: &[CelVariable]) -> Self {
        let (kept, inlined): (Vec<CelVariable>, Vec<CelVariable>) = variables
            .iter()
            .cloned()
            .partition(|v| SCHEMA_DEPENDENT_VARIABLES.contains(&v.name));
        let kept = kept
            .into_iter()
            .map(|v| CelVariable {
                name: v.name,
                expression: inline_variables(&v.expression, &inlined),
            })
            .collect();
        Self { inlined, kept }
    }

    /// `expression` with every variable but the kept ones written out.
    pub fn expression(&self, expression: &str) -> String {
        inline_variables(expression, &self.inlined)
    }
}

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

fn var(name: &'static str, expression: &str) -> CelVariable {
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
mod tests {
    use super::*;

    #[test]
    fn written_out_keeps_only_the_schema_dependent_variables() {
        let vars = [
            var("policy", "request.x"),
            var(
                "nothingToCascade",
                "variables.policy == '' && has(oldObject.spec.y)",
            ),
            var("sent", "'sent ' + variables.policy"),
        ];
        let out = WrittenOut::new(&vars);
        assert_eq!(
            out.kept,
            [var(
                "nothingToCascade",
                "(request.x) == '' && has(oldObject.spec.y)"
            )]
        );
        assert_eq!(
            out.expression("variables.nothingToCascade || variables.sent == 'variables.sent'"),
            "variables.nothingToCascade || ('sent ' + (request.x)) == 'variables.sent'"
        );
        // Every compiled policy: what is left names only what is kept.
        let settings = CompileSettings::default();
        for mode in [Mode::Refuse, Mode::Convert, Mode::Warn] {
            for shape in [Shape::CompositeResource, Shape::Claim, Shape::Other] {
                let p = compile_cel(mode, shape, &settings);
                let out = WrittenOut::new(&p.variables);
                let mut left =
                    out.expression(&p.validation) + &out.expression(&p.message_expression);
                for v in &out.kept {
                    assert!(SCHEMA_DEPENDENT_VARIABLES.contains(&v.name));
                    assert!(!v.expression.contains("variables."), "{mode} {shape:?}");
                    left = left.replace(&format!("variables.{}", v.name), "");
                }
                assert!(!left.contains("variables."), "{mode} {shape:?}: {left}");
                assert_eq!(
                    out.kept.len(),
                    usize::from(shape != Shape::Other),
                    "{mode} {shape:?}"
                );
            }
        }
    }

    #[test]
    fn variables_are_written_out_for_match_conditions() {
        let vars = [
            var("a", "request.x"),
            var("ab", "variables.a == 1"),
            var("a_b", "variables.ab && variables.a"),
        ];
        let cases = [
            ("variables.a", "(request.x)"),
            ("variables.ab", "((request.x) == 1)"),
            (
                "!variables.a_b || f(variables.a)",
                "!(((request.x) == 1) && (request.x)) || f((request.x))",
            ),
            ("variables.unknown", "variables.unknown"),
            ("no variables", "no variables"),
            // Literals and longer identifiers are left alone.
            (
                "variables.a == 'variables.a' || \"x\\\" variables.ab\" == myvariables.a",
                "(request.x) == 'variables.a' || \"x\\\" variables.ab\" == myvariables.a",
            ),
            (
                "'it\\'s variables.a' + variables.a",
                "'it\\'s variables.a' + (request.x)",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(inline_variables(input, &vars), want, "{input}");
        }
    }

    #[test]
    fn a_username_that_reads_like_a_variable_is_not_rewritten() {
        let settings = CompileSettings {
            gc_service_account_user: "system:serviceaccount:variables.policy:gc".into(),
            ..CompileSettings::default()
        };
        let p = compile_cel(Mode::Refuse, Shape::CompositeResource, &settings);
        assert!(
            p.refusal_condition.contains(&cel_string_literal(
                "system:serviceaccount:variables.policy:gc"
            )),
            "{}",
            p.refusal_condition
        );
    }

    #[test]
    fn the_garbage_collector_is_checked_first_and_the_rest_in_rule_order() {
        for mode in [Mode::Refuse, Mode::Convert, Mode::Warn] {
            for shape in [Shape::CompositeResource, Shape::Claim, Shape::Other] {
                let p = compile_cel(mode, shape, &CompileSettings::default());
                let rest: Vec<String> = rules(mode, shape)
                    .into_iter()
                    .filter(|(r, _)| *r != AllowReason::GarbageCollector)
                    .map(|(_, c)| wrap(c))
                    .collect();
                let want = std::iter::once("variables.isGarbageCollector".to_string())
                    .chain(rest)
                    .collect::<Vec<_>>()
                    .join(" || ");
                assert_eq!(p.validation, want, "{mode} {shape:?}");
                // The audit annotation still names the rules in the decision
                // table's order.
                if shape != Shape::Claim {
                    assert!(
                        p.decision_expression
                            .starts_with("variables.foregroundAsked ?"),
                        "{}",
                        p.decision_expression
                    );
                }
            }
        }
    }

    #[test]
    fn the_refusal_condition_is_the_validation_negated_without_variables() {
        for mode in [Mode::Refuse, Mode::Convert, Mode::Warn] {
            for shape in [Shape::CompositeResource, Shape::Other] {
                let p = compile_cel(mode, shape, &CompileSettings::default());
                assert!(
                    !p.refusal_condition.contains("variables."),
                    "{mode} {shape:?}"
                );
                assert_eq!(
                    p.refusal_condition,
                    format!("!({})", inline_variables(&p.validation, &p.variables))
                );
                // Balanced, so the negation covers the whole rule.
                let depth = p.refusal_condition.chars().try_fold(0i32, |d, c| {
                    let d = d + i32::from(c == '(') - i32::from(c == ')');
                    (d >= 0).then_some(d)
                });
                assert_eq!(depth, Some(0), "{mode} {shape:?}");
            }
        }
    }

    /// Decodes one CEL double-quoted literal at the start of `text`, returning
    /// the value and the rest. Written from the CEL spec's escape list, and
    /// strict: it rejects anything a CEL lexer would not accept in a literal.
    fn lex_literal(text: &str) -> Result<(String, &str), String> {
        let mut chars = text.char_indices();
        if chars.next().map(|(_, c)| c) != Some('"') {
            return Err("does not start with a quote".into());
        }
        let mut value = String::new();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => return Ok((value, &text[i + 1..])),
                '\n' | '\r' => return Err("raw line break".into()),
                '\\' => {
                    let (_, e) = chars.next().ok_or("dangling backslash")?;
                    let hex = |n: usize,
                               chars: &mut std::str::CharIndices|
                     -> Result<char, String> {
                        let digits: String = (0..n)
                            .filter_map(|_| chars.next().map(|(_, c)| c))
                            .collect();
                        let code = u32::from_str_radix(&digits, 16).map_err(|e| e.to_string())?;
                        char::from_u32(code).ok_or_else(|| "not a scalar value".to_string())
                    };
                    value.push(match e {
                        '\\' => '\\',
                        '"' => '"',
                        '\'' => '\'',
                        'n' => '\n',
                        'r' => '\r',
                        't' => '\t',
                        'u' => hex(4, &mut chars)?,
                        'U' => hex(8, &mut chars)?,
                        other => return Err(format!("unknown escape \\{other}")),
                    });
                }
                c => value.push(c),
            }
        }
        Err("unterminated".into())
    }

    #[test]
    fn literals_round_trip_and_cannot_break_out() {
        let hostile = [
            "system:serviceaccount:kube-system:generic-garbage-collector",
            "",
            "a' || true || '",
            "a\" || true || \"",
            "\"",
            "'",
            "\\",
            "\\\"",
            "ends with backslash\\",
            "line\nbreak",
            "carriage\rreturn",
            "nul\u{0}byte",
            "bell\u{7}del\u{7f}",
            "tab\there",
            "é ü 日本 🦀",
            "\u{2028}\u{2029}",
            "${x} `backtick` {{ }}",
            "\") || true || (\"",
        ];
        for input in hostile {
            let lit = cel_string_literal(input);
            assert!(lit.chars().all(|c| (' '..='~').contains(&c)), "{lit}");
            let (value, rest) = lex_literal(&lit).unwrap_or_else(|e| panic!("{input:?}: {e}"));
            assert_eq!(value, input);
            assert_eq!(rest, "", "{input:?} leaked out of its literal");
            // Inside an expression, the literal is still one token.
            let expr = format!("variables.username == {lit} && false");
            let after = expr.strip_prefix("variables.username == ").unwrap();
            let (_, tail) = lex_literal(after).unwrap();
            assert_eq!(tail, " && false");
        }
        assert_eq!(cel_string_literal("a'b\"c\\d\n"), r#""a\'b\"c\\d\n""#);
        assert_eq!(
            cel_string_literal("\u{0}é🦀"),
            r#""\u0000\u00e9\U0001f980""#
        );
    }

    fn all_text(p: &CelPolicy) -> String {
        let mut s = String::new();
        for v in &p.variables {
            s.push_str(&v.expression);
            s.push('\n');
        }
        for e in [
            &p.validation,
            &p.message_expression,
            &p.message,
            &p.decision_expression,
        ] {
            s.push_str(e);
            s.push('\n');
        }
        s
    }

    fn used_variables(expression: &str) -> Vec<String> {
        expression
            .split("variables.")
            .skip(1)
            .map(|rest| {
                rest.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect()
            })
            .collect()
    }

    fn var_names(p: &CelPolicy) -> Vec<&str> {
        p.variables.iter().map(|v| v.name).collect()
    }

    #[test]
    fn variants_differ_as_expected() {
        let s = CompileSettings::default();
        // (mode, shape, has nothingToCascade, has convertHeld)
        let cases = [
            (Mode::Refuse, Shape::CompositeResource, true, false),
            (Mode::Refuse, Shape::Other, false, false),
            (Mode::Warn, Shape::CompositeResource, true, false),
            (Mode::Convert, Shape::CompositeResource, true, true),
            (Mode::Convert, Shape::Other, false, true),
        ];
        for (mode, shape, nothing, convert) in cases {
            // Crossplane's delete of a held object: every mode that refuses
            // or warns (Convert lets anyone's through).
            let crossplane = !convert;
            let p = compile_cel(mode, shape, &s);
            let names = var_names(&p);
            assert_eq!(
                names.contains(&"nothingToCascade"),
                nothing,
                "{mode} {shape:?}"
            );
            assert_eq!(names.contains(&"convertHeld"), convert, "{mode} {shape:?}");
            assert_eq!(p.validation.contains("variables.nothingToCascade"), nothing);
            assert_eq!(p.validation.contains("variables.convertHeld"), convert);
            assert_eq!(p.decision_expression.contains("NothingToCascade"), nothing);
            assert_eq!(p.decision_expression.contains("ConvertHeld"), convert);
            assert_eq!(names.contains(&"crossplaneHeld"), crossplane);
            assert_eq!(
                p.validation.contains("variables.crossplaneHeld"),
                crossplane
            );
            assert_eq!(p.decision_expression.contains("CrossplaneHeld"), crossplane);
            assert_eq!(all_text(&p).contains("resourceRefs"), nothing);
            for always in [
                "foregroundAsked",
                "noPolicy",
                "inForeground",
                "isGarbageCollector",
                "breakGlass",
            ] {
                assert!(names.contains(&always), "{always}");
                assert!(
                    p.validation.contains(&format!("variables.{always}")),
                    "{always}"
                );
            }
            // Every variable an expression uses is declared before it.
            for (i, v) in p.variables.iter().enumerate() {
                for used in used_variables(&v.expression) {
                    assert!(
                        names[..i].contains(&used.as_str()),
                        "{} uses {used} before it is declared",
                        v.name
                    );
                }
            }
            for e in [&p.validation, &p.message_expression, &p.decision_expression] {
                for used in used_variables(e) {
                    assert!(names.contains(&used.as_str()), "{used} is not declared");
                }
            }
            // The API server requires variable names to be CEL identifiers,
            // and CEL reserves some ordinary words (`namespace` among them).
            const RESERVED: [&str; 21] = [
                "as",
                "break",
                "const",
                "continue",
                "else",
                "false",
                "for",
                "function",
                "if",
                "import",
                "in",
                "let",
                "loop",
                "package",
                "namespace",
                "null",
                "return",
                "true",
                "var",
                "void",
                "while",
            ];
            for name in &names {
                assert!(!RESERVED.contains(name), "{name} is reserved in CEL");
                assert!(
                    name.chars()
                        .next()
                        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                );
                assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
            }
            assert_eq!(p.reason, "Forbidden");
            assert!(!p.message.contains('\n') && !p.message_expression.contains('\n'));
        }
        let refuse = compile_cel(Mode::Refuse, Shape::CompositeResource, &s);
        let warn = compile_cel(Mode::Warn, Shape::CompositeResource, &s);
        assert_eq!(refuse.variables, warn.variables);
        assert_eq!(refuse.validation, warn.validation);
        assert!(refuse.message_expression.contains("refused"));
        assert!(warn.message_expression.contains("warning"));
        assert!(refuse.message_expression.contains(BREAK_GLASS_ANNOTATION));
        assert!(
            compile_cel(Mode::Refuse, Shape::Other, &s)
                .message_expression
                .contains("the objects it owns")
        );
    }

    #[test]
    fn rules_follow_the_decision_order() {
        let cases = [
            (Mode::Convert, Shape::CompositeResource),
            (Mode::Refuse, Shape::Claim),
        ];
        for (mode, shape) in cases {
            let p = compile_cel(mode, shape, &CompileSettings::default());
            let ours: Vec<AllowReason> = rules(mode, shape).into_iter().map(|(r, _)| r).collect();
            let positions: Vec<usize> = AllowReason::ORDER
                .iter()
                .filter(|r| ours.contains(r))
                .map(|r| {
                    p.decision_expression
                        .find(&format!("'allowed: {}'", r.as_str()))
                        .unwrap_or_else(|| panic!("{mode} {shape:?}: {r:?} not in the expression"))
                })
                .collect();
            assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
            assert!(
                p.decision_expression
                    .ends_with("'refused: ' + variables.sent")
            );
        }
        // Which rules a claim has: its own propagation counts for nothing,
        // except that a delete of a claim already being deleted, sending
        // none, changes nothing.
        let claim: Vec<AllowReason> = rules(Mode::Refuse, Shape::Claim)
            .into_iter()
            .map(|(r, _)| r)
            .collect();
        assert_eq!(
            claim,
            [
                AllowReason::AlreadyDeleting,
                AllowReason::NothingToCascade,
                AllowReason::CompositeDeletedInForeground,
                AllowReason::GarbageCollector,
                AllowReason::BreakGlass,
            ]
        );
    }

    #[test]
    fn only_the_gc_usernames_are_embedded() {
        let settings = CompileSettings {
            gc_service_account_user: "gc' || true || '\"\\\n\u{0}".into(),
            gc_controller_manager_user: "kcm-🦀".into(),
            ..CompileSettings::default()
        };
        let p = compile_cel(Mode::Refuse, Shape::CompositeResource, &settings);
        let text = all_text(&p);
        assert!(text.contains(&cel_string_literal(&settings.gc_service_account_user)));
        assert!(text.contains(&cel_string_literal(&settings.gc_controller_manager_user)));
        assert!(!text.contains("gc' || true"));

        // Remove the two literals; what is left is fixed text that does not
        // depend on any setting, so nothing else can have been embedded.
        let strip = |p: &CelPolicy, s: &CompileSettings| {
            all_text(p)
                .replace(&cel_string_literal(&s.gc_service_account_user), "SA")
                .replace(&cel_string_literal(&s.gc_controller_manager_user), "KCM")
        };
        let defaults = CompileSettings::default();
        assert_eq!(
            strip(&p, &settings),
            strip(
                &compile_cel(Mode::Refuse, Shape::CompositeResource, &defaults),
                &defaults
            )
        );
        // No kind, group or resource name appears: they come from the request.
        for word in ["modelplane", "InferenceCluster", "inferenceclusters"] {
            assert!(!text.contains(word));
        }
    }

    #[test]
    fn empty_gc_identities_are_left_out() {
        let cases = [
            (
                ("sa", "kcm"),
                "variables.username == \"sa\" || (variables.username == \"kcm\" && variables.uidPrecondition)",
            ),
            (("sa", ""), "variables.username == \"sa\""),
            (
                ("", "kcm"),
                "(variables.username == \"kcm\" && variables.uidPrecondition)",
            ),
            (("", ""), "false"),
        ];
        for ((sa, kcm), want) in cases {
            let settings = CompileSettings {
                gc_service_account_user: sa.into(),
                gc_controller_manager_user: kcm.into(),
                ..CompileSettings::default()
            };
            assert_eq!(garbage_collector_expression(&settings), want);
        }
    }

    #[test]
    fn update_rules_by_shape_and_mode() {
        let settings = CompileSettings::default();
        for mode in [Mode::Refuse, Mode::Convert, Mode::Warn] {
            for shape in [Shape::CompositeResource, Shape::Other] {
                let p = compile_update_cel(mode, shape, &settings);
                let xr = shape == Shape::CompositeResource;
                let label = format!("{mode} {shape:?}");
                // The match condition stands alone, and checks who asks
                // before any list is compared.
                assert!(!p.match_condition.contains("variables."), "{label}");
                assert!(
                    p.match_condition
                        .starts_with("(!(request.userInfo.?username.orValue('') in [")
                );
                let depth = p.match_condition.chars().try_fold(0i32, |d, c| {
                    let d = d + i32::from(c == '(') - i32::from(c == ')');
                    (d >= 0).then_some(d)
                });
                assert_eq!(depth, Some(0), "{label}");
                assert_eq!(p.match_condition.contains("resourceRefs"), xr, "{label}");
                if xr {
                    let crossplane = p.match_condition.find("crossplane-system").unwrap();
                    let refs = p.match_condition.find(".exists(").unwrap();
                    assert!(crossplane < refs, "{label}");
                }
                assert_eq!(p.validations.len(), if xr { 2 } else { 1 }, "{label}");
                let names: Vec<&str> = p.variables.iter().map(|v| v.name).collect();
                for (i, v) in p.variables.iter().enumerate() {
                    for used in used_variables(&v.expression) {
                        assert!(
                            names[..i].contains(&used.as_str()),
                            "{} uses {used}",
                            v.name
                        );
                    }
                }
                for v in &p.validations {
                    for e in [&v.expression, &v.message_expression] {
                        for used in used_variables(e) {
                            assert!(names.contains(&used.as_str()), "{used} is not declared");
                        }
                    }
                    assert!(!v.message.contains('\n') && !v.message_expression.contains('\n'));
                    let lead = if mode == Mode::Warn {
                        "'cascade-guard warning: removing"
                    } else {
                        "'cascade-guard refused to remove"
                    };
                    assert!(v.message_expression.starts_with(lead), "{label}");
                    // The break-glass command pastes into a shell as it is.
                    assert!(
                        v.message_expression
                            .contains(&format!("{BREAK_GLASS_ANNOTATION}=\\\"<why>\\\"")),
                        "{}",
                        v.message_expression
                    );
                }
                assert_eq!(p.reason, "Forbidden");
            }
        }
    }

    /// Break-glass asks the API server's authorizer, unless told not to; the
    /// refusal says when the annotation was there but did not count.
    #[test]
    fn break_glass_needs_the_permission_unless_told_otherwise() {
        let strict = CompileSettings::default();
        let lax = CompileSettings {
            break_glass_needs_permission: false,
            ..CompileSettings::default()
        };
        let asks =
            "authorizer.group('cascade-guard.dev').resource('breakglass').check('use').allowed()";
        let variable = |vars: &[CelVariable], name: &str| {
            vars.iter()
                .find(|v| v.name == name)
                .map(|v| v.expression.clone())
                .unwrap_or_default()
        };
        for (settings, needs) in [(&strict, true), (&lax, false)] {
            let delete = compile_cel(Mode::Refuse, Shape::CompositeResource, settings);
            assert_eq!(
                variable(&delete.variables, "breakGlass").contains(asks),
                needs
            );
            assert_eq!(delete.refusal_condition.contains(asks), needs);
            assert!(
                delete
                    .message_expression
                    .contains("may not use break-glass")
            );
            let update = compile_update_cel(Mode::Refuse, Shape::CompositeResource, settings);
            assert_eq!(
                variable(&update.variables, "breakGlass").contains(asks),
                needs
            );
        }
    }

    #[test]
    fn update_users_are_embedded_as_literals_and_empty_ones_never_match() {
        let hostile = CompileSettings {
            gc_service_account_user: "variables.x\" || true || \"".into(),
            gc_controller_manager_user: String::new(),
            crossplane_user: "cp' || true || '".into(),
            controller_user: "cg-🦀".into(),
            break_glass_needs_permission: true,
            set_name: None,
        };
        let p = compile_update_cel(Mode::Refuse, Shape::CompositeResource, &hostile);
        let lit = |s: &str| cel_string_literal(s);
        assert!(p.match_condition.contains(&format!(
            "request.userInfo.?username.orValue('') in [{}, {}]",
            lit(&hostile.gc_service_account_user),
            lit(&hostile.controller_user)
        )));
        assert!(p.match_condition.contains(&format!(
            "request.userInfo.?username.orValue('') in [{}]",
            lit(&hostile.crossplane_user)
        )));
        assert!(!p.match_condition.contains("cp' || true"));
        let nobody = CompileSettings {
            gc_service_account_user: String::new(),
            gc_controller_manager_user: String::new(),
            crossplane_user: String::new(),
            controller_user: String::new(),
            break_glass_needs_permission: true,
            set_name: None,
        };
        let p = compile_update_cel(Mode::Refuse, Shape::CompositeResource, &nobody);
        assert!(p.match_condition.starts_with("(!(false) && "));
        assert!(p.match_condition.contains("|| (!(false) && "));
    }

    #[test]
    fn delete_refusals_say_what_the_delete_would_do() {
        let p = compile_cel(
            Mode::Refuse,
            Shape::CompositeResource,
            &CompileSettings::default(),
        );
        let m = &p.message_expression;
        // Mid-cascade: nothing to do but wait; Orphan: left behind; else: removed first.
        let cut = m
            .find("variables.inForeground ? \"it is already being deleted")
            .unwrap();
        let orphan = m
            .find("variables.orphaning ? \"it would leave its composed resources behind")
            .unwrap();
        let first = m
            .find("\"it would remove it before its composed resources are gone")
            .unwrap();
        assert!(cut < orphan && orphan < first, "{m}");
        assert!(m.contains("cascade-guard trace \" + variables.target"));
        assert!(m.contains("cascade-guard plan \" + variables.target"));
        assert!(
            m.contains(&format!("{BREAK_GLASS_ANNOTATION}=\\\"<why>\\\"")),
            "{m}"
        );
        assert!(!m.contains("=<reason>"));
    }
}
