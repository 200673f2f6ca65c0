//! `plan -o mermaid` (pure): the [`Picture`] as a Mermaid flowchart, which
//! GitHub and most Markdown viewers draw in place. Each parent's subtree is
//! a subgraph; Mermaid has no ranks to pin, so each object's wave is a line
//! of its label. Identifiers are generated (`n<i>`, `t<i>`), never taken from
//! names, so none is a keyword (`end`, `graph`, `style`…). Every label is a
//! quoted string whose text goes through [`text`]: Mermaid reads `#…;` as
//! an entity and the label as HTML, so `"`, `#`, `&`, `<`, `>`, `|` and
//! backticks are written as entity codes and a line break as `<br>`.

use std::fmt::Write;

use super::Plan;
use super::picture::{BLUE, DELETING_FILL, Line, LineKind, Member, ORANGE, Picture, RED, Shape};

pub fn render_mermaid(plan: &Plan) -> String {
    mermaid(&Picture::of(plan))
}

pub fn mermaid(picture: &Picture) -> String {
    let mut out = String::new();
    // A YAML front matter title: one line, single-quoted (its only escape is
    // a doubled quote), so nothing in it is read as Mermaid.
    let title = picture.title.join(" · ").replace('\'', "''");
    let title: String = title
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let _ = writeln!(out, "---\ntitle: '{title}'\n---");
    out.push_str("flowchart TB\n");
    for member in &picture.top {
        write_member(&mut out, picture, member, 1);
    }

    for line in &picture.lines {
        let arrow = match line.kind {
            LineKind::Need | LineKind::Waits => "-->",
            LineKind::Order => "-.->",
        };
        let _ = writeln!(
            out,
            "  n{} {arrow}|\"{}\"| n{}",
            line.from,
            text(&line.label),
            line.to
        );
    }

    // Styles last: a later classDef wins where two apply, so red (a hazard)
    // is defined after grey (a go-between). Only the classes some box has.
    let shapes = &picture.shapes;
    type Has = fn(&Shape) -> bool;
    let classes: [(&str, String, Has); 7] = [
        (
            "goBetween",
            "fill:#f5f5f5,stroke:#999999,color:#707070".to_string(),
            |s| s.go_between && !s.gone,
        ),
        ("deleting", format!("fill:{DELETING_FILL}"), |s| {
            s.deleting && !s.gone
        }),
        (
            "gone",
            "fill:#ffffff,stroke:#b3b3b3,color:#8c8c8c,stroke-dasharray: 5 4".to_string(),
            |s| s.gone,
        ),
        ("outside", "stroke-dasharray: 5 4".to_string(), |s| {
            s.outside
        }),
        ("held", format!("stroke:{BLUE},stroke-width:3px"), |s| {
            s.held
        }),
        (
            "blocker",
            format!("stroke:{ORANGE},stroke-width:4px"),
            |s| s.blocker,
        ),
        (
            "hazard",
            format!("stroke:{RED},stroke-width:2px,color:{RED}"),
            |s| s.hazard,
        ),
    ];
    let members = |has: Has| -> Vec<String> {
        (0..shapes.len())
            .filter(|&i| has(&shapes[i]))
            .map(|i| format!("n{i}"))
            .collect()
    };
    for (name, style, has) in &classes {
        if !members(*has).is_empty() {
            let _ = writeln!(out, "  classDef {name} {style}");
        }
    }
    for (name, _, has) in &classes {
        let ids = members(*has);
        if !ids.is_empty() {
            let _ = writeln!(out, "  class {} {name}", ids.join(","));
        }
    }
    // Lines are styled by their place among the lines above (from 0).
    let lines = &picture.lines;
    let style = |out: &mut String, style: &str, has: &dyn Fn(&Line) -> bool| {
        let numbers = (0..lines.len()).filter(|&i| has(&lines[i]));
        let numbers: Vec<String> = numbers.map(|i| i.to_string()).collect();
        if !numbers.is_empty() {
            let _ = writeln!(out, "  linkStyle {} {style}", numbers.join(","));
        }
    };
    style(&mut out, &format!("stroke:{BLUE},color:{BLUE}"), &|l| {
        l.kind == LineKind::Order && !l.hazard
    });
    style(
        &mut out,
        &format!("stroke:{ORANGE},stroke-width:2px,color:{ORANGE}"),
        &|l| l.kind == LineKind::Waits && !l.hazard,
    );
    style(
        &mut out,
        &format!("stroke:{RED},stroke-width:2px,color:{RED}"),
        &|l| l.hazard,
    );
    out
}

