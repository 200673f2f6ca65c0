use std::collections::BTreeSet;

use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::super::fixtures::{live, meta, resolution, sync};
use super::*;
use crate::policy::CompileSettings;
use crate::policy::names::{FOREGROUND_CASCADE_FINALIZER, FOREGROUND_DELETION_FINALIZER};
use crate::policy::plan::plan;

#[test]
fn each_root_of_an_ordered_kind_is_ordered_or_says_why() {
    let object = |name: &str, generation: i64, controlled: bool, deleting: bool| {
        let mut m = json!({"name": name, "namespace": "team", "uid": format!("{name}-uid"),
                           "generation": generation});
        if controlled {
            m["ownerReferences"] = json!([{"apiVersion": "x/v1", "kind": "X", "name": "p",
                                           "uid": "p", "controller": true}]);
        }
        if deleting {
            m["deletionTimestamp"] = json!("2026-12-05T00:00:00Z");
        }
        serde_json::from_value::<ObjectMeta>(m).expect("metadata")
    };
    let objects = [
        object("ordered", 2, false, false),
        object("changed", 3, false, false),
        object("unread", 1, false, false),
        object("cannot", 1, false, false),
        object("composed", 1, true, false),
        object("going", 1, false, true),
    ];
    let marks = BTreeMap::from([
        ("ordered-uid".to_string(), "2".to_string()),
        ("changed-uid".to_string(), "2".to_string()),
        (
            "cannot-uid".to_string(),
            "not read: Secret team/kubeconfig".to_string(),
        ),
        ("composed-uid".to_string(), "7".to_string()),
    ]);
    let mut trees = SiblingTrees::default();
    trees.add("Stack", &objects, &marks);
    assert_eq!(trees.ordered, 1);
    let why: Vec<(&str, &str)> = trees
        .not_ordered
        .iter()
        .map(|t| (t.name.as_str(), t.why.as_str()))
        .collect();
    assert_eq!(
        why,
        [
            (
                "changed",
                "the tree changed since the controller last read it"
            ),
            (
                "unread",
                "the controller has not read this tree (it is down, new, or still reading)"
            ),
            (
                "cannot",
                "the controller cannot order this tree: not read: Secret team/kubeconfig"
            ),
        ]
    );
    assert!(
        trees
            .not_ordered
            .iter()
            .all(|t| t.kind == "Stack" && t.namespace.as_deref() == Some("team"))
    );
}

#[test]
fn protected_says_where_each_policy_comes_from() {
    let rows = protected(&plan(
        &resolution(Mode::Refuse),
        &CompileSettings::default(),
        BTreeSet::new(),
    ));
    let got: Vec<Protected> = rows;
    let row =
        |kind: &str, mode, source, from: &str, selector: Option<&str>, objects: Option<&str>| {
            Protected {
                kind: kind.into(),
                resource: String::new(),
                mode,
                source,
                from: from.into(),
                selector: selector.map(str::to_string),
                admission_objects: objects.map(str::to_string),
                served: (mode != Mode::Off).then_some(ServedFrom::Api),
            }
        };
    let want = [
        row(
            "Cluster.example.org",
            Mode::Convert,
            SourceKind::XrdAnnotation,
            "clusters.example.org",
            None,
            Some(
                "cascade-guard-xrds-convert-composite, cascade-guard-update-xrds-convert-composite",
            ),
        ),
        row(
            "Network.example.org",
            Mode::Refuse,
            SourceKind::Default,
            "networks.example.org",
            None,
            Some("cascade-guard-xrds-refuse-composite, cascade-guard-update-xrds-refuse-composite"),
        ),
        row(
            "Quiet.example.org",
            Mode::Off,
            SourceKind::XrdAnnotation,
            "quiet.example.org",
            None,
            None,
        ),
        row(
            "Release.helm.example.org",
            Mode::Refuse,
            SourceKind::CascadePolicy,
            "releases",
            Some("team=a"),
            Some("cascade-guard-policy-releases, cascade-guard-update-policy-releases"),
        ),
    ];
    let resources: Vec<&str> = got.iter().map(|p| p.resource.as_str()).collect();
    assert_eq!(
        resources,
        [
            "clusters.example.org",
            "networks.example.org",
            "quiet.example.org",
            "releases.helm.example.org"
        ]
    );
    let got: Vec<Protected> = got
        .into_iter()
        .map(|p| Protected {
            resource: String::new(),
            ..p
        })
        .collect();
    assert_eq!(got, want);
}

#[test]
fn in_sync_when_the_cluster_has_what_the_policies_compile_to() {
    let r = resolution(Mode::Refuse);
    let (policies, bindings) = live(&r);
    let sync = sync(&r, &policies, &bindings);
    assert!(sync.in_sync, "{sync:?}");
    // Three policies compile (Off does not), to a DELETE and an UPDATE
    // pair of a policy and a binding each.
    assert_eq!(sync.wanted, 12);
}

