//! Policies travel with the package, on real Crossplane: Modelplane's real
//! XRDs (from the fixtures), annotated with `cascade-guard.dev/deletion-policy`,
//! and the project's Compositions are built into a Configuration package with
//! crank (`crossplane xpkg build`, `testbed/tools/crank.sh`), pushed to an OCI
//! registry on loopback (`crane registry serve`) and installed by Crossplane's
//! package manager from a `Configuration` object. cascade-guard runs as the
//! chart installs it (its RBAC, the package's groups protected) with
//! `--xrd-default-mode=Off`, so the package's annotation is all that protects
//! the kinds: it protects them as Crossplane creates them, with no other step,
//! and a package upgrade that changes the annotation (Refuse → Convert) changes
//! the protection of the next delete.
//!
//! Core and function-patch-and-transform only (no providers, no local cloud):
//! an InferenceCluster composes its EKSCluster, ServingStack and Usage, which
//! is what a delete of it has to cascade; those two compose kinds that only the
//! providers and the local cloud serve, and stay unready.

use std::time::{Duration, Instant};

use cascade_guard_testkit::chart;
use kube::api::{ApiResource, DeleteParams, DynamicObject, PostParams, PropagationPolicy};
use kube::{Api, Client};
use local_cluster::process::{self, Lifetime, Process};
use local_cluster::real_crossplane::modelplane::{self, SYSTEM_NAMESPACE};
use local_cluster::real_crossplane::package::{self, ConfigurationPackage, PackageTools, Registry};
use local_cluster::real_crossplane::{Crossplane, CrossplaneOptions};
use local_cluster::{ControlPlane, Options, wait};
use serde_json::{Value, json};

const POLICY_ANNOTATION: &str = "cascade-guard.dev/deletion-policy";
const HOLD_FINALIZER: &str = "cascade-guard.dev/foreground-cascade";
const CONFIGURATION: &str = "modelplane-platform";
const REPOSITORY: &str = "cascade-guard/modelplane-platform";
const IC_XRD: &str = "inferenceclusters.modelplane.ai";
const IC_KIND: &str = "InferenceCluster.modelplane.ai";
/// The values a platform team sets for the package's kinds.
const CHART_VALUES: &str = "protectedGroups: [modelplane.ai, infrastructure.modelplane.ai]\n";
/// A package pull, a revision and its objects: seconds here.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(180);
/// The Usage in the tree re-checks its user every 30 s; meanwhile Crossplane's
/// usage webhook refuses the garbage collector's delete of the EKSCluster it
/// protects, and the collector retries with a back-off that doubles (5 ms up
/// to 1,000 s), so once the Usage is gone the next retry can be as far off as
/// the time already spent, should Crossplane's one replay of the delete be
/// refused too. Typical: 9 to 49 s here; CI once saw it pass 240 s.
const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(420);

