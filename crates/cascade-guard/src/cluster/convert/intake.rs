//! Where each watch event of a Convert kind goes, so that memory follows the
//! deletions in progress rather than every protected object.
//!
//! A live object needs at most one write (adding cascade-guard's finalizer),
//! done straight from the watch; after that nothing happens to it until it is
//! deleted. So only objects being deleted (and the rare live object whose
//! finalizer could not be added, or that is to be let go) reach the
//! controller's cache and work queue. Those held are counted in a [`Census`]
//! of UIDs, 16 bytes each.
//!
//! Keeping only deleting objects in the cache is consistent because a
//! deletionTimestamp is never taken back: a cached object can only get further
//! into its deletion or go, and a newer object reusing the name arrives only
//! after the old one's Delete event.

use std::collections::HashSet;

use kube::runtime::watcher::Event;

use crate::policy::cascade::{Observed, Step, live_step};

/// What to do with one watch event.
#[derive(Debug)]
pub struct Sorted<K> {
    /// The event for the controller's cache (None: the cache has no use for it).
    pub pass: Option<Event<K>>,
    /// A live object that still needs cascade-guard's finalizer.
    pub needs_finalizer: Option<NeedsFinalizer<K>>,
}

/// A live object to add cascade-guard's finalizer to, and where it goes if
/// that fails.
#[derive(Debug, PartialEq)]
pub struct NeedsFinalizer<K> {
    pub object: K,
    during_relist: bool,
}

impl<K> NeedsFinalizer<K> {
    /// When the finalizer could not be added: the object goes to the
    /// controller (in the same phase of the watch), which retries with backoff.
    pub fn failed(self) -> Event<K> {
        if self.during_relist {
            Event::InitApply(self.object)
        } else {
            Event::Apply(self.object)
        }
    }
}

/// Sorts one event, given what its object shows (`observe`).
pub fn sort<K: Clone>(event: Event<K>, observe: impl Fn(&K) -> Observed) -> Sorted<K> {
    let live_step = |o: &K| {
        let observed = observe(o);
        (!observed.deleting).then(|| live_step(observed))
    };
    match event {
        Event::Apply(o) => match live_step(&o) {
            Some(Step::AddFinalizer) => Sorted {
                needs_finalizer: Some(NeedsFinalizer {
                    object: o.clone(),
                    during_relist: false,
                }),
                // Out of the cache, in case a failed add had put it there.
                pass: Some(Event::Delete(o)),
            },
            // Letting go is rare (a relabel, a kind leaving Convert): the
            // controller does it, with its retries.
            Some(Step::LetGo(_)) => Sorted {
                pass: Some(Event::Apply(o)),
                needs_finalizer: None,
            },
            Some(_) => Sorted {
                pass: Some(Event::Delete(o)),
                needs_finalizer: None,
            },
            None => Sorted {
                pass: Some(Event::Apply(o)),
                needs_finalizer: None,
            },
        },
        Event::InitApply(o) => match live_step(&o) {
            Some(Step::AddFinalizer) => Sorted {
                needs_finalizer: Some(NeedsFinalizer {
                    object: o,
                    during_relist: true,
                }),
                pass: None,
            },
            Some(Step::LetGo(_)) | None => Sorted {
                pass: Some(Event::InitApply(o)),
                needs_finalizer: None,
            },
            Some(_) => Sorted {
                pass: None,
                needs_finalizer: None,
            },
        },
        other => Sorted {
            pass: Some(other),
            needs_finalizer: None,
        },
    }
}

/// The UIDs of the objects that carry cascade-guard's finalizer, for the
/// gauge and to tell when a kind no longer Convert has nothing left held;
/// rebuilt on every relist like the controller's cache.
#[derive(Debug, Default)]
pub struct Census {
    current: HashSet<u128>,
    relisting: Option<HashSet<u128>>,
    /// A first list has completed: `current` is the whole kind.
    listed: bool,
}

