//! The command line as clap reads it: the commands, and the arguments more
//! than one command takes. Each command's own arguments live with it
//! (`trace/command.rs`, `plan/command.rs`, ...); `run`'s here, since the
//! controller it starts is not a command module.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use super::duration::humantime_duration;
use super::exit::CommandError;
use super::kubeconfig::Selection;
use super::plan::command::PlanArgs;
use super::render::command::RenderArgs;
use super::status::command::StatusArgs;
use super::trace::command::TraceArgs;
use super::uninstall::command::UninstallArgs;
use crate::policy::names::{
    DEFAULT_CONTROLLER_USER, DEFAULT_CROSSPLANE_USER, DEFAULT_GC_CONTROLLER_MANAGER_USER,
    DEFAULT_GC_SERVICE_ACCOUNT_USER,
};
use crate::policy::{CompileSettings, Mode};

/// The top-level help's examples.
const HELP: &str = "\
Examples:
  # What is protected, and whether it is in force
  cascade-guard status

  # What deleting InferenceCluster prod would do, then watch it go
  cascade-guard plan inferencecluster prod
  cascade-guard trace inferencecluster prod

  # The admission objects for a package's XRDs, without a cluster
  cascade-guard render apis/

Each command's --help has its examples and exit codes.
";

/// `run --help`'s examples and exit codes.
const RUN_HELP: &str = "\
Examples:
  # As the chart runs it, in a pod with its ServiceAccount
  cascade-guard run --xrd-default-mode Warn

  # On a workstation, against the current context: one replica, a full pass a minute
  cascade-guard run --no-leader-election --resync 1m

Exit codes:
  0  stopped by SIGTERM or Ctrl-C (a leader hands its Lease over first)
  1  lost leadership (the Deployment starts it again as a candidate), or cannot start
  2  the command line is wrong
  5  no kubeconfig can be found
";

/// `completion --help`'s examples.
const COMPLETION_HELP: &str = "\
Examples:
  # bash: in this shell, and in every new one
  source <(cascade-guard completion bash)
  echo 'source <(cascade-guard completion bash)' >> ~/.bashrc

  # zsh (after compinit, as most ~/.zshrc run it)
  autoload -Uz compinit && compinit
  source <(cascade-guard completion zsh)

  # fish
  mkdir -p ~/.config/fish/completions
  cascade-guard completion fish > ~/.config/fish/completions/cascade-guard.fish

In bash and fish, plan and trace also complete the protected kinds and their
objects' names from the current context's cluster (nothing when it does not
answer).
";

/// `crd --help`'s examples.
const CRD_HELP: &str = "\
Examples:
  # The CRD, to apply with the rest of a GitOps install
  cascade-guard crd > cascadepolicies.yaml
";

/// `version --help`'s examples and exit codes.
const VERSION_HELP: &str = "\
Examples:
  # This binary's version only
  cascade-guard version --client

  # And the API server's, of another context
  cascade-guard version --context prod

Exit codes:
  0  printed
  2  the command line is wrong
  5  the cluster cannot be reached, or no kubeconfig can be found (without --client)
";

#[derive(Parser)]
#[command(
    after_help = HELP,
    name = "cascade-guard",
    version,
    about = "Makes every delete of a protected Kubernetes object a safe, foreground cascade"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// Only on the commands that contact a cluster; read as kubectl reads them
