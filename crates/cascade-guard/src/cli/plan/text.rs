//! `plan` for people (pure): the mode and what a plain delete does in it,
//! the waves in which the tree can leave, the sibling order and the edges
//! behind it, then the hazards, last, where a terminal leaves them in view.

use std::fmt::Write;

use super::Plan;
use crate::policy::Mode;
use crate::policy::sibling::hazards::Teardown;

pub fn render_text(plan: &Plan) -> String {
    let mut out = String::new();
    write_order(&mut out, plan);
    write_sibling_order(&mut out, plan);
    write_held(&mut out, plan);
    write_edges_and_problems(&mut out, plan);
    write_verdict(&mut out, plan);
    out
}

/// The root, its mode, and the waves.
fn write_order(out: &mut String, plan: &Plan) {
    let graph = &plan.graph;
    let _ = writeln!(out, "{}: {}", plan.root, plan.mode_said());
    let _ = writeln!(
        out,
        "a plain delete: {}",
        describe(plan.mode, plan.teardown)
    );
    let in_tree = graph.nodes.iter().filter(|n| n.in_tree).count();
    let _ = writeln!(
        out,
        "{in_tree} objects in the tree, {} referenced outside it",
        graph.nodes.len() - in_tree
    );

    let _ = writeln!(
        out,
        "\nThe order that works (wave 1 leaves first; each object after its children and after all that needs it):"
    );
    for (i, wave) in graph.waves.iter().enumerate() {
        let names: Vec<String> = wave.iter().map(ToString::to_string).collect();
        let _ = writeln!(out, "  {:>2}. {}", i + 1, names.join(", "));
    }
}

/// What sibling order orders that a foreground cascade would not.
fn write_sibling_order(out: &mut String, plan: &Plan) {
    let graph = &plan.graph;
    if !graph.sibling_edges.is_empty() {
        let _ = writeln!(
            out,
            "\nSibling order (what a foreground cascade does not order by itself):"
        );
        for edge in &graph.sibling_edges {
            let cycle = if edge.in_cycle { " (in a cycle)" } else { "" };
            let _ = writeln!(
                out,
                "  under {}: {} must be gone before {} goes{cycle}, because",
                edge.parent, edge.before, edge.after
            );
            // A need that a longer one of the same object goes through says
            // less than that one.
            let longest = edge.reasons.iter().filter(|need| {
                !edge
                    .reasons
                    .iter()
                    .any(|other| other.object == need.object && other.through.contains(&need.needs))
            });
            for need in longest {
                let _ = writeln!(out, "    {need}");
            }
        }
    }
}

/// Standalone Usages, and users outside the tree.
fn write_held(out: &mut String, plan: &Plan) {
    let graph = &plan.graph;
    let standalone = graph.standalone_usages();
    if !standalone.is_empty() {
        let held = plan.teardown == Teardown::Ordered;
        let _ = writeln!(
            out,
            "\nStandalone Usages (Crossplane lets one go as soon as it is deleted, in its user's first wave):"
        );
        for (usage, by) in &standalone {
            let what = if held {
                "held until its user is gone"
            } else {
                "not held: what it protects may be deleted while its user is still going"
            };
            let _ = writeln!(out, "  {usage} (user {by}): {what}");
        }
    }

    let outside = graph.outside_users();
    if !outside.is_empty() {
        let held = plan.teardown == Teardown::Ordered;
        let _ = writeln!(
            out,
            "\nOutside the tree and needing it (the cascade does not delete these; delete them first):"
        );
        for need in &outside {
            let what = if held {
                "held until it is gone"
            } else {
                "not held: it goes from under them"
            };
            let _ = writeln!(out, "  {need}: {} {what}", need.needs);
        }
    }
}

