//! What an unsafe delete is told (pure): the refusal (Refuse, Convert) or
//! warning (Warn) of the delete policy, written once as words and values,
//! and spelled two ways from that one text: as the CEL message expression
//! the API server evaluates ([`message_expression`]), and as the text it
//! gives for one request ([`text`]), which the decision-table tests pin
//! whole and the API server's own refusals are checked against.
//!
//! The refusal says what the delete would do, the command that works
//! (`--cascade=foreground`, or a claim's patch), the command that shows what
//! that delete takes down and in which order (`cascade-guard plan`, also
//! `kubectl cascade-guard plan`), and how to abandon the object on purpose.

use crate::cel::cel_string_literal;
use crate::decision::{DeleteRequest, Propagation, what_was_sent};
use crate::kind::Shape;
use crate::mode::Mode;
use crate::names::{
    BREAK_GLASS_ANNOTATION, BREAK_GLASS_RESOURCE, BREAK_GLASS_VERB, FOREGROUND_DELETION_FINALIZER,
    GROUP,
};

/// A value read from the request, which the CEL reads at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Value {
    /// The object's kind (`request.kind.kind`).
    Kind,
    /// The object's name.
    Name,
    /// What the client sent instead of a foreground cascade.
    Sent,
    /// The object as kubectl names it: `resource[.group] name [-n namespace]`.
    Target,
    /// Who sent the delete.
    Username,
}

impl Value {
    fn cel(self) -> &'static str {
        match self {
            Value::Kind => "request.kind.kind",
            Value::Name => "oldObject.metadata.name",
            Value::Sent => "variables.sent",
            Value::Target => "variables.target",
            Value::Username => "variables.username",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    Words(String),
    Value(Value),
}

/// Words and values, in order.
#[derive(Clone, Debug, Default)]
struct Said(Vec<Piece>);

impl Said {
    fn words(mut self, words: &str) -> Self {
        self.0.push(Piece::Words(words.to_string()));
        self
    }

    fn value(mut self, value: Value) -> Self {
        self.0.push(Piece::Value(value));
        self
    }

    fn then(mut self, more: Said) -> Self {
        self.0.extend(more.0);
        self
    }

    /// As a CEL string expression: literals and values joined by `+`.
    fn cel(&self) -> String {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|p| match p {
                Piece::Words(w) => cel_string_literal(w),
                Piece::Value(v) => v.cel().to_string(),
            })
            .collect();
        if parts.is_empty() {
            "''".to_string()
        } else {
            parts.join(" + ")
        }
    }

    fn text(&self, values: &dyn Fn(Value) -> String) -> String {
        self.0
            .iter()
            .map(|p| match p {
                Piece::Words(w) => w.clone(),
                Piece::Value(v) => values(*v),
            })
            .collect()
    }
}

/// Which account of the delete the message gives, chosen from the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Why {
    /// A claim whose composite Crossplane would delete in the background.
    Claim,
    /// A Background or Orphan delete of an object mid-way through a
    /// foreground cascade: the API server would cut that cascade short.
    CutsCascadeShort,
    /// The client asked to leave what the object owns behind.
    Orphans,
    /// Everything else: the object would go before what it owns.
    GoesFirst,
}

/// What a delete of the kind may leave to wedge.
pub(crate) fn what_it_leaves(shape: Shape) -> &'static str {
    match shape {
        Shape::CompositeResource => "its composed resources",
        Shape::Claim => "the resources it composes",
        Shape::Other => "the objects it owns",
    }
}

