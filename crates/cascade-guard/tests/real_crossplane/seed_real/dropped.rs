//! A nested XR dropped from its parent's Composition: Crossplane's delete of
//! it is never refused.

use super::*;

pub(crate) const DROP_GROUP: &str = "dropped.seed.local-cluster.dev";

/// v2 CompositeResourceDefinitions.
pub(crate) fn v2_xrds() -> ApiResource {
    modelplane::resource(
        "apiextensions.crossplane.io",
        "v2",
        "CompositeResourceDefinition",
        "compositeresourcedefinitions",
    )
}

/// A function-patch-and-transform resource: one ConfigMap, ready at once.
pub(crate) fn config_map_part() -> Value {
    json!({
        "name": "config",
        "base": {"apiVersion": "v1", "kind": "ConfigMap", "data": {"part": "config"}},
        "readinessChecks": [{"type": "None"}],
    })
}

pub(crate) fn compositions() -> ApiResource {
    modelplane::resource(
        "apiextensions.crossplane.io",
        "v1",
        "Composition",
        "compositions",
    )
}

/// Applies a cluster-scoped object (an XRD or a Composition).
pub(crate) async fn apply_cluster_object(client: &Client, resource: &ApiResource, object: Value) {
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    api(client, resource, None)
        .patch(
            &name,
            &PatchParams::apply("seed-real").force(),
            &Patch::Apply(&object),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {} {name}: {e}", resource.kind));
}

/// A v2 XRD for kind `kind`, namespaced, annotated with `mode`.
pub(crate) fn dropped_xrd(kind: &str, mode: Mode) -> Value {
    let plural = format!("{}s", kind.to_lowercase());
    json!({
        "apiVersion": "apiextensions.crossplane.io/v2",
        "kind": "CompositeResourceDefinition",
        "metadata": {
            "name": format!("{plural}.{DROP_GROUP}"),
            "annotations": {POLICY_ANNOTATION: mode.as_str()},
        },
        "spec": {
            "group": DROP_GROUP,
            "names": {"kind": kind, "plural": plural},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "referenceable": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"part": {"type": "string"}}},
                }}},
            }],
        },
    })
}

/// A Composition (named like the kind) for `group`'s `kind`, composing
/// `resources` through function-patch-and-transform.
pub(crate) fn pt_composition(group: &str, kind: &str, resources: Vec<Value>) -> Value {
    json!({
        "apiVersion": "apiextensions.crossplane.io/v1",
        "kind": "Composition",
        "metadata": {"name": kind.to_lowercase()},
        "spec": {
            "compositeTypeRef": {"apiVersion": format!("{group}/v1"), "kind": kind},
            "mode": "Pipeline",
            "pipeline": [{
                "step": "patch-and-transform",
                "functionRef": {"name": local_cluster::real_crossplane::FUNCTION_NAME},
                "input": {
                    "apiVersion": "pt.fn.crossplane.io/v1beta1",
                    "kind": "Resources",
                    "resources": resources,
                },
            }],
        },
    })
}

