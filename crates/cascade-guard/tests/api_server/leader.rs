//! Leader election against the real API server: two candidates for one Lease,
//! with short durations. Assertions are about the Lease as the API server
//! stores it.

use std::time::Duration;

use cascade_guard::controller::leader::{self, Leadership, LeaseSettings};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;
use kube::{Api, Client};
use local_cluster::testing::{Scope, shared};
use local_cluster::{ControlPlane, Options};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};
use tracing::instrument::WithSubscriber;
use tracing_subscriber::layer::SubscriberExt;

const LEASE: &str = "cascade-guard-leader";
const LEASE_DURATION: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_millis(500);

async fn control_plane() -> &'static ControlPlane {
    shared(Options::default).await
}

fn settings(namespace: &str, identity: &str) -> LeaseSettings {
    LeaseSettings {
        lease_duration: LEASE_DURATION,
        renew_interval: RENEW,
        retry_interval: RENEW,
        ..LeaseSettings::new(namespace, LEASE, identity)
    }
}

fn candidate(s: &Scope<'_>, identity: &str) -> JoinHandle<Leadership> {
    let client = s.client.clone();
    let settings = settings(&s.namespace, identity);
    tokio::spawn(async move {
        leader::acquire(client, settings)
            .await
            .expect("acquire returns only once it holds the lease")
    })
}

/// What `acquire` logs once it has read the lease and found another holder.
const WAITING: &str = "lease held by another replica; waiting";

/// Sets its flag when a log event's message is [`WAITING`].
struct SaysWaiting(watch::Sender<bool>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for SaysWaiting {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(bool);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" && format!("{value:?}") == WAITING {
                    self.0 = true;
                }
            }
        }
        let mut message = Message(false);
        event.record(&mut message);
        if message.0 {
            self.0.send_replace(true);
        }
    }
}

/// A candidate, and a flag set once it has looked at the lease, found it
/// held, and is waiting (its own log event, captured from its task alone).
fn waiting_candidate(
    s: &Scope<'_>,
    identity: &str,
) -> (JoinHandle<Leadership>, watch::Receiver<bool>) {
    let (tx, rx) = watch::channel(false);
    let client = s.client.clone();
    let settings = settings(&s.namespace, identity);
    let subscriber = tracing_subscriber::registry().with(SaysWaiting(tx));
    let task = tokio::spawn(
        async move {
            leader::acquire(client, settings)
                .await
                .expect("acquire returns only once it holds the lease")
        }
        .with_subscriber(subscriber),
    );
    (task, rx)
}

/// Waits until `candidate` says it is waiting for the lease.
async fn wait_until_waiting(mut says: watch::Receiver<bool>, identity: &str) {
    let within = Duration::from_secs(10);
    let waiting = timeout(within, says.wait_for(|w| *w)).await;
    assert!(
        matches!(waiting, Ok(Ok(_))),
        "{identity} did not start waiting for the lease within {within:?}"
    );
}

async fn stored(client: &Client, namespace: &str) -> Lease {
    Api::<Lease>::namespaced(client.clone(), namespace)
        .get(LEASE)
        .await
        .expect("get the lease")
}

fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

fn transitions(lease: &Lease) -> i32 {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_transitions)
        .unwrap_or(0)
}

