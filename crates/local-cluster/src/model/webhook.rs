//! Crossplane's `crossplane-no-usages` validating webhook, served on loopback
//! with TLS (there is no cluster networking, so its registration names a
//! `clientConfig.url`; upstream names the crossplane webhook Service).
//!
//! Upstream (cluster/webhookconfigurations/usage.yaml and
//! internal/webhook/protection/usage/handler.go):
//! - registered for DELETE of every resource, `failurePolicy: Fail`,
//!   `sideEffects: None`, only for objects labelled `crossplane.io/in-use: "true"`
//!   (the Usage controller puts that label on every used resource);
//! - when any Usage or ClusterUsage names the object as `of` (by resourceRef,
//!   matched on group, kind, name and namespace), it refuses with HTTP 409 in
//!   the AdmissionResponse status, the message in `reason`, after recording the
//!   caller's propagation policy (Background when none was sent) in the
//!   annotation `usage.crossplane.io/deletion-attempt-with-policy` on the object
//!   itself, with a merge patch, unless the annotation already says so;
//! - a Usage that is itself being deleted still counts.
//!
//! As upstream, a dry-run DELETE records the attempt too: the webhook declares
//! no side effects but has one.

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::usage::{self, IN_USE_LABEL};
use super::{ModelError, text};

/// The annotation the webhook records a refused deletion's policy in
/// (internal/protection/usage.go, `AnnotationKeyDeletionAttempt`).
pub const DELETION_ATTEMPT_ANNOTATION: &str = "usage.crossplane.io/deletion-attempt-with-policy";
pub const CONFIGURATION_NAME: &str = "crossplane-no-usages";
pub const WEBHOOK_NAME: &str = "nousages.protection.crossplane.io";
const PATH: &str = "/validate-no-usages";
/// A ConfigMap the model deletes with dry run until its webhook sees the request.
const PROBE: &str = "crossplane-model-webhook-probe";
const PROBE_NAMESPACE: &str = "default";

/// The webhook's server: bound, with its certificate, not yet serving.
pub struct Server {
    listener: TcpListener,
    acceptor: TlsAcceptor,
    ca_pem: String,
    handler: Handler,
}

#[derive(Clone)]
struct Handler {
    /// As Crossplane's service account: it lists Usages and patches the
    /// annotation.
    client: Client,
    probed: Arc<AtomicBool>,
}

impl Server {
    /// Makes a CA and a serving certificate for 127.0.0.1 (crate::pki) and binds
    /// a free port.
    pub async fn start(client: Client) -> Result<Self, ModelError> {
        let (ca, serving) =
            crate::pki::loopback_serving("crossplane-model webhook CA", "crossplane-webhook")
                .map_err(|e| ModelError::Certificate(e.to_string()))?;
        let pem = |e: tokio_rustls::rustls::pki_types::pem::Error| ModelError::Tls(e.to_string());
        let chain = vec![
            CertificateDer::from_pem_slice(serving.cert_pem.as_bytes()).map_err(pem)?,
            CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).map_err(pem)?,
        ];
        let key = PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes()).map_err(pem)?;
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ModelError::Tls(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| ModelError::Tls(e.to_string()))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await?;
        Ok(Self {
            listener,
            acceptor: TlsAcceptor::from(Arc::new(config)),
            ca_pem: ca.cert_pem,
            handler: Handler {
                client,
                probed: Arc::default(),
            },
        })
    }

    pub fn url(&self) -> String {
        let port = self.listener.local_addr().map(|a| a.port()).unwrap_or(0);
        format!("https://127.0.0.1:{port}{PATH}")
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Set once the API server has sent the probe's AdmissionReview.
    pub fn probed(&self) -> Arc<AtomicBool> {
        self.handler.probed.clone()
    }

    /// Serves until the task is aborted.
    pub async fn serve(self) {
        loop {
            let stream = match self.listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!("webhook accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let acceptor = self.acceptor.clone();
            let handler = self.handler.clone();
            tokio::spawn(async move {
                let tls = match acceptor.accept(stream).await {
                    Ok(tls) => tls,
                    Err(e) => {
                        tracing::debug!("webhook TLS handshake: {e}");
                        return;
                    }
                };
                let service = hyper::service::service_fn(move |request| {
                    let handler = handler.clone();
                    async move { Ok::<_, Infallible>(handler.http(request).await) }
                });
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await
                {
                    tracing::debug!("webhook connection: {e}");
                }
            });
        }
    }
}

impl Handler {
    async fn http(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let body = match request.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return reply(400, json!({"error": e.to_string()})),
        };
        let review: Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => return reply(400, json!({"error": e.to_string()})),
        };
        let req = &review["request"];
        let response = self.admit(req).await;
        let mut response = response;
        response["uid"] = req["uid"].clone();
        reply(
            200,
            json!({
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": response,
            }),
        )
    }

    /// The AdmissionResponse for one request (without its uid).
    async fn admit(&self, req: &Value) -> Value {
        if text(req, "/operation") != Some("DELETE") {
            return errored(
                400,
                &format!(
                    "unexpected operation {:?}, expected \"DELETE\"",
                    text(req, "/operation").unwrap_or_default()
                ),
            );
        }
        let old = &req["oldObject"];
        let name = text(old, "/metadata/name").unwrap_or_default();
        let namespace = text(old, "/metadata/namespace").unwrap_or_default();
        if namespace == PROBE_NAMESPACE && name == PROBE {
            self.probed.store(true, Ordering::SeqCst);
        }
        let api_version = text(old, "/apiVersion").unwrap_or_default();
        let kind = text(old, "/kind").unwrap_or_default();
        let usages =
            match usage::find_usages_of(&self.client, api_version, kind, name, namespace).await {
                Ok(u) => u,
                Err(e) => return errored(500, &e.to_string()),
            };
        let Some(first) = usages.first() else {
            return json!({"allowed": true});
        };
        let message = usage::in_use_message(first, usages.len());
        // The policy of the caller, Background when it sent none.
        let policy = text(req, "/options/propagationPolicy").unwrap_or("Background");
        let recorded = old
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(DELETION_ATTEMPT_ANNOTATION))
            .and_then(Value::as_str);
        if recorded != Some(policy)
            && let Err(e) = self.record(req, policy).await
        {
            return errored(500, &e.to_string());
        }
        json!({"allowed": false, "status": {"code": 409, "reason": message}})
    }

    async fn record(&self, req: &Value, policy: &str) -> Result<(), kube::Error> {
        let group = text(req, "/resource/group").unwrap_or_default();
        let version = text(req, "/resource/version").unwrap_or_default();
        let plural = text(req, "/resource/resource").unwrap_or_default();
        let kind = text(req, "/kind/kind").unwrap_or_default();
        let api_version = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        let resource = ApiResource {
            group: group.to_string(),
            version: version.to_string(),
            api_version,
            kind: kind.to_string(),
            plural: plural.to_string(),
        };
        let name = text(req, "/name").unwrap_or_default();
        let api: Api<DynamicObject> = match text(req, "/namespace").filter(|n| !n.is_empty()) {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &resource),
            None => Api::all_with(self.client.clone(), &resource),
        };
        let patch = json!({"metadata": {"annotations": {DELETION_ATTEMPT_ANNOTATION: policy}}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
    }
}

