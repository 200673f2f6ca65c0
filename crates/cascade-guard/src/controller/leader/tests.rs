use super::*;

const D: Duration = Duration::from_secs(15);

fn held_by(holder: &str, seconds: i32, transitions: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.into()),
        lease_duration_seconds: Some(seconds),
        lease_transitions: Some(transitions),
        acquire_time: Some(MicroTime(Timestamp::UNIX_EPOCH)),
        renew_time: Some(MicroTime(Timestamp::UNIX_EPOCH)),
        ..Default::default()
    }
}

#[test]
fn a_free_lease_may_be_taken_at_once() {
    let now = Instant::now();
    assert!(may_take_over(&LeaseSpec::default(), now, now, "b", D));
    let mut spec = held_by("a", 15, 3);
    spec.holder_identity = Some(String::new());
    assert!(may_take_over(&spec, now, now, "b", D));
}

#[test]
fn a_held_lease_may_be_taken_only_after_it_went_unrenewed_for_its_duration() {
    let seen = Instant::now();
    let spec = held_by("a", 3, 0);
    assert!(!may_take_over(&spec, seen, seen, "b", D));
    assert!(!may_take_over(
        &spec,
        seen,
        seen + Duration::from_secs(3),
        "b",
        D
    ));
    assert!(may_take_over(
        &spec,
        seen,
        seen + Duration::from_millis(3001),
        "b",
        D
    ));
}

#[test]
fn the_holders_duration_counts_not_ours() {
    let seen = Instant::now();
    let later = seen + Duration::from_secs(5);
    assert!(!may_take_over(&held_by("a", 10, 0), seen, later, "b", D));
    let mut spec = held_by("a", 10, 0);
    spec.lease_duration_seconds = None;
    assert!(!may_take_over(&spec, seen, later, "b", D));
    assert!(may_take_over(
        &spec,
        seen,
        later,
        "b",
        Duration::from_secs(4)
    ));
}

#[test]
fn a_wall_clock_far_ahead_does_not_expire_a_fresh_lease() {
    // renewTime is the epoch, but we saw it just now: still valid.
    let seen = Instant::now();
    assert!(!may_take_over(&held_by("a", 15, 0), seen, seen, "b", D));
}

#[test]
fn our_own_lease_may_be_reclaimed_at_once() {
    let now = Instant::now();
    assert!(may_take_over(&held_by("b", 15, 0), now, now, "b", D));
}

#[test]
fn a_new_lease_starts_with_no_transitions() {
    let now = Timestamp::now();
    let spec = claimed(None, "a", 15, now);
    assert_eq!(spec.holder_identity.as_deref(), Some("a"));
    assert_eq!(spec.lease_transitions, Some(0));
    assert_eq!(spec.lease_duration_seconds, Some(15));
    assert_eq!(spec.acquire_time, Some(MicroTime(now)));
    assert_eq!(spec.renew_time, Some(MicroTime(now)));
}

#[test]
fn taking_over_counts_a_transition_and_resets_acquire_time() {
    let now = Timestamp::now();
    let spec = claimed(Some(&held_by("a", 3, 4)), "b", 15, now);
    assert_eq!(spec.holder_identity.as_deref(), Some("b"));
    assert_eq!(spec.lease_transitions, Some(5));
    assert_eq!(spec.lease_duration_seconds, Some(15));
    assert_eq!(spec.acquire_time, Some(MicroTime(now)));
}

#[test]
fn taking_a_released_lease_counts_a_transition() {
    let now = Timestamp::now();
    let free = released(&held_by("a", 3, 4), now);
    assert_eq!(free.holder_identity, None);
    assert_eq!(free.lease_transitions, Some(4));
    assert_eq!(claimed(Some(&free), "b", 3, now).lease_transitions, Some(5));
}

#[test]
fn reclaiming_our_own_lease_is_no_transition() {
    let now = Timestamp::now();
    let old = held_by("a", 3, 4);
    let spec = claimed(Some(&old), "a", 3, now);
    assert_eq!(spec.lease_transitions, Some(4));
    assert_eq!(spec.acquire_time, old.acquire_time);
    assert_eq!(spec.renew_time, Some(MicroTime(now)));
}

