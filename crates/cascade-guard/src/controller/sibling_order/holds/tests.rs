//! The hold policy's writes, request by request, against the fake API
//! server: what `write_policy` applies, and what it counts as in place.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;
use crate::fake_api_server::{BINDINGS, Exchange, POLICIES, against, resource, says};

/// A namespaced kind of the test group beside `XDatabase`.
fn kind(kind: &str, plural: &str) -> kube::api::ApiResource {
    kube::api::ApiResource {
        kind: kind.into(),
        plural: plural.into(),
        ..resource()
    }
}

fn kinds() -> ServedKinds {
    ServedKinds::of(vec![
        (resource(), true),
        (kind("XCache", "xcaches"), true),
        (kind("XBucket", "xbuckets"), true),
    ])
}

fn held(kind: &str, name: &str) -> ObjectRef {
    ObjectRef::new("example.org", kind, Some("team-a"), name)
}

fn plural(plural: &str) -> HeldKind {
    ("example.org".to_string(), plural.to_string())
}

/// The four applies, in their order, of the hold policy naming `held_kinds`
/// and of the record guard, both reading the record in `home`.
fn the_four_applies(held_kinds: &[&str]) -> Vec<Exchange> {
    let settings = CompileSettings::default();
    let named: BTreeSet<HeldKind> = held_kinds.iter().map(|p| plural(p)).collect();
    let hold = compile_hold(&settings, "home", &named);
    let guard = compile_record_guard(&settings, "home");
    vec![
        Exchange::apply(&format!("{POLICIES}/{HOLD_OBJECT_NAME}"), &hold.policy).echoes(),
        Exchange::apply(&format!("{BINDINGS}/{HOLD_OBJECT_NAME}"), &hold.binding).echoes(),
        Exchange::apply(&format!("{POLICIES}/{RECORD_GUARD_NAME}"), &guard.policy).echoes(),
        Exchange::apply(&format!("{BINDINGS}/{RECORD_GUARD_NAME}"), &guard.binding).echoes(),
    ]
}

fn holds(client: Client) -> Holds {
    Holds::new(client, "home".into(), CompileSettings::default())
}

fn hold(h: &mut Holds, object: &ObjectRef) {
    h.hold(object, "root-uid", "XApp.example.org", "its user")
        .expect("room in the record");
}

/// A minute ago: long loaded.
fn long_ago() -> Instant {
    Instant::now()
        .checked_sub(Duration::from_secs(60))
        .expect("the clock is past a minute")
}

/// The policy names the kinds held now: a kind named before keeps its time,
/// a kind named for the first time counts from now (not in force until the
/// API server has loaded it), a kind no longer held is dropped; the policy
/// is in place.
#[tokio::test]
async fn the_hold_policy_names_the_kinds_held_now_applied_forced() {
    let (db, cache, bucket) = (
        held("XDatabase", "db"),
        held("XCache", "cache"),
        held("XBucket", "bucket"),
    );
    let before = Instant::now();
    against(the_four_applies(&["xcaches", "xdatabases"]), async |c| {
        let mut h = holds(c);
        hold(&mut h, &db);
        hold(&mut h, &cache);
        h.named = BTreeMap::from([
            (plural("xdatabases"), long_ago()),
            (plural("xbuckets"), long_ago()),
        ]);
        h.write_policy(&kinds()).await;
        assert!(h.in_place());
        assert!(h.policy_written.is_some_and(|at| at >= before));
        assert_eq!(h.in_force(&db, &kinds()), Ok(()), "named before: in force");
        let cache_in_force = h.in_force(&cache, &kinds());
        assert!(
            cache_in_force
                .as_ref()
                .is_err_and(|e| e.contains("only since a moment")),
            "{cache_in_force:?}"
        );
        assert!(
            h.named
                .get(&plural("xcaches"))
                .is_some_and(|at| *at >= before)
        );
        let bucket_in_force = h.in_force(&bucket, &kinds());
        assert!(
            bucket_in_force
                .as_ref()
                .is_err_and(|e| e.contains("does not name")),
            "{bucket_in_force:?}"
        );
    })
    .await;
}