/// Watches `xrs` and ConfigMaps in namespace `ns` (an XR kind composing
/// ConfigMaps).
pub(crate) async fn xrs_and_config_maps(client: &Client, xrs: &ApiResource, ns: &str) -> Timeline {
    Timeline::start(
        client,
        &[
            (xrs.clone(), Some(ns.to_string())),
            (
                ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
                Some(ns.to_string()),
            ),
        ],
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Creates XR `name` of `kind` (in DROP_GROUP) in namespace `ns`.
pub(crate) async fn create_drop_xr(xrs: &Api<DynamicObject>, kind: &str, ns: &str, name: &str) {
    xrs.patch(
        name,
        &PatchParams::apply("seed-real").force(),
        &Patch::Apply(json!({
            "apiVersion": format!("{DROP_GROUP}/v1"), "kind": kind,
            "metadata": {"name": name, "namespace": ns}, "spec": {},
        })),
    )
    .await
    .unwrap_or_else(|e| panic!("create {kind} {name}: {e}"));
}

/// Crossplane deletes a nested XR dropped from its parent's Composition
/// (v2.2 and later: Foreground, with a UID precondition; v2.0 and v2.1: no
/// propagation policy, let through under Refuse by `--hold-composed`): under
/// `mode` it must go through, in order, and never be refused.
pub(crate) async fn dropped_outcome(stack: &Stack, mode: Mode) {
    let client = stack.cp.admin().await.expect("admin client");
    let inner = format!("{}Inner", mode.as_str());
    let outer = format!("{}Outer", mode.as_str());
    let xrds = v2_xrds();
    let compositions = compositions();
    for kind in [&inner, &outer] {
        apply_cluster_object(&client, &xrds, dropped_xrd(kind, mode)).await;
    }
    let config_map = config_map_part();
    apply_cluster_object(
        &client,
        &compositions,
        pt_composition(DROP_GROUP, &inner, vec![config_map]),
    )
    .await;
    let part = |name: &str| {
        json!({
            "name": name,
            "base": {"apiVersion": format!("{DROP_GROUP}/v1"), "kind": inner, "spec": {"part": name}},
        })
    };
    apply_cluster_object(
        &client,
        &compositions,
        pt_composition(DROP_GROUP, &outer, vec![part("kept"), part("dropped")]),
    )
    .await;
    for kind in [&inner, &outer] {
        wait_generated_crd(&client, &format!("{}s.{DROP_GROUP}", kind.to_lowercase())).await;
    }
    let ns = format!("seed-dropped-{}", mode.as_str().to_lowercase());
    create_namespace(&client, &ns).await;
    let inners = modelplane::resource(
        DROP_GROUP,
        "v1",
        &inner,
        &format!("{}s", inner.to_lowercase()),
    );
    let outers = modelplane::resource(
        DROP_GROUP,
        "v1",
        &outer,
        &format!("{}s", outer.to_lowercase()),
    );
    let timeline = xrs_and_config_maps(&client, &inners, &ns).await;
    let outer_api = api(&client, &outers, Some(&ns));
    create_drop_xr(&outer_api, &outer, &ns, "app").await;
    let inner_api = api(&client, &inners, Some(&ns));
    // Both inner XRs Ready, each with its ConfigMap.
    let dropped = wait::until_lasting(BUILD_TIMEOUT, || async {
        let list = inner_api.list(&Default::default()).await.ok()?;
        if list.items.len() != 2 || !list.items.iter().all(is_ready) {
            return None;
        }
        list.items
            .into_iter()
            .find(|x| x.data.pointer("/spec/part") == Some(&json!("dropped")))
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "{mode:?}: the inner XRs never became Ready\n{}",
            timeline.describe()
        )
    });
    let dropped_name = dropped.name_any();
    let dropped_map = dropped
        .data
        .pointer("/spec/crossplane/resourceRefs/0/name")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| panic!("{dropped_name} composed nothing"));
    if mode == Mode::Convert {
        wait_held(&inner_api, &dropped_name).await;
    } else {
        // Refuse is in effect: a plain delete of it would be refused.
        let dry_run = DeleteParams {
            dry_run: true,
            propagation_policy: Some(PropagationPolicy::Background),
            ..DeleteParams::default()
        };
        let refused = wait::until_lasting(Duration::from_secs(60), || async {
            matches!(inner_api.delete(&dropped_name, &dry_run).await,
                Err(kube::Error::Api(ref s)) if s.code == 403)
            .then_some(())
        })
        .await;
        assert!(refused.is_some(), "Refuse never in effect for {inner}");
        if stack.hold_composed {
            // Crossplane v2.0 and v2.1 delete it with no propagation policy:
            // let through once the controller holds it (a delete before that
            // is refused, and Crossplane tries again).
            wait_held(&inner_api, &dropped_name).await;
        }
    }

    apply_cluster_object(
        &client,
        &compositions,
        pt_composition(DROP_GROUP, &outer, vec![part("kept")]),
    )
    .await;
    let gone = timeline
        .wait_gone(&inner, &dropped_name, TEARDOWN_TIMEOUT)
        .await;
    let map_gone = timeline.gone("ConfigMap", &dropped_map);
    assert!(
        gone.is_some()
            && map_gone.is_some_and(|m| gone
                .as_ref()
                .is_some_and(|g| timeline.revision_of(&m) < timeline.revision_of(g))),
        "{mode:?}: the dropped {inner} did not go after its ConfigMap\n{}",
        timeline.describe()
    );
    let events = local_cluster::audit::read(&audit_log::audit_log(&stack.cp))
        .expect("the API server's audit log");
    let by_crossplane: Vec<Option<i64>> = events
        .iter()
        .filter(|e| {
            e.verb == "delete"
                && !e.dry_run()
                && e.is_about(&inners.plural, &ns, &dropped_name)
                && e.effective_username() == local_cluster::real_crossplane::CROSSPLANE_USER
        })
        .map(|e| e.response_code())
        .collect();
    assert!(
        by_crossplane.contains(&Some(200)) && !by_crossplane.contains(&Some(403)),
        "{mode:?}: Crossplane's deletes of {dropped_name}: {by_crossplane:?}"
    );
    eprintln!(
        "dropped under {mode:?}: gone in order; Crossplane's deletes answered {by_crossplane:?}"
    );
    let _ = outer_api.delete("app", &DeleteParams::foreground()).await;
}

pub(crate) async fn crossplane_deleting_a_dropped_composite_is_never_refused() {
    use futures::FutureExt;
    let (stack, _shared) = shared_stack().await;
    // Each mode to its end, whatever the other does, so that a failure says
    // which modes failed (Crossplane v2.0 and v2.1 fail Refuse alone).
    let outcome = |mode| std::panic::AssertUnwindSafe(dropped_outcome(stack, mode)).catch_unwind();
    let (refuse, convert) = tokio::join!(outcome(Mode::Refuse), outcome(Mode::Convert));
    let failed: Vec<&str> = [("Refuse", refuse.is_err()), ("Convert", convert.is_err())]
        .into_iter()
        .filter_map(|(mode, failed)| failed.then_some(mode))
        .collect();
    assert!(
        failed.is_empty(),
        "a dropped composite did not go in order under {} (each mode's panic above)",
        failed.join(" and ")
    );
}
