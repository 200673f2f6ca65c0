//! `BENCH_ONLY=scale-100k`: Convert with 100,000 protected objects across 50
//! Convert kinds (BENCH_SCALE_KINDS, BENCH_SCALE_PER_KIND), each figure beside
//! the API server's own floor for the same work, measured in the same run:
//!
//! 1. the first take-over (every object gets cascade-guard's finalizer);
//!    with BENCH_SCALE_HOLDING (1,000) trees beside them, each a root and two
//!    ConfigMaps one of which needs the other, which sibling order holds;
//! 2. a restart with every object already held, to the controller's log
//!    saying every kind is listed, against the API server listing the same
//!    objects the same way (metadata, pages of 100, every kind at once);
//! 3. RSS and CPU at rest after that restart;
//! 4. a single plain delete amid them, one at a time: to `foregroundDeletion`;
//! 5. 100 plain deletes at once, against the benchmark itself sending the same
//!    200 DELETEs (each Background delete, then its Foreground one) with the
//!    controller stopped.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use cascade_guard_bench::{percentile, resource, start_controller, start_plane};
use cascade_guard_testkit::tree::{config_maps, create_tree};
use futures::StreamExt;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use super::{
    AT_ONCE, FirstSeen, HeldCounter, cpu_ticks, create_many, print_latencies, rest_usage,
    status_kib, xrd,
};

/// The page size of cascade-guard's lists of a Convert kind (convert/runner.rs).
const PAGE: u32 = 100;
/// What cascade-guard logs when a kind's list is complete.
const LISTED: &str = "listed every object of the kind";
const SINGLE: usize = 100;

