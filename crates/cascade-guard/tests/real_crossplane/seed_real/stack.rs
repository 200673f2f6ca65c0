//! The one real-Crossplane stack the tests share: the control plane, Crossplane,
//! the platform in each mode, cascade-guard's replicas, and what stops and
//! starts them.

use super::*;

pub(crate) struct Stack {
    pub(crate) cp: ControlPlane,
    /// Its processes stop when it is dropped; the random test kills core and
    /// the providers.
    pub(crate) crossplane: StdMutex<Crossplane>,
    pub(crate) kubectl: PathBuf,
    /// cascade-guard's replicas, with leader election (the random test kills
    /// the leader).
    pub(crate) controller: StdMutex<Replicas>,
    /// The kube-apiserver the random test started in place of the control
    /// plane's own, once it has restarted it (`ControlPlane::restart` needs
    /// the control plane mutably, which a stack shared by every test is not).
    pub(crate) apiserver: tokio::sync::Mutex<Option<Process>>,
    /// The randomized test SIGKILLs Crossplane core, a provider and
    /// cascade-guard and restarts kube-apiserver, which every test's objects
    /// need (a build, a refusal, a conversion, a teardown in time): it owns
    /// this while it kills, once every other test, which shares it
    /// throughout ([`shared_stack`]), is done.
    pub(crate) fault_window: FaultWindow,
    /// The replicas run with `--hold-composed`, as the README tells a
    /// platform on Crossplane v2.0 or v2.1 to run them.
    pub(crate) hold_composed: bool,
}

/// How long a leader kill waits for a replica to hold the Lease: a
/// failover takes the lease's 15 s.
pub(crate) const LEADER_WAIT: Duration = Duration::from_secs(20);

/// How many replicas of cascade-guard run: the leader and one candidate, as
/// the chart's HA install (`replicaCount: 2`).
pub(crate) const REPLICAS: usize = 2;

/// cascade-guard's replicas, as a Deployment keeps them: each slot runs one
/// process, started again when it exits (a lost Lease ends a leader) unless a
/// fault holds it down.
pub(crate) struct Replicas {
    /// How many processes were started: each gets a name (and a log, and a
    /// leader-election identity) of its own.
    pub(crate) started: usize,
    pub(crate) slots: Vec<Slot>,
}

pub(crate) struct Slot {
    pub(crate) process: Option<Process>,
    /// Killed by a fault and kept down until it ends.
    pub(crate) held_down: bool,
}

pub(crate) async fn stack() -> &'static Stack {
    static STACK: OnceCell<Stack> = OnceCell::const_new();
    static SUPERVISED: std::sync::Once = std::sync::Once::new();
    let stack = STACK.get_or_init(start).await;
    // As the Deployment would: a replica that exits on its own (its Lease
    // lost when a loaded machine delays a renewal) is started again, for
    // every test, not only during the random round. A thread, not a task:
    // each test has a runtime of its own, and the stack outlives them all.
    SUPERVISED.call_once(|| {
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_secs(2));
                let started = stack.start_replicas(false);
                if !started.is_empty() {
                    eprintln!("cascade-guard replicas that exited started again: {started:?}");
                }
            }
        });
    });
    stack
}

/// The stack, and a share of it that keeps the randomized test's kills away
/// until the caller's test ends.
pub(crate) async fn shared_stack() -> (&'static Stack, Shared) {
    let clock = TestClock::start();
    let stack = stack().await;
    let guard = stack.fault_window.share().await;
    (
        stack,
        Shared {
            _guard: guard,
            _clock: clock,
        },
    )
}

/// A test's hold on the shared stack (see [`shared_stack`]), timed.
pub(crate) struct Shared {
    pub(crate) _guard: fault_window::Sharing,
    pub(crate) _clock: TestClock,
}

/// When a test started and ended, in seconds from the binary's first test:
/// appended as `test<TAB>start<TAB>end` to the file named by
/// `SEED_REAL_TIMES`, if set (scripts/run-test-binaries.sh sets it), so that
/// the binary's critical path can be read after a run.
pub(crate) struct TestClock {
    pub(crate) test: String,
    pub(crate) started: Instant,
}

impl TestClock {
    pub(crate) fn epoch() -> Instant {
        static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *EPOCH.get_or_init(Instant::now)
    }

    pub(crate) fn start() -> Self {
        Self::part("")
    }

    /// A part of the test, named after it: `what` is added to its name.
    pub(crate) fn part(what: &str) -> Self {
        Self::epoch();
        Self {
            test: format!("{}{what}", std::thread::current().name().unwrap_or("?")),
            started: Instant::now(),
        }
    }
}

