//! `cascade-guard plan` on the command line: its arguments, the plan printed
//! as asked, and its exit code.

use clap::Args;

use crate::cli::args::{ClusterArgs, ObjectArgs};
use crate::cli::connect::connect;
use crate::cli::exit::{Outcome, PLAN_HAZARD, out};
use crate::policy::Mode;

/// `plan --help`'s examples and exit codes.
const HELP: &str = "\
Examples:
  # What deleting InferenceCluster prod would do now: waves, waits, hazards
  cascade-guard plan inferencecluster prod

  # As TYPE/NAME, in another namespace and context
  cascade-guard plan modeldeployment/llama -n team-a --context prod

  # What it would do in Convert mode, as a Mermaid flowchart
  cascade-guard plan inferencecluster prod --mode Convert -o mermaid

  # Drawn by Graphviz
  cascade-guard plan inferencecluster prod -o dot | dot -Tsvg > plan.svg

Exit codes:
  0  the delete has no hazard
  1  no plan could be made (the object is not there, the cluster refused a read)
  2  the command line is wrong
  3  the delete is not shown safe: a hazard (two objects that need each other go at once),
     sibling order not in force for the tree, or the tree read only in part (cut at 5,000
     objects, or objects it may not read)
  5  the cluster cannot be reached, or no kubeconfig can be found
";

#[derive(Args)]
#[command(after_help = HELP)]
pub struct PlanArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub object: ObjectArgs,
    /// Plan for this mode instead of the one today's policies give the kind.
    #[arg(long, ignore_case = true, value_name = "MODE", value_parser = crate::cli::values::mode())]
    pub mode: Option<Mode>,
    /// The mode of XRDs without the annotation (default: the one the running
    /// controller publishes on its Lease; Refuse when none runs).
    #[arg(
        long,
        env = "CASCADE_GUARD_XRD_DEFAULT_MODE",
        ignore_case = true,
        value_name = "MODE",
        value_parser = crate::cli::values::mode()
    )]
    pub xrd_default_mode: Option<Mode>,
    /// text for people, json or yaml for programs, dot (Graphviz) or mermaid
    /// to draw the tree, its waves, edges, holds and hazards.
    #[arg(short, long, value_enum, default_value = "text", value_name = "FORMAT")]
    pub output: PlanOutput,
    /// The name of the controller's Lease (its --leader-election-id), looked
    /// for in every namespace: whether it runs and has ordered this tree.
    #[arg(long, default_value = "cascade-guard", value_name = "NAME")]
    pub leader_election_id: String,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum PlanOutput {
    Text,
    Json,
    Yaml,
    Dot,
    Mermaid,
}

pub async fn run(args: PlanArgs) -> Outcome {
    let (resource, name) = args.object.target()?;
    let (client, context_namespace) = connect(&args.cluster.selection()).await?;
    let options = super::Options {
        resource,
        name,
        namespace: args.object.namespace.unwrap_or(context_namespace),
        mode: args.mode,
        xrd_default_mode: args.xrd_default_mode,
        leader_election_id: args.leader_election_id,
    };
    let plan = super::plan(&client, &options).await?;
    match args.output {
        PlanOutput::Text => out(&super::text::render_text(&plan))?,
        PlanOutput::Json => out(&format!("{}\n", serde_json::to_string_pretty(&plan)?))?,
        PlanOutput::Yaml => out(&serde_yaml::to_string(&plan)?)?,
        PlanOutput::Dot => out(&super::dot::render_dot(&plan))?,
        PlanOutput::Mermaid => out(&super::mermaid::render_mermaid(&plan))?,
    }
    Ok(if plan.unsafe_now() { PLAN_HAZARD } else { 0 })
}
