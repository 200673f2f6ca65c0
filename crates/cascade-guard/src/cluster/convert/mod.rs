//! Convert mode at run time: for each Convert kind, a metadata-only controller
//! that holds every object with cascade-guard's finalizer, turns its deletion
//! into a foreground cascade, and lets go when nothing is left to cascade. The
//! decisions are [`crate::policy::cascade::next_step`]; this module only does
//! what it says, with UID preconditions on every write so that a newer object
//! reusing a name is never touched.
//!
//! Each kind's watch covers every object of the kind, whatever its labels: a
//! policy's selector decides which live objects are held ([`Reach`]), but an
//! object that carries the finalizer is never lost sight of. A kind no policy
//! makes Convert any more keeps its controller, with nothing in reach, until
//! every object it held is let go or has finished its cascade.
//!
//! [`Reach`]: crate::policy::cascade::Reach

mod context;
pub(crate) mod dependents;
pub(crate) mod discovery;
pub(crate) mod events;
mod intake;
mod kinds;
mod metrics;
mod progress;
mod runner;
mod steps;
mod writes;

#[cfg(test)]
pub(crate) use kinds::test_policy;
pub use kinds::{ConvertKind, convert_kinds, kind_key};
pub use metrics::{ConvertMetrics, Uncounted};
pub use runner::{Converter, DEFAULT_STALL_AFTER};

use kube::api::{DynamicObject, PartialObjectMeta};

/// Convert reads and writes objects by their metadata alone.
pub(crate) type Meta = PartialObjectMeta<DynamicObject>;
