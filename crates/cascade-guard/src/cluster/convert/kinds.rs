//! Which kinds Convert runs for, and where the API server serves them.

use std::collections::BTreeMap;

use kube::Client;

use crate::cluster::served_resource;
use crate::policy::cascade::Reach;
use crate::policy::{Mode, Policy, ProtectedKind};

/// One kind as the Convert controller runs it: which of its live objects
/// are held (every Convert policy for the kind together).
#[derive(Clone, Debug, PartialEq)]
pub struct ConvertKind {
    pub kind: ProtectedKind,
    pub reach: Reach,
}

/// The Convert kinds a pass's policies ask for, by `group/kind`. An object is
/// in reach when any policy's selector matches it; a policy without a
/// selector, or with one that cannot be read, reaches every object (holding
/// more is the safe side).
pub fn convert_kinds(policies: &[Policy]) -> BTreeMap<String, ConvertKind> {
    let mut by_kind: BTreeMap<String, ConvertKind> = BTreeMap::new();
    for p in policies.iter().filter(|p| p.mode == Mode::Convert) {
        let reach = match p.selector.clone().map(kube::core::Selector::try_from) {
            Some(Ok(selector)) if !selector.selects_all() => Reach::Selected(vec![selector]),
            _ => Reach::Every,
        };
        let entry = by_kind
            .entry(kind_key(&p.kind))
            .or_insert_with(|| ConvertKind {
                kind: p.kind.clone(),
                reach: Reach::Selected(Vec::new()),
            });
        entry.reach = match (std::mem::replace(&mut entry.reach, Reach::Nothing), reach) {
            (Reach::Selected(mut all), Reach::Selected(more)) => {
                all.extend(more);
                Reach::Selected(all)
            }
            _ => Reach::Every,
        };
    }
    by_kind
}

pub fn kind_key(kind: &ProtectedKind) -> String {
    format!("{}/{}", kind.group, kind.kind)
}

/// Whether the kind is still served: false only when discovery says for sure
/// that it is not (its CRD is gone, and its objects with it).
pub(super) async fn is_served(client: &Client, kind: &ProtectedKind) -> bool {
    match served_resource(client, kind).await {
        Ok(_) => true,
        Err(kube::Error::Api(s)) => s.code != 404,
        Err(kube::Error::Discovery(
            kube::error::DiscoveryError::MissingResource(_)
            | kube::error::DiscoveryError::MissingApiGroup(_),
        )) => false,
        Err(_) => true,
    }
}
