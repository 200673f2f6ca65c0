use super::*;

const TO_THE_END: Carry = Carry::ToTheEnd {
    restart_after: Some(RESTART_AFTER),
};

fn obs(deleting: bool, held: bool, in_foreground: bool, shape: Shape) -> Observed {
    Observed {
        deleting,
        held,
        in_foreground,
        orphaning: false,
        in_reach: true,
        shape,
    }
}

#[test]
fn the_table() {
    use Dependents::*;
    use Shape::*;
    use Step::*;
    let now = Instant::now();
    let m = |conversions| Memory {
        conversions,
        ..Memory::default()
    };
    // (deleting, held, foreground, shape, conversions, dependents) -> step
    let cases = [
        // Live objects: the finalizer added, once.
        (
            false,
            false,
            false,
            CompositeResource,
            0,
            NotLookedUp,
            AddFinalizer,
        ),
        (false, true, false, CompositeResource, 0, NotLookedUp, Wait),
        (false, false, false, Other, 0, NotLookedUp, AddFinalizer),
        // A live object that somehow carries foregroundDeletion still just gets it.
        (false, false, true, Other, 0, NotLookedUp, AddFinalizer),
        // Deleting, not held (from before installation, or released): not ours.
        (true, false, false, CompositeResource, 0, NotLookedUp, Wait),
        (true, false, true, CompositeResource, 3, Remaining(2), Wait),
        // Deleting, held, in foreground: the garbage collector is at work
        // (an XR's composed resources tell whether it is quiet).
        (
            true,
            true,
            true,
            CompositeResource,
            0,
            NotLookedUp,
            LookUpDependents,
        ),
        (true, true, true, CompositeResource, 1, Remaining(1), Wait),
        (true, true, true, CompositeResource, 1, None, Wait),
        (true, true, true, Other, 5, None, Wait),
        // Deleting, held, no foregroundDeletion, never converted: convert.
        (
            true,
            true,
            false,
            CompositeResource,
            0,
            NotLookedUp,
            Convert,
        ),
        (true, true, false, CompositeResource, 0, None, Convert),
        (true, true, false, Other, 0, NotLookedUp, Convert),
        // XR after a conversion: decided by its composed resources.
        (
            true,
            true,
            false,
            CompositeResource,
            1,
            NotLookedUp,
            LookUpDependents,
        ),
        (
            true,
            true,
            false,
            CompositeResource,
            1,
            Remaining(3),
            Convert,
        ),
        (
            true,
            true,
            false,
            CompositeResource,
            4,
            Remaining(1),
            Convert,
        ),
        (true, true, false, CompositeResource, 1, None, Release),
        // XR whose composed resources cannot be read: the confirming round.
        (true, true, false, CompositeResource, 1, Unknowable, Convert),
        (true, true, false, CompositeResource, 2, Unknowable, Release),
        // Other kinds: one confirming round, then let go.
        (true, true, false, Other, 1, NotLookedUp, Convert),
        (true, true, false, Other, 2, NotLookedUp, Release),
        (true, true, false, Other, 9, NotLookedUp, Release),
    ];
    for (deleting, held, fg, shape, conversions, deps, want) in cases {
        let got = next_step(
            obs(deleting, held, fg, shape),
            m(conversions),
            deps,
            now,
            TO_THE_END,
        );
        assert_eq!(
            got, want,
            "deleting={deleting} held={held} fg={fg} {shape:?} conversions={conversions} {deps:?}"
        );
    }
}

