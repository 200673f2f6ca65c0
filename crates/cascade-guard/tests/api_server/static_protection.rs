//! Static protection on the real API server: cascade-guard's policies served
//! from the AdmissionConfiguration's `staticManifestsDir`, which cluster-admin
//! cannot delete or edit through the API, and which hold with the controller
//! stopped.
//!
//! The release is the one `LOCAL_CLUSTER_BIN_DIR` holds. On 1.36 and newer
//! the control plane loads a static directory (on 1.36 with the feature gate
//! on); on 1.35 and older, `render --static` and `run --static-manifests-dir`
//! must refuse with the minimum release named. `scripts/compat.sh` runs it per
//! release.

use local_cluster::skip;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cascade_guard::cluster::static_protection::{
    StaticDirectory, directory_hash, read_server_report, records,
};
use cascade_guard::policy::static_manifest::{FEATURE_GATE, FILE_NAME, STATIC_SUFFIX};
use cascade_guard_testkit::{
    CONTROLLER_HOME, DeleteSpec, Env, OFF, REFUSE, chart, composite, delete, xrd_api,
};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use local_cluster::{Binaries, wait};
use serde_json::json;

/// The minor release of the control plane the tests run on.
fn release_minor() -> u32 {
    let binaries = Binaries::locate().expect("control plane binaries");
    let out = Command::new(&binaries.kube_apiserver)
        .arg("--version")
        .output()
        .expect("kube-apiserver --version");
    let text = String::from_utf8_lossy(&out.stdout);
    // "Kubernetes v1.37.2"
    text.trim()
        .rsplit('v')
        .next()
        .and_then(|v| v.split('.').nth(1))
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("cannot read the release from {text:?}"))
}

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cascade-guard"))
}

fn static_dir_of(env: &Env) -> PathBuf {
    env.cp.dir().join("static-manifests")
}

async fn static_env() -> Env {
    let mut options = cascade_guard_testkit::options();
    // The directory lives in the control plane's own directory, which is
    // chosen at start: give the control plane one of ours, a scratch directory
    // that a later start removes once this test binary is gone (the control
    // plane lives in a static and is never dropped).
    let dir = local_cluster::new_scratch_dir().expect("a scratch directory");
    options.dir = Some(dir.clone());
    options.static_manifests_dir = Some(dir.join("static-manifests"));
    options.feature_gates = vec![format!("{FEATURE_GATE}=true")];
    let env = cascade_guard_testkit::bare_with(options).await;
    // The writer as the chart installs it: the chart's RBAC with static
    // protection on, and a kubeconfig that acts as the writer's own
    // ServiceAccount (its DaemonSet's), never the controller's.
    let client = env.cp.admin().await.expect("admin");
    let values = format!(
        "{}staticManifests:\n  enabled: true\n",
        cascade_guard_testkit::chart_values()
    );
    let docs = chart::install_rbac(
        &env.cp,
        &client,
        &values,
        &env.cp.dir().join("cascade-guard.kubeconfig"),
    )
    .await;
    let (_, groups) = chart::service_account_identity(&docs);
    let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
    env.cp
        .write_kubeconfig_as(&writer_kubeconfig(&env), WRITER_USER, &groups)
        .expect("the writer's kubeconfig");
    env
}

/// The chart's static writer's ServiceAccount, as a token names it.
const WRITER_USER: &str =
    "system:serviceaccount:cascade-guard-system:cascade-guard-static-manifests";

fn writer_kubeconfig(env: &Env) -> PathBuf {
    env.cp.dir().join("static-writer.kubeconfig")
}

/// Waits until the API server reports it loaded the directory as it is now;
/// the time it took.
async fn wait_loaded(client: &Client, dir: &Path, within: Duration) -> Duration {
    let start = Instant::now();
    let loaded = wait::until(within, || async {
        let want = StaticDirectory::open(dir).ok()?.hash().ok()?;
        let report = read_server_report(client).await.ok()?;
        (report.loaded_hash == want).then_some(())
    })
    .await;
    let report = read_server_report(client).await.ok();
    assert!(
        loaded.is_some(),
        "the API server never loaded {} as it is (it reports {report:?})",
        dir.display()
    );
    start.elapsed()
}

