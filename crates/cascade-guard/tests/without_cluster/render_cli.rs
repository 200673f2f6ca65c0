//! `cascade-guard render` as a package's CI runs it: `--strict` fails when
//! nothing is protected or a document protects nothing unless skipped on
//! purpose; `-o json` prints one List. No cluster is contacted.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{Value, json};

fn render(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cascade-guard"))
        .arg("render")
        .args(args)
        .arg(dir)
        .output()
        .expect("render runs")
}

fn package(name: &str, docs: &[Value]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("cg-render-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    for (i, doc) in docs.iter().enumerate() {
        std::fs::write(dir.join(format!("{i}.yaml")), doc.to_string()).expect("file");
    }
    dir
}

fn xrd() -> Value {
    json!({
        "apiVersion": "apiextensions.crossplane.io/v2", "kind": "CompositeResourceDefinition",
        "metadata": {"name": "xs.example.org",
                     "annotations": {"cascade-guard.dev/deletion-policy": "Refuse"}},
        "spec": {"group": "example.org", "names": {"kind": "X", "plural": "xs"},
                 "scope": "Namespaced",
                 "versions": [{"name": "v1", "served": true, "referenceable": true}]}
    })
}

fn composition() -> Value {
    json!({"apiVersion": "apiextensions.crossplane.io/v1", "kind": "Composition",
           "metadata": {"name": "xs"}, "spec": {}})
}

#[test]
fn strict_fails_on_an_empty_directory_and_on_what_protects_nothing() {
    let empty = package("empty", &[]);
    let out = render(&[], &empty);
    assert!(
        out.status.success(),
        "without --strict an empty set is not an error"
    );
    let out = render(&["--strict"], &empty);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("nothing is protected"), "{stderr}");

    let only_composition = package("composition", &[composition()]);
    let out = render(&["--strict"], &only_composition);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("Composition.apiextensions.crossplane.io xs is not an XRD"),
        "{stderr}"
    );

    let with_xrd = package("xrd", &[xrd(), composition()]);
    let out = render(&["--strict"], &with_xrd);
    assert!(!out.status.success(), "the Composition is not skipped yet");
    let out = render(&["--strict", "--skip", "Composition"], &with_xrd);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for dir in [empty, only_composition, with_xrd] {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn json_output_is_one_list_of_the_same_objects() {
    let dir = package("json", &[xrd()]);
    let yaml = render(&[], &dir);
    let json_out = render(&["-o", "json"], &dir);
    assert!(yaml.status.success() && json_out.status.success());
    let list: Value = serde_json::from_slice(&json_out.stdout).expect("JSON");
    assert_eq!(list["kind"], "List");
    let from_yaml = cascade_guard::policy::split_yaml_documents(
        &String::from_utf8(yaml.stdout).expect("utf-8"),
    )
    .expect("YAML");
    assert_eq!(list["items"].as_array().expect("items"), &from_yaml);
    let _ = std::fs::remove_dir_all(dir);
}