pub async fn run() -> Result<()> {
    let kinds = env_number("BENCH_SCALE_KINDS", 50)?;
    let per_kind = env_number("BENCH_SCALE_PER_KIND", 2000)?;
    let xrds: Vec<_> = (0..kinds)
        .map(|i| xrd(&format!("Scale{i}"), &format!("scale{i}s"), Some("Convert")))
        .collect();
    let holding = env_number("BENCH_SCALE_HOLDING", 1000)?;
    let (cp, admin) =
        start_plane(&xrds, &["scale", "single", "at-once", "floor", "holding"]).await?;
    let scale_kinds: Vec<ApiResource> = (0..kinds)
        .map(|i| resource(&format!("Scale{i}"), &format!("scale{i}s")))
        .collect();
    let Some(tree) = scale_kinds.first().cloned() else {
        bail!("BENCH_SCALE_KINDS must be at least 1");
    };

    let created = Instant::now();
    create_many(&admin, &scale_kinds, "scale", per_kind).await?;
    // The trees deleted in 4 and 5, among the others, with a composed
    // resource each (an object with nothing to cascade is not converted).
    for ns in ["single", "at-once", "floor"] {
        for i in 0..SINGLE.max(AT_ONCE) {
            create_tree(&admin, &tree, ns, &format!("t-{i}"), 1).await;
        }
    }
    // Sibling order's work: trees across the kinds, each holding a need.
    futures::stream::iter((0..holding).map(|i| {
        let admin = admin.clone();
        let kind = scale_kinds[i % scale_kinds.len()].clone();
        async move { make_needy_tree(&admin, &kind, "holding", &format!("h-{i}")).await }
    }))
    .buffer_unordered(16)
    .collect::<Vec<_>>()
    .await
    .into_iter()
    .collect::<Result<Vec<()>>>()?;
    let trees = 3 * SINGLE.max(AT_ONCE);
    let total = kinds * per_kind + trees + holding;
    println!(
        "{} objects across {kinds} Convert kinds, {trees} trees of one of them and {holding} trees holding a need across them, created in {:.0} s",
        kinds * per_kind,
        created.elapsed().as_secs_f64()
    );

    println!("\n1. First take-over: every object gets the finalizer");
    let held = HeldCounter::start(&admin, &scale_kinds, None).await;
    let started = Instant::now();
    let mut controller = start_controller(&cp)?;
    while held.count() < total {
        if started.elapsed() > Duration::from_secs(3600) {
            bail!(
                "cascade-guard held only {} of {total} after an hour",
                held.count()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = started.elapsed().as_secs_f64();
    let cpu = cpu_ticks(controller.pid)? as f64 / super::TICKS_PER_SECOND;
    println!(
        "   {total} held in {took:.1} s ({:.0} objects/s), cascade-guard's CPU {cpu:.1} s",
        total as f64 / took
    );
    drop(held);
    tokio::time::sleep(Duration::from_secs(10)).await;
    print_rest(controller.pid, Duration::from_secs(5))?;
    controller.stop(Duration::from_secs(10));

    println!("\n2. Restart with every object held, to every kind listed");
    let mut floors = Vec::new();
    for _ in 0..3 {
        let (took, seen) = list_every_kind(&admin, &scale_kinds).await?;
        if seen < total {
            bail!("the floor's list saw {seen} of {total} objects");
        }
        floors.push(took);
    }
    floors.sort_by(f64::total_cmp);
    let floor = percentile(&floors, 50.0);
    let log = cp.log_path("cascade-guard");
    let offset = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let started = Instant::now();
    let started_at = k8s_openapi::jiff::Timestamp::now();
    controller.start_again()?;
    while listed_since(&log, offset) < kinds {
        if started.elapsed() > Duration::from_secs(600) {
            bail!(
                "cascade-guard listed {} of {kinds} kinds in 10 minutes",
                listed_since(&log, offset)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let startup = started.elapsed().as_secs_f64();
    println!(
        "   floor, the API server listing them alone (metadata, pages of {PAGE}, every kind at once): {}",
        floors
            .iter()
            .map(|f| format!("{f:.2} s"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "   cascade-guard, from its start to its log saying every kind is listed: {startup:.2} s, {:.2} x the median floor",
        startup / floor
    );
    let startup_cpu = cpu_ticks(controller.pid)? as f64 / super::TICKS_PER_SECOND;
    println!("   cascade-guard's CPU in it: {startup_cpu:.1} s");
    println!(
        "   its log, seconds from the start: {}",
        start_timeline(&log, offset, started_at)
    );

    println!("\n3. At rest after the restart");
    tokio::time::sleep(Duration::from_secs(10)).await;
    print_rest(controller.pid, Duration::from_secs(30))?;

    // Sibling order reads every tree once after a start (one GET a root
    // here); only then is the controller at rest.
    println!("\n3b. Sibling order's first read of every tree, then at rest");
    while !logged_since(&log, offset, READ_EVERY_TREE) {
        if started.elapsed() > Duration::from_secs(1800) {
            bail!("sibling order did not read every tree in 30 minutes");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let first_pass = started.elapsed().as_secs_f64();
    let pass_cpu = cpu_ticks(controller.pid)? as f64 / super::TICKS_PER_SECOND;
    println!(
        "   every tree read {first_pass:.1} s after the start, cascade-guard's CPU by then {pass_cpu:.1} s"
    );
    let held = cascade_guard::cluster::holds::read(&admin, HOME).await?;
    println!("   sibling order holds {} objects", held.len());
    tokio::time::sleep(Duration::from_secs(10)).await;
    print_rest(controller.pid, Duration::from_secs(30))?;

    println!("\n4. A single plain delete amid them, {SINGLE} one at a time: to foregroundDeletion");
    let single = one_at_a_time(&admin, &tree, "single").await?;
    print_latencies(&single);

    println!("\n5. {AT_ONCE} plain deletes at once: to foregroundDeletion");
    // Each burst is sent by a client of its own: with one client the floor,
    // sent second, found the Convert burst's hundred connections still open
    // and paid for no TLS handshake, while the Convert burst paid for a
    // hundred (runs F to M measured against that warmer floor).
    let convert = at_once(&admin, &cp.admin().await?, &tree, "at-once", false).await?;
    print_latencies(&convert);
    controller.stop(Duration::from_secs(10));
    let floor = at_once(&admin, &cp.admin().await?, &tree, "floor", true).await?;
    println!(
        "   floor, the same {} DELETEs sent by the benchmark (controller stopped):",
        2 * AT_ONCE
    );
    print_latencies(&floor);
    println!(
        "   Convert minus floor: p50 {:+.0} ms, p99 {:+.0} ms, max {:+.0} ms",
        percentile(&convert, 50.0) - percentile(&floor, 50.0),
        percentile(&convert, 99.0) - percentile(&floor, 99.0),
        convert.last().copied().unwrap_or_default() - floor.last().copied().unwrap_or_default()
    );
    Ok(())
}

fn env_number(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|e| anyhow::anyhow!("{name}={v:?} is not a number: {e}")),
        Err(_) => Ok(default),
    }
}

/// cascade-guard's RSS, peak RSS and CPU over `window`.
fn print_rest(pid: u32, window: Duration) -> Result<()> {
    let (rss, cpu) = rest_usage(pid, window)?;
    println!(
        "   RSS {:.1} MiB (peak {:.1} MiB), CPU {cpu:.2}% of one core over {} s",
        rss as f64 / 1024.0,
        status_kib(pid, "VmHWM:")? as f64 / 1024.0,
        window.as_secs()
    );
    Ok(())
}

/// Lists the metadata of every object of every kind, as cascade-guard's
/// watches do at start-up: the seconds it took and how many it saw.
async fn list_every_kind(client: &Client, kinds: &[ApiResource]) -> Result<(f64, usize)> {
    let started = Instant::now();
    let counts = futures::future::join_all(kinds.iter().map(|r| async move {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), r);
        let mut params = ListParams::default().limit(PAGE);
        let mut seen = 0;
        loop {
            let page = api.list_metadata(&params).await?;
            seen += page.items.len();
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok::<usize, kube::Error>(seen),
            }
        }
    }))
    .await;
    let took = started.elapsed().as_secs_f64();
    let mut seen = 0;
    for c in counts {
        seen += c?;
    }
    Ok((took, seen))
}

/// cascade-guard's namespace as the benchmark runs it (no POD_NAMESPACE).
const HOME: &str = "default";

/// A root of `kind` composing ConfigMaps `<name>-0` and `<name>-1`, the
/// first needing the second (`cascade-guard.dev/needs`).
async fn make_needy_tree(client: &Client, kind: &ApiResource, ns: &str, name: &str) -> Result<()> {
    create_tree(client, kind, ns, name, 2).await;
    let maps: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &config_maps());
    maps.patch(
        &format!("{name}-0"),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {
            "cascade-guard.dev/needs": format!("ConfigMap/{name}-1")
        }}})),
    )
    .await?;
    Ok(())
}

