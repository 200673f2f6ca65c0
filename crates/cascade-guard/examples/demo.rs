//! The demo (scripts/demo.sh runs it against the local control plane with real
//! Crossplane and the seed's platform, `local-cluster up --crossplane
//! --modelplane`): the seed's InferenceCluster, deleted with a plain
//! `kubectl delete`, with cascade-guard in Convert mode, followed live by
//! `cascade-guard trace`.
//!
//!   demo --kubeconfig PATH [--mode Convert|Refuse|Off] [--no-usage] [--sibling-order enforce|off]
//!
//! Off shows the failure the seed reports: the cloud cluster goes while the
//! gateway's load balancer is still being deleted, its Object wedges on the
//! provider's finalizer, and the load balancer leaks. `--no-usage` composes
//! the tree without the hand-written Usage of the EKSCluster by the
//! ServingStack: with sibling order (cascade-guard's default) the teardown
//! is still in order, and `plan` shows why beforehand; with
//! `--sibling-order off` the foreground cascade deletes both at once and the
//! Object wedges, as in Modelplane #212.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cascade_guard::policy::names::PROTECTED_KINDS_ANNOTATION;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, ResourceExt};
use local_cluster::real_crossplane::modelplane::{self, SYSTEM_NAMESPACE};
use local_cluster::{Binaries, wait};
use serde_json::{Value, json};

const NAME: &str = "prod";
const HOLD_FINALIZER: &str = "cascade-guard.dev/foreground-cascade";

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let kubeconfig = PathBuf::from(arg("--kubeconfig").context("--kubeconfig PATH is required")?);
    let mode = arg("--mode").unwrap_or_else(|| "Convert".into());
    let no_usage = args.iter().any(|a| a == "--no-usage");
    let sibling_order = arg("--sibling-order").unwrap_or_else(|| "enforce".into());
    if !["enforce", "off"].contains(&sibling_order.as_str()) {
        bail!("--sibling-order is enforce or off");
    }
    if !["Convert", "Refuse", "Off"].contains(&mode.as_str()) {
        bail!("--mode is Convert, Refuse or Off");
    }
    let config = Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&kubeconfig)?,
        &KubeConfigOptions::default(),
    )
    .await?;
    let client = Client::try_from(config)?;
    let logs = kubeconfig
        .parent()
        .map(|d| d.join("logs"))
        .unwrap_or_default();

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    if crds
        .get_opt("inferenceclusters.modelplane.ai")
        .await?
        .is_none()
    {
        bail!(
            "the seed's platform is not installed: run `cargo run -p local-cluster -- down`, then scripts/demo.sh again"
        );
    }
    for crd in cascade_guard::api::crds() {
        if crds.get_opt(&crd.name_any()).await?.is_none() {
            crds.create(&PostParams::default(), &crd).await?;
        }
    }
    say(&format!(
        "annotating Modelplane's XRDs: cascade-guard.dev/deletion-policy: {mode}"
    ));
    annotate_xrds(&client, &mode).await?;

    let exe = std::env::current_exe()?;
    let target = exe.parent().and_then(Path::parent).context("target dir")?;
    let cascade_guard = target.join("cascade-guard");
    say("starting cascade-guard");
    let log = std::fs::File::create(logs.join("cascade-guard.log"))?;
    // It runs with the demo's kubeconfig: the user its UPDATE policies trust
    // to remove its finalizer must be that one.
    let me = cascade_guard::controller::own_username(&client).await?;
    let mut controller = Command::new(&cascade_guard)
        .args([
            "run",
            "--no-leader-election",
            "--http-address=127.0.0.1:0",
            &format!("--controller-user={me}"),
            &format!("--sibling-order={sibling_order}"),
            "--kubeconfig",
        ])
        .arg(&kubeconfig)
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting cascade-guard")?;

    let wait_for_hold = no_usage && sibling_order == "enforce" && mode != "Off";
    let result = run(
        &client,
        &cascade_guard,
        &kubeconfig,
        &logs,
        &mode,
        no_usage,
        wait_for_hold,
    )
    .await;
    let _ = controller.kill();
    let _ = controller.wait();
    println!();
    say(&format!(
        "the control plane and Crossplane are still running: export KUBECONFIG={}; stop them with: cargo run -p local-cluster -- down",
        kubeconfig.display()
    ));
    result
}