/// Any of the four applies failing: nothing after it is sent (a binding to
/// a policy that failed to change would bind the old one), the policy is not
/// in place (trees are not ordered), what it names is left as it was, and
/// the old labels are not touched.
#[tokio::test]
async fn a_failed_apply_sends_nothing_after_it_and_leaves_nothing_in_place() {
    for failing in 0..4 {
        let mut script = the_four_applies(&["xcaches", "xdatabases"]);
        script.truncate(failing + 1);
        let last = script.pop().expect("the failing apply");
        script.push(last.fails(says::INTERNAL, "etcdserver: request timed out"));
        against(script, async |c| {
            let mut h = holds(c);
            hold(&mut h, &held("XDatabase", "db"));
            hold(&mut h, &held("XCache", "cache"));
            h.policy_written = Some(long_ago());
            h.named = BTreeMap::from([(plural("xdatabases"), long_ago())]);
            h.strip_old = true;
            h.write_policy(&kinds()).await;
            assert!(!h.in_place(), "apply {failing} failed");
            assert_eq!(
                h.named.keys().cloned().collect::<Vec<_>>(),
                vec![plural("xdatabases")]
            );
            assert!(h.strip_old, "the old labels wait for a policy in place");
        })
        .await;
    }
}

/// The old labels are taken off once, after the first write that puts the
/// policy in place: listed by the label, each patched; a later write only
/// applies the policy.
#[tokio::test]
async fn the_old_labels_are_stripped_once_after_the_policy_is_in_place() {
    let labelled = json!({
        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList", "metadata": {},
        "items": [{"metadata": {"name": "db", "namespace": "team-a", "uid": "u1",
            "labels": {HOLD_LABEL: "root-uid"}}}],
    });
    let strip: Value = json!({"metadata": {
        "uid": "u1",
        "labels": {HOLD_LABEL: null},
        "annotations": {HELD_FOR_ANNOTATION: null},
    }});
    let mut script = the_four_applies(&["xdatabases"]);
    script.push(
        Exchange::get("/apis/example.org/v1/xdatabases?&labelSelector=cascade-guard.dev%2Fhold")
            .ok(labelled),
    );
    script.push(
        Exchange::patch(
            "/apis/example.org/v1/namespaces/team-a/xdatabases/db?&fieldManager=cascade-guard",
        )
        .body(strip)
        .echoes(),
    );
    script.extend(the_four_applies(&["xdatabases"]));
    let only_databases = ServedKinds::of(vec![(resource(), true)]);
    against(script, async |c| {
        let mut h = holds(c);
        hold(&mut h, &held("XDatabase", "db"));
        h.strip_old = true;
        h.write_policy(&only_databases).await;
        assert!(h.in_place());
        assert!(!h.strip_old);
        h.write_policy(&only_databases).await;
    })
    .await;
}

/// The pause before the next look covers the newest kind's load: none when
/// nothing is named or every kind named is loaded, else what is left of
/// the newest's.
#[test]
fn the_next_look_waits_for_the_newest_kind_to_load() {
    let s = Duration::from_secs;
    let cases: [(&[Duration], Duration); 4] = [
        (&[], s(0)),
        (&[s(10), s(3)], s(0)),
        (&[s(10), s(1)], s(2)),
        (&[s(2), Duration::ZERO, s(60)], s(3)),
    ];
    for (since, want) in cases {
        assert_eq!(loading(since.iter().copied()), want, "{since:?}");
    }
}

/// At the end of a look, a hold of a kind the policy does not name yet has
/// the policy written at once (the next look then finds it in force, after
/// the pause [`Holds::loading`] sets); when the policy already names every
/// kind held, nothing is sent; before the policy is in place at all, the
/// next look's start writes it, not this.
#[tokio::test]
async fn a_look_that_holds_a_new_kind_names_it_before_it_ends() {
    let (db, cache) = (held("XDatabase", "db"), held("XCache", "cache"));
    against(the_four_applies(&["xcaches", "xdatabases"]), async |c| {
        let mut h = holds(c);
        hold(&mut h, &db);
        hold(&mut h, &cache);
        h.name_held_kinds(&kinds()).await;
        assert!(h.named.is_empty(), "not in place: left to the next look");
        h.policy_written = Some(long_ago());
        h.named = BTreeMap::from([(plural("xdatabases"), long_ago())]);
        assert_eq!(h.loading(), Duration::ZERO);
        h.name_held_kinds(&kinds()).await;
        assert!(h.named.contains_key(&plural("xcaches")));
        assert!(h.loading() > Duration::from_secs(2), "{:?}", h.loading());
        // Everything held is named: no request.
        h.name_held_kinds(&kinds()).await;
    })
    .await;
}
