//! The `cascade-guard` command. Errors end here, as anyhow, with context.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use std::sync::Arc;

use cascade_guard::cli;
use cascade_guard::cli::kubeconfig::{ConfigError, Selection};
use cascade_guard::cluster::running::ControllerSettings;
use cascade_guard::controller::leader::{self, LeaseSettings};
use cascade_guard::controller::telemetry::{self, Health, Metrics};
use cascade_guard::controller::{self, Settings};
use cascade_guard::policy::names::{
    DEFAULT_CONTROLLER_USER, DEFAULT_CROSSPLANE_USER, DEFAULT_GC_CONTROLLER_MANAGER_USER,
    DEFAULT_GC_SERVICE_ACCOUNT_USER,
};
use cascade_guard::policy::{CompileSettings, Mode};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cascade-guard",
    version,
    about = "Makes every delete of a protected Kubernetes object a safe, foreground cascade"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Only on the commands that contact a cluster; read as kubectl reads them
/// (cli/kubeconfig.rs).
#[derive(Args)]
struct ClusterArgs {
    /// The kubeconfig to use; without it, KUBECONFIG (a list, merged in
    /// order, missing files skipped), ~/.kube/config or the in-cluster
    /// service account.
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context); its
    /// namespace is the default for -n.
    #[arg(long, value_name = "NAME")]
    context: Option<String>,
}