/// (cli/kubeconfig.rs).
#[derive(Args)]
pub struct ClusterArgs {
    /// The kubeconfig to use; without it, KUBECONFIG (a list, merged in
    /// order, missing files skipped), ~/.kube/config or the in-cluster
    /// service account.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context); its
    /// namespace is the default for -n.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

impl ClusterArgs {
    pub fn selection(&self) -> Selection {
        Selection {
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
        }
    }
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the controller: compile XRD annotations and CascadePolicies into
    /// ValidatingAdmissionPolicies and keep them in sync.
    Run(RunArgs),
    /// Print the admission objects for XRD, CascadePolicy and CRD files (or
    /// directories of them, such as a Crossplane package's apis/), without a cluster.
    Render(RenderArgs),
    /// Print the CascadePolicy CustomResourceDefinition.
    #[command(after_help = CRD_HELP)]
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
    #[command(after_help = COMPLETION_HELP)]
    Completion {
        /// The shell: bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// What TAB offers for plan's and trace's object, from the cluster: the
    /// bash completion script calls it.
    #[command(name = super::completion::OBJECTS_COMMAND, hide = true)]
    CompleteObjects {
        /// The command line after the binary's name, up to the word under
        /// the cursor.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        words: Vec<String>,
    },
    /// Print cascade-guard's version, and the API server's when one is reachable.
    #[command(after_help = VERSION_HELP)]
    Version {
        /// Only the client's version; do not contact the API server.
        #[arg(long)]
        client: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

#[derive(Args)]
pub struct PolicyArgs {
    /// The mode of XRDs that carry no cascade-guard.dev/deletion-policy annotation.
    #[arg(
        long,
        env = "CASCADE_GUARD_XRD_DEFAULT_MODE",
        default_value = "Refuse",
        ignore_case = true,
        value_name = "MODE",
        value_parser = super::values::mode()
    )]
    pub xrd_default_mode: Mode,
    /// The garbage collector's username when kube-controller-manager runs with
    /// --use-service-account-credentials=true.
    #[arg(long, env = "CASCADE_GUARD_GC_SERVICE_ACCOUNT_USER", default_value = DEFAULT_GC_SERVICE_ACCOUNT_USER, value_name = "USER")]
    pub gc_service_account_user: String,
    /// kube-controller-manager's own username, which the garbage collector
    /// uses without --use-service-account-credentials.
    #[arg(long, env = "CASCADE_GUARD_GC_CONTROLLER_MANAGER_USER", default_value = DEFAULT_GC_CONTROLLER_MANAGER_USER, value_name = "USER")]
    pub gc_controller_manager_user: String,
    /// Crossplane's username: the only one (with break-glass) that may take
    /// entries out of an XR's resourceRefs.
    #[arg(long, env = "CASCADE_GUARD_CROSSPLANE_USER", default_value = DEFAULT_CROSSPLANE_USER, value_name = "USER")]
    pub crossplane_user: String,
    /// cascade-guard's own username (its ServiceAccount's), which may remove
    /// its finalizer and foregroundDeletion like the garbage collector.
    #[arg(long, env = "CASCADE_GUARD_CONTROLLER_USER", default_value = DEFAULT_CONTROLLER_USER, value_name = "USER")]
    pub controller_user: String,
    /// Let break-glass count for anyone who can set the annotation, as before
    /// 0.2. By default it counts only for users allowed to `use`
    /// breakglass.cascade-guard.dev (the chart's break-glass ClusterRole).
    #[arg(long, env = "CASCADE_GUARD_BREAK_GLASS_WITHOUT_PERMISSION")]
    pub break_glass_without_permission: bool,
}

impl PolicyArgs {
    pub fn compile_settings(&self) -> CompileSettings {
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
#[command(after_help = RUN_HELP)]
pub struct RunArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Where to serve /metrics, /healthz and /readyz.
    #[arg(
        long,
        env = "CASCADE_GUARD_HTTP_ADDRESS",
        default_value = "0.0.0.0:8080",
        value_name = "ADDRESS"
    )]
    pub http_address: std::net::SocketAddr,
    #[command(flatten)]
    pub leader: LeaderArgs,
    /// A cascade cascade-guard holds with no progress (none of what it waits
    /// for gone, nothing more being deleted) for this long is reported: a
    /// CascadeStalled Warning Event naming what is left and what holds it, and
    /// cascade_guard_stalled_cascades.
    #[arg(long, env = "CASCADE_GUARD_STALL_AFTER", value_parser = humantime_duration, default_value = "10m", value_name = "DURATION")]
    pub stall_after: Duration,
    /// A foreground cascade cascade-guard holds that runs on this long with
    /// nothing it can see left (an XR with no composed resource left; any
    /// cascade of another kind) is restarted: foregroundDeletion removed and
    /// the object deleted in the foreground again, so that a garbage
    /// collector that missed the cascade's start (after an API server
    /// restart) sees it; then at growing intervals. A CascadeRestarted Event
    /// and cascade_guard_cascade_restarts say so. 0s turns it off.
    #[arg(long, env = "CASCADE_GUARD_RESTART_QUIET_CASCADES_AFTER", value_parser = humantime_duration, default_value = "30s", value_name = "DURATION")]
    pub restart_quiet_cascades_after: Duration,
    /// Time between full passes when nothing changes.
    #[arg(long, env = "CASCADE_GUARD_RESYNC", value_parser = humantime_duration, default_value = "5m", value_name = "DURATION")]
    pub resync: Duration,
    /// --resync in seconds, its old name (hidden; still read).
    #[arg(
        long,
        env = "CASCADE_GUARD_RESYNC_SECONDS",
        hide = true,
        conflicts_with = "resync",
        value_name = "SECONDS"
    )]
    pub resync_seconds: Option<u64>,
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
    pub sibling_order: SiblingOrder,
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
    pub unordered_deletes: UnorderedDeletes,
    /// Hold the composed objects of Refuse and Warn kinds (those with a
    /// controller owner reference) with cascade-guard's finalizer, as Convert
    /// holds its kinds' objects: Crossplane's own delete of one is then let
    /// through and made a foreground cascade. Crossplane v2.0 and v2.1 delete
    /// a composed resource dropped from its Composition with no propagation
    /// policy, which Refuse would otherwise refuse (and Crossplane stop
    /// composing its parent) until the delete is sent in the foreground;
    /// v2.2 and later send Foreground themselves and need none of this.
    #[arg(long, env = "CASCADE_GUARD_HOLD_COMPOSED")]
    pub hold_composed: bool,
    /// Also write the compiled policies as static admission manifests into
    /// this directory: the one the API server's AdmissionConfiguration names
    /// as staticManifestsDir (Kubernetes 1.36 with the feature gate
    /// ManifestBasedAdmissionControlConfig, on by default from 1.37). The API
    /// server serves them outside the API, so they cannot be deleted or
    /// edited through it. Every replica writes (one per control-plane node,
    /// each with that node's directory mounted); only the leader does the rest.
    #[arg(long, env = "CASCADE_GUARD_STATIC_MANIFESTS_DIR", value_name = "DIR")]
    pub static_manifests_dir: Option<PathBuf>,
    /// Only write the static manifests directory: no leader election, no
    /// admission objects, no Convert (the chart's DaemonSet on control-plane
    /// nodes runs so, beside the Deployment that does the rest).
    #[arg(
        long,
        env = "CASCADE_GUARD_STATIC_ONLY",
        requires = "static_manifests_dir"
    )]
    pub static_only: bool,
    /// Log as JSON lines.
    #[arg(long, env = "CASCADE_GUARD_LOG_JSON")]
    pub log_json: bool,
}

