//! `cascade-guard status`: what is protected and where each policy comes from,
//! whether the admission objects in the cluster are the ones the policies
//! compile to, and which protected objects are being deleted right now.
//!
//! One-shot reads, like `cascade-guard uninstall`; everything that can be pure
//! (the comparison, the cascading list, the text) is, and is tested there. It
//! compiles with the settings it is given, which must be the controller's
//! (`--xrd-default-mode` and the garbage-collector users): it cannot see the
//! controller's flags, and says so when a difference looks like a different
//! default mode.
//!
//! [`read`] fetches, [`report`] compares, [`text`] prints.

pub mod command;
#[cfg(test)]
mod fixtures;
mod read;
pub mod report;
mod text;

pub use read::{ControllerFlags, status};
pub use report::Report;
pub use text::render_text;