fn why(why: Why, shape: Shape) -> Said {
    let leaves = what_it_leaves(shape);
    // The delete that works, and where to see beforehand what it takes down.
    let foreground = || {
        Said::default()
            .words("Delete it with foreground cascading: kubectl delete ")
            .value(Value::Target)
            .words(
                " --cascade=foreground. To see first what that deletes, and in which order: cascade-guard plan ",
            )
            .value(Value::Target)
            .words(" (or kubectl cascade-guard plan, the same)")
    };
    match why {
        Why::Claim => Said::default()
            .words(&format!(
                "Crossplane would then delete its composite resource with background propagation (the claim's spec.compositeDeletePolicy is not Foreground), which removes the composite before {leaves} are gone and leaves them to wedge. Have the claim delete it in the foreground, then delete the claim: kubectl patch "
            ))
            .value(Value::Target)
            .words(r#" --type merge -p '{"spec":{"compositeDeletePolicy":"Foreground"}}' && kubectl delete "#)
            .value(Value::Target),
        Why::CutsCascadeShort => Said::default()
            .words("it is already being deleted with foreground cascading, and this delete would cut that cascade short. Nothing more is needed: the cascade ends by itself (follow it: cascade-guard trace ")
            .value(Value::Target)
            .words(")"),
        Why::Orphans => Said::default()
            .words(&format!(
                "it would leave {leaves} behind, orphaned, with nothing to delete them. "
            ))
            .then(foreground()),
        Why::GoesFirst => Said::default()
            .words(&format!(
                "it would remove it before {leaves} are gone and leave them to wedge. "
            ))
            .then(foreground()),
    }
}

/// Break-glass set, and still refused: it does not count for this user.
fn break_glass_not_counted() -> Said {
    Said::default()
        .words(&format!("{BREAK_GLASS_ANNOTATION} is set, but "))
        .value(Value::Username)
        .words(&format!(
            " may not use break-glass (it needs {BREAK_GLASS_VERB} on {BREAK_GLASS_RESOURCE}.{GROUP}, which the ClusterRole cascade-guard-break-glass grants), so it does not count; "
        ))
}

/// What comes before the account of the delete, and what after.
fn frame(mode: Mode) -> (Said, Said) {
    let head = |lead: &str, tail: &str| {
        Said::default()
            .words(lead)
            .value(Value::Kind)
            .words(" ")
            .value(Value::Name)
            .words(" with ")
            .value(Value::Sent)
            .words(tail)
    };
    match mode {
        Mode::Warn => (
            head("cascade-guard warning: deleting ", " is unsafe: "),
            Said::default(),
        ),
        _ => (
            head("cascade-guard refused to delete ", ": "),
            Said::default()
                .words(". To abandon it on purpose, first: kubectl annotate ")
                .value(Value::Target)
                .words(&format!(" {BREAK_GLASS_ANNOTATION}=\"<why>\"")),
        ),
    }
}

/// The delete policy's message expression for one mode and shape. Its
/// conditions read the policy's variables (`breakGlassAnnotated`,
/// `inForeground`, `orphaning`), which decide the account [`text`] gives.
pub(crate) fn message_expression(mode: Mode, shape: Shape) -> String {
    let (head, tail) = frame(mode);
    let account = match shape {
        Shape::Claim => why(Why::Claim, shape).cel(),
        _ => format!(
            "(variables.inForeground ? {} : variables.orphaning ? {} : {})",
            why(Why::CutsCascadeShort, shape).cel(),
            why(Why::Orphans, shape).cel(),
            why(Why::GoesFirst, shape).cel()
        ),
    };
    let mut out = format!(
        "{} + (variables.breakGlassAnnotated ? {} : '') + {account}",
        head.cel(),
        break_glass_not_counted().cel()
    );
    if !tail.0.is_empty() {
        out.push_str(" + ");
        out.push_str(&tail.cel());
    }
    out
}

/// The object a refusal is about, as the API server's request names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject {
    /// Its kind (`InferenceCluster`).
    pub kind: String,
    pub name: String,
    /// Its resource, as the request names it (`inferenceclusters`).
    pub resource: String,
    /// Its API group; empty for the core group.
    pub group: String,
    /// Its namespace; None when cluster-scoped.
    pub namespace: Option<String>,
}

impl Subject {
    /// The object as kubectl names it: `resource[.group] name [-n namespace]`.
    pub fn target(&self) -> String {
        let mut out = self.resource.clone();
        if !self.group.is_empty() {
            out.push('.');
            out.push_str(&self.group);
        }
        out.push(' ');
        out.push_str(&self.name);
        if let Some(ns) = self.namespace.as_deref().filter(|ns| !ns.is_empty()) {
            out.push_str(" -n ");
            out.push_str(ns);
        }
        out
    }
}

