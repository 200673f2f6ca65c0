//! A legacy XRD with a claim in each mode, and a deleted namespace holding a
//! claim.

use super::*;

pub(crate) const CLAIM_GROUP: &str = "claims.seed.local-cluster.dev";
pub(crate) const CLAIM_NAMESPACE: &str = "seed-claims";

/// A legacy (`apiextensions.crossplane.io/v1`) XRD `X<prefix><Mode>App` with
/// claim `<prefix><Mode>App`, annotated with `mode`, and a Composition of one
/// ConfigMap in `namespace`.
pub(crate) async fn install_claim_kind(
    client: &Client,
    mode: Mode,
    prefix: &str,
    namespace: &str,
) -> (ApiResource, ApiResource) {
    let kind = format!("{prefix}{}App", mode.as_str());
    let plural = kind.to_lowercase() + "s";
    let xrd = json!({
        "apiVersion": "apiextensions.crossplane.io/v1",
        "kind": "CompositeResourceDefinition",
        "metadata": {
            "name": format!("x{plural}.{CLAIM_GROUP}"),
            "annotations": {POLICY_ANNOTATION: mode.as_str()},
        },
        "spec": {
            "group": CLAIM_GROUP,
            "names": {"kind": format!("X{kind}"), "plural": format!("x{plural}")},
            "claimNames": {"kind": kind, "plural": plural},
            "versions": [{
                "name": "v1", "served": true, "referenceable": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"note": {"type": "string"}}},
                }}},
            }],
        },
    });
    let xrds = modelplane::resource(
        "apiextensions.crossplane.io",
        "v1",
        "CompositeResourceDefinition",
        "compositeresourcedefinitions",
    );
    apply_cluster_object(client, &xrds, xrd).await;
    let config_map = json!({
        "name": "config",
        "base": {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"namespace": namespace}, "data": {"part": "config"}},
        "readinessChecks": [{"type": "None"}],
    });
    apply_cluster_object(
        client,
        &compositions(),
        pt_composition(CLAIM_GROUP, &format!("X{kind}"), vec![config_map]),
    )
    .await;
    for crd in [
        format!("x{plural}.{CLAIM_GROUP}"),
        format!("{plural}.{CLAIM_GROUP}"),
    ] {
        wait_generated_crd(client, &crd).await;
    }
    (
        modelplane::resource(
            CLAIM_GROUP,
            "v1",
            &format!("X{kind}"),
            &format!("x{plural}"),
        ),
        modelplane::resource(CLAIM_GROUP, "v1", &kind, &plural),
    )
}

/// How a claim's tree is deleted.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum ClaimDelete {
    /// `kubectl delete <claim>`, in the shared claims' namespace.
    Claim,
    /// `kubectl delete namespace <ns>`, of a namespace of its own holding the
    /// claim and the composed ConfigMap: the namespace controller deletes
    /// both with Background propagation.
    Namespace(&'static str),
}

