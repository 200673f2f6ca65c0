//! The index driven as the watches drive it: objects pushed in, the looks
//! asserted.

use std::time::Duration;

use super::super::schedule;
use super::*;

fn xr() -> KindKey {
    ("example.org".into(), "XCluster".into())
}

fn usage_kind() -> KindKey {
    ("protection.crossplane.io".into(), "Usage".into())
}

fn object(uid: &str, rv: &str) -> Meta {
    Meta {
        uid: uid.into(),
        rv: rv.into(),
        name: format!("name-{uid}"),
        namespace: Some("ns".into()),
        ..Meta::default()
    }
}

fn controlled(uid: &str, rv: &str, by: &str) -> Meta {
    Meta {
        controllers: vec![(xr(), by.into())],
        owners: vec![by.into()],
        ..object(uid, rv)
    }
}

/// An index watching `xr()` (every object) and Usages, each listed with
/// `objects`.
fn listed(objects: Vec<Meta>) -> Index {
    let mut index = Index::default();
    index.set_kinds(&[(xr(), Vec::new())], &[usage_kind()]);
    index.apply(&xr(), 1, IndexEvent::Listing);
    for o in objects {
        index.apply(&xr(), 1, IndexEvent::Listed(o));
    }
    index.apply(&xr(), 1, IndexEvent::ListDone);
    index.apply(&usage_kind(), 1, IndexEvent::Listing);
    index.apply(&usage_kind(), 1, IndexEvent::ListDone);
    index
}

fn due(look: &Look) -> Vec<(&str, u8)> {
    look.due.iter().map(|d| (d.uid.as_str(), d.rank)).collect()
}

/// Selects `team=<name>`.
fn team(name: &str) -> Selector {
    Selector::from_iter([kube::core::Expression::Equal("team".into(), name.into())])
}

const RESYNC: Duration = Duration::from_secs(300);

fn tree(active: bool, members: &[&str]) -> TreeState {
    TreeState {
        active,
        settling: false,
        alone: members.is_empty(),
        members: members.iter().map(|m| m.to_string()).collect(),
        outside: Vec::new(),
        needed_outside: Vec::new(),
        configs: Vec::new(),
    }
}

#[test]
fn a_new_root_is_due_once_and_again_only_when_it_changes() {
    let now = Instant::now();
    let mut index = listed(vec![object("a", "1")]);
    let look = index.look(now, RESYNC);
    assert_eq!(due(&look), [("a", 1)]);
    assert!(look.listed_all);
    index.read("a", 1, now, tree(false, &[]));
    assert_eq!(due(&index.look(now, RESYNC)), []);
    assert!(!index.busy());
    // The same object again (a relist): nothing due.
    index.apply(&xr(), 1, IndexEvent::Applied(object("a", "1")));
    assert_eq!(due(&index.look(now, RESYNC)), []);
    index.apply(&xr(), 1, IndexEvent::Applied(object("a", "2")));
    assert_eq!(due(&index.look(now, RESYNC)), [("a", 2)]);
    let deleting = Meta {
        deleting: true,
        ..object("a", "3")
    };
    index.read("a", 2, now, tree(false, &[]));
    index.apply(&xr(), 1, IndexEvent::Applied(deleting));
    assert_eq!(due(&index.look(now, RESYNC)), [("a", 0)]);
}

#[test]
fn what_a_root_controls_is_no_root_until_its_controller_is_gone() {
    let now = Instant::now();
    let mut index = listed(vec![object("root", "1"), controlled("nested", "1", "root")]);
    assert_eq!(due(&index.look(now, RESYNC)), [("root", 1)]);
    assert!(!index.is_root("nested"));
    index.read("root", 1, now, tree(false, &["nested"]));
    // An orphan delete of the root: what it controlled begins a tree. The
    // root is told left (and what it held let go) only once that tree was
    // read, which holds again what it needs.
    index.apply(&xr(), 1, IndexEvent::Deleted("root".into()));
    let look = index.look(now, RESYNC);
    assert_eq!(due(&look), [("nested", 1)]);
    assert!(look.left.is_empty());
    let look = index.look(now, RESYNC);
    assert!(
        look.left.is_empty(),
        "told left before the nested tree was read"
    );
    index.read("nested", 1, now, tree(false, &[]));
    let look = index.look(now, RESYNC);
    assert_eq!(look.left, ["root"]);
    assert_eq!(due(&look), []);
}