impl Drop for TestClock {
    fn drop(&mut self) {
        let Some(path) = std::env::var_os("SEED_REAL_TIMES") else {
            return;
        };
        let epoch = Self::epoch();
        let line = format!(
            "{}\t{:.0}\t{:.0}{}\n",
            self.test,
            self.started.duration_since(epoch).as_secs_f64(),
            epoch.elapsed().as_secs_f64(),
            if std::thread::panicking() {
                "\tfailed"
            } else {
                ""
            },
        );
        use std::io::Write;
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            eprintln!("cannot record the test's time in {path:?}: {e}");
        }
    }
}

pub(crate) async fn start() -> Stack {
    local_cluster::testing::init_tracing();
    let cp = ControlPlane::start(Options {
        crds: cascade_guard::api::crds(),
        ..Options::default()
    })
    .await
    .unwrap_or_else(|e| panic!("cannot start the control plane: {e}"));
    let crossplane = Crossplane::start(&cp, CrossplaneOptions::default())
        .await
        .unwrap_or_else(|e| panic!("cannot start Crossplane: {e}"));
    eprintln!("real Crossplane started in {:?}", crossplane.started_in());
    let client = cp.admin().await.expect("admin client");
    let platforms: Vec<modelplane::Platform> = PLATFORM_MODES
        .iter()
        .map(|m| m.platform())
        .chain([random_platform()])
        .collect();
    let installs = platforms.iter().enumerate().map(|(i, platform)| {
        let (client, crossplane) = (&client, &crossplane);
        // Each install packs the charts: a directory of its own.
        let scratch = cp.dir().join("charts").join(i.to_string());
        async move {
            modelplane::install(client, crossplane, &scratch, platform)
                .await
                .unwrap_or_else(|e| panic!("cannot install the platform {platform:?}: {e}"))
        }
    });
    futures::future::join_all(installs).await;
    as_installed(&cp, &client).await;
    let hold_composed = needs_hold_composed(crossplane.version());
    let slots = (0..REPLICAS)
        .map(|n| Slot {
            process: Some(spawn_controller(&cp, n, hold_composed)),
            held_down: false,
        })
        .collect();
    let kubectl = Binaries::locate().expect("binaries").kubectl;
    Stack {
        cp,
        crossplane: StdMutex::new(crossplane),
        kubectl,
        controller: StdMutex::new(Replicas {
            started: REPLICAS,
            slots,
        }),
        apiserver: tokio::sync::Mutex::new(None),
        fault_window: FaultWindow::default(),
        hold_composed,
    }
}

/// Crossplane v2.0 and v2.1 delete a composed resource dropped from its
/// Composition with no propagation policy (v2.2 sends Foreground): the
/// README's Crossplane table tells a platform on them to set holdComposed.
pub(crate) fn needs_hold_composed(version: local_cluster::real_crossplane::CoreVersion) -> bool {
    version.major == 2 && version.minor < 2
}

/// The values a platform team sets, as the README and values.yaml say:
/// `protectedGroups` the XR groups (here every copy's, and the test kinds'),
/// `composedResources` the providers' groups, read-only.
pub(crate) fn chart_values() -> String {
    let mut groups = Vec::new();
    for variant in ["off", "refuse", "convert", "random"] {
        groups.push(format!("{variant}.modelplane.ai"));
        groups.push(format!("infrastructure.{variant}.modelplane.ai"));
    }
    for mode in ["off", "warn", "refuse", "convert"] {
        groups.push(format!("{mode}.fleet.local-cluster.dev"));
        groups.push(super::references::exposed_group(mode));
    }
    groups.push(CLAIM_GROUP.to_string());
    groups.push(DROP_GROUP.to_string());
    format!(
        "protectedGroups: [{}]\ncomposedResources:\n  - apiGroups: [helm.m.crossplane.io, kubernetes.m.crossplane.io, cloud.local-cluster.dev, helm.crossplane.io, kubernetes.crossplane.io]\n    resources: [\"*\"]\n",
        groups.join(", ")
    )
}

/// cascade-guard as a platform team installs it: the chart's RBAC with
/// [`chart_values`] and a kubeconfig that acts as its ServiceAccount, which
/// the replicas run with.
pub(crate) async fn as_installed(cp: &ControlPlane, client: &Client) {
    let kubeconfig = cp.dir().join("cascade-guard.kubeconfig");
    chart::install_rbac(cp, client, &chart_values(), &kubeconfig).await;
}

