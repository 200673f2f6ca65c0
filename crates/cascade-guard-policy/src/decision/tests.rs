use super::*;
use serde_json::json;

// The axes of the table. Each is written out as the situation it stands
// for, and the expectation below is derived from those situations in
// plain words, not from the code above.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sent {
    Nothing,
    Background,
    Foreground,
    Orphan,
    OrphanDependentsTrue,
    OrphanDependentsFalse,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Requester {
    Person,
    GcServiceAccount,
    ControllerManagerWithPrecondition,
    NamespaceController,
    Crossplane,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    LiveWithComposed,
    LiveWithNone,
    /// A claim says compositeDeletePolicy: Foreground (other kinds have
    /// no such field: the same as LiveWithComposed for them).
    LiveComposingInForeground,
    TerminatingForeground,
    TerminatingBackground,
    /// Live, composing, and carrying cascade-guard's finalizer (a composed
    /// object the controller holds).
    LiveHeld,
}

pub(crate) const SENT: [Sent; 6] = [
    Sent::Nothing,
    Sent::Background,
    Sent::Foreground,
    Sent::Orphan,
    Sent::OrphanDependentsTrue,
    Sent::OrphanDependentsFalse,
];
pub(crate) const REQUESTERS: [Requester; 5] = [
    Requester::Person,
    Requester::GcServiceAccount,
    Requester::ControllerManagerWithPrecondition,
    Requester::NamespaceController,
    Requester::Crossplane,
];
pub(crate) const STATES: [State; 6] = [
    State::LiveWithComposed,
    State::LiveWithNone,
    State::LiveComposingInForeground,
    State::TerminatingForeground,
    State::TerminatingBackground,
    State::LiveHeld,
];

pub(crate) fn request(sent: Sent, who: Requester, state: State, shape: Shape) -> DeleteRequest {
    let (propagation, orphan_dependents) = match sent {
        Sent::Nothing => (None, None),
        Sent::Background => (Some(Propagation::Background), None),
        Sent::Foreground => (Some(Propagation::Foreground), None),
        Sent::Orphan => (Some(Propagation::Orphan), None),
        Sent::OrphanDependentsTrue => (None, Some(true)),
        Sent::OrphanDependentsFalse => (None, Some(false)),
    };
    let (username, uid_precondition) = match who {
        Requester::Person => ("alice@example.com", false),
        Requester::GcServiceAccount => (
            "system:serviceaccount:kube-system:generic-garbage-collector",
            true,
        ),
        Requester::ControllerManagerWithPrecondition => ("system:kube-controller-manager", true),
        Requester::NamespaceController => ("system:kube-controller-manager", false),
        Requester::Crossplane => ("system:serviceaccount:crossplane-system:crossplane", false),
    };
    let composed = match state {
        State::LiveWithNone => 0,
        _ => 2,
    };
    let finalizers = match state {
        State::TerminatingForeground => vec!["foregroundDeletion".to_string()],
        State::TerminatingBackground => vec!["example.org/cleanup".to_string()],
        State::LiveHeld => vec![FOREGROUND_CASCADE_FINALIZER.to_string()],
        _ => vec![],
    };
    DeleteRequest {
        propagation,
        orphan_dependents,
        username: username.to_string(),
        uid_precondition,
        object: ObjectState {
            finalizers,
            composed_count: match shape {
                Shape::CompositeResource => Some(composed),
                Shape::Claim => Some(composed.min(1)),
                Shape::Other => None,
            },
            composite_delete_foreground: shape == Shape::Claim
                && state == State::LiveComposingInForeground,
            break_glass: false,
            deleting: matches!(
                state,
                State::TerminatingForeground | State::TerminatingBackground
            ),
        },
    }
}

