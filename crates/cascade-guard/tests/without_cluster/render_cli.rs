//! `cascade-guard render` as a package's CI runs it: `--strict` fails when
//! nothing is protected or a document protects nothing unless it is
//! Crossplane package content or skipped on purpose; a render that fails
//! prints nothing; every run says on stderr which kinds got which mode; the
//! README's examples run as written. No cluster is contacted.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};

fn run_in(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cascade-guard"))
        .args(args)
        .current_dir(dir)
        // One line an error, as a user sees it, not a backtrace.
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("cascade-guard runs")
}

fn render(args: &[&str], dir: &Path) -> Output {
    let mut all = vec!["render"];
    all.extend_from_slice(args);
    let dir = dir.to_str().expect("a UTF-8 temp path");
    all.push(dir);
    run_in(&all, Path::new("/"))
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cg-render-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

/// A directory with one file per document.
fn package(name: &str, docs: &[Value]) -> PathBuf {
    let dir = temp_dir(name);
    for (i, doc) in docs.iter().enumerate() {
        std::fs::write(dir.join(format!("{i}.yaml")), doc.to_string()).expect("file");
    }
    dir
}

fn xrd_of(mode: Option<&str>) -> Value {
    let mut xrd = json!({
        "apiVersion": "apiextensions.crossplane.io/v2", "kind": "CompositeResourceDefinition",
        "metadata": {"name": "xs.example.org"},
        "spec": {"group": "example.org", "names": {"kind": "X", "plural": "xs"},
                 "scope": "Namespaced",
                 "versions": [{"name": "v1", "served": true, "referenceable": true}]}
    });
    if let Some(mode) = mode {
        xrd["metadata"]["annotations"] = json!({"cascade-guard.dev/deletion-policy": mode});
    }
    xrd
}

fn xrd() -> Value {
    xrd_of(Some("Refuse"))
}

fn composition() -> Value {
    json!({"apiVersion": "apiextensions.crossplane.io/v1", "kind": "Composition",
           "metadata": {"name": "xs"}, "spec": {}})
}

fn deployment() -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}})
}

fn config_map() -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}})
}