impl RunArgs {
    /// --resync, or the seconds of its old name.
    pub fn resync(&self) -> Duration {
        self.resync_seconds
            .map_or(self.resync, Duration::from_secs)
            .max(Duration::from_secs(1))
    }
}

impl LeaderArgs {
    /// --leader-election-lease-duration, or the seconds of its old name.
    pub fn lease_duration(&self) -> Duration {
        self.leader_election_lease_seconds
            .map_or(self.leader_election_lease_duration, Duration::from_secs)
    }

    /// --leader-election-renew-interval, or the seconds of its old name.
    pub fn renew_interval(&self) -> Duration {
        self.leader_election_renew_seconds
            .map_or(self.leader_election_renew_interval, Duration::from_secs)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SiblingOrder {
    Enforce,
    Off,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum UnorderedDeletes {
    Refuse,
    Allow,
}

#[derive(Args)]
pub struct LeaderArgs {
    /// Run without leader election (a single replica only).
    #[arg(long, env = "CASCADE_GUARD_NO_LEADER_ELECTION")]
    pub no_leader_election: bool,
    /// Namespace of the Lease; default: the pod's namespace (POD_NAMESPACE), else default.
    #[arg(
        long,
        env = "CASCADE_GUARD_LEADER_ELECTION_NAMESPACE",
        value_name = "NAMESPACE"
    )]
    pub leader_election_namespace: Option<String>,
    /// Name of the Lease.
    #[arg(
        long,
        env = "CASCADE_GUARD_LEADER_ELECTION_ID",
        default_value = "cascade-guard",
        value_name = "NAME"
    )]
    pub leader_election_id: String,
    /// How long a leader's renewal keeps the other replicas off.
    #[arg(long, value_parser = humantime_duration, default_value = "15s", value_name = "DURATION")]
    pub leader_election_lease_duration: Duration,
    /// Time between a leader's renewals of its Lease.
    #[arg(long, value_parser = humantime_duration, default_value = "2s", value_name = "DURATION")]
    pub leader_election_renew_interval: Duration,
    /// --leader-election-lease-duration in seconds, its old name (hidden;
    /// still read).
    #[arg(long, hide = true, conflicts_with = "leader_election_lease_duration")]
    pub leader_election_lease_seconds: Option<u64>,
    /// --leader-election-renew-interval in seconds, its old name (hidden;
    /// still read).
    #[arg(long, hide = true, conflicts_with = "leader_election_renew_interval")]
    pub leader_election_renew_seconds: Option<u64>,
}