struct Stack {
    cp: ControlPlane,
    crossplane: Crossplane,
    tools: PackageTools,
    registry: Registry,
    client: Client,
    /// Stopped when dropped.
    _controller: Process,
    charts: Vec<(&'static str, String)>,
}

async fn start() -> Stack {
    local_cluster::testing::init_tracing();
    let cp = ControlPlane::start(Options {
        crds: cascade_guard::api::crds(),
        ..Options::default()
    })
    .await
    .unwrap_or_else(|e| panic!("cannot start the control plane: {e}"));
    let crossplane = Crossplane::start(
        &cp,
        CrossplaneOptions {
            providers: false,
            ..CrossplaneOptions::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("cannot start Crossplane: {e}"));
    let tools = tokio::task::spawn_blocking(PackageTools::locate)
        .await
        .expect("locating crank and crane")
        .unwrap_or_else(|e| panic!("no crank or crane: {e}"));
    let registry = Registry::start(&tools, &crossplane, &cp.log_path("package-registry"))
        .await
        .unwrap_or_else(|e| panic!("cannot start the registry: {e}\n{}", cp.log_tails(20)));
    let client = cp.admin().await.expect("admin client");
    let charts = modelplane::serve_charts(&crossplane, &cp.dir().join("charts"))
        .unwrap_or_else(|e| panic!("cannot serve the charts: {e}"));
    modelplane::ensure_namespace(&client)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // As a platform team installs it: the chart's RBAC, the package's
    // groups protected.
    let kubeconfig = cp.dir().join("cascade-guard.kubeconfig");
    chart::install_rbac(&cp, &client, CHART_VALUES, &kubeconfig).await;
    let controller = process::spawn(
        "cascade-guard",
        std::path::Path::new(env!("CARGO_BIN_EXE_cascade-guard")),
        &[
            "run".to_string(),
            format!("--kubeconfig={}", kubeconfig.display()),
            // Only the package's annotation protects.
            "--xrd-default-mode=Off".to_string(),
            "--http-address=127.0.0.1:0".to_string(),
            "--no-leader-election".to_string(),
            // Its ConfigMaps where the chart's Role lets it keep them.
            format!("--leader-election-namespace={}", chart::NAMESPACE),
        ],
        &cp.log_path("cascade-guard"),
        Lifetime::Owned,
    )
    .unwrap_or_else(|e| panic!("cannot start cascade-guard: {e}"));
    Stack {
        cp,
        crossplane,
        tools,
        registry,
        client,
        _controller: controller,
        charts,
    }
}

impl Stack {
    /// The platform package with InferenceCluster's annotation `mode` (the
    /// EKSCluster and ServingStack stay Refuse in every version).
    fn platform(&self, mode: &str) -> ConfigurationPackage {
        package::modelplane_platform(CONFIGURATION, &self.charts, |dir| {
            let mode = if dir == "inferenceclusters" {
                mode
            } else {
                "Refuse"
            };
            json!({ POLICY_ANNOTATION: mode })
        })
        .unwrap_or_else(|e| panic!("cannot assemble the package: {e}"))
    }

    /// Builds `package`, pushes it as `tag`, points the Configuration at it
    /// and waits until Crossplane runs it. Returns the reference.
    async fn ship(&self, package: &ConfigurationPackage, tag: &str) -> String {
        let started = Instant::now();
        let root = self.cp.dir().join(format!("package-{tag}"));
        let file = package
            .build(&self.tools, &root)
            .await
            .unwrap_or_else(|e| panic!("xpkg build: {e}"));
        let reference = self.registry.reference(REPOSITORY, tag);
        package::push(&self.tools, &file, &reference)
            .await
            .unwrap_or_else(|e| panic!("xpkg push: {e}"));
        let built = started.elapsed();
        package::install(&self.client, CONFIGURATION, &reference)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        package::wait_installed(&self.client, CONFIGURATION, &reference, INSTALL_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", self.cp.log_tails(30)));
        eprintln!(
            "{tag}: built and pushed in {built:?}, installed {:?} later",
            started.elapsed() - built
        );
        reference
    }

    /// `cascade-guard status -o json`.
    fn status(&self) -> Value {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_cascade-guard"))
            .arg("status")
            .arg(format!(
                "--kubeconfig={}",
                self.cp.kubeconfig_path().display()
            ))
            .args(["--xrd-default-mode=Off", "-o", "json"])
            .output()
            .expect("cascade-guard status");
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!(
                "status is not JSON ({e}): {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )
        })
    }

    /// Waits until `status` says InferenceCluster is protected in `mode` by
    /// its XRD's annotation, with the admission policies in place.
    async fn wait_protected(&self, mode: &str) -> Value {
        let found = wait::until_lasting(Duration::from_secs(60), || async {
            let status = self.status();
            let ic = status["protected"]
                .as_array()?
                .iter()
                .find(|p| p["kind"] == IC_KIND)?
                .clone();
            (ic["mode"] == mode && status["admission"]["inSync"] == true).then_some(ic)
        })
        .await;
        found
            .unwrap_or_else(|| panic!("status never showed {IC_KIND} in {mode}: {}", self.status()))
    }

    fn inference_clusters(&self) -> Api<DynamicObject> {
        Api::all_with(self.client.clone(), &modelplane::inference_clusters())
    }

    async fn xrd_annotation(&self) -> (Option<String>, Vec<String>) {
        let xrds: Api<DynamicObject> = Api::all_with(
            self.client.clone(),
            &local_cluster::crossplane::xrd_resource(),
        );
        let xrd = xrds.get(IC_XRD).await.expect("the package's XRD");
        let annotation = xrd
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(POLICY_ANNOTATION).cloned());
        let owners = xrd
            .metadata
            .owner_references
            .unwrap_or_default()
            .into_iter()
            .map(|o| o.kind)
            .collect();
        (annotation, owners)
    }

    /// Creates InferenceCluster `name` and waits until Crossplane has
    /// composed its tree (so a delete has something to cascade).
    async fn create_composed(&self, name: &str) {
        let object: DynamicObject =
            serde_json::from_value(modelplane::inference_cluster(name)).expect("object");
        self.inference_clusters()
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("creating InferenceCluster {name}: {e}"));
        let composed = wait::until_lasting(Duration::from_secs(120), || async {
            let ic = self.inference_clusters().get(name).await.ok()?;
            let refs = ic
                .data
                .pointer("/spec/crossplane/resourceRefs")?
                .as_array()?;
            (refs.len() == 3).then_some(())
        })
        .await;
        assert!(
            composed.is_some(),
            "Crossplane did not compose InferenceCluster {name}\n{}",
            self.cp.log_tails(30)
        );
    }

