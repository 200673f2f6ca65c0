//! `cascade-guard trace` on the command line: its arguments, and the run
//! that turns them into a trace and its outcome into an exit code.

use std::io::IsTerminal;
use std::time::Duration;

use clap::Args;

use crate::cli::args::{ClusterArgs, ObjectArgs};
use crate::cli::connect::connect;
use crate::cli::duration::humantime_duration;
use crate::cli::exit::{Outcome, TRACE_INCOMPLETE};

#[derive(Args)]
pub struct TraceArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub object: ObjectArgs,
    /// text: a live tree on a terminal, change lines otherwise; json: one JSON
    /// object per change, then the summary; yaml: one YAML document each.
    #[arg(short, long, value_enum, default_value = "text")]
    pub output: TraceOutput,
    /// Give up after this long and summarize (90s, 10m, 1h or seconds; 0:
    /// never). Exits 4 when the teardown did not complete.
    #[arg(long, value_parser = humantime_duration, default_value = "0")]
    pub timeout: Duration,
    /// Milliseconds between looks.
    #[arg(long, default_value_t = 500)]
    pub interval_ms: u64,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum TraceOutput {
    Text,
    Json,
    Yaml,
}

pub async fn run(args: TraceArgs) -> Outcome {
    let (resource, name) = args.object.target()?;
    let (client, context_namespace) = connect(&args.cluster.selection()).await?;
    let output = match args.output {
        TraceOutput::Json => super::Output::Json,
        TraceOutput::Yaml => super::Output::Yaml,
        TraceOutput::Text => super::Output::Text,
    };
    let options = super::Options {
        live: output == super::Output::Text && std::io::stdout().is_terminal(),
        resource,
        name,
        namespace: Some(args.object.namespace.unwrap_or(context_namespace)),
        output,
        interval: Duration::from_millis(args.interval_ms.max(50)),
        timeout: (!args.timeout.is_zero()).then_some(args.timeout),
    };
    let mut out = std::io::stdout().lock();
    let summary = super::trace(&client, &options, &mut out).await?;
    if !summary.complete {
        eprintln!("cascade-guard trace: the teardown did not complete");
        return Ok(TRACE_INCOMPLETE);
    }
    Ok(0)
}