/// Waits for `identity` to acquire, failing the test after `within`.
async fn acquired(task: JoinHandle<Leadership>, identity: &str, within: Duration) -> Leadership {
    match timeout(within, task).await {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => panic!("{identity}'s candidate failed: {e}"),
        Err(_) => panic!("{identity} did not acquire within {within:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_candidates_exactly_one_acquires() {
    let s = Scope::new(control_plane().await, "leader-one-of-two").await;
    let mut a = candidate(&s, "a");
    let mut b = candidate(&s, "b");
    let (winner, mut loser, loser_name) = tokio::select! {
        r = &mut a => (r.expect("a"), b, "b"),
        r = &mut b => (r.expect("b"), a, "a"),
    };
    assert!(winner.is_leader());
    let lease = stored(&s.client, &s.namespace).await;
    let winner_name = holder(&lease).expect("a holder").to_owned();
    assert_ne!(winner_name, loser_name, "the Lease names the winner");
    assert_eq!(transitions(&lease), 0);

    // Well past the lease duration: the winner keeps renewing, the other waits.
    assert!(
        timeout(LEASE_DURATION * 2, &mut loser).await.is_err(),
        "{loser_name} acquired a lease {winner_name} holds"
    );
    let lease = stored(&s.client, &s.namespace).await;
    assert_eq!(holder(&lease), Some(winner_name.as_str()));
    assert_eq!(transitions(&lease), 0);
    assert!(winner.is_leader());
    loser.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_lease_passes_to_the_other_candidate_at_once() {
    let s = Scope::new(control_plane().await, "leader-release").await;
    let a = acquired(candidate(&s, "a"), "a", Duration::from_secs(20)).await;
    let (b, says) = waiting_candidate(&s, "b");
    // b looks at the lease and starts waiting.
    wait_until_waiting(says, "b").await;
    assert!(!b.is_finished());

    let released = Instant::now();
    a.release().await;
    let lease = stored(&s.client, &s.namespace).await;
    // Either still free, or b was quicker than this read.
    assert!(matches!(holder(&lease), None | Some("b")), "{lease:?}");

    let b = acquired(b, "b", Duration::from_millis(1500)).await;
    let took = released.elapsed();
    assert!(took < LEASE_DURATION, "b waited {took:?}, as for an expiry");
    assert!(b.is_leader());
    let lease = stored(&s.client, &s.namespace).await;
    assert_eq!(holder(&lease), Some("b"));
    assert_eq!(transitions(&lease), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holder_is_replaced_only_once_its_lease_expired() {
    let s = Scope::new(control_plane().await, "leader-expiry").await;
    let a = acquired(candidate(&s, "a"), "a", Duration::from_secs(20)).await;
    let (b, says) = waiting_candidate(&s, "b");
    wait_until_waiting(says, "b").await;
    assert!(!b.is_finished());

    // Dropping stops renewal without releasing, as a SIGKILL would.
    drop(a);
    let died = Instant::now();
    // A renewal may still have been on the wire: read until two reads a
    // renewal interval apart agree.
    let mut last = stored(&s.client, &s.namespace).await;
    loop {
        sleep(RENEW * 2).await;
        let now = stored(&s.client, &s.namespace).await;
        if now.metadata.resource_version == last.metadata.resource_version {
            break;
        }
        last = now;
    }
    assert_eq!(holder(&last), Some("a"));
    let last_renew = last
        .spec
        .as_ref()
        .and_then(|s| s.renew_time.clone())
        .expect("renewTime")
        .0;

    let b = acquired(b, "b", LEASE_DURATION * 3).await;
    let waited = died.elapsed();
    assert!(b.is_leader());
    let lease = stored(&s.client, &s.namespace).await;
    assert_eq!(holder(&lease), Some("b"));
    assert_eq!(transitions(&lease), 1);
    // Never while a's lease was valid: b's claim is a full lease duration
    // after a's last renewal (both clocks are this machine's).
    let acquired_at = lease
        .spec
        .as_ref()
        .and_then(|s| s.acquire_time.clone())
        .expect("acquireTime")
        .0;
    let gap = acquired_at.duration_since(last_renew);
    assert!(
        gap >= k8s_openapi::jiff::SignedDuration::try_from(LEASE_DURATION).expect("duration"),
        "b took over {gap:?} after a's last renewal"
    );
    // And not much later: expiry, plus a retry interval and some slack.
    assert!(
        waited < LEASE_DURATION + RENEW * 4,
        "b took {waited:?} to replace a dead holder"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_lease_is_taken_sees_leadership_lost() {
    let s = Scope::new(control_plane().await, "leader-taken").await;
    let a = acquired(candidate(&s, "a"), "a", Duration::from_secs(20)).await;
    assert!(a.is_leader());

    let api = Api::<Lease>::namespaced(s.client.clone(), &s.namespace);
    let mut lease = stored(&s.client, &s.namespace).await;
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = Some("intruder".into());
    }
    api.replace(LEASE, &PostParams::default(), &lease)
        .await
        .expect("overwrite the holder");

    // The next renewal (every 500 ms) finds the intruder.
    timeout(RENEW * 4, a.lost())
        .await
        .expect("lost() resolves once another holder is found");
    assert!(!a.is_leader());
    // a neither overwrote the intruder nor, releasing, clears its claim.
    a.release().await;
    let lease = stored(&s.client, &s.namespace).await;
    assert_eq!(holder(&lease), Some("intruder"));
}
