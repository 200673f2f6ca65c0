//! The kind a policy protects.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where objects of a kind live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Scope {
    Namespaced,
    Cluster,
    /// The definition's scope could not be read (a broken XRD that is still
    /// protected). Admission then matches both scopes rather than guess.
    Unknown,
}

impl Scope {
    /// The `scope` of an admission rule.
    pub fn admission_scope(self) -> &'static str {
        match self {
            Scope::Namespaced => "Namespaced",
            Scope::Cluster => "Cluster",
            Scope::Unknown => "*",
        }
    }
}

/// What deleting one object of the kind may cascade to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Shape {
    /// A Crossplane composite resource: it lists what it composed in
    /// `spec.crossplane.resourceRefs` (or legacy `spec.resourceRefs`), so an
    /// empty list means there is nothing to cascade.
    CompositeResource,
    /// Any other custom resource: what it owns is not visible on the object.
    Other,
    /// A legacy Crossplane claim (an XRD's `claimNames`). Deleting it makes
    /// Crossplane delete its composite resource (`spec.resourceRef`) with the
    /// propagation its `spec.compositeDeletePolicy` names (Background unless
    /// it says Foreground), whatever propagation the claim's own delete asked.
    Claim,
}

/// API groups of Kubernetes itself that carry no `.k8s.io` suffix.
const UNSUFFIXED_KUBERNETES_GROUPS: [&str; 6] =
    ["", "apps", "batch", "autoscaling", "policy", "extensions"];
/// cascade-guard's own API group.
const OWN_GROUP: &str = crate::names::GROUP;

/// Why a kind may never be protected, whoever asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forbidden {
    /// A kind of Kubernetes' own API: Deployments, CRDs, Leases, admission
    /// objects, what the garbage collector, leader election and admission
    /// themselves rest on. cascade-guard protects custom resources.
    KubernetesGroup,
    /// cascade-guard's own kinds: guarding a CascadePolicy would block
    /// deleting the policies themselves.
    OwnGroup,
}

impl fmt::Display for Forbidden {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Forbidden::KubernetesGroup => {
                "it is a kind of Kubernetes' own API (cascade-guard protects custom resources only: the garbage collector, leader election and admission rest on the built-in kinds)"
            }
            Forbidden::OwnGroup => {
                "it is one of cascade-guard's own kinds (guarding them would block removing the policies)"
            }
        })
    }
}

/// The one rule for what may be protected, applied wherever policies are
/// resolved (the controller, `render`, `status`): never a kind of
/// Kubernetes' own groups (the core group, the unsuffixed built-ins, and any
/// `*.k8s.io` group), never cascade-guard's own.
pub fn forbidden(group: &str) -> Option<Forbidden> {
    let group = group.trim().to_ascii_lowercase();
    if UNSUFFIXED_KUBERNETES_GROUPS.contains(&group.as_str())
        || group == "k8s.io"
        || group.ends_with(".k8s.io")
    {
        Some(Forbidden::KubernetesGroup)
    } else if group == OWN_GROUP {
        Some(Forbidden::OwnGroup)
    } else {
        None
    }
}

/// A kind whose deletes cascade-guard guards.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ProtectedKind {
    pub group: String,
    pub kind: String,
    pub plural: String,
    pub scope: Scope,
    pub shape: Shape,
}

impl ProtectedKind {
    /// `plural.group`, the name kubectl and CRDs use (`inferenceclusters.modelplane.ai`).
    pub fn resource(&self) -> String {
        join_group(&self.plural, &self.group)
    }

    pub fn same_kind(&self, group: &str, kind: &str) -> bool {
        self.group == group && self.kind == kind
    }
}

impl fmt::Display for ProtectedKind {
    /// `Kind.group` (`InferenceCluster.modelplane.ai`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&join_group(&self.kind, &self.group))
    }
}

fn join_group(name: &str, group: &str) -> String {
    if group.is_empty() {
        name.to_string()
    } else {
        format!("{name}.{group}")
    }
}

#[cfg(test)]
impl ProtectedKind {
    /// A cluster-scoped kind of group `example.org` whose plural is its
    /// name in lowercase with an `s`, for tests.
    pub(crate) fn example(kind: &str, shape: Shape) -> Self {
        ProtectedKind {
            group: "example.org".into(),
            kind: kind.into(),
            plural: format!("{}s", kind.to_lowercase()),
            scope: Scope::Cluster,
            shape,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_custom_groups_may_be_protected() {
        for (group, want) in [
            ("", Some(Forbidden::KubernetesGroup)),
            ("apps", Some(Forbidden::KubernetesGroup)),
            ("batch", Some(Forbidden::KubernetesGroup)),
            ("apiextensions.k8s.io", Some(Forbidden::KubernetesGroup)),
            ("coordination.k8s.io", Some(Forbidden::KubernetesGroup)),
            (
                "admissionregistration.k8s.io",
                Some(Forbidden::KubernetesGroup),
            ),
            ("Coordination.K8S.io", Some(Forbidden::KubernetesGroup)),
            ("cascade-guard.dev", Some(Forbidden::OwnGroup)),
            ("modelplane.ai", None),
            ("table.cascade-guard.dev", None),
            ("apiextensions.crossplane.io", None),
            ("k8s.io.example.com", None),
        ] {
            assert_eq!(forbidden(group), want, "{group:?}");
        }
    }

    fn kind(group: &str, kind: &str, plural: &str) -> ProtectedKind {
        ProtectedKind {
            group: group.into(),
            kind: kind.into(),
            plural: plural.into(),
            scope: Scope::Cluster,
            shape: Shape::CompositeResource,
        }
    }

    #[test]
    fn display_and_resource() {
        let cases = [
            (
                kind("modelplane.ai", "InferenceCluster", "inferenceclusters"),
                "InferenceCluster.modelplane.ai",
                "inferenceclusters.modelplane.ai",
            ),
            (
                kind("infrastructure.modelplane.ai", "EKSCluster", "eksclusters"),
                "EKSCluster.infrastructure.modelplane.ai",
                "eksclusters.infrastructure.modelplane.ai",
            ),
            (kind("", "Thing", "things"), "Thing", "things"),
        ];
        for (k, display, resource) in cases {
            assert_eq!(k.to_string(), display);
            assert_eq!(k.resource(), resource);
        }
    }

    #[test]
    fn admission_scope() {
        assert_eq!(Scope::Namespaced.admission_scope(), "Namespaced");
        assert_eq!(Scope::Cluster.admission_scope(), "Cluster");
        assert_eq!(Scope::Unknown.admission_scope(), "*");
    }
}
