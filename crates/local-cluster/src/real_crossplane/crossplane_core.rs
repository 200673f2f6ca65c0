//! Crossplane core out of cluster: `crossplane core init` (the CRDs, the Usage
//! webhook's configuration, the Lock), then `crossplane core start` with the
//! External package runtime, as its own service account.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::manifest::{self, FIELD_MANAGER};
use super::{CROSSPLANE_NAMESPACE, CrossplaneBinaries, Error, api_error, io_error};
use crate::process::{self, Lifetime, Process, Surroundings};

const INIT_ATTEMPTS: u32 = 5;
/// The Service `core init` names in its webhook configurations (none exists).
const WEBHOOK_SERVICE: &str = "crossplane-webhooks";

/// Where core's certificates and caches are, and the ports it serves on
/// inside its network namespace.
pub struct CoreLayout {
    pub kubeconfig: PathBuf,
    pub server_certs: PathBuf,
    pub client_certs: PathBuf,
    pub cache: PathBuf,
    pub webhook_port: u16,
    /// Where the API server reaches the webhooks: a port on this machine's
    /// loopback, forwarded to `webhook_port` inside.
    pub webhook_url: String,
    pub metrics_port: u16,
    pub health_port: u16,
    pub ca_pem: String,
}

/// Runs `crossplane core init` until it succeeds: it can fail at once with
/// `no matches for kind "Lock"`, when its REST mapper has not yet seen a CRD
/// it has just created (in a cluster, the init container restarts). It is
/// idempotent.
pub async fn init(
    binaries: &CrossplaneBinaries,
    layout: &CoreLayout,
    log: &Path,
) -> Result<(), Error> {
    let mut args = vec![
        "core".to_string(),
        "init".to_string(),
        format!("--namespace={CROSSPLANE_NAMESPACE}"),
        "--service-account=crossplane".to_string(),
        format!("--webhook-service-name={WEBHOOK_SERVICE}"),
        format!("--webhook-service-namespace={CROSSPLANE_NAMESPACE}"),
        format!("--webhook-service-port={}", layout.webhook_port),
        "--tlsca-secret-name=crossplane-root-ca".to_string(),
        "--tls-server-secret-name=crossplane-tls-server".to_string(),
        "--tls-client-secret-name=crossplane-tls-client".to_string(),
    ];
    let program = if binaries.core_version()?.major >= 2 {
        args.extend([
            // kong's spelling of the flags for CRDsPath and TLSCASecretName.
            format!("--cr-ds-path={}", binaries.core_crds.display()),
            format!(
                "--webhook-configurations-path={}",
                binaries.core_webhook_configurations.display()
            ),
        ]);
        binaries.crossplane.clone()
    } else {
        // v1 has no flags for those: it reads /crds and /webhookconfigurations,
        // where its image has them. It runs chrooted into a directory that
        // has them there.
        let root = init_root(binaries, layout)?;
        args.insert(0, "/crossplane".into());
        args.insert(0, root.display().to_string());
        PathBuf::from("chroot")
    };
    let mut last = String::new();
    for attempt in 1..=INIT_ATTEMPTS {
        let out = std::fs::File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(io_error(log))?;
        let err = out.try_clone().map_err(io_error(log))?;
        let status = tokio::process::Command::new(&program)
            .args(&args)
            .env("KUBECONFIG", &layout.kubeconfig)
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .status()
            .await
            .map_err(|e| Error::Io(format!("{}: {e}", program.display())))?;
        if status.success() {
            return Ok(());
        }
        last = format!(
            "attempt {attempt}: {status}; {}",
            process::log_tail(log, 3).replace('\n', " | ")
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Err(Error::Init {
        attempts: INIT_ATTEMPTS,
        detail: last,
    })
}

/// A root for Crossplane v1's `core init`: its (static) binary, its CRDs and
/// webhook configurations where it looks for them, and the kubeconfig with
/// the certificate files it names, each at its own path.
fn init_root(binaries: &CrossplaneBinaries, layout: &CoreLayout) -> Result<PathBuf, Error> {
    let root = layout.cache.join("init-root");
    let copy = |from: &Path, to: &Path| -> Result<(), Error> {
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir).map_err(io_error(dir))?;
        }
        std::fs::copy(from, to).map(drop).map_err(io_error(from))
    };
    let inside = |path: &Path| root.join(path.strip_prefix("/").unwrap_or(path));
    copy(&binaries.crossplane, &root.join("crossplane"))?;
    for (dir, name) in [
        (&binaries.core_crds, "crds"),
        (
            &binaries.core_webhook_configurations,
            "webhookconfigurations",
        ),
    ] {
        for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
            let path = entry.map_err(io_error(dir))?.path();
            if path.is_file() {
                copy(
                    &path,
                    &root.join(name).join(path.file_name().unwrap_or_default()),
                )?;
            }
        }
    }
    let kubeconfig = kube::config::Kubeconfig::read_from(&layout.kubeconfig)
        .map_err(|e| Error::Io(format!("{}: {e}", layout.kubeconfig.display())))?;
    let files = kubeconfig
        .clusters
        .iter()
        .filter_map(|c| c.cluster.as_ref()?.certificate_authority.clone())
        .chain(kubeconfig.auth_infos.iter().flat_map(|a| {
            let auth = a.auth_info.as_ref();
            [
                auth.and_then(|a| a.client_certificate.clone()),
                auth.and_then(|a| a.client_key.clone()),
            ]
            .into_iter()
            .flatten()
        }))
        .map(PathBuf::from)
        .chain([layout.kubeconfig.clone()]);
    for file in files {
        copy(&file, &inside(&file))?;
    }
    Ok(root)
}