async fn run(
    client: &Client,
    cascade_guard: &Path,
    kubeconfig: &Path,
    logs: &Path,
    mode: &str,
    no_usage: bool,
    wait_for_hold: bool,
) -> Result<()> {
    let ics: Api<DynamicObject> = Api::all_with(client.clone(), &modelplane::inference_clusters());
    if ics.get_opt(NAME).await?.is_some() {
        say("removing the InferenceCluster left by an earlier run (a minute or two)");
        let _ = ics
            .patch(
                NAME,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"cascade-guard.dev/break-glass": "demo clean-up"}}})),
            )
            .await;
        let _ = ics.delete(NAME, &DeleteParams::foreground()).await;
        let gone = wait::until(Duration::from_secs(300), || async {
            abandon_wedged(client).await;
            tree_left(client).await.is_empty().then_some(())
        })
        .await;
        if gone.is_none() {
            bail!(
                "the earlier InferenceCluster did not go; try `cargo run -p local-cluster -- down` and run the demo again"
            );
        }
    }
    if mode != "Off" {
        wait_for_protection(client).await?;
    }

    say("creating InferenceCluster prod on real Crossplane, as the seed report describes it:");
    say(
        "  an EKSCluster: a local-cloud Cluster (a real control plane; 3 s to delete) and the ProviderConfigs",
    );
    say(
        "  that reach it through its connection Secret; a ServingStack: three provider-helm Releases and a",
    );
    say(
        "  provider-kubernetes Object for the gateway's LoadBalancer Service (its load balancer takes 40 s",
    );
    let mut ic = modelplane::inference_cluster(NAME);
    if no_usage {
        say(
            "  to delete); and no Usage between the two (--no-usage): nothing written by hand orders them",
        );
        ic["spec"]["crossplane"]["compositionRef"]["name"] = json!(without_usage(client).await?);
    } else {
        say(
            "  to delete); and a Usage of the EKSCluster by the ServingStack that replays a refused delete",
        );
    }
    ics.patch(
        NAME,
        &PatchParams::apply("cascade-guard-demo").force(),
        &Patch::Apply(ic),
    )
    .await?;
    wait_built(client, !no_usage).await?;
    if mode == "Convert" {
        let held = wait::until(Duration::from_secs(60), || async {
            let o = ics.get(NAME).await.ok()?;
            o.finalizers()
                .iter()
                .any(|f| f == HOLD_FINALIZER)
                .then_some(())
        })
        .await;
        if held.is_none() {
            bail!("cascade-guard did not hold the InferenceCluster");
        }
    }

    if wait_for_hold {
        // The first look at a new tree takes a moment (the controller reads
        // trees as they change): wait until what a sibling needs is held.
        wait_for_sibling_order(client).await;
    }
    println!("\n$ cascade-guard plan inferencecluster {NAME}");
    Command::new(cascade_guard)
        .args(["plan", "inferencecluster", NAME, "--kubeconfig"])
        .arg(kubeconfig)
        .status()?;

    let kubectl = Binaries::locate()?.kubectl;
    let mut delete_args = vec!["delete", "inferencecluster", NAME, "--wait=false"];
    if mode == "Refuse" {
        println!("\n$ kubectl delete inferencecluster {NAME}");
        Command::new(&kubectl)
            .args(&delete_args)
            .env("KUBECONFIG", kubeconfig)
            .status()?;
        delete_args.push("--cascade=foreground");
        println!("\n$ kubectl delete inferencecluster {NAME} --cascade=foreground");
    } else {
        println!("\n$ kubectl delete inferencecluster {NAME}");
    }
    // trace first: without cascade-guard the InferenceCluster is gone at once.
    println!("$ cascade-guard trace inferencecluster {NAME}");
    let timeout = if mode == "Off" { "60" } else { "300" };
    let started = Instant::now();
    let mut trace = Command::new(cascade_guard)
        .args([
            "trace",
            "inferencecluster",
            NAME,
            "--interval",
            "500ms",
            "--timeout",
            timeout,
            "--kubeconfig",
        ])
        .arg(kubeconfig)
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::inherit())
        .spawn()?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let deleted = Command::new(&kubectl)
        .args(&delete_args)
        .env("KUBECONFIG", kubeconfig)
        .output()?;
    let trace = trace.wait()?;
    println!(
        "(kubectl said: {})",
        String::from_utf8_lossy(if deleted.status.success() {
            &deleted.stdout
        } else {
            &deleted.stderr
        })
        .trim()
    );
    if mode == "Off" {
        println!();
        let leaked = leaked(logs);
        if trace.success() && leaked.is_empty() {
            say("this time everything finished before the cluster went: the race went well");
        } else {
            say(&format!(
                "without cascade-guard the teardown wedged within {:.0}s: the InferenceCluster went at once, the",
                started.elapsed().as_secs_f64()
            ));
            say(
                "Usage let go of the EKSCluster as soon as the ServingStack object left, and the cloud cluster was",
            );
            say(
                "deleted while the gateway's load balancer was still being deleted. Its Object can never finish:",
            );
            for (kind, name, message) in wedged(client).await {
                say(&format!("  {kind}/{name}: {message}"));
            }
            say("and the local cloud recorded what was left behind:");
            for line in leaked {
                say(&format!("  {line}"));
            }
            say("This is the seed report's failure.");
        }
        // So that the demo can run again: abandon the wedged objects on purpose,
        // as an operator would have to by hand.
        abandon_wedged(client).await;
        return Ok(());
    }
    if !trace.success() {
        bail!("the teardown did not complete");
    }
    Ok(())
}