/// controller-runtime's `admission.Errored`: not allowed, with the code and
/// the error as the message.
fn errored(code: u16, message: &str) -> Value {
    json!({"allowed": false, "status": {"code": code, "message": message}})
}

fn reply(status: u16, body: Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or_default();
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

/// Registers (or replaces) `crossplane-no-usages` with the server's URL.
pub async fn register(admin: &Client, url: &str, ca_pem: &str) -> Result<(), ModelError> {
    let mut config: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION_NAME},
        "webhooks": [{
            "name": WEBHOOK_NAME,
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": url},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "objectSelector": {"matchLabels": {IN_USE_LABEL: "true"}},
            "rules": [{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["DELETE"], "resources": ["*"]}],
        }]
    }))
    .map_err(|e| ModelError::Invalid(e.to_string()))?;
    for webhook in config.webhooks.iter_mut().flatten() {
        webhook.client_config.ca_bundle = Some(ByteString(ca_pem.as_bytes().to_vec()));
    }
    let api: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
    api.patch(
        CONFIGURATION_NAME,
        &PatchParams::apply("crossplane-model").force(),
        &Patch::Apply(&config),
    )
    .await?;
    Ok(())
}

/// Waits until the API server calls the webhook: dry-run deletes of an
/// in-use-labelled probe (not used by any Usage, so they are allowed) until
/// the server has seen one.
pub async fn wait_effective(admin: &Client, probed: &AtomicBool) -> Result<(), ModelError> {
    let maps: Api<ConfigMap> = Api::namespaced(admin.clone(), PROBE_NAMESPACE);
    let probe: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": PROBE, "labels": {IN_USE_LABEL: "true"}}
    }))
    .map_err(|e| ModelError::Invalid(e.to_string()))?;
    maps.patch(
        PROBE,
        &PatchParams::apply("crossplane-model").force(),
        &Patch::Apply(&probe),
    )
    .await?;
    let dry_run = DeleteParams {
        dry_run: true,
        ..DeleteParams::default()
    };
    for _ in 0..300 {
        let _ = maps.delete(PROBE, &dry_run).await;
        if probed.load(Ordering::SeqCst) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(ModelError::NotReady(format!("webhook {WEBHOOK_NAME}")))
}

/// Removes the registration and the probe (best effort), so that nothing in the
/// cluster calls a server that is gone.
pub async fn deregister(admin: &Client) {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
    let _ = api
        .delete(CONFIGURATION_NAME, &DeleteParams::default())
        .await;
    let maps: Api<ConfigMap> = Api::namespaced(admin.clone(), PROBE_NAMESPACE);
    let _ = maps.delete(PROBE, &DeleteParams::default()).await;
}
