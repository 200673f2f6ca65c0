//! `cascade-guard status` tells the truth and can gate a script, on the real
//! control plane: it compares by the running controller's own settings (read
//! from its Lease), says whether a controller runs and which replica leads,
//! and exits 0, 3 (a kind unguarded or drifted), 4 (no controller) or 5
//! (cannot reach the cluster). `uninstall` finds a controller run without
//! leader election.

use std::process::{Command, Output};
use std::time::Duration;

use cascade_guard_testkit::{Env, bare_env};
use local_cluster::wait;
use serde_json::Value;

fn cascade_guard(env: &Env, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cascade-guard"))
        .args(args)
        .arg(format!(
            "--kubeconfig={}",
            env.cp.kubeconfig_path().display()
        ))
        .output()
        .expect("cascade-guard runs")
}

fn report(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "status -o json: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// One test: the steps share a control plane and start and stop controllers.
#[tokio::test]
async fn status_compares_by_the_controllers_settings_and_exits_by_what_it_found() {
    let env = bare_env().await;
    let _stop = env.controllers_stop_on_drop();

    // Nothing ever ran: no admission objects, so unguarded (3, graver than
    // no controller), and the text says nothing runs.
    let out = cascade_guard(env, &["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(text.starts_with("CONTROLLER: NOT RUNNING"), "{text}");

    // A controller with settings other than status's defaults (as the chart
    // runs it: its own ServiceAccount as the controller user).
    let other_user = "system:serviceaccount:platform:cascade-guard";
    let n = env.start_controller(&[&format!("--controller-user={other_user}")]);
    let in_sync = wait::until(Duration::from_secs(60), || async {
        let out = cascade_guard(env, &["status", "-o", "json"]);
        (out.status.code() == Some(0)).then(|| report(&out))
    })
    .await
    .unwrap_or_else(|| {
        let out = cascade_guard(env, &["status"]);
        panic!(
            "status never exited 0 with the controller running: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    assert_eq!(in_sync["settingsFrom"], "Controller", "{in_sync:#}");
    assert_eq!(in_sync["admission"]["inSync"], true, "{in_sync:#}");
    assert_eq!(in_sync["controller"]["live"], true, "{in_sync:#}");
    assert_eq!(
        in_sync["controller"]["settings"]["controllerUser"], other_user,
        "{in_sync:#}"
    );
    let text = String::from_utf8_lossy(&cascade_guard(env, &["status"]).stdout).into_owned();
    assert!(text.starts_with("CONTROLLER: running, leader "), "{text}");

    // status's own flags, on request: they differ from the controller's, so
    // every object differs: 3.
    let out = cascade_guard(env, &["status", "--use-flags", "-o", "json"]);
    assert_eq!(out.status.code(), Some(3));
    let flags = report(&out);
    assert_eq!(flags["settingsFrom"], "Flags");
    assert_eq!(flags["admission"]["inSync"], false);

    // The controller stops (cleanly: it hands the Lease over), its objects
    // stay in force: 4.
    env.stop_controller(n);
    let out = cascade_guard(env, &["status"]);
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // uninstall finds a controller run without leader election.
    let solo = env.start_controller(&["--no-leader-election"]);
    let seen = wait::until(Duration::from_secs(30), || async {
        let out = cascade_guard(env, &["status", "-o", "json"]);
        let r = report(&out);
        (r["controller"]["live"] == true && r["controller"]["leaderElection"] == false)
            .then_some(())
    })
    .await;
    assert!(
        seen.is_some(),
        "status sees the controller without leader election"
    );
    let out = cascade_guard(env, &["uninstall", "--timeout=10s"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "uninstall refuses: {stderr}");
    assert!(stderr.contains("leader election off"), "{stderr}");
    env.stop_controller(solo);

    // Short names, as kubectl takes them (the CascadePolicy CRD's `cpol`).
    let out = cascade_guard(env, &["plan", "cpol/ghost"]);
    assert!(
        matches!(out.status.code(), Some(0 | 3)),
        "plan cpol/ghost: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("ghost"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // A drifted kind: its binding deleted, nothing running to put it back: 3.
    let client = env.cp.admin().await.expect("admin");
    let bindings: kube::Api<
        k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding,
    > = kube::Api::all(client);
    bindings
        .delete(
            "cascade-guard-xrds-refuse-composite",
            &kube::api::DeleteParams::default(),
        )
        .await
        .expect("delete a binding");
    let out = cascade_guard(env, &["status"]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn an_unreachable_cluster_exits_5_naming_the_server() {
    let dir = std::env::temp_dir().join(format!("cg-unreachable-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let kubeconfig = dir.join("kubeconfig");
    // Port 9 (discard) on loopback: nothing listens, the connection is refused.
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: 'https://127.0.0.1:9', insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
",
    )
    .expect("kubeconfig");
    for args in [&["status"][..], &["trace", "xr/a"], &["uninstall"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_cascade-guard"))
            .args(args)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .output()
            .expect("cascade-guard runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(5), "{args:?}: {stderr}");
        assert!(
            stderr.contains("cannot reach the API server at https://127.0.0.1:9"),
            "{args:?}: {stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
