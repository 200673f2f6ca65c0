//! Which cluster a command talks to, as kubectl picks it, seen from the
//! binary: a KUBECONFIG list with a missing file works, `--context` picks
//! the cluster, and a kubeconfig that cannot be found or used exits 5 (the
//! README's "the cluster cannot be reached") with one line that says what
//! to do. No cluster: the servers named are closed ports on loopback, so
//! the message that names the server shows which one was chosen.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The exit status the README gives a cluster that cannot be reached.
const UNREACHABLE_EXIT: i32 = 5;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cg-kubeconfig-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

/// Runs the binary with only the given KUBECONFIG and a HOME without a
/// kubeconfig, so that the machine's own cannot be picked up.
fn run(args: &[&str], kubeconfig_env: Option<&str>, home: &Path) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cascade-guard"));
    command
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", home)
        .env("RUST_BACKTRACE", "0");
    if let Some(value) = kubeconfig_env {
        command.env("KUBECONFIG", value);
    }
    command.output().expect("cascade-guard runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A kubeconfig whose contexts (name, loopback port) each name a cluster
/// on a port nothing listens on; the first is current.
fn kubeconfig(dir: &Path, file: &str, contexts: &[(&str, u16)]) -> PathBuf {
    let mut text = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: {}\nclusters:\n",
        contexts[0].0
    );
    for (name, port) in contexts {
        text.push_str(&format!(
            "- name: {name}\n  cluster:\n    server: https://127.0.0.1:{port}\n"
        ));
    }
    text.push_str("users:\n- name: u\n  user:\n    token: t\ncontexts:\n");
    for (name, _) in contexts {
        text.push_str(&format!(
            "- name: {name}\n  context:\n    cluster: {name}\n    user: u\n"
        ));
    }
    let path = dir.join(file);
    std::fs::write(&path, text).expect("write kubeconfig");
    path
}

fn assert_exit_5_in_one_line(out: &Output, what: &str, says: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(UNREACHABLE_EXIT), "{what}: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{what}: not one line: {err}"
    );
    assert!(err.contains(says), "{what}: {err}");
}

#[test]
fn a_missing_kubeconfig_exits_5_saying_what_to_do() {
    let home = temp_dir("missing");
    let missing = home.join("no-such-kubeconfig");
    let missing = missing.to_str().expect("a UTF-8 temp path");
    for command in [
        &["status"][..],
        &["plan", "xr/a"],
        &["trace", "xr/a"],
        &["uninstall"],
        &["version"],
    ] {
        let mut args = command.to_vec();
        args.extend(["--kubeconfig", missing]);
        let out = run(&args, None, &home);
        assert_exit_5_in_one_line(
            &out,
            &format!("{command:?}"),
            "(--kubeconfig) does not exist: give the path of a kubeconfig file",
        );
    }
    // Nothing at all: not even ~/.kube/config.
    let out = run(&["status"], None, &home);
    assert_exit_5_in_one_line(
        &out,
        "no kubeconfig",
        "pass --kubeconfig PATH or set KUBECONFIG",
    );
    let out = run(&["status"], Some(missing), &home);
    assert_exit_5_in_one_line(
        &out,
        "KUBECONFIG lists only a missing file",
        "set KUBECONFIG to your kubeconfig",
    );
    let _ = std::fs::remove_dir_all(home);
}

#[test]
fn a_kubeconfig_list_skips_missing_files_and_context_picks_the_cluster() {
    let home = temp_dir("list");
    // Ports 1 and 2 on loopback: nothing listens, the connection is refused
    // at once.
    let config = kubeconfig(&home, "config", &[("first", 1), ("second", 2)]);
    let list = std::env::join_paths([home.join("missing"), config.clone()])
        .expect("paths without a separator");
    let list = list.to_str().expect("a UTF-8 temp path");

    let out = run(&["status"], Some(list), &home);
    assert_exit_5_in_one_line(
        &out,
        "the current context, past a missing file",
        "cannot reach the API server at https://127.0.0.1:1/",
    );
    let out = run(&["status", "--context", "second"], Some(list), &home);
    assert_exit_5_in_one_line(
        &out,
        "--context second",
        "cannot reach the API server at https://127.0.0.1:2/",
    );
    let config = config.to_str().expect("a UTF-8 temp path");
    let out = run(
        &[
            "plan",
            "xr/a",
            "--kubeconfig",
            config,
            "--context",
            "second",
        ],
        None,
        &home,
    );
    assert_exit_5_in_one_line(&out, "plan --kubeconfig --context", "https://127.0.0.1:2/");

    let out = run(&["status", "--context", "third"], Some(list), &home);
    assert_exit_5_in_one_line(&out, "no such context", "it has: first, second");
    let _ = std::fs::remove_dir_all(home);
}
