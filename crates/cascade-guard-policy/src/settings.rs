//! Who the compiled policies trust: the identities of the garbage collector,
//! Crossplane and cascade-guard, and whether break-glass needs a permission.

use crate::names::{
    DEFAULT_CONTROLLER_USER, DEFAULT_CROSSPLANE_USER, DEFAULT_GC_CONTROLLER_MANAGER_USER,
    DEFAULT_GC_SERVICE_ACCOUNT_USER,
};

/// Who counts as the garbage collector, Crossplane and cascade-guard. An
/// empty string disables that identity (it never matches, rather than
/// matching everyone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileSettings {
    /// Trusted on its own.
    pub gc_service_account_user: String,
    /// Trusted only with a UID precondition (the namespace controller shares
    /// this identity and never sends one) on DELETE; on UPDATE on its own, as
    /// the namespace controller removes no finalizers.
    pub gc_controller_manager_user: String,
    /// May take entries out of an XR's `resourceRefs` (UPDATE).
    pub crossplane_user: String,
    /// cascade-guard itself: may remove its finalizer and `foregroundDeletion`
    /// (UPDATE), like the garbage collector.
    pub controller_user: String,
    /// Break-glass counts only for users the API server authorizes to `use`
    /// `breakglass.cascade-guard.dev`; false: for anyone who can annotate.
    pub break_glass_needs_permission: bool,
    /// `render --set-name`: the name of a set rendered and applied apart
    /// from others (one per package), which the pairs every XRD of a mode
    /// shares end in, so that sets do not replace one another's. Never set
    /// by the controller, which writes one set.
    pub set_name: Option<String>,
}

impl Default for CompileSettings {
    fn default() -> Self {
        CompileSettings {
            gc_service_account_user: DEFAULT_GC_SERVICE_ACCOUNT_USER.to_string(),
            gc_controller_manager_user: DEFAULT_GC_CONTROLLER_MANAGER_USER.to_string(),
            crossplane_user: DEFAULT_CROSSPLANE_USER.to_string(),
            controller_user: DEFAULT_CONTROLLER_USER.to_string(),
            break_glass_needs_permission: true,
            set_name: None,
        }
    }
}
