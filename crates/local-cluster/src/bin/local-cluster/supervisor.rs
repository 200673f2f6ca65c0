//! `local-cluster up --crossplane`: real Crossplane on the background control
//! plane. Its in-process parts (port forwarders, the local cloud's controller)
//! need a process that lives as long as the stack, so `up` starts
//! `local-cluster serve-crossplane` in the background as the supervisor: it
//! owns core, the function and the providers (they die with it) and stops
//! them on SIGTERM, which is what `down` sends it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use local_cluster::ControlPlane;
use local_cluster::process::{self, Lifetime, Process};
use local_cluster::real_crossplane::{Crossplane, CrossplaneOptions, CrossplaneState, resident_kb};

fn state_path(dir: &Path) -> PathBuf {
    dir.join("crossplane-state.json")
}

fn log_path(dir: &Path) -> PathBuf {
    dir.join("logs").join("crossplane-supervisor.log")
}

fn read_state(dir: &Path) -> Option<CrossplaneState> {
    let text = std::fs::read_to_string(state_path(dir)).ok()?;
    serde_json::from_str(&text).ok()
}

fn supervisor(state: &CrossplaneState) -> Result<Process> {
    let exe = std::env::current_exe().context("finding local-cluster's own binary")?;
    let exe = std::fs::canonicalize(&exe).unwrap_or(exe);
    Ok(Process::adopt(
        "crossplane-supervisor".into(),
        state.supervisor_pid,
        exe,
        state.logs.join("crossplane-supervisor.log"),
    ))
}

/// Starts the supervisor (unless one runs) and waits until the stack is up.
pub async fn up(dir: &Path, modelplane: bool) -> Result<()> {
    if let Some(state) = read_state(dir)
        && supervisor(&state)?.is_running()
    {
        eprintln!("local-cluster: Crossplane already running");
        describe(&state);
        return Ok(());
    }
    let _ = std::fs::remove_file(state_path(dir));
    let exe = std::env::current_exe().context("finding local-cluster's own binary")?;
    let log = log_path(dir);
    let mut args = vec![
        format!("--dir={}", dir.display()),
        "serve-crossplane".to_string(),
    ];
    if modelplane {
        args.push("--modelplane".to_string());
    }
    let started = Instant::now();
    let mut child = process::spawn(
        "crossplane-supervisor",
        &exe,
        &args,
        &log,
        Lifetime::Detached,
    )?;
    // Building Crossplane from nothing takes many minutes; a warm start seconds.
    let deadline = started + Duration::from_secs(3600);
    loop {
        if let Some(state) = read_state(dir) {
            eprintln!(
                "local-cluster: Crossplane up in {:.1}s",
                started.elapsed().as_secs_f64()
            );
            describe(&state);
            return Ok(());
        }
        if !child.is_running() {
            bail!(
                "the Crossplane supervisor exited; its log ({}):\n{}",
                log.display(),
                process::log_tail(&log, 40)
            );
        }
        if Instant::now() > deadline {
            child.stop(Duration::from_secs(10));
            bail!("Crossplane did not come up in time; see {}", log.display());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn describe(state: &CrossplaneState) {
    eprintln!(
        "  supervisor pid {} (forwarders, local cloud controller); logs in {}",
        state.supervisor_pid,
        state.logs.display()
    );
    for line in process_lines(state) {
        eprintln!("  {line}");
    }
    eprintln!(
        "  core and the function share a network namespace, each provider has its own; \
         loopback ports are forwarded by the supervisor"
    );
    eprintln!("  stop everything with: cargo run -p local-cluster -- down");
}

/// One line per recorded process: name, id, whether it runs, its memory now.
fn process_lines(state: &CrossplaneState) -> Vec<String> {
    state
        .processes
        .iter()
        .map(|p| {
            let mut process =
                Process::adopt(p.name.clone(), p.pid, p.binary.clone(), p.log.clone());
            let word = if process.is_running() {
                "running"
            } else {
                "stopped"
            };
            let rss = resident_kb(p.pid)
                .map(|kb| format!("{} MB", kb / 1024))
                .unwrap_or_default();
            format!("{:<30} pid {:<8} {word:<8} {rss}", p.name, p.pid)
        })
        .collect()
}

/// Stops the supervisor, which stops what it started.
pub fn down(dir: &Path) {
    let Some(state) = read_state(dir) else {
        return;
    };
    if let Ok(mut p) = supervisor(&state) {
        // Its grace covers stopping each process it owns.
        p.stop(Duration::from_secs(60));
    }
    let _ = std::fs::remove_file(state_path(dir));
}

pub fn status(dir: &Path) {
    let Some(state) = read_state(dir) else {
        return;
    };
    let running = supervisor(&state)
        .map(|mut p| p.is_running())
        .unwrap_or(false);
    let word = if running { "running" } else { "stopped" };
    println!(
        "{:<24} pid {:<8} {word}",
        "crossplane-supervisor", state.supervisor_pid
    );
    for line in process_lines(&state) {
        println!("  {line}");
    }
}

/// The supervisor: starts the stack, records it, waits for SIGTERM or
/// SIGINT, stops it.
pub async fn serve(dir: &Path, modelplane: bool) -> Result<()> {
    let text = std::fs::read_to_string(dir.join("state.json"))
        .with_context(|| format!("no control plane recorded in {}", dir.display()))?;
    let cp_state: local_cluster::State = serde_json::from_str(&text)?;
    let cp = ControlPlane::adopt(dir, cp_state);
    let mut crossplane = Crossplane::start(&cp, CrossplaneOptions::default()).await?;
    if modelplane {
        // The charts are served by this process, so the platform is installed
        // here, and its XRDs carry no deletion policy until someone sets one.
        let client = cp.admin().await?;
        local_cluster::real_crossplane::modelplane::install(
            &client,
            &crossplane,
            &dir.join("crossplane").join("charts"),
            &local_cluster::real_crossplane::modelplane::Platform::modelplane(
                serde_json::json!({}),
            ),
        )
        .await?;
        eprintln!("crossplane-supervisor: the seed's platform installed");
    }
    let state = CrossplaneState {
        supervisor_pid: std::process::id(),
        processes: crossplane.processes(),
        logs: dir.join("logs"),
    };
    eprintln!(
        "crossplane-supervisor: stack up in {:.1}s",
        crossplane.started_in().as_secs_f64()
    );
    std::fs::write(state_path(dir), serde_json::to_string_pretty(&state)?)?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    eprintln!("crossplane-supervisor: stopping");
    tokio::task::spawn_blocking(move || crossplane.stop()).await?;
    Ok(())
}