/// What sibling order logs once it has read every tree after its start.
const READ_EVERY_TREE: &str = "sibling order: every tree read once";

/// Whether cascade-guard logged `what` after `offset` in its log.
fn logged_since(log: &Path, offset: u64, what: &str) -> bool {
    let text = std::fs::read(log).unwrap_or_default();
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(text.len());
    String::from_utf8_lossy(&text[start..]).contains(what)
}

/// Where a start's time went, from cascade-guard's log after `offset`: its
/// first line, leadership, the first and the last kind listed, each in
/// seconds after `started_at` (the log's timestamps are UTC, RFC 3339).
fn start_timeline(log: &Path, offset: u64, started_at: k8s_openapi::jiff::Timestamp) -> String {
    let text = std::fs::read(log).unwrap_or_default();
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(text.len());
    let text = String::from_utf8_lossy(&text[start..]);
    let at = |line: &str| -> Option<f64> {
        let stamp: k8s_openapi::jiff::Timestamp = line.split_whitespace().next()?.parse().ok()?;
        Some(stamp.duration_since(started_at).as_secs_f64())
    };
    let first = |what: &str| text.lines().find(|l| l.contains(what)).and_then(at);
    let last = |what: &str| text.lines().rev().find(|l| l.contains(what)).and_then(at);
    let show = |t: Option<f64>| t.map_or("?".to_string(), |t| format!("{t:.2}"));
    format!(
        "first line {}, leadership {}, first kind listed {}, last {}",
        show(text.lines().next().and_then(at)),
        show(first("acquired leadership")),
        show(first(LISTED)),
        show(last(LISTED)),
    )
}

/// How many kinds cascade-guard has logged as listed after `offset` in its log.
fn listed_since(log: &Path, offset: u64) -> usize {
    let text = std::fs::read(log).unwrap_or_default();
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(text.len());
    String::from_utf8_lossy(&text[start..])
        .lines()
        .filter(|l| l.contains(LISTED))
        .count()
}

/// Plain deletes of the trees in `ns`, one after another, each sent once the
/// one before it reached foregroundDeletion.
async fn one_at_a_time(admin: &Client, tree: &ApiResource, ns: &str) -> Result<Vec<f64>> {
    let api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), ns, tree);
    let first = FirstSeen::start(admin, tree, ns, "foregroundDeletion").await;
    let mut sent = Vec::new();
    for i in 0..SINGLE {
        let name = format!("t-{i}");
        let at = Instant::now();
        api.delete(&name, &DeleteParams::background()).await?;
        sent.push((name, at));
        while first.count() < sent.len() {
            if at.elapsed() > Duration::from_secs(60) {
                bail!("t-{i} did not reach foregroundDeletion in a minute");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    first.latencies(&sent, Duration::from_secs(60)).await
}

/// Plain deletes of every tree in `ns` at once; with `by_hand`, each followed
/// by the Foreground delete cascade-guard would send, sent here instead.
/// `sender` sends the deletes, `admin` watches for `foregroundDeletion`.
async fn at_once(
    admin: &Client,
    sender: &Client,
    tree: &ApiResource,
    ns: &str,
    by_hand: bool,
) -> Result<Vec<f64>> {
    let api: Api<DynamicObject> = Api::namespaced_with(sender.clone(), ns, tree);
    let first = FirstSeen::start(admin, tree, ns, "foregroundDeletion").await;
    let sent: Vec<(String, Instant)> = futures::stream::iter(0..AT_ONCE)
        .map(|i| {
            let api = api.clone();
            async move {
                let name = format!("t-{i}");
                let at = Instant::now();
                let _ = api.delete(&name, &DeleteParams::background()).await;
                if by_hand {
                    let _ = api.delete(&name, &DeleteParams::foreground()).await;
                }
                (name, at)
            }
        })
        .buffer_unordered(AT_ONCE)
        .collect()
        .await;
    first.latencies(&sent, Duration::from_secs(120)).await
}