/// An object first seen in a foreground cascade it did not start (a user's
/// `--cascade=foreground`, Crossplane's replay, the garbage collector's
/// own delete of a dependent): when the garbage collector clears
/// `foregroundDeletion`, that cascade counts as the first conversion. An
/// XR with nothing left is released without a Foreground delete that
/// only the garbage collector could clear again (seed
/// 1796387107332808193, round 4: it never did); other kinds confirm once,
/// as after cascade-guard's own first conversion; a cascade cut short
/// (composed resources left) is converted.
#[test]
fn a_cascade_seen_in_foreground_from_the_start_counts_as_the_first() {
    use Dependents::*;
    let now = Instant::now();
    let cleared = |shape| obs(true, true, false, shape);
    let from_start = |conversions| Memory {
        conversions,
        foreground_from_the_start: true,
        ..Memory::default()
    };
    let cases = [
        (
            Shape::CompositeResource,
            0,
            NotLookedUp,
            Step::LookUpDependents,
        ),
        (Shape::CompositeResource, 0, None, Step::Release),
        (Shape::CompositeResource, 0, Remaining(1), Step::Convert),
        (Shape::CompositeResource, 0, Unknowable, Step::Convert),
        (Shape::CompositeResource, 1, Unknowable, Step::Release),
        (Shape::Other, 0, NotLookedUp, Step::Convert),
        (Shape::Other, 1, NotLookedUp, Step::Release),
    ];
    for (shape, conversions, deps, want) in cases {
        assert_eq!(
            next_step(
                cleared(shape),
                from_start(conversions),
                deps,
                now,
                TO_THE_END
            ),
            want,
            "{shape:?} conversions={conversions} {deps:?}"
        );
    }
    // While the garbage collector's cascade runs, nothing changes.
    assert_eq!(
        next_step(
            obs(true, true, true, Shape::CompositeResource),
            from_start(0),
            None,
            now,
            TO_THE_END
        ),
        Step::Wait
    );
    assert_eq!(from_start(0).cascades(), 1);
    assert_eq!(Memory::default().cascades(), 0);
}

/// Right after a conversion an XR's cascade is left to the garbage
/// collector, nothing asked: no lookup could make a restart due so soon.
/// From JUST_CONVERTED on, its composed resources are looked at again.
#[test]
fn a_cascade_just_converted_waits_without_a_lookup() {
    let converted = Instant::now();
    let memory = Memory {
        conversions: 1,
        last_conversion: Some(converted),
        ..Memory::default()
    };
    let running = obs(true, true, true, Shape::CompositeResource);
    let step = |now| next_step(running, memory, Dependents::NotLookedUp, now, TO_THE_END);
    assert!(memory.just_converted(converted));
    assert_eq!(step(converted), Step::Wait);
    assert_eq!(step(converted + JUST_CONVERTED / 2), Step::Wait);
    assert!(!memory.just_converted(converted + JUST_CONVERTED));
    assert_eq!(step(converted + JUST_CONVERTED), Step::LookUpDependents);
    // Other kinds were never looked up: unchanged.
    let other = obs(true, true, true, Shape::Other);
    assert_eq!(
        next_step(
            other,
            memory,
            Dependents::NotLookedUp,
            converted,
            TO_THE_END
        ),
        Step::Wait
    );
    // No restart can be due so soon: a restart waits longer.
    assert!(JUST_CONVERTED < RESTART_AFTER);
}

/// A new leader (nothing in memory) finds an object it converted before,
/// marked on the object, with `foregroundDeletion` cleared: it goes on
/// from there (looks at an XR's composed resources, confirms for other
/// kinds) instead of issuing the first Foreground delete again.
#[test]
fn a_conversion_marked_on_the_object_survives_a_restart() {
    use Dependents::*;
    let now = Instant::now();
    let cleared = |shape| obs(true, true, false, shape);
    let fresh = Memory::default();
    let cases = [
        (Shape::CompositeResource, false, NotLookedUp, Step::Convert),
        (
            Shape::CompositeResource,
            true,
            NotLookedUp,
            Step::LookUpDependents,
        ),
        (Shape::CompositeResource, true, None, Step::Release),
        (Shape::CompositeResource, true, Remaining(2), Step::Convert),
        (Shape::Other, false, NotLookedUp, Step::Convert),
        (Shape::Other, true, NotLookedUp, Step::Convert),
    ];
    for (shape, marked, deps, want) in cases {
        assert_eq!(
            next_step(
                cleared(shape),
                fresh.restored(marked),
                deps,
                now,
                TO_THE_END
            ),
            want,
            "{shape:?} marked={marked} {deps:?}"
        );
    }
    // What this replica remembers itself is kept.
    let seen = Memory {
        conversions: 3,
        ..Memory::default()
    };
    assert_eq!(seen.restored(true), seen);
    assert_eq!(seen.restored(false), seen);
    // A foreground cascade this replica saw from its start, and marked,
    // is counted once, not once more for the mark: a kind that is not an
    // XR is still confirmed before it is released.
    let from_start = Memory {
        foreground_from_the_start: true,
        ..Memory::default()
    };
    assert_eq!(from_start.restored(true), from_start);
    assert_eq!(
        next_step(
            cleared(Shape::Other),
            from_start.restored(true),
            NotLookedUp,
            now,
            TO_THE_END
        ),
        Step::Convert
    );
}

