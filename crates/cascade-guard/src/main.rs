//! The `cascade-guard` command. Errors end here, as anyhow, with context.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cascade-guard",
    version,
    about = "Makes every delete of a protected Kubernetes object a safe, foreground cascade"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print cascade-guard's version, and the API server's when one is reachable.
    Version {
        /// Only the client's version; do not contact the API server.
        #[arg(long)]
        client: bool,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Version { client } => version(client).await,
    }
}

async fn version(client_only: bool) -> Result<()> {
    println!("cascade-guard {}", env!("CARGO_PKG_VERSION"));
    if client_only {
        return Ok(());
    }
    let client = kube::Client::try_default()
        .await
        .context("cannot configure a Kubernetes client (KUBECONFIG or in-cluster)")?;
    let info = client
        .apiserver_version()
        .await
        .context("cannot reach the API server")?;
    println!("kubernetes {}", info.git_version);
    Ok(())
}