/// The Lease cascade-guard's replicas contend for: the chart's release
/// namespace, where its Role lets it keep the Lease and sibling order's
/// ConfigMaps.
pub(crate) const LEASE_NAMESPACE: &str = chart::NAMESPACE;
pub(crate) const LEASE_NAME: &str = "cascade-guard";

/// Starts `cascade-guard run` number `n`, a replica with leader election
/// whose identity is its process name (`POD_NAME`, as the chart sets it).
pub(crate) fn spawn_controller(cp: &ControlPlane, n: usize, hold_composed: bool) -> Process {
    let name = format!("cascade-guard-{n}");
    let mut args = vec![
        "run".to_string(),
        format!(
            "--kubeconfig={}",
            cp.dir().join("cascade-guard.kubeconfig").display()
        ),
        "--xrd-default-mode=Off".to_string(),
        "--resync-seconds=20".to_string(),
        "--http-address=127.0.0.1:0".to_string(),
        format!("--leader-election-namespace={LEASE_NAMESPACE}"),
        format!("--leader-election-id={LEASE_NAME}"),
        // The gate on unordered deletes (the product's default) is shown by
        // tests/api_server/order_gate.rs and the chart's tests: here, under
        // CI's load, a look at 17 new trees once took 220 s, and these tests
        // delete trees a minute or two after making them.
        "--unordered-deletes=allow".to_string(),
    ];
    if hold_composed {
        args.push("--hold-composed".to_string());
    }
    process::spawn_with(
        &name,
        std::path::Path::new(env!("CARGO_BIN_EXE_cascade-guard")),
        &args,
        &cp.log_path(&name),
        Lifetime::Owned,
        process::Surroundings {
            env: vec![("POD_NAME".into(), name.clone().into())],
            network_namespace: None,
        },
    )
    .unwrap_or_else(|e| panic!("cannot start {name}: {e}"))
}

pub(crate) fn api(client: &Client, resource: &ApiResource, ns: Option<&str>) -> Api<DynamicObject> {
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    }
}

pub(crate) fn condition<'a>(object: &'a DynamicObject, kind: &str) -> Option<&'a Value> {
    object
        .data
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))
}

pub(crate) fn is_ready(object: &DynamicObject) -> bool {
    condition(object, "Ready").and_then(|c| c.get("status")) == Some(&json!("True"))
}

/// The provider's Synced=False message, once it has reported one.
pub(crate) fn sync_failure(object: &DynamicObject) -> Option<String> {
    let c = condition(object, "Synced")?;
    (c.get("status")? == "False").then(|| {
        c.get("message")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    })
}

/// Each object's state, for failure messages.
pub(crate) async fn states_of(
    client: &Client,
    objects: &[(ApiResource, Option<String>, String)],
) -> String {
    let mut lines = Vec::new();
    for (r, ns, n) in objects {
        let line = match api(client, r, ns.as_deref()).get_opt(n).await {
            Ok(Some(o)) => format!(
                "{}/{n}: ready={} finalizers={:?} deleting={} synced={:?}",
                r.kind,
                is_ready(&o),
                o.finalizers(),
                o.metadata.deletion_timestamp.is_some(),
                sync_failure(&o)
            ),
            Ok(None) => format!("{}/{n}: gone", r.kind),
            Err(e) => format!("{}/{n}: {e}", r.kind),
        };
        lines.push(line);
    }
    lines.join("\n")
}

/// Which of `objects` still exist.
pub(crate) async fn left_of(
    client: &Client,
    objects: &[(ApiResource, Option<String>, String)],
) -> Vec<String> {
    let mut left = Vec::new();
    for (r, ns, n) in objects {
        match api(client, r, ns.as_deref()).get_opt(n).await {
            Ok(None) => {}
            Ok(Some(_)) => left.push(format!("{}/{n}", r.kind)),
            // Not known to be gone (the API server restarting, say).
            Err(e) => left.push(format!("{}/{n} (cannot tell: {e})", r.kind)),
        }
    }
    left
}

