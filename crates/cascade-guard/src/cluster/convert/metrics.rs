//! What Convert counts, for whoever exposes it: the controller's metrics
//! (`controller::telemetry::Metrics`), or nobody (`uninstall`).

use std::time::Duration;

/// Convert's counts, by the label of each kind.
pub trait ConvertMetrics: Send + Sync {
    /// Objects of `kind` held now (a recount).
    fn set_protected(&self, kind: &str, n: usize);
    /// A delete of a `kind` object was turned into a foreground cascade.
    fn conversion(&self, kind: &str);
    fn cascade_started(&self, kind: &str);
    /// Cascades of `kind` in progress now (a recount).
    fn set_in_progress(&self, kind: &str, n: usize);
    /// Cascades of `kind` stalled now (a recount).
    fn set_stalled(&self, kind: &str, n: usize);
    fn cascade_finished(&self, kind: &str, duration: Duration);
    /// A quiet foreground cascade of a `kind` object was restarted.
    fn cascade_restarted(&self, kind: &str);
    /// A write failed; `reason` is short CamelCase (`AddFinalizer`).
    fn error(&self, reason: &str);
}

/// Counts nothing: `uninstall` runs Convert to let go, with no metrics
/// endpoint to expose them on.
pub struct Uncounted;

impl ConvertMetrics for Uncounted {
    fn set_protected(&self, _: &str, _: usize) {}
    fn conversion(&self, _: &str) {}
    fn cascade_started(&self, _: &str) {}
    fn set_in_progress(&self, _: &str, _: usize) {}
    fn set_stalled(&self, _: &str, _: usize) {}
    fn cascade_finished(&self, _: &str, _: Duration) {}
    fn cascade_restarted(&self, _: &str) {}
    fn error(&self, _: &str) {}
}
