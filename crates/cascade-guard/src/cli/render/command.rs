//! `cascade-guard render` on the command line: its arguments, the release
//! check of `--static`, and the output written only when nothing failed.

use std::path::PathBuf;

use clap::Args;

use crate::cli::args::PolicyArgs;
use crate::cli::connect::client;
use crate::cli::exit::{CommandError, Outcome, out};
use crate::cli::kubeconfig::Selection;
use crate::policy::{render, static_manifest, yaml_stream};

/// `render --help`'s examples and exit codes.
const HELP: &str = "\
Examples:
  # The admission objects for a package's XRDs, to apply yourself
  cascade-guard render apis/ > cascade-guard-policies.yaml

  # In a package's CI: fail on any problem, and when nothing is protected
  cascade-guard render --strict apis/

  # One set per package, so that two packages' sets do not overwrite each other
  cascade-guard render --set-name my-package apis/

  # Static manifests for the API server's staticManifestsDir
  cascade-guard render --static --kubernetes-version 1.37 apis/ > cascade-guard.yaml

Exit codes:
  0  the objects are written
  1  a problem in the input (with --strict also a warning, or nothing protected):
     nothing is written
  2  the command line is wrong
  5  --static without --kubernetes-version, and the cluster cannot be reached
";

#[derive(Args)]
#[command(after_help = HELP)]
pub struct RenderArgs {
    /// Files or directories (walked recursively for .yaml, .yml and .json).
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Exit non-zero when any input has a problem, warnings included, when
    /// nothing is protected, and when a document is not an XRD,
    /// CascadePolicy or CRD (unless it is Crossplane package content, such
    /// as a Composition, or its kind is given to --skip).
    #[arg(long)]
    pub strict: bool,
    /// A kind (Deployment, or Deployment.apps; any case) that is in the
    /// input on purpose and protects nothing: --strict passes over it.
    /// Repeatable, or a comma list. Crossplane package kinds need not be
    /// given.
    #[arg(long, value_name = "KIND", value_delimiter = ',')]
    pub skip: Vec<String>,
    /// yaml: a multi-document stream for kubectl apply; json: one List.
    #[arg(short, long, value_enum, default_value = "yaml", value_name = "FORMAT")]
    pub output: RenderOutput,
    /// Append -NAME to the objects every XRD of a mode shares
    /// (cascade-guard-xrds-refuse-composite-NAME), so that sets rendered and
    /// applied separately, one per package, do not overwrite one another's.
    #[arg(long, value_name = "NAME")]
    pub set_name: Option<String>,
    /// Write static admission manifests instead: the same policies and
    /// bindings, named *.static.k8s.io, for the API server's
    /// staticManifestsDir (save the output as a .yaml file there on every
    /// control-plane node). Needs Kubernetes 1.36 or newer.
    #[arg(long = "static")]
    pub static_manifests: bool,
    /// The Kubernetes release the static manifests are for (1.37, v1.36.5);
    /// default: the release of the cluster in the kubeconfig.
    #[arg(long, requires = "static_manifests", value_name = "RELEASE")]
    pub kubernetes_version: Option<String>,
    /// With --static and no --kubernetes-version: the kubeconfig whose
    /// cluster's release to read. render contacts no cluster otherwise.
    #[arg(long, requires = "static_manifests", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// With --static and no --kubernetes-version: the kubeconfig context
    /// whose cluster's release to read.
    #[arg(long, requires = "static_manifests", value_name = "NAME")]
    pub context: Option<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RenderOutput {
    Yaml,
    Json,
}

pub async fn run(args: RenderArgs) -> Outcome {
    if args.static_manifests {
        let cluster = Selection {
            kubeconfig: args.kubeconfig.clone(),
            context: args.context.clone(),
        };
        static_release_check(&cluster, args.kubernetes_version.as_deref()).await?;
    }
    let mut settings = args.policy.compile_settings();
    if let Some(set) = &args.set_name {
        render::validate_set_name(set)
            .map_err(|e| CommandError::Usage(format!("--set-name: {e}")))?;
        settings.set_name = Some(set.clone());
    }
    let skip = render::Skip::new(&args.skip)?;
    let mut rendered = super::render_paths(&args.paths, args.policy.xrd_default_mode, &settings)?;
    let passed = render::passed_over(&rendered, &skip);
    let review = render::review_problems(&rendered, &passed, args.strict);
    rendered.problems.extend(review);
    // The whole output is built before anything is written: a render that
    // fails prints nothing, so `render | kubectl apply -f -` applies nothing.
    let objects = if args.static_manifests {
        static_manifest::to_static_documents(&rendered.objects)?
    } else {
        rendered.objects.clone()
    };
    let text = match (args.output, args.static_manifests) {
        (RenderOutput::Json, _) => {
            let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
            format!("{}\n", serde_json::to_string_pretty(&list)?)
        }
        (RenderOutput::Yaml, true) => static_manifest::with_header(&objects),
        (RenderOutput::Yaml, false) => yaml_stream::to_yaml_stream(&objects),
    };
    for problem in &rendered.problems {
        eprintln!("cascade-guard render: {problem}");
    }
    for note in render::notes(&passed, args.strict) {
        eprintln!("cascade-guard render: {note}");
    }
    eprintln!(
        "cascade-guard render: {}",
        render::summary(&rendered.policies)
    );
    if render::fails(&rendered.problems, args.strict) {
        return Err(CommandError::Rejected(format!(
            "{} problem(s) in the input; nothing written",
            rendered.problems.len()
        )));
    }
    out(&text)?;
    Ok(0)
}

/// Refuses a release without static admission manifests: the one given, else
/// the cluster's.
async fn static_release_check(
    cluster: &Selection,
    release: Option<&str>,
) -> Result<(), CommandError> {
    let (major, minor) = match release {
        Some(release) => static_manifest::parse_release(release)?,
        None => {
            let client = client(cluster).await.map_err(|e| {
                e.context("render --static needs the Kubernetes release it is for: give --kubernetes-version, or a kubeconfig whose cluster answers")
            })?;
            let info = client.apiserver_version().await.map_err(|e| {
                CommandError::from(e)
                    .context("cannot read the API server's version (or give --kubernetes-version)")
            })?;
            (info.major, info.minor)
        }
    };
    static_manifest::release_supports(&major, &minor)?;
    Ok(())
}
