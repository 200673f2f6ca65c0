//! The demo (scripts/demo.sh runs it against the local control plane): the
//! seed's InferenceCluster on a model of Crossplane, deleted with a plain
//! `kubectl delete`, with cascade-guard in Convert mode, followed live by
//! `cascade-guard trace`.
//!
//!   demo --kubeconfig PATH [--mode Convert|Refuse|Off]
//!
//! Off shows the failure the seed reports: the cluster goes while the Helm
//! releases still uninstall, and they wedge.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cascade_guard::api::CascadePolicy;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, CustomResourceExt, ResourceExt};
use local_cluster::model::{Model, Options as ModelOptions, modelplane};
use local_cluster::{Binaries, wait};
use serde_json::json;

const NAME: &str = "prod";

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
    if !["Convert", "Refuse", "Off"].contains(&mode.as_str()) {
        bail!("--mode is Convert, Refuse or Off");
    }
    let config = Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&kubeconfig)?,
        &KubeConfigOptions::default(),
    )
    .await?;
    let client = Client::try_from(config.clone())?;
    let logs = kubeconfig
        .parent()
        .map(|d| d.join("logs"))
        .unwrap_or_default();

    say(
        "installing the CRDs: Crossplane's, Modelplane's XRDs as Crossplane generates them, cascade-guard's",
    );
    install_crds(&client).await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces
        .get_opt(modelplane::SYSTEM_NAMESPACE)
        .await?
        .is_none()
    {
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(
                    json!({"metadata": {"name": modelplane::SYSTEM_NAMESPACE}}),
                )?,
            )
            .await?;
    }

    say(
        "starting the model of Crossplane: composite finalizers, Usages and their webhook, providers",
    );
    let model = Model::start(config, ModelOptions::modelplane()).await?;

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
            "--kubeconfig",
        ])
        .arg(&kubeconfig)
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting cascade-guard")?;

    let result = run(&client, &cascade_guard, &kubeconfig, &mode).await;
    let _ = controller.kill();
    let _ = controller.wait();
    drop(model);
    println!();
    say(&format!(
        "the control plane is still running: export KUBECONFIG={}; stop it with: cargo run -p local-cluster -- down",
        kubeconfig.display()
    ));
    result
}