#[test]
fn the_duration_written_is_rounded_up_to_whole_seconds() {
    let mut s = LeaseSettings::new("ns", "lease", "a");
    assert_eq!(s.lease_duration_seconds(), 15);
    s.lease_duration = Duration::from_millis(2500);
    assert_eq!(s.lease_duration_seconds(), 3);
}

#[test]
fn settings_that_cannot_work_are_refused() {
    let ok = LeaseSettings::new("ns", "lease", "a");
    assert!(ok.validate().is_ok());
    let mut s = ok.clone();
    s.identity.clear();
    assert!(s.validate().is_err());
    let mut s = ok.clone();
    s.renew_interval = s.lease_duration;
    assert!(s.validate().is_err());
    let mut s = ok;
    s.lease_duration = Duration::from_millis(500);
    assert!(s.validate().is_err());
}

/// Without leader election the controller says it runs on its Lease with the
/// verbs the chart's Role grants there (get and update by name, create), never
/// a patch, which that Role does not grant: a new Lease is created, one there
/// is replaced at the version read, with what others wrote on it kept.
#[tokio::test]
async fn a_presence_is_written_with_the_roles_verbs() {
    use crate::fake_api_server::{Exchange, against, says};
    use serde_json::json;

    const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/ns/leases";
    let path = format!("{LEASES}/lease");
    let mut settings = LeaseSettings::new("ns", "lease", "me");
    settings.annotations = [("cascade-guard.dev/settings".to_string(), "s".to_string())].into();
    let lease = presence(&settings, "me", 15);
    let written_on = |script: Vec<Exchange>, known: Option<Lease>| {
        let lease = lease.clone();
        against(script, async move |c| {
            let api: Api<Lease> = Api::namespaced(c, "ns");
            apply_presence(&api, "lease", &lease, known)
                .await
                .map(|l| l.spec.and_then(|s| s.holder_identity))
                .map_err(|e| e.to_string())
        })
    };
    let written = |script| written_on(script, None);
    let created = written(vec![
        Exchange::get(&path).fails(says::NOT_FOUND, "not found"),
        Exchange::post(&format!("{LEASES}?&fieldManager=cascade-guard"))
            .body_containing(json!({
                "metadata": {"name": "lease", "annotations": {"cascade-guard.dev/settings": "s"}},
                "spec": {"holderIdentity": "me", "leaseDurationSeconds": 15},
            }))
            .created(),
    ])
    .await;
    assert_eq!(created, Ok(Some("me".to_string())));
    let there = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {
            "name": "lease", "namespace": "ns", "resourceVersion": "7",
            "labels": {"team": "platform"},
            "annotations": {"cascade-guard.dev/settings": "old", "note": "kept"},
        },
        "spec": {"holderIdentity": "", "leaseDurationSeconds": 1},
    });
    let replaced = written(vec![
        Exchange::get(&path).ok(there.clone()),
        Exchange::put(&format!("{path}?&fieldManager=cascade-guard"))
            .body_containing(json!({
                "metadata": {
                    "name": "lease", "resourceVersion": "7",
                    "labels": {"team": "platform"},
                    "annotations": {"cascade-guard.dev/settings": "s", "note": "kept"},
                },
                "spec": {"holderIdentity": "me", "leaseDurationSeconds": 15},
            }))
            .echoes(),
    ])
    .await;
    assert_eq!(replaced, Ok(Some("me".to_string())));
    // A renewal of the Lease this process last wrote: one PUT, no read.
    let known: Lease = serde_json::from_value(there).expect("a Lease");
    let renewed = written_on(
        vec![
            Exchange::put(&format!("{path}?&fieldManager=cascade-guard"))
                .body_containing(json!({
                    "metadata": {"resourceVersion": "7"},
                    "spec": {"holderIdentity": "me"},
                }))
                .echoes(),
        ],
        Some(known),
    )
    .await;
    assert_eq!(renewed, Ok(Some("me".to_string())));
    // A write the Role forbids is an error the announcer logs, not a panic.
    let forbidden = written(vec![
        Exchange::get(&path).fails(says::FORBIDDEN, "leases is forbidden"),
    ])
    .await;
    assert!(forbidden.is_err(), "{forbidden:?}");
}