/// Whether a Background delete of an object of `kind` with something to
/// cascade is refused (dry run), and the message.
async fn refused(client: &Client, resource: &kube::api::ApiResource, ns: &str) -> (bool, String) {
    let outcome = delete(
        client,
        resource,
        ns,
        &format!("probe-{}", resource.plural),
        &DeleteSpec::dry_run_background(),
    )
    .await;
    (outcome.code == 403, outcome.message)
}

async fn probe(client: &Client, resource: &kube::api::ApiResource, ns: &str) {
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), ns, resource);
    let name = format!("probe-{}", resource.plural);
    api.create(&PostParams::default(), &composite(resource, &name, true))
        .await
        .unwrap_or_else(|e| panic!("probe {name}: {e}"));
}

/// Another replica holds the leader lease for an hour: the controller under
/// test never leads, so nothing it does goes through the API's admission
/// objects; all protection seen is static.
async fn hold_the_lease_elsewhere(client: &Client) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), CONTROLLER_HOME);
    let now = k8s_openapi::jiff::Timestamp::now();
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "cascade-guard"},
        "spec": {
            "holderIdentity": "another-replica",
            "leaseDurationSeconds": 3600,
            "acquireTime": now.to_string(),
            "renewTime": now.to_string(),
        }
    }))
    .expect("lease");
    leases
        .create(&PostParams::default(), &lease)
        .await
        .expect("lease held elsewhere");
}

