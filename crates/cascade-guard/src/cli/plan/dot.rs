//! `plan -o dot` (pure): the [`Picture`] in Graphviz's language. Each
//! parent's subtree is a cluster, each wave a rank (`rank=same` with a
//! "wave N" label on the left, the first to leave on top); `newrank` lets a
//! rank reach across clusters, which Graphviz's older ranking refuses.
//! Identifiers are generated (`n<i>`, `w<i>`, `cluster_n<i>`), never taken
//! from names; every label is a quoted string with its quotes and
//! backslashes escaped, so no name can end a string or start an escape like
//! `\N` (the node's own name) or `\l`.

use std::fmt::Write;

use super::Plan;
use super::picture::{BLUE, DELETING_FILL, Line, LineKind, Member, ORANGE, Picture, RED, Shape};

pub fn render_dot(plan: &Plan) -> String {
    dot(&Picture::of(plan))
}

pub fn dot(picture: &Picture) -> String {
    let mut out = String::new();
    out.push_str("digraph plan {\n");
    let _ = writeln!(
        out,
        "  graph [label={}, labelloc=t, fontname=\"Helvetica\", newrank=true, rankdir=TB];",
        quote(&picture.title.join("\n"))
    );
    out.push_str("  node [shape=box, style=\"rounded,filled\", fillcolor=white, fontname=\"Helvetica\", fontsize=10];\n");
    out.push_str("  edge [fontname=\"Helvetica\", fontsize=9];\n");

    if !picture.waves.is_empty() {
        out.push_str("  node [shape=plaintext, style=\"\", fontcolor=gray40];\n");
        for (i, wave) in picture.waves.iter().enumerate() {
            let _ = writeln!(out, "  w{i} [label={}];", quote(&wave.label));
        }
        let chain: Vec<String> = (0..picture.waves.len()).map(|i| format!("w{i}")).collect();
        if chain.len() > 1 {
            let _ = writeln!(out, "  {} [style=invis];", chain.join(" -> "));
        }
        out.push_str("  node [shape=box, style=\"rounded,filled\", fontcolor=black];\n");
    }

    for member in &picture.top {
        write_member(&mut out, picture, member, 1);
    }

    for (i, wave) in picture.waves.iter().enumerate() {
        let mut ids = vec![format!("w{i}")];
        ids.extend(wave.shapes.iter().map(|s| format!("n{s}")));
        let _ = writeln!(out, "  {{ rank=same; {}; }}", ids.join("; "));
    }

    for line in &picture.lines {
        let _ = writeln!(
            out,
            "  n{} -> n{} [{}];",
            line.from,
            line.to,
            line_attributes(line).join(", ")
        );
    }
    out.push_str("}\n");
    out
}

fn write_member(out: &mut String, picture: &Picture, member: &Member, depth: usize) {
    let pad = "  ".repeat(depth);
    match member {
        Member::Shape(i) => {
            let _ = writeln!(
                out,
                "{pad}n{i} [{}];",
                shape_attributes(&picture.shapes[*i]).join(", ")
            );
        }
        Member::Group(group) => {
            let _ = writeln!(out, "{pad}subgraph cluster_n{} {{", group.parent);
            let _ = writeln!(
                out,
                "{pad}  graph [label=\"\", style=rounded, color=gray75];"
            );
            for inner in &group.members {
                write_member(out, picture, inner, depth + 1);
            }
            let _ = writeln!(out, "{pad}}}");
        }
    }
}

fn shape_attributes(shape: &Shape) -> Vec<String> {
    let mut attributes = vec![format!("label={}", quote(&shape.lines.join("\n")))];
    if shape.outside || shape.gone {
        attributes.push("style=\"rounded,filled,dashed\"".to_string());
    }
    // The fill says its state: gone faded, over deleting, over a
    // go-between's grey (as the later class wins in Mermaid).
    if shape.gone {
        attributes.push("fillcolor=white, fontcolor=gray55".to_string());
    } else if shape.deleting {
        attributes.push(format!("fillcolor=\"{DELETING_FILL}\""));
    } else if shape.go_between {
        attributes.push("fillcolor=gray96, fontcolor=gray45".to_string());
    }
    // The outline says the most important thing about the object: red for
    // a hazard, over orange for what holds a teardown, over blue for a hold,
    // over grey for a go-between or what is gone.
    if shape.hazard {
        attributes.push(format!("color=\"{RED}\", fontcolor=\"{RED}\", penwidth=2"));
    } else if shape.blocker {
        attributes.push(format!("color=\"{ORANGE}\", penwidth=3"));
    } else if shape.gone {
        attributes.push("color=gray70".to_string());
    } else if shape.held {
        attributes.push(format!("color=\"{BLUE}\", penwidth=2.5"));
    } else if shape.go_between {
        attributes.push("color=gray60".to_string());
    }
    attributes
}

