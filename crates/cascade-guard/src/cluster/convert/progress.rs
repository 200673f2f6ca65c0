//! A held cascade's progress: its clock moves on with what it still waits
//! for, and an Event says when it stalls and when it moves again.

use std::time::Instant;

use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::Meta;
use super::context::Context;
use crate::policy::Shape;
use crate::policy::stall::{Clock, Left, Turn, stalled_note};

impl Context {
    /// Moves the cascade's clock on with what it waits for now (`left`).
    pub(super) async fn watch_progress(&self, object: &Meta, uid: &str, left: Vec<Left>) {
        let now = Instant::now();
        let turn = match self.clocks.lock() {
            Ok(mut clocks) => match clocks.get_mut(uid) {
                Some(clock) => {
                    let turn = clock.look(left, now, self.stall_after);
                    Some((turn, clock.still_for(now), clock.left().to_vec()))
                }
                None => {
                    clocks.insert(uid.to_string(), Clock::start(left, now));
                    None
                }
            },
            Err(_) => None,
        };
        let shows = self.shape == Shape::CompositeResource;
        match turn {
            Some((Turn::Stalled, still_for, left)) => {
                let note = stalled_note(still_for, &left, shows);
                tracing::warn!(kind = %self.label, name = %object.name_any(), %note, "cascade stalled");
                self.publish(object, EventType::Warning, "CascadeStalled", &note)
                    .await;
            }
            Some((Turn::Resumed, _, left)) => {
                let note = format!("progress again; {} left", left.len());
                tracing::info!(kind = %self.label, name = %object.name_any(), "cascade moving again");
                self.publish(object, EventType::Normal, "CascadeResumed", &note)
                    .await;
            }
            _ => {}
        }
    }
}
