//! One object's turn: the state machine's [`Step`] for it, done as writes,
//! and what the controller does next (wait for a change, look again, retry).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::Meta;
use super::context::Context;
use super::writes::{self, Reissue, ReleaseIf, Strip};
use crate::controller::backoff::step_retry;
use crate::policy::Shape;
use crate::policy::cascade::{Carry, Dependents, LetGo, Memory, Step, next_step};
use crate::policy::names::CONVERTED_ANNOTATION;

/// A failed write of `step` on object `name`.
fn failed(step: &'static str, name: &str) -> impl FnOnce(kube::Error) -> StepError {
    let name = name.to_string();
    move |source| StepError::Api { step, name, source }
}

#[derive(Debug, thiserror::Error)]
pub(super) enum StepError {
    #[error("{step} {name}: {source}")]
    Api {
        step: &'static str,
        name: String,
        source: kube::Error,
    },
}

pub(super) async fn reconcile(object: Arc<Meta>, ctx: Arc<Context>) -> Result<Action, StepError> {
    let result = step(&object, &ctx).await;
    if result.is_ok()
        && let Some(uid) = object.uid()
    {
        ctx.succeeded(&uid);
    }
    result
}

/// Retries a failed step after a wait that grows with the object's failures
/// in a row.
pub(super) fn error_policy(object: Arc<Meta>, error: &StepError, ctx: Arc<Context>) -> Action {
    let StepError::Api { step, .. } = error;
    ctx.metrics.error(match *step {
        "hold" => "AddFinalizer",
        "convert" => "Reissue",
        "restart" => "RestartCascade",
        _ => "RemoveFinalizer",
    });
    let failures = ctx.failed_again(object.uid());
    let wait = step_retry(failures);
    tracing::warn!(kind = %ctx.label, error = %error, failures, retry_in_seconds = wait.as_secs(), "retrying");
    Action::requeue(wait)
}

