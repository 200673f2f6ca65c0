//! Whether what a root held stays held once the root is no longer seen as
//! one: pure, for the loop's look over its holds.

use std::collections::HashSet;
use std::time::Duration;

use super::schedule::FIRST_READS_KEEP_HOLDS;

/// What one look knows that decides whether a root has left.
pub(super) struct Sight<'a> {
    /// The ordered kinds, `Kind.group`.
    pub ordered: &'a HashSet<String>,
    /// The ordered kinds whose watch has listed them.
    pub listed: &'a HashSet<String>,
    /// Every ordered kind is listed.
    pub listed_all: bool,
    /// The first reads after a start are still going ([`first_reads`]).
    pub first_reads: bool,
}

/// Whether the first reads after a start keep what roots that left held:
/// the index knows no tree as it was before the start, and an orphaning
/// delete just before it made roots of what the old root controlled; only
/// their first reads take over what they need. Until every tree was read
/// once, or for [`FIRST_READS_KEEP_HOLDS`].
pub(super) fn first_reads(read_every_tree: bool, since_start: Duration) -> bool {
    !read_every_tree && since_start < FIRST_READS_KEEP_HOLDS
}

/// Whether what `root` (of `root_kind`, `Kind.group`; empty when taken in
/// from an old label) held stays held. A root no longer seen as one is
/// taken as gone only where its kind is listed: a kind that cannot be
/// listed keeps its own roots' holds.
pub(super) fn stays_held(sight: &Sight, is_root: bool, root_kind: &str) -> bool {
    if is_root || sight.first_reads {
        return true;
    }
    let gone = if root_kind.is_empty() {
        // Its kind is not known: gone once every ordered kind is listed.
        sight.listed_all
    } else if !sight.ordered.contains(root_kind) {
        true
    } else {
        sight.listed.contains(root_kind)
    };
    !gone
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table() {
        let ordered: HashSet<String> = ["Fleet.x.dev".into(), "Region.x.dev".into()].into();
        let listed: HashSet<String> = ["Fleet.x.dev".into()].into();
        // (is_root, kind, listed_all, first_reads) -> stays held
        let cases = [
            (true, "Fleet.x.dev", true, false, true),
            // Gone, its kind listed: let go, but not during the first reads.
            (false, "Fleet.x.dev", true, false, false),
            (false, "Fleet.x.dev", true, true, true),
            // Its kind not listed (yet, or without RBAC): kept.
            (false, "Region.x.dev", false, false, true),
            // Its kind no longer ordered: let go, but not during the first reads.
            (false, "Other.x.dev", true, false, false),
            (false, "Other.x.dev", false, true, true),
            // From an old label, kind unknown: let go once everything is listed.
            (false, "", false, false, true),
            (false, "", true, false, false),
            (false, "", true, true, true),
        ];
        for (is_root, kind, listed_all, first_reads, want) in cases {
            let sight = Sight {
                ordered: &ordered,
                listed: &listed,
                listed_all,
                first_reads,
            };
            assert_eq!(
                stays_held(&sight, is_root, kind),
                want,
                "root {is_root}, kind {kind:?}, listed all {listed_all}, first reads {first_reads}"
            );
        }
    }

    #[test]
    fn the_first_reads_keep_holds_until_every_tree_is_read_or_for_a_bound() {
        assert!(first_reads(false, Duration::ZERO));
        assert!(first_reads(
            false,
            FIRST_READS_KEEP_HOLDS - Duration::from_secs(1)
        ));
        assert!(!first_reads(false, FIRST_READS_KEEP_HOLDS));
        assert!(!first_reads(true, Duration::ZERO));
    }
}
