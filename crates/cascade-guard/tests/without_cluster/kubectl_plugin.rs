//! `kubectl cascade-guard ...`: a real kubectl finds the binary on PATH as
//! the plugin file `kubectl-cascade_guard` (README "Install", the symlink it
//! shows; the release archives ship it under that name) and runs it; usage
//! and help then say `kubectl cascade-guard`. kubectl is the pinned control
//! plane's (LOCAL_CLUSTER_BIN_DIR, which scripts/test.sh sets; without it
//! testbed/controlplane/build.sh finds or builds it): a missing kubectl
//! fails the test, it never skips. No cluster: render reads files only.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cascade_guard::cli::plugin::PLUGIN_FILE;

fn kubectl() -> PathBuf {
    match local_cluster::Binaries::locate() {
        Ok(binaries) => binaries.kubectl,
        Err(e) => panic!(
            "no kubectl to run the plugin with: {e}. scripts/test.sh sets {} to the pinned control plane's binaries",
            local_cluster::BIN_DIR_ENV
        ),
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cg-kubectl-plugin-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

/// A PATH with only the plugin on it, as `ln -s` in the README puts it,
/// so that kubectl can find nothing else of that name.
fn plugin_dir(name: &str) -> PathBuf {
    let dir = temp_dir(name);
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_cascade-guard"), bin.join(PLUGIN_FILE))
        .expect("symlink the plugin");
    dir
}

fn kubectl_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(kubectl())
        .args(args)
        .env("PATH", dir.join("bin"))
        // kubectl reads no kubeconfig to run a plugin; none of the machine's.
        .env("HOME", dir)
        .env("KUBECONFIG", dir.join("no-kubeconfig"))
        .output()
        .expect("kubectl runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn kubectl_runs_the_plugin_and_its_usage_says_kubectl_cascade_guard() {
    let dir = plugin_dir("help");
    let out = kubectl_in(&dir, &["cascade-guard", "--help"]);
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(
        said.contains("Usage: kubectl cascade-guard <COMMAND>"),
        "{said}"
    );
    for command in ["plan", "trace", "status", "render"] {
        let out = kubectl_in(&dir, &["cascade-guard", command, "--help"]);
        assert!(out.status.success(), "{command}: {}", text(&out));
        let said = text(&out);
        assert!(
            said.contains(&format!("Usage: kubectl cascade-guard {command} ")),
            "{command}: {said}"
        );
    }
    // A usage error names the command as typed too.
    let out = kubectl_in(&dir, &["cascade-guard", "plan"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("Usage: kubectl cascade-guard plan <RESOURCE> [NAME]"),
        "{}",
        text(&out)
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn kubectl_cascade_guard_render_renders_a_file() {
    let dir = plugin_dir("render");
    let xrd = dir.join("xrd.yaml");
    std::fs::write(
        &xrd,
        r#"apiVersion: apiextensions.crossplane.io/v2
kind: CompositeResourceDefinition
metadata:
  name: xs.example.org
  annotations:
    cascade-guard.dev/deletion-policy: Refuse
spec:
  group: example.org
  names: {kind: X, plural: xs}
  scope: Namespaced
  versions: [{name: v1, served: true, referenceable: true}]
"#,
    )
    .expect("write the XRD");
    let xrd = xrd.to_str().expect("a UTF-8 temp path");
    let out = kubectl_in(&dir, &["cascade-guard", "render", xrd]);
    assert!(out.status.success(), "{}", text(&out));
    let yaml = String::from_utf8_lossy(&out.stdout);
    assert!(
        yaml.contains("kind: \"ValidatingAdmissionPolicy\""),
        "{}",
        text(&out)
    );
    let _ = std::fs::remove_dir_all(dir);
}
