//! `cascade-guard status` for people: the report as tables.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::report::{Mismatch, Report, SettingsFrom, SourceKind, StaticProtection};

/// `45s`, `3m12s`, `2h5m`, `3d4h`, as kubectl prints ages.
fn age(seconds: u64) -> String {
    let (d, h, m, s) = (
        seconds / 86_400,
        seconds / 3_600 % 24,
        seconds / 60 % 60,
        seconds % 60,
    );
    if d > 0 {
        format!("{d}d{h}h")
    } else if h > 0 {
        format!("{h}h{m}m")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// Who writes static manifests, and whether the API server loaded them.
fn static_section(out: &mut String, st: &StaticProtection) {
    let loaded = st.writers.iter().filter(|w| w.loaded).count();
    let _ = writeln!(
        out,
        "\nSTATIC PROTECTION: {} writer(s), {}",
        st.writers.len(),
        if loaded > 0 {
            "loaded by the API server (it cannot be deleted or edited through the API)"
        } else {
            "NOT loaded by the API server"
        }
    );
    let mut rows = vec![vec![
        "WRITER".to_string(),
        "DIRECTORY".to_string(),
        "KINDS".to_string(),
        "LOADED".to_string(),
    ]];
    for w in &st.writers {
        rows.push(vec![
            w.writer.clone(),
            w.directory.clone(),
            w.kinds.len().to_string(),
            if w.loaded { "yes" } else { "no" }.to_string(),
        ]);
    }
    table(out, &rows);
    if st.failed_reloads > 0 {
        let _ = writeln!(
            out,
            "  The API server failed to reload the directory {} time(s): its log says why; it serves the last set it loaded.",
            st.failed_reloads
        );
    }
}

/// The report for people.
/// How many trees that are not ordered the text lists one by one.
const TREES_SHOWN: usize = 20;

pub fn render_text(report: &Report) -> String {
    let mut out = String::new();
    controller_section(&mut out, report);
    protected_section(&mut out, report);
    admission_section(&mut out, report);
    sibling_order_section(&mut out, report);
    cascading_section(&mut out, report);
    problems_section(&mut out, report);
    out
}

/// The controller: running or not, and which settings status compared by.
fn controller_section(out: &mut String, report: &Report) {
    let compiled_with = match report.settings_from {
        SettingsFrom::Controller => "compared with what it compiles, by its own settings",
        SettingsFrom::Flags => "compared by status's own flags (--xrd-default-mode, --gc-*, ...)",
    };
    let _ = match &report.controller {
        Some(c) if c.live => writeln!(
            out,
            "CONTROLLER: running, leader {}; {compiled_with}\n",
            c.describe().trim_start_matches("controller ")
        ),
        Some(c) => writeln!(
            out,
            "CONTROLLER: NOT RUNNING: its Lease {}/{} was last renewed {}s ago by {}; nothing puts the admission objects back or converts deletes; {compiled_with}\n",
            c.namespace,
            c.lease,
            c.renewed_seconds_ago,
            if c.holder.is_empty() {
                "nobody"
            } else {
                &c.holder
            }
        ),
        None => writeln!(
            out,
            "CONTROLLER: NOT RUNNING: no Lease found (--leader-election-id); nothing puts the admission objects back or converts deletes; {compiled_with}\n"
        ),
    };
}

/// The protected kinds, by what, with what the API server serves statically.
fn protected_section(out: &mut String, report: &Report) {
    let _ = writeln!(out, "PROTECTED ({})", report.protected.len());
    if report.protected.is_empty() {
        let _ = writeln!(out, "  nothing: no XRDs and no CascadePolicies");
    } else {
        let with_static = report.static_protection.is_some();
        let mut rows = vec![vec![
            "KIND".to_string(),
            "MODE".to_string(),
            "SOURCE".to_string(),
        ]];
        if with_static {
            rows[0].push("SERVED".to_string());
        }
        for p in &report.protected {
            let source = match p.source {
                SourceKind::XrdAnnotation => format!("XRD annotation ({})", p.from),
                SourceKind::Default => format!(
                    "default, --xrd-default-mode={} ({})",
                    report.xrd_default_mode, p.from
                ),
                SourceKind::CascadePolicy => format!("CascadePolicy {}", p.from),
            };
            let kind = match &p.selector {
                Some(s) => format!("{} [{s}]", p.kind),
                None => p.kind.clone(),
            };
            let mut row = vec![kind, p.mode.to_string(), source];
            if with_static {
                row.push(p.served.map_or("-", |s| s.as_str()).to_string());
            }
            rows.push(row);
        }
        table(out, &rows);
    }
    if let Some(st) = &report.static_protection {
        static_section(out, st);
    }
}

/// cascade-guard's admission objects against what the policies compile to.
fn admission_section(out: &mut String, report: &Report) {
    let sync = &report.admission;
    if sync.in_sync {
        let _ = writeln!(
            out,
            "\nADMISSION POLICIES: in sync ({} objects)",
            sync.wanted
        );
    } else {
        let _ = writeln!(
            out,
            "\nADMISSION POLICIES: out of sync ({} of {} wanted objects missing or different, {} extra)",
            sync.differences
                .iter()
                .filter(|d| d.state != Mismatch::Extra)
                .count(),
            sync.wanted,
            sync.differences
                .iter()
                .filter(|d| d.state == Mismatch::Extra)
                .count(),
        );
        let mut rows = vec![vec![
            "STATE".to_string(),
            "KIND".to_string(),
            "NAME".to_string(),
            "DETAIL".to_string(),
        ]];
        for d in &sync.differences {
            rows.push(vec![
                format!("{:?}", d.state).to_lowercase(),
                d.kind.to_string(),
                d.name.clone(),
                d.detail.clone().unwrap_or_default(),
            ]);
        }
        table(out, &rows);
        let _ = writeln!(
            out,
            "  The controller (its leader) puts them right within a second; if it does not, check that it runs and its log."
        );
    }
}

/// What sibling order holds, and the trees it ordered or not.
fn sibling_order_section(out: &mut String, report: &Report) {
    if !report.sibling_holds.is_empty() {
        let _ = writeln!(
            out,
            "\nSIBLING ORDER ({} held until what needs them is gone; then let go, and deleted if their owner is being deleted)",
            report.sibling_holds.len()
        );
        let rows = kind_object_rows(
            ["KIND", "OBJECT", "WAITS FOR"],
            report
                .sibling_holds
                .iter()
                .map(|h| (&h.kind, &h.namespace, &h.name, &h.waits_for)),
        );
        table(out, &rows);
    }

    if let Some(trees) = &report.sibling_trees {
        if trees.not_ordered.is_empty() {
            let _ = writeln!(
                out,
                "\nSIBLING ORDER TREES: {} ordered, none waiting",
                trees.ordered
            );
        } else {
            let _ = writeln!(
                out,
                "\nSIBLING ORDER TREES: {} ordered; {} not (their roots' deletes are refused until they are, or go in no order with --unordered-deletes allow)",
                trees.ordered,
                trees.not_ordered.len()
            );
            let rows = kind_object_rows(
                ["KIND", "ROOT", "WHY"],
                trees
                    .not_ordered
                    .iter()
                    .take(TREES_SHOWN)
                    .map(|t| (&t.kind, &t.namespace, &t.name, &t.why)),
            );
            table(out, &rows);
            // A controller down with 100,000 roots would list them all:
            // the first few, then how many more, by reason (-o json has all).
            let more = trees.not_ordered.len().saturating_sub(TREES_SHOWN);
            if more > 0 {
                let mut by_why: BTreeMap<&str, usize> = BTreeMap::new();
                for t in &trees.not_ordered[TREES_SHOWN..] {
                    *by_why.entry(t.why.as_str()).or_default() += 1;
                }
                let _ = writeln!(out, "  and {more} more (-o json lists them all):");
                for (why, n) in by_why {
                    let _ = writeln!(out, "    {n}: {why}");
                }
            }
        }
    }
}

/// The protected objects being deleted.
fn cascading_section(out: &mut String, report: &Report) {
    if report.cascading.is_empty() {
        let _ = writeln!(out, "\nCASCADING: no protected object is being deleted");
    } else {
        let _ = writeln!(out, "\nCASCADING ({})", report.cascading.len());
        let mut rows = vec![vec![
            "KIND".to_string(),
            "OBJECT".to_string(),
            "AGE".to_string(),
            "STATE".to_string(),
            "FINALIZERS".to_string(),
        ]];
        for c in &report.cascading {
            let object = match &c.namespace {
                Some(ns) => format!("{ns}/{}", c.name),
                None => c.name.clone(),
            };
            let state = match &c.stalled {
                Some(_) => format!("STALLED: {}", c.state()),
                None => c.state().to_string(),
            };
            rows.push(vec![
                c.kind.clone(),
                object,
                age(c.age_seconds),
                state,
                c.finalizers.join(","),
            ]);
        }
        table(out, &rows);
        for c in &report.cascading {
            if let Some(note) = &c.stalled {
                let _ = writeln!(out, "  {} {} stalled: {note}", c.kind, c.name);
            }
        }
    }
}

/// What could not be read or made sense of.
fn problems_section(out: &mut String, report: &Report) {
    if !report.problems.is_empty() {
        let _ = writeln!(out, "\nPROBLEMS ({})", report.problems.len());
        for p in &report.problems {
            let _ = writeln!(out, "  {p}");
        }
    }
}

/// Left-aligned columns, two spaces apart, indented by two.
fn table(out: &mut String, rows: &[Vec<String>]) {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let mut line = String::from(" ");
        for (c, cell) in row.iter().enumerate() {
            let pad = widths[c].saturating_sub(cell.chars().count());
            let _ = write!(line, " {cell}{}", " ".repeat(pad));
            line.push(' ');
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

/// A table's rows: the header, then a row per (kind, namespace, name, what)
/// with the object as `namespace/name`.
fn kind_object_rows<'a>(
    header: [&str; 3],
    items: impl Iterator<Item = (&'a String, &'a Option<String>, &'a String, &'a String)>,
) -> Vec<Vec<String>> {
    let mut rows = vec![header.iter().map(|h| h.to_string()).collect()];
    for (kind, namespace, name, what) in items {
        let object = match namespace {
            Some(ns) => format!("{ns}/{name}"),
            None => name.clone(),
        };
        rows.push(vec![kind.clone(), object, what.clone()]);
    }
    rows
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use k8s_openapi::jiff::Timestamp;

    use super::super::fixtures::{live, meta, resolution, sync};
    use super::super::report::{Report, cascading_objects, protected};
    use super::*;
    use crate::policy::names::{FOREGROUND_CASCADE_FINALIZER, FOREGROUND_DELETION_FINALIZER};
    use crate::policy::plan::plan;
    use crate::policy::{CompileSettings, Mode};

    #[test]
    fn trees_not_ordered_are_listed_up_to_a_bound_then_counted_by_reason() {
        use super::super::report::{SiblingTrees, UnorderedTree};
        let tree = |i: usize, why: &str| UnorderedTree {
            kind: "Stack".into(),
            namespace: Some("team".into()),
            name: format!("s{i:02}"),
            why: why.into(),
        };
        let mut trees = SiblingTrees {
            ordered: 3,
            not_ordered: (0..TREES_SHOWN).map(|i| tree(i, "not read")).collect(),
        };
        trees
            .not_ordered
            .extend((0..3).map(|i| tree(100 + i, "not read")));
        trees.not_ordered.push(tree(200, "changed"));
        let r = resolution(Mode::Refuse);
        let (policies, bindings) = live(&r);
        let report = Report {
            xrd_default_mode: Mode::Refuse,
            protected: Vec::new(),
            admission: sync(&r, &policies, &bindings),
            cascading: Vec::new(),
            problems: Vec::new(),
            static_protection: None,
            controller: None,
            settings_from: SettingsFrom::Flags,
            sibling_holds: Vec::new(),
            sibling_trees: Some(trees),
        };
        let text = render_text(&report);
        assert!(
            text.contains("SIBLING ORDER TREES: 3 ordered; 24 not"),
            "{text}"
        );
        assert_eq!(text.matches("  Stack  ").count(), TREES_SHOWN, "{text}");
        assert!(
            text.contains(
                "  and 4 more (-o json lists them all):\n    1: changed\n    3: not read\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn ages_read_like_kubectl() {
        let cases = [
            (0, "0s"),
            (45, "45s"),
            (192, "3m12s"),
            (7_500, "2h5m"),
            (273_600, "3d4h"),
        ];
        for (secs, want) in cases {
            assert_eq!(age(secs), want);
        }
    }

    #[test]
    fn text_report() {
        let r = resolution(Mode::Refuse);
        let (policies, bindings) = live(&r);
        let now: Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let report = Report {
            xrd_default_mode: Mode::Refuse,
            protected: protected(&plan(&r, &CompileSettings::default(), BTreeSet::new())),
            admission: sync(&r, &policies, &bindings[1..]),
            cascading: cascading_objects(
                "Cluster.example.org",
                &[meta(
                    "prod",
                    Some("2026-01-01T11:58:00Z"),
                    &[FOREGROUND_DELETION_FINALIZER, FOREGROUND_CASCADE_FINALIZER],
                )],
                now,
            ),
            problems: vec!["warning: something".into()],
            static_protection: None,
            controller: None,
            settings_from: SettingsFrom::Flags,
            sibling_holds: Vec::new(),
            sibling_trees: None,
        };
        let text = render_text(&report);
        let expected = "\
CONTROLLER: NOT RUNNING: no Lease found (--leader-election-id); nothing puts the admission objects back or converts deletes; compared by status's own flags (--xrd-default-mode, --gc-*, ...)

PROTECTED (4)
  KIND                               MODE     SOURCE
  Cluster.example.org                Convert  XRD annotation (clusters.example.org)
  Network.example.org                Refuse   default, --xrd-default-mode=Refuse (networks.example.org)
  Quiet.example.org                  Off      XRD annotation (quiet.example.org)
  Release.helm.example.org [team=a]  Refuse   CascadePolicy releases

ADMISSION POLICIES: out of sync (1 of 12 wanted objects missing or different, 0 extra)
  STATE    KIND                              NAME                                  DETAIL
  missing  ValidatingAdmissionPolicyBinding  cascade-guard-xrds-convert-composite  unguarded until it is back: Cluster.example.org
  The controller (its leader) puts them right within a second; if it does not, check that it runs and its log.

CASCADING (1)
  KIND                 OBJECT       AGE   STATE                                      FINALIZERS
  Cluster.example.org  team-a/prod  2m0s  foreground cascade, held by cascade-guard  foregroundDeletion,cascade-guard.dev/foreground-cascade

PROBLEMS (1)
  warning: something
";
        assert_eq!(text, expected, "\n{text}");
        // And as JSON, for scripts.
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["admission"]["inSync"], false);
        assert_eq!(json["protected"][1]["source"], "Default");
        assert_eq!(json["cascading"][0]["held"], true);
        assert_eq!(json["cascading"][0]["ageSeconds"], 120);
    }
}