/// The message the API server gives `request` of `subject` when the delete
/// policy of `mode` refuses it (or, in Warn, warns of it): the same text the
/// [`message_expression`] evaluates to.
pub fn text(mode: Mode, shape: Shape, request: &DeleteRequest, subject: &Subject) -> String {
    let object = &request.object;
    let account = match shape {
        Shape::Claim => Why::Claim,
        _ if object
            .finalizers
            .iter()
            .any(|f| f == FOREGROUND_DELETION_FINALIZER) =>
        {
            Why::CutsCascadeShort
        }
        _ if request.propagation == Some(Propagation::Orphan)
            || request.orphan_dependents == Some(true) =>
        {
            Why::Orphans
        }
        _ => Why::GoesFirst,
    };
    let (head, tail) = frame(mode);
    let mut said = head;
    if object.break_glass {
        said = said.then(break_glass_not_counted());
    }
    let said = said.then(why(account, shape)).then(tail);
    let sent = what_was_sent(request).to_string();
    said.text(&|v| match v {
        Value::Kind => subject.kind.clone(),
        Value::Name => subject.name.clone(),
        Value::Sent => sent.clone(),
        Value::Target => subject.target(),
        Value::Username => request.username.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::tests::{Requester, Sent, State, request};

    fn subject(namespace: Option<&str>) -> Subject {
        Subject {
            kind: "InferenceCluster".to_string(),
            name: "prod".to_string(),
            resource: "inferenceclusters".to_string(),
            group: "modelplane.ai".to_string(),
            namespace: namespace.map(str::to_string),
        }
    }

    #[test]
    fn targets_are_named_as_kubectl_takes_them() {
        let cases = [
            (subject(None), "inferenceclusters.modelplane.ai prod"),
            (
                subject(Some("team-a")),
                "inferenceclusters.modelplane.ai prod -n team-a",
            ),
            (subject(Some("")), "inferenceclusters.modelplane.ai prod"),
            (
                Subject {
                    kind: "ConfigMap".to_string(),
                    name: "c".to_string(),
                    resource: "configmaps".to_string(),
                    group: String::new(),
                    namespace: Some("ns".to_string()),
                },
                "configmaps c -n ns",
            ),
        ];
        for (s, want) in cases {
            assert_eq!(s.target(), want);
        }
    }

    #[test]
    fn the_whole_refusal_of_each_account() {
        let person = Requester::Person;
        let xr = Shape::CompositeResource;
        let cases = [
            (
                Mode::Refuse,
                xr,
                Sent::Nothing,
                State::LiveWithComposed,
                false,
                "cascade-guard refused to delete InferenceCluster prod with no propagationPolicy: it would remove it before its composed resources are gone and leave them to wedge. Delete it with foreground cascading: kubectl delete inferenceclusters.modelplane.ai prod -n team-a --cascade=foreground. To see first what that deletes, and in which order: cascade-guard plan inferenceclusters.modelplane.ai prod -n team-a (or kubectl cascade-guard plan, the same). To abandon it on purpose, first: kubectl annotate inferenceclusters.modelplane.ai prod -n team-a cascade-guard.dev/break-glass=\"<why>\"",
            ),
            (
                Mode::Convert,
                Shape::Other,
                Sent::Orphan,
                State::LiveWithComposed,
                false,
                "cascade-guard refused to delete InferenceCluster prod with propagationPolicy Orphan: it would leave the objects it owns behind, orphaned, with nothing to delete them. Delete it with foreground cascading: kubectl delete inferenceclusters.modelplane.ai prod -n team-a --cascade=foreground. To see first what that deletes, and in which order: cascade-guard plan inferenceclusters.modelplane.ai prod -n team-a (or kubectl cascade-guard plan, the same). To abandon it on purpose, first: kubectl annotate inferenceclusters.modelplane.ai prod -n team-a cascade-guard.dev/break-glass=\"<why>\"",
            ),
            (
                Mode::Refuse,
                xr,
                Sent::Background,
                State::TerminatingForeground,
                false,
                "cascade-guard refused to delete InferenceCluster prod with propagationPolicy Background: it is already being deleted with foreground cascading, and this delete would cut that cascade short. Nothing more is needed: the cascade ends by itself (follow it: cascade-guard trace inferenceclusters.modelplane.ai prod -n team-a). To abandon it on purpose, first: kubectl annotate inferenceclusters.modelplane.ai prod -n team-a cascade-guard.dev/break-glass=\"<why>\"",
            ),
            (
                Mode::Refuse,
                xr,
                Sent::OrphanDependentsTrue,
                State::LiveWithComposed,
                true,
                "cascade-guard refused to delete InferenceCluster prod with orphanDependents=true: cascade-guard.dev/break-glass is set, but alice may not use break-glass (it needs use on breakglass.cascade-guard.dev, which the ClusterRole cascade-guard-break-glass grants), so it does not count; it would leave its composed resources behind, orphaned, with nothing to delete them. Delete it with foreground cascading: kubectl delete inferenceclusters.modelplane.ai prod -n team-a --cascade=foreground. To see first what that deletes, and in which order: cascade-guard plan inferenceclusters.modelplane.ai prod -n team-a (or kubectl cascade-guard plan, the same). To abandon it on purpose, first: kubectl annotate inferenceclusters.modelplane.ai prod -n team-a cascade-guard.dev/break-glass=\"<why>\"",
            ),
            (
                Mode::Refuse,
                Shape::Claim,
                Sent::Foreground,
                State::LiveWithComposed,
                false,
                "cascade-guard refused to delete InferenceCluster prod with propagationPolicy Foreground: Crossplane would then delete its composite resource with background propagation (the claim's spec.compositeDeletePolicy is not Foreground), which removes the composite before the resources it composes are gone and leaves them to wedge. Have the claim delete it in the foreground, then delete the claim: kubectl patch inferenceclusters.modelplane.ai prod -n team-a --type merge -p '{\"spec\":{\"compositeDeletePolicy\":\"Foreground\"}}' && kubectl delete inferenceclusters.modelplane.ai prod -n team-a. To abandon it on purpose, first: kubectl annotate inferenceclusters.modelplane.ai prod -n team-a cascade-guard.dev/break-glass=\"<why>\"",
            ),
            (
                Mode::Warn,
                xr,
                Sent::Background,
                State::LiveWithComposed,
                false,
                "cascade-guard warning: deleting InferenceCluster prod with propagationPolicy Background is unsafe: it would remove it before its composed resources are gone and leave them to wedge. Delete it with foreground cascading: kubectl delete inferenceclusters.modelplane.ai prod -n team-a --cascade=foreground. To see first what that deletes, and in which order: cascade-guard plan inferenceclusters.modelplane.ai prod -n team-a (or kubectl cascade-guard plan, the same)",
            ),
        ];
        for (mode, shape, sent, state, break_glass, want) in cases {
            let mut req = request(sent, person, state, shape);
            req.username = "alice".to_string();
            req.object.break_glass = break_glass;
            assert_eq!(
                text(mode, shape, &req, &subject(Some("team-a"))),
                want,
                "{mode} {shape:?} {sent:?} {state:?}"
            );
        }
    }

    #[test]
    fn the_expression_branches_as_the_text_does() {
        // The text itself is checked against the API server's evaluation of
        // the expression (tests/api_server/refuse.rs); here, its shape.
        for mode in [Mode::Refuse, Mode::Warn, Mode::Convert] {
            for shape in [Shape::CompositeResource, Shape::Claim, Shape::Other] {
                let e = message_expression(mode, shape);
                let at = format!("{mode} {shape:?}: {e}");
                assert!(!e.contains('\n'), "{at}");
                assert!(e.starts_with(&frame(mode).0.cel()), "{at}");
                assert!(e.contains("(variables.breakGlassAnnotated ? "), "{at}");
                let branches = e.contains("(variables.inForeground ? ")
                    && e.contains(" : variables.orphaning ? ");
                assert_eq!(branches, shape != Shape::Claim, "{at}");
                assert_eq!(
                    e.contains("cascade-guard plan \" + variables.target"),
                    shape != Shape::Claim,
                    "{at}"
                );
                assert_eq!(e.contains("kubectl annotate"), mode != Mode::Warn, "{at}");
            }
        }
    }
}