impl ClusterArgs {
    fn selection(&self) -> Selection {
        Selection {
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller: compile XRD annotations and CascadePolicies into
    /// ValidatingAdmissionPolicies and keep them in sync.
    Run(RunArgs),
    /// Print the admission objects for XRD, CascadePolicy and CRD files (or
    /// directories of them, such as a Crossplane package's apis/), without a cluster.
    Render(RenderArgs),
    /// Print the CascadePolicy CustomResourceDefinition.
    Crd,
    /// Remove everything cascade-guard put into the cluster: its admission
    /// policies, then its finalizer from every object that carries it (a
    /// deleting one only once its foreground cascade is done). Stop the
    /// controller first.
    Uninstall(UninstallArgs),
    /// What is protected (kind, mode, where the policy comes from), whether the
    /// admission policies in the cluster are the ones the policies compile to,
    /// and which protected objects are being deleted right now.
    Status(StatusArgs),
    /// Follow a deletion tree until everything in it is gone: what is left,
    /// what state each object is in, what holds it.
    Trace(TraceArgs),
    /// What a delete of this object would do now, with today's policies: the
    /// waves in which its tree can leave, what each waits on and why, and
    /// every hazard (two objects that need each other deleted at once).
    /// Exits 3 when there is a hazard.
    Plan(PlanArgs),
    /// Print a shell completion script: `source <(cascade-guard completion bash)`.
    Completion {
        /// The shell: bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print cascade-guard's version, and the API server's when one is reachable.
    Version {
        /// Only the client's version; do not contact the API server.
        #[arg(long)]
        client: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

#[derive(Args)]
struct PolicyArgs {
    /// The mode of XRDs that carry no cascade-guard.dev/deletion-policy annotation.
    #[arg(
        long,
        env = "CASCADE_GUARD_XRD_DEFAULT_MODE",
        default_value = "Refuse",
        ignore_case = true,
        value_parser = cli::values::mode()
    )]
    xrd_default_mode: Mode,
    /// The garbage collector's username when kube-controller-manager runs with
    /// --use-service-account-credentials=true.
    #[arg(long, env = "CASCADE_GUARD_GC_SERVICE_ACCOUNT_USER", default_value = DEFAULT_GC_SERVICE_ACCOUNT_USER)]
    gc_service_account_user: String,
    /// kube-controller-manager's own username, which the garbage collector
    /// uses without --use-service-account-credentials.
    #[arg(long, env = "CASCADE_GUARD_GC_CONTROLLER_MANAGER_USER", default_value = DEFAULT_GC_CONTROLLER_MANAGER_USER)]
    gc_controller_manager_user: String,
    /// Crossplane's username: the only one (with break-glass) that may take
    /// entries out of an XR's resourceRefs.
    #[arg(long, env = "CASCADE_GUARD_CROSSPLANE_USER", default_value = DEFAULT_CROSSPLANE_USER)]
    crossplane_user: String,
    /// cascade-guard's own username (its ServiceAccount's), which may remove
    /// its finalizer and foregroundDeletion like the garbage collector.
    #[arg(long, env = "CASCADE_GUARD_CONTROLLER_USER", default_value = DEFAULT_CONTROLLER_USER)]
    controller_user: String,
    /// Let break-glass count for anyone who can set the annotation, as before
    /// 0.2. By default it counts only for users allowed to `use`
    /// breakglass.cascade-guard.dev (the chart's break-glass ClusterRole).
    #[arg(long, env = "CASCADE_GUARD_BREAK_GLASS_WITHOUT_PERMISSION")]
    break_glass_without_permission: bool,
}

impl PolicyArgs {
    fn compile_settings(&self) -> CompileSettings {
        CompileSettings {
            gc_service_account_user: self.gc_service_account_user.clone(),
            gc_controller_manager_user: self.gc_controller_manager_user.clone(),
            crossplane_user: self.crossplane_user.clone(),
            controller_user: self.controller_user.clone(),
            break_glass_needs_permission: !self.break_glass_without_permission,
            set_name: None,
        }
    }
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(flatten)]
    policy: PolicyArgs,
    /// Where to serve /metrics, /healthz and /readyz.
    #[arg(
        long,
        env = "CASCADE_GUARD_HTTP_ADDRESS",
        default_value = "0.0.0.0:8080"
    )]
    http_address: std::net::SocketAddr,
    #[command(flatten)]
    leader: LeaderArgs,
    /// A cascade cascade-guard holds with no progress (none of what it waits
    /// for gone, nothing more being deleted) for this long is reported: a
    /// CascadeStalled Warning Event naming what is left and what holds it, and
    /// cascade_guard_stalled_cascades.
    #[arg(long, env = "CASCADE_GUARD_STALL_AFTER", value_parser = humantime_duration, default_value = "10m")]
    stall_after: Duration,
    /// A foreground cascade cascade-guard holds that runs on this long with
    /// nothing it can see left (an XR with no composed resource left; any
    /// cascade of another kind) is restarted: foregroundDeletion removed and
    /// the object deleted in the foreground again, so that a garbage
    /// collector that missed the cascade's start (after an API server
    /// restart) sees it; then at growing intervals. A CascadeRestarted Event
    /// and cascade_guard_cascade_restarts say so. 0s turns it off.
    #[arg(long, env = "CASCADE_GUARD_RESTART_QUIET_CASCADES_AFTER", value_parser = humantime_duration, default_value = "30s")]
    restart_quiet_cascades_after: Duration,
    /// Seconds between full passes when nothing changes.
    #[arg(long, env = "CASCADE_GUARD_RESYNC_SECONDS", default_value_t = 300)]
    resync_seconds: u64,
    /// enforce: in the trees of Refuse and Convert kinds, an object a sibling
    /// still needs is held (its delete refused, the garbage collector's too)
    /// until what needs it is gone, then deleted; off: siblings go together,
    /// as a foreground cascade deletes them.
    #[arg(
        long,
        env = "CASCADE_GUARD_SIBLING_ORDER",
        value_enum,
        default_value = "enforce"
    )]
    sibling_order: SiblingOrder,
    /// With sibling order enforced, what a delete of the root of a Refuse or
    /// Convert tree that the controller has not ordered gets (not read yet,
    /// changed since, the controller down, or a hold it may not make):
    /// refuse (fail closed, the default: the refusal says why and what to
    /// do); allow (prefer availability: such a tree is torn down as a plain
    /// foreground cascade, in no sibling order).
    #[arg(
        long,
        env = "CASCADE_GUARD_UNORDERED_DELETES",
        value_enum,
        default_value = "refuse"
    )]
    unordered_deletes: UnorderedDeletes,
    /// Also write the compiled policies as static admission manifests into
    /// this directory: the one the API server's AdmissionConfiguration names
    /// as staticManifestsDir (Kubernetes 1.36 with the feature gate
    /// ManifestBasedAdmissionControlConfig, on by default from 1.37). The API
    /// server serves them outside the API, so they cannot be deleted or
    /// edited through it. Every replica writes (one per control-plane node,
    /// each with that node's directory mounted); only the leader does the rest.
    #[arg(long, env = "CASCADE_GUARD_STATIC_MANIFESTS_DIR", value_name = "DIR")]
    static_manifests_dir: Option<PathBuf>,
    /// Only write the static manifests directory: no leader election, no
    /// admission objects, no Convert (the chart's DaemonSet on control-plane
    /// nodes runs so, beside the Deployment that does the rest).
    #[arg(
        long,
        env = "CASCADE_GUARD_STATIC_ONLY",
        requires = "static_manifests_dir"
    )]
    static_only: bool,
    /// Log as JSON lines.
    #[arg(long, env = "CASCADE_GUARD_LOG_JSON")]
    log_json: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SiblingOrder {
    Enforce,
    Off,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum UnorderedDeletes {
    Refuse,
    Allow,
}

#[derive(Args)]
struct LeaderArgs {
    /// Run without leader election (a single replica only).
    #[arg(long, env = "CASCADE_GUARD_NO_LEADER_ELECTION")]
    no_leader_election: bool,
    /// Namespace of the Lease; default: the pod's namespace (POD_NAMESPACE), else default.
    #[arg(long, env = "CASCADE_GUARD_LEADER_ELECTION_NAMESPACE")]
    leader_election_namespace: Option<String>,
    /// Name of the Lease.
    #[arg(
        long,
        env = "CASCADE_GUARD_LEADER_ELECTION_ID",
        default_value = "cascade-guard"
    )]
    leader_election_id: String,
    /// Seconds a leader's renewal keeps the other replicas off.
    #[arg(long, default_value_t = 15)]
    leader_election_lease_seconds: u64,
    /// Seconds between renewals.
    #[arg(long, default_value_t = 2)]
    leader_election_renew_seconds: u64,
}