fn write_member(out: &mut String, picture: &Picture, member: &Member, depth: usize) {
    let pad = "  ".repeat(depth);
    match member {
        Member::Shape(i) => {
            let label: Vec<String> = picture.shapes[*i].lines.iter().map(|l| text(l)).collect();
            let _ = writeln!(out, "{pad}n{i}[\"{}\"]", label.join("<br>"));
        }
        Member::Group(group) => {
            // A blank title: the parent is the group's first box.
            let _ = writeln!(out, "{pad}subgraph t{} [\" \"]", group.parent);
            for inner in &group.members {
                write_member(out, picture, inner, depth + 1);
            }
            let _ = writeln!(out, "{pad}end");
        }
    }
}

/// Text for inside a Mermaid quoted label: every character that could end
/// the string or the edge text (`"`, `|`), start an entity (`#`, `&`), be
/// read as HTML (`<`, `>`) or as Markdown (a backtick) is an entity code
/// (decimal, which Mermaid turns into `&#N;`); a line break is `<br>`, other
/// control characters spaces.
pub fn text(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for c in raw.chars() {
        match c {
            '"' | '#' | '&' | '<' | '>' | '|' | '`' => {
                let _ = write!(out, "#{};", u32::from(c));
            }
            '\n' => out.push_str("<br>"),
            '\r' => {}
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::plan::picture::Wave;
    use crate::cli::plan::test_tree::{sample_picture, shape};

    #[test]
    fn label_text_escapes_what_mermaid_would_read() {
        let cases = [
            ("plain name-1.x", "plain name-1.x"),
            (r#"say "hi""#, "say #34;hi#34;"),
            ("#quot;", "#35;quot;"),
            ("a & b", "a #38; b"),
            ("<script>", "#60;script#62;"),
            ("a|b", "a#124;b"),
            ("`md`", "#96;md#96;"),
            ("two\nlines", "two<br>lines"),
            ("cr\r\nlf", "cr<br>lf"),
            ("tab\there", "tab here"),
            ("end", "end"),
            ("ünïcødé", "ünïcødé"),
            ("", ""),
        ];
        for (raw, want) in cases {
            assert_eq!(text(raw), want, "{raw:?}");
        }
    }

    #[test]
    fn subgraphs_nest_and_styles_name_the_right_boxes_and_lines() {
        let picture = sample_picture();
        let text = mermaid(&picture);
        let want = "---
title: 'T it''s · a \"plain\" delete'
---
flowchart TB
  subgraph t0 [\" \"]
    n0[\"Kind<br>root\"]
    n1[\"Kind<br>pc\"]
    n2[\"Kind<br>#60;b#62;\"]
  end
  n3[\"Kind<br>out\"]
  n2 -->|\"spec.providerConfigRef\"| n1
  n1 -->|\"a #34;quoted#34; reason\"| n3
  n2 -.->|\"gone before\"| n0
  n0 -.->|\"gone before (in a cycle)\"| n2
";
        assert!(text.starts_with(want), "{text}");
        for line in [
            "  class n1 goBetween\n",
            "  class n3 outside\n",
            "  class n1 held\n",
            "  class n2 hazard\n",
            "  linkStyle 2 stroke:#1f5fa8,color:#1f5fa8\n",
            "  linkStyle 0,3 stroke:#c00000,stroke-width:2px,color:#c00000\n",
        ] {
            assert!(text.contains(line), "{line:?} missing from:\n{text}");
        }
        assert_eq!(text, mermaid(&picture), "the same picture, the same text");
    }

    #[test]
    fn no_class_or_link_style_names_nothing() {
        let picture = Picture {
            title: vec!["T".to_string()],
            shapes: vec![shape("alone")],
            top: vec![Member::Shape(0)],
            waves: vec![Wave {
                label: "wave 1".to_string(),
                shapes: vec![0],
            }],
            lines: Vec::new(),
        };
        let text = mermaid(&picture);
        assert!(!text.contains("\n  class "), "{text}");
        assert!(!text.contains("linkStyle"), "{text}");
    }
}
