//! Test support: one control plane per test binary, a namespace per test, and
//! the components' logs printed when a test fails.

use std::sync::atomic::{AtomicU32, Ordering};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::OnceCell;

use crate::{ControlPlane, Options};

/// The test binary's control plane, started on first use with `options`. It
/// stops when the test process exits (the components die with it).
///
/// Panics with the components' logs if it cannot start: a test without its
/// control plane has nothing to say.
pub async fn shared(options: fn() -> Options) -> &'static ControlPlane {
    static SHARED: OnceCell<ControlPlane> = OnceCell::const_new();
    SHARED
        .get_or_init(|| async move {
            init_tracing();
            match ControlPlane::start(options()).await {
                Ok(cp) => cp,
                Err(e) => panic!("cannot start the local control plane: {e}"),
            }
        })
        .await
}

/// A test's own namespace and admin client. When the test fails (panics), the
/// drop prints the end of each component's log.
pub struct Scope<'a> {
    pub cp: &'a ControlPlane,
    pub namespace: String,
    pub client: Client,
}

impl<'a> Scope<'a> {
    pub async fn new(cp: &'a ControlPlane, test: &str) -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut base: String = test
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .collect();
        base.truncate(50);
        let namespace = format!("{}-{n}", base.trim_matches('-'));
        let client = match cp.admin().await {
            Ok(c) => c,
            Err(e) => panic!("admin client: {e}"),
        };
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(namespace.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        if let Err(e) = Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
        {
            panic!("cannot create test namespace {namespace}: {e}");
        }
        Self {
            cp,
            namespace,
            client,
        }
    }
}

impl Drop for Scope<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "\n===== test in namespace {} failed; control plane in {} =====\n{}",
                self.namespace,
                self.cp.dir().display(),
                self.cp.log_tails(60)
            );
        }
    }
}

/// Logs to the test output, filtered by RUST_LOG (default: warnings).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}