fn line_attributes(line: &Line) -> Vec<String> {
    let mut attributes = vec![format!("label={}", quote(&line.label))];
    if line.kind == LineKind::Order {
        attributes.push("style=dashed".to_string());
    }
    if line.hazard {
        attributes.push(format!("color=\"{RED}\", fontcolor=\"{RED}\", penwidth=2"));
    } else if line.kind == LineKind::Order {
        attributes.push(format!("color=\"{BLUE}\", fontcolor=\"{BLUE}\""));
    } else if line.kind == LineKind::Waits {
        attributes.push(format!(
            "color=\"{ORANGE}\", fontcolor=\"{ORANGE}\", penwidth=2"
        ));
    }
    if !line.ranks {
        attributes.push("constraint=false".to_string());
    }
    attributes
}

/// A Graphviz quoted string. Inside one only `"` ends it and `\` escapes,
/// and in a label `\n`, `\l`, `\N` and the like mean something: both are
/// escaped, a line break becomes `\n` (a centred line), and other control
/// characters, which Graphviz would print as they are, become spaces.
pub fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => {}
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::plan::test_tree::{sample_picture, shape};

    #[test]
    fn labels_are_quoted_so_no_name_ends_the_string_or_escapes() {
        let cases = [
            ("plain", r#""plain""#),
            (r#"say "hi""#, r#""say \"hi\"""#),
            (r"a\nb", r#""a\\nb""#),
            (r"\N", r#""\\N""#),
            ("two\nlines", r#""two\nlines""#),
            ("cr\r\nlf", r#""cr\nlf""#),
            ("tab\there", r#""tab here""#),
            (
                "<b>html</b> & {record|field}",
                r#""<b>html</b> & {record|field}""#,
            ),
            ("", r#""""#),
            ("ünïcødé", r#""ünïcødé""#),
        ];
        for (text, want) in cases {
            assert_eq!(quote(text), want, "{text:?}");
        }
    }

    #[test]
    fn each_look_has_its_attributes() {
        let cases = [
            ((false, false, false, false), vec![]),
            (
                (true, false, false, false),
                vec!["fillcolor=gray96", "color=gray60"],
            ),
            ((false, true, false, false), vec!["dashed"]),
            ((false, false, true, false), vec!["penwidth=2.5", BLUE]),
            ((true, false, true, false), vec![BLUE, "fillcolor=gray96"]),
            ((false, false, true, true), vec![RED]),
        ];
        for ((go_between, outside, held, hazard), want) in cases {
            let s = Shape {
                go_between,
                outside,
                held,
                hazard,
                ..shape("x")
            };
            let said = shape_attributes(&s).join(", ");
            for w in &want {
                assert!(said.contains(w), "{w} missing from {said}");
            }
            if !hazard {
                assert!(!said.contains(RED), "{said}");
            }
            if hazard || !held {
                assert!(!said.contains(BLUE), "{said}");
            }
            if !outside {
                assert!(!said.contains("dashed"), "{said}");
            }
        }
    }

    #[test]
    fn a_traces_looks_fill_by_state_and_outline_the_blocker() {
        // (deleting, gone, blocker, go-between): what it says, what it may not.
        let cases = [
            ((true, false, false, true), DELETING_FILL, "gray96"),
            ((true, false, true, false), ORANGE, "gray70"),
            ((false, true, false, true), "dashed", DELETING_FILL),
            ((false, true, false, false), "fontcolor=gray55", ORANGE),
            ((false, false, true, false), "penwidth=3", "dashed"),
        ];
        for ((deleting, gone, blocker, go_between), says, not) in cases {
            let s = Shape {
                deleting,
                gone,
                blocker,
                go_between,
                ..shape("x")
            };
            let said = shape_attributes(&s).join(", ");
            assert!(said.contains(says), "{says} missing from {said}");
            assert!(!said.contains(not), "{not} in {said}");
        }
        let waits = Line {
            from: 0,
            to: 1,
            kind: LineKind::Waits,
            label: "its owner waits for it".to_string(),
            hazard: false,
            ranks: false,
        };
        let said = line_attributes(&waits).join(", ");
        assert!(
            said.contains(ORANGE) && said.contains("constraint=false"),
            "{said}"
        );
    }

    #[test]
    fn clusters_nest_ranks_follow_waves_and_backward_lines_do_not_rank() {
        let picture = sample_picture();
        let text = dot(&picture);
        for want in [
            "label=\"T it's\\na \\\"plain\\\" delete\"",
            "  w0 -> w1 [style=invis];\n",
            "  subgraph cluster_n0 {\n",
            "    n0 [label=\"Kind\\nroot\"];\n",
            "    n2 [label=\"Kind\\n<b>\", color=\"#c00000\", fontcolor=\"#c00000\", penwidth=2];\n",
            "  n3 [label=\"Kind\\nout\", style=\"rounded,filled,dashed\"];\n",
            "  { rank=same; w0; n1; n2; }\n",
            "  { rank=same; w1; n0; }\n",
            "  n1 -> n3 [label=\"a \\\"quoted\\\" reason\"];\n",
            "  n2 -> n0 [label=\"gone before\", style=dashed, color=\"#1f5fa8\", fontcolor=\"#1f5fa8\"];\n",
            "  n0 -> n2 [label=\"gone before (in a cycle)\", style=dashed, color=\"#c00000\", fontcolor=\"#c00000\", penwidth=2, constraint=false];\n",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
        assert!(text.ends_with("}\n"));
        assert_eq!(text, dot(&picture), "the same picture, the same text");
    }
}