#[derive(Args)]
struct UninstallArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Go on although a controller still holds the leader Lease (it will put
    /// back what this removes).
    #[arg(long)]
    force: bool,
    /// How long to wait for deleting objects to finish their foreground
    /// cascade before giving up (they stay held; run uninstall again).
    #[arg(long, value_parser = humantime_duration, default_value = "10m")]
    timeout: Duration,
    /// The controller's Lease name (its --leader-election-id).
    #[arg(long, default_value = "cascade-guard")]
    leader_election_id: String,
}

#[derive(Args)]
struct TraceArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The root's resource: plural, singular or kind, optionally with .group
    /// (inferenceclusters, inferencecluster.modelplane.ai), or TYPE/NAME.
    resource: String,
    /// The root's name (unless given as TYPE/NAME).
    name: Option<String>,
    #[arg(short, long)]
    namespace: Option<String>,
    /// text: a live tree on a terminal, change lines otherwise; json: one JSON
    /// object per change, then the summary; yaml: one YAML document each;
    /// dot (Graphviz) or mermaid: one picture at the end, of what left in
    /// which order and what holds the rest.
    #[arg(short, long, value_enum, default_value = "text")]
    output: TraceOutput,
    /// Give up after this long and summarize (90s, 10m, 1h or seconds; 0:
    /// never). Exits 4 when the teardown did not complete.
    #[arg(long, value_parser = humantime_duration, default_value = "0")]
    timeout: Duration,
    /// Milliseconds between looks.
    #[arg(long, default_value_t = 500)]
    interval_ms: u64,
    /// Look once at the whole tree and stop: the teardown as it stands now
    /// (exits 0 whether or not it is complete).
    #[arg(long)]
    once: bool,
    /// The controller's Lease name (its --leader-election-id): where a
    /// picture reads what sibling order holds.
    #[arg(long, default_value = "cascade-guard")]
    leader_election_id: String,
}