impl Stack {
    /// SIGKILLs the replica of cascade-guard that holds the Lease, as the
    /// OOM killer or a node failure would, and keeps it down until
    /// [`Stack::restart_controller`]; returns which it killed. Mid-failover
    /// (the Lease held by a replica that is gone, or by nobody) it waits up
    /// to [`LEADER_WAIT`] for a leader, then kills any running replica.
    pub(crate) async fn kill_leader(&self) -> String {
        let client = self.cp.admin().await.expect("admin client");
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(client, LEASE_NAMESPACE);
        let deadline = Instant::now() + LEADER_WAIT;
        loop {
            let holder = leases
                .get_opt(LEASE_NAME)
                .await
                .ok()
                .flatten()
                .and_then(|l| l.spec?.holder_identity)
                .unwrap_or_default();
            let late = Instant::now() > deadline;
            {
                let mut replicas = self.controller.lock().expect("controller");
                // Only a running one: an exited process's id may be reused.
                let running: Vec<Option<String>> = replicas
                    .slots
                    .iter_mut()
                    .map(|slot| {
                        let p = slot.process.as_mut()?;
                        p.is_running().then(|| p.name.clone())
                    })
                    .collect();
                let leader = running
                    .iter()
                    .position(|n| n.as_deref() == Some(holder.as_str()));
                let any = running.iter().position(Option::is_some);
                let chosen = leader.or(if late { any } else { None });
                if let Some(i) = chosen {
                    let slot = &mut replicas.slots[i];
                    slot.held_down = true;
                    let mut p = slot.process.take().expect("a replica");
                    p.kill();
                    return if leader.is_some() {
                        format!("leader {}", p.name)
                    } else {
                        format!(
                            "{} (no leader after {LEADER_WAIT:?}: Lease held by {holder:?})",
                            p.name
                        )
                    };
                }
                if late {
                    return format!("none running (Lease held by {holder:?})");
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Starts every replica of cascade-guard that is not running (killed,
    /// or exited on a lost Lease) again, as a Deployment would; returns the
    /// names started.
    /// Every replica's log so far, one after another (the leader's among
    /// them).
    pub(crate) fn controller_logs(&self) -> String {
        let started = self.controller.lock().expect("controller").started;
        (0..started)
            .map(|n| {
                let path = self.cp.log_path(&format!("cascade-guard-{n}"));
                std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            })
            .collect()
    }

    pub(crate) fn restart_controller(&self) -> Vec<String> {
        self.start_replicas(true)
    }

    /// Starts the replicas that exited on their own (`all`: and those a
    /// fault holds down) again.
    pub(crate) fn start_replicas(&self, all: bool) -> Vec<String> {
        let mut replicas = self.controller.lock().expect("controller");
        let mut started = Vec::new();
        let mut next = replicas.started;
        for slot in replicas.slots.iter_mut() {
            if slot.held_down && !all {
                continue;
            }
            let running = slot.process.as_mut().is_some_and(|p| p.is_running());
            if !running {
                // Reaped before its slot gets a new one.
                drop(slot.process.take());
                let p = spawn_controller(&self.cp, next, self.hold_composed);
                next += 1;
                started.push(p.name.clone());
                slot.process = Some(p);
            }
            slot.held_down = false;
        }
        replicas.started = next;
        started
    }

    /// SIGKILLs process `name` of the Crossplane stack (core, a provider).
    pub(crate) fn kill_crossplane(&self, name: &str) {
        let mut crossplane = self.crossplane.lock().expect("crossplane");
        crossplane
            .kill(name)
            .unwrap_or_else(|e| panic!("cannot kill {name}: {e}"));
    }

    /// Starts every process of the Crossplane stack that is not running
    /// again; returns their names.
    pub(crate) fn restart_crossplane(&self) -> Vec<String> {
        let mut crossplane = self.crossplane.lock().expect("crossplane");
        crossplane
            .start_all_again()
            .unwrap_or_else(|e| panic!("cannot start Crossplane again: {e}"))
    }

    /// Restarts kube-apiserver as a rolling update or a crashed node would:
    /// SIGTERM (its graceful shutdown), `downtime` stopped, then the same
    /// command line again, until it serves. Stopping and starting run off the
    /// test's runtime, which keeps the round's clocks and watches going.
    pub(crate) async fn restart_apiserver(&self, downtime: Duration) {
        let mut replacement = self.apiserver.lock().await;
        let running = match replacement.take() {
            Some(p) => p,
            // The control plane's own, adopted by its process id: its
            // command line is the one to start again.
            None => {
                let state = self
                    .cp
                    .state()
                    .processes
                    .into_iter()
                    .find(|p| p.name == "kube-apiserver")
                    .expect("the control plane runs a kube-apiserver");
                Process::adopt(state.name, state.pid, state.binary, state.log)
            }
        };
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", running.pid))
            .unwrap_or_else(|e| panic!("the command line of kube-apiserver: {e}"));
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .skip(1)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let (binary, log) = (running.binary.clone(), running.log.clone());
        let stopped = tokio::task::spawn_blocking(move || {
            let mut running = running;
            running.stop(Duration::from_secs(30));
            running
        })
        .await
        .expect("stopping kube-apiserver");
        drop(stopped);
        tokio::time::sleep(downtime).await;
        let started = tokio::task::spawn_blocking(move || {
            process::spawn("kube-apiserver", &binary, &args, &log, Lifetime::Owned)
        })
        .await
        .expect("starting kube-apiserver")
        .unwrap_or_else(|e| panic!("cannot start kube-apiserver again: {e}"));
        *replacement = Some(started);
        let ready = wait::until_lasting(Duration::from_secs(120), || async {
            let client = self.cp.admin().await.ok()?;
            let request = http::Request::get("/readyz").body(Vec::new()).ok()?;
            let body = client.request_text(request).await.ok()?;
            (body.trim() == "ok").then_some(())
        })
        .await;
        assert!(
            ready.is_some(),
            "kube-apiserver not ready again after its restart\n{}",
            self.cp.log_tails(30)
        );
    }

    /// Puts `mode` on `platform`'s XRDs. The mode applies to every object of
    /// those kinds: only for a platform no other test uses (the randomized
    /// test's).
    pub(crate) async fn put_mode(&self, platform: &modelplane::Platform, mode: Mode) {
        let client = self.cp.admin().await.expect("admin client");
        let xrds = api(&client, &v2_xrds(), None);
        for r in platform.xr_kinds() {
            let xrd = format!("{}.{}", r.plural, r.group);
            xrds.patch(
                &xrd,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {POLICY_ANNOTATION: mode.as_str()}}}),
                ),
            )
            .await
            .unwrap_or_else(|e| panic!("annotate {xrd}: {e}"));
        }
    }

    /// Waits until `mode`, which `tree`'s platform carries, is in effect for
    /// its InferenceCluster.
    pub(crate) async fn enter(&self, mode: Mode, tree: &Tree) {
        self.wait_in_effect(&tree.platform.inference_clusters(), None, &tree.name, mode)
            .await;
    }

    /// Waits until `mode` is in effect for object `name` of `resource`: held
    /// by cascade-guard (Convert), a Background delete refused (Refuse), or
    /// neither (Off, Warn).
    pub(crate) async fn wait_in_effect(
        &self,
        resource: &ApiResource,
        ns: Option<&str>,
        name: &str,
        mode: Mode,
    ) {
        let client = self.cp.admin().await.expect("admin client");
        let objects = api(&client, resource, ns);
        let dry_run = DeleteParams {
            dry_run: true,
            propagation_policy: Some(PropagationPolicy::Background),
            ..DeleteParams::default()
        };
        let effective = wait::until_lasting(Duration::from_secs(60), || async {
            let o = objects.get_opt(name).await.ok().flatten()?;
            let held = o.finalizers().iter().any(|f| f == HOLD_FINALIZER);
            let refused = matches!(
                objects.delete(name, &dry_run).await,
                Err(kube::Error::Api(ref s)) if s.code == 403
            );
            let ok = match mode {
                Mode::Off | Mode::Warn => !held && !refused,
                Mode::Refuse => refused,
                Mode::Convert => held && !refused,
            };
            ok.then_some(())
        })
        .await;
        assert!(
            effective.is_some(),
            "{} never in effect for {} {name}; logs:\n{}",
            mode.as_str(),
            resource.kind,
            self.cp.log_tails(30)
        );
    }

    /// `kubectl delete inferencecluster <tree>`: (succeeded, stderr).
    pub(crate) async fn kubectl_delete(&self, tree: &Tree, foreground: bool) -> (bool, String) {
        self.kubectl_delete_of(
            &tree.platform.inference_clusters(),
            None,
            &tree.name,
            foreground,
        )
        .await
    }

    /// `kubectl delete <resource> <name> [-n <ns>]`: (succeeded, stderr).
    pub(crate) async fn kubectl_delete_of(
        &self,
        resource: &ApiResource,
        ns: Option<&str>,
        name: &str,
        foreground: bool,
    ) -> (bool, String) {
        let target = format!("{}.{}", resource.plural, resource.group);
        let mut args = vec!["delete", target.as_str(), name, "--wait=false"];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        if foreground {
            args.push("--cascade=foreground");
        }
        let out = tokio::process::Command::new(&self.kubectl)
            .args(&args)
            .env("KUBECONFIG", self.cp.kubeconfig_path())
            .output()
            .await
            .expect("kubectl runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}
