use std::sync::Arc;

use kube::Client;
use serde_json::{Value, json};

use super::*;
use crate::fake_api_server::{Exchange, OBJECT, against, metadata, object, says};
use crate::policy::cascade::Reach;
use crate::policy::names::FOREGROUND_CASCADE_FINALIZER as HELD;

const FOREGROUND: &str = "foregroundDeletion";
const PATCHED: &str =
    "/apis/example.org/v1/namespaces/team-a/xdatabases/db?&fieldManager=cascade-guard";
const DELETED: &str = "/apis/example.org/v1/namespaces/team-a/xdatabases/db?";

fn context(client: Client, shape: Shape, reach: Reach) -> Arc<Context> {
    Arc::new(Context::for_tests(
        client,
        shape,
        reach,
        Duration::from_secs(600),
    ))
}

/// The Event the step publishes on `db`.
fn event(type_: &str, reason: &str) -> Exchange {
    Exchange::post("/apis/events.k8s.io/v1/namespaces/team-a/events?")
        .body_containing(json!({
            "type": type_,
            "reason": reason,
            "action": "Cascade",
            "reportingController": "cascade-guard",
            "regarding": {
                "apiVersion": "example.org/v1",
                "kind": "XDatabase",
                "namespace": "team-a",
                "name": "db",
                "uid": "u1",
            },
        }))
        .created()
}

fn convert() -> Exchange {
    Exchange::delete(DELETED).body(json!({
        "propagationPolicy": "Foreground",
        "preconditions": {"uid": "u1"},
    }))
}

/// The first conversion marked on the object.
fn mark() -> Exchange {
    Exchange::patch(PATCHED).body(json!({
        "metadata": {"uid": "u1", "annotations": {"cascade-guard.dev/converted": "true"}},
    }))
}

fn release(ops: Value) -> Exchange {
    Exchange::patch(PATCHED).body(ops)
}

fn release_any_version() -> Exchange {
    release(json!([
        {"op": "test", "path": "/metadata/uid", "value": "u1"},
        {"op": "test", "path": "/metadata/finalizers/0", "value": HELD},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]))
}