#[derive(Args)]
struct PlanArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The root's resource: plural, singular or kind, optionally with .group
    /// (inferenceclusters, InferenceCluster.modelplane.ai), or TYPE/NAME.
    resource: String,
    /// The root's name (unless given as TYPE/NAME).
    name: Option<String>,
    /// The root's namespace, if it is namespaced (default: the kubeconfig
    /// context's).
    #[arg(short, long)]
    namespace: Option<String>,
    /// Plan for this mode instead of the one today's policies give the kind.
    #[arg(long, ignore_case = true, value_parser = cli::values::mode())]
    mode: Option<Mode>,
    /// The mode of XRDs without the annotation (default: the one the running
    /// controller publishes on its Lease; Refuse when none runs).
    #[arg(
        long,
        env = "CASCADE_GUARD_XRD_DEFAULT_MODE",
        ignore_case = true,
        value_parser = cli::values::mode()
    )]
    xrd_default_mode: Option<Mode>,
    /// text for people, json or yaml for programs, dot (Graphviz) or mermaid
    /// to draw the tree, its waves, edges, holds and hazards.
    #[arg(short, long, value_enum, default_value = "text")]
    output: PlanOutput,
    /// The name of the controller's Lease (its --leader-election-id), looked
    /// for in every namespace: whether it runs and has ordered this tree.
    #[arg(long, default_value = "cascade-guard")]
    leader_election_id: String,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum TraceOutput {
    Text,
    Json,
    Yaml,
    Dot,
    Mermaid,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum PlanOutput {
    Text,
    Json,
    Yaml,
    Dot,
    Mermaid,
}

#[derive(Args)]
struct StatusArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The settings to compile with when no running controller publishes its
    /// own (or with --use-flags): the flags it runs with.
    #[command(flatten)]
    policy: PolicyArgs,
    /// text for people, json or yaml for scripts.
    #[arg(short, long, value_enum, default_value = "text")]
    output: StatusOutput,
    /// The name of the controller's Lease (its --leader-election-id), looked
    /// for in every namespace.
    #[arg(long, default_value = "cascade-guard")]
    leader_election_id: String,
    /// Compile with the flags given here even when the running controller
    /// publishes its own settings on its Lease (they are used by default).
    #[arg(long)]
    use_flags: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum RenderOutput {
    Yaml,
    Json,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum StatusOutput {
    Text,
    Json,
    Yaml,
}

#[derive(Args)]
struct RenderArgs {
    /// Files or directories (walked recursively for .yaml, .yml and .json).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    #[command(flatten)]
    policy: PolicyArgs,
    /// Exit non-zero when any input has a problem, warnings included, when
    /// nothing is protected, and when a document is not an XRD,
    /// CascadePolicy or CRD (unless it is Crossplane package content, such
    /// as a Composition, or its kind is given to --skip).
    #[arg(long)]
    strict: bool,
    /// A kind (Deployment, or Deployment.apps; any case) that is in the
    /// input on purpose and protects nothing: --strict passes over it.
    /// Repeatable, or a comma list. Crossplane package kinds need not be
    /// given.
    #[arg(long, value_name = "KIND", value_delimiter = ',')]
    skip: Vec<String>,
    /// yaml: a multi-document stream for kubectl apply; json: one List.
    #[arg(short, long, value_enum, default_value = "yaml")]
    output: RenderOutput,
    /// Append -NAME to the objects every XRD of a mode shares
    /// (cascade-guard-xrds-refuse-composite-NAME), so that sets rendered and
    /// applied separately, one per package, do not overwrite one another's.
    #[arg(long, value_name = "NAME")]
    set_name: Option<String>,
    /// Write static admission manifests instead: the same policies and
    /// bindings, named *.static.k8s.io, for the API server's
    /// staticManifestsDir (save the output as a .yaml file there on every
    /// control-plane node). Needs Kubernetes 1.36 or newer.
    #[arg(long = "static")]
    static_manifests: bool,
    /// The Kubernetes release the static manifests are for (1.37, v1.36.5);
    /// default: the release of the cluster in the kubeconfig.
    #[arg(long, requires = "static_manifests", value_name = "RELEASE")]
    kubernetes_version: Option<String>,
    /// With --static and no --kubernetes-version: the kubeconfig whose
    /// cluster's release to read. render contacts no cluster otherwise.
    #[arg(long, requires = "static_manifests", value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// With --static and no --kubernetes-version: the kubeconfig context
    /// whose cluster's release to read.
    #[arg(long, requires = "static_manifests", value_name = "NAME")]
    context: Option<String>,
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = parse();
    let result = match cli.command {
        Command::Run(args) => run(args.cluster.selection(), args).await,
        Command::Render(args) => {
            let cluster = Selection {
                kubeconfig: args.kubeconfig.clone(),
                context: args.context.clone(),
            };
            render(cluster, args).await
        }
        Command::Crd => {
            let crds = cascade_guard::api::crds()
                .iter()
                .map(serde_json::to_value)
                .collect::<Result<Vec<_>, _>>()?;
            out(&cascade_guard::policy::render::to_yaml_stream(&crds))
        }
        Command::Version { client, cluster } => version(cluster.selection(), client).await,
        Command::Completion { shell } => out(&cli::completion::script(
            shell,
            &mut Cli::command(),
            "cascade-guard",
        )),
        Command::Uninstall(args) => uninstall(args.cluster.selection(), args).await,
        Command::Status(args) => status(args.cluster.selection(), args).await,
        Command::Trace(args) => trace(args.cluster.selection(), args).await,
        Command::Plan(args) => plan(args.cluster.selection(), args).await,
    };
    match result {
        // The reader went away (`cascade-guard crd | head -1`): not an error.
        Err(e) if is_broken_pipe(&e) => Ok(()),
        Err(e) if e.chain().any(|c| c.downcast_ref::<Unreachable>().is_some()) => {
            eprintln!("Error: {e:#}");
            std::process::exit(UNREACHABLE_EXIT);
        }
        // No cluster to talk to either: the same exit, and only the line
        // that says what to do (not the chain of causes under it).
        Err(e) if e.chain().any(|c| c.downcast_ref::<ConfigError>().is_some()) => {
            if let Some(cause) = e.chain().find_map(|c| c.downcast_ref::<ConfigError>()) {
                eprintln!("Error: {cause}");
            }
            std::process::exit(UNREACHABLE_EXIT);
        }
        // Leader election at work, not a fault: one line, no backtrace.
        Err(e) if e.downcast_ref::<LostLeadership>().is_some() => {
            eprintln!("{e}");
            std::process::exit(1);
        }
        other => other,
    }
}

/// The command line, named as it was typed: `kubectl cascade-guard` when
/// kubectl runs this as its plugin (cli/plugin.rs), so that usage and help
/// say what to type.
fn parse() -> Cli {
    let mut command = Cli::command();
    if let Some(name) = std::env::args_os()
        .next()
        .and_then(|argv0| cli::plugin::command_name(&argv0))
    {
        command = command.bin_name(name);
    }
    let matches = command.get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// Writes command output to stdout.
fn out(text: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()?;
    Ok(())
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `90s`, `10m`, `1h`, or plain seconds.
fn humantime_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, "s"), |i| text.split_at(i));
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (90s, 10m, 1h)"))?;
    let seconds = match unit {
        "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        _ => return Err(format!("{text:?} is not a duration (90s, 10m, 1h)")),
    };
    Ok(Duration::from_secs(seconds))
}

fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only on a terminal: escape codes in a log file or a log
    // collector are noise.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn client(cluster: Selection) -> Result<kube::Client> {
    Ok(connect(cluster).await?.0)
}

