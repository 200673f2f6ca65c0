//! The commands people run against a cluster or files, one module each:
//!
//! - [`status`]: what is protected, whether the admission objects in the
//!   cluster are the ones the policies compile to, and what is being deleted;
//! - [`render`]: the admission objects for a set of files, without a cluster;
//! - [`trace`]: a deletion tree followed until everything in it is gone;
//! - [`plan`]: what a delete would do before anyone deletes: the order a
//!   tree can leave in, and the hazards of today's mode;
//! - [`uninstall`]: everything cascade-guard put into a cluster taken out.
//!
//! And what every command shares: [`kubeconfig`] (which cluster, as kubectl
//! chooses it), [`completion`] (the shell scripts), [`plugin`] (running as
//! `kubectl cascade-guard`), [`values`] (what completion offers for a flag).
//!
//! Each command's arguments and the run that turns them into its work and
//! an exit code are its `command` module (`trace/command.rs`, ...); the
//! command line as a whole is [`args`], how a command ends [`exit`], and the
//! client it talks through [`connect`]. `crd` and `version` are [`version`].
//! `run` (the controller) is [`crate::controller`], joined to its arguments
//! in main.rs.

pub mod args;
pub mod completion;
pub mod connect;
pub mod duration;
pub mod exit;
pub mod kubeconfig;
pub mod plan;
pub mod plugin;
pub mod render;
pub mod status;
pub mod trace;
pub mod uninstall;
pub mod values;
pub mod version;