#[test]
fn a_root_that_leaves_no_unread_tree_behind_is_told_left_at_once() {
    let now = Instant::now();
    let mut index = listed(vec![object("root", "1"), controlled("nested", "1", "root")]);
    index.look(now, RESYNC);
    index.read("root", 1, now, tree(false, &["nested"]));
    // A foreground cascade: the nested object goes before its root.
    index.apply(&xr(), 1, IndexEvent::Deleted("nested".into()));
    index.apply(&xr(), 1, IndexEvent::Deleted("root".into()));
    let look = index.look(now, RESYNC);
    assert_eq!(look.left, ["root"]);
}

#[test]
fn a_controller_of_a_kind_not_ordered_proves_nothing() {
    let mut index = listed(vec![Meta {
        controllers: vec![(("other.org".into(), "Claim".into()), "c1".into())],
        ..object("x", "1")
    }]);
    assert!(!index.is_root("x"));
    assert_eq!(due(&index.look(Instant::now(), RESYNC)), []);
}

#[test]
fn nothing_is_due_or_left_until_every_kind_is_listed() {
    let now = Instant::now();
    let mut index = Index::default();
    index.set_kinds(&[(xr(), Vec::new())], &[]);
    index.apply(&xr(), 1, IndexEvent::Listing);
    index.apply(&xr(), 1, IndexEvent::Listed(object("a", "1")));
    let look = index.look(now, RESYNC);
    assert_eq!(due(&look), []);
    assert!(!look.listed_all);
    index.apply(&xr(), 1, IndexEvent::ListDone);
    assert_eq!(due(&index.look(now, RESYNC)), [("a", 1)]);
    index.read("a", 1, now, tree(false, &[]));
    // The watch fails: the root is neither due nor left.
    index.apply(&xr(), 1, IndexEvent::Failed("forbidden".into()));
    index.apply(&xr(), 1, IndexEvent::Applied(object("a", "2")));
    let look = index.look(now, RESYNC);
    assert_eq!(
        (due(&look), look.left.len(), look.listed_all),
        (vec![], 0, false)
    );
    assert!(matches!(index.sync_of(&xr()), Some(Sync::Failing(_))));
    // Listed again, without it: it left; its change was never lost.
    index.apply(&xr(), 1, IndexEvent::Listing);
    index.apply(&xr(), 1, IndexEvent::Listed(object("b", "1")));
    index.apply(&xr(), 1, IndexEvent::ListDone);
    let look = index.look(now, RESYNC);
    assert_eq!(due(&look), [("b", 1)]);
    assert_eq!(look.left, ["a"]);
    assert!(!index.is_root("a"));
}

#[test]
fn a_root_relabelled_out_of_its_policy_leaves_and_back_in_is_due() {
    let now = Instant::now();
    let selector = team("a");
    let mut index = Index::default();
    index.set_kinds(&[(xr(), vec![selector])], &[]);
    let labelled = |rv: &str, team: &str| Meta {
        labels: [("team".to_string(), team.to_string())].into(),
        ..object("a", rv)
    };
    index.apply(&xr(), 1, IndexEvent::Listing);
    index.apply(&xr(), 1, IndexEvent::Listed(labelled("1", "a")));
    index.apply(&xr(), 1, IndexEvent::ListDone);
    assert_eq!(due(&index.look(now, RESYNC)), [("a", 1)]);
    index.read("a", 1, now, tree(false, &[]));
    index.apply(&xr(), 1, IndexEvent::Applied(labelled("2", "b")));
    let look = index.look(now, RESYNC);
    assert_eq!(
        (due(&look), look.left.clone()),
        (vec![], vec!["a".to_string()])
    );
    index.apply(&xr(), 1, IndexEvent::Applied(labelled("3", "a")));
    assert_eq!(due(&index.look(now, RESYNC)), [("a", 1)]);
    // The kind's policy changes its selector: selected again at once.
    index.read("a", 3, now, tree(false, &[]));
    index.set_kinds(&[(xr(), vec![team("b")])], &[]);
    assert_eq!(index.look(now, RESYNC).left, ["a"]);
}

#[test]
fn a_kind_no_longer_ordered_takes_its_roots_with_it() {
    let now = Instant::now();
    let mut index = listed(vec![object("a", "1")]);
    index.look(now, RESYNC);
    index.read("a", 1, now, tree(false, &[]));
    index.set_kinds(&[], &[]);
    let look = index.look(now, RESYNC);
    assert_eq!(look.left, ["a"]);
    assert!(look.listed_all);
}

