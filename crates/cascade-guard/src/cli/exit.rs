//! How a command ends: the exit codes a script can gate on, and the errors a
//! command returns to `main`, which prints them and picks the code.

use std::io::Write;

use super::connect::Unreachable;
use super::kubeconfig::ConfigError;

/// A command that could not do its job: bad input, an error from the cluster.
pub const FAILED: i32 = 1;
/// `plan`: the delete it plans has a hazard.
pub const PLAN_HAZARD: i32 = 3;
/// `trace`: the teardown did not complete within `--timeout`.
pub const TRACE_INCOMPLETE: i32 = 4;
/// Every command but `run` (which keeps retrying): the API server cannot be
/// reached, or there is no kubeconfig to find it by.
pub const UNREACHABLE: i32 = 5;

/// Why a command failed. `main` prints it (with its causes) and exits
/// [`FAILED`], or [`UNREACHABLE`] for the two kinds that say so.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// Said alone, without the context it came up in (see `main`).
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Unreachable(#[from] Unreachable),
    /// The arguments do not name what the command needs.
    #[error("{0}")]
    Usage(String),
    /// The command stopped short of its job; run it again.
    #[error("{0}")]
    Unfinished(String),
    /// Input the command will not act on (render's problems).
    #[error("{0}")]
    Rejected(String),
    /// Another error, with what the command was doing when it happened.
    #[error("{context}")]
    Context {
        context: String,
        #[source]
        source: Box<CommandError>,
    },
    #[error(transparent)]
    Trace(Box<super::trace::TraceError>),
    #[error(transparent)]
    Plan(Box<super::plan::PlanError>),
    #[error(transparent)]
    Cluster(Box<crate::Error>),
    #[error(transparent)]
    Kube(Box<kube::Error>),
    #[error(transparent)]
    Static(#[from] crate::policy::static_manifest::StaticError),
    #[error(transparent)]
    Skip(#[from] crate::policy::render::SkipError),
    #[error("cannot write the output: {0}")]
    Output(#[from] std::io::Error),
    #[error("cannot serialize the output: {0}")]
    Json(#[from] serde_json::Error),
    #[error("cannot serialize the output: {0}")]
    Yaml(#[from] serde_yaml::Error),
}

// Boxed: these are large, and a command's every Result carries the size of
// the largest.
macro_rules! boxed_from {
    ($($variant:ident: $error:ty),*) => {$(
        impl From<$error> for CommandError {
            fn from(e: $error) -> Self {
                CommandError::$variant(Box::new(e))
            }
        }
    )*};
}

boxed_from!(
    Trace: super::trace::TraceError,
    Plan: super::plan::PlanError,
    Cluster: crate::Error,
    Kube: kube::Error
);

impl CommandError {
    /// The code the command exits with: [`UNREACHABLE`] when there is no
    /// cluster to talk to, else [`FAILED`].
    pub fn exit_code(&self) -> i32 {
        match self {
            CommandError::Config(_) | CommandError::Unreachable(_) => UNREACHABLE,
            CommandError::Context { source, .. } => source.exit_code(),
            _ => FAILED,
        }
    }

    /// The kubeconfig that could not be used, under any context: its one
    /// line says what to do, and is said alone.
    pub fn config(&self) -> Option<&ConfigError> {
        match self {
            CommandError::Config(e) => Some(e),
            CommandError::Context { source, .. } => source.config(),
            _ => None,
        }
    }

    /// This error, said as the cause of `context`.
    pub fn context(self, context: impl Into<String>) -> Self {
        CommandError::Context {
            context: context.into(),
            source: Box::new(self),
        }
    }
}

/// What a command that ran to its end exits with: 0, or a code that says
/// how it found things ([`PLAN_HAZARD`], [`TRACE_INCOMPLETE`], status's).
pub type Outcome = Result<i32, CommandError>;

/// Writes command output to stdout.
pub fn out(text: &str) -> Result<(), CommandError> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()?;
    Ok(())
}
