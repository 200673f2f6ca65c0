//! The controller as a process, what `cascade-guard run` starts: its logs,
//! the static manifests writer, the metrics and probes listener, leader
//! election, and the signals that stop it.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kube::Client;

use super::leader::{self, LeaseSettings};
use super::telemetry::{self, Health, Metrics};
use super::{Settings, static_writer};
use crate::cluster::running::ControllerSettings;
use crate::policy::static_manifest::StaticError;

/// How the process runs, beside what the loop does ([`Settings`]).
pub struct Process {
    pub settings: Settings,
    /// Where to serve /metrics, /healthz and /readyz.
    pub http_address: SocketAddr,
    pub static_manifests_dir: Option<PathBuf>,
    /// Only write the static manifests directory.
    pub static_only: bool,
    pub leader: LeaderElection,
}

pub struct LeaderElection {
    /// false: a single replica, which still keeps its Lease renewed so that
    /// `status` and `uninstall` see it.
    pub enabled: bool,
    /// The Lease's name.
    pub id: String,
    pub lease_duration: Duration,
    pub renew_interval: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// A leader whose Lease another replica took stops writing and exits;
    /// its Deployment starts it again as a candidate.
    #[error("lost leadership: another replica leads now; exiting to restart as a candidate")]
    LostLeadership,
    #[error("leader election")]
    LeaderElection(#[source] crate::Error),
    #[error("cannot listen for SIGTERM")]
    Signal(#[source] std::io::Error),
    #[error("cannot read the API server's version, which --static-manifests-dir needs")]
    ServerVersion(#[source] kube::Error),
    #[error("--static-manifests-dir {dir}")]
    Release {
        dir: String,
        #[source]
        source: StaticError,
    },
    #[error(
        "--static-manifests-dir: the API server ({version}) reports the feature gate {gate} off; start it with --feature-gates={gate}=true"
    )]
    GateOff { version: String, gate: &'static str },
    #[error(transparent)]
    Cluster(#[from] crate::Error),
}

/// The namespace of the Lease and of what the controller writes: the flag,
/// else the pod's (POD_NAMESPACE), else default.
pub fn home_namespace(flag: Option<String>) -> String {
    flag.or_else(|| std::env::var("POD_NAMESPACE").ok())
        .unwrap_or_else(|| "default".into())
}

/// Logs to stderr, as JSON lines when asked; RUST_LOG filters, else info.
pub fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only on a terminal: escape codes in a log file or a log
    // collector are noise.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Runs the controller until SIGTERM or Ctrl-C (then Ok), or until it loses
/// leadership ([`ProcessError::LostLeadership`]).
pub async fn run(client: Client, process: Process) -> Result<(), ProcessError> {
    report_server_version(&client).await;
    let Process {
        settings,
        http_address,
        static_manifests_dir,
        static_only,
        leader: election,
    } = process;
    let namespace = settings.home_namespace.clone();
    let metrics = Arc::new(Metrics::new());
    let writer = match &static_manifests_dir {
        Some(dir) => Some(static_writer::run(
            client.clone(),
            settings.clone(),
            static_target(&client, dir, &namespace).await?,
            metrics.clone(),
        )),
        None => None,
    };
    let health = Health::new();
    let (bound, server) = telemetry::bind(http_address, metrics.clone(), health.clone()).await?;
    tokio::spawn(server);
    tracing::info!(address = %bound, "serving /metrics, /healthz and /readyz");

    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(ProcessError::Signal)?;
    let stop = async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    if let Some(writer) = writer {
        if static_only {
            health.set_ready(true);
            tokio::select! {
                () = writer => {}
                () = stop => tracing::info!("stopping"),
            }
            return Ok(());
        }
        tokio::spawn(writer);
    }
    let published = ControllerSettings::new(
        settings.xrd_default_mode,
        &settings.compile,
        settings.sibling_order,
    );
    let identity = std::env::var("POD_NAME").unwrap_or_else(|_| {
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let lease = LeaseSettings {
        lease_duration: election.lease_duration,
        renew_interval: election.renew_interval,
        annotations: published.annotations(election.enabled),
        ..LeaseSettings::new(namespace, election.id, identity)
    };
    if !election.enabled {
        let announcing = tokio::spawn(leader::announce(client.clone(), lease.clone()));
        metrics.set_leader(true);
        tokio::select! {
            () = super::run(client.clone(), settings, metrics, health) => {}
            () = stop => tracing::info!("stopping"),
        }
        // A clean stop says so at once: status and uninstall see it stopped.
        announcing.abort();
        leader::withdraw(client, &lease).await;
        return Ok(());
    }

    // A replica waiting for the lease is healthy and ready to take over.
    health.set_ready(true);
    tokio::pin!(stop);
    let leadership = tokio::select! {
        acquired = leader::acquire(client.clone(), lease) => acquired.map_err(ProcessError::LeaderElection)?,
        () = &mut stop => return Ok(()),
    };
    metrics.set_leader(true);
    // Not ready again until the first pass has run as leader.
    health.set_ready(false);
    tokio::select! {
        () = super::run(client, settings, metrics.clone(), health) => Ok(()),
        () = leadership.lost() => {
            metrics.set_leader(false);
            // Another replica leads now: stop writing at once; the Deployment
            // restarts this one as a candidate.
            Err(ProcessError::LostLeadership)
        }
        () = &mut stop => {
            tracing::info!("stopping; handing leadership over");
            leadership.release().await;
            Ok(())
        }
    }
}

/// The checks `run --static-manifests-dir` makes before it starts: a
/// release with the feature, the gate on where the API server says, and a
/// directory to write to.
async fn static_target(
    client: &Client,
    dir: &Path,
    namespace: &str,
) -> Result<static_writer::Target, ProcessError> {
    use crate::cluster::static_protection::{StaticDirectory, read_server_report};
    use crate::policy::static_manifest::{FEATURE_GATE, release_supports};
    let info = client
        .apiserver_version()
        .await
        .map_err(ProcessError::ServerVersion)?;
    release_supports(&info.major, &info.minor).map_err(|source| ProcessError::Release {
        dir: dir.display().to_string(),
        source,
    })?;
    match read_server_report(client).await {
        Ok(report) if report.gate_enabled == Some(false) => {
            return Err(ProcessError::GateOff {
                version: info.git_version,
                gate: FEATURE_GATE,
            });
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(error = %e, "cannot check the API server's feature gate; writing static manifests anyway")
        }
    }
    let directory = StaticDirectory::open(dir)?;
    let writer = std::env::var("NODE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| format!("pid-{}", std::process::id()))
        });
    Ok(static_writer::Target {
        directory,
        writer,
        namespace: namespace.to_string(),
    })
}

/// Logs the API server's release against the proven ones; an unreadable
/// version is only logged, never fatal.
async fn report_server_version(client: &Client) {
    use crate::cluster::server_version::{Support, support};
    match client.apiserver_version().await {
        Ok(info) => match support(&info) {
            Support::Proven => {
                tracing::info!(version = %info.git_version, "API server: {}", Support::Proven)
            }
            other => tracing::warn!(version = %info.git_version, "API server: {other}"),
        },
        Err(e) => tracing::warn!(error = %e, "cannot read the API server's version"),
    }
}
