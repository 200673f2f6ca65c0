//! Which objects of a batch a tree's read lists by kind and which it GETs
//! one by one (pure). A GET costs a round trip per object; a list brings a
//! page of objects in one, but every other object of the kind where it
//! looks as well, so it is used only where enough are wanted, and stopped
//! once it has brought more than GETs of the rest would cost.

use std::collections::BTreeMap;

/// From this many objects of one kind in one namespace (or spread over
/// several), a list; below it, a GET each.
pub(super) const LIST_FROM: usize = 8;
/// How many objects a list may bring per object wanted before the GETs of
/// the rest: a list of 2,000 ConfigMaps took as long as 30 to 70 GETs 16 at
/// once (BENCHMARKS.md, "plan of 4,904 objects read by kind"), so a list
/// that brings its whole budget in vain costs less than half the GETs that
/// follow it; 8 wanted bring one page of 128 at most.
pub(super) const LIST_PAYS: usize = 16;
/// The most objects a page of a list brings: a page is held whole while it
/// is read, and pages of 250 took as long as pages of 500.
pub(super) const PAGE: usize = 250;

/// One object wanted: its kind (any identity), whether the kind is
/// namespaced, the namespace to look in (None for a cluster-scoped kind, or
/// when none is named) and its name.
#[derive(Clone, Debug)]
pub(super) struct Wanted<K> {
    pub kind: K,
    pub namespaced: bool,
    pub namespace: Option<String>,
    pub name: String,
}

/// How some of a batch are read: a list of `kind` in `namespace` (None:
/// a cluster-scoped kind, or every namespace) for the wanted objects at
/// `members`, or a GET of the one at an index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Read<K> {
    List {
        kind: K,
        namespace: Option<String>,
        members: Vec<usize>,
    },
    Get(usize),
}

/// How to read `wanted`: a list for each kind and namespace with at least
/// [`LIST_FROM`] of them, one across every namespace for the rest of a kind
/// when they are that many together, a GET for each other one. Kinds that
/// `listable` refuses (a list refused earlier) and namespaced objects named
/// without a namespace are always fetched by a GET, as they would be
/// alone. The lists come first, the largest first (its pages come one after
/// another), then the GETs in the order wanted.
pub(super) fn reads<K: Clone + Ord>(
    wanted: &[Wanted<K>],
    listable: impl Fn(&K) -> bool,
) -> Vec<Read<K>> {
    let mut by_kind: BTreeMap<&K, BTreeMap<Option<&str>, Vec<usize>>> = BTreeMap::new();
    let mut gets = Vec::new();
    for (i, w) in wanted.iter().enumerate() {
        if !listable(&w.kind) || (w.namespaced && w.namespace.is_none()) {
            gets.push(i);
            continue;
        }
        let namespace = w.namespace.as_deref().filter(|_| w.namespaced);
        by_kind
            .entry(&w.kind)
            .or_default()
            .entry(namespace)
            .or_default()
            .push(i);
    }
    let mut lists = Vec::new();
    for (kind, by_namespace) in by_kind {
        let mut spread = Vec::new();
        for (namespace, members) in by_namespace {
            if members.len() >= LIST_FROM {
                lists.push(Read::List {
                    kind: kind.clone(),
                    namespace: namespace.map(str::to_string),
                    members,
                });
            } else {
                spread.extend(members);
            }
        }
        // A cluster-scoped kind's few are all in the one group above.
        let namespaced = spread.first().is_some_and(|&i| wanted[i].namespaced);
        if namespaced && spread.len() >= LIST_FROM {
            spread.sort_unstable();
            lists.push(Read::List {
                kind: kind.clone(),
                namespace: None,
                members: spread,
            });
        } else {
            gets.extend(spread);
        }
    }
    lists.sort_by_key(|r| match r {
        Read::List { members, .. } => std::cmp::Reverse(members.len()),
        Read::Get(_) => std::cmp::Reverse(0),
    });
    gets.sort_unstable();
    lists
        .into_iter()
        .chain(gets.into_iter().map(Read::Get))
        .collect()
}

/// The page size of a list for `wanted` objects: no more than it may bring.
pub(super) fn page_size(wanted: usize) -> usize {
    wanted.saturating_mul(LIST_PAYS).clamp(1, PAGE)
}

