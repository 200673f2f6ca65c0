//! One pass over everything: the inputs ([`sources`]) resolved and compiled
//! (policy::resolve, policy::plan), the cluster's admission objects
//! ([`managed`]) brought to the plan ([`apply`]: the pure pass of
//! `policy::sync`, its changes made by [`writes`]), and what came of it told to
//! people ([`publish`], [`type_check`]). Any change anywhere triggers a pass:
//! with tens of protected kinds a full pass is cheap, and it keeps the logic a
//! pure function of the inputs plus an apply.

pub(crate) mod apply;
pub(crate) use crate::cluster::limits;
pub(crate) mod managed;
pub(crate) mod publish;
pub(crate) mod sources;
pub mod type_check;
pub(crate) mod writes;