/// A failed render writes nothing to stdout, so `| kubectl apply -f -`
/// applies nothing.
fn assert_fails_quietly(out: &Output, what: &str) {
    assert!(!out.status.success(), "{what}: {}", stderr(out));
    assert!(
        out.stdout.is_empty(),
        "{what}: a failed render printed {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn strict_fails_on_an_empty_directory_and_on_what_protects_nothing() {
    let empty = package("empty", &[]);
    let out = render(&[], &empty);
    assert!(
        out.status.success(),
        "without --strict an empty set is not an error"
    );
    let err = stderr(&out);
    assert!(
        err.contains("warning: the input: nothing is protected"),
        "{err}"
    );
    let out = render(&["--strict"], &empty);
    assert_fails_quietly(&out, "--strict, empty");
    assert!(stderr(&out).contains("nothing is protected"));

    let only_deployment = package("deployment", &[deployment()]);
    let out = render(&["--strict"], &only_deployment);
    assert_fails_quietly(&out, "--strict, a Deployment");
    let err = stderr(&out);
    assert!(err.contains("Deployment.apps web is not an XRD"), "{err}");

    // The Composition beside the XRD is package content: no --skip needed.
    let with_xrd = package("xrd", &[xrd(), composition(), deployment()]);
    let out = render(&["--strict"], &with_xrd);
    assert_fails_quietly(&out, "the Deployment is not skipped");
    let out = render(&["--strict", "--skip", "Deployment"], &with_xrd);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!out.stdout.is_empty());
    let err = stderr(&out);
    assert!(
        err.contains(
            "skipped 1 document of Crossplane package kinds: Composition.apiextensions.crossplane.io 1"
        ),
        "{err}"
    );
    assert!(
        err.contains("skipped 1 document given to --skip: Deployment.apps 1"),
        "{err}"
    );
    for dir in [empty, only_deployment, with_xrd] {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn skip_takes_any_case_a_comma_list_and_repeats_and_warns_of_a_value_that_matches_nothing() {
    let dir = package("skip", &[xrd(), deployment(), config_map()]);
    for args in [
        &["--strict", "--skip", "deployment,CONFIGMAP"][..],
        &[
            "--strict",
            "--skip",
            "Deployment.APPS",
            "--skip",
            "configmap",
        ],
        &["--strict", "--skip=deployment, configmap"],
    ] {
        let out = render(args, &dir);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).contains("matches no document"), "{args:?}");
    }

    let out = render(
        &["--strict", "--skip", "Deployment,ConfigMap,Compositon"],
        &dir,
    );
    assert!(
        out.status.success(),
        "an unused --skip warns, it does not fail: {}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("warning: --skip Compositon matches no document"),
        "{}",
        stderr(&out)
    );

    let out = render(&["--skip", "Deployment,,ConfigMap"], &dir);
    assert_fails_quietly(&out, "an empty --skip value");
    assert!(
        stderr(&out).contains("--skip: an empty kind"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn every_render_says_which_kinds_got_which_mode_and_warns_when_nothing_is_protected() {
    let unannotated = package("unannotated", &[xrd_of(None)]);
    let config_map_only = package("configmap", &[config_map()]);
    let protected = package("protected", &[xrd()]);
    // (directory, arguments, a line stderr must hold, protects something?)
    let cases: [(&Path, &[&str], &str, bool); 4] = [
        (
            &unannotated,
            &["--xrd-default-mode", "Off"],
            "cascade-guard render: 1 kind: Off 1 (X.example.org)",
            false,
        ),
        (
            &unannotated,
            &["--xrd-default-mode", "Warn"],
            "cascade-guard render: 1 kind: Warn 1 (X.example.org)",
            true,
        ),
        (
            &config_map_only,
            &[],
            "passed over 1 document that is not an XRD, CascadePolicy or CRD: ConfigMap 1",
            false,
        ),
        (
            &protected,
            &[],
            "cascade-guard render: 1 kind: Refuse 1 (X.example.org)",
            true,
        ),
    ];
    for (dir, args, line, protects) in cases {
        let out = render(args, dir);
        let err = stderr(&out);
        assert!(out.status.success(), "{args:?}: {err}");
        assert!(err.contains(line), "{args:?}: {err}");
        assert_eq!(!err.contains("nothing is protected"), protects, "{err}");
        assert_eq!(!out.stdout.is_empty(), protects, "{args:?}");

        let mut strict = vec!["--strict", "--skip", "ConfigMap"];
        strict.extend_from_slice(args);
        let out = render(&strict, dir);
        if protects {
            assert!(out.status.success(), "{strict:?}: {}", stderr(&out));
        } else {
            assert_fails_quietly(&out, &format!("{strict:?}"));
            assert!(stderr(&out).contains("error: the input: nothing is protected"));
        }
    }
    for dir in [unannotated, config_map_only, protected] {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn a_failing_render_prints_nothing_even_with_objects_to_print() {
    // The XRD compiles; the Deployment fails --strict; nothing reaches stdout.
    let dir = package("partial", &[xrd(), deployment()]);
    let out = render(&["--strict"], &dir);
    assert_fails_quietly(&out, "--strict with a Deployment");
    let out = render(&["--strict", "-o", "json"], &dir);
    assert_fails_quietly(&out, "--strict -o json with a Deployment");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn problems_name_the_file_and_the_document_within_it() {
    let dir = temp_dir("located");
    std::fs::create_dir_all(dir.join("apis")).expect("apis");
    std::fs::write(dir.join("apis/a.yaml"), xrd().to_string()).expect("a");
    // Document 0 is empty, 1 an unnamed CascadePolicy, 2 a Deployment.
    std::fs::write(
        dir.join("apis/b.yaml"),
        "---\n---\napiVersion: cascade-guard.dev/v1alpha1\nkind: CascadePolicy\nspec: {}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n",
    )
    .expect("b");
    let out = run_in(&["render", "--strict", "apis/"], &dir);
    assert_fails_quietly(&out, "problems");
    let err = stderr(&out);
    assert!(
        err.contains("error: apis/b.yaml, document 1: "),
        "the CascadePolicy: {err}"
    );
    assert!(
        err.contains("error: apis/b.yaml, document 2: Deployment.apps web"),
        "the Deployment: {err}"
    );
    let _ = std::fs::remove_dir_all(dir);
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

/// The layouts the README's examples name: `package/apis/` and the
/// Crossplane package of "Shipping the policy in a Crossplane package"
/// (`platform/`, with its `crossplane.yaml`, an XRD and a Composition).
fn readme_layout() -> PathBuf {
    let dir = temp_dir("readme");
    let xrd = |mode: &str| {
        json!({
            "apiVersion": "apiextensions.crossplane.io/v2", "kind": "CompositeResourceDefinition",
            "metadata": {"name": "inferenceclusters.modelplane.ai",
                         "annotations": {"cascade-guard.dev/deletion-policy": mode}},
            "spec": {"group": "modelplane.ai", "scope": "Namespaced",
                     "names": {"kind": "InferenceCluster", "plural": "inferenceclusters"},
                     "versions": [{"name": "v1alpha1", "served": true, "referenceable": true}]}
        })
    };
    let composition = json!({"apiVersion": "apiextensions.crossplane.io/v1", "kind": "Composition",
        "metadata": {"name": "inferenceclusters"},
        "spec": {"compositeTypeRef": {"apiVersion": "modelplane.ai/v1alpha1", "kind": "InferenceCluster"}}});
    let files = [
        (
            "platform/crossplane.yaml",
            json!({"apiVersion": "meta.pkg.crossplane.io/v1", "kind": "Configuration",
                   "metadata": {"name": "platform"}}),
        ),
        (
            "platform/apis/inferenceclusters/definition.yaml",
            xrd("Convert"),
        ),
        (
            "platform/apis/inferenceclusters/composition.yaml",
            composition.clone(),
        ),
        (
            "package/apis/inferenceclusters/definition.yaml",
            xrd("Refuse"),
        ),
        (
            "package/apis/inferenceclusters/composition.yaml",
            composition,
        ),
    ];
    for (path, doc) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("dirs");
        std::fs::write(path, doc.to_string()).expect("file");
    }
    dir
}

/// Every `cascade-guard render` line of the README that needs no cluster,
/// run as written (its comment and output redirection aside) in that layout.
#[test]
fn the_readme_render_examples_run_as_written() {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let readme = std::fs::read_to_string(&readme).expect("README.md");
    let dir = readme_layout();
    let mut ran = Vec::new();
    let mut need_a_cluster = Vec::new();
    for line in readme.lines() {
        let Some(rest) = line.trim().strip_prefix("cascade-guard render ") else {
            continue;
        };
        let command = rest.split(" #").next().unwrap_or(rest);
        let command = command.split(" >").next().unwrap_or(command).trim();
        let args: Vec<&str> = command.split_whitespace().collect();
        // --static reads the release from the cluster unless it is given.
        if args.contains(&"--static") && !args.contains(&"--kubernetes-version") {
            need_a_cluster.push(command.to_string());
            continue;
        }
        let mut all = vec!["render"];
        all.extend_from_slice(&args);
        let out = run_in(&all, &dir);
        assert!(
            out.status.success(),
            "README: cascade-guard render {command}: {}",
            stderr(&out)
        );
        let text = String::from_utf8(out.stdout).expect("utf-8");
        let docs = cascade_guard::policy::split_yaml_documents(&text).expect("YAML");
        assert!(!docs.is_empty(), "README: {command} printed nothing");
        ran.push(command.to_string());
    }
    // So that a README reworded out of this test's reach fails it.
    assert_eq!(
        ran,
        [
            "--strict platform/apis/",
            "--xrd-default-mode Off package/apis/",
            "--static --kubernetes-version 1.37 package/apis/",
        ],
        "the README's render examples changed"
    );
    assert_eq!(need_a_cluster, ["--static package/apis/"]);
    let _ = std::fs::remove_dir_all(dir);
}