/// The edges, cycles and what could not be read.
fn write_edges_and_problems(out: &mut String, plan: &Plan) {
    let graph = &plan.graph;
    if !graph.edges.is_empty() {
        let _ = writeln!(out, "\nEdges (A needs B: B must stay until A is gone):");
        for edge in &graph.edges {
            let _ = writeln!(out, "  {edge}");
        }
    }

    for cycle in &graph.cycles {
        let names: Vec<String> = cycle.objects.iter().map(ToString::to_string).collect();
        let _ = writeln!(
            out,
            "\nCycle under {}: {} need one another; they are deleted together",
            cycle.parent,
            names.join(", ")
        );
    }

    let problems = graph
        .problems
        .iter()
        .map(ToString::to_string)
        .chain(plan.unread.iter().map(|u| format!("not read: {u}")));
    let problems: Vec<String> = problems.collect();
    if !problems.is_empty() {
        let _ = writeln!(
            out,
            "\nProblems (edges that could not be read are missing above):"
        );
        for p in problems {
            let _ = writeln!(out, "  {p}");
        }
    }
}

/// Whether sibling order is in force, and the hazards.
fn write_verdict(out: &mut String, plan: &Plan) {
    if !plan.not_ordered.is_empty() {
        let _ = writeln!(
            out,
            "\nSibling order is not in force for this tree (cascade-guard refuses its delete until it is; break-glass deletes it in no order):"
        );
        for why in &plan.not_ordered {
            let _ = writeln!(out, "  {why}");
        }
    }

    if plan.hazards.is_empty() && plan.unsafe_now() {
        let _ = writeln!(
            out,
            "\nNo hazard in what was read, but a delete now is not shown safe: {}.",
            if plan.unread.is_empty() {
                "sibling order is not in force for this tree (above)"
            } else {
                "the tree was read only in part (above)"
            }
        );
    } else if plan.hazards.is_empty() {
        let _ = writeln!(
            out,
            "\nNo hazard: a plain delete now tears the tree down in an order that works."
        );
    } else {
        let _ = writeln!(
            out,
            "\n{} hazard{} of a plain delete now:",
            plan.hazards.len(),
            if plan.hazards.len() == 1 { "" } else { "s" }
        );
        for hazard in &plan.hazards {
            let _ = writeln!(out, "  {hazard}");
        }
    }
}