async fn run(client: &Client, cascade_guard: &Path, kubeconfig: &Path, mode: &str) -> Result<()> {
    let ics: Api<DynamicObject> = Api::all_with(client.clone(), &modelplane::inference_clusters());
    if ics.get_opt(NAME).await?.is_some() {
        say("removing the InferenceCluster left by an earlier run");
        let _ = ics
            .patch(
                NAME,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"cascade-guard.dev/break-glass": "demo clean-up"}}})),
            )
            .await;
        let _ = ics.delete(NAME, &DeleteParams::foreground()).await;
        let gone = wait::until(Duration::from_secs(120), || async {
            ics.get_opt(NAME).await.ok()?.is_none().then_some(())
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

    say(
        "creating InferenceCluster prod: an EKSCluster (its cloud cluster takes 3 s to delete), a ServingStack",
    );
    say(
        "with three Helm releases (each takes 6 s to uninstall, and needs the cluster), and a Usage of the",
    );
    say(
        "EKSCluster by the ServingStack, as Modelplane's compose-inference-cluster function composes them",
    );
    let ic =
        modelplane::InferenceCluster::new(NAME, Duration::from_secs(3), Duration::from_secs(6));
    ic.tree().create(client).await?;
    if mode == "Convert" {
        let held = wait::until(Duration::from_secs(30), || async {
            let o = ics.get(NAME).await.ok()?;
            o.finalizers()
                .iter()
                .any(|f| f == "cascade-guard.dev/foreground-cascade")
                .then_some(())
        })
        .await;
        if held.is_none() {
            bail!("cascade-guard did not hold the InferenceCluster");
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

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
    let timeout = if mode == "Off" { "30" } else { "120" };
    let started = Instant::now();
    let mut trace = Command::new(cascade_guard)
        .args([
            "trace",
            "inferencecluster",
            NAME,
            "--interval-ms",
            "250",
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
        if trace.success() {
            say("this time the releases finished before the cluster went: the race went well");
        } else {
            say(&format!(
                "without cascade-guard the teardown wedged after {:.0}s: the cloud cluster went while the Helm",
                started.elapsed().as_secs_f64()
            ));
            say(
                "releases were still uninstalling, and they can never finish. This is the seed report's failure.",
            );
        }
        // So that the demo can run again: abandon the wedged objects on purpose,
        // as an operator would have to by hand.
        for kind in local_cluster::model::provider::ProviderKind::all() {
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), modelplane::SYSTEM_NAMESPACE, &kind.resource);
            for o in api.list(&Default::default()).await?.items {
                if o.metadata.deletion_timestamp.is_some() {
                    let _ = api
                        .patch(
                            &o.name_any(),
                            &PatchParams::default(),
                            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                        )
                        .await;
                }
            }
        }
        return Ok(());
    }
    if !trace.success() {
        bail!("the teardown did not complete");
    }
    Ok(())
}

fn say(line: &str) {
    println!("demo: {line}");
}

async fn install_crds(client: &Client) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut crds = modelplane::crds()?;
    crds.push(CascadePolicy::crd());
    let mut created = false;
    for crd in &crds {
        let name = crd.name_any();
        if api.get_opt(&name).await?.is_none() {
            api.create(&PostParams::default(), crd).await?;
            created = true;
        }
    }
    for crd in &crds {
        local_cluster::wait::crd_established(client, &crd.name_any(), Duration::from_secs(30))
            .await?;
    }
    if created {
        say("waiting for the garbage collector to watch the new kinds (it looks every 30 s)");
        wait_for_garbage_collector(client).await?;
    }
    Ok(())
}

/// A foreground delete of a ServingStack with a blocking dependent completes
/// only once the garbage collector watches the new kinds.
async fn wait_for_garbage_collector(client: &Client) -> Result<()> {
    let ns = modelplane::SYSTEM_NAMESPACE;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(ns).await?.is_none() {
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
            )
            .await?;
    }
    let stacks: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &modelplane::serving_stacks());
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let name = format!("gc-probe-{attempt}");
        let probe = DynamicObject::new(&name, &modelplane::serving_stacks())
            .within(ns)
            .data(
                json!({"spec": modelplane::minimal_spec(&modelplane::serving_stacks(), "probe")}),
            );
        let probe = stacks.create(&PostParams::default(), &probe).await?;
        maps.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name, "ownerReferences": [{
                "apiVersion": probe.types.as_ref().map(|t| t.api_version.clone()).unwrap_or_default(),
                "kind": "ServingStack", "name": name, "uid": probe.uid(), "blockOwnerDeletion": true}]}}))?,
        )
        .await?;
        stacks.delete(&name, &DeleteParams::foreground()).await?;
        let gone = wait::until(Duration::from_secs(5), || async {
            stacks.get_opt(&name).await.ok()?.is_none().then_some(())
        })
        .await;
        if gone.is_some() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the garbage collector did not start watching the new kinds");
        }
    }
}

async fn annotate_xrds(client: &Client, mode: &str) -> Result<()> {
    let xrds: Api<DynamicObject> =
        Api::all_with(client.clone(), &local_cluster::crossplane::xrd_resource());
    for mut xrd in modelplane::xrds()? {
        xrd["metadata"]["annotations"] = json!({"cascade-guard.dev/deletion-policy": mode});
        let name = xrd["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let object: DynamicObject = serde_json::from_value(xrd)?;
        xrds.patch(
            &name,
            &PatchParams::apply("cascade-guard-demo").force(),
            &Patch::Apply(&object),
        )
        .await?;
    }
    Ok(())
}

/// Until the InferenceCluster kind's admission policy is in force.
async fn wait_for_protection(client: &Client) -> Result<()> {
    let policies: Api<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy> =
        Api::all(client.clone());
    let ok = wait::until(Duration::from_secs(60), || async {
        policies
            .get_opt("cascade-guard-xrd-inferenceclusters.modelplane.ai")
            .await
            .ok()?
            .map(|_| ())
    })
    .await;
    if ok.is_none() {
        bail!("cascade-guard did not compile the InferenceCluster's policy");
    }
    // The API server loads new policies within a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    Ok(())
}
