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
use crate::cluster::backoff::step_retry;
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
        "add-finalizer" => "AddFinalizer",
        "convert" => "Reissue",
        "restart" => "RestartCascade",
        _ => "RemoveFinalizer",
    });
    let failures = ctx.failed_again(object.uid());
    let wait = step_retry(failures);
    tracing::warn!(kind = %ctx.label, error = %error, failures, retry_in_seconds = wait.as_secs(), "retrying");
    Action::requeue(wait)
}

async fn step(object: &Meta, ctx: &Arc<Context>) -> Result<Action, StepError> {
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
    // Not before a conversion, nor in the seconds after one: the conversion
    // is what a delete waits for, the decision does not need the lookup, and
    // with many deletes at once the lookups of those converted first held
    // back the conversion of the rest (#46). The next look starts the clock.
    let for_the_clock = in_cascade
        && ctx.shape == Shape::CompositeResource
        && step != Step::Convert
        && !memory.just_converted(now);
    if step == Step::LookUpDependents || for_the_clock {
        let (dependents, left) = ctx.lookup().dependents(object, &uid).await;
        memory = memory.seen(observed, dependents, now);
        if step == Step::LookUpDependents {
            step = decide(memory, dependents);
        }
        if in_cascade && !matches!(step, Step::Release | Step::LetGo(_)) {
            ctx.watch_progress(object, &uid, left).await;
        }
    } else if in_cascade && ctx.shape != Shape::CompositeResource {
        // A kind whose dependents it cannot see: the clock runs on nothing.
        // An XR's clock starts with its first lookup: started on nothing, a
        // stall would be told with nothing left when its composed resources
        // are still there.
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
        Step::AddFinalizer => {
            writes::add_finalizer(&api, object, &uid)
                .await
                .map_err(failed("add-finalizer", &name))?;
            Ok(Action::await_change())
        }
        Step::Convert => convert(object, &uid, &memory, marked, ctx).await,
        Step::RestartCascade => restart(object, &uid, &memory, ctx).await,
        Step::Backoff(wait) => {
            tracing::debug!(kind = %ctx.label, %name, wait_ms = wait.as_millis(), "the cascade keeps being cut short; converting again after a pause");
            Ok(Action::requeue(wait))
        }
        Step::LetGo(why) => let_go(object, &uid, why, ctx).await,
        Step::Release => release(object, &uid, &memory, ctx).await,
    }
}

/// Reissues the delete as a foreground cascade ([`Step::Convert`]); the
/// first conversion is marked on the object and told in an Event.
async fn convert(
    object: &Meta,
    uid: &str,
    memory: &Memory,
    marked: bool,
    ctx: &Arc<Context>,
) -> Result<Action, StepError> {
    let name = object.name_any();
    let api = ctx.api(object);
    let first = memory.conversions == 0;
    match writes::convert(&api, &name, uid).await {
        Ok(Reissue::Converted) => {}
        Ok(Reissue::Gone) => {
            ctx.forget(uid);
            return Ok(Action::await_change());
        }
        Err(source) => return Err(failed("convert", &name)(source)),
    }
    ctx.remember(uid, |m| {
        *m = m.restored(marked);
        m.conversions += 1;
        m.last_conversion = Some(Instant::now());
        m.restarting = false;
    });
    if first {
        // Marked at once: a replica that starts after the garbage collector
        // has ended an unmarked cascade converts it again (see `step`).
        // Unmarked, that costs one more Foreground delete: worth a warning,
        // not a retry of the conversion.
        if !marked && let Err(e) = writes::mark_converted(&api, &name, uid).await {
            tracing::warn!(kind = %ctx.label, %name, error = %e, "could not mark the object converted");
        }
        ctx.metrics.conversion(&ctx.label);
        ctx.metrics.cascade_started(&ctx.label);
        tracing::info!(kind = %ctx.label, %name, namespace = ?object.namespace(), "converted a delete into a foreground cascade");
        // The Event outside the kind's reconcile slots, a few at a time and
        // a moment later: with 100 deletes at once, one more request each in
        // a slot, or all at once beside them, held the next deletes'
        // conversions back (#46).
        let (ctx, object) = (Arc::clone(ctx), object.clone());
        tokio::spawn(async move {
            if !ctx.tell_after.is_zero() {
                tokio::time::sleep(ctx.tell_after).await;
            }
            let Ok(_told) = ctx.telling.acquire().await else {
                return;
            };
            ctx.publish(
                &object,
                EventType::Normal,
                "ForegroundCascade",
                "converted the delete into a foreground cascade: it stays until everything it owns is gone",
            )
            .await;
        });
    } else {
        tracing::info!(kind = %ctx.label, %name, "foregroundDeletion was cleared with dependents left, or needs confirming: converting again");
    }
    Ok(Action::requeue(Duration::from_secs(30)))
}

/// Lets go of an object without a cascade ([`Step::LetGo`]), saying why.
async fn let_go(object: &Meta, uid: &str, why: LetGo, ctx: &Context) -> Result<Action, StepError> {
    let name = object.name_any();
    let api = ctx.api(object);
    let (reason, note) = match why {
        LetGo::OutOfReach => (
            "Released",
            "no Convert policy covers it any more (its labels, or its kind's mode, changed): removed cascade-guard's finalizer",
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
            ctx.remember(uid, |m| m.orphaned = true);
            None
        }
        LetGo::HandedOver => None,
    };
    let guard = rv.as_deref().map_or(ReleaseIf::Held, ReleaseIf::AtVersion);
    writes::release(&api, object, uid, guard)
        .await
        .map_err(failed("release", &name))?;
    if why != LetGo::Orphaning {
        ctx.forget(uid);
    }
    ctx.publish(object, EventType::Normal, reason, note).await;
    tracing::info!(kind = %ctx.label, %name, ?why, "released without a cascade");
    Ok(Action::await_change())
}

/// Lets go of an object whose cascade is complete ([`Step::Release`]).
async fn release(
    object: &Meta,
    uid: &str,
    memory: &Memory,
    ctx: &Context,
) -> Result<Action, StepError> {
    let name = object.name_any();
    let api = ctx.api(object);
    let guard = if memory.restarts > 0 {
        ReleaseIf::FinalizersAsSeen
    } else {
        ReleaseIf::Held
    };
    writes::release(&api, object, uid, guard)
        .await
        .map_err(failed("release", &name))?;
    ctx.forget(uid);
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
mod tests;
