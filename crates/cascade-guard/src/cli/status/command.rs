//! `cascade-guard status` on the command line: its arguments, the report
//! printed as asked, and the exit code a script gates on.

use clap::Args;

use crate::cli::args::{ClusterArgs, PolicyArgs};
use crate::cli::connect::client;
use crate::cli::exit::{Outcome, out};

/// `status --help`'s examples and exit codes.
const HELP: &str = "\
Examples:
  # What is protected, whether it is in force, what is cascading now
  cascade-guard status

  # For a script: JSON on stdout, and an exit code to gate on
  cascade-guard status -o json > status.json

  # Compare by the flags given here, not the running controller's settings
  cascade-guard status --use-flags --xrd-default-mode Warn

Exit codes:
  0  every protected kind is guarded as its policy compiles, and a controller runs
  1  the status cannot be read
  2  the command line is wrong
  3  a protected kind is unguarded, or an admission object is missing, differs or is extra
  4  no controller runs: what is in force stays, nothing repairs it or converts deletes
  5  the cluster cannot be reached, or no kubeconfig can be found
";

#[derive(Args)]
#[command(after_help = HELP)]
pub struct StatusArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// The settings to compile with when no running controller publishes its
    /// own (or with --use-flags): the flags it runs with.
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// text for people, json or yaml for scripts.
    #[arg(short, long, value_enum, default_value = "text", value_name = "FORMAT")]
    pub output: StatusOutput,
    /// The name of the controller's Lease (its --leader-election-id), looked
    /// for in every namespace.
    #[arg(long, default_value = "cascade-guard", value_name = "NAME")]
    pub leader_election_id: String,
    /// Compile with the flags given here even when the running controller
    /// publishes its own settings on its Lease (they are used by default).
    #[arg(long)]
    pub use_flags: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum StatusOutput {
    Text,
    Json,
    Yaml,
}

pub async fn run(args: StatusArgs) -> Outcome {
    let client = client(&args.cluster.selection()).await?;
    let settings = super::ControllerFlags {
        xrd_default_mode: args.policy.xrd_default_mode,
        compile: args.policy.compile_settings(),
    };
    let report =
        super::status(&client, &settings, &args.leader_election_id, args.use_flags).await?;
    match args.output {
        StatusOutput::Text => out(&super::render_text(&report))?,
        StatusOutput::Json => out(&format!("{}\n", serde_json::to_string_pretty(&report)?))?,
        StatusOutput::Yaml => out(&serde_yaml::to_string(&report)?)?,
    }
    // Exit codes a script can gate on (README, "Watching a teardown").
    Ok(report.exit_code())
}
