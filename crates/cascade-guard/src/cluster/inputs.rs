//! Reading the inputs of a pass once, without watches: XRDs, CascadePolicies,
//! and the kinds CascadePolicies name (from discovery). The controller's
//! watched sources and `cascade-guard status` read them the same way.

use std::collections::BTreeSet;
use std::sync::Arc;

use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::discovery::{self, Scope as DiscoveryScope};
use kube::{Api, Client};

use crate::api::CascadePolicy;
use crate::policy::Mode;
use crate::policy::kind::Scope;
use crate::policy::names::CROSSPLANE_APIEXTENSIONS_GROUP;
use crate::policy::resolve::{CrdInfo, Inputs, XrdInput};

const XRD_PLURAL: &str = "compositeresourcedefinitions";

/// The served version of Crossplane's XRD resource, or None when Crossplane is
/// not installed.
pub(crate) async fn xrd_resource(client: &Client) -> Result<Option<ApiResource>, kube::Error> {
    let group = match discovery::group(client, CROSSPLANE_APIEXTENSIONS_GROUP).await {
        Ok(group) => group,
        Err(e) if is_not_found(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(group
        .recommended_resources()
        .into_iter()
        .find(|(r, _)| r.plural == XRD_PLURAL)
        .map(|(r, _)| r))
}

/// The kinds of the groups CascadePolicies name, from discovery, and the
/// groups that could not be read for any reason but their absence.
pub(crate) async fn discover_kinds(
    client: &Client,
    policies: &[Arc<CascadePolicy>],
) -> (Vec<CrdInfo>, BTreeSet<String>) {
    let groups: BTreeSet<&str> = policies.iter().map(|p| p.spec.group.as_str()).collect();
    let mut kinds = Vec::new();
    let mut undiscovered = BTreeSet::new();
    for group in groups {
        if group.is_empty() {
            continue;
        }
        match discovery::group(client, group).await {
            Ok(found) => {
                for (resource, caps) in found.recommended_resources() {
                    kinds.push(CrdInfo {
                        group: resource.group.clone(),
                        kind: resource.kind.clone(),
                        plural: resource.plural.clone(),
                        scope: match caps.scope {
                            DiscoveryScope::Cluster => Scope::Cluster,
                            DiscoveryScope::Namespaced => Scope::Namespaced,
                        },
                    });
                }
            }
            Err(e) if is_not_found(&e) => {}
            Err(e) => {
                tracing::warn!(%group, error = %e, "cannot discover API group");
                undiscovered.insert(group.to_string());
            }
        }
    }
    (kinds, undiscovered)
}

pub(crate) fn is_not_found(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => status.code == 404,
        // How kube's discovery reports a group that is not served.
        kube::Error::Discovery(kube::error::DiscoveryError::MissingApiGroup(_)) => true,
        _ => false,
    }
}

/// Everything a pass reads, read once (for `status` and `uninstall`, which run
/// without watches).
pub(crate) struct ReadOnce {
    pub inputs: Inputs,
    /// Every API group the CascadePolicies name could be discovered.
    pub kinds_complete: bool,
    /// The CascadePolicy CRD is installed.
    pub cascade_policy_crd: bool,
}

pub(crate) async fn read_once(
    client: &Client,
    xrd_default_mode: Mode,
) -> Result<ReadOnce, crate::Error> {
    let list = |what: &'static str| move |source| crate::Error::List { what, source };
    let xrds = match xrd_resource(client).await.map_err(list("the XRD API"))? {
        Some(resource) => Api::<DynamicObject>::all_with(client.clone(), &resource)
            .list(&ListParams::default())
            .await
            .map_err(list("XRDs"))?
            .items
            .iter()
            .filter_map(|x| serde_json::to_value(x).ok())
            .map(|v| XrdInput::from_value(&v))
            .collect(),
        None => Vec::new(),
    };
    let (cascade_policies, cascade_policy_crd): (Vec<Arc<CascadePolicy>>, bool) =
        match Api::<CascadePolicy>::all(client.clone())
            .list(&ListParams::default())
            .await
        {
            Ok(l) => (l.items.into_iter().map(Arc::new).collect(), true),
            Err(kube::Error::Api(s)) if s.code == 404 => (Vec::new(), false),
            Err(e) => return Err(list("CascadePolicies")(e)),
        };
    let (crds, undiscovered_groups) = discover_kinds(client, &cascade_policies).await;
    let kinds_complete = undiscovered_groups.is_empty();
    let inputs = Inputs {
        xrds,
        cascade_policies: cascade_policies
            .iter()
            .filter_map(|p| p.resolution_input())
            .collect(),
        crds,
        xrd_default_mode,
        undiscovered_groups,
    };
    Ok(ReadOnce {
        inputs,
        kinds_complete,
        cascade_policy_crd,
    })
}