/// The API server cannot reach a webhook by Service here (no kube-proxy, and
/// Endpoints refuse loopback addresses): the webhooks `core init` installed
/// (the Usage webhook; in v1 also `crossplane`, for XRDs and Compositions) and
/// the conversion webhooks of core's CRDs get loopback URLs instead.
pub async fn webhooks_on_loopback(
    client: &Client,
    binaries: &CrossplaneBinaries,
    layout: &CoreLayout,
) -> Result<(), Error> {
    let base = &layout.webhook_url;
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let installed = configs
        .list(&Default::default())
        .await
        .map_err(api_error("listing webhook configurations"))?;
    for mut config in installed {
        let name = config.metadata.name.clone().unwrap_or_default();
        let mut ours = false;
        for webhook in config.webhooks.iter_mut().flatten() {
            let Some(service) = webhook.client_config.service.as_ref() else {
                continue;
            };
            if service.name != WEBHOOK_SERVICE {
                continue;
            }
            let path = service.path.clone().unwrap_or_default();
            webhook.client_config = WebhookClientConfig {
                url: Some(format!("{base}{path}")),
                ca_bundle: Some(ByteString(layout.ca_pem.as_bytes().to_vec())),
                service: None,
            };
            ours = true;
        }
        if !ours {
            continue;
        }
        configs
            .replace(&name, &PostParams::default(), &config)
            .await
            .map_err(api_error(format!("pointing {name} at loopback")))?;
    }

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in manifest::read_crds(&binaries.core_crds)? {
        if !manifest::has_conversion_webhook(&crd) {
            continue;
        }
        let name = crd.metadata.name.clone().unwrap_or_default();
        let mut live = crds
            .get(&name)
            .await
            .map_err(api_error(format!("reading CRD {name}")))?;
        manifest::convert_on_loopback(&mut live, &format!("{base}/convert"), &layout.ca_pem);
        crds.replace(&name, &PostParams::default(), &live)
            .await
            .map_err(api_error(format!(
                "pointing CRD {name}'s conversion at loopback"
            )))?;
    }
    Ok(())
}

/// The namespace Crossplane keeps its Secrets in; `core init` expects it.
pub async fn ensure_namespace(client: &Client) -> Result<(), Error> {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CROSSPLANE_NAMESPACE}});
    namespaces
        .patch(
            CROSSPLANE_NAMESPACE,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Apply(&ns),
        )
        .await
        .map_err(api_error(format!(
            "creating namespace {CROSSPLANE_NAMESPACE}"
        )))?;
    Ok(())
}

/// Starts `crossplane core start` in `surroundings` (its network namespace).
pub fn start(
    binaries: &CrossplaneBinaries,
    layout: &CoreLayout,
    log: &Path,
    lifetime: Lifetime,
    mut surroundings: Surroundings,
) -> Result<Process, Error> {
    let args = vec![
        "core".to_string(),
        "start".to_string(),
        format!("--namespace={CROSSPLANE_NAMESPACE}"),
        // Crossplane installs packages but runs none: the harness runs the
        // function and the providers as processes.
        "--package-runtime=External".to_string(),
        format!("--webhook-port={}", layout.webhook_port),
        format!("--metrics-port={}", layout.metrics_port),
        format!("--health-probe-port={}", layout.health_port),
        format!("--tls-server-certs-dir={}", layout.server_certs.display()),
        format!("--tls-client-certs-dir={}", layout.client_certs.display()),
        format!("--xpkg-cache-dir={}", layout.cache.join("xpkg").display()),
        format!("--xfn-cache-dir={}", layout.cache.join("xfn").display()),
    ];
    for dir in ["xpkg", "xfn"] {
        let path = layout.cache.join(dir);
        std::fs::create_dir_all(&path).map_err(io_error(&path))?;
    }
    surroundings.env.push((
        OsString::from("KUBECONFIG"),
        layout.kubeconfig.clone().into_os_string(),
    ));
    Ok(process::spawn_with(
        super::CORE_PROCESS,
        &binaries.crossplane,
        &args,
        log,
        lifetime,
        surroundings,
    )?)
}

/// Waits until core's health endpoint says ready (`/readyz`, plain HTTP).
pub async fn wait_ready(port: u16, process: &mut Process) -> Result<(), Error> {
    super::wait_for(process, || async move {
        match http_get(port, "/readyz").await {
            Ok(200) => Ok(()),
            Ok(status) => Err(format!("/readyz answered {status}")),
            Err(e) => Err(e),
        }
    })
    .await
}

/// The status code of a plain HTTP GET on loopback.
async fn http_get(port: u16, path: &str) -> Result<u16, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response))
        .await
        .map_err(|_| "no answer in 5 s".to_string())?
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&response);
    text.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {}", text.lines().next().unwrap_or("")))
}
