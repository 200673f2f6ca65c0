//! The Events Convert publishes on the objects it holds.

use kube::Resource;
use kube::api::ApiResource;
use kube::runtime::events::{Event, EventType, Recorder};

use super::Meta;

/// Publishes one Event about `object`; a failure is logged, never fatal (the
/// step it reports on is done).
pub(in crate::controller) async fn publish(
    recorder: &Recorder,
    resource: &ApiResource,
    object: &Meta,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    let reference = object.object_ref(resource);
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note.into()),
        action: "Cascade".into(),
        secondary: None,
    };
    match recorder.publish(&event, &reference).await {
        Ok(()) => {}
        // No new objects, Events included, in a namespace being deleted.
        Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("being terminated") => {
            tracing::debug!("no event: the namespace is being deleted");
        }
        Err(e) => tracing::warn!(error = %e, "cannot publish event"),
    }
}
