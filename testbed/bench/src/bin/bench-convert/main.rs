//! Benchmark of Convert mode on the real control plane. Prints:
//!
//! 0. From creating an object of a Convert kind to cascade-guard's finalizer
//!    being on it (created one at a time, as a person or a composition
//!    would): p50 and p99.
//! 1. From a Background DELETE to `foregroundDeletion` being set on the
//!    object, with 100 deletes sent at once: p50 and p99.
//! 2. Total teardown time of the same tree (an XR whose composed resources
//!    take a provider's while to finish) deleted with Background under Convert
//!    versus a native `--cascade=foreground` delete of an unprotected kind,
//!    side by side, in pairs started together: medians and their ratio.
//! 3. cascade-guard's start-up time to take over 10,000 existing objects
//!    across 20 Convert kinds, then its memory (RSS) and CPU at rest.
//!
//! Run: scripts/bench.sh convert (BENCH_ONLY=scale runs only the third).
//!
//! `BENCH_ONLY=scale-100k` runs instead the same at 100,000 objects across 50
//! kinds, with each figure's floor (convert_scale.rs).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, PartialObjectMeta, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

const KINDS: usize = 20;
const PER_KIND: usize = 500;
const AT_ONCE: usize = 100;
const FRESH: usize = 100;
const PAIRS: usize = 20;
const PROVIDER_DELAY: Duration = Duration::from_millis(1000);
const FINALIZER: &str = "cascade-guard.dev/foreground-cascade";

fn xrd(kind: &str, plural: &str, mode: Option<&str>) -> Value {
    let mut x = json!({
        "apiVersion": "apiextensions.crossplane.io/v2",
        "kind": "CompositeResourceDefinition",
        "metadata": {"name": format!("{plural}.{GROUP}")},
        "spec": {"group": GROUP, "names": {"kind": kind, "plural": plural}, "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "referenceable": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object"}}}}}]}
    });
    if let Some(m) = mode {
        x["metadata"]["annotations"] = json!({"cascade-guard.dev/deletion-policy": m});
    }
    x
}

mod convert_scale;
use cascade_guard_bench::{GROUP, percentile, resource, start_controller};
use cascade_guard_testkit::HOLD;
use cascade_guard_testkit::tree::{Provider, config_maps, create_tree};