#[test]
fn a_new_or_changed_usage_makes_its_users_tree_due() {
    let now = Instant::now();
    let mut index = listed(vec![object("cluster", "1"), object("gateway", "1")]);
    index.look(now, RESYNC);
    index.read("cluster", 1, now, tree(false, &["stack"]));
    index.read("gateway", 1, now, tree(false, &[]));
    let usage = |rv: &str, owners: &[&str]| Meta {
        owners: owners.iter().map(|o| o.to_string()).collect(),
        ..object("u1", rv)
    };
    // (its version, its owners) -> the roots made due
    let cases: [(&str, &[&str], &[&str]); 6] = [
        ("5", &["gateway"], &["gateway"]),
        ("5", &["gateway"], &[]),
        ("6", &["stack"], &["cluster"]),
        ("7", &["unknown"], &[]),
        ("8", &[], &[]),
        ("9", &["gateway", "stack"], &["cluster", "gateway"]),
    ];
    for (rv, owners, want) in cases {
        index.apply(&usage_kind(), 1, IndexEvent::Applied(usage(rv, owners)));
        let look = index.look(now, RESYNC);
        let got: Vec<&str> = look.due.iter().map(|d| d.uid.as_str()).collect();
        assert_eq!(got, want, "{rv} {owners:?}");
        assert!(look.due.iter().all(|d| d.rank == 2));
    }
}

/// A tree of `members`, read with `outside` around it, of which it needs
/// `needed`.
fn around(members: &[&str], outside: &[&str], needed: &[&str]) -> TreeState {
    let strings = |s: &[&str]| s.iter().map(|m| m.to_string()).collect::<Vec<_>>();
    TreeState {
        outside: strings(outside),
        needed_outside: strings(needed),
        ..tree(false, members)
    }
}

#[test]
fn a_tree_needing_another_trees_object_makes_that_tree_due_once() {
    let now = Instant::now();
    let mut index = listed(vec![object("cluster", "1"), object("gateway", "1")]);
    index.look(now, RESYNC);
    // The gateway's Release needs the cluster's ProviderConfig; the
    // cluster's read finds the Release as its outside user.
    let gateway = || around(&["release"], &["pc"], &["pc"]);
    let cluster = || around(&["pc", "secret"], &["release"], &[]);
    // Read before the cluster: the ProviderConfig is nobody's yet, so the
    // need makes nothing due.
    index.read("gateway", 1, now, gateway());
    index.read("cluster", 1, now, cluster());
    assert_eq!(due(&index.look(now, RESYNC)), []);
    // The gateway read again (its root changed): the cluster is due though
    // it did not change, and the gateway's read of the ProviderConfig did
    // not take it from the cluster.
    index.apply(&xr(), 1, IndexEvent::Applied(object("gateway", "2")));
    assert_eq!(due(&index.look(now, RESYNC)), [("gateway", 2)]);
    index.read("gateway", 2, now, gateway());
    assert_eq!(due(&index.look(now, RESYNC)), [("cluster", 2)]);
    // Two trees that need each other's objects: a read only a poke caused
    // pokes nothing back, else each would keep the other due.
    let mutual = || around(&["pc", "secret"], &["release"], &["release"]);
    index.read("cluster", 1, now, mutual());
    assert_eq!(due(&index.look(now, RESYNC)), []);
    assert!(!index.busy());
    // A read for any other reason pokes: the cluster's own change pokes the
    // gateway, whose read (a poke's) ends it.
    index.apply(&xr(), 1, IndexEvent::Applied(object("cluster", "2")));
    assert_eq!(due(&index.look(now, RESYNC)), [("cluster", 2)]);
    index.read("cluster", 2, now, mutual());
    assert_eq!(due(&index.look(now, RESYNC)), [("gateway", 2)]);
    index.read("gateway", 2, now, gateway());
    assert_eq!(due(&index.look(now, RESYNC)), []);
    // What no tree has in it (a shared ProviderConfig) pokes nobody, not
    // even the first tree that read it.
    let shared = || around(&["release"], &["pc", "shared"], &["pc", "shared"]);
    index.apply(&xr(), 1, IndexEvent::Applied(object("gateway", "3")));
    index.look(now, RESYNC);
    index.read("gateway", 3, now, shared());
    assert_eq!(due(&index.look(now, RESYNC)), [("cluster", 2)]);
    index.read(
        "cluster",
        2,
        now,
        around(&["pc", "secret"], &["release", "shared"], &["shared"]),
    );
    assert_eq!(due(&index.look(now, RESYNC)), []);
    index.apply(&xr(), 1, IndexEvent::Applied(object("cluster", "3")));
    index.look(now, RESYNC);
    index.read(
        "cluster",
        3,
        now,
        around(&["pc", "secret"], &["release", "shared"], &["shared"]),
    );
    assert_eq!(due(&index.look(now, RESYNC)), []);
    // A tree that left gives its objects up: the need pokes nobody.
    index.apply(&xr(), 1, IndexEvent::Deleted("cluster".into()));
    index.look(now, RESYNC);
    index.apply(&xr(), 1, IndexEvent::Applied(object("gateway", "4")));
    assert_eq!(due(&index.look(now, RESYNC)), [("gateway", 2)]);
    index.read("gateway", 4, now, gateway());
    assert_eq!(due(&index.look(now, RESYNC)), []);
}