impl Census {
    /// `held` tells whether an object carries the finalizer.
    pub fn observe<K>(
        &mut self,
        event: &Event<K>,
        uid: impl Fn(&K) -> Option<String>,
        held: impl Fn(&K) -> bool,
    ) {
        let key = |o: &K| uid(o).map(|u| compact_uid(&u));
        match event {
            Event::Apply(o) => {
                if let Some(k) = key(o) {
                    if held(o) {
                        self.current.insert(k);
                    } else {
                        self.current.remove(&k);
                    }
                }
            }
            Event::Delete(o) => {
                if let Some(k) = key(o) {
                    self.current.remove(&k);
                }
            }
            Event::Init => self.relisting = Some(HashSet::new()),
            Event::InitApply(o) => {
                if let (Some(k), Some(next)) = (key(o), self.relisting.as_mut())
                    && held(o)
                {
                    next.insert(k);
                }
            }
            Event::InitDone => {
                if let Some(mut next) = self.relisting.take() {
                    next.shrink_to_fit();
                    self.current = next;
                    self.listed = true;
                }
            }
        }
    }

    pub fn len(&self) -> usize {
        self.current.len()
    }

    /// Listed, and nothing held.
    pub fn is_empty(&self) -> bool {
        self.listed && self.current.is_empty()
    }
}