/// The seed's InferenceCluster Composition without its Usage, as
/// `inferenceclusters-local-without-usage`; returns its name.
async fn without_usage(client: &Client) -> Result<String> {
    let resource = kube::api::ApiResource {
        group: "apiextensions.crossplane.io".into(),
        version: "v1".into(),
        api_version: "apiextensions.crossplane.io/v1".into(),
        kind: "Composition".into(),
        plural: "compositions".into(),
    };
    let compositions: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let original = compositions
        .get("inferenceclusters-local")
        .await
        .context("the seed's InferenceCluster Composition")?;
    let name = "inferenceclusters-local-without-usage".to_string();
    let mut spec = original.data["spec"].clone();
    for step in spec["pipeline"].as_array_mut().into_iter().flatten() {
        if let Some(resources) = step
            .pointer_mut("/input/resources")
            .and_then(Value::as_array_mut)
        {
            resources.retain(|r| r["name"] != "usage-eks-by-backend");
        }
    }
    let composition = json!({
        "apiVersion": "apiextensions.crossplane.io/v1",
        "kind": "Composition",
        "metadata": {"name": name},
        "spec": spec,
    });
    compositions
        .patch(
            &name,
            &PatchParams::apply("cascade-guard-demo").force(),
            &Patch::Apply(composition),
        )
        .await?;
    Ok(name)
}

/// Waits (up to a minute) until cascade-guard holds the EKSCluster for the
/// ServingStack.
async fn wait_for_sibling_order(client: &Client) {
    let eks = modelplane::eks_clusters();
    // The controller runs outside a pod: its ConfigMaps are in `default`.
    let _ = wait::until(Duration::from_secs(60), || async {
        let held = cascade_guard::cluster::holds::read(client, "default")
            .await
            .ok()?;
        held.iter()
            .any(|(o, _)| {
                o.kind == eks.kind
                    && o.group == eks.group
                    && o.namespace.as_deref() == Some(SYSTEM_NAMESPACE)
                    && o.name == NAME
            })
            .then_some(())
    })
    .await;
}

fn say(line: &str) {
    println!("demo: {line}");
}

