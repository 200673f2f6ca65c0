//! The `cascade-guard` command: the command line parsed, each command run,
//! and how it ended turned into an exit code. Errors end here, as anyhow.

use anyhow::Result;
use clap::{CommandFactory, FromArgMatches};

use cascade_guard::cli;
use cascade_guard::cli::args::{Cli, Command, RunArgs, SiblingOrder, UnorderedDeletes};
use cascade_guard::cli::exit::{CommandError, FAILED, UNREACHABLE};
use cascade_guard::controller::Settings;
use cascade_guard::controller::process::{self, LeaderElection, Process, ProcessError};

fn main() -> Result<()> {
    // Before the runtime starts its threads.
    cascade_guard::controller::memory::one_arena();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(command())
}

async fn command() -> Result<()> {
    let cli = parse();
    let outcome = match cli.command {
        Command::Run(args) => return run(args).await,
        Command::Render(args) => cli::render::command::run(args).await,
        Command::Crd => cli::version::crd(),
        Command::Version { client, cluster } => {
            cli::version::version(&cluster.selection(), client).await
        }
        Command::Completion { shell } => cli::exit::out(&cli::completion::script(
            shell,
            &Cli::command(),
            "cascade-guard",
        ))
        .map(|()| 0),
        Command::CompleteObjects { words } => {
            cli::completion::objects::run(&words, &Cli::command()).await
        }
        Command::Uninstall(args) => cli::uninstall::command::run(args).await,
        Command::Status(args) => cli::status::command::run(args).await,
        Command::Trace(args) => cli::trace::command::run(args).await,
        Command::Plan(args) => cli::plan::command::run(args).await,
    };
    match outcome {
        Ok(0) => Ok(()),
        Ok(code) => std::process::exit(code),
        Err(e) => exit_on(e),
    }
}

/// Prints a command's error as people need it, and exits.
fn exit_on(e: CommandError) -> Result<()> {
    // No kubeconfig to find the cluster by: only the line that says what to
    // do, not the context it came up in.
    if let Some(cause) = e.config() {
        eprintln!("Error: {cause}");
        std::process::exit(UNREACHABLE);
    }
    let code = e.exit_code();
    let e = anyhow::Error::from(e);
    // The reader went away (`cascade-guard crd | head -1`): not an error.
    if is_broken_pipe(&e) {
        return Ok(());
    }
    if code != FAILED {
        eprintln!("Error: {e:#}");
        std::process::exit(code);
    }
    // Returned from main: printed with its causes, exit 1 (FAILED).
    Err(e)
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

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `cascade-guard run`: the controller, with its arguments read into its
/// settings.
async fn run(args: RunArgs) -> Result<()> {
    process::init_logging(args.log_json);
    let client = match cli::connect::configure(&args.cluster.selection()).await {
        Ok((client, _, _)) => client,
        Err(e) => return exit_on(e),
    };
    let settings = Settings {
        home_namespace: process::home_namespace(args.leader.leader_election_namespace.clone()),
        xrd_default_mode: args.policy.xrd_default_mode,
        compile: args.policy.compile_settings(),
        resync: args.resync(),
        stall_after: args.stall_after,
        restart_quiet_cascades_after: (!args.restart_quiet_cascades_after.is_zero())
            .then_some(args.restart_quiet_cascades_after),
        sibling_order: args.sibling_order == SiblingOrder::Enforce,
        refuse_unordered_deletes: args.unordered_deletes == UnorderedDeletes::Refuse,
        hold_composed: args.hold_composed,
        ..Settings::default()
    };
    let process = Process {
        settings,
        http_address: args.http_address,
        static_manifests_dir: args.static_manifests_dir,
        static_only: args.static_only,
        leader: LeaderElection {
            enabled: !args.leader.no_leader_election,
            lease_duration: args.leader.lease_duration(),
            renew_interval: args.leader.renew_interval(),
            id: args.leader.leader_election_id,
        },
    };
    match process::run(client, process).await {
        // Leader election at work, not a fault: one line, no backtrace.
        Err(e @ ProcessError::LostLeadership) => {
            eprintln!("{e}");
            std::process::exit(FAILED);
        }
        other => Ok(other?),
    }
}
