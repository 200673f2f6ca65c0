//! `cascade-guard trace` on the command line: its arguments, and the run
//! that turns them into a trace and its outcome into an exit code.

use std::io::IsTerminal;
use std::time::Duration;

use clap::Args;

use crate::cli::args::{ClusterArgs, ObjectArgs};
use crate::cli::connect::connect;
use crate::cli::duration::humantime_duration;
use crate::cli::exit::{Outcome, TRACE_INCOMPLETE};

/// `trace --help`'s examples and exit codes.
const HELP: &str = "\
Examples:
  # Follow InferenceCluster prod's teardown: a live tree on a terminal
  cascade-guard trace inferencecluster prod

  # One JSON object per change, as TYPE/NAME; give up after 10 minutes
  cascade-guard trace modeldeployment/llama -n team-a -o json --timeout 10m

  # Delete, and watch it go
  kubectl delete inferencecluster prod --wait=false
  cascade-guard trace inferencecluster prod

  # A picture of a stuck teardown as it stands now (Graphviz)
  cascade-guard trace inferencecluster prod --once -o dot | dot -Tsvg > teardown.svg

Exit codes:
  0  everything in the tree is gone (with --once: the tree was read)
  1  the teardown cannot be followed (the object is not there)
  2  the command line is wrong
  4  the teardown did not complete within --timeout
  5  the cluster cannot be reached, or no kubeconfig can be found
";

#[derive(Args)]
#[command(after_help = HELP)]
pub struct TraceArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub object: ObjectArgs,
    /// text: a live tree on a terminal, change lines otherwise; json: one JSON
    /// object per change, then the summary; yaml: one YAML document each;
    /// dot (Graphviz) or mermaid: one picture at the end, of what left in
    /// which order and what holds the rest.
    #[arg(short, long, value_enum, default_value = "text", value_name = "FORMAT")]
    pub output: TraceOutput,
    /// Give up after this long and summarize (90s, 10m, 1h, or seconds; 0:
    /// never). Exits 4 when the teardown did not complete.
    #[arg(long, value_parser = humantime_duration, default_value = "0", value_name = "DURATION")]
    pub timeout: Duration,
    /// Time between looks at the tree (at least 50ms).
    #[arg(long, value_parser = humantime_duration, default_value = "500ms", value_name = "DURATION")]
    pub interval: Duration,
    /// --interval in milliseconds, its old name (hidden; still read).
    #[arg(
        long,
        hide = true,
        conflicts_with = "interval",
        value_name = "MILLISECONDS"
    )]
    pub interval_ms: Option<u64>,
    /// Look once at the whole tree and stop: the teardown as it stands now
    /// (exits 0 whether or not it is complete).
    #[arg(long)]
    pub once: bool,
    /// The controller's Lease name (its --leader-election-id): where a
    /// picture reads what sibling order holds.
    #[arg(long, default_value = "cascade-guard", value_name = "NAME")]
    pub leader_election_id: String,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum TraceOutput {
    Text,
    Json,
    Yaml,
    Dot,
    Mermaid,
}

impl TraceArgs {
    /// --interval, or the milliseconds of its old name; 50ms at least.
    pub fn interval(&self) -> Duration {
        self.interval_ms
            .map_or(self.interval, Duration::from_millis)
            .max(Duration::from_millis(50))
    }
}

pub async fn run(args: TraceArgs) -> Outcome {
    let (resource, name) = args.object.target()?;
    let interval = args.interval();
    let (client, context_namespace) = connect(&args.cluster.selection()).await?;
    let output = match args.output {
        TraceOutput::Json => super::Output::Json,
        TraceOutput::Yaml => super::Output::Yaml,
        TraceOutput::Text => super::Output::Text,
        TraceOutput::Dot => super::Output::Dot,
        TraceOutput::Mermaid => super::Output::Mermaid,
    };
    let options = super::Options {
        live: output == super::Output::Text && std::io::stdout().is_terminal(),
        resource,
        name,
        namespace: Some(args.object.namespace.unwrap_or(context_namespace)),
        output,
        interval,
        timeout: (!args.timeout.is_zero()).then_some(args.timeout),
        once: args.once,
        leader_election_id: args.leader_election_id,
    };
    let mut out = std::io::stdout().lock();
    let summary = super::trace(&client, &options, &mut out).await?;
    if !summary.complete && !args.once {
        eprintln!("cascade-guard trace: the teardown did not complete");
        return Ok(TRACE_INCOMPLETE);
    }
    Ok(0)
}
