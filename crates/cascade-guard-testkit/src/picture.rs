//! Checks of a picture that `plan` or `trace` drew, shared by the tests that
//! draw one (included by `#[path]`): Graphviz's own `dot` reads it, and a
//! Mermaid flowchart keeps to the part of Mermaid's grammar `-o mermaid`
//! writes (checked line by line: Mermaid's own parser needs a headless
//! browser, too heavy for the suite).

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};

/// Graphviz's dot, from `GRAPHVIZ_DOT` or PATH: a missing one fails the
/// test (a picture no one checked must not pass), saying how to install it.
pub fn run_dot(format: &str, input: &str) -> String {
    let dot = std::env::var("GRAPHVIZ_DOT").unwrap_or_else(|_| "dot".to_string());
    let mut child = match Command::new(&dot)
        .arg(format!("-T{format}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => panic!(
            "cannot run Graphviz's {dot:?} ({e}): testbed/tools/graphviz.sh installs it \
             (Debian's graphviz; scripts/test.sh runs it), or name it with GRAPHVIZ_DOT"
        ),
    };
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("dot reads its input");
    let output = child.wait_with_output().expect("dot ends");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stderr.trim().is_empty(),
        "dot -T{format} refused or warned ({}):\n{stderr}\n{input}",
        output.status
    );
    String::from_utf8(output.stdout).expect("dot writes UTF-8")
}

/// Mermaid's words that may not be a node's or subgraph's id.
const KEYWORDS: [&str; 13] = [
    "end",
    "graph",
    "flowchart",
    "subgraph",
    "style",
    "class",
    "classDef",
    "linkStyle",
    "click",
    "call",
    "href",
    "default",
    "direction",
];

fn valid_id(id: &str) -> bool {
    id.starts_with(|c: char| c.is_ascii_alphabetic())
        && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !KEYWORDS.contains(&id)
}

/// Quoted text as Mermaid reads it unchanged: no quote to end it, no pipe
/// to end an edge's text, no HTML but `<br>`, every `#` an entity code.
fn valid_text(text: &str) -> Result<(), String> {
    let plain = text.replace("<br>", "\n");
    if let Some(c) = plain
        .chars()
        .find(|c| matches!(c, '"' | '|' | '<' | '>' | '`' | '&' | '\r' | '\t'))
    {
        return Err(format!("{c:?} in {text:?}"));
    }
    for entity in plain.split('#').skip(1) {
        let (code, _) = entity
            .split_once(';')
            .ok_or(format!("a bare # in {text:?}"))?;
        if code.is_empty() || !code.chars().all(|c| c.is_ascii_digit()) {
            return Err(format!("#{code}; is not a decimal entity code in {text:?}"));
        }
    }
    Ok(())
}

/// `["text"]`, `|"text"|`: the text inside.
fn quoted<'a>(s: &'a str, open: &str, close: &str) -> Result<&'a str, String> {
    s.strip_prefix(open)
        .and_then(|s| s.strip_suffix(close))
        .ok_or(format!("{s:?} is not {open}…{close}"))
}

fn valid_styles(styles: &str) -> bool {
    styles.split(',').all(|style| {
        style.split_once(':').is_some_and(|(property, value)| {
            !property.is_empty()
                && property.chars().all(|c| c.is_ascii_lowercase() || c == '-')
                && !value.trim().is_empty()
                && value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || " #.-".contains(c))
        })
    })
}

/// Checks a Mermaid flowchart against the part of Mermaid's flowchart
/// grammar `-o mermaid` writes: the front matter title, `flowchart TB`,
/// subgraphs with a quoted title and their `end`, boxes `id["text"]`,
/// lines `a -->|"text"| b` and `a -.->|"text"| b` between boxes declared
/// before (Mermaid would make a new box of an unknown id, silently),
/// `classDef`, `class` naming declared boxes and defined classes, and
/// `linkStyle` naming lines that exist.
pub fn check_mermaid(text: &str) -> Result<(), String> {
    let mut lines = text.lines();
    let head: Vec<&str> = lines.by_ref().take(4).collect();
    let [open, title, close, chart] = head.as_slice() else {
        return Err("fewer than four lines".to_string());
    };
    let title = title
        .strip_prefix("title: '")
        .and_then(|t| t.strip_suffix('\''))
        .ok_or("no single-quoted title")?;
    if *open != "---" || *close != "---" || *chart != "flowchart TB" {
        return Err("not front matter and then flowchart TB".to_string());
    }
    if title.replace("''", "").contains('\'') {
        return Err(format!("a lone quote in the title {title:?}"));
    }
    let mut boxes = BTreeSet::new();
    let mut groups: Vec<String> = Vec::new();
    let mut ids = BTreeSet::new();
    let mut edges = 0;
    let mut classes = BTreeSet::new();
    for line in lines {
        let line = line.trim();
        let err = |why: String| format!("{line:?}: {why}");
        let words: Vec<&str> = line.splitn(3, ' ').collect();
        match words.as_slice() {
            ["end"] => {
                groups
                    .pop()
                    .ok_or(err("an end without a subgraph".to_string()))?;
            }
            ["subgraph", id, title] => {
                valid_text(quoted(title, "[\"", "\"]").map_err(err)?).map_err(err)?;
                if !valid_id(id) || !ids.insert(id.to_string()) {
                    return Err(err(format!("{id} is not a new id")));
                }
                groups.push(id.to_string());
            }
            ["classDef", name, styles] => {
                if !valid_id(name) || !valid_styles(styles) {
                    return Err(err("not a class definition".to_string()));
                }
                classes.insert(name.to_string());
            }
            ["class", names, class] => {
                if !classes.contains(*class) {
                    return Err(err(format!("class {class} is not defined")));
                }
                if let Some(unknown) = names.split(',').find(|n| !boxes.contains(*n)) {
                    return Err(err(format!("{unknown} is not a box")));
                }
            }
            ["linkStyle", numbers, styles] => {
                for n in numbers.split(',') {
                    let n: usize = n
                        .parse()
                        .map_err(|_| err(format!("{n} is not a line number")))?;
                    if n >= edges {
                        return Err(err(format!("line {n} does not exist ({edges} lines)")));
                    }
                }
                if !valid_styles(styles) {
                    return Err(err("not styles".to_string()));
                }
            }
            [from, arrow, rest]
                if valid_id(from) && (arrow.starts_with("-->") || arrow.starts_with("-.->")) =>
            {
                let joined = format!("{arrow} {rest}");
                let (label, to) = joined
                    .strip_prefix("-->")
                    .or_else(|| joined.strip_prefix("-.->"))
                    .and_then(|s| s.rsplit_once(' '))
                    .ok_or(err("not a line".to_string()))?;
                valid_text(quoted(label, "|\"", "\"|").map_err(err)?).map_err(err)?;
                for end in [from, &to] {
                    if !boxes.contains(*end) {
                        return Err(err(format!("{end} is not a box declared above")));
                    }
                }
                edges += 1;
            }
            _ => {
                let (id, label) = line
                    .split_once('[')
                    .ok_or(err("not a statement".to_string()))?;
                valid_text(quoted(&format!("[{label}"), "[\"", "\"]").map_err(err)?)
                    .map_err(err)?;
                if !valid_id(id) || !ids.insert(id.to_string()) {
                    return Err(err(format!("{id} is not a new id")));
                }
                boxes.insert(id.to_string());
            }
        }
    }
    if let Some(open) = groups.last() {
        return Err(format!("subgraph {open} has no end"));
    }
    Ok(())
}