/// A client, and the namespace of the kubeconfig's context (`default` when
/// it names none), which commands use as kubectl does when `-n` is not given.
async fn connect(cluster: Selection) -> Result<(kube::Client, String)> {
    let (client, namespace, server) = configure(cluster).await?;
    // One request that must answer, so that an unreachable cluster is said
    // once, naming the server, instead of as the first read's error.
    match tokio::time::timeout(REACH_TIMEOUT, client.apiserver_version()).await {
        // It answered, even if to say no (403 on /version).
        Ok(Ok(_)) | Ok(Err(kube::Error::Api(_))) => Ok((client, namespace)),
        Ok(Err(e)) => Err(Unreachable {
            server,
            cause: e.to_string(),
        }
        .into()),
        Err(_) => Err(Unreachable {
            server,
            cause: format!("no answer within {}s", REACH_TIMEOUT.as_secs()),
        }
        .into()),
    }
}

/// How long a command waits for the API server's first answer.
const REACH_TIMEOUT: Duration = Duration::from_secs(15);

/// Exit status of a command that cannot reach the API server, or has no
/// kubeconfig to find it by (every command but `run`, which keeps retrying
/// to reach it).
const UNREACHABLE_EXIT: i32 = 5;

/// A leader whose Lease another replica took stops writing and exits; its
/// Deployment starts it again as a candidate.
#[derive(Debug, thiserror::Error)]
#[error("lost leadership: another replica leads now; exiting to restart as a candidate")]
struct LostLeadership;

#[derive(Debug, thiserror::Error)]
#[error("cannot reach the API server at {server}: {cause}")]
struct Unreachable {
    server: String,
    cause: String,
}

/// A client for the kubeconfig and context (or the environment, as kubectl
/// reads it), its context's namespace and the server it talks to; nothing is
/// sent yet.
async fn configure(cluster: Selection) -> Result<(kube::Client, String, String)> {
    let config = cli::kubeconfig::config(&cluster).await?;
    let namespace = config.default_namespace.clone();
    let server = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).context("cannot make a Kubernetes client")?;
    Ok((client, namespace, server))
}

