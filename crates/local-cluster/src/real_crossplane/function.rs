//! function-patch-and-transform as a process with mutual TLS, registered with
//! Crossplane without a package registry: a FunctionRevision whose status the
//! harness fills in, as the External package runtime leaves to whoever runs
//! the function.

use std::path::Path;

use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use super::manifest::FIELD_MANAGER;
use super::netns::NetNamespace;
use super::{CoreVersion, CrossplaneBinaries, Error, api_error};
use crate::process::{self, Lifetime, Process, Surroundings};

/// The name Compositions give in `functionRef.name`.
pub const FUNCTION_NAME: &str = "function-patch-and-transform";
const REVISION_NAME: &str = "function-patch-and-transform-local";
/// Only recorded, never pulled: with the External runtime nothing fetches it.
const IMAGE: &str = "xpkg.crossplane.io/crossplane-contrib/function-patch-and-transform:v0.10.7";

fn function_revisions() -> ApiResource {
    ApiResource {
        group: "pkg.crossplane.io".into(),
        version: "v1".into(),
        api_version: "pkg.crossplane.io/v1".into(),
        kind: "FunctionRevision".into(),
        plural: "functionrevisions".into(),
    }
}

/// Starts the function on 127.0.0.1:`port`, trusting clients signed by the
/// CA in `certs` (`ca.crt`, beside its own `tls.crt` and `tls.key`).
pub fn start(
    binaries: &CrossplaneBinaries,
    port: u16,
    certs: &Path,
    log: &Path,
    lifetime: Lifetime,
    surroundings: Surroundings,
) -> Result<Process, Error> {
    let args = vec![
        format!("--address=127.0.0.1:{port}"),
        format!("--tls-certs-dir={}", certs.display()),
    ];
    Ok(process::spawn_with(
        FUNCTION_NAME,
        &binaries.function_patch_and_transform,
        &args,
        log,
        lifetime,
        surroundings,
    )?)
}

/// Registers the function with Crossplane: an active FunctionRevision with
/// the endpoint and the `composition` capability in its status (without the
/// capability Crossplane refuses a pipeline that calls it).
pub async fn register(client: &Client, port: u16, version: CoreVersion) -> Result<(), Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &function_revisions());
    let revision = json!({
        "apiVersion": "pkg.crossplane.io/v1",
        "kind": "FunctionRevision",
        "metadata": {
            "name": REVISION_NAME,
            "labels": {"pkg.crossplane.io/package": FUNCTION_NAME},
        },
        "spec": {
            "desiredState": "Active",
            "revision": 1,
            "image": IMAGE,
            "skipDependencyResolution": true,
            "ignoreCrossplaneConstraints": true,
        },
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(REVISION_NAME, &params, &Patch::Apply(&revision))
        .await
        .map_err(api_error("creating the FunctionRevision"))?;
    let mut status = json!({
        "apiVersion": "pkg.crossplane.io/v1",
        "kind": "FunctionRevision",
        "status": {"endpoint": format!("127.0.0.1:{port}")},
    });
    // Capabilities are new in v2 (v1's schema refuses the field, and every
    // function composes there).
    if version.major >= 2 {
        status["status"]["capabilities"] = json!(["composition"]);
    }
    api.patch_status(REVISION_NAME, &params, &Patch::Apply(&status))
        .await
        .map_err(api_error("setting the FunctionRevision's endpoint"))?;
    Ok(())
}

/// Waits until the function accepts TCP connections in its namespace.
pub async fn wait_listening(
    namespace: &NetNamespace,
    port: u16,
    process: &mut Process,
) -> Result<(), Error> {
    super::wait_for(process, || async move {
        if namespace.accepts(port) {
            Ok(())
        } else {
            Err(format!("nothing listens on 127.0.0.1:{port}"))
        }
    })
    .await
}