#[test]
fn a_new_provider_config_usage_makes_its_provider_configs_tree_due() {
    let helm = || -> KindKey { ("helm.m.crossplane.io".into(), "ProviderConfigUsage".into()) };
    let now = Instant::now();
    let mut index = listed(vec![object("cluster", "1"), object("other", "1")]);
    index.set_kinds(&[(xr(), Vec::new())], &[usage_kind(), helm()]);
    index.apply(&helm(), 1, IndexEvent::Listing);
    index.apply(&helm(), 1, IndexEvent::ListDone);
    index.look(now, RESYNC);
    let config = |ns: Option<&str>, name: &str, in_tree: bool| -> (ConfigName, bool) {
        (
            (
                "helm.m.crossplane.io".into(),
                ns.map(Into::into),
                name.into(),
            ),
            in_tree,
        )
    };
    // The cluster's own ProviderConfig and a ClusterProviderConfig; the
    // other tree read the first outside itself, after the cluster did.
    index.read(
        "cluster",
        1,
        now,
        TreeState {
            configs: vec![config(Some("ns"), "helm", true), config(None, "all", true)],
            ..tree(false, &["pc"])
        },
    );
    index.read(
        "other",
        1,
        now,
        TreeState {
            configs: vec![config(Some("ns"), "helm", false)],
            ..tree(false, &["x"])
        },
    );
    assert_eq!(due(&index.look(now, RESYNC)), []);
    let usage = |uid: &str, ns: &str, label: Option<&str>| Meta {
        namespace: Some(ns.into()),
        labels: label
            .map(|l| BTreeMap::from([("crossplane.io/provider-config".to_string(), l.to_string())]))
            .unwrap_or_default(),
        ..object(uid, "1")
    };
    // (the usage's namespace, its label) -> the roots made due
    let cases: [(&str, Option<&str>, &[&str]); 5] = [
        ("ns", Some("helm"), &["cluster"]),
        // A ClusterProviderConfig's, from any namespace.
        ("elsewhere", Some("all"), &["cluster"]),
        // Another namespace's ProviderConfig of that name: nobody's.
        ("elsewhere", Some("helm"), &[]),
        ("ns", Some("unknown"), &[]),
        ("ns", None, &[]),
    ];
    for (i, (ns, label, want)) in cases.into_iter().enumerate() {
        let event = IndexEvent::Applied(usage(&format!("u{i}"), ns, label));
        index.apply(&helm(), 1, event);
        let look = index.look(now, RESYNC);
        let got: Vec<&str> = look.due.iter().map(|d| d.uid.as_str()).collect();
        assert_eq!(got, want, "{ns} {label:?}");
    }
    // Nothing of them is kept, and a tree that left gives its
    // ProviderConfigs up.
    assert!(index.usages.is_empty());
    index.apply(&xr(), 1, IndexEvent::Deleted("cluster".into()));
    index.look(now, RESYNC);
    index.apply(
        &helm(),
        1,
        IndexEvent::Applied(usage("u9", "ns", Some("helm"))),
    );
    assert_eq!(due(&index.look(now, RESYNC)), []);
}