#[tokio::test]
async fn static_protection_holds_without_the_api_objects_and_the_controller() {
    if release_minor() < 36 {
        skip::skipped(
            "static manifests need Kubernetes 1.36; too_old_releases_are_refused_by_name checks the refusal",
        );
        return;
    }
    let env = static_env().await;
    let _stop = env.controllers_stop_on_drop();
    let client = env.cp.admin().await.expect("admin");
    let dir = static_dir_of(&env);
    let ns = "static";
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace");
    probe(&client, &REFUSE.resource(), ns).await;
    probe(&client, &OFF.resource(), ns).await;
    assert!(
        !refused(&client, &REFUSE.resource(), ns).await.0,
        "nothing protects anything yet"
    );

    // render --static, for the cluster's release (read from the kubeconfig),
    // is loaded by the API server as it is, and refuses on its own.
    let xrd_file = env.cp.dir().join("refuse-xrd.yaml");
    std::fs::write(
        &xrd_file,
        serde_json::to_string(&REFUSE.xrd()).expect("xrd"),
    )
    .expect("xrd file");
    let rendered = Command::new(binary())
        .args(["render", "--static", "--kubeconfig"])
        .arg(env.cp.kubeconfig_path())
        .arg(&xrd_file)
        .output()
        .expect("render --static");
    assert!(
        rendered.status.success(),
        "render --static: {}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    let text = String::from_utf8(rendered.stdout).expect("utf-8");
    assert!(text.contains(&format!("{STATIC_SUFFIX}\"")), "{text}");
    let rendered_file = dir.join("rendered.yaml");
    std::fs::write(&rendered_file, &text).expect("rendered file");
    let took = wait_loaded(&client, &dir, Duration::from_secs(120)).await;
    eprintln!("static: render --static output loaded in {took:?}");
    let (is_refused, message) = refused(&client, &REFUSE.resource(), ns).await;
    assert!(is_refused, "the rendered static policy refuses: {message}");
    std::fs::remove_file(&rendered_file).expect("remove rendered");
    wait::until(Duration::from_secs(120), || async {
        (!refused(&client, &REFUSE.resource(), ns).await.0).then_some(())
    })
    .await
    .expect("removing the file takes static protection away");

    // Another replica leads: the writer writes the directory and nothing else.
    hold_the_lease_elsewhere(&client).await;
    // The writer as the chart runs it: `run --static-only`, as its own
    // ServiceAccount.
    let n = env.start_controller(&[
        &format!("--kubeconfig={}", writer_kubeconfig(&env).display()),
        "--static-only",
        &format!("--static-manifests-dir={}", dir.display()),
    ]);
    wait::until(Duration::from_secs(60), || async {
        dir.join(FILE_NAME).exists().then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("no static file; logs:\n{}", env.cp.log_tails(40)));
    wait_loaded(&client, &dir, Duration::from_secs(120)).await;
    let (is_refused, message) = refused(&client, &REFUSE.resource(), ns).await;
    assert!(is_refused, "static protection refuses: {message}");
    assert!(
        message.contains(STATIC_SUFFIX),
        "the static policy answers: {message}"
    );
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    assert!(
        policies
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .is_empty(),
        "a replica that does not lead writes no API objects"
    );
    // Its record says what it wrote and the hash the API server reports.
    let record = wait::until(Duration::from_secs(30), || async {
        records(&client).await.ok()?.into_iter().next()
    })
    .await
    .expect("a static-manifests record");
    assert_eq!(record.directory, dir.display().to_string());
    assert_eq!(
        record.hash,
        read_server_report(&client)
            .await
            .expect("metrics")
            .loaded_hash
    );

    // status says where each kind's protection is served from.
    let status = Command::new(binary())
        .args(["status", "-o", "json", "--kubeconfig"])
        .arg(env.cp.kubeconfig_path())
        .output()
        .expect("status");
    let report: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap_or_else(|e| {
        panic!(
            "status -o json: {e}: {}",
            String::from_utf8_lossy(&status.stderr)
        )
    });
    let served = |kind: &str| {
        report["protected"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["kind"].as_str() == Some(kind)))
            .map(|r| r["served"].clone())
    };
    let refuse_kind = format!("{}.{}", REFUSE.kind, cascade_guard_testkit::GROUP);
    assert_eq!(
        served(&refuse_kind),
        Some(json!("Static")),
        "no API objects, static loaded: {report}"
    );
    assert_eq!(
        report["staticProtection"]["writers"][0]["loaded"],
        json!(true),
        "{report}"
    );

    // A new annotation reaches the directory and takes effect: timed.
    let start = Instant::now();
    xrd_api(&client)
        .patch(
            &OFF.xrd_name(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"cascade-guard.dev/deletion-policy": "Refuse"}}})),
        )
        .await
        .expect("annotate");
    let in_file = wait::until(Duration::from_secs(60), || async {
        let text = std::fs::read_to_string(dir.join(FILE_NAME)).ok()?;
        text.contains(OFF.kind).then(|| start.elapsed())
    })
    .await
    .expect("the new kind reaches the file");
    let in_force = wait::until(Duration::from_secs(120), || async {
        refused(&client, &OFF.resource(), ns)
            .await
            .0
            .then(|| start.elapsed())
    })
    .await
    .expect("the new kind is refused");
    eprintln!(
        "static: annotation to file {:.2} s, to refused {:.2} s",
        in_file.as_secs_f64(),
        in_force.as_secs_f64()
    );

    // Someone on the node deletes the file: it comes back.
    std::fs::remove_file(dir.join(FILE_NAME)).expect("remove the file");
    let back = wait::until(Duration::from_secs(30), || async {
        dir.join(FILE_NAME).exists().then(|| start.elapsed())
    })
    .await;
    assert!(back.is_some(), "a deleted static file is written again");
    wait_loaded(&client, &dir, Duration::from_secs(120)).await;

    // The controller stops; cluster-admin deletes every admission object the
    // API has: the protection stays.
    env.kill_controller(n);
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    bindings
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .expect("delete every binding");
    policies
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .expect("delete every policy");
    for resource in [REFUSE.resource(), OFF.resource()] {
        let (is_refused, message) = refused(&client, &resource, ns).await;
        assert!(
            is_refused,
            "{} still refused with the controller down and the API's policies gone: {message}",
            resource.plural
        );
    }

    // Break-glass goes through the API server's authorizer, as with the API's
    // policies (cluster-admin may `use` breakglass.cascade-guard.dev).
    let probes: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &REFUSE.resource());
    probes
        .patch(
            &format!("probe-{}", REFUSE.plural),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"cascade-guard.dev/break-glass": "static test"}}})),
        )
        .await
        .expect("break-glass annotation");
    let (is_refused, message) = refused(&client, &REFUSE.resource(), ns).await;
    assert!(
        !is_refused,
        "break-glass lets the delete through: {message}"
    );
    probes
        .patch(
            &format!("probe-{}", REFUSE.plural),
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"cascade-guard.dev/break-glass": null}}}),
            ),
        )
        .await
        .expect("break-glass off");

    // The static objects are not API objects: not found, not editable, and
    // their names cannot be taken through the API.
    let ours = wait::until(Duration::from_secs(5), || async {
        let text = std::fs::read_to_string(dir.join(FILE_NAME)).ok()?;
        text.lines().find_map(|l| {
            let l = l.trim();
            l.strip_prefix("name: \"")
                .and_then(|n| n.strip_suffix('"'))
                .filter(|n| n.ends_with(STATIC_SUFFIX))
                .map(str::to_string)
        })
    })
    .await
    .expect("a static name in the file");
    let got = policies.get_opt(&ours).await.expect("get");
    assert!(got.is_none(), "{ours} is not served through the API");
    let patched = policies
        .patch(
            &ours,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"validations": []}})),
        )
        .await;
    assert!(patched.is_err(), "{ours} cannot be patched through the API");
    let impostor: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": {"name": ours},
        "spec": {"validations": [{"expression": "true"}]}
    }))
    .expect("impostor");
    let created = policies.create(&PostParams::default(), &impostor).await;
    match created {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 422, "{e:?}");
            assert!(e.message.contains("reserved"), "{}", e.message);
        }
        other => panic!("a static name taken through the API: {other:?}"),
    }
    let (is_refused, _) = refused(&client, &REFUSE.resource(), ns).await;
    assert!(is_refused);

    // uninstall cannot take static protection away, and says which files do.
    Api::<Lease>::namespaced(client.clone(), CONTROLLER_HOME)
        .delete("cascade-guard", &DeleteParams::default())
        .await
        .expect("the other replica is gone");
    let uninstall = |force: bool| {
        let mut cmd = Command::new(binary());
        cmd.args(["uninstall", "--timeout=30s", "--kubeconfig"])
            .arg(env.cp.kubeconfig_path());
        if force {
            cmd.arg("--force");
        }
        cmd.output().expect("uninstall")
    };
    let refused_uninstall = uninstall(false);
    let stderr = String::from_utf8_lossy(&refused_uninstall.stderr);
    assert!(!refused_uninstall.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("{}/{FILE_NAME}", dir.display())),
        "names the file: {stderr}"
    );

    // The way out: remove the file.
    std::fs::remove_file(dir.join(FILE_NAME)).expect("remove the file");
    wait::until(Duration::from_secs(120), || async {
        (!refused(&client, &REFUSE.resource(), ns).await.0).then_some(())
    })
    .await
    .expect("with the file gone the protection goes");
    let done = uninstall(false);
    assert!(
        done.status.success(),
        "uninstall once the file is gone: {}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert_eq!(directory_hash(Vec::new()), None);
}

