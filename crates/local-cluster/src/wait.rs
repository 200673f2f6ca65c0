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
pub async fn until<T, F, Fut>(timeout: Duration, check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    poll(timeout, check, |_| FIRST_PAUSE).await
}

/// Like [`until`], for a state that stays once reached (Ready, labelled,
/// wedged, gone): every 50 ms at first, then a twentieth of the time waited
/// so far, at most once a second. Seeing the state late by a twentieth costs
/// little; polling a tree's every object every 50 ms through a teardown of
/// minutes made most of the requests the real-Crossplane suites sent their
/// API server.
/// Not for a passing state: a window shorter than the pause can be missed.
pub async fn until_lasting<T, F, Fut>(timeout: Duration, check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    poll(timeout, check, lasting_pause).await
}

const FIRST_PAUSE: Duration = Duration::from_millis(50);
const LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// The pause of [`until_lasting`] after waiting `waited`.
fn lasting_pause(waited: Duration) -> Duration {
    (waited / 20).clamp(FIRST_PAUSE, LONGEST_PAUSE)
}

async fn poll<T, F, Fut>(
    timeout: Duration,
    mut check: F,
    pause: fn(Duration) -> Duration,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = Instant::now();
    let deadline = started + timeout;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        let now = Instant::now();
        if now > deadline {
            return None;
        }
        // Never past the deadline by more than the last check.
        let left = deadline.saturating_duration_since(now);
        tokio::time::sleep(pause(now - started).min(left).max(Duration::from_millis(1))).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lasting_wait_pauses_a_twentieth_of_the_time_waited_between_50_ms_and_a_second() {
        for (waited_ms, pause_ms) in [
            (0, 50),
            (900, 50),
            (4_000, 200),
            (20_000, 1_000),
            (300_000, 1_000),
        ] {
            assert_eq!(
                lasting_pause(Duration::from_millis(waited_ms)),
                Duration::from_millis(pause_ms),
                "after {waited_ms} ms"
            );
        }
    }

    #[test]
    fn a_lasting_wait_of_a_minute_checks_about_a_hundred_and_twenty_times_not_twelve_hundred() {
        let minute = Duration::from_secs(60);
        let checks = |pause: fn(Duration) -> Duration| {
            let (mut waited, mut n) = (Duration::ZERO, 0);
            while waited < minute {
                n += 1;
                waited += pause(waited);
            }
            n
        };
        assert_eq!(checks(|_| FIRST_PAUSE), 1_200);
        let lasting = checks(lasting_pause);
        assert!((100..=140).contains(&lasting), "{lasting} checks");
    }
}