#[test]
fn an_active_tree_is_read_when_its_objects_change_or_a_period_passes_and_a_failed_read_again() {
    let now = Instant::now();
    let every = schedule::ACTIVE_EVERY;
    let mut index = listed(vec![object("a", "1"), controlled("m", "1", "a")]);
    index.look(now, RESYNC);
    index.read("a", 1, now, tree(true, &["m"]));
    assert!(index.busy());
    // Nothing of it changed: not within the period, at once after it.
    assert_eq!(due(&index.look(now + every / 2, RESYNC)), []);
    assert_eq!(due(&index.look(now + every, RESYNC)), [("a", 2)]);
    index.read("a", 1, now + every, tree(true, &["m"]));
    // One of its objects changed, or went: read at the next look.
    index.apply(&xr(), 1, IndexEvent::Applied(controlled("m", "2", "a")));
    assert_eq!(due(&index.look(now + every, RESYNC)), [("a", 2)]);
    index.read("a", 1, now + every, tree(true, &["m"]));
    index.apply(&xr(), 1, IndexEvent::Deleted("m".into()));
    assert_eq!(due(&index.look(now + every, RESYNC)), [("a", 2)]);
    // A settled tree's objects changing do not make it due.
    index.read("a", 1, now, tree(false, &["m"]));
    index.apply(&xr(), 1, IndexEvent::Applied(controlled("m", "3", "a")));
    assert_eq!(due(&index.look(now + every, RESYNC)), []);
    assert_eq!(due(&index.look(now, RESYNC)), []);
    index.apply(&xr(), 1, IndexEvent::Applied(object("a", "2")));
    assert_eq!(due(&index.look(now, RESYNC)), [("a", 2)]);
    index.not_read("a");
    assert_eq!(due(&index.look(now, RESYNC)), [("a", 2)]);
}

#[test]
fn a_young_tree_is_read_again_every_settle_period_not_every_look() {
    let start = Instant::now();
    let mut index = listed(vec![object("a", "1")]);
    index.look(start, RESYNC);
    let settling = TreeState {
        settling: true,
        ..tree(false, &["m"])
    };
    index.read("a", 1, start, settling.clone());
    let every = schedule::SETTLE_EVERY;
    // Looks within the period read nothing; the first after it reads it.
    assert_eq!(due(&index.look(start + every / 2, RESYNC)), []);
    assert_eq!(due(&index.look(start + every, RESYNC)), [("a", 2)]);
    // Read again (still young) at that look: due a period after it.
    let again = start + every;
    index.read("a", 1, again, settling);
    assert_eq!(due(&index.look(again + every / 2, RESYNC)), []);
    // A change makes it due at once, settling or not.
    index.apply(&xr(), 1, IndexEvent::Applied(object("a", "2")));
    assert_eq!(due(&index.look(again + every / 2, RESYNC)), [("a", 2)]);
    // Settled: read again only when it changes (or its resync is due).
    index.read("a", 2, again, tree(false, &["m"]));
    assert_eq!(due(&index.look(again + every * 10, RESYNC)), []);
    // Active (being deleted, writes to make) beats settling: read again
    // every ACTIVE_EVERY, sooner than SETTLE_EVERY.
    let both = TreeState {
        settling: true,
        ..tree(true, &["m"])
    };
    index.read("a", 2, again, both);
    assert!(schedule::ACTIVE_EVERY < every);
    assert_eq!(
        due(&index.look(again + schedule::ACTIVE_EVERY, RESYNC)),
        [("a", 2)]
    );
}

#[test]
fn resyncs_come_in_small_batches_and_never_for_a_root_alone() {
    let start = Instant::now();
    let roots: Vec<Meta> = (0..100).map(|i| object(&format!("r{i:03}"), "1")).collect();
    let mut index = listed([roots, vec![object("alone", "1")]].concat());
    assert_eq!(index.look(start, RESYNC).due.len(), 101);
    for i in 0..100 {
        index.read(&format!("r{i:03}"), 1, start, tree(false, &["m"]));
    }
    index.read("alone", 1, start, tree(false, &[]));
    assert_eq!(index.unread_roots(), 0);
    let later = start + RESYNC + Duration::from_secs(1);
    let look = index.look(later, RESYNC);
    assert_eq!(look.due.len(), schedule::RESYNCS_PER_LOOK);
    assert!(look.due.iter().all(|d| d.rank == 3 && d.uid != "alone"));
    // The next batch only after a quiet look's time.
    assert_eq!(index.look(later, RESYNC).due.len(), 0);
    let quiet = later + schedule::QUIET_LOOK;
    assert_eq!(
        index.look(quiet, RESYNC).due.len(),
        schedule::RESYNCS_PER_LOOK
    );
}

