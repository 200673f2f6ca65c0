//! Prometheus metrics (OpenMetrics text) and the liveness/readiness endpoints,
//! served over plain HTTP/1.1 by hyper.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry, Unit};
use tokio::net::TcpListener;
use tracing::{debug, error, warn};

use crate::Error;
use crate::cluster::convert::ConvertMetrics;

pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT_CONTENT_TYPE: &str = "text/plain; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InputLabel {
    input: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabel {
    policy: String,
}

/// A fn pointer (not a closure) so that the family's type can be named.
fn teardown_histogram() -> Histogram {
    // 0.1 s doubling to ~55 min: a teardown takes from moments to an hour.
    Histogram::new(exponential_buckets(0.1, 2.0, 16))
}

/// Registers `metric` under `name`, and gives it back: a family or a metric
/// shares its state with its clone in the registry.
fn registered<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// cascade-guard's metrics and the registry that exposes them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    protected: Family<KindLabel, Gauge>,
    conversions: Family<KindLabel, Counter>,
    restarts: Family<KindLabel, Counter>,
    in_progress: Family<KindLabel, Gauge>,
    stalled: Family<KindLabel, Gauge>,
    durations: Family<KindLabel, Histogram, fn() -> Histogram>,
    errors: Family<ReasonLabel, Counter>,
    policies: Gauge,
    leader: Gauge,
    inputs: Family<InputLabel, Gauge>,
    type_check_warnings: Family<PolicyLabel, Gauge>,
    sibling_holds: Gauge,
    sibling_order_problems: Gauge,
    static_policies: Gauge,
    static_loaded: Gauge,
    passes_started: Counter,
    passes: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let r = &mut registry;
        // In the order they are exposed; the registry last, once each is in.
        Self {
            protected: registered(
                r,
                "cascade_guard_protected_objects",
                "Objects of a Convert kind that cascade-guard holds with its finalizer",
                Default::default(),
            ),
            conversions: registered(
                r,
                "cascade_guard_conversions",
                "Deletes turned into foreground cascades",
                Default::default(),
            ),
            restarts: registered(
                r,
                "cascade_guard_cascade_restarts",
                "Quiet foreground cascades restarted because the garbage collector may have missed their start",
                Default::default(),
            ),
            in_progress: registered(
                r,
                "cascade_guard_cascades_in_progress",
                "Foreground cascades started and not yet finished",
                Default::default(),
            ),
            stalled: registered(
                r,
                "cascade_guard_stalled_cascades",
                "Cascades held by cascade-guard with no progress for the stall time (--stall-after)",
                Default::default(),
            ),
            durations: {
                let durations =
                    Family::new_with_constructor(teardown_histogram as fn() -> Histogram);
                r.register_with_unit(
                    "cascade_guard_cascade_duration",
                    "Time from the start of a foreground cascade to the object's removal",
                    Unit::Seconds,
                    durations.clone(),
                );
                durations
            },
            errors: registered(
                r,
                "cascade_guard_errors",
                "Failed operations, by what failed",
                Default::default(),
            ),
            policies: registered(
                r,
                "cascade_guard_admission_policies",
                "Compiled admission policies in force",
                Default::default(),
            ),
            leader: registered(
                r,
                "cascade_guard_leader",
                "1 while this replica holds the leader lease, else 0",
                Default::default(),
            ),
            inputs: registered(
                r,
                "cascade_guard_input_available",
                "1 when an API cascade-guard reads policies from is installed (input=CascadePolicy), else 0",
                Default::default(),
            ),
            type_check_warnings: registered(
                r,
                "cascade_guard_admission_policy_type_check_warnings",
                "Expressions of an admission policy that the API server could not type-check (status.typeChecking)",
                Default::default(),
            ),
            sibling_holds: registered(
                r,
                "cascade_guard_sibling_holds",
                "Objects held (label cascade-guard.dev/hold) until a sibling that needs them is gone",
                Default::default(),
            ),
            sibling_order_problems: registered(
                r,
                "cascade_guard_sibling_order_problems",
                "Cycles, conflicts and unresolved references in the live trees sibling order reads: those edges are not kept",
                Default::default(),
            ),
            static_policies: registered(
                r,
                "cascade_guard_static_policies",
                "Admission policies in the static manifests file this replica writes (--static-manifests-dir)",
                Default::default(),
            ),
            static_loaded: registered(
                r,
                "cascade_guard_static_manifests_loaded",
                "1 when the API server reports it loaded the static manifests directory as this replica last wrote it, else 0",
                Default::default(),
            ),
            passes_started: registered(
                r,
                "cascade_guard_sync_passes_started",
                "Passes over every policy input (the sync loop) started; one more than the completed passes while one runs",
                Default::default(),
            ),
            passes: registered(
                r,
                "cascade_guard_sync_passes",
                "Passes over every policy input (the sync loop) completed",
                Default::default(),
            ),
            registry,
        }
    }

    /// A sync pass starts reading what the cluster says.
    pub fn sync_pass_started(&self) {
        self.passes_started.inc();
    }

    /// A sync pass has applied, published and handed on what it read.
    pub fn sync_pass_completed(&self) {
        self.passes.inc();
    }

    /// Cascades of `kind` stalled now (a recount).
    pub fn set_stalled(&self, kind: &str, n: usize) {
        self.stalled
            .get_or_create(&kind_label(kind))
            .set(saturate(n));
    }

    /// Objects sibling order holds, and the problems it met, over every tree.
    pub fn set_sibling_order(&self, holds: usize, problems: usize) {
        self.sibling_holds.set(saturate(holds));
        self.sibling_order_problems.set(saturate(problems));
    }

    /// The policies in the static file, and whether the API server loaded it.
    pub fn set_static(&self, policies: usize, loaded: bool) {
        self.static_policies.set(saturate(policies));
        self.static_loaded.set(i64::from(loaded));
    }

    pub fn set_policies(&self, n: usize) {
        self.policies.set(saturate(n));
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// Whether an input API (`CascadePolicy`) is installed.
    pub fn set_input_available(&self, input: &str, available: bool) {
        self.inputs
            .get_or_create(&InputLabel {
                input: input.to_owned(),
            })
            .set(i64::from(available));
    }

    /// How many type-check warnings the API server recorded for a policy.
    pub fn set_type_check_warnings(&self, policy: &str, n: usize) {
        self.type_check_warnings
            .get_or_create(&policy_label(policy))
            .set(saturate(n));
    }

    /// A policy that is gone has no series.
    pub fn forget_type_check_warnings(&self, policy: &str) {
        self.type_check_warnings.remove(&policy_label(policy));
    }

    /// The OpenMetrics text exposition of every family.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail; an error would come from a metric's
        // own encoding, and a partial scrape is still worth serving.
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            error!(error = %e, "cannot encode metrics");
        }
        out
    }
}

