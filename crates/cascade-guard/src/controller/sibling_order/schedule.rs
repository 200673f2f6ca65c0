//! When sibling order looks, and which trees a look reads first: pure.

use std::time::Duration;

/// How often the loop looks.
pub(crate) const TICK: Duration = Duration::from_secs(1);
/// How often it looks while a tree it holds is being deleted: the next wave
/// waits for the hold to be let go, so this is the latency it adds per
/// level of a teardown (Crossplane's Usage adds up to 30 s) when what goes
/// is of a kind it watches; ACTIVE_EVERY when not.
pub(crate) const TEARDOWN_TICK: Duration = Duration::from_millis(200);
/// How often an active tree (being deleted, writes to make) is read again
/// while nothing of it the watches see changes: for what no watch follows.
pub(crate) const ACTIVE_EVERY: Duration = Duration::from_secs(1);
/// The longest pause between two looks.
pub(crate) const MAX_PAUSE: Duration = Duration::from_secs(10);
/// Resyncs are taken at most this often.
pub(crate) const QUIET_LOOK: Duration = Duration::from_secs(10);
/// A tree this young (seconds since its root was created) is read again
/// every SETTLE_EVERY though nothing of it the index sees changed.
pub(crate) const SETTLING_SECS: i64 = 120;
/// How often a young tree is read again while nothing else makes it due.
/// Read every look, twenty young trees in a teardown's 200-ms looks were a
/// hundred reads a second, and under a loaded CI each look took up to a
/// minute.
pub(crate) const SETTLE_EVERY: Duration = Duration::from_secs(3);
/// How often sibling order's policies (the hold policy, the record guard,
/// the gate) are read back, to put back an edit. Read every look, under a
/// loaded API server their GETs took seconds of each look.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(5);
/// The ProviderConfigs (for those made outside a tree on its Secrets) are
/// listed for the looks at most this often: one made since counts from the
/// next list. Listed every look, a teardown's 200-ms looks listed every
/// ProviderConfig kind five times a second.
pub(crate) const CONFIGS_EVERY: Duration = Duration::from_secs(10);
/// Discovery (which kinds exist, in which versions) is read again this often.
pub(crate) const DISCOVERY_EVERY: Duration = Duration::from_secs(30);
/// After a start, what a root that has left held stays held until every
/// tree was read once, but no longer than this: a tree that cannot be read
/// must not keep another's holds for ever.
pub(crate) const FIRST_READS_KEEP_HOLDS: Duration = Duration::from_secs(600);
/// A look that takes longer than this is logged.
pub(crate) const SLOW_LOOK: Duration = Duration::from_secs(10);
/// How many trees are read at once in a look.
pub(crate) const READS_AT_ONCE: usize = 8;
/// How many trees are read before they are written: the reads overlap, and
/// what is held in memory stays bounded.
pub(crate) const READ_BATCH: usize = 32;
/// The most trees one look reads. The rest stay due and are read by the next
/// looks, in rank: a look over 100,000 new roots would otherwise take minutes
/// before a tree being deleted is read again. Most of a look this long reads
/// roots by list (see LIST_FROM).
pub(crate) const READS_PER_LOOK: usize = 4096;
/// The most roots one look fetches one at a time (a GET each).
pub(crate) const FETCHES_PER_LOOK: usize = 512;
/// From this many due roots of one kind on, a look lists the kind for them
/// rather than fetching each.
pub(crate) const LIST_FROM: usize = 64;
/// The most trees one look reads only because their resync is due: with
/// 100,000 roots, reading each every resync period (300 s) would be 330
/// reads a second at rest; this makes a full resync longer instead.
pub(crate) const RESYNCS_PER_LOOK: usize = 32;

