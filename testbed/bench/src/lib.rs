//! cascade-guard's benchmarks (scripts/bench.sh, BENCHMARKS.md): test-only,
//! never published. Each is a binary of this crate (src/bin/); this is what
//! they share: their kinds' API group, percentiles, and starting the release
//! build of cascade-guard against their control plane.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use kube::api::{ApiResource, DynamicObject, PostParams};
use kube::{Api, Client};
use local_cluster::process::{self, Lifetime, Process};
use local_cluster::{ControlPlane, Options, crossplane};
use serde_json::{Value, json};

/// The user of the local control plane's admin kubeconfig.
const ADMIN_USER: &str = "admin";

/// The API group of the benchmarks' kinds.
pub const GROUP: &str = "bench.cascade-guard.dev";

/// A benchmark kind, served at v1.
pub fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: "v1".into(),
        api_version: format!("{GROUP}/v1"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Starts cascade-guard with the control plane's admin kubeconfig, trusting
/// that user (the admin) to remove its finalizer, as it will.
pub fn start_controller(cp: &ControlPlane) -> Result<Process> {
    let binary = controller_binary()?;
    if !binary.exists() {
        bail!(
            "{} is missing: build it first (cargo build --bins)",
            binary.display()
        );
    }
    let args = vec![
        "run".to_string(),
        format!("--kubeconfig={}", cp.kubeconfig_path().display()),
        "--no-leader-election".to_string(),
        "--http-address=127.0.0.1:0".to_string(),
        format!("--controller-user={ADMIN_USER}"),
    ];
    // BENCH_CONTROLLER_WRAPPER runs it under another command, such as a
    // heap profiler: `heaptrack -o /tmp/cascade-guard`.
    let wrapper: Vec<String> = std::env::var("BENCH_CONTROLLER_WRAPPER")
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect();
    let (program, args) = match wrapper.split_first() {
        Some((program, before)) => {
            let mut all = before.to_vec();
            all.push(binary.display().to_string());
            all.extend(args);
            (PathBuf::from(program), all)
        }
        None => (binary, args),
    };
    Ok(process::spawn(
        "cascade-guard",
        &program,
        &args,
        &cp.log_path("cascade-guard"),
        Lifetime::Owned,
    )?)
}

/// The cascade-guard binary to measure: BENCH_CONTROLLER_BIN (such as the
/// image's static musl build, `scripts/image.sh binary`), else the release
/// build beside the benchmark (both in target/release).
pub fn controller_binary() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("BENCH_CONTROLLER_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().context("locating the benchmark")?;
    exe.parent()
        .map(|p| p.join("cascade-guard"))
        .context("locating the cascade-guard binary")
}

/// Each round's (unprotected, protected) latencies in ms, sorted.
pub struct Rounds(pub Vec<(Vec<f64>, Vec<f64>)>);

impl Rounds {
    pub fn pooled(&self) -> (Vec<f64>, Vec<f64>) {
        let mut plain: Vec<f64> = self.0.iter().flat_map(|r| r.0.iter().copied()).collect();
        let mut protected: Vec<f64> = self.0.iter().flat_map(|r| r.1.iter().copied()).collect();
        plain.sort_by(f64::total_cmp);
        protected.sort_by(f64::total_cmp);
        (plain, protected)
    }

    /// The median over rounds of protected minus unprotected at quantile `q`.
    pub fn median_difference(&self, q: f64) -> f64 {
        let mut d: Vec<f64> = self
            .0
            .iter()
            .map(|(plain, protected)| percentile(protected, q) - percentile(plain, q))
            .collect();
        d.sort_by(f64::total_cmp);
        percentile(&d, 50.0)
    }
}

/// Prints one phase: each kind's p50 and p99, their ratio and difference.
pub fn report(phase: &str, rounds: &Rounds) {
    let (plain, protected) = &rounds.pooled();
    let p = |v: &[f64], q| percentile(v, q);
    println!("   {phase} ({} requests of each kind):", plain.len());
    println!(
        "     unprotected kind  p50 {:.3} ms  p99 {:.3} ms",
        p(plain, 50.0),
        p(plain, 99.0)
    );
    println!(
        "     protected kind    p50 {:.3} ms  p99 {:.3} ms",
        p(protected, 50.0),
        p(protected, 99.0)
    );
    println!(
        "     ratio protected/unprotected  p50 {:.3}  p99 {:.3}",
        p(protected, 50.0) / p(plain, 50.0),
        p(protected, 99.0) / p(plain, 99.0)
    );
    println!(
        "     median over rounds of protected minus unprotected: p50 {:+.3} ms  p99 {:+.3} ms",
        rounds.median_difference(50.0),
        rounds.median_difference(99.0)
    );
}

/// A control plane serving the kinds of `xrds`, with an XRD object for each
/// that carries a deletion policy (the others stay unprotected), and the
/// namespaces.
pub async fn start_plane(xrds: &[Value], namespaces: &[&str]) -> Result<(ControlPlane, Client)> {
    let mut crds =
        vec![crossplane::crossplane_crd(crossplane::XRD_CRD).map_err(anyhow::Error::msg)?];
    for x in xrds {
        crds.push(crossplane::xrd_to_crd(x).map_err(anyhow::Error::msg)?);
    }
    crds.extend(cascade_guard::api::crds());
    let cp = ControlPlane::start(Options {
        crds,
        ..Options::default()
    })
    .await?;
    let admin = cp.admin().await?;
    let xrd_api: Api<DynamicObject> = Api::all_with(admin.clone(), &crossplane::xrd_resource());
    for x in xrds
        .iter()
        .filter(|x| x["metadata"]["annotations"].is_object())
    {
        xrd_api
            .create(&PostParams::default(), &serde_json::from_value(x.clone())?)
            .await?;
    }
    for ns in namespaces {
        Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
            )
            .await?;
    }
    Ok((cp, admin))
}
