//! Waiting for the API server to reach a state.

use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client};

/// Waits until a CRD is Established (its kind is served). Past `timeout`,
/// an error (reason `Timeout`, code 504, as the API server's own) naming the
/// CRD, how long it waited and the conditions it last had.
pub async fn crd_established(
    client: &Client,
    name: &str,
    timeout: Duration,
) -> Result<(), kube::Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    loop {
        let crd = api.get(name).await?;
        let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
        if conditions
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            let last = conditions
                .iter()
                .map(|c| {
                    let reason = c.reason.as_deref().unwrap_or_default();
                    format!("{}={} {reason}", c.type_, c.status)
                })
                .collect::<Vec<_>>()
                .join(", ");
            let message = format!(
                "CRD {name} was not Established after {timeout:?} (its conditions: {})",
                if last.is_empty() { "none" } else { &last }
            );
            return Err(kube::Error::Api(
                kube::error::Status::failure(&message, "Timeout")
                    .with_code(504)
                    .boxed(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls `check` every 50 ms until it returns `Some`, or `timeout` passes.
pub async fn until<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