/// Out of reach (relabelled out of a selector, or the kind no longer
/// Convert): a live object is let go, a deleting one is carried through.
#[test]
fn out_of_reach_lets_live_objects_go_and_finishes_deletions() {
    use Dependents::*;
    let now = Instant::now();
    let out = |deleting, held, fg| Observed {
        in_reach: false,
        ..obs(deleting, held, fg, Shape::CompositeResource)
    };
    let m = |conversions| Memory {
        conversions,
        ..Memory::default()
    };
    let cases = [
        (
            out(false, true, false),
            0,
            NotLookedUp,
            Step::LetGo(LetGo::OutOfReach),
        ),
        (out(false, false, false), 0, NotLookedUp, Step::Wait),
        (out(true, true, false), 0, NotLookedUp, Step::Convert),
        (
            out(true, true, true),
            1,
            NotLookedUp,
            Step::LookUpDependents,
        ),
        (out(true, true, true), 1, Remaining(1), Step::Wait),
        (out(true, true, false), 1, Remaining(1), Step::Convert),
        (out(true, true, false), 1, None, Step::Release),
        (out(true, false, false), 0, NotLookedUp, Step::Wait),
    ];
    for (observed, conversions, deps, want) in cases {
        assert_eq!(
            next_step(observed, m(conversions), deps, now, TO_THE_END),
            want,
            "{observed:?} {conversions} {deps:?}"
        );
    }
}

/// An explicit Orphan (break-glass) is left alone: no conversion.
#[test]
fn an_orphaning_delete_is_let_go_not_converted() {
    let now = Instant::now();
    let orphaning = Observed {
        orphaning: true,
        ..obs(true, true, false, Shape::CompositeResource)
    };
    for conversions in [0, 1, 3] {
        let memory = Memory {
            conversions,
            ..Memory::default()
        };
        assert_eq!(
            next_step(orphaning, memory, Dependents::Remaining(2), now, TO_THE_END),
            Step::LetGo(LetGo::Orphaning)
        );
    }
    // Seen orphaning before: still left alone once `orphan` is gone.
    let orphaned = Memory {
        orphaned: true,
        ..Memory::default()
    };
    let done = Observed {
        orphaning: false,
        ..orphaning
    };
    assert_eq!(
        next_step(done, orphaned, Dependents::NotLookedUp, now, TO_THE_END),
        Step::LetGo(LetGo::Orphaning)
    );
    // Not held: not ours to touch.
    let unheld = Observed {
        held: false,
        ..orphaning
    };
    assert_eq!(
        next_step(
            unheld,
            Memory::default(),
            Dependents::NotLookedUp,
            now,
            TO_THE_END
        ),
        Step::Wait
    );
}

/// Uninstall carries a deleting object until the garbage collector's
/// foreground cascade holds it, converting it first if it must.
#[test]
fn uninstall_hands_over_to_the_garbage_collector() {
    let now = Instant::now();
    let xr = |fg| Observed {
        in_reach: false,
        ..obs(true, true, fg, Shape::CompositeResource)
    };
    let carry = Carry::ToTheGarbageCollector;
    let none = Memory::default();
    assert_eq!(
        next_step(xr(false), none, Dependents::NotLookedUp, now, carry),
        Step::Convert
    );
    assert_eq!(
        next_step(xr(true), none, Dependents::NotLookedUp, now, carry),
        Step::LetGo(LetGo::HandedOver)
    );
    // Live ones are let go as anywhere out of reach.
    let live = Observed {
        deleting: false,
        ..xr(false)
    };
    assert_eq!(
        next_step(live, none, Dependents::NotLookedUp, now, carry),
        Step::LetGo(LetGo::OutOfReach)
    );
}