/// The table in words: a delete of a guarded object goes through when
/// the client asked for foreground, or sent nothing while a foreground
/// cascade is already running or the object is already being deleted
/// (nothing changes then); when a composite resource composed
/// nothing; or when the garbage collector itself deletes. A claim's own
/// propagation does not count: it goes through when it is bound to no
/// composite resource, or says to delete that in the foreground.
/// Crossplane's own delete of an object cascade-guard holds (never a
/// claim) goes through too, unless it orphans: the controller makes it a
/// foreground cascade.
/// Everything else would not cascade in the foreground and is refused.
pub(crate) fn expected_allowed(sent: Sent, who: Requester, state: State, shape: Shape) -> bool {
    let claim = shape == Shape::Claim;
    let asked_foreground = !claim && sent == Sent::Foreground;
    let keeps_running_foreground =
        !claim && sent == Sent::Nothing && state == State::TerminatingForeground;
    let changes_nothing = sent == Sent::Nothing
        && matches!(
            state,
            State::TerminatingForeground | State::TerminatingBackground
        );
    let composed_nothing = shape != Shape::Other && state == State::LiveWithNone;
    let composite_in_foreground = claim && state == State::LiveComposingInForeground;
    let garbage_collector = matches!(
        who,
        Requester::GcServiceAccount | Requester::ControllerManagerWithPrecondition
    );
    let crossplane_held = !claim
        && who == Requester::Crossplane
        && state == State::LiveHeld
        && !matches!(sent, Sent::Orphan | Sent::OrphanDependentsTrue);
    asked_foreground
        || crossplane_held
        || keeps_running_foreground
        || changes_nothing
        || composed_nothing
        || composite_in_foreground
        || garbage_collector
}

#[test]
fn full_table() {
    let settings = CompileSettings::default();
    let mut cells = 0;
    for shape in [Shape::CompositeResource, Shape::Other, Shape::Claim] {
        for mode in [Mode::Refuse, Mode::Warn, Mode::Off] {
            for sent in SENT {
                for who in REQUESTERS {
                    for state in STATES {
                        let req = request(sent, who, state, shape);
                        let v = decide(mode, shape, &settings, &req);
                        let would_allow = expected_allowed(sent, who, state, shape);
                        let at = format!("{mode} {shape:?} {sent:?} {who:?} {state:?}: {v:?}");
                        match mode {
                            Mode::Refuse => {
                                assert_eq!(v.allowed, would_allow, "{at}");
                                assert_eq!(v.warning, None, "{at}");
                            }
                            Mode::Warn => {
                                assert!(v.allowed, "{at}");
                                assert_eq!(v.warning.is_some(), !would_allow, "{at}");
                            }
                            Mode::Off => {
                                assert!(v.allowed, "{at}");
                                assert_eq!(v.reason, Reason::Allowed(AllowReason::ModeOff));
                            }
                            Mode::Convert => unreachable!(),
                        }
                        if mode != Mode::Off {
                            assert_eq!(matches!(v.reason, Reason::Allowed(_)), would_allow, "{at}");
                        }
                        if let Reason::Refused(sent) = v.reason {
                            refusal_fits(mode, shape, state, sent, &req, &at);
                        }
                        cells += 1;
                    }
                }
            }
        }
    }
    assert_eq!(cells, 3 * 3 * 6 * 5 * 6);
}

/// The refusal of a cell (its whole text per account is pinned in
/// [`crate::refusal`]'s tests): the object and what was sent, then the
/// way out the cell has. Mid-cascade nothing is to be done but follow
/// it; a claim is patched; anything else is deleted in the foreground,
/// after `cascade-guard plan` has shown what that takes down.
fn refusal_fits(
    mode: Mode,
    shape: Shape,
    state: State,
    sent: RefuseReason,
    req: &DeleteRequest,
    at: &str,
) {
    let subject = crate::refusal::Subject {
        kind: "XR".to_string(),
        name: "a".to_string(),
        resource: "xrs".to_string(),
        group: "example.org".to_string(),
        namespace: Some("team".to_string()),
    };
    let text = crate::refusal::text(mode, shape, req, &subject);
    let head = match mode {
        Mode::Warn => format!("cascade-guard warning: deleting XR a with {sent} is unsafe: "),
        _ => format!("cascade-guard refused to delete XR a with {sent}: "),
    };
    assert!(text.starts_with(&head), "{at}: {text}");
    let mid_cascade = shape != Shape::Claim && state == State::TerminatingForeground;
    let (way_out, plan) = match shape {
        Shape::Claim => (
            "kubectl patch xrs.example.org a -n team --type merge",
            false,
        ),
        _ if mid_cascade => ("cascade-guard trace xrs.example.org a -n team)", false),
        _ => (
            "kubectl delete xrs.example.org a -n team --cascade=foreground. ",
            true,
        ),
    };
    assert!(text.contains(way_out), "{at}: {text}");
    assert_eq!(
            text.contains(
                "To see first what that deletes, and in which order: cascade-guard plan xrs.example.org a -n team (or kubectl cascade-guard plan, the same)"
            ),
            plan,
            "{at}: {text}"
        );
    let abandon = "To abandon it on purpose, first: kubectl annotate xrs.example.org a -n team cascade-guard.dev/break-glass=\"<why>\"";
    assert_eq!(text.ends_with(abandon), mode != Mode::Warn, "{at}: {text}");
}