/// A UID as 16 bytes: the API server's UIDs are UUIDs. Anything else is
/// hashed (counting is all the census does, so a collision costs one count).
fn compact_uid(uid: &str) -> u128 {
    let hex: String = uid.chars().filter(|c| *c != '-').collect();
    if hex.len() == 32
        && let Ok(n) = u128::from_str_radix(&hex, 16)
    {
        return n;
    }
    // FNV-1a, 128-bit: stable and dependency-free.
    let mut h: u128 = 0x6c62272e07bb014262b821756295c58d;
    for b in uid.bytes() {
        h ^= u128::from(b);
        h = h.wrapping_mul(0x0000000001000000000000000000013B);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Shape;

    /// (name, deleting, held, in reach)
    type Obj = (&'static str, bool, bool, bool);
    /// (event in, event passed on, object that needs the finalizer)
    type Case = (Event<Obj>, Option<Event<Obj>>, Option<Obj>);

    fn observe(o: &Obj) -> Observed {
        Observed {
            deleting: o.1,
            held: o.2,
            in_foreground: false,
            orphaning: false,
            in_reach: o.3,
            shape: Shape::CompositeResource,
        }
    }

    #[test]
    fn the_table() {
        let live_unheld: Obj = ("a", false, false, true);
        let live_held: Obj = ("b", false, true, true);
        let deleting: Obj = ("c", true, true, true);
        let deleting_unheld: Obj = ("d", true, false, true);
        let out_held: Obj = ("e", false, true, false);
        let out_unheld: Obj = ("f", false, false, false);
        let out_deleting: Obj = ("g", true, true, false);
        let cases: Vec<Case> = vec![
            // Live objects leave (or never enter) the cache; unheld ones are held.
            (
                Event::Apply(live_unheld),
                Some(Event::Delete(live_unheld)),
                Some(live_unheld),
            ),
            (
                Event::Apply(live_held),
                Some(Event::Delete(live_held)),
                None,
            ),
            (Event::InitApply(live_unheld), None, Some(live_unheld)),
            (Event::InitApply(live_held), None, None),
            // Out of reach: held ones go to the controller to be let go; the
            // rest are left alone.
            (Event::Apply(out_held), Some(Event::Apply(out_held)), None),
            (
                Event::InitApply(out_held),
                Some(Event::InitApply(out_held)),
                None,
            ),
            (
                Event::Apply(out_unheld),
                Some(Event::Delete(out_unheld)),
                None,
            ),
            (Event::InitApply(out_unheld), None, None),
            // Deletions go to the controller, held or not, in reach or not
            // (it decides).
            (Event::Apply(deleting), Some(Event::Apply(deleting)), None),
            (
                Event::Apply(deleting_unheld),
                Some(Event::Apply(deleting_unheld)),
                None,
            ),
            (
                Event::InitApply(deleting),
                Some(Event::InitApply(deleting)),
                None,
            ),
            (
                Event::Apply(out_deleting),
                Some(Event::Apply(out_deleting)),
                None,
            ),
            (
                Event::Delete(live_held),
                Some(Event::Delete(live_held)),
                None,
            ),
            (Event::Delete(deleting), Some(Event::Delete(deleting)), None),
            // The relist's frame always passes, so the cache is rebuilt.
            (Event::Init, Some(Event::Init), None),
            (Event::InitDone, Some(Event::InitDone), None),
        ];
        for (event, pass, needs_finalizer) in cases {
            let label = format!("{event:?}");
            let sorted = sort(event, observe);
            // watcher::Event has no PartialEq; its Debug form says all.
            assert_eq!(format!("{:?}", sorted.pass), format!("{pass:?}"), "{label}");
            assert_eq!(
                sorted.needs_finalizer.map(|h| h.object),
                needs_finalizer,
                "{label}"
            );
        }
    }

    #[test]
    fn a_failed_finalizer_add_goes_to_the_controller_in_the_same_phase() {
        let o: Obj = ("a", false, false, true);
        let failed = |e: Event<Obj>| {
            let failed = sort(e, observe).needs_finalizer.map(NeedsFinalizer::failed);
            format!("{:?}", failed.expect("a live object without it needs it"))
        };
        assert_eq!(failed(Event::Apply(o)), format!("{:?}", Event::Apply(o)));
        assert_eq!(
            failed(Event::InitApply(o)),
            format!("{:?}", Event::InitApply(o))
        );
    }

    /// (uid, held)
    type Entry = (&'static str, bool);

    fn uid(o: &Entry) -> Option<String> {
        Some(o.0.to_string())
    }

    fn held(o: &Entry) -> bool {
        o.1
    }

    #[test]
    fn census_follows_finalizer_adds_deletes_and_relists() {
        let a = ("0b4c9f7e-3d6a-4f0e-9a53-3c1f0c2e8d11", true);
        let b = ("1b4c9f7e-3d6a-4f0e-9a53-3c1f0c2e8d11", true);
        let c = ("not-a-uuid", true);
        let mut census = Census::default();
        census.observe(&Event::Apply(a), uid, held);
        census.observe(&Event::Apply(a), uid, held);
        census.observe(&Event::Apply(b), uid, held);
        assert_eq!(census.len(), 2);
        // Not listed yet: never "empty", whatever the count.
        assert!(!census.is_empty());
        census.observe(&Event::Delete(a), uid, held);
        assert_eq!(census.len(), 1);
        // Let go: no longer counted.
        census.observe(&Event::Apply((b.0, false)), uid, held);
        assert_eq!(census.len(), 0);
        // A relist replaces the count only when complete, and counts only
        // what is held.
        census.observe(&Event::Init, uid, held);
        census.observe(&Event::InitApply(a), uid, held);
        census.observe(&Event::InitApply(c), uid, held);
        census.observe(&Event::InitApply((b.0, false)), uid, held);
        assert_eq!(census.len(), 0);
        census.observe(&Event::InitDone, uid, held);
        assert_eq!(census.len(), 2);
        census.observe(&Event::Delete(c), uid, held);
        census.observe(&Event::Delete(a), uid, held);
        assert!(census.is_empty());
    }

    #[test]
    fn uuids_pack_into_16_bytes_and_others_hash() {
        assert_eq!(compact_uid("00000000-0000-0000-0000-00000000000a"), 10u128);
        assert_ne!(compact_uid("x"), compact_uid("y"));
        assert_eq!(compact_uid("x"), compact_uid("x"));
    }
}