#[test]
fn repeated_conversions_back_off() {
    let start = Instant::now();
    let xr = obs(true, true, false, Shape::CompositeResource);
    let after = |conversions, secs: f64| {
        let memory = Memory {
            conversions,
            last_conversion: Some(start),
            ..Memory::default()
        };
        next_step(
            xr,
            memory,
            Dependents::Remaining(1),
            start + Duration::from_secs_f64(secs),
            TO_THE_END,
        )
    };
    // The second conversion is not held back (the confirming round).
    assert_eq!(after(1, 0.0), Step::Convert);
    // Then 1 s, 2 s, 4 s ... at most 30 s since the last one.
    assert_eq!(after(2, 0.25), Step::Backoff(Duration::from_millis(750)));
    assert_eq!(after(2, 1.0), Step::Convert);
    assert_eq!(after(3, 1.0), Step::Backoff(Duration::from_secs(1)));
    assert_eq!(after(3, 2.5), Step::Convert);
    assert_eq!(after(20, 29.0), Step::Backoff(Duration::from_secs(1)));
    assert_eq!(after(20, 30.0), Step::Convert);
    let intervals: Vec<u64> = (0..10)
        .map(|n| reconversion_interval(n).as_secs())
        .collect();
    assert_eq!(intervals, [0, 0, 1, 2, 4, 8, 16, 30, 30, 30]);
}

#[test]
fn observed_reads_the_finalizers() {
    let f = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let o = Observed::new(
        true,
        &f(&[
            "x",
            FOREGROUND_CASCADE_FINALIZER,
            FOREGROUND_DELETION_FINALIZER,
        ]),
        true,
        Shape::Other,
    );
    assert!(o.held && o.in_foreground && o.deleting && !o.orphaning);
    let o = Observed::new(false, &f(&["x", ORPHAN_FINALIZER]), false, Shape::Other);
    assert!(!o.held && !o.in_foreground && o.orphaning && !o.in_reach);
}

#[test]
fn reach_follows_the_selectors() {
    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let team = |t: &str| -> Selector {
        let s: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector =
            serde_json::from_value(serde_json::json!({"matchLabels": {"team": t}}))
                .expect("selector");
        Selector::try_from(s).expect("valid")
    };
    let a = labels(&[("team", "a")]);
    let b = labels(&[("team", "b")]);
    assert!(Reach::Every.covers(&b));
    assert!(!Reach::Nothing.covers(&a));
    let selected = Reach::Selected(vec![team("a"), team("c")]);
    assert!(selected.covers(&a));
    assert!(!selected.covers(&b));
    assert!(!selected.covers(&labels(&[])));
}

