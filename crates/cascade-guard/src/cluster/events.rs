//! The one way cascade-guard publishes an Event (the controller, and Convert
//! run by `uninstall`): its note cut to what the API server keeps, and a
//! failure logged, never fatal (what it reports on is done). A namespace
//! being deleted takes no new objects, Events included: its 403 is expected
//! and not worth a warning.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};

use super::limits::event_note;

/// What became of one Event.
#[derive(Debug, PartialEq, Eq)]
pub enum Published {
    Yes,
    /// The object's namespace is being deleted; it takes no Events.
    NamespaceTerminating,
    /// Refused or not sent (logged).
    Failed,
}

/// Publishes an Event of `type_` about `regarding`, for the controller's
/// `action` (`Cascade`, `Compile`, `SiblingOrder`).
pub async fn publish(
    recorder: &Recorder,
    regarding: &ObjectReference,
    type_: EventType,
    action: &str,
    reason: &str,
    note: &str,
) -> Published {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(event_note(note)),
        action: action.into(),
        secondary: None,
    };
    match recorder.publish(&event, regarding).await {
        Ok(()) => Published::Yes,
        Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("being terminated") => {
            tracing::debug!(
                namespace = regarding.namespace.as_deref().unwrap_or_default(),
                reason,
                "no event: the namespace is being deleted"
            );
            Published::NamespaceTerminating
        }
        Err(e) => {
            tracing::warn!(error = %e, action, reason, "cannot publish event");
            Published::Failed
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::events::Reporter;
    use serde_json::json;

    use super::*;
    use crate::fake_api_server::{Exchange, against, says};

    const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/team-a/events?";

    fn regarding() -> ObjectReference {
        ObjectReference {
            api_version: Some("example.org/v1".into()),
            kind: Some("XDatabase".into()),
            namespace: Some("team-a".into()),
            name: Some("db".into()),
            uid: Some("u1".into()),
            ..ObjectReference::default()
        }
    }

    async fn publish_once(answer: Exchange) -> Published {
        against(vec![answer], async |client| {
            let recorder = Recorder::new(
                client,
                Reporter {
                    controller: "cascade-guard".into(),
                    instance: None,
                },
            );
            publish(
                &recorder,
                &regarding(),
                EventType::Warning,
                "Cascade",
                "CascadeStalled",
                &"x".repeat(2000),
            )
            .await
        })
        .await
    }

    /// The Event sent: its note cut to the API server's 1 kB.
    fn event() -> Exchange {
        Exchange::post(EVENTS).body_containing(json!({
            "type": "Warning",
            "reason": "CascadeStalled",
            "action": "Cascade",
            "note": format!("{}…", "x".repeat(1000)),
            "reportingController": "cascade-guard",
            "regarding": {"kind": "XDatabase", "namespace": "team-a", "name": "db", "uid": "u1"},
        }))
    }

    #[tokio::test]
    async fn an_event_is_created_with_its_note_cut_to_what_the_api_server_keeps() {
        assert_eq!(publish_once(event().created()).await, Published::Yes);
    }

    #[tokio::test]
    async fn a_terminating_namespace_refusing_the_event_is_expected() {
        let sent = publish_once(event().fails(
            says::FORBIDDEN,
            "events.events.k8s.io \"db.1\" is forbidden: unable to create new content in \
             namespace team-a because it is being terminated",
        ))
        .await;
        assert_eq!(sent, Published::NamespaceTerminating);
    }

    #[tokio::test]
    async fn any_other_refusal_is_a_failure() {
        let sent = publish_once(event().fails(
            says::FORBIDDEN,
            "events.events.k8s.io is forbidden: User \"system:serviceaccount:x:y\" cannot \
             create resource \"events\"",
        ))
        .await;
        assert_eq!(sent, Published::Failed);
    }
}
