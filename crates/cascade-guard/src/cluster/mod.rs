//! What the CLI commands and the controller both read from a cluster, read
//! the same way by each: the policies' inputs read once ([`inputs`]), the
//! objects cascade-guard's finalizer holds ([`held`]), where a kind is served
//! ([`served_resource`], and every kind at once: [`kinds`]), what the API server's type check says of a policy
//! ([`type_check`]), which Kubernetes release it runs ([`server_version`]),
//! a live tree with what it references ([`tree`]), and letting go of what
//! sibling order holds ([`unhold`]), and the directory of static admission
//! manifests with what the API server loaded of it ([`static_protection`]),
//! and what a running controller says of itself on its Lease ([`running`]).
//!
//! And what both do to it: Convert's per-kind controllers ([`convert`]),
//! which the controller runs and `uninstall` runs to let go of what they
//! hold, the Events both publish ([`events`], with the sizes the API server
//! keeps: [`limits`]), and how long a broken watch or a failed step waits
//! ([`backoff`]).

pub(crate) mod backoff;
pub mod convert;
pub mod events;
pub mod held;
pub mod holds;
pub(crate) mod inputs;
pub mod kinds;
pub(crate) mod limits;
pub mod running;
mod served;
pub mod server_version;
pub mod static_protection;
pub mod tree;
pub mod type_check;
pub mod unhold;
pub mod watch_tap;

pub(crate) use served::served_resource;
