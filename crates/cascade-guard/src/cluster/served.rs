//! Where the API server serves a kind.

use kube::Client;
use kube::api::ApiResource;

use crate::policy::ProtectedKind;

/// The version of a kind the API server serves (its preferred one). The
/// admission policy matches every version; the controller watches this one.
pub async fn served_resource(
    client: &Client,
    kind: &ProtectedKind,
) -> Result<ApiResource, kube::Error> {
    let group = kube::discovery::group(client, &kind.group).await?;
    group
        .recommended_resources()
        .into_iter()
        .map(|(r, _)| r)
        .find(|r| r.plural == kind.plural)
        .ok_or_else(|| {
            kube::Error::Discovery(kube::error::DiscoveryError::MissingResource(format!(
                "{}.{}",
                kind.plural, kind.group
            )))
        })
}