fn kind_label(kind: &str) -> KindLabel {
    KindLabel {
        kind: kind.to_owned(),
    }
}

fn policy_label(policy: &str) -> PolicyLabel {
    PolicyLabel {
        policy: policy.to_owned(),
    }
}

fn saturate(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl ConvertMetrics for Metrics {
    fn set_protected(&self, kind: &str, n: usize) {
        self.protected
            .get_or_create(&kind_label(kind))
            .set(saturate(n));
    }

    fn conversion(&self, kind: &str) {
        self.conversions.get_or_create(&kind_label(kind)).inc();
    }

    fn cascade_restarted(&self, kind: &str) {
        self.restarts.get_or_create(&kind_label(kind)).inc();
    }

    fn cascade_started(&self, kind: &str) {
        self.in_progress.get_or_create(&kind_label(kind)).inc();
    }

    fn set_in_progress(&self, kind: &str, n: usize) {
        self.in_progress
            .get_or_create(&kind_label(kind))
            .set(saturate(n));
    }

    fn cascade_finished(&self, kind: &str, duration: Duration) {
        let label = kind_label(kind);
        self.in_progress.get_or_create(&label).dec();
        self.durations
            .get_or_create(&label)
            .observe(duration.as_secs_f64());
    }

    fn error(&self, reason: &str) {
        self.errors
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }

    fn set_stalled(&self, kind: &str, n: usize) {
        Metrics::set_stalled(self, kind, n);
    }
}

/// Liveness and readiness, shared between the controller and the endpoint.
#[derive(Clone, Debug, Default)]
pub struct Health {
    inner: Arc<HealthState>,
}

#[derive(Debug, Default)]
struct HealthState {
    ready: AtomicBool,
    /// Tells "still starting" from "was ready, is no longer" in the 503 reason.
    was_ready: AtomicBool,
}

impl Health {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn set_ready(&self, ready: bool) {
        if ready {
            self.inner.was_ready.store(true, Ordering::Relaxed);
        }
        self.inner.ready.store(ready, Ordering::Relaxed);
    }

    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Relaxed)
    }

    /// `None` when ready, else why not (one line).
    fn not_ready_reason(&self) -> Option<&'static str> {
        if self.is_ready() {
            None
        } else if self.inner.was_ready.load(Ordering::Relaxed) {
            Some("not ready: readiness withdrawn")
        } else {
            Some("not ready: still starting")
        }
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr` until dropped.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>, health: Health) -> Result<(), Error> {
    let (_, server) = bind(addr, metrics, health).await?;
    server.await;
    Ok(())
}

/// Binds `addr` and returns the bound address (useful with port 0) and the
/// future that serves on it until dropped.
pub async fn bind(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Health,
) -> Result<(SocketAddr, impl Future<Output = ()> + Send + 'static), Error> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| Error::Bind { addr, source })?;
    Ok((bound, accept(listener, metrics, health)))
}

async fn accept(listener: TcpListener, metrics: Arc<Metrics>, health: Health) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(connection) => connection,
            Err(e) => {
                // Usually out of file descriptors or a connection reset before
                // accept: transient, and no reason to stop serving probes.
                warn!(error = %e, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        let health = health.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                let response = respond(&request, &metrics, &health);
                async move { Ok::<_, Infallible>(response) }
            });
            // The timeout keeps a client that never finishes its headers from
            // holding a connection (and a task) forever.
            let served = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(e) = served {
                debug!(%peer, error = %e, "metrics connection ended with an error");
            }
        });
    }
}

fn respond<B>(request: &Request<B>, metrics: &Metrics, health: &Health) -> Response<Full<Bytes>> {
    let path = request.uri().path();
    if !matches!(path, "/metrics" | "/healthz" | "/readyz") {
        return text(StatusCode::NOT_FOUND, "not found");
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match path {
        "/metrics" => {
            let mut response = Response::new(Full::new(Bytes::from(metrics.encode())));
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(OPENMETRICS_CONTENT_TYPE),
            );
            response
        }
        "/readyz" => match health.not_ready_reason() {
            None => text(StatusCode::OK, "ok"),
            Some(reason) => text(StatusCode::SERVICE_UNAVAILABLE, reason),
        },
        // Answering at all is the liveness signal.
        _ => text(StatusCode::OK, "ok"),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(TEXT_CONTENT_TYPE));
    response
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    #[test]
    fn encode_exposes_every_family_after_updates() {
        let m = Metrics::new();
        m.set_protected("InferenceCluster.modelplane.ai", 3);
        m.conversion("InferenceCluster.modelplane.ai");
        m.conversion("InferenceCluster.modelplane.ai");
        m.cascade_started("InferenceCluster.modelplane.ai");
        m.cascade_started("InferenceCluster.modelplane.ai");
        m.cascade_finished("InferenceCluster.modelplane.ai", Duration::from_secs(42));
        m.error("AddFinalizer");
        m.set_policies(7);
        m.set_leader(true);
        m.set_type_check_warnings("cascade-guard-xrd-x", 2);
        m.sync_pass_started();
        m.sync_pass_completed();
        m.sync_pass_started();
        let text = m.encode();
        let k = r#"kind="InferenceCluster.modelplane.ai""#;
        for line in [
            format!("cascade_guard_protected_objects{{{k}}} 3"),
            format!("cascade_guard_conversions_total{{{k}}} 2"),
            format!("cascade_guard_cascades_in_progress{{{k}}} 1"),
            format!("cascade_guard_cascade_duration_seconds_count{{{k}}} 1"),
            format!("cascade_guard_cascade_duration_seconds_sum{{{k}}} 42.0"),
            format!("cascade_guard_cascade_duration_seconds_bucket{{le=\"51.2\",{k}}} 1"),
            format!("cascade_guard_cascade_duration_seconds_bucket{{le=\"25.6\",{k}}} 0"),
            r#"cascade_guard_errors_total{reason="AddFinalizer"} 1"#.to_owned(),
            "cascade_guard_admission_policies 7".to_owned(),
            "cascade_guard_leader 1".to_owned(),
            "cascade_guard_sync_passes_started_total 2".to_owned(),
            "cascade_guard_sync_passes_total 1".to_owned(),
            r#"cascade_guard_admission_policy_type_check_warnings{policy="cascade-guard-xrd-x"} 2"#
                .to_owned(),
            "# TYPE cascade_guard_cascade_duration_seconds histogram".to_owned(),
            "# UNIT cascade_guard_cascade_duration_seconds seconds".to_owned(),
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in:\n{text}"
            );
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        m.set_leader(false);
        assert!(m.encode().lines().any(|l| l == "cascade_guard_leader 0"));
        m.forget_type_check_warnings("cascade-guard-xrd-x");
        assert!(!m.encode().contains("cascade-guard-xrd-x"));
    }

    #[test]
    fn histogram_buckets_span_a_tenth_of_a_second_to_about_an_hour() {
        let m = Metrics::new();
        m.cascade_finished("K", Duration::from_millis(50));
        let text = m.encode();
        assert!(text.contains(r#"le="0.1""#), "{text}");
        assert!(text.contains(r#"le="3276.8""#), "{text}");
    }

    /// A hand-written HTTP/1.1 GET over a real socket: status, headers, body.
    fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
        let mut stream = std::net::TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .expect("write request");
        let mut raw = String::new();
        stream.read_to_string(&mut raw).expect("read response");
        let (head, body) = raw.split_once("\r\n\r\n").expect("header end");
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("status code");
        (status, head.to_owned(), body.to_owned())
    }

    async fn fetch(addr: SocketAddr, path: &'static str) -> (u16, String, String) {
        tokio::task::spawn_blocking(move || get(addr, path))
            .await
            .expect("request thread")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serves_metrics_and_health_over_tcp() {
        let metrics = Arc::new(Metrics::new());
        let health = Health::new();
        let (addr, server) = bind(
            "127.0.0.1:0".parse().expect("addr"),
            metrics.clone(),
            health.clone(),
        )
        .await
        .expect("bind");
        assert_ne!(addr.port(), 0);
        let server = tokio::spawn(server);

        metrics.conversion("InferenceCluster.modelplane.ai");
        let (status, head, body) = fetch(addr, "/metrics").await;
        assert_eq!(status, 200);
        assert!(
            head.to_ascii_lowercase()
                .contains(&format!("content-type: {OPENMETRICS_CONTENT_TYPE}")),
            "{head}"
        );
        assert!(
            body.contains(
                r#"cascade_guard_conversions_total{kind="InferenceCluster.modelplane.ai"} 1"#
            ),
            "{body}"
        );

        assert_eq!(fetch(addr, "/healthz").await.0, 200);
        let (status, _, body) = fetch(addr, "/readyz").await;
        assert_eq!((status, body.as_str()), (503, "not ready: still starting"));
        health.set_ready(true);
        let (status, _, body) = fetch(addr, "/readyz").await;
        assert_eq!((status, body.as_str()), (200, "ok"));
        health.set_ready(false);
        let (status, _, body) = fetch(addr, "/readyz").await;
        assert_eq!(
            (status, body.as_str()),
            (503, "not ready: readiness withdrawn")
        );
        let (status, _, body) = fetch(addr, "/healthz").await;
        assert_eq!((status, body.as_str()), (200, "ok"));

        assert_eq!(fetch(addr, "/nope").await.0, 404);
        server.abort();
    }

    #[tokio::test]
    async fn a_taken_address_is_an_error_naming_it() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = taken.local_addr().expect("addr");
        let err = serve(addr, Arc::new(Metrics::new()), Health::new())
            .await
            .expect_err("address in use");
        assert!(err.to_string().contains(&addr.to_string()), "{err}");
    }
}
