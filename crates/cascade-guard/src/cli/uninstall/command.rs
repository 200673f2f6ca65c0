//! `cascade-guard uninstall` on the command line: its arguments, progress on
//! stderr and the summary on stdout.

use std::time::Duration;

use clap::Args;

use crate::cli::args::ClusterArgs;
use crate::cli::connect::client;
use crate::cli::duration::humantime_duration;
use crate::cli::exit::{CommandError, Outcome, out};

/// `uninstall --help`'s examples and exit codes.
const HELP: &str = "\
Examples:
  # Stop the controller first, then take everything out
  kubectl -n cascade-guard-system scale deployment cascade-guard --replicas=0
  cascade-guard uninstall

  # Wait up to 30 minutes for deleting objects to finish their cascade
  cascade-guard uninstall --timeout 30m

Exit codes:
  0  everything cascade-guard put in is out
  1  a controller still runs (pass --force to go on), objects still cascade after
     --timeout (run it again), or a request failed
  2  the command line is wrong
  5  the cluster cannot be reached, or no kubeconfig can be found
";

#[derive(Args)]
#[command(after_help = HELP)]
pub struct UninstallArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Go on although a controller still holds the leader Lease (it will put
    /// back what this removes).
    #[arg(long)]
    pub force: bool,
    /// How long to wait for deleting objects to finish their foreground
    /// cascade before giving up (they stay held; run uninstall again).
    #[arg(long, value_parser = humantime_duration, default_value = "10m", value_name = "DURATION")]
    pub timeout: Duration,
    /// The controller's Lease name (its --leader-election-id).
    #[arg(long, default_value = "cascade-guard", value_name = "NAME")]
    pub leader_election_id: String,
}

pub async fn run(args: UninstallArgs) -> Outcome {
    let client = client(&args.cluster.selection()).await?;
    let options = super::UninstallOptions {
        force: args.force,
        timeout: args.timeout,
        leader_election_id: args.leader_election_id,
    };
    let summary = super::uninstall(&client, &options, |line| {
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
        return Err(CommandError::Unfinished(format!(
            "still cascading after {}s, and still held: {}. Run cascade-guard uninstall again to finish",
            options.timeout.as_secs(),
            summary.left.join(", ")
        )));
    }
    Ok(0)
}
