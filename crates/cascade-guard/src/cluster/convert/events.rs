//! The Events Convert publishes on the objects it holds.

use kube::Resource;
use kube::api::ApiResource;
use kube::runtime::events::{EventType, Recorder};

use super::Meta;
use crate::cluster::events;

/// Publishes one Event about `object` (see [`events::publish`]).
pub(crate) async fn publish(
    recorder: &Recorder,
    resource: &ApiResource,
    object: &Meta,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    let reference = object.object_ref(resource);
    events::publish(recorder, &reference, type_, "Cascade", reason, note).await;
}