#[test]
fn missing_differs_and_extra() {
    let r = resolution(Mode::Refuse);
    let (mut policies, mut bindings) = live(&r);
    // A binding deleted, a policy's validation edited, and a leftover of
    // an XRD that is gone.
    bindings.retain(|b| b["metadata"]["name"] != "cascade-guard-xrds-convert-composite");
    let releases = policies
        .iter()
        .position(|p| p["metadata"]["name"] == "cascade-guard-policy-releases")
        .unwrap();
    policies[releases]["spec"]["validations"][0]["expression"] = json!("true");
    let mut stale = policies[0].clone();
    stale["metadata"]["name"] = json!("cascade-guard-xrd-gone.example.org");
    policies.push(stale);
    let sync = sync(&r, &policies, &bindings);
    let got: Vec<(Mismatch, &str, &str, Option<&str>)> = sync
        .differences
        .iter()
        .map(|d| (d.state, d.kind, d.name.as_str(), d.detail.as_deref()))
        .collect();
    assert_eq!(
        got,
        [
            (
                Mismatch::Missing,
                "ValidatingAdmissionPolicyBinding",
                "cascade-guard-xrds-convert-composite",
                Some("unguarded until it is back: Cluster.example.org")
            ),
            (
                Mismatch::Differs,
                "ValidatingAdmissionPolicy",
                "cascade-guard-policy-releases",
                Some("spec.validations[0].expression differs")
            ),
            (
                Mismatch::Extra,
                "ValidatingAdmissionPolicy",
                "cascade-guard-xrd-gone.example.org",
                Some("no policy compiles to it")
            ),
        ]
    );
    assert!(!sync.in_sync);
}

#[test]
fn another_default_mode_is_named_as_the_likely_cause() {
    // The controller runs with Warn; status assumed Refuse.
    let (policies, bindings) = live(&resolution(Mode::Warn));
    let sync = sync(&resolution(Mode::Refuse), &policies, &bindings);
    // The XRD without the annotation is in the Warn objects, which
    // status does not want, and missing from the Refuse ones it does.
    let got: Vec<(Mismatch, &str, Option<&str>)> = sync
        .differences
        .iter()
        .map(|d| (d.state, d.name.as_str(), d.detail.as_deref()))
        .collect();
    let missing = Some("unguarded until it is back: Network.example.org");
    let hint = Some(
        "compiled for mode Warn for Network.example.org, the policy says Refuse; if the controller runs with --xrd-default-mode=Warn, pass the same to status",
    );
    assert_eq!(
        got,
        [
            (
                Mismatch::Missing,
                "cascade-guard-xrds-refuse-composite",
                missing
            ),
            (
                Mismatch::Missing,
                "cascade-guard-xrds-refuse-composite",
                missing
            ),
            (
                Mismatch::Missing,
                "cascade-guard-update-xrds-refuse-composite",
                missing
            ),
            (
                Mismatch::Missing,
                "cascade-guard-update-xrds-refuse-composite",
                missing
            ),
            (
                Mismatch::Extra,
                "cascade-guard-update-xrds-warn-composite",
                hint
            ),
            (Mismatch::Extra, "cascade-guard-xrds-warn-composite", hint),
            (
                Mismatch::Extra,
                "cascade-guard-update-xrds-warn-composite",
                hint
            ),
            (Mismatch::Extra, "cascade-guard-xrds-warn-composite", hint),
        ],
        "{sync:?}"
    );
}

