//! The commands people run against a cluster or files, one module each:
//!
//! - [`status`]: what is protected, whether the admission objects in the
//!   cluster are the ones the policies compile to, and what is being deleted;
//! - [`render`]: the admission objects for a set of files, without a cluster;
//! - [`trace`]: a deletion tree followed until everything in it is gone;
//! - [`uninstall`]: everything cascade-guard put into a cluster taken out.
//!
//! `run` (the controller) is [`crate::controller`]; `crd` and `version` are a
//! line each in main.rs. A `plan` command would go in `plan.rs`.

pub mod render;
pub mod status;
pub mod trace;
pub mod uninstall;