#[test]
fn refusal_describes_what_was_sent() {
    let settings = CompileSettings::default();
    let cases = [
        (Sent::Nothing, "no propagationPolicy"),
        (Sent::Background, "propagationPolicy Background"),
        (Sent::Orphan, "propagationPolicy Orphan"),
        (Sent::OrphanDependentsTrue, "orphanDependents=true"),
        (Sent::OrphanDependentsFalse, "orphanDependents=false"),
    ];
    for (sent, words) in cases {
        let req = request(
            sent,
            Requester::Person,
            State::LiveWithComposed,
            Shape::CompositeResource,
        );
        let v = decide(Mode::Refuse, Shape::CompositeResource, &settings, &req);
        match v.reason {
            Reason::Refused(r) => assert_eq!(r.to_string(), words),
            other => panic!("{sent:?}: {other:?}"),
        }
        let warned = decide(Mode::Warn, Shape::CompositeResource, &settings, &req);
        assert!(warned.warning.unwrap().contains(words));
    }
}

#[test]
fn foreground_with_orphan_dependents_is_refused() {
    let settings = CompileSettings::default();
    for orphan in [true, false] {
        let mut req = request(
            Sent::Foreground,
            Requester::Person,
            State::LiveWithComposed,
            Shape::Other,
        );
        req.orphan_dependents = Some(orphan);
        let v = decide(Mode::Refuse, Shape::Other, &settings, &req);
        assert_eq!(
            v.reason,
            Reason::Refused(RefuseReason::OrphanDependents(orphan))
        );
    }
    // A policy sent to an object already in foreground is not "no policy":
    // Background would strip foregroundDeletion.
    let req = request(
        Sent::Background,
        Requester::Person,
        State::TerminatingForeground,
        Shape::Other,
    );
    assert!(!decide(Mode::Refuse, Shape::Other, &settings, &req).allowed);
}

#[test]
fn break_glass_and_convert() {
    let settings = CompileSettings::default();
    let base = request(
        Sent::Background,
        Requester::Person,
        State::LiveWithComposed,
        Shape::CompositeResource,
    );
    // (mode, break_glass, finalizer present, allowed, reason)
    let cases = [
        (Mode::Refuse, false, false, false, None),
        (
            Mode::Refuse,
            true,
            false,
            true,
            Some(AllowReason::BreakGlass),
        ),
        (Mode::Refuse, false, true, false, None),
        (Mode::Convert, false, false, false, None),
        (
            Mode::Convert,
            false,
            true,
            true,
            Some(AllowReason::ConvertHeld),
        ),
        (
            Mode::Convert,
            true,
            true,
            true,
            Some(AllowReason::BreakGlass),
        ),
        (Mode::Warn, false, true, true, None),
    ];
    for (mode, glass, held, allowed, reason) in cases {
        let mut req = base.clone();
        req.object.break_glass = glass;
        if held {
            req.object
                .finalizers
                .push(FOREGROUND_CASCADE_FINALIZER.into());
        }
        let v = decide(mode, Shape::CompositeResource, &settings, &req);
        assert_eq!(v.allowed, allowed, "{mode} {glass} {held}");
        if let Some(r) = reason {
            assert_eq!(v.reason, Reason::Allowed(r), "{mode} {glass} {held}");
        } else {
            assert!(
                matches!(v.reason, Reason::Refused(_)),
                "{mode} {glass} {held}"
            );
        }
    }
}

