//! `--sibling-order off`: nothing a controller once held stays held by one
//! that no longer orders.

use kube::Client;

use super::gate;
use crate::cluster::kinds::ServedKinds;
use crate::cluster::unhold;
use crate::policy::sibling::hold_policy::{HOLD_OBJECT_NAME, RECORD_GUARD_NAME};

/// `--sibling-order off`: the gate, the hold policy and every hold removed,
/// and what an owner being deleted had been refused deleted, so that nothing
/// a controller once held stays held by one that no longer orders.
pub async fn let_go_of_everything(client: Client, namespace: String) {
    // The hold policy and the records' guard first: the guard refuses a
    // change of the records by anyone but a running controller.
    gate::remove(&client, HOLD_OBJECT_NAME).await;
    gate::remove(&client, RECORD_GUARD_NAME).await;
    let held = crate::cluster::holds::read(&client, &namespace)
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "sibling order is off, and what it held cannot be read");
            Vec::new()
        });
    gate::remove_all(&client, &namespace).await;
    match ServedKinds::discover(&client).await {
        Ok(kinds) => {
            for (object, _) in &held {
                if let Err(e) = unhold::let_go(&client, &kinds, object).await {
                    tracing::warn!(%object, error = %e, "sibling order is off, and cannot let go");
                }
            }
            let stripped = unhold::strip_old_labels(&client, &kinds, |line| {
                tracing::warn!("sibling order is off: {line}")
            })
            .await;
            if !held.is_empty() || stripped > 0 {
                tracing::info!(
                    released = held.len(),
                    stripped,
                    "sibling order is off: let go of every object it held"
                );
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "sibling order is off, and what it held cannot be let go: cannot discover the API")
        }
    }
}
