//! A watch's events handed to whoever else wants them: Convert's watch of
//! each kind feeds sibling order's index through this, so the API server
//! serves each object to one watch, not two (the controller's sibling order
//! implements it; `uninstall` runs Convert with none).

use kube::api::{DynamicObject, PartialObjectMeta};
use kube::runtime::watcher;

use crate::policy::ProtectedKind;

/// One watch event, as the watch yields it.
pub type WatchEvent = Result<watcher::Event<PartialObjectMeta<DynamicObject>>, watcher::Error>;

/// Gives a tap to each watch of a kind.
pub trait Taps: Send + Sync {
    /// A tap for one watch of `kind`; dropped with the watch, it says the
    /// watch stopped.
    fn tap(&self, kind: &ProtectedKind) -> Box<dyn Tap>;
}

/// One watch's events, as they come.
pub trait Tap: Send + Sync {
    fn event(&self, event: &WatchEvent);
}
