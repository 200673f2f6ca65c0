//! Benchmark of what cascade-guard's UPDATE policies cost an ordinary update
//! on the real control plane. Prints the latency of a label change (a merge
//! patch, as a controller or kubectl sends) of an XR with ten composed
//! resources and two finalizers, for a kind no policy matches and a kind
//! cascade-guard protects (Refuse), interleaved request by request: without
//! policies, with them, and without them again (A-B-A).
//!
//! Run: scripts/bench.sh update   (or, after `cargo build --release -p cascade-guard`,
//! cargo run --release -p cascade-guard-bench --bin bench-update)

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::api::{ApiResource, DynamicObject, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use local_cluster::{ControlPlane, Options, crossplane};
use serde_json::{Value, json};

use cascade_guard_bench::{GROUP, Rounds, percentile, report, resource, start_controller};

/// Objects of each kind; rounds of one update of each per phase.
const OBJECTS: usize = 500;
const ROUNDS: usize = 5;

fn xrd(kind: &str, plural: &str) -> Value {
    json!({
        "apiVersion": "apiextensions.crossplane.io/v2",
        "kind": "CompositeResourceDefinition",
        "metadata": {"name": format!("{plural}.{GROUP}"),
            "annotations": {"cascade-guard.dev/deletion-policy": "Refuse"}},
        "spec": {"group": GROUP, "names": {"kind": kind, "plural": plural},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "referenceable": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object"}}}}}]}
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    let protected_xrd = xrd("Bench0", "bench0s");
    let mut crds = vec![
        crossplane::crossplane_crd(crossplane::XRD_CRD).map_err(anyhow::Error::msg)?,
        crossplane::xrd_to_crd(&protected_xrd).map_err(anyhow::Error::msg)?,
        // The unprotected kind: an XR kind with no XRD, so no policy matches it.
        crossplane::xrd_to_crd(&xrd("Plain", "plains")).map_err(anyhow::Error::msg)?,
    ];
    crds.extend(cascade_guard::api::crds());
    let cp = ControlPlane::start(Options {
        crds,
        ..Options::default()
    })
    .await?;
    let admin = cp.admin().await?;
    let ns = "bench";
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await?;
    let plain = resource("Plain", "plains");
    let protected = resource("Bench0", "bench0s");
    for r in [&plain, &protected] {
        let api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), ns, r);
        for i in 0..OBJECTS {
            let refs: Vec<Value> = (0..10)
                .map(|j| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": format!("x-{j}")}))
                .collect();
            let mut o = DynamicObject::new(&format!("o-{i}"), r)
                .data(json!({"spec": {"crossplane": {"resourceRefs": refs}}}));
            o.metadata.finalizers = Some(vec![
                "composite.apiextensions.crossplane.io".into(),
                "cascade-guard.dev/foreground-cascade".into(),
            ]);
            api.create(&PostParams::default(), &o).await?;
        }
    }

    println!(
        "UPDATE latency: {ROUNDS} rounds of one label change of each of {OBJECTS} objects of each kind, interleaved"
    );
    let before = measure(&admin, ns, &plain, &protected, "before").await?;
    report("no policies installed", &before);

    let mut controller = start_controller(&cp)?;
    let xrds: Api<DynamicObject> =
        Api::all_with(admin.clone(), &local_cluster::crossplane::xrd_resource());
    xrds.create(
        &PostParams::default(),
        &serde_json::from_value(protected_xrd)?,
    )
    .await?;
    // The admin is the user cascade-guard runs as here, and trusted: probe as
    // someone else.
    let person = cp
        .client_as("alice@example.com", &["system:masters"])
        .await?;
    wait_for(&person, ns, &protected, true).await?;
    let after = measure(&admin, ns, &plain, &protected, "after").await?;
    report("cascade-guard's policies installed", &after);

    controller.stop(Duration::from_secs(10));
    let ours = ListParams::default().labels("app.kubernetes.io/managed-by=cascade-guard");
    let bindings: Api<
        k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding,
    > = Api::all(admin.clone());
    let vaps: Api<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy> =
        Api::all(admin.clone());
    bindings
        .delete_collection(&Default::default(), &ours)
        .await?;
    vaps.delete_collection(&Default::default(), &ours).await?;
    wait_for(&person, ns, &protected, false).await?;
    let again = measure(&admin, ns, &plain, &protected, "again").await?;
    report("policies removed", &again);
    for q in [50.0, 99.0] {
        let p = |r: &Rounds| {
            let (plain, protected) = r.pooled();
            (percentile(&plain, q), percentile(&protected, q))
        };
        let ((a0, b0), (a1, b1), (a2, b2)) = (p(&before), p(&after), p(&again));
        println!(
            "p{q:.0}: protected kind {b0:.3} / {b1:.3} / {b2:.3} ms (without / with / without): with minus the mean without {:+.3} ms; unprotected kind {a0:.3} / {a1:.3} / {a2:.3} ms: {:+.3} ms",
            b1 - (b0 + b2) / 2.0,
            a1 - (a0 + a2) / 2.0
        );
    }
    Ok(())
}

/// Until a person's dry-run update that drops cascade-guard's finalizer is
/// refused (`guarded`) or not.
async fn wait_for(person: &Client, ns: &str, r: &ApiResource, guarded: bool) -> Result<()> {
    let api: Api<DynamicObject> = Api::namespaced_with(person.clone(), ns, r);
    let params = kube::api::PatchParams {
        dry_run: true,
        ..Default::default()
    };
    let strip = kube::api::Patch::Merge(
        json!({"metadata": {"finalizers": ["composite.apiextensions.crossplane.io"]}}),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let refused = match api.patch("o-0", &params, &strip).await {
            Ok(_) => false,
            Err(kube::Error::Api(s)) if s.code == 403 => true,
            Err(e) => return Err(e.into()),
        };
        if refused == guarded {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the UPDATE policy did not come {}",
                if guarded { "into force" } else { "off" }
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// ROUNDS rounds of interleaved label changes of the two kinds' objects.
async fn measure(
    admin: &Client,
    ns: &str,
    plain: &ApiResource,
    protected: &ApiResource,
    phase: &str,
) -> Result<Rounds> {
    let mut rounds = Vec::new();
    for round in 0..ROUNDS {
        let mut plain_ms = Vec::new();
        let mut protected_ms = Vec::new();
        for i in 0..OBJECTS {
            // Alternate which kind goes first: the first of a pair is slower.
            let pair = if i % 2 == 0 {
                [plain, protected]
            } else {
                [protected, plain]
            };
            for r in pair {
                let body = serde_json::to_vec(
                    &json!({"metadata": {"labels": {"round": format!("{phase}-{round}")}}}),
                )?;
                let request = http::Request::patch(format!(
                    "/apis/{}/namespaces/{ns}/{}/o-{i}",
                    r.api_version, r.plural
                ))
                .header("Content-Type", "application/merge-patch+json")
                .body(body)?;
                let start = Instant::now();
                let object: DynamicObject = admin
                    .request(request)
                    .await
                    .with_context(|| format!("patch o-{i}"))?;
                let ms = start.elapsed().as_secs_f64() * 1000.0;
                debug_assert_eq!(object.name_any(), format!("o-{i}"));
                if r.kind == plain.kind {
                    plain_ms.push(ms);
                } else {
                    protected_ms.push(ms);
                }
            }
        }
        plain_ms.sort_by(f64::total_cmp);
        protected_ms.sort_by(f64::total_cmp);
        rounds.push((plain_ms, protected_ms));
    }
    Ok(Rounds(rounds))
}