/// In Convert mode a held object lets every propagation through except an
/// explicit Orphan, which would leave its composed resources behind.
#[test]
fn convert_does_not_convert_an_explicit_orphan() {
    let settings = CompileSettings::default();
    // (sent, orphanDependents, allowed)
    let cases = [
        (None, None, true),
        (Some(Propagation::Background), None, true),
        (Some(Propagation::Foreground), None, true),
        (Some(Propagation::Orphan), None, false),
        (None, Some(true), false),
        (None, Some(false), true),
    ];
    for (propagation, orphan_dependents, allowed) in cases {
        let req = DeleteRequest {
            propagation,
            orphan_dependents,
            username: "alice".into(),
            uid_precondition: false,
            object: ObjectState {
                finalizers: vec![FOREGROUND_CASCADE_FINALIZER.into()],
                composed_count: Some(2),
                composite_delete_foreground: false,
                break_glass: false,
                deleting: false,
            },
        };
        let v = decide(Mode::Convert, Shape::CompositeResource, &settings, &req);
        assert_eq!(v.allowed, allowed, "{propagation:?} {orphan_dependents:?}");
    }
}

#[test]
fn gc_identities_are_configurable_and_empty_means_none() {
    let custom = CompileSettings {
        gc_service_account_user: "gc".into(),
        gc_controller_manager_user: String::new(),
        ..CompileSettings::default()
    };
    let mut req = request(
        Sent::Background,
        Requester::Person,
        State::LiveWithComposed,
        Shape::Other,
    );
    // (username, precondition, allowed)
    let cases = [
        ("gc", false, true),
        (
            "system:serviceaccount:kube-system:generic-garbage-collector",
            true,
            false,
        ),
        ("", true, false),
        ("", false, false),
    ];
    for (user, pre, allowed) in cases {
        req.username = user.into();
        req.uid_precondition = pre;
        assert_eq!(
            decide(Mode::Refuse, Shape::Other, &custom, &req).allowed,
            allowed,
            "{user:?}"
        );
    }
}

#[test]
fn object_state_from_object() {
    let obj = json!({
        "metadata": {
            "finalizers": ["foregroundDeletion", 7],
            "annotations": {"cascade-guard.dev/break-glass": "wedged, abandoning (INC-42)"},
        },
        "spec": {"crossplane": {"resourceRefs": [{"kind": "A"}, {"kind": "B"}]},
                 "resourceRefs": [{"kind": "C"}]},
    });
    let s = ObjectState::from_object(&obj, Shape::CompositeResource);
    assert_eq!(s.finalizers, vec!["foregroundDeletion".to_string()]);
    assert_eq!(s.composed_count, Some(3));
    assert!(s.break_glass);
    assert_eq!(
        ObjectState::from_object(&obj, Shape::Other).composed_count,
        None
    );

    let bare = ObjectState::from_object(
        &json!({"metadata": {"annotations": {"cascade-guard.dev/break-glass": ""}}}),
        Shape::CompositeResource,
    );
    assert_eq!(
        bare,
        ObjectState {
            finalizers: vec![],
            composed_count: Some(0),
            composite_delete_foreground: false,
            break_glass: false,
            deleting: false,
        }
    );
    let terminating = ObjectState::from_object(
        &json!({"metadata": {"deletionTimestamp": "2026-12-04T07:40:00Z"}}),
        Shape::Other,
    );
    assert!(terminating.deleting);

    // A claim: bound or not, and how Crossplane deletes its composite.
    let claim = |spec: Value| ObjectState::from_object(&json!({"spec": spec}), Shape::Claim);
    let bound =
        json!({"resourceRef": {"apiVersion": "example.org/v1", "kind": "XApp", "name": "a-x"}});
    let cases = [
        (json!({}), Some(0), false),
        (bound.clone(), Some(1), false),
        (
            json!({"resourceRef": bound["resourceRef"], "compositeDeletePolicy": "Foreground"}),
            Some(1),
            true,
        ),
        (
            json!({"compositeDeletePolicy": "Background"}),
            Some(0),
            false,
        ),
    ];
    for (spec, count, foreground) in cases {
        let state = claim(spec.clone());
        assert_eq!(
            (state.composed_count, state.composite_delete_foreground),
            (count, foreground),
            "{spec}"
        );
    }
    // Only a claim reads compositeDeletePolicy.
    let xr = json!({"spec": {"compositeDeletePolicy": "Foreground"}});
    assert!(!ObjectState::from_object(&xr, Shape::CompositeResource).composite_delete_foreground);
}