/// The object `plan` and `trace` start from, named as kubectl names it.
#[derive(Args)]
pub struct ObjectArgs {
    /// The root's resource: plural, singular or kind, optionally with .group
    /// (inferenceclusters, InferenceCluster.modelplane.ai), or TYPE/NAME.
    pub resource: String,
    /// The root's name (unless given as TYPE/NAME).
    pub name: Option<String>,
    /// The root's namespace, if it is namespaced (default: the kubeconfig
    /// context's).
    #[arg(short, long)]
    pub namespace: Option<String>,
}

impl ObjectArgs {
    /// The resource and the name, from `TYPE NAME` or `TYPE/NAME`.
    pub fn target(&self) -> Result<(String, String), CommandError> {
        target(self.resource.clone(), self.name.clone())
    }
}

/// `TYPE NAME` or `TYPE/NAME`, as kubectl takes them.
fn target(resource: String, name: Option<String>) -> Result<(String, String), CommandError> {
    match (resource.split_once('/'), name) {
        (Some((r, n)), None) if !r.is_empty() && !n.is_empty() => {
            Ok((r.to_string(), n.to_string()))
        }
        (Some(_), Some(_)) => Err(CommandError::Usage(
            "give TYPE NAME or TYPE/NAME, not both".into(),
        )),
        (None, Some(name)) => Ok((resource, name)),
        _ => Err(CommandError::Usage(
            "name the object: TYPE NAME or TYPE/NAME".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

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

    /// Every time flag takes a duration; the names they had before, in
    /// seconds or milliseconds, still parse as they did (older charts and
    /// scripts pass them), and not together with the new name.
    #[test]
    fn time_flags_take_durations_and_their_old_names_their_old_units() {
        let parse = |args: &[&str]| {
            let mut all = vec!["cascade-guard"];
            all.extend_from_slice(args);
            Cli::try_parse_from(all).map(|cli| cli.command)
        };
        let run = |args: &[&str]| match parse(&[&["run"][..], args].concat()) {
            Ok(Command::Run(run)) => (
                run.resync(),
                run.leader.lease_duration(),
                run.leader.renew_interval(),
            ),
            _ => panic!("run {args:?} does not parse"),
        };
        let secs = Duration::from_secs;
        assert_eq!(run(&[]), (secs(300), secs(15), secs(2)));
        assert_eq!(
            run(&[
                "--resync=1m",
                "--leader-election-lease-duration=30s",
                "--leader-election-renew-interval=5s"
            ]),
            (secs(60), secs(30), secs(5))
        );
        assert_eq!(
            run(&[
                "--resync-seconds=20",
                "--leader-election-lease-seconds=3",
                "--leader-election-renew-seconds=1"
            ]),
            (secs(20), secs(3), secs(1))
        );
        assert!(parse(&["run", "--resync=1m", "--resync-seconds=20"]).is_err());
        let interval = |args: &[&str]| match parse(&[&["trace", "xr/a"][..], args].concat()) {
            Ok(Command::Trace(trace)) => trace.interval(),
            _ => panic!("trace {args:?} does not parse"),
        };
        assert_eq!(interval(&[]), Duration::from_millis(500));
        assert_eq!(interval(&["--interval", "2s"]), secs(2));
        assert_eq!(
            interval(&["--interval-ms", "100"]),
            Duration::from_millis(100)
        );
        assert!(parse(&["run", "--resync-seconds=1m"]).is_err());
    }
}