/// Reconciles `object` once; the controller's next move.
async fn turn(object: &Meta, ctx: &Arc<Context>) -> Result<Action, String> {
    reconcile(Arc::new(object.clone()), ctx.clone())
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn a_kind_that_is_not_an_xr_is_converted_confirmed_and_released() {
    let deleting = object("u1", "8", &[HELD], true);
    let in_foreground = metadata("u1", "9", &[HELD, FOREGROUND], true);
    let script = vec![
        convert().ok(in_foreground.clone()),
        mark().ok(metadata("u1", "9", &[HELD, FOREGROUND], true)),
        event("Normal", "ForegroundCascade"),
        // The garbage collector cleared foregroundDeletion: once more to
        // confirm (no second Event), then let go.
        convert().ok(in_foreground),
        release_any_version().ok(metadata("u1", "10", &[], true)),
        event("Normal", "CascadeComplete"),
    ];
    let (turns, conversions) = against(script, async |c| {
        let ctx = context(c, Shape::Other, Reach::Every);
        let mut turns = Vec::new();
        let mut conversions = Vec::new();
        for _ in 0..3 {
            turns.push(turn(&deleting, &ctx).await);
            conversions.push(ctx.memory("u1").conversions);
        }
        (turns, conversions)
    })
    .await;
    let again = Ok(Action::requeue(Duration::from_secs(30)));
    assert_eq!(turns, [again.clone(), again, Ok(Action::await_change())]);
    // Released: forgotten.
    assert_eq!(conversions, [1, 2, 0]);
}

/// Deleted with Foreground by someone else: the garbage collector's
/// clearing counts as after a first conversion, so one confirming delete
/// (not two) and then the release.
#[tokio::test]
async fn a_foreground_delete_from_the_start_is_confirmed_once_and_released() {
    let in_cascade = object("u1", "7", &[HELD, FOREGROUND], true);
    // Marked on first sight of the cascade, and not marked again.
    let mut cleared = object("u1", "8", &[HELD], true);
    cleared
        .annotations_mut()
        .insert(CONVERTED_ANNOTATION.into(), "true".into());
    let in_foreground = metadata("u1", "9", &[HELD, FOREGROUND], true);
    let script = vec![
        mark().ok(in_foreground.clone()),
        convert().ok(in_foreground),
        event("Normal", "ForegroundCascade"),
        release_any_version().ok(metadata("u1", "10", &[], true)),
        event("Normal", "CascadeComplete"),
    ];
    let (turns, conversions) = against(script, async |c| {
        let ctx = context(c, Shape::Other, Reach::Every);
        let mut turns = vec![turn(&in_cascade, &ctx).await];
        let mut conversions = vec![ctx.memory("u1").cascades()];
        for _ in 0..2 {
            turns.push(turn(&cleared, &ctx).await);
            conversions.push(ctx.memory("u1").cascades());
        }
        (turns, conversions)
    })
    .await;
    assert!(turns[0].is_ok(), "{turns:?}");
    assert_eq!(
        turns[1..],
        [
            Ok(Action::requeue(Duration::from_secs(30))),
            Ok(Action::await_change())
        ]
    );
    assert_eq!(conversions, [1, 2, 0]);
}

/// A cascade quiet past the restart time is restarted: foregroundDeletion
/// removed where seen, a Foreground delete, an Event (Normal for a kind
/// whose dependents cascade-guard cannot see). A view from
/// between the two (foregroundDeletion gone, the object still held) must
/// not let go: the release tests every finalizer as seen, and the API
/// server, with foregroundDeletion back, refuses it.
#[tokio::test]
async fn a_quiet_cascade_is_restarted_and_a_view_from_half_way_does_not_let_go() {
    let mark = |mut o: Meta| {
        o.annotations_mut()
            .insert(CONVERTED_ANNOTATION.into(), "true".into());
        o
    };
    let quiet = mark(object("u1", "8", &[HELD, FOREGROUND], true));
    let half_way = mark(object("u1", "9", &[HELD], true));
    let script = vec![
        Exchange::patch(PATCHED)
            .body(json!([
                {"op": "test", "path": "/metadata/uid", "value": "u1"},
                {"op": "test", "path": "/metadata/finalizers/1", "value": FOREGROUND},
                {"op": "remove", "path": "/metadata/finalizers/1"},
            ]))
            .ok(metadata("u1", "9", &[HELD], true)),
        convert().ok(metadata("u1", "10", &[HELD, FOREGROUND], true)),
        event("Normal", "CascadeRestarted"),
        release(json!([
            {"op": "test", "path": "/metadata/uid", "value": "u1"},
            {"op": "test", "path": "/metadata/finalizers", "value": [HELD]},
            {"op": "test", "path": "/metadata/finalizers/0", "value": HELD},
            {"op": "remove", "path": "/metadata/finalizers/0"},
        ]))
        .fails(
            says::INVALID,
            "the server rejected our request due to an error in our request",
        ),
    ];
    let (turns, memory) = against(script, async |c| {
        let ctx = context(c, Shape::Other, Reach::Every);
        ctx.remember("u1", |m| {
            m.conversions = 1;
            m.quiet_since = Instant::now().checked_sub(Duration::from_secs(60));
        });
        let turns = vec![turn(&quiet, &ctx).await, turn(&half_way, &ctx).await];
        (turns, ctx.memory("u1"))
    })
    .await;
    assert_eq!(turns[0], Ok(Action::requeue(Duration::from_secs(30))));
    assert!(turns[1].is_err(), "{turns:?}");
    assert_eq!((memory.restarts, memory.conversions), (1, 2));
    assert!(!memory.restarting);
}

#[tokio::test]
async fn a_conversion_that_finds_the_object_gone_or_replaced_forgets_it() {
    let deleting = object("u1", "8", &[HELD], true);
    let script = vec![
        convert().fails(says::NOT_FOUND, "xdatabases.example.org \"db\" not found"),
        convert().fails(
            says::CONFLICT,
            "Precondition failed: UID in precondition: u1, UID in object meta: u2",
        ),
    ];
    let (turns, memory) = against(script, async |c| {
        let ctx = context(c, Shape::Other, Reach::Every);
        let turns = [turn(&deleting, &ctx).await, turn(&deleting, &ctx).await];
        (turns, ctx.memory("u1"))
    })
    .await;
    assert_eq!(
        turns,
        [Ok(Action::await_change()), Ok(Action::await_change())]
    );
    assert_eq!(memory.conversions, 0);
}

#[tokio::test]
async fn a_refused_conversion_is_retried_after_growing_waits_until_it_succeeds() {
    let deleting = object("u1", "8", &[HELD], true);
    let script = vec![
        convert().fails(says::INTERNAL, "etcdserver: request timed out"),
        convert().fails(says::INTERNAL, "etcdserver: request timed out"),
        convert().ok(metadata("u1", "9", &[HELD, FOREGROUND], true)),
        mark().ok(metadata("u1", "9", &[HELD, FOREGROUND], true)),
        event("Normal", "ForegroundCascade"),
    ];
    let waits = against(script, async |c| {
        let ctx = context(c, Shape::Other, Reach::Every);
        let object = Arc::new(deleting.clone());
        let mut waits = Vec::new();
        for _ in 0..2 {
            match reconcile(object.clone(), ctx.clone()).await {
                Err(e) => waits.push(error_policy(object.clone(), &e, ctx.clone())),
                Ok(action) => panic!("refused, yet {action:?}"),
            }
        }
        waits.push(turn(&deleting, &ctx).await.expect("converted"));
        // Succeeded: the count of failures starts again.
        assert_eq!(ctx.failed_again(Some("u1".into())), 1);
        waits
    })
    .await;
    assert_eq!(
        waits,
        [
            Action::requeue(Duration::from_secs(2)),
            Action::requeue(Duration::from_secs(4)),
            Action::requeue(Duration::from_secs(30)),
        ]
    );
}

#[tokio::test]
async fn an_orphaning_delete_is_let_go_and_remembered() {
    let orphaning = object("u1", "8", &[HELD, "orphan"], true);
    let script = vec![
        release_any_version().ok(metadata("u1", "9", &["orphan"], true)),
        event("Normal", "OrphanLeftAlone"),
    ];
    let (out, memory) = against(script, async |c| {
        let ctx = context(c, Shape::Other, Reach::Every);
        (turn(&orphaning, &ctx).await, ctx.memory("u1"))
    })
    .await;
    assert_eq!(out, Ok(Action::await_change()));
    assert!(memory.orphaned);
}

fn release_as_seen() -> Exchange {
    release(json!([
        {"op": "test", "path": "/metadata/uid", "value": "u1"},
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
        {"op": "test", "path": "/metadata/finalizers/0", "value": HELD},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]))
}

#[tokio::test]
async fn a_live_object_out_of_reach_is_let_go_as_seen() {
    let live = object("u1", "7", &[HELD], false);
    let script = vec![
        release_as_seen().ok(metadata("u1", "8", &[], false)),
        event("Normal", "Released"),
    ];
    let out = against(script, async |c| {
        turn(&live, &context(c, Shape::Other, Reach::Nothing)).await
    })
    .await;
    assert_eq!(out, Ok(Action::await_change()));
}

#[tokio::test]
async fn a_let_go_refused_as_no_longer_as_seen_is_retried() {
    let live = object("u1", "7", &[HELD], false);
    let script = vec![release_as_seen().fails(
        says::INVALID,
        "the server rejected our request due to an error in our request",
    )];
    let (out, wait) = against(script, async |c| {
        let ctx = context(c, Shape::Other, Reach::Nothing);
        let object = Arc::new(live.clone());
        match reconcile(object.clone(), ctx.clone()).await {
            Ok(action) => (Ok(action), None),
            Err(e) => (Err(e.to_string()), Some(error_policy(object, &e, ctx))),
        }
    })
    .await;
    assert!(
        out.as_ref().is_err_and(|e| e.starts_with("release db")),
        "{out:?}"
    );
    assert_eq!(wait, Some(Action::requeue(Duration::from_secs(2))));
}

#[tokio::test]
async fn adding_the_finalizer_to_an_object_that_went_waits_for_a_change() {
    let live = object("u1", "7", &[], false);
    let script = vec![
        Exchange::patch(PATCHED)
            .body(json!([
                {"op": "test", "path": "/metadata/uid", "value": "u1"},
                {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "add", "path": "/metadata/finalizers", "value": [HELD]},
            ]))
            .fails(says::NOT_FOUND, "xdatabases.example.org \"db\" not found"),
    ];
    let out = against(script, async |c| {
        turn(&live, &context(c, Shape::Other, Reach::Every)).await
    })
    .await;
    assert_eq!(out, Ok(Action::await_change()));
}

/// The XR as stored, composing one cluster-scoped NopResource.
fn xr() -> Value {
    json!({
        "apiVersion": "example.org/v1",
        "kind": "XDatabase",
        "metadata": {"name": "db", "namespace": "team-a", "uid": "u1", "resourceVersion": "9"},
        "spec": {"crossplane": {"resourceRefs": [
            {"apiVersion": "nop.example.org/v1alpha1", "kind": "NopResource", "name": "db-x"},
        ]}},
    })
}

const COMPOSED: &str = "/apis/nop.example.org/v1alpha1/nopresources/db-x";

fn discovery() -> Exchange {
    Exchange::get("/apis/nop.example.org/v1alpha1").ok(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "nop.example.org/v1alpha1",
        "resources": [{
            "name": "nopresources",
            "singularName": "nopresource",
            "namespaced": false,
            "kind": "NopResource",
            "verbs": ["delete", "get", "list", "watch"],
        }],
    }))
}