/// What the loop remembers of a root's last read, as it bears on the next.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Last {
    /// Its resourceVersion is not the one read, or a Usage naming it changed.
    pub changed: bool,
    /// Being deleted or with writes to make when last read, or young and
    /// not read for SETTLE_EVERY.
    pub active: bool,
    /// Not read for a resync period.
    pub resync_due: bool,
}

/// Whether a root's tree is read this look, and how soon: 0 being deleted,
/// 1 never read (those are what a late look costs), 2 changed or active,
/// 3 only its resync due.
pub(crate) fn rank(deleting: bool, last: Option<Last>) -> Option<u8> {
    match last {
        _ if deleting => Some(0),
        None => Some(1),
        Some(l) if l.changed || l.active => Some(2),
        Some(l) if l.resync_due => Some(3),
        Some(_) => None,
    }
}

/// Keeps what one look reads of `due`, sorted by rank.
pub(crate) fn take_this_look<T>(due: &mut Vec<T>, rank: impl Fn(&T) -> u8) {
    let mut resyncs = 0;
    due.retain(|d| {
        if rank(d) < 3 {
            return true;
        }
        resyncs += 1;
        resyncs <= RESYNCS_PER_LOOK
    });
    due.truncate(READS_PER_LOOK);
}

/// The pause after a look. A look reads up to READS_PER_LOOK trees, which
/// takes a while when very many are due at once (100,000 new objects of
/// ordered kinds) or the API server is slow: the pause grows with the look,
/// so that the loop reads for at most half of the time (four fifths while a
/// tree is torn down, where the pause is what each level of the teardown
/// waits, or while trees are left due from the last look: a start's first
/// read of every tree is what the gate refuses deletes for), but never past
/// MAX_PAUSE: a new tree waits for the look after the pause, and a pause as
/// long as a 216-s look under a loaded CI kept new trees from their holds
/// for seven minutes. `tearing_down` is either.
pub(crate) fn pause(tearing_down: bool, look: Duration) -> Duration {
    if tearing_down {
        TEARDOWN_TICK.max(look / 4).min(MAX_PAUSE / 4)
    } else {
        TICK.max(look).min(MAX_PAUSE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_trees_a_look_reads_first() {
        let last = |changed, active, resync_due| {
            Some(Last {
                changed,
                active,
                resync_due,
            })
        };
        let cases = [
            (true, None, Some(0)),
            (true, last(false, false, false), Some(0)),
            (false, None, Some(1)),
            (false, last(true, false, false), Some(2)),
            (false, last(false, true, false), Some(2)),
            (false, last(true, true, true), Some(2)),
            (false, last(false, false, true), Some(3)),
            (false, last(false, false, false), None),
        ];
        for (deleting, last, want) in cases {
            assert_eq!(rank(deleting, last), want);
        }
    }

    #[test]
    fn the_pause_grows_with_the_look_up_to_a_bound() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // (tearing down, look) -> pause
        let cases = [
            (false, ms(50), s(1)),
            (false, s(4), s(4)),
            (false, s(216), s(10)),
            (true, ms(50), ms(200)),
            (true, s(4), s(1)),
            (true, s(216), ms(2500)),
        ];
        for (tearing_down, look, want) in cases {
            assert_eq!(pause(tearing_down, look), want, "{tearing_down} {look:?}");
        }
    }

    #[test]
    fn a_look_reads_a_bounded_number_of_trees_and_few_resyncs() {
        // Sorted by rank, as the look sorts them.
        let mut due: Vec<u8> = [vec![0; 3], vec![1; 10], vec![2; 5], vec![3; 100]].concat();
        take_this_look(&mut due, |r| *r);
        assert_eq!(due.len(), 3 + 10 + 5 + RESYNCS_PER_LOOK);
        let mut many: Vec<u8> = [vec![1; 2 * READS_PER_LOOK], vec![3; 10]].concat();
        take_this_look(&mut many, |r| *r);
        assert_eq!(many.len(), READS_PER_LOOK);
        assert!(many.iter().all(|r| *r == 1));
    }
}