#[test]
fn a_look_reads_a_bounded_number_and_leaves_the_rest_due() {
    let now = Instant::now();
    let n = schedule::READS_PER_LOOK + 88;
    let roots: Vec<Meta> = (0..n).map(|i| object(&format!("r{i:04}"), "1")).collect();
    let mut index = listed(roots);
    let first = index.look(now, RESYNC);
    assert_eq!(first.due.len(), schedule::READS_PER_LOOK);
    assert!(first.backlog);
    let second = index.look(now, RESYNC);
    assert_eq!(second.due.len(), 88);
    assert!(!second.backlog);
    // Being deleted comes first.
    index.apply(
        &xr(),
        1,
        IndexEvent::Applied(Meta {
            deleting: true,
            ..object("r0999", "2")
        }),
    );
    index.apply(&xr(), 1, IndexEvent::Applied(object("zzz", "1")));
    assert_eq!(due(&index.look(now, RESYNC)), [("r0999", 0), ("zzz", 1)]);
}

#[test]
fn objects_of_a_kind_only_watched_begin_trees_once_it_is_ordered() {
    let now = Instant::now();
    let thing: KindKey = ("other.org".into(), "Thing".into());
    let mut index = listed(vec![]);
    index.apply(&thing, 7, IndexEvent::Listing);
    index.apply(&thing, 7, IndexEvent::Listed(object("t", "1")));
    index.apply(&thing, 7, IndexEvent::ListDone);
    assert!(!index.is_root("t"));
    let look = index.look(now, RESYNC);
    assert_eq!((due(&look), look.listed_all), (vec![], true));
    // Warn to Refuse: the same watch's objects begin trees.
    index.set_kinds(&[(xr(), Vec::new()), (thing.clone(), Vec::new())], &[]);
    assert_eq!(due(&index.look(now, RESYNC)), [("t", 1)]);
    index.read("t", 1, now, tree(false, &[]));
    // Back to Warn: the tree leaves, the objects stay while watched.
    index.set_kinds(&[(xr(), Vec::new())], &[]);
    assert_eq!(index.look(now, RESYNC).left, ["t"]);
    // Its watch stopped, and the kind not ordered: forgotten.
    index.apply(&thing, 7, IndexEvent::Stopped);
    index.set_kinds(&[(xr(), Vec::new())], &[]);
    index.set_kinds(&[(xr(), Vec::new()), (thing, Vec::new())], &[]);
    let look = index.look(now, RESYNC);
    assert_eq!((due(&look), look.listed_all), (vec![], false));
}

#[test]
fn a_kind_that_changes_hands_keeps_its_trees() {
    let now = Instant::now();
    // Refuse, fed by the admission-only watch (1).
    let mut index = listed(vec![object("a", "1"), object("b", "1")]);
    index.look(now, RESYNC);
    index.read("a", 1, now, tree(false, &["m"]));
    index.read("b", 1, now, tree(false, &["m"]));
    // Convert now: its watch (2) lists while the old one still sends.
    index.apply(&xr(), 2, IndexEvent::Listing);
    index.apply(&xr(), 2, IndexEvent::Listed(object("a", "1")));
    index.apply(&xr(), 1, IndexEvent::Deleted("a".into()));
    index.apply(&xr(), 1, IndexEvent::Stopped);
    assert!(
        index.is_root("a"),
        "the old watch's last events count for nothing"
    );
    index.apply(&xr(), 2, IndexEvent::Listed(object("b", "1")));
    index.apply(&xr(), 2, IndexEvent::ListDone);
    let look = index.look(now, RESYNC);
    assert_eq!((due(&look), look.left.len()), (vec![], 0));
    // The new watch stops with nothing after it: unknown, never left.
    index.apply(&xr(), 2, IndexEvent::Stopped);
    index.apply(&xr(), 2, IndexEvent::Applied(object("a", "2")));
    let look = index.look(now, RESYNC);
    assert_eq!(
        (due(&look), look.left.len(), look.listed_all),
        (vec![], 0, false)
    );
    assert!(!index.is_root("a"));
}
