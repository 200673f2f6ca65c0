//! `local-cluster up | down | status | env`: a local control plane in the
//! background, for the demo and for people. Its admin kubeconfig is written to
//! `<dir>/kubeconfig`, by default `.local-cluster/kubeconfig` in the repository.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use local_cluster::process::{Lifetime, Process};
use local_cluster::{ControlPlane, Options, State};

#[path = "local-cluster/supervisor.rs"]
mod supervisor;

#[derive(Parser)]
#[command(
    name = "local-cluster",
    about = "A real local Kubernetes control plane"
)]
struct Cli {
    /// Where the control plane keeps its state, certificates, logs, data and kubeconfig.
    #[arg(long, env = "LOCAL_CLUSTER_DIR", global = true)]
    dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start etcd, kube-apiserver and kube-controller-manager in the background
    /// (or reuse the ones already running) and print the kubeconfig's path.
    Up {
        /// kube-controller-manager's --use-service-account-credentials.
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        use_service_account_credentials: bool,
        /// Also run real Crossplane on it: core, function-patch-and-transform,
        /// provider-kubernetes, provider-helm and the local cloud (built by
        /// testbed/crossplane/build.sh), under a supervisor process in the
        /// background.
        #[arg(long)]
        crossplane: bool,
        /// With --crossplane: also install the seed's platform (Modelplane's
        /// XRDs, the project's Compositions and charts,
        /// testbed/crossplane/modelplane/).
        #[arg(long, requires = "crossplane")]
        modelplane: bool,
    },
    /// Stop the control plane and remove its directory.
    Down,
    /// Say whether the control plane is running.
    Status,
    /// Print `export KUBECONFIG=...` for a shell to eval.
    Env,
    /// Run real Crossplane on the control plane in the foreground until
    /// SIGTERM (what `up --crossplane` starts in the background).
    #[command(hide = true)]
    ServeCrossplane {
        #[arg(long)]
        modelplane: bool,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("warn,kube_client::client::builder=off")
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let dir = cli.dir.unwrap_or_else(default_dir);
    match cli.command {
        Command::Up {
            use_service_account_credentials,
            crossplane,
            modelplane,
        } => {
            up(&dir, use_service_account_credentials).await?;
            if crossplane {
                supervisor::up(&dir, modelplane).await?;
            }
            Ok(())
        }
        Command::Down => {
            supervisor::down(&dir);
            down(&dir)
        }
        Command::Status => {
            supervisor::status(&dir);
            status(&dir)
        }
        Command::ServeCrossplane { modelplane } => supervisor::serve(&dir, modelplane).await,
        Command::Env => {
            println!("export KUBECONFIG={}", dir.join("kubeconfig").display());
            Ok(())
        }
    }
}

fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.local-cluster")
}

fn state_path(dir: &Path) -> PathBuf {
    dir.join("state.json")
}

fn read_state(dir: &Path) -> Result<Option<State>> {
    let path = state_path(dir);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some(
            serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// The recorded processes, and whether all of them still run.
fn running(state: &State) -> (Vec<Process>, bool) {
    let mut processes: Vec<Process> = state
        .processes
        .iter()
        .map(|p| Process::adopt(p.name.clone(), p.pid, p.binary.clone(), p.log.clone()))
        .collect();
    let all = !processes.is_empty() && processes.iter_mut().all(|p| p.is_running());
    (processes, all)
}

async fn up(dir: &Path, use_service_account_credentials: bool) -> Result<()> {
    if let Some(state) = read_state(dir)? {
        let (processes, all) = running(&state);
        if all && state.use_service_account_credentials == use_service_account_credentials {
            eprintln!("local-cluster: already running at {}", state.server);
            println!("{}", state.kubeconfig.display());
            return Ok(());
        }
        eprintln!(
            "local-cluster: replacing the control plane recorded in {}",
            dir.display()
        );
        supervisor::down(dir);
        stop(processes);
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = std::fs::canonicalize(dir)?;
    let started = std::time::Instant::now();
    let cp = ControlPlane::start(Options {
        use_service_account_credentials,
        dir: Some(dir.clone()),
        lifetime: Lifetime::Detached,
        ..Options::default()
    })
    .await?;
    let state = cp.state();
    std::fs::write(state_path(&dir), serde_json::to_string_pretty(&state)?)?;
    eprintln!(
        "local-cluster: up at {} in {:.1}s (garbage collector: {})",
        state.server,
        started.elapsed().as_secs_f64(),
        cp.garbage_collector_username()
    );
    println!("{}", state.kubeconfig.display());
    Ok(())
}

fn stop(processes: Vec<Process>) {
    // Reverse start order: the controller manager, the API server, then etcd.
    for mut p in processes.into_iter().rev() {
        p.stop(Duration::from_secs(10));
    }
}

fn down(dir: &Path) -> Result<()> {
    let Some(state) = read_state(dir)? else {
        eprintln!("local-cluster: nothing recorded in {}", dir.display());
        return Ok(());
    };
    let (processes, _) = running(&state);
    stop(processes);
    std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    eprintln!("local-cluster: stopped");
    Ok(())
}

fn status(dir: &Path) -> Result<()> {
    let Some(state) = read_state(dir)? else {
        bail!("not running (nothing recorded in {})", dir.display());
    };
    let (mut processes, all) = running(&state);
    for p in &mut processes {
        let word = if p.is_running() { "running" } else { "stopped" };
        println!("{:<24} pid {:<8} {word}", p.name, p.pid);
    }
    println!("server      {}", state.server);
    println!("kubeconfig  {}", state.kubeconfig.display());
    if !all {
        bail!("not every component is running; `local-cluster up` replaces it");
    }
    Ok(())
}