    /// Waits until InferenceCluster `name` carries `finalizer`.
    async fn wait_finalizer(&self, name: &str, finalizer: &str) -> Option<()> {
        wait::until(Duration::from_secs(30), || async {
            let ic = self.inference_clusters().get(name).await.ok()?;
            ic.metadata
                .finalizers
                .unwrap_or_default()
                .iter()
                .any(|f| f == finalizer)
                .then_some(())
        })
        .await
    }

    /// What a teardown of InferenceCluster `name` that did not end left
    /// behind, for the failure: each object of the tree as it stands, every
    /// delete of it the API server answered, and what the components said
    /// of it.
    async fn teardown_story(&self, name: &str) -> String {
        let mut out = String::from("----- the tree now -----\n");
        let root = self.inference_clusters().get_opt(name).await;
        out.push_str(&format!("InferenceCluster {name}: {}\n", standing(root)));
        for (resource, child) in composed(name) {
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), SYSTEM_NAMESPACE, &resource);
            let object = api.get_opt(&child).await;
            out.push_str(&format!(
                "{} {child}: {}\n",
                resource.kind,
                standing(object)
            ));
        }
        out.push_str("----- deletes of the tree (audit log) -----\n");
        match local_cluster::audit::read(&self.cp.audit_log_path()) {
            Ok(events) => {
                for e in events.iter().filter(|e| {
                    e.object_ref
                        .as_ref()
                        .is_some_and(|r| r.name.starts_with(name))
                }) {
                    let what = e.object_ref.as_ref().map(|r| r.resource.as_str());
                    let object = e.object_ref.as_ref().map(|r| r.name.as_str());
                    out.push_str(&format!(
                        "{} {} by {} policy {:?} dry run {} -> {:?}\n",
                        what.unwrap_or_default(),
                        object.unwrap_or_default(),
                        e.effective_username(),
                        e.propagation_policy(),
                        e.dry_run(),
                        e.response_status
                    ));
                }
            }
            Err(e) => out.push_str(&format!("cannot read the audit log: {e}\n")),
        }
        out.push_str(&self.cp.log_lines_naming(name));
        out
    }

    /// A plain delete, as `kubectl delete` sends it (Background).
    async fn plain_delete(&self, name: &str, dry_run: bool) -> Result<(), kube::Error> {
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            dry_run,
            ..DeleteParams::default()
        };
        self.inference_clusters()
            .delete(name, &params)
            .await
            .map(|_| ())
    }
}

fn refusal(result: Result<(), kube::Error>) -> Option<String> {
    match result {
        Err(kube::Error::Api(e)) if e.code == 403 => Some(e.message),
        _ => None,
    }
}

/// An object as a failing test shows it: gone, or its deletion timestamp,
/// finalizers, labels and annotations.
fn standing(object: Result<Option<DynamicObject>, kube::Error>) -> String {
    match object {
        Ok(None) => "gone".to_string(),
        Ok(Some(o)) => format!(
            "deleting since {:?}, finalizers {:?}, labels {:?}, annotations {:?}, conditions {}",
            o.metadata.deletion_timestamp.map(|t| t.0),
            o.metadata.finalizers.unwrap_or_default(),
            o.metadata.labels.unwrap_or_default(),
            o.metadata
                .annotations
                .unwrap_or_default()
                .into_iter()
                .filter(|(k, _)| k != "kubectl.kubernetes.io/last-applied-configuration")
                .collect::<std::collections::BTreeMap<_, _>>(),
            o.data
                .pointer("/status/conditions")
                .cloned()
                .unwrap_or_default()
        ),
        Err(e) => format!("cannot read: {e}"),
    }
}