/// Waits until the InferenceCluster is Ready and its Usage guards the
/// EKSCluster, saying what is still coming up.
/// Waits until the tree is ready and, unless it has none, its Usage holds
/// the EKSCluster.
async fn wait_built(client: &Client, with_usage: bool) -> Result<()> {
    let started = Instant::now();
    let mut last = String::new();
    loop {
        let mut waiting = Vec::new();
        for (r, ns, n) in modelplane::tree(NAME) {
            if r.kind == "ProviderConfig" || r.kind == "Usage" {
                continue;
            }
            let api: Api<DynamicObject> = match &ns {
                Some(ns) => Api::namespaced_with(client.clone(), ns, &r),
                None => Api::all_with(client.clone(), &r),
            };
            match api.get_opt(&n).await {
                Ok(Some(o)) if is_ready(&o) => {}
                Ok(Some(_)) => waiting.push(format!("{}/{n} (not ready)", r.kind)),
                _ => waiting.push(format!("{}/{n} (not there yet)", r.kind)),
            }
        }
        let eks: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            SYSTEM_NAMESPACE,
            &modelplane::eks_clusters(),
        );
        let in_use = !with_usage
            || eks.get_opt(NAME).await.ok().flatten().is_some_and(|o| {
                o.labels().get("crossplane.io/in-use").map(String::as_str) == Some("true")
            });
        if waiting.is_empty() && in_use {
            say(&format!(
                "the tree is ready after {:.0}s",
                started.elapsed().as_secs_f64()
            ));
            return Ok(());
        }
        let now = if waiting.is_empty() {
            "the Usage to take hold of the EKSCluster".to_string()
        } else {
            waiting.join(", ")
        };
        if now != last {
            say(&format!(
                "{:>4.0}s waiting for {now}",
                started.elapsed().as_secs_f64()
            ));
            last = now;
        }
        if started.elapsed() > Duration::from_secs(400) {
            bail!("the tree did not become ready; see .local-cluster/logs/");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

fn is_ready(object: &DynamicObject) -> bool {
    conditions(object).iter().any(|c| {
        c.get("type").and_then(Value::as_str) == Some("Ready")
            && c.get("status").and_then(Value::as_str) == Some("True")
    })
}

fn conditions(object: &DynamicObject) -> Vec<Value> {
    object
        .data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// The objects of the demo's tree still in the API.
async fn tree_left(client: &Client) -> Vec<String> {
    let mut left = Vec::new();
    for (r, ns, n) in modelplane::tree(NAME) {
        let api: Api<DynamicObject> = match &ns {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &r),
            None => Api::all_with(client.clone(), &r),
        };
        if let Ok(Some(_)) = api.get_opt(&n).await {
            left.push(format!("{}/{n}", r.kind));
        }
    }
    left
}

/// The tree's managed resources that are being deleted, each with its API.
async fn deleting_managed(client: &Client) -> Vec<(Api<DynamicObject>, DynamicObject)> {
    let mut deleting = Vec::new();
    for (r, _, n) in modelplane::tree(NAME) {
        if r.kind != "Release" && r.kind != "Object" {
            continue;
        }
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), SYSTEM_NAMESPACE, &r);
        if let Ok(Some(o)) = api.get_opt(&n).await
            && o.metadata.deletion_timestamp.is_some()
        {
            deleting.push((api, o));
        }
    }
    deleting
}

/// Deleted managed resources of the tree held by their provider, with the
/// provider's words.
async fn wedged(client: &Client) -> Vec<(String, String, String)> {
    let mut wedged = Vec::new();
    for (_, o) in deleting_managed(client).await {
        let message = conditions(&o)
            .iter()
            .find(|c| c.get("type").and_then(Value::as_str) == Some("Synced"))
            .and_then(|c| c.get("message").and_then(Value::as_str))
            .unwrap_or("held by finalizer.managedresource.crossplane.io")
            .to_string();
        let kind = o.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default();
        wedged.push((kind, o.name_any(), message));
    }
    wedged
}

/// Removes the providers' finalizer from deleted managed resources of the tree.
async fn abandon_wedged(client: &Client) {
    for (api, o) in deleting_managed(client).await {
        let _ = api
            .patch(
                &o.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await;
    }
}

/// What the local cloud logged as leaked for the demo's cluster.
fn leaked(logs: &Path) -> Vec<String> {
    let log = std::fs::read_to_string(logs.join("local-cloud.log")).unwrap_or_default();
    modelplane::leaked(&log, NAME)
}

async fn annotate_xrds(client: &Client, mode: &str) -> Result<()> {
    let xrds: Api<DynamicObject> =
        Api::all_with(client.clone(), &local_cluster::crossplane::xrd_resource());
    for r in [
        modelplane::inference_clusters(),
        modelplane::eks_clusters(),
        modelplane::serving_stacks(),
    ] {
        let name = format!("{}.{}", r.plural, r.group);
        xrds.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"cascade-guard.dev/deletion-policy": mode}}}),
            ),
        )
        .await
        .with_context(|| format!("annotating {name}"))?;
    }
    Ok(())
}

/// Until the InferenceCluster kind's admission policy is in force.
async fn wait_for_protection(client: &Client) -> Result<()> {
    let policies: Api<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy> =
        Api::all(client.clone());
    // Every XRD of one mode shares a policy; it lists the kinds it carries.
    let ok = wait::until(Duration::from_secs(60), || async {
        let list = policies.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .any(|p| {
                p.annotations()
                    .get(PROTECTED_KINDS_ANNOTATION)
                    .is_some_and(|kinds| kinds.contains("\"InferenceCluster.modelplane.ai\""))
            })
            .then_some(())
    })
    .await;
    if ok.is_none() {
        bail!("cascade-guard did not compile the InferenceCluster's policy");
    }
    // The API server loads new policies within a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    Ok(())
}