#[test]
fn cascading_lists_only_deleted_objects_with_what_holds_them() {
    let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
    let objects = [
        meta("live", None, &[FOREGROUND_CASCADE_FINALIZER]),
        meta(
            "converting",
            Some("2026-01-01T11:59:50Z"),
            &[FOREGROUND_CASCADE_FINALIZER],
        ),
        meta(
            "cascading",
            Some("2026-01-01T11:55:00Z"),
            &[FOREGROUND_DELETION_FINALIZER, FOREGROUND_CASCADE_FINALIZER],
        ),
        meta(
            "refuse-mode",
            Some("2026-01-01T10:00:00Z"),
            &[FOREGROUND_DELETION_FINALIZER],
        ),
        meta(
            "wedged",
            Some("2025-12-30T12:00:00Z"),
            &["example.org/cleanup"],
        ),
    ];
    let got = cascading_objects("Cluster.example.org", &objects, now);
    let rows: Vec<(&str, u64, bool, bool, &str)> = got
        .iter()
        .map(|c| {
            (
                c.name.as_str(),
                c.age_seconds,
                c.held,
                c.foreground,
                c.state(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (
                "converting",
                10,
                true,
                false,
                "held by cascade-guard, waiting for it to re-issue the delete"
            ),
            (
                "cascading",
                300,
                true,
                true,
                "foreground cascade, held by cascade-guard"
            ),
            ("refuse-mode", 7200, false, true, "foreground cascade"),
            (
                "wedged",
                172_800,
                false,
                false,
                "terminating, waiting on its finalizers"
            ),
        ]
    );
    assert_eq!(got[0].deleting_since, "2026-01-01T11:59:50Z");
    assert_eq!(got[3].finalizers, ["example.org/cleanup"]);
}

#[test]
fn static_protection_marks_each_kind_and_says_what_is_wrong() {
    use crate::cluster::static_protection::Record;
    use crate::policy::static_manifest::{ServerReport, manifest};
    let r = resolution(Mode::Refuse);
    let p = plan(&r, &CompileSettings::default(), BTreeSet::new());
    let full = manifest(&p.objects).unwrap();
    // Another writer's file carries only the first pair.
    let partial = manifest(&p.objects[..1]).unwrap();
    let record = |writer: &str, hash: &str, text: &str| Record {
        writer: writer.into(),
        directory: "/etc/kubernetes/cascade-guard".into(),
        hash: Some(hash.into()),
        manifest: text.into(),
    };
    let server = ServerReport {
        gate_enabled: Some(true),
        loaded_hash: Some("sha256:a".into()),
        failed_reloads: 0,
    };

    // Not in use: nothing changes.
    let mut rows = protected(&p);
    let mut problems = Vec::new();
    assert_eq!(
        static_protection(&mut rows, &[], Some(&server), &mut problems),
        None
    );
    assert!(problems.is_empty());

    // One writer, loaded: every protected kind is static + API; Off has none.
    let mut rows = protected(&p);
    let st = static_protection(
        &mut rows,
        &[record("cp-1", "sha256:a", &full)],
        Some(&server),
        &mut problems,
    )
    .unwrap();
    assert!(st.writers[0].loaded);
    for row in &rows {
        let want = (row.mode != Mode::Off).then_some(ServedFrom::StaticAndApi);
        assert_eq!(row.served, want, "{}", row.kind);
    }
    assert!(problems.is_empty(), "{problems:?}");

    // Its API objects gone: static alone.
    let mut rows = protected(&p);
    for row in rows.iter_mut().filter(|r| r.served.is_some()) {
        row.served = Some(ServedFrom::Unguarded);
    }
    static_protection(
        &mut rows,
        &[record("cp-1", "sha256:a", &full)],
        Some(&server),
        &mut problems,
    );
    assert!(
        rows.iter()
            .filter(|r| r.mode != Mode::Off)
            .all(|r| r.served == Some(ServedFrom::Static))
    );

    // A second writer whose file lacks kinds: those kinds say so.
    let mut rows = protected(&p);
    static_protection(
        &mut rows,
        &[
            record("cp-1", "sha256:a", &full),
            record("cp-2", "sha256:b", &partial),
        ],
        Some(&server),
        &mut problems,
    );
    assert!(
        rows.iter()
            .any(|r| r.served == Some(ServedFrom::NotInStaticFile))
    );
    assert!(
        problems
            .iter()
            .any(|p| p.contains("not in the static file of cp-2")),
        "{problems:?}"
    );

    // Written but not loaded: stale, and the gate named when it is off.
    let mut rows = protected(&p);
    let mut problems = Vec::new();
    let off = ServerReport {
        gate_enabled: Some(false),
        loaded_hash: None,
        failed_reloads: 2,
    };
    static_protection(
        &mut rows,
        &[record("cp-1", "sha256:a", &full)],
        Some(&off),
        &mut problems,
    );
    assert!(
        rows.iter()
            .filter(|r| r.mode != Mode::Off)
            .all(|r| r.served == Some(ServedFrom::StaticStale))
    );
    assert!(problems[0].contains("has not loaded"), "{problems:?}");
    assert!(problems[0].contains("2 failed"), "{problems:?}");
    assert!(problems[0].contains("feature gate"), "{problems:?}");
}

#[test]
fn the_exit_code_says_unguarded_before_no_controller() {
    use crate::cluster::running::Running;
    let r = resolution(Mode::Refuse);
    let p = plan(&r, &CompileSettings::default(), BTreeSet::new());
    let running = |live: bool| Running {
        namespace: "cascade-guard-system".into(),
        lease: "cascade-guard".into(),
        holder: "pod-a".into(),
        renewed_seconds_ago: if live { 1 } else { 600 },
        live,
        leader_election: true,
        settings: None,
    };
    let report = |in_sync: bool, controller: Option<Running>| Report {
        xrd_default_mode: Mode::Refuse,
        protected: protected(&p),
        admission: AdmissionSync {
            in_sync,
            wanted: 4,
            differences: Vec::new(),
        },
        cascading: Vec::new(),
        problems: Vec::new(),
        static_protection: None,
        controller,
        settings_from: SettingsFrom::Flags,
        sibling_holds: Vec::new(),
        sibling_trees: None,
    };
    assert_eq!(report(true, Some(running(true))).exit_code(), 0);
    assert_eq!(
        report(false, Some(running(true))).exit_code(),
        UNGUARDED_EXIT
    );
    assert_eq!(
        report(true, Some(running(false))).exit_code(),
        NO_CONTROLLER_EXIT
    );
    assert_eq!(report(true, None).exit_code(), NO_CONTROLLER_EXIT);
    assert_eq!(report(false, None).exit_code(), UNGUARDED_EXIT);
    let mut unguarded = report(true, Some(running(true)));
    unguarded.protected[0].served = Some(ServedFrom::Unguarded);
    assert_eq!(unguarded.exit_code(), UNGUARDED_EXIT);
}
