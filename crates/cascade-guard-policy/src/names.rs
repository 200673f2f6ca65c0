//! Every name cascade-guard puts on, or reads from, Kubernetes objects.
//!
//! They live in one place because the CEL, the admission objects, the
//! controller and the docs must all agree on them byte for byte.

/// cascade-guard's API group (CascadePolicy, annotations, finalizer).
pub const GROUP: &str = "cascade-guard.dev";

/// XRD annotation choosing how deletes of the XRD's composite resources are
/// treated. Values: see [`crate::mode::Mode`].
pub const DELETION_POLICY_ANNOTATION: &str = "cascade-guard.dev/deletion-policy";

/// Annotation on a protected object: any non-empty value (the operator's
/// reason) lets any delete of that object through, so a wedged object can be
/// abandoned on purpose.
pub const BREAK_GLASS_ANNOTATION: &str = "cascade-guard.dev/break-glass";

/// Break-glass counts only for a user who may `use` this resource of
/// cascade-guard's group ([`GROUP`]): a permission no built-in role grants, so
/// that the protection is not only as strong as the weakest patch permission.
/// The chart's `<release>-break-glass` ClusterRole grants it.
pub const BREAK_GLASS_RESOURCE: &str = "breakglass";
pub const BREAK_GLASS_VERB: &str = "use";

/// Finalizer cascade-guard holds on objects of Convert-mode kinds while it
/// turns a refused delete into a foreground one; while it is present, any
/// delete is allowed.
pub const FOREGROUND_CASCADE_FINALIZER: &str = "cascade-guard.dev/foreground-cascade";

/// Annotation cascade-guard writes on an object of a Convert kind once it has
/// turned its delete into a foreground cascade, or seen it in one it did not
/// start (a foreground delete counts as the first conversion). What it remembers of a
/// deletion survives a restart or a change of leader this way: a new leader
/// that finds it does not issue the first Foreground delete again, which
/// could re-add `foregroundDeletion` just after the garbage collector cleared
/// it at the end of the cascade and leave it to a garbage collector that may
/// not look again.
pub const CONVERTED_ANNOTATION: &str = "cascade-guard.dev/converted";

/// The Kubernetes garbage collector's finalizer for a foreground cascade.
pub const FOREGROUND_DELETION_FINALIZER: &str = "foregroundDeletion";

/// The finalizer the API server adds for a delete with propagationPolicy
/// Orphan; the garbage collector removes owner references, then it.
pub const ORPHAN_FINALIZER: &str = "orphan";

/// Label key and value on every object cascade-guard generates, so it can
/// find (and prune) exactly its own objects.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY_VALUE: &str = "cascade-guard";
/// The field manager of cascade-guard's server-side applies, and the
/// reporter of its Events.
pub const FIELD_MANAGER: &str = "cascade-guard";
/// The label selector for exactly those objects (`MANAGED_BY_LABEL=MANAGED_BY_VALUE`),
/// for every list and watch of them.
pub const MANAGED_BY_SELECTOR: &str = "app.kubernetes.io/managed-by=cascade-guard";

/// Annotations on generated objects, to trace them back to what asked for them.
pub const SOURCE_ANNOTATION: &str = "cascade-guard.dev/source";
pub const PROTECTED_KIND_ANNOTATION: &str = "cascade-guard.dev/protected-kind";
pub const MODE_ANNOTATION: &str = "cascade-guard.dev/mode";
/// On an object every XRD of one mode and shape shares: for each kind it
/// protects (`Kind.group`), where its policy comes from, as JSON
/// (`{"Kind.group": {"source": "CompositeResourceDefinition/...", "modeFrom": "xrd-annotation"}}`).
pub const PROTECTED_KINDS_ANNOTATION: &str = "cascade-guard.dev/protected-kinds";
/// Where the mode comes from: the XRD's annotation, the controller's default
/// for XRDs without one, or a CascadePolicy's spec.
pub const MODE_FROM_ANNOTATION: &str = "cascade-guard.dev/mode-from";

/// The garbage collector's user when kube-controller-manager runs with
/// `--use-service-account-credentials=true` (kubeadm's default).
pub const DEFAULT_GC_SERVICE_ACCOUNT_USER: &str =
    "system:serviceaccount:kube-system:generic-garbage-collector";

/// kube-controller-manager's own user, which the garbage collector uses when
/// service-account credentials are off. The namespace controller shares it, so
/// it is trusted only together with a UID precondition (see the decision table).
pub const DEFAULT_GC_CONTROLLER_MANAGER_USER: &str = "system:kube-controller-manager";

/// Crossplane's user (its core ServiceAccount in the namespace Crossplane's
/// Helm chart installs into): the one identity that may take composed
/// resources out of an XR's `resourceRefs`.
pub const DEFAULT_CROSSPLANE_USER: &str = "system:serviceaccount:crossplane-system:crossplane";

/// cascade-guard's own user when installed with its chart or manifest
/// (ServiceAccount `cascade-guard` in `cascade-guard-system`): it removes its
/// finalizer when a cascade is done.
pub const DEFAULT_CONTROLLER_USER: &str =
    "system:serviceaccount:cascade-guard-system:cascade-guard";

/// Crossplane's API group for XRDs.
pub const CROSSPLANE_APIEXTENSIONS_GROUP: &str = "apiextensions.crossplane.io";

/// Kind of a Crossplane CompositeResourceDefinition.
pub const XRD_KIND: &str = "CompositeResourceDefinition";

/// Kind of cascade-guard's own policy resource.
pub const CASCADE_POLICY_KIND: &str = "CascadePolicy";

/// Prefixes of the objects every XRD of one mode and shape shares, for
/// DELETEs and for UPDATEs (`cascade-guard-xrds-refuse-composite`).
pub const XRDS_OBJECT_PREFIX: &str = "cascade-guard-xrds-";
pub const UPDATE_XRDS_OBJECT_PREFIX: &str = "cascade-guard-update-xrds-";

/// Prefixes of generated object names, one per kind of source: the policy
/// and binding that check DELETEs. XRDs' per-kind names are what earlier
/// releases wrote; they are still recognised, so an upgrade removes them
/// (after writing the shared objects) only once XRDs could be read.
pub const XRD_OBJECT_PREFIX: &str = "cascade-guard-xrd-";
pub const CASCADE_POLICY_OBJECT_PREFIX: &str = "cascade-guard-policy-";
/// The claim kind of a legacy XRD, named after the XRD.
pub const CLAIM_OBJECT_PREFIX: &str = "cascade-guard-claim-";

/// The same for the policy and binding that check UPDATEs of the same kind
/// (no finalizer of a cascade or composed resource taken away). A prefix of
/// their own, not a suffix, so that no source name can make an UPDATE
/// object's name equal a DELETE one's.
pub const UPDATE_XRD_OBJECT_PREFIX: &str = "cascade-guard-update-xrd-";
pub const UPDATE_CASCADE_POLICY_OBJECT_PREFIX: &str = "cascade-guard-update-policy-";
pub const UPDATE_CLAIM_OBJECT_PREFIX: &str = "cascade-guard-update-claim-";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_managed_by_selector_is_the_label_and_its_value() {
        assert_eq!(
            MANAGED_BY_SELECTOR,
            format!("{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}")
        );
    }
}