fn composed_blocking() -> Value {
    json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": {
            "name": "db-x",
            "uid": "c1",
            "deletionTimestamp": "2026-01-01T00:00:01Z",
            "finalizers": ["finalizer.managedresource.crossplane.io"],
            "ownerReferences": [{
                "apiVersion": "example.org/v1",
                "kind": "XDatabase",
                "name": "db",
                "uid": "u1",
                "blockOwnerDeletion": true,
            }],
        },
    })
}

#[tokio::test]
async fn an_xr_in_cascade_is_looked_at_until_its_dependents_are_gone_then_released() {
    let in_foreground = object("u1", "9", &[HELD, FOREGROUND], true);
    // The garbage collector cleared foregroundDeletion.
    let cleared = object("u1", "10", &[HELD], true);
    let script = vec![
        // Waiting on one composed resource; its kind discovered once.
        Exchange::get(OBJECT).ok(xr()),
        discovery(),
        Exchange::get(COMPOSED).ok(composed_blocking()),
        Exchange::get(OBJECT).ok(xr()),
        Exchange::get(COMPOSED).fails(says::NOT_FOUND, "nopresources \"db-x\" not found"),
        // Nothing left: released.
        Exchange::get(OBJECT).ok(xr()),
        Exchange::get(COMPOSED).fails(says::NOT_FOUND, "nopresources \"db-x\" not found"),
        release_any_version().ok(metadata("u1", "11", &[], true)),
        event("Normal", "CascadeComplete"),
    ];
    let turns = against(script, async |c| {
        let ctx = context(c, Shape::CompositeResource, Reach::Every);
        // Converted once already (the first turn of its deletion).
        ctx.remember("u1", |m| m.conversions = 1);
        [
            turn(&in_foreground, &ctx).await,
            turn(&in_foreground, &ctx).await,
            turn(&cleared, &ctx).await,
        ]
    })
    .await;
    let look_again = Ok(Action::requeue(Duration::from_secs(30)));
    assert_eq!(
        turns,
        [look_again.clone(), look_again, Ok(Action::await_change())]
    );
}