#[tokio::test]
async fn too_old_releases_are_refused_by_name() {
    let minor = release_minor();
    if minor >= 36 {
        // Offline: a release given as too old is refused the same way.
        let out = Command::new(binary())
            .args(["render", "--static", "--kubernetes-version", "1.35"])
            .arg(std::env::temp_dir())
            .output()
            .expect("render");
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("1.36 or newer"), "{stderr}");
        return;
    }
    let env = cascade_guard_testkit::bare_with(cascade_guard_testkit::options()).await;
    let _stop = env.controllers_stop_on_drop();
    let rendered = Command::new(binary())
        .args(["render", "--static", "--kubeconfig"])
        .arg(env.cp.kubeconfig_path())
        .arg(std::env::temp_dir())
        .output()
        .expect("render");
    assert!(!rendered.status.success());
    let stderr = String::from_utf8_lossy(&rendered.stderr);
    assert!(
        stderr.contains("1.36 or newer") && stderr.contains(&format!("1.{minor}")),
        "{stderr}"
    );

    let dir = env.cp.dir().join("static-manifests");
    std::fs::create_dir_all(&dir).expect("dir");
    let n = env.start_controller(&[&format!("--static-manifests-dir={}", dir.display())]);
    let exited = wait::until(Duration::from_secs(30), || async {
        (!env.controller_running(n)).then_some(())
    })
    .await;
    let log =
        std::fs::read_to_string(env.cp.log_path(&format!("cascade-guard-{n}"))).unwrap_or_default();
    assert!(
        exited.is_some(),
        "run --static-manifests-dir on 1.{minor} must exit: {log}"
    );
    assert!(log.contains("1.36 or newer"), "{log}");
    assert!(!dir.join(FILE_NAME).exists());
}