#[tokio::main]
async fn main() -> Result<()> {
    if std::env::var("BENCH_ONLY").as_deref() == Ok("scale-100k") {
        return convert_scale::run().await;
    }
    let mut xrds = vec![
        xrd("Tree", "trees", Some("Convert")),
        // No XRD object is created for this one: nothing protects it.
        xrd("Native", "natives", None),
    ];
    for i in 0..KINDS {
        xrds.push(xrd(
            &format!("Scale{i}"),
            &format!("scale{i}s"),
            Some("Convert"),
        ));
    }
    let (cp, admin) =
        cascade_guard_bench::start_plane(&xrds, &["fresh", "latency", "teardown", "scale"]).await?;

    // 3 first: the objects exist before cascade-guard starts.
    println!(
        "creating {} objects across {KINDS} Convert kinds...",
        KINDS * PER_KIND
    );
    let scale_kinds: Vec<ApiResource> = (0..KINDS)
        .map(|i| resource(&format!("Scale{i}"), &format!("scale{i}s")))
        .collect();
    create_many(&admin, &scale_kinds, "scale", PER_KIND).await?;
    let held = HeldCounter::start(&admin, &scale_kinds, Some("scale")).await;

    let started = Instant::now();
    let mut controller = start_controller(&cp)?;
    let took_over = loop {
        if held.count() >= KINDS * PER_KIND {
            break started.elapsed();
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!(
                "cascade-guard held only {} objects after 10 minutes",
                held.count()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The take-over's CPU, for comparing builds (glibc and musl allocators).
    let startup_cpu = cpu_ticks(controller.pid)? as f64 / TICKS_PER_SECOND;

    if std::env::var("BENCH_ONLY").as_deref() != Ok("scale") {
        println!(
            "\n0. New object to held (finalizer added), {FRESH} objects created one at a time"
        );
        let tree = resource("Tree", "trees");
        let held = create_to_held(&admin, &tree).await?;
        print_latencies(&held);

        println!("\n1. Background DELETE to foregroundDeletion set, {AT_ONCE} deletes at once");
        let latency = delete_to_foreground(&admin, &tree).await?;
        print_latencies(&latency);

        println!(
            "\n2. Teardown of an XR with 3 composed resources (provider delay {} ms each), {PAIRS} pairs side by side",
            PROVIDER_DELAY.as_millis()
        );
        let (convert, native, mut per_pair) =
            teardown_pairs(&admin, &tree, &resource("Native", "natives")).await?;
        per_pair.sort_by(f64::total_cmp);
        let (c, n) = (percentile(&convert, 50.0), percentile(&native, 50.0));
        println!(
            "   Convert, Background delete:            median {c:.0} ms, max {:.0} ms",
            convert.last().copied().unwrap_or_default()
        );
        println!(
            "   native, --cascade=foreground delete:   median {n:.0} ms, max {:.0} ms",
            native.last().copied().unwrap_or_default()
        );
        println!("   ratio Convert/native (medians): {:.3}", c / n);
        println!(
            "   Convert minus native within each pair: median {:+.0} ms, min {:+.0} ms, max {:+.0} ms",
            percentile(&per_pair, 50.0),
            per_pair.first().copied().unwrap_or_default(),
            per_pair.last().copied().unwrap_or_default()
        );
    }

    println!(
        "\n3. Scale: {} objects across {KINDS} Convert kinds",
        KINDS * PER_KIND
    );
    println!(
        "   start-up to hold every existing object: {:.1} s, cascade-guard's CPU {startup_cpu:.1} s",
        took_over.as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (rss, cpu) = rest_usage(controller.pid, Duration::from_secs(30))?;
    let peak = status_kib(controller.pid, "VmHWM:")?;
    println!(
        "   at rest: RSS {:.1} MiB (peak {:.1} MiB), CPU {:.2}% of one core over 30 s",
        rss as f64 / 1024.0,
        peak as f64 / 1024.0,
        cpu
    );
    controller.stop(Duration::from_secs(10));
    Ok(())
}

async fn create_many(
    client: &Client,
    kinds: &[ApiResource],
    ns: &str,
    per_kind: usize,
) -> Result<()> {
    let mut jobs = Vec::new();
    for r in kinds {
        for i in 0..per_kind {
            jobs.push((r.clone(), format!("o-{i}")));
        }
    }
    let results: Vec<Result<()>> = futures::stream::iter(jobs)
        .map(|(r, name)| {
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &r);
            async move {
                let o = DynamicObject::new(&name, &r).data(json!({"spec": {}}));
                api.create(&PostParams::default(), &o).await?;
                Ok(())
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Counts objects carrying cascade-guard's finalizer, from watches (stopped
/// when it is dropped).
struct HeldCounter {
    held: Arc<Mutex<HashMap<String, bool>>>,
    watches: Vec<tokio::task::JoinHandle<()>>,
}

impl HeldCounter {
    /// Watches `kinds` in `ns`, or in every namespace.
    async fn start(client: &Client, kinds: &[ApiResource], ns: Option<&str>) -> Self {
        let held = Arc::new(Mutex::new(HashMap::new()));
        let mut watches = Vec::new();
        for r in kinds {
            let api: Api<PartialObjectMeta<DynamicObject>> = match ns {
                Some(ns) => Api::namespaced_with(client.clone(), ns, r),
                None => Api::all_with(client.clone(), r),
            };
            let held = held.clone();
            let kind = r.kind.clone();
            watches.push(tokio::spawn(async move {
                let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
                while let Some(Ok(event)) = stream.next().await {
                    if let Event::Apply(o) | Event::InitApply(o) = event {
                        let is_held = o.finalizers().iter().any(|f| f == FINALIZER);
                        let key = format!(
                            "{kind}/{}/{}",
                            o.namespace().unwrap_or_default(),
                            o.name_any()
                        );
                        if let Ok(mut h) = held.lock() {
                            h.insert(key, is_held);
                        }
                    }
                }
            }));
        }
        Self { held, watches }
    }

    fn count(&self) -> usize {
        self.held
            .lock()
            .map(|h| h.values().filter(|v| **v).count())
            .unwrap_or(0)
    }
}

impl Drop for HeldCounter {
    fn drop(&mut self) {
        for w in &self.watches {
            w.abort();
        }
    }
}

fn print_latencies(sorted_ms: &[f64]) {
    println!(
        "   p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        percentile(sorted_ms, 50.0),
        percentile(sorted_ms, 99.0),
        sorted_ms.last().copied().unwrap_or_default()
    );
}

/// When each object of a kind in a namespace first shows a finalizer, from a
/// watch.
struct FirstSeen {
    seen: Arc<Mutex<HashMap<String, Instant>>>,
    watch: tokio::task::JoinHandle<()>,
}

impl FirstSeen {
    async fn start(client: &Client, r: &ApiResource, ns: &str, finalizer: &'static str) -> Self {
        let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        let api: Api<PartialObjectMeta<DynamicObject>> =
            Api::namespaced_with(client.clone(), ns, r);
        let recorder = seen.clone();
        let watch = tokio::spawn(async move {
            let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
            while let Some(Ok(event)) = stream.next().await {
                if let Event::Apply(o) = event
                    && o.finalizers().iter().any(|f| f == finalizer)
                    && let Ok(mut s) = recorder.lock()
                {
                    s.entry(o.name_any()).or_insert_with(Instant::now);
                }
            }
        });
        // The watch is established before anything is measured.
        tokio::time::sleep(Duration::from_millis(500)).await;
        Self { seen, watch }
    }

    fn count(&self) -> usize {
        self.seen.lock().map(|s| s.len()).unwrap_or(0)
    }

    /// Waits until `n` objects were seen, then the milliseconds from each
    /// `sent` instant to its object being seen, sorted.
    async fn latencies(self, sent: &[(String, Instant)], within: Duration) -> Result<Vec<f64>> {
        let deadline = Instant::now() + within;
        while self.count() < sent.len() {
            if Instant::now() > deadline {
                bail!("only {} of {} seen in time", self.count(), sent.len());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.watch.abort();
        let seen = self.seen.lock().map(|s| s.clone()).unwrap_or_default();
        let mut ms: Vec<f64> = sent
            .iter()
            .filter_map(|(name, at)| {
                seen.get(name)
                    .map(|t| t.duration_since(*at).as_secs_f64() * 1000.0)
            })
            .collect();
        ms.sort_by(f64::total_cmp);
        Ok(ms)
    }
}

/// Creates FRESH objects one after another (20 ms apart) and times each from
/// its create request to a watch showing cascade-guard's finalizer on it.
async fn create_to_held(admin: &Client, tree: &ApiResource) -> Result<Vec<f64>> {
    let ns = "fresh";
    let first = FirstSeen::start(admin, tree, ns, FINALIZER).await;
    let mut sent = Vec::new();
    for i in 0..FRESH {
        let name = format!("f-{i}");
        let at = Instant::now();
        create_tree(admin, tree, ns, &name, 0).await;
        sent.push((name, at));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.latencies(&sent, Duration::from_secs(60)).await
}

async fn delete_to_foreground(admin: &Client, tree: &ApiResource) -> Result<Vec<f64>> {
    let ns = "latency";
    let api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), ns, tree);
    for i in 0..AT_ONCE {
        create_tree(admin, tree, ns, &format!("t-{i}"), 1).await;
    }
    wait_all_held(&api, AT_ONCE).await?;
    // When foregroundDeletion first appears on each.
    let first = FirstSeen::start(admin, tree, ns, "foregroundDeletion").await;
    let sent: Vec<(String, Instant)> = futures::future::join_all((0..AT_ONCE).map(|i| {
        let api = api.clone();
        async move {
            let name = format!("t-{i}");
            let at = Instant::now();
            let _ = api
                .delete(&name, &kube::api::DeleteParams::background())
                .await;
            (name, at)
        }
    }))
    .await;
    let ms = first.latencies(&sent, Duration::from_secs(120)).await?;
    // Let the provider finish these trees before the next measurement.
    release_all(admin, ns).await?;
    Ok(ms)
}

async fn teardown_pairs(
    admin: &Client,
    tree: &ApiResource,
    native: &ApiResource,
) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let ns = "teardown";
    let trees: Api<DynamicObject> = Api::namespaced_with(admin.clone(), ns, tree);
    for i in 0..PAIRS {
        create_tree(admin, tree, ns, &format!("c-{i}"), 3).await;
        create_tree(admin, native, ns, &format!("n-{i}"), 3).await;
    }
    wait_all_held(&trees, PAIRS).await?;
    // It looks every 20 ms, not the kit's 50: its wait is part of the
    // teardown measured.
    let provider = Provider::start_polling(
        admin.clone(),
        ns.to_string(),
        PROVIDER_DELAY,
        Duration::from_millis(20),
    );
    let mut convert = Vec::new();
    let mut nat = Vec::new();
    let mut per_pair = Vec::new();
    for i in 0..PAIRS {
        let c_api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), ns, tree);
        let n_api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), ns, native);
        let (c_name, n_name) = (format!("c-{i}"), format!("n-{i}"));
        let (c, n) = tokio::join!(
            teardown(&c_api, &c_name, kube::api::DeleteParams::background()),
            teardown(&n_api, &n_name, kube::api::DeleteParams::foreground()),
        );
        let (c, n) = (c?, n?);
        convert.push(c);
        nat.push(n);
        per_pair.push(c - n);
    }
    drop(provider);
    convert.sort_by(f64::total_cmp);
    nat.sort_by(f64::total_cmp);
    Ok((convert, nat, per_pair))
}

async fn teardown(
    api: &Api<DynamicObject>,
    name: &str,
    params: kube::api::DeleteParams,
) -> Result<f64> {
    let start = Instant::now();
    api.delete(name, &params).await?;
    loop {
        if api.get_opt(name).await?.is_none() {
            return Ok(start.elapsed().as_secs_f64() * 1000.0);
        }
        if start.elapsed() > Duration::from_secs(120) {
            bail!("{name} did not go");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn wait_all_held(api: &Api<DynamicObject>, n: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let held = api
            .list(&Default::default())
            .await?
            .items
            .iter()
            .filter(|o| o.finalizers().iter().any(|f| f == FINALIZER))
            .count();
        if held >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("only {held} of {n} held");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn release_all(client: &Client, ns: &str) -> Result<()> {
    let maps: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &config_maps());
    for cm in maps.list(&Default::default()).await?.items {
        if cm.finalizers().iter().any(|f| f == HOLD) {
            let _ = maps
                .patch(
                    &cm.name_any(),
                    &Default::default(),
                    &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
                )
                .await;
        }
    }
    Ok(())
}

/// USER_HZ on Linux: the unit of /proc/PID/stat's CPU times.
const TICKS_PER_SECOND: f64 = 100.0;

/// The CPU time (user + system, in ticks) `pid` has used so far.
fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may contain spaces).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0);
    let stime: u64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    Ok(utime + stime)
}

/// A KiB figure of /proc/PID/status (VmRSS: now, VmHWM: the peak).
fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    Ok(status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0))
}

/// RSS (KiB) now, and CPU (% of one core) over `window`, from /proc.
fn rest_usage(pid: u32, window: Duration) -> Result<(u64, f64)> {
    let before = cpu_ticks(pid)?;
    std::thread::sleep(window);
    let after = cpu_ticks(pid)?;
    let cpu = (after - before) as f64 / TICKS_PER_SECOND / window.as_secs_f64() * 100.0;
    Ok((status_kib(pid, "VmRSS:")?, cpu))
}