/// Whether a list for `wanted` objects, `still_wanted` of them not found in
/// the `listed` it brought so far, lists its next page; else the rest are
/// fetched by GETs.
pub(super) fn list_on(listed: usize, wanted: usize, still_wanted: usize) -> bool {
    still_wanted > 0 && listed < wanted.saturating_mul(LIST_PAYS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(kind: &'static str, namespace: Option<&str>, name: &str) -> Wanted<&'static str> {
        Wanted {
            kind,
            namespaced: kind != "Cluster",
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
        }
    }

    /// `n` objects of `kind` in `namespace`, named `prefix-<i>`.
    fn many(kind: &'static str, namespace: Option<&str>, n: usize) -> Vec<Wanted<&'static str>> {
        (0..n)
            .map(|i| w(kind, namespace, &format!("{kind}-{i}")))
            .collect()
    }

    fn list(
        kind: &'static str,
        namespace: Option<&str>,
        members: Vec<usize>,
    ) -> Read<&'static str> {
        Read::List {
            kind,
            namespace: namespace.map(str::to_string),
            members,
        }
    }

    fn gets(indices: impl IntoIterator<Item = usize>) -> Vec<Read<&'static str>> {
        indices.into_iter().map(Read::Get).collect()
    }

    #[test]
    fn enough_of_a_kind_in_a_namespace_are_listed_the_rest_fetched_one_by_one() {
        let below = LIST_FROM - 1;
        // (what, wanted, how they are read)
        type Case = (
            &'static str,
            Vec<Wanted<&'static str>>,
            Vec<Read<&'static str>>,
        );
        let cases: Vec<Case> = vec![
            ("nothing", vec![], vec![]),
            (
                "a few: GETs",
                many("ConfigMap", Some("a"), below),
                gets(0..below),
            ),
            (
                "enough: one list",
                many("ConfigMap", Some("a"), LIST_FROM),
                vec![list("ConfigMap", Some("a"), (0..LIST_FROM).collect())],
            ),
            (
                "two kinds: the larger list first, the few by GETs",
                [
                    many("Secret", Some("a"), LIST_FROM),
                    many("ConfigMap", Some("a"), LIST_FROM + 1),
                    many("Service", Some("a"), 2),
                ]
                .concat(),
                [
                    vec![
                        list(
                            "ConfigMap",
                            Some("a"),
                            (LIST_FROM..2 * LIST_FROM + 1).collect(),
                        ),
                        list("Secret", Some("a"), (0..LIST_FROM).collect()),
                    ],
                    gets(2 * LIST_FROM + 1..2 * LIST_FROM + 3),
                ]
                .concat(),
            ),
            (
                "a few in each of two namespaces, enough together: one list across namespaces",
                [
                    many("ConfigMap", Some("a"), below),
                    many("ConfigMap", Some("b"), 1),
                ]
                .concat(),
                vec![list("ConfigMap", None, (0..LIST_FROM).collect())],
            ),
            (
                "a namespace with enough listed there, the few elsewhere by GETs",
                [
                    many("ConfigMap", Some("a"), LIST_FROM),
                    many("ConfigMap", Some("b"), 2),
                ]
                .concat(),
                [
                    vec![list("ConfigMap", Some("a"), (0..LIST_FROM).collect())],
                    gets(LIST_FROM..LIST_FROM + 2),
                ]
                .concat(),
            ),
            (
                "a cluster-scoped kind, named with a namespace or not: one list",
                [many("Cluster", Some("a"), 2), many("Cluster", None, below)].concat(),
                vec![list("Cluster", None, (0..LIST_FROM + 1).collect())],
            ),
            (
                "namespaced, named without a namespace: GETs, as alone",
                many("ConfigMap", None, LIST_FROM),
                gets(0..LIST_FROM),
            ),
        ];
        for (what, wanted, want) in cases {
            assert_eq!(reads(&wanted, |_| true), want, "{what}");
        }
    }

    #[test]
    fn a_kind_whose_list_was_refused_is_fetched_by_gets() {
        let wanted = [
            many("Secret", Some("a"), LIST_FROM),
            many("ConfigMap", Some("a"), LIST_FROM),
        ]
        .concat();
        assert_eq!(
            reads(&wanted, |k| *k != "Secret"),
            [
                vec![list(
                    "ConfigMap",
                    Some("a"),
                    (LIST_FROM..2 * LIST_FROM).collect()
                )],
                gets(0..LIST_FROM),
            ]
            .concat()
        );
    }

    #[test]
    fn a_list_pages_on_while_it_brings_less_than_gets_of_the_rest_would_cost() {
        // (listed so far, wanted, still wanted, list on)
        let cases = [
            (0, 10, 10, true),
            (10 * LIST_PAYS - 1, 10, 1, true),
            (10 * LIST_PAYS, 10, 1, false),
            (500, 2_000, 1_500, true),
            (500, 2_000, 0, false),
        ];
        for (listed, wanted, still, want) in cases {
            assert_eq!(
                list_on(listed, wanted, still),
                want,
                "{listed} listed, {still} of {wanted} still wanted"
            );
        }
        let sizes = [
            (0, 1),
            (1, LIST_PAYS),
            (LIST_FROM, LIST_FROM * LIST_PAYS),
            (5_000, PAGE),
        ];
        for (wanted, want) in sizes {
            assert_eq!(page_size(wanted), want, "{wanted} wanted");
        }
    }
}