#[tokio::test]
async fn an_xr_whose_dependents_remain_is_converted_again() {
    let cleared = object("u1", "10", &[HELD], true);
    let script = vec![
        Exchange::get(OBJECT).ok(xr()),
        discovery(),
        Exchange::get(COMPOSED).ok(composed_blocking()),
        convert().ok(metadata("u1", "11", &[HELD, FOREGROUND], true)),
    ];
    let (out, conversions) = against(script, async |c| {
        let ctx = context(c, Shape::CompositeResource, Reach::Every);
        ctx.remember("u1", |m| m.conversions = 1);
        (turn(&cleared, &ctx).await, ctx.memory("u1").conversions)
    })
    .await;
    assert_eq!(out, Ok(Action::requeue(Duration::from_secs(30))));
    assert_eq!(conversions, 2);
}

#[tokio::test]
async fn a_cascade_with_no_progress_is_reported_stalled_then_moving_again() {
    let in_foreground = object("u1", "9", &[HELD, FOREGROUND], true);
    let gone = || Exchange::get(COMPOSED).fails(says::NOT_FOUND, "not found");
    let script = vec![
        mark().ok(metadata("u1", "10", &[HELD, FOREGROUND], true)),
        Exchange::get(OBJECT).ok(xr()),
        discovery(),
        Exchange::get(COMPOSED).ok(composed_blocking()),
        Exchange::get(OBJECT).ok(xr()),
        Exchange::get(COMPOSED).ok(composed_blocking()),
        event("Warning", "CascadeStalled"),
        Exchange::get(OBJECT).ok(xr()),
        gone(),
        event("Normal", "CascadeResumed"),
    ];
    let turns = against(script, async |c| {
        // Stalled as soon as a look finds no progress.
        let ctx = Arc::new(Context::for_tests(
            c,
            Shape::CompositeResource,
            Reach::Every,
            Duration::ZERO,
        ));
        let mut turns = Vec::new();
        for _ in 0..3 {
            turns.push(turn(&in_foreground, &ctx).await);
        }
        turns
    })
    .await;
    // Looked at every second, the least interval.
    let look_again = Ok(Action::requeue(Duration::from_secs(1)));
    assert_eq!(turns, [look_again.clone(), look_again.clone(), look_again]);
}