fn composed(name: &str) -> [(ApiResource, String); 3] {
    [
        (modelplane::eks_clusters(), name.to_string()),
        (
            modelplane::serving_stacks(),
            format!("{name}-serving-stack"),
        ),
        (modelplane::usages(), format!("{name}-usage-eks-by-backend")),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_packages_annotation_protects_and_an_upgrade_changes_the_protection() {
    let s = start().await;
    eprintln!("real Crossplane started in {:?}", s.crossplane.started_in());

    // Version 1: InferenceCluster Refuse.
    let v1 = s.ship(&s.platform("Refuse"), "v0.1.0").await;
    modelplane::wait_established(&s.client)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (annotation, owners) = s.xrd_annotation().await;
    assert_eq!(annotation.as_deref(), Some("Refuse"), "from {v1}");
    assert!(
        owners.iter().any(|o| o == "ConfigurationRevision"),
        "the XRD is not the package's: owners {owners:?}"
    );
    let protected = s.wait_protected("Refuse").await;
    assert_eq!(protected["source"], "XrdAnnotation", "{protected}");

    s.create_composed("prod").await;
    // The API server enforces a new admission policy once its cache has it:
    // a dry run goes through admission without deleting.
    let refused = wait::until_lasting(Duration::from_secs(30), || async {
        refusal(s.plain_delete("prod", true).await)
    })
    .await;
    assert!(
        refused.is_some(),
        "a dry-run background delete was never refused"
    );
    let message = refusal(s.plain_delete("prod", false).await)
        .expect("a plain background delete of a composed InferenceCluster is refused");
    assert!(
        message.contains("cascade-guard refused to delete InferenceCluster prod"),
        "{message}"
    );
    assert!(message.contains("--cascade=foreground"), "{message}");
    let still = s.inference_clusters().get("prod").await.expect("prod");
    assert!(still.metadata.deletion_timestamp.is_none());

    // Version 2: the same package with InferenceCluster Convert; the
    // Configuration's package reference bumped, nothing else.
    let upgrade = Instant::now();
    let v2 = s.ship(&s.platform("Convert"), "v0.2.0").await;
    let configuration = package::wait_installed(&s.client, CONFIGURATION, &v2, INSTALL_TIMEOUT)
        .await
        .expect("still installed");
    assert_ne!(
        configuration["status"]["currentRevision"], "",
        "{configuration}"
    );
    let changed = wait::until_lasting(Duration::from_secs(60), || async {
        let (annotation, _) = s.xrd_annotation().await;
        (annotation.as_deref() == Some("Convert")).then_some(())
    })
    .await;
    assert!(
        changed.is_some(),
        "the upgrade did not change the XRD's annotation"
    );
    s.wait_protected("Convert").await;
    eprintln!(
        "the upgrade's Convert in force {:?} after the push began",
        upgrade.elapsed()
    );
    // The existing InferenceCluster is now held by cascade-guard.
    let held = s.wait_finalizer("prod", HOLD_FINALIZER).await;
    assert!(
        held.is_some(),
        "prod was never held\n{}",
        s.cp.log_tails(20)
    );

    // The Convert policy replaced the Refuse one under the same name, and the
    // API server enforces it once its policy cache has reloaded (about a
    // second): a dry run shows when the plain delete is let through.
    let accepted = wait::until_lasting(Duration::from_secs(30), || async {
        s.plain_delete("prod", true).await.ok()
    })
    .await;
    assert!(
        accepted.is_some(),
        "a dry-run plain delete of held prod was never accepted: {:?}",
        s.plain_delete("prod", true).await
    );

    // The same plain delete now goes through, as a foreground cascade.
    let deleted = Instant::now();
    s.plain_delete("prod", false)
        .await
        .expect("under Convert a plain delete is accepted");
    let converted = s.wait_finalizer("prod", "foregroundDeletion").await;
    assert!(
        converted.is_some(),
        "prod's delete was not made a foreground cascade"
    );
    let gone = wait::until_lasting(TEARDOWN_TIMEOUT, || async {
        match s.inference_clusters().get_opt("prod").await {
            Ok(None) => Some(()),
            _ => None,
        }
    })
    .await;
    assert!(
        gone.is_some(),
        "prod was never gone\n{}",
        s.teardown_story("prod").await
    );
    eprintln!("prod's foreground cascade took {:?}", deleted.elapsed());
    // Foreground: what it composed was gone before it.
    for (resource, name) in composed("prod") {
        let api: Api<DynamicObject> =
            Api::namespaced_with(s.client.clone(), SYSTEM_NAMESPACE, &resource);
        let left = api
            .get_opt(&name)
            .await
            .expect("reading what prod composed");
        assert!(left.is_none(), "{} {name} outlived prod", resource.kind);
    }
    let events = wait::until_lasting(Duration::from_secs(30), || async {
        let events = cascade_guard_testkit::events_about(&s.client, "prod").await;
        let reasons: Vec<_> = events.iter().map(|(r, _)| r.as_str()).collect();
        (reasons.contains(&"ForegroundCascade") && reasons.contains(&"CascadeComplete"))
            .then_some(events)
    })
    .await;
    assert!(
        events.is_some(),
        "no ForegroundCascade and CascadeComplete Events on prod: {:?}",
        cascade_guard_testkit::events_about(&s.client, "prod").await
    );
}