async fn step(object: &Meta, ctx: &Context) -> Result<Action, StepError> {
    let Some(uid) = object.uid() else {
        return Ok(Action::await_change());
    };
    let observed = ctx.observe(object);
    let now = Instant::now();
    let mut marked = object.annotations().contains_key(CONVERTED_ANNOTATION);
    let memory = ctx.memory(&uid).restored(marked);
    // A foreground cascade cascade-guard did not start counts as its first
    // conversion (cascade::Memory::foreground_from_the_start), and is marked
    // like one: a replica that starts after the garbage collector has ended
    // it (a restart, a new leader) would otherwise take the ended cascade for
    // a Background delete never converted, and re-add `foregroundDeletion`
    // for a garbage collector done with the object (soak seed
    // 1796387107332808193, run 4, round 4: never cleared, the XR wedged).
    if observed.deleting && observed.held && observed.in_foreground && memory.cascades() == 0 {
        ctx.remember(&uid, |m| m.foreground_from_the_start = true);
        let name = object.name_any();
        if !marked {
            match writes::mark_converted(&ctx.api(object), &name, &uid).await {
                Ok(()) => marked = true,
                Err(e) => {
                    tracing::warn!(kind = %ctx.label, %name, error = %e, "could not mark the object's foreground cascade");
                }
            }
        }
    }
    // The quiet clock moves with each look (and with the lookup below).
    let mut memory = memory.seen(observed, Dependents::NotLookedUp, now);
    let decide = |memory, dependents| next_step(observed, memory, dependents, now, ctx.carry);
    let mut step = decide(memory, Dependents::NotLookedUp);
    // A cascade cascade-guard holds: what it waits for, for the stall clock
    // (and for the decision, when that needs it).
    let in_cascade = observed.deleting && observed.held && !observed.orphaning;
    if step == Step::LookUpDependents || (in_cascade && ctx.shape == Shape::CompositeResource) {
        let (dependents, left) = ctx.lookup().dependents(object, &uid).await;
        memory = memory.seen(observed, dependents, now);
        if step == Step::LookUpDependents {
            step = decide(memory, dependents);
        }
        if in_cascade && !matches!(step, Step::Release | Step::LetGo(_)) {
            ctx.watch_progress(object, &uid, left).await;
        }
    } else if in_cascade {
        ctx.watch_progress(object, &uid, Vec::new()).await;
    }
    // Remembered only when it changes: a live object (no clock) gets no
    // entry, which at 100,000 held objects would be memory for nothing.
    let quiet_since = memory.quiet_since;
    if ctx.memory(&uid).quiet_since != quiet_since {
        ctx.remember(&uid, |m| m.quiet_since = quiet_since);
    }
    let name = object.name_any();
    let api = ctx.api(object);
    match step {
        Step::Wait | Step::LookUpDependents => Ok(if in_cascade {
            // A cascade is running: look at its progress now and then (and
            // catch an event that was missed), and when a restart is due.
            let look = ctx.look_interval();
            let due = match ctx.carry {
                Carry::ToTheEnd {
                    restart_after: Some(after),
                } => memory.restart_due(after),
                _ => None,
            };
            let due =
                due.map(|due| due.saturating_duration_since(now) + Duration::from_millis(100));
            Action::requeue(due.map_or(look, |due| due.min(look)))
        } else {
            Action::await_change()
        }),
        Step::Hold => {
            writes::hold(&api, object, &uid)
                .await
                .map_err(failed("hold", &name))?;
            Ok(Action::await_change())
        }
        Step::Convert => {
            let first = memory.conversions == 0;
            match writes::convert(&api, &name, &uid).await {
                Ok(Reissue::Converted) => {}
                Ok(Reissue::Gone) => {
                    ctx.forget(&uid);
                    return Ok(Action::await_change());
                }
                Err(source) => return Err(failed("convert", &name)(source)),
            }
            ctx.remember(&uid, |m| {
                *m = m.restored(marked);
                m.conversions += 1;
                m.last_conversion = Some(Instant::now());
                m.restarting = false;
            });
            if first {
                // Unmarked, a restart costs one more Foreground delete: worth
                // a warning, not a retry of the conversion.
                if !marked && let Err(e) = writes::mark_converted(&api, &name, &uid).await {
                    tracing::warn!(kind = %ctx.label, %name, error = %e, "could not mark the object converted");
                }
                ctx.metrics.conversion(&ctx.label);
                ctx.metrics.cascade_started(&ctx.label);
                ctx.publish(
                    object,
                    EventType::Normal,
                    "ForegroundCascade",
                    "converted the delete into a foreground cascade: it stays until everything it owns is gone",
                )
                .await;
                tracing::info!(kind = %ctx.label, %name, namespace = ?object.namespace(), "converted a delete into a foreground cascade");
            } else {
                tracing::info!(kind = %ctx.label, %name, "foregroundDeletion was cleared with dependents left, or needs confirming: converting again");
            }
            Ok(Action::requeue(Duration::from_secs(30)))
        }
        Step::RestartCascade => restart(object, &uid, &memory, ctx).await,
        Step::Backoff(wait) => {
            tracing::debug!(kind = %ctx.label, %name, wait_ms = wait.as_millis(), "the cascade keeps being cut short; converting again after a pause");
            Ok(Action::requeue(wait))
        }
        Step::LetGo(why) => {
            let (reason, note) = match why {
                LetGo::OutOfReach => (
                    "Released",
                    "no Convert policy covers it any more (its labels, or its kind's mode, changed): released cascade-guard's hold",
                ),
                LetGo::Orphaning => (
                    "OrphanLeftAlone",
                    "deleted with propagationPolicy Orphan: its dependents stay, so there is no cascade to hold it for; released",
                ),
                LetGo::HandedOver => (
                    "Released",
                    "cascade-guard is being uninstalled: the garbage collector's foreground cascade holds it until its dependents are gone",
                ),
            };
            // A live object is released as seen: if it started deleting since,
            // the newer version is decided afresh. An orphaning one is let go
            // whatever else changed (the garbage collector dropping `orphan`),
            // and remembered as such until it is gone.
            let rv = match why {
                LetGo::OutOfReach => object.resource_version(),
                LetGo::Orphaning => {
                    ctx.remember(&uid, |m| m.orphaned = true);
                    None
                }
                LetGo::HandedOver => None,
            };
            let guard = rv.as_deref().map_or(ReleaseIf::Held, ReleaseIf::AtVersion);
            writes::release(&api, object, &uid, guard)
                .await
                .map_err(failed("release", &name))?;
            if why != LetGo::Orphaning {
                ctx.forget(&uid);
            }
            ctx.publish(object, EventType::Normal, reason, note).await;
            tracing::info!(kind = %ctx.label, %name, ?why, "released without a cascade");
            Ok(Action::await_change())
        }
        Step::Release => {
            let guard = if memory.restarts > 0 {
                ReleaseIf::FinalizersAsSeen
            } else {
                ReleaseIf::Held
            };
            writes::release(&api, object, &uid, guard)
                .await
                .map_err(failed("release", &name))?;
            ctx.forget(&uid);
            let took = object
                .metadata
                .deletion_timestamp
                .as_ref()
                .map(|t| {
                    let now = k8s_openapi::jiff::Timestamp::now();
                    Duration::from_secs_f64(now.duration_since(t.0).as_secs_f64().max(0.0))
                })
                .unwrap_or_default();
            ctx.metrics.cascade_finished(&ctx.label, took);
            ctx.publish(
                object,
                EventType::Normal,
                "CascadeComplete",
                &format!(
                    "foreground cascade complete in {:.1}s: nothing left to cascade; released",
                    took.as_secs_f64()
                ),
            )
            .await;
            tracing::info!(kind = %ctx.label, %name, seconds = took.as_secs_f64(), "cascade complete; released");
            Ok(Action::await_change())
        }
    }
}