async fn run(cluster: Selection, args: RunArgs) -> Result<()> {
    init_logging(args.log_json);
    let (client, _, _) = configure(cluster).await?;
    report_server_version(&client).await;
    let namespace = args
        .leader
        .leader_election_namespace
        .clone()
        .or_else(|| std::env::var("POD_NAMESPACE").ok())
        .unwrap_or_else(|| "default".into());
    let settings = Settings {
        home_namespace: namespace.clone(),
        xrd_default_mode: args.policy.xrd_default_mode,
        compile: args.policy.compile_settings(),
        resync: Duration::from_secs(args.resync_seconds.max(1)),
        stall_after: args.stall_after,
        restart_quiet_cascades_after: (!args.restart_quiet_cascades_after.is_zero())
            .then_some(args.restart_quiet_cascades_after),
        sibling_order: args.sibling_order == SiblingOrder::Enforce,
        refuse_unordered_deletes: args.unordered_deletes == UnorderedDeletes::Refuse,
        ..Settings::default()
    };
    let metrics = Arc::new(Metrics::new());
    let writer = match &args.static_manifests_dir {
        Some(dir) => Some(controller::static_writer::run(
            client.clone(),
            settings.clone(),
            static_target(&client, dir).await?,
            metrics.clone(),
        )),
        None => None,
    };
    let health = Health::new();
    let (bound, server) =
        telemetry::bind(args.http_address, metrics.clone(), health.clone()).await?;
    tokio::spawn(server);
    tracing::info!(address = %bound, "serving /metrics, /healthz and /readyz");

    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    let stop = async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    if let Some(writer) = writer {
        if args.static_only {
            health.set_ready(true);
            tokio::select! {
                () = writer => {}
                () = stop => tracing::info!("stopping"),
            }
            return Ok(());
        }
        tokio::spawn(writer);
    }
    let published = ControllerSettings::new(
        settings.xrd_default_mode,
        &settings.compile,
        settings.sibling_order,
    );
    let identity = std::env::var("POD_NAME").unwrap_or_else(|_| {
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let lease = LeaseSettings {
        lease_duration: Duration::from_secs(args.leader.leader_election_lease_seconds),
        renew_interval: Duration::from_secs(args.leader.leader_election_renew_seconds),
        annotations: published.annotations(!args.leader.no_leader_election),
        ..LeaseSettings::new(namespace, args.leader.leader_election_id.clone(), identity)
    };
    if args.leader.no_leader_election {
        let announcing = tokio::spawn(leader::announce(client.clone(), lease.clone()));
        metrics.set_leader(true);
        tokio::select! {
            () = controller::run(client.clone(), settings, metrics, health) => {}
            () = stop => tracing::info!("stopping"),
        }
        // A clean stop says so at once: status and uninstall see it stopped.
        announcing.abort();
        leader::withdraw(client, &lease).await;
        return Ok(());
    }

    // A replica waiting for the lease is healthy and ready to take over.
    health.set_ready(true);
    tokio::pin!(stop);
    let leadership = tokio::select! {
        acquired = leader::acquire(client.clone(), lease) => acquired.context("leader election")?,
        () = &mut stop => return Ok(()),
    };
    metrics.set_leader(true);
    // Not ready again until the first pass has run as leader.
    health.set_ready(false);
    tokio::select! {
        () = controller::run(client, settings, metrics.clone(), health) => Ok(()),
        () = leadership.lost() => {
            metrics.set_leader(false);
            // Another replica leads now: stop writing at once; the Deployment
            // restarts this one as a candidate.
            Err(LostLeadership.into())
        }
        () = &mut stop => {
            tracing::info!("stopping; handing leadership over");
            leadership.release().await;
            Ok(())
        }
    }
}

/// Logs the API server's release against the proven ones; an unreadable
/// version is only logged, never fatal.
/// Refuses a release without static admission manifests: the one given, else
/// the cluster's.
async fn static_release_check(cluster: Selection, release: Option<&str>) -> Result<()> {
    use cascade_guard::policy::static_manifest::{parse_release, release_supports};
    let (major, minor) = match release {
        Some(release) => parse_release(release)?,
        None => {
            let client = client(cluster).await.context(
                "render --static needs the Kubernetes release it is for: give --kubernetes-version, or a kubeconfig whose cluster answers",
            )?;
            let info = client
                .apiserver_version()
                .await
                .context("cannot read the API server's version (or give --kubernetes-version)")?;
            (info.major, info.minor)
        }
    };
    release_supports(&major, &minor)?;
    Ok(())
}

/// The checks `run --static-manifests-dir` makes before it starts: a
/// release with the feature, the gate on where the API server says, and a
/// directory to write to.
async fn static_target(
    client: &kube::Client,
    dir: &std::path::Path,
) -> Result<controller::static_writer::Target> {
    use cascade_guard::cluster::static_protection::{StaticDirectory, read_server_report};
    use cascade_guard::policy::static_manifest::{FEATURE_GATE, release_supports};
    let info = client
        .apiserver_version()
        .await
        .context("cannot read the API server's version, which --static-manifests-dir needs")?;
    release_supports(&info.major, &info.minor)
        .with_context(|| format!("--static-manifests-dir {}", dir.display()))?;
    match read_server_report(client).await {
        Ok(report) if report.gate_enabled == Some(false) => bail!(
            "--static-manifests-dir: the API server ({}) reports the feature gate {FEATURE_GATE} off; start it with --feature-gates={FEATURE_GATE}=true",
            info.git_version
        ),
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(error = %e, "cannot check the API server's feature gate; writing static manifests anyway")
        }
    }
    let directory = StaticDirectory::open(dir)?;
    let writer = std::env::var("NODE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| format!("pid-{}", std::process::id()))
        });
    let namespace = std::env::var("POD_NAMESPACE").unwrap_or_else(|_| "default".into());
    Ok(controller::static_writer::Target {
        directory,
        writer,
        namespace,
    })
}

async fn report_server_version(client: &kube::Client) {
    use cascade_guard::cluster::server_version::{Support, support};
    match client.apiserver_version().await {
        Ok(info) => match support(&info) {
            Support::Proven => {
                tracing::info!(version = %info.git_version, "API server: {}", Support::Proven)
            }
            other => tracing::warn!(version = %info.git_version, "API server: {other}"),
        },
        Err(e) => tracing::warn!(error = %e, "cannot read the API server's version"),
    }
}

/// `TYPE NAME` or `TYPE/NAME`, as kubectl takes them.
fn target(resource: String, name: Option<String>) -> Result<(String, String)> {
    match (resource.split_once('/'), name) {
        (Some((r, n)), None) if !r.is_empty() && !n.is_empty() => {
            Ok((r.to_string(), n.to_string()))
        }
        (Some(_), Some(_)) => bail!("give TYPE NAME or TYPE/NAME, not both"),
        (None, Some(name)) => Ok((resource, name)),
        _ => bail!("name the object: TYPE NAME or TYPE/NAME"),
    }
}

/// Exit status of `trace` when the teardown did not complete (1: it could
/// not follow it at all, e.g. the cluster cannot be reached).
const TRACE_INCOMPLETE_EXIT: i32 = 4;