/// Walks the machine through the life of an XR whose cascade is cut short
/// by a Background delete, with the API server's responses written out.
#[test]
fn a_stripped_cascade_is_converted_again_and_released_only_when_empty() {
    let now = Instant::now();
    let xr = |deleting, held, fg| obs(deleting, held, fg, Shape::CompositeResource);
    let mut memory = Memory::default();
    let step = |o, m, d| next_step(o, m, d, now, TO_THE_END);
    assert_eq!(
        step(xr(false, false, false), memory, Dependents::NotLookedUp),
        Step::AddFinalizer
    );
    // Someone deletes it with Background: terminating, held, no foregroundDeletion.
    assert_eq!(
        step(xr(true, true, false), memory, Dependents::NotLookedUp),
        Step::Convert
    );
    memory.conversions += 1;
    // Foreground is running: its composed resources are looked up (the
    // quiet clock), and it waits for them.
    assert_eq!(
        step(xr(true, true, true), memory, Dependents::NotLookedUp),
        Step::LookUpDependents
    );
    assert_eq!(
        step(xr(true, true, true), memory, Dependents::Remaining(2)),
        Step::Wait
    );
    // Stripped by a second Background delete while two composed resources remain.
    assert_eq!(
        step(xr(true, true, false), memory, Dependents::NotLookedUp),
        Step::LookUpDependents
    );
    assert_eq!(
        step(xr(true, true, false), memory, Dependents::Remaining(2)),
        Step::Convert
    );
    memory.conversions += 1;
    // The garbage collector finishes and clears foregroundDeletion.
    assert_eq!(
        step(xr(true, true, false), memory, Dependents::None),
        Step::Release
    );
}
/// A foreground cascade that shows nothing cascade-guard can see left is
/// restarted after RESTART_AFTER, then after growing waits; one that
/// waits for something, or stops running, stops the clock; half-way
/// through a restart the object is converted, not let go.
#[test]
fn a_quiet_foreground_cascade_is_restarted_after_growing_waits() {
    use Dependents::*;
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let running = |shape| obs(true, true, true, shape);
    let xr = Shape::CompositeResource;
    let converted = Memory {
        conversions: 1,
        ..Memory::default()
    };

    // The clock: (memory, what is seen, dependents, when) -> quiet since.
    let m = converted.seen(running(xr), NotLookedUp, at(0));
    assert_eq!(m.quiet_since, Option::None, "not looked up: no change");
    let m = m.seen(running(xr), Remaining(2), at(1));
    assert_eq!(m.quiet_since, Option::None, "waits for two");
    let m = m.seen(running(xr), None, at(5));
    assert_eq!(m.quiet_since, Some(at(5)));
    let m = m.seen(running(xr), Unknowable, at(9));
    assert_eq!(m.quiet_since, Some(at(5)), "keeps its start");
    let m2 = m.seen(running(xr), NotLookedUp, at(10));
    assert_eq!(m2.quiet_since, Some(at(5)));
    assert_eq!(
        m.seen(running(xr), Remaining(1), at(11)).quiet_since,
        Option::None
    );
    assert_eq!(
        m.seen(obs(true, true, false, xr), None, at(11)).quiet_since,
        Option::None,
        "cleared: no cascade running"
    );
    assert_eq!(
        m.seen(obs(true, false, true, xr), None, at(11)).quiet_since,
        Option::None,
        "not held"
    );
    // Other kinds: quiet from the start, whatever the lookup says.
    let other = converted.seen(running(Shape::Other), NotLookedUp, at(3));
    assert_eq!(other.quiet_since, Some(at(3)));

    // The schedule: (restarts, last restart, now) -> step.
    let quiet = |restarts: u32, last: Option<u64>| Memory {
        quiet_since: Some(at(0)),
        restarts,
        last_restart: last.map(at),
        ..converted
    };
    let cases = [
        (0, Option::None, 29, Step::Wait),
        (0, Option::None, 30, Step::RestartCascade),
        (1, Some(30), 89, Step::Wait),
        (1, Some(30), 90, Step::RestartCascade),
        (2, Some(90), 209, Step::Wait),
        (2, Some(90), 210, Step::RestartCascade),
        (5, Some(1000), 1959, Step::Wait),
        (5, Some(1000), 1960, Step::RestartCascade),
        (40, Some(1000), 1960, Step::RestartCascade),
    ];
    for (restarts, last, now, want) in cases {
        for shape in [xr, Shape::Other] {
            assert_eq!(
                next_step(
                    running(shape),
                    quiet(restarts, last),
                    None,
                    at(now),
                    TO_THE_END
                ),
                want,
                "{shape:?} restarts={restarts} last={last:?} at {now}"
            );
        }
    }
    // A restart before this quiet spell does not shorten the first wait.
    let earlier = Memory {
        quiet_since: Some(at(100)),
        restarts: 1,
        last_restart: Some(at(50)),
        ..converted
    };
    assert_eq!(earlier.restart_due(RESTART_AFTER), Some(at(130)));
    // A longer wait than the interval holds between restarts too.
    let long = Duration::from_secs(300);
    assert_eq!(quiet(1, Some(30)).restart_due(long), Some(at(330)));
    // An XR quiet since 0, looked at 500 s in: (dependents, carry) -> step.
    let off = Carry::ToTheEnd {
        restart_after: Option::None,
    };
    let long_quiet = [
        // Restarts can be turned off.
        (None, off, Step::Wait),
        // Still waiting for composed resources: never restarted.
        (Remaining(1), TO_THE_END, Step::Wait),
        // Uninstall hands a running cascade over, quiet or not.
        (
            None,
            Carry::ToTheGarbageCollector,
            Step::LetGo(LetGo::HandedOver),
        ),
    ];
    for (deps, carry, want) in long_quiet {
        assert_eq!(
            next_step(running(xr), quiet(0, Option::None), deps, at(500), carry),
            want,
            "{deps:?} {carry:?}"
        );
    }
    // Half-way through a restart (foregroundDeletion removed, the
    // Foreground delete not yet through): convert, for every kind,
    // whatever the count of cascades says.
    let half_way = Memory {
        conversions: 3,
        restarting: true,
        ..Memory::default()
    };
    for (shape, deps) in [(xr, None), (xr, NotLookedUp), (Shape::Other, NotLookedUp)] {
        assert_eq!(
            next_step(
                obs(true, true, false, shape),
                half_way,
                deps,
                at(0),
                TO_THE_END
            ),
            Step::Convert,
            "{shape:?} {deps:?}"
        );
    }
}