fn describe(mode: Mode, teardown: Teardown) -> &'static str {
    let ordered = teardown == Teardown::Ordered;
    match mode {
        Mode::Off => {
            "Background: the root leaves at once and everything under it is deleted at once"
        }
        Mode::Warn => {
            "Background (warned): the root leaves at once and everything under it is deleted at once"
        }
        Mode::Refuse if ordered => {
            "refused; `--cascade=foreground` then deletes each parent after its children, and cascade-guard holds each object a sibling still needs until that sibling is gone"
        }
        Mode::Refuse => {
            "refused; `--cascade=foreground` then deletes each parent after its children, siblings at once"
        }
        Mode::Convert if ordered => {
            "turned into a foreground cascade, each parent after its children, and cascade-guard holds each object a sibling still needs until that sibling is gone"
        }
        Mode::Convert => {
            "turned into a foreground cascade: each parent after its children, siblings at once"
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cli::plan::test_tree::{obj, ordered, plan_for, tree};
    use crate::cli::plan::{ModeSource, teardown_of};
    use crate::policy::sibling::graph;

    #[test]
    fn the_text_names_the_order_the_edges_and_each_hazard() {
        let text = render_text(&plan_for(Mode::Convert));
        for want in [
            "XR ns/root: Convert (XRD xrs.example.org)",
            "a plain delete: turned into a foreground cascade",
            "7 objects in the tree, 0 referenced outside it",
            "under XR ns/root: XR ns/stack must be gone before XR ns/cluster goes, because\n    Release ns/web needs ProviderConfig.helm.m.crossplane.io ns/helm",
            "Release ns/web needs ProviderConfig.helm.m.crossplane.io ns/helm (spec.providerConfigRef)",
            "not read: Secret other: forbidden",
            "hazard",
            "Release ns/web needs Cluster ns/prod",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
        let hazards = text.rfind("hazard").expect("a hazard line");
        let order = text.find("The order that works").expect("the waves");
        assert!(order < hazards, "the hazards come last:\n{text}");
    }

    #[test]
    fn a_standalone_usage_is_named_held_or_not() {
        let mut objects = tree();
        let mut usage = obj(
            "protection.crossplane.io/v1beta1",
            "Usage",
            "stack-uses-hub",
            None,
            json!({
                "of": {"apiVersion": "example.org/v1", "kind": "XR", "resourceRef": {"name": "hub"}},
                "by": {"apiVersion": "example.org/v1", "kind": "XR", "resourceRef": {"name": "root"}},
            }),
        );
        usage["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "example.org/v1", "kind": "XR", "name": "root", "uid": "root"}]);
        objects.push(usage);
        objects.push(obj("example.org/v1", "XR", "hub", None, json!({})));
        let graph = graph::graph(&objects, "root").expect("the root is in the tree");
        for (sibling_order, want) in [
            (true, "held until its user is gone"),
            (false, "not held: what it protects may be deleted"),
        ] {
            let teardown = teardown_of(Mode::Convert, sibling_order);
            let plan = Plan {
                root: graph.root.clone(),
                mode: Mode::Convert,
                mode_source: ModeSource::Flag,
                sibling_order,
                not_ordered: Vec::new(),
                teardown,
                hazards: graph.hazards(teardown),
                graph: graph.clone(),
                unread: Vec::new(),
            };
            let text = render_text(&plan);
            let line = format!("Usage ns/stack-uses-hub (user XR ns/root): {want}");
            assert!(text.contains(&line), "{line:?} missing from:\n{text}");
        }
    }

    #[test]
    fn with_sibling_order_enforced_the_plan_has_no_hazard_and_says_why() {
        let plan = ordered(plan_for(Mode::Convert));
        let text = render_text(&plan);
        assert!(
            text.contains("cascade-guard holds each object a sibling still needs"),
            "{text}"
        );
        assert!(
            text.contains(
                "No hazard: a plain delete now tears the tree down in an order that works."
            ),
            "{text}"
        );
        assert!(!plan.unsafe_now());
    }

    #[test]
    fn a_plan_never_says_safe_when_it_did_not_check_it() {
        // Ordered but read in part: no "No hazard: ... works", and unsafe.
        let mut partial = plan_for(Mode::Convert);
        partial.not_ordered.clear();
        partial.sibling_order = true;
        partial.teardown = teardown_of(Mode::Convert, true);
        partial.hazards = partial.graph.hazards(partial.teardown);
        let text = render_text(&partial);
        assert!(partial.unsafe_now());
        assert!(text.contains("read only in part"), "{text}");
        assert!(!text.contains("in an order that works"), "{text}");
        // Not ordered: the reasons, the foreground's hazards, unsafe.
        let mut down = plan_for(Mode::Convert);
        down.unread.clear();
        let text = render_text(&down);
        assert!(down.unsafe_now());
        assert!(
            text.contains("Sibling order is not in force for this tree"),
            "{text}"
        );
        assert!(
            text.contains("  no controller runs: no Lease named cascade-guard"),
            "{text}"
        );
        assert!(
            !down.hazards.is_empty(),
            "a foreground cascade of this tree has hazards"
        );
        // Not ordered, and no sibling needs another: no hazard, still unsafe
        // (cascade-guard refuses the delete until it is ordered).
        let mut alone = down.clone();
        alone.hazards.clear();
        let text = render_text(&alone);
        assert!(alone.unsafe_now());
        assert!(
            text.contains("not shown safe: sibling order is not in force"),
            "{text}"
        );
    }

    #[test]
    fn an_unprotected_kind_says_so() {
        let mut plan = plan_for(Mode::Off);
        plan.mode_source = ModeSource::Unprotected;
        let text = render_text(&plan);
        assert!(text.starts_with("XR ns/root: not protected\n"), "{text}");
        assert!(text.contains("a plain delete: Background"), "{text}");
    }
}