async fn trace(cluster: Selection, args: TraceArgs) -> Result<()> {
    use std::io::IsTerminal;
    let (resource, name) = target(args.resource, args.name)?;
    let (client, context_namespace) = connect(cluster).await?;
    let output = match args.output {
        TraceOutput::Json => cli::trace::Output::Json,
        TraceOutput::Yaml => cli::trace::Output::Yaml,
        TraceOutput::Text => cli::trace::Output::Text,
        TraceOutput::Dot => cli::trace::Output::Dot,
        TraceOutput::Mermaid => cli::trace::Output::Mermaid,
    };
    let options = cli::trace::Options {
        live: output == cli::trace::Output::Text && std::io::stdout().is_terminal(),
        resource,
        name,
        namespace: Some(args.namespace.unwrap_or(context_namespace)),
        output,
        interval: Duration::from_millis(args.interval_ms.max(50)),
        timeout: (!args.timeout.is_zero()).then_some(args.timeout),
        once: args.once,
        leader_election_id: args.leader_election_id,
    };
    let mut out = std::io::stdout().lock();
    let summary = cli::trace::trace(&client, &options, &mut out).await?;
    if !summary.complete && !args.once {
        eprintln!("cascade-guard trace: the teardown did not complete");
        std::process::exit(TRACE_INCOMPLETE_EXIT);
    }
    Ok(())
}

/// Exit status of `plan` when the delete it plans has a hazard: apart from 1
/// (the plan could not be made) and 2 (bad arguments).
const PLAN_HAZARD_EXIT: i32 = 3;

async fn plan(cluster: Selection, args: PlanArgs) -> Result<()> {
    let (resource, name) = target(args.resource, args.name)?;
    let (client, context_namespace) = connect(cluster).await?;
    let options = cli::plan::Options {
        resource,
        name,
        namespace: args.namespace.unwrap_or(context_namespace),
        mode: args.mode,
        xrd_default_mode: args.xrd_default_mode,
        leader_election_id: args.leader_election_id,
    };
    let plan = cli::plan::plan(&client, &options).await?;
    match args.output {
        PlanOutput::Text => out(&cli::plan::text::render_text(&plan))?,
        PlanOutput::Json => out(&format!("{}\n", serde_json::to_string_pretty(&plan)?))?,
        PlanOutput::Yaml => out(&serde_yaml::to_string(&plan)?)?,
        PlanOutput::Dot => out(&cli::plan::dot::render_dot(&plan))?,
        PlanOutput::Mermaid => out(&cli::plan::mermaid::render_mermaid(&plan))?,
    }
    if plan.unsafe_now() {
        std::process::exit(PLAN_HAZARD_EXIT);
    }
    Ok(())
}

async fn uninstall(cluster: Selection, args: UninstallArgs) -> Result<()> {
    let client = client(cluster).await?;
    let options = cli::uninstall::UninstallOptions {
        force: args.force,
        timeout: args.timeout,
        leader_election_id: args.leader_election_id,
    };
    let summary = cli::uninstall::uninstall(&client, &options, |line| {
        eprintln!("cascade-guard uninstall: {line}")
    })
    .await?;
    for kind in &summary.unreadable {
        eprintln!("cascade-guard uninstall: cannot tell whether objects are held: {kind}");
    }
    out(&format!(
        "removed {} admission objects; let go of {} live objects; handed {} deleting objects to the garbage collector's foreground cascade\n",
        summary.admission_objects, summary.released, summary.cascaded
    ))?;
    if !summary.left.is_empty() {
        bail!(
            "still cascading after {}s, and still held: {}. Run cascade-guard uninstall again to finish",
            options.timeout.as_secs(),
            summary.left.join(", ")
        );
    }
    Ok(())
}

async fn status(cluster: Selection, args: StatusArgs) -> Result<()> {
    let client = client(cluster).await?;
    let settings = cli::status::ControllerFlags {
        xrd_default_mode: args.policy.xrd_default_mode,
        compile: args.policy.compile_settings(),
    };
    let report =
        cli::status::status(&client, &settings, &args.leader_election_id, args.use_flags).await?;
    match args.output {
        StatusOutput::Text => out(&cli::status::render_text(&report))?,
        StatusOutput::Json => out(&format!("{}\n", serde_json::to_string_pretty(&report)?))?,
        StatusOutput::Yaml => out(&serde_yaml::to_string(&report)?)?,
    }
    // Exit codes a script can gate on (README, "Watching a teardown").
    match report.exit_code() {
        0 => Ok(()),
        code => std::process::exit(code),
    }
}