/// Deletes a claim with a plain `kubectl delete` under `mode` (or its
/// namespace): Ok(what was said) when the claim, its XR and the composed
/// ConfigMap end up gone, the ConfigMap before the XR (after it, under Off:
/// the seed's failure). Under Refuse the plain delete is refused at the claim,
/// with the commands that work (set compositeDeletePolicy: Foreground, then
/// delete), which are run.
pub(crate) async fn claim_outcome(
    stack: &Stack,
    mode: Mode,
    how: ClaimDelete,
) -> Result<String, String> {
    let client = stack.cp.admin().await.expect("admin client");
    let (namespace, prefix) = match how {
        ClaimDelete::Claim => (CLAIM_NAMESPACE, ""),
        ClaimDelete::Namespace(ns) => (ns, "Ns"),
    };
    create_namespace(&client, namespace).await;
    let (xrs, claims) = install_claim_kind(&client, mode, prefix, namespace).await;
    let name = "app";
    let claim = json!({
        "apiVersion": format!("{CLAIM_GROUP}/v1"),
        "kind": claims.kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {},
    });
    let claim_api = api(&client, &claims, Some(namespace));
    claim_api
        .patch(
            name,
            &PatchParams::apply("seed-real").force(),
            &Patch::Apply(&claim),
        )
        .await
        .unwrap_or_else(|e| panic!("create the claim: {e}"));
    let xr_name = when_ready(&claim_api, name, "/spec/resourceRef/name")
        .await
        .ok_or_else(|| format!("{} never became Ready", claims.kind))?;
    let xr_api = api(&client, &xrs, None);
    let xr = xr_api.get(&xr_name).await.expect("the XR");
    let composed: Vec<String> = xr
        .data
        .pointer("/spec/resourceRefs")
        .and_then(Value::as_array)
        .map(|refs| {
            refs.iter()
                .filter_map(|r| r.get("name").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let timeline = Timeline::start(
        &client,
        &[
            (claims.clone(), Some(namespace.to_string())),
            (xrs.clone(), None),
            (
                ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
                Some(namespace.to_string()),
            ),
        ],
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    // Protection in effect for the XR kind (Convert holds the XR).
    if mode == Mode::Convert {
        wait_held(&xr_api, &xr_name).await;
    }
    let claim_target = format!("{}.{CLAIM_GROUP}", claims.plural);
    let target: Vec<&str> = match how {
        ClaimDelete::Claim => vec!["delete", &claim_target, name, "-n", namespace],
        ClaimDelete::Namespace(ns) => vec!["delete", "namespace", ns],
    };
    let out = tokio::process::Command::new(&stack.kubectl)
        .args(target)
        .arg("--wait=false")
        .env("KUBECONFIG", stack.cp.kubeconfig_path())
        .output()
        .await
        .expect("kubectl runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let said = match (mode, out.status.success()) {
        (Mode::Refuse, true) => {
            return Err(format!("the claim's plain delete went through: {said}"));
        }
        // Refused at the claim, with the commands that work: run them.
        (Mode::Refuse, false) => {
            let command = said
                .split("Have the claim delete it in the foreground, then delete the claim: ")
                .nth(1)
                .and_then(|rest| rest.split(". To abandon").next())
                .map(str::trim)
                .ok_or_else(|| format!("no command in the refusal: {said}"))?;
            shapes::follow(stack, command)
                .await
                .map_err(|e| format!("the claim's commands `{command}` failed: {e}"))?;
            format!("refused: {}; ran: {command}", said.trim())
        }
        (_, false) => return Err(format!("the claim's delete was refused: {said}")),
        (_, true) => format!("kubectl said: {}", said.trim()),
    };
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    // The namespace controller deletes the claim only on a retry, which
    // backs off (under CI's load its retry came minutes late): the bound is
    // for a wedge, not for speed. The namespace itself: below.
    let limit = match how {
        ClaimDelete::Namespace(_) => Duration::from_secs(300),
        _ => Duration::from_secs(120),
    };
    let gone = wait::until_lasting(limit, || async {
        timeline.gone(&claims.kind, name)?;
        let xr = timeline.gone(&xrs.kind, &xr_name)?;
        let maps: Option<Vec<_>> = composed
            .iter()
            .map(|m| timeline.gone("ConfigMap", m))
            .collect();
        Some((xr, maps?))
    })
    .await;
    let Some((xr, maps)) = gone else {
        let claim = claim_api.get_opt(name).await.ok().flatten();
        return Err(format!(
            "not all gone after {limit:?}; the claim: {:?}\n{}",
            claim.map(|c| (c.finalizers().to_vec(), c.data.pointer("/status").cloned())),
            timeline.describe()
        ));
    };
    if let ClaimDelete::Namespace(ns) = how {
        namespace_finishes(&namespaces, ns).await?;
    }
    let in_order = maps
        .iter()
        .all(|m| timeline.revision_of(m) < timeline.revision_of(&xr));
    // Off is the seed's failure: the XR goes first and leaves its resources
    // to the garbage collector.
    if in_order == (mode != Mode::Off) {
        Ok(said)
    } else {
        Err(format!(
            "the XR left {} its composed ConfigMap\n{}",
            if in_order { "after" } else { "before" },
            timeline.describe()
        ))
    }
}

/// Waits for the namespace `ns`, whose content is gone, to finish: within
/// 360 s. One pass of the namespace controller goes through this stack's
/// hundred-odd namespaced kinds one DeleteCollection after another; under
/// CI's load each took about a second (the API server's writes 0.7 s at the
/// median), so a pass took 3 to 4 minutes (a run at 1968628).
///
/// A pass whose discovery failed (this stack's tests make and delete CRDs
/// all the time) is retried with a back-off that grows to 1,000 s; seen in
/// CI with everything in the namespace gone for minutes. Only then is the
/// namespace written to (an operator's nudge), which queues it at once. A
/// write while a pass runs makes that pass's status update conflict and
/// costs a whole pass: at 1968628 a nudge after 60 s, in the middle of the
/// first pass, made the namespace finish 7 minutes after its delete instead
/// of 3.
pub(crate) async fn namespace_finishes(
    namespaces: &Api<k8s_openapi::api::core::v1::Namespace>,
    ns: &str,
) -> Result<(), String> {
    let conditions = |n: &k8s_openapi::api::core::v1::Namespace| -> Vec<(String, String, String)> {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|c| (c.type_, c.status, c.message.unwrap_or_default()))
            .collect()
    };
    let started = Instant::now();
    let mut nudged = None;
    let mut last = Vec::new();
    while started.elapsed() < Duration::from_secs(360) {
        let namespace = match namespaces.get_opt(ns).await {
            Ok(None) => return Ok(()),
            Ok(Some(n)) => n,
            Err(_) => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        last = conditions(&namespace);
        let discovery_failed = last
            .iter()
            .any(|(t, s, _)| t == "NamespaceDeletionDiscoveryFailure" && s == "True");
        if discovery_failed && nudged.is_none() {
            eprintln!(
                "namespace {ns}: its content gone, its discovery failed after {:?}: {last:?}; queued again by a write",
                started.elapsed()
            );
            let _ = namespaces
                .patch(
                    ns,
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"metadata": {"annotations": {"seed-real/nudged": "its discovery failed"}}}),
                    ),
                )
                .await;
            nudged = Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Err(format!(
        "namespace {ns} did not finish within {:?} of its content gone; its conditions: {last:?}; nudged: {nudged:?}",
        started.elapsed()
    ))
}

pub(crate) async fn deleting_a_legacy_claim_ends_gone_in_order_or_says_which_command_works() {
    let (stack, _shared) = shared_stack().await;
    let (off, refuse, convert) = tokio::join!(
        claim_outcome(stack, Mode::Off, ClaimDelete::Claim),
        claim_outcome(stack, Mode::Refuse, ClaimDelete::Claim),
        claim_outcome(stack, Mode::Convert, ClaimDelete::Claim)
    );
    for (mode, outcome) in [("Off", &off), ("Refuse", &refuse), ("Convert", &convert)] {
        eprintln!("claim under {mode}: {outcome:?}");
    }
    for (mode, outcome) in [("Off", off), ("Refuse", refuse), ("Convert", convert)] {
        if let Err(why) = outcome {
            panic!("claim under {mode}: {why}");
        }
    }
}

/// The deletion of a team's namespace holding a claim, under Convert: the
/// namespace controller deletes the claim (and everything else) with
/// Background propagation, Crossplane deletes the claim's cluster-scoped XR
/// with none, and cascade-guard makes that a foreground cascade, so the
/// composed ConfigMap goes before the XR and the namespace finishes. (The
/// namespaced tree of a ModelDeployment is the ignored test above: its
/// managed resources can wedge in a terminating namespace upstream.)
pub(crate) async fn convert_tears_a_deleted_namespace_holding_a_claim_down_in_order() {
    let (stack, _shared) = shared_stack().await;
    let outcome = claim_outcome(
        stack,
        Mode::Convert,
        ClaimDelete::Namespace("seed-claims-team"),
    )
    .await;
    eprintln!("namespace holding a claim under Convert: {outcome:?}");
    if let Err(why) = outcome {
        panic!("namespace holding a claim under Convert: {why}");
    }
}