/// An XR's Background delete is converted with nothing asked before the
/// Foreground delete, and its cascade's first look right after (the watch
/// bringing `foregroundDeletion`) asks nothing either: with many deletes at
/// once, those lookups held the later conversions back (#46).
#[tokio::test]
async fn an_xr_is_converted_first_and_looked_at_only_later() {
    let deleting = object("u1", "8", &[HELD], true);
    let in_foreground = object("u1", "9", &[HELD, FOREGROUND], true);
    let script = vec![
        convert().ok(metadata("u1", "9", &[HELD, FOREGROUND], true)),
        mark().ok(metadata("u1", "10", &[HELD, FOREGROUND], true)),
        event("Normal", "ForegroundCascade"),
    ];
    let turns = against(script, async |c| {
        let ctx = context(c, Shape::CompositeResource, Reach::Every);
        let first = turn(&deleting, &ctx).await;
        let next = turn(&in_foreground, &ctx).await;
        // Its stall clock not started on nothing: it starts with a lookup.
        assert!(ctx.clocks.lock().expect("clocks").is_empty());
        // What the conversion told, told before the client goes.
        let _all = ctx
            .telling
            .acquire_many(super::super::context::TOLD_AT_ONCE as u32)
            .await;
        [first, next]
    })
    .await;
    let look = Action::requeue(Duration::from_secs(30));
    assert_eq!(turns, [Ok(look.clone()), Ok(look)]);
}