async fn render(cluster: Selection, args: RenderArgs) -> Result<()> {
    if args.static_manifests {
        static_release_check(cluster, args.kubernetes_version.as_deref()).await?;
    }
    let mut settings = args.policy.compile_settings();
    if let Some(set) = &args.set_name {
        cascade_guard::policy::render::validate_set_name(set)
            .map_err(|e| anyhow::anyhow!("--set-name: {e}"))?;
        settings.set_name = Some(set.clone());
    }
    let skip = cascade_guard::policy::render::Skip::new(&args.skip)?;
    let mut rendered =
        cli::render::render_paths(&args.paths, args.policy.xrd_default_mode, &settings)?;
    let passed = cascade_guard::policy::render::passed_over(&rendered, &skip);
    let review = cascade_guard::policy::render::review_problems(&rendered, &passed, args.strict);
    rendered.problems.extend(review);
    // The whole output is built before anything is written: a render that
    // fails prints nothing, so `render | kubectl apply -f -` applies nothing.
    let objects = if args.static_manifests {
        cascade_guard::policy::static_manifest::to_static_documents(&rendered.objects)?
    } else {
        rendered.objects.clone()
    };
    let text = match (args.output, args.static_manifests) {
        (RenderOutput::Json, _) => {
            let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
            format!("{}\n", serde_json::to_string_pretty(&list)?)
        }
        (RenderOutput::Yaml, true) => cascade_guard::policy::static_manifest::with_header(&objects),
        (RenderOutput::Yaml, false) => cascade_guard::policy::render::to_yaml_stream(&objects),
    };
    for problem in &rendered.problems {
        eprintln!("cascade-guard render: {problem}");
    }
    for note in cascade_guard::policy::render::notes(&passed, args.strict) {
        eprintln!("cascade-guard render: {note}");
    }
    eprintln!(
        "cascade-guard render: {}",
        cascade_guard::policy::render::summary(&rendered.policies)
    );
    if cascade_guard::policy::render::fails(&rendered.problems, args.strict) {
        bail!(
            "{} problem(s) in the input; nothing written",
            rendered.problems.len()
        );
    }
    out(&text)
}

async fn version(cluster: Selection, client_only: bool) -> Result<()> {
    out(&format!("cascade-guard {}\n", env!("CARGO_PKG_VERSION")))?;
    if client_only {
        return Ok(());
    }
    let client = client(cluster).await?;
    let info = client
        .apiserver_version()
        .await
        .context("cannot reach the API server")?;
    out(&format!("kubernetes {}\n", info.git_version))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn every_positional_argument_says_what_it_is() {
        fn walk(cmd: &clap::Command, path: &str) {
            for arg in cmd.get_positionals() {
                assert!(
                    arg.get_help().is_some(),
                    "{path} {}: a positional argument without help",
                    arg.get_id()
                );
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()));
            }
        }
        walk(&Cli::command(), "cascade-guard");
    }

    #[test]
    fn only_commands_that_contact_a_cluster_take_a_kubeconfig_and_a_context() {
        let parses = |args: &[&str]| Cli::try_parse_from(args).is_ok();
        for flag in ["--kubeconfig", "--context"] {
            for command in [
                &["run"][..],
                &["status"],
                &["uninstall"],
                &["trace", "xr/a"],
                &["plan", "xr/a"],
                &["version"],
                &["render", "--static", "apis/"],
            ] {
                let mut args = vec!["cascade-guard"];
                args.extend_from_slice(command);
                args.extend([flag, "k"]);
                assert!(parses(&args), "{args:?}");
            }
            for command in [&["crd"][..], &["render", "apis/"], &["completion", "bash"]] {
                let mut args = vec!["cascade-guard"];
                args.extend_from_slice(command);
                args.extend([flag, "k"]);
                assert!(!parses(&args), "{args:?} takes no {flag}");
            }
        }
    }

    use super::*;

    #[test]
    fn an_object_is_named_as_kubectl_takes_it() {
        let some = |s: &str| Some(s.to_string());
        type Case = (
            &'static str,
            Option<String>,
            Option<(&'static str, &'static str)>,
        );
        let cases: [Case; 6] = [
            (
                "inferencecluster",
                some("prod"),
                Some(("inferencecluster", "prod")),
            ),
            (
                "inferencecluster/prod",
                None,
                Some(("inferencecluster", "prod")),
            ),
            ("cpol/db", None, Some(("cpol", "db"))),
            ("inferencecluster/prod", some("prod"), None),
            ("inferencecluster", None, None),
            ("/prod", None, None),
        ];
        for (resource, name, want) in cases {
            let got = target(resource.to_string(), name.clone()).ok();
            let want = want.map(|(r, n)| (r.to_string(), n.to_string()));
            assert_eq!(got, want, "{resource} {name:?}");
        }
    }

    #[test]
    fn completion_scripts_name_every_command() {
        use clap::CommandFactory;
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "cascade-guard", &mut script);
            let script = String::from_utf8_lossy(&script);
            for command in ["run", "render", "status", "trace", "plan", "uninstall"] {
                assert!(script.contains(command), "{shell}: {command}");
            }
        }
    }

    #[test]
    fn durations_read_as_people_write_them() {
        for (text, want) in [
            ("90s", 90),
            ("10m", 600),
            ("1h", 3600),
            ("600", 600),
            ("0", 0),
        ] {
            assert_eq!(
                humantime_duration(text),
                Ok(Duration::from_secs(want)),
                "{text}"
            );
        }
        assert!(humantime_duration("10 minutes").is_err());
    }
}
