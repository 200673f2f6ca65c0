//! Composed resources' kinds, found through discovery and remembered: an XR
//! in cascade is looked at again and again, and its composed kinds rarely
//! change.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::Client;
use kube::api::{ApiResource, GroupVersionKind};

/// A composed resource's kind as served, and whether it is namespaced.
pub(super) type Discovered = (ApiResource, bool);

/// What discovery said of a composed resource's kind.
#[derive(Clone)]
enum Discovery {
    Found(Discovered),
    /// Not found, or discovery failed: looked up again after
    /// [`REDISCOVER_AFTER`], and warned about once.
    Failed(Instant),
}

/// How long a failed discovery of a composed kind stands before the next try.
const REDISCOVER_AFTER: Duration = Duration::from_secs(60);

/// The composed kinds discovered so far, by (apiVersion, kind).
#[derive(Default)]
pub(crate) struct Discoveries {
    known: Mutex<HashMap<(String, String), Discovery>>,
}

impl Discoveries {
    /// The kind as served; None when it is not served or discovery failed
    /// (within the last [`REDISCOVER_AFTER`]).
    pub(super) async fn find(
        &self,
        client: &Client,
        api_version: &str,
        kind: &str,
    ) -> Option<Discovered> {
        let key = (api_version.to_string(), kind.to_string());
        let known = self.known.lock().ok().and_then(|d| d.get(&key).cloned());
        match &known {
            Some(Discovery::Found(found)) => return Some(found.clone()),
            Some(Discovery::Failed(at)) if at.elapsed() < REDISCOVER_AFTER => return None,
            _ => {}
        }
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let result = match kube::discovery::pinned_kind(client, &gvk).await {
            Ok((resource, caps)) => {
                Discovery::Found((resource, caps.scope == kube::discovery::Scope::Namespaced))
            }
            Err(e) => {
                if known.is_none() {
                    tracing::warn!(%api_version, %kind, error = %e, "cannot discover a composed resource's kind; relying on the garbage collector's confirmation, and trying again in a minute");
                } else {
                    tracing::debug!(%api_version, %kind, error = %e, "still cannot discover a composed resource's kind");
                }
                Discovery::Failed(Instant::now())
            }
        };
        if let Ok(mut d) = self.known.lock() {
            d.insert(key, result.clone());
        }
        match result {
            Discovery::Found(found) => Some(found),
            Discovery::Failed(_) => None,
        }
    }
}