/// Restarts a foreground cascade the garbage collector may have lost
/// ([`Step::RestartCascade`]): removes `foregroundDeletion` and deletes in
/// the foreground again, so that the collector sees the cascade start. The
/// object stays held in between; a failure half-way is converted on the
/// next turn ([`Memory::restarting`]).
async fn restart(
    object: &Meta,
    uid: &str,
    memory: &Memory,
    ctx: &Context,
) -> Result<Action, StepError> {
    let name = object.name_any();
    let api = ctx.api(object);
    match writes::strip_foreground(&api, object, uid)
        .await
        .map_err(failed("restart", &name))?
    {
        Strip::Stripped => {}
        // Cleared or changed meanwhile: decide again on what is there now.
        Strip::NotAsSeen => return Ok(Action::requeue(Duration::from_secs(1))),
    }
    ctx.remember(uid, |m| m.restarting = true);
    match writes::convert(&api, &name, uid)
        .await
        .map_err(failed("restart", &name))?
    {
        Reissue::Converted => {}
        Reissue::Gone => {
            ctx.forget(uid);
            return Ok(Action::await_change());
        }
    }
    let now = Instant::now();
    let quiet_for = memory
        .quiet_since
        .map(|since| now.saturating_duration_since(since))
        .unwrap_or_default();
    ctx.remember(uid, |m| {
        m.restarting = false;
        m.conversions += 1;
        m.last_conversion = Some(now);
        m.restarts += 1;
        m.last_restart = Some(now);
    });
    ctx.metrics.cascade_restarted(&ctx.label);
    let restart = memory.restarts + 1;
    let quiet = quiet_for.as_secs();
    // An XR with nothing left is a lost cascade for sure; a kind whose
    // dependents cascade-guard cannot see is restarted through any long
    // cascade, which is routine.
    let (type_, note) = if ctx.shape == Shape::CompositeResource {
        (
            EventType::Warning,
            format!(
                "foregroundDeletion stayed {quiet}s with none of its composed resources left; the garbage collector may have missed the cascade's start (after an API server restart, say): removed foregroundDeletion and deleted it in the foreground again, so that the collector starts the cascade afresh (restart {restart})"
            ),
        )
    } else {
        (
            EventType::Normal,
            format!(
                "in its foreground cascade for {quiet}s; cascade-guard cannot see this kind's dependents, so it restarted the cascade in case the garbage collector missed its start (after an API server restart, say): removed foregroundDeletion and deleted it in the foreground again; the collector goes on waiting for what is left (restart {restart})"
            ),
        )
    };
    match type_ {
        EventType::Warning => {
            tracing::warn!(kind = %ctx.label, %name, restart, quiet_seconds = quiet, "restarted a quiet foreground cascade")
        }
        EventType::Normal => {
            tracing::info!(kind = %ctx.label, %name, restart, quiet_seconds = quiet, "restarted a long foreground cascade")
        }
    }
    ctx.publish(object, type_, "CascadeRestarted", &note).await;
    Ok(Action::requeue(ctx.look_interval()))
}

#[cfg(test)]
mod tests {
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
    async fn holding_an_object_that_went_waits_for_a_change() {
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
}
