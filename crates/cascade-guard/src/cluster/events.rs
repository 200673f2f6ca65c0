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

/// How many told Events are published at once.
const TOLD_AT_ONCE: usize = 2;
/// How many told Events may wait; past that a new one is dropped (and
/// logged): what an Event reports is done, and in the log already.
const WAITING: usize = 512;

/// Events told without waiting for them: sibling order published one per
/// action in its look, and under a loaded API server each took up to a
/// second (a look at 22 trees spent 30 of its 56 s on them, and every new
/// tree waited for its holds that much longer). Published through
/// [`publish`], TOLD_AT_ONCE at a time, in the order told.
#[derive(Clone)]
pub struct Teller {
    queue: tokio::sync::mpsc::Sender<Told>,
}

struct Told {
    regarding: ObjectReference,
    type_: EventType,
    action: &'static str,
    reason: &'static str,
    note: String,
}

impl Teller {
    /// Starts the task that publishes what is told, for as long as a
    /// Teller is kept.
    pub fn start(recorder: Recorder) -> Self {
        let (queue, mut told) = tokio::sync::mpsc::channel::<Told>(WAITING);
        let at_once = std::sync::Arc::new(tokio::sync::Semaphore::new(TOLD_AT_ONCE));
        tokio::spawn(async move {
            while let Some(t) = told.recv().await {
                let Ok(permit) = at_once.clone().acquire_owned().await else {
                    return;
                };
                let recorder = recorder.clone();
                tokio::spawn(async move {
                    publish(
                        &recorder,
                        &t.regarding,
                        t.type_,
                        t.action,
                        t.reason,
                        &t.note,
                    )
                    .await;
                    drop(permit);
                });
            }
        });
        Self { queue }
    }

    /// Queues an Event (see [`publish`]); never waits.
    pub fn tell(
        &self,
        regarding: ObjectReference,
        type_: EventType,
        action: &'static str,
        reason: &'static str,
        note: String,
    ) {
        let told = Told {
            regarding,
            type_,
            action,
            reason,
            note,
        };
        if let Err(tokio::sync::mpsc::error::TrySendError::Full(t)) = self.queue.try_send(told) {
            tracing::warn!(
                reason = t.reason,
                note = %t.note,
                "too many Events waiting to be published: this one is dropped"
            );
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

    /// Told Events are published without the teller waiting, every one.
    #[tokio::test]
    async fn told_events_are_published_aside() {
        let one = |reason: &str| {
            Exchange::post(EVENTS)
                .body_containing(json!({"reason": reason, "action": "SiblingOrder"}))
                .created()
        };
        against(
            vec![one("HeldForOrder"), one("ReleasedForOrder")],
            async |client| {
                let teller = Teller::start(Recorder::new(
                    client,
                    Reporter {
                        controller: "cascade-guard".into(),
                        instance: None,
                    },
                ));
                for reason in ["HeldForOrder", "ReleasedForOrder"] {
                    teller.tell(
                        regarding(),
                        EventType::Normal,
                        "SiblingOrder",
                        reason,
                        "as said".into(),
                    );
                }
            },
        )
        .await;
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
